// Fuzz target: the config parser (server/config.cc): the YAML file and the
// --set overrides. Input parts separated by 0xff: the YAML text, then each
// override "section.key=value". Bad input must give InvalidArgument with
// one line, never a crash or an exception.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "server/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (flatkv::fuzz::Quiet(), true);
  (void)quiet;
  const auto parts = flatkv::fuzz::Split(
      std::string_view(reinterpret_cast<const char*>(data), size), static_cast<char>(0xff));
  static const std::string path = flatkv::fuzz::TempRoot() + "/flatkv.yaml";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(parts[0].data(), static_cast<std::streamsize>(parts[0].size()));
  }
  std::vector<std::string> overrides;
  for (size_t i = 1; i < parts.size(); ++i) overrides.emplace_back(parts[i]);
  flatkv::server::Config config;
  const flatkv::Status st = flatkv::server::LoadConfig(path, overrides, &config);
  if (!st.ok() && st.message().find('\n') != std::string::npos) __builtin_trap();  // one line
  return 0;
}
