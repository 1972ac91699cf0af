// The workloads of flatkv-bench and the machinery that times them: which keys
// each one touches, the value bytes it writes, and the threads that run it.
//
// Key indexes live in [0, num). Every key sequence is a pure function of
// (--seed, workload position, thread), so two runs with the same flags issue
// the same operations in the same order against every engine. --key-dist
// maps an index to the integer key sent (KeySpace below): dense sends the
// index itself, random and snowflake spread the same indexes over a sparse
// key space, so a workload touches the same number of distinct keys either
// way.
//
// With --keys string, key index i is sent as the 16 bytes StringKey(i) instead
// of the integer i; the sequences below pick the same indexes either way, so
// "ascending" and "permutation" are about indexes, not about the bytes.
//
//   fillseq       put 0..num-1 ascending; thread t takes the t-th slice
//   fillrandom    put a random permutation of [0, num): each key once
//   overwrite     put num keys drawn with replacement from [0, num)
//   readrandom    get num keys drawn with replacement from [0, num)
//   readmissing   get num keys drawn from [num, 2*num): never written
//   deleterandom  delete a random permutation of [0, num)
//   reopen        close (untimed), then time one Open
//   compact       set-up (below), then time one CompactAndWait and measure
//                 the data files before and after it
//   readwhilecompacting
//                 set-up (below), then readrandom of num keys without
//                 compaction (the baseline), then readrandom on as many
//                 threads while one CompactAndWait runs
//   zipfoverwrite put num keys drawn from Zipf(0.99) over [0, num)
//   zipfread      get num keys drawn from the same Zipf(0.99)
//
// Zipf: rank r in [0, num) has probability proportional to 1/(r+1)^0.99. The
// CDF is computed once per workload, before its threads start (8 bytes a
// key), and each thread draws with its own Rng. Ranks are scattered over the
// keys by a KeyPermutation that depends on --seed only, so zipfoverwrite and
// zipfread share the same hot keys, and they are not the lowest key numbers.
//
// Write workloads on an engine whose cache writes back (flat, --cache with
// --write-mode async) end with a FlushCache() inside the timed interval, so
// their time includes getting every write into the engine.
//
// The set-up of the two compaction workloads is untimed: kSetupOverwrites
// passes of overwrite (num puts each, keys drawn as overwrite draws them), so
// the log holds (1 + kSetupOverwrites) records per key of which one is live,
// then a clean close and reopen, which trims the space the store reserves
// ahead of each data file's end while it is open.
//
// Thread safety: RunWorkload starts and joins its own threads; the
// ValueBuffer is shared read-only between them.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "client/bench/bench_engine.h"
#include "client/bench/bench_histogram.h"
#include "engine/status.h"

