// Implementation notes: the live-slot summary.
//
// Counts only ever describe slot values, so they are exact whenever no
// Store() is in flight. While one is, a reader may see a count that already
// includes a slot about to become nonzero (harmless: the walk then reads the
// slot and finds it absent), but never one that has lost a slot still
// nonzero: Store() raises the counts before it writes a nonzero value over
// zero and lowers them only after it writes zero over a nonzero value.
#include "engine/flat_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "engine/crc32c.h"

namespace flatkv::engine {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'A', 'T', 'K', 'V', 'I', 'X'};
constexpr uint32_t kVersion = 3;  // 2: 8-bit size hints for W >= 6; 3: dead_bytes
constexpr size_t kPage = 4096;
constexpr size_t kCrcOffset = 40;
constexpr uint64_t kGroupsPerChunk = FlatIndex::kChunkSlots / FlatIndex::kGroupSlots;
static_assert(FlatIndex::kGroupSlots <= UINT16_MAX, "group counts are 16-bit");
static_assert(FlatIndex::kChunkSlots <= UINT32_MAX, "chunk counts are 32-bit");

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

// Nonzero slots among n slots of width W at p. Only zero or not matters, so
// byte order does not; a constant width lets the compiler inline the copy.
template <int W>
uint64_t CountNonzeroOf(const char* p, uint64_t n) {
  uint64_t live = 0;
  for (uint64_t i = 0; i < n; ++i, p += W) {
    uint64_t v = 0;
    std::memcpy(&v, p, W);
    live += v != 0;
  }
  return live;
}

