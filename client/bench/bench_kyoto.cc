// The Kyoto Cabinet adapter: a HashDB file (the engine Kyoto's docs point
// users to for random access) with its bucket array sized to the record count
// before open, as Kyoto's docs ask; everything else at its default.
//
// Kyoto reports errors through db.error(), which is per thread, so each call
// reads it right after the failing operation on the same thread.
#include <algorithm>
#include <memory>
#include <string>

#include <kchashdb.h>

#include "client/bench/bench_engine.h"

namespace flatkv::client {
namespace {

// Kyoto's docs suggest 50%..400% of the record count: two buckets a
// record, as flat's sparse tier gets two slots a key (bench_flat.cc); below
// 512k records the default (about 1M) is already enough.
constexpr int64_t kMinBuckets = int64_t{1} << 20;

class KyotoBenchEngine : public BenchEngine {
 public:
  ~KyotoBenchEngine() override {
    if (open_) db_->close();
  }

  const char* name() const override { return "kyotocabinet"; }

  Status Open(const BenchEngineOptions& options) override {
    // tune_* must precede open; a fresh object per Open (reopen included)
    // also keeps no error or tuning state from the previous one.
    db_ = std::make_unique<kyotocabinet::HashDB>();
    int64_t buckets = std::max<int64_t>(2 * static_cast<int64_t>(options.num), kMinBuckets);
    if (!db_->tune_buckets(buckets)) return Error("tune_buckets");
    uint32_t mode = kyotocabinet::HashDB::OWRITER | kyotocabinet::HashDB::OCREATE;
    if (options.sync) mode |= kyotocabinet::HashDB::OAUTOSYNC;
    if (!db_->open(options.dir + "/bench.kch", mode)) return Error("open");
    open_ = true;
    max_value_ = std::max<size_t>(options.value_size, 1);
    return Status::OK();
  }

  Status Put(int64_t key, std::string_view value) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return PutBytes(std::string_view(k, sizeof(k)), value);
  }

  Status Get(int64_t key, std::string* value) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return GetBytes(std::string_view(k, sizeof(k)), value);
  }

  Status Delete(int64_t key) override {
    char k[8];
    EncodeBigEndianKey(key, k);
    return DeleteBytes(std::string_view(k, sizeof(k)));
  }

  Status SPut(std::string_view key, std::string_view value) override {
    return PutBytes(key, value);
  }

  Status SGet(std::string_view key, std::string* value) override { return GetBytes(key, value); }

  Status SDelete(std::string_view key) override { return DeleteBytes(key); }

  Status Close() override {
    if (!open_) return Status::IOError("kyotocabinet: not open");
    open_ = false;
    if (!db_->close()) return Error("close");
    return Status::OK();
  }

 private:
  Status PutBytes(std::string_view key, std::string_view value) {
    if (db_->set(key.data(), key.size(), value.data(), value.size())) return Status::OK();
    return Error("set");
  }

  Status GetBytes(std::string_view key, std::string* value) {
    // The buffer form copies into memory we own; the convenient forms
    // allocate a fresh buffer on every call.
    if (value->size() < max_value_) value->resize(max_value_);
    int32_t n = db_->get(key.data(), key.size(), value->data(), value->size());
    if (n < 0) {
      if (db_->error().code() == kyotocabinet::BasicDB::Error::NOREC) {
        return Status::NotFound("kyotocabinet");
      }
      return Error("get");
    }
    if (static_cast<size_t>(n) > value->size()) {
      // Larger than expected: fetch it whole rather than truncating.
      if (!db_->get(std::string(key), value)) return Error("get");
      return Status::OK();
    }
    value->resize(n);
    return Status::OK();
  }

  Status DeleteBytes(std::string_view key) {
    if (db_->remove(key.data(), key.size())) return Status::OK();
    if (db_->error().code() == kyotocabinet::BasicDB::Error::NOREC) return Status::OK();
    return Error("remove");
  }

  Status Error(const char* op) const {
    kyotocabinet::BasicDB::Error e = db_->error();
    std::string msg = std::string("kyotocabinet ") + op + ": " + e.name() + ": " + e.message();
    if (e.code() == kyotocabinet::BasicDB::Error::BROKEN) return Status::Corruption(msg);
    return Status::IOError(msg);
  }

  std::unique_ptr<kyotocabinet::HashDB> db_;
  bool open_ = false;
  size_t max_value_ = 1;
};

}  // namespace

std::unique_ptr<BenchEngine> NewKyotoBenchEngine() {
  return std::make_unique<KyotoBenchEngine>();
}

}  // namespace flatkv::client
