// Online compaction (paper §2.5), the Store's side: table generations on disk,
// the background compactor thread, the switch, and reclaiming the old table.
// The per-record work (routing writes to the successor, copying live
// records) is FlatTable's: BeginCompaction, CopyLive, FinishCompaction.
//
// Implementation notes
//
// A table's home (seg-XXXX/ or strings/) holds CURRENT naming the live
// generation directory (gen-N); without CURRENT the home itself is
// generation 0. Compacting generation N:
//   1. create gen-(N+1) and a table in it; BeginCompaction: from now on
//      writes go to the new table, removes reach both, gets try new then old;
//   2. copy every record live in the old table and absent from the new one;
//   3. make the new table durable (fdatasync + checkpoint);
//   4. write CURRENT = gen-(N+1) (temp file, fsync, rename, fsync home): the
//      atomic switch;
//   5. publish the new table, wait for readers of the old one to drain
//      (SynchronizeReaders), close it and delete its files.
// A crash before step 4 leaves gen-(N+1) beside a CURRENT naming N: the next
// open reopens both, re-enters step 1 with the existing new table (writes
// acknowledged during compaction live only there) and the compactor resumes
// at step 2; copying is idempotent. A crash after step 4 leaves only
// garbage of generation N, deleted on open.
#include <dirent.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/flat_table.h"
#include "engine/sparse_tier.h"
#include "engine/store.h"
#include "engine/string_keys.h"

