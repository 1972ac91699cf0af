// WriteBackCache: the cache in front of the Store, with the two write modes
// of the paper (§2.9), switchable at run time.
//
//   safe:  a write reaches the Store (honouring storage.sync) before it
//          returns, then updates the cache if the key is cached there
//          (write-through without write-allocate: reads bring keys in).
//   async: a write returns once it is in the cache, marked dirty; flusher
//          threads write dirty keys within flush_interval_ms, so repeated
//          updates of one key cost one Store write (coalescing). Past
//          max_dirty_bytes, writers wait for the flushers.
//          While flushes fail (a full disk), async writes are written
//          through like safe ones (so they fail at once, never queue up
//          unwritable data); the dirty entries stay, readable, retried
//          every flush interval, until a pass writes them all.
//
// Dirty entries live in a per-shard map outside the replacement policy, so
// eviction never drops one; a flushed entry becomes a clean policy entry.
// A get always returns the newest acknowledged value: dirty map, then
// policy, then Store. Absent keys are never cached. Integer and string keys
// share the shards, the policy and the dirty maps (tagged so they never
// collide) and behave the same, except that Append and the batches take
// integer keys only.
//
// Thread safety: all methods may be called from any thread. Locks: a
// per-key stripe (orders a key's Store write against its cache update and
// against flushers), then a shard mutex (cache state); gets take only the
// shard mutex. See engine/CONCURRENCY.md.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/cache/policy.h"
#include "engine/status.h"
#include "engine/store.h"

namespace flatkv::engine::cache {

enum class WriteMode { kSafe, kAsync };
const char* WriteModeName(WriteMode mode);
bool ParseWriteMode(const std::string& text, WriteMode* mode);

struct CacheOptions {
  std::string policy = "arc";               // cache.policy: "lru" | "arc"
  uint64_t capacity_bytes = 256ull << 20;   // cache.capacity_bytes (clean entries)
  WriteMode mode = WriteMode::kSafe;        // write_mode
  int flush_threads = 2;                    // cache.flush_threads
  uint32_t flush_interval_ms = 100;         // cache.flush_interval_ms
  uint64_t max_dirty_bytes = 64ull << 20;   // cache.max_dirty_bytes
};

struct CacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t clean_bytes = 0;
  uint64_t dirty_bytes = 0;
  uint64_t dirty_entries = 0;
  uint64_t flushes = 0;          // Store writes done by flushers
  uint64_t coalesced = 0;        // async writes that replaced a dirty entry
  uint64_t writer_waits = 0;     // async writes that waited for the flushers
  uint64_t flush_failures = 0;   // flusher passes that failed to write an entry
  bool flush_failing = false;    // the last pass failed: async writes go through
};

class WriteBackCache {
 public:
  // "store" must outlive the cache. InvalidArgument for a bad policy name.
  static Status Open(Store* store, const CacheOptions& options,
                     std::unique_ptr<WriteBackCache>* result);
  // Flushes everything dirty and stops the flushers (Close()).
  ~WriteBackCache();

  Status Get(int64_t key, std::string* value);
  // Get of every key: (*found)[i] says whether keys[i] is present and
  // (*values)[i] holds its value. One pass: each shard is locked once for
  // the keys it serves from memory, the others are read from the Store.
  // Returns the first error other than NotFound.
  Status GetBatch(const std::vector<int64_t>& keys, std::vector<std::string>* values,
                  std::vector<bool>* found);
  Status Put(int64_t key, std::string_view value);
  // Put of every pair in order, checked first (KeyOutOfRange or
  // ValueTooLarge writes nothing). Safe mode writes them to the Store as one
  // Store::PutBatch under the stripes of all their keys; async mode adds
  // them to the dirty map.
  Status PutBatch(const std::vector<KeyValueRef>& pairs);
  Status Remove(int64_t key, bool* existed = nullptr);
  // In async mode the new whole value is computed now (from the cache or the
  // Store) and written as one dirty put.
  Status Append(int64_t key, std::string_view value);

  // String keys (Store::SGet/SPut/SRemove) through the same cache, in the
  // same write mode: cached, dirty and flushed like integer keys. A key over
  // storage.max_key_bytes is InvalidArgument for SPut, absent for the others.
  Status SGet(std::string_view key, std::string* value);
  Status SPut(std::string_view key, std::string_view value);
  Status SRemove(std::string_view key, bool* existed = nullptr);
  // Read repair of a string-key bucket (Store::SReadBucket/SWriteBucket):
  // every dirty entry reaches the Store first. Cached entries stay: a
  // repair writes the values they hold.
  Status SReadBucket(int64_t slot, std::vector<StringKeyValue>* live);
  Status SWriteBucket(int64_t slot, const std::vector<StringKeyValue>& live);

