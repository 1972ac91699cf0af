#include "client/bench/bench_flags.h"

#include <charconv>
#include <limits>
#include <string_view>

namespace flatkv::client {
namespace {

constexpr uint64_t kMaxValueSize = uint64_t{64} << 20;  // the engine's max_value_bytes
constexpr uint64_t kMaxThreads = 1024;
// Keys go up to 2*num (readmissing); keep that well inside int64.
constexpr uint64_t kMaxNum = uint64_t{1} << 60;
// Fewest string slots the bench picks by itself (--string-slots may go lower).
constexpr uint64_t kMinAutoStringSlots = 1024;
// Highest --compaction-mb-per-sec: 1 TB/s, unlimited in practice.
constexpr uint64_t kMaxCompactionMbPerSec = 1000000;
// Highest --flush-interval-ms: one hour.
constexpr uint64_t kMaxFlushIntervalMs = 3600000;
// Most --points of a growth run.
constexpr uint64_t kMaxPoints = 100000;
// Server mode: connections, keys per call, and a key space whose
// written-keys bitmap stays under 2 GiB.
constexpr uint64_t kMaxClients = 10000;
constexpr uint64_t kMaxBatch = 100000;
constexpr uint64_t kMaxServerNum = uint64_t{1} << 34;
constexpr uint64_t kMaxTimeoutMs = 3600000;

// Parses a whole decimal 64-bit integer (a sign allowed); anything else is
// an error naming the flag.
Status ParseI64(std::string_view flag, std::string_view text, int64_t* out) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return Status::InvalidArgument("--" + std::string(flag) + ": '" + std::string(text) +
                                   "' is not a 64-bit integer");
  }
  *out = v;
  return Status::OK();
}

// Parses a whole decimal string into [lo, hi]; anything else (sign, suffix,
// empty, overflow) is an error naming the flag.
Status ParseUint(std::string_view flag, std::string_view text, uint64_t lo, uint64_t hi,
                 uint64_t* out) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return Status::InvalidArgument("--" + std::string(flag) + ": '" + std::string(text) +
                                   "' is not a number");
  }
  if (v < lo || v > hi) {
    return Status::InvalidArgument("--" + std::string(flag) + ": " + std::string(text) +
                                   " is out of range [" + std::to_string(lo) + ", " +
                                   std::to_string(hi) + "]");
  }
  *out = v;
  return Status::OK();
}

Status ParseWorkloadList(std::string_view text, std::vector<Workload>* out) {
  out->clear();
  while (true) {
    size_t comma = text.find(',');
    std::string_view name = text.substr(0, comma);
    Workload w;
    if (!ParseWorkload(name, &w)) {
      return Status::InvalidArgument("--workload: unknown workload '" + std::string(name) +
                                     "' (expected " + WorkloadNameList() + ")");
    }
    out->push_back(w);
    if (comma == std::string_view::npos) return Status::OK();
    text.remove_prefix(comma + 1);
  }
}

