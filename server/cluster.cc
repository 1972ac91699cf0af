// Implementation notes
//
// The pool keeps idle connections per member address; a call borrows one
// (or opens a new one), and gives it back only if the call got an answer:
// after a network failure the connection's state is unknown. There is no cap
// on connections per peer beyond the callers in flight (one per handler
// thread), so the pool never makes a call wait for another.
#include "server/cluster.h"
#include "server/migration.h"

#include <signal.h>
#include <unistd.h>

#include <future>

#include <spdlog/spdlog.h>

namespace flatkv::server {
namespace {

constexpr size_t kMaxIdlePerPeer = 64;

}  // namespace

bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

Status Cluster::Start(const Config& config, std::function<void(const Status&)> on_fatal,
                      std::unique_ptr<Cluster>* result) {
  partition::RegistryOptions options;
  options.zookeeper = config.cluster.zookeeper;
  options.service_path = config.cluster.service_path;
  options.mark = config.cluster.mark;
  options.advertise = config.cluster.advertise;
  options.settings.hash_bound = config.cluster.hash_bound;
  options.settings.replication = config.cluster.replication;
  options.session_timeout_ms = config.cluster.session_timeout_ms;
  options.on_fatal = std::move(on_fatal);
  auto hooks = std::make_shared<Hooks>();
  options.on_ring = [hooks](std::shared_ptr<const partition::Ring> ring) {
    spdlog::info("ring version {}: {}", ring->version(), ring->ToString());
    if (Replicator* r = hooks->replicator.load()) r->OnRing(ring);
    if (Cluster* c = hooks->cluster.load()) c->OnRingChange(*ring);
  };
  options.on_registered = [hooks](int64_t czxid) {
    if (Replicator* r = hooks->replicator.load()) r->OnRegistered(czxid);
  };
  // With a chain, a member whose session expired catches up before it
  // registers again (the replicator decides when).
  options.reregister_after_expiry = false;
  std::unique_ptr<partition::Registry> registry;
  FLATKV_RETURN_IF_ERROR(partition::Registry::Start(std::move(options), &registry));
  result->reset(new Cluster(config, std::move(registry), hooks));
  hooks->cluster.store(result->get());
  if (auto ring = (*result)->ring()) (*result)->OnRingChange(*ring);
  return Status::OK();
}

Cluster::Cluster(const Config& config, std::unique_ptr<partition::Registry> registry,
                 std::shared_ptr<Hooks> hooks)
    : options_(config.cluster),
      router_(config.cluster.mark),
      advertise_(config.cluster.advertise),
      registry_(std::move(registry)),
      hooks_(std::move(hooks)) {}

Cluster::~Cluster() { Close(); }

Status Cluster::StartReplication(const Config& config, engine::Store* store,
                                 engine::cache::WriteBackCache* cache) {
  ReplicatorOptions o;
  o.self = advertise_;
  o.mark = mark();
  o.data_dir = config.storage.path;
  o.sync = options_.replication == "sync";
  o.sync_always = config.storage.sync == engine::SyncMode::kAlways;
  o.session_timeout_ms = options_.session_timeout_ms;
  o.peer_timeout_ms = options_.peer_timeout_ms;
  o.peer_token = options_.peer_token;
  o.resync_bytes_per_sec = static_cast<uint64_t>(options_.resync_mb_per_sec) << 20;
  o.chain.backlog_bytes = static_cast<uint64_t>(options_.backlog_bytes);
  FLATKV_RETURN_IF_ERROR(Replicator::Start(std::move(o), store, cache, this, &replicator_));
  hooks_->replicator.store(replicator_.get());
  if (auto ring = registry_->ring()) replicator_->OnRing(ring);
  store_ = store;
  cache_ = cache;
  return Status::OK();
}

void Cluster::Join() {
  if (replicator_) {
    replicator_->Join();
  } else {
    registry_->Register();
  }
}

void Cluster::Register() {
  const auto ring = registry_->ring();
  const partition::RingChange* change = ring ? ring->change() : nullptr;
  const bool mine = change != nullptr && change->importer == advertise_ && change->mark == mark();
  if (!mine && (!ring || ring->empty() || ring->Find(mark()) != nullptr)) {
    return registry_->Register();
  }
  std::lock_guard<std::mutex> lock(gate_mu_);
  if (gate_.joinable() || gate_stop_) return;  // already checking
  gate_ = std::thread([this] { GateLoop(); });
}

void Cluster::GateLoop() {
  std::string logged;
  for (;;) {
    Status st = GateStep();
    std::unique_lock<std::mutex> lock(gate_mu_);
    if (gate_stop_) return;
    if (st.ok()) {
      gate_reason_.clear();
      return;
    }
    gate_reason_ = st.message();
    if (gate_reason_ != logged) {
      spdlog::error("not registering yet: {}", gate_reason_);
      logged = gate_reason_;
    }
    gate_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return gate_stop_; });
    if (gate_stop_) return;
  }
}

