// ChainLog: a chain member's write-ahead log, <storage.path>/CHAINLOG.
//
// Every replicated write a member applies is appended here first, in
// sequence order, and under storage.sync: always made durable with one
// fdatasync per batch before the member applies, acknowledges or passes
// on any write of the batch. The engine underneath then runs as
// storage.sync: interval: one log append and one fdatasync stand in for a
// group commit per data file (a batch of random keys touches most of a
// segment's 16 data files; each would need its own fdatasync).
//
// The log also carries the member's position (the last applied (epoch,
// seq)) and whether its store is intact (holds every write it applied: a
// wipe for a snapshot clears it until the member registered again), in
// state records. A restart replays the entries after the last state
// record into the store: replicated writes are idempotent assignments, so
// replaying a write the store already holds is harmless, and the position
// is that of the last entry. So the position never claims more than the
// store holds, and never less than it holds either (a member that claimed
// less could keep a write its chain dropped: chain.h, catch-up).
//
// Reset() starts a new log holding one state record (a checkpoint), once
// the store durably holds everything before: when the log grows past a
// limit, when the member registers, at a clean stop.
//
// Format: records of [u32 length of the body][u32 masked crc32c of the
// body][body], little-endian; a body is a type byte and its fields:
//   'S' state: i64 epoch, u64 seq, u8 intact
//   'E' entry: i64 epoch, u64 seq, u32 key count, u64 keys..., op bytes
// A torn or corrupt record ends the log (a crash mid-append): it and
// anything after it are cut off when the log is opened.
//
// Thread safety: none; the replicator's loop thread owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"
#include "partition/chain.h"

namespace flatkv::server {

class ChainLog {
 public:
  struct State {
    partition::ChainPosition position;
    bool intact = false;
  };

  // Opens the log at "path", creating it (with a not-intact state at (0,
  // 0)) if missing. *state: its last state record; *entries: the entries
  // after it, in order, to replay.
  static Status Open(const std::string& path, State* state,
                     std::vector<partition::ChainEntry>* entries,
                     std::unique_ptr<ChainLog>* log);
  ~ChainLog();

  // Appends the entries (to the OS; Sync() makes them durable).
  Status Append(const std::vector<partition::ChainEntry>& entries);
  // fdatasync, if anything was appended since the last.
  Status Sync();
  bool dirty() const { return dirty_; }
  // A new log holding only "state", written beside and renamed over this
  // one, both synced. The store must durably hold every write before.
  Status Reset(const State& state);
  // Bytes in the log now.
  uint64_t bytes() const { return size_; }

  ChainLog(const ChainLog&) = delete;
  ChainLog& operator=(const ChainLog&) = delete;

 private:
  ChainLog(std::string path, int fd, uint64_t size);
  Status Write(const std::string& records);

  const std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  bool dirty_ = false;
};

}  // namespace flatkv::server
