// EntryTable: the open-addressing table with intrusive lists under the cache
// policies. The ways it can fail that a std::unordered_map + std::list could
// not: a backward shift that forgets to relink a moved entry's neighbours or
// moves an entry before its home (most likely across the wraparound), growth
// that loses or reorders list entries, and a spilled key or a ghost whose
// bytes go stale. Hashes are chosen by the tests to force collisions.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <list>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/cache/entry_table.h"

using flatkv::engine::cache::EntryTable;

namespace {

constexpr int kLists = EntryTable::kMaxLists;

uint64_t Seed() {
  if (const char* s = std::getenv("FLATKV_CACHE_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

std::vector<std::string> ListKeys(const EntryTable& t, int list) {
  std::vector<std::string> keys;
  for (uint32_t i = t.head(list); i != EntryTable::kNil; i = t.next(i)) {
    keys.emplace_back(t.key(i));
  }
  return keys;
}

std::string ValueOf(const std::string& key) { return "v:" + key; }

// The model: per list, keys from head (most recent) to tail.
struct Model {
  std::list<std::string> lists[kLists];
  std::map<std::string, std::pair<int, uint64_t>> where;  // key -> (list, hash)

  void Check(const EntryTable& t) const {
    REQUIRE(t.TEST_CheckInvariants() == "");
    REQUIRE(t.size() == where.size());
    for (int l = 0; l < kLists; ++l) {
      const std::vector<std::string> want(lists[l].begin(), lists[l].end());
      REQUIRE(ListKeys(t, l) == want);
    }
    for (const auto& [key, lh] : where) {
      const uint32_t slot = t.Find(key, lh.second);
      REQUIRE(slot != EntryTable::kNil);
      REQUIRE(t.list(slot) == lh.first);
      REQUIRE(t.value(slot) == ValueOf(key));
    }
  }
};

// Low 8 bits in {0xfc..0xff, 0x00..0x03}: while the table has at most 256
// slots every home is one of the last or first four slots, so probe runs
// wrap around the end of the array and collide constantly.
uint64_t WrapHash(std::mt19937_64& rng) {
  return (rng() & ~uint64_t{0xff}) | ((0xfc + rng() % 8) & 0xff);
}

}  // namespace

TEST_CASE("EntryTable removes across the wraparound and relinks every moved entry",
          "[engine][cache]") {
  EntryTable t;
  REQUIRE(t.capacity() == 64);
  Model m;
  // Homes 62, 63, 0 and 1, interleaved, on alternating lists: the run is
  // 62, 63, 0, 1, ... and every removal shifts entries back across slot 0.
  const uint64_t homes[] = {62, 63, 62, 0, 63, 1, 62, 0, 1, 63};
  for (int i = 0; i < 10; ++i) {
    const std::string key = std::string("k") += std::to_string(i);
    const uint64_t hash = (static_cast<uint64_t>(i + 1) << 32) | homes[i];
    const int list = i % 2;
    t.Add(key, hash, ValueOf(key), list);
    m.lists[list].push_front(key);
    m.where[key] = {list, hash};
  }
  m.Check(t);
  REQUIRE(t.TEST_Home(t.Find("k3", m.where["k3"].second)) == 0);
  REQUIRE(t.Find("k3", m.where["k3"].second) != 0);  // displaced past the wrap
  // Remove from the front of the run (slot 62) first, then the middle, so
  // both shifting and not-shifting (an entry at its home) happen.
  for (const char* key : {"k0", "k4", "k3", "k9", "k6", "k1", "k8", "k2", "k5", "k7"}) {
    INFO("removing " << key);
    const uint32_t slot = t.Find(key, m.where[key].second);
    REQUIRE(slot != EntryTable::kNil);
    t.Remove(slot);
    m.lists[m.where[key].first].remove(key);
    m.where.erase(key);
    m.Check(t);
  }
  REQUIRE(t.size() == 0);
}

TEST_CASE("EntryTable matches a model under random adds, moves and removes near the wraparound",
          "[engine][cache]") {
  const uint64_t seed = Seed();
  INFO("seed " << seed << " (rerun with FLATKV_CACHE_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  EntryTable t;
  Model m;
  std::vector<std::string> present;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5 || present.empty()) {  // add (the table grows past 64, 128, 256 slots)
      const std::string key = "key" + std::to_string(rng() % 100000) +
                              (rng() % 4 == 0 ? std::string(40, 'L') : std::string());
      if (m.where.count(key)) continue;
      const uint64_t hash = WrapHash(rng);
      const int list = static_cast<int>(rng() % kLists);
      t.Add(key, hash, ValueOf(key), list);
      m.lists[list].push_front(key);
      m.where[key] = {list, hash};
      present.push_back(key);
    } else if (op < 8) {  // remove
      const size_t k = rng() % present.size();
      const std::string key = present[k];
      present[k] = present.back();
      present.pop_back();
      t.Remove(t.Find(key, m.where[key].second));
      m.lists[m.where[key].first].remove(key);
      m.where.erase(key);
    } else {  // move to the front of some list
      const std::string& key = present[rng() % present.size()];
      const int to = static_cast<int>(rng() % kLists);
      t.MoveToFront(t.Find(key, m.where[key].second), to);
      m.lists[m.where[key].first].remove(key);
      m.lists[to].push_front(key);
      m.where[key].first = to;
    }
    if (step % 50 == 0 || present.size() < 20) {
      INFO("step " << step);
      m.Check(t);
    }
  }
  m.Check(t);
}

TEST_CASE("EntryTable growth keeps every list's order and every value", "[engine][cache]") {
  EntryTable t;
  Model m;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 3000; ++i) {
    const std::string key = std::string("g") += std::to_string(i);
    const uint64_t hash = EntryTable::Hash(key);
    const int list = static_cast<int>(rng() % kLists);
    t.Add(key, hash, ValueOf(key), list);
    m.lists[list].push_front(key);
    m.where[key] = {list, hash};
    if (i == 47 || i == 48 || i == 49) m.Check(t);  // around the first growth (48 of 64)
  }
  REQUIRE(t.capacity() >= 4096);
  REQUIRE(t.size() * 4 <= uint64_t{t.capacity()} * 3);
  m.Check(t);
}

TEST_CASE("EntryTable keeps long keys, empty values and ghosts right", "[engine][cache]") {
  EntryTable t;
  const std::string inline_key(EntryTable::kInlineKey, 'i');
  const std::string long_key(EntryTable::kInlineKey + 1, 'l');
  const std::string huge_key(1000, 'h');
  for (const std::string* key : {&inline_key, &long_key, &huge_key}) {
    INFO("key of " << key->size() << " bytes");
    const uint64_t hash = EntryTable::Hash(*key);
    uint32_t slot = t.Add(*key, hash, "", 0);
    REQUIRE(t.key(slot) == *key);
    REQUIRE(t.value(slot).empty());
    t.SetValue(slot, "first");
    REQUIRE(t.value(slot) == "first");
    t.SetValue(slot, "other");  // same size: in place
    t.SetValue(slot, std::string(500, 'x'));
    REQUIRE(t.value(slot) == std::string(500, 'x'));
    t.DropValue(slot);  // a ghost: key and size stay
    t.MoveToFront(slot, 2);
    REQUIRE_FALSE(t.has_value(slot));
    REQUIRE(t.value_size(slot) == 500);
    REQUIRE(t.value(slot).empty());
    REQUIRE(t.key(slot) == *key);
    REQUIRE(t.Find(*key, hash) == slot);
    t.SetValue(slot, "back");
    REQUIRE(t.value(slot) == "back");
    REQUIRE(t.key(slot) == *key);
  }
  // Keys that differ only past the inline part, under one forced hash.
  const std::string a = long_key + "a";
  const std::string b = long_key + "b";
  t.Add(a, 7, "A", 1);
  t.Add(b, 7, "B", 1);
  REQUIRE(t.value(t.Find(a, 7)) == "A");
  REQUIRE(t.value(t.Find(b, 7)) == "B");
  REQUIRE(t.Find(long_key + "c", 7) == EntryTable::kNil);
  REQUIRE(t.TEST_CheckInvariants() == "");
}
