// FlatIndex maps each integer key of [kmin, kmin + slots) to the position of
// its newest record: slot (key - kmin) holds an item_bytes-wide little-endian
// value, 0 meaning absent (FlatTable decides what a nonzero value encodes).
// The slots live in one file mapped with mmap(); its first page is a header:
//
//   0         8     12    16      24      32    36     40    44    48
//   +---------+-----+-----+-------+-------+-----+------+-----+-----+----------
//   | magic   | ver | W   | kmin  | slots | N   | clean| crc | 0   | checkpoint
//   | FLATKVIX| 1   |4..8 | i64   | u64   | u32 | u32  | u32 |     | u64 x N ...
//   +---------+-----+-----+-------+-------+-----+------+-----+-----+----------
//   4088: dead_bytes u64 (an estimate of unreferenced log bytes)
//   4096: slot 0, slot 1, ... (W bytes each); file size = 4096 + slots * W
//
// crc is the masked CRC32C of the 4096-byte header with the crc field zeroed.
// checkpoint[i] is the offset in data file i up to which the slots are known
// to reflect every record; clean = 1 means the table was closed cleanly.
//
// The slot area starts sparse (a hole); a page is reserved with fallocate()
// the first time a slot in it is stored, so a full disk is a NoSpace status,
// never a SIGBUS, and a few scattered keys cost a few pages.
//
// Live-slot summary (memory only, not on disk): the index counts the nonzero
// slots of each group of kGroupSlots slots, of each chunk of kChunkSlots slots
// and of the whole index, so a key-order walk jumps over an empty group, chunk
// or index in one step (EmptySpan). Store() keeps the counts; Open() rebuilds
// them by reading only the allocated parts of the slot area (lseek SEEK_DATA /
// SEEK_HOLE), so it costs nothing for an empty index and one pass over the
// written pages otherwise. A page whose slots were all removed stays allocated
// on disk but counts zero. Group counts are allocated per chunk on the chunk's
// first live slot, so a sparse index costs 8 KiB per touched chunk plus
// 12 bytes per chunk of its range.
//
// Thread safety: Load() may run concurrently with everything (it uses
// relaxed atomic byte loads; callers detect torn values with a seqlock, see
// FlatTable). Store() may run concurrently with Store() on other slots.
// WriteHeader() and Sync() need external synchronization. The summary
// accessors may run concurrently with everything; see EmptySpan() for what
// a concurrent reader may rely on.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/status.h"

namespace flatkv::engine {

struct IndexParams {
  int64_t kmin = 0;
  uint64_t slots = 0;
  int item_bytes = 6;  // 4..8
  int data_files = 16;
};

class FlatIndex {
 public:
  static constexpr size_t kHeaderBytes = 4096;
  // The header's last 8 bytes hold the table's dead-byte estimate.
  static constexpr int kMaxDataFiles = (kHeaderBytes - 8 - 48) / 8;

  // Opens the index at "path". With "create", a missing file is created empty
  // (all slots absent, checkpoints 0, clean). Returns NotFound if the file is
  // missing and !create, and Corruption if the header is damaged, its CRC or
  // parameters do not match "params", or the file size is wrong.
  static Status Open(const std::string& path, const IndexParams& params, bool create,
                     std::unique_ptr<FlatIndex>* result);

  ~FlatIndex();

  // Slots per summary group (3 KiB of slots at the default width of 6) and
  // per chunk (4096 groups).
  static constexpr uint64_t kGroupSlots = 512;
  static constexpr uint64_t kChunkSlots = kGroupSlots * 4096;

