// Handler implements the generated FlatKVIf over the cache and the Store.
// Every method validates its input, maps each Status onto a KvError with a
// precise message, and catches everything else itself, so a client always
// gets a typed answer (Thrift would turn any other exception into a bare
// TApplicationException). Counters per method feed stats(); latency
// histograms per method feed GET /metrics.
//
// Thread safety: called from the server's worker threads concurrently; the
// Store and the cache are thread-safe, counters are atomics.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "FlatKV.h"
#include "engine/cache/write_back.h"
#include "engine/store.h"
#include "server/config.h"
#include "server/metrics.h"

namespace flatkv::server {

class Handler : public rpc::FlatKVIf {
 public:
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
  enum Method {
    kGet, kPut, kRemove, kAppend, kMultiGet, kMultiPut, kScan, kScanLog, kSGet, kSPut,
    kSRemove, kSetWriteMode, kGetWriteMode, kCompact, kCompactionStatus, kInfo, kStats,
    kMethods
  };
  // Runs "body" for "method": counts and times the call, turns a non-OK
  // Status into a KvError, and anything thrown other than KvError into
  // STORAGE_ERROR.
  template <typename Body>
  void Run(Method method, Body&& body);
  void CheckValue(size_t size) const;
  void CheckAdmin(const std::string& token) const;

  engine::Store* const store_;
  engine::cache::WriteBackCache* const cache_;
  const Config config_;
  const uint64_t max_value_bytes_;
  const std::chrono::steady_clock::time_point started_;
  std::array<std::atomic<int64_t>, kMethods> calls_{};
  std::array<std::atomic<int64_t>, kMethods> errors_{};
  std::array<LatencyHistogram, kMethods> latency_;
  std::function<void(std::map<std::string, int64_t>*)> server_stats_;
};

// Throws the KvError for a non-OK status (used at the Thrift boundary only).
[[noreturn]] void ThrowKvError(const Status& status);

}  // namespace flatkv::server
