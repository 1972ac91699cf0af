// What a ring change moves (server/member/migration.h) and how it is recorded
// (partition::RingChange): the ranges a new mark takes over, a range's
// export from a real store in pages, and the change node's JSON.
#include "partition/change.h"
#include "server/member/migration.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::partition::HashRange;
using flatkv::partition::Ring;
using flatkv::partition::RingChange;
using flatkv::server::ExportRange;
using flatkv::partition::RangesTakenBy;

namespace {

// "v<k>" (built so that GCC 12's -Wrestrict false positive on "lit" + string stays quiet).
std::string Val(int64_t k) { return std::string("v").append(std::to_string(k)); }

std::shared_ptr<const Ring> RingOf(std::vector<int64_t> marks) {
  return Ring::Make(1, {}, std::move(marks), {});
}

}  // namespace

TEST_CASE("a new mark takes the range below it from the mark above it") {
  auto ring = RingOf({100, 200, 300});
  auto r = RangesTakenBy(*ring, 150);
  REQUIRE(r.size() == 1);
  CHECK((r[0].lo == 100 && r[0].hi == 149 && ring->partitions()[r[0].partition].mark == 200));
  // The highest: [300, mark) from the lowest mark, which owns the wrap.
  r = RangesTakenBy(*ring, 400);
  REQUIRE(r.size() == 1);
  CHECK((r[0].lo == 300 && r[0].hi == 399 && ring->partitions()[r[0].partition].mark == 100));
  // The lowest: everything from the highest mark up, and below itself.
  r = RangesTakenBy(*ring, 50);
  REQUIRE(r.size() == 2);
  CHECK((r[0].lo == 300 && r[0].hi == INT64_MAX && r[1].lo == INT64_MIN && r[1].hi == 49));
  CHECK(ring->partitions()[r[0].partition].mark == 100);
  // A mark the ring has, or an empty ring: nothing.
  CHECK(RangesTakenBy(*ring, 200).empty());
  CHECK(RangesTakenBy(*RingOf({}), 5).empty());
  // A ring of one mark: the new one takes [that mark, new) wrapping.
  r = RangesTakenBy(*RingOf({1000}), 1800);
  REQUIRE(r.size() == 1);
  CHECK((r[0].lo == 1000 && r[0].hi == 1799));
}

TEST_CASE("a range exports its integer keys in order and its string keys by hash, in pages") {
  flatkv::test::TempDir dir;
  flatkv::engine::EngineOptions o;
  o.path = dir.path();
  o.key_max = 100000;
  std::unique_ptr<flatkv::engine::Store> store;
  REQUIRE(flatkv::engine::Store::Open(o, &store).ok());
  for (int64_t k = 0; k < 3000; k += 3) REQUIRE(store->Put(k, Val(k)).ok());
  const int64_t bound = 1000;
  std::set<std::string> in_range;
  for (int i = 0; i < 200; ++i) {
    const std::string s = std::string("s").append(std::to_string(i));
    REQUIRE(store->SPut(s, s).ok());
    const int64_t h = Ring::HashString(s, bound);
    if (h >= 400 && h <= 1999) in_range.insert(s);
  }
  std::vector<int64_t> keys;
  std::set<std::string> skeys;
  std::string cursor;
  int pages = 0;
  for (bool done = false; !done; ++pages) {
    flatkv::rpc::ExportPage page;
    REQUIRE(ExportRange(*store, bound, 400, 1999, cursor, 50, &page).ok());
    CHECK(page.pairs.size() + page.spairs.size() <= 50);
    for (const auto& p : page.pairs) {
      keys.push_back(p.key);
      CHECK(p.value == Val(p.key));
    }
    for (const auto& p : page.spairs) skeys.insert(p.key);
    done = page.done;
    cursor = page.cursor;
  }
  std::vector<int64_t> want;
  for (int64_t k = 402; k <= 1999; k += 3) want.push_back(k);
  CHECK(keys == want);
  CHECK(skeys == in_range);
  CHECK(in_range.size() > 50);  // string hashes lie in [0, 1000): [400, 999] holds many
  CHECK(pages > 6);
  // Every string key over the whole hash space.
  skeys.clear();
  cursor.clear();
  for (bool done = false; !done;) {
    flatkv::rpc::ExportPage page;
    REQUIRE(ExportRange(*store, bound, INT64_MIN, INT64_MAX, cursor, 64, &page).ok());
    for (const auto& p : page.spairs) skeys.insert(p.key);
    done = page.done;
    cursor = page.cursor;
  }
  CHECK(skeys.size() == 200);
  flatkv::rpc::ExportPage page;
  CHECK(ExportRange(*store, bound, 0, 10, "zzz", 5, &page).IsInvalidArgument());
  CHECK(ExportRange(*store, bound, 10, 0, "", 5, &page).IsInvalidArgument());
}

TEST_CASE("the ring change node's JSON reads back, and anything else is refused") {
  RingChange c;
  c.mark = 1800;
  c.into = 1800;
  c.source = 1000;
  c.importer = "127.0.0.1:9003";
  c.state = "flip";
  c.ranges = {{1200, 1799}, {INT64_MIN, -5}};
  RingChange back;
  REQUIRE(RingChange::FromJson(c.ToJson(), &back).ok());
  CHECK(back == c);
  c.kind = "remove";
  c.source = 1800;
  c.into = 2000;
  REQUIRE(RingChange::FromJson(c.ToJson(), &back).ok());
  CHECK(back == c);
  CHECK(back.Covers(1500));
  CHECK(back.Covers(INT64_MIN));
  CHECK_FALSE(back.Covers(1800));
  CHECK_FALSE(back.Covers(0));
  for (const char* bad : {
           R"({"kind": "add", "mark": 1, "into": 1, "source": 2, "importer": "h:1", "state": "copy"})",
           R"({"kind": "add", "mark": 1, "into": 3, "source": 2, "importer": "h:1", "state": "copy", "ranges": [[1, 2]]})",
           R"({"kind": "remove", "mark": 1, "into": 3, "source": 2, "importer": "h:1", "state": "copy", "ranges": [[1, 2]]})",
           R"({"kind": "move", "mark": 1, "into": 1, "source": 2, "importer": "h:1", "state": "copy", "ranges": [[1, 2]]})",
           R"({"kind": "add", "mark": 1, "into": 1, "source": 2, "importer": "h", "state": "copy", "ranges": [[1, 2]]})",
           R"({"kind": "add", "mark": 1, "into": 1, "source": 2, "importer": "h:1", "state": "go", "ranges": [[1, 2]]})",
           R"({"kind": "add", "mark": 1, "into": 1, "source": 2, "importer": "h:1", "state": "copy", "ranges": [[3, 2]]})",
           R"({"kind": "add", "mark": 1, "into": 1, "source": 2, "importer": "h:1", "state": "copy", "ranges": [[1, 2]], "x": 1})",
           "not json"}) {
    RingChange out;
    CHECK(RingChange::FromJson(bad, &out).IsInvalidArgument());
  }
}
