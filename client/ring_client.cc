// Implementation notes
//
// Routing reuses partition::Router, the same decisions the server makes, so
// a call sent here lands on the member that would have served it had it
// gone through any instance. A batch is split by owner; each part is sent
// (send_multiX) on its member's connection before any answer is read
// (recv_multiX), so P partitions cost about one round trip.
#include "client/ring_client.h"

#include <chrono>
#include <thread>

#include "partition/router.h"

namespace flatkv::client {

using partition::Router;

std::shared_ptr<const partition::Ring> RingFromInfo(const rpc::RingInfo& info) {
  partition::RingSettings settings;
  settings.hash_bound = info.hashBound > 0 ? info.hashBound : partition::kDefaultHashBound;
  settings.replication = info.replication;
  std::vector<int64_t> marks;
  std::vector<partition::Ring::Registration> regs;
  int64_t order = 0;  // the answer is in chain order already
  for (const rpc::Partition& p : info.partitions) {
    marks.push_back(p.mark);
    for (const rpc::Member& m : p.chain) {
      regs.push_back({p.mark, partition::Member{m.host, m.port, ++order}});
    }
  }
  std::optional<partition::RingChange> change;
  partition::RingChange c;
  if (info.__isset.change && partition::RingChange::FromJson(info.change, &c).ok()) change = c;
  return partition::Ring::Make(info.version, settings, std::move(marks), std::move(regs), {},
                               std::move(change));
}

RingClient::RingClient(RingClientOptions options) : options_(std::move(options)) {}

RingClient::~RingClient() {
  if (registry_) registry_->Close();
}

Status RingClient::Open(RingClientOptions options, std::unique_ptr<RingClient>* result) {
  if (options.zookeeper.empty() && options.seeds.empty()) {
    return Status::InvalidArgument("ring client: give ZooKeeper hosts or at least one instance");
  }
  std::unique_ptr<RingClient> c(new RingClient(std::move(options)));
  if (c->options_.zookeeper.empty()) {
    FLATKV_RETURN_IF_ERROR(c->FetchFromSeeds());
  } else {
    partition::RegistryOptions r;
    r.zookeeper = c->options_.zookeeper;
    r.service_path = c->options_.service_path;
    r.observer = true;  // reads and watches; never registers or writes
    FLATKV_RETURN_IF_ERROR(partition::Registry::Start(std::move(r), &c->registry_));
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(c->options_.open_timeout_ms);
    while (!c->registry_->ring()) {
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("no ring from ZooKeeper " + c->options_.zookeeper +
                                   c->options_.service_path + " within " +
                                   std::to_string(c->options_.open_timeout_ms) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  *result = std::move(c);
  return Status::OK();
}

Status RingClient::FetchFromSeeds() {
  Status last = Status::Unavailable("no instance to ask for the ring");
  for (const std::string& seed : options_.seeds) {
    rpc::RingInfo info;
    last = Member(seed)->Ring(&info);
    if (last.ok()) {
      seed_ring_ = RingFromInfo(info);
      return Status::OK();
    }
  }
  return last;
}

std::shared_ptr<const partition::Ring> RingClient::ring() const {
  return registry_ ? registry_->ring() : seed_ring_;
}

Status RingClient::Refresh() {
  if (!registry_) return FetchFromSeeds();
  std::shared_ptr<const partition::Ring> ring;
  return registry_->Refresh(&ring);
}

Client* RingClient::Member(const std::string& address) {
  auto& slot = members_[address];
  if (!slot) {
    ClientOptions o = options_.client;
    std::string host;
    int port = 0;
    if (partition::ParseHostPort(address, "member", &host, &port).ok()) {
      o.host = host;
      o.port = port;
    }
    slot = std::make_unique<Client>(o);
  }
  return slot.get();
}

Status RingClient::Pick(int64_t hash, bool write, std::string* address) {
  const auto r = ring();
  if (!r || r->empty()) return Status::Unavailable("the ring has no marks");
  const partition::Partition& p = r->Owner(hash);
  const partition::Member* m = Router::Target(p, write, r->settings().replication, spread_++);
  if (m == nullptr) {
    return Status::Unavailable("mark " + std::to_string(p.mark) + " has no serving member");
  }
  *address = m->address();
  return Status::OK();
}

Status RingClient::Routed(int64_t hash, bool write, bool idempotent,
                          const std::function<Status(Client&)>& call) {
  for (int attempt = 0;; ++attempt) {
    std::string address;
    FLATKV_RETURN_IF_ERROR(Pick(hash, write, &address));
    Client* c = Member(address);
    Status st = call(*c);
    const bool moved = st.IsNotOwner() || st.IsUnavailable() || c->network_failed();
    const bool retry = attempt == 0 && moved && (idempotent || st.IsNotOwner());
    if (!retry) return st;
    FLATKV_RETURN_IF_ERROR(Refresh());
  }
}

Status RingClient::Get(int64_t key, std::string* value) {
  return Routed(partition::Ring::HashKey(key), false, true, [&](Client& c) { return c.Get(key, value); });
}

Status RingClient::Put(int64_t key, std::string_view value) {
  return Routed(key, true, true, [&](Client& c) { return c.Put(key, value); });
}

Status RingClient::Remove(int64_t key, bool* existed) {
  return Routed(key, true, true, [&](Client& c) { return c.Remove(key, existed); });
}

Status RingClient::Append(int64_t key, std::string_view value) {
  return Routed(key, true, false, [&](Client& c) { return c.Append(key, value); });
}

Status RingClient::SGet(std::string_view key, std::string* value) {
  const auto r = ring();
  return Routed(r->HashString(key), false, true, [&](Client& c) { return c.SGet(key, value); });
}

Status RingClient::SPut(std::string_view key, std::string_view value) {
  const auto r = ring();
  return Routed(r->HashString(key), true, true, [&](Client& c) { return c.SPut(key, value); });
}

Status RingClient::SRemove(std::string_view key, bool* existed) {
  const auto r = ring();
  return Routed(r->HashString(key), true, true,
                [&](Client& c) { return c.SRemove(key, existed); });
}

Status RingClient::Scan(int64_t from, int32_t limit, bool reverse, rpc::ScanResult* result) {
  return Routed(from, false, true,
                [&](Client& c) { return c.Scan(from, limit, reverse, result); });
}

Status RingClient::ScanLog(const std::string& cursor, int32_t limit, rpc::LogScanResult* result) {
  // Any instance walks the ring; the first mark's reader is as good as any.
  const auto r = ring();
  const int64_t first = r->empty() ? 0 : r->partitions().front().mark;
  return Routed(first - (first > INT64_MIN ? 1 : 0), false, true,
                [&](Client& c) { return c.ScanLog(cursor, limit, result); });
}

// One part of a batch: the member and the request positions it serves.
namespace {
struct Part {
  std::string address;
  std::vector<size_t> positions;
  Status status;
};
}  // namespace

Status RingClient::MultiGet(const std::vector<int64_t>& keys,
                            std::vector<rpc::GetResult>* results) {
  for (int attempt = 0;; ++attempt) {
    const auto r = ring();
    std::vector<Part> parts;
    Status st;
    for (const partition::OwnerGroup& g : Router::SplitByOwner(*r, keys)) {
      Part p;
      p.positions = g.positions;
      st = Pick(keys[g.positions.front()], false, &p.address);
      if (!st.ok()) return st;
      parts.push_back(std::move(p));
    }
    std::vector<std::vector<int64_t>> part_keys(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      for (size_t pos : parts[i].positions) part_keys[i].push_back(keys[pos]);
      parts[i].status = Member(parts[i].address)->Call("multiGet", false, [&](rpc::FlatKVClient& c) {
        c.send_multiGet(part_keys[i]);
      });
    }
    results->assign(keys.size(), rpc::GetResult());
    bool moved = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      Client* c = Member(parts[i].address);
      if (parts[i].status.ok()) {
        std::vector<rpc::GetResult> got;
        parts[i].status = c->Call("multiGet", false, [&](rpc::FlatKVClient& rc) {
          rc.recv_multiGet(got);
        });
        for (size_t j = 0; j < got.size() && j < parts[i].positions.size(); ++j) {
          (*results)[parts[i].positions[j]] = std::move(got[j]);
        }
      }
      if (!parts[i].status.ok()) {
        moved = moved || c->network_failed() || parts[i].status.IsUnavailable() ||
                parts[i].status.IsNotOwner();
        if (st.ok()) st = parts[i].status;
      }
    }
    if (st.ok() || !moved || attempt > 0) return st;
    FLATKV_RETURN_IF_ERROR(Refresh());
  }
}

Status RingClient::MultiPut(const std::vector<rpc::KvPair>& pairs) {
  for (int attempt = 0;; ++attempt) {
    const auto r = ring();
    std::vector<int64_t> keys(pairs.size());
    for (size_t i = 0; i < pairs.size(); ++i) keys[i] = pairs[i].key;
    std::vector<Part> parts;
    Status st;
    for (const partition::OwnerGroup& g : Router::SplitByOwner(*r, keys)) {
      Part p;
      p.positions = g.positions;
      st = Pick(keys[g.positions.front()], true, &p.address);
      if (!st.ok()) return st;
      parts.push_back(std::move(p));
    }
    std::vector<std::vector<rpc::KvPair>> part_pairs(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      for (size_t pos : parts[i].positions) part_pairs[i].push_back(pairs[pos]);
      parts[i].status = Member(parts[i].address)->Call("multiPut", false, [&](rpc::FlatKVClient& c) {
        c.send_multiPut(part_pairs[i]);
      });
    }
    bool moved = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      Client* c = Member(parts[i].address);
      if (parts[i].status.ok()) {
        parts[i].status = c->Call("multiPut", false, [&](rpc::FlatKVClient& rc) {
          rc.recv_multiPut();
        });
      }
      if (!parts[i].status.ok()) {
        moved = moved || c->network_failed() || parts[i].status.IsUnavailable() ||
                parts[i].status.IsNotOwner();
        if (st.ok()) st = parts[i].status;
      }
    }
    // A multiPut is atomic per partition only; writing a part twice is
    // harmless (a put is idempotent), so the whole batch is sent again.
    if (st.ok() || !moved || attempt > 0) return st;
    FLATKV_RETURN_IF_ERROR(Refresh());
  }
}

}  // namespace flatkv::client
