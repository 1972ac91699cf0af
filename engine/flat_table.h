// FlatTable is one flat index plus N append-only data files (paper §2.3):
// key k of [kmin, kmin + slots) lives in data file (k - kmin) mod N and slot
// (k - kmin) of the index holds its newest record's position.
//
// A slot value v != 0 encodes ((pos << hint_bits) | size_class) + 1, where
// size_class bounds the record's size so a get reads the whole record with a
// single pread(): 8 bits (within 1.125x) for index_item_bytes 6..8, 6 bits
// (within 1.5x) for 5. With 4-byte slots there is no hint: a get reads 4 KiB
// and, for a larger record, a second time.
//
// Thread safety (see CONCURRENCY.md):
//  - Each data file has a mutex; Put/Remove/Append hold the key's file mutex,
//    so writes to one file are serialized in log order and writes to
//    different files run in parallel.
//  - Readers take no lock. Slots of file i are written only under file i's
//    mutex and guarded by file i's seqlock, so a reader never sees a torn
//    slot; it then reads the record with pread() and verifies its checksum.
//  - With SyncMode::kAlways, a writer appends, queues its slot update and
//    waits; one writer per file (the leader) runs fdatasync for everyone
//    queued and then applies the queued slot updates in log order, so a
//    reader never sees a write that is not yet durable.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/flat_index.h"
#include "engine/log_file.h"
#include "engine/options.h"
#include "engine/status.h"
#include "engine/store.h"

namespace flatkv::engine {

// Counters shared by the tables of a store.
struct EngineCounters {
  std::atomic<uint64_t> bytes_appended{0};
  std::atomic<uint64_t> fdatasyncs{0};
  std::atomic<uint64_t> recovery_bytes_scanned{0};
  std::atomic<uint64_t> recovery_records{0};
  std::atomic<uint64_t> corrupt_records{0};
  std::atomic<uint64_t> index_rebuilds{0};
  std::atomic<uint64_t> data_files_open{0};
  std::atomic<uint64_t> segment_opens{0};
  std::atomic<uint64_t> segment_closes{0};
  std::atomic<uint64_t> scan_slots_visited{0};
  std::atomic<uint64_t> scan_regions_skipped{0};
  // Full disk (Store::NoteWrite): writes that failed with NoSpace, whether
  // the last write failed so, and that failure's message.
  std::atomic<uint64_t> no_space_errors{0};
  std::atomic<bool> disk_full{false};
  std::atomic<uint64_t> appended_when_full{0};  // Store::WriteProgress() when it was set
  std::atomic<uint64_t> no_space_at_us{0};      // NowMicros() of the last NoSpace
  std::atomic<uint64_t> no_space_logged_us{0};  // and of the last one logged
  // Writes that waited for the compactor (Store::WaitForCompactor).
  std::atomic<uint64_t> write_stalls{0};
  std::atomic<uint64_t> write_stall_us{0};
  std::mutex no_space_mu;
  std::string no_space_reason;  // GUARDED_BY(no_space_mu)
};

struct TableParams {
  std::string dir;        // the table's directory
  IndexParams index;      // range, slot width, data file count
  SyncMode sync = SyncMode::kNone;
  uint32_t max_value_bytes = 64u << 20;
  // What a live record that fails its checksum becomes when compaction
  // copies the table (the string table: a damaged bucket, string_keys.h).
  // Without one, that compaction fails and the record stays where it is,
  // read as Corruption until it is repaired or overwritten: never dropped,
  // which would make an acknowledged key read as absent.
  std::optional<std::string> lost_value;
};

// How a compaction rewrites the values it moves to the successor (the string
// table compacts its buckets).
struct CopyTransform {
  // Rewrites a value, or returns false to drop the key.
  std::function<bool(std::string*)> rewrite;
  // Optional: whether rewrite would leave this value exactly as it is. Such
  // a whole record is copied verbatim, in a batch, without being decoded.
  std::function<bool(std::string_view)> keeps;
  explicit operator bool() const { return static_cast<bool>(rewrite); }
};

class FlatTable {
 public:
  // Opens the table in params.dir (creating it if "create"). See Store::Open
  // for what recovery does. The table's META file wins over params for the
  // slot width and data file count of an existing table.
  static Status Open(const TableParams& params, bool create, EngineCounters* counters,
                     std::unique_ptr<FlatTable>* result);
  ~FlatTable();

