// Store-level behaviour: key range and value limits, segments created on
// demand, sparse key spaces, and reopening without reading the data files.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "engine/flat_index.h"
#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineOptions;
using flatkv::engine::KeyValue;
using flatkv::engine::Store;

namespace {

std::string ValueFor(int64_t key, size_t size) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; ++i) v[i] = static_cast<char>('a' + (key * 31 + i) % 26);
  return v;
}

}  // namespace

TEST_CASE("Store rejects keys below key_min and from key_max up with KeyOutOfRange",
          "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_min = 100;
  o.key_max = 200;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  for (int64_t k : {int64_t{99}, int64_t{200}, int64_t{-1}, INT64_MIN, INT64_MAX}) {
    Status st = store->Put(k, "v");
    REQUIRE(st.IsKeyOutOfRange());
    REQUIRE(st.message().find(std::to_string(k)) != std::string::npos);
    std::string v;
    REQUIRE(store->Get(k, &v).IsKeyOutOfRange());
    REQUIRE(store->Remove(k).IsKeyOutOfRange());
    REQUIRE(store->Append(k, "x").IsKeyOutOfRange());
  }
  REQUIRE(store->Put(100, "first").ok());
  REQUIRE(store->Put(199, "last").ok());
  std::string v;
  REQUIRE(store->Get(199, &v).ok());
  REQUIRE(v == "last");
}

TEST_CASE("Store rejects values over max_value_bytes and keeps the old value",
          "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.max_value_bytes = 1000;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(store->Put(1, std::string(1000, 'a')).ok());
  REQUIRE(store->Put(1, std::string(1001, 'b')).IsValueTooLarge());
  REQUIRE(store->Append(1, "c").IsValueTooLarge());  // would make it 1001 bytes
  std::string v;
  REQUIRE(store->Get(1, &v).ok());
  REQUIRE(v == std::string(1000, 'a'));
}

TEST_CASE("Store refuses bad options with a message naming the key", "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  std::unique_ptr<Store> store;
  SECTION("item width") {
    o.index_item_bytes = 9;
    Status st = Store::Open(o, &store);
    REQUIRE(st.IsInvalidArgument());
    REQUIRE(st.message().find("storage.index_item_bytes") != std::string::npos);
  }
  SECTION("empty range") {
    o.key_min = 10;
    o.key_max = 10;
    REQUIRE(Store::Open(o, &store).IsInvalidArgument());
  }
  SECTION("data files") {
    o.data_files = 0;
    REQUIRE(Store::Open(o, &store).IsInvalidArgument());
  }
}

TEST_CASE("A few hundred random keys over 2^40 cost a few MB, not gigabytes",
          "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_max = int64_t{1} << 40;  // default segment_keys 2^24: 65536 possible segments
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::mt19937_64 rng(7);
  std::vector<int64_t> keys;
  for (int i = 0; i < 300; ++i) {
    keys.push_back(static_cast<int64_t>(rng() % (uint64_t{1} << 40)));
    REQUIRE(store->Put(keys.back(), ValueFor(keys.back(), 100)).ok());
  }
  REQUIRE(store->GetStats().segments >= 290);  // nearly one segment per key
  const uint64_t disk = flatkv::test::AllocatedBytes(o.path);
  INFO("disk bytes after 300 random keys: " << disk);
  REQUIRE(disk < 8u << 20);
  store.reset();
  REQUIRE(flatkv::test::AllocatedBytes(o.path) < 8u << 20);
  REQUIRE(Store::Open(o, &store).ok());
  for (int64_t k : keys) {
    std::string v;
    REQUIRE(store->Get(k, &v).ok());
    REQUIRE(v == ValueFor(k, 100));
  }
}

TEST_CASE("A store with 1M keys reopens without reading its data files", "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.checkpoint_interval_ms = 0;
  constexpr int64_t kKeys = 1000000;
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int64_t k = 0; k < kKeys; ++k) REQUIRE(store->Put(k, ValueFor(k, 16)).ok());
  }
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(store->GetStats().recovery_bytes_scanned == 0);
  REQUIRE(store->GetStats().index_rebuilds == 0);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const int64_t k = static_cast<int64_t>(rng() % kKeys);
    std::string v;
    REQUIRE(store->Get(k, &v).ok());
    REQUIRE(v == ValueFor(k, 16));
  }
  std::string v;
  REQUIRE(store->Get(kKeys, &v).IsNotFound());
}

TEST_CASE("A killed store replays only the log tail past its checkpoint", "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.checkpoint_interval_ms = 0;
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::unique_ptr<Store> store;
    if (!Store::Open(o, &store).ok()) _exit(1);
    for (int64_t k = 0; k < 10000; ++k) {
      if (!store->Put(k, ValueFor(k, 100)).ok()) _exit(1);
    }
    if (!store->Checkpoint().ok()) _exit(1);
    for (int64_t k = 10000; k < 10100; ++k) {
      if (!store->Put(k, ValueFor(k, 100)).ok()) _exit(1);
    }
    _exit(0);  // no Close(): as if killed
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  // Exactly the 100 records written after the checkpoint, not all 10100.
  REQUIRE(store->GetStats().recovery_records == 100);
  REQUIRE(store->GetStats().recovery_bytes_scanned > 0);
  for (int64_t k = 0; k < 10100; ++k) {
    std::string v;
    REQUIRE(store->Get(k, &v).ok());
    REQUIRE(v == ValueFor(k, 100));
  }
}

