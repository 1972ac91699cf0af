// Implementation note: a step is one RunTogether of --threads threads. Thread
// t owns the step's record indexes begin + t, begin + t + T, ... and walks
// them in order, so the threads insert disjoint records and, at any moment,
// thread t knows exactly which records are present without reading any other
// thread's progress: those below "begin" (all earlier steps) and its own
// inserts so far. Reads draw from that set, which is why every read must
// hit. Nothing in the timed loop allocates or takes a lock of ours; the
// output (JSON or CSV) is built from one field list so both always carry the
// same fields in the same order.
#include "client/bench/bench_growth.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "client/bench/bench_engine.h"
#include "client/bench/bench_flags.h"
#include "client/bench/bench_sys.h"
#include "client/bench/bench_workload.h"

namespace flatkv::client {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct MixInfo {
  GrowthMix mix;
  const char* name;
  int read_percent;
};

constexpr MixInfo kMixes[] = {
    {GrowthMix::kWriteOnly, "writeonly", 0},
    {GrowthMix::kReadHeavy, "readheavy", 90},
    {GrowthMix::kWriteHeavy, "writeheavy", 10},
};

const MixInfo& InfoOf(GrowthMix mix) {
  for (const MixInfo& m : kMixes) {
    if (m.mix == mix) return m;
  }
  return kMixes[0];  // not reached: every enumerator is in the table
}

// What one step asks of its threads.
struct StepPlan {
  uint64_t begin = 0;  // records present before the step: indexes [0, begin)
  uint64_t end = 0;    // records present after it
  int threads = 1;
  int read_percent = 0;
  uint64_t seed = 0;   // the step's; each thread mixes in its index
  const KeyPermutation* permutation = nullptr;
  KeySpace space;      // record index -> integer key (--key-dist)
  const ValueBuffer* values = nullptr;
};

// One thread's counts over a step.
struct StepThread {
  uint64_t inserts = 0;
  uint64_t reads = 0;
  uint64_t found = 0;
  uint64_t errors = 0;  // failed ops, and reads that missed
  std::string first_error;
  Clock::time_point end;
};

[[gnu::noinline]] void RecordFailure(const char* op, int64_t key, const Status& s,
                                     StepThread* r) {
  if (r->errors++ > 0) return;
  r->first_error = std::string(op) + " of record key " + std::to_string(key) + ": " +
                   (s.IsNotFound() ? std::string("not found (it was inserted)") : s.ToString());
}

// Thread t's part of a step: its inserts, with reads drawn in between.
template <KeyKind kKind>
void RunStepThread(BenchEngine* engine, const StepPlan& p, int t, StepThread* r) {
  const uint64_t stride = static_cast<uint64_t>(p.threads);
  const uint64_t first = p.begin + static_cast<uint64_t>(t);
  Rng rng(SplitMix64(p.seed ^ static_cast<uint64_t>(t)));
  size_t value_pos = rng.Uniform(p.values->size());
  std::string value;
  value.reserve(p.values->value_size());
  const uint64_t read_percent = static_cast<uint64_t>(p.read_percent);
  for (uint64_t next = first; next < p.end;) {
    // Records this thread can read: [0, begin) and its own inserts so far.
    uint64_t present = p.begin + r->inserts;
    if (read_percent > 0 && present > 0 && rng.Uniform(100) < read_percent) {
      uint64_t u = rng.Uniform(present);
      uint64_t index = u < p.begin ? u : first + (u - p.begin) * stride;
      int64_t key = p.space.Key((*p.permutation)(index));
      Status s = GetKey<kKind>(engine, key, &value);
      ++r->reads;
      if (s.ok()) {
        ++r->found;
      } else {
        RecordFailure("get", key, s, r);
      }
    } else {
      int64_t key = p.space.Key((*p.permutation)(next));
      Status s = PutKey<kKind>(engine, key, p.values->Next(&value_pos));
      if (!s.ok()) RecordFailure("put", key, s, r);
      ++r->inserts;
      next += stride;
    }
  }
  r->end = Clock::now();
}

// One output line's numbers.
struct GrowthPoint {
  int point = 0;
  uint64_t records = 0;
  uint64_t inserts = 0;
  uint64_t reads = 0;
  uint64_t found = 0;
  uint64_t errors = 0;
  std::string first_error;
  double seconds = 0;
  double elapsed_seconds = 0;  // timed seconds of every step so far
  uint64_t disk_bytes = 0;
  uint64_t rss_bytes = 0;
  uint64_t write_bytes = 0;
};

// Runs step "plan" and fills the counts and seconds of *point. With a
// write-back cache the step ends with a timed flush, as engine mode's write
// workloads do, so its time includes getting every insert into the engine.
void RunStep(BenchEngine* engine, KeyKind keys, const StepPlan& plan, GrowthPoint* point) {
  std::vector<StepThread> per_thread(static_cast<size_t>(plan.threads));
  Clock::time_point start = RunTogether(plan.threads, [&](int t) {
    if (keys == KeyKind::kString) {
      RunStepThread<KeyKind::kString>(engine, plan, t, &per_thread[static_cast<size_t>(t)]);
    } else {
      RunStepThread<KeyKind::kInt>(engine, plan, t, &per_thread[static_cast<size_t>(t)]);
    }
  });
  Clock::time_point last = start;
  for (const StepThread& r : per_thread) {
    last = std::max(last, r.end);
    point->inserts += r.inserts;
    point->reads += r.reads;
    point->found += r.found;
    point->errors += r.errors;
    if (point->first_error.empty()) point->first_error = r.first_error;
  }
  if (engine->CacheWritesBack()) {
    Status s = engine->FlushCache();
    last = Clock::now();
    if (!s.ok() && point->errors++ == 0) point->first_error = "flush: " + s.ToString();
  }
  point->seconds = std::chrono::duration<double>(last - start).count();
}

// One named field of an output line; text fields come from fixed tables
// (engine, mix, key kind and sync names), so none needs quoting.
struct Field {
  const char* name;
  std::string value;
  bool text;
};

std::string Num(uint64_t v) { return std::to_string(v); }

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// The fields of a point, in output order. Scripts (bench_report.py) read
// them by name: add fields at the end, never rename.
std::vector<Field> PointFields(const BenchFlags& f, const GrowthPoint& p) {
  uint64_t ops = p.inserts + p.reads;
  double ops_per_sec = p.seconds > 0 ? static_cast<double>(ops) / p.seconds : 0;
  double micros = ops > 0 ? p.seconds * 1e6 / static_cast<double>(ops) : 0;
  const MixInfo& mix = InfoOf(f.mix);
  return {
      {"engine", f.engine, true},
      {"mode", "growth", true},
      {"mix", mix.name, true},
      {"read_percent", std::to_string(mix.read_percent), false},
      {"keys", KeyKindName(f.keys), true},
      {"key_dist", KeyDistName(f.key_dist), true},
      {"value_size", Num(f.value_size), false},
      {"threads", std::to_string(f.threads), false},
      {"sync", f.sync ? "always" : "none", true},
      {"num", Num(f.num), false},
      {"points", std::to_string(f.points), false},
      {"point", std::to_string(p.point), false},
      {"records", Num(p.records), false},
      {"ops", Num(ops), false},
      {"inserts", Num(p.inserts), false},
      {"reads", Num(p.reads), false},
      {"found", Num(p.found), false},
      {"errors", Num(p.errors), false},
      {"seconds", Fixed(p.seconds, 9), false},
      {"ops_per_sec", Fixed(ops_per_sec, 1), false},
      {"micros_per_op", Fixed(micros, 3), false},
      {"elapsed_seconds", Fixed(p.elapsed_seconds, 6), false},
      {"disk_bytes", Num(p.disk_bytes), false},
      {"rss_bytes", Num(p.rss_bytes), false},
      {"write_bytes", Num(p.write_bytes), false},
  };
}

void PrintPoint(const BenchFlags& f, const GrowthPoint& p) {
  std::vector<Field> fields = PointFields(f, p);
  if (f.json) {
    std::string line = "{";
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) line += ",";
      // Appended piecewise: g++ 12 warns (-Wrestrict, a false positive)
      // on "\"" + std::string temporaries.
      line += '"';
      line += fields[i].name;
      line += "\":";
      if (fields[i].text) line += '"';
      line += fields[i].value;
      if (fields[i].text) line += '"';
    }
    std::printf("%s}\n", line.c_str());
  } else if (f.csv) {
    if (p.point == 1) {
      for (size_t i = 0; i < fields.size(); ++i) {
        std::printf("%s%s", i > 0 ? "," : "", fields[i].name);
      }
      std::printf("\n");
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      std::printf("%s%s", i > 0 ? "," : "", fields[i].value.c_str());
    }
    std::printf("\n");
  } else {
    // growth readheavy  3/10:   300000 records  123456 ops/sec   8.100 micros/op  (...)
    uint64_t ops = p.inserts + p.reads;
    double ops_per_sec = p.seconds > 0 ? static_cast<double>(ops) / p.seconds : 0;
    std::printf("growth %-10s %3d/%d: %10" PRIu64 " records %8.0f ops/sec %8.3f micros/op"
                "  (%s, %u B%s, %d thr)\n",
                InfoOf(f.mix).name, p.point, f.points, p.records, ops_per_sec,
                ops > 0 ? p.seconds * 1e6 / static_cast<double>(ops) : 0.0, f.engine.c_str(),
                f.value_size, f.keys == KeyKind::kString ? ", str keys" : "", f.threads);
  }
  std::fflush(stdout);
}

