// The sparse tier (storage.sparse_tier): integer keys spread too thinly for
// a flat table live in it, dense segments are promoted to flat tables, and
// every operation, scans in both directions and reopening included, sees
// one store whatever the key shape.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineOptions;
using flatkv::engine::KeyValue;
using flatkv::engine::KeyValueRef;
using flatkv::engine::Store;

namespace {

EngineOptions SparseOptions(const std::string& path) {
  EngineOptions o;
  o.path = path;
  o.sparse_tier = true;
  o.key_min = std::numeric_limits<int64_t>::min();
  o.segment_keys = uint64_t{1} << 20;
  o.data_files = 4;
  return o;
}

std::string ValueFor(int64_t key, int version) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on
  // "literal" + std::string once this is inlined into a loop.
  std::string v = "v";
  v += std::to_string(key);
  v += '/';
  v += std::to_string(version);
  return v;
}

// Every key of "model" in [lo, hi] through Scan pages of "limit", forward
// or reverse, compared with the model.
void CheckScan(const Store& store, const std::map<int64_t, std::string>& model, int64_t lo,
               int64_t hi, bool reverse, size_t limit) {
  std::vector<KeyValue> got;
  int64_t from = reverse ? hi : lo;
  for (int calls = 0;; ++calls) {
    REQUIRE(calls < 1000000);
    std::vector<KeyValue> page;
    int64_t next = 0;
    bool done = false;
    REQUIRE(store.Scan(from, reverse, limit, lo, hi, &page, &next, &done).ok());
    REQUIRE(page.size() <= limit);
    got.insert(got.end(), page.begin(), page.end());
    if (done) break;
    from = next;
  }
  std::vector<KeyValue> want;
  for (auto it = model.lower_bound(lo); it != model.end() && it->first <= hi; ++it) {
    want.push_back(KeyValue{it->first, it->second});
  }
  if (reverse) std::reverse(want.begin(), want.end());
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("scan position " << i << (reverse ? " (reverse)" : ""));
    REQUIRE(got[i].key == want[i].key);
    REQUIRE(got[i].value == want[i].value);
  }
}

}  // namespace

TEST_CASE("Random 64-bit keys live in the sparse tier: no segment each, every operation works",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  const EngineOptions o = SparseOptions(dir / "s");
  std::map<int64_t, std::string> model;
  std::mt19937_64 rng(7);
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int i = 0; i < 3000; ++i) {
      const int64_t k = static_cast<int64_t>(rng());
      REQUIRE(store->Put(k, ValueFor(k, 1)).ok());
      model[k] = ValueFor(k, 1);
    }
    // Removes say whether the key was there; appends grow a value.
    int n = 0;
    for (auto it = model.begin(); it != model.end() && n < 300; ++n) {
      bool existed = false;
      REQUIRE(store->Remove(it->first, &existed).ok());
      REQUIRE(existed);
      REQUIRE(store->Remove(it->first, &existed).ok());
      REQUIRE_FALSE(existed);
      it = model.erase(it);
      ++it;
    }
    for (auto it = model.begin(); it != model.end(); std::advance(it, 7)) {
      REQUIRE(store->Append(it->first, "+tail").ok());
      it->second += "+tail";
      if (std::distance(it, model.end()) < 8) break;
    }
    const int64_t absent = 12345;
    REQUIRE(model.count(absent) == 0);
    REQUIRE(store->Append(absent, "fresh").ok());
    model[absent] = "fresh";
    const auto stats = store->GetStats();
    CHECK(stats.segments == 0);
    CHECK(stats.sparse_promotions == 0);
    for (const auto& [k, v] : model) {
      std::string got;
      REQUIRE(store->Get(k, &got).ok());
      REQUIRE(got == v);
      REQUIRE(store->Exists(k).ok());
    }
    std::string got = "unchanged";
    REQUIRE(store->Get(42, &got).IsNotFound());
    REQUIRE(got == "unchanged");
    REQUIRE(store->Exists(42).IsNotFound());
    CheckScan(*store, model, INT64_MIN, INT64_MAX, false, 100);
    CheckScan(*store, model, INT64_MIN, INT64_MAX, true, 77);
  }
  // Reopened, nothing is missing.
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  for (const auto& [k, v] : model) {
    std::string got;
    REQUIRE(store->Get(k, &got).ok());
    REQUIRE(got == v);
  }
  CheckScan(*store, model, -(int64_t{1} << 62), int64_t{1} << 62, false, 1000);

  // A range's live bytes (a ring change's progress total) are the tier's by
  // the range's share of its keys, counted over more than one page of keys.
  REQUIRE(model.size() > 2500);
  const uint64_t total = store->LiveBytesEstimate();
  REQUIRE(total > 0);
  const int64_t lo = std::next(model.begin(), 500)->first;
  const int64_t hi = std::next(model.begin(), 2200)->first;
  const auto in = static_cast<long double>(std::distance(model.lower_bound(lo),
                                                          model.upper_bound(hi)));
  const auto want = static_cast<uint64_t>(total * in / model.size());
  const uint64_t got = store->LiveBytesEstimate(lo, hi, 0);
  CHECK(got + 1 >= want);
  CHECK(got <= want + 1);
  CHECK(store->LiveBytesEstimate(INT64_MIN, INT64_MAX, 0) == total);
  REQUIRE(model.count(lo + 1) == 0);
  CHECK(store->LiveBytesEstimate(lo + 1, lo + 1, 0) == 0);
}

