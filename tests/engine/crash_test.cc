// Crash test: a child process writes with sync: always from two threads and
// reports each acknowledged operation through a pipe; the parent kills it with
// SIGKILL at a random moment, reopens the store and checks that every
// acknowledged write survived and nothing else appeared. Repeated 25 times on
// the same directory, so each run also starts from a recovered store.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <random>
#include <thread>

#include "engine/cache/write_back.h"
#include "engine/store.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::engine::EngineOptions;
using flatkv::engine::KeyValue;
using flatkv::engine::Store;
using flatkv::engine::SyncMode;

namespace {

constexpr int kThreads = 2;
constexpr int64_t kKeys = 3000;
constexpr int kMaxOps = 20000;

enum class OpType { kPut, kRemove, kAppend };
// Appends become puts (set before KillLoop; the child inherits it).
bool g_no_appends = false;
struct Op {
  OpType type;
  int64_t key;
  std::string value;
};

// The deterministic operation sequence of one writer thread: the child runs
// it, the parent replays it into its model.
class OpGen {
 public:
  OpGen(uint64_t seed, int thread) : rng_(seed * 7919 + static_cast<uint64_t>(thread)),
                                     thread_(thread) {}
  Op Next() {
    Op op;
    op.key = static_cast<int64_t>(rng_() % (kKeys / kThreads)) * kThreads + thread_;
    const int r = static_cast<int>(rng_() % 100);
    op.type = r < 60 ? OpType::kPut : r < 80 ? OpType::kRemove : OpType::kAppend;
    if (g_no_appends && op.type == OpType::kAppend) op.type = OpType::kPut;
    if (op.type != OpType::kRemove) {
      size_t n = rng_() % (op.type == OpType::kPut ? 2000 : 40);
      if (op.type == OpType::kPut && rng_() % 50 == 0) n = 70000 + rng_() % 10000;
      op.value.resize(n);
      const char c = static_cast<char>('a' + rng_() % 26);
      for (size_t i = 0; i < n; ++i) op.value[i] = static_cast<char>(c + i % 7);
    }
    return op;
  }

 private:
  std::mt19937_64 rng_;
  int thread_;
};

void Apply(const Op& op, std::map<int64_t, std::string>* model) {
  switch (op.type) {
    case OpType::kPut: (*model)[op.key] = op.value; break;
    case OpType::kRemove: model->erase(op.key); break;
    case OpType::kAppend: (*model)[op.key] += op.value; break;
  }
}

EngineOptions CrashOptions(const std::string& path, bool compact = false) {
  EngineOptions o;
  o.path = path;
  o.key_max = kKeys;
  o.segment_keys = 1024;  // three segments
  o.data_files = 4;
  o.sync = SyncMode::kAlways;
  o.checkpoint_interval_ms = 15;  // checkpoints race with the kill too
  if (compact) {
    o.compaction_mb_per_sec = 20;  // slow enough that kills land mid-copy
    o.compaction_garbage_ratio = 0;
  }
  return o;
}

enum class Child { kStore, kCompacting, kCacheSafe, kCacheAsync };

[[noreturn]] void RunChild(const EngineOptions& o, uint64_t seed, int ack_fd, Child mode) {
  const bool compact = mode == Child::kCompacting;
  std::unique_ptr<Store> store;
  if (!Store::Open(o, &store).ok()) _exit(3);
  // The cache modes send every operation through the write-back cache.
  std::unique_ptr<flatkv::engine::cache::WriteBackCache> cache;
  if (mode == Child::kCacheSafe || mode == Child::kCacheAsync) {
    flatkv::engine::cache::CacheOptions co;
    co.capacity_bytes = 256 * 1024;
    co.flush_interval_ms = 5;
    co.mode = mode == Child::kCacheSafe ? flatkv::engine::cache::WriteMode::kSafe
                                        : flatkv::engine::cache::WriteMode::kAsync;
    if (!flatkv::engine::cache::WriteBackCache::Open(store.get(), co, &cache).ok()) _exit(7);
  }
  std::vector<std::thread> threads;
  if (compact) {
    // Compaction rounds back to back while the writers run: the kill lands
    // in the copy, the switch or the cleanup.
    threads.emplace_back([&] {
      for (;;) {
        Status st = store->CompactAndWait();
        if (!st.ok() && !st.IsBusy()) _exit(6);
      }
    });
  }
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      OpGen gen(seed, t);
      for (uint32_t i = 0; i < kMaxOps; ++i) {
        Op op = gen.Next();
        Status st;
        if (cache != nullptr) {
          if (op.type == OpType::kPut) st = cache->Put(op.key, op.value);
          if (op.type == OpType::kRemove) st = cache->Remove(op.key);
          if (op.type == OpType::kAppend) st = cache->Append(op.key, op.value);
        } else {
          if (op.type == OpType::kPut) st = store->Put(op.key, op.value);
          if (op.type == OpType::kRemove) st = store->Remove(op.key);
          if (op.type == OpType::kAppend) st = store->Append(op.key, op.value);
        }
        if (!st.ok()) _exit(4);
        const uint32_t ack = (static_cast<uint32_t>(t) << 31) | i;
        if (ack_fd >= 0 && write(ack_fd, &ack, sizeof(ack)) != sizeof(ack)) _exit(5);
      }
    });
  }
  for (size_t t = compact ? 1 : 0; t < threads.size(); ++t) threads[t].join();
  _exit(0);
}

