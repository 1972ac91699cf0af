// Handler implements the generated FlatKVIf over the cache and the Store.
// Every method validates its input, maps each Status onto a KvError with a
// precise message, and catches everything else itself, so a client always
// gets a typed answer (Thrift would turn any other exception into a bare
// TApplicationException). Counters per method feed stats(); latency
// histograms per method feed GET /metrics.
//
// This class is the single-node front: every call served from this
// instance's store. A ring member is its subclass MemberHandler
// (server/member/member_handler.h), which overrides the protected hooks
// below (routing a call to the key's owner, the chain's read gate and
// write path, read repair) and the methods a ring changes (batches, scans,
// ring(), the peer* methods). The dependency runs one way: nothing here
// knows the member. Standalone, a peer* method is refused with NOT_OWNER.
//
// Thread safety: called from the server's worker threads concurrently; the
// Store and the cache are thread-safe, counters are atomics.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "FlatKV.h"
#include "engine/backup.h"
#include "engine/cache/write_back.h"
#include "engine/store.h"
#include "server/config.h"
#include "server/metrics.h"

namespace flatkv::client {
class Client;
}
namespace flatkv::partition {
class Ring;
}

namespace flatkv::server {

// What the operator console (console.h) reads of a ring: the ring, this
// member's mark and address, and pooled connections to the other members.
// A ring member's Cluster (server/member/cluster.h) is one.
class RingView {
 public:
  virtual ~RingView() = default;
  virtual std::shared_ptr<const partition::Ring> ring() const = 0;
  virtual int64_t mark() const = 0;
  virtual const std::string& advertise() const = 0;
  virtual std::unique_ptr<client::Client> Borrow(const std::string& address) = 0;
  virtual void Return(std::unique_ptr<client::Client> connection) = 0;
};

class Handler : public rpc::FlatKVIf {
 public:
  enum Method {
    kGet, kPut, kRemove, kAppend, kMultiGet, kMultiPut, kScan, kScanLog, kSGet, kSPut,
    kSRemove, kSetWriteMode, kGetWriteMode, kCompact, kCompactionStatus, kInfo, kStats,
    kRing, kPeerGet, kPeerPut, kPeerRemove, kPeerAppend, kPeerMultiGet, kPeerMultiPut,
    kPeerScan, kPeerScanLog, kPeerSGet, kPeerSPut, kPeerSRemove, kPeerChain, kPeerSnapshot,
    kDigest, kPeerRepair, kVerify, kPeerExport, kPeerFence, kPeerDrop, kRemoveMark, kAbortChange,
    kBackup, kBackupStatus, kPeerTrack, kPeerDelta, kPeerBucket, kMethods
  };

  Handler(engine::Store* store, engine::cache::WriteBackCache* cache, const Config& config);
  ~Handler() override = default;

  void get(rpc::GetResult& result, int64_t key) override;
  void put(int64_t key, const std::string& value) override;
  bool remove(int64_t key) override;
  void append(int64_t key, const std::string& value) override;
  void multiGet(std::vector<rpc::GetResult>& result, const std::vector<int64_t>& keys) override;
  void multiPut(const std::vector<rpc::KvPair>& pairs) override;
  void scan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse) override;
  void scanLog(rpc::LogScanResult& result, const std::string& cursor, int32_t limit) override;
  void sget(rpc::GetResult& result, const std::string& key) override;
  void sput(const std::string& key, const std::string& value) override;
  bool sremove(const std::string& key) override;
  void setWriteMode(const std::string& token, rpc::WriteMode::type mode) override;
  rpc::WriteMode::type getWriteMode() override;
  void compact(const std::string& token) override;
  void compactionStatus(rpc::CompactionStatus& result) override;
  void info(rpc::NodeInfo& result) override;
  void stats(std::map<std::string, int64_t>& result) override;
  void ring(rpc::RingInfo& result) override;

