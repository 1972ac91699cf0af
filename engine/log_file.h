// LogFile is one append-only data file of a flat table. Records (record.h) are
// appended at the logical end; nothing is ever rewritten in place.
//
// Writes go through a shared mapping of space reserved ahead with fallocate(),
// so a small put is a memcpy into the page cache, with no system call, and survives
// a killed process. The reservation also turns a full disk into an ENOSPC from
// fallocate (a NoSpace status) instead of a SIGBUS on a mapped page. Records of
// kDirectWriteBytes or more are written with pwritev instead, which is cheaper
// than faulting in their pages one by one.
//
// Reads of a range that lies within one 4 KiB page go through read-only
// mappings of the file (MappedRange), so a get whose record is in the page
// cache makes no system call; everything else uses pread(). Both see the
// writes through the shared page cache. The read mappings cover the file in
// fixed chunks of kReadChunkBytes: each chunk reserves its address range once
// (PROT_NONE, no memory) and maps the file into it in place, only up to the
// file's current size on disk (written or fallocated bytes), growing as the
// file grows, so a read never touches a page past the end of the file (no
// SIGBUS) and an address handed to a reader stays valid until Close() or
// Discard(). The mappings are MADV_RANDOM: a miss faults in exactly the one
// page the record lies in, which keeps a get at one disk read. A range that
// spans two pages would be two faults when neither is cached, so a get
// (ReadForGet) reads it with one pread() unless the file's recent reads
// found their pages cached (SpanReadPolicy); then through the mapping too.
//
// On disk, the file may be longer than its logical end while open (the
// reserved tail is zeros). Close() and recovery truncate it to the end.
//
// Thread safety: Append(), Sync() and Truncate() need external
// synchronization (the table's per-file mutex). Read(), MappedRange(),
// ReadForGet() and end() may be called concurrently with Append() and Sync(), for positions
// below end(). Truncate(), Close() and Discard() drop the read mappings: no
// reader may be inside the file then (the Store's Guard/SynchronizeReaders
// ensure it; recovery truncates before any reader exists).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "engine/record.h"
#include "engine/status.h"

struct iovec;

namespace flatkv::engine {

// fsync of a directory: makes the names created or renamed in it durable.
Status SyncDirectory(const std::string& dir);

// How a get reads a record that spans two pages: through the read mapping
// (no system call; but if neither page is cached, a fault and a disk read
// for each, where one pread reads both at once) or with pread. Decided from
// the reads' own times: a mapped span slower than kDiskReadNs had a page
// to read from disk, so the file goes back to pread at once; kCachedStreak
// preads in a row faster than that were served from the page cache, so it
// goes to the mapping. A store whose pages are cached thus reads spans
// without system calls, and one that is not keeps one disk read per get
// (but for the one get, per thread, that finds a page missing first).
// Thread-safe: relaxed atomics, a race costs one read done the other way.
class SpanReadPolicy {
 public:
  // Below any disk read seen here (a 4-8 KiB O_DIRECT read on this VM's
  // disk: 52 us at the 1st percentile); a pread of two cached pages takes
  // 1-3 us, a mapped touch of them well under one.
  static constexpr uint64_t kDiskReadNs = 20'000;
  static constexpr uint32_t kCachedStreak = 64;