// Applies one "--name value" pair.
Status ApplyFlag(std::string_view name, std::string_view value, BenchFlags* f) {
  uint64_t n = 0;
  if (name == "engine") {
    f->engine = value;
  } else if (name == "workload") {
    return ParseWorkloadList(value, &f->workloads);
  } else if (name == "dir") {
    f->dir = value;
  } else if (name == "num") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxNum, &f->num));
  } else if (name == "value-size") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 0, kMaxValueSize, &n));
    f->value_size = static_cast<uint32_t>(n);
  } else if (name == "threads") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxThreads, &n));
    f->threads = static_cast<int>(n);
  } else if (name == "sync") {
    if (value != "none" && value != "always") {
      return Status::InvalidArgument("--sync: expected none|always, got '" +
                                     std::string(value) + "'");
    }
    f->sync = value == "always";
  } else if (name == "seed") {
    FLATKV_RETURN_IF_ERROR(
        ParseUint(name, value, 0, std::numeric_limits<uint64_t>::max(), &f->seed));
  } else if (name == "index-item-bytes") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 4, 8, &n));
    f->index_item_bytes = static_cast<int>(n);
  } else if (name == "data-files") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, 4096, &n));
    f->data_files = static_cast<int>(n);
  } else if (name == "keys") {
    if (!ParseKeyKind(value, &f->keys)) {
      return Status::InvalidArgument("--keys: expected int|string, got '" + std::string(value) +
                                     "'");
    }
  } else if (name == "key-dist") {
    if (!ParseKeyDist(value, &f->key_dist)) {
      return Status::InvalidArgument("--key-dist: expected dense|random|snowflake, got '" +
                                     std::string(value) + "'");
    }
    f->key_dist_given = true;
  } else if (name == "key-min" || name == "key-max") {
    FLATKV_RETURN_IF_ERROR(ParseI64(name, value, name == "key-min" ? &f->key_min : &f->key_max));
  } else if (name == "sparse-first") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxNum, &f->sparse_first));
  } else if (name == "snowflake-rate") {
    // Up to 2^22 IDs a millisecond: the sequence's 22 bits.
    FLATKV_RETURN_IF_ERROR(
        ParseUint(name, value, 1, (uint64_t{1} << 22) * 1000, &f->snowflake_rate));
  } else if (name == "string-slots") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxNum, &f->string_slots));
  } else if (name == "compaction-mb-per-sec") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 0, kMaxCompactionMbPerSec, &n));
    f->compaction_mb_per_sec = static_cast<uint32_t>(n);
  } else if (name == "compaction-disk-ratio") {
    // A decimal; the engine checks the range (0, or 1.1 to 1000) at open.
    double r = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), r);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size() || r < 0) {
      return Status::InvalidArgument("--compaction-disk-ratio: '" + std::string(value) +
                                     "' is not a ratio");
    }
    f->compaction_disk_ratio = r;
  } else if (name == "compaction-mode") {
    if (value != "whole" && value != "in_place") {
      return Status::InvalidArgument("--compaction-mode: expected whole|in_place, got '" +
                                     std::string(value) + "'");
    }
    f->compaction_in_place = value == "in_place";
    f->compaction_mode_given = true;
  } else if (name == "sparse-tier") {
    if (value != "on" && value != "off") {
      return Status::InvalidArgument("--sparse-tier: expected on|off, got '" + std::string(value) +
                                     "'");
    }
    f->sparse_tier = value == "on";
    f->sparse_tier_given = true;
  } else if (name == "cache") {
    if (value != "lru" && value != "arc" && value != "none") {
      return Status::InvalidArgument("--cache: expected lru|arc|none, got '" +
                                     std::string(value) + "'");
    }
    f->cache = value;
    f->cache_flags_given = true;
  } else if (name == "cache-bytes") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxNum, &f->cache_bytes));
    f->cache_flags_given = true;
  } else if (name == "write-mode") {
    if (value != "safe" && value != "async") {
      return Status::InvalidArgument("--write-mode: expected safe|async, got '" +
                                     std::string(value) + "'");
    }
    f->write_async = value == "async";
    f->cache_flags_given = true;
  } else if (name == "mix") {
    if (!ParseGrowthMix(value, &f->mix)) {
      return Status::InvalidArgument("--mix: expected writeonly|readheavy|writeheavy, got '" +
                                     std::string(value) + "'");
    }
    f->growth_flags_given = true;
  } else if (name == "points") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxPoints, &n));
    f->points = static_cast<int>(n);
    f->growth_flags_given = true;
  } else if (name == "flush-interval-ms") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxFlushIntervalMs, &n));
    f->flush_interval_ms = static_cast<uint32_t>(n);
    f->cache_flags_given = true;
  } else {
    return Status::InvalidArgument("unknown flag --" + std::string(name));
  }
  return Status::OK();
}

Status ParseServerWorkloadList(std::string_view text, std::vector<ServerWorkload>* out) {
  out->clear();
  while (true) {
    size_t comma = text.find(',');
    std::string_view name = text.substr(0, comma);
    ServerWorkload w;
    if (!ParseServerWorkload(name, &w)) {
      return Status::InvalidArgument("--workload: unknown workload '" + std::string(name) +
                                     "' (expected " + ServerWorkloadNameList() + ")");
    }
    out->push_back(w);
    if (comma == std::string_view::npos) return Status::OK();
    text.remove_prefix(comma + 1);
  }
}