  void peerGet(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) override;
  void peerPut(const rpc::PeerContext& ctx, int64_t key, const std::string& value) override;
  bool peerRemove(const rpc::PeerContext& ctx, int64_t key) override;
  void peerAppend(const rpc::PeerContext& ctx, int64_t key, const std::string& value) override;
  void peerMultiGet(std::vector<rpc::GetResult>& result, const rpc::PeerContext& ctx,
                    const std::vector<int64_t>& keys) override;
  void peerMultiPut(const rpc::PeerContext& ctx, const std::vector<rpc::KvPair>& pairs) override;
  void peerScan(rpc::ScanResult& result, const rpc::PeerContext& ctx, int64_t from, int32_t limit,
                bool reverse, int64_t lo, int64_t hi) override;
  void peerScanLog(rpc::LogScanResult& result, const rpc::PeerContext& ctx,
                   const std::string& cursor, int32_t limit) override;
  void peerFence(const rpc::PeerContext& ctx) override;
  void peerTrack(rpc::TrackToken& result, const rpc::PeerContext& ctx, int64_t czxid) override;
  void peerDelta(rpc::DeltaPage& result, const rpc::PeerContext& ctx,
                 const rpc::TrackToken& token, const std::string& cursor,
                 int32_t limit) override;
  void removeMark(const std::string& token, int64_t mark) override;
  void abortChange(const std::string& token) override;
  int64_t peerDrop(const rpc::PeerContext& ctx, int64_t lo, int64_t hi, int32_t limit) override;
  void peerSGet(rpc::GetResult& result, const rpc::PeerContext& ctx,
                const std::string& key) override;
  void peerSPut(const rpc::PeerContext& ctx, const std::string& key,
                const std::string& value) override;
  bool peerSRemove(const rpc::PeerContext& ctx, const std::string& key) override;
  void peerChain(const rpc::PeerContext& ctx, const std::string& from,
                 const rpc::ChainFrame& frame) override;
  int64_t peerSnapshot(const rpc::PeerContext& ctx, const std::string& from,
                       const rpc::SnapshotPage& page) override;
  void digest(rpc::Digest& result, const std::string& token) override;
  void peerRepair(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) override;
  void peerBucket(std::string& result, const rpc::PeerContext& ctx, int64_t slots, int64_t slot,
                  bool repair) override;
  void verify(rpc::VerifyResult& result, const std::string& token, bool repair) override;
  // Online backup (engine/backup.h): flushes the cache, then copies the
  // store into "dir" in the background.
  void backup(const std::string& token, const std::string& dir, int32_t mb_per_sec) override;
  void backupStatus(rpc::BackupStatus& result) override;
  // Stops a running backup (its partial copy is removed); before the store
  // closes.
  void StopBackup() { backup_->Stop(); }
  // Refuses every backup call (the fuzz targets: an input holding the admin
  // token must not make the process write directories anywhere).
  void TEST_DisableBackup() { backup_disabled_ = true; }
  void peerExport(rpc::ExportPage& result, const rpc::PeerContext& ctx, int64_t lo, int64_t hi,
                  const std::string& cursor, int32_t limit) override;

  // Whether the call in "message" (a binary-protocol message of "len"
  // bytes) may block: in a ring, a data call for a key another instance
  // serves, and every batch and scan (they may fan out); standalone none.
  // The EventServer runs those on a worker instead of the I/O thread.
  // Cheap; never throws.
  virtual bool MayBlock(const uint8_t* message, uint32_t len) const;

  // For calls answered without the handler (the Forwarder's): counts a
  // call of "method" when it starts, then its latency from "start" and
  // whether it failed with a KvError, as the handler's own calls are.
  void CountCall(Method method) { calls_[method].fetch_add(1, std::memory_order_relaxed); }
  void Finish(Method method, std::chrono::steady_clock::time_point start, bool error);

  // Runs "run" (a call of the processor, on this thread) as the retry of a
  // call that the Forwarder sent and the peer answered NOT_OWNER, exactly
  // as Routed() retries: the ring is re-read first, then one attempt, no
  // further retry. The call is not counted again and its latency runs from
  // "start". Never throws.
  static void RunAsRetry(std::chrono::steady_clock::time_point start,
                         const std::function<void()>& run);

  // The hash of a string key in the current ring (0 standalone).
  virtual int64_t StringHash(const std::string& key) const;

  // Empty when data calls can be served; else why not (a ring member that
  // has not reached ZooKeeper yet), for /health.
  virtual std::string NotReady() const;
  // The ring this instance is a member of, for the console; null standalone.
  virtual RingView* ring_view() const { return nullptr; }
  // Empty when writes work; else why they fail though reads are served (a
  // full disk: the message of the last write's NoSpace), for /health.
  std::string Degraded() const;

