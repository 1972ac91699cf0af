// Implementation notes
//
// Lock order: StripeOf(key) -> Shard::mu -> flush_mu_ is never held with
// either (writers waiting for the flushers take only flush_mu_).
//
// Why stripes: a safe write must update the cache in the same order as its
// Store write lands, or two racing writers could leave the cache holding the
// value the Store did not keep. Holding the key's stripe across "Store write,
// then cache update" serializes writes per key (not per shard, so sync:
// always writers to different keys still share group commits). Flushers take
// the same stripe, so a flush of an older dirty value can never land after a
// newer safe write.
//
// Why Shard::seq: a get that misses reads the Store without locks, then
// caches what it read only if no write touched the shard meanwhile; otherwise
// it could cache a value older than one a racing write just put there.
#include "engine/cache/write_back.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>

#include "engine/cache/arc.h"
#include "engine/cache/lru.h"

namespace flatkv::engine::cache {
namespace {

constexpr uint64_t kDirtyOverhead = 64;

uint64_t DirtyCharge(const std::string& value) { return value.size() + kDirtyOverhead; }

}  // namespace

const char* WriteModeName(WriteMode mode) { return mode == WriteMode::kSafe ? "safe" : "async"; }

bool ParseWriteMode(const std::string& text, WriteMode* mode) {
  if (text == "safe") {
    *mode = WriteMode::kSafe;
  } else if (text == "async") {
    *mode = WriteMode::kAsync;
  } else {
    return false;
  }
  return true;
}

Status WriteBackCache::Open(Store* store, const CacheOptions& options,
                            std::unique_ptr<WriteBackCache>* result) {
  if (options.policy != "lru" && options.policy != "arc") {
    return Status::InvalidArgument("cache.policy: must be lru or arc, not '" + options.policy + "'");
  }
  if (options.flush_threads < 1 || options.flush_threads > 64) {
    return Status::InvalidArgument("cache.flush_threads: must be in [1, 64]");
  }
  if (options.flush_interval_ms == 0) {
    return Status::InvalidArgument("cache.flush_interval_ms: must be positive");
  }
  std::unique_ptr<WriteBackCache> cache(new WriteBackCache(store, options));
  for (int i = 0; i < options.flush_threads; ++i) {
    cache->flushers_.emplace_back([c = cache.get(), i] { c->FlusherLoop(i); });
  }
  *result = std::move(cache);
  return Status::OK();
}

WriteBackCache::WriteBackCache(Store* store, const CacheOptions& options)
    : store_(store), options_(options), mode_(options.mode) {
  const uint64_t per_shard = options.capacity_bytes / kShards;
  for (Shard& s : shards_) {
    if (options.policy == "lru") {
      s.policy = std::make_unique<LruPolicy>(per_shard);
    } else {
      s.policy = std::make_unique<ArcPolicy>(per_shard);
    }
  }
}

WriteBackCache::~WriteBackCache() {
  Status st = Close();
  if (!st.ok()) spdlog::error("closing the cache: {}", st.ToString());
}

uint64_t WriteBackCache::Hash(int64_t key) {
  uint64_t z = static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

WriteBackCache::Key WriteBackCache::Key::Int(int64_t key) {
  Key k;
  k.enc_.reserve(1 + sizeof(key));
  k.enc_.push_back('i');
  k.enc_.append(reinterpret_cast<const char*>(&key), sizeof(key));
  k.hash_ = Hash(key);
  return k;
}

WriteBackCache::Key WriteBackCache::Key::Str(std::string_view key) {
  Key k;
  k.enc_.reserve(1 + key.size());
  k.enc_.push_back('s');
  k.enc_.append(key.data(), key.size());
  k.hash_ = std::hash<std::string_view>()(key);
  return k;
}

WriteBackCache::Key WriteBackCache::Key::FromEncoded(const std::string& enc) {
  return enc[0] == 'i' ? Int(ParseInt(enc)) : Str(std::string_view(enc).substr(1));
}

int64_t WriteBackCache::Key::ikey() const { return ParseInt(enc_); }

int64_t WriteBackCache::Key::ParseInt(const std::string& enc) {
  int64_t key;
  std::memcpy(&key, enc.data() + 1, sizeof(key));
  return key;
}

Status WriteBackCache::NotFound(const Key& key) {
  return Status::NotFound(key.is_string() ? std::string("string key")
                                          : "key " + std::to_string(key.ikey()));
}

Status WriteBackCache::StoreGet(const Key& key, std::string* value) const {
  return key.is_string() ? store_->SGet(key.skey(), value) : store_->Get(key.ikey(), value);
}

Status WriteBackCache::StorePut(const Key& key, std::string_view value) {
  return key.is_string() ? store_->SPut(key.skey(), value) : store_->Put(key.ikey(), value);
}

Status WriteBackCache::StoreRemove(const Key& key) {
  return key.is_string() ? store_->SRemove(key.skey(), nullptr) : store_->Remove(key.ikey(), nullptr);
}

bool WriteBackCache::StoreHas(const Key& key) const {
  if (!key.is_string()) return store_->Exists(key.ikey()).ok();
  std::string ignored;
  return store_->SGet(key.skey(), &ignored).ok();
}

Status WriteBackCache::Get(int64_t key, std::string* value) { return GetKey(Key::Int(key), value); }

Status WriteBackCache::SGet(std::string_view key, std::string* value) {
  return GetKey(Key::Str(key), value);
}

Status WriteBackCache::GetKey(const Key& key, std::string* value) {
  Shard& s = ShardOf(key);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    // The dirty map is empty in safe mode and between async bursts: then a
    // hit is the policy's one hash lookup, not a std::hash and a find first.
    if (!s.dirty.empty()) {
      auto it = s.dirty.find(key.enc());
      if (it != s.dirty.end()) {
        if (it->second.remove) return NotFound(key);
        *value = it->second.value;
        return Status::OK();
      }
    }
    if (s.policy->Lookup(key.enc(), value)) return Status::OK();
    seq = s.seq;
  }
  std::string v;
  FLATKV_RETURN_IF_ERROR(StoreGet(key, &v));  // NotFound is never cached
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.seq == seq) s.policy->Insert(key.enc(), v);
  }
  *value = std::move(v);
  return Status::OK();
}

