// Changing the ring live (shared/DESIGN.md, "Changing the ring") as a pure state machine (STYLE.md §9): no sockets, no threads, no clock.
// The shell (server/member/cluster.cc) runs the steps it asks for against
// ZooKeeper, the source's head and the local store, and reports each
// outcome; tests/partition/change_sim_test.cc runs the same machine in a
// seeded simulation against a model of them.
//
// One change at a time, held by the node <service_path>/.cluster/change
// (RingChange). The importer drives it:
//
//   add (a new mark N takes [pred(N), N-1] from its owner S; a first mark
//   of an empty ring registers at once):
//     create the node (state precopy: S still takes writes to the ranges)
//     -> S's head starts recording the keys written there, once all it
//     sequenced before is committed (track) -> wipe this store -> copy
//     (while writes flow) -> state copy -> fence S (it refuses writes to
//     the ranges from now) -> copy the recorded keys (delta; a record that
//     is not continuous, because S's head changed or restarted or the
//     record overflowed: wipe and copy everything, still fenced) -> persist
//     -> state flip -> register -> listed in the ring -> state drop -> S
//     confirms it let the ranges go (release) -> S drops them -> delete
//     the node
//   remove (mark M leaves; the next mark up, I, inherits its ranges; the
//   head of I imports, whoever that is when the node is read):
//     (node created by the admin call, state precopy) -> track at M's
//     head -> remove what an earlier attempt copied into the ranges here
//     (wipe) -> copy through I's chain (while writes flow) -> state copy
//     -> fence M -> the delta through I's chain (or wipe and copy
//     everything) -> state flip (M's members leave) -> M's member nodes
//     gone -> delete M's mark node -> delete the change node
//
// A failed step starts the pass over from the node's state in ZooKeeper
// (precopy: track and copy again; copy: fence, then the delta again, or
// everything again if the record was not continuous; flip or later: never
// copy again). A crash loses only the machine's memory; the node's state
// says where to resume: a restarted importer in state copy does not know
// what its store holds of the pre-copy, so it wipes and copies everything
// under the fence (the slow but always safe path; a crash is rare, and
// re-tracking would need the pre-copy's token to survive the crash).
// The same holds for a remove's importer, and for a member that takes a
// remove's import over (the head of I changed) or registers again: it has
// no pre-copy of its own, so it copies everything under the fence.
//
// Who serves a hash the change covers (Moving, below):
//   - the source refuses writes from state copy on (in precopy its head
//     records them, and the delta after the fence copies them; from copy
//     on a write there would miss the copy) and reads in state drop (the importer may take writes from
//     its release on, and the source is dropping); until then nobody takes
//     a write, so the source's copy is the newest and reads stay served;
//   - the importing mark refuses reads and writes until its importer knows
//     every member of the source's chain has seen state drop (the release
//     answered: "released"; ReleasedBy), or the node is gone. A member
//     checks again after it read the store that its view still lets it
//     serve the key, so a read that began before the member saw the drop
//     cannot return what the drop or the importer changed since.
// So at every moment at most one mark serves a hash, given that each
// member's ring view reads the change node before the members and marks
// (registry.cc): a view without the node then shows every registration
// made before the node went.
//
// Thread safety: ChangeMachine is not thread-safe (the shell serializes
// it); the free functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/status.h"
#include "partition/ring.h"

