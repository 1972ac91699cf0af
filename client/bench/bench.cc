// flatkv-bench: measures FlatKV's storage engine against the engines people
// would otherwise use (RocksDB, LevelDB, Kyoto Cabinet), in-process, with the
// same keys, values and threads for each; in growth mode
// (client/bench/bench_growth.h), as the store fills up; or, in server mode
// (client/bench/bench_server.h), a running flatkv-server over the network. See
// client/bench/README.md.
//
//   flatkv-bench engine --engine flat --workload fillrandom,readrandom
//       --num 1000000 --value-size 100 --threads 1 --dir /tmp/b --fresh --json
//   flatkv-bench growth --engine flat --mix readheavy --num 1000000
//       --points 20 --value-size 1024 --dir /tmp/g --fresh --json
//   flatkv-bench server --host 127.0.0.1 --port 9901 --clients 50
//       --workload fill,get --ops 100000 --value-size 100 --json
//
// Each workload prints one line (db_bench-like text, or one JSON object with
// --json) to stdout; notes and errors go to stderr so stdout stays parseable.
// That includes the engine's own log lines (spdlog's default logger writes to
// stdout), which main() sends to stderr before anything runs.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "client/bench/bench_engine.h"
#include "client/bench/bench_flags.h"
#include "client/bench/bench_server.h"
#include "client/bench/bench_sys.h"
#include "client/bench/bench_workload.h"