TEST_CASE("Scans walk keys across segments in both directions and resume", "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.segment_keys = 1000;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  const std::vector<int64_t> keys = {5, 999, 1000, 54321, 54322, 999999};
  for (int64_t k : keys) REQUIRE(store->Put(k, std::to_string(k)).ok());
  std::vector<KeyValue> out;
  int64_t next = 0;
  bool done = false;
  REQUIRE(store->Scan(999, false, 3, &out, &next, &done).ok());
  REQUIRE(out.size() == 3);
  REQUIRE(out[0].key == 999);
  REQUIRE(out[2].key == 54321);
  REQUIRE(!done);
  REQUIRE(store->Scan(next, false, 10, &out, &next, &done).ok());
  REQUIRE(out.size() == 2);
  REQUIRE(out[1].value == "999999");
  REQUIRE(done);
  REQUIRE(store->Scan(54321, true, 10, &out, &next, &done).ok());
  REQUIRE(out.size() == 4);
  REQUIRE(out[0].key == 54321);
  REQUIRE(out[3].key == 5);
  REQUIRE(done);
  REQUIRE(store->ScanLog("garbage", 10, &out, nullptr, &done).IsInvalidArgument());
}

TEST_CASE("sync: interval makes written files durable in the background", "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.sync = flatkv::engine::SyncMode::kInterval;
  o.sync_interval_ms = 200;
  o.checkpoint_interval_ms = 0;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(store->Put(1, "one").ok());
  REQUIRE(store->Put(2, "two").ok());
  REQUIRE(store->GetStats().fdatasyncs == 0);  // a put does not wait for the disk
  for (int i = 0; i < 300 && store->GetStats().fdatasyncs < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(store->GetStats().fdatasyncs == 2);  // one per written data file
  // Nothing new written: the next rounds sync nothing.
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  REQUIRE(store->GetStats().fdatasyncs == 2);
}

TEST_CASE("Store::PutBatch writes every pair in order across segments and data files",
          "[engine][store][batch]") {
  for (auto sync : {flatkv::engine::SyncMode::kNone, flatkv::engine::SyncMode::kAlways}) {
    flatkv::test::TempDir dir;
    EngineOptions o;
    o.path = dir / "s";
    o.segment_keys = 1000;
    o.data_files = 4;
    o.sync = sync;
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    std::vector<std::string> values;
    std::vector<flatkv::engine::KeyValueRef> batch;
    for (int64_t k = 990; k < 1010; ++k) values.push_back(ValueFor(k, 50));
    for (int64_t k = 990; k < 1010; ++k) batch.push_back({k, values[k - 990]});
    batch.push_back({995, "second write of 995 wins"});  // same key twice: the last wins
    REQUIRE(store->PutBatch(batch).ok());
    auto check = [&] {
      for (int64_t k = 990; k < 1010; ++k) {
        std::string v;
        REQUIRE(store->Get(k, &v).ok());
        REQUIRE(v == (k == 995 ? "second write of 995 wins" : values[k - 990]));
      }
    };
    check();
    REQUIRE(store->Close().ok());
    store.reset();
    REQUIRE(Store::Open(o, &store).ok());
    check();
  }
}

TEST_CASE("Store::PutBatch with one bad key or value writes nothing", "[engine][store][batch]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_max = 100;
  o.max_value_bytes = 10;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::vector<flatkv::engine::KeyValueRef> batch = {{1, "a"}, {100, "b"}};
  REQUIRE(store->PutBatch(batch).IsKeyOutOfRange());
  batch = {{1, "a"}, {2, "0123456789x"}};
  REQUIRE(store->PutBatch(batch).IsValueTooLarge());
  std::string v;
  REQUIRE(store->Get(1, &v).IsNotFound());
}

namespace {

using flatkv::engine::EngineStats;

// Slots read and empty runs jumped by the scans run in "body".
struct ScanCost {
  uint64_t slots = 0;
  uint64_t skips = 0;
};
template <typename F>
ScanCost CostOf(const Store& store, F body) {
  const EngineStats before = store.GetStats();
  body();
  const EngineStats after = store.GetStats();
  return {after.scan_slots_visited - before.scan_slots_visited,
          after.scan_regions_skipped - before.scan_regions_skipped};
}

// Every key a resumed scan returns, page by page; checks each page against
// the contract on the way (at most "page" pairs, a resume key in bounds).
std::vector<int64_t> ScanKeys(const Store& store, int64_t from, bool reverse, size_t page,
                              int64_t lo = INT64_MIN, int64_t hi = INT64_MAX,
                              size_t* short_pages = nullptr) {
  std::vector<int64_t> keys;
  std::vector<KeyValue> out;
  bool done = false;
  for (int calls = 0; !done; ++calls) {
    REQUIRE(calls < 1000000);
    int64_t next = 0;
    REQUIRE(store.Scan(from, reverse, page, lo, hi, &out, &next, &done).ok());
    REQUIRE(out.size() <= page);
    for (const KeyValue& kv : out) {
      REQUIRE(kv.value == std::to_string(kv.key));
      keys.push_back(kv.key);
    }
    if (!done) {
      REQUIRE(next >= lo);
      REQUIRE(next <= hi);
      if (!out.empty()) REQUIRE((reverse ? next < out.back().key : next > out.back().key));
      if (out.size() < page && short_pages != nullptr) ++*short_pages;
      from = next;
    }
  }
  return keys;
}

std::vector<int64_t> Expected(const std::vector<int64_t>& sorted_keys, int64_t from,
                              bool reverse, int64_t lo, int64_t hi) {
  std::vector<int64_t> want;
  for (int64_t k : sorted_keys) {
    if (k >= lo && k <= hi && (reverse ? k <= from : k >= from)) want.push_back(k);
  }
  if (reverse) std::reverse(want.begin(), want.end());
  return want;
}

}  // namespace

TEST_CASE("Scan past the last key of a segment visits only non-empty slot groups",
          "[engine][scan]") {
  flatkv::test::TempDir dir;
  EngineOptions o;  // default: 2^24 keys per segment
  o.path = dir / "s";
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  for (int64_t k = 0; k < 2000; ++k) REQUIRE(store->Put(k, std::to_string(k)).ok());
  const uint64_t group = flatkv::engine::FlatIndex::kGroupSlots;
  const uint64_t groups = o.segment_keys / group;
  const uint64_t chunks = o.segment_keys / flatkv::engine::FlatIndex::kChunkSlots;
  std::vector<KeyValue> out;
  int64_t next = 0;
  bool done = false;
  // The old walk read all 2^24 - 1950 slots to the segment's end here.
  ScanCost cost = CostOf(*store, [&] {
    REQUIRE(store->Scan(1950, false, 100, &out, &next, &done).ok());
  });
  REQUIRE(out.size() == 50);
  REQUIRE(out.back().key == 1999);
  REQUIRE(done);
  CHECK(cost.slots <= group);            // the rest of key 1950's group
  CHECK(cost.skips <= groups + chunks);  // one step per empty group/chunk
  // Starting in an empty group past every key: no slot read at all.
  cost = CostOf(*store, [&] { REQUIRE(store->Scan(5000, false, 10, &out, &next, &done).ok()); });
  REQUIRE(out.empty());
  REQUIRE(done);
  CHECK(cost.slots == 0);
  CHECK(cost.skips <= groups + chunks);
  // Reverse from far past the segment: straight down to the last keys.
  for (int64_t from : {int64_t{1000000000000}, INT64_MAX}) {
    cost = CostOf(*store, [&] { REQUIRE(store->Scan(from, true, 10, &out, &next, &done).ok()); });
    REQUIRE(out.size() == 10);
    REQUIRE(out.front().key == 1999);
    REQUIRE(out.back().key == 1990);
    REQUIRE(!done);
    REQUIRE(next == 1989);
    CHECK(cost.slots <= group);
    CHECK(cost.skips <= groups + chunks);
  }
}

TEST_CASE("Scan over a segment whose keys were all removed reads no slot, before and after a "
          "reopen", "[engine][scan]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  const int64_t seg = static_cast<int64_t>(o.segment_keys);
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  for (int64_t k = 0; k < 100; ++k) REQUIRE(store->Put(k, std::to_string(k)).ok());
  // Segment 1 gets 2,000 keys (whole pages of slots), then loses them all;
  // its index pages stay allocated on disk.
  for (int64_t k = seg; k < seg + 2000; ++k) REQUIRE(store->Put(k, std::to_string(k)).ok());
  for (int64_t k = seg; k < seg + 2000; ++k) REQUIRE(store->Remove(k).ok());
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<KeyValue> out;
    int64_t next = 0;
    bool done = false;
    ScanCost cost = CostOf(*store, [&] {
      REQUIRE(store->Scan(seg, false, 10, &out, &next, &done).ok());
    });
    REQUIRE(out.empty());
    REQUIRE(done);
    CHECK(cost.slots == 0);
    CHECK(cost.skips == 1);  // the whole segment in one step
    // Reverse from the top crosses segment 1 in one step, then finds 99.
    cost = CostOf(*store, [&] {
      REQUIRE(store->Scan(INT64_MAX, true, 1, &out, &next, &done).ok());
    });
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].key == 99);
    CHECK(cost.slots <= flatkv::engine::FlatIndex::kGroupSlots);
    // The counts are rebuilt from the allocated pages at open.
    store.reset();
    REQUIRE(Store::Open(o, &store).ok());
  }
}

