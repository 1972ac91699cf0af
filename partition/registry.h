// Registry: this instance's side of ZooKeeper (shared/DESIGN.md, "Cluster"),
// on the multi-threaded C client (zookeeper_mt).
//
// It keeps one session to the ensemble and, on it:
//   - creates <service_path> and <service_path>/.cluster if missing, writes
//     the ring-wide settings there (first instance) or checks ours against
//     them (a mismatch is fatal: on_fatal, nothing written);
//   - on Register(): creates .cluster/marks/<mark> (persistent, empty), then
//     the ephemeral member node <service_path>/thriftbinary<mark>:<host>:<port>
//     whose data is the same string;
//   - watches the children of <service_path> and re-reads them (and each
//     member's creation zxid, and .cluster/marks) on every event and on every
//     reconnect, builds a new Ring and publishes it (ring() swaps a
//     shared_ptr<const Ring>; on_ring is told);
//   - after session expiry makes a new session by itself and, if it was
//     registered, registers again;
//   - Close() closes the session so the member node goes at once.
// ZooKeeper's own log goes through spdlog, rate-limited. The ZooKeeper
// completion thread never blocks: watchers only wake the registry's own
// thread, which makes every (synchronous) ZooKeeper call.
//
// Thread safety: every public method may be called from any thread.
// Callbacks run on the registry's thread; they must not call Close().
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "engine/status.h"
#include "partition/ring.h"

namespace flatkv::partition {

struct RegistryOptions {
  std::string zookeeper;                  // cluster.zookeeper: "host:port,..."
  std::string service_path = "/flatkv";   // cluster.service_path
  int64_t mark = 0;                       // cluster.mark
  std::string advertise;                  // cluster.advertise: "host:port"
  RingSettings settings;                  // cluster.hash_bound, cluster.replication
  int session_timeout_ms = 6000;          // cluster.session_timeout_ms
  // A client's view (client/ring_client.h): only reads and watches the ring
  // (settings from .cluster when present); never creates, writes or checks
  // anything, and Register() does nothing. mark, advertise and settings are
  // not used.
  bool observer = false;
  // Called once, from the registry's thread, when the ring's settings
  // differ from ours (the message names the key) or the service path cannot
  // be used at all; the instance must stop (exit 2). Nothing was written.
  // It runs before WaitRegistered() and Refresh() return the same error.
  std::function<void(const Status&)> on_fatal;
  // Called after each new Ring is published.
  std::function<void(std::shared_ptr<const Ring>)> on_ring;
};

// Counters for stats() and /metrics.
struct RegistryStats {
  int64_t sessions = 0;          // sessions established (1 + re-connections after expiry)
  int64_t registrations = 0;     // member nodes created
  int64_t ring_reads = 0;        // times the children were read
  int64_t connected = 0;         // 1 while the session is connected
  int64_t members_seen = 0;      // members in the current ring
  int64_t ring_version = 0;      // version of the current ring (-1: none yet)
};

class Registry {
 public:
  // Validates the options (InvalidArgument naming the key: an empty or
  // malformed cluster.zookeeper, a service path not starting with '/', an
  // advertise that is not host:port or whose host is a wildcard such as
  // 0.0.0.0 or ::) and starts the registry's thread, which connects in the
  // background and retries for as long as ZooKeeper is unreachable. Does
  // not wait for ZooKeeper.
  static Status Start(RegistryOptions options, std::unique_ptr<Registry>* result);

  ~Registry();  // Close()
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Asks the registry to register this instance (now, or as soon as it is
  // connected and the settings are checked) and to keep it registered
  // across session expiry. Returns at once.
  void Register();
  // Blocks until the member node exists or "timeout_ms" passes (Unavailable
  // then). For tests and start-up logs.
  Status WaitRegistered(int timeout_ms);

  // The newest ring, or nullptr while none has been read yet (ZooKeeper
  // unreachable since start). Never blocks.
  std::shared_ptr<const Ring> ring() const;
  // Re-reads the children now (used after a NOT_OWNER) and returns the new
  // ring; Unavailable if ZooKeeper cannot be reached within the session
  // timeout. Blocks the caller, not the completion thread.
  Status Refresh(std::shared_ptr<const Ring>* ring);

  // True while the session is connected.
  bool connected() const;
  // Milliseconds since the session was last connected (0 while connected;
  // since Start() if it never was). Set by the ZooKeeper client's own
  // detection: 2/3 of the session timeout without an answer, or at once
  // when the connection breaks.
  int64_t disconnected_ms() const;
  RegistryStats stats() const;

  // Closes the session (the member node goes at once) and stops the thread.
  // Idempotent.
  void Close();

  // TEST_: the current session's id and password, to expire it from a test
  // (open a second handle with them and close it).
  bool TEST_SessionId(int64_t* id, std::string* password) const;

 private:
  struct Impl;
  explicit Registry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flatkv::partition
