// LogFile is one append-only data file of a flat table. Records (record.h) are
// appended at the logical end; nothing is ever rewritten in place.
//
// Writes go through a shared mapping of space reserved ahead with fallocate(),
// so a small put is a memcpy into the page cache, with no system call, and survives
// a killed process. The reservation also turns a full disk into an ENOSPC from
// fallocate (a NoSpace status) instead of a SIGBUS on a mapped page. Records of
// kDirectWriteBytes or more are written with pwritev instead, which is cheaper
// than faulting in their pages one by one. Reads use pread(), which sees the
// mapped writes through the shared page cache.
//
// On disk, the file may be longer than its logical end while open (the
// reserved tail is zeros). Close() and recovery truncate it to the end.
//
// Thread safety: Append(), Sync() and Truncate() need external
// synchronization (the table's per-file mutex). Read() and end() may be
// called concurrently with everything, for positions below end().
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "engine/record.h"
#include "engine/status.h"

namespace flatkv::engine {

// fsync of a directory: makes the names created or renamed in it durable.
Status SyncDirectory(const std::string& dir);

class LogFile {
 public:
  static constexpr size_t kDirectWriteBytes = 64 * 1024;

  // Opens the file at "path", creating it empty if "create" and it is
  // missing. The logical end starts at the file's size.
  static Status Open(const std::string& path, bool create, std::unique_ptr<LogFile>* result);

  ~LogFile();

  // Appends one record; on success stores its position in *pos and its size
  // in *size. On failure the logical end is unchanged (a partial write past it
  // is harmless: it is overwritten by the next append and cut by recovery).
  Status Append(RecordType type, int64_t key, uint64_t timestamp, std::string_view prefix,
                std::string_view value, uint64_t* pos, size_t* size);

  // Reads up to n bytes at pos into dst; *got is the number read (fewer only
  // at the end of the file). One pread() call unless the kernel returns short.
  Status Read(uint64_t pos, size_t n, char* dst, size_t* got) const;

  // fdatasync: everything appended so far is durable when it returns OK.
  Status Sync();

  // Sets the logical end to "end" and the file's size to match, dropping
  // reserved space and anything past it. Used by recovery and Close().
  Status Truncate(uint64_t end);

  // Unmaps, truncates to the logical end and closes. Idempotent.
  // Closes without truncating or syncing: for a file about to be deleted.
  void Discard();
  Status Close();

  uint64_t end() const { return end_.load(std::memory_order_acquire); }
  // Size of the file on disk (reserved space included).
  uint64_t allocated() const { return alloc_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

 private:
  LogFile(std::string path, int fd, uint64_t size);

  // Makes room for n bytes at end_ in the writable window.
  Status Reserve(size_t n);
  Status WriteDirect(RecordType type, int64_t key, uint64_t timestamp, std::string_view prefix,
                     std::string_view value, size_t size);
  void Unmap();
  void Populate(uint64_t need);

  const std::string path_;
  int fd_;
  std::atomic<uint64_t> end_;  // logical end: records live in [0, end_)
  // File size on disk, >= end_. Written by the appender (under its table's
  // file mutex); read by anyone (the Store's space accounting).
  std::atomic<uint64_t> alloc_;
  char* window_ = nullptr;     // writable mapping of [window_start_, alloc_)
  uint64_t window_start_ = 0;
  uint64_t window_len_ = 0;
  uint64_t released_ = 0;      // window pages below this were dropped from RSS
  uint64_t populated_ = 0;     // window pages below this are faulted in
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
  Status status_;
};

}  // namespace flatkv::engine