namespace flatkv::client {

enum class Workload {
  kFillSeq,
  kFillRandom,
  kOverwrite,
  kReadRandom,
  kReadMissing,
  kDeleteRandom,
  kReopen,
  kCompact,
  kReadWhileCompacting,
  kZipfOverwrite,
  kZipfRead,
};

// Exponent of the Zipf distribution of zipfoverwrite and zipfread.
inline constexpr double kZipfTheta = 0.99;

// Overwrite passes in the set-up of compact and readwhilecompacting.
inline constexpr int kSetupOverwrites = 3;

// Parses a workload name as spelled on the command line; false if unknown.
bool ParseWorkload(std::string_view name, Workload* workload);
const char* WorkloadName(Workload workload);
// "fillseq|fillrandom|..." for usage and error messages.
const char* WorkloadNameList();

// How keys reach the engine: the integer index itself, or the 16 bytes
// StringKey(index) through the engine's string-key calls.
enum class KeyKind { kInt, kString };

// Parses "int" | "string"; false on anything else.
bool ParseKeyKind(std::string_view name, KeyKind* kind);
// "int" | "string", as on the command line and in --json.
const char* KeyKindName(KeyKind kind);
// Bytes of one key as the engine sees it: 8 for int (the peers' big-endian
// form), 16 for string.
uint64_t KeyBytes(KeyKind kind);

// Workloads that write (puts and deletes): they get a write_amp.
bool IsWriteWorkload(Workload workload);
// Workloads that read what a fill wrote: on an empty directory the bench
// fills first so their numbers mean something.
bool NeedsData(Workload workload);
// compact and readwhilecompacting: they need BenchEngine::SupportsCompaction.
bool IsCompactionWorkload(Workload workload);

// splitmix64: tiny, fast and good enough to drive key choice. Each thread
// owns one, so there is no shared state in the timed loop.
class Rng {
 public:
  // __extension__ keeps -Wpedantic quiet about the GCC/Clang 128-bit type.
  __extension__ typedef unsigned __int128 Uint128;

  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by multiply-shift (Lemire), without a division.
  uint64_t Uniform(uint64_t n) {
    return static_cast<uint64_t>((static_cast<Uint128>(Next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

// splitmix64 as a pure function of its input (one Rng step from state x). A
// bijection of uint64.
inline uint64_t SplitMix64(uint64_t x) { return Rng(x).Next(); }

// Where integer key index i lands (--key-dist), as shared/DESIGN.md names it:
//   dense      i itself: keys in [0, num)
//   random     uniform over [key_min, key_max): SplitMix64 of (i, seed),
//              scaled by multiply-shift; distinct indexes collide only as
//              two uniform draws over that span do
//   snowflake  Twitter's IDs, (milliseconds << 22) | sequence, issued at
//              snowflake_rate IDs a second from a fixed start
//              (kSnowflakeStartMs), so a run's keys do not depend on the clock
enum class KeyDist { kDense, kRandom, kSnowflake };

// Parses "dense" | "random" | "snowflake"; false on anything else.
bool ParseKeyDist(std::string_view name, KeyDist* dist);
const char* KeyDistName(KeyDist dist);

// 2026-01-01T00:00:00Z in milliseconds since Twitter's epoch (1288834974657).
inline constexpr uint64_t kSnowflakeStartMs = 1767225600000ULL - 1288834974657ULL;

struct KeySpace {
  KeyDist dist = KeyDist::kDense;
  int64_t key_min = 0;                                  // random only
  int64_t key_max = std::numeric_limits<int64_t>::max();
  uint64_t snowflake_rate = 10000;                      // IDs a second
  uint64_t seed = 0;                                    // random only

  int64_t Key(uint64_t index) const {
    switch (dist) {
      case KeyDist::kDense:
        return static_cast<int64_t>(index);
      case KeyDist::kRandom: {
        const uint64_t span = static_cast<uint64_t>(key_max) - static_cast<uint64_t>(key_min);
        const uint64_t x = SplitMix64(index ^ seed);
        const auto offset = static_cast<uint64_t>((static_cast<Rng::Uint128>(x) * span) >> 64);
        return static_cast<int64_t>(static_cast<uint64_t>(key_min) + offset);
      }
      case KeyDist::kSnowflake:
        break;
    }
    // Within a millisecond the sequence counts up; past 1000 IDs a second
    // several share one, below it the milliseconds skip.
    uint64_t ms, seq;
    if (snowflake_rate >= 1000) {
      const uint64_t per_ms = snowflake_rate / 1000;
      ms = index / per_ms;
      seq = index % per_ms;
    } else {
      ms = index * (1000 / snowflake_rate);
      seq = 0;
    }
    return static_cast<int64_t>(((kSnowflakeStartMs + ms) << 22) | seq);
  }
};

inline constexpr size_t kStringKeyBytes = 16;

// Writes the string key of index i into out[0..16): SplitMix64(i) and
// SplitMix64(i ^ kSalt), each big-endian. Binary, independent of --seed, and
// distinct for distinct i (the first half alone is a bijection), so the
// missing keys [num, 2*num) never collide with the written ones.
inline void StringKey(uint64_t i, char* out) {
  constexpr uint64_t kSalt = 0x5bd1e9955bd1e995ULL;
  EncodeBigEndianKey(static_cast<int64_t>(SplitMix64(i)), out);
  EncodeBigEndianKey(static_cast<int64_t>(SplitMix64(i ^ kSalt)), out + 8);
}

// One op on the key of index "key": the integer itself, or its string key
// (engine workloads and growth mode).
template <KeyKind kKind>
inline Status PutKey(BenchEngine* engine, int64_t key, std::string_view value) {
  if constexpr (kKind == KeyKind::kString) {
    char k[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), k);
    return engine->SPut(std::string_view(k, sizeof(k)), value);
  } else {
    return engine->Put(key, value);
  }
}

template <KeyKind kKind>
inline Status GetKey(BenchEngine* engine, int64_t key, std::string* value) {
  if constexpr (kKind == KeyKind::kString) {
    char k[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), k);
    return engine->SGet(std::string_view(k, sizeof(k)), value);
  } else {
    return engine->Get(key, value);
  }
}

template <KeyKind kKind>
inline Status DeleteKey(BenchEngine* engine, int64_t key) {
  if constexpr (kKind == KeyKind::kString) {
    char k[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), k);
    return engine->SDelete(std::string_view(k, sizeof(k)));
  } else {
    return engine->Delete(key);
  }
}

// A seeded bijection of [0, n): a random permutation that costs no memory,
// so a billion-key fillrandom does not inflate rss_bytes by 8 GB. It mixes
// within the smallest power of two >= n and walks the cycle until it lands
// below n (fewer than two steps on average).
class KeyPermutation {
 public:
  KeyPermutation(uint64_t n, uint64_t seed);
  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do {
      x = Mix(x);
    } while (x >= n_);
    return x;
  }

 private:
  // Each step (odd multiply, xor-shift, add, all modulo 2^bits) is a
  // bijection of [0, 2^bits), so the composition is one too.
  uint64_t Mix(uint64_t x) const {
    for (int r = 0; r < kRounds; ++r) {
      x = (x * mul_[r]) & mask_;
      x ^= x >> shift_;
      x = (x + add_[r]) & mask_;
    }
    return x;
  }

  static constexpr int kRounds = 3;
  uint64_t n_;
  uint64_t mask_;
  int shift_;
  uint64_t mul_[kRounds];
  uint64_t add_[kRounds];
};

// The Zipf(kZipfTheta) distribution over [0, n): the CDF over ranks (8 bytes
// a key, built by the constructor, which is O(n) and meant to run before any
// timed loop) with a guide table (guide_[j] is the first rank whose CDF
// exceeds j / kGuide), so a draw binary-searches only the ranks between two
// guide entries. Ranks are scattered over the keys by a KeyPermutation of
// "seed", so the hot keys are not the lowest numbers and two tables with the
// same (n, seed) have the same hot keys. Used by zipfoverwrite and zipfread
// here and by `flatkv-bench server --keys zipf` (client/bench/bench_server.h).
//
// Thread safety: Draw() is const; threads share one table, each with its
// own Rng.
class ZipfTable {
 public:
  // Requires n >= 1.
  ZipfTable(uint64_t n, uint64_t seed);
  // The key of one draw: a Zipf rank, scattered over [0, n).
  int64_t Draw(Rng& rng) const {
    double u = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;  // [0, 1)
    size_t j = static_cast<size_t>(u * kGuide);
    auto lo = cdf_.begin() + static_cast<ptrdiff_t>(guide_[j]);
    auto hi = cdf_.begin() + static_cast<ptrdiff_t>(guide_[j + 1]) + 1;
    uint64_t rank = static_cast<uint64_t>(std::upper_bound(lo, hi, u) - cdf_.begin());
    return static_cast<int64_t>(permutation_(rank));
  }