TEST_CASE("Key order follows every put and remove of a tier key, however many wait to be sorted in",
          "[engine][sparse]") {
  // Writes reach the tier's key order in sorted batches; between two reads
  // of the order, a key may be put and removed many times. Rounds of 1 to
  // 5000 writes over 300 keys, each round ended by scans both ways, the
  // sparse_keys count, and now and then a reopen.
  flatkv::test::TempDir dir;
  const EngineOptions o = SparseOptions(dir / "s");
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::mt19937_64 rng(23);
  std::vector<int64_t> pool(300);
  for (int64_t& k : pool) k = static_cast<int64_t>(rng());
  std::map<int64_t, std::string> model;
  int version = 0;
  for (int round = 0; round < 40; ++round) {
    const int writes = std::vector<int>{1, 7, 255, 256, 700, 5000}[rng() % 6];
    INFO("round " << round << ", " << writes << " writes");
    for (int i = 0; i < writes; ++i) {
      const int64_t k = pool[rng() % pool.size()];
      if (rng() % 3 == 0) {
        bool existed = false;
        REQUIRE(store->Remove(k, &existed).ok());
        REQUIRE(existed == (model.erase(k) == 1));
      } else {
        model[k] = ValueFor(k, ++version);
        REQUIRE(store->Put(k, model[k]).ok());
      }
    }
    REQUIRE(store->GetStats().sparse_keys == model.size());
    CheckScan(*store, model, INT64_MIN, INT64_MAX, round % 2 == 0, 1 + rng() % 50);
    const int64_t a = static_cast<int64_t>(rng()), b = static_cast<int64_t>(rng());
    CheckScan(*store, model, std::min(a, b), std::max(a, b), round % 2 == 1, 7);
    if (round % 10 == 9) {
      store.reset();
      REQUIRE(Store::Open(o, &store).ok());
      CheckScan(*store, model, INT64_MIN, INT64_MAX, false, 100);
    }
  }
}

