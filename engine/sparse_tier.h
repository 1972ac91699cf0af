// SparseTier: the integer keys of segments too sparse for a flat table.
//
// A flat table spends index_item_bytes of index per key of its range,
// present or not, so it suits keys that fill their segment. Keys spread
// thinly (random 64-bit IDs, hashed IDs, Snowflake IDs millions apart) would
// cost a segment, its files and an index page each. With
// storage.sparse_tier on, a write to a segment that has no flat table goes
// here instead. Store promotes a segment to a flat table once its keys are
// dense enough (store.h, "The sparse tier"); the tier itself knows nothing
// of segments.
//
// The tier is a store of its own under <storage.path>/sparse that holds only
// a string-key table (string_keys.h): key k is kept under the 8-byte string
// EncodeSparseKey(k), in the bucket of its hash. So a tier key costs what a
// string key costs, whatever the keys' spread: a put is one append to its
// bucket's data file, a get one read (none for most absent keys, by the
// bucket filter, and no look at the table for a key outside the span of the
// tier's keys), and the string table's compaction, crash recovery,
// checksums, full-disk handling and damaged-bucket rule apply unchanged.
//
// Key order, which hashing gives up, is kept in memory: an ordered set of
// the tier's keys (a B-tree, about 10 bytes a key), rebuilt at open from the
// buckets (one read of the tier's live data). Scans, counts and promotions
// walk it and read each value by its key. A write does not insert into the
// set itself: it appends its key to a short list of pending changes, which
// is sorted and folded into the set once it is long enough or when the
// order is read. A B-tree insert of a random key costs a cache miss per
// level (about a third of a put's time in a million-key tier); a sorted
// batch walks the tree in order and costs about a quarter of that. A put
// that replaced a key its bucket held (Store::SPut says so) notes nothing:
// the key is in the order already.
//
// Thread safety: every method may be called from any thread. A put or
// remove updates the table and then the key order, so a scan running
// beside it may see the key or not; the Store serializes the writes of one
// key (SparseKeyMutex), which keeps the two in step.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include <absl/container/btree_set.h>

#include "engine/options.h"
#include "engine/status.h"

namespace flatkv::engine {

struct EngineStats;
struct KeyValue;
struct KeyValueRef;
class Store;

// 8 bytes big-endian with the sign bit flipped: byte order is integer order.
std::string EncodeSparseKey(int64_t key);
// False unless "bytes" is 8 bytes long.
bool DecodeSparseKey(std::string_view bytes, int64_t* key);

class SparseTier {
 public:
  // Opens (creating if needed) the tier in "dir". "max_open_files" is the
  // tier's share of the store's descriptor budget.
  static Status Open(const std::string& dir, const EngineOptions& options, int max_open_files,
                     std::unique_ptr<SparseTier>* result);
  ~SparseTier();

  Status Put(int64_t key, std::string_view value);
  // Puts the pairs at "items" of "pairs", in order; an error stops it
  // (pairs before it may be written), as Store::PutBatch.
  Status PutBatch(const std::vector<KeyValueRef>& pairs, const std::vector<uint32_t>& items);
  // NotFound leaves *value unchanged; Corruption if its bucket fails its
  // checksum (never a wrong value). A key outside the tier's bounds (below)
  // is NotFound without a look at the table.
  Status Get(int64_t key, std::string* value) const;
  Status Delete(int64_t key);
  // Deletes every key in [lo, hi], durably (synced before this returns,
  // whatever storage.sync says).
  Status DeleteRange(int64_t lo, int64_t hi);

