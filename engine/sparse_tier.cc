#include "engine/sparse_tier.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <cstring>
#include <limits>

#include "engine/store.h"

namespace flatkv::engine {
namespace {

constexpr uint64_t kSignBit = uint64_t{1} << 63;

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
  rocksdb::Options ro;
  ro.create_if_missing = true;
  ro.paranoid_checks = true;
  ro.max_open_files = max_open_files;
  ro.IncreaseParallelism(2);
  rocksdb::BlockBasedTableOptions table;
  // The block cache is the peers' size in flatkv-bench (64 MiB). Ten bits
  // a key: a get of an absent key reads a block in about 1 % of
  // cases; index and filter blocks stay in memory, so a present key costs
  // one block read.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(size_t{64} << 20);
  ro.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Values are stored as given, as in the flat tables: a read that misses
  // the block cache costs a page-cache copy, not a decompression.
  ro.compression = rocksdb::kNoCompression;
  rocksdb::DB* db = nullptr;
  FLATKV_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(ro, dir, &db), "opening " + dir));
  std::unique_ptr<SparseTier> tier(new SparseTier());
  tier->db_.reset(db);
  tier->dir_ = dir;
  tier->sync_always_ = options.sync == SyncMode::kAlways;
  *result = std::move(tier);
  return Status::OK();
}

SparseTier::~SparseTier() { (void)Close(); }

Status SparseTier::NoteWrite(Status st) {
  if (st.IsNoSpace()) {
    // RocksDB stops taking writes after a failed one on a full disk; resume
    // now so the next write finds it writable again once there is room.
    (void)db_->Resume();
  }
  return st;
}

Status SparseTier::Put(int64_t key, std::string_view value) {
  char k[8];
  EncodeKey(key, k);
  rocksdb::WriteOptions wo;
  wo.sync = sync_always_;
  return NoteWrite(FromRocks(
      db_->Put(wo, rocksdb::Slice(k, 8), rocksdb::Slice(value.data(), value.size())),
      "sparse tier " + dir_ + ": put " + std::to_string(key)));
}

Status SparseTier::PutBatch(const std::vector<KeyValueRef>& pairs,
                            const std::vector<uint32_t>& items) {
  rocksdb::WriteBatch batch;
  for (uint32_t i : items) {
    char k[8];
    EncodeKey(pairs[i].key, k);
    batch.Put(rocksdb::Slice(k, 8), rocksdb::Slice(pairs[i].value.data(), pairs[i].value.size()));
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync_always_;
  return NoteWrite(FromRocks(db_->Write(wo, &batch), "sparse tier " + dir_ + ": batch put"));
}

Status SparseTier::Get(int64_t key, std::string* value) const {
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
  rocksdb::WriteOptions wo;
  wo.sync = sync_always_;
  return NoteWrite(FromRocks(db_->Delete(wo, rocksdb::Slice(k, 8)),
                             "sparse tier " + dir_ + ": remove " + std::to_string(key)));
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
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return NoteWrite(FromRocks(db_->Write(wo, &batch), "sparse tier " + dir_ + ": removing [" +
                                                         std::to_string(lo) + ", " +
                                                         std::to_string(hi) + "]"));
}

Status SparseTier::Collect(int64_t from, int64_t stop, bool reverse, size_t limit,
                           std::vector<KeyValue>* out, bool* more) const {
  *more = false;
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
  if (closed_) return Status::OK();
  return FromRocks(db_->SyncWAL(), "sparse tier " + dir_ + ": sync");
}

uint64_t SparseTier::LiveBytes() const {
  uint64_t live = 0;
  uint64_t mem = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kEstimateLiveDataSize, &live);
  db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &mem);
  return live + mem;
}

uint64_t SparseTier::LiveBytes(int64_t lo, int64_t hi) const {
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
  uint64_t keys = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kEstimateNumKeys, &keys);
  return keys;
}

Status SparseTier::Compact() {
  rocksdb::CompactRangeOptions co;
  return FromRocks(db_->CompactRange(co, nullptr, nullptr), "sparse tier " + dir_ + ": compact");
}

Status SparseTier::Close() {
  if (closed_ || db_ == nullptr) return Status::OK();
  closed_ = true;
  Status st = FromRocks(db_->SyncWAL(), "sparse tier " + dir_ + ": sync");
  const rocksdb::Status s = db_->Close();
  if (st.ok()) st = FromRocks(s, "closing sparse tier " + dir_);
  db_.reset();
  return st;
}

}  // namespace flatkv::engine