TEST_CASE("A dense segment is promoted to a flat table and scans merge both tiers in either direction",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  EngineOptions o = SparseOptions(dir / "s");
  std::map<int64_t, std::string> model;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  // Dense keys from 0 up, and sparse ones around and between them.
  const int64_t dense = 20000;
  for (int64_t k = 0; k < dense; ++k) {
    REQUIRE(store->Put(k, ValueFor(k, 1)).ok());
    model[k] = ValueFor(k, 1);
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 500; ++i) {
    int64_t k = static_cast<int64_t>(rng() >> 1) - (int64_t{1} << 61);
    if (i % 5 == 0) k = static_cast<int64_t>(rng() % (uint64_t{1} << 40)) + (int64_t{1} << 21);
    REQUIRE(store->Put(k, ValueFor(k, 2)).ok());
    model[k] = ValueFor(k, 2);
  }
  auto stats = store->GetStats();
  REQUIRE(stats.sparse_promotions == 1);
  REQUIRE(stats.segments == 1);  // the dense one alone
  // Writes to the promoted segment go to its table, wherever in it.
  REQUIRE(store->Put(int64_t{1} << 19, "far in segment 0").ok());
  model[int64_t{1} << 19] = "far in segment 0";
  REQUIRE(store->GetStats().segments == 1);
  for (size_t limit : {size_t{1}, size_t{3}, size_t{64}, size_t{5000}}) {
    CheckScan(*store, model, INT64_MIN, INT64_MAX, false, limit);
    CheckScan(*store, model, INT64_MIN, INT64_MAX, true, limit);
  }
  // Bounds inside and across the dense segment; few work units per call,
  // so the flat side stops early and the merge must stop with it.
  store->TEST_SetScanWork(5);
  CheckScan(*store, model, -5, 700, false, 50);
  CheckScan(*store, model, 19990, int64_t{1} << 40, true, 9);
  CheckScan(*store, model, INT64_MIN, 100, true, 13);
  store->TEST_SetScanWork(Store::kScanWork);
  // Verify reads every record of both tiers.
  Store::VerifyReport report;
  REQUIRE(store->Verify(&report).ok());
  REQUIRE(report.records == model.size());
  // A compaction on request covers the tier too, and changes nothing seen.
  REQUIRE(store->CompactAndWait().ok());
  CheckScan(*store, model, INT64_MIN, INT64_MAX, true, 1000);
  store.reset();
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(store->GetStats().segments == 1);
  CheckScan(*store, model, INT64_MIN, INT64_MAX, false, 333);
  for (const auto& [k, v] : model) {
    std::string got;
    REQUIRE(store->Get(k, &got).ok());
    REQUIRE(got == v);
  }
}

TEST_CASE("Batches split between a flat table and the sparse tier keep the last value of a key",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(SparseOptions(dir / "s"), &store).ok());
  for (int64_t k = 0; k < 2000; ++k) REQUIRE(store->Put(k, "d").ok());
  REQUIRE(store->GetStats().segments == 1);
  const int64_t far = int64_t{1} << 50;
  std::vector<KeyValueRef> batch = {{5, "flat-1"}, {far, "sparse-1"}, {far, "sparse-2"},
                                    {5, "flat-2"}, {far + 1, "sparse-3"}};
  REQUIRE(store->PutBatch(batch).ok());
  std::string v;
  REQUIRE(store->Get(5, &v).ok());
  CHECK(v == "flat-2");
  REQUIRE(store->Get(far, &v).ok());
  CHECK(v == "sparse-2");
  REQUIRE(store->Get(far + 1, &v).ok());
  CHECK(v == "sparse-3");
  REQUIRE(store->GetStats().segments == 1);
}

TEST_CASE("Opening decides a promotion cut short by the moved mark: without it the tier's keys win",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  const EngineOptions sparse = SparseOptions(dir / "s");
  EngineOptions flat = sparse;
  flat.sparse_tier = false;
  flat.path = dir / "flat";
  // A flat table of segment 0 holding old values (as a promotion cut short
  // after some copies leaves it), and the tier holding the newer ones.
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(flat, &store).ok());
    REQUIRE(store->Put(1, "old-1").ok());
    REQUIRE(store->Put(2, "old-2").ok());
  }
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(sparse, &store).ok());
    REQUIRE(store->Put(1, "new-1").ok());
    REQUIRE(store->Put(3, "new-3").ok());
    REQUIRE(store->GetStats().segments == 0);
  }
  const std::string seg0 = "/seg-0000080000000000";
  std::filesystem::copy(flat.path + seg0, sparse.path + seg0,
                        std::filesystem::copy_options::recursive);
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(sparse, &store).ok());
    std::string v;
    REQUIRE(store->Get(1, &v).ok());
    CHECK(v == "new-1");
    REQUIRE(store->Get(3, &v).ok());
    CHECK(v == "new-3");
    REQUIRE(store->Get(2, &v).ok());  // the table's own record stays
    REQUIRE(std::filesystem::exists(sparse.path + seg0 + "/" + "SPARSE-MOVED"));
    // The tier holds none of the segment now: a scan returns each key once.
    std::vector<KeyValue> out;
    int64_t next;
    bool done;
    REQUIRE(store->Scan(INT64_MIN, false, 100, &out, &next, &done).ok());
    CHECK(out.size() == 3);
  }
  // With the mark, copies left in the tier are stale: the table wins.
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(flat, &store).ok());
    REQUIRE(store->Put(7, "table-7").ok());
  }
  {
    EngineOptions other = sparse;
    other.path = dir / "t";
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(other, &store).ok());
    REQUIRE(store->Put(7, "stale-7").ok());
    REQUIRE(store->Put(8, "stale-8").ok());
  }
  std::filesystem::copy(flat.path + seg0, (dir / "t") + seg0,
                        std::filesystem::copy_options::recursive);
  { std::ofstream((dir / "t") + seg0 + "/" + "SPARSE-MOVED") << "moved\n"; }
  EngineOptions other = sparse;
  other.path = dir / "t";
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(other, &store).ok());
  std::string v;
  REQUIRE(store->Get(7, &v).ok());
  CHECK(v == "table-7");
  CHECK(store->Get(8, &v).IsNotFound());
  std::vector<KeyValue> out;
  int64_t next;
  bool done;
  REQUIRE(store->Scan(INT64_MIN, false, 100, &out, &next, &done).ok());
  CHECK(done);
  CHECK(out.size() == 3);  // 1, 2 and 7 of the table
}

