// BenchEngine is the one interface flatkv-bench drives: FlatKV's own Store and
// the peer engines it is compared with (RocksDB, LevelDB, Kyoto Cabinet). Each
// adapter configures its engine the way that engine's users run it, so the
// numbers compare engines rather than tuning effort:
//
//   flat          engine::Store, EngineOptions{path, sync} plus the optional
//                 index_item_bytes / data_files / string_slots pass-throughs;
//                 with the sparse tier, sparse_slots = num rounded up to a
//                 power of two (at least 1024)
//   rocksdb       defaults + create_if_missing + 64 MiB LRU block cache
//   leveldb       defaults + create_if_missing + 64 MiB LRU block cache
//   kyotocabinet  HashDB, tune_buckets(max(num, 1M)) before open
//
// Integer keys (Put/Get/Delete): flat takes them as they are; the peers get
// them as 8 big-endian bytes so that ascending integers are ascending in their
// (bytewise) key order and fillseq really is sequential for them.
//
// String keys (SPut/SGet/SDelete, --keys string): flat uses its string-key
// API (Store::SPut/SGet/SRemove, hash buckets stored under integer keys); the
// peers use the bytes as the key, as they would any key.
//
// Writes are acknowledged without a per-write sync unless sync is set: then
// WriteOptions::sync for RocksDB/LevelDB, HashDB::OAUTOSYNC for Kyoto and
// SyncMode::kAlways for flat.
//
// Compaction on request (the compact and readwhilecompacting workloads) is
// flat's only: Store::CompactAndWait and Store::GetCompactionStatus. flat
// runs with compaction_garbage_ratio = 0, so no automatic compaction starts
// in the middle of another workload; the peers keep their own background
// compaction and report SupportsCompaction() == false.
//
// Thread safety: after Open() returns OK, Put/Get/Delete (and for flat
// CompactAndWait and GetCompactionStatus) may be called from any number of
// threads at once (all four engines are internally synchronized). Open and
// Close must not race with anything.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "engine/status.h"

namespace flatkv::client {

// What an adapter needs to open its engine. Zero means "the engine's default"
// for the flat-only knobs.
struct BenchEngineOptions {
  std::string dir;            // database directory; exists before Open()
  bool sync = false;          // sync every write before it returns
  uint64_t num = 0;           // records the run will hold (Kyoto sizes its buckets)
  uint32_t value_size = 0;    // expected value size (lets Get avoid allocating)
  int index_item_bytes = 0;   // flat only: EngineOptions::index_item_bytes
  int data_files = 0;         // flat only: EngineOptions::data_files
  uint64_t string_slots = 0;  // flat only: EngineOptions::string_slots
  uint32_t compaction_mb_per_sec = 0;  // flat only: EngineOptions::compaction_mb_per_sec
  // flat only: EngineOptions::compaction_disk_ratio; negative = its default.
  double compaction_disk_ratio = -1;
  // flat only: EngineOptions::compaction_in_place (storage.compaction_mode).
  bool compaction_in_place = false;
  // flat only: EngineOptions::sparse_tier (storage.sparse_tier).
  bool sparse_tier = false;
  // flat only: automatic compaction at the default garbage ratio, as users
  // run it (peers' numbers include their compactions too). Off only when
  // the run measures compaction itself.
  bool auto_compaction = true;
  // flat only: a WriteBackCache (engine/cache/write_back.h) in front of the
  // Store for integer keys. Empty policy = no cache (string keys never use it).
  std::string cache_policy;             // "" | "lru" | "arc"
  uint64_t cache_bytes = 0;             // CacheOptions::capacity_bytes
  bool write_async = false;             // WriteMode::kAsync instead of kSafe
  uint32_t flush_interval_ms = 100;     // CacheOptions::flush_interval_ms
  // flat only: EngineOptions::key_min / key_max (the peers take any key).
  int64_t key_min = 0;
  int64_t key_max = std::numeric_limits<int64_t>::max();
};

// Counters of flat's Store (EngineStats) the bench reports per workload.
struct BenchEngineCounters {
  uint64_t segments = 0;      // tables created so far (EngineStats::segments)
  uint64_t write_stalls = 0;  // writes that waited for the compactor
  uint64_t write_stall_us = 0;
};

// Counters of flat's WriteBackCache since it was opened (CacheStats).
struct BenchCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t flushes = 0;    // Store writes done by the flushers (async mode)
  uint64_t coalesced = 0;  // async writes that replaced a dirty entry
};