  // Adds the server's own counters (connections, overload) to stats();
  // set once before serving.
  void SetServerStats(std::function<void(std::map<std::string, int64_t>*)> fn) {
    server_stats_ = std::move(fn);
  }

  // Largest value accepted: storage.max_value_bytes, but never more than a
  // frame can carry with the call around it.
  uint64_t max_value_bytes() const { return max_value_bytes_; }

  // Fills "result" with the counters stats() returns, without counting a
  // call of stats() (for GET /metrics).
  void CollectStats(std::map<std::string, int64_t>* result) const;

  // The latency histogram of each method, named as in stats(), in a fixed
  // order. They live as long as the Handler.
  std::vector<NamedLatency> latencies() const;

 protected:
  // The ring member's part of a call: MemberHandler overrides each; the
  // versions here are the standalone ones (everything is this store's).

  // A call of the processor on the other side of a forward.
  using RemoteCall = std::function<void(rpc::FlatKVClient&, const rpc::PeerContext&)>;
  // Runs "local" if this instance serves "hash", else "remote" on a
  // connection to the member that does (standalone: "local").
  virtual void Routed(int64_t hash, bool write, const char* peer_method, bool idempotent,
                      const std::function<void()>& local, const RemoteCall& remote);
  // The gate before a local read of the key with hash "hash" (throws
  // KvError); then, after the read, whether what was read of the keys
  // with "hashes" is committed (false: read again), throwing if the keys
  // moved away meanwhile. Standalone every read is.
  virtual void CheckRead(int64_t /*hash*/) {}
  virtual bool ReadCommitted(const int64_t* /*hashes*/, size_t /*n*/) { return true; }
  // Whether this instance may serve a read or write of "key" now (a ring
  // change may be moving it away).
  virtual Status CheckMoving(int64_t /*key*/, bool /*write*/) const { return Status::OK(); }
  // A single-key write (put, remove, append, sput, sremove: "string_key"
  // for the last two, "value" for the writes that carry one) or a batch of
  // puts through the chain, waiting for its answer (throws KvError); false
  // if there is no chain (the caller writes the cache).
  virtual bool ChainWrite(Method /*method*/, int64_t /*key*/, const std::string& /*string_key*/,
                          const std::string& /*value*/, bool* /*existed*/) {
    return false;
  }
  virtual bool ChainWriteBatch(const std::vector<rpc::KvPair>& /*pairs*/) { return false; }
  // Read repair: this instance's record of "key" failed its checksum
  // ("bad"). With other copies (a chain of several members) the key is
  // rewritten with the newest value and *result gets it: OK; else "bad",
  // or why the repair failed. The same for a string key, by its bucket.
  virtual Status RepairRead(int64_t /*key*/, const Status& bad, rpc::GetResult* /*result*/) {
    return bad;
  }
  virtual Status RepairStringRead(const std::string& /*key*/, const Status& bad,
                                  rpc::GetResult* /*result*/) {
    return bad;
  }
  // verify's repair of string-key bucket "slot": whether other copies
  // exist, and the rewrite (*bucket gets the pairs written).
  virtual bool HasOtherCopies() const { return false; }
  virtual Status RepairBucket(int64_t slot, std::string* bucket);
  // What info() says this instance is, and the member's own stats().
  virtual std::string Role() const { return "standalone"; }
  virtual void AddMemberStats(std::map<std::string, int64_t>* /*out*/) const {}

  // The front's side, for MemberHandler.

  // Set on a worker by RunAsRetry() for the one call it runs.
  struct Retry {
    bool active = false;   // Run(): not counted again, timed from start
    bool refresh = false;  // Routed(): re-read the ring, one attempt only
    std::chrono::steady_clock::time_point start;
  };
  static thread_local Retry retry_;
  // This thread's call asked to run again on a worker (RepairRead): not
  // counted now, its answer is discarded.
  static thread_local bool redo_;

  // Runs "body" for "method": counts and times the call, turns a non-OK
  // Status into a KvError, and anything thrown other than KvError into
  // STORAGE_ERROR.
  template <typename Body>
  void Run(Method method, Body&& body);
  Status ValueSize(size_t size) const;  // ValueTooLarge over max_value_bytes()
  void CheckValue(size_t size) const;    // throws it
  void CheckAdmin(const std::string& token) const;

