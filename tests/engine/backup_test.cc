// engine::Backup: a copy of a Store while it is written, opened as a store of
// its own; the refusals; a stopped copy leaves nothing behind.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/backup.h"
#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::Backup;
using flatkv::engine::BackupStatus;
using flatkv::engine::EngineOptions;
using flatkv::engine::Store;

namespace {

EngineOptions Options(const std::string& path) {
  EngineOptions o;
  o.path = path;
  o.segment_keys = 1 << 12;  // several segments
  o.string_slots = 1 << 10;
  return o;
}

// "v<k>" (appended, not "v" + to_string: g++ 12 -O3 warns about that one).
std::string V(int64_t k) {
  std::string s = "v";
  s += std::to_string(k);
  return s;
}

BackupStatus WaitDone(const Backup& b) {
  for (int i = 0; i < 6000; ++i) {
    BackupStatus s = b.GetStatus();
    if (!s.running) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return b.GetStatus();
}

}  // namespace

TEST_CASE("Backup copies every key and value while writes go on, and the copy opens as a store",
          "[engine][backup]") {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(Options(dir / "src"), &store).ok());
  for (int64_t k = 0; k < 20000; k += 3) REQUIRE(store->Put(k, V(k)).ok());
  REQUIRE(store->Append(3, "+appended").ok());
  REQUIRE(store->SPut("alpha", "A").ok());
  REQUIRE(store->SPut(std::string("b\0c", 3), "binary key").ok());
  bool existed = false;
  REQUIRE(store->Remove(6, &existed).ok());

  // A writer beside the copy: later writes may or may not be in it.
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int64_t i = 0; !stop; ++i) REQUIRE(store->Put(1 + 3 * (i % 6000), "later").ok());
  });
  Backup backup(store.get());
  REQUIRE(backup.Start(dir / "copy", 0).ok());
  const BackupStatus s = WaitDone(backup);
  stop = true;
  writer.join();
  INFO(s.last_error);
  REQUIRE(s.complete);
  REQUIRE(s.percent == 100);
  REQUIRE(s.path == dir / "copy");
  REQUIRE_FALSE(std::filesystem::exists(dir / "copy.partial"));

  std::unique_ptr<Store> copy;
  REQUIRE(Store::Open(Options(dir / "copy"), &copy).ok());
  std::string v;
  for (int64_t k = 0; k < 20000; k += 3) {
    if (k == 6) continue;
    INFO(k);
    REQUIRE(copy->Get(k, &v).ok());
    REQUIRE(v == (k == 3 ? std::string("v3+appended") : V(k)));
  }
  REQUIRE(copy->Get(6, &v).IsNotFound());
  REQUIRE(copy->SGet("alpha", &v).ok());
  REQUIRE(v == "A");
  REQUIRE(copy->SGet(std::string("b\0c", 3), &v).ok());
  REQUIRE(v == "binary key");
  // Keys the writer touched hold a value somebody wrote, never anything else.
  for (int64_t k = 1; k < 18000; k += 3) {
    const Status st = copy->Get(k, &v);
    REQUIRE((st.IsNotFound() || (st.ok() && v == "later")));
  }
  REQUIRE(s.keys_done >= 20000 / 3 + 2);
  REQUIRE(copy->Close().ok());
  REQUIRE(store->Close().ok());
}

TEST_CASE("Backup refuses a relative or existing directory and a second copy at once",
          "[engine][backup]") {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(Options(dir / "src"), &store).ok());
  for (int64_t k = 0; k < 2000; ++k) REQUIRE(store->Put(k, std::string(1000, 'x')).ok());
  Backup backup(store.get());
  REQUIRE(backup.Start("relative", 0).IsInvalidArgument());
  REQUIRE(backup.Start(dir / "src", 0).IsInvalidArgument());
  REQUIRE(backup.Start(dir / "no/such/parent", 0).IsInvalidArgument());
  REQUIRE(backup.Start(dir / "slow", 1).ok());  // 2 MB at 1 MB/s: still running below
  REQUIRE(backup.Start(dir / "other", 0).IsBusy());
  const BackupStatus running = backup.GetStatus();
  REQUIRE(running.running);
  REQUIRE(running.percent < 100);

  // Stopped: nothing is left, neither DIR nor DIR.partial.
  backup.Stop();
  const BackupStatus stopped = backup.GetStatus();
  REQUIRE_FALSE(stopped.running);
  REQUIRE_FALSE(stopped.complete);
  REQUIRE_FALSE(stopped.last_error.empty());
  REQUIRE_FALSE(std::filesystem::exists(dir / "slow"));
  REQUIRE_FALSE(std::filesystem::exists(dir / "slow.partial"));
  REQUIRE(store->Close().ok());
}
