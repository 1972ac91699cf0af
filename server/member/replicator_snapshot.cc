// Snapshots: a member streaming its store to a joiner
// (Replicator::SnapshotSender, one thread per joiner, pages read a page
// ahead and rate-limited), and a joiner emptying its store and loading the
// pages it is sent.
#include <algorithm>
#include <chrono>
#include <map>

#include <spdlog/spdlog.h>

#include "client/client.h"
#include "server/handler.h"
#include "server/member/replicator.h"
#include "server/member/replicator_internal.h"

namespace flatkv::server {
namespace {

using partition::ChainOutput;
using partition::ChainPosition;
using replicator_internal::Fatal;
using replicator_internal::NowMs;
using replicator_internal::PeerContextOf;
using replicator_internal::PeerOptions;

}  // namespace

Replicator::SnapshotSender::SnapshotSender(Replicator* owner, const std::string& to,
                                           ChainPosition at)
    : owner_(owner), to_(to), at_(at), started_ms_(NowMs()) {
  thread_ = std::thread([this] { Run(); });
}

Replicator::SnapshotSender::~SnapshotSender() {
  stop_.store(true);
  thread_.join();
}

void Replicator::SnapshotSender::Run() {
  struct End {
    std::atomic<bool>* ended;
    ~End() { ended->store(true); }
  } ended{&ended_};
  const ReplicatorOptions& opt = owner_->options_;
  client::Client conn(PeerOptions(to_, std::max(opt.peer_timeout_ms, 10000), opt));
  const rpc::PeerContext ctx = PeerContextOf(opt);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t total = owner_->store_->LiveBytesEstimate();
  uint64_t bytes = 0;
  int64_t token = 0;
  bool first = true;
  auto send = [&](rpc::SnapshotPage* page) -> bool {
    page->token = token;
    page->first = first;
    page->atEpoch = at_.epoch;
    page->atSeq = static_cast<int64_t>(at_.seq);
    page->__set_totalBytes(static_cast<int64_t>(total));
    int64_t answer = 0;
    Status st = conn.Call("peerSnapshot", false, [&](rpc::FlatKVClient& c) {
      answer = c.peerSnapshot(ctx, opt.self, *page);
    });
    if (!st.ok()) {
      spdlog::warn("chain: snapshot to {} stopped: {}", to_, st.ToString());
      return false;
    }
    token = answer;
    first = false;
    owner_->snapshot_bytes_sent_.store(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(owner_->progress_mu_);
      owner_->sending_.bytes = bytes;
      if (page->last) owner_->sending_.end_ms = NowMs();
    }
    // Throttle: cluster.resync_mb_per_sec.
    if (opt.resync_bytes_per_sec > 0) {
      const double due =
          static_cast<double>(bytes) / static_cast<double>(opt.resync_bytes_per_sec);
      const double spent =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (due > spent) std::this_thread::sleep_for(std::chrono::duration<double>(due - spent));
    }
    return !stop_.load();
  };
  {
    std::lock_guard<std::mutex> lock(owner_->progress_mu_);
    owner_->sending_ = {to_, 0, total, NowMs(), 0};
  }
  spdlog::info("chain: streaming a snapshot of about {} MB to {} (resumes after epoch {} seq {})",
               static_cast<double>(total) / 1e6, to_, at_.epoch, at_.seq);
  // Writes still in an async cache must be in the store it scans.
  (void)owner_->cache_->Flush();
  // The store is read a page ahead, on a second thread, while the joiner
  // loads the page before it: reading and loading overlap rather than
  // take turns (at most kAhead pages wait in memory).
  constexpr size_t kPage = 2048;
  constexpr uint64_t kPageBytes = 1u << 20;
  constexpr size_t kAhead = 2;
  struct Ready {
    rpc::SnapshotPage page;
    uint64_t bytes = 0;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Ready> ready;
  bool read_all = false;  // the reader pushed the last page (or failed)
  bool quit = false;      // the sender stopped: the reader stops too
  Status read_status;
  std::thread reader([&] {
    Ready next;
    // Hands a full page (or the last one) over; false ends the walk.
    auto push = [&](bool last) {
      if (!last && next.bytes < kPageBytes &&
          next.page.pairs.size() + next.page.spairs.size() < kPage) {
        return !stop_.load();
      }
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return quit || ready.size() < kAhead; });
      if (quit) return false;
      ready.push_back(std::move(next));
      next = Ready();
      cv.notify_all();
      return !stop_.load();
    };
    Status st = ForEachPage(
        *owner_->store_, kPage,
        [&](std::vector<engine::KeyValue>* out) {
          for (engine::KeyValue& kv : *out) {
            rpc::KvPair p;
            p.key = kv.key;
            next.bytes += kv.value.size() + 8;
            p.value = std::move(kv.value);
            next.page.pairs.push_back(std::move(p));
          }
          return push(false);
        },
        [&](std::vector<engine::StringKeyValue>* out) {
          for (engine::StringKeyValue& kv : *out) {
            rpc::StringKvPair p;
            next.bytes += kv.key.size() + kv.value.size();
            p.key = std::move(kv.key);
            p.value = std::move(kv.value);
            next.page.spairs.push_back(std::move(p));
          }
          return push(false);
        });
    bool finished = st.ok() && !stop_.load();
    if (finished) {
      std::lock_guard<std::mutex> lk(mu);
      finished = !quit;
    }
    if (finished) {
      next.page.last = true;
      // Read after the whole store: every write the copy holds was
      // applied by the member first (the loop applies to the store after).
      std::lock_guard<std::mutex> lock(owner_->mu_);
      const partition::ChainPosition end = owner_->member_->applied();
      next.page.__set_endEpoch(end.epoch);
      next.page.__set_endSeq(static_cast<int64_t>(end.seq));
    }
    if (finished) (void)push(true);
    std::lock_guard<std::mutex> lk(mu);
    read_status = st;
    read_all = true;
    cv.notify_all();
  });
  bool sent_last = false;
  for (;;) {
    Ready r;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !ready.empty() || read_all; });
      if (ready.empty()) break;  // the reader is done and nothing waits
      r = std::move(ready.front());
      ready.pop_front();
      cv.notify_all();
    }
    bytes += r.bytes;
    if (stop_.load() || !send(&r.page)) break;
    if (r.page.last) {
      sent_last = true;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    quit = true;
    cv.notify_all();
  }
  reader.join();
  if (!read_status.ok()) {
    spdlog::warn("chain: snapshot to {}: reading the store: {}", to_, read_status.ToString());
    return;
  }
  if (!sent_last) return;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  owner_->snapshots_sent_.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("chain: snapshot to {} sent: {} MB in {:.2f} s ({:.1f} MB/s)", to_,
               static_cast<double>(bytes) / 1e6, secs,
               secs > 0 ? static_cast<double>(bytes) / 1e6 / secs : 0.0);
  done_.store(true);
}