Status WriteBackCache::GetBatch(const std::vector<int64_t>& keys,
                                std::vector<std::string>* values, std::vector<bool>* found) {
  values->assign(keys.size(), std::string());
  found->assign(keys.size(), false);
  // Indices grouped by shard (counting sort), so each shard locks once.
  std::array<uint32_t, kShards + 1> start{};
  for (int64_t k : keys) ++start[Hash(k) % kShards + 1];
  for (size_t i = 1; i <= kShards; ++i) start[i] += start[i - 1];
  std::vector<uint32_t> order(keys.size());
  std::array<uint32_t, kShards> fill{};
  for (uint32_t i = 0; i < keys.size(); ++i) {
    const size_t sh = Hash(keys[i]) % kShards;
    order[start[sh] + fill[sh]++] = i;
  }
  for (size_t sh = 0; sh < kShards; ++sh) {
    if (start[sh] == start[sh + 1]) continue;
    Shard& s = shards_[sh];
    std::vector<uint32_t> misses;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      for (uint32_t j = start[sh]; j < start[sh + 1]; ++j) {
        const uint32_t i = order[j];
        const Key key = Key::Int(keys[i]);
        auto it = s.dirty.empty() ? s.dirty.end() : s.dirty.find(key.enc());
        if (it != s.dirty.end()) {
          (*found)[i] = !it->second.remove;
          if ((*found)[i]) (*values)[i] = it->second.value;
        } else if (s.policy->Lookup(key.enc(), &(*values)[i])) {
          (*found)[i] = true;
        } else {
          misses.push_back(i);
        }
      }
      seq = s.seq;
    }
    if (misses.empty()) continue;
    for (uint32_t i : misses) {
      Status st = store_->Get(keys[i], &(*values)[i]);
      if (!st.ok() && !st.IsNotFound()) return st;
      (*found)[i] = st.ok();
    }
    // As in Get: cache what was read only if no write touched the shard.
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.seq != seq) continue;
    for (uint32_t i : misses) {
      if ((*found)[i]) s.policy->Insert(Key::Int(keys[i]).enc(), (*values)[i]);
    }
  }
  return Status::OK();
}

void WriteBackCache::DropDirtyLocked(Shard& s, const Key& key) {
  auto it = s.dirty.find(key.enc());
  if (it == s.dirty.end()) return;
  dirty_bytes_ -= DirtyCharge(it->second.value);
  --dirty_entries_;
  s.dirty.erase(it);
  drained_cv_.notify_all();
}

Status WriteBackCache::WriteSafe(const Key& key, bool remove, std::string_view value) {
  Shard& s = ShardOf(key);
  std::lock_guard<std::mutex> stripe(StripeOf(key));
  FLATKV_RETURN_IF_ERROR(remove ? StoreRemove(key) : StorePut(key, value));
  if (!remove) {
    AfterSafePut(key, value);
    return Status::OK();
  }
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.seq;
  DropDirtyLocked(s, key);  // an older async write, superseded
  s.policy->Erase(key.enc());
  return Status::OK();
}