namespace flatkv::engine {
namespace {

constexpr const char* kCurrent = "CURRENT";

std::string GenName(uint64_t gen) { return "gen-" + std::to_string(gen); }

bool ParseGen(const std::string& name, uint64_t* gen) {
  if (name.rfind("gen-", 0) != 0 || name.size() < 5) return false;
  char* end = nullptr;
  *gen = std::strtoull(name.c_str() + 4, &end, 10);
  return end != nullptr && *end == '\0';
}

Status WriteCurrent(const std::string& home, uint64_t gen) {
  const std::string tmp = home + "/" + kCurrent + ".tmp";
  const std::string text = GenName(gen) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("creating " + tmp, errno);
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Status::FromErrno("writing " + tmp, err);
  const std::string path = home + "/" + kCurrent;
  if (rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno("renaming " + tmp, errno);
  return SyncDirectory(home);
}

// A compaction writes the live records again before it frees the old ones,
// so it needs room for them: NoSpace before it starts if the file system
// lacks it (an estimate: live bytes plus a sixteenth and 1 MiB for the new
// index pages). Unknown free space (statvfs fails) lets it try.
Status CheckRoom(const std::string& home, uint64_t live) {
  struct statvfs vfs;
  if (statvfs(home.c_str(), &vfs) != 0) return Status::OK();
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t need = live + live / 16 + (1u << 20);
  if (avail >= need) return Status::OK();
  return Status::NoSpace(home + ": compaction needs about " + std::to_string(need) +
                         " bytes free for the live data and the file system has " +
                         std::to_string(avail) + " (disk full); the table is kept as it is");
}

// The undo reserve of a compaction (CompactPinned): a file whose blocks are
// allocated (fallocate) and never written, removed to give them back.
constexpr const char* kRoomFile = "compaction.room";
constexpr uint64_t kRoomStep = 256u << 10;
constexpr uint64_t kRoomInitial = 2 * kRoomStep;


// Generation 0 lives in the home itself: its files are everything but
// CURRENT and the generation directories.
void RemoveGenerationZero(const std::string& home) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(home, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t gen;
    if (name == kCurrent || name == std::string(kCurrent) + ".tmp" || ParseGen(name, &gen)) {
      continue;
    }
    std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

class Room {
 public:
  explicit Room(std::string path) : path_(std::move(path)) {}
  ~Room() { Remove(); }
  uint64_t size() const { return size_; }
  // Reserves at least "bytes" (rounded up to a kRoomStep): NoSpace naming
  // the disk if it cannot.
  Status Grow(uint64_t bytes) {
    const uint64_t want = (bytes + kRoomStep - 1) / kRoomStep * kRoomStep;
    if (want <= size_) return Status::OK();
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::FromErrno("creating " + path_, errno);
    const int err = posix_fallocate(fd_, 0, static_cast<off_t>(want));
    if (err != 0) {
      return Status::FromErrno("reserving " + std::to_string(want) + " bytes in " + path_ +
                                   " (room to undo the compaction)", err);
    }
    size_ = want;
    return Status::OK();
  }
  void Remove() {
    if (fd_ < 0) return;
    ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
    size_ = 0;
  }
  Room(const Room&) = delete;
  Room& operator=(const Room&) = delete;

 private:
  const std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// ---------------------------------------------------------------------------
// Readers and reclamation

Store::Guard::Guard(const Store* store) : store_(store) {
  static std::atomic<size_t> next_slot{0};
  thread_local const size_t my_slot = next_slot.fetch_add(1) % kReaderSlots;
  slot_ = my_slot;
  // Count in the parity of an epoch that is still current after the count
  // went up. Reading the epoch and then counting is not enough: a flip in
  // between may have checked this parity before the count rose, and a
  // second flip would then wait for the other parity only, and free a table
  // (or table array) this operation goes on to use (ThreadSanitizer:
  // heap-use-after-free in FlatTable::EnsureWritable and in a freed
  // TableArray, store_test "Every kind of operation runs beside table
  // closes, reopens and compactions").
  for (;;) {
    const uint64_t epoch = store->epoch_.load();
    parity_ = static_cast<int>(epoch & 1);
    store->reader_slots_[slot_].count[parity_].fetch_add(1);
    if (store->epoch_.load() == epoch) break;
    store->reader_slots_[slot_].count[parity_].fetch_sub(1, std::memory_order_release);
  }
}

Store::Guard::~Guard() {
  store_->reader_slots_[slot_].count[parity_].fetch_sub(1, std::memory_order_release);
}

void Store::SynchronizeReaders() const {
  std::lock_guard<std::mutex> one(sync_mu_);
  // The caller published the new table before this: an operation counted in
  // the new parity loads the new table; the old parity only drains.
  const int old = static_cast<int>(epoch_.fetch_add(1) & 1);
  for (;;) {
    int64_t active = 0;
    for (const ReaderSlot& slot : reader_slots_) active += slot.count[old].load();
    if (active == 0) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// String buckets move to the new generation with only their live entries
// (CompactBucket); an empty bucket is dropped, and one already compact (as
// SPut writes a small bucket) is copied as it is. Integer values move as
// they are.
CopyTransform Store::BucketTransform(uint64_t segment) {
  if (segment != kStringsSegment) return {};
  return {[](std::string* bucket) {
            *bucket = CompactBucket(*bucket);  // a damaged bucket keeps its mark
            return !bucket->empty();
          },
          BucketIsCompact};
}

// ---------------------------------------------------------------------------
// Homes and generations

std::string Store::HomeDir(uint64_t segment) const {
  return segment == kStringsSegment ? options_.path + "/strings" : SegmentDir(segment);
}

std::unique_ptr<FlatTable>& Store::OwnerLocked(uint64_t segment) {
  return segment == kStringsSegment ? strings_owner_ : tables_[segment];
}

Status Store::OpenOwnerLocked(uint64_t segment, FlatTable** table) {
  std::unique_ptr<FlatTable>& owner = OwnerLocked(segment);
  if (owner == nullptr && segment != kStringsSegment) {
    FlatTable* reopened;  // closed by the open-table budget: reopen it
    FLATKV_RETURN_IF_ERROR(OpenSegmentLocked(segment, &reopened));
  }
  *table = owner.get();
  return Status::OK();
}

Status Store::OpenHome(uint64_t segment, const TableParams& params, bool create,
                       std::unique_ptr<FlatTable>* table) {
  const std::string home = HomeDir(segment);
  uint64_t live = 0;
  {
    std::ifstream in(home + "/" + kCurrent);
    std::string name;
    if (in >> name && !ParseGen(name, &live)) {
      return Status::Corruption(home + "/CURRENT names no generation: " + name);
    }
  }
  // Older generations are leftovers of a finished switch; a newer one is an
  // unfinished compaction, resumed below.
  uint64_t pending = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(home, ec)) {
    uint64_t gen;
    if (!e.is_directory() || !ParseGen(e.path().filename().string(), &gen)) continue;
    if (gen < live) {
      spdlog::info("{}: removing generation {} (replaced by {})", home, gen, live);
      std::filesystem::remove_all(e.path(), ec);
    } else if (gen > live) {
      pending = std::max(pending, gen);
    }
  }
  if (live > 0) RemoveGenerationZero(home);
  // An undo reserve left by a crash mid-compaction (CompactPinned) holds
  // blocks for nothing now; the one of a resumed compaction is made anew.
  std::filesystem::remove(home + "/" + GenName(live) + "/" + kRoomFile, ec);
  if (pending > 0) std::filesystem::remove(home + "/" + GenName(pending) + "/" + kRoomFile, ec);

  TableParams p = params;
  p.dir = live == 0 ? home : home + "/" + GenName(live);
  FLATKV_RETURN_IF_ERROR(FlatTable::Open(p, create, counters_.get(), table));
  generation_[segment] = live;
  if (pending > 0) {
    spdlog::warn("{}: resuming an unfinished compaction into {}", home, GenName(pending));
    TableParams np = params;
    np.dir = home + "/" + GenName(pending);
    std::unique_ptr<FlatTable> next;
    FLATKV_RETURN_IF_ERROR(FlatTable::Open(np, true, counters_.get(), &next));
    std::vector<uint64_t> ends;
    (*table)->BeginCompaction(next.get(), &ends, BucketTransform(segment));
    pending_[segment] = std::move(next);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// The compactor

bool Store::CompactionProgress(uint64_t bytes) {
  copy_bytes_ += bytes;
  round_bytes_done_.fetch_add(bytes, std::memory_order_relaxed);
  RefreshAllowance();  // writes go on meanwhile and spend the allowance
  if (options_.compaction_mb_per_sec > 0) {
    // Sleep until the bytes read so far fit the budget.
    const double due = static_cast<double>(copy_bytes_) / (options_.compaction_mb_per_sec * 1e6);
    const auto target = copy_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double>(due));
    while (std::chrono::steady_clock::now() < target && !stopping_.load()) {
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(target - std::chrono::steady_clock::now(),
                                                        std::chrono::milliseconds(20)));
    }
  }
  return !stopping_.load();
}

Status Store::CompactTable(uint64_t segment, bool in_place) {
  // Pin the segment: CloseIdle must not close a table the compactor holds a
  // raw pointer to (it would otherwise be one more candidate, since the
  // compactor's pointers live outside any Guard).
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    compacting_ = segment;
  }
  Status st = in_place ? CleanPinned(segment) : CompactPinned(segment);
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    compacting_ = kNoSegment;
  }
  return st;
}

// One round of compaction in place (FlatTable::CleanHead): each data file's
// oldest share is cleaned, its live records copied to its end, and freed.
// Nothing is undone on an error: what was copied is a duplicate, garbage
// for the next round. A table that cannot be cleaned so is copied whole.
Status Store::CleanPinned(uint64_t segment) {
  FlatTable* t;
  bool whole;
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    if (closed_.load()) return Status::Busy("store is closing");
    FLATKV_RETURN_IF_ERROR(OpenOwnerLocked(segment, &t));
    if (t == nullptr) return Status::OK();
    whole = segment == kStringsSegment || pending_.count(segment) > 0 ||
            !options_.compaction_in_place || punch_unsupported_.load() || !t->CanCleanHead();
  }
  if (whole) return CompactPinned(segment);
  const int n = t->data_files();
  std::vector<uint64_t> targets(static_cast<size_t>(n));
  uint64_t planned = 0;
  for (int f = 0; f < n; ++f) {
    const uint64_t head = t->Head(f);
    const uint64_t end = std::max(head, t->AppliedEnd(f));
    targets[f] = head + std::max((end - head) / kCleanShare, kMinClean);
    planned += std::min(end, targets[f]) - head;
  }
  {
    std::lock_guard<std::mutex> lock(compact_mu_);
    compaction_.bytes_total = planned;
  }
  const uint64_t before = t->TotalBytes();
  uint64_t written = 0;  // read since the last StartWriteback
  auto progress = [&](uint64_t bytes) {
    written += bytes;
    if (written >= kWritebackStep) {
      t->StartWriteback();  // as CompactPinned: the commit's sync finds less
      written = 0;
    }
    return CompactionProgress(bytes);
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int f = 0; f < n; ++f) FLATKV_RETURN_IF_ERROR(t->CleanHead(f, targets[f], progress));
  const auto t1 = std::chrono::steady_clock::now();
  FLATKV_RETURN_IF_ERROR(t->CommitHeads());
  const auto t2 = std::chrono::steady_clock::now();
  // A get that loaded a slot before its record was copied may still read
  // the old place: it must finish before that place is freed.
  SynchronizeReaders();
  const auto t3 = std::chrono::steady_clock::now();
  if (Status st = t->DropHeads(); !st.ok()) {
    // The heads are committed (nothing reads before them), only the space
    // stays allocated: from now on tables are compacted whole.
    spdlog::warn("{}: {}; compacting tables whole from now on (storage.compaction_mode)",
                 HomeDir(segment), st.ToString());
    punch_unsupported_.store(true);
  }
  // The space is back: renew the writes' allowance without it now.
  (void)PickAutomatic();
  const uint64_t after = t->TotalBytes();
  const auto ms = [](auto a, auto b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  spdlog::debug("{}: cleaned {} of {} log bytes in place, {} -> {} (copy {:.1f} ms, commit {:.1f} "
                "ms, readers {:.1f} ms, free {:.1f} ms) dead {} alloc {}",
                HomeDir(segment), planned, before, before, after, ms(t0, t1), ms(t1, t2),
                ms(t2, t3), ms(t3, std::chrono::steady_clock::now()), t->DeadBytes(), t->AllocatedBytes());
  std::lock_guard<std::mutex> lock(compact_mu_);
  ++compaction_.heads_cleaned;
  compaction_.bytes_reclaimed += before > after ? before - after : 0;
  return Status::OK();
}

Status Store::CompactPinned(uint64_t segment) {
  const std::string home = HomeDir(segment);
  FlatTable* old;
  FlatTable* next;
  uint64_t gen;
  std::vector<uint64_t> ends;
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    if (closed_.load()) return Status::Busy("store is closing");
    FLATKV_RETURN_IF_ERROR(OpenOwnerLocked(segment, &old));
    if (old == nullptr) return Status::OK();
    gen = generation_[segment];
    auto it = pending_.find(segment);
    const uint64_t live = old->TotalBytes() - std::min(old->TotalBytes(), old->DeadBytes());
    const uint64_t copied = it == pending_.end() ? 0 : it->second->TotalBytes();
    FLATKV_RETURN_IF_ERROR(CheckRoom(home, live - std::min(live, copied)));
    if (it == pending_.end()) {
      TableParams p = ParamsFor(segment);
      p.index.kmin = old->kmin();  // the range is the old table's
      p.index.slots = old->slots();
      p.dir = home + "/" + GenName(gen + 1);
      std::error_code ec;
      std::filesystem::remove_all(p.dir, ec);  // a stale, empty attempt
      std::unique_ptr<FlatTable> created;
      Status st = FlatTable::Open(p, true, counters_.get(), &created);
      if (!st.ok()) {
        // Half made (a full disk): remove it, or the next start-up would
        // take it for an unfinished compaction and try to complete it.
        std::filesystem::remove_all(p.dir, ec);
        return st;
      }
      it = pending_.emplace(segment, std::move(created)).first;
    }
    next = it->second.get();
    old->BeginCompaction(next, &ends, BucketTransform(segment), /*track=*/true);
  }
  // The table is pending now, so the allowance may lend its dead bytes: renew
  // it at once. Writers that ran it out are what woke the compactor, and
  // until the next renewal (RefreshAllowance: 50 ms) they would go on waiting
  // (measured: a 50 ms stall at the start of every compaction of a one-table
  // store under overwrites).
  (void)PickAutomatic();
  const uint64_t before = old->TotalBytes();
  // Room to undo: a file of reserved blocks at least as large as what the
  // writes forwarded to the new generation hold, given back just before
  // AbortCompaction writes them into the old table. A disk filling up
  // midway (another program, or these writes) then stops the compaction
  // while the old table can still take them back.
  Room room(next->dir() + "/" + kRoomFile);
  Status st = room.Grow(kRoomInitial);
  uint64_t written = 0;  // copied since the last StartWriteback
  auto progress = [&](uint64_t bytes) {
    if (const uint64_t at = test_fail_after_.load(); at > 0 && copy_bytes_ >= at) {
      st = Status::NoSpace(next->dir() + ": TEST_FailCompactionAfter: No space left on device");
      return false;
    }
    // The write-back needs what the writes took, plus page rounding in each
    // data file and index pages: a quarter more and a step besides. (A
    // program that grabs every block freed meanwhile can still take the
    // room before the write-back gets it: then the compaction is kept.)
    const uint64_t need = old->ForwardedBytes() + old->ForwardedBytes() / 4 + kRoomStep;
    if (need > room.size()) {
      st = room.Grow(need + kRoomStep);
      if (!st.ok()) return false;
    }
    // Start writing the copies back as they go (as RocksDB's
    // bytes_per_sync does), so the sync before the switch, which writes
    // wait through once they pass the disk bound, finds little left.
    written += bytes;
    if (written >= kWritebackStep) {
      next->StartWriteback();
      written = 0;
    }
    return CompactionProgress(bytes);
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int f = 0; st.ok() && f < static_cast<int>(ends.size()); ++f) {
    Status copied = old->CopyLive(f, ends[f], progress);
    if (st.ok()) st = copied;  // else the room's error stopped it
  }
  const auto t1 = std::chrono::steady_clock::now();
  // The new generation must be durable before CURRENT names it.
  if (st.ok()) next->ReleaseWindows();
  if (st.ok()) st = next->Sync();
  next->ResumeLookahead();  // the data files are written back
  if (st.ok()) st = next->Checkpoint();
  if (st.ok()) st = SyncDirectory(next->dir());
  const auto t2 = std::chrono::steady_clock::now();
  if (!st.ok()) {
    if (stopping_.load()) return st;  // Close(): resumed at the next open
    return Abandon(segment, old, &room, st);
  }
  room.Remove();
  FLATKV_RETURN_IF_ERROR(WriteCurrent(home, gen + 1));
  old->FinishCompaction();
  std::unique_ptr<FlatTable> retired;
  std::vector<std::unique_ptr<const TableArray>> old_arrays;
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    std::unique_ptr<FlatTable>& owner = OwnerLocked(segment);
    retired = std::move(owner);
    owner = std::move(pending_[segment]);
    pending_.erase(segment);
    generation_[segment] = gen + 1;
    if (segment == kStringsSegment) {
      strings_.store(owner.get(), std::memory_order_release);
    } else {
      PublishTablesLocked();
      old_arrays = RetireArraysLocked();
    }
  }
  const auto t3 = std::chrono::steady_clock::now();
  SynchronizeReaders();
  old_arrays.clear();  // every reader of them has drained
  const auto t4 = std::chrono::steady_clock::now();
  const std::string old_dir = retired->dir();
  retired->Discard();  // deleted below: nothing to sync
  retired.reset();
  if (gen == 0) {
    RemoveGenerationZero(home);
  } else {
    std::error_code ec;
    std::filesystem::remove_all(old_dir, ec);
  }
  // The old generation is gone: renew the writes' allowance without it
  // now, or writers that spent it wait through the sync below as well.
  (void)PickAutomatic();
  FLATKV_RETURN_IF_ERROR(SyncDirectory(home));
  const auto t5 = std::chrono::steady_clock::now();
  const uint64_t after = next->TotalBytes();
  spdlog::info("{}: compacted generation {} -> {}: {} -> {} log bytes", home, gen, gen + 1, before,
               after);
  const auto ms = [](auto a, auto b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  spdlog::debug("{}: generation {}: copy {:.1f} ms, sync {:.1f} ms, switch {:.1f} ms, readers "
                "{:.1f} ms, removal {:.1f} ms",
                home, gen + 1, ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t4, t5));
  std::lock_guard<std::mutex> lock(compact_mu_);
  ++compaction_.tables_compacted;
  compaction_.bytes_reclaimed += before > after ? before - after : 0;
  return Status::OK();
}

// The automatic policy. Two rules choose a table, and of the tables they
// allow the one with the most dead bytes goes first (it gives back the most
// space per byte copied):
//  - a table whose dead bytes pass compaction_garbage_ratio of its log
//    bytes (at least compaction_min_bytes of them);
//  - any table with dead bytes while the log bytes of all open tables pass
//    compaction_disk_ratio times their live bytes. This is the rule that
//    bounds the disk: the first alone lets every table reach 1 / (1 - ratio)
//    times its live data (2x at 0.5) before its compaction adds a copy of
//    the live part, and tables that cross it while the compactor is busy
//    elsewhere wait their turn.
// One table per pick, then the figures are read again: a list made at the
// start of a round goes stale while writes go on. An unfinished compaction
// (found on open, or stopped by an error) is resumed first.
//
// The write allowance: writes spend it (WaitForCompactor), each pick renews
// it to (compaction_disk_ratio + kStallMargin) x live - log bytes, counting
// the writes a successor took but not the compaction's copies (those are
// one table's live bytes at most, and go away at the switch; counting them
// would stall every write of a one-table store near the end of each of its
// compactions). A compactor that keeps up never lets it run out.
//
// "log" is what compactions work on: live plus dead record bytes, and the
// space reserved ahead of the data files' ends that grows with them (up to
// FlatTable::kChargedReserve of each file's bytes). A table's fixed cost
// (a new file's first reserved page, the index's pages, META) is not
// counted: no compaction gives it back, and a store of hundreds of
// near-empty segments holds megabytes of it beside a few kilobytes of
// records, which made every write wait for a compactor with nothing to do.
// Without garbage the log is at most (1 + kChargedReserve) x live, under
// the (disk_ratio + kStallMargin) x live the allowance allows (disk_ratio
// is at least 1.1), so a store without garbage never stalls a writer.
//
// While a table compacts, writes may also borrow from the dead bytes its
// switch will free (at most (disk_ratio - 1) x its live bytes), in
// proportion to its share of the live bytes (the share its copy walks, so
// the time it takes). The margin alone left the
// writes 0.1 x live for a whole compaction: a one-table store (the default
// up to 16M integer keys) copies all its live bytes, so its writes stalled
// through most of every compaction unless the compactor copied ten times
// faster than they wrote (in a chain each member's stalls add up, and they
// were its p999). With the loan a one-table store's writes wait only past
// 0.6 x the copy rate, a store of n equal tables past about 0.1 n + 0.5 / n
// of it, and the disk peak of n tables grows by about 0.5 / n^2 x live.
uint64_t Store::PickAutomatic(int64_t* allowance) {
  struct Figures {
    uint64_t seg, bytes, dead;
  };
  std::vector<Figures> figures;
  uint64_t log = 0, live = 0, taken = 0;
  std::vector<std::pair<uint64_t, uint64_t>> compacting;  // (dead, live) of each
  uint64_t resume = kNoSegment;
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    auto consider = [&](uint64_t seg, const FlatTable* t) {
      if (t == nullptr) return;  // closed by the open-table budget: only on request
      const uint64_t bytes = t->TotalBytes();
      const uint64_t dead = std::min(bytes, t->DeadBytes());
      if (auto it = pending_.find(seg); it != pending_.end()) {
        resume = seg;
        const FlatTable* next = it->second.get();
        taken += next->ChargedBytes() - std::min(next->ChargedBytes(), next->CopiedBytes());
        compacting.emplace_back(dead, bytes - dead);  // frozen: writes go to "next"
      }
      log += t->ChargedBytes();  // not the fixed cost: no compaction frees it
      live += bytes - dead;
      figures.push_back({seg, bytes, dead});
    };
    for (const auto& [seg, t] : tables_) consider(seg, t.get());
    if (strings_owner_ != nullptr) consider(kStringsSegment, strings_owner_.get());
  }
  // compaction_garbage_ratio 0 turns automatic compaction off altogether.
  const double disk_ratio =
      options_.compaction_garbage_ratio > 0 ? options_.compaction_disk_ratio : 0.0;
  const bool over = disk_ratio > 0 && log >= options_.compaction_min_bytes &&
                    static_cast<double>(log) > disk_ratio * static_cast<double>(live);
  if (disk_ratio > 0) {
    double loan = 0;
    for (const auto& [dead, table_live] : compacting) {
      // At most what a table compacted on time frees, (disk_ratio - 1) x
      // its live bytes: a table that piled up garbage behind a slow
      // compactor lends no more.
      const double frees = std::min(static_cast<double>(dead), (disk_ratio - 1) * table_live);
      if (live > 0) loan += frees * table_live / static_cast<double>(live);
    }
    const double cap = std::max((disk_ratio + kStallMargin) * static_cast<double>(live) + loan,
                                static_cast<double>(options_.compaction_min_bytes));
    // Writers wake the compactor when what is left falls under the margin,
    // i.e. when the log passes disk_ratio x live (compaction is due): it
    // then starts before the allowance is gone, not after writes wait.
    const int64_t bytes = static_cast<int64_t>(cap) - static_cast<int64_t>(log + taken);
    SetAllowance(bytes, static_cast<int64_t>(kStallMargin * static_cast<double>(live)));
    if (allowance != nullptr) *allowance = bytes;
  } else {
    SetAllowance(kNoLimit);
    if (allowance != nullptr) *allowance = kNoLimit;
  }
  if (resume != kNoSegment) return resume;
  uint64_t pick = kNoSegment, most = 0;
  for (const Figures& f : figures) {
    const bool garbage = options_.compaction_garbage_ratio > 0 &&
                         f.bytes >= options_.compaction_min_bytes &&
                         static_cast<double>(f.dead) >=
                             options_.compaction_garbage_ratio * static_cast<double>(f.bytes);
    if ((garbage || (over && f.dead > 0)) && f.dead > most) {
      pick = f.seg;
      most = f.dead;
    }
  }
  return pick;
}

void Store::SetAllowance(int64_t bytes, int64_t wake_below) {
  renew_asked_.store(false);
  {
    std::lock_guard<std::mutex> lock(stall_mu_);
    renewed_at_ = std::chrono::steady_clock::now();
    wake_below_.store(wake_below, std::memory_order_relaxed);
    allowance_.store(bytes);
  }
  if (bytes > 0) stall_cv_.notify_all();
}

void Store::RefreshAllowance() {
  if (!renew_asked_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(stall_mu_);
    if (std::chrono::steady_clock::now() - renewed_at_ < std::chrono::milliseconds(50)) return;
  }
  (void)PickAutomatic();  // for the allowance; the pick waits for this compaction
}

void Store::AskCompactor() {
  renew_asked_.store(true);
  {
    std::lock_guard<std::mutex> lock(compact_mu_);  // no lost wake-up
  }
  compact_cv_.notify_all();
}

bool Store::RenewForWriter() {
  // While a table compacts, only the compactor renews: from its switch
  // until its old generation is deleted, that generation's files are on
  // disk but in no table's figures, and renewals that counted without them
  // let the disk pass its bound (2.05x instead of 1.9x in compaction_test's
  // churn). A compaction starting after this check reaches its switch only
  // after a copy, long after this renewal.
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    if (compacting_ != kNoSegment || !pending_.empty()) return false;
  }
  // The renewal clears renew_asked_: ask again if a compaction is due.
  int64_t renewed = 0;
  if (PickAutomatic(&renewed) != kNoSegment) AskCompactor();
  return renewed > 0;
}