bool Cluster::GateStopped() const {
  std::lock_guard<std::mutex> lock(gate_mu_);
  return gate_stop_;
}

Status Cluster::GateStep() {
  const auto ring = registry_->ring();
  const partition::RingChange* change = ring->change();
  const bool mine = change != nullptr && change->importer == advertise_ && change->mark == mark();
  std::optional<partition::RingChange> flipped;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    flipped = flipped_;
  }
  if (flipped) {
    // This process wrote state "flip" (the ring read may lag behind it).
    registry_->Register();
    return FinishImport(*flipped);
  }
  if (mine && change->state != "copy") {
    // The copy is complete and durable: register (again) and finish. Never
    // copy again: the ring may flip at any moment from here.
    registry_->Register();
    return FinishImport(*change);
  }
  if (ring->Find(mark()) != nullptr) {
    // In the ring already: register (a restart, say).
    registry_->Register();
    return mine ? FinishImport(*change) : Status::OK();
  }
  if (change != nullptr && !mine) {
    return Status::Busy("another ring change runs (" + change->ToJson() + "); waiting for it");
  }
  if (!mine) {
    Status st = CheckTakeOver(*ring);
    if (st.ok()) {
      spdlog::info("mark {} takes over ranges that hold no key: registering", mark());
      registry_->Register();
      return st;
    }
    if (!st.IsInvalidArgument()) return st;  // the owner could not be asked: again
  }
  return Import(*ring);
}

// Cursor-walks every page of "ranges" at "target" (peerExport), calling
// "page" for each; stops at the first failure. The next page is fetched
// while "page" loads the current one.
static Status ExportPages(Cluster* cluster, const Cluster::Target& target,
                          const std::vector<partition::HashRange>& ranges, int32_t limit,
                          const std::function<Status(rpc::ExportPage&)>& page) {
  for (const partition::HashRange& r : ranges) {
    auto fetch = [cluster, &target, r, limit](std::string cursor) {
      std::pair<Status, rpc::ExportPage> got;
      got.first = cluster->Forward(target, "peerExport", true, [&](rpc::FlatKVClient& c) {
        c.peerExport(got.second, target.context, r.lo, r.hi, cursor, limit);
      });
      return got;
    };
    auto next = std::async(std::launch::async, fetch, std::string());
    for (;;) {
      auto [st, p] = next.get();
      if (!st.ok()) return st;
      const bool done = p.done;
      if (!done) next = std::async(std::launch::async, fetch, p.cursor);
      st = page(p);
      if (!st.ok()) {
        if (!done) next.wait();
        return st;
      }
      if (done) break;
    }
  }
  return Status::OK();
}