void WriteBackCache::AfterSafePut(const Key& key, std::string_view value) {
  Shard& s = ShardOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.seq;
  DropDirtyLocked(s, key);  // an older async write, superseded
  // Write-through without write-allocate: a cached key gets the new value,
  // an uncached one stays uncached (a fill must not churn the cache, and
  // reads bring hot keys in).
  s.policy->Update(key.enc(), value);
}

// Holds the stripes of every key of the batch, taken in ascending order
// (everyone else holds at most one stripe, so this cannot deadlock), across
// the Store write and the cache updates, as WriteSafe does for one key.
Status WriteBackCache::WriteSafeBatch(const std::vector<KeyValueRef>& pairs) {
  std::vector<size_t> stripes;
  stripes.reserve(pairs.size());
  for (const KeyValueRef& p : pairs) stripes.push_back(Hash(p.key) / kShards % kStripes);
  std::sort(stripes.begin(), stripes.end());
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  for (size_t i : stripes) stripes_[i].lock();
  Status st = store_->PutBatch(pairs);
  // Pairs may have reached the Store even on an error: update the cache for
  // all of them (a later get then reads the Store, which is the truth).
  for (const KeyValueRef& p : pairs) {
    const Key key = Key::Int(p.key);
    if (st.ok()) {
      AfterSafePut(key, p.value);
    } else {
      Shard& s = ShardOf(key);
      std::lock_guard<std::mutex> lock(s.mu);
      ++s.seq;
      s.policy->Erase(key.enc());
    }
  }
  for (size_t i : stripes) stripes_[i].unlock();
  return st;
}

Status WriteBackCache::PutBatch(const std::vector<KeyValueRef>& pairs) {
  for (const KeyValueRef& p : pairs) {
    FLATKV_RETURN_IF_ERROR(store_->CheckKey(p.key));
    FLATKV_RETURN_IF_ERROR(store_->CheckValue(p.value.size()));
  }
  if (mode_.load() != WriteMode::kAsync) return WriteSafeBatch(pairs);
  for (const KeyValueRef& p : pairs) {
    Dirty op;
    op.value.assign(p.value.data(), p.value.size());
    WaitForRoom();
    const Key key = Key::Int(p.key);
    if (!TryWriteAsync(key, &op)) FLATKV_RETURN_IF_ERROR(WriteSafe(key, false, p.value));
  }
  return Status::OK();
}

void WriteBackCache::WaitForRoom() {
  if (dirty_bytes_.load() <= options_.max_dirty_bytes) return;
  // Back-pressure: wait for the flushers instead of growing. Not while
  // flushes fail: the writer writes through instead (TryWriteAsync), so a
  // full disk fails writes at once rather than blocking them for good.
  ++writer_waits_;
  std::unique_lock<std::mutex> f(flush_mu_);
  flush_cv_.notify_all();
  drained_cv_.wait(f, [&] {
    return dirty_bytes_.load() <= options_.max_dirty_bytes || stopping_ ||
           flush_failing_.load();
  });
}

bool WriteBackCache::TryWriteAsync(const Key& key, Dirty* op) {
  Shard& s = ShardOf(key);
  std::lock_guard<std::mutex> lock(s.mu);
  if (mode_.load() != WriteMode::kAsync) return false;
  // While flushes fail (a full disk), acknowledge nothing the disk has not
  // taken: the caller writes through and gets the Store's error.
  if (flush_failing_.load()) return false;
  op->version = next_version_++;
  ++s.seq;
  s.policy->Erase(key.enc());  // the dirty map holds the newest value
  auto [it, inserted] = s.dirty.try_emplace(key.enc());
  if (inserted) {
    ++dirty_entries_;
  } else {
    ++coalesced_;
    dirty_bytes_ -= DirtyCharge(it->second.value);
  }
  dirty_bytes_ += DirtyCharge(op->value);
  it->second = std::move(*op);
  return true;
}

Status WriteBackCache::Put(int64_t key, std::string_view value) {
  // Checked now: an async write is acknowledged before the Store sees it.
  FLATKV_RETURN_IF_ERROR(store_->CheckKey(key));
  FLATKV_RETURN_IF_ERROR(store_->CheckValue(value.size()));
  return PutKey(Key::Int(key), value);
}

