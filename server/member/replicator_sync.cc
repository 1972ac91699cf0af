// Making the member's output real and durable: Carry (wipe, log, apply,
// send, register), the sync pipeline under storage.sync: always (the
// syncer thread's fdatasync of the chain log while later batches go on,
// and the replies and acks held until it), applying replicated writes to
// the store, and checkpoints of the chain log.
#include <algorithm>
#include <cstdlib>
#include <map>

#include <spdlog/spdlog.h>

#include "engine/string_keys.h"
#include "server/member/replicator.h"
#include "server/member/replicator_internal.h"

namespace flatkv::server {
namespace {

using partition::ChainEntry;
using partition::ChainOutput;
using partition::ChainPosition;
using replicator_internal::Fatal;

// The chain log is checkpointed (a new log, the store synced) past this.
constexpr uint64_t kLogCheckpointBytes = 64ull << 20;

}  // namespace

namespace replicator_internal {

void Fatal(const char* what, const Status& st) {
  spdlog::critical("chain: {}: {}; stopping this member (restart it: it replays its log and "
                   "catches up)",
                   what, st.ToString());
  spdlog::shutdown();
  std::_Exit(3);
}

}  // namespace replicator_internal

bool Replicator::CheckpointWanted() const {
  return checkpoint_due_ || intact_ != logged_intact_ || log_->bytes() > kLogCheckpointBytes;
}

void Replicator::ReleaseSynced() {
  if (held_.empty()) return;
  uint64_t synced;
  Status error;
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    synced = sync_done_;
    error = sync_error_;
  }
  while (!held_.empty() && held_.front().batch <= synced) {
    Held h = std::move(held_.front());
    held_.pop_front();
    Carry(&h.out, /*logged=*/true);
    for (Waiter* w : h.done) SignalDone(w, Status::OK());
  }
  if (held_.empty() || error.ok()) return;
  if (!error.IsNoSpace()) Fatal("syncing the chain log", error);
  // The batches past the last good sync are logged (maybe not durably)
  // and not applied: applied again at rejoin, like a batch whose apply
  // failed, once the member rebuilt itself from the log.
  // Nothing else held is carried out: its acks and answers may stand on
  // those batches.
  const Status why = Status::NoSpace("member " + options_.self + " left its chain: " +
                                     error.message());
  while (!held_.empty()) {
    Held h = std::move(held_.front());
    held_.pop_front();
    unapplied_.insert(unapplied_.end(), h.out.apply.begin(), h.out.apply.end());
    DropOutput(&h.out, why);
    for (Waiter* w : h.done) SignalDone(w, why);
  }
  ChainOutput none;
  LeaveForFullDisk("syncing replicated writes", error, &none);
}

void Replicator::Drain() {
  if (held_.empty()) return;
  if (std::this_thread::get_id() == syncer_.get_id()) {
    // The syncer runs events itself (its wake-up's run_here) and met an
    // output that drains (not expected: those are Heavy(), the loop's):
    // it syncs here rather than wait for itself.
    const uint64_t target = logged_batch_;
    Status st = log_->SyncAppended();
    std::lock_guard<std::mutex> lock(sync_mu_);
    if (st.ok()) sync_done_ = std::max(sync_done_, target);
    if (!st.ok() && sync_error_.ok()) sync_error_ = st;
  } else {
    std::unique_lock<std::mutex> lock(sync_mu_);
    sync_cv_.wait(lock, [&] { return sync_done_ >= logged_batch_ || !sync_error_.ok(); });
  }
  ReleaseSynced();
}

void Replicator::SyncLoop() {
  std::unique_lock<std::mutex> lock(sync_mu_);
  while (true) {
    // After an error, nothing until RejoinAfterFullDisk clears it.
    sync_cv_.wait(lock, [&] {
      return sync_stop_ || (sync_error_.ok() && sync_want_ > sync_done_);
    });
    if (sync_stop_ && (sync_want_ <= sync_done_ || !sync_error_.ok())) return;
    const uint64_t target = sync_want_;
    lock.unlock();
    // Covers every batch logged before this call: at least "target".
    Status st = log_->SyncAppended();
    pipeline_syncs_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
    if (st.ok()) {
      sync_done_ = target;
    } else {
      // Never again: after a failed fdatasync a later one may succeed
      // without the lost pages (Linux), so the loop stops on this one.
      sync_error_ = st;
    }
    sync_cv_.notify_all();
    lock.unlock();
    // The held outputs of these batches go now: this thread carries them
    // out itself if nothing else runs events (saving the loop's wake-up),
    // else whoever runs them does.
    Event wake;
    wake.run = [](int64_t, ChainOutput*) {};
    Post(std::move(wake), /*run_here=*/true);
    lock.lock();
  }
}

