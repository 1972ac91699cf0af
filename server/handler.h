// Handler implements the generated FlatKVIf over the cache and the Store.
// Every method validates its input, maps each Status onto a KvError with a
// precise message, and catches everything else itself, so a client always
// gets a typed answer (Thrift would turn any other exception into a bare
// TApplicationException). Counters per method feed stats(); latency
// histograms per method feed GET /metrics.
//
// In a ring (SetCluster) every data method is served here only for the keys
// this instance's mark owns and forwarded to the owner otherwise
// (handler_cluster.cc: Routed(), the Ring* methods); the peer* methods are
// the forwarded calls, served only when this mark owns the key. Under the
// EventServer, single-key calls for other marks do not reach the handler at
// all: the I/O thread's Forwarder (server/member/forwarder.h) forwards them and
// counts them here (CountCall(), Finish()).
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

namespace flatkv::server {

// The ring member (server/member/): the handler holds pointers to it only.
class Cluster;
class Replicator;

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
  // serves, and every batch and scan (they may fan out). The EventServer
  // runs those on a worker instead of the I/O thread. Cheap; never throws.
  bool MayBlock(const uint8_t* message, uint32_t len) const;

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

  // The answer of a write through the chain: Replicator::WriteDone.
  using ChainWriteDone = std::function<void(const Status& status, bool existed)>;

  // A single-key write (put, remove, append, sput, sremove: "string_key"
  // for the last two, "value" for the writes that carry one) of this
  // member's own mark, started through its chain without blocking (the
  // Forwarder's, on an I/O thread): "done" gets the answer, on another
  // thread. A write refused at once (value too large, key out of range)
  // returns its error and "done" is not called. Needs a replicator.
  Status StartChainWrite(Method method, int64_t key, const std::string& string_key,
                         std::string value, ChainWriteDone done);

  // The hash of a string key in the current ring (0 standalone).
  int64_t StringHash(const std::string& key) const;

  // Empty when data calls can be served; else why not (a ring member that
  // has not reached ZooKeeper yet), for /health.
  std::string NotReady() const;
  // Empty when writes work; else why they fail though reads are served (a
  // full disk: the message of the last write's NoSpace), for /health.
  std::string Degraded() const;

  // Makes this handler a member of a ring: set once before serving; null
  // (the default) is standalone. The Cluster outlives the handler's calls.
  void SetCluster(Cluster* cluster) { cluster_ = cluster; }
  Cluster* cluster() const { return cluster_; }
  // Chain replication (server/member/replicator.h): local writes go through it and
  // local reads ask it first. Set once before serving, with SetCluster.
  void SetReplicator(Replicator* replicator) { replicator_ = replicator; }

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

 private:
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
  // Counts and logs a failure other than KvError; the KvError to throw.
  rpc::KvError Unexpected(Method method, const char* what);
  Status ValueSize(size_t size) const;  // ValueTooLarge over max_value_bytes()
  void CheckValue(size_t size) const;    // throws it
  void CheckAdmin(const std::string& token) const;
  // recent.window_ms, recent.ops_per_sec, recent.p99_us (CollectStats).
  void AddRecentLoad(std::map<std::string, int64_t>* out) const;

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

  // In a ring (handler_cluster.cc). Routed() runs "local" if this instance
  // serves "hash", else "remote" on a connection to the member that does;
  // a NOT_OWNER answer re-reads the ring and routes once more. Standalone
  // it runs "local".
  void Routed(int64_t hash, bool write, const char* peer_method, bool idempotent,
              const std::function<void()>& local,
              const std::function<void(rpc::FlatKVClient&, const rpc::PeerContext&)>& remote);
  void RingMultiGet(std::vector<rpc::GetResult>& result, const std::vector<int64_t>& keys);
  void RingMultiPut(const std::vector<rpc::KvPair>& pairs);
  void RingScan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse);
  void RingScanLog(rpc::LogScanResult& result, const std::string& cursor, int32_t limit);
  // Throws NOT_OWNER/UNAUTHORIZED unless this mark owns every hash of
  // [lo, hi] (a peer call's keys).
  void CheckPeer(const rpc::PeerContext& ctx, int64_t lo, int64_t hi);
  // StartChainWrite(), waiting for the answer (throws KvError).
  void ReplicatedWrite(Method method, int64_t key, const std::string& string_key,
                       const std::string& value, bool* existed);
  // The gate of a local read (throws KvError); a no-op without a replicator.
  void CheckRead(int64_t hash);
  // A chain member's local read of the keys with hashes "hashes": the gate
  // (CheckRead), the store read ("read"), then the member's confirmation
  // that what it read was committed (Replicator::ConfirmRead), else all
  // again. Throws UNAVAILABLE if the keys keep changing under the reads.
  // (Defined in handler.cc, its only user.)
  template <typename Read>
  void GatedRead(const int64_t* hashes, size_t n, const Read& read);
  // Read repair: this member's record of "key" failed its checksum ("bad").
  // In a chain of several members the head rewrites the key with its newest
  // value (Replicator::Repair; asked with peerRepair unless this member is
  // the head) and *result gets it: OK. Else "bad", or why the repair
  // failed. Inline on an I/O thread it asks to run on a worker instead
  // (EventServer::RedoOnWorker, sets redo_) and returns "bad".
  Status RepairRead(int64_t key, const Status& bad, rpc::GetResult* result);
  // The same for a string key, by its bucket (RepairBucket).
  Status RepairStringRead(const std::string& key, const Status& bad, rpc::GetResult* result);
  // Rewrites this member's bucket "slot" through the chain (at the head:
  // Replicator::RepairBucket; elsewhere asked with peerBucket); *bucket gets
  // the pairs written. Blocks: a worker's call.
  Status RepairBucket(int64_t slot, std::string* bucket);
  // Throws NOT_OWNER unless this instance is the head of ctx.mark's chain
  // (and ctx's token and mark are right).
  void CheckHeadOf(const rpc::PeerContext& ctx, const char* what);
  // The head's side of a repair: another member's copy of "key" (peerGet
  // with ownCopy), from the first member after the head that has a good one.
  Status FetchCopy(int64_t key, rpc::GetResult* result);
  // The same for a string-key bucket (peerBucket without repair).
  Status FetchBucket(int64_t slots, int64_t slot, std::string* bucket);

  engine::Store* const store_;
  engine::cache::WriteBackCache* const cache_;
  const Config config_;
  const uint64_t max_value_bytes_;
  const std::chrono::steady_clock::time_point started_;
  const std::unique_ptr<engine::Backup> backup_;
  bool backup_disabled_ = false;
  std::array<std::atomic<int64_t>, kMethods> calls_{};
  std::array<std::atomic<int64_t>, kMethods> errors_{};
  std::array<LatencyHistogram, kMethods> latency_;
  mutable RecentLoad recent_;  // the data methods' "recent.*" stats
  std::function<void(std::map<std::string, int64_t>*)> server_stats_;
  Cluster* cluster_ = nullptr;
  Replicator* replicator_ = nullptr;
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
