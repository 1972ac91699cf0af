// ChainMember: one member's side of chain replication (van Renesse and
// Schneider, OSDI 2004; shared/DESIGN.md, "Partitions and chains") as a pure
// state machine (STYLE.md §9): methods take events (a new chain from
// ZooKeeper, a client write at the head, a message from a neighbour, a
// timer) and append the actions to take to a ChainOutput (apply these
// writes, send these messages, answer these clients). No sockets, threads
// or clocks inside: time comes in as `now` (milliseconds, any origin). The
// I/O shell around it (server/member/replicator.*) and the deterministic simulation
// (tests/partition/chain_sim_test.cc) drive the same code.
//
// The protocol.
//
//   client -> head -> ... -> tail        writes flow down, in sequence order
//             head <- ... <- tail        acks flow up: "applied up to s,
//                                        the tail has applied up to c"
//             head <-------- tail        and (direct_commit) straight to
//                                        the head: "applied up to c"
//
// * The head gives each write the next sequence number s (contiguous, per
//   partition) and the epoch of its head term (its registration's czxid,
//   which grows with every new head: a head is always the oldest member,
//   and the next one registered after it). (epoch, s) names one write:
//   no other write ever gets the same pair.
// * Every member applies writes in sequence order, exactly once; a write
//   that does not follow its last one (a gap after a drop) is ignored and
//   sent again. So each member's history is a prefix of its predecessor's.
// * A member acks what it applied to its predecessor. One whose downstream
//   will ack the same writes waits for that ack and sends one ack carrying
//   both (its applied and the new commit point), or after resend_ms / 4
//   if the downstream is slow: one ack up per message down.
// * Each member keeps what it applied in a log: the writes the tail has not
//   yet applied (the paper's Sent list), plus up to `backlog_bytes` of older
//   ones for members that catch up. When its successor changes (a middle
//   member failed) it resends everything after the commit point: the new
//   successor skips what it has.
// * The commit point c is the tail's applied sequence (a member applies
//   only what its predecessor applied, so every member holds it), as the
//   acks relay it up. Sooner (direct_commit) a tail that is not the head's
//   successor also sends c to the head itself (kCommit), which a head of a
//   recorded chain takes from its current tail: one hop instead of one per
//   member. Not where an ack must also mean "synced" and members pass
//   writes on before their own sync (sends_before_sync): the tail cannot
//   vouch for the others; there the tail serves a read only once the
//   head's commit point (which the head sends it, kCommit down) covers the
//   key's newest write. Under `sync` the head answers a write once c
//   reaches it, and only the tail serves reads, so single-key operations
//   are linearizable. Under `async` the head answers once it applied the
//   write itself and any member serves reads.
// * Fencing: every message carries the chain id (ChainConfig::id, which
//   changes with every change of this chain). A message from another chain
//   is dropped: a head that was paused past its session and wakes believing
//   it still leads cannot get an ack from a member of the new chain, so
//   under `sync` it can never answer a write the current chain does not
//   hold. A member told it lost its session (SetFenced) refuses clients.
// * Catch-up: a member outside the chain (new, returning, or expired) asks
//   the tail for the writes after its position. If the tail's log still
//   holds that position with the same epoch, the tail streams the rest and,
//   under `sync`, commits only what the joiner has applied (so once the
//   joiner registers as the new tail it holds every acknowledged write);
//   meanwhile the tail serves a read of a key with a write the joiner has
//   not applied only once it has. Otherwise the tail says "snapshot": the
//   joiner wipes its store, the shells stream the tail's store (a fuzzy
//   copy: writes go on meanwhile), and the joiner asks again from the
//   snapshot's position; replaying writes after it is safe because every
//   replicated write is an idempotent assignment (an append travels as the
//   put of its result). Once within `catchup_lag` writes of the tail the
//   joiner registers; the new chain makes it the tail.
//
// Thread safety: none; the shell serializes all calls on one member.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "engine/status.h"

