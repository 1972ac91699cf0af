// Store is the storage engine's public face: the flat tables (segments) of one
// key space under one directory. Each segment covers segment_keys consecutive
// keys of [key_min, key_max) and is created on the first write inside it.
//
//   Store ──owns──> FlatTable (one per segment) ──owns──> FlatIndex + LogFiles
//
// A Get costs at most one read system call for a present key and none for an
// absent one; a Put is one append to the key's data file. See FORMAT.md for the
// bytes on disk and CONCURRENCY.md for the lock order.
//
// Open tables are a bounded cache (EngineOptions::max_open_files): a table
// holds one descriptor and one mapping for its index plus one descriptor per
// data file. When an operation leaves more tables open than the budget
// allows, it closes (cleanly, like Close()) the tables no operation used
// since the last sweep (a CLOCK approximation of LRU); a closed table is
// reopened on its next use, which reads only its index header (it was closed
// cleanly). A table being compacted and the string-key table stay open.
//
// The sparse tier (EngineOptions::sparse_tier, sparse_tier.h): with it on, a
// write to a segment that has no flat table puts its key in the tier. Once
// a window of kDenseWindow keys around a written key holds kDenseKeys keys
// of the tier (a density the flat index spends at most ~400 bytes a key
// on), the segment is promoted: its keys are copied into a new flat table,
// made durable, the table is marked moved (kMovedMark in its home) and
// published, and the keys leave the tier. The segment's stripe of
// segment_mu_ is held exclusively meanwhile; every operation on a key of a
// segment without a flat table holds it shared, so it sees the segment
// whole in one place. On open, a table without the mark takes the tier's
// keys of its range (a promotion cut short), one with it drops them (they
// are stale copies). With the tier off, open moves every key it still
// holds into flat tables and removes it.
//
// Thread safety: every method may be called concurrently from any number of
// threads. Gets never block on each other and run in parallel with writes;
// writes to keys of different data files proceed in parallel; writes to one
// data file are serialized in log order.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <condition_variable>
#include <functional>
#include <vector>

#include "engine/options.h"
#include "engine/status.h"

namespace flatkv::engine {

class FlatTable;
class Room;
class SparseTier;
struct CopyTransform;
struct EngineCounters;
struct TableParams;

struct KeyValue {
  int64_t key = 0;
  std::string value;
};

// A pair whose value the caller owns (batch writes).
struct KeyValueRef {
  int64_t key = 0;
  std::string_view value;
};

struct StringKeyValue {
  std::string key;
  std::string value;
};

// Progress of online compaction (Store::GetCompactionStatus).
struct CompactionStatus {
  bool running = false;
  double percent = 0;         // of the current round, by log bytes read
  uint64_t bytes_done = 0;    // log bytes read in the current round
  uint64_t bytes_total = 0;   // log bytes to read in the current round
  uint64_t tables_compacted = 0;  // since open: whole-table compactions
  uint64_t heads_cleaned = 0;     // since open: rounds of compaction in place
  uint64_t bytes_reclaimed = 0;   // since open: log bytes before minus after
  std::string last_error;     // empty if the last compaction succeeded
};

// Counters the engine keeps; read with Store::GetStats(). Monotonic unless
// noted.
struct EngineStats {
  uint64_t segments = 0;            // flat tables, open or closed (current value)
  uint64_t segments_open = 0;       // of those, open now (current value)
  uint64_t segment_opens = 0;       // reopens of a table closed by the budget
  uint64_t segment_closes = 0;      // tables closed to stay within max_open_files
  uint64_t data_files_open = 0;     // data files with an open descriptor (current)
  uint64_t bytes_appended = 0;      // log bytes written by this process
  uint64_t fdatasyncs = 0;          // fdatasync calls on data files
  uint64_t recovery_bytes_scanned = 0;  // log bytes read by crash recovery/rebuild
  uint64_t recovery_records = 0;    // records applied to an index by recovery/rebuild
  uint64_t corrupt_records = 0;     // bad records found inside a log (torn tails
                                    // after a crash are expected and not counted)
  uint64_t buckets_damaged = 0;     // string-key buckets written anew with a
                                    // damaged mark (a write met a bad record)
  uint64_t index_rebuilds = 0;      // tables whose index was rebuilt from the logs
  uint64_t scan_slots_visited = 0;  // index slots read by key-order scans
  uint64_t scan_regions_skipped = 0;  // empty slot groups/chunks/segments they jumped
  uint64_t no_space_errors = 0;     // writes that failed for a full disk (NoSpace)
  uint64_t disk_full = 0;           // 1 while the last write failed so (current value)
  uint64_t write_stalls = 0;        // writes that waited for the compactor
                                    // (EngineOptions::compaction_disk_ratio)
  uint64_t write_stall_us = 0;      // and the microseconds they waited
  uint64_t string_filter_skips = 0;  // string-key gets and removes answered
                                     // "absent" by the bucket filter, no read
  uint64_t sparse_keys = 0;         // keys in the sparse tier, estimated (current)
  uint64_t sparse_promotions = 0;   // segments moved from the sparse tier to a flat table
};

class Store {
 public:
  // Opens (creating if needed) the store at options.path. A table closed
  // cleanly opens without reading its data files; after a crash only the log
  // tail past the table's checkpoint is replayed, and a missing or damaged
  // index is rebuilt from the data files. Returns InvalidArgument for bad
  // options, IOError/Corruption naming the file otherwise.
  static Status Open(const EngineOptions& options, std::unique_ptr<Store>* result);