  // This instance's own data, whatever the ring says; each throws KvError.
  void LocalGet(rpc::GetResult& result, int64_t key);
  void LocalPut(int64_t key, const std::string& value);
  bool LocalRemove(int64_t key);
  void LocalAppend(int64_t key, const std::string& value);
  void LocalMultiGet(std::vector<rpc::GetResult>& result, const std::vector<int64_t>& keys);
  void LocalMultiPut(const std::vector<rpc::KvPair>& pairs);
  // Keys in [lo, hi] only.
  void LocalScan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse, int64_t lo,
                 int64_t hi);
  void LocalScanLog(rpc::LogScanResult& result, const std::string& cursor, int32_t limit);
  void LocalSGet(rpc::GetResult& result, const std::string& key);
  void LocalSPut(const std::string& key, const std::string& value);
  bool LocalSRemove(const std::string& key);

  engine::Store* const store_;
  engine::cache::WriteBackCache* const cache_;
  const Config config_;
  const uint64_t max_value_bytes_;

 private:
  // Counts and logs a failure other than KvError; the KvError to throw.
  rpc::KvError Unexpected(Method method, const char* what);
  // recent.window_ms, recent.ops_per_sec, recent.p99_us (CollectStats).
  void AddRecentLoad(std::map<std::string, int64_t>* out) const;
  // A local read of the keys with hashes "hashes": the gate (CheckRead),
  // the store read ("read"), then the check that what it read was
  // committed (ReadCommitted), else all again. Throws UNAVAILABLE if the
  // keys keep changing under the reads.
  template <typename Read>
  void GatedRead(const int64_t* hashes, size_t n, const Read& read);

  const std::chrono::steady_clock::time_point started_;
  const std::unique_ptr<engine::Backup> backup_;
  bool backup_disabled_ = false;
  std::array<std::atomic<int64_t>, kMethods> calls_{};
  std::array<std::atomic<int64_t>, kMethods> errors_{};
  std::array<LatencyHistogram, kMethods> latency_;
  mutable RecentLoad recent_;  // the data methods' "recent.*" stats
  std::function<void(std::map<std::string, int64_t>*)> server_stats_;
};

template <typename Body>
void Handler::Run(Method method, Body&& body) {
  const bool retry = retry_.active;
  retry_.active = false;
  if (!retry) calls_[method].fetch_add(1, std::memory_order_relaxed);
  // Records on every exit, error or not.
  ScopedLatency timer(&latency_[method],
                      retry ? retry_.start : std::chrono::steady_clock::now());
  try {
    body();
  } catch (const rpc::KvError&) {
    if (redo_) {  // it runs again on a worker: counted there
      redo_ = false;
      if (!retry) calls_[method].fetch_sub(1, std::memory_order_relaxed);
      throw;
    }
    errors_[method].fetch_add(1, std::memory_order_relaxed);
    throw;
  } catch (const std::exception& e) {
    throw Unexpected(method, e.what());
  } catch (...) {
    throw Unexpected(method, nullptr);
  }
}

// Visits every live record of "store" in pages of up to "page": integer
// keys in key order, then string keys in hash order. A callback returning
// false ends the walk (OK). Used by digest, and by a ring member's
// snapshots and wipe: a record failing its checksum ends it with
// Corruption (never skipped).
Status ForEachPage(const engine::Store& store, size_t page,
                   const std::function<bool(std::vector<engine::KeyValue>*)>& ints,
                   const std::function<bool(std::vector<engine::StringKeyValue>*)>& strings);

// Constant-time comparison of two tokens (admin.token, cluster.peer_token),
// so a token cannot be guessed byte by byte.
bool SameToken(const std::string& a, const std::string& b);

// A KvError with "code" and "message".
rpc::KvError MakeError(rpc::ErrorCode::type code, const std::string& message);

// The KvError for a non-OK status (used at the Thrift boundary only), and
// throwing it.
rpc::KvError ToKvError(const Status& status);
[[noreturn]] void ThrowKvError(const Status& status);
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) ThrowKvError(status);
}

}  // namespace flatkv::server