uint64_t CountNonzero(const char* p, uint64_t n, int w) {
  switch (w) {
    case 4: return CountNonzeroOf<4>(p, n);
    case 5: return CountNonzeroOf<5>(p, n);
    case 6: return CountNonzeroOf<6>(p, n);
    case 7: return CountNonzeroOf<7>(p, n);
    default: return CountNonzeroOf<8>(p, n);
  }
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
    // Build the file under a temporary name so a killed process never
    // leaves a half-written header behind the real name. Nothing is synced:
    // after an OS crash a header that did not reach the disk is damaged,
    // and a damaged index is rebuilt from the data files (FlatTable::Open).
    const std::string tmp = path + ".tmp";
    fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno("creating " + tmp, errno);
    char hdr[kHeaderBytes];
    EncodeHeader(hdr, params, true, std::vector<uint64_t>(params.data_files, 0), 0);
    if (pwrite(fd, hdr, sizeof(hdr), 0) != static_cast<ssize_t>(sizeof(hdr)) ||
        ftruncate(fd, static_cast<off_t>(FileBytes(params))) != 0 ||
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
  FLATKV_RETURN_IF_ERROR(index->CountLiveSlots());
  *result = std::move(index);
  return Status::OK();
}

FlatIndex::FlatIndex(std::string path, int fd, const IndexParams& params, char* base, size_t len)
    : path_(std::move(path)), fd_(fd), params_(params), base_(base), len_(len),
      slots_(base + kHeaderBytes),
      chunks_((params.slots + kChunkSlots - 1) / kChunkSlots) {
  const uint64_t pages = (len - kHeaderBytes + kPage - 1) / kPage;
  const uint64_t words = (pages + 63) / 64;
  reserved_.reset(new std::atomic<uint64_t>[words]());
  chunk_live_.reset(new std::atomic<uint32_t>[chunks_]());
  group_live_.reset(new std::atomic<std::atomic<uint16_t>*>[chunks_]());
}

FlatIndex::~FlatIndex() {
  for (uint64_t c = 0; c < chunks_; ++c) delete[] group_live_[c].load();
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
  if (word.load(std::memory_order_acquire) & bit) return Status::OK();
  // One reserver at a time: a page found empty below is filled with zeros,
  // which must not land after another reserver's caller stored a slot there.
  std::lock_guard<std::mutex> lock(reserve_mu_);
  if (word.load(std::memory_order_relaxed) & bit) return Status::OK();
  const uint64_t off = kHeaderBytes + page * kPage;
  const uint64_t len = std::min<uint64_t>(kPage, len_ - off);
  // A page that is a hole is reserved by writing its zeros: the file system
  // reserves its block then (a full disk fails this write, not a later
  // store through the mapping) and allocates it at write-back, in file
  // order, next to its neighbours. fallocate, which cannot harm a page that
  // holds slots, is kept for those. Pages fallocate'd one by one in random
  // order (a compaction fills its new index so) stay an extent each, and
  // the next msync converts them one at a time: docs/performance.md,
  // "Index pages of a new generation".
  const off_t data = lseek(fd_, static_cast<off_t>(off), SEEK_DATA);
  const bool hole = (data < 0 && errno == ENXIO) ||
                    (data >= 0 && static_cast<uint64_t>(data) >= off + len);
  int err = 0;
  if (hole) {
    static const char kZeros[kPage] = {};
    for (size_t done = 0; done < len && err == 0;) {
      const ssize_t n = pwrite(fd_, kZeros + done, len - done, static_cast<off_t>(off + done));
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n == 0 || errno != EINTR) {
        err = n == 0 ? EIO : errno;
      }
    }
  } else if (fallocate(fd_, 0, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
    err = errno;
    if (err == EOPNOTSUPP) err = posix_fallocate(fd_, static_cast<off_t>(off), static_cast<off_t>(len));
  }
  if (err != 0) return Status::FromErrno("reserving index page in " + path_, err);
  word.fetch_or(bit, std::memory_order_release);
  return Status::OK();
}

void FlatIndex::AddLive(uint64_t slot, uint64_t n) {
  const uint64_t chunk = slot / kChunkSlots;
  std::atomic<uint16_t>* groups = group_live_[chunk].load(std::memory_order_acquire);
  if (groups == nullptr) {
    // Writers of different data files may race to allocate: one wins.
    auto* fresh = new std::atomic<uint16_t>[kGroupsPerChunk]();
    if (group_live_[chunk].compare_exchange_strong(groups, fresh, std::memory_order_acq_rel)) {
      groups = fresh;
    } else {
      delete[] fresh;
    }
  }
  groups[(slot % kChunkSlots) / kGroupSlots].fetch_add(static_cast<uint16_t>(n),
                                                       std::memory_order_relaxed);
  chunk_live_[chunk].fetch_add(static_cast<uint32_t>(n), std::memory_order_relaxed);
  live_.fetch_add(n, std::memory_order_relaxed);
}

void FlatIndex::DropLive(uint64_t slot) {
  // Only after AddLive of the same slot, so the group array exists.
  const uint64_t chunk = slot / kChunkSlots;
  std::atomic<uint16_t>* groups = group_live_[chunk].load(std::memory_order_acquire);
  live_.fetch_sub(1, std::memory_order_relaxed);
  chunk_live_[chunk].fetch_sub(1, std::memory_order_relaxed);
  groups[(slot % kChunkSlots) / kGroupSlots].fetch_sub(1, std::memory_order_relaxed);
}

void FlatIndex::ResetLive() {
  live_.store(0);
  for (uint64_t c = 0; c < chunks_; ++c) {
    chunk_live_[c].store(0);
    if (std::atomic<uint16_t>* groups = group_live_[c].load()) {
      for (uint64_t g = 0; g < kGroupsPerChunk; ++g) groups[g].store(0);
    }
  }
}

uint64_t FlatIndex::EmptySpan(uint64_t slot) const {
  if (live_.load(std::memory_order_relaxed) == 0) return params_.slots;
  const uint64_t chunk = slot / kChunkSlots;
  if (chunk_live_[chunk].load(std::memory_order_relaxed) == 0) return kChunkSlots;
  const std::atomic<uint16_t>* groups = group_live_[chunk].load(std::memory_order_acquire);
  if (groups == nullptr) return kChunkSlots;  // not reachable with a nonzero chunk count
  if (groups[(slot % kChunkSlots) / kGroupSlots].load(std::memory_order_relaxed) == 0) {
    return kGroupSlots;
  }
  return 0;
}

Status FlatIndex::CountLiveSlots() {
  ResetLive();
  const off_t area_end = static_cast<off_t>(len_);
  off_t pos = static_cast<off_t>(kHeaderBytes);
  const auto w = static_cast<uint64_t>(params_.item_bytes);
  while (pos < area_end) {
    // Holes read as zeros: only the allocated ranges can hold a live slot.
    // A file system without SEEK_DATA support reports the file as all data.
    off_t data = lseek(fd_, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // nothing allocated past pos
      return Status::FromErrno("seeking data in " + path_, errno);
    }
    if (data >= area_end) break;
    off_t hole = lseek(fd_, data, SEEK_HOLE);
    if (hole < 0) return Status::FromErrno("seeking a hole in " + path_, errno);
    hole = std::min(hole, area_end);
    // Slots overlapping [data, hole). Holes are page-aligned and wider than
    // a slot, so no slot overlaps two data ranges and none is counted twice.
    const uint64_t first = (static_cast<uint64_t>(data) - kHeaderBytes) / w;
    const uint64_t end = std::min<uint64_t>(
        params_.slots, (static_cast<uint64_t>(hole) - kHeaderBytes + w - 1) / w);
    FLATKV_RETURN_IF_ERROR(CountRange(first, end));
    pos = hole;
  }
  return Status::OK();
}

Status FlatIndex::CountRange(uint64_t first, uint64_t end) {
  // Open runs before anyone else sees the index, so the counts are added
  // once per group. The slots are read with pread() rather than through the
  // mapping: faulting in a full 2^24-slot index page by page took ~4x longer.
  const auto w = static_cast<uint64_t>(params_.item_bytes);
  constexpr uint64_t kBatch = kGroupSlots * 256;  // slots per read (<= 2 MiB)
  std::vector<char> buf(std::min(kBatch, end - first) * w);
  for (uint64_t s = first; s < end;) {
    const uint64_t n = std::min(kBatch, end - s);
    const off_t off = static_cast<off_t>(kHeaderBytes + s * w);
    size_t got = 0;
    while (got < n * w) {
      const ssize_t r = pread(fd_, buf.data() + got, n * w - got, off + static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Status::FromErrno("reading " + path_, r < 0 ? errno : EIO);
      got += static_cast<size_t>(r);
    }
    const char* p = buf.data();
    for (const uint64_t batch_end = s + n; s < batch_end;) {
      const uint64_t group_end = std::min(batch_end, (s / kGroupSlots + 1) * kGroupSlots);
      const uint64_t live = CountNonzero(p, group_end - s, params_.item_bytes);
      p += (group_end - s) * w;
      s = group_end;
      if (live != 0) AddLive(s - 1, live);
    }
  }
  return Status::OK();
}

Status FlatIndex::Reserve(uint64_t slot) {
  const uint64_t first = slot * params_.item_bytes;
  FLATKV_RETURN_IF_ERROR(ReservePage(first / kPage));
  const uint64_t last = first + params_.item_bytes - 1;
  if (last / kPage != first / kPage) FLATKV_RETURN_IF_ERROR(ReservePage(last / kPage));
  return Status::OK();
}

Status FlatIndex::Store(uint64_t slot, uint64_t value) {
  FLATKV_RETURN_IF_ERROR(Reserve(slot));
  // See the notes at the top: raise before, lower after.
  const bool was_live = Load(slot) != 0;
  if (!was_live && value != 0) AddLive(slot);
  StoreRaw(slot, value);
  if (was_live && value == 0) DropLive(slot);
  return Status::OK();
}

void FlatIndex::StoreRaw(uint64_t slot, uint64_t value) {
  const uint64_t first = slot * params_.item_bytes;
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
  ResetLive();
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) != 0) {
    // No hole punching here: cut the slots off and grow the file back, a
    // hole again. Not memset through the mapping: writing zeros into holes
    // of a full disk would be a SIGBUS. Nothing maps past the header
    // meanwhile (Clear runs in recovery, before any reader).
    if (ftruncate(fd_, off) != 0 || ftruncate(fd_, static_cast<off_t>(len_)) != 0) {
      return Status::FromErrno("clearing the slots of " + path_, errno);
    }
  }
  const uint64_t pages = (len_ - kHeaderBytes + kPage - 1) / kPage;
  for (uint64_t w = 0; w < (pages + 63) / 64; ++w) reserved_[w].store(0);
  return Status::OK();
}

}  // namespace flatkv::engine