// Runs every step on the open engine; returns the exit status.
int RunSteps(BenchEngine* engine, const BenchFlags& f) {
  KeyPermutation permutation(f.num, f.seed);
  ValueBuffer values(f.value_size, f.seed);
  StepPlan plan;
  plan.threads = f.threads;
  plan.read_percent = InfoOf(f.mix).read_percent;
  plan.permutation = &permutation;
  plan.space = KeySpaceFor(f);
  plan.values = &values;
  double elapsed = 0;
  int exit_code = kExitOk;
  for (int p = 1; p <= f.points; ++p) {
    plan.begin = GrowthRecords(f.num, f.points, p - 1);
    plan.end = GrowthRecords(f.num, f.points, p);
    plan.seed = SplitMix64(f.seed ^ (static_cast<uint64_t>(p) << 20));
    GrowthPoint point;
    point.point = p;
    point.records = plan.end;
    uint64_t io_before = ReadIoWriteBytes();
    RunStep(engine, f.keys, plan, &point);
    uint64_t io_after = ReadIoWriteBytes();
    point.write_bytes = io_after >= io_before ? io_after - io_before : 0;
    elapsed += point.seconds;
    point.elapsed_seconds = elapsed;
    point.disk_bytes = DiskBytes(f.dir);
    point.rss_bytes = ReadRssBytes();
    PrintPoint(f, point);
    if (point.errors > 0) {
      std::fprintf(stderr, "flatkv-bench: growth point %d: %" PRIu64 " errors; first: %s\n", p,
                   point.errors, point.first_error.c_str());
      exit_code = kExitFailure;
    }
  }
  return exit_code;
}

}  // namespace