  // Writes a checkpoint and closes every table cleanly (see Close()).
  ~Store();

  // Stores "value" under "key", replacing any previous value. An empty value
  // is a real value. Returns KeyOutOfRange outside [key_min, key_max),
  // ValueTooLarge beyond max_value_bytes, NoSpace/IOError if the append fails
  // (the store is unchanged then).
  Status Put(int64_t key, std::string_view value);

  // On a hit stores the value in *value and returns OK. If there is no entry
  // for "key", leaves *value unchanged and returns NotFound without any I/O
  // (a key of the sparse tier: after its bucket's filter, which sends about
  // 1 in 7 absent keys that share a bucket with another to one read).
  // Returns Corruption (never a wrong value) if the record fails its checksum.
  Status Get(int64_t key, std::string* value) const;
  // The checks every write makes before it touches anything, for callers
  // that acknowledge a write before it reaches the Store (the async cache):
  // KeyOutOfRange outside [key_min, key_max) (IOError once closed), and
  // ValueTooLarge over max_value_bytes.
  Status CheckKey(int64_t key) const;
  Status CheckValue(size_t size) const;
  // InvalidArgument for a string key over max_key_bytes (IOError once closed).
  Status CheckStringKey(std::string_view key) const;
  // Puts every pair, in order (a key given twice keeps its last value), as
  // one batch: each table's data file takes its lock once, and with
  // sync: always one fdatasync per data file covers the batch. Every key
  // and value is checked first: KeyOutOfRange or ValueTooLarge writes
  // nothing. An I/O error stops the batch: pairs before it may be written.
  Status PutBatch(const std::vector<KeyValueRef>& pairs);

  // OK if the key is present, NotFound otherwise. Never does I/O for a key
  // of a flat table; one of the sparse tier costs what Get does.
  Status Exists(int64_t key) const;

  // Removes "key". Sets *existed (if non-null) to whether it was present. A
  // tombstone is appended only if the key was present.
  Status Remove(int64_t key, bool* existed = nullptr);

  // Appends "value" to the key's current value (creating it if absent). Costs
  // O(|value|) bytes written, amortized, whatever the current value's size;
  // a key of the sparse tier has its value rewritten whole.
  Status Append(int64_t key, std::string_view value);

  // Key-order scan. Forward: keys >= from in ascending order; reverse: keys <=
  // from in descending order. Returns at most "limit" pairs in *out (cleared
  // first), possibly fewer, even none, with *done = false: one call does at
  // most kScanWork units of work (see below), so its cost follows the keys
  // it returns, never the empty key space it crosses. *done is true when
  // nothing follows; otherwise *next is the key to pass as "from" to resume
  // (done = false does not promise that a key follows: the call that
  // resumes may return none with done = true). Returns InvalidArgument for
  // a zero limit and IOError once closed.
  Status Scan(int64_t from, bool reverse, size_t limit, std::vector<KeyValue>* out,
              int64_t* next, bool* done) const;