namespace flatkv::client {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// One output line's worth of numbers.
struct Report {
  const char* workload = "";
  uint64_t ops = 0;
  double seconds = 0;
  double ops_per_sec = 0;
  double micros_per_op = 0;
  double mb_per_sec = 0;
  uint64_t rss_bytes = 0;
  uint64_t write_bytes = 0;
  uint64_t disk_bytes = 0;
  uint64_t found = 0;
  double write_amp = 0;
  uint64_t errors = 0;
  // compact and readwhilecompacting only (see CompactionResult).
  CompactionResult compaction;
  uint64_t live_bytes = 0;
  double space_after_over_live = 0;
  double baseline_ops_per_sec = 0;
  double ratio = 0;                    // ops_per_sec / baseline_ops_per_sec
  double compaction_mb_per_sec = 0;    // log bytes read / compaction seconds
  // --cache only: the cache's counters over the workload, and for write
  // workloads the engine writes per put (1 in safe mode, flushes / puts in
  // async mode, where the workload ends with a flush).
  BenchCacheStats cache;
  double engine_writes_per_put = 0;
  // With --key-dist given: each put's latency, and (flat) the segments the
  // workload created and the writes that waited for the compactor.
  bool put_latency = false;
  uint64_t put_p50_ns = 0, put_p99_ns = 0, put_max_ns = 0;
  bool engine_counters = false;
  uint64_t segments_created = 0;
  uint64_t write_stalls = 0;
};

// b - a for counters that restart at 0 when the engine reopens (reopen, the
// compaction workloads' set-up): then the count since that open.
uint64_t CounterDelta(uint64_t before, uint64_t after) {
  return after >= before ? after - before : after;
}

BenchCacheStats CacheDelta(const BenchCacheStats& a, const BenchCacheStats& b) {
  BenchCacheStats d;
  d.hits = CounterDelta(a.hits, b.hits);
  d.misses = CounterDelta(a.misses, b.misses);
  d.flushes = CounterDelta(a.flushes, b.flushes);
  d.coalesced = CounterDelta(a.coalesced, b.coalesced);
  return d;
}

// Record overhead of flat's log: a 24-byte header and the 8-byte key.
constexpr uint64_t kFlatRecordOverhead = 32;
// A string key's entry in its bucket (engine/string_keys.h) besides the value:
// the kind byte, the key-size varint (1 byte for 16) and the key.
constexpr uint64_t kStringEntryOverhead = 1 + 1 + kStringKeyBytes;

uint64_t VarintBytes(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// What num live keys take in flat's log, approximately: one record per key,
// header and key included. A string key's record is its bucket, so it also
// carries the key's bucket entry; keys sharing a bucket share a header, which
// this does not count (it overestimates by up to 32 bytes a key).
uint64_t LiveBytes(const BenchFlags& f) {
  uint64_t per_key = kFlatRecordOverhead + f.value_size;
  if (f.keys == KeyKind::kString) per_key += kStringEntryOverhead + VarintBytes(f.value_size);
  return f.num * per_key;
}

Report MakeReport(const BenchFlags& f, Workload w, const WorkloadResult& r,
                  uint64_t write_bytes) {
  Report rep;
  rep.workload = WorkloadName(w);
  rep.ops = r.ops;
  rep.seconds = r.seconds;
  rep.found = r.found;
  rep.errors = r.errors;
  rep.write_bytes = write_bytes;
  // A zero interval (tiny --num on a coarse clock) reports 0, never inf:
  // JSON has no infinity and a reader would choke on it.
  if (r.seconds > 0) {
    rep.ops_per_sec = static_cast<double>(r.ops) / r.seconds;
    rep.micros_per_op = r.seconds * 1e6 / static_cast<double>(r.ops);
  }
  // Bytes of user data per op: the key (8 bytes, or 16 with --keys string)
  // plus the value. readwhilecompacting does at least num ops.
  uint64_t ops = w == Workload::kReadWhileCompacting ? r.ops : f.num;
  double user_bytes =
      static_cast<double>(ops) * static_cast<double>(KeyBytes(f.keys) + f.value_size);
  if (w != Workload::kReopen && r.seconds > 0) rep.mb_per_sec = user_bytes / r.seconds / 1e6;
  if (IsWriteWorkload(w) && user_bytes > 0) rep.write_amp = write_bytes / user_bytes;
  rep.rss_bytes = ReadRssBytes();
  rep.disk_bytes = DiskBytes(f.dir);
  if (r.put_latency.count() > 0) {
    rep.put_latency = true;
    rep.put_p50_ns = r.put_latency.Percentile(0.5);
    rep.put_p99_ns = r.put_latency.Percentile(0.99);
    rep.put_max_ns = r.put_latency.max();
  }
  if (IsCompactionWorkload(w)) {
    const CompactionResult& c = r.compaction;
    rep.compaction = c;
    rep.live_bytes = LiveBytes(f);
    if (c.seconds > 0) rep.compaction_mb_per_sec = c.log_bytes_read / c.seconds / 1e6;
    if (w == Workload::kCompact) {
      // compact times one call: its MB/s is the compaction's log read rate.
      rep.mb_per_sec = rep.compaction_mb_per_sec;
      if (rep.live_bytes > 0) {
        rep.space_after_over_live =
            static_cast<double>(c.space_after) / static_cast<double>(rep.live_bytes);
      }
    } else {
      if (c.baseline_seconds > 0) rep.baseline_ops_per_sec = c.baseline_ops / c.baseline_seconds;
      if (rep.baseline_ops_per_sec > 0) rep.ratio = rep.ops_per_sec / rep.baseline_ops_per_sec;
    }
  }
  return rep;
}

double Mb(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

// fillrandom   :   1.234 micros/op  810372 ops/sec  87.5 MB/s  (flat, 100 B, 1 thr)
// With --keys string: (flat, 100 B, str keys, 1 thr).
void PrintText(const BenchFlags& f, Workload w, const Report& rep) {
  std::string extra;
  if (w == Workload::kReadRandom || w == Workload::kReadMissing || w == Workload::kZipfRead) {
    extra += ", " + std::to_string(rep.found) + " of " + std::to_string(rep.ops) + " found";
  }
  if (rep.errors > 0) extra += ", " + std::to_string(rep.errors) + " errors";
  if (f.sync) extra += ", sync";
  if (CacheEnabled(f)) {
    char buf[160];
    uint64_t lookups = rep.cache.hits + rep.cache.misses;
    std::snprintf(buf, sizeof(buf), ", cache %s %s", f.cache.c_str(),
                  f.write_async ? "async" : "safe");
    extra += buf;
    if (lookups > 0) {
      std::snprintf(buf, sizeof(buf), ", %.1f%% hits", 100.0 * rep.cache.hits / lookups);
      extra += buf;
    }
    if (IsWriteWorkload(w)) {
      std::snprintf(buf, sizeof(buf), ", %.3f engine writes/put", rep.engine_writes_per_put);
      extra += buf;
    }
  }
  if (IsCompactionWorkload(w) && f.compaction_mb_per_sec > 0) {
    extra += ", limit " + std::to_string(f.compaction_mb_per_sec) + " MB/s";
  }
  if (f.key_dist_given) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), ", %s keys", KeyDistName(f.key_dist));
    extra += buf;
    if (rep.put_latency) {
      std::snprintf(buf, sizeof(buf), ", put p50 %.1f p99 %.1f max %.1f us",
                    rep.put_p50_ns / 1e3, rep.put_p99_ns / 1e3, rep.put_max_ns / 1e3);
      extra += buf;
    }
    if (rep.engine_counters) {
      std::snprintf(buf, sizeof(buf), ", %" PRIu64 " new segments, %" PRIu64 " stalls",
                    rep.segments_created, rep.write_stalls);
      extra += buf;
    }
  }
  const char* keys = f.keys == KeyKind::kString ? ", str keys" : "";
  const CompactionResult& c = rep.compaction;
  if (w == Workload::kCompact) {
    // compact      :   0.932 s   906.3 MB/s of log, data files 844.9 -> 211.3 MB (1.00x live)
    std::printf("%-12s : %7.3f s %7.1f MB/s of log, data files %.1f -> %.1f MB (%.2fx live)"
                "  (%s, %u B%s, %d thr%s)\n",
                rep.workload, rep.seconds, rep.mb_per_sec, Mb(c.space_before), Mb(c.space_after),
                rep.space_after_over_live, f.engine.c_str(), f.value_size, keys, f.threads,
                extra.c_str());
    return;
  }
  std::printf("%-12s : %7.3f micros/op %7.0f ops/sec %5.1f MB/s", rep.workload,
              rep.micros_per_op, rep.ops_per_sec, rep.mb_per_sec);
  if (w == Workload::kReadWhileCompacting) {
    std::printf(", %.2fx of %.0f ops/sec without; compaction %.3f s, %.1f MB/s of log",
                rep.ratio, rep.baseline_ops_per_sec, c.seconds, rep.compaction_mb_per_sec);
  }
  std::printf("  (%s, %u B%s, %d thr%s)\n", f.engine.c_str(), f.value_size, keys, f.threads,
              extra.c_str());
}