namespace flatkv::partition {

// The last write a member applied: (epoch, seq); (0, 0) for an empty store.
struct ChainPosition {
  int64_t epoch = 0;
  uint64_t seq = 0;
  bool operator==(const ChainPosition& o) const { return epoch == o.epoch && seq == o.seq; }
};

// A member's place in its chain (ChainMember::chain_role()). The shell
// decides by this value; RoleName() is its name in stats, NodeInfo.role and
// logs.
enum class ChainRole {
  kNone,     // no chain yet
  kSyncing,  // catching up, not in the chain
  kFenced,   // lost its place (session, full disk) until it rejoins
  kSingle,   // a chain of one: head and tail
  kHead,
  kMiddle,
  kTail,
};

// "none", "syncing", "fenced", "single", "head", "middle" or "tail".
const char* RoleName(ChainRole role);

// One replicated write. "op" is the shell's encoding of an idempotent
// assignment (put key=value, remove key, several of them); "keys" are the
// hashes of the keys it touches (for read gating during a catch-up).
struct ChainEntry {
  uint64_t seq = 0;
  int64_t epoch = 0;
  std::vector<uint64_t> keys;
  std::string op;
};

// One mark's chain as ZooKeeper holds it.
struct ChainConfig {
  int64_t version = 0;               // the ring's version: an older config is ignored
  uint64_t id = 0;                   // changes with every change of this chain
  std::vector<std::string> members;  // chain order, head first
  std::vector<int64_t> epochs;       // members[i]'s registration czxid
  bool sync = true;                  // cluster.replication
  // The chain last recorded in ZooKeeper (.cluster/chains/<mark>, ring.h's
  // RecordedChain) by a head.
  // Writes are acknowledged, and sync reads served, only while it equals
  // `members`: so every acknowledged write (and every value a read
  // returned) is held by every member of the recorded chain, and when the
  // whole chain is gone one of those members, with its store intact, may
  // start it again alone. Empty for a mark that never had a chain.
  std::vector<std::string> recorded;
  // The ring version the recorded chain was recorded under (its record's
  // ring_version). A record asked for under an older ring can land after a
  // newer one was read: a head trusts a record only from its own chain's
  // time (Recorded()).
  int64_t recorded_version = 0;
  // The zxid of the write that recorded it (RecordedChain::zxid). A record
  // counts for this chain only if it is later than every member's
  // registration (epochs): one of the same addresses made before a member
  // registered again vouches for that member's earlier life, not for what
  // this registration holds.
  int64_t recorded_zxid = 0;
  // While a ring change adds this mark (shared/DESIGN.md, "Changing the
  // ring"), the member importing its data, in any state of the change: its
  // store will be the whole of the mark's data, so no other member may start
  // the mark's chain (one restarted with a store from an earlier life of the
  // mark would lead, and the importer would catch up from it and lose the
  // import). Empty otherwise.
  std::string importer;
};

// A message between two members of one mark.
struct ChainMessage {
  enum class Kind : uint8_t {
    kReplicate,        // down: entries, sender's applied and commit point
    kAck,              // up: receiver's applied and commit point
    kSyncRequest,      // joiner -> tail: "I have position"
    kSyncRefused,      // tail -> joiner: not now (not the tail, busy); ask later
    kCommit,           // to the head: "applied up to here"; from it to the tail:
                       // "committed up to here" (ChainOptions)
  };
  Kind kind = Kind::kReplicate;
  uint64_t chain = 0;  // the sender's ChainConfig::id
  std::vector<ChainEntry> entries;
  uint64_t applied = 0;
  uint64_t committed = 0;  // the commit point under this chain
  // Down: every write up to here was committed (under any chain). Up (an
  // ack): the highest commit point the sender or a member after it has
  // known (a tail may have served reads up to there).
  uint64_t floor = 0;
  ChainPosition position;
  // An ack: the sender (the tail) sent this commit point to the head
  // itself (kCommit), so the head's successor need not relay it at once.
  bool direct = false;
};

// What the shell must do after an event, in this order: apply `apply` to the
// store (in order) and make it as durable as storage.sync says, then send
// `sends`, answer `replies`, serve `reads`, start `snapshots`, remove the
// member nodes in `evict`; `wipe`, `register_now` and `deregister` concern
// this member's own registration.
struct ChainOutput {
  struct Send {
    std::string to;
    ChainMessage msg;
  };
  struct Reply {
    uint64_t request = 0;
    Status status;
  };
  struct Snapshot {
    std::string to;      // the joiner
    ChainPosition at;    // the joiner resumes after this position
  };
  // A member whose process is gone (OnPeerRefused): delete its member node
  // if it is still the one its registration made (creation zxid "epoch").
  struct Evict {
    std::string member;
    int64_t epoch = 0;
  };
  std::vector<ChainEntry> apply;
  std::vector<std::string> record;  // head: record this chain in ZooKeeper...
  int64_t record_version = 0;       // ...unless a chain of a later ring version is recorded
  std::vector<Send> sends;
  std::vector<Reply> replies;
  std::vector<uint64_t> reads;  // parked reads (OnRead kWait) that may be served now
  std::vector<Snapshot> snapshots;
  std::vector<Evict> evict;
  bool wipe = false;          // empty the store (a snapshot is being loaded)
  bool register_now = false;  // joiner: caught up; register the member node
  bool deregister = false;    // registered without catching up: remove the node, rejoin

