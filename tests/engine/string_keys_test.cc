// String keys: bucket encoding, the fixed hash, store-level sget/sput/sremove
// with collisions, binary and empty keys, limits, scans and reopen, and the
// promise that a crowded bucket does not make puts quadratic.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "engine/store.h"
#include "engine/string_keys.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineOptions;
using flatkv::engine::Store;
using flatkv::engine::StringKeyValue;

namespace {

std::map<std::string, std::string> ScanAll(const Store& store, size_t page) {
  std::map<std::string, std::string> all;
  std::vector<StringKeyValue> out;
  std::string cursor, next;
  bool done = false;
  while (!done) {
    REQUIRE(store.SScan(cursor, page, &out, &next, &done).ok());
    REQUIRE(out.size() <= page);
    for (auto& kv : out) REQUIRE(all.emplace(kv.key, kv.value).second);  // each once
    cursor = next;
  }
  return all;
}

EngineOptions Options(const std::string& path, uint64_t slots) {
  EngineOptions o;
  o.path = path;
  o.string_slots = slots;
  o.data_files = 4;
  o.checkpoint_interval_ms = 0;
  return o;
}

}  // namespace

TEST_CASE("HashStringKey is XXH64 with seed 0, fixed across versions", "[engine][strings]") {
  // Reference values of the xxHash specification.
  REQUIRE(flatkv::engine::HashStringKey("") == 0xEF46DB3751D8E999ull);
  REQUIRE(flatkv::engine::HashStringKey("a") == 0xD24EC4F1A98C6E5Bull);
  REQUIRE(flatkv::engine::HashStringKey("abc") == 0x44BC2CF5AD770999ull);
}

TEST_CASE("A bucket resolves to the newest entry per key", "[engine][strings]") {
  std::string b;
  flatkv::engine::AppendBucketPut(&b, "k", "v1");
  flatkv::engine::AppendBucketPut(&b, std::string("\0x", 2), "bin");
  flatkv::engine::AppendBucketPut(&b, "k", "v2");
  flatkv::engine::AppendBucketRemove(&b, std::string("\0x", 2));
  std::string v;
  REQUIRE(flatkv::engine::FindInBucket(b, "k", &v));
  REQUIRE(v == "v2");
  REQUIRE_FALSE(flatkv::engine::FindInBucket(b, std::string("\0x", 2), &v));
  const auto live = flatkv::engine::LiveBucketEntries(b);
  REQUIRE(live.size() == 1);
  REQUIRE(live[0].second == "v2");
  REQUIRE_FALSE(flatkv::engine::ForEachBucketEntry(b.substr(0, b.size() - 1),
                                                   [](auto, auto, auto) {}));
}

TEST_CASE("String keys of any bytes work, including colliding ones, across reopens",
          "[engine][strings]") {
  flatkv::test::TempDir dir;
  // Four slots for hundreds of keys: every bucket holds many colliding keys.
  const EngineOptions o = Options(dir / "s", GENERATE(uint64_t{4}, uint64_t{1} << 16));
  std::mt19937_64 rng(11);
  std::map<std::string, std::string> model;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  const std::vector<std::string> special = {"", std::string(1, '\0'), std::string("a\0b", 3),
                                            std::string(o.max_key_bytes, 'x')};
  for (const std::string& k : special) {
    REQUIRE(store->SPut(k, "special:" + std::to_string(k.size())).ok());
    model[k] = "special:" + std::to_string(k.size());
  }
  for (int step = 0; step < 3000; ++step) {
    std::string k(1 + rng() % 12, '\0');
    for (auto& c : k) c = static_cast<char>(rng() % 4);  // small alphabet: many repeats
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      std::string v(rng() % 200, static_cast<char>('a' + rng() % 26));
      REQUIRE(store->SPut(k, v).ok());
      model[k] = v;
    } else if (op < 9) {
      bool existed = false;
      REQUIRE(store->SRemove(k, &existed).ok());
      REQUIRE(existed == (model.erase(k) == 1));
    } else {
      store.reset();
      REQUIRE(Store::Open(o, &store).ok());
    }
  }
  for (const auto& [k, v] : model) {
    std::string got;
    REQUIRE(store->SGet(k, &got).ok());
    REQUIRE(got == v);
  }
  std::string untouched = "untouched";
  REQUIRE(store->SGet("never written", &untouched).IsNotFound());
  REQUIRE(untouched == "untouched");
  REQUIRE(ScanAll(*store, 7) == model);
  store.reset();
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(ScanAll(*store, 1000) == model);
}

TEST_CASE("String keys and values over their limits are refused", "[engine][strings]") {
  flatkv::test::TempDir dir;
  EngineOptions o = Options(dir / "s", 1024);
  o.max_value_bytes = 100;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  Status st = store->SPut(std::string(o.max_key_bytes + 1, 'k'), "v");
  REQUIRE(st.IsInvalidArgument());
  REQUIRE(st.message().find("max_key_bytes") != std::string::npos);
  REQUIRE(store->SPut("k", std::string(101, 'v')).IsValueTooLarge());
  REQUIRE(store->SPut("k", std::string(100, 'v')).ok());
}

TEST_CASE("Integer and string keys live side by side", "[engine][strings]") {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(Options(dir / "s", 1024), &store).ok());
  REQUIRE(store->Put(5, "int five").ok());
  REQUIRE(store->SPut("5", "string five").ok());
  std::string v;
  REQUIRE(store->Get(5, &v).ok());
  REQUIRE(v == "int five");
  REQUIRE(store->SGet("5", &v).ok());
  REQUIRE(v == "string five");
}

TEST_CASE("Puts into a crowded bucket cost about their own size, not the bucket's",
          "[engine][strings]") {
  // 100 keys share one bucket; overwriting each 20 times must not write
  // O(bucket) bytes per put (that would be ~100 x 100 x 20 x entry size).
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(Options(dir / "s", 1), &store).ok());
  const std::string value(100, 'v');
  for (int round = 0; round < 20; ++round) {
    for (int k = 0; k < 100; ++k) REQUIRE(store->SPut("key" + std::to_string(k), value).ok());
  }
  const uint64_t written = store->GetStats().bytes_appended;
  const uint64_t entries = 20 * 100 * (value.size() + 8);
  INFO("bytes written " << written << " for " << entries << " bytes of entries");
  REQUIRE(written < 12 * entries);  // O(log) merging of appended parts, bounded rewrites
  REQUIRE(ScanAll(*store, 10).size() == 100);
}
