// Replacement policies: LRU order, byte bounds, and ARC's resistance to scans
// (where it must beat LRU's hit rate) without losing LRU's behaviour on
// recency-friendly workloads; and both policies, now over EntryTable, against
// the plain list-and-map versions they replaced (seeded model tests).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>

#include "engine/cache/arc.h"
#include "engine/cache/lru.h"

using flatkv::engine::cache::ArcPolicy;
using flatkv::engine::cache::LruPolicy;
using flatkv::engine::cache::Policy;
using flatkv::engine::cache::PolicyStats;

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

// Model tests: the policies run over EntryTable (open addressing, intrusive
// lists), and the references below are the plain std::list +
// std::unordered_map versions they replaced. Every answer, every counter and
// (for ARC) every list's bytes and p must agree after each operation, with
// keys on both sides of the inline-key limit and values from empty to large.

namespace {

uint64_t ModelSeed() {
  if (const char* s = std::getenv("FLATKV_CACHE_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

uint64_t RefCharge(std::string_view key, size_t value_size) {
  return key.size() + value_size + Policy::kEntryOverhead;
}

// LRU as the textbook has it.
class RefLru {
 public:
  explicit RefLru(uint64_t capacity) : capacity_(capacity) {}
  bool Lookup(const std::string& key, std::string* value) {
    auto it = map_.find(key);
    if (it == map_.end()) {
      ++misses_;
      return false;
    }
    ++hits_;
    list_.splice(list_.begin(), list_, it->second);
    *value = it->second->second;
    return true;
  }
  void Insert(const std::string& key, const std::string& value) {
    Erase(key);
    const uint64_t charge = RefCharge(key, value.size());
    if (charge > capacity_) return;
    while (bytes_ + charge > capacity_) {
      bytes_ -= RefCharge(list_.back().first, list_.back().second.size());
      map_.erase(list_.back().first);
      list_.pop_back();
      ++evictions_;
    }
    list_.emplace_front(key, value);
    map_[key] = list_.begin();
    bytes_ += charge;
  }
  bool Update(const std::string& key, const std::string& value) {
    if (!Contains(key)) return false;
    Insert(key, value);
    return true;
  }
  bool Contains(const std::string& key) const { return map_.count(key) > 0; }
  void Erase(const std::string& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    bytes_ -= RefCharge(key, it->second->second.size());
    list_.erase(it->second);
    map_.erase(it);
  }
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, bytes_ = 0;
  size_t entries() const { return map_.size(); }

 private:
  const uint64_t capacity_;
  std::list<std::pair<std::string, std::string>> list_;
  std::unordered_map<std::string, std::list<std::pair<std::string, std::string>>::iterator> map_;
};

// ARC exactly as engine/cache/arc.cc had it before EntryTable (commit
// 0621161): a std::list per list and a std::unordered_map of locations.
class RefArc {
 public:
  explicit RefArc(uint64_t capacity) : capacity_(capacity) {}
  enum ListId { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3 };
  struct Entry {
    std::string key;
    std::string value;
    uint64_t charge;
  };
  using List = std::list<Entry>;
  struct Loc {
    ListId list;
    List::iterator it;
  };

  bool Lookup(const std::string& key, std::string* value) {
    auto it = map_.find(key);
    if (it == map_.end() || it->second.list >= kB1) {
      ++misses_;
      return false;
    }
    ++hits_;
    MoveTo(&it->second, kT2);
    *value = it->second.it->value;
    return true;
  }
  void Insert(const std::string& key, const std::string& value) {
    const uint64_t charge = RefCharge(key, value.size());
    auto it = map_.find(key);
    if (it != map_.end() && it->second.list <= kT2) {
      Rewrite(&it->second, key, value);
      return;
    }
    if (charge > capacity_) {
      if (it != map_.end()) Erase(key);
      return;
    }
    if (it != map_.end()) {
      Loc& loc = it->second;
      const bool in_b2 = loc.list == kB2;
      if (!in_b2) {
        const uint64_t ratio = bytes_[kB1] > 0 ? charge * bytes_[kB2] / bytes_[kB1] : 0;
        p_ = std::min(capacity_, p_ + std::max(charge, ratio));
      } else {
        const uint64_t ratio = bytes_[kB2] > 0 ? charge * bytes_[kB1] / bytes_[kB2] : 0;
        const uint64_t delta = std::max(charge, ratio);
        p_ = p_ > delta ? p_ - delta : 0;
      }
      bytes_[loc.list] -= loc.it->charge;
      lists_[loc.list].erase(loc.it);
      map_.erase(it);
      MakeRoom(charge, in_b2);
      Push(kT2, key, value, charge);
      return;
    }
    while (bytes_[kT1] + bytes_[kB1] + charge > capacity_ && !lists_[kB1].empty()) DropLru(kB1);
    while (bytes_[kT1] + charge > capacity_ && !lists_[kT1].empty()) {
      DropLru(kT1);
      ++evictions_;
    }
    while (bytes_[kT1] + bytes_[kT2] + bytes_[kB1] + bytes_[kB2] + charge > 2 * capacity_ &&
           !lists_[kB2].empty()) {
      DropLru(kB2);
    }
    MakeRoom(charge, false);
    Push(kT1, key, value, charge);
  }
  bool Update(const std::string& key, const std::string& value) {
    auto it = map_.find(key);
    if (it == map_.end() || it->second.list >= kB1) return false;
    Rewrite(&it->second, key, value);
    return true;
  }
  bool Contains(const std::string& key) const {
    auto it = map_.find(key);
    return it != map_.end() && it->second.list <= kT2;
  }
  void Erase(const std::string& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    Loc loc = it->second;
    bytes_[loc.list] -= loc.it->charge;
    map_.erase(it);
    lists_[loc.list].erase(loc.it);
  }
  size_t entries() const { return lists_[kT1].size() + lists_[kT2].size(); }

  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, p_ = 0;
  uint64_t bytes_[4] = {0, 0, 0, 0};

 private:
  void Push(ListId list, const std::string& key, const std::string& value, uint64_t charge) {
    lists_[list].push_front(Entry{key, value, charge});
    bytes_[list] += charge;
    map_[key] = Loc{list, lists_[list].begin()};
  }
  void MoveTo(Loc* loc, ListId to) {
    bytes_[loc->list] -= loc->it->charge;
    bytes_[to] += loc->it->charge;
    lists_[to].splice(lists_[to].begin(), lists_[loc->list], loc->it);
    loc->list = to;
  }
  void DropLru(ListId list) {
    bytes_[list] -= lists_[list].back().charge;
    map_.erase(lists_[list].back().key);
    lists_[list].pop_back();
  }
  void Replace(bool hit_in_b2) {
    const bool from_t1 = !lists_[kT1].empty() &&
                         (bytes_[kT1] > p_ || (hit_in_b2 && bytes_[kT1] >= p_) ||
                          lists_[kT2].empty());
    const ListId from = from_t1 ? kT1 : kT2;
    if (lists_[from].empty()) return;
    Entry& victim = lists_[from].back();
    victim.value.clear();
    MoveTo(&map_.at(victim.key), from_t1 ? kB1 : kB2);
    ++evictions_;
  }
  void MakeRoom(uint64_t charge, bool hit_in_b2) {
    while (bytes_[kT1] + bytes_[kT2] + charge > capacity_ &&
           !(lists_[kT1].empty() && lists_[kT2].empty())) {
      Replace(hit_in_b2);
    }
  }
  void Rewrite(Loc* loc, const std::string& key, const std::string& value) {
    const uint64_t charge = RefCharge(key, value.size());
    bytes_[loc->list] -= loc->it->charge;
    loc->it->value = value;
    loc->it->charge = charge;
    bytes_[loc->list] += charge;
    MoveTo(loc, kT2);
    MakeRoom(0, false);
    if (charge > capacity_) Erase(key);
  }

  const uint64_t capacity_;
  List lists_[4];
  std::unordered_map<std::string, Loc> map_;
};

// Keys of 1..4 bytes, exactly at and just past the inline limit, and long.
std::string ModelKey(std::mt19937_64& rng) {
  const int id = static_cast<int>(rng() % 400);
  static const size_t kLengths[] = {0, 29, 30, 31, 90};
  std::string key = std::to_string(id);
  const size_t len = kLengths[id % 5];
  if (key.size() < len) key.append(len - key.size(), static_cast<char>('a' + id % 26));
  return key;
}

std::string ModelValue(std::mt19937_64& rng) {
  const size_t sizes[] = {0, 1, 8, 100, 400, 1500};
  std::string v(sizes[rng() % 6], static_cast<char>('A' + rng() % 26));
  if (!v.empty()) v[0] = static_cast<char>(rng());
  return v;
}

// Runs the same random operations on policy and ref, comparing as it goes.
template <typename P, typename Ref, typename Compare>
void RunModel(P* policy, Ref* ref, uint64_t seed, int steps, Compare compare) {
  std::mt19937_64 rng(seed);
  for (int step = 0; step < steps; ++step) {
    const std::string key = ModelKey(rng);
    const int op = static_cast<int>(rng() % 20);
    INFO("step " << step << " op " << op << " key of " << key.size() << " bytes");
    if (op < 8) {
      std::string got = "unchanged", want = "unchanged";
      const bool hit = policy->Lookup(key, &got);
      REQUIRE(hit == ref->Lookup(key, &want));
      REQUIRE(got == want);
    } else if (op < 15) {
      const std::string value = ModelValue(rng);
      policy->Insert(key, value);
      ref->Insert(key, value);
    } else if (op < 17) {
      const std::string value = ModelValue(rng);
      REQUIRE(policy->Update(key, value) == ref->Update(key, value));
    } else if (op < 19) {
      policy->Erase(key);
      ref->Erase(key);
    } else {
      REQUIRE(policy->Contains(key) == ref->Contains(key));
    }
    const PolicyStats s = policy->stats();
    REQUIRE(s.hits == ref->hits_);
    REQUIRE(s.misses == ref->misses_);
    REQUIRE(s.evictions == ref->evictions_);
    REQUIRE(s.entries == ref->entries());
    compare(*policy, *ref);
    if (step % 97 == 0) REQUIRE(policy->TEST_table().TEST_CheckInvariants() == "");
  }
  REQUIRE(policy->TEST_table().TEST_CheckInvariants() == "");
}

}  // namespace

TEST_CASE("LRU over EntryTable matches a reference LRU on random operations", "[engine][cache]") {
  const uint64_t seed = ModelSeed();
  INFO("seed " << seed << " (rerun with FLATKV_CACHE_SEED=" << seed << ")");
  for (uint64_t capacity : {uint64_t{2000}, uint64_t{30000}, uint64_t{300000}}) {
    INFO("capacity " << capacity);
    LruPolicy lru(capacity);
    RefLru ref(capacity);
    RunModel(&lru, &ref, seed + capacity, 20000, [](const LruPolicy& p, const RefLru& r) {
      REQUIRE(p.stats().bytes == r.bytes_);
    });
  }
}

TEST_CASE("ARC over EntryTable matches the list-based ARC on random operations",
          "[engine][cache]") {
  const uint64_t seed = ModelSeed();
  INFO("seed " << seed << " (rerun with FLATKV_CACHE_SEED=" << seed << ")");
  for (uint64_t capacity : {uint64_t{2000}, uint64_t{30000}, uint64_t{300000}}) {
    INFO("capacity " << capacity);
    ArcPolicy arc(capacity);
    RefArc ref(capacity);
    RunModel(&arc, &ref, seed + capacity, 20000, [](const ArcPolicy& p, const RefArc& r) {
      REQUIRE(p.target_t1() == r.p_);
      for (int l = 0; l < 4; ++l) {
        REQUIRE(p.TEST_list_bytes(static_cast<ArcPolicy::ListId>(l)) == r.bytes_[l]);
      }
    });
  }
}

TEST_CASE("ARC's ghost lists stay within capacity and hold no values", "[engine][cache]") {
  const uint64_t capacity = 200 * kCharge;
  ArcPolicy arc(capacity);
  int next = 0;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 20000; ++i) {
    // Mostly new keys (T1 overflows into B1), some reused recent ones (T2,
    // then B2 as they age), some ghosts brought back.
    const int key = rng() % 4 == 0 && next > 0 ? next - 1 - static_cast<int>(rng() % 600) : next++;
    Access(&arc, key < 0 ? 0 : key);
    const uint64_t t1 = arc.TEST_list_bytes(ArcPolicy::kT1), t2 = arc.TEST_list_bytes(ArcPolicy::kT2);
    const uint64_t b1 = arc.TEST_list_bytes(ArcPolicy::kB1), b2 = arc.TEST_list_bytes(ArcPolicy::kB2);
    REQUIRE(t1 + t2 <= capacity);
    REQUIRE(t1 + b1 <= capacity);
    REQUIRE(t1 + t2 + b1 + b2 <= 2 * capacity);
  }
  const flatkv::engine::cache::EntryTable& t = arc.TEST_table();
  REQUIRE(t.TEST_CheckInvariants() == "");
  REQUIRE(t.list_size(ArcPolicy::kB1) > 0);
  REQUIRE(t.list_size(ArcPolicy::kB2) > 0);
  REQUIRE(t.size() <= 2 * capacity / kCharge);  // ghosts are dropped, not kept forever
  for (int l = ArcPolicy::kB1; l <= ArcPolicy::kB2; ++l) {
    for (uint32_t i = t.head(l); i != flatkv::engine::cache::EntryTable::kNil; i = t.next(i)) {
      REQUIRE_FALSE(t.has_value(i));
      REQUIRE(t.value_size(i) == 100);  // the ghost's charge survives
      std::string v;
      REQUIRE_FALSE(arc.Lookup(t.key(i), &v));
      REQUIRE_FALSE(arc.Contains(t.key(i)));
    }
  }
}