  // Store's methods, for keys inside this table (callers check the range).
  Status Put(int64_t key, std::string_view value);
  // Store::PutBatch for pairs[i], i in "items", all keys in this table.
  Status PutBatch(const std::vector<KeyValueRef>& pairs, const std::vector<uint32_t>& items);
  Status Get(int64_t key, std::string* value) const;
  bool Contains(int64_t key) const;
  // Starts loading the key's index slot (a hint; no effect otherwise).
  void PrefetchSlot(int64_t key) const {
    index_->Prefetch(static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin()));
  }
  Status Remove(int64_t key, bool* existed);
  // If the key's value is at most max_bytes, reads it into *value and sets
  // *small (one read for a whole value; one per part for a value built by
  // Append()); otherwise only sets *small = false, reading nothing when the
  // size hint already says it is larger. While compacting, reads as Get()
  // does. NotFound if the key is absent, with a fixed message (the
  // string-key writes ask it for every put and never show it).
  Status ReadIfSmall(int64_t key, size_t max_bytes, std::string* value, bool* small) const;
  // For a value built by Append() whose reading fails its checksum: the
  // parts after the last bad one, concatenated (what survives of the
  // newest appends), in *suffix; empty if the newest record is bad itself.
  // NotFound if the key is absent.
  Status ReadGoodSuffix(int64_t key, std::string* suffix) const;
  // Sizes of a value after Append(): all of it, and its base part (the
  // value as last written whole); total - base bytes arrived by appends.
  struct AppendInfo {
    uint64_t total = 0;
    uint64_t base = 0;
  };
  Status Append(int64_t key, std::string_view value, AppendInfo* info = nullptr);

  // Key-order scan of this table's keys between "from" and "stop" (both
  // inclusive, in any order relative to the table's range: both are clamped
  // to it). Forward walks up from "from" to "stop" (stop >= from), reverse
  // down from "from" to "stop" (stop <= from); otherwise nothing is in range.
  // Adds pairs to *out until it holds "limit" pairs. *work is the caller's
  // allowance: each slot read and each empty group, chunk or table jumped
  // over (FlatIndex::EmptySpan) spends one unit. If the limit is reached or
  // the allowance runs out before the range ends, sets *done = false and
  // *next to the first key of the range not yet looked at (inside the range);
  // otherwise sets *done = true and leaves *next alone. A record failing
  // its checksum is skipped (counted and logged by the read), its key added
  // to *corrupt when that is given.
  Status Scan(int64_t from, int64_t stop, bool reverse, size_t limit, uint64_t* work,
              std::vector<KeyValue>* out, int64_t* next, bool* done,
              std::vector<int64_t>* corrupt = nullptr) const;

  // Insertion-order scan of data file "file" from "offset" onward, then the
  // following files. Adds live records to *out up to "limit"; sets
  // *next_file/*next_offset to resume and *done when the table is finished.
  Status ScanLog(int file, uint64_t offset, size_t limit, std::vector<KeyValue>* out,
                 int* next_file, uint64_t* next_offset, bool* done) const;

  Status Sync();
  // Makes the slots durable and vouches for them in the index header
  // (checkpoints); "force" writes even when no file moved since the last
  // one (a head cleaning's copies under sync: always move no checkpoint).
  Status Checkpoint(bool force = false);
  // LogFile::StartWriteback on every data file: a compaction calls it on
  // the new generation as it copies, so the Sync() that must finish before
  // the switch (while writes wait on the disk bound) finds little left.
  void StartWriteback();
  // LogFile::ReleaseWindow on every data file, each under its mutex: a
  // compaction calls it on the new generation right before the Sync() that
  // must finish before the switch.
  void ReleaseWindows();
  // LogFile::ResumeLookahead on every data file, each under its mutex: once
  // that Sync() has returned.
  void ResumeLookahead();
  Status Close();
  // Closes without syncing or marking the index clean: for a table whose
  // files are deleted next (a compaction's retired or undone generation),
  // which Close() would fdatasync for nothing (17 syncs per compaction).
  void Discard();