namespace flatkv::partition {

// The hash ranges mark "mark" would take over if it joined "ring" (whose
// partitions do not include it), each with the index of its current owner
// in ring.partitions(). Empty if the ring has no marks or already has it.
std::vector<HashRange> RangesTakenBy(const Ring& ring, int64_t mark);

// The change (kind add, state precopy) for "importer" of the new mark "mark"
// taking RangesTakenBy(ring, mark). Ranges empty if there is nothing to take.
RingChange PlanAdd(const Ring& ring, int64_t mark, const std::string& importer);

// The change (kind remove, state precopy) that moves mark "removed"'s ranges to
// the next mark up, imported by that mark's head. InvalidArgument for a mark
// not in the ring or the only one; Unavailable if the inheriting mark has
// no serving member.
Status PlanRemove(const Ring& ring, int64_t removed, RingChange* out);

// True if a member of "self_mark" must refuse a call for hash "h" because a
// change moves it (see above). "released": this member imports the change
// and knows the source has seen the flip (ChangeMachine::Released).
bool Moving(const RingChange& change, int64_t self_mark, int64_t h, bool write, bool released);

// Who confirms an add's release (ChangeStep::kRelease), in the order to
// ask them: every member of the source's chain in "ring" (a fresh view),
// the head last. Each re-reads the ring before it answers, so from its
// answer on it refuses the ranges (its view shows the change in drop, or
// the new mark listed); a member that serves reads and kept a view from
// before the drop would serve a key the head is dropping, or a value older
// than a write the importer takes once released. The head's answer also
// drops the first key. A member that does not answer blocks the release
// until its node is gone (it may still be serving clients it can reach).
// Empty if the source is not in "ring" or has no member.
std::vector<std::string> ReleasedBy(const Ring& ring, const RingChange& change);

// True once a member of "self_mark" must stop serving and leave: its mark
// is being removed and the copy is complete (state flip), or its mark node
// is gone while the ring still has others (the remove finished while this
// member was away or registering: what it holds belongs to another mark).
// Only a remove deletes a mark node, so the node is known gone when the
// view lists a member of the mark without it, or when this process had
// seen the node in an earlier view ("mark_seen") and the view has no trace
// of the mark: its session expired too while the remove finished. A new
// process has not seen it: a member started on a removed mark's data adds
// the mark again (a new mark), as a member of a new mark does.
bool MustLeave(const Ring& ring, int64_t self_mark, bool mark_seen);

// One step for the shell to run.
struct ChangeStep {
  enum Kind {
    kDone,        // nothing (more) to do
    kWait,        // not yet, because "reason"; ask again after a while
    kRegister,    // register this member (idempotent; the registry does it);
                  // create_mark: also create the mark's node (a first mark, or
                  // an import past its flip); otherwise only while the mark
                  // node exists (a removed mark never comes back by a restart)
    kCreate,      // create the change node "change"
    kTrack,       // add, precopy: the source's head starts recording the keys
                  // written to the ranges and answers (a token) once every write
                  // it sequenced before is committed
    kFence,       // the source's head stops writes to the ranges, commits the rest
    kDelta,       // add, copy after a pre-copy: copy the keys the source's head
                  // recorded (removing those it no longer holds); NotFound: it
                  // has no continuous record for this change (then wipe and copy)
    kWipe,        // add: empty this store (an earlier attempt may have left a copy)
    kCopy,        // copy change.ranges from the source (into this store; remove:
                  // as writes through this mark's chain)
    kPersist,     // add: flush, sync, adopt the import as the chain's position
    kSetState,    // write "change" (its state is the new one) to the node
    kRelease,     // add: every member of the source's chain re-reads the ring
                  // and confirms it has let the ranges go (ReleasedBy), the
                  // head last with a peerDrop of at most one key; from then
                  // on this member serves them
    kDrop,        // add: the source drops change.ranges (every page of them)
    kDeleteMark,  // remove: delete the removed mark's node
    kDelete,      // delete the change node (done, or rolled back: "reason")
  };
  Kind kind = kDone;
  RingChange change;
  bool create_mark = false;       // kRegister
  std::string reason;             // kWait; kDelete of a roll-back
};
const char* StepName(ChangeStep::Kind kind);

class ChangeMachine {
 public:
  ChangeMachine(int64_t mark, std::string self) : mark_(mark), self_(std::move(self)) {}

  // This member was asked to register (serving starts, or again after its
  // session expired): an add gate runs until it has.
  void Join() {
    // Registering again (its session expired): another member may have
    // imported meanwhile, so a pre-copy this process made is stale. (A new
    // mark's importer is asked again and again before it registers: its
    // pre-copy stays.)
    if (registered_) precopied_ = 0;
    join_ = true;
    registered_ = false;
    asked_ = Asked::kNone;
  }

  // The next step, from the newest ring view. "head": this member heads its
  // mark's chain (a remove's import runs only there). None once Leaving().
  ChangeStep Next(const Ring& ring, bool head);
  // True once this member must stop serving and leave: MustLeave() of
  // "ring", with whether this process saw its mark's node in a view before
  // (this or an earlier call, or Next()).
  bool Leaving(const Ring& ring);
  // The outcome of "step" (as Next returned it).
  void Done(const ChangeStep& step, const Status& st);

  // For Moving(): this member imports "change" and its source has seen the
  // flip (or this member deleted the node already).
  bool Released(const RingChange& change) const;
  // A change of this member's runs (for stats).
  bool importing() const { return flipped_.has_value() || copy_czxid_ != 0; }
  // The copy in state copy of the change this member pre-copied is of the
  // recorded keys only (false: everything, or no such change).
  bool delta(int64_t czxid) const { return precopied_ == czxid && !full_; }

 private:
  ChangeStep Copy(const Ring& ring, const RingChange& change, bool head);
  ChangeStep AfterFlip(const Ring& ring);
  // Forgets the change of "czxid" as finished: its steps are all done.
  void Finished(int64_t czxid);
  // The steps after a flip start from the first: those of "flipped", or
  // none.
  void StartAfresh(std::optional<RingChange> flipped);
  ChangeStep Register(bool create_mark, const RingChange& change);
  bool Listed(const Ring& ring) const;
  static ChangeStep Step(ChangeStep::Kind kind, const RingChange& change);
  static ChangeStep Wait(std::string reason);

  const int64_t mark_;
  const std::string self_;
  bool mark_seen_ = false;   // a view showed this member's mark node
  bool join_ = false;        // asked to register
  bool registered_ = false;  // and the ring listed it
  enum class Asked { kNone, kPlain, kCreate };
  Asked asked_ = Asked::kNone;  // the registration last asked for
  bool created_ = false;           // add: this member created the node just now
  // The copy pass in progress: the change's czxid and state, how far it got.
  int64_t copy_czxid_ = 0;
  std::string copy_state_;
  int phase_ = 0;
  // The change this process pre-copied and moved to state copy itself (its
  // store holds the pre-copy, the source's head its record); full_: the
  // record turned out not continuous, so everything is copied again.
  int64_t precopied_ = 0;
  bool full_ = false;
  // The change this member moved to state flip (or found so): from then on
  // only finished, whatever a lagging ring view says.
  std::optional<RingChange> flipped_;
  bool released_ = false;      // add: the source confirmed it let the ranges go
  bool dropped_ = false;       // add: the source dropped the ranges
  bool mark_deleted_ = false;  // remove: the removed mark's node is gone
  int64_t finished_czxid_ = 0;  // the change this member saw finish last
};

}  // namespace flatkv::partition