 private:
  static constexpr size_t kGuide = 1 << 16;
  std::vector<double> cdf_;
  std::vector<uint64_t> guide_;
  KeyPermutation permutation_;
};

// Value bytes generated once, like db_bench's RandomGenerator: random
// printable bytes in which each 100-byte stretch holds 50 random bytes
// repeated, so a compressing engine (RocksDB/LevelDB with Snappy) sees a 0.5
// compression ratio, as it would on real data, not on zeros or noise. Puts
// slice it, so producing a value costs nothing in the timed loop.
class ValueBuffer {
 public:
  ValueBuffer(uint32_t value_size, uint64_t seed);
  // The value for the op at "pos" (advanced past it). Slices wrap around a
  // 1 MiB buffer (larger if values are).
  std::string_view Next(size_t* pos) const {
    if (*pos + value_size_ > data_.size()) *pos = 0;
    std::string_view v(data_.data() + *pos, value_size_);
    *pos += value_size_;
    return v;
  }
  size_t size() const { return data_.size(); }
  uint32_t value_size() const { return value_size_; }

 private:
  uint32_t value_size_;
  std::string data_;
};

// Runs body(t) for t in [0, n) on n threads that start together: each checks
// in on "ready" and then waits for "go", so thread start-up is outside the
// timed interval. Joins them all and returns the time of "go".
template <class Body>
std::chrono::steady_clock::time_point RunTogether(int n, const Body& body) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  std::latch ready(n);
  std::atomic<bool> go{false};
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      ready.count_down();
      go.wait(false);
      body(t);
    });
  }
  ready.wait();
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  go.store(true);
  go.notify_all();
  for (std::thread& th : threads) th.join();
  return start;
}