  // Key-order read: the first "limit" keys from "from" towards "stop"
  // (both inclusive; ascending unless "reverse") are looked at and their
  // pairs appended to *out (a key removed meanwhile is left out). *more is
  // true if keys in range were left: *resume is then the first of them. A
  // key whose bucket fails its checksum fails the call, unless "corrupt" is
  // given: then it is appended there and skipped, as a flat table's scan
  // skips a bad record.
  Status Collect(int64_t from, int64_t stop, bool reverse, size_t limit,
                 std::vector<KeyValue>* out, bool* more, int64_t* resume,
                 std::vector<int64_t>* corrupt = nullptr) const;
  // The keys in [lo, hi], counted up to "cap".
  Status Count(int64_t lo, int64_t hi, uint64_t cap, uint64_t* n) const;
  // As Count, but without the writes not yet folded into the key order (at
  // most a fold's worth, kMaxFold): for estimates that run often (the
  // density check behind promotions), which must not fold at every call.
  uint64_t CountFolded(int64_t lo, int64_t hi, uint64_t cap) const;

  // Makes every acknowledged write durable.
  Status Sync();
  // The table's live bytes (Store::LiveBytesEstimate), all of it or the
  // share of [lo, hi] by key count.
  uint64_t LiveBytes() const;
  uint64_t LiveBytes(int64_t lo, int64_t hi) const;
  uint64_t KeysEstimate() const;
  // Buckets that failed their checksum when the tier opened: their keys are
  // not in the key order (scans and counts miss them) and read as errors.
  size_t BadBucketsAtOpen() const { return bad_buckets_at_open_; }
  // The table's own counters (appends, syncs, recovery, bad records, full
  // disk), for the Store's.
  EngineStats Stats() const;
  // Compacts the table and waits for it (Store::Compact).
  Status Compact();
  Status Checkpoint();
  Status Close();

  SparseTier(const SparseTier&) = delete;
  SparseTier& operator=(const SparseTier&) = delete;

 private:
  SparseTier();
  // A write of "key" to the key order: a put adds it, a remove drops it.
  struct Change {
    int64_t key;
    bool put;
  };
  static constexpr size_t kMinFold = 256;
  static constexpr size_t kMaxFold = 16384;

  // Fills order_ from the table's buckets (at open).
  Status LoadOrder();
  // Records a write in the key order: appends it to pending_ and folds
  // pending_ once it holds a batch worth sorting (about 1/16 of the set,
  // between kMinFold and kMaxFold changes).
  void NoteChange(int64_t key, bool put);
  // Folds pending_ into order_, if it holds anything. Held: order_mu_,
  // exclusively.
  void FoldLocked() const;
  // Folds pending_ (taking order_mu_ exclusively only if there is any).
  void Fold() const;
  // The keys of order_ in [lo, hi], counted up to "cap" a page at a time
  // (a count of many keys does not hold writers off).
  uint64_t CountKeys(int64_t lo, int64_t hi, uint64_t cap) const;
  // The keys of order_ from "from" towards "stop", at most "limit" + 1.
  std::vector<int64_t> KeysFrom(int64_t from, int64_t stop, bool reverse, size_t limit) const;

  std::string dir_;
  std::unique_ptr<Store> table_;
  mutable std::shared_mutex order_mu_;
  // The key order: order_ with the changes of pending_ applied in turn.
  // Readers of order_ fold pending_ first (Fold), so they are logically
  // const.
  mutable absl::btree_set<int64_t> order_;  // GUARDED_BY(order_mu_)
  mutable std::vector<Change> pending_;      // GUARDED_BY(order_mu_)
  mutable std::atomic<size_t> pending_count_{0};  // pending_.size(), read without the lock
  size_t bad_buckets_at_open_ = 0;  // set by LoadOrder
  // Bounds of every key the tier may hold: each key found at open and each
  // key put since lies in [lo_, hi_] (a put widens them before it writes;
  // removes never narrow them). A get outside them is answered without the
  // table's hash, filter and index: the misses of IDs newer than any stored
  // (Snowflake IDs, timestamps) cost one compare, as an LSM tree's do by its
  // files' key ranges. With buckets failing their checksum at open, whose
  // keys are unknown and must read as Corruption, they span every key.
  std::atomic<int64_t> lo_{std::numeric_limits<int64_t>::max()};
  std::atomic<int64_t> hi_{std::numeric_limits<int64_t>::min()};
  // Widens the bounds to hold "key".
  void Cover(int64_t key);
};

}  // namespace flatkv::engine
