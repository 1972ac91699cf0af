#include "engine/sparse_tier.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <mutex>

#include <spdlog/spdlog.h>

#include "engine/store.h"

namespace flatkv::engine {
namespace {

constexpr uint64_t kSignBit = uint64_t{1} << 63;

// DeleteRange and CountKeys work a page of keys at a time and let go of
// the ordered set between pages, so none holds it for long; LoadOrder
// reads the table a page at a time.
constexpr size_t kPage = 1024;

// The table's errors name the tier (its own name for a key, "string key",
// does not): "sparse tier: <what failed>".
Status Named(const Status& st) {
  return st.ok() || st.IsNotFound() ? st : st.WithContext("sparse tier");
}

}  // namespace

std::string EncodeSparseKey(int64_t key) {
  const uint64_t u = static_cast<uint64_t>(key) ^ kSignBit;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(u >> (56 - 8 * i));
  return out;
}

bool DecodeSparseKey(std::string_view bytes, int64_t* key) {
  if (bytes.size() != 8) return false;
  uint64_t u = 0;
  for (char c : bytes) u = (u << 8) | static_cast<uint8_t>(c);
  *key = static_cast<int64_t>(u ^ kSignBit);
  return true;
}

SparseTier::SparseTier() = default;

Status SparseTier::Open(const std::string& dir, const EngineOptions& options, int max_open_files,
                        std::unique_ptr<SparseTier>* result) {
  // The tier's earlier format is an embedded RocksDB database, which names
  // itself in IDENTITY; its files are not a store's.
  if (access((dir + "/IDENTITY").c_str(), F_OK) == 0) {
    return Status::InvalidArgument(
        "sparse tier " + dir + " holds a RocksDB database (the tier's earlier format); "
        "open it once with the version that wrote it and storage.sparse_tier: off, which "
        "moves its keys into flat tables and removes it");
  }
  std::unique_ptr<SparseTier> tier(new SparseTier());
  tier->dir_ = dir;
  EngineOptions inner = options;
  inner.path = dir;
  inner.sparse_tier = false;  // the tier holds no integer keys of its own
  inner.string_slots = options.sparse_slots;
  inner.max_open_files = static_cast<uint32_t>(std::max(max_open_files, 1));
  FLATKV_RETURN_IF_ERROR(Named(Store::Open(inner, &tier->table_)));
  FLATKV_RETURN_IF_ERROR(tier->LoadOrder());
  *result = std::move(tier);
  return Status::OK();
}

SparseTier::~SparseTier() { (void)Close(); }

Status SparseTier::LoadOrder() {
  // The keys come in hash order; the set is built once from them sorted
  // (each insert then lands at its end: a third of the open time of a
  // million-key tier went to inserts in hash order, each a cache miss).
  // Nothing else holds the tier during its open.
  std::string cursor;
  std::vector<StringKeyValue> page;
  std::vector<int64_t> corrupt;
  std::vector<int64_t> keys;
  for (;;) {
    page.clear();
    std::string next;
    bool done = false;
    FLATKV_RETURN_IF_ERROR(Named(table_->SScan(cursor, kPage, &page, &next, &done, &corrupt)));
    for (const StringKeyValue& kv : page) {
      int64_t key;
      if (!DecodeSparseKey(kv.key, &key)) {
        return Status::Corruption("sparse tier " + dir_ + ": a key of " +
                                  std::to_string(kv.key.size()) + " bytes (tier keys have 8)");
      }
      keys.push_back(key);
    }
    if (done) break;
    cursor = std::move(next);
  }
  std::sort(keys.begin(), keys.end());
  if (!corrupt.empty()) {
    lo_.store(std::numeric_limits<int64_t>::min(), std::memory_order_relaxed);
    hi_.store(std::numeric_limits<int64_t>::max(), std::memory_order_relaxed);
  } else if (!keys.empty()) {
    Cover(keys.front());
    Cover(keys.back());
  }
  {
    std::unique_lock<std::shared_mutex> lock(order_mu_);
    order_.insert(keys.begin(), keys.end());
  }
  bad_buckets_at_open_ = corrupt.size();
  if (!corrupt.empty()) {
    // Their keys read as Corruption until repaired; scans do not list them.
    spdlog::error("sparse tier {}: {} bucket(s) fail their checksum; their keys are left out "
                  "of key-order scans", dir_, corrupt.size());
  }
  return Status::OK();
}

void SparseTier::NoteChange(int64_t key, bool put) {
  std::unique_lock<std::shared_mutex> lock(order_mu_);
  pending_.push_back(Change{key, put});
  pending_count_.store(pending_.size(), std::memory_order_relaxed);
  if (pending_.size() >= std::clamp(order_.size() / 16, kMinFold, kMaxFold)) FoldLocked();
}

void SparseTier::FoldLocked() const {
  if (pending_.empty()) return;
  // Stable: the changes of one key keep their order, the newest last.
  std::stable_sort(pending_.begin(), pending_.end(),
                   [](const Change& a, const Change& b) { return a.key < b.key; });
  for (const Change& c : pending_) {
    if (c.put) {
      order_.insert(c.key);
    } else {
      order_.erase(c.key);
    }
  }
  pending_.clear();
  pending_count_.store(0, std::memory_order_relaxed);
  // A burst of writes should not pin a long list's memory.
  if (pending_.capacity() > 4 * kMaxFold) std::vector<Change>().swap(pending_);
}

void SparseTier::Fold() const {
  // Relaxed is enough: a write that happened before this call stored its
  // count before it, and coherence makes this load see that store or a
  // later one (a fold's 0, made under the lock after the change was in
  // order_). A write still running is concurrent with the reader anyway.
  if (pending_count_.load(std::memory_order_relaxed) == 0) return;
  std::unique_lock<std::shared_mutex> lock(order_mu_);
  FoldLocked();
}

void SparseTier::Cover(int64_t key) {
  // Relaxed is enough: a get that must see this put's key starts after the
  // put returned, so after this store, and reads it or a wider bound.
  int64_t lo = lo_.load(std::memory_order_relaxed);
  while (key < lo && !lo_.compare_exchange_weak(lo, key, std::memory_order_relaxed)) {
  }
  int64_t hi = hi_.load(std::memory_order_relaxed);
  while (key > hi && !hi_.compare_exchange_weak(hi, key, std::memory_order_relaxed)) {
  }
}

Status SparseTier::Put(int64_t key, std::string_view value) {
  Cover(key);
  bool replaced;
  FLATKV_RETURN_IF_ERROR(Named(table_->SPut(EncodeSparseKey(key), value, &replaced)));
  // A key its bucket held is in the key order already (the Store serializes
  // the writes of a key, so its last put noted it): an overwrite leaves the
  // order alone rather than sorting and folding the key in for nothing.
  if (!replaced) NoteChange(key, true);
  return Status::OK();
}

Status SparseTier::PutBatch(const std::vector<KeyValueRef>& pairs,
                            const std::vector<uint32_t>& items) {
  for (uint32_t i : items) FLATKV_RETURN_IF_ERROR(Put(pairs[i].key, pairs[i].value));
  return Status::OK();
}

Status SparseTier::Get(int64_t key, std::string* value) const {
  if (key < lo_.load(std::memory_order_relaxed) || key > hi_.load(std::memory_order_relaxed)) {
    return Status::NotFound("key");
  }
  Status st = table_->SGet(EncodeSparseKey(key), value);
  return st.IsNotFound() ? Status::NotFound("key") : Named(st);
}

Status SparseTier::Delete(int64_t key) {
  FLATKV_RETURN_IF_ERROR(Named(table_->SRemove(EncodeSparseKey(key))));
  NoteChange(key, false);
  return Status::OK();
}

Status SparseTier::DeleteRange(int64_t lo, int64_t hi) {
  for (;;) {
    const std::vector<int64_t> keys = KeysFrom(lo, hi, false, kPage);
    for (int64_t key : keys) FLATKV_RETURN_IF_ERROR(Delete(key));
    if (keys.size() <= kPage) break;
  }
  return Named(table_->Sync());
}

std::vector<int64_t> SparseTier::KeysFrom(int64_t from, int64_t stop, bool reverse,
                                          size_t limit) const {
  Fold();
  std::vector<int64_t> keys;
  std::shared_lock<std::shared_mutex> lock(order_mu_);
  if (!reverse) {
    for (auto it = order_.lower_bound(from); it != order_.end() && *it <= stop; ++it) {
      keys.push_back(*it);
      if (keys.size() > limit) break;
    }
  } else {
    for (auto it = order_.upper_bound(from); it != order_.begin();) {
      --it;
      if (*it < stop) break;
      keys.push_back(*it);
      if (keys.size() > limit) break;
    }
  }
  return keys;
}

Status SparseTier::Collect(int64_t from, int64_t stop, bool reverse, size_t limit,
                           std::vector<KeyValue>* out, bool* more, int64_t* resume,
                           std::vector<int64_t>* corrupt) const {
  const std::vector<int64_t> keys = KeysFrom(from, stop, reverse, limit);
  *more = keys.size() > limit;
  if (*more) *resume = keys[limit];
  const size_t take = std::min(keys.size(), limit);
  for (size_t i = 0; i < take; ++i) {
    KeyValue kv{keys[i], {}};
    Status st = Get(kv.key, &kv.value);
    if (st.IsNotFound()) continue;  // removed since the keys were listed
    if (st.IsCorruption() && corrupt != nullptr) {
      corrupt->push_back(kv.key);
      continue;
    }
    FLATKV_RETURN_IF_ERROR(st);
    out->push_back(std::move(kv));
  }
  return Status::OK();
}

uint64_t SparseTier::CountKeys(int64_t lo, int64_t hi, uint64_t cap) const {
  uint64_t n = 0;
  int64_t from = lo;
  while (n < cap) {
    std::shared_lock<std::shared_mutex> lock(order_mu_);
    auto it = order_.lower_bound(from);
    for (size_t taken = 0; it != order_.end() && *it <= hi && n < cap && taken < kPage; ++it) {
      ++n;
      ++taken;
    }
    if (it == order_.end() || *it > hi || n >= cap) break;
    from = *it;  // the next page starts at the first key not yet counted
  }
  return n;
}

Status SparseTier::Count(int64_t lo, int64_t hi, uint64_t cap, uint64_t* n) const {
  Fold();
  *n = CountKeys(lo, hi, cap);
  return Status::OK();
}

uint64_t SparseTier::CountFolded(int64_t lo, int64_t hi, uint64_t cap) const {
  return CountKeys(lo, hi, cap);
}

Status SparseTier::Sync() { return Named(table_->Sync()); }

uint64_t SparseTier::LiveBytes() const { return table_->LiveBytesEstimate(); }

uint64_t SparseTier::LiveBytes(int64_t lo, int64_t hi) const {
  const uint64_t all = KeysEstimate();  // folds the pending writes
  if (all == 0) return 0;
  // Keys written between the two reads may make "in" exceed "all".
  const uint64_t in = std::min(CountKeys(lo, hi, std::numeric_limits<uint64_t>::max()), all);
  return static_cast<uint64_t>(static_cast<long double>(LiveBytes()) * in / all);
}

uint64_t SparseTier::KeysEstimate() const {
  Fold();
  std::shared_lock<std::shared_mutex> lock(order_mu_);
  return order_.size();
}

EngineStats SparseTier::Stats() const { return table_->GetStats(); }

Status SparseTier::Compact() { return Named(table_->CompactAndWait()); }

Status SparseTier::Checkpoint() { return Named(table_->Checkpoint()); }

Status SparseTier::Close() {
  if (table_ == nullptr) return Status::OK();
  return table_->Close();
}

}  // namespace flatkv::engine