TEST_CASE("A bounded scan returns only keys in [lo, hi], down to the i64 extremes",
          "[engine][scan]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_min = INT64_MIN;
  o.key_max = INT64_MAX;  // so INT64_MAX - 1 is the largest key
  o.segment_keys = 1000;
  o.data_files = 3;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  const std::vector<int64_t> keys = {INT64_MIN,      INT64_MIN + 1, INT64_MIN + 999,
                                     INT64_MIN + 1000, -1001,       -1000,
                                     -1,             0,             5,
                                     999,            1000,          54321,
                                     INT64_MAX - 1001, INT64_MAX - 2, INT64_MAX - 1};
  for (int64_t k : keys) REQUIRE(store->Put(k, std::to_string(k)).ok());
  const std::vector<std::pair<int64_t, int64_t>> bounds = {
      {INT64_MIN, INT64_MAX}, {INT64_MIN, INT64_MIN}, {INT64_MAX, INT64_MAX},
      {INT64_MAX - 1, INT64_MAX}, {INT64_MIN, -1},    {0, INT64_MAX},
      {-1000, 999},           {1, 998},               {5, 5},
      {6, 6},                 {INT64_MIN + 1, INT64_MAX - 2}};
  const std::vector<int64_t> froms = {INT64_MIN, INT64_MIN + 1, -1000, 0, 5, 1000,
                                      INT64_MAX - 2, INT64_MAX};
  for (auto [lo, hi] : bounds) {
    for (int64_t from : froms) {
      for (bool reverse : {false, true}) {
        for (size_t page : {size_t{1}, size_t{2}, size_t{100}}) {
          INFO("lo " << lo << " hi " << hi << " from " << from << " reverse " << reverse
                     << " page " << page);
          REQUIRE(ScanKeys(*store, from, reverse, page, lo, hi) ==
                  Expected(keys, from, reverse, lo, hi));
        }
      }
    }
  }
  // The unbounded Scan is the bounded one over the whole i64 range.
  std::vector<KeyValue> out;
  int64_t next = 0;
  bool done = false;
  REQUIRE(store->Scan(INT64_MIN, false, 100, &out, &next, &done).ok());
  REQUIRE(out.size() == keys.size());
  REQUIRE(done);
  // A from past the bounds returns nothing; empty bounds are an error.
  REQUIRE(store->Scan(100, false, 10, 0, 99, &out, &next, &done).ok());
  REQUIRE((out.empty() && done));
  REQUIRE(store->Scan(-1, true, 10, 0, 99, &out, &next, &done).ok());
  REQUIRE((out.empty() && done));
  REQUIRE(store->Scan(0, false, 10, 5, 4, &out, &next, &done).IsInvalidArgument());
  REQUIRE(store->Scan(0, false, 0, 0, 4, &out, &next, &done).IsInvalidArgument());
}

