#include "engine/sparse_tier.h"

#include <sys/statvfs.h>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <cstring>
#include <limits>

#include <spdlog/spdlog.h>

#include "engine/store.h"

namespace flatkv::engine {
namespace {

constexpr uint64_t kSignBit = uint64_t{1} << 63;
// Each memtable (and so each log file before it is flushed).
constexpr uint64_t kMemtableBytes = uint64_t{32} << 20;

void EncodeKey(int64_t key, char out[8]) {
  const uint64_t u = static_cast<uint64_t>(key) ^ kSignBit;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(u >> (56 - 8 * i));
}

int64_t DecodeKey(const rocksdb::Slice& s) {
  uint64_t u = 0;
  for (size_t i = 0; i < 8 && i < s.size(); ++i) {
    u = (u << 8) | static_cast<uint8_t>(s.data()[i]);
  }
  return static_cast<int64_t>(u ^ kSignBit);
}

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  if (s.IsNotFound()) return Status::NotFound(what);
  if (s.IsCorruption()) return Status::Corruption(what + ": " + s.ToString());
  if (s.IsNoSpace()) return Status::NoSpace(what + ": " + s.ToString());
  return Status::IOError(what + ": " + s.ToString());
}

}  // namespace

Status SparseTier::Open(const std::string& dir, const EngineOptions& options, int max_open_files,
                        std::unique_ptr<SparseTier>* result) {
  std::unique_ptr<SparseTier> tier(new SparseTier());
  tier->dir_ = dir;
  tier->options_ = options;
  tier->max_open_files_ = max_open_files;
  tier->sync_always_ = options.sync == SyncMode::kAlways;
  FLATKV_RETURN_IF_ERROR(tier->OpenDb());
  *result = std::move(tier);
  return Status::OK();
}

Status SparseTier::OpenDb() {
  rocksdb::Options ro;
  ro.create_if_missing = true;
  ro.paranoid_checks = true;
  ro.max_open_files = max_open_files_;
  ro.IncreaseParallelism(2);
  ro.write_buffer_size = kMemtableBytes;
  // Compactions start only with room for their output and kReserve more.
  ro.sst_file_manager.reset(rocksdb::NewSstFileManager(rocksdb::Env::Default()));
  ro.sst_file_manager->SetCompactionBufferSize(kReserve);
  rocksdb::BlockBasedTableOptions table;
  // The block cache is the peers' size in flatkv-bench (64 MiB). Ten bits
  // a key: a get of an absent key reads a block in about 1 % of cases;
  // index and filter blocks stay in memory, so a present key costs one
  // block read.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(size_t{64} << 20);
  ro.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Values are stored as given, as in the flat tables: a read that misses
  // the block cache costs a page-cache copy, not a decompression.
  ro.compression = rocksdb::kNoCompression;
  rocksdb::DB* db = nullptr;
  FLATKV_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(ro, dir_, &db), "opening " + dir_));
  db_.reset(db);
  return Status::OK();
}

SparseTier::~SparseTier() { (void)Close(); }

Status SparseTier::BeforeWrite() {
  if (!failed_.load(std::memory_order_acquire)) return Status::OK();
  std::lock_guard<std::mutex> fail(fail_mu_);
  if (!failed_.load()) return Status::OK();
  const auto now = std::chrono::steady_clock::now();
  if (now < retry_at_) return failure_;
  retry_at_ = now + kRetryAfter;
  // Reopening writes a new log and manifest: not on a disk that is still
  // full.
  if (!Room(0).ok()) return failure_;
  std::unique_lock<std::shared_mutex> lock(db_mu_);
  if (closed_) return failure_;
  // Its log writer failed: it is closed without another write to it.
  (void)db_->Close();
  db_.reset();
  Status st = OpenDb();
  if (!st.ok()) {
    spdlog::error("reopening sparse tier {} after a failed write: {}", dir_, st.ToString());
    // Reads go on from a read-only copy until a later write reopens it.
    rocksdb::Options ro;
    rocksdb::DB* db = nullptr;
    if (rocksdb::DB::OpenForReadOnly(ro, dir_, &db).ok()) db_.reset(db);
    if (st.IsNoSpace()) failure_ = st;
    return failure_;
  }
  failed_.store(false, std::memory_order_release);
  spdlog::info("sparse tier {} takes writes again", dir_);
  return Status::OK();
}

void SparseTier::NoteFailed(const Status& st) {
  std::lock_guard<std::mutex> fail(fail_mu_);
  if (failed_.load()) return;
  spdlog::error("sparse tier {}: writes fail until it reopens: {}", dir_, st.ToString());
  failure_ = st;
  retry_at_ = std::chrono::steady_clock::now() + kRetryAfter;
  failed_.store(true, std::memory_order_release);
}

