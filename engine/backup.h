// Online backup: a consistent copy of a Store into a new directory while
// the store serves (flatkv admin backup).
//
// The copy is logical: a key-order scan of the integer keys and a hash-order
// scan of the string keys of the source, written in pages into a new Store
// with the source's options (so the same configuration opens it), closed
// cleanly, then renamed from DIR.partial to DIR. A standalone server started
// with storage.path=DIR opens it at once (a clean close needs no log replay),
// and it holds no garbage (as after a compaction).
//
// What it holds: every write the source had applied when Start() was called
// (a key is read once, with its newest value at that moment; a value is read
// whole and checked by its CRC, so it is never torn), and possibly writes
// applied later; a key removed after Start() may be absent. A caller with a
// write-back cache flushes it before Start(), so everything acknowledged
// before is in the store. A record failing its checksum is skipped and
// counted (corrupt_skipped), as a scan does.
//
// Thread safety: all methods may be called from any thread. One copy runs at
// a time, on a thread of its own; the source must outlive the Backup (the
// destructor stops a running copy and removes its partial directory).
#pragma once

#include "engine/status.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace flatkv::engine {

class Store;

struct BackupStatus {
  bool running = false;
  double percent = 0;           // of bytes_total, 100 once complete
  uint64_t bytes_done = 0;      // key and value bytes copied
  uint64_t bytes_total = 0;     // the source's live bytes at the start (an estimate)
  uint64_t keys_done = 0;       // integer and string keys copied
  uint64_t corrupt_skipped = 0; // records skipped for a bad checksum
  std::string path;             // DIR of the current or last backup
  bool complete = false;        // the last backup finished: DIR holds it
  std::string last_error;       // empty unless the last backup failed
};

class Backup {
 public:
  explicit Backup(const Store* source);
  ~Backup();

  // Starts copying the source into "dir" (an absolute path whose parent
  // exists, and that does not exist yet) at most "mb_per_sec" MB/s of keys
  // and values read (0 = unlimited); returns at once. InvalidArgument for a
  // relative path or an existing "dir" (or DIR.partial), Busy if a backup
  // is running.
  Status Start(const std::string& dir, uint32_t mb_per_sec);

  BackupStatus GetStatus() const;

  // Stops a running copy (its partial directory is removed) and waits.
  void Stop();

  Backup(const Backup&) = delete;
  Backup& operator=(const Backup&) = delete;

 private:
  void Run(std::string dir, uint32_t mb_per_sec);
  Status Copy(const std::string& partial, uint32_t mb_per_sec);
  // Sleeps so that bytes_done stays within mb_per_sec since "start";
  // false if stopped meanwhile.
  bool Throttle(uint32_t mb_per_sec, uint64_t start_ns);

  const Store* const source_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bytes_done_{0};
  std::atomic<uint64_t> keys_done_{0};
  std::atomic<uint64_t> corrupt_skipped_{0};
  mutable std::mutex mu_;
  std::thread thread_;           // GUARDED_BY(mu_)
  bool running_ = false;         // GUARDED_BY(mu_)
  bool complete_ = false;        // GUARDED_BY(mu_)
  uint64_t bytes_total_ = 0;     // GUARDED_BY(mu_)
  std::string path_;             // GUARDED_BY(mu_)
  std::string last_error_;       // GUARDED_BY(mu_)
};

}  // namespace flatkv::engine