  bool empty() const {
    return apply.empty() && record.empty() && sends.empty() && replies.empty() && reads.empty() &&
           snapshots.empty() && evict.empty() && !wipe && !register_now && !deregister;
  }
};

struct ChainOptions {
  uint64_t backlog_bytes = 64u << 20;  // cluster.backlog_bytes: committed writes kept
  uint32_t max_batch_entries = 512;    // writes per kReplicate message
  uint64_t max_batch_bytes = 4u << 20; // bytes of ops per kReplicate message
  int64_t resend_ms = 200;             // resend when a neighbour made no progress
  int64_t joiner_timeout_ms = 3000;    // drop a joiner silent this long
  uint64_t catchup_lag = 64;           // a joiner this close to the tail registers
  // The tail also sends its position to the head (kCommit), besides the
  // relayed acks. Sound where a member passes a write on only once it holds
  // it as surely as it ever will (the shell logs a batch before it sends
  // it on: storage.sync interval or none); not with sends_before_sync.
  // (Under always, every member reporting its synced position to the head
  // instead of relaying was measured no faster: the syncs dominate.)
  bool direct_commit = true;
  // The shell passes a batch down before its own sync (storage.sync:
  // always). The tail's own position then says nothing of the members
  // before it, which may still lose that batch to a power cut; under sync
  // it serves a read only up to a commit point the head computed (from
  // acks each sent after its member's sync), which the head sends it
  // (kCommit, down) as it advances.
  bool sends_before_sync = false;
};

class ChainMember {
 public:
  enum class Read { kServe, kWait, kRefuse };

  // "self" is this member's address ("host:port"); "durable" the position
  // its store holds (at most what it applied); "intact" false if the store
  // may have lost writes it once held (wiped, or a new data directory).
  ChainMember(std::string self, ChainOptions options, ChainPosition durable, bool intact = true);

