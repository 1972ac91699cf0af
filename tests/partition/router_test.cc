// The partition manager's decisions (router.h) against a model, and a
// seeded deterministic simulation of routing while the ring changes: clients
// with stale rings, marks that gain and lose members, new marks that take
// their range's keys. A failing seed is printed and replays exactly with
// FLATKV_SIM_SEED=<seed>.
#include "partition/router.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <random>
#include <set>

using flatkv::partition::Member;
using flatkv::partition::OwnerGroup;
using flatkv::partition::Partition;
using flatkv::partition::Ring;
using flatkv::partition::RingSettings;
using flatkv::partition::Router;
using flatkv::partition::ScanStep;

namespace {

std::shared_ptr<const Ring> MakeRing(int64_t version, const std::map<int64_t, int>& members,
                                     const std::string& replication = "sync") {
  std::vector<int64_t> marks;
  std::vector<Ring::Registration> regs;
  int64_t zxid = 0;
  for (const auto& [mark, n] : members) {
    marks.push_back(mark);
    for (int i = 0; i < n; ++i) {
      std::string host(1, 'm');
      host += std::to_string(mark);
      regs.push_back({mark, Member{host, 1 + i, ++zxid}});
    }
  }
  RingSettings s;
  s.replication = replication;
  return Ring::Make(version, s, marks, regs);
}

// Walks a whole ring-wide scan with Router::Step/After over per-mark stores,
// "page" keys per partition call, as member_handler.cc does.
std::vector<int64_t> RingScan(const Ring& ring, const std::map<int64_t, std::set<int64_t>>& stores,
                              int64_t from, bool reverse, size_t page) {
  std::vector<int64_t> out;
  int64_t cursor = from;
  for (int guard = 0; guard < 100000; ++guard) {
    const ScanStep step = Router::Step(ring, cursor, reverse);
    const auto& keys = stores.at(ring.partitions()[step.partition].mark);
    // One partition call: keys of [lo, hi] from step.from, at most "page".
    std::vector<int64_t> got;
    bool done = true;
    if (!reverse) {
      for (auto it = keys.lower_bound(step.from); it != keys.end() && *it <= step.hi; ++it) {
        if (got.size() == page) { done = false; cursor = *it; break; }
        got.push_back(*it);
      }
    } else {
      for (auto it = keys.upper_bound(step.from); it != keys.begin();) {
        --it;
        if (*it < step.lo) break;
        if (got.size() == page) { done = false; cursor = *it; break; }
        got.push_back(*it);
      }
    }
    out.insert(out.end(), got.begin(), got.end());
    if (!done) continue;
    if (!Router::After(step, reverse, &cursor)) return out;
  }
  FAIL("scan did not end");
  return out;
}

}  // namespace

TEST_CASE("Writes go to the head, sync reads to the tail, async reads to a member, none with no member",
          "[partition][router]") {
  auto ring = MakeRing(1, {{10, 3}, {20, 0}});
  const Partition& p = *ring->Find(10);
  CHECK(Router::Target(p, true, "sync", 7)->port == 1);
  CHECK(Router::Target(p, false, "sync", 7)->port == 3);   // the tail
  CHECK(Router::Target(p, false, "async", 8)->port == 3);  // member 8 % 3
  CHECK(Router::Target(*ring->Find(20), true, "sync", 0) == nullptr);
  // Under async a member of the chain serves its own reads; an instance
  // outside it spreads them over the chain.
  auto async = MakeRing(1, {{10, 3}}, "async");
  const Partition& a = *async->Find(10);
  REQUIRE(a.chain.size() == 3);
  for (int i = 0; i < 6; ++i) {
    CHECK(Router::Target(a, false, "async", static_cast<uint64_t>(i), "m10:2")->port == 2);
    CHECK(Router::Target(a, false, "async", static_cast<uint64_t>(i), "other:9")->port ==
          1 + i % 3);
  }
  CHECK(Router::Target(a, true, "async", 0, "m10:2")->port == 1);  // writes: the head
  Router router(10);
  CHECK(router.IsLocal(*ring, 5));
  CHECK_FALSE(router.IsLocal(*ring, 15));
  CHECK(router.IsLocal(*ring, 25));  // wraps to the first mark
}

TEST_CASE("A batch splits by owner in ring order and keeps request positions",
          "[partition][router]") {
  auto ring = MakeRing(1, {{10, 1}, {20, 1}, {30, 1}});
  const std::vector<int64_t> hashes = {25, 5, 15, 35, 12, 29, -1};
  const auto groups = Router::SplitByOwner(*ring, hashes);
  REQUIRE(groups.size() == 3);
  CHECK(groups[0].partition == 0);
  CHECK(groups[0].positions == std::vector<size_t>{1, 3, 6});  // 5, 35 (wraps), -1
  CHECK(groups[1].positions == std::vector<size_t>{2, 4});
  CHECK(groups[2].positions == std::vector<size_t>{0, 5});
  CHECK(Router::SplitByOwner(*ring, {}).empty());
}

