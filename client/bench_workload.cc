// Implementation note: the timed loop is one virtual call per op and nothing
// else that allocates or locks. Keys come from a per-thread functor (a
// counter, the shared read-only permutation, or a per-thread Rng), values are
// slices of the shared ValueBuffer, and gets reuse one std::string per thread.
// The loop is instantiated per key source and key kind so the compiler sees
// the key computation inline (a string key is built in a stack buffer from the
// index); failures go to an out-of-line function.
#include "client/bench_workload.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <thread>
#include <vector>

namespace flatkv::client {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMinValueBufferBytes = size_t{1} << 20;
// Bytes per stretch of the value buffer; the first half of each is random,
// the second repeats it, giving db_bench's compression ratio of 0.5.
constexpr size_t kCompressibleStretch = 100;

struct WorkloadInfo {
  Workload workload;
  const char* name;
};

constexpr WorkloadInfo kWorkloads[] = {
    {Workload::kFillSeq, "fillseq"},         {Workload::kFillRandom, "fillrandom"},
    {Workload::kOverwrite, "overwrite"},     {Workload::kReadRandom, "readrandom"},
    {Workload::kReadMissing, "readmissing"}, {Workload::kDeleteRandom, "deleterandom"},
    {Workload::kReopen, "reopen"},
};

// One splitmix64 step as a pure function, to derive independent seeds.
uint64_t MixSeed(uint64_t x) { return Rng(x).Next(); }

struct ThreadResult {
  uint64_t found = 0;
  uint64_t errors = 0;
  std::string first_error;
  Clock::time_point end;
};

// Kept out of line so the hot loops stay small. "key" is the index; with
// string keys the message also shows the bytes sent, in hex.
[[gnu::noinline]] void RecordFailure(const Status& s, KeyKind kind, int64_t key,
                                     ThreadResult* r) {
  if (r->errors++ > 0) return;
  r->first_error = "key " + std::to_string(key);
  if (kind == KeyKind::kString) {
    char bytes[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), bytes);
    static constexpr char kHex[] = "0123456789abcdef";
    r->first_error += " (string ";
    for (char c : bytes) {
      r->first_error += kHex[static_cast<unsigned char>(c) >> 4];
      r->first_error += kHex[static_cast<unsigned char>(c) & 0xf];
    }
    r->first_error += ")";
  }
  r->first_error += ": " + s.ToString();
}

struct SeqKeys {
  int64_t operator()(uint64_t i) { return static_cast<int64_t>(i); }
};

struct PermutedKeys {
  const KeyPermutation* permutation;
  int64_t operator()(uint64_t i) { return static_cast<int64_t>((*permutation)(i)); }
};

// Keys drawn with replacement from [base, base + n).
struct RandomKeys {
  Rng rng;
  uint64_t n;
  uint64_t base;
  int64_t operator()(uint64_t) { return static_cast<int64_t>(base + rng.Uniform(n)); }
};

enum class Op { kPut, kGet, kDelete };

Op OpOf(Workload w) {
  switch (w) {
    case Workload::kReadRandom:
    case Workload::kReadMissing:
      return Op::kGet;
    case Workload::kDeleteRandom:
      return Op::kDelete;
    default:
      return Op::kPut;
  }
}

// One op on the key of index "key": the integer itself, or its string key.
template <KeyKind kKind>
Status PutKey(BenchEngine* engine, int64_t key, std::string_view value) {
  if constexpr (kKind == KeyKind::kString) {
    char k[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), k);
    return engine->SPut(std::string_view(k, sizeof(k)), value);
  } else {
    return engine->Put(key, value);
  }
}

template <KeyKind kKind>
Status GetKey(BenchEngine* engine, int64_t key, std::string* value) {
  if constexpr (kKind == KeyKind::kString) {
    char k[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), k);
    return engine->SGet(std::string_view(k, sizeof(k)), value);
  } else {
    return engine->Get(key, value);
  }
}

