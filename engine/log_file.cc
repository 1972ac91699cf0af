// Implementation notes
//
// The writable window maps [window_start_, alloc_) where window_start_ is the
// page holding the logical end when the window was made. Space is reserved
// ahead in steps of an eighth of the file, from one page up to
// kMaxReserveStep, so a table with one tiny record costs one page, a busy
// file remaps every 8 MiB once past 64 MiB, and reserved space is at most
// an eighth of a file's data; a step is also at most a thousandth of the
// file system's free space.
// madvise(MADV_DONTNEED) on already-written pages of a shared file mapping
// only drops this process's page table entries: the dirty pages stay in the
// page cache and are written back as usual.
// Only the writer (holding the table's per-file mutex) touches the window;
// readers never dereference it, so it can be replaced without coordination.
//
// Read mappings (MappedRange) are separate: read-only, and never moved or
// shrunk while the file is open, because a reader may hold an address into
// one without any lock. A chunk first reserves kReadChunkBytes of address
// space (PROT_NONE anonymous, which costs no memory and keeps the range
// ours), then maps the file over the front of it with MAP_FIXED, up to the
// file's size on disk. As the file grows, the next piece is mapped with
// MAP_FIXED right after the previous one; the kernel merges the pieces into
// one VMA, so a chunk costs at most two (the mapped part and the rest of the
// reservation). Mapping only up to the size on disk is what keeps reads safe
// from SIGBUS: the end only moves forward while open (Reserve and WriteDirect
// fallocate before they publish alloc_), and the only shrinking calls
// (Truncate, Close) run with no reader inside and drop the mappings first.
// If a MAP_FIXED ever fails the chunk is marked broken and never extended
// again (its reservation may now have a hole someone else could map into);
// reads there use pread.
#include "engine/log_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace flatkv::engine {
namespace {

constexpr uint64_t kPage = 4096;
// Written pages are dropped from the window (not from the page cache) every
// this many bytes, so a long fill does not show up as process RSS (16 data
// files of a table being written, and a compaction's second generation, each
// hold up to this plus kPopulateBytes mapped).
constexpr uint64_t kReleaseBytes = 256ull << 10;
// Pages of the window are faulted in this many bytes ahead of the end.
constexpr uint64_t kPopulateBytes = 256ull << 10;
// The window maps at least this many bytes of the file, beyond its end too
// (a mapping may reach past the end of a file; only touching a page there
// faults, and the appender touches nothing past what it reserved). A young
// file reserves an eighth of what it holds at a time, so a window of just
// the reserved bytes was unmapped and mapped again about 50 times while a
// data file grew to 2 MB: each munmap a TLB shootdown to the compactor's
// CPU. Address space only: RSS counts the pages touched.
constexpr uint64_t kWindowSpan = 64ull << 20;
constexpr size_t kReadChunk = 1 << 20;
// Direct writes (records of kDirectWriteBytes and more) reserve at most this
// far ahead: ten 100 KiB records per fallocate instead of one (one call per
// record of exactly its size made 100 KiB fills a third slower and 4 KiB
// ones 2-40x slower), while the space reserved ahead, which counts toward
// the compaction's disk bound, stays small beside the window's eighth of
// the file (8 MiB steps started compactions early enough to cost 100 KiB
// overwrites 60 % of their rate).
constexpr uint64_t kDirectReserveStep = 1ull << 20;

uint64_t RoundUp(uint64_t n, uint64_t unit) { return (n + unit - 1) / unit * unit; }

Status Reserve(int fd, uint64_t from, uint64_t len, const std::string& path) {
  if (fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(len)) == 0) {
    return Status::OK();
  }
  int err = errno;
  if (err == EOPNOTSUPP) {
    err = posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(len));
    if (err == 0) return Status::OK();
  }
  return Status::FromErrno("reserving space in " + path, err);
}

}  // namespace

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("opening directory " + dir, errno);
  const int rc = fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? Status::OK() : Status::FromErrno("syncing directory " + dir, err);
}

Status LogFile::Open(const std::string& path, bool create, std::unique_ptr<LogFile>* result) {
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return Status::FromErrno("opening " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno("stat " + path, err);
  }
  result->reset(new LogFile(path, fd, static_cast<uint64_t>(st.st_size)));
  return Status::OK();
}

LogFile::LogFile(std::string path, int fd, uint64_t size)
    : path_(std::move(path)), fd_(fd), end_(size), alloc_(size) {}

