// Implementation notes
//
// The pool keeps idle connections per member address; a call borrows one
// (or opens a new one), and gives it back only if the call got an answer:
// after a network failure the connection's state is unknown. There is no cap
// on connections per peer beyond the callers in flight (one per handler
// thread), so the pool never makes a call wait for another.
#include "server/member/cluster.h"
#include "server/member/migration.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

namespace flatkv::server {
namespace {

constexpr size_t kMaxIdlePerPeer = 64;

}  // namespace

// At most 99 until the copy is complete: the estimate counts record
// headers and pro-rates tables the range cuts.
int64_t Cluster::ImportPercent(uint64_t bytes, uint64_t total, bool copied) {
  if (copied) return 100;
  if (total == 0) return 0;
  return static_cast<int64_t>(std::min<uint64_t>(99, bytes * 100 / total));
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
  options.credentials = config.cluster.zookeeper_credentials;
  if (config.cluster.zookeeper_auth_file_open) {
    spdlog::warn("cluster.zookeeper_auth_file: {} may be read by group or others; "
                 "chmod 600 it (it holds the ring's ZooKeeper password)",
                 config.cluster.zookeeper_auth_file);
  }
  options.on_fatal = std::move(on_fatal);
  auto hooks = std::make_shared<Hooks>();
  options.on_ring = [hooks](std::shared_ptr<const partition::Ring> ring) {
    spdlog::info("ring version {}: {}", ring->version(), ring->ToString());
    if (Replicator* r = hooks->replicator.load()) r->OnRing(ring);
    if (Cluster* c = hooks->cluster.load()) c->OnRingChange(*ring);
  };
  options.on_registered = [hooks](int64_t czxid, uint64_t session) {
    if (Replicator* r = hooks->replicator.load()) r->OnRegistered(czxid, session);
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
      hooks_(std::move(hooks)),
      machine_(config.cluster.mark, config.cluster.advertise) {}

Cluster::~Cluster() { Close(); }

Status Cluster::StartReplication(const Config& config, engine::Store* store,
                                 engine::cache::WriteBackCache* cache,
                                 std::function<bool(std::function<void()>)> defer) {
  ReplicatorOptions o;
  o.self = advertise_;
  o.mark = mark();
  o.data_dir = config.storage.path;
  o.sync = options_.replication == "sync";
  o.sync_always = config.storage.sync == engine::SyncMode::kAlways;
  // partition/chain.h: under always a member passes a batch on before its
  // fdatasync (Replicator::SendDownFirst) and its ack also means "synced".
  o.chain.sends_before_sync = o.sync_always;
  o.chain.direct_commit = !o.sync_always;
  o.session_timeout_ms = options_.session_timeout_ms;
  o.peer_timeout_ms = options_.peer_timeout_ms;
  o.peer_token = options_.peer_token;
  o.tls_ca_file = options_.peer_tls_ca_file;
  o.tls_cert_file = options_.peer_tls_cert_file;
  o.tls_key_file = options_.peer_tls_key_file;
  o.resync_bytes_per_sec = static_cast<uint64_t>(options_.resync_mb_per_sec) << 20;
  o.track_max_keys = static_cast<uint64_t>(options_.track_max_keys);
  o.chain.backlog_bytes = static_cast<uint64_t>(options_.backlog_bytes);
  o.defer = std::move(defer);
  FLATKV_RETURN_IF_ERROR(Replicator::Start(std::move(o), store, cache, this, &replicator_));
  hooks_->replicator.store(replicator_.get());
  if (auto ring = registry_->ring()) replicator_->OnRing(ring);
  store_ = store;
  cache_ = cache;
  return Status::OK();
}

void Cluster::Join() {
  registry_->RemoveStale();
  if (replicator_) {
    replicator_->Join();
  } else {
    Register();
  }
}

void Cluster::Register() {
  {
    std::lock_guard<std::mutex> lock(machine_mu_);
    machine_.Join();
  }
  KickChange();
}


Status Cluster::CheckStillServed(int64_t hash) const {
  const auto ring = registry_->ring();
  if (!ring || ring->empty()) {
    return Status::Unavailable("the ring this read was served under is gone; read again");
  }
  const int64_t owner = ring->partitions()[ring->OwnerIndex(hash)].mark;
  if (owner != mark()) {
    return Status::NotOwner("hash " + std::to_string(hash) + " moved to mark " +
                            std::to_string(owner) + " while it was read here (mark " +
                            std::to_string(mark()) + "); read it again");
  }
  return CheckMoving(ring.get(), hash, /*write=*/false);
}

Status Cluster::CheckMoving(int64_t hash, bool write) const {
  return CheckMoving(registry_->ring().get(), hash, write);
}

Status Cluster::CheckMoving(const partition::Ring* ring, int64_t hash, bool write) const {
  const partition::RingChange* change = ring ? ring->change() : nullptr;
  if (change == nullptr || !change->Covers(hash)) return Status::OK();
  bool released;
  {
    std::lock_guard<std::mutex> lock(machine_mu_);
    released = machine_.Released(*change);
  }
  if (!partition::Moving(*change, mark(), hash, write, released)) return Status::OK();
  if (change->source == mark()) {
    return Status::Unavailable(
        "hash " + std::to_string(hash) + " is moving from mark " + std::to_string(mark()) +
        " to mark " + std::to_string(change->into) + " (ring change " + change->kind +
        ", state " + change->state + ", copied by " + change->importer + "); " +
        (write ? "writes" : "reads") + " to it resume once that mark serves it");
  }
  return Status::Unavailable("hash " + std::to_string(hash) + " is moving to mark " +
                             std::to_string(mark()) + " (ring change " + change->kind +
                             ", state " + change->state +
                             "); served once the source has let go of it");
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


Status Cluster::RecordChain(const std::vector<std::string>& members, int64_t ring_version) {
  return registry_->RecordChain(members, ring_version);
}

void Cluster::OnRingChange(const partition::Ring& ring) {
  bool leave;
  {
    std::lock_guard<std::mutex> lock(machine_mu_);
    leave = machine_.Leaving(ring);
  }
  if (leave) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      first = !leaving_;
      leaving_ = true;
    }
    if (first) {
      const partition::RingChange* change = ring.change();
      spdlog::warn("mark {} was removed from the ring{}: this member stops serving and exits",
                   mark(),
                   change != nullptr ? " (its keys now belong to mark " +
                                           std::to_string(change->into) + ")"
                                     : "");
      kill(getpid(), SIGTERM);  // a clean stop: the member node goes first
    }
    return;
  }
  const partition::RingChange* change = ring.change();
  bool running;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    running = gate_running_;
  }
  // A change this member drives (a remove's: whoever heads the inheriting
  // mark), or a machine waiting for a new ring.
  const partition::ChainRole role = ring.ChainRoleOf(mark(), advertise_);
  const bool drives =
      change != nullptr &&
      (change->importer == advertise_ ||
       (change->kind == "remove" && change->into == mark() &&
        (role == partition::ChainRole::kHead || role == partition::ChainRole::kSingle)));
  if (running || drives) KickChange();
}

void Cluster::Close() {
  hooks_->cluster.store(nullptr);  // the registry's callbacks leave this alone from now
  std::thread gate;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    gate_stop_ = true;
    gate = std::move(gate_);
  }
  gate_cv_.notify_all();
  if (gate.joinable()) {
    if (gate.get_id() != std::this_thread::get_id()) {
      gate.join();
    } else {
      gate.detach();
    }
  }
  // The replicator first: it may call the registry until it stops.
  hooks_->replicator.store(nullptr);
  if (replicator_) replicator_->Stop();
  registry_->Close();
}