Status Cluster::Import(const partition::Ring& ring) {
  if (replicator_ == nullptr || store_ == nullptr) {
    return Status::Unavailable("importing needs chain replication (a ring member's store)");
  }
  const std::vector<partition::HashRange> ranges = RangesTakenBy(ring, mark());
  if (ranges.empty()) return Status::Unavailable("no range to take over");
  const size_t source_index = ranges.front().partition;
  partition::RingChange change;
  if (ring.change() != nullptr) {
    change = *ring.change();  // ours, from before a restart: copy again from the start
  } else {
    change.mark = mark();
    change.into = mark();
    change.source = ring.partitions()[source_index].mark;
    change.importer = advertise_;
    change.state = "copy";
    for (const partition::HashRange& r : ranges) change.ranges.emplace_back(r.lo, r.hi);
    FLATKV_RETURN_IF_ERROR(registry_->CreateChange(change));
    spdlog::info("ring change: mark {} imports {} from mark {}", mark(), change.ToJson(),
                 change.source);
  }
  const auto now_ring = registry_->ring();
  if (now_ring->change() == nullptr || now_ring->change()->importer != advertise_) {
    return Status::Unavailable("the ring change node is not ours any more");
  }
  change = *now_ring->change();
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    import_ = ImportProgress();
    import_.running = true;
    import_.start_ms = NowMillis();
  }
  // 1. The source stops taking writes to the ranges and commits what it took.
  Target head;
  FLATKV_RETURN_IF_ERROR(RouteTo(*now_ring, source_index, /*write=*/true, &head));
  FLATKV_RETURN_IF_ERROR(Forward(head, "peerFence", true, [&](rpc::FlatKVClient& c) {
    c.peerFence(head.context);
  }));
  // 2. This store starts empty (an earlier attempt may have left half a copy).
  FLATKV_RETURN_IF_ERROR(WipeStore());
  // 3. The copy, from the member that serves the source's reads.
  Target reader;
  FLATKV_RETURN_IF_ERROR(RouteTo(*now_ring, source_index, /*write=*/false, &reader));
  const uint64_t rate = static_cast<uint64_t>(options_.migrate_mb_per_sec) << 20;
  const int64_t started = NowMillis();
  Status copied = ExportPages(this, reader, ranges, 512, [&](rpc::ExportPage& p) {
    if (GateStopped()) return Status::Unavailable("stopping");
    std::vector<engine::KeyValueRef> batch;
    uint64_t bytes = 0;
    for (const rpc::KvPair& kv : p.pairs) {
      batch.push_back({kv.key, kv.value});
      bytes += kv.value.size() + 8;
    }
    if (!batch.empty()) FLATKV_RETURN_IF_ERROR(cache_->PutBatch(batch));
    for (const rpc::StringKvPair& kv : p.spairs) {
      FLATKV_RETURN_IF_ERROR(cache_->SPut(kv.key, kv.value));
      bytes += kv.key.size() + kv.value.size();
    }
    uint64_t total;
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      import_.keys += p.pairs.size() + p.spairs.size();
      import_.bytes += bytes;
      total = import_.bytes;
    }
    if (rate > 0) {  // cluster.migrate_mb_per_sec
      const int64_t due = static_cast<int64_t>(total * 1000 / rate);
      const int64_t spent = NowMillis() - started;
      if (due > spent) std::this_thread::sleep_for(std::chrono::milliseconds(due - spent));
    }
    return Status::OK();
  });
  if (!copied.ok()) return copied;
  // 4. Durable, and the chain position no log covers (joiners take a copy).
  FLATKV_RETURN_IF_ERROR(cache_->Flush());
  FLATKV_RETURN_IF_ERROR(store_->Sync());
  FLATKV_RETURN_IF_ERROR(replicator_->AdoptImport(change.czxid));
  ImportProgress done;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    import_.copied_ms = NowMillis();
    done = import_;
  }
  const double secs = static_cast<double>(done.copied_ms - done.start_ms) / 1000.0;
  spdlog::info("ring change: imported {} keys, {:.1f} MB in {:.2f} s ({:.1f} MB/s); registering "
               "mark {}",
               done.keys, static_cast<double>(done.bytes) / 1e6, secs,
               secs > 0 ? static_cast<double>(done.bytes) / 1e6 / secs : 0.0, mark());
  // 5. Recorded before registering, so that nothing copies again once the
  // ring may flip (a wipe then would lose what the source is about to drop).
  change.state = "flip";
  FLATKV_RETURN_IF_ERROR(registry_->UpdateChange(change));
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    flipped_ = change;
  }
  // 6. The ring flips: the source answers NOT_OWNER for the ranges from now.
  registry_->Register();
  return FinishImport(change);
}

Status Cluster::FinishImport(partition::RingChange change) {
  const auto ring = registry_->ring();
  const partition::Partition* own = ring->Find(mark());
  const bool listed = own != nullptr && std::any_of(own->chain.begin(), own->chain.end(),
                                                    [&](const partition::Member& m) {
                                                      return m.address() == advertise_;
                                                    });
  if (!listed) return Status::Unavailable("ring change: waiting for this member to register");
  if (change.state != "drop") {
    change.state = "drop";
    FLATKV_RETURN_IF_ERROR(registry_->UpdateChange(change));
  }
  // The source drops what moved (only now: this member confirmed it holds it all).
  size_t source_index = ring->partitions().size();
  for (size_t i = 0; i < ring->partitions().size(); ++i) {
    if (ring->partitions()[i].mark == change.source) source_index = i;
  }
  if (source_index == ring->partitions().size()) {
    return Status::Unavailable("ring change: source mark " + std::to_string(change.source) +
                               " is not in the ring");
  }
  Target head;
  FLATKV_RETURN_IF_ERROR(RouteTo(*ring, source_index, /*write=*/true, &head));
  int64_t dropped = 0;
  for (const auto& range : change.ranges) {
    // Plain copies: clang 14 (the fuzz build) cannot capture structured bindings.
    const auto lo = range.first;
    const auto hi = range.second;
    for (int64_t n = 1; n > 0;) {
      FLATKV_RETURN_IF_ERROR(Forward(head, "peerDrop", true, [&](rpc::FlatKVClient& c) {
        n = c.peerDrop(head.context, lo, hi, 20000);
      }));
      dropped += n;
    }
  }
  {
    // Before the node goes: whoever sees it gone sees these too.
    std::lock_guard<std::mutex> lock(gate_mu_);
    import_.running = false;
    import_.dropped = dropped;
    gate_reason_.clear();
  }
  FLATKV_RETURN_IF_ERROR(registry_->DeleteChange(change));
  spdlog::info("ring change done: mark {} serves {}; mark {} dropped {} moved keys", mark(),
               change.ToJson(), change.source, dropped);
  return Status::OK();
}

