// The ring as a pure value: ownership with wraparound, the key hashes, chain
// order and roles, key-order ranges, node names and the settings JSON.
#include "partition/ring.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <set>

using flatkv::partition::HashRange;
using flatkv::partition::Member;
using flatkv::partition::RecordedChain;
using flatkv::partition::Ring;
using flatkv::partition::RingSettings;

namespace {

std::shared_ptr<const Ring> Marks(std::vector<int64_t> marks) {
  return Ring::Make(1, RingSettings{}, std::move(marks), {});
}

Ring::Registration Reg(int64_t mark, const std::string& host, int port, int64_t czxid) {
  return Ring::Registration{mark, Member{host, port, czxid}};
}

// owner(h) by definition: the smallest mark greater than h, else the first.
int64_t ModelOwner(const std::set<int64_t>& marks, int64_t h) {
  auto it = marks.upper_bound(h);
  return it == marks.end() ? *marks.begin() : *it;
}

}  // namespace

TEST_CASE("A mark owns the hashes from the previous mark up to itself, exclusive", "[partition][ring]") {
  auto ring = Marks({30, 10, 20});
  REQUIRE(ring->partitions().size() == 3);
  CHECK(ring->Owner(10).mark == 20);  // a hash equal to a mark belongs to the next
  CHECK(ring->Owner(9).mark == 10);
  CHECK(ring->Owner(19).mark == 20);
  CHECK(ring->Owner(20).mark == 30);
  CHECK(ring->Owner(29).mark == 30);
}

TEST_CASE("Hashes past the last mark and below the first wrap to the first mark", "[partition][ring]") {
  auto ring = Marks({10, 20, 30});
  CHECK(ring->Owner(30).mark == 10);
  CHECK(ring->Owner(INT64_MAX).mark == 10);
  CHECK(ring->Owner(-5).mark == 10);  // negative integer keys
  CHECK(ring->Owner(INT64_MIN).mark == 10);
}

TEST_CASE("Marks at the i64 extremes own the expected hashes", "[partition][ring]") {
  auto ring = Marks({INT64_MIN, 0, INT64_MAX});
  CHECK(ring->Owner(INT64_MIN).mark == 0);  // the smallest mark greater than MIN
  CHECK(ring->Owner(-1).mark == 0);
  CHECK(ring->Owner(0).mark == INT64_MAX);
  CHECK(ring->Owner(INT64_MAX - 1).mark == INT64_MAX);
  CHECK(ring->Owner(INT64_MAX).mark == INT64_MIN);  // no greater mark: wraps
  const auto ranges = ring->KeyOrder();
  REQUIRE(ranges.size() == 3);
  CHECK(ranges[0].lo == INT64_MIN);
  CHECK(ranges[0].hi == -1);
  CHECK(ring->partitions()[ranges[0].partition].mark == 0);
  CHECK(ranges[2].lo == INT64_MAX);
  CHECK(ranges[2].hi == INT64_MAX);
  CHECK(ring->partitions()[ranges[2].partition].mark == INT64_MIN);
}

TEST_CASE("A ring of one mark owns every hash in one range", "[partition][ring]") {
  auto ring = Marks({42});
  for (int64_t h : {INT64_MIN, int64_t{-1}, int64_t{0}, int64_t{41}, int64_t{42}, INT64_MAX}) {
    CHECK(ring->Owner(h).mark == 42);
  }
  const auto ranges = ring->KeyOrder();
  REQUIRE(ranges.size() == 1);
  CHECK(ranges[0].lo == INT64_MIN);
  CHECK(ranges[0].hi == INT64_MAX);
}

TEST_CASE("Key-order ranges cover the i64 space once, in order, each with its owner", "[partition][ring]") {
  auto ring = Marks({10, 20});
  const auto ranges = ring->KeyOrder();
  REQUIRE(ranges.size() == 3);
  CHECK((ranges[0].lo == INT64_MIN && ranges[0].hi == 9));
  CHECK((ranges[1].lo == 10 && ranges[1].hi == 19));
  CHECK((ranges[2].lo == 20 && ranges[2].hi == INT64_MAX));
  for (const HashRange& r : ranges) {
    CHECK(ring->OwnerIndex(r.lo) == r.partition);
    CHECK(ring->OwnerIndex(r.hi) == r.partition);
  }
  CHECK(ring->RangeOf(15).lo == 10);
  CHECK(ring->RangeOf(INT64_MAX).lo == 20);
}