  bool UseMapping() const { return mapped_.load(std::memory_order_relaxed); }
  // A span read through the mapping took "ns".
  void NoteMapped(uint64_t ns) {
    if (ns < kDiskReadNs) return;
    mapped_.store(false, std::memory_order_relaxed);
    streak_.store(0, std::memory_order_relaxed);
  }
  // A span read with pread took "ns".
  void NotePread(uint64_t ns) {
    if (ns >= kDiskReadNs) {
      streak_.store(0, std::memory_order_relaxed);
    } else if (streak_.fetch_add(1, std::memory_order_relaxed) + 1 >= kCachedStreak) {
      mapped_.store(true, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<bool> mapped_{false};
  std::atomic<uint32_t> streak_{0};
};

class LogFile {
 public:
  // A record of a page or more shares no page with the next one, so the
  // mapping's per-page work (populate, page_mkwrite, the release's TLB
  // flush) buys nothing over a pwritev's system call: at 4 KiB values,
  // 2-thread fills ran 1.6-2.3x faster this way and 1-thread ones the
  // same or better; at 1 KiB values a pwritev per record was 35-45 %
  // slower than the mapping (64 KiB measured worse).
  static constexpr size_t kDirectWriteBytes = 4 * 1024;
  // Read mappings (MappedRange) are made in chunks of this many bytes of the
  // file, each at a fixed address once reserved.
  static constexpr uint64_t kReadChunkBytes = 64ull << 20;
  static constexpr uint64_t kMapPage = 4096;

  // Opens the file at "path", creating it empty if "create" and it is
  // missing. The logical end starts at the file's size.
  static Status Open(const std::string& path, bool create, std::unique_ptr<LogFile>* result);

  ~LogFile();

  // Appends one record; on success stores its position in *pos and its size
  // in *size. On failure the logical end is unchanged (a partial write past it
  // is harmless: it is overwritten by the next append and cut by recovery).
  Status Append(RecordType type, int64_t key, uint64_t timestamp, std::string_view prefix,
                std::string_view value, uint64_t* pos, size_t* size);

  // Appends "records", one or more whole records already encoded and
  // checksummed (a compaction copies live records verbatim, in batches),
  // with one pwrite() after reserving the space; stores the position of
  // the first byte in *pos. On failure the logical end is unchanged, as
  // for Append(). The caller vouches for the bytes: they are not parsed.
  Status AppendEncoded(std::string_view records, uint64_t* pos);

  // Reads up to n bytes at pos into dst; *got is the number read (fewer only
  // at the end of the file). One pread() call unless the kernel returns short.
  Status Read(uint64_t pos, size_t n, char* dst, size_t* got) const;
  // Reads up to head_n + n bytes at pos: the first head_n into head, the
  // rest into dst (one preadv() unless the kernel returns short), so a
  // large record's value lands in the caller's string without a copy.
  // *got counts both.
  Status ReadSplit(uint64_t pos, char* head, size_t head_n, char* dst, size_t n,
                   size_t* got) const;

  // Returns the address of [pos, pos + n) in a read-only mapping of the file
  // when the range is non-empty, lies within "pages" consecutive pages (one
  // unless said) and below the file's size on disk; nullptr otherwise (read
  // it with Read()). Maps or extends
  // the chunk holding it on first use (under map_mu_). The bytes stay
  // readable until Close(), Discard() or Truncate(); they are the file's
  // current contents, so a concurrent Append() past end() may change bytes
  // past end() (callers read only below end()). No system call when the
  // chunk already covers the range.
  const char* MappedRange(uint64_t pos, size_t n, uint64_t pages = 1) const {
    if (n == 0 || (pos & (kMapPage - 1)) + n > pages * kMapPage) return nullptr;
    const uint64_t c = pos / kReadChunkBytes;
    const int b = 63 - __builtin_clzll(c + 1);
    const ReadChunk* blk = blocks_[b].load(std::memory_order_acquire);
    if (blk != nullptr) {
      const ReadChunk& ch = blk[c + 1 - (uint64_t{1} << b)];
      const uint64_t off = pos % kReadChunkBytes;
      if (off + n <= ch.valid.load(std::memory_order_acquire)) {
        return ch.base.load(std::memory_order_relaxed) + off;
      }
    }
    return MapSlow(pos, n, pages);
  }

  // A get's read of [pos, pos + n): *data = its address in the read mapping
  // when it lies within one page (MappedRange), or within two while
  // span_policy() says this file's pages are cached; otherwise one pread
  // into *buf, *data = buf->data(). *got as for Read(). A span read through
  // the mapping touches both pages before it returns, timed, to tell the
  // policy whether they were cached.
  Status ReadForGet(uint64_t pos, size_t n, std::string* buf, const char** data,
                    size_t* got) const;
  SpanReadPolicy& span_policy() const { return span_policy_; }

  // Bytes of the file currently mapped for reads (for tests and stats).
  uint64_t read_mapped_bytes() const { return read_mapped_.load(std::memory_order_relaxed); }

  // fdatasync: everything appended so far is durable when it returns OK.
  Status Sync();
  // Starts writing back what is dirty in the page cache (sync_file_range
  // SYNC_FILE_RANGE_WRITE), without waiting for it and without the
  // metadata: a later Sync() then has less to wait for. A hint only: it
  // makes nothing durable, and an I/O error shows at that Sync().
  void StartWriteback();
  // Drops the writable window's page mappings (the pages written behind the
  // end and the ones populated ahead of it; they stay in the page cache), so
  // the Sync() that follows writes them back without write-protecting each
  // one (a TLB shootdown per page, 7 % of a compaction of string keys, whose
  // 16 files each held up to 512 KiB mapped). The next append faults in
  // what it needs again, and until ResumeLookahead() only that: appends
  // made while the sync runs would otherwise populate kPopulateBytes ahead,
  // dirty and mapped writable, for the sync to write back and write-protect
  // (two thirds of a string compaction's fdatasync was those shootdowns;
  // its sync phase took 47 ms on average, 27 ms with this). Caller: as for
  // Append.
  void ReleaseWindow();
  void ResumeLookahead();

  // Sets the logical end to "end" and the file's size to match, dropping
  // reserved space and anything past it. Used by recovery and Close().
  Status Truncate(uint64_t end);

  // Unmaps, truncates to the logical end and closes. Idempotent.
  // Closes without truncating or syncing: for a file about to be deleted.
  void Discard();
  Status Close();

  uint64_t end() const { return end_.load(std::memory_order_acquire); }
  // Records live in [begin(), end()): the bytes before begin() were given
  // back to the file system (a head cleaning, FlatTable::CleanHead) and
  // read as zeros. 0 until DropBefore().
  uint64_t begin() const { return begin_.load(std::memory_order_acquire); }
  // Frees the file's bytes before "pos" (<= end()): sets begin() to pos and
  // punches a hole over the whole pages below it (FALLOC_FL_PUNCH_HOLE,
  // keeping the file's size, so positions stay where they are). The
  // caller has made sure nothing will read below pos again (no reader is
  // inside that range, and every record there is garbage or copied past
  // it durably). Calling it again with the same pos punches again (after a
  // crash between persisting the head and punching, recovery does so).
  Status DropBefore(uint64_t pos);
  // Size of the file on disk (reserved space included).
  uint64_t allocated() const { return alloc_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

 private:
  LogFile(std::string path, int fd, uint64_t size);

  // Makes room for n bytes at end_ in the writable window.
  Status Reserve(size_t n);
  // Reserves (fallocate) the file up to at least need_end, a step ahead
  // (an eighth of the file, at most max_step and a thousandth of the free
  // space), or exactly what is needed when the disk lacks the step.
  Status ReserveAhead(uint64_t need_end, uint64_t max_step = kMaxReserveStep);
  static constexpr uint64_t kMaxReserveStep = 8ull << 20;
  Status WriteDirect(RecordType type, int64_t key, uint64_t timestamp, std::string_view prefix,
                     std::string_view value, size_t size);
  // Writes iov (size bytes in all) at end_ with pwritev, reserving first.
  Status WriteAtEnd(iovec* iov, int cnt, size_t size);
  void Unmap();
  // Faults in the window's pages for an append of [start, need), and more
  // ahead when appends through the window follow each other.
  void Populate(uint64_t start, uint64_t need);

  // One chunk of the read mappings. base is set once (the reservation,
  // before valid turns nonzero); valid only grows until UnmapReads().
  struct ReadChunk {
    std::atomic<char*> base{nullptr};  // kReadChunkBytes reserved, mapped in front
    std::atomic<uint64_t> valid{0};    // bytes of the chunk readable at base
    uint64_t mapped = 0;               // GUARDED_BY(map_mu_): page-aligned extent mapped
    bool broken = false;               // GUARDED_BY(map_mu_): a map failed; pread only
  };
  const char* MapSlow(uint64_t pos, size_t n, uint64_t pages) const;
  // Unmaps every read chunk. Only with no reader inside the file.
  void UnmapReads();

  const std::string path_;
  int fd_;
  std::atomic<uint64_t> end_;  // logical end: records live in [begin_, end_)
  std::atomic<uint64_t> begin_{0};
  // File size on disk, >= end_. Written by the appender (under its table's
  // file mutex); read by anyone (the Store's space accounting).
  std::atomic<uint64_t> alloc_;
  char* window_ = nullptr;     // writable mapping of [window_start_, +window_len_); the file ends at alloc_
  uint64_t window_start_ = 0;
  uint64_t window_len_ = 0;
  uint64_t released_ = 0;      // window pages below this were dropped from RSS
  uint64_t populated_ = 0;     // window pages below this are faulted in
  bool hold_lookahead_ = false;  // ReleaseWindow until ResumeLookahead
  // What the window may hold mapped writable, [lo, hi): published by the
  // writer for StartWriteback, which leaves those pages to Sync(). Writing
  // back a page mapped writable write-protects it (a TLB shootdown to every
  // CPU the process runs on, one page at a time) and the appender faults it
  // writable again. Relaxed: a stale view only costs such a shootdown.
  std::atomic<uint64_t> writable_lo_{0};
  std::atomic<uint64_t> writable_hi_{0};
  void PublishWritable();

  // Read chunk c lives in block b = floor(log2(c + 1)), at index
  // c + 1 - 2^b: block b holds 2^b chunks and is allocated (under map_mu_)
  // when the file first grows into it, so 64 blocks cover any file.
  mutable std::atomic<ReadChunk*> blocks_[64] = {};
  mutable std::mutex map_mu_;  // creates and extends read mappings
  mutable std::atomic<uint64_t> read_mapped_{0};
  mutable SpanReadPolicy span_policy_;
};

// LogReader walks the records of a log from an offset, verifying each. A bad
// record (torn, checksum mismatch, garbage) is reported and skipped: the reader
// resynchronizes by searching forward for the next valid record, so one bad
// record never hides the ones after it. Bytes after the last valid record
// (a torn tail, or reserved zeros) are reported once as a tail.
class LogReader {
 public:
  // Called for each skipped range: [offset, offset + bytes) and why.
  using Reporter = std::function<void(uint64_t offset, uint64_t bytes, const char* reason)>;

  // Reads [start, limit) of "file".
  LogReader(const LogFile* file, uint64_t start, uint64_t limit, Reporter reporter);

  // Stores the next valid record in *view (valid until the next call) and its
  // position in *pos and returns true; returns false at the end or on an I/O
  // error (see status()).
  bool Next(RecordView* view, uint64_t* pos);

  // Calls fn(key) for each of up to n records after the one Next()
  // returned last, as far as they are in the reader's buffer already,
  // from their headers alone (no checksum, no I/O): hints for prefetching
  // what the next calls will need, never to be trusted.
  template <typename Fn>
  void PeekKeys(size_t n, Fn fn) const {
    const char* p = record_.data() + record_.size();
    const char* end = buf_.data() + buf_len_;
    for (size_t i = 0; i < n && end - p >= static_cast<ptrdiff_t>(kRecordHeaderSize); ++i) {
      uint32_t value_size, reserved;
      std::memcpy(&value_size, p + 4, 4);  // little-endian, as FORMAT.md says
      std::memcpy(&reserved, p + 8, 4);
      const uint64_t size = uint64_t{kRecordHeaderSize} + value_size + kRecordKeySize + reserved;
      if (static_cast<uint64_t>(end - p) < size) return;
      int64_t key;
      std::memcpy(&key, p + kRecordHeaderSize + value_size, 8);
      fn(key);
      p += size;
    }
  }

  // The bytes of the record Next() returned last, exactly as on disk
  // (header, value, key and any padding; its checksum verified), valid
  // until the next call. Empty before the first record.
  std::string_view record() const { return record_; }

  // Offset just past the last valid record returned (start if none).
  uint64_t valid_end() const { return valid_end_; }
  // Offset of the first byte not yet consumed (use as a resume point).
  uint64_t offset() const { return offset_; }
  uint64_t bytes_read() const { return bytes_read_; }
  const Status& status() const { return status_; }

 private:
  // Ensures buf_ holds [offset_, offset_ + n) or everything up to limit_.
  bool Fill(size_t n);

  const LogFile* file_;
  uint64_t limit_;  // shrinks to the file's size if the file is shorter
  Reporter reporter_;
  uint64_t offset_;
  uint64_t valid_end_;
  uint64_t bytes_read_ = 0;
  std::string buf_;        // holds [buf_offset_, buf_offset_ + buf_len_)
  uint64_t buf_offset_ = 0;
  size_t buf_len_ = 0;
  std::string_view record_;  // the last record returned, inside buf_
  Status status_;
};

}  // namespace flatkv::engine