// The fields compact and readwhilecompacting add to their JSON object,
// without the closing brace.
void PrintCompactionJson(const BenchFlags& f, Workload w, const Report& rep) {
  const CompactionResult& c = rep.compaction;
  std::printf(",\"compaction_seconds\":%.9f,\"compaction_bytes_read\":%" PRIu64
              ",\"compaction_mb_per_sec\":%.3f,\"compaction_mb_per_sec_limit\":%u"
              ",\"tables_compacted\":%" PRIu64,
              c.seconds, c.log_bytes_read, rep.compaction_mb_per_sec, f.compaction_mb_per_sec,
              c.tables_compacted);
  if (w == Workload::kCompact) {
    std::printf(",\"space_before\":%" PRIu64 ",\"space_after\":%" PRIu64
                ",\"log_bytes_before\":%" PRIu64 ",\"log_bytes_after\":%" PRIu64
                ",\"live_bytes\":%" PRIu64 ",\"space_after_over_live\":%.4f",
                c.space_before, c.space_after, c.log_bytes_before, c.log_bytes_after,
                rep.live_bytes, rep.space_after_over_live);
  } else {
    std::printf(",\"ops\":%" PRIu64 ",\"baseline_ops_per_sec\":%.1f,\"ratio\":%.4f", rep.ops,
                rep.baseline_ops_per_sec, rep.ratio);
  }
}