Status Cluster::WipeStore() {
  std::vector<int64_t> keys;
  std::vector<std::string> skeys;
  FLATKV_RETURN_IF_ERROR(cache_->Flush());
  FLATKV_RETURN_IF_ERROR(ForEachPage(
      *store_, 1024,
      [&](std::vector<engine::KeyValue>* out) {
        for (const engine::KeyValue& kv : *out) keys.push_back(kv.key);
        return true;
      },
      [&](std::vector<engine::StringKeyValue>* out) {
        for (engine::StringKeyValue& kv : *out) skeys.push_back(std::move(kv.key));
        return true;
      }));
  for (int64_t k : keys) FLATKV_RETURN_IF_ERROR(cache_->Remove(k, nullptr));
  for (const std::string& k : skeys) FLATKV_RETURN_IF_ERROR(cache_->SRemove(k, nullptr));
  if (!keys.empty() || !skeys.empty()) {
    spdlog::info("ring change: emptied this store first ({} keys, {} string keys)", keys.size(),
                 skeys.size());
  }
  return Status::OK();
}

Status Cluster::CheckTakeOver(const partition::Ring& ring) {
  for (const partition::HashRange& r : RangesTakenBy(ring, mark())) {
    Target t;
    FLATKV_RETURN_IF_ERROR(RouteTo(ring, r.partition, /*write=*/false, &t));
    std::string cursor;
    for (bool done = false; !done;) {
      rpc::ExportPage page;
      FLATKV_RETURN_IF_ERROR(Forward(t, "peerExport", true, [&](rpc::FlatKVClient& c) {
        c.peerExport(page, t.context, r.lo, r.hi, cursor, 1);
      }));
      if (!page.pairs.empty() || !page.spairs.empty()) {
        const std::string example = !page.pairs.empty()
                                        ? "key " + std::to_string(page.pairs.front().key)
                                        : "string key '" + page.spairs.front().key + "'";
        return Status::InvalidArgument(
            "mark " + std::to_string(mark()) + " would take over hashes [" +
            std::to_string(r.lo) + ", " + std::to_string(r.hi) + "] from mark " +
            std::to_string(t.mark) + ", which holds keys there (" + example +
            "); moving keys to a new mark is not built yet (issue 11): registering would hide "
            "them. Start this instance with a mark the ring has, or empty that range first");
      }
      done = page.done;
      cursor = page.cursor;
    }
  }
  return Status::OK();
}

Status Cluster::CheckWritable(int64_t hash) const {
  const auto ring = registry_->ring();
  const partition::RingChange* change = ring ? ring->change() : nullptr;
  // Every state: until the ring flips this mark still owns the ranges, and
  // a write taken now would miss the importer's copy.
  if (change == nullptr || change->source != mark() || !change->Covers(hash)) {
    return Status::OK();
  }
  return Status::Unavailable("hash " + std::to_string(hash) + " is moving from mark " +
                             std::to_string(mark()) + " to the new mark " +
                             std::to_string(change->mark) + " (copied by " + change->importer +
                             "); writes to it resume once that mark serves");
}

int64_t Cluster::NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Cluster::register_blocked() const {
  std::lock_guard<std::mutex> lock(gate_mu_);
  return gate_reason_;
}

void Cluster::Deregister() { registry_->Deregister(); }

Status Cluster::Ping(int timeout_ms) { return registry_->Ping(timeout_ms); }

