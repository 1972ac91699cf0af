// Fuzz target: a table home's CURRENT file, its generation directories and
// its META file, as Store::Open finds them after a crash or a damaged disk.
// Input parts separated by 0xff bytes: CURRENT's bytes, META's bytes, then
// names of directories to create in the home (filtered to [A-Za-z0-9-]).
// Open must fail with a Status or open a store that reads and writes.
#include <sys/stat.h>

#include <cctype>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "engine/store.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flatkv::engine;

namespace {
void Write(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (flatkv::fuzz::Quiet(), true);
  (void)quiet;
  const auto parts = flatkv::fuzz::Split(
      std::string_view(reinterpret_cast<const char*>(data), size), static_cast<char>(0xff));
  const std::string root = flatkv::fuzz::FreshDir("store");
  const std::string home = root + "/seg-0000000000000000";
  mkdir(home.c_str(), 0755);
  if (!parts[0].empty()) Write(home + "/CURRENT", parts[0]);
  for (size_t i = 2; i < parts.size() && i < 10; ++i) {
    std::string name;
    for (char c : parts[i]) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '-') name.push_back(c);
    }
    if (name.empty() || name.size() > 40) continue;
    const std::string dir = home + "/" + name;
    mkdir(dir.c_str(), 0755);
    if (parts.size() > 1 && !parts[1].empty()) Write(dir + "/META", parts[1]);
  }
  if (parts.size() > 1 && !parts[1].empty()) Write(home + "/META", parts[1]);
  EngineOptions o;
  o.path = root;
  o.segment_keys = 64;
  o.data_files = 2;
  o.string_slots = 64;
  o.checkpoint_interval_ms = 0;
  o.compaction_garbage_ratio = 0;
  std::unique_ptr<Store> store;
  if (!Store::Open(o, &store).ok()) return 0;
  std::string v;
  if (store->Put(3, "value").ok()) {
    if (!store->Get(3, &v).ok() || v != "value") __builtin_trap();
  }
  (void)store->Get(70, &v);
  (void)store->Close();
  return 0;
}