// Applies one "--name value" pair of `flatkv-bench server`.
Status ApplyServerFlag(std::string_view name, std::string_view value, ServerBenchFlags* f) {
  uint64_t n = 0;
  if (name == "host") {
    if (value.empty()) return Status::InvalidArgument("--host is empty");
    f->host = value;
  } else if (name == "port") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, 65535, &n));
    f->port = static_cast<int>(n);
  } else if (name == "zk") {
    if (value.empty()) return Status::InvalidArgument("--zk is empty");
    f->zk = value;
  } else if (name == "path") {
    if (value.empty() || value[0] != '/') {
      return Status::InvalidArgument("--path must start with '/', got '" + std::string(value) +
                                     "'");
    }
    f->zk_path = value;
  } else if (name == "clients") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxClients, &n));
    f->clients = static_cast<int>(n);
  } else if (name == "threads") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxThreads, &n));
    f->threads = static_cast<int>(n);
  } else if (name == "ops") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxNum, &f->ops));
  } else if (name == "num") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxServerNum, &f->num));
  } else if (name == "value-size") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 0, kMaxValueSize, &n));
    f->value_size = static_cast<uint32_t>(n);
  } else if (name == "batch") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxBatch, &n));
    f->batch = static_cast<uint32_t>(n);
  } else if (name == "keys") {
    if (!ParseKeyDistribution(value, &f->keys)) {
      return Status::InvalidArgument("--keys: expected uniform|zipf, got '" + std::string(value) +
                                     "'");
    }
  } else if (name == "workload") {
    return ParseServerWorkloadList(value, &f->workloads);
  } else if (name == "seed") {
    FLATKV_RETURN_IF_ERROR(
        ParseUint(name, value, 0, std::numeric_limits<uint64_t>::max(), &f->seed));
  } else if (name == "timeout-ms") {
    FLATKV_RETURN_IF_ERROR(ParseUint(name, value, 1, kMaxTimeoutMs, &n));
    f->timeout_ms = static_cast<int>(n);
  } else if (name == "tls-ca") {
    f->tls_ca = value;
  } else if (name == "tls-cert") {
    f->tls_cert = value;
  } else if (name == "tls-key") {
    f->tls_key = value;
  } else if (name == "key-dist") {
    if (!ParseKeyDist(value, &f->space.dist)) {
      return Status::InvalidArgument("--key-dist: expected dense|random|snowflake, got '" +
                                     std::string(value) + "'");
    }
  } else if (name == "key-min" || name == "key-max") {
    FLATKV_RETURN_IF_ERROR(
        ParseI64(name, value, name == "key-min" ? &f->space.key_min : &f->space.key_max));
  } else if (name == "snowflake-rate") {
    FLATKV_RETURN_IF_ERROR(
        ParseUint(name, value, 1, (uint64_t{1} << 22) * 1000, &f->space.snowflake_rate));
  } else {
    return Status::InvalidArgument("unknown flag --" + std::string(name) + " for 'server'");
  }
  return Status::OK();
}

Status ValidateServer(const ServerBenchFlags& f) {
  if (f.space.key_min >= f.space.key_max) {
    return Status::InvalidArgument("--key-min must be below --key-max");
  }
  if (f.space.dist == KeyDist::kSnowflake &&
      f.space.Key(2 * ServerKeySpace(f) - 1) < f.space.Key(0)) {
    return Status::InvalidArgument("--key-dist snowflake: the keys of --num overflow 64 bits");
  }
  if (f.threads > f.clients) {
    return Status::InvalidArgument("--threads " + std::to_string(f.threads) + " exceeds --clients " +
                                   std::to_string(f.clients) +
                                   " (each thread needs a connection)");
  }
  // The written-keys bitmap takes num / 8 bytes, and the keys must be
  // valid i64s.
  if (ServerKeySpace(f) > kMaxServerNum) {
    return Status::InvalidArgument("--num (by default --ops) is over " +
                                   std::to_string(kMaxServerNum));
  }
  return Status::OK();
}

bool IsBoolFlag(std::string_view name) {
  return name == "json" || name == "fresh" || name == "csv";
}