// Flips the middle byte of every copy of "needle" in the files under "dir";
// returns how many it damaged.
int FlipInFiles(const std::filesystem::path& dir, const std::string& needle) {
  int hits = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::string blob = flatkv::test::ReadFile(entry.path());
    bool changed = false;
    for (size_t at = blob.find(needle); at != std::string::npos; at = blob.find(needle, at + 1)) {
      blob[at + needle.size() / 2] ^= 0x5a;
      changed = true;
      ++hits;
    }
    if (!changed) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.write(blob.data(), static_cast<std::streamsize>(blob.size()));
  }
  return hits;
}

TEST_CASE("A tier bucket failing its checksum: its keys are errors, scans skip and name them",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  EngineOptions o = SparseOptions(dir / "s");
  o.sparse_slots = 16;  // many keys a bucket
  std::map<int64_t, std::string> model;
  std::mt19937_64 rng(11);
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  for (int i = 0; i < 2000; ++i) {
    const auto k = static_cast<int64_t>(rng());
    const std::string v = "tier-value-" + std::to_string(k) + "-end";
    REQUIRE(store->Put(k, v).ok());
    model[k] = v;
  }
  REQUIRE(store->Sync().ok());
  const int64_t victim = std::next(model.begin(), 1000)->first;
  REQUIRE(FlipInFiles((dir / "s") + "/sparse", model[victim]) == 1);

  // The victim's bucket reads as an error, never as absent or a wrong value.
  std::set<int64_t> bad;
  for (const auto& [k, v] : model) {
    std::string got;
    const Status st = store->Get(k, &got);
    if (st.IsCorruption()) {
      bad.insert(k);
      continue;
    }
    REQUIRE(st.ok());
    REQUIRE(got == v);
  }
  REQUIRE(bad.count(victim) == 1);
  REQUIRE(bad.size() < model.size() / 4);

  // A scan skips the bad keys and names them; every other pair comes whole.
  std::vector<KeyValue> all;
  std::vector<int64_t> named;
  int64_t from = INT64_MIN;
  for (bool done = false; !done;) {
    std::vector<KeyValue> page;
    int64_t next = 0;
    REQUIRE(store->Scan(from, false, 97, INT64_MIN, INT64_MAX, &page, &next, &done, &named).ok());
    all.insert(all.end(), page.begin(), page.end());
    from = next;
  }
  CHECK(std::set<int64_t>(named.begin(), named.end()) == bad);
  CHECK(named.size() == bad.size());  // each named once
  REQUIRE(all.size() == model.size() - bad.size());
  for (const KeyValue& kv : all) {
    REQUIRE(bad.count(kv.key) == 0);
    REQUIRE(kv.value == model[kv.key]);
  }
  Store::VerifyReport report;
  REQUIRE(store->Verify(&report).ok());
  CHECK(std::set<int64_t>(report.corrupt_keys.begin(), report.corrupt_keys.end()) == bad);
  CHECK(report.corrupt_keys.size() == bad.size());
  CHECK(report.records == model.size() - bad.size());

  // A put of a bad key makes it good; the bucket's other keys stay errors.
  REQUIRE(store->Put(victim, "rewritten").ok());
  std::string got;
  REQUIRE(store->Get(victim, &got).ok());
  CHECK(got == "rewritten");
  for (int64_t k : bad) {
    if (k != victim) CHECK(store->Get(k, &got).IsCorruption());
  }
  REQUIRE(store->Close().ok());
  store.reset();

  // Turning the tier off would lose keys no one can list: refused, with why.
  EngineOptions off = o;
  off.sparse_tier = false;
  const Status st = Store::Open(off, &store);
  REQUIRE(st.IsCorruption());
  CHECK(st.ToString().find("fail their checksum") != std::string::npos);
  CHECK(st.ToString().find("storage.sparse_tier") != std::string::npos);
  store.reset();
  REQUIRE(std::filesystem::exists((dir / "s") + "/sparse"));
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(store->Get(victim, &got).ok());
  CHECK(got == "rewritten");
  std::vector<KeyValue> one;
  int64_t next = 0;
  bool done = false;
  REQUIRE(store->Scan(victim, false, 1, victim, victim, &one, &next, &done).ok());
  CHECK(one.size() == 1);  // a key written after the damage is in the key order again
  for (const auto& [k, v] : model) {
    if (bad.count(k) == 0) {
      REQUIRE(store->Get(k, &got).ok());
      REQUIRE(got == v);
    }
  }
}