Status Cluster::RecordChain(const std::vector<std::string>& members, int64_t ring_version) {
  return registry_->RecordChain(members, ring_version);
}

Status Cluster::StartRemoveMark(int64_t removed) {
  const auto ring = registry_->ring();
  if (!ring) return Status::Unavailable("no ring known yet: ZooKeeper not reached");
  const std::vector<partition::Partition>& parts = ring->partitions();
  size_t at = parts.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].mark == removed) at = i;
  }
  if (at == parts.size()) {
    return Status::InvalidArgument("mark " + std::to_string(removed) + " is not in the ring");
  }
  if (parts.size() < 2) {
    return Status::InvalidArgument("mark " + std::to_string(removed) +
                                   " is the ring's only mark: nothing would inherit its keys");
  }
  // The next mark up inherits the range (the lowest, if this is the highest).
  const partition::Partition& into = parts[(at + 1) % parts.size()];
  if (into.chain.empty()) {
    return Status::Unavailable("mark " + std::to_string(into.mark) +
                               ", which would inherit the keys, has no serving member");
  }
  partition::RingChange change;
  change.kind = "remove";
  change.mark = removed;
  change.source = removed;
  change.into = into.mark;
  change.importer = into.chain.front().address();
  for (const partition::HashRange& r : ring->KeyOrder()) {
    if (r.partition == at) change.ranges.emplace_back(r.lo, r.hi);
  }
  if (const partition::RingChange* now = ring->change();
      now != nullptr && now->kind == "remove" && now->mark == removed) {
    return Status::OK();  // asked again (a retry after a timeout): it runs
  }
  Status st = registry_->CreateChange(change);
  if (st.IsBusy()) {
    // Ours from an earlier attempt that timed out, or another change.
    const auto again = registry_->ring();
    const partition::RingChange* now = again ? again->change() : nullptr;
    if (now != nullptr && now->kind == "remove" && now->mark == removed) return Status::OK();
  }
  FLATKV_RETURN_IF_ERROR(st);
  spdlog::info("ring change: removing mark {}: {}", removed, change.ToJson());
  return Status::OK();
}

Status Cluster::AbortChange() {
  FLATKV_RETURN_IF_ERROR(registry_->AbortChange());
  spdlog::warn("ring change aborted by an admin (rolled back before anything registered)");
  return Status::OK();
}

void Cluster::OnRingChange(const partition::Ring& ring) {
  const partition::RingChange* change = ring.change();
  if (change == nullptr || change->kind != "remove") return;
  if (change->mark == mark() && change->state != "copy") {
    // This mark leaves the ring: its keys are with the inheriting mark.
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      first = !leaving_;
      leaving_ = true;
    }
    if (first) {
      spdlog::warn("mark {} was removed from the ring (its keys now belong to mark {}): this "
                   "member stops serving and exits",
                   mark(), change->into);
      kill(getpid(), SIGTERM);  // a clean stop: the member node goes first
    }
    return;
  }
  if (change->importer != advertise_ || change->into != mark()) return;
  std::lock_guard<std::mutex> lock(gate_mu_);
  if (change_running_ || gate_stop_) return;
  if (change_.joinable()) change_.join();  // an earlier change's, finished
  change_running_ = true;
  change_ = std::thread([this] {
    std::string logged;
    for (;;) {
      Status st = RemoveStep();
      std::unique_lock<std::mutex> wait(gate_mu_);
      if (gate_stop_ || st.ok()) {
        change_running_ = false;
        return;
      }
      if (st.message() != logged) {
        spdlog::warn("ring change: {}", st.message());
        logged = st.message();
      }
      gate_cv_.wait_for(wait, std::chrono::seconds(1), [this] { return gate_stop_; });
      if (gate_stop_) return;
    }
  });
}