// Field names are the contract in shared/DESIGN.md ("Tools"); scripts parse
// them, so add fields, never rename ("keys" came last, hence at the end; the
// compaction workloads' own fields follow it). Every string printed comes
// from a fixed table (engine, workload and key kind names), so none needs
// escaping.
void PrintJson(const BenchFlags& f, Workload w, const Report& rep) {
  std::printf(
      "{\"engine\":\"%s\",\"workload\":\"%s\",\"num\":%" PRIu64 ",\"value_size\":%u,"
      "\"threads\":%d,\"sync\":\"%s\",\"seconds\":%.9f,\"ops_per_sec\":%.1f,"
      "\"micros_per_op\":%.3f,\"mb_per_sec\":%.3f,\"rss_bytes\":%" PRIu64
      ",\"write_bytes\":%" PRIu64 ",\"disk_bytes\":%" PRIu64 ",\"found\":%" PRIu64
      ",\"write_amp\":%.4f,\"errors\":%" PRIu64 ",\"keys\":\"%s\"",
      f.engine.c_str(), rep.workload, f.num, f.value_size, f.threads,
      f.sync ? "always" : "none", rep.seconds, rep.ops_per_sec, rep.micros_per_op,
      rep.mb_per_sec, rep.rss_bytes, rep.write_bytes, rep.disk_bytes, rep.found,
      rep.write_amp, rep.errors, KeyKindName(f.keys));
  if (IsCompactionWorkload(w)) PrintCompactionJson(f, w, rep);
  if (f.key_dist_given) {
    std::printf(",\"key_dist\":\"%s\"", KeyDistName(f.key_dist));
    if (rep.put_latency) {
      std::printf(",\"put_p50_us\":%.3f,\"put_p99_us\":%.3f,\"put_max_us\":%.3f",
                  rep.put_p50_ns / 1e3, rep.put_p99_ns / 1e3, rep.put_max_ns / 1e3);
    }
    if (rep.engine_counters) {
      std::printf(",\"segments_created\":%" PRIu64 ",\"write_stalls\":%" PRIu64,
                  rep.segments_created, rep.write_stalls);
    }
  }
  if (CacheEnabled(f)) {
    std::printf(",\"cache\":\"%s\",\"write_mode\":\"%s\",\"cache_hits\":%" PRIu64
                ",\"cache_misses\":%" PRIu64 ",\"cache_flushes\":%" PRIu64
                ",\"cache_coalesced\":%" PRIu64 ",\"engine_writes_per_put\":%.4f",
                f.cache.c_str(), f.write_async ? "async" : "safe", rep.cache.hits,
                rep.cache.misses, rep.cache.flushes, rep.cache.coalesced,
                rep.engine_writes_per_put);
  }
  std::printf("}\n");
}

WorkloadConfig MakeConfig(const BenchFlags& f, const BenchEngineOptions& open_options,
                          const ValueBuffer* values, int position) {
  WorkloadConfig c;
  c.num = f.num;
  c.threads = f.threads;
  c.seed = f.seed;
  c.position = position;
  c.keys = f.keys;
  c.space = KeySpaceFor(f);
  c.time_puts = f.key_dist_given;
  c.values = values;
  c.open_options = open_options;
  return c;
}

// Fills an empty database with an untimed fillrandom so that a list starting
// with readrandom (say) measures reads of real data, not of nothing.
bool PreFill(BenchEngine* engine, const BenchFlags& f, Workload first,
             const WorkloadConfig& config) {
  std::fprintf(stderr,
               "flatkv-bench: note: %s is empty; filling it with fillrandom of %" PRIu64
               " keys (untimed) before %s\n",
               f.dir.c_str(), f.num, WorkloadName(first));
  WorkloadResult r;
  Status s = RunWorkload(engine, Workload::kFillRandom, config, &r);
  if (s.ok() && r.errors == 0) return true;
  std::fprintf(stderr, "flatkv-bench: pre-fill failed: %s\n",
               s.ok() ? r.first_error.c_str() : s.ToString().c_str());
  return false;
}