void Replicator::Carry(ChainOutput* out, bool logged) {
  if (out->wipe) {
    Status st = Wipe();
    if (st.IsNoSpace()) return LeaveForFullDisk("emptying the store for a snapshot", st, out);
    if (!st.ok()) spdlog::error("chain: emptying the store for a snapshot: {}", st.ToString());
  }
  if (disk_full_.load() && !out->apply.empty()) {
    // Out of the chain for a full disk (LeaveForFullDisk): nothing applied,
    // passed on or acknowledged until it rejoins. A batch the pipeline
    // logged already is applied then.
    if (logged) unapplied_.insert(unapplied_.end(), out->apply.begin(), out->apply.end());
    return DropOutput(out, Status::NoSpace("member " + options_.self +
                                           " left its chain: its disk is full"));
  }
  if (!out->apply.empty()) {
    // Logged before anything of the batch is applied, passed on or
    // acknowledged. The writes go down the chain before this member's
    // fdatasync and store apply, so the members sync in parallel rather
    // than one after another: safe because nothing that answers a client
    // leaves before it. Acks (and replies) are sent below, once the batch
    // is durable and applied here; an ack from downstream is an event run
    // after this one (or held behind this batch by the pipeline). So the
    // commit point a member reports up, and the answer the head gives,
    // still follow every member's sync.
    Status st;
    if (!logged) {
      st = log_->Append(out->apply);
      if (st.ok()) SendDownFirst(out);
      if (st.ok() && options_.sync_always) st = log_->Sync();
      if (st.IsNoSpace()) return LeaveForFullDisk("logging replicated writes", st, out);
      if (!st.ok()) Fatal("logging replicated writes", st);
    }
    st = ApplyEntries(out->apply);
    if (st.IsNoSpace()) {
      unapplied_ = out->apply;  // logged, maybe partly applied: again at rejoin
      return LeaveForFullDisk("applying replicated writes", st, out);
    }
    if (!st.ok()) Fatal("applying replicated writes", st);
  }
  if (held_.empty() && CheckpointWanted()) Checkpoint();
  log_bytes_.store(log_->bytes(), std::memory_order_relaxed);
  if (!out->record.empty()) {
    Status st = coordinator_->RecordChain(out->record, out->record_version);
    if (st.ok()) {
      records_.fetch_add(1, std::memory_order_relaxed);
    } else {
      spdlog::warn("chain: recording the chain in ZooKeeper: {}", st.ToString());
    }
  }
  for (const ChainOutput::Send& s : out->sends) Send(s.to, s.msg);
  for (const ChainOutput::Reply& r : out->replies) Finish(r.request, r.status);
  for (uint64_t r : out->reads) Finish(r, Status::OK());
  for (const ChainOutput::Snapshot& s : out->snapshots) StartSnapshot(s.to, s.at);
  for (const ChainOutput::Evict& e : out->evict) {
    spdlog::warn("chain: {} refused a connection: its process is gone; removing its member node",
                 e.member);
    evictions_.fetch_add(1, std::memory_order_relaxed);
    coordinator_->Evict(e.member, e.epoch);
  }
  if (out->deregister) coordinator_->Deregister();
  if (out->register_now) {
    spdlog::info("chain: caught up; registering in mark {}", options_.mark);
    coordinator_->Register();
  }
}

Status ApplyChainEntries(engine::cache::WriteBackCache* cache, const std::vector<ChainEntry>& entries,
                         std::vector<std::pair<uint64_t, bool>>* existed_out) {
  std::vector<std::vector<rpc::ChainOp>> decoded(entries.size());
  std::vector<engine::KeyValueRef> puts;
  std::vector<std::pair<uint64_t, bool>>& existed = *existed_out;  // seq, existed: first op a remove
  Status result;
  auto flush = [&]() {
    if (puts.empty()) return;
    Status st = cache->PutBatch(puts);
    if (!st.ok() && result.ok()) result = st;
    puts.clear();
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    Status st = DecodeChainOps(entries[i].op, &decoded[i]);
    if (!st.ok()) {
      if (result.ok()) result = st;
      continue;
    }
    bool first = true;
    for (const rpc::ChainOp& op : decoded[i]) {
      if (op.kind == rpc::ChainOpKind::PUT) {
        puts.push_back({op.key, op.value});
        first = false;
        continue;
      }
      flush();
      bool had = false;
      switch (op.kind) {
        case rpc::ChainOpKind::REMOVE:
          st = cache->Remove(op.key, &had);
          break;
        case rpc::ChainOpKind::SPUT:
          st = cache->SPut(op.skey, op.value);
          break;
        case rpc::ChainOpKind::SREMOVE:
          st = cache->SRemove(op.skey, &had);
          break;
        case rpc::ChainOpKind::SBUCKET:
          // With other slots this member's buckets differ, and it holds
          // these pairs already: only a damaged bucket needs the rewrite.
          if (static_cast<uint64_t>(op.slots) == cache->store()->options().string_slots) {
            st = cache->SWriteBucket(op.key, DecodeBucket(op.value));
          }
          break;
        default:
          break;
      }
      if (!st.ok() && result.ok()) result = st;
      if (first) existed.push_back({entries[i].seq, had});
      first = false;
    }
  }
  flush();
  return result;
}

Status Replicator::ApplyEntries(const std::vector<ChainEntry>& entries) {
  std::vector<std::pair<uint64_t, bool>> existed;  // seq, existed: first op a remove
  Status result = ApplyChainEntries(cache_, entries, &existed);
  applied_entries_.fetch_add(static_cast<int64_t>(entries.size()), std::memory_order_relaxed);
  apply_batches_.fetch_add(1, std::memory_order_relaxed);
  if (!existed.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [seq, had] : existed) existed_[seq] = had;
  }
  return result;
}

void Replicator::Checkpoint() {
  // Everything applied reaches the store's files and the disk, then the
  // log restarts from the position it names.
  Status st = cache_->Flush();
  if (st.ok()) st = store_->Sync();
  ChainLog::State state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state.position = member_->applied();
  }
  state.intact = intact_;
  if (st.ok()) st = log_->Reset(state);
  if (!st.ok()) {
    // The old log stays whole and keeps every write: only longer.
    spdlog::error("chain: checkpoint of the log: {}", st.ToString());
    return;
  }
  checkpoints_.fetch_add(1, std::memory_order_relaxed);
  logged_intact_ = state.intact;
  checkpoint_due_ = false;
}

}  // namespace flatkv::server