  // ---- Online compaction (driven by Store; see compactor.cc) ----
  // Log bytes in the data files, and an estimate of those no longer
  // referenced (overwritten or removed values, tombstones, merged parts).
  uint64_t TotalBytes() const;
  // What the data files hold on disk: TotalBytes() plus the space each
  // reserved ahead of its end (LogFile::Reserve).
  uint64_t AllocatedBytes() const;
  // What the store's disk bound charges the table (Store::PickAutomatic):
  // TotalBytes() plus each data file's space reserved ahead up to
  // kChargedReserve of its bytes, the share the reservation keeps to once a
  // file grows. Beyond that a reservation is a fixed cost of an open file
  // (a new file's first page, a large record's step) that no compaction
  // gives back, so a table without garbage is charged at most 1 +
  // kChargedReserve times its live bytes.
  uint64_t ChargedBytes() const;
  static constexpr double kChargedReserve = 1.0 / 8;
  uint64_t DeadBytes() const { return dead_bytes_.load(std::memory_order_relaxed); }
  // Live keys in the whole table, and (an estimate, for progress reports)
  // in [from, stop] clamped to the table: counted from the index alone (no
  // record read; empty regions skipped), extrapolated from the first
  // "budget" slots looked at when the range is larger.
  uint64_t LiveKeys() const;
  uint64_t LiveKeysIn(int64_t from, int64_t stop, uint64_t budget) const;
  // Log bytes a compaction copied into this table (PutCopy) since it opened:
  // TotalBytes() - CopiedBytes() of a successor are the writes it took.
  uint64_t CopiedBytes() const { return copied_bytes_.load(std::memory_order_relaxed); }

  // Makes "next" (an empty or partly filled table over the same range) this
  // table's successor. From then on every write takes this table's per-file
  // mutex and goes to "next"; removes reach both tables; gets try "next"
  // first. Stores in *ends the end of each data file: the part to copy.
  // "transform" (optional) rewrites each value moved to the successor, or
  // returns false to drop the key: the string table compacts buckets so.
  // With "track", every write forwarded to a fresh successor is noted, so
  // AbortCompaction can undo the compaction.
  void BeginCompaction(FlatTable* next, std::vector<uint64_t>* ends,
                       CopyTransform transform = {}, bool track = false);
  // Undoes BeginCompaction (a copy that failed midway, e.g. for a full
  // disk): under every file mutex, writes each value a write forwarded to
  // the successor back into this table (kNoWait: the successor holds them
  // durably until the caller has synced this table and only then deletes
  // it), then detaches the successor. The caller syncs this table, waits for
  // readers of the successor to drain and closes it. Busy if the compaction
  // was not tracked (a successor resumed after a restart); the error of a
  // failed write otherwise: the successor then stays attached and holds
  // every write, so nothing is lost.
  Status AbortCompaction();
  // Log bytes the writes forwarded to the successor added there, an upper
  // bound on what AbortCompaction writes (tombstones included).
  uint64_t ForwardedBytes() const {
    const FlatTable* next = successor();
    return next == nullptr ? 0 : next->TotalBytes() - std::min(next->TotalBytes(), next->CopiedBytes());
  }
  // Copies each record of data file "file" in [0, end) that is still live
  // here and absent from the successor, merging appended parts into one
  // record. Calls "progress" with the bytes read after each record; stops
  // with Busy if it returns false.
  Status CopyLive(int file, uint64_t end, const std::function<bool(uint64_t)>& progress);
  // CopyLive's second half: the live records of "file" below "end" that
  // the log reader did not meet ("seen", by slot / data_files).
  Status CopyUnseen(int file, uint64_t end, const std::vector<bool>& seen);