template <KeyKind kKind>
Status DeleteKey(BenchEngine* engine, int64_t key) {
  if constexpr (kKind == KeyKind::kString) {
    char k[kStringKeyBytes];
    StringKey(static_cast<uint64_t>(key), k);
    return engine->SDelete(std::string_view(k, sizeof(k)));
  } else {
    return engine->Delete(key);
  }
}

// Runs ops [begin, end) of one thread.
template <KeyKind kKind, class Keys>
void RunSlice(BenchEngine* engine, Op op, Keys keys, uint64_t begin, uint64_t end,
              const ValueBuffer& values, size_t value_pos, ThreadResult* r) {
  switch (op) {
    case Op::kPut:
      for (uint64_t i = begin; i < end; ++i) {
        int64_t key = keys(i);
        Status s = PutKey<kKind>(engine, key, values.Next(&value_pos));
        if (!s.ok()) RecordFailure(s, kKind, key, r);
      }
      break;
    case Op::kGet: {
      std::string value;
      value.reserve(values.value_size());
      for (uint64_t i = begin; i < end; ++i) {
        int64_t key = keys(i);
        Status s = GetKey<kKind>(engine, key, &value);
        if (s.ok()) {
          ++r->found;
        } else if (!s.IsNotFound()) {
          RecordFailure(s, kKind, key, r);
        }
      }
      break;
    }
    case Op::kDelete:
      for (uint64_t i = begin; i < end; ++i) {
        int64_t key = keys(i);
        Status s = DeleteKey<kKind>(engine, key);
        if (!s.ok()) RecordFailure(s, kKind, key, r);
      }
      break;
  }
}

// The body of thread "t": picks its slice and key source, then runs it.
template <KeyKind kKind>
void RunThread(BenchEngine* engine, Workload w, const WorkloadConfig& c,
               const KeyPermutation& permutation, int t, ThreadResult* r) {
  uint64_t threads = static_cast<uint64_t>(c.threads);
  uint64_t begin = c.num * t / threads;
  uint64_t end = c.num * (t + 1) / threads;
  uint64_t thread_seed =
      MixSeed(c.seed ^ MixSeed(static_cast<uint64_t>(c.position) << 16 | static_cast<uint64_t>(t)));
  Rng rng(thread_seed);
  size_t value_pos = rng.Uniform(c.values->size());
  Op op = OpOf(w);
  const ValueBuffer& values = *c.values;
  switch (w) {
    case Workload::kFillSeq:
      RunSlice<kKind>(engine, op, SeqKeys{}, begin, end, values, value_pos, r);
      break;
    case Workload::kFillRandom:
    case Workload::kDeleteRandom:
      RunSlice<kKind>(engine, op, PermutedKeys{&permutation}, begin, end, values, value_pos, r);
      break;
    case Workload::kReadMissing:
      RunSlice<kKind>(engine, op, RandomKeys{rng, c.num, c.num}, begin, end, values, value_pos, r);
      break;
    default:  // overwrite, readrandom
      RunSlice<kKind>(engine, op, RandomKeys{rng, c.num, 0}, begin, end, values, value_pos, r);
      break;
  }
  r->end = Clock::now();
}

Status RunReopen(BenchEngine* engine, const WorkloadConfig& c, WorkloadResult* result) {
  result->ops = 1;
  // The close is not timed: "reopen" measures how long a user waits for a
  // database that was shut down cleanly.
  Status s = engine->Close();
  if (!s.ok()) {
    result->errors = 1;
    result->first_error = "close: " + s.ToString();
  }
  Clock::time_point start = Clock::now();
  s = engine->Open(c.open_options);
  result->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!s.ok()) return s.WithContext("reopen");
  return Status::OK();
}

}  // namespace

bool ParseWorkload(std::string_view name, Workload* workload) {
  for (const WorkloadInfo& info : kWorkloads) {
    if (name == info.name) {
      *workload = info.workload;
      return true;
    }
  }
  return false;
}