  // A new chain for this member's mark (ZooKeeper's view; may not include
  // this member).
  void OnConfig(const ChainConfig& config, int64_t now, ChainOutput* out);
  // The ZooKeeper session is lost or too long disconnected (true), or good
  // again (false). Fenced, a member refuses clients and fails pending writes.
  void SetFenced(bool fenced, ChainOutput* out);
  // The shell registered this member's node (after out->register_now); its
  // creation zxid names this registration in ChainConfig::epochs: a config
  // listing this address with another zxid (an earlier registration) does
  // not count as this member being in the chain.
  //
  // A joiner registers holding every write its tail had committed (the
  // floor), and the tail commits nothing it has not applied while it is
  // the tail's downstream: from here it counts as intact, as the shell's
  // log says after a restart. Should the tail drop it before the new chain
  // shows it, any write acknowledged without it needs a recorded chain
  // without it, and only a member of the recorded chain may restart an
  // empty one (SendSyncRequest).
  //
  // "session" names the ZooKeeper session that made the node (as in
  // OnSessionAnswer): the registration lives as long as that session.
  // "now": when it was made. The ring has joiner_timeout_ms from then to
  // show it (OnTick), however long ago this member asked: a registration
  // waits in the shell while its mark node does not exist (a new mark's
  // importer asks at start and registers at the flip).
  void OnRegistered(int64_t czxid, uint64_t session, int64_t now) {
    Clock(now);
    if (joining_) join_progress_ms_ = now;
    if (joining_ && !register_sent_ && StartsImport()) {
      // The ring change registered this importer before it asked itself:
      // its store is the mark's data, it starts the chain alone.
      register_sent_ = true;
      registered_alone_ = true;
    }
    registration_ = czxid;
    registration_session_ = session;
    if (joining_ && register_sent_ && copy_end_.seq == 0 && !dirty_) intact_ = true;
  }
  // The ZooKeeper lease (shared/DESIGN.md, "ZooKeeper unreachable"). The
  // shell reports every request its session sent at "sent" that ZooKeeper
  // answered (a periodic probe, and any other call): the server heard this
  // member after "sent", so it cannot expire the session before
  // sent + session_timeout_ms. The lease runs until sent + half of that
  // ("session_timeout_ms" is the timeout the server granted), on the
  // shell's clock, which must never jump and must count a pause of the
  // process. The half left over covers clocks that run at different rates.
  // Not counted from the client library's disconnect report, which comes
  // 2/3 of a timeout after the server last heard from it: ZooKeeper may
  // have expired the member and formed a chain without it by then.
  //
  // Without the lease a member answers UNAVAILABLE at once to writes (not
  // applied) and sync reads, and fails the writes waiting for their commit
  // (in doubt: they may still commit), unless it is alone: a chain of one
  // that has had no joiner or other member since it last held the lease
  // (nobody could have taken over from it).
  //
  // "session" names the ZooKeeper session that answered (any value that
  // changes with every new session). A client never returns to a session
  // once it has another: an answer from another session than the one that
  // made this member's registration (OnRegistered) means that session
  // expired (or was closed) and the registration with it, so the member
  // leaves its chain (fenced; a joiner registers again) before the answer
  // counts. Without this, the new session's first answer would renew the
  // lease of a member whose view still shows it in the chain it was
  // removed from, until the ring read showing its removal arrives.
  void OnSessionAnswer(int64_t sent, int64_t session_timeout_ms, int64_t now, ChainOutput* out,
                       uint64_t session = 0);
  // Holds the lease at "now" (or needs none: alone).
  bool leased(int64_t now) const { return !company_ || now < lease_end_; }
  // A client write at the head; answered through out->replies (maybe later).
  void OnWrite(uint64_t request, std::vector<uint64_t> keys, std::string op, int64_t now,
               ChainOutput* out);
  void OnMessage(const std::string& from, const ChainMessage& msg, int64_t now,
                 ChainOutput* out);
  // A connection to "peer" was refused: its host answered that nothing
  // listens on its port, so the process that registered there is gone (a
  // process stopped or cut off keeps its port; one that restarts holds it
  // again only as a new member, which must catch up and register anew).
  // A member of the current chain asks once (out->evict) to remove the
  // peer's member node, if the peer is in that chain: the chain re-forms
  // without it at once instead of a session timeout later. Safe for the
  // same reason an expiry is (a chain forms without a member that no
  // longer serves), given what a refusal proves: the shell reports only
  // ECONNREFUSED, never a timeout, an unreachable host or a broken
  // connection. (A firewall that answers a member's peers with resets yet
  // lets its clients through breaks that premise: shared/DESIGN.md.)
  void OnPeerRefused(const std::string& peer, int64_t now, ChainOutput* out);
  // Resends what a silent neighbour has not acknowledged; drops a silent
  // joiner. Call every resend_ms / 2 or so.
  void OnTick(int64_t now, ChainOutput* out);
  // Not in the chain (new, returning, fenced): catch up from the tail, then
  // register (out->register_now).
  void StartJoin(int64_t now, ChainOutput* out);
  // A snapshot stream from "from" (out->snapshots there) begins. Returns
  // its token, or 0 if this member does not expect one from it (the shell
  // refuses the stream). The shell empties the store (out->wipe) and loads
  // the stream's records only while snapshot_current(token): a later
  // stream replaces an earlier one.
  uint64_t OnSnapshotBegin(const std::string& from, ChainPosition at, int64_t now,
                           ChainOutput* out);
  bool snapshot_current(uint64_t token) const { return snapshotting_ && token == snapshot_token_; }
  // A page of the stream of "token" arrived: the stream is alive (a joiner
  // gives up on a stream silent for 3 x joiner_timeout_ms).
  void OnSnapshotProgress(uint64_t token, int64_t now) {
    if (snapshot_current(token)) join_progress_ms_ = now;
  }
  // The whole stream of "token" is loaded. "end" is the source's position
  // once it had read its whole store: the copy is fuzzy and may hold any
  // write up to there, including writes a later head term discards (never
  // committed). Replaying from the snapshot's position fixes every key the
  // chain's history writes again, not one only the discarded branch wrote;
  // so the joiner registers only once it has applied the chain's write at
  // end's seq and found end's epoch there (the same history up to there),
  // and starts over from an empty store if it finds another.
  void OnSnapshotLoaded(uint64_t token, ChainPosition end, int64_t now, ChainOutput* out);
  // The stream of "token" broke (its source failed or stalled): ask again.
  void OnSnapshotFailed(uint64_t token, int64_t now, ChainOutput* out);
  // May a read of the key with hash "key" be served now? kWait parks it:
  // "request" comes back in out->reads once it may (kRefuse: UNAVAILABLE,
  // or not the member that serves reads).
  Read OnRead(uint64_t request, uint64_t key, int64_t now, ChainOutput* out);
  // The shell read the store for a read OnRead let through (kServe, or
  // released from out->reads): may it answer with what it read? It reads
  // outside the member's lock while the loop goes on applying writes, and a
  // tail that commits later than it applies (a joiner catching up from it;
  // sends_before_sync) may by then hold a newer write of the key that is not
  // committed. So the rule is checked again after the read: true means every
  // write the read can have seen is committed (the value was current at a
  // moment between the two checks); false, read again through OnRead.
  bool ConfirmRead(uint64_t key, int64_t now);

