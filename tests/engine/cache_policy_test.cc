// Replacement policies: LRU order, byte bounds, and ARC's resistance to scans
// (where it must beat LRU's hit rate) without losing LRU's behaviour on
// recency-friendly workloads.
#include <catch2/catch.hpp>

#include <memory>
#include <random>

#include "engine/cache/arc.h"
#include "engine/cache/lru.h"

using flatkv::engine::cache::ArcPolicy;
using flatkv::engine::cache::LruPolicy;
using flatkv::engine::cache::Policy;

namespace {

constexpr uint64_t kCharge = 10 + 100 + Policy::kEntryOverhead;  // 10-byte key, 100-byte value

std::string Key(int i) {
  std::string k = std::to_string(i);
  k.insert(0, 10 - k.size(), 'k');
  return k;
}

std::unique_ptr<Policy> Make(const std::string& name, uint64_t capacity) {
  if (name == "lru") return std::make_unique<LruPolicy>(capacity);
  return std::make_unique<ArcPolicy>(capacity);
}

// Looks a key up; on a miss "fetches" it and inserts it. Returns whether it hit.
bool Access(Policy* p, int key) {
  std::string v;
  if (p->Lookup(Key(key), &v)) {
    REQUIRE(v == std::string(100, static_cast<char>('a' + key % 26)));
    return true;
  }
  p->Insert(Key(key), std::string(100, static_cast<char>('a' + key % 26)));
  return false;
}

}  // namespace

TEST_CASE("LRU evicts the least recently used entry", "[engine][cache]") {
  LruPolicy lru(3 * kCharge);
  std::string v;
  for (int i = 0; i < 3; ++i) Access(&lru, i);
  REQUIRE(lru.Lookup(Key(0), &v));  // 0 is now the most recent
  Access(&lru, 3);                   // evicts 1
  REQUIRE_FALSE(lru.Lookup(Key(1), &v));
  REQUIRE(lru.Lookup(Key(0), &v));
  REQUIRE(lru.Lookup(Key(2), &v));
  REQUIRE(lru.Lookup(Key(3), &v));
  REQUIRE(lru.stats().evictions == 1);
}

TEST_CASE("Both policies stay within their byte capacity and replace values", "[engine][cache]") {
  const std::string name = GENERATE("lru", "arc");
  INFO(name);
  const uint64_t capacity = 50 * 1024;
  auto p = Make(name, capacity);
  std::mt19937_64 rng(9);
  for (int i = 0; i < 20000; ++i) {
    const std::string key = Key(static_cast<int>(rng() % 2000));
    if (rng() % 10 == 0) {
      p->Erase(key);
    } else {
      p->Insert(key, std::string(rng() % 3000, 'x'));
    }
    REQUIRE(p->stats().bytes <= capacity);
  }
  p->Insert("big", std::string(capacity, 'b'));  // larger than the whole cache: not kept
  std::string v;
  REQUIRE_FALSE(p->Lookup("big", &v));
  p->Insert("k", "old");
  p->Insert("k", "new value");
  REQUIRE(p->Lookup("k", &v));
  REQUIRE(v == "new value");
  p->Erase("k");
  REQUIRE_FALSE(p->Lookup("k", &v));
}

TEST_CASE("ARC keeps a reused working set through scans that flush LRU", "[engine][cache]") {
  // 60 hot keys, each used twice per round (so they are reused while
  // resident), then a scan of 150 keys never seen again; the cache holds 100
  // entries, so each scan flushes LRU.
  auto run = [](Policy* p) {
    uint64_t hot_hits = 0;
    int scan = 100000;
    for (int round = 0; round < 200; ++round) {
      for (int pass = 0; pass < 2; ++pass) {
        for (int k = 0; k < 60; ++k) hot_hits += Access(p, k) ? 1 : 0;
      }
      for (int s = 0; s < 150; ++s) Access(p, scan++);
    }
    return hot_hits;
  };
  LruPolicy lru(100 * kCharge);
  ArcPolicy arc(100 * kCharge);
  const uint64_t lru_hits = run(&lru);
  const uint64_t arc_hits = run(&arc);
  const uint64_t accesses = 200 * 2 * 60;
  INFO("hot-key hits: lru " << lru_hits << ", arc " << arc_hits << " of " << accesses);
  REQUIRE(lru_hits <= accesses / 2);      // only the second pass of each round hits
  REQUIRE(arc_hits > accesses * 9 / 10);  // the scans pass through T1 only
}

TEST_CASE("ARC is about as good as LRU when recency is all that matters", "[engine][cache]") {
  // A sliding window a little smaller than the cache: LRU's best case.
  auto run = [](Policy* p) {
    uint64_t hits = 0;
    std::mt19937_64 rng(3);
    for (int i = 0; i < 50000; ++i) {
      const int base = i / 10;
      hits += Access(p, base + static_cast<int>(rng() % 80)) ? 1 : 0;
    }
    return hits;
  };
  LruPolicy lru(100 * kCharge);
  ArcPolicy arc(100 * kCharge);
  const uint64_t lru_hits = run(&lru);
  const uint64_t arc_hits = run(&arc);
  INFO("hits: lru " << lru_hits << ", arc " << arc_hits);
  REQUIRE(arc_hits * 10 >= lru_hits * 9);
}

TEST_CASE("ARC's target for recent entries adapts to ghost hits", "[engine][cache]") {
  ArcPolicy arc(20 * kCharge);
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < 10; ++k) Access(&arc, k);  // 10 frequent entries (T2)
  }
  for (int k = 100; k < 130; ++k) Access(&arc, k);  // once each: T1 overflows into B1
  REQUIRE(arc.target_t1() == 0);
  for (int k = 110; k < 130; ++k) Access(&arc, k);  // recently evicted, wanted again
  const uint64_t grown = arc.target_t1();
  INFO("p after B1 ghost hits " << grown);
  REQUIRE(grown > 0);
  // 30 keys, each used twice in a row, cycled through a 20-entry cache: T2
  // overflows into B2, and each round brings its keys back as B2 ghost hits.
  for (int round = 0; round < 10; ++round) {
    for (int k = 300; k < 330; ++k) {
      Access(&arc, k);
      Access(&arc, k);
    }
  }
  INFO("p after B2 ghost hits " << arc.target_t1());
  REQUIRE(arc.target_t1() < grown);
}

TEST_CASE("Update replaces a resident value and never inserts an absent key", "[engine][cache]") {
  for (const char* name : {"lru", "arc"}) {
    INFO(name);
    std::unique_ptr<Policy> p = Make(name, 1 << 20);
    REQUIRE_FALSE(p->Update("absent", "v"));
    REQUIRE_FALSE(p->Contains("absent"));
    p->Insert("k", "old");
    REQUIRE(p->Update("k", "new"));
    std::string v;
    REQUIRE(p->Lookup("k", &v));
    REQUIRE(v == "new");
    p->Erase("k");
    REQUIRE_FALSE(p->Update("k", "again"));
    REQUIRE_FALSE(p->Lookup("k", &v));
  }
}