TEST_CASE("A scan call stops at its work allowance and resumes to return every key in order",
          "[engine][scan]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_min = -5000000;
  o.segment_keys = 1 << 20;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  // 1,000 keys, 1,000 apart: each slot group holds at most one, so a call
  // with the default allowance reads 512 slots per key and stops early.
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 1000; ++i) keys.push_back(i * 1000);
  // And a few scattered over other segments, below and far above.
  for (int64_t k : {-4999999, -1234567, 7777777, 123456789}) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  for (int64_t k : keys) REQUIRE(store->Put(k, std::to_string(k)).ok());

  std::vector<KeyValue> out;
  int64_t next = 0;
  bool done = true;
  ScanCost cost = CostOf(*store, [&] { REQUIRE(store->Scan(0, false, 1000, &out, &next, &done).ok()); });
  REQUIRE(!done);
  REQUIRE(!out.empty());
  REQUIRE(out.size() < 1000);
  CHECK(cost.slots + cost.skips <= Store::kScanWork);
  REQUIRE(next > out.back().key);

  for (uint64_t work : {uint64_t{1}, uint64_t{2}, uint64_t{7}, uint64_t{600}, Store::kScanWork}) {
    store->TEST_SetScanWork(work);
    for (bool reverse : {false, true}) {
      for (size_t page : {size_t{1}, size_t{3}, size_t{1000}}) {
        INFO("work " << work << " reverse " << reverse << " page " << page);
        size_t short_pages = 0;
        const int64_t from = reverse ? INT64_MAX : INT64_MIN;
        REQUIRE(ScanKeys(*store, from, reverse, page, INT64_MIN, INT64_MAX, &short_pages) ==
                Expected(keys, from, reverse, INT64_MIN, INT64_MAX));
        // Pages whose keys cost more than the allowance (a group of slots
        // read per key) must have come back short.
        if (page > 1 && page * flatkv::engine::FlatIndex::kGroupSlots > work) {
          CHECK(short_pages > 0);
        }
      }
    }
  }
}