  // This member's place in its chain, and its name (RoleName).
  ChainRole chain_role() const;
  const char* role() const { return RoleName(chain_role()); }
  // What the lease allows now (Leased): false, the member refuses every
  // client call until ZooKeeper answers it again.
  bool lease_held() const { return Leased(); }
  const std::string& self() const { return self_; }
  // The shell registers the member node (after out->register_now) only
  // while this holds: a registration that comes too late is withdrawn.
  bool wants_registration() const { return joining_ && (register_sent_ || StartsImport()); }
  ChainPosition applied() const { return applied_; }
  // As head: the epoch of its term (its registration's czxid), which every
  // new head term changes.
  int64_t head_epoch() const { return epoch_; }
  uint64_t committed() const { return committed_; }
  size_t pending_writes() const { return pending_.size(); }
  // A new mark's first member imported its store from another mark's (a
  // ring change): its store holds what position "at" names, which no log
  // covers, so a joiner from any other position gets a full copy. Only
  // while it is in no chain; whatever it applied or logged before (an
  // earlier life of this instance, whose store the import wiped) is
  // forgotten. False if it is in a chain.
  bool Rebase(ChainPosition at);
  // The newest write this member applied that the current chain has not
  // committed (so some member may lack it) touching the key with hash
  // "key", or null. Read repair at the head: such a write holds the key's
  // newest value; without one, every member holds it.
  const ChainEntry* NewestUncommitted(uint64_t key) const;
  // Every such write, oldest first (read repair of a string-key bucket).
  std::vector<const ChainEntry*> Uncommitted() const;
  // Read repair at the head: where the value that rewrites a key (or a
  // string-key bucket) this member holds damaged comes from. "own_good":
  // this member's store holds it whole (a value or its absence);
  // "uncommitted_sets_it": a write this member holds uncommitted sets it
  // whole (NewestUncommitted's, for a key; never for a bucket, whose
  // uncommitted writes each set one of its keys); "fetched": another
  // member's copy is at hand.
  enum class RepairFrom {
    kOwn,          // its own copy, written through the chain so every member holds it again
    kUncommitted,  // that write: newer than any member's committed copy
    kFetch,        // another member's copy is needed first
    kCopy,         // the fetched copy (it holds every committed write), the
                   // writes not yet committed applied on top, oldest first
  };
  static RepairFrom ChooseRepair(bool own_good, bool uncommitted_sets_it, bool fetched);
  // The current chain's members, head first (empty before the first config).
  const std::vector<std::string>& members() const { return config_.members; }
  // The member after this one (successor, or a joiner at the tail), its
  // acknowledged position, and what it lacks of this member's log.
  const std::string& downstream() const { return down_; }
  uint64_t downstream_applied() const { return down_applied_; }
  uint64_t lag_writes() const;
  uint64_t lag_bytes() const;
  uint64_t log_bytes() const { return log_bytes_; }
  uint64_t refused_messages() const { return refused_; }

