// Implementation notes
//
// Locks: mu_ guards the member and the waiters; queue_mu_ the event queue.
// The loop never holds mu_ while it touches the store, a socket or
// ZooKeeper, so reads at the tail (BeforeRead) wait only for the member's
// own bookkeeping. Client writes and held-back reads are pending_ entries
// whose WriteDone the loop calls outside mu_ (a blocking caller waits on a
// latch of its own: Wait()); peer events wait on a Waiter with mu_.
//
// This file: starting and stopping, the event queue and the thread that
// runs it (Post, RunHere, Loop, Tick, Process), client writes and reads,
// peer frames, replies and stats. The other seams have files of their own:
// replicator_peer.cc (peer links and the frame codec), replicator_snapshot.cc
// (snapshot streams sent and loaded), replicator_tracking.cc (a ring change's
// write tracking), replicator_repair.cc (repairing a damaged key),
// replicator_sync.cc (logging, applying, the sync pipeline, checkpoints) and
// replicator_full_disk.cc (leaving and rejoining the chain on a full disk);
// replicator_internal.h holds what they share.
#include "server/member/replicator.h"

#include <algorithm>
#include <chrono>
#include <map>

#include <spdlog/spdlog.h>

#include "server/member/replicator_internal.h"

namespace flatkv::server {
namespace {

using partition::ChainEntry;
using partition::ChainMessage;
using partition::ChainOutput;
using partition::ChainPosition;
using partition::ChainRole;
using partition::RoleName;
using replicator_internal::NowMs;

}  // namespace

Status Replicator::Start(ReplicatorOptions options, engine::Store* store,
                         engine::cache::WriteBackCache* cache, ChainCoordinator* coordinator,
                         std::unique_ptr<Replicator>* result) {
  const std::string path = options.data_dir + "/CHAINLOG";
  ChainLog::State state;
  std::vector<ChainEntry> entries;
  std::unique_ptr<ChainLog> log;
  FLATKV_RETURN_IF_ERROR(ChainLog::Open(path, &state, &entries, &log));
  // Writes logged but perhaps not in the store when the process stopped:
  // replayed before the loop runs.
  const ChainPosition position =
      entries.empty() ? state.position : ChainPosition{entries.back().epoch, entries.back().seq};
  std::unique_ptr<Replicator> r(new Replicator(std::move(options), store, cache, coordinator,
                                               std::move(log), position, state.intact));
  if (!entries.empty()) {
    Status st = r->ApplyEntries(entries);
    if (!st.ok()) return Status::IOError("replaying " + path + ": " + st.ToString());
    spdlog::info("chain: replayed {} logged writes", entries.size());
    r->existed_.clear();
  }
  r->StartLoop();
  *result = std::move(r);
  spdlog::info("chain: position epoch {} seq {}, store {}", position.epoch, position.seq,
               state.intact ? "intact" : "not known intact (new, or wiped for a snapshot)");
  return Status::OK();
}

Replicator::Replicator(ReplicatorOptions options, engine::Store* store,
                       engine::cache::WriteBackCache* cache, ChainCoordinator* coordinator,
                       std::unique_ptr<ChainLog> log, ChainPosition durable, bool intact)
    : options_(std::move(options)),
      store_(store),
      cache_(cache),
      coordinator_(coordinator),
      member_(std::make_unique<partition::ChainMember>(options_.self, options_.chain,
                                                       durable, intact)),
      log_(std::move(log)),
      logged_intact_(intact),
      intact_(intact) {}

void Replicator::StartLoop() {
  if (pipelined_) syncer_ = std::thread([this] { SyncLoop(); });
  loop_ = std::thread([this] { Loop(); });
}

Replicator::~Replicator() { Stop(); }

void Replicator::Stop() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (loop_.joinable()) loop_.join();  // drains the pipeline
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    sync_stop_ = true;
  }
  sync_cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
  // Events the loop did not take: their callers are still waiting.
  std::deque<Event> left;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    left.swap(queue_);
  }
  for (Event& ev : left) {
    if (ev.done != nullptr) SignalDone(ev.done, Status::Unavailable("the server is stopping"));
  }
  senders_.clear();
  links_.clear();
  std::map<uint64_t, Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  for (auto& [request, p] : pending) p.done(Status::Unavailable("the server is stopping"), false);
}