  // ---- Head cleaning: compaction in place (driven by Store; compactor.cc) ----
  // A data file is a log whose oldest part holds the most garbage. Cleaning
  // copies what is still live in a file's head to its end, then frees the
  // head (a hole punched in the file; positions do not move), so each round
  // copies only the live part of the oldest bytes instead of the whole
  // table. Three steps, each a precondition of the next:
  //  1. CleanHead per file: the copies, with their slots pointing at them;
  //  2. CommitHeads: the copies and the slots durable, then META's heads;
  //  3. DropHeads, once no reader can still hold a slot it loaded before
  //     step 1 (Store::SynchronizeReaders): the holes.
  // A crash or an error before step 2 leaves only duplicates (the copies),
  // garbage for the next round; after it, recovery starts each file at its
  // head and punches again.
  //
  // Whether a cleaning may run: no successor, no record it found unreadable
  // (the whole-table compaction deals with those: CopyUnseen), every data
  // file's end below kMaxCleanEnd (positions only grow; the whole-table
  // compaction starts them over, and with them the read mappings).
  bool CanCleanHead() const;
  static constexpr uint64_t kMaxCleanEnd = 64ull << 30;
  // Step 1 for data file "file": copies each record of [head, about
  // "target") that is live (or a part of a live appended value) to the end
  // and notes the new head, a record boundary at most "target", for
  // CommitHeads. Stops early at a record that fails its checksum (and
  // CanCleanHead turns false). "progress" as for CopyLive.
  Status CleanHead(int file, uint64_t target, const std::function<bool(uint64_t)>& progress);
  Status CommitHeads();
  // Step 3; an error (a file system that cannot punch holes) leaves the
  // bytes allocated but never read again.
  Status DropHeads();
  // Where the live records of data file "file" begin, and where the next
  // cleaning may end: its records appended and applied (sync: always
  // applies a write after its group's fdatasync).
  uint64_t Head(int file) const;
  uint64_t AppliedEnd(int file);

  // After the switch: the successor holds everything; this table forwards
  // all operations to it and is no longer consulted itself.
  void FinishCompaction() { successor_done_.store(true, std::memory_order_release); }
  FlatTable* successor() const { return successor_.load(std::memory_order_acquire); }
  const std::string& dir() const { return params_.dir; }

  // The Store's CLOCK bit (see store.h): every operation that finds this
  // table sets it; the sweep that closes idle tables clears it and closes
  // only tables it finds clear. The store is skipped when already set, so
  // the hot path only reads the cache line.
  void MarkUsed() const {
    if (!used_.load(std::memory_order_relaxed)) used_.store(true, std::memory_order_relaxed);
  }
  bool TakeUsed() const { return used_.exchange(false, std::memory_order_relaxed); }
  const TableParams& params() const { return params_; }

  int64_t kmin() const { return params_.index.kmin; }
  uint64_t slots() const { return params_.index.slots; }
  int data_files() const { return params_.index.data_files; }

  FlatTable(const FlatTable&) = delete;
  FlatTable& operator=(const FlatTable&) = delete;

 private:
  struct Pending {
    uint64_t slot;
    uint64_t value;
  };
  struct FileState {
    std::mutex mu;
    std::atomic<uint32_t> seq{0};          // seqlock over this file's slots
    std::atomic<LogFile*> log{nullptr};    // set once, before any slot points at it
    std::unique_ptr<LogFile> owner;        // GUARDED_BY(mu)
    std::condition_variable cv;            // group commit: a batch finished
    std::condition_variable more;          // group commit: the leader's batch grew
    bool syncing = false;                  // GUARDED_BY(mu): a leader is gathering or syncing
    bool gathering = false;                // GUARDED_BY(mu): the leader waits for writers
    size_t expected = 1;                   // GUARDED_BY(mu): writers seen by the last sync
    int64_t last_sync_ns = 0;              // GUARDED_BY(mu): how long it took
    uint64_t applied = 0;                  // GUARDED_BY(mu): slots reflect log [0, applied)
    std::vector<Pending> pending;          // GUARDED_BY(mu): queued slot updates, log order
    uint64_t queued = 0;                   // GUARDED_BY(mu): updates ever queued
    uint64_t dequeued = 0;                 // GUARDED_BY(mu): updates applied or failed
    Status error;                          // GUARDED_BY(mu): sticky after fdatasync fails
    std::atomic<bool> dirty{false};        // appended since the last Sync()
  };