namespace {

// Descriptors this process has open now.
size_t OpenDescriptors() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("Store with 200 segments stays under a 256-descriptor limit and serves every key",
          "[engine][store][open_files]") {
  flatkv::test::TempDir dir;
  // The soft limit of this test process (ctest runs each case alone): a
  // descriptor past 255 fails with EMFILE.
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit lim{std::min<rlim_t>(256, old.rlim_max), old.rlim_max};
  REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0);
  EngineOptions o;
  o.path = dir / "s";
  o.segment_keys = 64;
  o.data_files = 16;
  o.max_open_files = 100;  // 5 tables of 17 descriptors
  constexpr int kSegments = 200;
  // 16 keys per segment: one in each data file, so a table open holds 17.
  auto key_of = [](int seg, int i) { return int64_t{seg} * 64 + i * 3; };
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int seg = 0; seg < kSegments; ++seg) {
      for (int i = 0; i < 16; ++i) {
        const int64_t k = key_of(seg, i);
        INFO("key " << k);
        REQUIRE(store->Put(k, ValueFor(k, 40)).ok());
      }
    }
    CHECK(store->GetStats().segments == kSegments);
    CHECK(store->GetStats().segments_open <= 6);
    CHECK(store->GetStats().segment_closes >= kSegments - 6);
    CHECK(OpenDescriptors() < 200);
    // Every key readable (reopening closed tables), and overwritable.
    for (int seg = kSegments - 1; seg >= 0; --seg) {
      for (int i = 0; i < 16; ++i) {
        const int64_t k = key_of(seg, i);
        std::string v;
        INFO("key " << k);
        REQUIRE(store->Get(k, &v).ok());
        REQUIRE(v == ValueFor(k, 40));
      }
      REQUIRE(store->Put(key_of(seg, 0), "new").ok());
      REQUIRE(store->Append(key_of(seg, 1), "+").ok());
    }
    CHECK(store->GetStats().segment_opens > 0);
    // A batch over every segment is written in rounds within the budget.
    std::vector<flatkv::engine::KeyValueRef> batch;
    std::vector<std::string> values;
    for (int seg = 0; seg < kSegments; ++seg) values.push_back("batch" + std::to_string(seg));
    for (int seg = 0; seg < kSegments; ++seg) batch.push_back({key_of(seg, 2), values[seg]});
    REQUIRE(store->PutBatch(batch).ok());
    // A forward and a reverse scan see every key, crossing closed tables.
    for (bool reverse : {false, true}) {
      int64_t from = reverse ? int64_t{kSegments} * 64 : 0;
      bool done = false;
      size_t seen = 0;
      while (!done) {
        std::vector<KeyValue> out;
        int64_t next = 0;
        REQUIRE(store->Scan(from, reverse, 1000, &out, &next, &done).ok());
        seen += out.size();
        from = next;
      }
      CHECK(seen == size_t{kSegments} * 16);
    }
    // The insertion-order scan too.
    std::string cursor;
    size_t logged = 0;
    for (bool done = false; !done;) {
      std::vector<KeyValue> out;
      std::string next;
      REQUIRE(store->ScanLog(cursor, 1000, &out, &next, &done).ok());
      logged += out.size();
      cursor = next;
    }
    CHECK(logged == size_t{kSegments} * 16);
    bool existed = false;
    REQUIRE(store->Remove(key_of(7, 5), &existed).ok());
    CHECK(existed);
    CHECK(OpenDescriptors() < 200);
  }
  // Reopened: only the budget's tables stay open; the values survived.
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  CHECK(store->GetStats().segments_open <= 6);
  for (int seg = 0; seg < kSegments; ++seg) {
    std::string v;
    REQUIRE(store->Get(key_of(seg, 0), &v).ok());
    CHECK(v == "new");
    REQUIRE(store->Get(key_of(seg, 1), &v).ok());
    CHECK(v == ValueFor(key_of(seg, 1), 40) + "+");
    REQUIRE(store->Get(key_of(seg, 2), &v).ok());
    CHECK(v == "batch" + std::to_string(seg));
  }
  CHECK(store->Exists(key_of(7, 5)).IsNotFound());
  REQUIRE(store->CompactAndWait().ok());
  std::string v;
  REQUIRE(store->Get(key_of(150, 3), &v).ok());
  CHECK(v == ValueFor(key_of(150, 3), 40));
  CHECK(OpenDescriptors() < 200);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
}

TEST_CASE("Store closes and reopens tables under concurrent readers and writers",
          "[engine][store][open_files]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.segment_keys = 32;
  o.data_files = 4;
  o.max_open_files = 15;  // 3 tables for 40 segments in use
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  constexpr int64_t kKeys = 40 * 32;
  for (int64_t k = 0; k < kKeys; ++k) REQUIRE(store->Put(k, std::to_string(k)).ok());
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 3000 && !failed.load(); ++i) {
        const auto k = static_cast<int64_t>(rng() % kKeys);
        std::string v;
        if (t % 2 == 0) {
          if (!store->Get(k, &v).ok() || (v != std::to_string(k) && v != std::string("w").append(std::to_string(k)))) {
            failed.store(true);
          }
        } else if (!store->Put(k, std::string("w").append(std::to_string(k))).ok()) {
          failed.store(true);
        }
      }
    });
  }
  threads.emplace_back([&] {  // a compaction round meanwhile
    if (!store->CompactAndWait().ok()) failed.store(true);
  });
  for (auto& th : threads) th.join();
  CHECK_FALSE(failed.load());
  CHECK(store->GetStats().segment_closes > 0);
  CHECK(store->GetStats().segments_open <= 4);
  for (int64_t k = 0; k < kKeys; ++k) {
    std::string v;
    REQUIRE(store->Get(k, &v).ok());
    CHECK((v == std::to_string(k) || v == std::string("w").append(std::to_string(k))));
  }
}