  // Like Scan, but considers only keys in [lo, hi] (both inclusive). Forward
  // starts at max(from, lo); reverse at min(from, hi). *done is true when no
  // key in the bounds follows; otherwise *next lies in [lo, hi]. A "from"
  // past the bounds in the scan's direction returns nothing with done = true.
  // InvalidArgument if lo > hi. Scan() is this with [INT64_MIN, INT64_MAX].
  // Both skip a record that fails its checksum (it is counted in
  // corrupt_records and logged with its file and offset); this one adds its
  // key to *corrupt when given.
  Status Scan(int64_t from, bool reverse, size_t limit, int64_t lo, int64_t hi,
              std::vector<KeyValue>* out, int64_t* next, bool* done,
              std::vector<int64_t>* corrupt = nullptr) const;

  // What Verify() found.
  struct VerifyReport {
    uint64_t records = 0;  // live records read (a string-key bucket counts one)
    uint64_t bytes = 0;    // their value bytes
    std::vector<int64_t> corrupt_keys;     // integer keys whose record fails its checksum
    std::vector<int64_t> corrupt_buckets;  // string-key buckets (their slot) that do
  };
  // Reads every live record back and checks it (flatkv admin verify): each
  // bad one is counted and logged as a read would. "keep_going" is asked
  // between pages of 1024 records (false stops early: Unavailable).
  Status Verify(VerifyReport* report, const std::function<bool()>& keep_going = nullptr) const;

  // The work one Scan call may do before it returns with done = false: one
  // unit per index slot read, and one per empty run of slots jumped over (a
  // group of FlatIndex::kGroupSlots slots, a chunk of kChunkSlots, or a whole
  // segment with no live key). 65536 units read at most 384 KiB of index at
  // the default slot width: well under a millisecond, on the server's I/O
  // thread. The values of the returned pairs are read on top of that (one
  // pread each, "limit" at most).
  static constexpr uint64_t kScanWork = uint64_t{1} << 16;
  // Sets the per-call work allowance (kScanWork by default, at least 1); for
  // tests.
  void TEST_SetScanWork(uint64_t units) { scan_work_.store(units); }
  // Makes every compaction fail with NoSpace once it has read "bytes" of
  // the old table (0: never), as a disk filling up midway would.
  void TEST_FailCompactionAfter(uint64_t bytes) { test_fail_after_.store(bytes); }
  // Makes the process kill itself (SIGKILL) in the next promotion from the
  // sparse tier: 1 once the keys are copied, 2 once the table is marked
  // moved, 3 once it is published (before the tier drops the keys). 4
  // does not kill: the tier's drop of the keys fails, as on a full disk.
  void TEST_KillInPromotion(int stage) { test_kill_stage_.store(stage); }

  // Insertion-order scan: the sparse tier's keys first (in key order: the
  // tier keeps no write order), then each segment in key order, each of its
  // data files in write order, live records only. An empty cursor starts;
  // *next_cursor resumes. Keys written after the scan started may or may
  // not appear; a key whose segment is promoted meanwhile may come twice.
  Status ScanLog(std::string_view cursor, size_t limit, std::vector<KeyValue>* out,
                 std::string* next_cursor, bool* done) const;

  // String keys (see string_keys.h): keys of any bytes, empty and binary
  // included, up to max_key_bytes. SGet follows Get's contract: NotFound
  // leaves *value unchanged. SPut returns InvalidArgument for a key over
  // max_key_bytes and ValueTooLarge for a value over max_value_bytes.
  // SPut's *replaced (if given) is true when the put is known to have
  // replaced a live value of the key (its bucket was small enough to be
  // rewritten whole); false when the key was absent, or when the put only
  // appended to a large bucket, which it does not read.
  Status SGet(std::string_view key, std::string* value) const;
  Status SPut(std::string_view key, std::string_view value, bool* replaced = nullptr);
  Status SRemove(std::string_view key, bool* existed = nullptr);

  // A write into a bucket whose record fails its checksum succeeds: the
  // bucket is written anew with a damaged mark and the new entry (see
  // string_keys.h), so its other keys read as Corruption, never as absent,
  // until the bucket is written whole again (SWriteBucket).
  //
  // Iterates string keys in hash order, resumable: an empty cursor starts,
  // *next_cursor resumes; at most "limit" pairs per call. A bucket that
  // fails its checksum is skipped (counted and logged); a damaged one gives
  // the keys written since. Either adds its slot to *corrupt when given.
  Status SScan(std::string_view cursor, size_t limit, std::vector<StringKeyValue>* out,
               std::string* next_cursor, bool* done,
               std::vector<int64_t>* corrupt = nullptr) const;