// Cross-flag checks once everything is parsed.
Status Validate(const BenchFlags& f) {
  if (f.engine.empty()) return Status::InvalidArgument("--engine is required");
  if (f.dir.empty()) return Status::InvalidArgument("--dir is required");
  if (f.engine != "flat" &&
      (f.index_item_bytes != 0 || f.data_files != 0 || f.compaction_mb_per_sec != 0 ||
       f.compaction_disk_ratio >= 0 || f.compaction_mode_given || f.sparse_tier_given)) {
    return Status::InvalidArgument(
        "--index-item-bytes, --data-files, --compaction-mb-per-sec, "
        "--compaction-disk-ratio, --compaction-mode and --sparse-tier apply only to --engine flat");
  }
  if (f.engine != "flat" && f.cache_flags_given) {
    return Status::InvalidArgument(
        "--cache, --cache-bytes, --write-mode and --flush-interval-ms apply only to "
        "--engine flat");
  }
  if (f.cache == "none" && (f.write_async || f.cache_bytes != (uint64_t{64} << 20) ||
                            f.flush_interval_ms != 100)) {
    return Status::InvalidArgument(
        "--cache-bytes, --write-mode async and --flush-interval-ms need --cache lru|arc");
  }
  if (f.key_dist != KeyDist::kDense && f.keys != KeyKind::kInt) {
    return Status::InvalidArgument("--key-dist random|snowflake applies only to --keys int");
  }
  if (f.mode == BenchMode::kGrowth && f.sparse_first > 0) {
    return Status::InvalidArgument("--sparse-first applies only to 'engine'");
  }
  if (f.sparse_first > 0 && f.keys != KeyKind::kInt) {
    return Status::InvalidArgument("--sparse-first applies only to --keys int");
  }
  if (f.key_min >= f.key_max) {
    return Status::InvalidArgument("--key-min must be below --key-max");
  }
  {
    // Every key a run may touch (readmissing goes up to index 2*num - 1)
    // must be one the store accepts.
    const KeySpace space = KeySpaceFor(f);
    for (uint64_t i : {uint64_t{0}, 2 * f.num - 1}) {
      const int64_t k = space.Key(i);
      if (k < f.key_min || k >= f.key_max) {
        return Status::InvalidArgument(std::string("--key-dist ") + KeyDistName(f.key_dist) +
                                       ": key " + std::to_string(k) + " of index " +
                                       std::to_string(i) + " lies outside [--key-min, --key-max)");
      }
    }
  }
  if (f.string_slots != 0 && (f.engine != "flat" || f.keys != KeyKind::kString)) {
    return Status::InvalidArgument("--string-slots applies only to --engine flat --keys string");
  }
  if (f.mode == BenchMode::kGrowth) {
    if (f.json && f.csv) return Status::InvalidArgument("--json and --csv exclude each other");
    if (static_cast<uint64_t>(f.points) > f.num) {
      return Status::InvalidArgument("--points " + std::to_string(f.points) + " exceeds --num " +
                                     std::to_string(f.num) + " (each point adds records)");
    }
  } else if (f.growth_flags_given) {
    return Status::InvalidArgument("--mix, --points and --csv apply only to 'growth'");
  }
  return Status::OK();
}

// Walks argv[2..] as "--name value", "--name=value", or "--name" alone for
// the names is_bool accepts, calling on_bool(name) or on_value(name, value),
// which returns a Status, for each in order.
template <class IsBool, class OnBool, class OnValue>
Status ForEachFlag(int argc, char** argv, IsBool is_bool, OnBool on_bool, OnValue on_value) {
  for (int i = 2; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      return Status::InvalidArgument("unexpected argument '" + std::string(arg) + "'");
    }
    arg.remove_prefix(2);
    size_t eq = arg.find('=');
    std::string_view name = arg.substr(0, eq);
    if (is_bool(name)) {
      if (eq != std::string_view::npos) {
        return Status::InvalidArgument("--" + std::string(name) + " takes no value");
      }
      on_bool(name);
      continue;
    }
    std::string_view value;
    if (eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Status::InvalidArgument("--" + std::string(name) + " needs a value");
    }
    FLATKV_RETURN_IF_ERROR(on_value(name, value));
  }
  return Status::OK();
}

}  // namespace