Status SparseTier::Room(uint64_t bytes) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  const uint64_t since = written_since_check_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const uint64_t known = free_known_.load(std::memory_order_relaxed);
  if (now >= check_after_.load(std::memory_order_relaxed) || since + kReserve > known) {
    struct statvfs fs;
    // Unknown free space (statvfs fails) lets the write go.
    const uint64_t free = statvfs(dir_.c_str(), &fs) == 0
                              ? static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize
                              : ~uint64_t{0};
    free_known_.store(free, std::memory_order_relaxed);
    written_since_check_.store(0, std::memory_order_relaxed);
    const auto next = std::chrono::steady_clock::now() + kRecheckEvery;
    check_after_.store(next.time_since_epoch().count(), std::memory_order_relaxed);
    if (free < kReserve + bytes) {
      return Status::NoSpace("sparse tier " + dir_ + ": " + std::to_string(free >> 20) +
                             " MiB free, and it keeps " + std::to_string(kReserve >> 20) +
                             " MiB free for its log, flushes and compactions (No space left on "
                             "device)");
    }
  }
  return Status::OK();
}

Status SparseTier::Write(rocksdb::WriteBatch* batch, bool sync, const std::string& what) {
  FLATKV_RETURN_IF_ERROR(BeforeWrite());
  // RocksDB (Debian's 7.8, built with assertions) aborts the process on
  // some paths after a write fails for a full disk: it is not let near one.
  FLATKV_RETURN_IF_ERROR(Room(batch->GetDataSize()));
  // Failure and NoteFailed take fail_mu_, which BeforeWrite holds while it
  // waits for db_mu_: neither runs under db_mu_.
  Status st;
  bool open = false;
  {
    std::shared_lock<std::shared_mutex> lock(db_mu_);
    if (failed_.load(std::memory_order_acquire)) {
      open = false;
    } else if (db_ != nullptr) {
      open = true;
      rocksdb::WriteOptions wo;
      wo.sync = sync;
      st = FromRocks(db_->Write(wo, batch), "sparse tier " + dir_ + ": " + what);
    }
  }
  if (!open) return Failure();
  if (!st.ok()) NoteFailed(st);
  return st;
}

Status SparseTier::Put(int64_t key, std::string_view value) {
  char k[8];
  EncodeKey(key, k);
  rocksdb::WriteBatch batch;
  batch.Put(rocksdb::Slice(k, 8), rocksdb::Slice(value.data(), value.size()));
  return Write(&batch, sync_always_, "put " + std::to_string(key));
}

Status SparseTier::PutBatch(const std::vector<KeyValueRef>& pairs,
                            const std::vector<uint32_t>& items) {
  rocksdb::WriteBatch batch;
  for (uint32_t i : items) {
    char k[8];
    EncodeKey(pairs[i].key, k);
    batch.Put(rocksdb::Slice(k, 8), rocksdb::Slice(pairs[i].value.data(), pairs[i].value.size()));
  }
  return Write(&batch, sync_always_, "batch put");
}

Status SparseTier::Get(int64_t key, std::string* value) const {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) {
    lock.unlock();
    return Failure();
  }
  char k[8];
  EncodeKey(key, k);
  std::string got;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  const rocksdb::Status s = db_->Get(ro, rocksdb::Slice(k, 8), &got);
  if (s.IsNotFound()) return Status::NotFound("key " + std::to_string(key));
  FLATKV_RETURN_IF_ERROR(FromRocks(s, "sparse tier " + dir_ + ": get " + std::to_string(key)));
  *value = std::move(got);
  return Status::OK();
}

Status SparseTier::Delete(int64_t key) {
  char k[8];
  EncodeKey(key, k);
  rocksdb::WriteBatch batch;
  batch.Delete(rocksdb::Slice(k, 8));
  return Write(&batch, sync_always_, "remove " + std::to_string(key));
}