 private:
  bool in_chain() const { return index_ >= 0; }
  bool is_head() const { return index_ == 0; }
  bool is_tail() const { return in_chain() && index_ + 1 == static_cast<int>(config_.members.size()); }
  // The last member that must apply a write before it commits: no one
  // after this member (tail without joiner).
  bool is_end() const { return is_tail() && down_.empty(); }
  const std::string& predecessor() const;
  void Apply(ChainEntry entry, ChainOutput* out);
  // out->deregister, and forget the registration.
  void Deregister(ChainOutput* out);
  // Out of the chain it is in (or registered into) to catch up again:
  // withdraws the node, fails the pending writes, drops the downstream.
  void LeaveToRejoin(ChainOutput* out);
  void Pump(int64_t now, ChainOutput* out);
  void SendAck(int64_t now, ChainOutput* out);
  // Sends "m" (an ack or a COMMIT: each says where something stands) to
  // "to", replacing one of its kind already in "out": only the latest counts.
  void SendLatest(const std::string& to, ChainMessage m, ChainOutput* out);
  // The floor an ack carries: the highest commit point this member or one
  // after it has known.
  uint64_t ack_floor() const { return std::max(committed_, down_floor_); }
  void Commit(uint64_t committed, ChainOutput* out);
  void FailPending(const Status& status, ChainOutput* out);
  // Head: answers the pending writes that may be answered (committed under
  // sync, applied under async); tail: serves the parked reads whose key's
  // writes are committed. Only while the chain is recorded and leased.
  void Release(ChainOutput* out);
  // The current chain is the recorded one. For the head, which answers
  // writes by it, only by a record made under this chain (from the version
  // it first saw it): an older record of the same members may be followed
  // by a late one of another chain (asked for before, landing after this
  // view was read), which would then name members lacking what it answered.
  bool Recorded() const {
    return ChainRecorded() && (!is_head() || config_.recorded_version >= chain_since_);
  }
  // The current chain is the one recorded, by a record written after every
  // member's registration.
  bool ChainRecorded() const {
    if (config_.recorded != config_.members) return false;
    for (int64_t epoch : config_.epochs) {
      if (config_.recorded_zxid <= epoch) return false;
    }
    return true;
  }
  // May start an empty chain alone: it holds every acknowledged write (a
  // member of the recorded chain with its store intact), or the mark never
  // had a chain.
  bool MayStartAlone() const {
    if (!config_.importer.empty()) return config_.importer == self_;
    const auto& rec = config_.recorded;
    return imported_ || rec.empty() ||
           (intact_ && std::find(rec.begin(), rec.end(), self_) != rec.end());
  }
  // This member imports its mark's data and holds the import (Rebase).
  bool StartsImport() const { return imported_ && config_.importer == self_; }
  // This member may hold the only copy of some acknowledged write: it is
  // in the recorded chain with its store intact, and the current chain has
  // not recorded itself (so it acknowledged nothing yet and may vanish
  // before it does, leaving the mark to this member: SendSyncRequest).
  bool Keeper() const {
    const auto& rec = config_.recorded;
    return intact_ && !ChainRecorded() && std::find(rec.begin(), rec.end(), self_) != rec.end();
  }
  // May answer writes and sync reads: the lease holds, or it is alone.
  bool Leased() const { return leased(now_); }
  // Every event's "now" passes here first: the lease is judged at the
  // latest time the member has been told.
  void Clock(int64_t now) { now_ = std::max(now_, now); }
  // The lease ended since the last event: fail what waits on it.
  void CheckLease(ChainOutput* out);
  void Trim();
  bool Covers(const ChainPosition& p) const;
  // What the tail serves reads up to: its commit point, and under
  // sends_before_sync no further than the head's (read_safe_).
  uint64_t ReadCommitted() const {
    if (!options_.sends_before_sync || is_head()) return chain_committed_;
    return std::min(chain_committed_, read_safe_);
  }
  // Highest seq in (ReadCommitted(), applied_] touching "key", or 0.
  uint64_t DirtyUntil(uint64_t key) const;
  // Whether a read of "key" may be served now (OnRead and ConfirmRead):
  // kWait with "until", the write it waits for.
  Read ReadRule(uint64_t key, uint64_t* until) const;
  void DropDownstream();
  void HandleReplicate(const std::string& from, const ChainMessage& msg, int64_t now,
                       ChainOutput* out);
  void HandleAck(const std::string& from, const ChainMessage& msg, int64_t now, ChainOutput* out);
  void HandleCommit(const std::string& from, const ChainMessage& msg, int64_t now,
                    ChainOutput* out);
  // The tail's kCommit to the head (ChainOptions::direct_commit).
  void SendCommit(ChainOutput* out);
  void HandleSyncRequest(const std::string& from, const ChainMessage& msg, int64_t now,
                         ChainOutput* out);
  void SendSyncRequest(int64_t now, ChainOutput* out);
  // Joiner whose store may hold writes the chain's history does not
  // (copy_end_ contradicted, or dirty_ after a restart): empty it and ask
  // for everything.
  void StartOver(int64_t now, ChainOutput* out);
  // Has "to" start over from a copy of this store (out->snapshots), keeping
  // the log from here for its catch-up.
  void RequestSnapshot(const std::string& to, int64_t now, ChainOutput* out);
  // An empty kReplicate to the downstream: the commit point, and "I am
  // your predecessor".
  void Heartbeat(ChainOutput* out);

