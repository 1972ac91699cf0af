// Fuzz target: the log record decoder (ParseRecord, DecodeAppendParts) and
// LogReader over a data file holding the input. Data-file bytes are input:
// a damaged file must be reported and skipped, never crash or over-read.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/log_file.h"
#include "engine/record.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flatkv::engine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (flatkv::fuzz::Quiet(), true);
  (void)quiet;
  const char* p = reinterpret_cast<const char*>(data);
  RecordView view;
  const char* reason = nullptr;
  if (ParseRecord(p, size, &view, &reason) == ParseResult::kOk) {
    if (view.size > size || view.value.data() < p || view.value.data() + view.value.size() > p + size) {
      __builtin_trap();  // a parsed record must lie inside the bytes given
    }
    std::vector<AppendPart> parts;
    std::string_view payload;
    (void)DecodeAppendParts(view.value, &parts, &payload);
  }
  std::vector<AppendPart> parts;
  std::string_view payload;
  (void)DecodeAppendParts(std::string_view(p, size), &parts, &payload);

  // The same bytes as a data file, read by LogReader from the start.
  static const std::string path = flatkv::fuzz::TempRoot() + "/data-000.log";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  const bool written = size == 0 || write(fd, data, size) == static_cast<ssize_t>(size);
  ::close(fd);
  if (!written) return 0;
  std::unique_ptr<LogFile> log;
  if (!LogFile::Open(path, false, &log).ok()) return 0;
  uint64_t skipped = 0;
  LogReader reader(log.get(), 0, log->end(),
                   [&](uint64_t, uint64_t bytes, const char*) { skipped += bytes; });
  uint64_t pos = 0;
  uint64_t last_end = 0;
  while (reader.Next(&view, &pos)) {
    if (pos < last_end || pos + view.size > log->end()) __builtin_trap();
    last_end = pos + view.size;
  }
  (void)log->Close();
  return 0;
}