void Store::WaitForCompactor(uint64_t bytes) {
  const auto n = static_cast<int64_t>(std::min<uint64_t>(bytes, kNoLimit));
  const int64_t left = allowance_.fetch_sub(n, std::memory_order_relaxed) - n;
  if (left >= 0) {
    // The one write that crosses the margin wakes the compactor (it may be
    // idle, waiting on compact_cv_ for up to 250 ms).
    const int64_t wake = wake_below_.load(std::memory_order_relaxed);
    if (left < wake && left + n >= wake) AskCompactor();
    return;
  }
  // Spent: renew it from the figures first. Writes that add no garbage leave
  // a renewal something to give (the allowance grows with the live bytes),
  // so only garbage a compaction must free makes a writer wait; waiting for
  // the compactor to wake up and renew it stalled writes into a store that
  // had none. One writer renews at a time; the others find it renewed.
  // What decides is the renewal this writer made or found, not the
  // allowance read again afterwards: the other writers may have spent a
  // renewal whole while this one was descheduled, and it then waited for a
  // compactor with nothing to do.
  {
    std::lock_guard<std::mutex> renew(renew_mu_);
    if (closed_.load() || allowance_.load() > 0 || RenewForWriter()) return;
  }
  if (allowance_.load() > 0 || closed_.load()) return;
  // Still spent: garbage past the bound. Ask the compactor to free some and
  // wait for a renewal that leaves some, or kMaxStall.
  const auto start = std::chrono::steady_clock::now();
  AskCompactor();
  {
    std::unique_lock<std::mutex> lock(stall_mu_);
    stall_cv_.wait_for(lock, kMaxStall, [this] { return allowance_.load() > 0 || closed_.load(); });
  }
  counters_->write_stalls.fetch_add(1, std::memory_order_relaxed);
  counters_->write_stall_us.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count()),
      std::memory_order_relaxed);
}

