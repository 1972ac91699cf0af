// The flat adapter: FlatKV's own engine::Store, opened with the options a
// user of flatkv-server would get from `storage.*` (defaults, plus sync and
// the layout knobs the bench exposes). String keys go through the store's
// string-key API; string_slots is set by the bench (see bench.cc).
//
// Automatic compaction runs at its default garbage ratio, as for a user,
// except in runs that measure compaction itself (compact,
// readwhilecompacting), which call Store::CompactAndWait paced by
// compaction_mb_per_sec (--compaction-mb-per-sec, default 0 = unlimited).
//
// With --cache lru|arc, Put/Get/Delete of integer and string keys go
// through an engine::cache::WriteBackCache opened over the Store (in the
// --write-mode given), as they do in flatkv-server. Close() closes the
// cache first (which flushes whatever is dirty), then the Store.
#include <memory>

#include <spdlog/spdlog.h>

#include "client/bench/bench_engine.h"
#include "engine/cache/write_back.h"
#include "engine/options.h"
#include "engine/store.h"

namespace flatkv::client {
namespace {

class FlatBenchEngine : public BenchEngine {
 public:
  const char* name() const override { return "flat"; }

  Status Open(const BenchEngineOptions& options) override {
    engine::EngineOptions eo;
    eo.path = options.dir;
    eo.sync = options.sync ? engine::SyncMode::kAlways : engine::SyncMode::kNone;
    if (options.index_item_bytes > 0) eo.index_item_bytes = options.index_item_bytes;
    if (options.data_files > 0) eo.data_files = options.data_files;
    if (options.string_slots > 0) eo.string_slots = options.string_slots;
    if (!options.auto_compaction) eo.compaction_garbage_ratio = 0;
    eo.compaction_mb_per_sec = options.compaction_mb_per_sec;
    if (options.compaction_disk_ratio >= 0) eo.compaction_disk_ratio = options.compaction_disk_ratio;
    eo.compaction_in_place = options.compaction_in_place;
    eo.sparse_tier = options.sparse_tier;
    // The tier's hashed table at two slots a key or more, as Kyoto
    // Cabinet's buckets are (bench_kyoto.cc): at one a key, over a third of
    // a fill's puts land on a taken slot and rewrite its bucket, whose old
    // copy the tier then compacts away; at two, a fifth.
    if (options.sparse_tier) {
      eo.sparse_slots = 1024;
      while (eo.sparse_slots < 2 * options.num) eo.sparse_slots <<= 1;
    }
    eo.key_min = options.key_min;
    eo.key_max = options.key_max;
    FLATKV_RETURN_IF_ERROR(engine::Store::Open(eo, &store_));
    if (options.cache_policy.empty()) return Status::OK();
    engine::cache::CacheOptions co;
    co.policy = options.cache_policy;
    co.capacity_bytes = options.cache_bytes;
    co.mode = options.write_async ? engine::cache::WriteMode::kAsync
                                  : engine::cache::WriteMode::kSafe;
    co.flush_interval_ms = options.flush_interval_ms;
    Status s = engine::cache::WriteBackCache::Open(store_.get(), co, &cache_);
    if (!s.ok()) {
      static_cast<void>(store_->Close());  // the cache error is the one to report
      store_.reset();
      return s.WithContext("cache");
    }
    return Status::OK();
  }

  Status Put(int64_t key, std::string_view value) override {
    return cache_ ? cache_->Put(key, value) : store_->Put(key, value);
  }

  Status Get(int64_t key, std::string* value) override {
    return cache_ ? cache_->Get(key, value) : store_->Get(key, value);
  }

  Status Delete(int64_t key) override {
    return cache_ ? cache_->Remove(key, nullptr) : store_->Remove(key, nullptr);
  }

  Status SPut(std::string_view key, std::string_view value) override {
    return cache_ ? cache_->SPut(key, value) : store_->SPut(key, value);
  }

  Status SGet(std::string_view key, std::string* value) override {
    return cache_ ? cache_->SGet(key, value) : store_->SGet(key, value);
  }

  Status SDelete(std::string_view key) override {
    return cache_ ? cache_->SRemove(key, nullptr) : store_->SRemove(key, nullptr);
  }

  Status Close() override {
    if (store_ == nullptr) return Status::IOError("flat: not open");
    Status cs;
    if (cache_) {
      cs = cache_->Close();  // flushes every dirty entry into the Store
      cache_.reset();
    }
    const engine::EngineStats es = store_->GetStats();
    spdlog::debug("flat: {} writes waited for the compactor, {:.1f} ms in all", es.write_stalls,
                  es.write_stall_us / 1000.0);
    Status s = store_->Close();
    store_.reset();
    return cs.ok() ? s : cs.WithContext("cache close");
  }

  bool CacheWritesBack() const override {
    return cache_ && cache_->mode() == engine::cache::WriteMode::kAsync;
  }

  Status FlushCache() override { return cache_ ? cache_->Flush() : Status::OK(); }

  bool GetCacheStats(BenchCacheStats* stats) const override {
    if (!cache_) return false;
    engine::cache::CacheStats cs = cache_->stats();
    stats->hits = cs.hits;
    stats->misses = cs.misses;
    stats->flushes = cs.flushes;
    stats->coalesced = cs.coalesced;
    return true;
  }

  bool GetEngineCounters(BenchEngineCounters* counters) const override {
    const engine::EngineStats es = store_->GetStats();
    counters->segments = es.segments;
    counters->write_stalls = es.write_stalls;
    counters->write_stall_us = es.write_stall_us;
    return true;
  }

  bool SupportsCompaction() const override { return true; }

  Status CompactAndWait() override { return store_->CompactAndWait(); }

  Status GetCompactionStatus(BenchCompactionStatus* status) const override {
    engine::CompactionStatus cs = store_->GetCompactionStatus();
    status->running = cs.running;
    status->bytes_done = cs.bytes_done;
    status->bytes_total = cs.bytes_total;
    status->tables_compacted = cs.tables_compacted;
    status->bytes_reclaimed = cs.bytes_reclaimed;
    status->last_error = cs.last_error;
    return Status::OK();
  }

 private:
  std::unique_ptr<engine::Store> store_;
  std::unique_ptr<engine::cache::WriteBackCache> cache_;  // null without --cache
};

}  // namespace

std::unique_ptr<BenchEngine> NewFlatBenchEngine() {
  return std::make_unique<FlatBenchEngine>();
}

}  // namespace flatkv::client
