// SparseTier: the integer keys of segments too sparse for a flat table.
//
// A flat table spends index_item_bytes of index per key of its range,
// present or not, so it suits keys that fill their segment. Keys spread
// thinly (random 64-bit IDs, hashed IDs, Snowflake IDs millions apart) would
// cost a segment, its files and an index page each. With
// storage.sparse_tier on, a write to a segment that has no flat table goes
// here instead: an embedded RocksDB database under <storage.path>/sparse,
// keyed in key order, whose space and write cost follow the keys it holds.
// Store promotes a segment to a flat table once its keys are dense enough
// (store.h, "The sparse tier"); the tier itself knows nothing of segments.
//
// Keys are 8 bytes big-endian with the sign bit flipped, so byte order is
// integer order; values are stored as given. RocksDB checksums every block
// and verifies it on every read: a damaged block reads as Corruption.
//
// Thread safety: every method may be called from any thread. Get, Collect
// and Count read a consistent snapshot; a caller that needs a read and a
// write of one key to be atomic (Remove's "existed", Append) serializes
// them itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/options.h"
#include "engine/status.h"

namespace rocksdb {
class DB;
class WriteBatch;
}

namespace flatkv::engine {

struct KeyValue;
struct KeyValueRef;

class SparseTier {
 public:
  // Opens (creating if needed) the database in "dir". "max_open_files" is
  // the tier's share of the store's descriptor budget.
  static Status Open(const std::string& dir, const EngineOptions& options, int max_open_files,
                     std::unique_ptr<SparseTier>* result);
  ~SparseTier();

  Status Put(int64_t key, std::string_view value);
  // The pairs at "items" of "pairs" as one atomic write.
  Status PutBatch(const std::vector<KeyValueRef>& pairs, const std::vector<uint32_t>& items);
  // NotFound leaves *value unchanged.
  Status Get(int64_t key, std::string* value) const;
  Status Delete(int64_t key);
  // Deletes every key in [lo, hi], durably (the write-ahead log is synced
  // before this returns, whatever storage.sync says).
  Status DeleteRange(int64_t lo, int64_t hi);

  // Key-order read: keys from "from" towards "stop" (both inclusive;
  // ascending unless "reverse"), at most "limit" pairs appended to *out.
  // *more is true if it stopped at the limit with keys still in range.
  Status Collect(int64_t from, int64_t stop, bool reverse, size_t limit,
                 std::vector<KeyValue>* out, bool* more) const;
  // The keys in [lo, hi], counted up to "cap".
  Status Count(int64_t lo, int64_t hi, uint64_t cap, uint64_t* n) const;

  // Makes every acknowledged write durable (syncs the write-ahead log).
  Status Sync();
  // Estimates from RocksDB's own statistics.
  uint64_t LiveBytes() const;
  uint64_t LiveBytes(int64_t lo, int64_t hi) const;
  uint64_t KeysEstimate() const;
  // Compacts the whole database (Store::Compact).
  Status Compact();
  Status Close();

  SparseTier(const SparseTier&) = delete;
  SparseTier& operator=(const SparseTier&) = delete;

 private:
  SparseTier() = default;
  // After a failed write (a full disk, an I/O error) the database's log
  // writer must not be used again (RocksDB 7.8 aborts on a log write or
  // sync after a failed one): the tier fails every write and sync with
  // that error, without touching the database, until a write at least
  // kRetryAfter later finds it reopens (which replays its log into a new
  // one). Reads go on meanwhile.
  static constexpr std::chrono::seconds kRetryAfter{1};
  // Writes are refused (NoSpace) while the file system has less than this
  // free: room for two memtables' logs and flushes and a compaction's
  // margin, so RocksDB itself never meets a full disk.
  static constexpr uint64_t kReserve = uint64_t{128} << 20;
  // Free space is looked up at least this often, and whenever the bytes
  // written since the last look could have taken the reserve.
  static constexpr std::chrono::milliseconds kRecheckEvery{100};
  Status Room(uint64_t bytes);
  std::atomic<uint64_t> free_known_{0};
  std::atomic<uint64_t> written_since_check_{0};
  std::atomic<int64_t> check_after_{0};
  Status BeforeWrite();
  // Every write: BeforeWrite, Room, the batch, NoteFailed if it failed.
  Status Write(rocksdb::WriteBatch* batch, bool sync, const std::string& what);
  // A write or sync failed with "st" (db_mu_ not held): the tier stops.
  void NoteFailed(const Status& st);
  Status Failure() const;  // the failed write's error
  // Opens db_ in dir_ with options_ (db_mu_ held exclusively, or no other
  // user yet).
  Status OpenDb();

  mutable std::shared_mutex db_mu_;  // shared: every use of db_; exclusive: reopening it
  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
  EngineOptions options_;
  int max_open_files_ = 0;
  bool sync_always_ = false;
  bool closed_ = false;
  std::atomic<bool> failed_{false};
  mutable std::mutex fail_mu_;
  Status failure_;                                  // GUARDED_BY(fail_mu_)
  std::chrono::steady_clock::time_point retry_at_;  // GUARDED_BY(fail_mu_)
};

}  // namespace flatkv::engine