TEST_CASE("Ring scanLog cursors name the partition and survive a mark leaving",
          "[partition][router]") {
  int64_t mark = 0;
  std::string inner;
  const std::string c = Router::EncodeLogCursor(-42, std::string("\0\x01z", 3));
  REQUIRE(Router::DecodeLogCursor(c, &mark, &inner).ok());
  CHECK(mark == -42);
  CHECK(inner == std::string("\0\x01z", 3));
  for (const char* bad : {"x", "r/", "rX/", "r12", "12/"}) {
    INFO(bad);
    CHECK(Router::DecodeLogCursor(bad, &mark, &inner).IsInvalidArgument());
  }
  auto ring = MakeRing(1, {{10, 1}, {30, 1}});
  size_t p = 9;
  REQUIRE(Router::LogPartition(*ring, 20, &p));  // mark 20 left: continue with 30
  CHECK(ring->partitions()[p].mark == 30);
  CHECK_FALSE(Router::LogPartition(*ring, 31, &p));
  REQUIRE(Router::LogPartition(*ring, INT64_MIN, &p));
  CHECK(p == 0);
}

TEST_CASE("Simulation: routing stays exact while rings change and clients lag",
          "[partition][router][sim]") {
  std::vector<uint64_t> seeds;
  if (const char* env = std::getenv("FLATKV_SIM_SEED")) {
    seeds.push_back(std::strtoull(env, nullptr, 10));
  } else {
    for (uint64_t s = 1; s <= 300; ++s) seeds.push_back(s);
  }
  for (uint64_t seed : seeds) {
    INFO("replay with FLATKV_SIM_SEED=" << seed);
    std::mt19937_64 rng(seed);
    const auto pick = [&](int64_t lo, int64_t hi) {
      return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    };
    std::map<int64_t, int> members = {{pick(-1000, 1000), 1}};
    std::map<int64_t, std::set<int64_t>> stores = {{members.begin()->first, {}}};
    std::set<int64_t> acked;  // every acknowledged, not removed key
    int64_t version = 1;
    auto ring = MakeRing(version, members);
    auto client_ring = ring;  // a client's view, refreshed only on NOT_OWNER
    int not_owner = 0;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op == 0) {  // a new mark imports the keys of the range it splits
        const int64_t m = pick(-1200, 1200);
        if (members.count(m)) continue;
        const int64_t old_owner = ring->Owner(m).mark;
        members[m] = 1;
        stores[m];  // its store, empty until the import below
        auto next = MakeRing(++version, members);
        auto& from = stores[old_owner];
        for (auto it = from.begin(); it != from.end();) {
          if (next->Owner(*it).mark == m) {
            REQUIRE(next->Owner(*it).mark != old_owner);
            stores[m].insert(*it);
            it = from.erase(it);
          } else {
            ++it;
          }
        }
        ring = next;
      } else if (op == 1) {  // a member joins or leaves a mark (the data stays)
        auto it = std::next(members.begin(), static_cast<long>(rng() % members.size()));
        it->second = it->second == 0 ? 1 : static_cast<int>(rng() % 3);
        ring = MakeRing(++version, members);
      } else if (op <= 6) {  // a write from the lagging client
        const int64_t key = pick(-1500, 1500);
        const Partition* target = &client_ring->Owner(key);
        // The instance called checks ownership with its own (current) ring.
        if (ring->Owner(key).mark != target->mark) {
          ++not_owner;
          client_ring = ring;  // NOT_OWNER: re-read and route once more
          target = &client_ring->Owner(key);
        }
        REQUIRE(ring->Owner(key).mark == target->mark);
        if (Router::Target(*target, true, "sync", 0) == nullptr) continue;  // UNAVAILABLE
        stores[target->mark].insert(key);
        acked.insert(key);
      } else if (op == 7) {  // a batch: every key lands with its owner
        std::vector<int64_t> batch;
        for (int i = 0; i < 8; ++i) batch.push_back(pick(-1500, 1500));
        size_t seen = 0;
        for (const OwnerGroup& g : Router::SplitByOwner(*ring, batch)) {
          for (size_t pos : g.positions) {
            REQUIRE(ring->OwnerIndex(batch[pos]) == g.partition);
            ++seen;
          }
        }
        REQUIRE(seen == batch.size());
      } else {  // a ring-wide scan, forward or reverse, in small pages
        const bool reverse = op == 9;
        const int64_t from = reverse ? INT64_MAX : INT64_MIN;
        const auto got = RingScan(*ring, stores, from, reverse, 1 + rng() % 5);
        std::vector<int64_t> want(acked.begin(), acked.end());
        if (reverse) std::reverse(want.begin(), want.end());
        REQUIRE(got == want);
      }
      // No key is held by a mark that does not own it, nor by two marks.
      size_t held = 0;
      for (const auto& [mark, keys] : stores) {
        for (int64_t k : keys) REQUIRE(ring->Owner(k).mark == mark);
        held += keys.size();
      }
      REQUIRE(held == acked.size());
    }
    (void)not_owner;
  }
}