// A compaction that failed midway (its copy, or making the new generation
// durable): undo it, so the old table stays the only one and the half-made
// generation goes; a compaction that cannot be undone (resumed after a
// restart, or the old table could not take the writes back) stays pending
// and is resumed later, holding every write.
Status Store::Abandon(uint64_t segment, FlatTable* old, Room* room, const Status& why) {
  const uint64_t room_bytes = room->size();
  const uint64_t forwarded = old->ForwardedBytes();
  room->Remove();  // its blocks are what the old table takes the writes back into
  // ext4 lets freed blocks be allocated again only once the journal has
  // committed the free (the disk_full test met NoSpace right after the
  // room went): syncfs commits it. A write-back that still meets NoSpace
  // is tried again a little later (what it wrote so far is harmless: the
  // same values as the successor's).
  if (int fd = ::open(HomeDir(segment).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    (void)::syncfs(fd);
    ::close(fd);
  }
  Status undo = old->AbortCompaction();
  for (int retry = 0; retry < 5 && undo.IsNoSpace(); ++retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    undo = old->AbortCompaction();
  }
  if (!undo.ok()) {
    struct statvfs vfs;
    const uint64_t avail = statvfs(HomeDir(segment).c_str(), &vfs) == 0
                               ? static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize
                               : 0;
    spdlog::error("{}: compaction stopped ({}) and could not be undone: {} (writes to move back: "
                  "{} bytes; room given back: {}; free now: {}); its new generation is kept (it "
                  "holds every write) and resumed later",
                  HomeDir(segment), why.ToString(), undo.ToString(), forwarded, room_bytes, avail);
    return why;
  }
  // The writes moved back are durable here before their other copy goes.
  Status st = old->Sync();
  if (st.ok()) st = old->Checkpoint();
  if (!st.ok()) spdlog::warn("{}: syncing after undoing a compaction: {}", old->dir(), st.ToString());
  std::unique_ptr<FlatTable> dropped;
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    auto it = pending_.find(segment);
    if (it != pending_.end()) {
      dropped = std::move(it->second);
      pending_.erase(it);
    }
  }
  if (dropped != nullptr) {
    SynchronizeReaders();  // operations that loaded the successor pointer
    const std::string dir = dropped->dir();
    dropped->Discard();  // deleted below
    dropped.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    (void)SyncDirectory(HomeDir(segment));
  }
  spdlog::warn("{}: compaction stopped midway ({}); undone: the table is kept as it was and "
               "its new generation removed", HomeDir(segment), why.ToString());
  const std::string what = why.IsNoSpace() ? " (disk full)" : "";
  const std::string msg = HomeDir(segment) + ": compaction stopped midway" + what + ": " +
                          why.message() + "; undone, the table is kept as it was";
  if (why.IsNoSpace()) return Status::NoSpace(msg);
  return why.IsCorruption() ? Status::Corruption(msg) : Status::IOError(msg);
}