TEST_CASE("Keys beyond the tier's smallest and largest read as absent, every key within as stored",
          "[engine][sparse]") {
  // Gets outside the span of the tier's keys are answered by a compare
  // alone: a key put below or above the span, before or after a reopen, must
  // widen it, and a damaged bucket must still read as an error, never as
  // absent, even when it held the largest key.
  flatkv::test::TempDir dir;
  EngineOptions o = SparseOptions(dir / "s");
  o.sparse_slots = 16;  // many keys a bucket
  std::map<int64_t, std::string> model;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  std::string got;
  CHECK(store->Get(0, &got).IsNotFound());  // an empty tier
  // Snowflake-like IDs: a millisecond apart, far above 0.
  const int64_t base = int64_t{1} << 60;
  for (int i = 0; i < 500; ++i) {
    const int64_t k = base + (int64_t{i} << 22);
    model[k] = ValueFor(k, 1);
    REQUIRE(store->Put(k, model[k]).ok());
  }
  auto check_all = [&] {
    for (const auto& [k, v] : model) {
      INFO("key " << k);
      REQUIRE(store->Get(k, &got).ok());
      REQUIRE(got == v);
    }
    const int64_t lo = model.begin()->first;
    const int64_t hi = model.rbegin()->first;
    const int64_t next_ms = hi + (int64_t{1} << 22);
    for (int64_t k : {lo - 1, hi + 1, next_ms, INT64_MIN, INT64_MAX - 1, int64_t{0}}) {
      if (model.count(k) != 0) continue;
      INFO("absent key " << k);
      CHECK(store->Get(k, &got).IsNotFound());
      bool existed = true;
      CHECK(store->Remove(k, &existed).ok());
      CHECK_FALSE(existed);
    }
  };
  check_all();
  // Below and above the span, and at the ends of the key space.
  const int64_t later = base + (int64_t{600} << 22);
  for (int64_t k : {base - 7, later, INT64_MIN + 1, INT64_MAX - (int64_t{1} << 40)}) {
    model[k] = ValueFor(k, 2);
    REQUIRE(store->Put(k, model[k]).ok());
    REQUIRE(store->Get(k, &got).ok());
    CHECK(got == model[k]);
  }
  check_all();
  REQUIRE(store->Close().ok());
  store.reset();
  REQUIRE(Store::Open(o, &store).ok());
  check_all();
  const int64_t above = INT64_MAX - (int64_t{1} << 30);
  REQUIRE(store->Get(above, &got).IsNotFound());
  model[above] = ValueFor(above, 3);
  REQUIRE(store->Put(above, model[above]).ok());
  check_all();

  // The largest key's bucket damaged: after a reopen its keys are unknown
  // (left out of the key order), and must read as errors.
  const int64_t top = model.rbegin()->first;
  REQUIRE(store->Close().ok());
  store.reset();
  REQUIRE(FlipInFiles((dir / "s") + "/sparse", model[top]) == 1);
  REQUIRE(Store::Open(o, &store).ok());
  CHECK(store->Get(top, &got).IsCorruption());
}

