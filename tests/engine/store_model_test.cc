// Randomized model test: random put/remove/append/compact/reopen sequences run against
// the store and against std::map, comparing every get and both iteration
// orders after each phase, and key-order scans from random keys inside random
// bounds, in both directions, resumed page by page under a random per-call
// work allowance.
#include <catch2/catch.hpp>

#include <algorithm>
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

// Resumes a bounded scan to its end; checks every page against the contract.
std::vector<KeyValue> ScanAll(const Store& store, int64_t from, bool reverse, size_t page,
                              int64_t lo, int64_t hi) {
  std::vector<KeyValue> all, out;
  bool done = false;
  for (int calls = 0; !done; ++calls) {
    REQUIRE(calls < 10000000);
    int64_t next = 0;
    REQUIRE(store.Scan(from, reverse, page, lo, hi, &out, &next, &done).ok());
    REQUIRE(out.size() <= page);
    all.insert(all.end(), out.begin(), out.end());
    if (!done) {
      REQUIRE((next >= lo && next <= hi));
      from = next;
    }
  }
  return all;
}

// Bounded scans from random points, against the model.
void CompareScans(Store& store, const std::map<int64_t, std::string>& model,
                  const EngineOptions& o, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> key(o.key_min - 20, o.key_max + 20);
  for (int round = 0; round < 20; ++round) {
    store.TEST_SetScanWork(round % 2 == 0 ? 1 + rng() % 300 : Store::kScanWork);
    int64_t lo = key(rng), hi = key(rng);
    if (lo > hi) std::swap(lo, hi);
    if (round == 0) lo = INT64_MIN, hi = INT64_MAX;
    const int64_t from = round % 3 == 0 ? (rng() % 2 ? INT64_MIN : INT64_MAX) : key(rng);
    const bool reverse = rng() % 2 == 1;
    const size_t page = 1 + rng() % 9;
    INFO("lo " << lo << " hi " << hi << " from " << from << " reverse " << reverse);
    std::vector<std::pair<int64_t, std::string>> want;
    for (const auto& [k, v] : model) {
      if (k >= lo && k <= hi && (reverse ? k <= from : k >= from)) want.emplace_back(k, v);
    }
    if (reverse) std::reverse(want.begin(), want.end());
    const std::vector<KeyValue> got = ScanAll(store, from, reverse, page, lo, hi);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      REQUIRE(got[i].key == want[i].first);
      REQUIRE(got[i].value == want[i].second);
    }
  }
  store.TEST_SetScanWork(Store::kScanWork);
}

void CompareAll(Store& store, const std::map<int64_t, std::string>& model,
                const EngineOptions& o, std::mt19937_64& rng) {
  CompareScans(store, model, o, rng);
  // Point lookups, present and absent.
  for (const auto& [k, v] : model) {
    std::string got;
    REQUIRE(store.Get(k, &got).ok());
    REQUIRE(got == v);
  }
  const int64_t stride = std::max<int64_t>(7, (o.key_max - o.key_min) / 20000);
  for (int64_t k = o.key_min; k < o.key_max; k += stride) {
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

// With "pool" > 0, keys are drawn from that many random keys of the range
// (so a sparse range still sees overwrites and removes of present keys).
void RunModel(EngineOptions o, uint64_t seed, int steps, size_t pool = 0) {
  flatkv::test::TempDir dir;
  o.path = dir / "store";
  std::mt19937_64 rng(seed);
  std::map<int64_t, std::string> model;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::uniform_int_distribution<int64_t> key(o.key_min, o.key_max - 1);
  std::vector<int64_t> keys(pool);
  for (int64_t& k : keys) k = key(rng);
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 100);
    const int64_t k = pool > 0 ? keys[rng() % pool] : key(rng);
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
      CompareAll(*store, model, o, rng);
    } else {
      // Clean close and reopen (crash recovery has its own tests), then the
      // whole store must still match the model.
      store.reset();
      REQUIRE(Store::Open(o, &store).ok());
      CompareAll(*store, model, o, rng);
    }
  }
  CompareAll(*store, model, o, rng);
  store.reset();
  REQUIRE(Store::Open(o, &store).ok());
  CompareAll(*store, model, o, rng);
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

TEST_CASE("Store scans match a std::map over sparse keys in large segments",
          "[engine][store][model][scan]") {
  // Segments of 2^21 slots (4096 groups of 512) holding a few hundred keys:
  // scans jump over empty groups and segments, and hit the work allowance.
  EngineOptions o;
  o.key_min = -(int64_t{1} << 22);
  o.key_max = int64_t{1} << 22;
  o.segment_keys = uint64_t{1} << 21;
  o.data_files = 5;
  o.checkpoint_interval_ms = 0;
  const uint64_t seed = GENERATE(11, 12);
  RunModel(o, seed, 1500, 400);
}