LogFile::~LogFile() { (void)Close(); }

Status LogFile::Reserve(size_t n) {
  const uint64_t end = end_.load(std::memory_order_relaxed);
  if (window_ != nullptr && end >= window_start_ && end + n <= window_start_ + window_len_) {
    // Inside the mapping: the file may need to grow under it.
    return end + n <= alloc_ ? Status::OK() : ReserveAhead(end + n);
  }
  FLATKV_RETURN_IF_ERROR(ReserveAhead(end + n));
  Unmap();
  const uint64_t start = end / kPage * kPage;
  const uint64_t len = std::max(alloc_ - start, kWindowSpan);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(start));
  if (p == MAP_FAILED) return Status::FromErrno("mapping " + path_, errno);
  // No read-around on a fault in the window: the pages past the end hold
  // reserved zeros, and the kernel's mmap read-around would zero up to
  // read_ahead_kb of them (8 MiB on some disks) around the faulted page,
  // only for the next large write to overwrite them with pwrite. Populate()
  // already faults in the pages that small appends will use.
  madvise(p, len, MADV_RANDOM);
  window_ = static_cast<char*>(p);
  window_start_ = start;
  window_len_ = len;
  PublishWritable();
  return Status::OK();
}

Status LogFile::ReserveAhead(uint64_t need_end, uint64_t max_step) {
  // An eighth of the file: reserved-but-unwritten space stays a small share
  // of the disk (doubling steps made an open store take up to twice its
  // data: the soak's disk went past 2x the live data on that alone). Of
  // what the file holds: after head cleaning its positions run far past
  // its bytes (the step once grew with the position: 2x the live data in
  // allocated tails alone).
  const uint64_t held = alloc_ - std::min<uint64_t>(alloc_, begin_.load(std::memory_order_relaxed));
  uint64_t step = std::clamp<uint64_t>(held / 8, kPage, max_step);
  // Never reserve ahead more than a thousandth of the free space: on a
  // small or nearly full disk, dozens of data files each holding megabytes
  // of reserved zeros would fill it while the records themselves fit.
  struct statvfs vfs;
  if (fstatvfs(fd_, &vfs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    step = std::min(step, std::max<uint64_t>(kPage, avail / 1024));
  }
  uint64_t want = RoundUp(std::max<uint64_t>(need_end, alloc_ + step), kPage);
  if (want > alloc_) {
    Status st = flatkv::engine::Reserve(fd_, alloc_, want - alloc_, path_);
    // Nearly full: reserving a whole step ahead (up to 8 MiB) fails while
    // the record itself still fits, so try once more for just its pages.
    const uint64_t need = RoundUp(need_end, kPage);
    if (st.IsNoSpace() && need > alloc_ && need < want) {
      st = flatkv::engine::Reserve(fd_, alloc_, need - alloc_, path_);
      want = need;
    }
    FLATKV_RETURN_IF_ERROR(st);
    alloc_ = want;
  }
  return Status::OK();
}

Status LogFile::Append(RecordType type, int64_t key, uint64_t timestamp, std::string_view prefix,
                       std::string_view value, uint64_t* pos, size_t* size) {
  if (fd_ < 0) return Status::IOError(path_ + " is closed");
  const size_t n = RecordSize(prefix.size() + value.size());
  const uint64_t end = end_.load(std::memory_order_relaxed);
  if (n >= kDirectWriteBytes) {
    FLATKV_RETURN_IF_ERROR(WriteDirect(type, key, timestamp, prefix, value, n));
  } else {
    FLATKV_RETURN_IF_ERROR(Reserve(n));
    if (end + n > populated_) Populate(end, end + n);
    EncodeRecord(window_ + (end - window_start_), type, key, timestamp, prefix, value);
    const uint64_t done = (end + n) / kPage * kPage;
    if (done >= released_ + kReleaseBytes) {
      const uint64_t from = std::max(released_, window_start_);
      madvise(window_ + (from - window_start_), done - from, MADV_DONTNEED);
      released_ = done;
      PublishWritable();
    }
  }
  *pos = end;
  *size = n;
  end_.store(end + n, std::memory_order_release);
  return Status::OK();
}

Status LogFile::WriteDirect(RecordType type, int64_t key, uint64_t timestamp,
                            std::string_view prefix, std::string_view value, size_t size) {
  char hdr[kRecordHeaderSize];
  EncodeRecordHeader(hdr, type, key, timestamp, prefix, value);
  char key_bytes[kRecordKeySize];
  const auto ukey = static_cast<uint64_t>(key);
  std::memcpy(key_bytes, &ukey, sizeof(ukey));
  iovec iov[4] = {{hdr, sizeof(hdr)},
                  {const_cast<char*>(prefix.data()), prefix.size()},
                  {const_cast<char*>(value.data()), value.size()},
                  {key_bytes, sizeof(key_bytes)}};
  return WriteAtEnd(iov, 4, size);
}

Status LogFile::AppendEncoded(std::string_view records, uint64_t* pos) {
  if (fd_ < 0) return Status::IOError(path_ + " is closed");
  const uint64_t end = end_.load(std::memory_order_relaxed);
  if (records.empty()) {
    *pos = end;
    return Status::OK();
  }
  // Reserved a step ahead, as for the write window: one fallocate() per
  // batch made up 7 % of a compaction's time.
  if (end + records.size() > alloc_) FLATKV_RETURN_IF_ERROR(ReserveAhead(end + records.size()));
  iovec iov[1] = {{const_cast<char*>(records.data()), records.size()}};
  FLATKV_RETURN_IF_ERROR(WriteAtEnd(iov, 1, records.size()));
  *pos = end;
  end_.store(end + records.size(), std::memory_order_release);
  return Status::OK();
}

Status LogFile::WriteAtEnd(iovec* v, int cnt, size_t size) {
  const uint64_t end = end_.load(std::memory_order_relaxed);
  // Reserve first so a full disk fails here, cleanly, before any byte lands.
  if (end + size > alloc_) FLATKV_RETURN_IF_ERROR(ReserveAhead(end + size, kDirectReserveStep));
  uint64_t off = end;
  size_t left = size;
  while (left > 0) {
    ssize_t w = pwritev(fd_, v, cnt, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("writing " + path_, errno);
    }
    off += static_cast<uint64_t>(w);
    left -= static_cast<size_t>(w);
    // Drop the iovecs written in full, trim the first partial one.
    auto done = static_cast<size_t>(w);
    while (cnt > 0 && done >= v->iov_len) {
      done -= v->iov_len;
      ++v;
      --cnt;
    }
    if (cnt > 0) {
      v->iov_base = static_cast<char*>(v->iov_base) + done;
      v->iov_len -= done;
    }
  }
  return Status::OK();
}

namespace {

// Calls read_at(done) (a pread-like call for the bytes from offset "done" of
// the request on) until "want" bytes are read or the file ends; retries
// EINTR. *got is the number read.
template <typename ReadAt>
Status ReadFully(const std::string& path, uint64_t pos, size_t want, ReadAt read_at,
                 size_t* got) {
  size_t total = 0;
  while (total < want) {
    const ssize_t r = read_at(total);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("reading " + path + " at offset " + std::to_string(pos), errno);
    }
    if (r == 0) break;
    total += static_cast<size_t>(r);
  }
  *got = total;
  return Status::OK();
}

}  // namespace

