#include "engine/flat_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/crc32c.h"

namespace flatkv::engine {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'A', 'T', 'K', 'V', 'I', 'X'};
constexpr uint32_t kVersion = 3;  // 2: 8-bit size hints for W >= 6; 3: dead_bytes
constexpr size_t kPage = 4096;
constexpr size_t kCrcOffset = 40;

template <typename T>
void PutAt(char* base, size_t off, T v) {
  std::memcpy(base + off, &v, sizeof(v));
}
template <typename T>
T GetAt(const char* base, size_t off) {
  T v;
  std::memcpy(&v, base + off, sizeof(v));
  return v;
}

uint32_t HeaderCrc(const char* hdr) {
  char copy[FlatIndex::kHeaderBytes];
  std::memcpy(copy, hdr, sizeof(copy));
  PutAt<uint32_t>(copy, kCrcOffset, 0);
  return crc32c::Mask(crc32c::Value(copy, sizeof(copy)));
}

constexpr size_t kDeadBytesOffset = FlatIndex::kHeaderBytes - 8;

void EncodeHeader(char* hdr, const IndexParams& p, bool clean,
                  const std::vector<uint64_t>& checkpoints, uint64_t dead_bytes) {
  std::memset(hdr, 0, FlatIndex::kHeaderBytes);
  std::memcpy(hdr, kMagic, sizeof(kMagic));
  PutAt<uint32_t>(hdr, 8, kVersion);
  PutAt<uint32_t>(hdr, 12, static_cast<uint32_t>(p.item_bytes));
  PutAt<int64_t>(hdr, 16, p.kmin);
  PutAt<uint64_t>(hdr, 24, p.slots);
  PutAt<uint32_t>(hdr, 32, static_cast<uint32_t>(p.data_files));
  PutAt<uint32_t>(hdr, 36, clean ? 1 : 0);
  for (size_t i = 0; i < checkpoints.size(); ++i) PutAt<uint64_t>(hdr, 48 + 8 * i, checkpoints[i]);
  PutAt<uint64_t>(hdr, kDeadBytesOffset, dead_bytes);
  PutAt<uint32_t>(hdr, kCrcOffset, HeaderCrc(hdr));
}

uint64_t FileBytes(const IndexParams& p) {
  return FlatIndex::kHeaderBytes + p.slots * static_cast<uint64_t>(p.item_bytes);
}

}  // namespace

Status FlatIndex::Open(const std::string& path, const IndexParams& params, bool create,
                       std::unique_ptr<FlatIndex>* result) {
  if (params.item_bytes < 4 || params.item_bytes > 8 || params.data_files < 1 ||
      params.data_files > kMaxDataFiles || params.slots == 0) {
    return Status::InvalidArgument("bad index parameters for " + path);
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    // Build the file under a temporary name so a crash never leaves a
    // half-written header behind the real name.
    const std::string tmp = path + ".tmp";
    fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno("creating " + tmp, errno);
    char hdr[kHeaderBytes];
    EncodeHeader(hdr, params, true, std::vector<uint64_t>(params.data_files, 0), 0);
    if (pwrite(fd, hdr, sizeof(hdr), 0) != static_cast<ssize_t>(sizeof(hdr)) ||
        ftruncate(fd, static_cast<off_t>(FileBytes(params))) != 0 || fdatasync(fd) != 0 ||
        rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::close(fd);
      unlink(tmp.c_str());
      return Status::FromErrno("creating " + path, err);
    }
  }
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + " does not exist");
    return Status::FromErrno("opening " + path, errno);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno("stat " + path, err);
  }
  // Never trust (or map past) a file whose size disagrees with its parameters.
  const uint64_t want = FileBytes(params);
  if (static_cast<uint64_t>(st.st_size) != want) {
    ::close(fd);
    return Status::Corruption(path + " has " + std::to_string(st.st_size) +
                              " bytes, expected " + std::to_string(want));
  }
  void* base = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno("mapping " + path, err);
  }
  std::unique_ptr<FlatIndex> index(
      new FlatIndex(path, fd, params, static_cast<char*>(base), want));
  FLATKV_RETURN_IF_ERROR(index->ReadHeader());
  *result = std::move(index);
  return Status::OK();
}

FlatIndex::FlatIndex(std::string path, int fd, const IndexParams& params, char* base, size_t len)
    : path_(std::move(path)), fd_(fd), params_(params), base_(base), len_(len),
      slots_(base + kHeaderBytes) {
  const uint64_t pages = (len - kHeaderBytes + kPage - 1) / kPage;
  const uint64_t words = (pages + 63) / 64;
  reserved_.reset(new std::atomic<uint64_t>[words]());
}

FlatIndex::~FlatIndex() {
  munmap(base_, len_);
  ::close(fd_);
}