void Replicator::Post(Event event, bool run_here) {
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (!stopping_) {
      run_here = run_here && event.done == nullptr && !event.serial;
      if (!run_here) ++queued_for_loop_;
      queue_.push_back(std::move(event));
      if (run_here && options_.defer) {
        // At the end of the caller's round, once for all of it.
        thread_local bool scheduled = false;
        lock.unlock();
        if (scheduled) return;
        scheduled = options_.defer([this] {
          scheduled = false;
          RunQueuedHere();
        });
        if (scheduled) return;
        lock.lock();  // not an I/O thread after all: run it now
      }
      if (run_here && !running_ && !loop_wants_ && queued_for_loop_ == 0) {
        running_ = true;
        lock.unlock();
        RunHere();
        return;
      }
      // Else the loop runs it, or the thread running events now does.
      if (!running_) queue_cv_.notify_one();
      return;
    }
  }
  // Stopped: nothing will run it. Whoever waits for it is told so.
  if (event.done != nullptr) SignalDone(event.done, Status::Unavailable("the server is stopping"));
  if (event.request != 0) Finish(event.request, Status::Unavailable("the server is stopping"));
}

void Replicator::RunQueuedHere() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (running_ || stopping_ || queue_.empty()) return;  // whoever runs takes it
    if (loop_wants_ || queued_for_loop_ > 0) {
      queue_cv_.notify_one();
      return;
    }
    running_ = true;
  }
  RunHere();
}

// The caller's thread runs what is queued, as the loop would, while only
// events it may run are queued, for a few rounds; then it hands the rest
// to the loop. An output that needs more than the store and the sockets
// (Heavy()) is handed to the loop as it stands.
void Replicator::RunHere() {
  constexpr int kRounds = 4;
  for (int round = 0;; ++round) {
    std::deque<Event> events;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (queue_.empty() || round == kRounds || loop_wants_ || queued_for_loop_ > 0 ||
          stopping_) {
        running_ = false;
        if (!queue_.empty() || loop_wants_ || stopping_) queue_cv_.notify_one();
        return;
      }
      events.swap(queue_);
    }
    if (!RunEvents(&events, NowMs(), /*here=*/true)) return;  // the loop took over
  }
}

// What only the loop thread does: it may wait on ZooKeeper (a record, a
// deregistration, a registration), on a whole store (a wipe, a checkpoint)
// or on the disk (the pipeline's Drain), or start a snapshot stream. A
// batch of writes is not heavy: under storage.sync: always it is logged and
// sent, and its fdatasync is the syncer's.
bool Replicator::Heavy(const ChainOutput& out) const {
  return out.wipe || !out.record.empty() || !out.snapshots.empty() || out.deregister ||
         out.register_now || disk_full_.load() || CheckpointWanted();
}

void Replicator::PostRun(std::function<void(int64_t now, ChainOutput* out)> run) {
  Event ev;
  ev.run = std::move(run);
  Post(std::move(ev));
}

void Replicator::Join() {
  PostRun([this](int64_t now, ChainOutput* out) {
    joined_ = true;
    member_->StartJoin(now, out);
  });
}

void Replicator::OnRing(std::shared_ptr<const partition::Ring> ring) {
  PostRun([this, ring](int64_t now, ChainOutput* out) {
    ring_ = ring;
    member_->OnConfig(ConfigOf(*ring), now, out);
  });
}

void Replicator::OnRegistered(int64_t czxid, uint64_t session) {
  PostRun([this, czxid, session](int64_t now, ChainOutput* out) {
    if (!member_->wants_registration()) {
      // Registered too late (the tail changed meanwhile): withdraw it.
      out->deregister = true;
      return;
    }
    member_->OnRegistered(czxid, session, now);
    intact_ = true;
    if (ring_) member_->OnConfig(ConfigOf(*ring_), now, out);
  });
}