TEST_CASE("A 1000-mark ring agrees with the definition of owner for random hashes", "[partition][ring]") {
  std::mt19937_64 rng(7);
  std::set<int64_t> marks;
  while (marks.size() < 1000) marks.insert(static_cast<int64_t>(rng()));
  auto ring = Marks(std::vector<int64_t>(marks.begin(), marks.end()));
  REQUIRE(ring->partitions().size() == 1000);
  for (int i = 0; i < 100000; ++i) {
    const int64_t h = static_cast<int64_t>(rng());
    REQUIRE(ring->Owner(h).mark == ModelOwner(marks, h));
  }
  for (int64_t m : marks) {  // at and next to every mark
    REQUIRE(ring->Owner(m).mark == ModelOwner(marks, m));
    if (m > INT64_MIN) REQUIRE(ring->Owner(m - 1).mark == m);
  }
  // Key-order ranges tile the space with no gap or overlap.
  const auto ranges = ring->KeyOrder();
  CHECK(ranges.front().lo == INT64_MIN);
  CHECK(ranges.back().hi == INT64_MAX);
  for (size_t i = 1; i < ranges.size(); ++i) REQUIRE(ranges[i].lo == ranges[i - 1].hi + 1);
}

TEST_CASE("A new mark takes hashes only from the one range it splits", "[partition][ring]") {
  std::mt19937_64 rng(11);
  std::set<int64_t> marks;
  while (marks.size() < 50) marks.insert(static_cast<int64_t>(rng() % 1000000));
  auto before = Marks(std::vector<int64_t>(marks.begin(), marks.end()));
  const int64_t added = 500001;
  REQUIRE(marks.count(added) == 0);
  const int64_t split_owner = before->Owner(added).mark;  // the mark whose range it splits
  marks.insert(added);
  auto after = Marks(std::vector<int64_t>(marks.begin(), marks.end()));
  int moved = 0;
  for (int i = 0; i < 200000; ++i) {
    const int64_t h = static_cast<int64_t>(rng() % 1200000) - 100000;
    const int64_t a = before->Owner(h).mark;
    const int64_t b = after->Owner(h).mark;
    if (a == b) continue;
    ++moved;
    REQUIRE(b == added);        // only to the new mark
    REQUIRE(a == split_owner);  // only from the range it split
  }
  CHECK(moved > 0);
}

TEST_CASE("String keys hash with XXH64 seed 0 modulo the hash bound", "[partition][ring]") {
  // XXH64("", 0) and XXH64("a", 0) are published test vectors.
  CHECK(Ring::HashString("", INT64_MAX) ==
        static_cast<int64_t>(0xEF46DB3751D8E999ull % static_cast<uint64_t>(INT64_MAX)));
  CHECK(Ring::HashString("a", INT64_MAX) ==
        static_cast<int64_t>(0xD24EC4F1A98C6E5Bull % static_cast<uint64_t>(INT64_MAX)));
  CHECK(Ring::HashString("a", 1000) == static_cast<int64_t>(0xD24EC4F1A98C6E5Bull % 1000));
  for (const char* s : {"user:1", "user:2", "\xff\x00"}) {
    const int64_t h = Ring::HashString(s, 1000);
    CHECK((h >= 0 && h < 1000));
  }
  RingSettings small;
  small.hash_bound = 100;
  auto ring = Ring::Make(1, small, {50}, {});
  CHECK(ring->HashString("a") == Ring::HashString("a", 100));
}

TEST_CASE("A chain is ordered by registration, oldest first, and roles follow it", "[partition][ring]") {
  auto ring = Ring::Make(5, RingSettings{}, {10},
                         {Reg(10, "h", 3, 300), Reg(10, "h", 1, 100), Reg(10, "h", 2, 200),
                          Reg(20, "h", 4, 150)});
  REQUIRE(ring->partitions().size() == 2);  // a registration brings its mark
  const auto& chain = ring->Find(10)->chain;
  REQUIRE(chain.size() == 3);
  CHECK(chain[0].port == 1);
  CHECK(chain[2].port == 3);
  CHECK(ring->RoleOf(10, "h:1") == "head");
  CHECK(ring->RoleOf(10, "h:2") == "middle");
  CHECK(ring->RoleOf(10, "h:3") == "tail");
  CHECK(ring->RoleOf(20, "h:4") == "single");
  CHECK(ring->RoleOf(20, "h:1") == "");
  CHECK(ring->RoleOf(99, "h:1") == "");
  using flatkv::partition::ChainRole;
  CHECK(ring->ChainRoleOf(10, "h:1") == ChainRole::kHead);
  CHECK(ring->ChainRoleOf(10, "h:2") == ChainRole::kMiddle);
  CHECK(ring->ChainRoleOf(10, "h:3") == ChainRole::kTail);
  CHECK(ring->ChainRoleOf(20, "h:4") == ChainRole::kSingle);
  CHECK(ring->ChainRoleOf(20, "h:1") == ChainRole::kNone);
  CHECK(ring->version() == 5);
  CHECK(ring->ToString() == "10=[h:1,h:2,h:3] 20=[h:4]");
}