Status LogFile::Read(uint64_t pos, size_t n, char* dst, size_t* got) const {
  return ReadFully(path_, pos, n, [&](size_t done) {
    return pread(fd_, dst + done, n - done, static_cast<off_t>(pos + done));
  }, got);
}

Status LogFile::ReadSplit(uint64_t pos, char* head, size_t head_n, char* dst, size_t n,
                          size_t* got) const {
  return ReadFully(path_, pos, head_n + n, [&](size_t done) {
    iovec iov[2];
    int cnt = 0;
    if (done < head_n) iov[cnt++] = {head + done, head_n - done};
    const size_t into_dst = done > head_n ? done - head_n : 0;
    iov[cnt++] = {dst + into_dst, n - into_dst};
    return preadv(fd_, iov, cnt, static_cast<off_t>(pos + done));
  }, got);
}

const char* LogFile::MapSlow(uint64_t pos, size_t n, uint64_t pages) const {
  if (n == 0 || (pos & (kMapPage - 1)) + n > pages * kMapPage) return nullptr;
  std::lock_guard<std::mutex> lock(map_mu_);
  if (fd_ < 0) return nullptr;
  const uint64_t c = pos / kReadChunkBytes;
  const int b = 63 - __builtin_clzll(c + 1);
  ReadChunk* blk = blocks_[b].load(std::memory_order_relaxed);
  if (blk == nullptr) {
    blk = new ReadChunk[uint64_t{1} << b];
    blocks_[b].store(blk, std::memory_order_release);
  }
  ReadChunk& ch = blk[c + 1 - (uint64_t{1} << b)];
  const uint64_t chunk_start = c * kReadChunkBytes;
  const uint64_t off = pos - chunk_start;
  if (off + n <= ch.valid.load(std::memory_order_relaxed)) {
    return ch.base.load(std::memory_order_relaxed) + off;  // another reader mapped it
  }
  // The file's size on disk: every byte below it is written or fallocated.
  const uint64_t size = alloc_.load(std::memory_order_acquire);
  if (ch.broken || size <= chunk_start) return nullptr;
  const uint64_t valid = std::min(kReadChunkBytes, size - chunk_start);
  if (off + n > valid) return nullptr;
  char* base = ch.base.load(std::memory_order_relaxed);
  if (base == nullptr) {
    void* r = mmap(nullptr, kReadChunkBytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return nullptr;
    base = static_cast<char*>(r);
    ch.base.store(base, std::memory_order_relaxed);
  }
  // The last page may hold the file's end: its bytes past the end read as
  // zeros (no SIGBUS; only pages wholly past the end would fault).
  const uint64_t extent = RoundUp(valid, kMapPage);
  if (extent > ch.mapped) {
    void* r = mmap(base + ch.mapped, extent - ch.mapped, PROT_READ, MAP_SHARED | MAP_FIXED, fd_,
                   static_cast<off_t>(chunk_start + ch.mapped));
    if (r == MAP_FAILED) {
      ch.broken = true;
      return nullptr;
    }
    // One page per miss: no read-around (see the header).
    madvise(base + ch.mapped, extent - ch.mapped, MADV_RANDOM);
    read_mapped_.fetch_add(extent - ch.mapped, std::memory_order_relaxed);
    ch.mapped = extent;
  }
  ch.valid.store(valid, std::memory_order_release);
  return base + off;
}

Status LogFile::ReadForGet(uint64_t pos, size_t n, std::string* buf, const char** data,
                          size_t* got) const {
  if (const char* p = MappedRange(pos, n)) {
    *data = p;
    *got = n;
    return Status::OK();
  }
  using Clock = std::chrono::steady_clock;
  auto ns = [](Clock::time_point since) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
  };
  const bool span = n != 0 && (pos & (kMapPage - 1)) + n <= 2 * kMapPage;
  if (span && span_policy_.UseMapping()) {
    if (const char* p = MappedRange(pos, n, 2)) {
      const Clock::time_point start = Clock::now();
      // One byte of each page: a missing one faults here, inside the timing.
      const auto* v = reinterpret_cast<const volatile char*>(p);
      [[maybe_unused]] const char first = v[0], last = v[n - 1];
      span_policy_.NoteMapped(ns(start));
      *data = p;
      *got = n;
      return Status::OK();
    }
  }
  if (buf->size() < n) buf->resize(n);
  *data = buf->data();
  if (!span) return Read(pos, n, buf->data(), got);  // nothing for the policy to learn
  const Clock::time_point start = Clock::now();
  Status st = Read(pos, n, buf->data(), got);
  if (st.ok()) span_policy_.NotePread(ns(start));
  return st;
}