partition::ChainConfig Replicator::ConfigOf(const partition::Ring& ring) const {
  partition::ChainConfig c;
  c.version = ring.version();
  c.sync = options_.sync;
  const partition::RingChange* change = ring.change();
  if (change != nullptr && change->kind == "add" && change->mark == options_.mark) {
    c.importer = change->importer;
  }
  const partition::Partition* p = ring.Find(options_.mark);
  if (p == nullptr) return c;
  uint64_t id = 0xcbf29ce484222325ull;  // FNV-1a over members and czxids
  auto mix = [&id](const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) id = (id ^ b[i]) * 0x100000001b3ull;
  };
  for (const partition::Member& m : p->chain) {
    const std::string a = m.address();
    c.members.push_back(a);
    c.epochs.push_back(m.czxid);
    mix(a.data(), a.size());
    mix(&m.czxid, sizeof(m.czxid));
  }
  c.id = id;
  c.recorded = p->recorded;
  c.recorded_version = p->recorded_ring_version;
  c.recorded_zxid = p->recorded_zxid;
  return c;
}

void Replicator::Sequence(bool serial, const char* what, SequenceFn run, WriteDone done,
                          bool run_here) {
  uint64_t request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request = next_request_++;
    pending_[request] = {std::move(done), NowMs() + WriteTimeoutMs(), what};
  }
  Event ev;
  ev.request = request;
  ev.serial = serial;
  ev.run = [this, request, run = std::move(run)](int64_t now, ChainOutput* out) {
    const size_t before = out->apply.size();
    run(request, now, out);
    if (out->apply.size() > before) seq_of_request_[request] = out->apply.back().seq;
  };
  Post(std::move(ev), run_here);
}

// A latch for one answer, shared with the callback: a caller that stopped
// waiting leaves it to the callback.
Status Replicator::Wait(const std::function<void(WriteDone)>& start, bool* existed) {
  return WaitFor(start, WriteTimeoutMs(), existed);
}

Status Replicator::WaitFor(const std::function<void(WriteDone)>& start, int64_t timeout_ms,
                           bool* existed) {
  struct Latch {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    bool existed = false;
  };
  auto latch = std::make_shared<Latch>();
  start([latch](const Status& status, bool had) {
    std::lock_guard<std::mutex> lock(latch->mu);
    latch->done = true;
    latch->status = status;
    latch->existed = had;
    latch->cv.notify_all();
  });
  // Every pending request is answered: by the chain, by its deadline
  // (Expire(), on a tick) or by Stop(). A second later than the deadline
  // the loop itself must be stuck (a disk that does not answer).
  std::unique_lock<std::mutex> lk(latch->mu);
  if (!latch->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms + 1000),
                          [&] { return latch->done; })) {
    return Status::Unavailable("the chain of mark " + std::to_string(options_.mark) +
                               " did not answer in time (its replication loop is stuck)");
  }
  if (existed != nullptr) *existed = latch->existed;
  return latch->status;
}

void Replicator::WriteAsync(std::vector<rpc::ChainOp> ops, std::vector<uint64_t> keys,
                            WriteDone done, bool import, bool run_here) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    const ChainRole role = member_->chain_role();
    if (role == ChainRole::kMiddle || role == ChainRole::kTail) {
      lock.unlock();
      return done(Status::NotOwner(std::string("this member is the ") + RoleName(role) +
                                   " of mark " + std::to_string(options_.mark) +
                                   "'s chain, not its head"),
                  false);
    }
  }
  Sequence(
      false, "write",
      [this, keys = std::move(keys), op = EncodeChainOps(ops), import](
          uint64_t request, int64_t now, ChainOutput* out) mutable {
        for (size_t i = 0; i < keys.size() && !import; ++i) {
          Status st = coordinator_->CheckWritable(static_cast<int64_t>(keys[i]));
          if (!st.ok()) {
            out->replies.push_back({request, st});
            return;
          }
        }
        // (A ring change's own writes are not recorded: at a source they
        // are the drop, after the record was read.)
        if (!import) Track(keys, op);
        member_->OnWrite(request, std::move(keys), std::move(op), now, out);
      },
      std::move(done), run_here);
}

