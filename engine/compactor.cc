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

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/flat_table.h"
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

// ---------------------------------------------------------------------------
// Readers and reclamation

Store::Guard::Guard(const Store* store) : store_(store) {
  static std::atomic<size_t> next_slot{0};
  thread_local const size_t my_slot = next_slot.fetch_add(1) % kReaderSlots;
  slot_ = my_slot;
  parity_ = static_cast<int>(store->epoch_.load() & 1);
  store->reader_slots_[slot_].count[parity_].fetch_add(1);
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

// String buckets move to the new generation with only their live entries;
// an empty bucket is dropped. Integer values move as they are.
std::function<bool(std::string*)> Store::BucketTransform(uint64_t segment) {
  if (segment != kStringsSegment) return nullptr;
  return [](std::string* bucket) {
    std::string live;
    for (const auto& [k, v] : LiveBucketEntries(*bucket)) AppendBucketPut(&live, k, v);
    bucket->swap(live);
    return !bucket->empty();
  };
}

// ---------------------------------------------------------------------------
// Homes and generations

std::string Store::HomeDir(uint64_t segment) const {
  return segment == kStringsSegment ? options_.path + "/strings" : SegmentDir(segment);
}

std::unique_ptr<FlatTable>& Store::OwnerLocked(uint64_t segment) {
  return segment == kStringsSegment ? strings_owner_ : tables_[segment];
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

Status Store::CompactTable(uint64_t segment) {
  // Pin the segment: CloseIdle must not close a table the compactor holds a
  // raw pointer to (it would otherwise be one more candidate, since the
  // compactor's pointers live outside any Guard).
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    compacting_ = segment;
  }
  Status st = CompactPinned(segment);
  {
    std::lock_guard<std::mutex> lock(tables_mu_);
    compacting_ = kNoSegment;
  }
  return st;
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
    std::unique_ptr<FlatTable>& owner = OwnerLocked(segment);
    if (owner == nullptr && segment != kStringsSegment) {
      FlatTable* reopened;  // closed by the open-table budget: reopen it
      FLATKV_RETURN_IF_ERROR(OpenSegmentLocked(segment, &reopened));
    }
    if (owner == nullptr) return Status::OK();
    old = owner.get();
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
    old->BeginCompaction(next, &ends, BucketTransform(segment));
  }
  const uint64_t before = old->TotalBytes();
  for (int f = 0; f < static_cast<int>(ends.size()); ++f) {
    FLATKV_RETURN_IF_ERROR(
        old->CopyLive(f, ends[f], [this](uint64_t bytes) { return CompactionProgress(bytes); }));
  }
  // The new generation must be durable before CURRENT names it.
  FLATKV_RETURN_IF_ERROR(next->Sync());
  FLATKV_RETURN_IF_ERROR(next->Checkpoint());
  FLATKV_RETURN_IF_ERROR(SyncDirectory(next->dir()));
  FLATKV_RETURN_IF_ERROR(WriteCurrent(home, gen + 1));
  old->FinishCompaction();
  std::unique_ptr<FlatTable> retired;
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
    }
  }
  SynchronizeReaders();
  const std::string old_dir = retired->dir();
  Status st = retired->Close();
  if (!st.ok()) spdlog::warn("closing the compacted table {}: {}", old_dir, st.ToString());
  retired.reset();
  if (gen == 0) {
    RemoveGenerationZero(home);
  } else {
    std::error_code ec;
    std::filesystem::remove_all(old_dir, ec);
  }
  FLATKV_RETURN_IF_ERROR(SyncDirectory(home));
  const uint64_t after = next->TotalBytes();
  spdlog::info("{}: compacted generation {} -> {}: {} -> {} log bytes", home, gen, gen + 1, before,
               after);
  std::lock_guard<std::mutex> lock(compact_mu_);
  ++compaction_.tables_compacted;
  compaction_.bytes_reclaimed += before > after ? before - after : 0;
  return Status::OK();
}

void Store::CompactorLoop() {
  std::unique_lock<std::mutex> lock(compact_mu_);
  while (!stopping_.load()) {
    compact_cv_.wait_for(lock, std::chrono::seconds(1), [this] {
      return stopping_.load() || rounds_requested_ > rounds_done_;
    });
    if (stopping_.load()) break;
    const uint64_t round = rounds_requested_;
    const bool requested = round > rounds_done_;
    // After a round that ran out of space, only a request (or the backoff
    // passing) starts another: a full disk must not make the compactor
    // re-read a table every second.
    if (!requested && std::chrono::steady_clock::now() < no_space_backoff_) continue;
    lock.unlock();
    // What to compact: everything on request; otherwise unfinished
    // compactions and tables whose garbage passed the ratio.
    std::vector<uint64_t> targets;
    uint64_t total = 0;
    {
      std::lock_guard<std::mutex> tables_lock(tables_mu_);
      auto consider = [&](uint64_t seg, const FlatTable* t) {
        if (t == nullptr) {  // closed by the open-table budget: only on request
          if (requested) targets.push_back(seg);
          return;
        }
        const uint64_t bytes = t->TotalBytes();
        const bool garbage = options_.compaction_garbage_ratio > 0 &&
                             bytes >= options_.compaction_min_bytes &&
                             static_cast<double>(t->DeadBytes()) >=
                                 options_.compaction_garbage_ratio * static_cast<double>(bytes);
        if (requested || garbage || pending_.count(seg) > 0) {
          targets.push_back(seg);
          total += bytes;
        }
      };
      for (const auto& [seg, t] : tables_) consider(seg, t.get());
      if (strings_owner_ != nullptr) consider(kStringsSegment, strings_owner_.get());
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
      Status st = CompactTable(seg);
      MaybeCloseIdle();  // a compaction on request reopens closed tables
      if (!st.ok()) {
        if (!stopping_.load()) spdlog::error("compacting {}: {}", HomeDir(seg), st.ToString());
        result = st;
        if (stopping_.load()) break;
      }
    }
    lock.lock();
    if (result.IsNoSpace()) {
      no_space_backoff_ = std::chrono::steady_clock::now() + kNoSpaceBackoff;
    }
    compaction_.running = false;
    round_bytes_done_.store(compaction_.bytes_total);
    compaction_.last_error = result.ok() ? "" : result.ToString();
    if (requested) {
      rounds_done_ = round;
      round_status_ = result;
    }
    compact_cv_.notify_all();
  }
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