void LogFile::UnmapReads() {
  std::lock_guard<std::mutex> lock(map_mu_);
  for (int b = 0; b < 64; ++b) {
    ReadChunk* blk = blocks_[b].load(std::memory_order_relaxed);
    if (blk == nullptr) continue;
    for (uint64_t i = 0; i < (uint64_t{1} << b); ++i) {
      char* base = blk[i].base.load(std::memory_order_relaxed);
      if (base != nullptr) munmap(base, kReadChunkBytes);
    }
    blocks_[b].store(nullptr, std::memory_order_relaxed);
    delete[] blk;
  }
  read_mapped_.store(0, std::memory_order_relaxed);
}

Status LogFile::Sync() {
  if (fd_ < 0) return Status::OK();
  if (fdatasync(fd_) != 0) return Status::FromErrno("fdatasync " + path_, errno);
  return Status::OK();
}

void LogFile::StartWriteback() {
  // Whole pages below the end only, and none the window holds writable:
  // the pages populated ahead of the end are dirty zeros that appends are
  // about to fill, and the ones just behind it are still mapped until the
  // next release (kReleaseBytes). Writing either back would write-protect
  // each page (a TLB shootdown each: 9 % of a compaction's time under 4 KiB
  // overwrites) only for the appender to fault it writable again. Sync()
  // writes them; this is a hint that keeps its wait short.
  if (fd_ < 0) return;
  const uint64_t upto = end() / kPage * kPage;
  const uint64_t lo = std::min(writable_lo_.load(std::memory_order_relaxed), upto);
  const uint64_t hi = std::max(writable_hi_.load(std::memory_order_relaxed), lo);
  if (lo > 0) (void)sync_file_range(fd_, 0, static_cast<off_t>(lo), SYNC_FILE_RANGE_WRITE);
  if (hi < upto) {
    (void)sync_file_range(fd_, static_cast<off_t>(hi), static_cast<off_t>(upto - hi),
                          SYNC_FILE_RANGE_WRITE);
  }
}