  FlatTable(const TableParams& params, EngineCounters* counters);

  // Writes META via a temporary file and a rename; "durable" also fsyncs
  // the file and the directory (a new table leaves that to SyncLayout).
  static Status WriteMeta(const std::string& dir, const IndexParams& p, bool appends,
                          const std::vector<uint64_t>& heads, bool durable = true);
  Status OpenFiles(bool create);
  Status Recover(bool force_rebuild);
  Status Replay(int file, uint64_t from, bool rebuild, std::vector<uint64_t>* positions);
  std::string DataPath(int file) const;

  uint64_t EncodeSlot(uint64_t pos, size_t size) const;
  void DecodeSlot(uint64_t v, uint64_t* pos, size_t* guess) const;

  uint64_t ReadSlot(const FileState& fs, uint64_t slot) const;
  // The largest aligned region holding "slot" (as FlatIndex::EmptySpan) with
  // no live slot in this table nor in its successor, 0 if none.
  uint64_t EmptySpan(uint64_t slot) const;
  // Scan's read of one key: the successor's value first while compacting.
  Status ScanRead(uint64_t slot, KeyValue* kv) const;
  Status WriteSlot(FileState& fs, uint64_t slot, uint64_t value);
  uint64_t CurrentSlotLocked(const FileState& fs, uint64_t slot) const;

  Status EnsureWritable();
  // Calls a LogFile method on every open data file, each under its mutex.
  void ForEachLogLocked(void (LogFile::*call)());
  Status LogForWrite(FileState& fs, int file, LogFile** log);
  // What Write does under sync: always once the record is appended.
  enum class Durability {
    kWait,     // queue for group commit and wait until durable and visible
    kQueue,    // queue for group commit; the caller waits (a batch)
    kNoWait,   // visible at once (compaction copies, made durable as a
               // whole before the switch)
  };
  // Appends a record for "key" and makes it visible (and durable, per the
  // sync mode) with slot value EncodeSlot(pos) (or 0 for a tombstone).
  Status Write(FileState& fs, std::unique_lock<std::mutex>& lk, int file, int64_t key,
               RecordType type, std::string_view prefix, std::string_view value,
               Durability durability = Durability::kWait);
  // PutBatch's items that live in data file "file".
  Status PutFileBatch(int file, const std::vector<KeyValueRef>& pairs, const uint32_t* items,
                      size_t n);
  // What Write added to dead_bytes_ for a record of "size" bytes when it
  // died (its size hint's bound).
  uint64_t DeadEstimate(uint64_t size) const;
  // Estimated on-disk size of the record a slot value points at.
  uint64_t RecordBytesEstimate(uint64_t slot_value, size_t fallback) const;
  // Put without waiting for durability (see Write); used by CopyLive.
  Status PutCopy(int64_t key, std::string_view value);
  // A batch of records a compaction copies verbatim (CopyLive): their bytes
  // back to back, and per record its key and where it lies in the bytes.
  struct CopyBatch {
    struct Item {
      int64_t key;
      uint64_t slot_value;  // the old table's slot when the record was read
      uint32_t offset;      // in bytes
      uint32_t size;
    };
    std::string bytes;
    std::vector<Item> items;
    // Drops the items keep(item) refuses, moving the bytes of the rest
    // together, in order.
    template <typename Keep>
    void KeepIf(Keep keep) {
      size_t kept = 0, to = 0;
      for (const Item& item : items) {
        if (!keep(item)) continue;
        if (to != item.offset) std::memmove(bytes.data() + to, bytes.data() + item.offset, item.size);
        items[kept++] = {item.key, item.slot_value, static_cast<uint32_t>(to), item.size};
        to += item.size;
      }
      items.resize(kept);
      bytes.resize(to);
    }
  };
  // The successor's side of a batch: appends the records of "batch" that all
  // live in data file "file" here with one write and points their slots at
  // them, without waiting for durability (as PutCopy). The caller holds the
  // old table's mutex of that file and has checked every key is absent here.
  Status PutCopies(int file, const CopyBatch& batch);
  // CopyLive's flush: under the old table's file mutex, drops the records
  // no longer live here or no longer absent from the successor, then writes
  // the rest there (PutCopies). Leaves "batch" empty.
  Status FlushCopies(int file, CopyBatch* batch);
  Status WaitDurable(FileState& fs, std::unique_lock<std::mutex>& lk, uint64_t end);
  // CleanHead's flush: under the file's mutex, appends the batch's records
  // still live to the file's end and points their slots there.
  Status FlushHeadCopies(int file, CopyBatch* batch, uint64_t* dead, uint64_t* copied);
  // The first kAppend record of this table: META says so before it is
  // written, and head cleaning stops for good (CanCleanHead).
  Status NoteAppends();