  const std::string self_;
  const ChainOptions options_;

  ChainConfig config_;
  bool have_config_ = false;
  int index_ = -1;          // in config_.members, -1 if not there
  bool was_member_ = false; // in the chain at some point (then leaving = fenced)
  // A member that joined serves reads only once its predecessor showed a
  // commit point it has reached (it registered holding every committed write).
  bool verified_ = true;
  bool fenced_ = false;     // SetFenced(true)
  int64_t now_ = INT64_MIN;        // the latest "now" of any event
  int64_t lease_end_ = INT64_MIN;  // OnSessionAnswer: the lease holds before this
  bool was_leased_ = false;        // Leased() at the last CheckLease
  bool company_ = false;    // other members or a joiner since the lease last held
  int64_t epoch_ = 0;       // as head: the epoch of new writes

  ChainPosition applied_;
  // The commit point: the highest seq known applied by a tail (any chain's),
  // and the one reported under the current chain (what answers writes and
  // gates reads; acks carry it).
  uint64_t committed_ = 0;
  uint64_t chain_committed_ = 0;
  uint64_t record_at_ = 0;       // head: record the chain once chain_committed_ reaches it
  int64_t chain_since_ = 0;      // the ring version this member first saw the current chain at
  bool record_sent_ = false;
  int64_t record_sent_ms_ = 0;   // when out->record was last asked for
  std::deque<ChainEntry> log_;   // (log_base_, applied_], contiguous
  ChainPosition log_base_;
  uint64_t log_bytes_ = 0;
  uint64_t pin_ = UINT64_MAX;    // keep entries after this for a snapshot in flight
  int64_t pin_until_ = 0;