Status Cluster::RemoveStep() {
  const auto ring = registry_->ring();
  const partition::RingChange* now = ring->change();
  if (now == nullptr || now->kind != "remove" || now->importer != advertise_) return Status::OK();
  partition::RingChange change = *now;
  const std::vector<partition::Partition>& parts = ring->partitions();
  size_t source = parts.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].mark == change.source) source = i;
  }
  if (change.state == "copy") {
    if (source == parts.size()) return Status::Unavailable("the removed mark is not in the ring");
    if (replicator_ == nullptr || replicator_->head() != advertise_) {
      return Status::Unavailable("only the head of mark " + std::to_string(mark()) +
                                 " imports a removed mark's keys");
    }
    Target head, reader;
    FLATKV_RETURN_IF_ERROR(RouteTo(*ring, source, /*write=*/true, &head));
    FLATKV_RETURN_IF_ERROR(Forward(head, "peerFence", true, [&](rpc::FlatKVClient& c) {
      c.peerFence(head.context);
    }));
    FLATKV_RETURN_IF_ERROR(RouteTo(*ring, source, /*write=*/false, &reader));
    std::vector<partition::HashRange> ranges;
    for (const auto& [lo, hi] : change.ranges) ranges.push_back({lo, hi, source});
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      import_ = ImportProgress();
      import_.running = true;
      import_.start_ms = NowMillis();
    }
    const int64_t bound = ring->settings().hash_bound;
    // Through this mark's chain: every member of it gets the keys.
    Status copied = ExportPages(this, reader, ranges, 512, [&](rpc::ExportPage& p) {
      std::vector<rpc::ChainOp> ops;
      std::vector<uint64_t> hashes;
      uint64_t bytes = 0;
      for (rpc::KvPair& kv : p.pairs) {
        rpc::ChainOp op;
        op.kind = rpc::ChainOpKind::PUT;
        op.__set_key(kv.key);
        bytes += kv.value.size() + 8;
        op.__set_value(std::move(kv.value));
        hashes.push_back(static_cast<uint64_t>(kv.key));
        ops.push_back(std::move(op));
      }
      for (rpc::StringKvPair& kv : p.spairs) {
        rpc::ChainOp op;
        op.kind = rpc::ChainOpKind::SPUT;
        hashes.push_back(static_cast<uint64_t>(partition::Ring::HashString(kv.key, bound)));
        bytes += kv.key.size() + kv.value.size();
        op.__set_skey(std::move(kv.key));
        op.__set_value(std::move(kv.value));
        ops.push_back(std::move(op));
      }
      if (!ops.empty()) {
        const size_t n = ops.size();
        Status st = replicator_->Write(std::move(ops), std::move(hashes), nullptr);
        if (!st.ok()) return st;
        std::lock_guard<std::mutex> lock(gate_mu_);
        import_.keys += n;
        import_.bytes += bytes;
      }
      return Status::OK();
    });
    if (!copied.ok()) return copied;
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      import_.copied_ms = NowMillis();
    }
    change.state = "flip";
    FLATKV_RETURN_IF_ERROR(registry_->UpdateChange(change));
    spdlog::info("ring change: mark {} holds mark {}'s keys; its members leave now", mark(),
                 change.source);
  }
  // The removed mark's members deregister and exit (OnRingChange); then its
  // mark node goes and the ring gives its ranges to this mark.
  const auto again = registry_->ring();
  const partition::Partition* removed = again->Find(change.source);
  if (removed != nullptr && !removed->chain.empty()) {
    return Status::Unavailable("waiting for mark " + std::to_string(change.source) +
                               "'s members to leave");
  }
  FLATKV_RETURN_IF_ERROR(registry_->DeleteMark(change.source));
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    import_.running = false;
  }
  FLATKV_RETURN_IF_ERROR(registry_->DeleteChange(change));
  spdlog::info("ring change done: mark {} removed, mark {} serves its ranges", change.source,
               mark());
  return Status::OK();
}

void Cluster::Close() {
  hooks_->cluster.store(nullptr);  // the registry's callbacks leave this alone from now
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    gate_stop_ = true;
  }
  gate_cv_.notify_all();
  if (gate_.joinable() && gate_.get_id() != std::this_thread::get_id()) gate_.join();
  if (change_.joinable() && change_.get_id() != std::this_thread::get_id()) change_.join();
  // The replicator first: it may call the registry until it stops.
  hooks_->replicator.store(nullptr);
  if (replicator_) replicator_->Stop();
  registry_->Close();
}

std::string Cluster::role() const {
  if (replicator_) {
    const std::string role = replicator_->role();
    return role == "none" ? "syncing" : role;
  }
  const auto ring = registry_->ring();
  const std::string role = ring ? ring->RoleOf(mark(), advertise_) : "";
  return role.empty() ? "syncing" : role;
}

Status Cluster::Route(int64_t hash, bool write, Target* target) {
  const auto ring = registry_->ring();
  if (!ring) {
    return Status::Unavailable("no ring known yet: ZooKeeper (" + options_.zookeeper +
                               ") has not been reached since this instance started");
  }
  return RouteTo(*ring, ring->OwnerIndex(hash), write, target);
}

