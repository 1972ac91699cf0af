// Store-level behaviour: key range and value limits, segments created on
// demand, sparse key spaces, and reopening without reading the data files.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <random>
#include <thread>

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

TEST_CASE("Store rejects keys outside [key_min, key_max) with KeyOutOfRange",
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
