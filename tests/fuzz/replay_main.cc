// Replays inputs through a fuzz target's LLVMFuzzerTestOneInput without
// libFuzzer, so the seeds and every crash ever found (checked in under
// tests/fuzz/<target>/regressions) run as a normal test in every build:
//   <target>_replay DIR_OR_FILE...
// Exits 0 when every input ran (a crash or a sanitizer report fails it),
// and 1 when a directory holds no input at all (a test that cannot fail
// must not pass silently) or when an input made the process's peak RSS
// grow by more than 512 MiB: like libFuzzer's -rss_limit_mb, memory is
// watched too (a length field that makes the server allocate what the
// input only claims is a finding even when the allocation succeeds).
#include <algorithm>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) inputs.push_back(e.path());
      }
    } else if (std::filesystem::exists(p)) {
      inputs.push_back(p);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs to replay\n");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  auto peak_mib = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<long>(u.ru_maxrss / 1024);
  };
  constexpr long kMaxGrowthMiB = 512;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    std::fflush(stdout);
    const long before = peak_mib();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (peak_mib() - before > kMaxGrowthMiB) {
      std::fprintf(stderr, "%s: peak RSS grew from %ld to %ld MiB\n", path.c_str(), before,
                   peak_mib());
      return 1;
    }
  }
  std::printf("%zu inputs replayed\n", inputs.size());
  return 0;
}
