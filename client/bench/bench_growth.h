// Growth mode of flatkv-bench: throughput as the store grows from empty to
// --num records, the way the ZDB paper's Figures 5-10 plot it (ops/s against
// the number of records stored, per workload, record size and engine).
//
//   flatkv-bench growth --engine flat --mix readheavy --num 1000000
//       --points 20 --value-size 1024 --dir /tmp/g --fresh --json
//
// The run is --points steps. Step p (1-based) inserts the records
// [R(p-1), R(p)) with R(p) = num * p / points, so the store holds R(p)
// records when point p is printed. Inserted keys are KeyPermutation(num,
// seed) of the record index (random order, each key once, as YCSB's hashed
// inserts). Each thread interleaves its share of the step's inserts with
// reads in the mix's proportion:
//
//   writeonly    every op inserts a new record          (paper Figs. 5, 6)
//   readheavy    90% reads, 10% inserts                 (Figs. 7, 8)
//   writeheavy   10% reads, 90% inserts                 (Figs. 9, 10)
//
// An op is a read with probability read_percent / 100 (a per-thread Rng), so
// a step does about inserts / (1 - read_percent / 100) ops: a readheavy run
// to N records does about 10 N ops. A read picks a record uniformly among
// those present at the start of the step plus the ones this thread has
// inserted in it, so every read must hit: a miss is a failure (exit 1).
// With the paper's Table 1 missing from our copy of the text, the two mixed
// proportions are those of `flatkv-bench server`'s readheavy and writeheavy.
//
// Output: one line per point on stdout (text, --json objects, or --csv rows
// under one header line); see client/bench/README.md, "Growth mode".
//
// Thread safety: RunGrowthBench starts and joins its own threads.
#pragma once

#include <cstdint>
#include <string_view>

namespace flatkv::client {

struct BenchFlags;

// The read/insert mix of a growth run (--mix).
enum class GrowthMix { kWriteOnly, kReadHeavy, kWriteHeavy };

// Parses "writeonly" | "readheavy" | "writeheavy"; false on anything else.
bool ParseGrowthMix(std::string_view name, GrowthMix* mix);
// The name as on the command line and in the output.
const char* GrowthMixName(GrowthMix mix);
// Percent of ops that are reads: 0, 90 or 10.
int GrowthReadPercent(GrowthMix mix);

// Records in the store after point p (0 <= p <= points) of a run to num
// records: num * p / points, rounded down; 0 at p = 0, num at p = points.
uint64_t GrowthRecords(uint64_t num, int points, int p);

// Runs `flatkv-bench growth` with "flags" (mode kGrowth, already validated)
// and returns the exit status: 0 ok, 1 an op or the engine failed or a read
// missed, 2 an engine not built in or a --dir that is not empty (without
// --fresh).
int RunGrowthBench(const BenchFlags& flags);

}  // namespace flatkv::client