void Store::CompactorLoop() {
  RunAsBackground();
  std::unique_lock<std::mutex> lock(compact_mu_);
  bool busy = false;  // the last automatic pick found a table: look again at once
  while (!stopping_.load()) {
    if (!busy) {
      compact_cv_.wait_for(lock, std::chrono::milliseconds(250), [this] {
        return stopping_.load() || rounds_requested_ > rounds_done_ || renew_asked_.load();
      });
    }
    busy = false;
    if (stopping_.load()) break;
    const uint64_t round = rounds_requested_;
    const bool requested = round > rounds_done_;
    // After a round that ran out of space, only a request (or the backoff
    // passing) starts another: a full disk must not make the compactor
    // re-read a table every second. Writers do not wait meanwhile either.
    if (!requested && std::chrono::steady_clock::now() < no_space_backoff_) {
      SetAllowance(kNoLimit);
      continue;
    }
    lock.unlock();
    // What to compact: everything on request; otherwise what the automatic
    // policy picks, one table at a time.
    std::vector<uint64_t> targets;
    uint64_t total = 0;
    if (requested) {
      std::lock_guard<std::mutex> tables_lock(tables_mu_);
      for (const auto& [seg, t] : tables_) {
        targets.push_back(seg);
        if (t != nullptr) total += t->TotalBytes();
      }
      if (strings_owner_ != nullptr) {
        targets.push_back(kStringsSegment);
        total += strings_owner_->TotalBytes();
      }
    } else if (const uint64_t pick = PickAutomatic(); pick != kNoSegment) {
      targets.push_back(pick);
      std::lock_guard<std::mutex> tables_lock(tables_mu_);
      const FlatTable* t = OwnerLocked(pick).get();
      total = t != nullptr ? t->TotalBytes() : 0;
    }
    lock.lock();
    if (targets.empty() && !requested) continue;
    compaction_.running = true;
    round_bytes_done_.store(0);
    compaction_.bytes_total = total;
    lock.unlock();
    copy_start_ = std::chrono::steady_clock::now();
    copy_bytes_ = 0;
    Status result;
    for (uint64_t seg : targets) {
      Status st = CompactTable(seg, /*in_place=*/!requested);
      MaybeCloseIdle();  // a compaction on request reopens closed tables
      if (!st.ok()) {
        if (!stopping_.load()) spdlog::error("compacting {}: {}", HomeDir(seg), st.ToString());
        result = st;
        // A full disk ends the round: the next tables would only be refused
        // (or read for nothing), and its error is the one to report.
        if (stopping_.load() || st.IsNoSpace()) break;
      }
    }
    // A round on request compacts the sparse tier too (its own compactor
    // keeps it within its bounds otherwise).
    if (requested && sparse_ != nullptr && !stopping_.load() && !result.IsNoSpace()) {
      Status st = sparse_->Compact();
      if (!st.ok()) {
        spdlog::error("compacting the sparse tier: {}", st.ToString());
        result = st;
      }
    }
    lock.lock();
    // A table holding a record that fails its checksum (and no lost_value)
    // fails each time until it is repaired: it waits as a full disk does.
    if (result.IsNoSpace() || result.IsCorruption()) {
      no_space_backoff_ = std::chrono::steady_clock::now() + kNoSpaceBackoff;
      SetAllowance(kNoLimit);
    }
    compaction_.running = false;
    round_bytes_done_.store(compaction_.bytes_total);
    compaction_.last_error = result.ok() ? "" : result.ToString();
    if (requested) {
      rounds_done_ = round;
      round_status_ = result;
    } else {
      busy = result.ok();
    }
    compact_cv_.notify_all();
  }
  SetAllowance(kNoLimit);  // nobody renews it any more
}

Status Store::Compact() {
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  std::lock_guard<std::mutex> lock(compact_mu_);
  ++rounds_requested_;
  compact_cv_.notify_all();
  return Status::OK();
}

Status Store::CompactAndWait() {
  std::unique_lock<std::mutex> lock(compact_mu_);
  if (closed_.load()) return Status::IOError("store " + options_.path + " is closed");
  const uint64_t round = ++rounds_requested_;
  compact_cv_.notify_all();
  compact_cv_.wait(lock, [&] { return rounds_done_ >= round || stopping_.load(); });
  if (rounds_done_ < round) return Status::Busy("store closed before compaction finished");
  return round_status_;
}

CompactionStatus Store::GetCompactionStatus() const {
  std::lock_guard<std::mutex> lock(compact_mu_);
  CompactionStatus s = compaction_;
  s.bytes_done = std::min(round_bytes_done_.load(std::memory_order_relaxed), s.bytes_total);
  s.percent = s.bytes_total == 0 ? (s.running ? 0.0 : 100.0)
                                 : 100.0 * static_cast<double>(s.bytes_done) /
                                       static_cast<double>(s.bytes_total);
  return s;
}

}  // namespace flatkv::engine