// The importer's percent rests on this estimate (a ring change's total): it
// must follow where the keys are, not how wide the range is.
TEST_CASE("Store estimates the live bytes of a key range from the index",
          "[engine][store]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_min = 0;
  o.key_max = int64_t{1} << 30;
  o.segment_keys = uint64_t{1} << 24;  // one segment spans every range below
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  // 2000 keys of 1000 bytes at [1000, 3000), 6000 more at [5,000,000, 5,006,000).
  for (int64_t k = 1000; k < 3000; ++k) REQUIRE(store->Put(k, ValueFor(k, 1000)).ok());
  for (int64_t k = 5000000; k < 5006000; ++k) REQUIRE(store->Put(k, ValueFor(k, 1000)).ok());
  const double all = static_cast<double>(store->LiveBytesEstimate());
  // A narrow range holding a quarter of the keys, and a wide one holding
  // three quarters; an empty one.
  const double narrow = static_cast<double>(store->LiveBytesEstimate(0, 4000, 0.0));
  const double wide = static_cast<double>(store->LiveBytesEstimate(4000, 10000000, 0.0));
  INFO("all " << all << ", narrow " << narrow << ", wide " << wide);
  CHECK(narrow > 0.2 * all);
  CHECK(narrow < 0.3 * all);
  CHECK(wide > 0.7 * all);
  CHECK(wide < 0.8 * all);
  CHECK(store->LiveBytesEstimate(20000000, 30000000, 0.0) == 0);
  // A removed key no longer counts.
  for (int64_t k = 1000; k < 3000; ++k) REQUIRE(store->Remove(k).ok());
  CHECK(static_cast<double>(store->LiveBytesEstimate(0, 4000, 0.0)) < 0.01 * all);
}

TEST_CASE("Every kind of operation runs beside table closes, reopens and compactions",
          "[engine][store][open_files]") {
  // For ThreadSanitizer above all (docs/testing.md, "Running the tests"): a budget of two
  // tables for 24 segments, so nearly every operation reopens a table that
  // CloseIdle is closing or has closed, while the compactor (automatic, and
  // rounds on request) replaces tables under them. Each writer owns its
  // keys and checks its reads; every value is checked at the end.
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.segment_keys = 64;
  o.data_files = 4;
  o.string_slots = 256;
  o.max_open_files = 10;  // two tables of five descriptors
  o.compaction_garbage_ratio = 0.3;
  o.compaction_min_bytes = 4096;
  constexpr int kWriters = 3;
  constexpr int64_t kKeys = 24 * 64;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::vector<std::map<int64_t, std::string>> models(kWriters);
  std::atomic<bool> stop{false};
  flatkv::test::ThreadFailures failures;
  auto fail = [&](const std::string& what) { failures.Add(what); };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      auto& model = models[w];
      for (int i = 0; i < 2500 && failures.count() == 0; ++i) {
        const int64_t k = w + static_cast<int64_t>(rng() % (kKeys / kWriters)) * kWriters;
        const std::string v = std::to_string(k) + ":" + std::to_string(i);
        switch (rng() % 7) {
          case 0: {
            std::string got;
            Status st = store->Get(k, &got);
            auto it = model.find(k);
            if (it == model.end() ? !st.IsNotFound() : (!st.ok() || got != it->second)) {
              fail("get " + std::to_string(k) + ": " + st.ToString());
            }
            break;
          }
          case 1:
            if (!store->Remove(k).ok()) fail("remove");
            model.erase(k);
            break;
          case 2:
            if (!store->Append(k, "+").ok()) fail("append");
            model[k] += "+";
            break;
          case 3: {
            std::vector<flatkv::engine::KeyValueRef> batch;
            std::vector<std::string> values;
            for (int b = 0; b < 4; ++b) {
              values.push_back(v + "b" + std::to_string(b));
            }
            for (int b = 0; b < 4; ++b) {
              const int64_t bk = (k + int64_t{b} * 64 * kWriters) % kKeys;
              batch.push_back({bk, values[static_cast<size_t>(b)]});
            }
            if (!store->PutBatch(batch).ok()) fail("batch");
            for (const auto& p : batch) model[p.key] = std::string(p.value);
            break;
          }
          case 4: {
            std::vector<KeyValue> out;
            int64_t next = 0;
            bool done = false;
            if (!store->Scan(k, rng() % 2 == 0, 20, &out, &next, &done).ok()) fail("scan");
            break;
          }
          case 5: {
            const std::string sk = "s" + std::to_string(w) + "-" + std::to_string(rng() % 50);
            if (!store->SPut(sk, v).ok()) fail("sput");
            std::string got;
            if (!store->SGet(sk, &got).ok() || got != v) fail("sget " + sk);
            break;
          }
          default:
            if (!store->Put(k, v).ok()) fail("put");
            model[k] = v;
        }
      }
    });
  }
  std::thread logger([&] {  // insertion-order scans across closed tables
    while (!stop.load() && failures.count() == 0) {
      std::string cursor;
      for (bool done = false; !done && failures.count() == 0;) {
        std::vector<KeyValue> out;
        std::string next;
        if (!store->ScanLog(cursor, 100, &out, &next, &done).ok()) fail("scanlog");
        cursor = next;
      }
    }
  });
  std::thread compactor([&] {
    for (int r = 0; r < 3 && failures.count() == 0; ++r) {
      if (!store->CompactAndWait().ok()) fail("compaction round");
    }
  });
  for (auto& t : threads) t.join();
  compactor.join();
  stop.store(true);
  logger.join();
  INFO(failures.first());
  REQUIRE(failures.count() == 0);
  CHECK(store->GetStats().segment_closes > 0);
  CHECK(store->GetStats().segment_opens > 0);
  CHECK(store->GetCompactionStatus().tables_compacted > 0);
  for (const auto& model : models) {
    for (const auto& [k, v] : model) {
      std::string got;
      INFO("key " << k);
      REQUIRE(store->Get(k, &got).ok());
      REQUIRE(got == v);
    }
  }
}