TEST_CASE("Turning the sparse tier off moves its keys into flat tables and removes it",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  EngineOptions o = SparseOptions(dir / "s");
  std::map<int64_t, std::string> model;
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int64_t k : {int64_t{-5}, int64_t{3}, int64_t{1} << 40, (int64_t{1} << 40) + 9}) {
      REQUIRE(store->Put(k, ValueFor(k, 1)).ok());
      model[k] = ValueFor(k, 1);
    }
    REQUIRE(store->GetStats().segments == 0);
  }
  o.sparse_tier = false;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  CHECK_FALSE(std::filesystem::exists(o.path + "/sparse"));
  CHECK(store->GetStats().segments == 3);
  CheckScan(*store, model, INT64_MIN, INT64_MAX, false, 2);
}

TEST_CASE("Readers and scanners never miss an acknowledged key while its segment is promoted",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(SparseOptions(dir / "s"), &store).ok());
  constexpr int kWriters = 2;
  constexpr int64_t kPerWriter = 6000;
  std::atomic<int64_t> acked[kWriters];
  for (auto& a : acked) a.store(-1);
  std::atomic<bool> stop{false};
  flatkv::test::ThreadFailures failures;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    // Writer w fills keys w, w + kWriters, ... of segments 0..2 in turn.
    threads.emplace_back([&, w] {
      for (int64_t i = 0; i < kPerWriter; ++i) {
        const int64_t k = (i % 3) * (int64_t{1} << 20) + (i / 3) * kWriters + w;
        Status st = store->Put(k, ValueFor(k, 1));
        if (!st.ok()) failures.Add("put " + std::to_string(k) + ": " + st.ToString());
        acked[w].store(i);
      }
    });
  }
  threads.emplace_back([&] {  // point reads of acknowledged keys
    std::mt19937_64 rng(3);
    while (!stop.load()) {
      const int w = static_cast<int>(rng() % kWriters);
      const int64_t upto = acked[w].load();
      if (upto < 0) continue;
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(upto + 1));
      const int64_t k = (i % 3) * (int64_t{1} << 20) + (i / 3) * kWriters + w;
      std::string v;
      Status st = store->Get(k, &v);
      if (!st.ok() || v != ValueFor(k, 1)) failures.Add("get " + std::to_string(k) + ": " + st.ToString());
    }
  });
  threads.emplace_back([&] {  // whole scans: every key acknowledged before one starts is in it
    while (!stop.load()) {
      int64_t before[kWriters];
      for (int w = 0; w < kWriters; ++w) before[w] = acked[w].load();
      std::map<int64_t, bool> seen;
      int64_t from = INT64_MIN;
      for (bool done = false; !done;) {
        std::vector<KeyValue> page;
        int64_t next;
        Status st = store->Scan(from, false, 500, &page, &next, &done);
        if (!st.ok()) {
          failures.Add("scan: " + st.ToString());
          return;
        }
        for (const KeyValue& kv : page) seen[kv.key] = true;
        from = next;
      }
      for (int w = 0; w < kWriters; ++w) {
        for (int64_t i = 0; i <= before[w]; ++i) {
          const int64_t k = (i % 3) * (int64_t{1} << 20) + (i / 3) * kWriters + w;
          if (seen.count(k) == 0) {
            failures.Add("scan missed acknowledged key " + std::to_string(k));
            return;
          }
        }
      }
    }
  });
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  stop.store(true);
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();
  INFO(failures.first());
  REQUIRE(failures.count() == 0);
  CHECK(store->GetStats().sparse_promotions == 3);
  CHECK(store->GetStats().segments == 3);
}

