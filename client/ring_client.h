// RingClient is the ring-aware C++ client (shared/DESIGN.md, "Requests"):
// it knows the ring, from ZooKeeper (watched, so it follows every change
// within about a second) or from any instance's ring(), and sends each call
// straight to the member that serves its key, with no hop through another
// instance. Batches are split by owner and the parts sent in parallel.
//
// It gives the same Status errors as Client (client.h). A call that finds
// its member gone (a network failure, UNAVAILABLE or NOT_OWNER) re-reads
// the ring and is routed once more; append is retried only after NOT_OWNER
// (the member refused it, so it was not applied). A mark with no serving
// member is Unavailable naming the mark.
//
// Scans go to one instance, which walks the whole ring itself (its answer
// is the same from any instance).
//
// Thread safety: like Client, one RingClient per thread (it holds one
// connection per member it has called). The ZooKeeper watch runs on its
// own thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "FlatKV.h"
#include "client/client.h"
#include "engine/status.h"
#include "partition/registry.h"
#include "partition/ring.h"

namespace flatkv::client {

struct RingClientOptions {
  // Where the ring comes from: ZooKeeper hosts ("host:port,...") and the
  // service path, or, with zookeeper empty, the instances in "seeds"
  // ("host:port"; the first that answers ring() is used).
  std::string zookeeper;
  std::string service_path = "/flatkv";
  std::vector<std::string> seeds;
  // Timeouts and frame limit of each member connection (host and port are
  // ignored).
  ClientOptions client;
  // How long Open() waits for ZooKeeper's first ring.
  int open_timeout_ms = 5000;
};

class RingClient {
 public:
  // Reads the ring once (InvalidArgument for bad options, Unavailable if
  // neither ZooKeeper nor any seed answers in time).
  static Status Open(RingClientOptions options, std::unique_ptr<RingClient>* result);
  ~RingClient();

  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  // The same contracts as Client's methods of the same names.
  Status Get(int64_t key, std::string* value);
  Status Put(int64_t key, std::string_view value);
  Status Remove(int64_t key, bool* existed = nullptr);
  Status Append(int64_t key, std::string_view value);
  Status MultiGet(const std::vector<int64_t>& keys, std::vector<rpc::GetResult>* results);
  Status MultiPut(const std::vector<rpc::KvPair>& pairs);
  Status Scan(int64_t from, int32_t limit, bool reverse, rpc::ScanResult* result);
  Status ScanLog(const std::string& cursor, int32_t limit, rpc::LogScanResult* result);
  Status SGet(std::string_view key, std::string* value);
  Status SPut(std::string_view key, std::string_view value);
  Status SRemove(std::string_view key, bool* existed = nullptr);

  // The ring this client routes by (never null after Open()).
  std::shared_ptr<const partition::Ring> ring() const;
  // Reads the ring again now.
  Status Refresh();
  // A connection to one member (for calls not routed by key, e.g. info()).
  Client* Member(const std::string& address);

 private:
  explicit RingClient(RingClientOptions options);
  Status FetchFromSeeds();
  // Runs "call" on the member that serves "hash" (a write goes to the head),
  // re-routing once as the file comment says.
  Status Routed(int64_t hash, bool write, bool idempotent,
                const std::function<Status(Client&)>& call);
  Status Pick(int64_t hash, bool write, std::string* address);

  const RingClientOptions options_;
  std::unique_ptr<partition::Registry> registry_;     // ZooKeeper source
  std::shared_ptr<const partition::Ring> seed_ring_;  // seeds source
  std::map<std::string, std::unique_ptr<Client>> members_;
  uint64_t spread_ = 0;
};

// The partition::Ring of a RingInfo answer (chain order kept).
std::shared_ptr<const partition::Ring> RingFromInfo(const rpc::RingInfo& info);

}  // namespace flatkv::client