TEST_CASE("A recorded mark with no member stays in the ring with an empty chain", "[partition][ring]") {
  auto ring = Ring::Make(1, RingSettings{}, {10, 20, 20}, {Reg(20, "h", 1, 1)});
  REQUIRE(ring->partitions().size() == 2);
  CHECK(ring->Owner(5).mark == 10);
  CHECK(ring->Owner(5).chain.empty());
  CHECK(ring->Owner(5).head() == nullptr);
  CHECK(ring->Find(20)->tail()->port == 1);
}

TEST_CASE("A standalone ring is mark 0 holding the instance itself", "[partition][ring]") {
  auto ring = Ring::Standalone("127.0.0.1", 9901);
  REQUIRE(ring->partitions().size() == 1);
  CHECK(ring->partitions()[0].mark == 0);
  CHECK(ring->Owner(-7).chain.at(0).address() == "127.0.0.1:9901");
  CHECK(ring->RoleOf(0, "127.0.0.1:9901") == "single");
}

TEST_CASE("Member node names round-trip and foreign names are refused", "[partition][ring]") {
  CHECK(flatkv::partition::MemberNodeName(42, "10.0.0.1:9901") == "thriftbinary42:10.0.0.1:9901");
  int64_t mark = 0;
  std::string host;
  int port = 0;
  REQUIRE(flatkv::partition::ParseMemberNode("thriftbinary-7:node-a:9902", &mark, &host, &port));
  CHECK(mark == -7);
  CHECK(host == "node-a");
  CHECK(port == 9902);
  REQUIRE(flatkv::partition::ParseMemberNode("thriftbinary9223372036854775807:[::1]:1", &mark,
                                             &host, &port));
  CHECK(mark == INT64_MAX);
  CHECK(host == "[::1]");
  for (const char* bad : {"zookeeper", ".cluster", "thriftbinary", "thriftbinaryX:h:1",
                          "thriftbinary1:h", "thriftbinary1:h:0", "thriftbinary1:h:65536",
                          "thriftbinary1::1", "thriftbinary99999999999999999999:h:1"}) {
    INFO(bad);
    CHECK_FALSE(flatkv::partition::ParseMemberNode(bad, &mark, &host, &port));
  }
}

TEST_CASE("Ring settings round-trip through JSON and a difference names the key", "[partition][ring]") {
  RingSettings s;
  CHECK(s.ToJson() == R"({"hash_bound": 9223372036854775807, "replication": "sync"})");
  RingSettings parsed;
  REQUIRE(RingSettings::FromJson(s.ToJson(), &parsed).ok());
  CHECK(parsed.CheckSame(s).ok());
  REQUIRE(RingSettings::FromJson(R"( { "replication" : "async", "hash_bound":100 } )", &parsed).ok());
  CHECK(parsed.hash_bound == 100);
  CHECK(parsed.replication == "async");
  const flatkv::Status diff = s.CheckSame(parsed);
  CHECK(diff.IsInvalidArgument());
  CHECK(diff.message().find("cluster.hash_bound") != std::string::npos);
  parsed.hash_bound = s.hash_bound;
  CHECK(s.CheckSame(parsed).message().find("cluster.replication") != std::string::npos);
  for (const char* bad : {"", "{}", "[]", R"({"hash_bound": 0, "replication": "sync"})",
                          R"({"hash_bound": 5, "replication": "chain"})",
                          R"({"hash_bound": 5})", R"({"hash_bound": 5, "replication": "sync", "x": 1})",
                          R"({"hash_bound": 5, "replication": "sync"} x)"}) {
    INFO(bad);
    CHECK(RingSettings::FromJson(bad, &parsed).IsInvalidArgument());
  }
}

