// Implementation note: the timed loop is one virtual call per op and nothing
// else that allocates or locks. Keys come from a per-thread functor (a
// counter, the shared read-only permutation, or a per-thread Rng), values are
// slices of the shared ValueBuffer, and gets reuse one std::string per thread.
// The loop is instantiated per key source and key kind so the compiler sees
// the key computation inline (a string key is built in a stack buffer from the
// index); failures go to an out-of-line function.
//
// The compaction workloads reuse that machinery: their set-up is plain
// overwrite runs and their baseline a plain readrandom run, each with a key
// sequence of its own (PhasePosition). Reads during compaction run one more
// thread alongside the readers, which makes the CompactAndWait call.
#include "client/bench/bench_workload.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "client/bench/bench_sys.h"

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
    {Workload::kReopen, "reopen"},           {Workload::kCompact, "compact"},
    {Workload::kReadWhileCompacting, "readwhilecompacting"},
    {Workload::kZipfOverwrite, "zipfoverwrite"}, {Workload::kZipfRead, "zipfread"},
};

// Phases of the compaction workloads that draw keys: the set-up's overwrite
// passes, then (readwhilecompacting) the baseline reads and the reads during
// compaction.
constexpr int kPhaseBaselineReads = kSetupOverwrites;
constexpr int kPhaseCompactionReads = kSetupOverwrites + 1;
constexpr int kPhases = kSetupOverwrites + 2;

// The position a phase's keys derive from: below the pre-fill's -1 and
// distinct for each (workload position, phase), so no two phases of a run
// draw the same sequence.
int PhasePosition(int position, int phase) { return -2 - (position * kPhases + phase); }

// One splitmix64 step as a pure function, to derive independent seeds.
uint64_t MixSeed(uint64_t x) { return Rng(x).Next(); }

