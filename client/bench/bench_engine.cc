#include "client/bench/bench_engine.h"

#include <string>

namespace flatkv::client {

bool BenchEngineBuilt(std::string_view name) {
  if (name == "flat") return true;
#ifdef FLATKV_HAVE_ROCKSDB
  if (name == "rocksdb") return true;
#endif
#ifdef FLATKV_HAVE_LEVELDB
  if (name == "leveldb") return true;
#endif
#ifdef FLATKV_HAVE_KYOTOCABINET
  if (name == "kyotocabinet") return true;
#endif
  return false;
}

Status NewBenchEngine(std::string_view name, std::unique_ptr<BenchEngine>* result) {
  bool known = false;
  for (const char* n : kBenchEngineNames) known = known || name == n;
  if (!known) {
    return Status::InvalidArgument("unknown engine '" + std::string(name) +
                                   "' (expected flat|rocksdb|leveldb|kyotocabinet)");
  }
  // A peer missing at build time is a distinct answer from a typo: the user
  // needs to install the -dev package and rebuild, not fix the command line.
  if (!BenchEngineBuilt(name)) {
    return Status::InvalidArgument("engine " + std::string(name) +
                                   " not built into this flatkv-bench");
  }
  if (name == "flat") *result = NewFlatBenchEngine();
#ifdef FLATKV_HAVE_ROCKSDB
  if (name == "rocksdb") *result = NewRocksDbBenchEngine();
#endif
#ifdef FLATKV_HAVE_LEVELDB
  if (name == "leveldb") *result = NewLevelDbBenchEngine();
#endif
#ifdef FLATKV_HAVE_KYOTOCABINET
  if (name == "kyotocabinet") *result = NewKyotoBenchEngine();
#endif
  return Status::OK();
}

}  // namespace flatkv::client