Status Replicator::Write(std::vector<rpc::ChainOp> ops, std::vector<uint64_t> keys,
                         bool* existed, bool import, bool run_here) {
  return Wait(
      [&](WriteDone done) {
        WriteAsync(std::move(ops), std::move(keys), std::move(done), import, run_here);
      },
      existed);
}

void Replicator::AppendAsync(int64_t key, std::string suffix, uint64_t max_value_bytes,
                             WriteDone done) {
  // Serial: it reads the value every earlier write left (the loop applied them first).
  Sequence(
      true, "append",
      [this, key, suffix = std::move(suffix), max_value_bytes](uint64_t request, int64_t now,
                                                               ChainOutput* out) {
        if (Status st = coordinator_->CheckWritable(key); !st.ok()) {
          out->replies.push_back({request, st});
          return;
        }
        std::string value;
        Status st = cache_->Get(key, &value);
        if (!st.ok() && !st.IsNotFound()) {
          out->replies.push_back({request, st});
          return;
        }
        if (value.size() + suffix.size() > max_value_bytes) {
          out->replies.push_back(
              {request, Status::ValueTooLarge("append would make key " + std::to_string(key) +
                                              " " + std::to_string(value.size() + suffix.size()) +
                                              " bytes, over storage.max_value_bytes (" +
                                              std::to_string(max_value_bytes) + ")")});
          return;
        }
        value += suffix;
        rpc::ChainOp op;
        op.kind = rpc::ChainOpKind::PUT;
        op.__set_key(key);
        op.__set_value(std::move(value));
        std::string encoded = EncodeChainOps({op});
        Track({static_cast<uint64_t>(key)}, encoded);
        member_->OnWrite(request, {static_cast<uint64_t>(key)}, std::move(encoded), now, out);
      },
      std::move(done));
}

Status Replicator::BeforeRead(uint64_t hash, bool* held) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t request = next_request_++;
  ChainOutput out;
  switch (member_->OnRead(request, hash, NowMs(), &out)) {
    case partition::ChainMember::Read::kServe:
      return Status::OK();
    case partition::ChainMember::Read::kRefuse: {
      const ChainRole role = member_->chain_role();
      if (role == ChainRole::kHead || role == ChainRole::kMiddle) {
        return Status::NotOwner(std::string("this member is the ") + RoleName(role) + " of mark " +
                                std::to_string(options_.mark) +
                                "'s chain: under sync the tail serves reads");
      }
      return Status::Unavailable("member " + options_.self + " of mark " +
                                 std::to_string(options_.mark) + " cannot serve reads now (" +
                                 RoleName(role) + ")");
    }
    case partition::ChainMember::Read::kWait:
      break;
  }
  reads_held_.fetch_add(1, std::memory_order_relaxed);
  if (held != nullptr) {
    *held = true;  // the member releases the parked read later: ignored (Finish)
    return Status::Unavailable("read held back");
  }
  // A catch-up holds this key back until the joiner applied its writes, or
  // under always the head's commit point its newest write (or the peer
  // timeout passed: Expire()).
  return WaitFor(
      [&](WriteDone done) {
        pending_[request] = {std::move(done), NowMs() + options_.peer_timeout_ms, nullptr};
        lk.unlock();
      },
      options_.peer_timeout_ms, nullptr);
}