Status Cluster::RouteTo(const partition::Ring& ring, size_t partition, bool write,
                        Target* target) {
  const partition::Partition& p = ring.partitions()[partition];
  const partition::Member* member = partition::Router::Target(
      p, write, ring.settings().replication, spread_.fetch_add(1, std::memory_order_relaxed));
  if (member == nullptr) {
    return Status::Unavailable("mark " + std::to_string(p.mark) +
                               " has no serving member (ring version " +
                               std::to_string(ring.version()) + ")");
  }
  target->mark = p.mark;
  target->address = member->address();
  target->local = p.mark == mark() && target->address == advertise_;
  target->context.token = options_.peer_token;
  target->context.ringVersion = ring.version();
  target->context.mark = p.mark;
  return Status::OK();
}

std::vector<Cluster::Target> Cluster::OwnChain() {
  std::vector<Target> out;
  const auto ring = registry_->ring();
  const partition::Partition* p = ring ? ring->Find(mark()) : nullptr;
  if (p == nullptr) return out;
  for (const partition::Member& m : p->chain) {
    Target t;
    t.mark = p->mark;
    t.address = m.address();
    t.local = t.address == advertise_;
    t.context.token = options_.peer_token;
    t.context.ringVersion = ring->version();
    t.context.mark = p->mark;
    out.push_back(std::move(t));
  }
  return out;
}

void Cluster::Refresh() {
  not_owner_retries_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const partition::Ring> ring;
  Status st = registry_->Refresh(&ring);
  if (!st.ok()) spdlog::warn("re-reading the ring: {}", st.ToString());
}

std::unique_ptr<client::Client> Cluster::Borrow(const std::string& address) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(address);
    if (it != idle_.end() && !it->second.empty()) {
      auto conn = std::move(it->second.back());
      it->second.pop_back();
      return conn;
    }
  }
  client::ClientOptions o;
  std::string host;
  int port = 0;
  if (partition::ParseHostPort(address, "member", &host, &port).ok()) {
    o.host = host;
    o.port = port;
  }
  o.connect_timeout_ms = options_.peer_timeout_ms;
  o.timeout_ms = options_.peer_timeout_ms;
  return std::make_unique<client::Client>(o);
}

void Cluster::Return(std::unique_ptr<client::Client> connection) {
  if (connection->network_failed()) return;  // its state is unknown: closed
  std::lock_guard<std::mutex> lock(mu_);
  auto& idle = idle_[connection->address()];
  if (idle.size() < kMaxIdlePerPeer) idle.push_back(std::move(connection));
}

Status Cluster::PeerFailure(const Target& target, const client::Client& connection,
                            Status st) const {
  if (!connection.network_failed()) return st;  // the peer answered: keep its code
  return PeerUnanswered(target, st.message());
}

Status Cluster::Forward(const Target& target, const char* method, bool idempotent,
                        const std::function<void(rpc::FlatKVClient&)>& call) {
  CountForward(target.address);
  auto conn = Borrow(target.address);
  Status st = conn->Call(method, idempotent, call);
  if (!st.ok()) {
    if (conn->network_failed()) peer_failures_.fetch_add(1, std::memory_order_relaxed);
    st = PeerFailure(target, *conn, st);
  }
  Return(std::move(conn));
  return st;
}

void Cluster::CountForward(const std::string& address) {
  ForwardCounter(address)->fetch_add(1, std::memory_order_relaxed);
}

std::atomic<int64_t>* Cluster::ForwardCounter(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  return &forwarded_.try_emplace(address, 0).first->second;  // map nodes never move
}

Status Cluster::PeerUnanswered(const Target& target, const std::string& why) const {
  return Status::Unavailable("mark " + std::to_string(target.mark) + ": member " +
                             target.address + " did not answer: " + why);
}

Status Cluster::CheckToken(const rpc::PeerContext& context) {
  if (options_.peer_token.empty() || SameToken(context.token, options_.peer_token)) {
    return Status::OK();
  }
  unauthorized_.fetch_add(1, std::memory_order_relaxed);
  return Status::Unauthorized("wrong cluster.peer_token on a call between instances");
}

Status Cluster::RefuseNotOwner(const rpc::PeerContext& context, const partition::Ring* ring,
                               const std::string& why) {
  not_owner_sent_.fetch_add(1, std::memory_order_relaxed);
  return Status::NotOwner(why + " (this instance is mark " + std::to_string(mark()) +
                          ", ring version " + std::to_string(ring ? ring->version() : -1) +
                          "; the sender's ring version " + std::to_string(context.ringVersion) +
                          ")");
}