BenchEngineOptions EngineOptionsFor(const BenchFlags& f) {
  BenchEngineOptions options;
  options.dir = f.dir;
  options.sync = f.sync;
  options.num = f.num;
  options.value_size = f.value_size;
  options.index_item_bytes = f.index_item_bytes;
  options.data_files = f.data_files;
  options.string_slots = StringSlotsFor(f);
  options.compaction_mb_per_sec = f.compaction_mb_per_sec;
  options.compaction_disk_ratio = f.compaction_disk_ratio;
  options.compaction_in_place = f.compaction_in_place;
  options.sparse_tier = f.sparse_tier;
  options.key_min = f.key_min;
  options.key_max = f.key_max;
  if (CacheEnabled(f)) {
    options.cache_policy = f.cache;
    options.cache_bytes = f.cache_bytes;
    options.write_async = f.write_async;
    options.flush_interval_ms = f.flush_interval_ms;
  }
  for (Workload w : f.workloads) {
    if (f.mode == BenchMode::kEngine && IsCompactionWorkload(w)) options.auto_compaction = false;
  }
  return options;
}

KeySpace KeySpaceFor(const BenchFlags& flags) {
  KeySpace space;
  space.dist = flags.key_dist;
  space.key_min = flags.key_min;
  space.key_max = flags.key_max;
  space.snowflake_rate = flags.snowflake_rate;
  space.seed = SplitMix64(flags.seed ^ 0x6b65792d64697374ULL);  // "key-dist"
  return space;
}

uint64_t StringSlotsFor(const BenchFlags& flags) {
  if (flags.keys != KeyKind::kString) return 0;
  if (flags.string_slots != 0) return flags.string_slots;
  uint64_t slots = kMinAutoStringSlots;
  while (slots < flags.num) slots <<= 1;  // num <= 2^60: no overflow
  return slots;
}

Status ParseBenchFlags(int argc, char** argv, BenchFlags* flags) {
  *flags = BenchFlags();
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h" || (i == 1 && a == "help")) {
      flags->help = true;
      return Status::OK();
    }
  }
  if (argc < 2) {
    return Status::InvalidArgument("missing command (expected 'engine', 'growth' or 'server')");
  }
  std::string_view command = argv[1];
  if (command == "server") {
    flags->mode = BenchMode::kServer;
    ServerBenchFlags& f = flags->server;
    // Without an explicit list, prepare the keys and read them.
    FLATKV_RETURN_IF_ERROR(ParseServerWorkloadList("fill,get", &f.workloads));
    FLATKV_RETURN_IF_ERROR(ForEachFlag(
        argc, argv, [](std::string_view name) { return name == "json"; },
        [&](std::string_view) { f.json = true; },
        [&](std::string_view name, std::string_view value) {
          return ApplyServerFlag(name, value, &f);
        }));
    return ValidateServer(f);
  }
  if (command != "engine" && command != "growth") {
    return Status::InvalidArgument("unknown command '" + std::string(command) +
                                   "' (expected 'engine', 'growth' or 'server')");
  }
  if (command == "growth") flags->mode = BenchMode::kGrowth;
  // Without an explicit list, run what db_bench users reach for first.
  if (flags->mode == BenchMode::kEngine) {
    FLATKV_RETURN_IF_ERROR(ParseWorkloadList("fillrandom,readrandom", &flags->workloads));
  }
  FLATKV_RETURN_IF_ERROR(ForEachFlag(
      argc, argv, IsBoolFlag,
      [&](std::string_view name) {
        if (name == "csv") flags->growth_flags_given = true;
        (name == "json" ? flags->json : name == "csv" ? flags->csv : flags->fresh) = true;
      },
      [&](std::string_view name, std::string_view value) {
        // A growth run's ops follow from --mix and --num, not a list.
        if (name == "workload" && flags->mode == BenchMode::kGrowth) {
          return Status::InvalidArgument("--workload does not apply to 'growth' (use --mix)");
        }
        return ApplyFlag(name, value, flags);
      }));
  return Validate(*flags);
}