Status SparseTier::DeleteRange(int64_t lo, int64_t hi) {
  char begin[8];
  EncodeKey(lo, begin);
  rocksdb::WriteBatch batch;
  if (hi == std::numeric_limits<int64_t>::max()) {
    // No key follows hi: end the range past every 8-byte key.
    const char end[9] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff'};
    batch.DeleteRange(rocksdb::Slice(begin, 8), rocksdb::Slice(end, 9));
  } else {
    char end[8];
    EncodeKey(hi + 1, end);
    batch.DeleteRange(rocksdb::Slice(begin, 8), rocksdb::Slice(end, 8));
  }
  return Write(&batch, true,
               "removing [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

Status SparseTier::Collect(int64_t from, int64_t stop, bool reverse, size_t limit,
                           std::vector<KeyValue>* out, bool* more) const {
  *more = false;
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) {
    lock.unlock();
    return Failure();
  }
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  char k[8];
  EncodeKey(from, k);
  size_t taken = 0;
  if (!reverse) {
    for (it->Seek(rocksdb::Slice(k, 8)); it->Valid(); it->Next()) {
      const int64_t key = DecodeKey(it->key());
      if (key > stop) break;
      if (taken == limit) {
        *more = true;
        break;
      }
      out->push_back(KeyValue{key, it->value().ToString()});
      ++taken;
    }
  } else {
    for (it->SeekForPrev(rocksdb::Slice(k, 8)); it->Valid(); it->Prev()) {
      const int64_t key = DecodeKey(it->key());
      if (key < stop) break;
      if (taken == limit) {
        *more = true;
        break;
      }
      out->push_back(KeyValue{key, it->value().ToString()});
      ++taken;
    }
  }
  return FromRocks(it->status(), "sparse tier " + dir_ + ": scan");
}

Status SparseTier::Count(int64_t lo, int64_t hi, uint64_t cap, uint64_t* n) const {
  *n = 0;
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) {
    lock.unlock();
    return Failure();
  }
  rocksdb::ReadOptions ro;
  char k[8];
  EncodeKey(lo, k);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  for (it->Seek(rocksdb::Slice(k, 8)); it->Valid() && *n < cap; it->Next()) {
    if (DecodeKey(it->key()) > hi) break;
    ++*n;
  }
  return FromRocks(it->status(), "sparse tier " + dir_ + ": count");
}

Status SparseTier::Sync() {
  Status st;
  {
    std::shared_lock<std::shared_mutex> lock(db_mu_);
    if (closed_ || db_ == nullptr) return Status::OK();
    if (!failed_.load(std::memory_order_acquire)) {
      st = FromRocks(db_->SyncWAL(), "sparse tier " + dir_ + ": sync");
    }
  }
  if (st.ok() && failed_.load(std::memory_order_acquire)) return Failure();
  if (!st.ok()) NoteFailed(st);
  return st;
}

Status SparseTier::Failure() const {
  std::lock_guard<std::mutex> fail(fail_mu_);
  return failure_.ok() ? Status::IOError("sparse tier " + dir_ + " is not open") : failure_;
}

uint64_t SparseTier::LiveBytes() const {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return 0;
  uint64_t live = 0;
  uint64_t mem = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kEstimateLiveDataSize, &live);
  db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &mem);
  return live + mem;
}

uint64_t SparseTier::LiveBytes(int64_t lo, int64_t hi) const {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return 0;
  char begin[8];
  char end[8];
  EncodeKey(lo, begin);
  EncodeKey(hi == std::numeric_limits<int64_t>::max() ? hi : hi + 1, end);
  rocksdb::Range range(rocksdb::Slice(begin, 8), rocksdb::Slice(end, 8));
  uint64_t size = 0;
  rocksdb::SizeApproximationOptions sa;
  sa.include_memtables = true;
  sa.include_files = true;
  if (!db_->GetApproximateSizes(sa, db_->DefaultColumnFamily(), &range, 1, &size).ok()) return 0;
  return size;
}

uint64_t SparseTier::KeysEstimate() const {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return 0;
  uint64_t keys = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kEstimateNumKeys, &keys);
  return keys;
}

Status SparseTier::Compact() {
  if (failed_.load(std::memory_order_acquire)) return Failure();
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) {
    lock.unlock();
    return Failure();
  }
  rocksdb::CompactRangeOptions co;
  return FromRocks(db_->CompactRange(co, nullptr, nullptr), "sparse tier " + dir_ + ": compact");
}

Status SparseTier::Close() {
  std::unique_lock<std::shared_mutex> lock(db_mu_);
  if (closed_ || db_ == nullptr) return Status::OK();
  closed_ = true;
  // After a failed write the log is not synced again (see BeforeWrite).
  Status st = failed_.load() ? Status::OK()
                             : FromRocks(db_->SyncWAL(), "sparse tier " + dir_ + ": sync");
  const rocksdb::Status s = db_->Close();
  if (st.ok()) st = FromRocks(s, "closing sparse tier " + dir_);
  db_.reset();
  return st;
}

}  // namespace flatkv::engine
