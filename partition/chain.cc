#include "partition/chain.h"

#include <algorithm>
#include <utility>

namespace flatkv::partition {
namespace {

uint64_t EntryBytes(const ChainEntry& e) { return e.op.size() + 8 * e.keys.size() + 32; }

const std::string kNone;

}  // namespace

ChainMember::ChainMember(std::string self, ChainOptions options, ChainPosition durable)
    : self_(std::move(self)), options_(options), applied_(durable), log_base_(durable) {}

const char* ChainMember::role() const {
  if (fenced_ && (in_chain() || was_member_)) return "fenced";
  if (joining_) return "syncing";
  if (!in_chain()) return was_member_ ? "fenced" : "none";
  if (config_.members.size() == 1) return "single";
  if (is_head()) return "head";
  return is_tail() ? "tail" : "middle";
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
  const bool was_head = is_head();
  config_ = config;
  have_config_ = true;
  auto it = std::find(config_.members.begin(), config_.members.end(), self_);
  index_ = it == config_.members.end() ? -1 : static_cast<int>(it - config_.members.begin());

  if (!in_chain()) {
    if (was_head || !pending_.empty()) {
      FailPending(Status::Unavailable("this member left the chain (session lost)"), out);
    }
    if (!down_.empty()) DropDownstream();  // only a chain member has a downstream
    for (const ParkedRead& r : parked_) {
      out->replies.push_back({r.request, Status::Unavailable("this member left the chain")});
    }
    parked_.clear();
    if (joining_ && !snapshotting_) SendSyncRequest(now, out);
    return;
  }
  if (registered_alone_ && index_ > 0) {
    // Registered on what looked like an empty chain, but an older member
    // is there: this store may lack its writes. Leave and catch up.
    registered_alone_ = false;
    out->deregister = true;
    FailPending(Status::Unavailable("rejoining the chain"), out);
    DropDownstream();
    joining_ = true;
    register_sent_ = false;
    index_ = -1;
    SendSyncRequest(now, out);
    return;
  }
  registered_alone_ = false;
  if (joining_) verified_ = false;  // until the predecessor shows its commit point
  if (index_ == 0) verified_ = true;
  joining_ = false;
  snapshotting_ = false;
  register_sent_ = false;
  was_member_ = true;
  if (is_head()) {
    epoch_ = config_.epochs[0];
  } else if (was_head || !pending_.empty()) {
    FailPending(Status::Unavailable("no longer the head of the chain"), out);
  }

  const size_t next = static_cast<size_t>(index_) + 1;
  if (next < config_.members.size()) {
    const std::string& succ = config_.members[next];
    if (down_ != succ) {
      // A new successor: resend everything after the commit point (it has
      // at least that: it is upstream of the tail, or a caught-up joiner).
      down_ = succ;
      down_applied_ = std::min(committed_, applied_.seq);
      sent_upto_ = down_applied_;
      down_progress_ms_ = now;
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
  if (is_end()) Commit(applied_.seq, out);
  acked_applied_ = UINT64_MAX;  // tell the (maybe new) predecessor where we are
  if (!is_head()) SendAck(now, out);
  Pump(now, out);
}

void ChainMember::SetFenced(bool fenced, ChainOutput* out) {
  if (fenced == fenced_) return;
  fenced_ = fenced;
  if (fenced) {
    FailPending(Status::Unavailable("this member lost its ZooKeeper session"), out);
    for (const ParkedRead& r : parked_) out->replies.push_back({r.request, Status::Unavailable(
        "this member lost its ZooKeeper session")});
    parked_.clear();
  }
}

void ChainMember::OnWrite(uint64_t request, std::vector<uint64_t> keys, std::string op,
                          int64_t now, ChainOutput* out) {
  if (fenced_ || !is_head()) {
    out->replies.push_back(
        {request, Status::Unavailable(fenced_ ? "this member lost its ZooKeeper session"
                                              : std::string("not the head of the chain (") +
                                                    role() + ")")});
    return;
  }
  ChainEntry e;
  e.seq = applied_.seq + 1;
  e.epoch = epoch_;
  e.keys = std::move(keys);
  e.op = std::move(op);
  const uint64_t seq = e.seq;
  Apply(std::move(e), out);
  if (!config_.sync || is_end()) {
    if (is_end()) Commit(applied_.seq, out);
    out->replies.push_back({request, Status::OK()});
  } else {
    pending_.push_back({seq, request});
  }
  Pump(now, out);
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
  down_.clear();
  down_is_joiner_ = false;
  down_applied_ = 0;
  sent_upto_ = 0;
}

void ChainMember::Pump(int64_t now, ChainOutput* out) {
  if (down_.empty() || fenced_) return;
  if (sent_upto_ < log_base_.seq) {
    // The downstream lacks writes this log no longer holds (a joiner that
    // fell behind, or a successor that registered without them): it must
    // start over from a copy of this store.
    std::string to = down_;
    DropDownstream();
    RequestSnapshot(to, now, out);
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
    m.committed = committed_;
    // Merge into a message to the same member already in this output.
    bool merged = false;
    for (ChainOutput::Send& s : out->sends) {
      if (s.to == down_ && s.msg.kind == ChainMessage::Kind::kReplicate &&
          s.msg.chain == m.chain && !s.msg.entries.empty() &&
          s.msg.entries.back().seq + 1 == m.entries.front().seq &&
          s.msg.entries.size() + m.entries.size() <= options_.max_batch_entries) {
        for (ChainEntry& e : m.entries) s.msg.entries.push_back(std::move(e));
        s.msg.applied = m.applied;
        s.msg.committed = m.committed;
        merged = true;
        break;
      }
    }
    if (!merged) out->sends.push_back({down_, std::move(m)});
  }
}

void ChainMember::SendAck(int64_t now, ChainOutput* out) {
  const std::string& pred = predecessor();
  if (pred.empty()) return;
  if (acked_applied_ == applied_.seq && acked_committed_ == committed_) return;
  acked_applied_ = applied_.seq;
  acked_committed_ = committed_;
  last_ack_ms_ = now;
  ChainMessage m;
  m.kind = ChainMessage::Kind::kAck;
  m.chain = config_.id;
  m.applied = applied_.seq;
  m.committed = committed_;
  for (ChainOutput::Send& s : out->sends) {
    if (s.to == pred && s.msg.kind == ChainMessage::Kind::kAck) {
      s.msg = std::move(m);
      return;
    }
  }
  out->sends.push_back({pred, std::move(m)});
}

void ChainMember::Commit(uint64_t committed, ChainOutput* out) {
  committed = std::min(committed, applied_.seq);
  if (committed > committed_) committed_ = committed;
  while (!pending_.empty() && pending_.front().seq <= committed_) {
    out->replies.push_back({pending_.front().request, Status::OK()});
    pending_.pop_front();
  }
  if (!parked_.empty()) {
    std::vector<ParkedRead> still;
    for (const ParkedRead& r : parked_) {
      if (r.until > committed_) {
        still.push_back(r);
        continue;
      }
      uint64_t until = DirtyUntil(r.key);
      if (until > committed_) {
        still.push_back({r.request, r.key, until});
      } else {
        out->reads.push_back(r.request);
      }
    }
    parked_ = std::move(still);
  }
  Trim();
}

void ChainMember::FailPending(const Status& status, ChainOutput* out) {
  for (const Pending& p : pending_) out->replies.push_back({p.request, status});
  pending_.clear();
}

uint64_t ChainMember::DirtyUntil(uint64_t key) const {
  for (auto it = log_.rbegin(); it != log_.rend() && it->seq > committed_; ++it) {
    if (std::find(it->keys.begin(), it->keys.end(), key) != it->keys.end()) return it->seq;
  }
  return 0;
}

ChainMember::Read ChainMember::OnRead(uint64_t request, uint64_t key, ChainOutput* out) {
  (void)out;
  if (fenced_ || !in_chain() || !verified_) return Read::kRefuse;
  if (!config_.sync) return Read::kServe;
  if (!is_tail()) return Read::kRefuse;
  // A tail with a joiner commits only what the joiner applied: a key with
  // a write after the commit point waits for it (DirtyUntil).
  uint64_t until = DirtyUntil(key);
  if (until <= committed_) return Read::kServe;
  parked_.push_back({request, key, until});
  return Read::kWait;
}

void ChainMember::OnMessage(const std::string& from, const ChainMessage& msg, int64_t now,
                            ChainOutput* out) {
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
    case ChainMessage::Kind::kSnapshotNeeded:
      if (msg.chain != config_.id || from != predecessor() || snapshotting_) {
        ++refused_;
        return;
      }
      if (!joining_) {
        // In the chain but behind what the predecessor still holds: leave,
        // and start over from its copy.
        out->deregister = true;
        FailPending(Status::Unavailable("rejoining the chain"), out);
        joining_ = true;
        register_sent_ = false;
        index_ = -1;
      }
      snapshotting_ = true;
      join_progress_ms_ = now;
      applied_ = {};
      committed_ = 0;
      log_.clear();
      log_bytes_ = 0;
      log_base_ = {};
      out->wipe = true;
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
  if (joining_) join_progress_ms_ = now;
  for (const ChainEntry& e : msg.entries) {
    if (e.seq <= applied_.seq) continue;     // have it
    if (e.seq != applied_.seq + 1) break;    // a gap: wait for the resend
    Apply(e, out);
  }
  if (is_end() || (joining_ && down_.empty())) {
    Commit(applied_.seq, out);
  } else {
    Commit(msg.committed, out);
  }
  if (in_chain() && !verified_ && msg.committed <= applied_.seq) verified_ = true;
  if (joining_ && !register_sent_ && msg.committed <= applied_.seq &&
      msg.applied <= applied_.seq + options_.catchup_lag) {
    register_sent_ = true;
    out->register_now = true;
  }
  SendAck(now, out);
  Pump(now, out);
}

void ChainMember::HandleAck(const std::string& from, const ChainMessage& msg, int64_t now,
                            ChainOutput* out) {
  if (msg.chain != config_.id || from != down_ || down_.empty()) {
    ++refused_;
    return;
  }
  if (msg.applied > down_applied_ || msg.applied >= sent_upto_) down_progress_ms_ = now;
  // Its applied position as it says (a new successor may have less than
  // assumed); what it was sent beyond that is resent on a tick.
  down_applied_ = std::min(msg.applied, applied_.seq);
  if (down_applied_ < log_base_.seq) {
    std::string to = down_;
    DropDownstream();
    RequestSnapshot(to, now, out);
    return;
  }
  Commit(msg.committed, out);
  SendAck(now, out);
  Pump(now, out);
}

void ChainMember::HandleSyncRequest(const std::string& from, const ChainMessage& msg,
                                    int64_t now, ChainOutput* out) {
  ChainMessage answer;
  answer.chain = config_.id;
  const bool busy = down_is_joiner_ && down_ != from &&
                    now - down_progress_ms_ < options_.joiner_timeout_ms;
  if (fenced_ || !is_tail() || msg.chain != config_.id || busy) {
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
  down_progress_ms_ = now;
  down_applied_ = msg.position.seq;
  sent_upto_ = msg.position.seq;
  pin_ = UINT64_MAX;
  Pump(now, out);
  // Nothing to send: tell the joiner where the tail is, so it registers.
  if (sent_upto_ == applied_.seq && down_applied_ == applied_.seq) Heartbeat(out);
}

void ChainMember::RequestSnapshot(const std::string& to, int64_t now, ChainOutput* out) {
  ChainMessage m;
  m.kind = ChainMessage::Kind::kSnapshotNeeded;
  m.chain = config_.id;
  m.position = applied_;
  out->sends.push_back({to, std::move(m)});
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
  m.committed = committed_;
  out->sends.push_back({down_, std::move(m)});
}

void ChainMember::SendSyncRequest(int64_t now, ChainOutput* out) {
  join_progress_ms_ = now;
  if (config_.members.empty()) {
    // No member serves the mark: this store is the best there is.
    if (!register_sent_) {
      register_sent_ = true;
      registered_alone_ = true;
      out->register_now = true;
    }
    return;
  }
  ChainMessage m;
  m.kind = ChainMessage::Kind::kSyncRequest;
  m.chain = config_.id;
  m.position = applied_;
  out->sends.push_back({config_.members.back(), std::move(m)});
}

void ChainMember::StartJoin(int64_t now, ChainOutput* out) {
  if (in_chain() && !fenced_) return;
  joining_ = true;
  snapshotting_ = false;
  register_sent_ = false;
  fenced_ = false;
  FailPending(Status::Unavailable("rejoining the chain"), out);
  if (!down_.empty()) DropDownstream();
  committed_ = std::min(committed_, applied_.seq);
  if (have_config_) SendSyncRequest(now, out);
}

void ChainMember::OnSnapshotLoaded(ChainPosition at, int64_t now, ChainOutput* out) {
  if (!joining_ || !snapshotting_) return;
  snapshotting_ = false;
  applied_ = at;
  log_base_ = at;
  log_.clear();
  log_bytes_ = 0;
  committed_ = 0;
  SendSyncRequest(now, out);
}

void ChainMember::OnTick(int64_t now, ChainOutput* out) {
  if (pin_ != UINT64_MAX && now > pin_until_) {
    pin_ = UINT64_MAX;
    Trim();
  }
  if (joining_) {
    if (!snapshotting_ && !register_sent_ && now - join_progress_ms_ >= options_.resend_ms) {
      SendSyncRequest(now, out);
    }
    if (snapshotting_ && now - join_progress_ms_ >= options_.joiner_timeout_ms * 10) {
      snapshotting_ = false;  // the snapshot never came: ask again
      SendSyncRequest(now, out);
    }
    if (register_sent_ && now - join_progress_ms_ >= options_.joiner_timeout_ms) {
      register_sent_ = false;  // registration lost in a ring change: ask again
      SendSyncRequest(now, out);
    }
    return;
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
  }
}

}  // namespace flatkv::partition