bool Replicator::ConfirmRead(uint64_t hash) {
  std::lock_guard<std::mutex> lk(mu_);
  if (member_->ConfirmRead(hash, NowMs())) return true;
  reads_again_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Status Replicator::OnFrame(const std::string& from, const rpc::ChainFrame& frame, bool wait) {
  ChainMessage msg;
  FLATKV_RETURN_IF_ERROR(DecodeChainFrame(frame, &msg));
  for (const ChainEntry& e : msg.entries) {
    std::vector<rpc::ChainOp> ops;
    FLATKV_RETURN_IF_ERROR(DecodeChainOps(e.op, &ops));
  }
  frames_received_.fetch_add(1, std::memory_order_relaxed);
  spdlog::trace("chain: from {}: kind {} chain {:x} entries {} applied {} committed {}", from,
               static_cast<int>(msg.kind), msg.chain, msg.entries.size(), msg.applied,
               msg.committed);
  Waiter w;
  Event ev;
  if (wait) ev.done = &w;
  frames_pending_.fetch_add(1, std::memory_order_relaxed);
  ev.run = [this, from, msg = std::move(msg)](int64_t now, ChainOutput* out) {
    frames_pending_.fetch_sub(1, std::memory_order_relaxed);
    member_->OnMessage(from, msg, now, out);
  };
  Post(std::move(ev), /*run_here=*/!wait);
  if (!wait) return Status::OK();
  std::unique_lock<std::mutex> lk(mu_);
  w.cv.wait(lk, [&] { return w.done; });
  return w.status;
}

void Replicator::SignalDone(Waiter* w, const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (w->status.ok()) w->status = status;
  w->done = true;
  w->cv.notify_all();
}

void Replicator::Loop() {
  int64_t next_tick = NowMs();
  while (true) {
    std::deque<Event> events;
    {
      std::unique_lock<std::mutex> lk(queue_mu_);
      while (true) {
        if (handoff_) {  // running_ is ours already
          handoff_ = false;
          break;
        }
        const bool due = NowMs() >= next_tick;
        if (!running_ && (stopping_ || due || !queue_.empty())) {
          running_ = true;
          break;
        }
        // A thread running events releases them to us (RunHere).
        loop_wants_ = due || stopping_;
        if (loop_wants_) {
          queue_cv_.wait(lk);
        } else {
          queue_cv_.wait_for(lk, std::chrono::milliseconds(std::max<int64_t>(1, next_tick - NowMs())));
        }
      }
      loop_wants_ = false;
      if (stopping_) break;  // running_ stays ours: nothing runs events any more
      events.swap(queue_);
      queued_for_loop_ = 0;
    }
    const int64_t now = NowMs();
    RunEvents(&events, now, /*here=*/false);
    if (now >= next_tick) {
      ChainOutput out;
      Tick(now, &out);
      Process(&out);
      next_tick = now + options_.tick_ms;
    }
    std::lock_guard<std::mutex> lock(queue_mu_);
    running_ = false;
  }
  // Shutting down: what is held carried out, the store made durable, the
  // log emptied.
  Drain();
  Checkpoint();
}

bool Replicator::RunEvents(std::deque<Event>* events, int64_t now, bool here) {
  ChainOutput out;
  std::vector<Waiter*> done;
  auto flush = [&] {
    Process(&out, &done);
    out = ChainOutput();
  };
  for (Event& ev : *events) {
    if (ev.serial) {
      // Runs on the store as the member's state says it is: everything
      // before carried out, the pipeline's held writes too.
      flush();
      Drain();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ev.run(now, &out);
    }
    if (ev.serial) {
      Process(&out);
      Drain();
      out = ChainOutput();
      if (ev.after) {
        ev.after(now, &out);
        Process(&out);
        Drain();
        out = ChainOutput();
      }
    }
    if (ev.done != nullptr) done.push_back(ev.done);
  }
  if (here && Heavy(out)) {
    // The loop carries out this output first, then whatever queued meanwhile
    // (events here have no waiter: RunHere takes none).
    auto held = std::make_shared<ChainOutput>(std::move(out));
    Event ev;
    ev.run = [held](int64_t, ChainOutput* o) { *o = std::move(*held); };
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.push_front(std::move(ev));
      handoff_ = true;
    }
    queue_cv_.notify_one();
    return false;
  }
  flush();
  return true;
}

