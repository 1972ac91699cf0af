// Concurrency: gets run in parallel with puts, removes and appends on the same
// keys and must only ever see a complete value that some writer wrote, never
// a torn slot, garbage or a checksum error.
#include <catch2/catch.hpp>

#include <atomic>
#include <random>
#include <thread>

#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineOptions;
using flatkv::engine::Store;
using flatkv::engine::SyncMode;

namespace {

constexpr int64_t kKeys = 512;

// A value that names its key and is self-checking: "k<key>:" then a filler
// of one repeated letter, then "." Any torn or foreign value fails Valid().
std::string MakeValue(int64_t key, std::mt19937_64& rng) {
  std::string v = "k";
  v += std::to_string(key);
  v += ':';
  const size_t n = rng() % 3 == 0 ? 5000 + rng() % 80000 : rng() % 300;
  v.append(n, static_cast<char>('a' + rng() % 26));
  v += '.';
  return v;
}

bool Valid(int64_t key, const std::string& v, bool appended) {
  std::string prefix = "k";
  prefix += std::to_string(key);
  prefix += ':';
  if (v.compare(0, prefix.size(), prefix) != 0 || v.back() != '.') return false;
  if (appended) return true;  // appends concatenate several valid pieces
  const size_t body = v.size() - prefix.size() - 1;
  return body == 0 || v.find_first_not_of(v[prefix.size()], prefix.size()) == v.size() - 1;
}

void Hammer(SyncMode sync, int index_item_bytes) {
  flatkv::test::TempDir dir;
  EngineOptions o;
  o.path = dir / "s";
  o.key_max = kKeys;
  o.segment_keys = 128;
  o.data_files = 4;
  o.sync = sync;
  o.index_item_bytes = index_item_bytes;
  o.checkpoint_interval_ms = 5;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::atomic<long> reads{0}, hits{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      while (!stop.load()) {
        const int64_t k = static_cast<int64_t>(rng() % kKeys);
        const int op = static_cast<int>(rng() % 10);
        Status st;
        if (op < 6) {
          st = store->Put(k, MakeValue(k, rng));
        } else if (op < 8) {
          st = store->Remove(k);
        } else {
          // Appends go to odd keys only, so even keys stay single-piece.
          st = (k % 2 == 1) ? store->Append(k, MakeValue(k, rng)) : store->Put(k, MakeValue(k, rng));
        }
        if (!st.ok()) bad.fetch_add(1);
      }
    });
  }
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(100 + r);
      std::string v;
      while (!stop.load()) {
        const int64_t k = static_cast<int64_t>(rng() % kKeys);
        Status st = store->Get(k, &v);
        reads.fetch_add(1);
        if (st.ok()) {
          hits.fetch_add(1);
          if (!Valid(k, v, k % 2 == 1)) bad.fetch_add(1);
        } else if (!st.IsNotFound()) {
          bad.fetch_add(1);
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop.store(true);
  for (auto& t : threads) t.join();
  INFO("reads " << reads.load() << ", hits " << hits.load());
  REQUIRE(bad.load() == 0);
  REQUIRE(hits.load() > 100);
  REQUIRE(store->GetStats().corrupt_records == 0);
}

}  // namespace

TEST_CASE("Gets running beside puts, removes and appends only see whole values",
          "[engine][concurrency]") {
  SECTION("sync none, 6-byte slots") { Hammer(SyncMode::kNone, 6); }
  SECTION("sync none, 5-byte slots") { Hammer(SyncMode::kNone, 5); }
  SECTION("sync always, 8-byte slots") { Hammer(SyncMode::kAlways, 8); }
}