// ---- Reads through the read mappings (LogFile::MappedRange) ----

namespace {

// Distinct for every key (the key's digits, then letters).
std::string UniqueValue(int64_t key, size_t size) {
  std::string v = std::to_string(key) + ":" + ValueFor(key, size);
  v.resize(size);
  return v;
}

// Read mappings of data files in this process (lines of /proc/self/maps).
size_t DataFileMappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/data-") != std::string::npos && line.find(".log") != std::string::npos) ++n;
  }
  return n;
}

void CheckAll(Store& store, int64_t from, int64_t to, size_t size) {
  for (int64_t k = from; k < to; ++k) {
    std::string v;
    INFO("key " << k);
    REQUIRE(store.Get(k, &v).ok());
    REQUIRE(v == UniqueValue(k, size));
  }
}

}  // namespace

TEST_CASE("Gets are right on both sides of a 64 MiB read-mapping chunk edge, compacted and reopened",
          "[engine][store][mmap]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.data_files = 1;  // one file, records back to back: record i at i * 1032
  o.compaction_garbage_ratio = 0;
  constexpr size_t kSize = 1000;
  const int64_t keys = static_cast<int64_t>((66u << 20) / (kSize + 32));  // past 64 MiB
  // The record that straddles the chunk edge at 64 MiB.
  const int64_t edge = static_cast<int64_t>((64u << 20) / (kSize + 32));
  REQUIRE(edge * static_cast<int64_t>(kSize + 32) < (64 << 20));
  REQUIRE((edge + 1) * static_cast<int64_t>(kSize + 32) > (64 << 20));
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int64_t k = 0; k < keys; ++k) REQUIRE(store->Put(k, UniqueValue(k, kSize)).ok());
    CheckAll(*store, 0, keys, kSize);
    CheckAll(*store, edge - 3, edge + 4, kSize);
    // Overwrites grow the file past what the reads above mapped.
    for (int64_t k = 0; k < keys; k += 7) REQUIRE(store->Put(k, UniqueValue(k + 1, kSize)).ok());
    for (int64_t k = 0; k < keys; ++k) {
      std::string v;
      REQUIRE(store->Get(k, &v).ok());
      REQUIRE(v == UniqueValue(k % 7 == 0 ? k + 1 : k, kSize));
    }
    REQUIRE(store->CompactAndWait().ok());
    for (int64_t k = 0; k < keys; k += 7) REQUIRE(store->Put(k, UniqueValue(k, kSize)).ok());
    CheckAll(*store, 0, keys, kSize);
  }
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  CheckAll(*store, 0, keys, kSize);
}