  uint64_t Load(uint64_t slot) const;
  // Starts loading the slot's cache line (a hint: no fault, no effect on
  // what Load returns). A compaction's copy, which looks up the slots of the
  // records in log order (a random walk over the index), prefetches the
  // next ones while it checks the current one.
  void Prefetch(uint64_t slot) const {
    if (slot < params_.slots) __builtin_prefetch(slots_ + slot * params_.item_bytes);
  }
  // Stores "value" (< 2^(8*item_bytes)) into the slot and updates the live
  // counts; NoSpace if the page holding it cannot be reserved (the slot and
  // the counts are unchanged then). Two Store() calls on the same slot must
  // not run concurrently (FlatTable writes a slot under its file's mutex).
  Status Store(uint64_t slot, uint64_t value);
  // Reserves the page(s) holding "slot" (what Store() does first), so a
  // writer can learn of a full disk before it appends the record the slot
  // will point at: NoSpace then, and nothing changed. A later Store() of
  // the slot cannot fail.
  Status Reserve(uint64_t slot);

  // Number of nonzero slots in the whole index.
  uint64_t LiveSlots() const { return live_.load(std::memory_order_relaxed); }
  // The size of the largest aligned region holding "slot" that has no
  // nonzero slot: slots() for the whole index, else kChunkSlots, else
  // kGroupSlots, else 0 (the slot's group holds a live slot). The region is
  // [slot - slot % span, min(that + span, slots())). A slot that was nonzero
  // before this call began and is not zeroed meanwhile is never inside a
  // region reported empty (counts rise before a slot becomes nonzero and
  // fall after it becomes zero). Does no I/O.
  uint64_t EmptySpan(uint64_t slot) const;

  bool clean() const { return clean_; }
  const std::vector<uint64_t>& checkpoints() const { return checkpoints_; }

  // Rewrites the header with these values (and the dead-byte estimate last
  // given to set_dead_bytes) and makes it durable (msync).
  Status WriteHeader(bool clean, const std::vector<uint64_t>& checkpoints);
  // Bytes of the data files no longer referenced (an estimate kept by the
  // table for compaction), persisted by the next WriteHeader().
  uint64_t dead_bytes() const { return dead_bytes_; }
  void set_dead_bytes(uint64_t v) { dead_bytes_ = v; }
  // Makes every stored slot durable (msync of the slot area).
  Status Sync();
  // Sets every slot to absent (used before rebuilding from the logs).
  Status Clear();

  const IndexParams& params() const { return params_; }
  const std::string& path() const { return path_; }

  FlatIndex(const FlatIndex&) = delete;
  FlatIndex& operator=(const FlatIndex&) = delete;

 private:
  FlatIndex(std::string path, int fd, const IndexParams& params, char* base, size_t len);
  Status ReadHeader();
  Status ReservePage(uint64_t page);
  // Writes the slot's bytes (its pages already reserved).
  void StoreRaw(uint64_t slot, uint64_t value);
  // Counts the nonzero slots of the allocated parts of the file (at Open).
  Status CountLiveSlots();
  // Adds the nonzero slots of [first, end) to the counts.
  Status CountRange(uint64_t first, uint64_t end);
  // Adds n live slots to the counts of the group holding "slot".
  void AddLive(uint64_t slot, uint64_t n = 1);
  void DropLive(uint64_t slot);
  void ResetLive();

  const std::string path_;
  int fd_;
  const IndexParams params_;
  char* const base_;  // mapping of the whole file
  const size_t len_;
  char* const slots_;
  bool clean_ = true;
  std::vector<uint64_t> checkpoints_;
  uint64_t dead_bytes_ = 0;
  // One bit per page of the slot area: reserved by this process already.
  std::unique_ptr<std::atomic<uint64_t>[]> reserved_;
  std::mutex reserve_mu_;  // serializes ReservePage's first reservation of a page
  // Live-slot summary: total, per chunk, and per group (an array of
  // kChunkSlots / kGroupSlots counts per chunk, allocated on first use and
  // freed by the destructor).
  std::atomic<uint64_t> live_{0};
  const uint64_t chunks_;
  std::unique_ptr<std::atomic<uint32_t>[]> chunk_live_;
  std::unique_ptr<std::atomic<std::atomic<uint16_t>*>[]> group_live_;
};

}  // namespace flatkv::engine
