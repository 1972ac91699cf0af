#include "partition/change.h"

#include <algorithm>
#include <climits>

namespace flatkv::partition {

std::vector<HashRange> RangesTakenBy(const Ring& ring, int64_t mark) {
  std::vector<HashRange> out;
  if (ring.empty() || ring.Find(mark) != nullptr) return out;
  const std::vector<Partition>& parts = ring.partitions();
  // The marks below and above "mark" (cyclically): it takes [below, mark - 1],
  // all of which "above" owns now.
  auto it = std::lower_bound(parts.begin(), parts.end(), mark,
                             [](const Partition& p, int64_t m) { return p.mark < m; });
  const size_t above = it == parts.end() ? 0 : static_cast<size_t>(it - parts.begin());
  const size_t below = it == parts.begin() ? parts.size() - 1
                                           : static_cast<size_t>(it - parts.begin()) - 1;
  const int64_t from = parts[below].mark;
  if (from < mark) {
    out.push_back({from, mark - 1, above});
  } else {  // wraps: [from, INT64_MAX] and [INT64_MIN, mark - 1]
    out.push_back({from, INT64_MAX, above});
    if (mark > INT64_MIN) out.push_back({INT64_MIN, mark - 1, above});
  }
  return out;
}

RingChange PlanAdd(const Ring& ring, int64_t mark, const std::string& importer) {
  RingChange change;
  change.kind = "add";
  change.mark = mark;
  change.into = mark;
  change.importer = importer;
  change.state = "precopy";
  const std::vector<HashRange> ranges = RangesTakenBy(ring, mark);
  if (!ranges.empty()) change.source = ring.partitions()[ranges.front().partition].mark;
  for (const HashRange& r : ranges) change.ranges.emplace_back(r.lo, r.hi);
  return change;
}

// PlanRemove without the check that "into" has a member.
static Status RemovePlan(const Ring& ring, int64_t removed, RingChange* out,
                         const Partition** into) {
  const std::vector<Partition>& parts = ring.partitions();
  const Partition* p = ring.Find(removed);
  if (p == nullptr) {
    return Status::InvalidArgument("mark " + std::to_string(removed) + " is not in the ring");
  }
  if (parts.size() < 2) {
    return Status::InvalidArgument("mark " + std::to_string(removed) +
                                   " is the ring's only mark: nothing would inherit its keys");
  }
  // The next mark up inherits the range (the lowest, if this is the highest).
  const size_t at = static_cast<size_t>(p - parts.data());
  *into = &parts[(at + 1) % parts.size()];
  RingChange change;
  change.kind = "remove";
  change.mark = removed;
  change.source = removed;
  change.into = (*into)->mark;
  change.state = "precopy";
  for (const HashRange& r : ring.KeyOrder()) {
    if (r.partition == at) change.ranges.emplace_back(r.lo, r.hi);
  }
  *out = std::move(change);
  return Status::OK();
}

Status PlanRemove(const Ring& ring, int64_t removed, RingChange* out) {
  const Partition* into = nullptr;
  RingChange change;
  FLATKV_RETURN_IF_ERROR(RemovePlan(ring, removed, &change, &into));
  if (into->chain.empty()) {
    return Status::Unavailable("mark " + std::to_string(into->mark) +
                               ", which would inherit the keys, has no serving member");
  }
  change.importer = into->chain.front().address();
  *out = std::move(change);
  return Status::OK();
}

bool Moving(const RingChange& change, int64_t self_mark, int64_t h, bool write, bool released) {
  if (!change.Covers(h)) return false;
  if (change.source == self_mark) {
    return write ? change.state != "precopy" : change.state == "drop";
  }
  if (change.into == self_mark) return !released;
  return false;
}

std::vector<std::string> ReleasedBy(const Ring& ring, const RingChange& change) {
  std::vector<std::string> members;
  const Partition* source = ring.Find(change.source);
  if (source == nullptr) return members;
  for (auto m = source->chain.rbegin(); m != source->chain.rend(); ++m) {
    members.push_back(m->address());
  }
  return members;
}

bool MustLeave(const Ring& ring, int64_t self_mark, bool mark_seen) {
  const RingChange* c = ring.change();
  if (c != nullptr && c->kind == "remove" && c->mark == self_mark && c->state != "copy" &&
      c->state != "precopy") {
    return true;
  }
  const Partition* own = ring.Find(self_mark);
  if (own != nullptr ? own->in_marks : !mark_seen) return false;
  // Member nodes create their mark node first, so a view listing a member
  // of a mark without its node saw the node deleted (a finished remove);
  // so did this process, if it had seen the node and sees none of the mark.
  return std::any_of(ring.partitions().begin(), ring.partitions().end(),
                     [](const Partition& p) { return p.in_marks; });
}

const char* StepName(ChangeStep::Kind kind) {
  switch (kind) {
    case ChangeStep::kDone: return "done";
    case ChangeStep::kWait: return "wait";
    case ChangeStep::kRegister: return "register";
    case ChangeStep::kCreate: return "create";
    case ChangeStep::kTrack: return "track";
    case ChangeStep::kFence: return "fence";
    case ChangeStep::kDelta: return "delta";
    case ChangeStep::kWipe: return "wipe";
    case ChangeStep::kCopy: return "copy";
    case ChangeStep::kPersist: return "persist";
    case ChangeStep::kSetState: return "set-state";
    case ChangeStep::kRelease: return "release";
    case ChangeStep::kDrop: return "drop";
    case ChangeStep::kDeleteMark: return "delete-mark";
    case ChangeStep::kDelete: return "delete";
  }
  return "?";
}

ChangeStep ChangeMachine::Step(ChangeStep::Kind kind, const RingChange& change) {
  ChangeStep s;
  s.kind = kind;
  s.change = change;
  return s;
}

ChangeStep ChangeMachine::Wait(std::string reason) {
  ChangeStep s;
  s.kind = ChangeStep::kWait;
  s.reason = std::move(reason);
  return s;
}

bool ChangeMachine::Listed(const Ring& ring) const {
  const Partition* own = ring.Find(mark_);
  return own != nullptr && std::any_of(own->chain.begin(), own->chain.end(),
                                       [&](const Member& m) { return m.address() == self_; });
}

ChangeStep ChangeMachine::Register(bool create_mark, const RingChange& change) {
  if (asked_ == (create_mark ? Asked::kCreate : Asked::kPlain)) {
    return Wait("waiting for this member to be listed in the ring");
  }
  ChangeStep s = Step(ChangeStep::kRegister, change);
  s.create_mark = create_mark;
  return s;
}

bool ChangeMachine::Leaving(const Ring& ring) {
  const bool leave = MustLeave(ring, mark_, mark_seen_);
  const Partition* own = ring.Find(mark_);
  if (own != nullptr && own->in_marks) mark_seen_ = true;
  return leave;
}

ChangeStep ChangeMachine::Next(const Ring& ring, bool head) {
  // A removed mark's member changes nothing more: it would add its mark
  // back (its view has no trace of it) or act on a ring it is leaving.
  if (Leaving(ring)) {
    return Wait("mark " + std::to_string(mark_) + " was removed from the ring: this member leaves");
  }
  // The change this member flipped is over once a view no longer holds its
  // node: whoever deleted it had done every step (a remove deletes the
  // removed mark's node before the change node), maybe another head while
  // this one was cut off from ZooKeeper. A step of it now would undo what
  // came after, such as deleting the node of a mark added back since.
  if (flipped_ && (ring.change() == nullptr || ring.change()->czxid != flipped_->czxid)) {
    Finished(flipped_->czxid);
  }
  const RingChange* c = ring.change();
  // A view from before this member deleted its change.
  if (c != nullptr && finished_czxid_ != 0 && c->czxid == finished_czxid_) c = nullptr;
  if (join_ && !registered_ && asked_ != Asked::kNone && Listed(ring)) registered_ = true;
  if (flipped_) return AfterFlip(ring);
  const bool add = c != nullptr && c->kind == "add" && c->importer == self_ && c->mark == mark_;
  // A remove is imported by the head of the inheriting mark: the one it
  // named, or whoever heads that chain now (its head died mid-copy; a stale
  // head's chain writes are refused by the chain's own fencing).
  const bool remove = c != nullptr && c->kind == "remove" && c->into == mark_ &&
                      (c->importer == self_ || head);
  if (add || remove) {
    created_ = false;
    if (c->state != "copy" && c->state != "precopy") {
      // Copied and durable: never copy again (the ring may flip any moment).
      flipped_ = *c;
      released_ = false;
      dropped_ = false;
      mark_deleted_ = false;
      return AfterFlip(ring);
    }
    if (add && ring.Find(mark_) != nullptr) {
      // Registered meanwhile as a first mark (the ring looked empty): the
      // import is moot, and a change still copying is always safe to undo.
      ChangeStep s = Step(ChangeStep::kDelete, *c);
      s.reason = "moot: mark " + std::to_string(mark_) + " is in the ring already";
      return s;
    }
    // A remove's importer whose session expired registers first.
    if (remove && join_ && !registered_) return Register(false, {});
    return Copy(ring, *c, head);
  }
  if (!join_ || registered_) return ChangeStep();
  // A member of a mark the ring has registers (only while the mark's node
  // exists); the first mark of an empty ring creates it.
  if (ring.Find(mark_) != nullptr) return Register(false, {});
  // A ring with no mark yet: this one registers as its first (instances of
  // a new ring that start together may all do so; nothing is stored yet).
  if (ring.empty() || asked_ == Asked::kCreate) return Register(true, {});
  // The add gate.
  if (c != nullptr) {
    created_ = false;
    return Wait("another ring change runs (" + c->ToJson() + "); waiting for it");
  }
  if (created_) return Wait("waiting for the ring to show the change node this member created");
  // Even a range that holds no key at its owner now moves through a
  // change: without the fence the owner could take a write there between
  // a look and the flip, and the flip would hide it.
  return Step(ChangeStep::kCreate, PlanAdd(ring, mark_, self_));
}

ChangeStep ChangeMachine::Copy(const Ring& ring, const RingChange& seen, bool head) {
  // This member wrote state copy itself: a view still showing precopy lags.
  RingChange change = seen;
  if (change.state == "precopy" && precopied_ == change.czxid) change.state = "copy";
  if (copy_czxid_ != change.czxid || copy_state_ != change.state) {
    if (copy_czxid_ != change.czxid) full_ = false;
    copy_czxid_ = change.czxid;
    copy_state_ = change.state;
    phase_ = 0;
  }
  // precopy: writes still flow; the record covers every write the copy may miss.
  static constexpr ChangeStep::Kind kPre[] = {ChangeStep::kTrack, ChangeStep::kWipe,
                                              ChangeStep::kCopy, ChangeStep::kSetState};
  // copy after this process's pre-copy: only the recorded keys.
  static constexpr ChangeStep::Kind kDelta[] = {ChangeStep::kFence, ChangeStep::kDelta,
                                                ChangeStep::kPersist, ChangeStep::kSetState};
  // copy otherwise (a restart, a record not continuous): everything, fenced.
  static constexpr ChangeStep::Kind kAdd[] = {ChangeStep::kFence, ChangeStep::kWipe,
                                              ChangeStep::kCopy, ChangeStep::kPersist,
                                              ChangeStep::kSetState};
  // A remove copies through this mark's chain; its wipe removes only what
  // an earlier attempt copied into the ranges (the mark keeps its own keys).
  static constexpr ChangeStep::Kind kRemovePre[] = {ChangeStep::kTrack, ChangeStep::kWipe,
                                                    ChangeStep::kCopy, ChangeStep::kSetState};
  static constexpr ChangeStep::Kind kRemoveDelta[] = {ChangeStep::kFence, ChangeStep::kDelta,
                                                      ChangeStep::kSetState};
  static constexpr ChangeStep::Kind kRemove[] = {ChangeStep::kFence, ChangeStep::kWipe,
                                                 ChangeStep::kCopy, ChangeStep::kSetState};
  if (phase_ == 0) {
    // The change was planned on its creator's view, which may have lagged
    // behind a change that finished just before. This view read the node
    // first and the marks after, and no mark comes or goes while the node
    // exists: if the plan differs from it, roll the change back.
    RingChange plan;
    if (change.kind == "remove") {
      const Partition* into = nullptr;
      if (!RemovePlan(ring, change.mark, &plan, &into).ok()) plan = RingChange();
    } else {
      plan = PlanAdd(ring, mark_, self_);
    }
    if (plan.ranges != change.ranges || plan.source != change.source ||
        plan.into != change.into) {
      ChangeStep s = Step(ChangeStep::kDelete, change);
      s.reason = "planned on a ring that changed since (now: " + plan.ToJson() + ")";
      return s;
    }
  }
  const ChangeStep::Kind* steps = change.state == "precopy" ? kPre
                                  : delta(change.czxid)     ? kDelta
                                                            : kAdd;
  if (change.kind == "remove") {
    if (ring.Find(change.source) == nullptr) {
      return Wait("the removed mark " + std::to_string(change.source) + " is not in the ring");
    }
    if (!head) {
      // Another member may import meanwhile: this one's pre-copy is stale.
      precopied_ = 0;
      return Wait("only the head of mark " + std::to_string(mark_) +
                  " imports a removed mark's keys");
    }
    steps = change.state == "precopy" ? kRemovePre
            : delta(change.czxid)     ? kRemoveDelta
                                      : kRemove;
  }
  ChangeStep s = Step(steps[phase_], change);
  if (s.kind == ChangeStep::kSetState) s.change.state = change.state == "precopy" ? "copy" : "flip";
  return s;
}

ChangeStep ChangeMachine::AfterFlip(const Ring& ring) {
  const RingChange& c = *flipped_;
  if (c.kind == "add") {
    // Asked by this process (a listing may be an earlier process's node
    // waiting for its session to expire), then listed.
    if (asked_ != Asked::kCreate || !Listed(ring)) return Register(true, c);
    registered_ = true;
    if (c.state != "drop") {
      ChangeStep s = Step(ChangeStep::kSetState, c);
      s.change.state = "drop";
      return s;
    }
    if (!released_ || !dropped_) {
      if (ring.Find(c.source) == nullptr) {
        return Wait("ring change: source mark " + std::to_string(c.source) +
                    " is not in the ring");
      }
      return Step(released_ ? ChangeStep::kDrop : ChangeStep::kRelease, c);
    }
    return Step(ChangeStep::kDelete, c);
  }
  const Partition* removed = ring.Find(c.source);
  if (removed != nullptr && !removed->chain.empty()) {
    return Wait("waiting for mark " + std::to_string(c.source) + "'s members to leave");
  }
  if (!mark_deleted_) return Step(ChangeStep::kDeleteMark, c);
  return Step(ChangeStep::kDelete, c);
}

void ChangeMachine::Done(const ChangeStep& step, const Status& st) {
  switch (step.kind) {
    case ChangeStep::kDone:
    case ChangeStep::kWait:
      return;
    case ChangeStep::kRegister:
      // Asked; registered once the ring lists this member.
      asked_ = !st.ok() ? Asked::kNone : step.create_mark ? Asked::kCreate : Asked::kPlain;
      return;
    case ChangeStep::kCreate:
      created_ = st.ok();
      return;
    case ChangeStep::kTrack:
    case ChangeStep::kFence:
    case ChangeStep::kWipe:
    case ChangeStep::kCopy:
    case ChangeStep::kPersist:
      // A failure starts the pass over: (track,) fence, (wipe,) copy again.
      phase_ = st.ok() ? phase_ + 1 : 0;
      return;
    case ChangeStep::kDelta:
      if (st.IsNotFound()) {
        // No continuous record: wipe and copy everything, still fenced
        // (kAdd's step after the fence).
        full_ = true;
        phase_ = 1;
        return;
      }
      phase_ = st.ok() ? phase_ + 1 : 0;
      return;
    case ChangeStep::kSetState:
      if (!st.ok()) {
        // Not written, or written and not yet seen: the next view says.
        if (step.change.state == "flip" || step.change.state == "copy") phase_ = 0;
        return;
      }
      if (step.change.state == "copy") {
        precopied_ = step.change.czxid;
        full_ = false;
        return;
      }
      if (step.change.state == "flip") {
        StartAfresh(step.change);
      } else if (flipped_) {
        flipped_->state = step.change.state;
      }
      return;
    case ChangeStep::kRelease:
      if (st.ok()) released_ = true;
      return;
    case ChangeStep::kDrop:
      if (st.ok()) dropped_ = true;
      return;
    case ChangeStep::kDeleteMark:
      if (st.ok()) mark_deleted_ = true;
      return;
    case ChangeStep::kDelete:
      if (st.ok()) Finished(step.change.czxid);
      return;
  }
}

void ChangeMachine::Finished(int64_t czxid) {
  finished_czxid_ = czxid;
  StartAfresh(std::nullopt);
}

void ChangeMachine::StartAfresh(std::optional<RingChange> flipped) {
  flipped_ = std::move(flipped);
  released_ = false;
  dropped_ = false;
  mark_deleted_ = false;
  copy_czxid_ = 0;
  copy_state_.clear();
  precopied_ = 0;
  phase_ = 0;
}

bool ChangeMachine::Released(const RingChange& change) const {
  if (finished_czxid_ != 0 && change.czxid == finished_czxid_) return true;
  return flipped_ && flipped_->czxid == change.czxid && released_;
}

}  // namespace flatkv::partition