TEST_CASE("Gets read new records while the data file grows and compactions replace it",
          "[engine][store][mmap]") {
  // For ThreadSanitizer as well: readers take the mapped path (and extend
  // the mappings) while a writer appends and the compactor switches tables.
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.data_files = 2;
  o.compaction_garbage_ratio = 0;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  constexpr int64_t kKeys = 20000;
  std::atomic<int64_t> written{0};
  std::atomic<bool> failed{false};
  // The writer starts once both readers run: on a busy machine the readers
  // could otherwise be scheduled only after its last put, read nothing,
  // and fail the reads > 0 check below without an engine fault.
  std::atomic<int> readers_running{0};
  std::thread writer([&] {
    while (readers_running.load() < 2) std::this_thread::yield();
    for (int64_t k = 0; k < kKeys && !failed; ++k) {
      if (!store->Put(k, UniqueValue(k, 100 + k % 300)).ok()) failed = true;
      written.store(k + 1, std::memory_order_release);
      if (k % 5000 == 4999 && !store->Compact().ok()) failed = true;
    }
  });
  std::vector<std::thread> readers;
  std::atomic<uint64_t> reads{0};
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      readers_running.fetch_add(1);
      while (!failed && written.load(std::memory_order_acquire) < kKeys) {
        const int64_t n = written.load(std::memory_order_acquire);
        if (n == 0) continue;
        // Mostly the newest keys: their records lie past what was mapped.
        const int64_t k = rng() % 2 ? n - 1 - static_cast<int64_t>(rng() % std::min<int64_t>(n, 16))
                                    : static_cast<int64_t>(rng() % n);
        std::string v;
        if (!store->Get(k, &v).ok() || v != UniqueValue(k, 100 + k % 300)) failed = true;
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  writer.join();
  for (auto& r : readers) r.join();
  REQUIRE_FALSE(failed);
  CHECK(reads.load() > 0);
  for (int64_t k = 0; k < kKeys; ++k) {
    std::string v;
    REQUIRE(store->Get(k, &v).ok());
    REQUIRE(v == UniqueValue(k, 100 + k % 300));
  }
}

TEST_CASE("A record damaged on disk while the store is open fails with Corruption for its key only",
          "[engine][store][mmap]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.data_files = 1;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  for (int64_t k = 0; k < 100; ++k) REQUIRE(store->Put(k, UniqueValue(k, 100)).ok());
  CheckAll(*store, 0, 100, 100);  // every record read once (and mapped)
  // Flip a byte of key 42's value in the file: the page cache, and so the
  // mapping the reads above used, now holds the damaged byte.
  std::string path;
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.path)) {
    if (e.path().filename() == "data-000.log") path = e.path().string();
  }
  REQUIRE(!path.empty());
  const std::string data = flatkv::test::ReadFile(path);
  const size_t at = data.find(UniqueValue(42, 100));
  REQUIRE(at != std::string::npos);
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  const char flipped = static_cast<char>(data[at + 50] ^ 0x20);
  REQUIRE(pwrite(fd, &flipped, 1, static_cast<off_t>(at + 50)) == 1);
  ::close(fd);
  const uint64_t corrupt = store->GetStats().corrupt_records;
  std::string v = "unchanged";
  REQUIRE(store->Get(42, &v).IsCorruption());
  CHECK(v == "unchanged");
  CHECK(store->GetStats().corrupt_records == corrupt + 1);
  CheckAll(*store, 0, 42, 100);
  CheckAll(*store, 43, 100, 100);
  REQUIRE(store->Put(42, "repaired").ok());
  REQUIRE(store->Get(42, &v).ok());
  CHECK(v == "repaired");
}

TEST_CASE("Tables closed for max_open_files release their read mappings and read right reopened",
          "[engine][store][mmap][open_files]") {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.segment_keys = 64;
  o.data_files = 4;
  o.max_open_files = 15;  // three tables of five descriptors
  constexpr int kSegments = 40;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  const int64_t keys = int64_t{kSegments} * 64;
  for (int64_t k = 0; k < keys; ++k) REQUIRE(store->Put(k, UniqueValue(k, 120)).ok());
  for (int round = 0; round < 3; ++round) {
    CheckAll(*store, 0, keys, 120);  // every table reopened, its files mapped
    CHECK(store->GetStats().segments_open <= 4);
    // Open tables' files only: at most 4 tables x 4 files, a chunk each
    // (a mapped part plus the rest of its reservation is one or two lines).
    CHECK(DataFileMappings() <= 4 * 4 * 2);
  }
  CHECK(store->GetStats().segment_closes >= kSegments - 4);
  store.reset();
  CHECK(DataFileMappings() == 0);
}

namespace {

// Pages of "path" in the page cache, or -1 if that cannot be told.
long ResidentPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  const uint64_t size = flatkv::test::FileSize(path);
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const size_t pages = (size + 4095) / 4096;
  std::vector<unsigned char> vec(pages);
  long n = -1;
  if (mincore(p, size, vec.data()) == 0) {
    n = 0;
    for (unsigned char c : vec) n += c & 1;
  }
  munmap(p, size);
  return n;
}

}  // namespace

TEST_CASE("A get of an uncached record within one page brings in that page only",
          "[engine][store][mmap]") {
  // "At most one disk read per get": the read mapping is MADV_RANDOM, so
  // the fault reads the record's page and no read-around.
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.data_files = 1;
  constexpr int64_t kKeys = 2000;  // 132-byte records: about 65 pages
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int64_t k = 0; k < kKeys; ++k) REQUIRE(store->Put(k, UniqueValue(k, 100)).ok());
  }  // closed: synced, so the pages are clean and can be dropped
  std::string path;
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.path)) {
    if (e.path().filename() == "data-000.log") path = e.path().string();
  }
  REQUIRE(!path.empty());
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
  if (ResidentPages(path) != 0) {
    WARN("the page cache kept " << path << " (tmpfs?): nothing to measure here");
    return;
  }
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());  // a clean open reads no log byte
  CHECK(ResidentPages(path) == 0);
  const int64_t key = 1000;  // at 132000: bytes 928..1060 of its page
  REQUIRE((key * 132) % 4096 + 132 <= 4096);
  std::string v;
  REQUIRE(store->Get(key, &v).ok());
  REQUIRE(v == UniqueValue(key, 100));
  CHECK(ResidentPages(path) == 1);
}
