// The RocksDB adapter: defaults as a RocksDB user gets them, plus
// create_if_missing and a 64 MiB LRU block cache (the same cache LevelDB
// gets, so the two LSMs are compared on equal memory).
#include <memory>
#include <string>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>

#include "client/bench/bench_engine.h"

namespace flatkv::client {
namespace {

constexpr size_t kBlockCacheBytes = size_t{64} << 20;

Status FromRocks(const rocksdb::Status& s) {
  if (s.ok()) return Status::OK();
  if (s.IsNotFound()) return Status::NotFound("rocksdb");
  if (s.IsCorruption()) return Status::Corruption("rocksdb: " + s.ToString());
  if (s.IsNoSpace()) return Status::NoSpace("rocksdb: " + s.ToString());
  if (s.IsBusy() || s.IsTryAgain()) return Status::Busy("rocksdb: " + s.ToString());
  return Status::IOError("rocksdb: " + s.ToString());
}

class RocksDbBenchEngine : public BenchEngine {
 public:
  const char* name() const override { return "rocksdb"; }

  Status Open(const BenchEngineOptions& options) override {
    rocksdb::Options ro;
    ro.create_if_missing = true;
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = rocksdb::NewLRUCache(kBlockCacheBytes);
    ro.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    write_options_.sync = options.sync;
    rocksdb::DB* db = nullptr;
    Status s = FromRocks(rocksdb::DB::Open(ro, options.dir, &db));
    if (s.ok()) db_.reset(db);
    return s;
  }

  Status Put(int64_t key, std::string_view value) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return PutBytes(rocksdb::Slice(k, sizeof(k)), value);
  }

  Status Get(int64_t key, std::string* value) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return GetBytes(rocksdb::Slice(k, sizeof(k)), value);
  }

  Status Delete(int64_t key) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return DeleteBytes(rocksdb::Slice(k, sizeof(k)));
  }

  Status SPut(std::string_view key, std::string_view value) override {
    return PutBytes(rocksdb::Slice(key.data(), key.size()), value);
  }

  Status SGet(std::string_view key, std::string* value) override {
    return GetBytes(rocksdb::Slice(key.data(), key.size()), value);
  }

  Status SDelete(std::string_view key) override {
    return DeleteBytes(rocksdb::Slice(key.data(), key.size()));
  }

  Status Close() override {
    if (db_ == nullptr) return Status::IOError("rocksdb: not open");
    // DB::Close reports errors the destructor would swallow.
    Status s = FromRocks(db_->Close());
    db_.reset();
    return s;
  }

 private:
  Status PutBytes(const rocksdb::Slice& key, std::string_view value) {
    return FromRocks(db_->Put(write_options_, key, rocksdb::Slice(value.data(), value.size())));
  }

  Status GetBytes(const rocksdb::Slice& key, std::string* value) {
    // The std::string overload assigns into *value, reusing its capacity.
    return FromRocks(db_->Get(read_options_, key, value));
  }

  Status DeleteBytes(const rocksdb::Slice& key) {
    return FromRocks(db_->Delete(write_options_, key));
  }

  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;
};

}  // namespace

std::unique_ptr<BenchEngine> NewRocksDbBenchEngine() {
  return std::make_unique<RocksDbBenchEngine>();
}

}  // namespace flatkv::client