  // Reads and verifies the record at "pos"; "buf" backs *view.
  Status ReadRecord(const LogFile* log, int64_t key, uint64_t pos, size_t guess,
                    std::string* buf, RecordView* view) const;
  Status ReadValue(const LogFile* log, int64_t key, uint64_t slot_value, std::string* out) const;
  // ReadValue's path for a large whole value (size hint >= kSplitReadBytes):
  // one preadv of the header into a local buffer and the rest into *out,
  // checked in place. false, with *out unchanged, if the record is not a
  // good kValue of "key" (the caller reads it again the general way, which
  // says what is wrong).
  bool ReadLargeValue(const LogFile* log, int64_t key, uint64_t pos, size_t guess,
                      std::string* out) const;
  Status Assemble(const LogFile* log, int64_t key, std::string_view newest,
                  std::string* out) const;
  Status ReadPayload(const LogFile* log, int64_t key, const AppendPart& part,
                     std::string* out) const;

  const TableParams params_;
  EngineCounters* const counters_;
  int hint_bits_ = 0;
  uint64_t pos_limit_ = 0;  // positions must stay below this
  std::unique_ptr<FlatIndex> index_;
  std::unique_ptr<FileState[]> files_;
  std::mutex header_mu_;                 // orders header writes (dirty mark, checkpoint, close)
  std::atomic<bool> dirty_marked_{false};
  // Creating a table or a data file syncs nothing (each fsync of a file or
  // directory cost a new segment milliseconds): the names and META become
  // durable in SyncLayout(), which runs before any data file's fdatasync,
  // so a durable record always has its table around it after an OS crash.
  // layout_changes_ counts creations (bumped once the file exists),
  // layout_synced_ the ones SyncLayout has covered.
  Status SyncLayout();
  std::mutex layout_mu_;                 // a leaf: one SyncLayout at a time
  std::atomic<uint64_t> layout_changes_{0};
  std::atomic<uint64_t> layout_synced_{0};
  bool layout_created_ = false;          // GUARDED_BY(layout_mu_): META and the
                                         // directory's own name still to sync
  std::atomic<uint64_t> dead_bytes_{0};
  std::atomic<uint64_t> copied_bytes_{0};
  std::atomic<FlatTable*> successor_{nullptr};  // set under every file mutex
  std::atomic<bool> successor_done_{false};
  CopyTransform transform_;  // set with successor_
  // Per data file, a bit per key of that file: a write was forwarded to the
  // successor (set under the file's mutex; null when not tracked).
  std::unique_ptr<std::vector<uint64_t>[]> forwarded_;
  void NoteForwardedLocked(int file, uint64_t slot);
  bool closed_ = false;                  // GUARDED_BY(header_mu_)
  // Head cleaning: META's heads (what recovery starts from) and whether an
  // appended value may exist; the heads a cleaning reached but has not
  // committed, and the garbage each frees once dropped.
  std::mutex meta_mu_;                   // orders META writes; after any file mutex
  std::vector<uint64_t> heads_;          // GUARDED_BY(meta_mu_)
  std::atomic<bool> may_have_appends_{true};
  std::vector<uint64_t> clean_to_;       // the compactor's only
  std::vector<uint64_t> clean_freed_;    // the compactor's only
  std::atomic<bool> clean_blocked_{false};
  mutable std::atomic<bool> used_{true};  // the CLOCK bit (MarkUsed)
};

}  // namespace flatkv::engine