void Replicator::Tick(int64_t now, ChainOutput* out) {
  Expire(now);
  // Out of the chain for a full disk: no lease, no join, until there is room.
  if (disk_full_.load() && !RejoinAfterFullDisk(now, out)) return;
  // The member decides on its lease (ChainMember::OnSessionAnswer); the
  // shell only passes on what the session answered. Not fenced for being
  // disconnected: a member learns that its session expired from the ring
  // (its registration gone) once ZooKeeper answers; until then a chain of
  // one keeps serving (DESIGN.md, "ZooKeeper unreachable").
  const partition::SessionLease lease = coordinator_->lease();
  std::lock_guard<std::mutex> lock(mu_);
  if (lease.sent_ms != 0 && lease.sent_ms != lease_sent_ms_) {
    lease_sent_ms_ = lease.sent_ms;
    member_->OnSessionAnswer(lease.sent_ms, lease.timeout_ms, now, out, lease.session);
  }
  const bool leased = member_->leased(now);
  if (leased != leased_) {
    spdlog::warn("chain: ZooKeeper lease {}",
                 leased ? "renewed" : "lost (writes and sync reads refused)");
    leased_ = leased;
  }
  const ChainRole role = member_->chain_role();
  if (joined_ && (role == ChainRole::kFenced || role == ChainRole::kNone) && ring_ != nullptr) {
    spdlog::info("chain: not in mark {}'s chain: catching up to join it", options_.mark);
    member_->StartJoin(now, out);
  }
  member_->OnTick(now, out);
}

void Replicator::Process(ChainOutput* out, std::vector<Waiter*>* done) {
  auto signal = [&] {
    if (done == nullptr) return;
    for (Waiter* w : *done) SignalDone(w, Status::OK());
    done->clear();
  };
  if (!pipelined_) {
    Carry(out, /*logged=*/false);
    return signal();
  }
  ReleaseSynced();
  // What reads or resets the store as the member's state names it, or
  // waits on ZooKeeper, runs once everything before it is carried out; so
  // does a checkpoint, which restarts the log from the member's position.
  // (All Heavy(): on the loop thread.)
  const bool drain = out->wipe || !out->record.empty() || !out->snapshots.empty() ||
                     out->deregister || out->register_now || disk_full_.load() ||
                     CheckpointWanted();
  if (drain) Drain();
  if (held_.empty() && (out->apply.empty() || drain)) {
    Carry(out, /*logged=*/false);
    return signal();
  }
  if (!out->apply.empty()) {
    Status st = log_->Append(out->apply);
    if (!st.ok()) {
      // Nothing of this batch is logged: what was before it is carried out,
      // then this one as without the pipeline (its Append fails again).
      Drain();
      Carry(out, /*logged=*/false);
      return signal();
    }
    SendDownFirst(out);
    ++logged_batch_;
    {
      std::lock_guard<std::mutex> lock(sync_mu_);
      sync_want_ = logged_batch_;
    }
    sync_cv_.notify_all();
  }
  if (out->empty() && (done == nullptr || done->empty())) return;
  Held h;
  h.out = std::move(*out);
  *out = ChainOutput();
  if (done != nullptr) h.done.swap(*done);
  h.batch = logged_batch_;
  held_.push_back(std::move(h));
}

void Replicator::Finish(uint64_t request, const Status& status) {
  WriteDone done;
  bool existed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = seq_of_request_.find(request);
    if (s != seq_of_request_.end()) {
      auto e = existed_.find(s->second);
      if (e != existed_.end()) {
        existed = e->second;
        existed_.erase(e);
      }
      seq_of_request_.erase(s);
    }
    auto it = pending_.find(request);
    if (it == pending_.end()) return;  // expired meanwhile
    done = std::move(it->second.done);
    pending_.erase(it);
  }
  done(status, existed);
}