// Progress of the engine's compaction on request (flat's CompactionStatus).
struct BenchCompactionStatus {
  bool running = false;
  uint64_t bytes_done = 0;        // log bytes read in the current (or last) round
  uint64_t bytes_total = 0;       // log bytes to read in the current (or last) round
  uint64_t tables_compacted = 0;  // since open
  uint64_t bytes_reclaimed = 0;   // since open
  std::string last_error;         // empty if the last round succeeded
};

class BenchEngine {
 public:
  virtual ~BenchEngine() = default;

  // The engine's name as spelled on the command line ("flat", "rocksdb", ...).
  virtual const char* name() const = 0;

  // Opens (creating if needed) the database in options.dir. May be called
  // again after Close() to reopen the same database.
  virtual Status Open(const BenchEngineOptions& options) = 0;

  // Stores "value" under "key", replacing any previous value.
  virtual Status Put(int64_t key, std::string_view value) = 0;

  // On a hit fills *value and returns OK; returns NotFound on a miss. Any
  // other status is an error. Reuses *value's capacity where the engine's API
  // allows, so a warm loop does not allocate.
  virtual Status Get(int64_t key, std::string* value) = 0;

  // Removes "key". Removing an absent key is OK, not an error.
  virtual Status Delete(int64_t key) = 0;

  // The same three for a key of arbitrary bytes (a separate key space from
  // the integer keys for flat; the same one for the peers).
  virtual Status SPut(std::string_view key, std::string_view value) = 0;
  virtual Status SGet(std::string_view key, std::string* value) = 0;
  virtual Status SDelete(std::string_view key) = 0;

  // Closes the database cleanly (the way its users shut it down). Further
  // calls other than Open() fail.
  virtual Status Close() = 0;

  // Compaction on request, for the compact and readwhilecompacting
  // workloads. Only flat supports it; the defaults say no.
  virtual bool SupportsCompaction() const { return false; }
  // Compacts every table once and returns when that round has finished,
  // with its error. Reads and writes may run meanwhile.
  virtual Status CompactAndWait() {
    return Status::InvalidArgument(std::string(name()) + ": compaction not supported");
  }
  virtual Status GetCompactionStatus(BenchCompactionStatus* /*status*/) const {
    return Status::InvalidArgument(std::string(name()) + ": compaction not supported");
  }

  // flat with --cache only. True if integer-key writes are written back
  // (async mode): they reach the engine only on a flush.
  virtual bool CacheWritesBack() const { return false; }
  // Writes every dirty cache entry to the engine (no-op without a cache).
  virtual Status FlushCache() { return Status::OK(); }
  // Fills *stats and returns true if the engine has a cache open.
  virtual bool GetCacheStats(BenchCacheStats* /*stats*/) const { return false; }
  // flat only: fills *counters and returns true.
  virtual bool GetEngineCounters(BenchEngineCounters* /*counters*/) const { return false; }
};

// Engine names flatkv-bench knows, compiled in or not, in usage order.
inline constexpr const char* kBenchEngineNames[] = {"flat", "rocksdb", "leveldb",
                                                    "kyotocabinet"};

// True if "name" is one of kBenchEngineNames and its adapter was compiled in.
bool BenchEngineBuilt(std::string_view name);

// Creates the (unopened) adapter for "name". Returns InvalidArgument naming
// the engine if it is unknown, or "engine X not built into this flatkv-bench"
// if its library was not found at build time.
Status NewBenchEngine(std::string_view name, std::unique_ptr<BenchEngine>* result);

// Adapter factories, one per translation unit; only those whose library was
// found are compiled (see client/CMakeLists.txt).
std::unique_ptr<BenchEngine> NewFlatBenchEngine();
std::unique_ptr<BenchEngine> NewRocksDbBenchEngine();
std::unique_ptr<BenchEngine> NewLevelDbBenchEngine();
std::unique_ptr<BenchEngine> NewKyotoBenchEngine();

// Writes "key" as 8 big-endian bytes into buf[0..8), so bytewise order equals
// numeric order for non-negative keys.
inline void EncodeBigEndianKey(int64_t key, char* buf) {
  uint64_t v = static_cast<uint64_t>(key);
  for (int i = 7; i >= 0; --i) {
    buf[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

}  // namespace flatkv::client