std::string Cluster::role() const {
  if (replicator_) {
    const partition::ChainRole role = replicator_->chain_role();
    return partition::RoleName(role == partition::ChainRole::kNone ? partition::ChainRole::kSyncing
                                                                   : role);
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
  FLATKV_RETURN_IF_ERROR(RouteTo(*ring, ring->OwnerIndex(hash), write, target));
  // Served here: unless a ring change moves it (writes are checked again
  // as they are sequenced).
  if (target->local) return CheckMoving(ring.get(), hash, /*write=*/false);
  return Status::OK();
}

Status Cluster::RouteTo(const partition::Ring& ring, size_t partition, bool write,
                        Target* target) {
  if (partition >= ring.partitions().size()) {  // a ring with no mark: no owner at all
    return Status::Unavailable("the ring this instance has read holds no mark yet (ring version " +
                               std::to_string(ring.version()) + ")");
  }
  const partition::Partition& p = ring.partitions()[partition];
  const partition::Member* member =
      partition::Router::Target(p, write, ring.settings().replication,
                                spread_.fetch_add(1, std::memory_order_relaxed), advertise_);
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

Status Cluster::Refresh() {
  not_owner_retries_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const partition::Ring> ring;
  Status st = registry_->Refresh(&ring);
  if (!st.ok()) spdlog::warn("re-reading the ring: {}", st.ToString());
  return st;
}

Status Cluster::RefreshForRetry(std::string_view what) {
  Status st = Refresh();
  if (st.ok()) return st;
  return Status::Unavailable(std::string(what) + ": the owner answered NOT_OWNER and " +
                             st.message() + "; not applied");
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
  o.tls_ca_file = options_.peer_tls_ca_file;
  o.tls_cert_file = options_.peer_tls_cert_file;
  o.tls_key_file = options_.peer_tls_key_file;
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

Status Cluster::PeerUnanswered(const Target& target, const std::string& why, bool sent) const {
  return Status::Unavailable("mark " + std::to_string(target.mark) + ": member " +
                             target.address + " did not answer: " + why +
                             (sent ? "; a write may or may not have been applied" : ""));
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
  FLATKV_RETURN_IF_ERROR(CheckToken(context));
  // Started and not yet read the ring (ZooKeeper down, say): the sender's
  // ring is no staler than ours, and re-reading it would only bring the
  // call back here. Refused as unavailable, so the client may retry.
  const auto ring = registry_->ring();
  if (!ring) {
    return Status::Unavailable("member " + advertise() +
                               " has not read the ring since it started: ZooKeeper (" +
                               options_.zookeeper + ") not reached yet");
  }
  FLATKV_RETURN_IF_ERROR(CheckMarkIn(context, ring.get()));
  const partition::HashRange range = ring->RangeOf(lo);
  const int64_t owner = ring->partitions()[range.partition].mark;
  if (owner != mark() || hi > range.hi) {
    return RefuseNotOwner(context, ring.get(),
                          "hash " + std::to_string(lo) + " belongs to mark " + std::to_string(owner));
  }
  // A ring change moving part of [lo, hi] (reads; writes are checked again
  // as they are sequenced).
  if (const partition::RingChange* change = ring->change()) {
    for (const auto& r : change->ranges) {
      if (r.second < lo || r.first > hi) continue;
      FLATKV_RETURN_IF_ERROR(CheckMoving(ring.get(), std::max(lo, r.first), /*write=*/false));
    }
  }
  return Status::OK();
}

Status Cluster::CheckPeerMark(const rpc::PeerContext& context) {
  FLATKV_RETURN_IF_ERROR(CheckToken(context));
  const auto ring = registry_->ring();
  if (!ring) return RefuseNotOwner(context, nullptr, "no ring known yet");
  return CheckMarkIn(context, ring.get());
}

Status Cluster::CheckMarkIn(const rpc::PeerContext& context, const partition::Ring* ring) {
  if (context.mark != mark()) {
    return RefuseNotOwner(context, ring,
                          "the call was routed to mark " + std::to_string(context.mark));
  }
  if (ring->Find(mark()) == nullptr) {
    return RefuseNotOwner(context, ring, "this mark is not in the ring yet");
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
      (*out)["cluster.import.total_bytes"] = static_cast<int64_t>(import_.total);
      (*out)["cluster.import.percent"] = ImportPercent(import_.bytes, import_.total,
                                                       import_.copied_ms != 0);
      (*out)["cluster.import.delta_keys"] = static_cast<int64_t>(import_.delta_keys);
      (*out)["cluster.import.full_copy_fenced"] = import_.full ? 1 : 0;
      if (fence_window_ms_ >= 0) (*out)["cluster.import.fence_ms"] = fence_window_ms_;
    }
  }
  (*out)["cluster.members_seen"] = r.members_seen;
  (*out)["cluster.zk_connected"] = r.connected;
  if (replicator_) replicator_->AddStats(out);
  (*out)["cluster.zk_sessions"] = r.sessions;
  (*out)["cluster.registrations"] = r.registrations;
  (*out)["cluster.ring_reads"] = r.ring_reads;
  (*out)["cluster.zk_reads"] = r.zk_reads;
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