std::map<int64_t, std::string> ReadAll(const Store& store) {
  std::map<int64_t, std::string> out;
  std::vector<KeyValue> page;
  int64_t from = 0, next = 0;
  bool done = false;
  while (!done) {
    REQUIRE(store.Scan(from, false, 500, &page, &next, &done).ok());
    for (KeyValue& kv : page) out[kv.key] = std::move(kv.value);
    from = next;
  }
  return out;
}

// Forks a child that runs "body" with the write end of a pipe and exits 0
// after it; returns the read end. The caller reads it to the end (the
// child's records may outgrow the pipe's buffer) before it reaps the child.
int ForkWithPipe(const std::function<void(int)>& body, pid_t* child) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    body(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  *child = pid;
  return fds[0];
}

// The child's store, or exit 3 if it does not open.
std::unique_ptr<Store> OpenInChild(const EngineOptions& o) {
  std::unique_ptr<Store> store;
  if (!Store::Open(o, &store).ok()) _exit(3);
  return store;
}

int Reap(pid_t child) {
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return status;
}

// Runs the kill loop; returns the store's final state.
std::map<int64_t, std::string> KillLoop(const EngineOptions& o, int runs, Child mode) {
  std::map<int64_t, std::string> model;  // the store's state before each run
  std::mt19937_64 rng(12345);
  int runs_with_inflight_writes = 0;
  for (uint64_t run = 0; run < static_cast<uint64_t>(runs); ++run) {
    pid_t pid;
    const int acks = ForkWithPipe([&](int ack_fd) { RunChild(o, run, ack_fd, mode); }, &pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 150));
    kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    INFO("run " << run);
    REQUIRE(((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
             (WIFEXITED(status) && WEXITSTATUS(status) == 0)));

    uint32_t acked[kThreads] = {0, 0};
    uint32_t ack;
    while (read(acks, &ack, sizeof(ack)) == sizeof(ack)) {
      const int t = static_cast<int>(ack >> 31);
      const uint32_t i = ack & 0x7fffffffu;
      REQUIRE(i == acked[t]);  // acknowledged in order
      acked[t] = i + 1;
    }
    close(acks);

    // Replay the acknowledged ops; each thread's next op may or may not have
    // landed before the kill.
    std::vector<std::optional<Op>> inflight(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      OpGen gen(run, t);
      for (uint32_t i = 0; i < acked[t]; ++i) Apply(gen.Next(), &model);
      if (acked[t] < kMaxOps) inflight[t] = gen.Next();
    }
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    const std::map<int64_t, std::string> actual = ReadAll(*store);
    for (int t = 0; t < kThreads; ++t) {
      if (!inflight[t]) continue;
      // Resolve the in-flight op from what the store holds for its key.
      std::map<int64_t, std::string> with = model;
      Apply(*inflight[t], &with);
      const int64_t k = inflight[t]->key;
      auto got = actual.find(k);
      auto want_with = with.find(k);
      const bool matches_with = (got == actual.end()) == (want_with == with.end()) &&
                                (got == actual.end() || got->second == want_with->second);
      if (matches_with) {
        if (with != model) ++runs_with_inflight_writes;
        model = std::move(with);
      }
    }
    REQUIRE(actual.size() == model.size());
    for (const auto& [k, v] : model) {
      INFO("key " << k);
      auto it = actual.find(k);
      REQUIRE(it != actual.end());
      REQUIRE(it->second == v);
    }
    REQUIRE(store->GetStats().corrupt_records == 0);
  }
  // Not an assertion on luck: just a record of how often a write was caught
  // between its append and its acknowledgement.
  WARN("runs whose in-flight write survived: " << runs_with_inflight_writes);
  REQUIRE(!model.empty());
  return model;
}

}  // namespace

TEST_CASE("Every acknowledged write survives SIGKILL at random moments with sync: always",
          "[engine][crash]") {
  flatkv::test::TempDir dir;
  KillLoop(CrashOptions(dir / "s"), 25, Child::kStore);
}