void Replicator::Expire(int64_t now) {
  std::vector<Pending> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Reads wait less than writes: every entry is looked at.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      late.push_back(std::move(it->second));
      it = pending_.erase(it);
    }
  }
  for (Pending& p : late) {
    if (p.what == nullptr) {
      p.done(Status::Unavailable("a read of mark " + std::to_string(options_.mark) +
                                 " waited too long for a joining member"),
             false);
    } else {
      p.done(Status::Unavailable("the chain of mark " + std::to_string(options_.mark) +
                                 " did not acknowledge the " + p.what +
                                 " in time (it may still be applied)"),
             false);
    }
  }
}

std::string Replicator::role() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->role();
}

partition::ChainRole Replicator::chain_role() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->chain_role();
}

bool Replicator::lease_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->lease_held();
}

ChainPosition Replicator::applied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->applied();
}

void Replicator::AddStats(std::map<std::string, int64_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ChainPosition p = member_->applied();
    (*out)["cluster.chain.applied_epoch"] = p.epoch;
    if (tracker_.on) {
      (*out)["cluster.track.keys"] =
          static_cast<int64_t>(tracker_.keys.size() + tracker_.skeys.size());
      (*out)["cluster.track.overflowed"] = tracker_.overflow.empty() ? 0 : 1;
    }
    (*out)["cluster.track.writes"] = tracked_writes_.load(std::memory_order_relaxed);
    (*out)["cluster.track.overflows"] = track_overflows_.load(std::memory_order_relaxed);
    (*out)["cluster.chain.applied_seq"] = static_cast<int64_t>(p.seq);
    (*out)["cluster.chain.committed_seq"] = static_cast<int64_t>(member_->committed());
    (*out)["cluster.chain.pending_writes"] = static_cast<int64_t>(member_->pending_writes());
    (*out)["cluster.chain.lag_writes"] = static_cast<int64_t>(member_->lag_writes());
    (*out)["cluster.chain.lag_bytes"] = static_cast<int64_t>(member_->lag_bytes());
    (*out)["cluster.chain.log_bytes"] = static_cast<int64_t>(member_->log_bytes());
    (*out)["cluster.chain.refused_messages"] = static_cast<int64_t>(member_->refused_messages());
    (*out)["cluster.chain.leased"] = member_->lease_held() ? 1 : 0;
    const ChainRole role = member_->chain_role();
    if ((role == ChainRole::kTail || role == ChainRole::kSingle) &&
        !member_->downstream().empty()) {
      // A joiner catching up from this tail: what it still lacks.
      (*out)["cluster.chain.joiner." + member_->downstream() + ".lag_writes"] =
          static_cast<int64_t>(member_->lag_writes());
    }
  }
  {
    std::lock_guard<std::mutex> lock(progress_mu_);
    loading_.Report("cluster.chain.snapshot_from." + loading_.peer + ".", out);
    sending_.Report("cluster.chain.snapshot_to." + sending_.peer + ".", out);
  }
  (*out)["cluster.chain.disk_full"] = disk_full_.load() ? 1 : 0;
  (*out)["cluster.chain.disk_full_leaves"] = disk_full_leaves_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.applied_entries"] = applied_entries_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.apply_batches"] = apply_batches_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.checkpoints"] = checkpoints_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.repairs"] = repairs_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.reads_held"] = reads_held_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.reads_again"] = reads_again_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.log_syncs"] = pipeline_syncs_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.log_file_bytes"] =
      static_cast<int64_t>(log_bytes_.load(std::memory_order_relaxed));
  (*out)["cluster.chain.frames_sent"] = frames_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.frames_failed"] = frames_failed_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.frames_received"] = frames_received_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.snapshots_sent"] = snapshots_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.snapshot_bytes_sent"] =
      snapshot_bytes_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.snapshot_bytes_loaded"] =
      snapshot_bytes_loaded_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.wipes"] = wipes_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.records"] = records_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.evictions"] = evictions_.load(std::memory_order_relaxed);
}

}  // namespace flatkv::server