Status Cluster::CheckPeerRange(const rpc::PeerContext& context, int64_t lo, int64_t hi) {
  FLATKV_RETURN_IF_ERROR(CheckPeerMark(context));
  const auto ring = registry_->ring();
  const partition::HashRange range = ring->RangeOf(lo);
  const int64_t owner = ring->partitions()[range.partition].mark;
  if (owner != mark() || hi > range.hi) {
    return RefuseNotOwner(context, ring.get(),
                          "hash " + std::to_string(lo) + " belongs to mark " + std::to_string(owner));
  }
  return Status::OK();
}

Status Cluster::CheckPeerMark(const rpc::PeerContext& context) {
  FLATKV_RETURN_IF_ERROR(CheckToken(context));
  const auto ring = registry_->ring();
  if (!ring) return RefuseNotOwner(context, nullptr, "no ring known yet");
  if (context.mark != mark()) {
    return RefuseNotOwner(context, ring.get(),
                          "the call was routed to mark " + std::to_string(context.mark));
  }
  if (ring->Find(mark()) == nullptr) {
    return RefuseNotOwner(context, ring.get(), "this mark is not in the ring yet");
  }
  return Status::OK();
}

void Cluster::Describe(rpc::RingInfo* info) const {
  const auto ring = registry_->ring();
  info->partitions.clear();
  if (!ring) {
    info->version = -1;
    info->hashBound = options_.hash_bound;
    info->replication = options_.replication;
    return;
  }
  info->version = ring->version();
  info->hashBound = ring->settings().hash_bound;
  info->replication = ring->settings().replication;
  if (const partition::RingChange* change = ring->change()) info->__set_change(change->ToJson());
  for (const partition::Partition& p : ring->partitions()) {
    rpc::Partition out;
    out.mark = p.mark;
    for (const partition::Member& m : p.chain) {
      rpc::Member member;
      member.host = m.host;
      member.port = m.port;
      out.chain.push_back(std::move(member));
    }
    info->partitions.push_back(std::move(out));
  }
}

void Cluster::AddStats(std::map<std::string, int64_t>* out) const {
  const partition::RegistryStats r = registry_->stats();
  (*out)["cluster.mark"] = mark();
  (*out)["cluster.ring_version"] = r.ring_version;
  (*out)["cluster.register_blocked"] = register_blocked().empty() ? 0 : 1;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    if (import_.start_ms != 0) {
      const int64_t end = import_.copied_ms != 0 ? import_.copied_ms : NowMillis();
      const int64_t ms = std::max<int64_t>(1, end - import_.start_ms);
      (*out)["cluster.import.keys"] = static_cast<int64_t>(import_.keys);
      (*out)["cluster.import.bytes"] = static_cast<int64_t>(import_.bytes);
      (*out)["cluster.import.bytes_per_sec"] = static_cast<int64_t>(import_.bytes * 1000 /
                                                                    static_cast<uint64_t>(ms));
      (*out)["cluster.import.copied"] = import_.copied_ms != 0 ? 1 : 0;
      (*out)["cluster.import.running"] = import_.running ? 1 : 0;
      (*out)["cluster.import.dropped_at_source"] = import_.dropped;
    }
  }
  (*out)["cluster.members_seen"] = r.members_seen;
  (*out)["cluster.zk_connected"] = r.connected;
  if (replicator_) replicator_->AddStats(out);
  (*out)["cluster.zk_sessions"] = r.sessions;
  (*out)["cluster.registrations"] = r.registrations;
  (*out)["cluster.ring_reads"] = r.ring_reads;
  (*out)["cluster.not_owner_sent"] = not_owner_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.not_owner_retries"] = not_owner_retries_.load(std::memory_order_relaxed);
  (*out)["cluster.peer_failures"] = peer_failures_.load(std::memory_order_relaxed);
  (*out)["cluster.peer_unauthorized"] = unauthorized_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [address, n] : forwarded_) {
    (*out)["cluster.forwarded." + address] = n.load(std::memory_order_relaxed);
    total += n.load(std::memory_order_relaxed);
  }
  (*out)["cluster.forwarded"] = total;
  (*out)["cluster.forwarded_async"] = forwarded_async_.load(std::memory_order_relaxed);
  (*out)["cluster.peer_connections_async"] = async_connections_.load(std::memory_order_relaxed);
}

}  // namespace flatkv::server