TEST_CASE("A kill at any moment of compaction loses nothing and leaves no garbage",
          "[engine][crash][compaction]") {
  flatkv::test::TempDir dir;
  const EngineOptions o = CrashOptions(dir / "s", true);
  const std::map<int64_t, std::string> model = KillLoop(o, 20, Child::kCompacting);
  // The next open resumes any unfinished compaction; once it is done each
  // table home holds CURRENT and exactly one generation.
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  REQUIRE(store->CompactAndWait().ok());
  REQUIRE(ReadAll(*store) == model);
  store.reset();
  for (const auto& home : std::filesystem::directory_iterator(o.path)) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(home.path())) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    INFO(home.path());
    REQUIRE(names.size() == 2);
    REQUIRE(names[0] == "CURRENT");
    REQUIRE(names[1].rfind("gen-", 0) == 0);
  }
}

TEST_CASE("A kill at any moment of a compaction in place loses nothing, nor does an index rebuild",
          "[engine][crash][compaction][in_place]") {
  // Automatic rounds in place, slow enough that the kills land in their
  // copies, commits and punches; puts and removes from two writers (a table
  // with an appended value is compacted whole, as in the case above).
  flatkv::test::TempDir dir;
  EngineOptions o = CrashOptions(dir / "s");
  o.compaction_in_place = true;
  o.compaction_garbage_ratio = 0.2;
  o.compaction_min_bytes = 1;
  o.compaction_mb_per_sec = 20;
  g_no_appends = true;
  const std::map<int64_t, std::string> model = KillLoop(o, 20, Child::kStore);
  g_no_appends = false;
  // Rounds committed: some table's META names heads.
  int with_heads = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.path)) {
    if (e.path().filename() != "META") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("\nheads ") != std::string::npos) ++with_heads;
  }
  CHECK(with_heads > 0);
  // Every index gone: rebuilt from each data file's head on, the same keys.
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.path)) {
    if (e.path().filename() == "index") std::filesystem::remove(e.path());
  }
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  CHECK(store->GetStats().index_rebuilds > 0);
  REQUIRE(store->GetStats().corrupt_records == 0);
  REQUIRE(ReadAll(*store) == model);
}

TEST_CASE("In safe mode no write acknowledged through the cache is lost on SIGKILL",
          "[engine][crash][cache]") {
  flatkv::test::TempDir dir;
  KillLoop(CrashOptions(dir / "s"), 15, Child::kCacheSafe);
}

TEST_CASE("In async mode a SIGKILL leaves only values that were written, never garbage",
          "[engine][crash][cache]") {
  // Async writes may be lost, and coalescing skips intermediate states, but
  // each key must hold its state before the run or after some prefix of the
  // run's operations on it.
  flatkv::test::TempDir dir;
  const EngineOptions o = CrashOptions(dir / "s");
  std::map<int64_t, std::string> state;  // what the store held after the last run
  std::mt19937_64 rng(777);
  for (uint64_t run = 0; run < 15; ++run) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) RunChild(o, 1000 + run, -1, Child::kCacheAsync);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 150));
    kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    // Every state each key passed through in this run, in order.
    std::map<int64_t, std::vector<std::optional<std::string>>> states;
    std::map<int64_t, std::optional<std::string>> cur;
    for (const auto& [k, v] : state) cur[k] = v;
    for (int t = 0; t < kThreads; ++t) {
      OpGen gen(1000 + run, t);
      for (uint32_t i = 0; i < kMaxOps; ++i) {
        const Op op = gen.Next();
        std::optional<std::string>& c = cur[op.key];
        if (op.type == OpType::kPut) c = op.value;
        if (op.type == OpType::kRemove) c.reset();
        if (op.type == OpType::kAppend) c = c.value_or("") + op.value;
        states[op.key].push_back(c);
      }
    }
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    const std::map<int64_t, std::string> actual = ReadAll(*store);
    REQUIRE(store->GetStats().corrupt_records == 0);
    std::set<int64_t> keys;
    for (const auto& [k, v] : actual) keys.insert(k);
    for (const auto& [k, v] : state) keys.insert(k);
    for (int64_t k : keys) {
      INFO("run " << run << " key " << k);
      std::optional<std::string> got;
      if (auto it = actual.find(k); it != actual.end()) got = it->second;
      std::optional<std::string> before;
      if (auto it = state.find(k); it != state.end()) before = it->second;
      bool ok = got == before;
      for (const auto& s : states[k]) ok = ok || got == s;
      REQUIRE(ok);
    }
    state = actual;
  }
}

