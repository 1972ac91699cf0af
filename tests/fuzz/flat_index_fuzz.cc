// Fuzz target: the flat index header (and slot area) as read by
// FlatIndex::Open from an existing file. The parameters passed in are taken
// from the header itself where they are plausible, so the checks past the
// magic and the CRC are reached too; the slot count is kept small so one
// input never makes a large file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "engine/flat_index.h"
#include "engine/crc32c.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flatkv::engine;

namespace {
template <typename T>
T At(const std::string& s, size_t off) {
  T v{};
  if (off + sizeof(T) <= s.size()) std::memcpy(&v, s.data() + off, sizeof(T));
  return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (flatkv::fuzz::Quiet(), true);
  (void)quiet;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  IndexParams params;
  params.item_bytes = std::clamp<int>(At<uint32_t>(file, 12), 4, 8);
  params.kmin = At<int64_t>(file, 16);
  params.slots = std::clamp<uint64_t>(At<uint64_t>(file, 24), 1, 1 << 14);
  params.data_files = std::clamp<int>(static_cast<int>(At<uint32_t>(file, 32) % 1024), 1,
                                      FlatIndex::kMaxDataFiles);
  // mode bit 0: size the file as the parameters say (else keep the input's
  // length); bit 1: recompute the header CRC so the checks behind it run.
  if (mode & 1) file.resize(FlatIndex::kHeaderBytes + params.slots * params.item_bytes, '\0');
  if ((mode & 2) && file.size() >= FlatIndex::kHeaderBytes) {
    std::memset(&file[40], 0, 4);
    const uint32_t crc = crc32c::Mask(crc32c::Value(file.data(), FlatIndex::kHeaderBytes));
    std::memcpy(&file[40], &crc, 4);
  }
  static const std::string path = flatkv::fuzz::TempRoot() + "/index";
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  const bool written =
      file.empty() || write(fd, file.data(), file.size()) == static_cast<ssize_t>(file.size());
  ::close(fd);
  if (!written) return 0;
  std::unique_ptr<FlatIndex> index;
  if (!FlatIndex::Open(path, params, false, &index).ok()) return 0;
  uint64_t live = 0;
  for (uint64_t s = 0; s < params.slots; ++s) live += index->Load(s) != 0;
  if (live != index->LiveSlots()) __builtin_trap();  // the summary counts what is there
  for (uint64_t s = 0; s < params.slots; s += 97) (void)index->EmptySpan(s);
  (void)index->checkpoints();
  if (mode & 4) {
    (void)index->Store(params.slots - 1, 1);
    (void)index->WriteHeader(true, std::vector<uint64_t>(params.data_files, 0));
  }
  return 0;
}
