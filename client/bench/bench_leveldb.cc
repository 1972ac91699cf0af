// The LevelDB adapter: defaults (Snappy on Debian) plus create_if_missing and
// a 64 MiB LRU block cache.
#include <memory>
#include <string>

#include <leveldb/cache.h>
#include <leveldb/db.h>
#include <leveldb/options.h>

#include "client/bench/bench_engine.h"

namespace flatkv::client {
namespace {

constexpr size_t kBlockCacheBytes = size_t{64} << 20;

Status FromLevel(const leveldb::Status& s) {
  if (s.ok()) return Status::OK();
  if (s.IsNotFound()) return Status::NotFound("leveldb");
  if (s.IsCorruption()) return Status::Corruption("leveldb: " + s.ToString());
  return Status::IOError("leveldb: " + s.ToString());
}

class LevelDbBenchEngine : public BenchEngine {
 public:
  // The cache must outlive the DB that points at it: members are destroyed
  // in reverse order, so db_ (declared last) goes first.
  ~LevelDbBenchEngine() override { db_.reset(); }

  const char* name() const override { return "leveldb"; }

  Status Open(const BenchEngineOptions& options) override {
    if (cache_ == nullptr) cache_.reset(leveldb::NewLRUCache(kBlockCacheBytes));
    leveldb::Options lo;
    lo.create_if_missing = true;
    lo.block_cache = cache_.get();
    write_options_.sync = options.sync;
    leveldb::DB* db = nullptr;
    Status s = FromLevel(leveldb::DB::Open(lo, options.dir, &db));
    if (s.ok()) db_.reset(db);
    return s;
  }

  Status Put(int64_t key, std::string_view value) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return PutBytes(leveldb::Slice(k, sizeof(k)), value);
  }

  Status Get(int64_t key, std::string* value) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return GetBytes(leveldb::Slice(k, sizeof(k)), value);
  }

  Status Delete(int64_t key) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return DeleteBytes(leveldb::Slice(k, sizeof(k)));
  }

  Status SPut(std::string_view key, std::string_view value) override {
    return PutBytes(leveldb::Slice(key.data(), key.size()), value);
  }

  Status SGet(std::string_view key, std::string* value) override {
    return GetBytes(leveldb::Slice(key.data(), key.size()), value);
  }

  Status SDelete(std::string_view key) override {
    return DeleteBytes(leveldb::Slice(key.data(), key.size()));
  }

  Status Close() override {
    if (db_ == nullptr) return Status::IOError("leveldb: not open");
    // LevelDB has no Close(): deleting the DB waits for background
    // compaction and closes its files.
    db_.reset();
    return Status::OK();
  }

 private:
  Status PutBytes(const leveldb::Slice& key, std::string_view value) {
    return FromLevel(db_->Put(write_options_, key, leveldb::Slice(value.data(), value.size())));
  }

  Status GetBytes(const leveldb::Slice& key, std::string* value) {
    return FromLevel(db_->Get(read_options_, key, value));
  }

  Status DeleteBytes(const leveldb::Slice& key) {
    return FromLevel(db_->Delete(write_options_, key));
  }

  std::unique_ptr<leveldb::Cache> cache_;
  leveldb::WriteOptions write_options_;
  leveldb::ReadOptions read_options_;
  std::unique_ptr<leveldb::DB> db_;
};

}  // namespace

std::unique_ptr<BenchEngine> NewLevelDbBenchEngine() {
  return std::make_unique<LevelDbBenchEngine>();
}

}  // namespace flatkv::client