Status FlatIndex::ReadHeader() {
  const char* h = base_;
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) {
    return Status::Corruption(path_ + ": bad magic (not a FlatKV index)");
  }
  if (GetAt<uint32_t>(h, 8) != kVersion) {
    return Status::Corruption(path_ + ": unsupported format version " +
                              std::to_string(GetAt<uint32_t>(h, 8)));
  }
  if (GetAt<uint32_t>(h, kCrcOffset) != HeaderCrc(h)) {
    return Status::Corruption(path_ + ": header checksum mismatch");
  }
  if (GetAt<uint32_t>(h, 12) != static_cast<uint32_t>(params_.item_bytes) ||
      GetAt<int64_t>(h, 16) != params_.kmin || GetAt<uint64_t>(h, 24) != params_.slots ||
      GetAt<uint32_t>(h, 32) != static_cast<uint32_t>(params_.data_files)) {
    return Status::Corruption(path_ + ": header parameters differ from the table's");
  }
  clean_ = GetAt<uint32_t>(h, 36) == 1;
  checkpoints_.resize(params_.data_files);
  for (int i = 0; i < params_.data_files; ++i) checkpoints_[i] = GetAt<uint64_t>(h, 48 + 8 * i);
  dead_bytes_ = GetAt<uint64_t>(h, kDeadBytesOffset);
  return Status::OK();
}

uint64_t FlatIndex::Load(uint64_t slot) const {
  const char* p = slots_ + slot * params_.item_bytes;
  switch (params_.item_bytes) {
    case 4:
      return __atomic_load_n(reinterpret_cast<const uint32_t*>(p), __ATOMIC_RELAXED);
    case 8:
      return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_RELAXED);
    default: {
      uint64_t v = 0;
      for (int i = params_.item_bytes - 1; i >= 0; --i) {
        v = (v << 8) | __atomic_load_n(reinterpret_cast<const uint8_t*>(p + i), __ATOMIC_RELAXED);
      }
      return v;
    }
  }
}

Status FlatIndex::ReservePage(uint64_t page) {
  std::atomic<uint64_t>& word = reserved_[page / 64];
  const uint64_t bit = uint64_t{1} << (page % 64);
  if (word.load(std::memory_order_relaxed) & bit) return Status::OK();
  const uint64_t off = kHeaderBytes + page * kPage;
  const uint64_t len = std::min<uint64_t>(kPage, len_ - off);
  if (fallocate(fd_, 0, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
    int err = errno;
    if (err != EOPNOTSUPP) return Status::FromErrno("reserving index page in " + path_, err);
    err = posix_fallocate(fd_, static_cast<off_t>(off), static_cast<off_t>(len));
    if (err != 0) return Status::FromErrno("reserving index page in " + path_, err);
  }
  word.fetch_or(bit, std::memory_order_relaxed);
  return Status::OK();
}

Status FlatIndex::Store(uint64_t slot, uint64_t value) {
  const uint64_t first = slot * params_.item_bytes;
  FLATKV_RETURN_IF_ERROR(ReservePage(first / kPage));
  const uint64_t last = first + params_.item_bytes - 1;
  if (last / kPage != first / kPage) FLATKV_RETURN_IF_ERROR(ReservePage(last / kPage));
  char* p = slots_ + first;
  switch (params_.item_bytes) {
    case 4:
      __atomic_store_n(reinterpret_cast<uint32_t*>(p), static_cast<uint32_t>(value),
                       __ATOMIC_RELAXED);
      break;
    case 8:
      __atomic_store_n(reinterpret_cast<uint64_t*>(p), value, __ATOMIC_RELAXED);
      break;
    default:
      for (int i = 0; i < params_.item_bytes; ++i) {
        __atomic_store_n(reinterpret_cast<uint8_t*>(p + i), static_cast<uint8_t>(value >> (8 * i)),
                         __ATOMIC_RELAXED);
      }
  }
  return Status::OK();
}

Status FlatIndex::WriteHeader(bool clean, const std::vector<uint64_t>& checkpoints) {
  EncodeHeader(base_, params_, clean, checkpoints, dead_bytes_);
  if (msync(base_, kHeaderBytes, MS_SYNC) != 0) {
    return Status::FromErrno("syncing header of " + path_, errno);
  }
  clean_ = clean;
  checkpoints_ = checkpoints;
  return Status::OK();
}

Status FlatIndex::Sync() {
  if (msync(slots_, len_ - kHeaderBytes, MS_SYNC) != 0) {
    return Status::FromErrno("syncing " + path_, errno);
  }
  return Status::OK();
}

Status FlatIndex::Clear() {
  const off_t off = kHeaderBytes;
  const off_t len = static_cast<off_t>(len_ - kHeaderBytes);
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) != 0) {
    std::memset(slots_, 0, len_ - kHeaderBytes);
    return Status::OK();
  }
  const uint64_t pages = (len_ - kHeaderBytes + kPage - 1) / kPage;
  for (uint64_t w = 0; w < (pages + 63) / 64; ++w) reserved_[w].store(0);
  return Status::OK();
}

}  // namespace flatkv::engine