bool ParseGrowthMix(std::string_view name, GrowthMix* mix) {
  for (const MixInfo& m : kMixes) {
    if (name == m.name) {
      *mix = m.mix;
      return true;
    }
  }
  return false;
}

const char* GrowthMixName(GrowthMix mix) { return InfoOf(mix).name; }

int GrowthReadPercent(GrowthMix mix) { return InfoOf(mix).read_percent; }

uint64_t GrowthRecords(uint64_t num, int points, int p) {
  // num <= 2^60 and points <= 100000 < 2^17: the product fits in 128 bits
  // but not always in 64, so split num into quotient and remainder.
  uint64_t n = static_cast<uint64_t>(points);
  uint64_t k = static_cast<uint64_t>(p);
  return num / n * k + num % n * k / n;
}

int RunGrowthBench(const BenchFlags& f) {
  std::unique_ptr<BenchEngine> engine;
  Status s = NewBenchEngine(f.engine, &engine);
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: %s\n", s.message().c_str());
    return kExitUsage;
  }
  bool dir_was_empty = false;
  s = PrepareDir(f.dir, f.fresh, &dir_was_empty);
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: %s\n", s.message().c_str());
    return s.IsInvalidArgument() ? kExitUsage : kExitFailure;
  }
  if (!dir_was_empty) {
    std::fprintf(stderr,
                 "flatkv-bench: growth starts from an empty store, and %s is not empty "
                 "(add --fresh to empty it first)\n",
                 f.dir.c_str());
    return kExitUsage;
  }
  s = engine->Open(EngineOptionsFor(f));
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: cannot open %s in %s: %s\n", engine->name(),
                 f.dir.c_str(), s.ToString().c_str());
    return kExitFailure;
  }
  int exit_code = RunSteps(engine.get(), f);
  s = engine->Close();
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: close: %s\n", s.ToString().c_str());
    exit_code = kExitFailure;
  }
  return exit_code;
}

}  // namespace flatkv::client