Status WriteBackCache::SPut(std::string_view key, std::string_view value) {
  FLATKV_RETURN_IF_ERROR(store_->CheckStringKey(key));
  FLATKV_RETURN_IF_ERROR(store_->CheckValue(value.size()));
  return PutKey(Key::Str(key), value);
}

Status WriteBackCache::SReadBucket(int64_t slot, std::vector<StringKeyValue>* live) {
  FLATKV_RETURN_IF_ERROR(Flush());
  return store_->SReadBucket(slot, live);
}

Status WriteBackCache::SWriteBucket(int64_t slot, const std::vector<StringKeyValue>& live) {
  FLATKV_RETURN_IF_ERROR(Flush());
  return store_->SWriteBucket(slot, live);
}

// Safe mode writes the caller's bytes straight to the Store: the only copy
// of the value is the one into the log. Async mode copies it into the
// dirty entry.
Status WriteBackCache::PutKey(const Key& key, std::string_view value) {
  if (mode_.load() == WriteMode::kAsync) {
    Dirty op;
    op.value.assign(value.data(), value.size());
    WaitForRoom();
    if (TryWriteAsync(key, &op)) return Status::OK();
  }
  return WriteSafe(key, false, value);
}

Status WriteBackCache::Remove(int64_t key, bool* existed) {
  FLATKV_RETURN_IF_ERROR(store_->CheckKey(key));
  return RemoveKey(Key::Int(key), existed);
}

Status WriteBackCache::SRemove(std::string_view key, bool* existed) {
  if (!store_->CheckStringKey(key).ok()) {  // too long to have been stored
    if (existed != nullptr) *existed = false;
    return Status::OK();
  }
  return RemoveKey(Key::Str(key), existed);
}

Status WriteBackCache::RemoveKey(const Key& key, bool* existed) {
  if (mode_.load() == WriteMode::kAsync) WaitForRoom();
  Shard& s = ShardOf(key);
  std::lock_guard<std::mutex> stripe(StripeOf(key));
  bool present = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.dirty.find(key.enc());
    if (it != s.dirty.end()) {
      present = !it->second.remove;
    } else {
      std::string ignored;
      present = s.policy->Lookup(key.enc(), &ignored) || StoreHas(key);
    }
  }
  if (existed != nullptr) *existed = present;
  Dirty op;
  op.remove = true;
  if (mode_.load() == WriteMode::kAsync && TryWriteAsync(key, &op)) return Status::OK();
  FLATKV_RETURN_IF_ERROR(StoreRemove(key));
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.seq;
  DropDirtyLocked(s, key);
  s.policy->Erase(key.enc());
  return Status::OK();
}

Status WriteBackCache::Append(int64_t ikey, std::string_view value) {
  FLATKV_RETURN_IF_ERROR(store_->CheckKey(ikey));
  FLATKV_RETURN_IF_ERROR(store_->CheckValue(value.size()));
  if (mode_.load() == WriteMode::kAsync) WaitForRoom();
  const Key key = Key::Int(ikey);
  Shard& s = ShardOf(key);
  std::lock_guard<std::mutex> stripe(StripeOf(key));
  // The current value: dirty, cached, or in the Store.
  std::string current;
  bool dirty = false;
  bool dirty_remove = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.dirty.find(key.enc());
    if (it != s.dirty.end()) {
      dirty = true;
      dirty_remove = it->second.remove;
      if (!dirty_remove) current = it->second.value;
    }
  }
  if (mode_.load() == WriteMode::kAsync) {
    if (!dirty) {
      Status st = GetKey(key, &current);
      if (!st.ok() && !st.IsNotFound()) return st;
    }
    Dirty op;
    op.value = current;
    op.value.append(value.data(), value.size());
    FLATKV_RETURN_IF_ERROR(store_->CheckValue(op.value.size()));
    if (TryWriteAsync(key, &op)) return Status::OK();
  }
  // Safe: land any older dirty value first, then append in the Store.
  if (dirty) {
    FLATKV_RETURN_IF_ERROR(dirty_remove ? StoreRemove(key) : StorePut(key, current));
  }
  FLATKV_RETURN_IF_ERROR(store_->Append(ikey, value));
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.seq;
  DropDirtyLocked(s, key);
  s.policy->Erase(key.enc());  // the whole value is in the Store only
  return Status::OK();
}