// What compact and readwhilecompacting measure besides the time of their
// timed part. "Data files" are flat's data-*.log files under --dir, measured
// with the store closed cleanly (see ReadDataFileBytes).
struct CompactionResult {
  double seconds = 0;               // one CompactAndWait, call to return
  uint64_t log_bytes_read = 0;      // bytes_total of the round (its log bytes)
  uint64_t tables_compacted = 0;    // by that round
  uint64_t space_before = 0;        // data files, allocated bytes
  uint64_t space_after = 0;
  uint64_t log_bytes_before = 0;    // data files, st_size
  uint64_t log_bytes_after = 0;
  uint64_t write_bytes = 0;         // /proc/self/io write_bytes over the
                                    // compaction (compact) or the reads during
                                    // it (readwhilecompacting); no set-up
  double baseline_seconds = 0;      // readwhilecompacting: the reads without
  uint64_t baseline_ops = 0;        // compaction
};

// What one timed workload did.
struct WorkloadResult {
  double seconds = 0;
  uint64_t ops = 0;     // operations issued (num, 1 for reopen and compact, at
                        // least num for readwhilecompacting)
  uint64_t found = 0;   // gets that hit
  uint64_t errors = 0;  // ops that failed with anything but NotFound
  std::string first_error;  // the first such failure, for stderr
  CompactionResult compaction;  // compact and readwhilecompacting only
  LatencyHistogram put_latency;  // each put's, with config.time_puts
};

struct WorkloadConfig {
  uint64_t num = 0;
  int threads = 1;
  uint64_t seed = 301;      // mixed with "position" and the thread index
  int position = 0;         // index of the workload in --workload, so repeats differ
  KeyKind keys = KeyKind::kInt;
  KeySpace space;           // integer keys: index -> key (--key-dist)
  bool time_puts = false;   // record each put's latency in put_latency
  const ValueBuffer* values = nullptr;
  BenchEngineOptions open_options;  // for reopen
};

// Runs "workload" against the open "engine" with config.threads threads that
// start together; seconds covers the first start to the last finish. Per-op
// failures (and a failed compaction) are counted, not fatal. Returns an error
// only if the engine could not be reopened (reopen, and the set-up of the
// compaction workloads), after which it is closed. The compaction workloads
// need engine->SupportsCompaction().
//
// readwhilecompacting: each reader thread does at least its share of num
// gets and keeps going until the compaction has finished; seconds and ops
// cover that whole interval (compaction starts with the readers).
Status RunWorkload(BenchEngine* engine, Workload workload, const WorkloadConfig& config,
                   WorkloadResult* result);

}  // namespace flatkv::client