TEST_CASE("A kill at each step of a promotion from the sparse tier loses nothing and revives nothing",
          "[engine][crash][sparse]") {
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("killed at promotion step " << stage);
    flatkv::test::TempDir dir;
    EngineOptions o = CrashOptions(dir / "s");
    o.sparse_tier = true;
    o.segment_keys = 1 << 16;
    pid_t pid;
    const int acks = ForkWithPipe([&](int ack_fd) {
      std::unique_ptr<Store> store = OpenInChild(o);
      store->TEST_KillInPromotion(stage);
      for (int64_t k = 0; k < 2000; ++k) {
        if (!store->Put(k, "v" + std::to_string(k)).ok()) _exit(4);
        if (write(ack_fd, &k, sizeof(k)) != sizeof(k)) _exit(5);
      }
      // No promotion happened: the parent fails below.
    }, &pid);
    int64_t acked = -1;
    int64_t k;
    while (read(acks, &k, sizeof(k)) == sizeof(k)) acked = k;
    close(acks);
    const int status = Reap(pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    REQUIRE(acked >= 0);
    std::unique_ptr<Store> store;
    REQUIRE(Store::Open(o, &store).ok());
    for (int64_t key = 0; key <= acked; ++key) {
      std::string v;
      INFO("key " << key);
      REQUIRE(store->Get(key, &v).ok());
      REQUIRE(v == "v" + std::to_string(key));
    }
    // The segment is a flat table now; removes in it stay removed across a
    // reopen (no stale copy of the tier comes back).
    REQUIRE(store->GetStats().segments == 1);
    for (int64_t key = 0; key <= acked; key += 2) REQUIRE(store->Remove(key).ok());
    store.reset();
    REQUIRE(Store::Open(o, &store).ok());
    std::map<int64_t, std::string> all = ReadAll(*store);
    for (int64_t key = 1; key <= acked; key += 2) REQUIRE(all.count(key) == 1);
    for (const auto& [key, v] : all) {
      INFO("key " << key);
      REQUIRE((key % 2 == 1 || key > acked));  // the put in flight at the kill may be there
      REQUIRE(v == "v" + std::to_string(key));
    }
  }
}

TEST_CASE("A kill -9 amid writes to the sparse tier loses no acknowledged key and scans find them in order",
          "[engine][crash][sparse]") {
  flatkv::test::TempDir dir;
  EngineOptions o = CrashOptions(dir / "s");
  o.sparse_tier = true;
  o.key_min = std::numeric_limits<int64_t>::min();
  o.key_max = std::numeric_limits<int64_t>::max();
  o.segment_keys = uint64_t{1} << 24;
  o.sync = SyncMode::kNone;  // a killed process loses nothing the kernel has
  // Random 64-bit keys (each in a segment of its own: all in the tier);
  // every third one is removed again once acknowledged.
  pid_t pid;
  const int acks = ForkWithPipe([&](int ack_fd) {
    std::unique_ptr<Store> store = OpenInChild(o);
    std::mt19937_64 rng(11);
    for (int64_t i = 0;; ++i) {
      const auto k = static_cast<int64_t>(rng());
      if (!store->Put(k, "v" + std::to_string(k)).ok()) _exit(4);
      int64_t rec[2] = {k, 1};
      if (i % 3 == 0) {
        if (!store->Remove(k).ok()) _exit(4);
        rec[1] = 0;
      }
      if (write(ack_fd, rec, sizeof(rec)) != sizeof(rec)) _exit(5);
      if (i == 20000) raise(SIGKILL);
    }
  }, &pid);
  std::map<int64_t, std::string> want;
  int64_t rec[2];
  while (read(acks, rec, sizeof(rec)) == sizeof(rec)) {
    if (rec[1] == 1) want[rec[0]] = "v" + std::to_string(rec[0]);
    else want.erase(rec[0]);
  }
  close(acks);
  const int status = Reap(pid);
  INFO("the writer's exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(want.size() > 10000);
  std::unique_ptr<Store> store;
  REQUIRE(Store::Open(o, &store).ok());
  CHECK(store->GetStats().segments == 0);
  CHECK(store->GetStats().sparse_keys == want.size());
  // The order the tier rebuilt at open: a full scan is exactly the model.
  std::map<int64_t, std::string> got;
  int64_t from = std::numeric_limits<int64_t>::min();
  for (bool done = false; !done;) {
    std::vector<KeyValue> page;
    int64_t next = 0;
    REQUIRE(store->Scan(from, false, 500, &page, &next, &done).ok());
    for (KeyValue& kv : page) got[kv.key] = std::move(kv.value);
    from = next;
  }
  std::vector<int64_t> missing, extra;
  for (const auto& [k, v] : want) {
    if (got.count(k) == 0 || got.at(k) != v) missing.push_back(k);
  }
  for (const auto& [k, v] : got) {
    if (want.count(k) == 0) extra.push_back(k);
  }
  INFO(missing.size() << " acknowledged keys missing or wrong (first " <<
       (missing.empty() ? 0 : missing[0]) << "), " << extra.size() << " removed keys back (first " <<
       (extra.empty() ? 0 : extra[0]) << ")");
  REQUIRE(missing.empty());
  REQUIRE(extra.empty());
}