Status WriteBackCache::FlushKey(Shard& s, const Key& key, uint64_t version, bool* wrote) {
  *wrote = false;
  std::lock_guard<std::mutex> stripe(StripeOf(key));
  Dirty op;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.dirty.find(key.enc());
    if (it == s.dirty.end() || it->second.version != version) return Status::OK();
    op = it->second;
  }
  FLATKV_RETURN_IF_ERROR(op.remove ? StoreRemove(key) : StorePut(key, op.value));
  ++flushes_;
  *wrote = true;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.dirty.find(key.enc());
  if (it != s.dirty.end() && it->second.version == version) {
    dirty_bytes_ -= DirtyCharge(it->second.value);
    --dirty_entries_;
    s.dirty.erase(it);
    if (!op.remove) s.policy->Insert(key.enc(), op.value);  // now clean
  }
  return Status::OK();
}

Status WriteBackCache::FlushShard(Shard& s) {
  std::vector<std::pair<std::string, uint64_t>> todo;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    todo.reserve(s.dirty.size());
    for (const auto& [key, d] : s.dirty) todo.emplace_back(key, d.version);
  }
  Status result;
  for (const auto& [key, version] : todo) {
    bool wrote;
    Status st = FlushKey(s, Key::FromEncoded(key), version, &wrote);
    if (!st.ok() && result.ok()) result = st;
  }
  if (!todo.empty()) drained_cv_.notify_all();
  return result;
}

void WriteBackCache::FlusherLoop(int index) {
  std::unique_lock<std::mutex> f(flush_mu_);
  while (!stopping_) {
    flush_cv_.wait_for(f, std::chrono::milliseconds(options_.flush_interval_ms));
    if (stopping_) break;
    f.unlock();
    Status result;
    for (size_t i = static_cast<size_t>(index); i < kShards;
         i += static_cast<size_t>(options_.flush_threads)) {
      Status st = FlushShard(shards_[i]);
      if (!st.ok() && result.ok()) result = st;
    }
    f.lock();
    NoteFlush(result);
    drained_cv_.notify_all();
  }
}

void WriteBackCache::NoteFlush(const Status& result) {
  // Logged when flushes start failing, every 10 s while they do, and when
  // they succeed again, not every flush interval.
  const auto now = std::chrono::steady_clock::now();
  if (!result.ok()) {
    flush_error_ = result;
    ++flush_failures_;
    if (!flush_failing_.exchange(true) || now - flush_logged_ >= std::chrono::seconds(10)) {
      flush_logged_ = now;
      spdlog::error("cache flush: {} ({} entries stay dirty, readable and retried; async "
                    "writes are written through meanwhile)",
                    result.ToString(), dirty_entries_.load());
    }
  } else if (flush_failing_.load() && dirty_entries_.load() == 0) {
    flush_failing_.store(false);
    flush_error_ = Status::OK();
    spdlog::info("cache flush: every dirty entry is written again; async writes resume");
  }
}

Status WriteBackCache::Flush() {
  Status result;
  // Repeat while entries remain: a pass skips keys re-dirtied meanwhile.
  for (int pass = 0; pass < 100 && dirty_entries_.load() > 0; ++pass) {
    for (Shard& s : shards_) {
      Status st = FlushShard(s);
      if (!st.ok()) return st;
    }
  }
  return result;
}

Status WriteBackCache::SetMode(WriteMode mode) {
  if (mode == WriteMode::kAsync) {
    mode_.store(mode);
    return Status::OK();
  }
  // No async write may add a dirty entry once this returns: switch under
  // every shard lock, then drain.
  for (Shard& s : shards_) s.mu.lock();
  mode_.store(WriteMode::kSafe);
  for (Shard& s : shards_) s.mu.unlock();
  drained_cv_.notify_all();
  return Flush();
}

Status WriteBackCache::Close() {
  {
    std::lock_guard<std::mutex> f(flush_mu_);
    if (closed_) return Status::OK();
    closed_ = true;
  }
  Status st = SetMode(WriteMode::kSafe);
  {
    std::lock_guard<std::mutex> f(flush_mu_);
    stopping_ = true;
  }
  flush_cv_.notify_all();
  drained_cv_.notify_all();
  for (std::thread& t : flushers_) t.join();
  return st;
}

CacheStats WriteBackCache::stats() const {
  CacheStats c;
  for (const Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(s.mu));
    const PolicyStats p = s.policy->stats();
    c.hits += p.hits;
    c.misses += p.misses;
    c.evictions += p.evictions;
    c.clean_bytes += p.bytes;
  }
  c.dirty_bytes = dirty_bytes_.load();
  c.dirty_entries = dirty_entries_.load();
  c.flushes = flushes_.load();
  c.coalesced = coalesced_.load();
  c.writer_waits = writer_waits_.load();
  c.flush_failures = flush_failures_.load();
  c.flush_failing = flush_failing_.load();
  return c;
}

}  // namespace flatkv::engine::cache
