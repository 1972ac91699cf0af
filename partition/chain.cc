#include "partition/chain.h"

#include <algorithm>
#include <utility>

namespace flatkv::partition {
namespace {

uint64_t EntryBytes(const ChainEntry& e) { return e.op.size() + 8 * e.keys.size() + 32; }

const std::string kNone;

}  // namespace

ChainMember::ChainMember(std::string self, ChainOptions options, ChainPosition durable,
                         bool intact)
    : self_(std::move(self)),
      options_(options),
      applied_(durable),
      log_base_(durable),
      intact_(intact),
      dirty_(!intact && durable.seq > 0) {}

const char* RoleName(ChainRole role) {
  switch (role) {
    case ChainRole::kNone: return "none";
    case ChainRole::kSyncing: return "syncing";
    case ChainRole::kFenced: return "fenced";
    case ChainRole::kSingle: return "single";
    case ChainRole::kHead: return "head";
    case ChainRole::kMiddle: return "middle";
    case ChainRole::kTail: return "tail";
  }
  return "none";
}

ChainRole ChainMember::chain_role() const {
  if (fenced_ && (in_chain() || was_member_)) return ChainRole::kFenced;
  if (joining_) return ChainRole::kSyncing;
  if (!in_chain()) return was_member_ ? ChainRole::kFenced : ChainRole::kNone;
  if (config_.members.size() == 1) return ChainRole::kSingle;
  if (is_head()) return ChainRole::kHead;
  return is_tail() ? ChainRole::kTail : ChainRole::kMiddle;
}

const std::string& ChainMember::predecessor() const {
  if (index_ > 0) return config_.members[static_cast<size_t>(index_) - 1];
  if (joining_ && !config_.members.empty()) return config_.members.back();
  return kNone;
}

uint64_t ChainMember::lag_writes() const {
  if (down_.empty()) return 0;
  return applied_.seq > down_applied_ ? applied_.seq - down_applied_ : 0;
}

uint64_t ChainMember::lag_bytes() const {
  uint64_t bytes = 0;
  if (down_.empty()) return 0;
  for (auto it = log_.rbegin(); it != log_.rend() && it->seq > down_applied_; ++it) {
    bytes += it->op.size();
  }
  return bytes;
}

void ChainMember::OnConfig(const ChainConfig& config, int64_t now, ChainOutput* out) {
  Clock(now);
  if (have_config_ && config.version < config_.version) return;  // a late, stale view
  const bool was_head = is_head();
  const bool new_chain = !have_config_ || config.id != config_.id;
  const std::string old_tail = config_.members.empty() ? std::string() : config_.members.back();
  config_ = config;
  have_config_ = true;
  // In the chain only under this member's own current registration: a node
  // of an earlier one (or of its dead process) is a stale view.
  index_ = -1;
  for (size_t k = 0; k < config_.members.size(); ++k) {
    if (config_.members[k] == self_ && config_.epochs[k] == registration_ && registration_ != 0) {
      index_ = static_cast<int>(k);
    }
  }
  if (in_chain() && left_) index_ = -1;

  if (!in_chain()) {
    if (was_member_ && !joining_) left_ = true;  // only StartJoin brings it back
    if (was_head || !pending_.empty()) {
      FailPending(Status::Unavailable("this member left the chain (session lost)"), out);
    }
    if (!down_.empty()) DropDownstream();  // only a chain member has a downstream
    for (const ParkedRead& r : parked_) {
      out->replies.push_back({r.request, Status::Unavailable("this member left the chain")});
    }
    parked_.clear();
    const std::string tail = config_.members.empty() ? std::string() : config_.members.back();
    if (joining_ && register_sent_ && tail != old_tail) {
      // Caught up with a tail that is no longer the tail: the new one may
      // hold more. Withdraw the registration (if it was made) and ask it.
      register_sent_ = false;
      Deregister(out);
    }
    if (joining_ && snapshotting_ && tail != snapshot_from_) {
      snapshotting_ = false;  // its source is no longer the tail: start over from the new one
    }
    if (joining_ && !snapshotting_ && !register_sent_) SendSyncRequest(now, out);
    return;
  }
  if (registered_alone_ && (index_ > 0 || !MayStartAlone())) {
    // Registered on what looked like an empty chain, but an older member
    // is there, or the ring read since names a recorded chain this store
    // does not hold (the view it registered on was stale: a chain formed
    // and recorded without it meanwhile): this store may lack its writes.
    // Leave and catch up.
    registered_alone_ = false;
    LeaveToRejoin(out);
    SendSyncRequest(now, out);
    return;
  }
  if (joining_ && register_sent_ && !registered_alone_ && predecessor() != register_from_) {
    // Caught up from a tail that is not its predecessor in the chain it
    // registered into (that tail left, or was expired unaware and served a
    // chain ZooKeeper had already replaced): what it holds was vouched for
    // by another member's history. Withdraw and catch up from this chain.
    register_sent_ = false;
    Deregister(out);
    index_ = -1;
    SendSyncRequest(now, out);
    return;
  }
  const bool alone = registered_alone_;
  registered_alone_ = false;
  left_ = false;
  if (config_.members.size() > 1) company_ = true;
  // A joiner that registered holds the commit point only once its
  // predecessor shows it (one that started the chain alone holds it).
  if (joining_) verified_ = alone && index_ == 0;
  // A recorded chain was recorded only once its tail held the commit
  // point, and every member before the tail holds more: all hold it.
  if (Recorded()) verified_ = true;
  if (ChainRecorded()) imported_ = false;  // the record names it now
  if (!verified_ && index_ == 0) {
    // First in the chain without the commit point (its predecessors left
    // before it caught up): it must not lead. Leave; the mark waits for a
    // member of the recorded chain.
    Deregister(out);
    DropDownstream();
    index_ = -1;
    joining_ = true;
    register_sent_ = false;
    SendSyncRequest(now, out);
    return;
  }
  if (verified_) intact_ = true;  // in the chain holding the commit point
  joining_ = false;
  snapshotting_ = false;
  register_sent_ = false;
  was_member_ = true;
  if (new_chain) {
    // A new chain: its own commit point starts from nothing (the end's is
    // what it applied). It is recorded, and writes answered, only once its
    // tail has everything committed before (record_at_).
    chain_committed_ = 0;
    read_safe_ = 0;
    record_at_ = committed_;
    record_sent_ = false;
    chain_since_ = config_.version;
  }
  if (is_head()) {
    epoch_ = config_.epochs[0];
  } else if (was_head || !pending_.empty()) {
    FailPending(Status::Unavailable("no longer the head of the chain"), out);
  }

  const size_t next = static_cast<size_t>(index_) + 1;
  if (next < config_.members.size()) {
    const std::string& succ = config_.members[next];
    if (down_ != succ) {
      // A new successor: send everything after the commit point (what it
      // should have), until its first ack says where it really is.
      down_ = succ;
      down_floor_ = 0;
      down_applied_ = std::min(committed_, applied_.seq);
      down_known_ = false;
      sent_upto_ = down_applied_;
      down_progress_ms_ = now;
      Heartbeat(out);
    } else if (new_chain || down_is_joiner_) {
      // The same successor under a new chain (or the joiner it registered
      // as): tell it the commit point now. A member that joined is
      // verified only by a floor it holds, and its acks keep this side's
      // resend timer quiet, so on an idle chain nothing else would.
      Heartbeat(out);
    }
    down_is_joiner_ = false;
  } else if (!down_is_joiner_) {
    DropDownstream();
  }
  if (!is_tail() && !parked_.empty()) {
    for (const ParkedRead& r : parked_) {
      out->replies.push_back({r.request, Status::Unavailable("no longer the tail of the chain")});
    }
    parked_.clear();
  }
  Commit(is_end() ? applied_.seq : 0, out);
  acked_applied_ = UINT64_MAX;  // tell the (maybe new) predecessor where we are
  if (!is_head()) SendAck(now, out);
  Pump(now, out);
}

void ChainMember::OnSessionAnswer(int64_t sent, int64_t session_timeout_ms, int64_t now,
                                  ChainOutput* out, uint64_t session) {
  Clock(now);
  if (registration_ != 0 && session != registration_session_) {
    // The session that held this member's registration is gone, and the
    // registration with it.
    if (joining_) {
      registration_ = 0;
      register_sent_ = false;  // catch up and register again (OnTick)
    } else {
      SetFenced(true, out);  // out of the chain; the shell has it rejoin
    }
  }
  if (session_timeout_ms <= 0) return;
  lease_end_ = std::max(lease_end_, sent + session_timeout_ms / 2);
  if (now_ >= lease_end_) return;  // answered too late to count
  company_ = config_.members.size() > 1 || !down_.empty();
  was_leased_ = true;
  Release(out);
}

void ChainMember::CheckLease(ChainOutput* out) {
  const bool leased = Leased();
  if (was_leased_ && !leased) {
    // ZooKeeper may be expiring this member now and forming the chain
    // without it: answer nobody from here (no hanging until a client's
    // timeout). A pending write went down the chain: it may still commit.
    FailPending(Status::Unavailable("no ZooKeeper lease (this member may have been replaced)"),
                out);
    for (const ParkedRead& r : parked_) {
      out->replies.push_back({r.request, Status::Unavailable("no ZooKeeper lease")});
    }
    parked_.clear();
  }
  was_leased_ = leased;
}

void ChainMember::SetFenced(bool fenced, ChainOutput* out) {
  if (fenced == fenced_) return;
  fenced_ = fenced;
  if (fenced) {
    lease_end_ = INT64_MIN;  // the session is gone: only a new one's answers count
    FailPending(Status::Unavailable("this member lost its ZooKeeper session"), out);
    for (const ParkedRead& r : parked_) out->replies.push_back({r.request, Status::Unavailable(
        "this member lost its ZooKeeper session")});
    parked_.clear();
  }
}

void ChainMember::OnWrite(uint64_t request, std::vector<uint64_t> keys, std::string op,
                          int64_t now, ChainOutput* out) {
  Clock(now);
  if (fenced_ || !is_head()) {
    out->replies.push_back(
        {request, Status::Unavailable(fenced_ ? "this member lost its ZooKeeper session"
                                              : std::string("not the head of the chain (") +
                                                    role() + ")")});
    return;
  }
  if (!Leased()) {
    out->replies.push_back({request, Status::Unavailable(
        "no ZooKeeper lease (this member may have been replaced); not applied")});
    return;
  }
  ChainEntry e;
  e.seq = applied_.seq + 1;
  e.epoch = epoch_;
  e.keys = std::move(keys);
  e.op = std::move(op);
  const uint64_t seq = e.seq;
  Apply(std::move(e), out);
  pending_.push_back({seq, request});
  if (is_end()) {
    Commit(applied_.seq, out);
  } else {
    Release(out);
  }
  Pump(now, out);
}

void ChainMember::Deregister(ChainOutput* out) {
  out->deregister = true;
  registration_ = 0;
}

void ChainMember::LeaveToRejoin(ChainOutput* out) {
  Deregister(out);
  FailPending(Status::Unavailable("rejoining the chain"), out);
  DropDownstream();
  joining_ = true;
  register_sent_ = false;
  index_ = -1;
}

void ChainMember::Apply(ChainEntry entry, ChainOutput* out) {
  applied_ = {entry.epoch, entry.seq};
  log_bytes_ += EntryBytes(entry);
  out->apply.push_back(entry);
  log_.push_back(std::move(entry));
  Trim();
}

void ChainMember::Trim() {
  // Keep every entry the tail has not applied (and what a snapshot in
  // flight will need), and up to backlog_bytes of the others.
  while (!log_.empty()) {
    const ChainEntry& e = log_.front();
    if (e.seq > committed_ || e.seq > pin_ || log_bytes_ <= options_.backlog_bytes) break;
    log_bytes_ -= EntryBytes(e);
    log_base_ = {e.epoch, e.seq};
    log_.pop_front();
  }
}

bool ChainMember::Covers(const ChainPosition& p) const {
  if (p.seq > applied_.seq) return false;
  if (p == log_base_) return true;
  if (p.seq <= log_base_.seq || log_.empty()) return p == applied_;
  const ChainEntry& e = log_[p.seq - log_.front().seq];
  return e.epoch == p.epoch;
}

void ChainMember::DropDownstream() {
  down_known_ = true;
  down_floor_ = 0;
  down_.clear();
  down_is_joiner_ = false;
  down_applied_ = 0;
  sent_upto_ = 0;
}

namespace {
uint64_t OpBytes(const ChainMessage& m) {
  uint64_t bytes = 0;
  for (const ChainEntry& e : m.entries) bytes += e.op.size();
  return bytes;
}
}  // namespace

void ChainMember::Pump(int64_t now, ChainOutput* out) {
  if (down_.empty() || fenced_) return;
  if (sent_upto_ < log_base_.seq) {
    // The downstream lacks writes this log no longer holds: a joiner that
    // fell behind starts over from a copy of this store. (A successor in
    // the chain always holds the commit point, which the log keeps; if one
    // did not, the copy is offered to it too, and it takes it unless it
    // has shown it holds the commit point.)
    std::string to = down_;
    if (down_is_joiner_) {
      DropDownstream();
    } else {
      sent_upto_ = log_base_.seq;
    }
    RequestSnapshot(to, now, out);
    if (!down_.empty()) Pump(now, out);
    return;
  }
  while (sent_upto_ < applied_.seq) {
    ChainMessage m;
    m.kind = ChainMessage::Kind::kReplicate;
    m.chain = config_.id;
    uint64_t bytes = 0;
    size_t i = static_cast<size_t>(sent_upto_ - log_base_.seq);
    while (i < log_.size() && m.entries.size() < options_.max_batch_entries &&
           (m.entries.empty() || bytes + log_[i].op.size() <= options_.max_batch_bytes)) {
      bytes += log_[i].op.size();
      m.entries.push_back(log_[i]);
      ++i;
    }
    sent_upto_ = m.entries.back().seq;
    m.applied = applied_.seq;
    m.committed = chain_committed_;
    m.floor = committed_;
    // Merge into a message to the same member already in this output.
    bool merged = false;
    for (ChainOutput::Send& s : out->sends) {
      if (s.to == down_ && s.msg.kind == ChainMessage::Kind::kReplicate &&
          s.msg.chain == m.chain && !s.msg.entries.empty() &&
          s.msg.entries.back().seq + 1 == m.entries.front().seq &&
          s.msg.entries.size() + m.entries.size() <= options_.max_batch_entries &&
          OpBytes(s.msg) + bytes <= options_.max_batch_bytes) {
        for (ChainEntry& e : m.entries) s.msg.entries.push_back(std::move(e));
        s.msg.applied = m.applied;
        s.msg.committed = m.committed;
        s.msg.floor = m.floor;
        merged = true;
        break;
      }
    }
    if (!merged) out->sends.push_back({down_, std::move(m)});
  }
}

void ChainMember::SendLatest(const std::string& to, ChainMessage m, ChainOutput* out) {
  for (ChainOutput::Send& s : out->sends) {
    if (s.to == to && s.msg.kind == m.kind) {
      s.msg = std::move(m);
      return;
    }
  }
  out->sends.push_back({to, std::move(m)});
}

void ChainMember::SendAck(int64_t now, ChainOutput* out) {
  const std::string& pred = predecessor();
  if (pred.empty()) return;
  const uint64_t floor = ack_floor();
  if (acked_applied_ == applied_.seq && acked_committed_ == chain_committed_ &&
      acked_floor_ == floor) {
    return;
  }
  acked_applied_ = applied_.seq;
  acked_committed_ = chain_committed_;
  acked_floor_ = floor;
  last_ack_ms_ = now;
  ChainMessage m;
  m.kind = ChainMessage::Kind::kAck;
  m.chain = config_.id;
  m.applied = applied_.seq;
  m.committed = chain_committed_;
  m.floor = floor;
  m.direct = commit_sent_chain_ == config_.id && commit_sent_ >= chain_committed_;
  SendLatest(pred, std::move(m), out);
}

void ChainMember::Commit(uint64_t committed, ChainOutput* out) {
  committed = std::min(committed, applied_.seq);
  if (committed > chain_committed_) chain_committed_ = committed;
  if (chain_committed_ > committed_) committed_ = chain_committed_;
  if (is_head() && !Recorded() && !record_sent_ && chain_committed_ >= record_at_ && !fenced_) {
    record_sent_ = true;
    record_sent_ms_ = now_;
    out->record = config_.members;
    out->record_version = config_.version;
  }
  if (options_.sends_before_sync && is_head() && config_.sync && config_.members.size() >= 2 &&
      !fenced_ && (commit_down_chain_ != config_.id || commit_down_ < chain_committed_)) {
    // The tail serves reads up to here (ReadCommitted).
    commit_down_ = chain_committed_;
    commit_down_chain_ = config_.id;
    ChainMessage m;
    m.kind = ChainMessage::Kind::kCommit;
    m.chain = config_.id;
    m.applied = applied_.seq;
    m.committed = chain_committed_;
    SendLatest(config_.members.back(), std::move(m), out);
  }
  Release(out);
  Trim();
}

void ChainMember::Release(ChainOutput* out) {
  if (fenced_ || !Recorded() || !Leased()) return;
  while (is_head() && !pending_.empty() &&
         (!config_.sync || pending_.front().seq <= chain_committed_)) {
    out->replies.push_back({pending_.front().request, Status::OK()});
    pending_.pop_front();
  }
  // Parked reads are served under the rules that parked them (OnRead): by
  // the tail of a recorded chain holding its lease. One parked under an
  // earlier chain waits until they hold again (or is refused once this
  // member is no longer the tail).
  if (parked_.empty() || !is_tail()) return;
  std::vector<ParkedRead> still;
  for (const ParkedRead& r : parked_) {
    if (r.until > ReadCommitted()) {
      still.push_back(r);
      continue;
    }
    uint64_t until = DirtyUntil(r.key);
    if (until > ReadCommitted()) {
      still.push_back({r.request, r.key, until});
    } else {
      out->reads.push_back(r.request);
    }
  }
  parked_ = std::move(still);
}

void ChainMember::FailPending(const Status& status, ChainOutput* out) {
  if (pending_.empty()) return;
  // A pending write was applied here and passed down: a later head may
  // still commit it. The client is told it cannot know.
  const Status in_doubt = Status::Unavailable(
      status.message() + "; the write may or may not have been applied");
  for (const Pending& p : pending_) out->replies.push_back({p.request, in_doubt});
  pending_.clear();
}

uint64_t ChainMember::DirtyUntil(uint64_t key) const {
  const uint64_t committed = ReadCommitted();
  for (auto it = log_.rbegin(); it != log_.rend() && it->seq > committed; ++it) {
    if (std::find(it->keys.begin(), it->keys.end(), key) != it->keys.end()) return it->seq;
  }
  return 0;
}

bool ChainMember::Rebase(ChainPosition at) {
  if (in_chain()) return false;
  log_.clear();
  log_bytes_ = 0;
  applied_ = at;
  log_base_ = at;
  committed_ = 0;
  chain_committed_ = 0;
  read_safe_ = 0;
  intact_ = true;
  dirty_ = false;
  copy_end_ = {};
  imported_ = true;
  return true;
}

const ChainEntry* ChainMember::NewestUncommitted(uint64_t key) const {
  for (auto it = log_.rbegin(); it != log_.rend() && it->seq > chain_committed_; ++it) {
    if (std::find(it->keys.begin(), it->keys.end(), key) != it->keys.end()) return &*it;
  }
  return nullptr;
}

ChainMember::RepairFrom ChainMember::ChooseRepair(bool own_good, bool uncommitted_sets_it,
                                                 bool fetched) {
  if (own_good) return RepairFrom::kOwn;
  if (uncommitted_sets_it) return RepairFrom::kUncommitted;
  return fetched ? RepairFrom::kCopy : RepairFrom::kFetch;
}

std::vector<const ChainEntry*> ChainMember::Uncommitted() const {
  std::vector<const ChainEntry*> out;
  for (const ChainEntry& e : log_) {
    if (e.seq > chain_committed_) out.push_back(&e);
  }
  return out;
}

ChainMember::Read ChainMember::ReadRule(uint64_t key, uint64_t* until) const {
  if (fenced_ || !in_chain() || !verified_) return Read::kRefuse;
  if (!config_.sync) return Read::kServe;
  if (!is_tail() || !Recorded() || !Leased()) return Read::kRefuse;
  // A tail with a joiner commits only what the joiner applied: a key with
  // a write after the commit point waits for it (DirtyUntil).
  *until = DirtyUntil(key);
  return *until <= ReadCommitted() ? Read::kServe : Read::kWait;
}

ChainMember::Read ChainMember::OnRead(uint64_t request, uint64_t key, int64_t now,
                                      ChainOutput* out) {
  (void)out;
  Clock(now);  // the writes and reads a lapsed lease fails wait for OnTick
  uint64_t until = 0;
  const Read read = ReadRule(key, &until);
  if (read == Read::kWait) parked_.push_back({request, key, until});
  return read;
}

bool ChainMember::ConfirmRead(uint64_t key, int64_t now) {
  Clock(now);
  // Every write the store can have shown was handed to the shell (applied_)
  // before it read: if the read may be served now, none of this key's is
  // past the commit point, so the one it read was committed, and no later
  // one was before the read.
  uint64_t until = 0;
  return ReadRule(key, &until) == Read::kServe;
}

void ChainMember::OnMessage(const std::string& from, const ChainMessage& msg, int64_t now,
                            ChainOutput* out) {
  Clock(now);
  switch (msg.kind) {
    case ChainMessage::Kind::kReplicate:
      HandleReplicate(from, msg, now, out);
      return;
    case ChainMessage::Kind::kAck:
      HandleAck(from, msg, now, out);
      return;
    case ChainMessage::Kind::kSyncRequest:
      HandleSyncRequest(from, msg, now, out);
      return;
    case ChainMessage::Kind::kCommit:
      HandleCommit(from, msg, now, out);
      return;
    case ChainMessage::Kind::kSyncRefused:
      // Asked again on a tick (the tail may be busy or changing).
      return;
  }
}

void ChainMember::HandleReplicate(const std::string& from, const ChainMessage& msg, int64_t now,
                                  ChainOutput* out) {
  if (fenced_ || msg.chain != config_.id || from != predecessor() || from.empty() ||
      (joining_ && snapshotting_)) {
    ++refused_;
    return;
  }
  if (joining_ && copy_end_.seq != 0 && msg.applied < copy_end_.seq) {
    // The tail lacks writes the copy may hold (a branch its source had,
    // which this chain does not): they would stay.
    return StartOver(now, out);
  }
  bool gap = false;
  for (const ChainEntry& e : msg.entries) {
    if (e.seq <= applied_.seq) continue;     // have it
    if (e.seq != applied_.seq + 1) {         // a gap: wait for the resend
      gap = true;
      break;
    }
    if (e.seq == copy_end_.seq) {
      if (e.epoch != copy_end_.epoch) return StartOver(now, out);
      copy_end_ = {};  // the copy is a state of this chain's history
    }
    Apply(e, out);
  }
  // A joiner that cannot apply what it is sent asks again (on a tick).
  if (joining_ && !gap) join_progress_ms_ = now;
  if (is_end() || (joining_ && down_.empty())) {
    Commit(applied_.seq, out);
  } else {
    Commit(msg.committed, out);
  }
  SendCommit(out);
  if (in_chain() && !verified_ && msg.floor <= applied_.seq) verified_ = true;
  if (in_chain() && verified_) intact_ = true;
  if (joining_ && !register_sent_ && copy_end_.seq == 0 && msg.floor <= applied_.seq &&
      msg.applied <= applied_.seq + options_.catchup_lag) {
    register_sent_ = true;
    register_from_ = from;
    out->register_now = true;
  }
  // A member whose downstream acks what it passes on tells its predecessor
  // of these writes with that ack (HandleAck), which brings the commit
  // point too: one ack up per frame, not two. An ack with news besides
  // "applied" goes now; a lone "applied" waits at most resend_ms / 4
  // (OnTick) should the downstream be slow.
  const bool ack_follows =
      !is_end() && !down_.empty() && down_known_ && applied_.seq > down_applied_;
  // News for the predecessor besides "applied": a commit point or floor
  // above what its own frame says (the end's commit, an earlier chain's),
  // not one this member just learned from it (under direct_commit the
  // head's frames bring the tail's commit point down).
  const bool news = (acked_committed_ != chain_committed_ || acked_floor_ != ack_floor()) &&
                    std::max(chain_committed_, ack_floor()) > std::max(msg.committed, msg.floor);
  if (!ack_follows || news) SendAck(now, out);
  Pump(now, out);
}

void ChainMember::HandleAck(const std::string& from, const ChainMessage& msg, int64_t now,
                            ChainOutput* out) {
  if (msg.chain != config_.id || from != down_ || down_.empty()) {
    ++refused_;
    return;
  }
  if (msg.applied > down_applied_ || msg.applied >= sent_upto_) down_progress_ms_ = now;
  if (!down_known_) {
    // Its first ack: where it really is (a member that registered behind
    // this one's commit point is sent what it lacks, if the log has it).
    down_known_ = true;
    down_applied_ = std::min(msg.applied, applied_.seq);
    sent_upto_ = down_applied_;
  } else {
    // Acks may arrive out of order: the position only grows. (A joiner
    // that lost what it had says so with a new kSyncRequest, which resets
    // it; an ack below the log's base is an old one, not a restart: taking
    // it for one dropped a joiner that had registered, and the tail then
    // committed, and trimmed, past what its new successor held.)
    down_applied_ = std::max(down_applied_, std::min(msg.applied, applied_.seq));
  }
  // A member after this one may have committed, and as a tail served
  // reads, past what this one knows (a tail that dropped its joiner went
  // on alone): the new chain is recorded (which verifies every member)
  // only once its tail holds that too.
  down_floor_ = std::max(down_floor_, msg.floor);
  if (is_head() && !Recorded() && !record_sent_) record_at_ = std::max(record_at_, msg.floor);
  Commit(msg.committed, out);
  // The tail told the head this commit point itself (kCommit): the head's
  // successor need not relay it at once. Its own position goes up with
  // its next ack (OnTick, once resend_ms / 4 passed); the head takes the tail's
  // commit point as its progress meanwhile (HandleCommit).
  if (!(msg.direct && index_ == 1 && Recorded())) SendAck(now, out);
  Pump(now, out);
}

void ChainMember::SendCommit(ChainOutput* out) {
  // Only under sync, from a verified tail of three or more (the head's
  // successor acks it directly anyway) without a joiner (which the commit
  // point then waits for: the relayed acks), once per position and chain.
  if (!options_.direct_commit || options_.sends_before_sync || !config_.sync || !is_end() ||
      index_ < 2 || !verified_ || fenced_) {
    return;
  }
  if (commit_sent_ == applied_.seq && commit_sent_chain_ == config_.id) return;
  commit_sent_ = applied_.seq;
  commit_sent_chain_ = config_.id;
  ChainMessage m;
  m.kind = ChainMessage::Kind::kCommit;
  m.chain = config_.id;
  m.applied = applied_.seq;
  m.committed = applied_.seq;
  SendLatest(config_.members.front(), std::move(m), out);
}

void ChainMember::HandleCommit(const std::string& from, const ChainMessage& msg, int64_t now,
                               ChainOutput* out) {
  const auto& members = config_.members;
  if (options_.sends_before_sync && !is_head() && is_tail() && !members.empty() &&
      from == members.front() && msg.chain == config_.id && !fenced_) {
    // Down from the head: its commit point, which every member has synced.
    read_safe_ = std::max(read_safe_, std::min(msg.committed, applied_.seq));
    Release(out);
    return;
  }
  // Up from the tail of this very chain (the id names its members): every
  // member applied what it applied. A head whose chain is not recorded yet
  // takes the commit point with the floor its successor's acks bring
  // (HandleAck), which the recording waits for.
  if (!is_head() || fenced_ || msg.chain != config_.id || members.size() < 3 ||
      from != members.back() || !options_.direct_commit || options_.sends_before_sync ||
      !Recorded()) {
    ++refused_;
    return;
  }
  const uint64_t c = std::min(msg.applied, applied_.seq);
  // The successor applied it too: its position must not lag the commit
  // point, or a resend from there would find the trimmed log and offer it
  // a snapshot (Pump); and it made progress (its own acks may wait).
  if (down_known_ && !down_.empty() && c > down_applied_) {
    down_applied_ = c;
    down_progress_ms_ = now;
  }
  Commit(c, out);
}

void ChainMember::HandleSyncRequest(const std::string& from, const ChainMessage& msg,
                                    int64_t now, ChainOutput* out) {
  ChainMessage answer;
  answer.chain = config_.id;
  const bool busy = down_is_joiner_ && down_ != from &&
                    now - down_progress_ms_ < options_.joiner_timeout_ms;
  // An unverified tail may lack committed writes: it is no source. Nor is
  // one without its lease: ZooKeeper may have formed the chain without it,
  // and a joiner that caught up from it would register into that chain
  // holding another history.
  if (fenced_ || !is_tail() || !verified_ || !Leased() || msg.chain != config_.id || busy) {
    ++refused_;
    answer.kind = ChainMessage::Kind::kSyncRefused;
    out->sends.push_back({from, std::move(answer)});
    return;
  }
  if (!Covers(msg.position)) {
    if (down_is_joiner_ && down_ == from) DropDownstream();
    RequestSnapshot(from, now, out);
    return;
  }
  down_ = from;
  down_is_joiner_ = true;
  company_ = true;
  down_known_ = true;
  down_progress_ms_ = now;
  down_applied_ = msg.position.seq;
  sent_upto_ = msg.position.seq;
  pin_ = UINT64_MAX;
  Pump(now, out);
  // Nothing to send: tell the joiner where the tail is, so it registers.
  if (sent_upto_ == applied_.seq && down_applied_ == applied_.seq) Heartbeat(out);
}

void ChainMember::RequestSnapshot(const std::string& to, int64_t now, ChainOutput* out) {
  out->snapshots.push_back({to, applied_});
  pin_ = applied_.seq;
  pin_until_ = now + options_.joiner_timeout_ms * 10;
}

void ChainMember::Heartbeat(ChainOutput* out) {
  if (down_.empty()) return;
  ChainMessage m;
  m.kind = ChainMessage::Kind::kReplicate;
  m.chain = config_.id;
  m.applied = applied_.seq;
  m.committed = chain_committed_;
  m.floor = committed_;
  out->sends.push_back({down_, std::move(m)});
}

void ChainMember::SendSyncRequest(int64_t now, ChainOutput* out) {
  join_progress_ms_ = now;
  // No ring read yet (a tick before the first OnConfig): an empty chain
  // here means "not known", not "no member serves the mark".
  if (!have_config_) return;
  if (config_.members.empty()) {
    // No member serves the mark. Only a member of the recorded chain with
    // its store intact holds every acknowledged write: it starts the chain
    // again; anyone else waits for one (a mark that never had a chain has
    // nothing to lose).
    if (MayStartAlone() && !register_sent_) {
      register_sent_ = true;
      registered_alone_ = true;
      out->register_now = true;
    }
    return;
  }
  if (dirty_) return StartOver(now, out);
  // Its own node, being withdrawn, is the tail in this view: ask once the
  // ring shows it gone (OnConfig, or the next tick after that).
  if (config_.members.back() == self_) return;
  ChainMessage m;
  m.kind = ChainMessage::Kind::kSyncRequest;
  m.chain = config_.id;
  m.position = applied_;
  out->sends.push_back({config_.members.back(), std::move(m)});
}

void ChainMember::StartOver(int64_t now, ChainOutput* out) {
  dirty_ = false;
  copy_end_ = {};
  out->wipe = true;
  intact_ = false;
  applied_ = {};
  committed_ = 0;
  chain_committed_ = 0;
  read_safe_ = 0;
  log_.clear();
  log_bytes_ = 0;
  log_base_ = {};
  SendSyncRequest(now, out);
}

void ChainMember::StartJoin(int64_t now, ChainOutput* out) {
  Clock(now);
  if (in_chain() && !fenced_) return;
  if (in_chain()) Deregister(out);  // fenced: its node may linger
  index_ = -1;
  left_ = false;
  imported_ = false;  // a rejoin after the import: the record rules again
  company_ = false;
  joining_ = true;
  snapshotting_ = false;
  register_sent_ = false;
  fenced_ = false;
  FailPending(Status::Unavailable("rejoining the chain"), out);
  if (!down_.empty()) DropDownstream();
  committed_ = std::min(committed_, applied_.seq);
  chain_committed_ = 0;
  read_safe_ = 0;
  if (have_config_) SendSyncRequest(now, out);
}

uint64_t ChainMember::OnSnapshotBegin(const std::string& from, ChainPosition at, int64_t now,
                                      ChainOutput* out) {
  Clock(now);
  // From the tail we are joining, or (in the chain, but behind what the
  // predecessor still holds) from the predecessor.
  // Not one it asked for: a joiner that caught up (a stale request's
  // answer), or a verified member (it holds every committed write).
  if (from.empty() || from != predecessor() || fenced_ || (joining_ && register_sent_) ||
      (!joining_ && verified_)) {
    ++refused_;
    return 0;
  }
  // A keeper does not empty its store for a copy until the chain it would
  // join has recorded itself; in that chain, it leaves it meanwhile (it
  // cannot follow its predecessor without the copy).
  if (Keeper()) {
    ++refused_;
    if (!joining_) LeaveToRejoin(out);
    return 0;
  }
  if (!joining_) {
    // Leave the chain and start over from the predecessor's copy.
    Deregister(out);
    FailPending(Status::Unavailable("rejoining the chain"), out);
    joining_ = true;
    register_sent_ = false;
    index_ = -1;
  }
  snapshotting_ = true;
  snapshot_at_ = at;
  snapshot_from_ = from;
  join_progress_ms_ = now;
  dirty_ = false;  // emptied below
  copy_end_ = {};
  applied_ = {};
  // Commit points are sequence numbers of the history it held; the copy
  // may be of another (a branch its old chain wrote and never committed
  // under a recorded chain): none of them says anything of the copy.
  committed_ = 0;
  chain_committed_ = 0;
  read_safe_ = 0;
  log_.clear();
  log_bytes_ = 0;
  log_base_ = {};
  out->wipe = true;
  intact_ = false;
  return ++snapshot_token_;
}

void ChainMember::OnSnapshotLoaded(uint64_t token, ChainPosition end, int64_t now,
                                   ChainOutput* out) {
  Clock(now);
  if (!joining_ || !snapshot_current(token)) return;
  const ChainPosition at = snapshot_at_;
  snapshotting_ = false;
  dirty_ = false;
  copy_end_ = end.seq > at.seq ? end : ChainPosition{};
  applied_ = at;
  log_base_ = at;
  log_.clear();
  log_bytes_ = 0;
  committed_ = 0;
  chain_committed_ = 0;
  read_safe_ = 0;
  SendSyncRequest(now, out);
}

void ChainMember::OnSnapshotFailed(uint64_t token, int64_t now, ChainOutput* out) {
  Clock(now);
  if (!joining_ || !snapshot_current(token)) return;
  snapshotting_ = false;
  SendSyncRequest(now, out);
}

void ChainMember::OnPeerRefused(const std::string& peer, int64_t now, ChainOutput* out) {
  Clock(now);
  CheckLease(out);
  if (!in_chain() || fenced_ || peer == self_) return;
  const auto& members = config_.members;
  const auto it = std::find(members.begin(), members.end(), peer);
  if (it == members.end() || config_.epochs.size() != members.size()) return;
  const int64_t epoch = config_.epochs[static_cast<size_t>(it - members.begin())];
  const std::pair<std::string, int64_t> registration{peer, epoch};
  if (std::find(evicted_.begin(), evicted_.end(), registration) != evicted_.end()) return;
  // Members come and go; the last few evictions are all that can repeat.
  if (evicted_.size() >= 16) evicted_.erase(evicted_.begin());
  evicted_.push_back(registration);
  out->evict.push_back({peer, epoch});
}

void ChainMember::OnTick(int64_t now, ChainOutput* out) {
  Clock(now);
  CheckLease(out);
  if (pin_ != UINT64_MAX && now > pin_until_) {
    pin_ = UINT64_MAX;
    Trim();
  }
  if (joining_) {
    if (!snapshotting_ && !register_sent_ && now - join_progress_ms_ >= options_.resend_ms) {
      SendSyncRequest(now, out);
    }
    if (snapshotting_ && now - join_progress_ms_ >= options_.joiner_timeout_ms * 3) {
      snapshotting_ = false;  // the snapshot never came: ask again
      SendSyncRequest(now, out);
    }
    if (register_sent_ && now - join_progress_ms_ >= options_.joiner_timeout_ms) {
      // The ring has not shown the registration (lost in a ring change, or
      // this process was stopped meanwhile): ask again, withdrawing a node
      // that was made, lest the ring show it in the chain with whatever
      // this store holds by then.
      register_sent_ = false;
      if (registration_ != 0) Deregister(out);
      SendSyncRequest(now, out);
    }
    return;
  }
  if (is_head() && record_sent_ && !Recorded() &&
      now - record_sent_ms_ >= options_.joiner_timeout_ms) {
    // The record did not show in the ring: its write may have been lost
    // with the connection (or landed, and the ring read that shows it was
    // lost). Asking again is harmless: the registry writes only what is not
    // there yet.
    record_sent_ = false;
    Commit(0, out);
  }
  if (!down_.empty() && now - down_progress_ms_ >= options_.resend_ms) {
    if (down_is_joiner_ && now - down_progress_ms_ >= options_.joiner_timeout_ms) {
      // A joiner that went silent must not hold the commit point.
      DropDownstream();
      if (is_end()) Commit(applied_.seq, out);
      SendAck(now, out);
    } else if (down_applied_ < applied_.seq) {
      sent_upto_ = down_applied_;
      down_progress_ms_ = now;
      Pump(now, out);
    } else {
      Heartbeat(out);  // carries the commit point; verifies a new tail
    }
  }
  if (in_chain() && !is_head() && now - last_ack_ms_ >= options_.resend_ms) {
    acked_applied_ = UINT64_MAX;
    SendAck(now, out);
  } else if (acked_applied_ != applied_.seq && now - last_ack_ms_ >= options_.resend_ms / 4) {
    SendAck(now, out);  // writes HandleReplicate left to the downstream's ack
  }
}

}  // namespace flatkv::partition