TEST_CASE("The insertion-order scan covers the sparse tier and the flat tables, each key once",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(SparseOptions(dir / "s"), &store).ok());
  std::map<int64_t, std::string> model;
  for (int64_t k = 0; k < 3000; ++k) {
    REQUIRE(store->Put(k, ValueFor(k, 1)).ok());
    model[k] = ValueFor(k, 1);
  }
  std::mt19937_64 rng(5);
  for (int i = 0; i < 700; ++i) {
    const auto k = static_cast<int64_t>(rng());
    REQUIRE(store->Put(k, ValueFor(k, 3)).ok());
    model[k] = ValueFor(k, 3);
  }
  REQUIRE(store->GetStats().sparse_promotions == 1);
  std::map<int64_t, std::string> seen;
  std::string cursor;
  for (int calls = 0;; ++calls) {
    REQUIRE(calls < 100000);
    std::vector<KeyValue> page;
    std::string next;
    bool done = false;
    REQUIRE(store->ScanLog(cursor, 64, &page, &next, &done).ok());
    for (KeyValue& kv : page) {
      INFO("key " << kv.key);
      REQUIRE(seen.count(kv.key) == 0);
      seen[kv.key] = kv.value;
    }
    if (done) break;
    cursor = next;
  }
  REQUIRE(seen == model);
  std::vector<KeyValue> page;
  std::string next;
  bool done;
  REQUIRE(store->ScanLog(std::string(5, '\x02'), 10, &page, &next, &done).IsInvalidArgument());
}

TEST_CASE("Copies a promotion could not drop from the tier never come back, even after a reopen",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  EngineOptions o = SparseOptions(dir / "s");
  std::map<int64_t, std::string> model;
  {
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    store->TEST_KillInPromotion(4);  // the tier keeps its copies
    for (int64_t k = 0; k < 1000; ++k) {
      REQUIRE(store->Put(k, ValueFor(k, 1)).ok());
      model[k] = ValueFor(k, 1);
    }
    REQUIRE(store->GetStats().segments == 1);
    for (int64_t k = 0; k < 1000; k += 3) {
      REQUIRE(store->Remove(k).ok());
      model.erase(k);
    }
    for (int64_t k = 1; k < 1000; k += 3) {
      REQUIRE(store->Put(k, ValueFor(k, 2)).ok());
      model[k] = ValueFor(k, 2);
    }
    CheckScan(*store, model, INT64_MIN, INT64_MAX, false, 100);
    CheckScan(*store, model, INT64_MIN, INT64_MAX, true, 100);
    std::map<int64_t, std::string> logged;
    std::string cursor;
    for (bool done = false; !done;) {
      std::vector<KeyValue> page;
      REQUIRE(store->ScanLog(cursor, 100, &page, &cursor, &done).ok());
      for (KeyValue& kv : page) logged[kv.key] = kv.value;
    }
    REQUIRE(logged == model);
  }
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  CheckScan(*store, model, INT64_MIN, INT64_MAX, false, 100);
  for (int64_t k = 0; k < 1000; k += 3) {
    std::string v;
    REQUIRE(store->Get(k, &v).IsNotFound());
  }
}

TEST_CASE("A sparse tier in the earlier RocksDB format is refused with what to do, and left as it was",
          "[engine][sparse]") {
  flatkv::test::TempDir dir;
  const EngineOptions o = SparseOptions(dir / "s");
  const std::string tier = dir / "s/sparse";
  std::filesystem::create_directories(tier);
  // RocksDB names every database in IDENTITY.
  std::ofstream(tier + "/IDENTITY") << "0f0e0d0c-rocksdb\n";
  for (bool on : {true, false}) {
    EngineOptions opts = o;
    opts.sparse_tier = on;
    std::unique_ptr<Store> store;
    const Status st = Store::Open(opts, &store);
    INFO(st.ToString());
    REQUIRE(st.IsInvalidArgument());
    CHECK(st.message().find("RocksDB") != std::string::npos);
    CHECK(st.message().find("storage.sparse_tier: off") != std::string::npos);
  }
  CHECK(std::filesystem::exists(tier + "/IDENTITY"));
  CHECK_FALSE(std::filesystem::exists(tier + "/strings"));
}