  // Buckets, for repair: a string key lives in bucket StringSlot(key), in
  // [0, string_slots). SReadBucket gives a bucket's live pairs (none if
  // absent); Corruption if its record fails its checksum or it is damaged.
  // SWriteBucket replaces a bucket whole with "live" without reading it
  // (none: removes it); InvalidArgument for a key of another slot.
  int64_t StringSlot(std::string_view key) const;
  Status SReadBucket(int64_t slot, std::vector<StringKeyValue>* live) const;
  Status SWriteBucket(int64_t slot, const std::vector<StringKeyValue>& live);

  // Starts a round of online compaction of every table (one at a time, in
  // the background); returns at once. Reads and writes continue meanwhile.
  // If a round is running, another one follows it.
  Status Compact();
  // Compact(), then waits until that round has finished; returns its error.
  Status CompactAndWait();
  CompactionStatus GetCompactionStatus() const;

  // Makes every acknowledged write durable (fdatasync of written data files).
  Status Sync();

  // Makes the indexes durable and advances every table's checkpoint, bounding
  // the replay after a crash.
  Status Checkpoint();

  // Flushes and closes every table and marks it clean. Further calls fail.
  // Called by the destructor if not called before.
  Status Close();

  EngineStats GetStats() const;
  // Empty unless the last write failed for a full disk (NoSpace): then its
  // message (it names the file and the errno text). A write that succeeds
  // clears it; reads are not affected.
  std::string DiskFull() const;
  // Bytes of live records, estimated: each table's log bytes less those it
  // knows are dead (record headers included). For progress reports.
  uint64_t LiveBytesEstimate() const;
  // The same for integer keys in [lo, hi] (each table's live bytes times the
  // share of its live keys inside the range, counted from its index; a
  // closed table, whose index is not mapped, by the share of its key span)
  // plus "string_share" of the string keys' table (their hashes are
  // uniform: the range's share of the hash space).
  uint64_t LiveBytesEstimate(int64_t lo, int64_t hi, double string_share) const;
  const EngineOptions& options() const { return options_; }

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

 private:
  // Epoch-based reclamation of tables replaced by compaction: every operation
  // that uses a table pointer runs inside a Guard, which counts it in the
  // current epoch's parity; a replaced table is freed only after the epoch
  // has advanced and the old parity has drained. Counters are per thread
  // slot (cache-line sized), so readers do not share a cache line.
  class Guard {
   public:
    explicit Guard(const Store* store);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    const Store* store_;
    size_t slot_;
    int parity_;
  };
  struct alignas(64) ReaderSlot {
    std::atomic<int64_t> count[2] = {0, 0};
  };
  static constexpr size_t kReaderSlots = 32;
  mutable ReaderSlot reader_slots_[kReaderSlots];
  mutable std::atomic<uint64_t> epoch_{0};
  // Waits until no operation that started before this call is still running.
  // Callers are serialized (sync_mu_): two overlapping epoch flips would let
  // the second return while operations of the first's old parity still run.
  void SynchronizeReaders() const;
  mutable std::mutex sync_mu_;

  struct TableRef {
    uint64_t segment;
    FlatTable* table;  // nullptr: the segment exists but its table is closed
    uint64_t generation;  // bumped by each compaction; log-scan cursors carry it
  };
  using TableArray = std::vector<TableRef>;

  explicit Store(const EngineOptions& options);

  uint64_t SegmentId(int64_t key) const;

