// The write-back cache: safe and async write modes, coalescing, switching
// modes at run time, bounded dirty bytes, eviction that never drops a dirty
// entry, and many threads racing with mode switches.
#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "engine/cache/write_back.h"
#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineOptions;
using flatkv::engine::Store;
using flatkv::engine::cache::CacheOptions;
using flatkv::engine::cache::WriteBackCache;
using flatkv::engine::cache::WriteMode;

namespace {

struct Fixture {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  std::unique_ptr<WriteBackCache> cache;

  explicit Fixture(CacheOptions co) {
    EngineOptions o;
    o.path = dir / "s";
    o.checkpoint_interval_ms = 0;
    REQUIRE(Store::Open(o, &store).ok());
    REQUIRE(WriteBackCache::Open(store.get(), co, &cache).ok());
  }
};

CacheOptions Options(WriteMode mode, const std::string& policy = "arc") {
  CacheOptions co;
  co.policy = policy;
  co.mode = mode;
  co.capacity_bytes = 1 << 20;
  co.flush_interval_ms = 3600 * 1000;  // flush only when a test asks
  return co;
}

// "prefix" followed by n, built without operator+ (GCC 12 warns falsely on it).
std::string Tag(const char* prefix, int64_t n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

std::string StoreValue(Store* store, int64_t key) {
  std::string v;
  Status st = store->Get(key, &v);
  return st.ok() ? v : "<absent>";
}

}  // namespace

TEST_CASE("Safe mode writes reach the store before they return", "[engine][cache]") {
  Fixture f(Options(WriteMode::kSafe, GENERATE("lru", "arc")));
  REQUIRE(f.cache->Put(1, "one").ok());
  REQUIRE(StoreValue(f.store.get(), 1) == "one");
  REQUIRE(f.cache->Append(1, "+more").ok());
  REQUIRE(StoreValue(f.store.get(), 1) == "one+more");
  std::string v;
  REQUIRE(f.cache->Get(1, &v).ok());
  REQUIRE(v == "one+more");
  bool existed = false;
  REQUIRE(f.cache->Remove(1, &existed).ok());
  REQUIRE(existed);
  REQUIRE(StoreValue(f.store.get(), 1) == "<absent>");
  REQUIRE(f.cache->Get(1, &v).IsNotFound());
  REQUIRE(f.cache->stats().dirty_entries == 0);
}

TEST_CASE("Async mode acknowledges from the cache and coalesces repeated updates",
          "[engine][cache]") {
  Fixture f(Options(WriteMode::kAsync));
  for (int i = 0; i < 100; ++i) REQUIRE(f.cache->Put(7, Tag("v", i)).ok());
  REQUIRE(f.cache->Append(7, "+a").ok());
  REQUIRE(f.cache->Put(8, "eight").ok());
  bool existed = true;
  REQUIRE(f.cache->Remove(9, &existed).ok());
  REQUIRE_FALSE(existed);
  std::string v;
  REQUIRE(f.cache->Get(7, &v).ok());
  REQUIRE(v == "v99+a");
  REQUIRE(StoreValue(f.store.get(), 7) == "<absent>");  // not written yet
  REQUIRE(f.cache->stats().coalesced >= 100);
  REQUIRE(f.cache->Flush().ok());
  REQUIRE(StoreValue(f.store.get(), 7) == "v99+a");
  REQUIRE(StoreValue(f.store.get(), 8) == "eight");
  REQUIRE(f.cache->stats().flushes <= 3);  // 102 updates, one write per key
  REQUIRE(f.cache->Remove(8, &existed).ok());
  REQUIRE(existed);
  REQUIRE(f.cache->Get(8, &v).IsNotFound());
  REQUIRE(f.cache->Close().ok());  // a clean close writes what is dirty
  REQUIRE(StoreValue(f.store.get(), 8) == "<absent>");
}

TEST_CASE("Flusher threads write dirty entries within the flush interval", "[engine][cache]") {
  CacheOptions co = Options(WriteMode::kAsync);
  co.flush_interval_ms = 20;
  Fixture f(co);
  REQUIRE(f.cache->Put(1, "x").ok());
  for (int i = 0; i < 100 && StoreValue(f.store.get(), 1) != "x"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(StoreValue(f.store.get(), 1) == "x");
  REQUIRE(f.cache->stats().dirty_entries == 0);
}

TEST_CASE("Switching async to safe returns once everything dirty is in the store",
          "[engine][cache]") {
  Fixture f(Options(WriteMode::kAsync));
  for (int64_t k = 0; k < 1000; ++k) REQUIRE(f.cache->Put(k, std::to_string(k)).ok());
  REQUIRE(f.cache->stats().dirty_entries == 1000);
  REQUIRE(f.cache->SetMode(WriteMode::kSafe).ok());
  REQUIRE(f.cache->stats().dirty_entries == 0);
  for (int64_t k = 0; k < 1000; ++k) REQUIRE(StoreValue(f.store.get(), k) == std::to_string(k));
  REQUIRE(f.cache->SetMode(WriteMode::kAsync).ok());  // and back, at once
  REQUIRE(f.cache->Put(5, "dirty again").ok());
  REQUIRE(StoreValue(f.store.get(), 5) == "5");
}

TEST_CASE("Dirty bytes stay bounded: writers wait for the flushers", "[engine][cache]") {
  CacheOptions co = Options(WriteMode::kAsync);
  co.flush_interval_ms = 5;
  co.max_dirty_bytes = 20 * 1024;
  Fixture f(co);
  const std::string value(1000, 'v');
  for (int64_t k = 0; k < 2000; ++k) {
    REQUIRE(f.cache->Put(k, value).ok());
    REQUIRE(f.cache->stats().dirty_bytes <= co.max_dirty_bytes + 2 * (value.size() + 64));
  }
  REQUIRE(f.cache->stats().writer_waits > 0);
  REQUIRE(f.cache->Flush().ok());
  for (int64_t k = 0; k < 2000; k += 97) REQUIRE(StoreValue(f.store.get(), k) == value);
}

TEST_CASE("Eviction never drops a dirty entry", "[engine][cache]") {
  CacheOptions co = Options(WriteMode::kAsync, GENERATE("lru", "arc"));
  co.capacity_bytes = 4096;  // a few clean entries at most
  Fixture f(co);
  for (int64_t k = 0; k < 500; ++k) REQUIRE(f.cache->Put(k, std::string(100, 'a')).ok());
  std::string v;
  for (int64_t k = 0; k < 500; ++k) {
    REQUIRE(f.cache->Get(k, &v).ok());
    REQUIRE(v == std::string(100, 'a'));
  }
  REQUIRE(f.cache->Close().ok());
  for (int64_t k = 0; k < 500; ++k) REQUIRE(StoreValue(f.store.get(), k) == std::string(100, 'a'));
}

TEST_CASE("Threads racing with mode switches leave the store with every newest value",
          "[engine][cache][concurrency]") {
  CacheOptions co = Options(WriteMode::kAsync);
  co.flush_interval_ms = 2;
  co.capacity_bytes = 64 * 1024;
  co.max_dirty_bytes = 64 * 1024;
  Fixture f(co);
  constexpr int kWriters = 3;
  constexpr int64_t kKeysPerWriter = 200;
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::map<int64_t, std::string>> models(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      auto& model = models[w];
      for (int i = 0; i < 20000; ++i) {
        const int64_t k = w * kKeysPerWriter + static_cast<int64_t>(rng() % kKeysPerWriter);
        const int op = static_cast<int>(rng() % 10);
        std::string v;
        if (op < 5) {
          v = Tag("w", w);
          v += Tag("-", i);
          if (!f.cache->Put(k, v).ok()) bad++;
          model[k] = v;
        } else if (op < 7) {
          if (!f.cache->Remove(k).ok()) bad++;
          model.erase(k);
        } else if (op < 8) {
          if (!f.cache->Append(k, "+").ok()) bad++;
          model[k] += "+";
        } else {
          Status st = f.cache->Get(k, &v);  // read-your-writes, whatever the mode
          auto it = model.find(k);
          if (st.ok() != (it != model.end()) || (st.ok() && v != it->second)) bad++;
        }
      }
    });
  }
  threads.emplace_back([&] {
    std::mt19937_64 rng(99);
    while (!stop.load()) {
      if (!f.cache->SetMode(rng() % 2 ? WriteMode::kAsync : WriteMode::kSafe).ok()) bad++;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  stop.store(true);
  threads.back().join();
  REQUIRE(bad.load() == 0);
  REQUIRE(f.cache->Close().ok());
  f.cache.reset();
  // The store alone (no cache) holds exactly each key's newest value.
  for (int w = 0; w < kWriters; ++w) {
    for (int64_t k = w * kKeysPerWriter; k < (w + 1) * kKeysPerWriter; ++k) {
      auto it = models[w].find(k);
      INFO("key " << k);
      REQUIRE(StoreValue(f.store.get(), k) == (it == models[w].end() ? "<absent>" : it->second));
    }
  }
}

TEST_CASE("PutBatch in safe mode reaches the store and updates cached keys", "[engine][cache][batch]") {
  Fixture f(Options(WriteMode::kSafe));
  REQUIRE(f.cache->Put(1, "old").ok());
  std::string v;
  REQUIRE(f.cache->Get(1, &v).ok());  // now cached
  std::vector<flatkv::engine::KeyValueRef> batch;
  std::vector<std::string> values;
  for (int64_t k = 0; k < 300; ++k) values.push_back(Tag("batch", k));
  for (int64_t k = 0; k < 300; ++k) batch.push_back({k, values[k]});
  REQUIRE(f.cache->PutBatch(batch).ok());
  for (int64_t k = 0; k < 300; ++k) {
    REQUIRE(f.store->Get(k, &v).ok());  // in the store before PutBatch returned
    REQUIRE(v == values[k]);
    REQUIRE(f.cache->Get(k, &v).ok());
    REQUIRE(v == values[k]);
  }
  std::vector<flatkv::engine::KeyValueRef> bad = {{2, "x"}, {-1, "y"}};
  REQUIRE(f.cache->PutBatch(bad).IsKeyOutOfRange());
  REQUIRE(f.cache->Get(2, &v).ok());
  REQUIRE(v == values[2]);
}

TEST_CASE("PutBatch in async mode is acknowledged from the cache and flushed later",
          "[engine][cache][batch]") {
  Fixture f(Options(WriteMode::kAsync));
  std::vector<flatkv::engine::KeyValueRef> batch = {{7, "a"}, {8, "b"}, {7, "c"}};
  REQUIRE(f.cache->PutBatch(batch).ok());
  std::string v;
  REQUIRE(f.store->Get(7, &v).IsNotFound());  // not flushed yet
  REQUIRE(f.cache->Get(7, &v).ok());
  REQUIRE(v == "c");
  REQUIRE(f.cache->Flush().ok());
  REQUIRE(f.store->Get(7, &v).ok());
  REQUIRE(v == "c");
  REQUIRE(f.store->Get(8, &v).ok());
  REQUIRE(v == "b");
}

TEST_CASE("Async writes with a bad key or value are refused, not acknowledged and lost",
          "[engine][cache]") {
  EngineOptions o;
  Fixture f(Options(WriteMode::kAsync));
  REQUIRE(f.cache->Put(-5, "v").IsKeyOutOfRange());
  REQUIRE(f.cache->Append(-5, "v").IsKeyOutOfRange());
  REQUIRE(f.cache->Remove(-5).IsKeyOutOfRange());
  REQUIRE(f.cache->Put(5, std::string(o.max_value_bytes + 1, 'x')).IsValueTooLarge());
  REQUIRE(f.cache->Flush().ok());  // nothing bad was queued
}

TEST_CASE("GetBatch returns dirty, cached, stored and absent keys in request order",
          "[engine][cache][batch]") {
  Fixture f(Options(WriteMode::kSafe));
  REQUIRE(f.store->Put(1, "stored").ok());
  REQUIRE(f.cache->Put(2, "cached").ok());
  std::string v;
  REQUIRE(f.cache->Get(2, &v).ok());
  REQUIRE(f.cache->SetMode(WriteMode::kAsync).ok());
  REQUIRE(f.cache->Put(3, "dirty").ok());
  REQUIRE(f.cache->Remove(1).ok());
  REQUIRE(f.cache->Put(4, "dirty4").ok());
  std::vector<int64_t> keys = {4, 1, 2, 99, 3, 2};
  std::vector<std::string> values;
  std::vector<bool> found;
  REQUIRE(f.cache->GetBatch(keys, &values, &found).ok());
  REQUIRE(found == std::vector<bool>{true, false, true, false, true, true});
  REQUIRE(values[0] == "dirty4");
  REQUIRE(values[2] == "cached");
  REQUIRE(values[4] == "dirty");
  REQUIRE(values[5] == "cached");
  std::vector<int64_t> bad = {5, -1};
  REQUIRE(f.cache->GetBatch(bad, &values, &found).IsKeyOutOfRange());
}

TEST_CASE("String keys go through the cache in both write modes and never collide with integer keys",
          "[engine][cache]") {
  Fixture f(Options(WriteMode::kAsync));
  const std::string eight("\x01\x00\x00\x00\x00\x00\x00\x00", 8);  // the bytes of int key 1
  REQUIRE(f.cache->Put(1, "int").ok());
  REQUIRE(f.cache->SPut(eight, "string").ok());
  std::string v;
  REQUIRE(f.store->SGet(eight, &v).IsNotFound());  // async: acknowledged from the cache
  REQUIRE(f.cache->SGet(eight, &v).ok());
  REQUIRE(v == "string");
  REQUIRE(f.cache->Get(1, &v).ok());
  REQUIRE(v == "int");
  bool existed = false;
  REQUIRE(f.cache->SRemove("never", &existed).ok());
  REQUIRE_FALSE(existed);
  REQUIRE(f.cache->SPut("gone", "x").ok());
  REQUIRE(f.cache->SRemove("gone", &existed).ok());
  REQUIRE(existed);
  REQUIRE(f.cache->SGet("gone", &v).IsNotFound());
  REQUIRE(f.cache->SPut(std::string(5000, 'k'), "v").IsInvalidArgument());  // over max_key_bytes
  REQUIRE(f.cache->Flush().ok());
  REQUIRE(f.store->SGet(eight, &v).ok());
  REQUIRE(v == "string");
  REQUIRE(f.store->Get(1, &v).ok());
  REQUIRE(v == "int");
  REQUIRE(f.store->SGet("gone", &v).IsNotFound());

  REQUIRE(f.cache->SetMode(WriteMode::kSafe).ok());
  REQUIRE(f.cache->SPut("safe", "s1").ok());
  REQUIRE(f.store->SGet("safe", &v).ok());  // safe: in the store before SPut returns
  REQUIRE(v == "s1");
  REQUIRE(f.cache->SGet("safe", &v).ok());  // now cached
  REQUIRE(f.cache->SPut("safe", "s2").ok());
  REQUIRE(f.cache->SGet("safe", &v).ok());
  REQUIRE(v == "s2");  // the cached copy was updated, not left stale
}