  // Safe -> async takes effect at once; async -> safe returns once every
  // dirty entry is in the Store.
  Status SetMode(WriteMode mode);
  WriteMode mode() const { return mode_.load(); }
  // Writes every dirty entry to the Store; returns the first error.
  Status Flush();
  Status Close();
  CacheStats stats() const;
  Store* store() const { return store_; }

  WriteBackCache(const WriteBackCache&) = delete;
  WriteBackCache& operator=(const WriteBackCache&) = delete;

 private:
  // A key of either kind as the policy and the dirty maps hold it: 'i' and
  // the 8 bytes of an integer key, or 's' and the bytes of a string key, so
  // the two kinds never collide.
  class Key {
   public:
    static Key Int(int64_t key);
    static Key Str(std::string_view key);
    static Key FromEncoded(const std::string& enc);
    bool is_string() const { return enc_[0] == 's'; }
    int64_t ikey() const;
    std::string_view skey() const { return std::string_view(enc_).substr(1); }
    const std::string& enc() const { return enc_; }
    uint64_t hash() const { return hash_; }

   private:
    static int64_t ParseInt(const std::string& enc);
    std::string enc_;
    uint64_t hash_ = 0;
  };
  struct Dirty {
    bool remove = false;
    std::string value;
    uint64_t version = 0;
  };
  struct Shard {
    std::mutex mu;
    std::unique_ptr<Policy> policy;                 // GUARDED_BY(mu)
    std::unordered_map<std::string, Dirty> dirty;   // GUARDED_BY(mu), by Key::enc()
    uint64_t seq = 0;                               // GUARDED_BY(mu): bumped by each write
  };
  static constexpr size_t kShards = 16;
  static constexpr size_t kStripes = 256;

  WriteBackCache(Store* store, const CacheOptions& options);
  Shard& ShardOf(const Key& key) { return shards_[key.hash() % kShards]; }
  std::mutex& StripeOf(const Key& key) { return stripes_[key.hash() / kShards % kStripes]; }
  static uint64_t Hash(int64_t key);
  static Status NotFound(const Key& key);
  // The Store call for either kind of key.
  Status StoreGet(const Key& key, std::string* value) const;
  Status StorePut(const Key& key, std::string_view value);
  Status StoreRemove(const Key& key);
  bool StoreHas(const Key& key) const;
  Status GetKey(const Key& key, std::string* value);
  Status PutKey(const Key& key, std::string_view value);
  Status RemoveKey(const Key& key, bool* existed);
  // Writes a put of "value" (or a remove) through to the Store, then the
  // cache, under the key's stripe.
  Status WriteSafe(const Key& key, bool remove, std::string_view value);
  // The cache side of a safe put that reached the Store (stripe held).
  void AfterSafePut(const Key& key, std::string_view value);
  Status WriteSafeBatch(const std::vector<KeyValueRef>& pairs);
  // Waits (holding no lock) while dirty bytes exceed max_dirty_bytes.
  void WaitForRoom();
  // Adds a dirty entry if the mode is still async (checked under the shard
  // lock); false if it is safe now and the caller must write through.
  bool TryWriteAsync(const Key& key, Dirty* op);
  // Drops key's dirty entry (after a write-through superseded it).
  void DropDirtyLocked(Shard& s, const Key& key);
  // Writes one dirty entry if it is still the one seen; true if it wrote.
  Status FlushKey(Shard& shard, const Key& key, uint64_t version, bool* wrote);
  Status FlushShard(Shard& shard);
  void FlusherLoop(int index);

  Store* const store_;
  const CacheOptions options_;
  std::atomic<WriteMode> mode_;
  Shard shards_[kShards];
  std::mutex stripes_[kStripes];
  std::atomic<uint64_t> next_version_{1};
  std::atomic<uint64_t> dirty_bytes_{0};
  std::atomic<uint64_t> dirty_entries_{0};
  std::atomic<uint64_t> flushes_{0};
  std::atomic<uint64_t> coalesced_{0};
  std::atomic<uint64_t> writer_waits_{0};

  std::mutex flush_mu_;
  std::condition_variable flush_cv_;    // wakes flushers
  std::condition_variable drained_cv_;  // dirty bytes went down
  bool stopping_ = false;               // GUARDED_BY(flush_mu_)
  std::vector<std::thread> flushers_;
  Status flush_error_;                  // GUARDED_BY(flush_mu_)
  // A flusher pass failed (a full disk) and no pass has written every
  // dirty entry since: async writes are written through meanwhile.
  std::atomic<bool> flush_failing_{false};
  std::atomic<uint64_t> flush_failures_{0};
  std::chrono::steady_clock::time_point flush_logged_;  // GUARDED_BY(flush_mu_)
  void NoteFlush(const Status& result);  // EXCLUSIVE_LOCKS_REQUIRED(flush_mu_)
  bool closed_ = false;                 // GUARDED_BY(flush_mu_)
};

}  // namespace flatkv::engine::cache
