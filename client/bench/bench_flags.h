// Command line of flatkv-bench:
//
//   flatkv-bench engine --engine E --workload W[,W...] --dir D [options]
//   flatkv-bench growth --engine E --mix M --num N --points P --dir D [options]
//   flatkv-bench server --host H --port P --workload W[,W...] [options]
//
// Flags take "--name value" or "--name=value". Parsing never exits or throws:
// it returns InvalidArgument naming the flag, and main() turns that into a
// message and exit code 2.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "client/bench/bench_engine.h"
#include "client/bench/bench_growth.h"
#include "client/bench/bench_server.h"
#include "client/bench/bench_workload.h"
#include "engine/status.h"

namespace flatkv::client {

// The command: the storage engine in-process (a workload list, or a growth
// run: client/bench/bench_growth.h), or a running flatkv-server.
enum class BenchMode { kEngine, kGrowth, kServer };

struct BenchFlags {
  bool help = false;                      // --help / -h: print usage, exit 0
  BenchMode mode = BenchMode::kEngine;    // the first argument: engine | server
  // `server` mode: all of its flags (client/bench/bench_server.h). The fields
  // below are engine mode's.
  ServerBenchFlags server;
  // Engine and growth modes share the fields below, but for --workload
  // (engine only) and the growth fields after the cache's (growth only).
  std::string engine;                     // --engine (required)
  std::vector<Workload> workloads;        // --workload, run in order
  std::string dir;                        // --dir (required)
  uint64_t num = 1000000;                 // --num: keys, and ops per workload
  uint32_t value_size = 100;              // --value-size in bytes
  int threads = 1;                        // --threads
  bool sync = false;                      // --sync none|always
  bool json = false;                      // --json: one JSON object per line
  bool fresh = false;                     // --fresh: empty --dir first
  uint64_t seed = 301;                    // --seed for keys and values
  int index_item_bytes = 0;               // --index-item-bytes (flat), 0 = default
  int data_files = 0;                     // --data-files (flat), 0 = default
  KeyKind keys = KeyKind::kInt;           // --keys int|string
  // --key-dist dense|random|snowflake: where integer key indexes land
  // (KeySpace in bench_workload.h); given explicitly, each put's latency is
  // reported too (p50/p99/max), with flat's new segments and write stalls.
  KeyDist key_dist = KeyDist::kDense;
  bool key_dist_given = false;
  int64_t key_min = 0;                    // --key-min: random's range, and flat's
  int64_t key_max = std::numeric_limits<int64_t>::max();  // --key-max (storage.key_*)
  uint64_t snowflake_rate = 10000;        // --snowflake-rate: IDs a second
  // --sparse-first N: before the workloads, in the same process (untimed,
  // summed up on stderr), put N keys uniform over [--key-min, --key-max):
  // a store holding a few sparse segments, as a server would after them.
  uint64_t sparse_first = 0;
  uint64_t string_slots = 0;              // --string-slots (flat, string keys), 0 = auto
  uint32_t compaction_mb_per_sec = 0;     // --compaction-mb-per-sec (flat), 0 = unlimited
  double compaction_disk_ratio = -1;      // --compaction-disk-ratio (flat), -1 = default
  bool compaction_in_place = false;       // --compaction-mode in_place (flat)
  bool compaction_mode_given = false;     // --compaction-mode was on the command line
  bool sparse_tier = false;               // --sparse-tier on|off (flat)
  bool sparse_tier_given = false;
  // flat only: the WriteBackCache in front of the Store (engine/cache/).
  std::string cache = "none";             // --cache lru|arc|none
  uint64_t cache_bytes = uint64_t{64} << 20;  // --cache-bytes: clean-entry capacity
  bool write_async = false;               // --write-mode safe|async
  uint32_t flush_interval_ms = 100;       // --flush-interval-ms (async flushers)
  bool cache_flags_given = false;         // any of the four above was on the command line
  // `growth` mode only (client/bench/bench_growth.h); --num is the final
  // record count.
  GrowthMix mix = GrowthMix::kWriteOnly;  // --mix writeonly|readheavy|writeheavy
  int points = 10;                        // --points: steps, one output line each
  bool csv = false;                       // --csv: a header line, then one row a point
  bool growth_flags_given = false;        // --mix, --points or --csv was given
};

// True if --cache is lru or arc (not none).
inline bool CacheEnabled(const BenchFlags& flags) { return flags.cache != "none"; }

// The string_slots flat gets with --keys string: --string-slots if given,
// else the smallest power of two >= num and >= 1024, so that a bucket holds
// about one key. 0 (the engine's default) with --keys int.
uint64_t StringSlotsFor(const BenchFlags& flags);

// The options the engine adapters open with, from the engine/growth flags.
BenchEngineOptions EngineOptionsFor(const BenchFlags& flags);

// The integer key space of --key-dist, --key-min, --key-max, --snowflake-rate
// and --seed.
KeySpace KeySpaceFor(const BenchFlags& flags);

// Parses argv (argv[0] is the program). On success fills *flags; on a bad
// command line returns InvalidArgument with a one-line reason.
Status ParseBenchFlags(int argc, char** argv, BenchFlags* flags);

// Writes the usage text to "out".
void PrintBenchUsage(std::FILE* out);

}  // namespace flatkv::client