TEST_CASE("A recorded chain round-trips through JSON and anything else is refused",
          "[partition][ring]") {
  RecordedChain c{17, {"127.0.0.1:9001", "127.0.0.1:9002"}};
  CHECK(c.ToJson() == R"({"ring_version": 17, "members": ["127.0.0.1:9001", "127.0.0.1:9002"]})");
  RecordedChain parsed;
  REQUIRE(RecordedChain::FromJson(c.ToJson(), &parsed).ok());
  CHECK(parsed == c);
  REQUIRE(
      RecordedChain::FromJson(R"( {"members":[ "[::1]:5" ] ,"ring_version":0} )", &parsed).ok());
  CHECK(parsed == RecordedChain{0, {"[::1]:5"}});
  for (const char* bad :
       {"", "garbage", "{}", "[]", R"({"ring_version": 1})", R"({"members": ["h:1"]})",
        R"({"ring_version": -1, "members": ["h:1"]})", R"({"ring_version": 1, "members": []})",
        R"({"ring_version": 1, "members": ["h"]})", R"({"ring_version": 1, "members": [1]})",
        R"({"ring_version": 1, "members": "h:1"})", R"({"ring_version": 1, "members": ["h:1",]})",
        R"({"ring_version": 1, "members": ["h:1"], "x": 1})",
        R"({"ring_version": 1, "ring_version": 2, "members": ["h:1"]})",
        R"({"ring_version": 1, "members": ["h:1"]} x)",
        R"({"ring_version": 1, "members": ["h:1")"}) {
    INFO(bad);
    CHECK(RecordedChain::FromJson(bad, &parsed).IsInvalidArgument());
  }
  // Whatever was written by hand, the message is one printable line of bounded size.
  const flatkv::Status s =
      RecordedChain::FromJson(std::string("\0\n{", 3) + std::string(500, 'x'), &parsed);
  CHECK(s.message().find_first_of(std::string("\0\n", 2)) == std::string::npos);
  CHECK(s.message().size() < 250);
}

TEST_CASE("Recorded chains land on their marks, and one of a mark not in the ring is ignored",
          "[partition][ring]") {
  auto ring = Ring::Make(7, RingSettings{}, {10, 20}, {Reg(10, "h", 1, 100), Reg(10, "h", 2, 200)},
                         {{10, RecordedChain{5, {"h:1", "h:2"}}}, {30, RecordedChain{6, {"h:9"}}}});
  REQUIRE(ring->partitions().size() == 2);  // mark 30 is not brought back
  CHECK(ring->Find(10)->recorded == std::vector<std::string>{"h:1", "h:2"});
  CHECK(ring->Find(10)->recorded_ring_version == 5);
  CHECK(ring->Find(20)->recorded.empty());
  CHECK(ring->Find(20)->recorded_ring_version == 0);
  CHECK(ring->ToString() == "10=[h:1,h:2] 20=[]");

  // SameAs sees what ToString does not: recorded chains and czxids.
  auto same = Ring::Make(7, RingSettings{}, {20, 10}, {Reg(10, "h", 2, 200), Reg(10, "h", 1, 100)},
                         {{10, RecordedChain{5, {"h:1", "h:2"}}}});
  CHECK(ring->SameAs(*same));
  auto other_record = Ring::Make(7, RingSettings{}, {10, 20},
                                 {Reg(10, "h", 1, 100), Reg(10, "h", 2, 200)},
                                 {{10, RecordedChain{5, {"h:1"}}}});
  CHECK_FALSE(ring->SameAs(*other_record));
  auto other_czxid = Ring::Make(7, RingSettings{}, {10, 20},
                                {Reg(10, "h", 1, 100), Reg(10, "h", 2, 300)},
                                {{10, RecordedChain{5, {"h:1", "h:2"}}}});
  CHECK_FALSE(ring->SameAs(*other_czxid));
  CHECK_FALSE(ring->SameAs(*Marks({10, 20})));
}

TEST_CASE("RangeOf gives the key-order range holding a hash, for random rings", "[partition][ring]") {
  std::mt19937_64 rng(3);
  for (int round = 0; round < 200; ++round) {
    std::set<int64_t> marks;
    const size_t n = 1 + rng() % 6;
    while (marks.size() < n) {
      const int64_t pick[] = {INT64_MIN, INT64_MAX, 0, static_cast<int64_t>(rng() % 100) - 50,
                              static_cast<int64_t>(rng())};
      marks.insert(pick[rng() % 5]);
    }
    auto ring = Marks(std::vector<int64_t>(marks.begin(), marks.end()));
    const auto ranges = ring->KeyOrder();
    for (const HashRange& r : ranges) {
      for (int64_t h : {r.lo, r.hi}) {
        const HashRange got = ring->RangeOf(h);
        REQUIRE(got.lo == r.lo);
        REQUIRE(got.hi == r.hi);
        REQUIRE(got.partition == r.partition);
      }
    }
  }
}