const char* WorkloadName(Workload workload) {
  for (const WorkloadInfo& info : kWorkloads) {
    if (info.workload == workload) return info.name;
  }
  return "unknown";
}

const char* WorkloadNameList() {
  return "fillseq|fillrandom|overwrite|readrandom|readmissing|deleterandom|reopen";
}

bool ParseKeyKind(std::string_view name, KeyKind* kind) {
  if (name == "int") {
    *kind = KeyKind::kInt;
  } else if (name == "string") {
    *kind = KeyKind::kString;
  } else {
    return false;
  }
  return true;
}

const char* KeyKindName(KeyKind kind) { return kind == KeyKind::kString ? "string" : "int"; }

uint64_t KeyBytes(KeyKind kind) { return kind == KeyKind::kString ? kStringKeyBytes : 8; }

bool IsWriteWorkload(Workload w) {
  return w == Workload::kFillSeq || w == Workload::kFillRandom ||
         w == Workload::kOverwrite || w == Workload::kDeleteRandom;
}

bool NeedsData(Workload w) {
  return w == Workload::kOverwrite || w == Workload::kReadRandom ||
         w == Workload::kReadMissing || w == Workload::kDeleteRandom;
}

KeyPermutation::KeyPermutation(uint64_t n, uint64_t seed) : n_(n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  mask_ = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  // A shift of half the width carries high bits into low ones; it must be at
  // least 1 or the xor would zero the value and break the bijection.
  shift_ = std::max(1, (bits + 1) / 2);
  Rng rng(seed);
  for (int r = 0; r < kRounds; ++r) {
    mul_[r] = rng.Next() | 1;  // odd: invertible modulo 2^bits
    add_[r] = rng.Next();
  }
}

ValueBuffer::ValueBuffer(uint32_t value_size, uint64_t seed) : value_size_(value_size) {
  size_t bytes = std::max<size_t>(kMinValueBufferBytes, value_size);
  data_.reserve(bytes + kCompressibleStretch);
  Rng rng(seed);
  while (data_.size() < bytes) {
    size_t half = kCompressibleStretch / 2;
    size_t start = data_.size();
    for (size_t i = 0; i < half; ++i) data_.push_back(static_cast<char>(' ' + rng.Uniform(95)));
    data_.append(data_, start, half);
  }
  data_.resize(bytes);
}

Status RunWorkload(BenchEngine* engine, Workload workload, const WorkloadConfig& config,
                   WorkloadResult* result) {
  *result = WorkloadResult();
  if (workload == Workload::kReopen) return RunReopen(engine, config, result);

  KeyPermutation permutation(config.num,
                             MixSeed(config.seed + static_cast<uint64_t>(config.position)));
  std::vector<ThreadResult> per_thread(config.threads);
  std::vector<std::thread> threads;
  threads.reserve(config.threads);
  // Threads check in on "ready" and then wait for "go", so thread start-up is
  // outside the timed interval and all of them begin together.
  std::latch ready(config.threads);
  std::atomic<bool> go{false};
  for (int t = 0; t < config.threads; ++t) {
    threads.emplace_back([&, t] {
      ready.count_down();
      go.wait(false);
      if (config.keys == KeyKind::kString) {
        RunThread<KeyKind::kString>(engine, workload, config, permutation, t, &per_thread[t]);
      } else {
        RunThread<KeyKind::kInt>(engine, workload, config, permutation, t, &per_thread[t]);
      }
    });
  }
  ready.wait();
  Clock::time_point start = Clock::now();
  go.store(true);
  go.notify_all();
  for (std::thread& th : threads) th.join();

  Clock::time_point last = start;
  for (const ThreadResult& r : per_thread) {
    last = std::max(last, r.end);
    result->found += r.found;
    result->errors += r.errors;
    if (result->first_error.empty()) result->first_error = r.first_error;
  }
  result->ops = config.num;
  result->seconds = std::chrono::duration<double>(last - start).count();
  return Status::OK();
}

}  // namespace flatkv::client