void Replicator::StartSnapshot(const std::string& to, ChainPosition at) {
  if (auto it = senders_.find(to);
      it != senders_.end() && it->second->running() && it->second->at() == at &&
      NowMs() - it->second->started_ms() < options_.chain.joiner_timeout_ms) {
    // The joiner asked again before the stream's first page reached it
    // (it asks every resend_ms until then): the stream under way serves it.
    // Replacing it would start the copy over each time a first page is
    // slower than resend_ms. A joiner that cannot take the stream (it
    // restarted, or emptied its store) refuses its next page, which ends it.
    return;
  }
  senders_.erase(to);  // a new stream to the same joiner replaces the old one
  for (auto it = senders_.begin(); it != senders_.end();) {
    it = it->second->done() ? senders_.erase(it) : std::next(it);
  }
  senders_[to] = std::make_unique<SnapshotSender>(this, to, at);
}

Status Replicator::OnSnapshotPage(const std::string& from, const rpc::SnapshotPage& page,
                                  int64_t* token) {
  // Runs on the loop: the first page empties the store (its output's wipe),
  // then every page is loaded while its stream is the current one.
  Waiter w;
  uint64_t t = 0;
  Event ev;
  ev.done = &w;
  ev.serial = true;
  ev.run = [this, from, &page, &t](int64_t now, ChainOutput* out) {
    t = static_cast<uint64_t>(page.token);
    if (page.first) {
      t = member_->OnSnapshotBegin(from, {page.atEpoch, static_cast<uint64_t>(page.atSeq)}, now,
                                  out);
    }
    if (t == 0 || !member_->snapshot_current(t)) {
      t = 0;
      return;
    }
    member_->OnSnapshotProgress(t, now);
  };
  ev.after = [this, from, &page, &t, &w](int64_t now, ChainOutput* out) {
    if (t == 0) {
      w.status = Status::NotOwner("member " + options_.self +
                                  " does not expect this snapshot stream (a later one replaced "
                                  "it, or it is no longer joining)");
      return;
    }
    const int64_t before = snapshot_bytes_loaded_.load(std::memory_order_relaxed);
    Status st = LoadPage(page);
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      if (page.first) loading_ = {from, 0, 0, NowMs(), 0};
      loading_.total = static_cast<uint64_t>(page.totalBytes);
      loading_.bytes += static_cast<uint64_t>(
          snapshot_bytes_loaded_.load(std::memory_order_relaxed) - before);
      if (page.last && st.ok()) loading_.end_ms = NowMs();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok()) {
      spdlog::warn("chain: loading a snapshot page: {}", st.ToString());
      member_->OnSnapshotFailed(t, now, out);
      w.status = st;
      return;
    }
    if (page.last && member_->snapshot_current(t)) {
      spdlog::info("chain: snapshot loaded; catching up from epoch {} seq {}", page.atEpoch,
                   page.atSeq);
      const partition::ChainPosition end =
          page.__isset.endSeq
              ? partition::ChainPosition{page.endEpoch, static_cast<uint64_t>(page.endSeq)}
              : partition::ChainPosition{page.atEpoch, static_cast<uint64_t>(page.atSeq)};
      member_->OnSnapshotLoaded(t, end, now, out);
      checkpoint_due_ = true;  // the pages were written without a sync
    }
  };
  Post(std::move(ev));
  {
    std::unique_lock<std::mutex> lk(mu_);
    w.cv.wait(lk, [&] { return w.done; });
  }
  if (!w.status.ok()) return w.status;
  *token = static_cast<int64_t>(t);
  return Status::OK();
}

