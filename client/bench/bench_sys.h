// What flatkv-bench reads from the operating system around each workload:
// resident memory, bytes the process caused to be written to storage, bytes
// allocated under the database directory, and the directory set-up itself.
//
// All functions are Linux-specific (/proc) and thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "engine/status.h"

namespace flatkv::client {

// VmRSS of this process in bytes, from /proc/self/status; 0 if unreadable.
uint64_t ReadRssBytes();

// The `write_bytes` counter of /proc/self/io: bytes this process (all its
// threads) caused to be sent to the storage layer. Page-cache writes count
// when a page is first dirtied, so rewriting a page that is still dirty (an
// mmap'd index slot, say) counts once. Returns 0 if unreadable (some
// containers hide /proc/self/io); *ok tells the two apart when non-null.
uint64_t ReadIoWriteBytes(bool* ok = nullptr);

// Bytes allocated on disk under "dir": the sum of st_blocks * 512 over every
// file, recursively, without following symlinks. Sparse files count what they
// really use. Files that vanish during the walk (an LSM deleting compacted
// tables) are skipped.
uint64_t DiskBytes(const std::string& dir);

// Sizes of flat's data files under "dir" (files named data-*.log, found
// recursively in every segment and generation directory).
struct DataFileBytes {
  uint64_t size = 0;       // sum of st_size
  uint64_t allocated = 0;  // sum of st_blocks * 512
};
DataFileBytes ReadDataFileBytes(const std::string& dir);

// Makes "dir" ready for a run: creates it (and parents) if missing; with
// "fresh", removes everything inside it (never the directory itself, and never
// "/"). Sets *was_empty to whether the directory holds nothing afterwards.
// Returns InvalidArgument if "dir" exists and is not a directory, IOError if
// it cannot be created or cleared.
Status PrepareDir(const std::string& dir, bool fresh, bool* was_empty);

}  // namespace flatkv::client