  // ---- The sparse tier (see the top of this file) ----
  static constexpr uint64_t kDenseKeys = 256;
  static constexpr int64_t kDenseWindow = 16384;
  // One sparse write in this many checks its key's window for promotion.
  static constexpr uint64_t kPromoteSample = 32;
  static constexpr const char* kMovedMark = "SPARSE-MOVED";
  static constexpr size_t kSegmentStripes = 16;
  static constexpr size_t kSparseKeyStripes = 32;
  std::shared_mutex& SegmentMutex(uint64_t seg) const {
    return segment_mu_[(seg * 0x9E3779B97F4A7C15ull) >> 60];
  }
  std::mutex& SparseKeyMutex(int64_t key) const {
    return sparse_key_mu_[(static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> 59];
  }
  mutable std::shared_mutex segment_mu_[kSegmentStripes];
  mutable std::mutex sparse_key_mu_[kSparseKeyStripes];
  std::unique_ptr<SparseTier> sparse_;
  std::atomic<uint64_t> sparse_writes_{0};
  std::atomic<uint64_t> promotions_{0};
  // No promotion is tried before this (steady_clock ticks) after one failed
  // for a full disk (kNoSpaceBackoff).
  std::atomic<int64_t> promote_after_{0};
  // Opens the tier (on) or moves what it holds into flat tables (off).
  Status OpenSparseTier();
  // After a sparse write of "key" (no lock held, inside a Guard): one in
  // kPromoteSample checks the density and promotes the segment.
  void MaybePromote(int64_t key);
  // Moves segment "seg" from the tier into a flat table (the exclusive
  // stripe held by the caller). "table": its table if it exists already
  // (an open that found it), else one is created.
  Status PromoteLocked(uint64_t seg, FlatTable* table);
  // Copies the tier's keys of "seg" into "table" and makes them durable.
  Status CopySparseKeys(uint64_t seg, FlatTable* table);
  // The integer-key scan over the flat tables alone (Scan merges the tier),
  // with arguments Scan has checked and clamped: lo <= from <= hi.
  Status FlatScan(int64_t from, bool reverse, size_t limit, int64_t lo, int64_t hi,
                  std::vector<KeyValue>* out, int64_t* next, bool* done,
                  std::vector<int64_t>* corrupt) const;
  // Takes every stripe of segment_mu_ shared: no promotion runs meanwhile.
  std::vector<std::shared_lock<std::shared_mutex>> LockAllSegments() const;
  // Whether segment "seg" has a flat table (inside a Guard).
  bool HasFlatTable(uint64_t seg) const;
  // Runs a write of "key": "flat" on its flat table (created if "create"
  // and the tier is off), else "sparse" under the key's stripes, and then
  // (if "create") the promotion check.
  Status RouteWrite(int64_t key, bool create, const std::function<Status(FlatTable*)>& flat,
                    const std::function<Status()>& sparse);
  Status SparseLogScan(std::string_view cursor, size_t limit, std::vector<KeyValue>* out,
                       std::string* next_cursor, bool* done) const;
  int64_t SegmentFirstKey(uint64_t segment) const;
  int64_t SegmentLastKey(uint64_t segment) const;
  // Declared before an operation's Guard, so it runs after the Guard ends.
  class CloseIdleAfter {
   public:
    explicit CloseIdleAfter(const Store* store) : store_(store) {}
    ~CloseIdleAfter() { store_->MaybeCloseIdle(); }
    CloseIdleAfter(const CloseIdleAfter&) = delete;
    CloseIdleAfter& operator=(const CloseIdleAfter&) = delete;

   private:
    const Store* store_;
  };
  // The table holding "key" (reopened if the budget had closed it), or
  // nullptr if its segment does not exist yet. Must run inside a Guard.
  Status FindTable(int64_t key, FlatTable** table) const;
  // The table holding "key", created if absent. Must run inside a Guard.
  Status GetOrCreateTable(int64_t key, FlatTable** table);
  // Slow path of both: under tables_mu_, returns the open table of "seg"
  // (reopening a closed one, taking back one being closed), or nullptr if
  // the segment does not exist. Logically const (a cache fill).
  Status OpenSegment(uint64_t seg, FlatTable** table) const;
  Status OpenSegmentLocked(uint64_t seg, FlatTable** table);  // EXCLUSIVE_LOCKS_REQUIRED(tables_mu_)
  // Called after an operation has left its Guard (never inside one: it
  // waits for readers): closes idle tables while more are open than the
  // budget allows. Cheap when within the budget.
  void MaybeCloseIdle() const {
    if (open_tables_.load(std::memory_order_relaxed) > table_budget_) CloseIdle();
  }
  void CloseIdle() const;
  // Tables that may stay open: max_open_files / (data_files + 1), at least 1.
  size_t table_budget_ = 1;
  // Open tables (in tables_, idle_closing_ and the string table).
  mutable std::atomic<size_t> open_tables_{0};
  // Tables unpublished by CloseIdle and waiting for their readers to drain
  // before they close; a use meanwhile takes the table back.
  std::map<uint64_t, std::unique_ptr<FlatTable>> idle_closing_;  // GUARDED_BY(tables_mu_)
  mutable std::mutex close_idle_mu_;  // one CloseIdle at a time (try_lock)
  // Live bytes of each closed table, noted when it closed, so
  // LiveBytesEstimate() need not reopen it.
  void NoteClosedLocked(uint64_t seg, const FlatTable* table);  // EXCLUSIVE_LOCKS_REQUIRED(tables_mu_)
  std::map<uint64_t, uint64_t> closed_live_;  // GUARDED_BY(tables_mu_)
  std::atomic<uint64_t> closed_live_total_{0};
  uint64_t clock_hand_ = 0;           // GUARDED_BY(tables_mu_): next segment to sweep
  // The segment CompactTable holds a raw pointer to (never closed meanwhile).
  uint64_t compacting_ = kNoSegment;  // GUARDED_BY(tables_mu_)
  static constexpr uint64_t kNoSegment = ~uint64_t{0} - 1;
  Status OpenTable(uint64_t segment, bool create, std::unique_ptr<FlatTable>* table);
  // Every public write's result passes here: a NoSpace sets the disk-full
  // state (logged once), a success clears it. Returns "st".
  Status NoteWrite(Status st) const;
  // Grows with every write that took room: log bytes appended to the flat
  // tables plus writes the sparse tier took.
  uint64_t WriteProgress() const;
  std::string SegmentDir(uint64_t segment) const;
  void BackgroundLoop();
  // Called first on the store's own threads (periodic sync, compactor):
  // marks the calling thread SCHED_BATCH, so that waking up (an fdatasync
  // or a discard of a removed file completing) does not preempt a thread
  // serving calls on the same core; it runs at the next tick or when that
  // thread waits, with the same CPU share as before.
  static void RunAsBackground();
  void PublishTablesLocked();
  // Every published array but the newest, taken out of arrays_ for the
  // caller to free after a SynchronizeReaders() that begins after this
  // call: an operation that can still hold one of them loaded it before
  // the newest was published, so it counts in the parity that call drains
  // (each compaction and each CloseIdle publish one; kept until Close(),
  // they grew by one array per compaction: 2,434 in the 30-minute soak).
  std::vector<std::unique_ptr<const TableArray>> RetireArraysLocked();  // EXCLUSIVE_LOCKS_REQUIRED(tables_mu_)
  // Tables in segment order (a snapshot).
  const TableArray& Tables() const;

  const EngineOptions options_;

  // Segment lookup on the hot path takes no lock: readers load an immutable,
  // sorted array of (segment, table) published by the creator of a segment,
  // inside a Guard. Replaced arrays are freed after the readers drain
  // (RetireArraysLocked), by compactions and CloseIdle.
  std::atomic<const TableArray*> table_array_{nullptr};

  mutable std::mutex tables_mu_;  // serializes segment creation, reopening, closing and Close()
  // Every segment; nullptr while its table is closed (or in closing_).
  std::map<uint64_t, std::unique_ptr<FlatTable>> tables_;  // GUARDED_BY(tables_mu_)
  std::vector<std::unique_ptr<const TableArray>> arrays_;  // GUARDED_BY(tables_mu_)
  std::unique_ptr<EngineCounters> counters_;

  // The string-key table, created on the first SPut. Readers load the
  // pointer; string writers also take the stripe of their bucket, so a
  // remove's check-then-append and a bucket rewrite are atomic.
  Status GetOrCreateStringTable(FlatTable** table);
  Status OpenStringTable(bool create, std::unique_ptr<FlatTable>* table);
  // Appends one entry to the bucket of "ikey"; rewrites the bucket with its
  // live entries when it has grown past twice its base (+4 KiB).
  Status AppendToBucket(FlatTable* table, int64_t ikey, std::string_view entry);
  // A write met a bucket failing its checksum ("bad"): writes the bucket
  // anew as a damaged mark followed by "entry".
  Status MarkDamaged(FlatTable* table, int64_t ikey, std::string_view entry, const Status& bad);
  std::atomic<uint64_t> damaged_buckets_{0};
  std::atomic<FlatTable*> strings_{nullptr};
  // The bucket filter (string_keys.h), one byte per slot of the string
  // table in an anonymous mapping, so memory is taken only by the pages
  // touched. 0: not known yet; a get that read the bucket may fill it in,
  // from 0 only (compare-exchange). kFilterBlocked: not known, and not to be
  // filled in by gets (a writer got there first, or the bucket is damaged).
  // Otherwise known. Writers, holding their stripe, never set it back to 0:
  // before writing a bucket they add their key's bit to a known byte or
  // block an unknown one, after writing it whole they may store its exact
  // filter. So a get fills in only a bucket no one has written since open,
  // and a byte that says "absent" was true when the lookup began.
  static constexpr uint8_t kFilterBlocked = 1;
  uint8_t* filter_ = nullptr;
  size_t filter_bytes_ = 0;
  mutable std::atomic<uint64_t> filter_skips_{0};
  uint8_t FilterLoad(uint64_t slot) const {
    return std::atomic_ref<uint8_t>(filter_[slot]).load(std::memory_order_acquire);
  }
  void FilterStore(uint64_t slot, uint8_t v) {
    std::atomic_ref<uint8_t>(filter_[slot]).store(v, std::memory_order_release);
  }
  // BucketFilter's answer as a filter byte: 0 (a damaged bucket, whose
  // absent keys are unknown) becomes kFilterBlocked.
  static uint8_t KnownOrBlocked(uint8_t exact) { return exact != 0 ? exact : kFilterBlocked; }
  // Whether a filter byte says the key of this hash is absent from its bucket.
  static bool FilterSaysAbsent(uint8_t filter, uint64_t hash);
  // The string-table slot of a key whose HashStringKey is "hash".
  uint64_t SlotOfHash(uint64_t hash) const { return hash % options_.string_slots; }
  // Before writing bucket "slot" (its stripe held): adds "bits" to a known
  // filter, blocks an unknown one.
  void FilterBeforeWrite(uint64_t slot, uint8_t bits);
  // A get of "slot" that saw "seen" (0) and read the bucket ("exact" is
  // BucketFilter of what it read, or kFilterKnown if there was none).
  void FilterLearn(uint64_t slot, uint8_t exact) const;
  std::unique_ptr<FlatTable> strings_owner_;  // GUARDED_BY(tables_mu_)

  // ---- Compaction (compactor.cc) ----
  // A table's home directory holds CURRENT, naming the generation directory
  // with its files ("gen-N"; missing CURRENT = the home itself, generation 0).
  // Compaction builds generation N+1 beside it and switches CURRENT.
  static constexpr uint64_t kStringsSegment = ~uint64_t{0};
  std::string HomeDir(uint64_t segment) const;
  // Opens the live generation of a home, deletes leftovers of finished
  // compactions and reopens an unfinished one (which the compactor resumes).
  Status OpenHome(uint64_t segment, const TableParams& params, bool create,
                  std::unique_ptr<FlatTable>* table);
  // A compaction of one table; "in_place" (an automatic pick) cleans its
  // files' heads when it can (CleanPinned), else it is copied whole.
  Status CompactTable(uint64_t segment, bool in_place = false);
  Status CompactPinned(uint64_t segment);  // CompactTable with the segment pinned
  Status CleanPinned(uint64_t segment);    // one round of head cleaning, pinned
  // A table gets share 1 / kCleanShare of each data file's bytes (at least
  // kMinClean) cleaned per round: enough that a round's fixed cost (an
  // fdatasync per file, the index's msync, META) stays small, little enough
  // that its copies stay inside the writers' margin (kStallMargin).
  static constexpr uint64_t kCleanShare = 4;
  static constexpr uint64_t kMinClean = 64u << 10;
  std::atomic<bool> punch_unsupported_{false};  // the file system cannot punch holes
  // Undoes a compaction that failed midway with "why" (compactor.cc).
  Status Abandon(uint64_t segment, FlatTable* old, Room* room, const Status& why);
  bool CompactionProgress(uint64_t bytes);  // rate limit, progress, stop check
  void CompactorLoop();
  std::unique_ptr<FlatTable>& OwnerLocked(uint64_t segment);
  // The segment's table for a compaction, reopened if the open-table budget
  // closed it; nullptr if it has none (never written, or the string table
  // not created yet). EXCLUSIVE_LOCKS_REQUIRED(tables_mu_)
  Status OpenOwnerLocked(uint64_t segment, FlatTable** table);
  TableParams ParamsFor(uint64_t segment) const;
  static CopyTransform BucketTransform(uint64_t segment);
  // The automatic policy (compactor.cc): the next table to compact
  // (kNoSegment if none is due). Also renews the write allowance, and
  // stores what it set in *allowance if given.
  uint64_t PickAutomatic(int64_t* allowance = nullptr);
  // PickAutomatic for the allowance alone, at most every 50 ms unless a
  // writer asked (compactor thread, called between records; no lock held).
  void RefreshAllowance();
  // Writers call this before their Guard with the log bytes they are about
  // to add. They take them from allowance_, the bytes the log may still
  // grow by before it passes (compaction_disk_ratio + kStallMargin) times
  // the live bytes; once it is spent a writer renews it (RenewForWriter),
  // and only if that leaves none (garbage past the bound, or a compaction
  // running) it waits for the compactor (at most kMaxStall, then it goes
  // on).
  void WaitForCompactor(uint64_t bytes);
  // A writer's renewal of a spent allowance (PickAutomatic), unless a
  // compaction is running: then the compactor renews it. True if it
  // renewed and left room.
  bool RenewForWriter();
  // Sets the allowance to "bytes"; a writer that takes it below
  // "wake_below" wakes the compactor (-1: none does).
  void SetAllowance(int64_t bytes, int64_t wake_below = -1);
  void AskCompactor();  // renew_asked_ and a notify of compact_cv_
  static constexpr double kStallMargin = 0.1;
  // Bytes a compaction copies between starts of the new generation's
  // writeback (FlatTable::StartWriteback).
  static constexpr uint64_t kWritebackStep = 8 << 20;
  static constexpr std::chrono::milliseconds kMaxStall{100};
  static constexpr int64_t kNoLimit = int64_t{1} << 62;
  std::atomic<int64_t> allowance_{kNoLimit};
  std::atomic<int64_t> wake_below_{-1};
  std::atomic<bool> renew_asked_{false};
  mutable std::mutex stall_mu_;
  mutable std::condition_variable stall_cv_;
  std::chrono::steady_clock::time_point renewed_at_;  // GUARDED_BY(stall_mu_)
  std::mutex renew_mu_;  // one writer at a time renews a spent allowance

  std::map<uint64_t, std::unique_ptr<FlatTable>> pending_;  // GUARDED_BY(tables_mu_)
  std::map<uint64_t, uint64_t> generation_;                 // GUARDED_BY(tables_mu_)
  mutable std::mutex compact_mu_;
  std::condition_variable compact_cv_;
  uint64_t rounds_requested_ = 0;  // GUARDED_BY(compact_mu_)
  uint64_t rounds_done_ = 0;       // GUARDED_BY(compact_mu_)
  Status round_status_;            // GUARDED_BY(compact_mu_)
  // No automatic round before this after one failed with NoSpace.
  std::chrono::steady_clock::time_point no_space_backoff_;  // GUARDED_BY(compact_mu_)
  static constexpr std::chrono::seconds kNoSpaceBackoff{30};
  CompactionStatus compaction_;    // GUARDED_BY(compact_mu_)
  std::chrono::steady_clock::time_point copy_start_;
  uint64_t copy_bytes_ = 0;        // compactor thread only
  std::atomic<uint64_t> round_bytes_done_{0};
  std::atomic<bool> stopping_{false};  // Close() stops the compactor
  std::thread compactor_thread_;
  static constexpr size_t kStringStripes = 64;
  // An appended bucket this large that Append folded into one record is
  // rewritten with its live entries (see AppendToBucket).
  static constexpr size_t kSmallBucket = 4096;
  mutable std::mutex string_mu_[kStringStripes];

  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  bool closing_ = false;  // GUARDED_BY(bg_mu_)
  std::thread bg_thread_;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> scan_work_{kScanWork};
  std::atomic<uint64_t> test_fail_after_{0};
  std::atomic<int> test_kill_stage_{0};
  void MaybeKillAt(int stage) const;
};

}  // namespace flatkv::engine