void PrintBenchUsage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: flatkv-bench engine --engine ENGINE --dir DIR [options]\n"
      "       flatkv-bench growth --engine ENGINE --dir DIR [--mix M] [options]   (below)\n"
      "       flatkv-bench server [--host H] [--port P] [options]   (below)\n"
      "\n"
      "Runs storage-engine workloads in-process and prints one line per workload.\n"
      "\n"
      "  --engine E          flat|rocksdb|leveldb|kyotocabinet (required)\n"
      "  --dir D             database directory, created if missing (required);\n"
      "                      existing data is reused, never deleted without --fresh\n"
      "  --workload W[,W..]  run in order on one open database (default\n"
      "                      fillrandom,readrandom); each of\n"
      "                      %s\n"
      "  --num N             keys in [0, N) and ops per workload (default 1000000)\n"
      "  --value-size B      value bytes (default 100)\n"
      "  --threads T         client threads (default 1)\n"
      "  --sync none|always  sync each write before it returns (default none)\n"
      "  --fresh             remove everything inside --dir first\n"
      "  --json              one JSON object per line instead of text\n"
      "  --seed S            seed for keys and values (default 301)\n"
      "  --key-dist D        dense|random|snowflake: integer key index i is sent as\n"
      "                      i (dense, the default), a uniform key in\n"
      "                      [--key-min, --key-max) (random), or the Twitter\n"
      "                      ID (ms << 22) | seq issued at --snowflake-rate IDs\n"
      "                      a second (snowflake); given, each line also shows\n"
      "                      put latency p50/p99/max and (flat) the segments\n"
      "                      created and the writes that stalled\n"
      "  --key-min K, --key-max K\n"
      "                      random's range, and flat's storage.key_min/key_max\n"
      "                      (default 0 and 2^63-1)\n"
      "  --snowflake-rate R  snowflake IDs a second (default 10000)\n"
      "  --sparse-first N    int keys: first put N keys uniform over [--key-min,\n"
      "                      --key-max) in the same process (untimed; rate,\n"
      "                      new segments and stalls on stderr)\n"
      "  --keys int|string   int: the key index as an integer (default); string:\n"
      "                      16 random bytes per index (flat: SPut/SGet/SRemove)\n"
      "  --index-item-bytes  flat only: index slot width 4..8\n"
      "  --data-files N      flat only: data files per table\n"
      "  --string-slots N    flat with --keys string: slots of the string-key table\n"
      "                      (default: the power of two >= num, at least 1024);\n"
      "                      num/K slots puts about K keys in each bucket\n"
      "  --compaction-mb-per-sec N\n"
      "                      flat only: compaction budget in MB/s of log read\n"
      "                      (default 0 = unlimited); flat compacts by itself\n"
      "                      as a server does on defaults (a table at half\n"
      "                      garbage, the log past 1.5x its live bytes), so\n"
      "                      overwrite and deleterandom pay for it; only a run\n"
      "                      with compact or readwhilecompacting turns that\n"
      "                      off, to time its own compaction\n"
      "  --compaction-disk-ratio R\n"
      "                      flat only: storage.compaction_disk_ratio (0 = off,\n"
      "                      else 1.1..1000; default: the engine's), the log\n"
      "                      bytes kept under R x the live bytes: higher\n"
      "                      trades disk for less compaction\n"
      "  --compaction-mode whole|in_place\n"
      "                      flat only: storage.compaction_mode (default whole)\n"
      "  --sparse-tier on|off\n"
      "                      flat only: storage.sparse_tier (default: the\n"
      "                      engine's, off)\n"
      "  --cache lru|arc|none\n"
      "                      flat only: put a WriteBackCache with this policy in\n"
      "                      front of the Store, for integer and string keys\n"
      "                      (default none)\n"
      "  --cache-bytes N     flat with --cache: clean-entry capacity (default 64 MiB)\n"
      "  --write-mode safe|async\n"
      "                      flat with --cache: write through, or write back by\n"
      "                      flusher threads (default safe); async write\n"
      "                      workloads end with a timed Flush()\n"
      "  --flush-interval-ms N\n"
      "                      flat with --cache: flusher period (default 100)\n"
      "  --help              this text\n"
      "\n"
      "If the first workload reads, overwrites or deletes and --dir is empty, the\n"
      "database is first filled with an untimed fillrandom (noted on stderr).\n"
      "compact and readwhilecompacting (flat only; skipped with a note for the\n"
      "peers) first overwrite the keys 3 times (untimed), then time one full\n"
      "compaction, or reads during it against reads without it.\n"
      "Exit status: 0 ok, 1 an operation or the engine failed, 2 bad command line\n"
      "or an engine not built into this binary.\n"
      "\n"
      "usage: flatkv-bench growth --engine ENGINE --dir DIR [--mix M] [options]\n"
      "\n"
      "Fills an empty store to --num records in --points steps, each inserting\n"
      "num/points new records (random order) mixed with reads of records already\n"
      "there, and prints one line per step: the records held and the ops/s of the\n"
      "step (the ZDB paper's Figures 5-10; chart them with bench_report.py --plot).\n"
      "Takes the engine flags above but --workload, and:\n"
      "\n"
      "  --mix M             writeonly: inserts only (default); readheavy: 90%%\n"
      "                      reads, 10%% inserts; writeheavy: 10%% reads, 90%%\n"
      "                      inserts (about num / (1 - reads) ops in all)\n"
      "  --num N             records at the end (default 1000000)\n"
      "  --points P          steps, one output line each (default 10, <= num)\n"
      "  --csv               a header line, then one comma-separated row per point\n"
      "                      (or --json: one object per point)\n"
      "\n"
      "--dir must be empty (or given with --fresh). Every read must find its\n"
      "record: a miss counts as an error. Exit status as for engine.\n",
      WorkloadNameList());
  std::fprintf(
      out,
      "\n"
      "usage: flatkv-bench server [--host H] [--port P | --zk HOSTS] [options]\n"
      "\n"
      "Drives a running flatkv-server over --clients connections, each with one\n"
      "call in flight, from --threads epoll loops; prints throughput and per-call\n"
      "latency (p50/p99/p999/max) per workload.\n"
      "\n"
      "  --host H            server address (default 127.0.0.1)\n"
      "  --port P            server port (default 9901)\n"
      "  --zk HOSTS          drive a ring instead: read it from ZooKeeper HOSTS\n"
      "                      (host:port,...) and send each key to its member\n"
      "  --path P            the ring's service path (default /flatkv)\n"
      "  --workload W[,W..]  run in order (default fill,get); each of\n"
      "                      %s:\n"
      "                      fill: put keys 0..num-1 once each (num ops);\n"
      "                      put: 100%% puts; get: 100%% gets; readheavy: 90%%\n"
      "                      gets, 10%% puts; writeheavy: 10%% gets, 90%% puts\n"
      "  --clients C         connections (default 50)\n"
      "  --threads T         event-loop threads, <= clients (default 1)\n"
      "  --ops N             ops (keys) per workload but fill (default 100000)\n"
      "  --num K             key space [0, K) (default --ops)\n"
      "  --value-size B      value bytes (default 100)\n"
      "  --batch K           keys per call: K > 1 sends multiGet/multiPut\n"
      "                      (default 1: get/put)\n"
      "  --keys uniform|zipf key distribution (default uniform; zipf: 0.99)\n"
      "  --key-dist dense|random|snowflake\n"
      "                      the integer key each index of [0, num) is sent as,\n"
      "                      as in engine mode (--key-min, --key-max,\n"
      "                      --snowflake-rate too; default dense)\n"
      "  --seed S            seed for keys and values (default 301)\n"
      "  --timeout-ms N      connect timeout, and longest wait for an answer\n"
      "                      (default 30000)\n"
      "  --tls-ca F          connect over TLS; the server's certificate must\n"
      "                      verify against the CAs in F (PEM) and name the host\n"
      "  --tls-cert F        with --tls-ca: a client certificate (PEM)\n"
      "  --tls-key F         the key of --tls-cert (PEM)\n"
      "  --json              one JSON object per line instead of text\n"
      "\n"
      "Gets check their answers: a key this run wrote must come back with\n"
      "--value-size bytes, so read after fill (--workload fill,get).\n"
      "Exit status: 0 ok, 1 a call failed or a check did not hold (the run goes\n"
      "on), or the connection failed (the run stops), 2 bad command line.\n",
      ServerWorkloadNameList());
}

}  // namespace flatkv::client