Status Replicator::LoadPage(const rpc::SnapshotPage& page) {
  std::vector<engine::KeyValueRef> batch;
  batch.reserve(page.pairs.size());
  uint64_t bytes = 0;
  for (const rpc::KvPair& p : page.pairs) {
    batch.push_back({p.key, p.value});
    bytes += p.value.size() + 8;
  }
  if (!batch.empty()) FLATKV_RETURN_IF_ERROR(cache_->PutBatch(batch));
  for (const rpc::StringKvPair& p : page.spairs) {
    FLATKV_RETURN_IF_ERROR(cache_->SPut(p.key, p.value));
    bytes += p.key.size() + p.value.size();
  }
  snapshot_bytes_loaded_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return Status::OK();
}

void Replicator::Progress::Report(const std::string& prefix,
                                  std::map<std::string, int64_t>* out) const {
  if (peer.empty()) return;
  const int64_t ms = std::max<int64_t>(1, (end_ms != 0 ? end_ms : NowMs()) - start_ms);
  // The total is an estimate (record headers, dead bytes not yet known as
  // such): 100 only once the stream ended.
  int64_t percent = total > 0 ? static_cast<int64_t>(std::min<uint64_t>(99, bytes * 100 / total))
                              : 0;
  if (end_ms != 0) percent = 100;
  (*out)[prefix + "percent"] = percent;
  (*out)[prefix + "bytes"] = static_cast<int64_t>(bytes);
  (*out)[prefix + "total_bytes"] = static_cast<int64_t>(total);
  (*out)[prefix + "bytes_per_sec"] = static_cast<int64_t>(bytes * 1000 / static_cast<uint64_t>(ms));
  (*out)[prefix + "done"] = end_ms != 0 ? 1 : 0;
}

Status Replicator::Wipe() {
  wipes_.fetch_add(1, std::memory_order_relaxed);
  // Snapshot streams this member sends read the store being emptied: a
  // joiner would load a partial copy and take it for whole. Stopped here
  // (each ends after the page in flight, without its last page), so their
  // joiners ask again, elsewhere.
  if (!senders_.empty()) {
    spdlog::warn("chain: stopping {} snapshot stream(s): this member empties its store",
                 senders_.size());
    senders_.clear();
  }
  intact_ = false;
  // Not intact from here until registered again (the writes logged before
  // are void: the store is being replaced).
  if (Status st = log_->Reset({{}, false}); !st.ok()) {
    if (!st.IsNoSpace()) Fatal("resetting the log for a wipe", st);
    return st;  // Process() sees NoSpace: out of the chain until there is room
  }
  logged_intact_ = false;
  FLATKV_RETURN_IF_ERROR(cache_->Flush());
  uint64_t removed = 0;
  Status st;
  std::vector<std::string> skeys;  // removed after the walk: SScan's cursor stays valid
  FLATKV_RETURN_IF_ERROR(ForEachPage(
      *store_, 1024,
      [&](std::vector<engine::KeyValue>* out) {
        for (const engine::KeyValue& kv : *out) {
          if (st = cache_->Remove(kv.key); !st.ok()) return false;
        }
        removed += out->size();
        return true;
      },
      [&](std::vector<engine::StringKeyValue>* out) {
        for (engine::StringKeyValue& kv : *out) skeys.push_back(std::move(kv.key));
        return true;
      }));
  FLATKV_RETURN_IF_ERROR(st);
  for (const std::string& k : skeys) FLATKV_RETURN_IF_ERROR(cache_->SRemove(k));
  removed += skeys.size();
  spdlog::info("chain: emptied the store for a snapshot ({} keys removed)", removed);
  return Status::OK();
}

}  // namespace flatkv::server