// --sparse-first: puts f.sparse_first keys uniform over [key_min, key_max)
// (a distinct seed from the workloads'), then notes on stderr how fast they
// went and what the engine did meanwhile. false if a put failed.
bool SparseFirst(BenchEngine* engine, const BenchFlags& f, const BenchEngineOptions& open_options,
                 const ValueBuffer* values) {
  WorkloadConfig c = MakeConfig(f, open_options, values, -2);
  c.num = f.sparse_first;
  c.threads = 1;
  c.space.dist = KeyDist::kRandom;
  c.space.seed = SplitMix64(c.space.seed ^ 0x737061727365ULL);  // "sparse"
  c.time_puts = true;
  BenchEngineCounters before, after;
  const bool counted = engine->GetEngineCounters(&before);
  WorkloadResult r;
  Status s = RunWorkload(engine, Workload::kFillRandom, c, &r);
  if (counted) engine->GetEngineCounters(&after);
  std::fprintf(stderr,
               "flatkv-bench: sparse-first: %" PRIu64 " random keys in %.3f s (%.0f puts/s), put "
               "p99 %.1f us",
               c.num, r.seconds, r.seconds > 0 ? static_cast<double>(c.num) / r.seconds : 0.0,
               r.put_latency.Percentile(0.99) / 1e3);
  if (counted) {
    std::fprintf(stderr, ", %" PRIu64 " new segments, %" PRIu64 " stalls",
                 CounterDelta(before.segments, after.segments),
                 CounterDelta(before.write_stalls, after.write_stalls));
  }
  std::fprintf(stderr, "\n");
  if (s.ok() && r.errors == 0) return true;
  std::fprintf(stderr, "flatkv-bench: sparse-first failed: %s\n",
               s.ok() ? r.first_error.c_str() : s.ToString().c_str());
  return false;
}

