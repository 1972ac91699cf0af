// Randomized model test: random put/remove/append/compact/reopen sequences run against
// the store and against std::map, comparing every get and both iteration
// orders after each phase.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::engine::EngineOptions;
using flatkv::engine::KeyValue;
using flatkv::engine::Store;
using flatkv::Status;

namespace {

std::string RandomValue(std::mt19937_64& rng) {
  static const size_t kSizes[] = {0, 1, 7, 100, 1000, 5000, 70000};
  std::uniform_int_distribution<int> pick(0, 6);
  size_t n = kSizes[pick(rng)];
  if (n > 1) n = std::uniform_int_distribution<size_t>(n / 2, n)(rng);
  std::string v(n, '\0');
  for (auto& c : v) c = static_cast<char>('a' + rng() % 26);
  return v;
}

void CompareAll(const Store& store, const std::map<int64_t, std::string>& model,
                const EngineOptions& o) {
  // Point lookups, present and absent.
  for (const auto& [k, v] : model) {
    std::string got;
    REQUIRE(store.Get(k, &got).ok());
    REQUIRE(got == v);
  }
  for (int64_t k = o.key_min; k < o.key_max; k += 7) {
    if (model.count(k)) continue;
    std::string got = "untouched";
    REQUIRE(store.Get(k, &got).IsNotFound());
    REQUIRE(got == "untouched");
  }
  // Key order, forward, in pages of 5.
  std::vector<KeyValue> all, page;
  int64_t from = o.key_min;
  bool done = false;
  while (!done) {
    int64_t next = 0;
    REQUIRE(store.Scan(from, false, 5, &page, &next, &done).ok());
    all.insert(all.end(), page.begin(), page.end());
    from = next;
  }
  REQUIRE(all.size() == model.size());
  auto it = model.begin();
  for (const KeyValue& kv : all) {
    REQUIRE(kv.key == it->first);
    REQUIRE(kv.value == it->second);
    ++it;
  }
  // Key order, backward.
  all.clear();
  from = o.key_max - 1;
  done = false;
  while (!done) {
    int64_t next = 0;
    REQUIRE(store.Scan(from, true, 3, &page, &next, &done).ok());
    all.insert(all.end(), page.begin(), page.end());
    from = next;
  }
  REQUIRE(all.size() == model.size());
  auto rit = model.rbegin();
  for (const KeyValue& kv : all) {
    REQUIRE(kv.key == rit->first);
    REQUIRE(kv.value == rit->second);
    ++rit;
  }
  // Insertion order: every live key exactly once, with its newest value.
  std::map<int64_t, std::string> seen;
  std::string cursor, next_cursor;
  done = false;
  while (!done) {
    REQUIRE(store.ScanLog(cursor, 4, &page, &next_cursor, &done).ok());
    for (KeyValue& kv : page) REQUIRE(seen.emplace(kv.key, kv.value).second);
    cursor = next_cursor;
  }
  REQUIRE(seen == model);
}

void RunModel(EngineOptions o, uint64_t seed, int steps) {
  flatkv::test::TempDir dir;
  o.path = dir / "store";
  std::mt19937_64 rng(seed);
  std::map<int64_t, std::string> model;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::uniform_int_distribution<int64_t> key(o.key_min, o.key_max - 1);
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 100);
    const int64_t k = key(rng);
    if (op < 45) {
      std::string v = RandomValue(rng);
      REQUIRE(store->Put(k, v).ok());
      model[k] = v;
    } else if (op < 65) {
      bool existed = false;
      REQUIRE(store->Remove(k, &existed).ok());
      REQUIRE(existed == (model.erase(k) == 1));
    } else if (op < 90) {
      std::string v = RandomValue(rng);
      if (v.size() > 2000) v.resize(rng() % 50);
      REQUIRE(store->Append(k, v).ok());
      model[k] += v;
    } else if (op < 96) {
      std::string got;
      Status st = store->Get(k, &got);
      REQUIRE(st.ok() == (model.count(k) == 1));
      if (st.ok()) REQUIRE(got == model[k]);
    } else if (op < 97) {
      // Online compaction: everything must read the same afterwards.
      REQUIRE(store->CompactAndWait().ok());
      CompareAll(*store, model, o);
    } else {
      // Clean close and reopen (crash recovery has its own tests), then the
      // whole store must still match the model.
      store.reset();
      REQUIRE(Store::Open(o, &store).ok());
      CompareAll(*store, model, o);
    }
  }
  CompareAll(*store, model, o);
  store.reset();
  REQUIRE(Store::Open(o, &store).ok());
  CompareAll(*store, model, o);
}


}  // namespace

TEST_CASE("Store matches a std::map under random puts, removes, appends and reopens",
          "[engine][store][model]") {
  EngineOptions o;
  o.key_min = -50;
  o.key_max = 250;
  o.segment_keys = 64;  // several segments, the last one partial
  o.data_files = 3;
  o.checkpoint_interval_ms = 0;
  const uint64_t seed = GENERATE(1, 2, 3);
  SECTION("6-byte slots") { RunModel(o, seed, 3000); }
  SECTION("4-byte slots, no size hint") {
    o.index_item_bytes = 4;
    RunModel(o, seed, 3000);
  }
  SECTION("8-byte slots, sync always") {
    o.index_item_bytes = 8;
    o.sync = flatkv::engine::SyncMode::kAlways;
    RunModel(o, seed, 1500);
  }
}