  // Downstream: the successor, or a joiner after the tail.
  std::string down_;
  bool down_is_joiner_ = false;
  uint64_t down_applied_ = 0;
  // The highest commit point a member after this one has known (under any
  // chain), from its acks' floor.
  uint64_t down_floor_ = 0;
  bool down_known_ = true;  // down_applied_ came from its ack (not assumed)
  uint64_t sent_upto_ = 0;
  int64_t down_progress_ms_ = 0;  // last ack from downstream (or start)

  // Upstream acks.
  uint64_t acked_applied_ = UINT64_MAX;  // last ack sent: applied, committed
  uint64_t acked_committed_ = 0;
  uint64_t acked_floor_ = 0;
  int64_t last_ack_ms_ = 0;
  uint64_t commit_sent_ = 0;  // last kCommit sent to the head (direct_commit)...
  uint64_t commit_sent_chain_ = 0;  // ...under this chain
  // sends_before_sync: the head's commit point under this chain as the
  // tail last heard it (kCommit down), and as the head last sent it.
  uint64_t read_safe_ = 0;
  uint64_t commit_down_ = 0;
  uint64_t commit_down_chain_ = 0;

  // Head: writes waiting for the commit point (sync), in seq order.
  struct Pending {
    uint64_t seq;
    uint64_t request;
  };
  std::deque<Pending> pending_;
  // Tail with a joiner: reads waiting for a key's writes to commit.
  struct ParkedRead {
    uint64_t request;
    uint64_t key;
    uint64_t until;
  };
  std::vector<ParkedRead> parked_;

  // Joiner.
  bool joining_ = false;
  bool snapshotting_ = false;    // loading a snapshot taken at snapshot_at_
  ChainPosition snapshot_at_;
  std::string snapshot_from_;
  uint64_t snapshot_token_ = 0;
  bool register_sent_ = false;
  std::string register_from_;      // the tail whose stream made it register
  bool registered_alone_ = false;  // registered on an empty chain
  bool intact_ = true;             // holds every write it applied
  // The loaded copy may hold writes up to here (seq 0: nothing beyond
  // applied_): not a member of the chain's history until it applied the
  // chain's write at this seq and found this epoch.
  ChainPosition copy_end_;
  // Restarted while catching up from a copy (not intact, at a position):
  // its store may hold writes of a discarded branch. Emptied before it
  // catches up from a tail.
  bool dirty_ = false;
  // Its store is a new mark's import (Rebase): the ring change made it the
  // whole of the mark's data, whatever chain a record of an earlier life of
  // the mark (removed since) names.
  bool imported_ = false;
  bool left_ = false;              // was in the chain, then not: out until it rejoins
  int64_t registration_ = 0;       // czxid of our member node (OnRegistered), 0 if none
  uint64_t registration_session_ = 0;  // the session that made it
  // Registrations (member, epoch) this member asked to evict: each once.
  std::vector<std::pair<std::string, int64_t>> evicted_;
  int64_t join_progress_ms_ = 0;
  uint64_t refused_ = 0;
};

}  // namespace flatkv::partition