// Runs the workload list on one open database and returns the exit code.
// Sets *open to false if a failed reopen left the database closed.
int RunWorkloads(BenchEngine* engine, const BenchFlags& f,
                 const BenchEngineOptions& open_options, bool dir_was_empty, bool* open) {
  ValueBuffer values(f.value_size, f.seed);
  // Workloads this engine cannot run are skipped with a note (exit status
  // unaffected); the pre-fill looks at the first one that runs.
  auto supported = [engine](Workload w) {
    return !IsCompactionWorkload(w) || engine->SupportsCompaction();
  };
  const Workload* first = nullptr;
  for (const Workload& w : f.workloads) {
    if (supported(w)) {
      first = &w;
      break;
    }
  }
  if (f.sparse_first > 0 && !SparseFirst(engine, f, open_options, &values)) return kExitFailure;
  // The pre-fill uses position -1 so its permutation differs from a later
  // fillrandom's, as two separate runs would.
  if (dir_was_empty && first != nullptr && NeedsData(*first) &&
      !PreFill(engine, f, *first, MakeConfig(f, open_options, &values, -1))) {
    return kExitFailure;
  }
  bool io_ok = false;
  ReadIoWriteBytes(&io_ok);
  if (!io_ok) std::fprintf(stderr, "flatkv-bench: note: /proc/self/io unreadable; write_bytes is 0\n");
  int exit_code = kExitOk;
  for (size_t i = 0; i < f.workloads.size(); ++i) {
    Workload w = f.workloads[i];
    if (!supported(w)) {
      std::fprintf(stderr, "flatkv-bench: note: %s is not supported for %s; skipped\n",
                   WorkloadName(w), engine->name());
      continue;
    }
    WorkloadResult r;
    BenchCacheStats cache_before, cache_after;
    engine->GetCacheStats(&cache_before);
    BenchEngineCounters counters_before, counters_after;
    const bool counted = engine->GetEngineCounters(&counters_before);
    uint64_t before = ReadIoWriteBytes();
    Status s = RunWorkload(engine, w, MakeConfig(f, open_options, &values, static_cast<int>(i)), &r);
    uint64_t after = ReadIoWriteBytes();
    engine->GetCacheStats(&cache_after);
    if (counted && s.ok()) engine->GetEngineCounters(&counters_after);
    if (!s.ok()) {
      // Only a failed reopen gets here; the database is closed now.
      *open = false;
      std::fprintf(stderr, "flatkv-bench: %s: %s\n", WorkloadName(w), s.ToString().c_str());
      return kExitFailure;
    }
    // The compaction workloads count only their timed part, not the
    // set-up's overwrites.
    uint64_t write_bytes = IsCompactionWorkload(w) ? r.compaction.write_bytes
                           : after >= before      ? after - before
                                                  : 0;
    Report rep = MakeReport(f, w, r, write_bytes);
    if (counted) {
      rep.engine_counters = true;
      rep.segments_created = CounterDelta(counters_before.segments, counters_after.segments);
      rep.write_stalls = CounterDelta(counters_before.write_stalls, counters_after.write_stalls);
    }
    if (CacheEnabled(f)) {
      rep.cache = CacheDelta(cache_before, cache_after);
      // Safe mode writes through: each put is one engine write. Async mode
      // writes what the flushers wrote, all of it by the end of the
      // workload's timed flush.
      if (IsWriteWorkload(w) && f.num > 0) {
        rep.engine_writes_per_put =
            f.write_async ? static_cast<double>(rep.cache.flushes) / static_cast<double>(f.num)
                          : 1.0;
      }
    }
    if (f.json) {
      PrintJson(f, w, rep);
    } else {
      PrintText(f, w, rep);
    }
    std::fflush(stdout);
    if (r.errors > 0) {
      std::fprintf(stderr, "flatkv-bench: %s: %" PRIu64 " errors; first: %s\n",
                   WorkloadName(w), r.errors, r.first_error.c_str());
      exit_code = kExitFailure;
    }
  }
  return exit_code;
}

int RunEngineBench(const BenchFlags& f) {
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
  BenchEngineOptions options = EngineOptionsFor(f);
  s = engine->Open(options);
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: cannot open %s in %s: %s\n", engine->name(),
                 f.dir.c_str(), s.ToString().c_str());
    return kExitFailure;
  }
  bool open = true;
  int exit_code = RunWorkloads(engine.get(), f, options, dir_was_empty, &open);
  if (open) {
    s = engine->Close();
    if (!s.ok()) {
      std::fprintf(stderr, "flatkv-bench: close: %s\n", s.ToString().c_str());
      exit_code = kExitFailure;
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace flatkv::client

int main(int argc, char** argv) {
  // The engine logs through spdlog's default logger (compactions, recovery);
  // on stdout those lines would break --json.
  spdlog::set_default_logger(spdlog::stderr_color_mt("flatkv-bench"));
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows each compaction's phases
  using flatkv::client::BenchFlags;
  BenchFlags flags;
  flatkv::Status s = flatkv::client::ParseBenchFlags(argc, argv, &flags);
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: %s\n(run 'flatkv-bench --help' for usage)\n",
                 s.message().c_str());
    return 2;
  }
  if (flags.help) {
    flatkv::client::PrintBenchUsage(stdout);
    return 0;
  }
  if (flags.mode == flatkv::client::BenchMode::kServer) {
    return flatkv::client::RunServerBench(flags.server);
  }
  if (flags.mode == flatkv::client::BenchMode::kGrowth) {
    return flatkv::client::RunGrowthBench(flags);
  }
  return flatkv::client::RunEngineBench(flags);
}