struct ThreadResult {
  uint64_t ops = 0;  // set by the open-ended reads during compaction only
  uint64_t found = 0;
  uint64_t errors = 0;
  std::string first_error;
  Clock::time_point end;
  LatencyHistogram put_latency;  // with WorkloadConfig::time_puts
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

struct ZipfKeys {
  Rng rng;
  const ZipfTable* table;
  int64_t operator()(uint64_t) { return table->Draw(rng); }
};

enum class Op { kPut, kGet, kDelete };

Op OpOf(Workload w) {
  switch (w) {
    case Workload::kReadRandom:
    case Workload::kReadMissing:
    case Workload::kZipfRead:
      return Op::kGet;
    case Workload::kDeleteRandom:
      return Op::kDelete;
    default:
      return Op::kPut;
  }
}

// Runs ops [begin, end) of one thread. Integer key indexes go through
// "space" (--key-dist); string keys are hashed from the index anyway.
template <KeyKind kKind, class Keys>
void RunSlice(BenchEngine* engine, Op op, Keys keys, uint64_t begin, uint64_t end,
              const ValueBuffer& values, size_t value_pos, const WorkloadConfig& c,
              ThreadResult* r) {
  auto key_of = [&c](int64_t index) {
    return kKind == KeyKind::kInt ? c.space.Key(static_cast<uint64_t>(index)) : index;
  };
  switch (op) {
    case Op::kPut:
      for (uint64_t i = begin; i < end; ++i) {
        int64_t key = key_of(keys(i));
        const Clock::time_point t0 = c.time_puts ? Clock::now() : Clock::time_point();
        Status s = PutKey<kKind>(engine, key, values.Next(&value_pos));
        if (c.time_puts) {
          r->put_latency.Record(static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
        }
        if (!s.ok()) RecordFailure(s, kKind, key, r);
      }
      break;
    case Op::kGet: {
      std::string value;
      value.reserve(values.value_size());
      for (uint64_t i = begin; i < end; ++i) {
        int64_t key = key_of(keys(i));
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
        int64_t key = key_of(keys(i));
        Status s = DeleteKey<kKind>(engine, key);
        if (!s.ok()) RecordFailure(s, kKind, key, r);
      }
      break;
  }
}

// The seed of thread "t" of a workload at c.position.
uint64_t ThreadSeed(const WorkloadConfig& c, int t) {
  return MixSeed(c.seed ^
                 MixSeed(static_cast<uint64_t>(c.position) << 16 | static_cast<uint64_t>(t)));
}

// The body of thread "t": picks its slice and key source, then runs it.
template <KeyKind kKind>
void RunThread(BenchEngine* engine, Workload w, const WorkloadConfig& c,
               const KeyPermutation& permutation, const ZipfTable* zipf, int t,
               ThreadResult* r) {
  uint64_t threads = static_cast<uint64_t>(c.threads);
  uint64_t begin = c.num * t / threads;
  uint64_t end = c.num * (t + 1) / threads;
  Rng rng(ThreadSeed(c, t));
  size_t value_pos = rng.Uniform(c.values->size());
  Op op = OpOf(w);
  const ValueBuffer& values = *c.values;
  switch (w) {
    case Workload::kFillSeq:
      RunSlice<kKind>(engine, op, SeqKeys{}, begin, end, values, value_pos, c, r);
      break;
    case Workload::kFillRandom:
    case Workload::kDeleteRandom:
      RunSlice<kKind>(engine, op, PermutedKeys{&permutation}, begin, end, values, value_pos, c,
                      r);
      break;
    case Workload::kReadMissing:
      RunSlice<kKind>(engine, op, RandomKeys{rng, c.num, c.num}, begin, end, values, value_pos, c,
                      r);
      break;
    case Workload::kZipfOverwrite:
    case Workload::kZipfRead:
      RunSlice<kKind>(engine, op, ZipfKeys{rng, zipf}, begin, end, values, value_pos, c, r);
      break;
    default:  // overwrite, readrandom
      RunSlice<kKind>(engine, op, RandomKeys{rng, c.num, 0}, begin, end, values, value_pos, c, r);
      break;
  }
  r->end = Clock::now();
}

// Gets random keys of [0, c.num) until at least "quota" are done and "stop"
// is set: the reads of readwhilecompacting, which last as long as the
// compaction. Sets r->ops.
template <KeyKind kKind>
void RunReadsUntil(BenchEngine* engine, const WorkloadConfig& c, int t, uint64_t quota,
                   const std::atomic<bool>& stop, ThreadResult* r) {
  RandomKeys keys{Rng(ThreadSeed(c, t)), c.num, 0};
  std::string value;
  value.reserve(c.values->value_size());
  uint64_t i = 0;
  for (; i < quota || !stop.load(std::memory_order_relaxed); ++i) {
    int64_t key = keys(i);
    if (kKind == KeyKind::kInt) key = c.space.Key(static_cast<uint64_t>(key));
    Status s = GetKey<kKind>(engine, key, &value);
    if (s.ok()) {
      ++r->found;
    } else if (!s.IsNotFound()) {
      RecordFailure(s, kKind, key, r);
    }
  }
  r->ops = i;
  r->end = Clock::now();
}

// Adds the threads' counts to *result; seconds runs from "start" to the last
// thread's end.
void Summarize(const std::vector<ThreadResult>& per_thread, Clock::time_point start,
               WorkloadResult* result) {
  Clock::time_point last = start;
  for (const ThreadResult& r : per_thread) {
    last = std::max(last, r.end);
    result->put_latency.Merge(r.put_latency);
    result->found += r.found;
    result->errors += r.errors;
    if (result->first_error.empty()) result->first_error = r.first_error;
  }
  result->seconds = std::chrono::duration<double>(last - start).count();
}

// Adds the failures of a helper run to "to".
void AddFailures(const WorkloadResult& from, WorkloadResult* to) {
  to->errors += from.errors;
  if (to->first_error.empty()) to->first_error = from.first_error;
}

void AddFailure(const Status& s, const char* what, WorkloadResult* result) {
  if (result->errors++ == 0) result->first_error = std::string(what) + ": " + s.ToString();
}

// Closes the engine cleanly and opens it again; *open_seconds (if non-null)
// is the time of the open alone. A failed close counts as an error in
// *result; a failed open is returned, and leaves the engine closed.
Status Reopen(BenchEngine* engine, const BenchEngineOptions& options, WorkloadResult* result,
              double* open_seconds) {
  Status s = engine->Close();
  if (!s.ok()) AddFailure(s, "close", result);
  Clock::time_point start = Clock::now();
  s = engine->Open(options);
  if (open_seconds != nullptr) {
    *open_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  if (!s.ok()) return s.WithContext("reopen");
  return Status::OK();
}

Status RunReopen(BenchEngine* engine, const WorkloadConfig& c, WorkloadResult* result) {
  result->ops = 1;
  // The close is not timed: "reopen" measures how long a user waits for a
  // database that was shut down cleanly.
  return Reopen(engine, c.open_options, result, &result->seconds);
}

// The untimed set-up of compact and readwhilecompacting: kSetupOverwrites
// overwrite passes, then a clean close and reopen. While open, flat reserves
// space (fallocate) ahead of each data file's end, up to 8 MiB a file, and a
// clean close trims it; reopening here means the data files are measured as
// they are at rest, before compaction as after it. Put failures are counted
// in *result; only a failed reopen is returned.
Status RunCompactionSetup(BenchEngine* engine, const WorkloadConfig& c, WorkloadResult* result) {
  for (int pass = 0; pass < kSetupOverwrites; ++pass) {
    WorkloadConfig pass_config = c;
    pass_config.position = PhasePosition(c.position, pass);
    WorkloadResult r;
    Status s = RunWorkload(engine, Workload::kOverwrite, pass_config, &r);
    if (!s.ok()) return s;  // not reached: overwrite fails only per op
    AddFailures(r, result);
  }
  return Reopen(engine, c.open_options, result, nullptr);
}

// The engine's compaction status; a failure to read it counts as an error.
BenchCompactionStatus ReadCompactionStatus(BenchEngine* engine, WorkloadResult* result) {
  BenchCompactionStatus status;
  Status s = engine->GetCompactionStatus(&status);
  if (!s.ok()) AddFailure(s, "compaction status", result);
  return status;
}

Status RunCompact(BenchEngine* engine, const WorkloadConfig& c, WorkloadResult* result) {
  FLATKV_RETURN_IF_ERROR(RunCompactionSetup(engine, c, result));
  CompactionResult& cr = result->compaction;
  const DataFileBytes before = ReadDataFileBytes(c.open_options.dir);
  cr.space_before = before.allocated;
  cr.log_bytes_before = before.size;
  BenchCompactionStatus start_status = ReadCompactionStatus(engine, result);

  uint64_t io_before = ReadIoWriteBytes();
  Clock::time_point start = Clock::now();
  Status s = engine->CompactAndWait();
  cr.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t io_after = ReadIoWriteBytes();
  cr.write_bytes = io_after >= io_before ? io_after - io_before : 0;
  if (!s.ok()) AddFailure(s, "compaction", result);
  BenchCompactionStatus end_status = ReadCompactionStatus(engine, result);
  cr.log_bytes_read = end_status.bytes_total;
  cr.tables_compacted = end_status.tables_compacted - start_status.tables_compacted;

  // Measured at rest, as "before" was (see RunCompactionSetup).
  FLATKV_RETURN_IF_ERROR(Reopen(engine, c.open_options, result, nullptr));
  const DataFileBytes after = ReadDataFileBytes(c.open_options.dir);
  cr.space_after = after.allocated;
  cr.log_bytes_after = after.size;
  result->ops = 1;
  result->seconds = cr.seconds;
  return Status::OK();
}

Status RunReadWhileCompacting(BenchEngine* engine, const WorkloadConfig& c,
                              WorkloadResult* result) {
  FLATKV_RETURN_IF_ERROR(RunCompactionSetup(engine, c, result));
  CompactionResult& cr = result->compaction;

  WorkloadConfig baseline_config = c;
  baseline_config.position = PhasePosition(c.position, kPhaseBaselineReads);
  WorkloadResult baseline;
  Status s = RunWorkload(engine, Workload::kReadRandom, baseline_config, &baseline);
  if (!s.ok()) return s;  // not reached: readrandom fails only per op
  AddFailures(baseline, result);
  cr.baseline_seconds = baseline.seconds;
  cr.baseline_ops = baseline.ops;

  // Thread c.threads compacts; the others read, each at least its share of
  // num and then until the compaction has finished.
  WorkloadConfig reads_config = c;
  reads_config.position = PhasePosition(c.position, kPhaseCompactionReads);
  BenchCompactionStatus start_status = ReadCompactionStatus(engine, result);
  std::vector<ThreadResult> per_thread(c.threads);
  std::atomic<bool> compacted{false};
  Status compact_status;
  uint64_t io_before = ReadIoWriteBytes();
  Clock::time_point start = RunTogether(c.threads + 1, [&](int t) {
    if (t == c.threads) {
      Clock::time_point begin = Clock::now();
      compact_status = engine->CompactAndWait();
      cr.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      compacted.store(true, std::memory_order_relaxed);
      return;
    }
    uint64_t threads = static_cast<uint64_t>(c.threads);
    uint64_t quota = c.num * (t + 1) / threads - c.num * t / threads;
    if (c.keys == KeyKind::kString) {
      RunReadsUntil<KeyKind::kString>(engine, reads_config, t, quota, compacted, &per_thread[t]);
    } else {
      RunReadsUntil<KeyKind::kInt>(engine, reads_config, t, quota, compacted, &per_thread[t]);
    }
  });
  uint64_t io_after = ReadIoWriteBytes();
  cr.write_bytes = io_after >= io_before ? io_after - io_before : 0;
  Summarize(per_thread, start, result);
  result->ops = 0;
  for (const ThreadResult& r : per_thread) result->ops += r.ops;
  if (!compact_status.ok()) AddFailure(compact_status, "compaction", result);
  BenchCompactionStatus end_status = ReadCompactionStatus(engine, result);
  cr.log_bytes_read = end_status.bytes_total;
  cr.tables_compacted = end_status.tables_compacted - start_status.tables_compacted;
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
  return "fillseq|fillrandom|overwrite|readrandom|readmissing|deleterandom|reopen|"
         "compact|readwhilecompacting|zipfoverwrite|zipfread";
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

bool ParseKeyDist(std::string_view name, KeyDist* dist) {
  if (name == "dense") {
    *dist = KeyDist::kDense;
  } else if (name == "random") {
    *dist = KeyDist::kRandom;
  } else if (name == "snowflake") {
    *dist = KeyDist::kSnowflake;
  } else {
    return false;
  }
  return true;
}

const char* KeyDistName(KeyDist dist) {
  switch (dist) {
    case KeyDist::kRandom:
      return "random";
    case KeyDist::kSnowflake:
      return "snowflake";
    default:
      return "dense";
  }
}

uint64_t KeyBytes(KeyKind kind) { return kind == KeyKind::kString ? kStringKeyBytes : 8; }

bool IsWriteWorkload(Workload w) {
  return w == Workload::kFillSeq || w == Workload::kFillRandom ||
         w == Workload::kOverwrite || w == Workload::kDeleteRandom ||
         w == Workload::kZipfOverwrite;
}

bool NeedsData(Workload w) {
  return w == Workload::kOverwrite || w == Workload::kReadRandom ||
         w == Workload::kReadMissing || w == Workload::kDeleteRandom ||
         w == Workload::kZipfOverwrite || w == Workload::kZipfRead || IsCompactionWorkload(w);
}

bool IsCompactionWorkload(Workload w) {
  return w == Workload::kCompact || w == Workload::kReadWhileCompacting;
}

ZipfTable::ZipfTable(uint64_t n, uint64_t seed) : cdf_(n), permutation_(n, seed) {
  double sum = 0;
  for (uint64_t r = 0; r < n; ++r) {
    sum += 1.0 / std::pow(static_cast<double>(r + 1), kZipfTheta);
    cdf_[r] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;  // every u < 1 lands below n
  guide_.resize(kGuide + 1);
  uint64_t r = 0;
  for (size_t j = 0; j <= kGuide; ++j) {
    double u = static_cast<double>(j) / kGuide;
    while (r + 1 < n && cdf_[r] <= u) ++r;
    guide_[j] = r;
  }
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
  switch (workload) {
    case Workload::kReopen:
      return RunReopen(engine, config, result);
    case Workload::kCompact:
      return RunCompact(engine, config, result);
    case Workload::kReadWhileCompacting:
      return RunReadWhileCompacting(engine, config, result);
    default:
      break;
  }

  KeyPermutation permutation(config.num,
                             MixSeed(config.seed + static_cast<uint64_t>(config.position)));
  // Built before the threads start: the CDF is not part of the timed loop.
  // Its permutation depends on the seed alone, so every Zipf workload of a
  // run (and of runs with the same --seed) has the same hot keys.
  std::unique_ptr<ZipfTable> zipf;
  if (workload == Workload::kZipfOverwrite || workload == Workload::kZipfRead) {
    zipf = std::make_unique<ZipfTable>(config.num, MixSeed(config.seed ^ 0x7a697066ULL));
  }
  std::vector<ThreadResult> per_thread(config.threads);
  Clock::time_point start = RunTogether(config.threads, [&](int t) {
    if (config.keys == KeyKind::kString) {
      RunThread<KeyKind::kString>(engine, workload, config, permutation, zipf.get(), t,
                                  &per_thread[t]);
    } else {
      RunThread<KeyKind::kInt>(engine, workload, config, permutation, zipf.get(), t,
                               &per_thread[t]);
    }
  });
  Summarize(per_thread, start, result);
  // A write-back cache has acknowledged writes the engine has not seen yet:
  // the workload ends when they are in, so the flush is timed too.
  if (IsWriteWorkload(workload) && engine->CacheWritesBack()) {
    Status s = engine->FlushCache();
    if (!s.ok()) AddFailure(s, "cache flush", result);
    result->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  result->ops = config.num;
  return Status::OK();
}

}  // namespace flatkv::client