void LogFile::ReleaseWindow() {
  if (window_ == nullptr) return;
  const uint64_t from = std::max(released_, window_start_);
  const uint64_t to = std::min(populated_, window_start_ + window_len_);
  if (to > from) madvise(window_ + (from - window_start_), to - from, MADV_DONTNEED);
  // Nothing below the end's page is mapped now, nor populated from there.
  const uint64_t floor = std::max(end() / kPage * kPage, window_start_);
  released_ = std::max(released_, floor);
  populated_ = floor;
  hold_lookahead_ = true;
  PublishWritable();
}

void LogFile::ResumeLookahead() { hold_lookahead_ = false; }

Status LogFile::Truncate(uint64_t end) {
  Unmap();
  UnmapReads();  // they may cover what is cut; no reader is inside (see the header)
  if (ftruncate(fd_, static_cast<off_t>(end)) != 0) {
    return Status::FromErrno("truncating " + path_, errno);
  }
  alloc_ = end;
  end_.store(end, std::memory_order_release);
  return Status::OK();
}

Status LogFile::DropBefore(uint64_t pos) {
  pos = std::min(pos, end());
  const uint64_t cut = pos / kPage * kPage;
  if (cut > 0 &&
      fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(cut)) != 0) {
    return Status::FromErrno("freeing the first " + std::to_string(cut) + " bytes of " + path_,
                             errno);
  }
  if (pos > begin_.load(std::memory_order_relaxed)) begin_.store(pos, std::memory_order_release);
  return Status::OK();
}

void LogFile::Populate(uint64_t start, uint64_t need) {
  // Fault in the next pages of the window writable in one call, instead of
  // one read fault (zero fill of the reserved extent) plus one write fault per
  // page. Best effort: on kernels without MADV_POPULATE_WRITE the writes
  // simply fault as usual.
  //
  // kPopulateBytes ahead pays when small appends follow each other. When the
  // end has jumped past the populated pages since (direct writes of large
  // records, a compaction's copy batches), the pages ahead would mostly be
  // zeroed for nothing, since the next large write lands there with pwrite:
  // a tombstone after each 100 KiB value spent about 60 us zeroing 256 KiB
  // (deletes during a compaction of 100 KiB values ran at 12k/s). Then only
  // the pages this append needs are faulted in; so too between
  // ReleaseWindow() and ResumeLookahead(), while a compaction's sync runs.
  const bool single = start > populated_ || hold_lookahead_;
  const uint64_t from = std::max({populated_, window_start_, start / kPage * kPage});
  const uint64_t ahead = single ? kPage - 1 : kPopulateBytes;
  // Never past the reserved bytes: the window maps beyond the file's end.
  const uint64_t to = std::min({window_start_ + window_len_, alloc_ / kPage * kPage,
                                (std::max(need, from) + ahead) / kPage * kPage});
  if (to > from) {
    // The window is MADV_RANDOM (Reserve), so each fault would read its
    // page alone: a run of pages ahead is put into the page cache in one
    // batch first (reserved extents read as zeros without I/O), as
    // read-around did before, only for the pages asked for.
    if (!single) posix_fadvise(fd_, static_cast<off_t>(from), static_cast<off_t>(to - from),
                               POSIX_FADV_WILLNEED);
    madvise(window_ + (from - window_start_), to - from, MADV_POPULATE_WRITE);
  }
  populated_ = std::max(to, need);
  PublishWritable();
}

void LogFile::PublishWritable() {
  const uint64_t lo = window_ == nullptr ? 0 : std::max(released_, window_start_);
  writable_lo_.store(lo, std::memory_order_relaxed);
  writable_hi_.store(std::max(lo, populated_), std::memory_order_relaxed);
}

void LogFile::Unmap() {
  if (window_ != nullptr) munmap(window_, window_len_);
  window_ = nullptr;
  window_len_ = 0;
  populated_ = 0;
  PublishWritable();
}

void LogFile::Discard() {
  if (fd_ < 0) return;
  Unmap();
  UnmapReads();
  ::close(fd_);
  fd_ = -1;
}

Status LogFile::Close() {
  if (fd_ < 0) return Status::OK();
  Status st;
  if (alloc_ != end()) st = Truncate(end());
  Unmap();
  UnmapReads();
  if (st.ok()) st = Sync();
  ::close(fd_);
  fd_ = -1;
  return st;
}

// ---------------------------------------------------------------------------

LogReader::LogReader(const LogFile* file, uint64_t start, uint64_t limit, Reporter reporter)
    : file_(file), limit_(limit), reporter_(std::move(reporter)), offset_(start),
      valid_end_(start) {}

bool LogReader::Fill(size_t n) {
  const uint64_t want_end = std::min<uint64_t>(offset_ + n, limit_);
  if (offset_ >= buf_offset_ && want_end <= buf_offset_ + buf_len_) return true;
  const size_t len = static_cast<size_t>(
      std::min<uint64_t>(std::max<uint64_t>(n, kReadChunk), limit_ - offset_));
  if (buf_.size() < len) buf_.resize(len);
  size_t got = 0;
  status_ = file_->Read(offset_, len, buf_.data(), &got);
  if (!status_.ok()) return false;
  bytes_read_ += got;
  if (got < len) limit_ = offset_ + got;  // the file ends before the limit
  buf_offset_ = offset_;
  buf_len_ = got;
  return true;
}

bool LogReader::Next(RecordView* view, uint64_t* pos) {
  uint64_t bad_start = 0;
  const char* bad_reason = nullptr;
  while (offset_ < limit_) {
    if (!Fill(kRecordHeaderSize)) return false;
    if (offset_ >= limit_) break;  // the file ended before the limit
    size_t avail = static_cast<size_t>(buf_offset_ + buf_len_ - offset_);
    const char* p = buf_.data() + (offset_ - buf_offset_);
    const char* reason = "truncated record";
    ParseResult r = ParseRecord(p, avail, view, &reason);
    if (r == ParseResult::kIncomplete && offset_ + view->size <= limit_) {
      if (!Fill(view->size)) return false;
      avail = static_cast<size_t>(buf_offset_ + buf_len_ - offset_);
      p = buf_.data() + (offset_ - buf_offset_);
      r = ParseRecord(p, avail, view, &reason);
    }
    if (r == ParseResult::kOk && offset_ + view->size <= limit_) {
      if (bad_reason != nullptr) reporter_(bad_start, offset_ - bad_start, bad_reason);
      *pos = offset_;
      record_ = std::string_view(p, view->size);
      offset_ += view->size;
      valid_end_ = offset_;
      return true;
    }
    // Not a record here: remember where the bad range began, then try the
    // next byte. A quick look at the fixed header bytes rejects most offsets
    // without computing a checksum.
    if (bad_reason == nullptr) {
      bad_start = offset_;
      bad_reason = r == ParseResult::kOk ? "record extends past end of file" : reason;
    }
    ++offset_;
    while (offset_ + kRecordHeaderSize <= limit_) {
      if (!Fill(kRecordHeaderSize)) return false;
      const char* q = buf_.data() + (offset_ - buf_offset_);
      if (q[12] >= 1 && q[12] <= 3 && q[13] == static_cast<char>(kRecordKeySize) &&
          q[14] == 0 && q[15] == 0) {
        break;
      }
      if (q[12] == 0) {
        // A record's type byte is never zero: skip a run of zeros (such as
        // space reserved ahead of a crash) a word at a time.
        const char* end = buf_.data() + buf_len_;
        const char* z = q + 12;
        uint64_t word;
        while (z + 8 <= end && (std::memcpy(&word, z, 8), word == 0)) z += 8;
        while (z < end && *z == 0) ++z;
        // offset_ + 12 is now the first nonzero byte (or the buffer's end):
        // look at that candidate before moving on.
        offset_ += static_cast<uint64_t>(z - (q + 12));
        continue;
      }
      ++offset_;
    }
    if (offset_ + kRecordHeaderSize > limit_) offset_ = limit_;
  }
  if (bad_reason != nullptr && limit_ > bad_start) {
    reporter_(bad_start, limit_ - bad_start, bad_reason);
  }
  return false;
}

}  // namespace flatkv::engine
