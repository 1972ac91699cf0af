#include "engine/flat_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

namespace flatkv::engine {
namespace {

constexpr size_t kNoHintGuess = 4096;
// Enough to read a record's header and an append fragment's part list.
constexpr size_t kHeadBytes = kRecordHeaderSize + 1 + kMaxAppendParts * kAppendPartBytes;
// Reads larger than this use a one-off buffer instead of the thread's.
constexpr size_t kMaxScratch = 1 << 20;
// Records whose size hint is at least this are read with the value straight
// into the caller's string (ReadLargeValue): a pread into a scratch buffer
// and a copy out cost a 100 KiB get 10% of its time in the copy.
constexpr size_t kSplitReadBytes = 16 << 10;
// A compaction copies verbatim records in batches of about this many bytes
// (one write each, under the old file's mutex), and reports progress (and
// checks whether to stop) every this many bytes read.
constexpr size_t kCopyBatchBytes = 64 << 10;
// CopyLive prefetches the index slots of this many records ahead, every
// half of it.
constexpr int kCopyPrefetch = 16;

// Size classes (FORMAT.md): with 6 hint bits (5-byte slots) a class bounds
// a record within 1.5x, with 8 hint bits (6- to 8-byte slots) within 1.125x.
uint64_t SizeBound(int hint_bits, unsigned c) {
  if (hint_bits == 6) return uint64_t{2 + (c & 1)} << ((c >> 1) + 4);
  return uint64_t{8 + (c & 7)} << (c >> 3);
}

unsigned SizeClass(int hint_bits, uint64_t n) {
  const int mantissa = hint_bits == 6 ? 1 : 3;
  const int shift = hint_bits == 6 ? 4 : 0;
  // Start at the lowest class of the exponent just below n, then step up.
  const int top = n > 1 ? 63 - __builtin_clzll(n - 1) : 0;
  const int e = std::max(0, top - mantissa - shift);
  unsigned c = static_cast<unsigned>(e) << mantissa;
  while (SizeBound(hint_bits, c) < n) ++c;
  return c;
}

}  // namespace

FlatTable::FlatTable(const TableParams& params, EngineCounters* counters)
    : params_(params), counters_(counters) {
  const int w = params.index.item_bytes;
  hint_bits_ = w == 4 ? 0 : w == 5 ? 6 : 8;
  const uint64_t max_value = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  pos_limit_ = (max_value - 1) >> hint_bits_;
  files_.reset(new FileState[params.index.data_files]);
  const auto n = static_cast<size_t>(params.index.data_files);
  heads_.assign(n, 0);
  clean_to_.assign(n, 0);
  clean_freed_.assign(n, 0);
}

FlatTable::~FlatTable() {
  Status st = Close();
  if (!st.ok()) spdlog::error("closing table {}: {}", params_.dir, st.ToString());
}

std::string FlatTable::DataPath(int file) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/data-%03d.log", file);
  return params_.dir + name;
}

uint64_t FlatTable::EncodeSlot(uint64_t pos, size_t size) const {
  const uint64_t hint = hint_bits_ == 0 ? 0 : SizeClass(hint_bits_, size);
  return ((pos << hint_bits_) | hint) + 1;
}

void FlatTable::DecodeSlot(uint64_t v, uint64_t* pos, size_t* guess) const {
  const uint64_t x = v - 1;
  *pos = x >> hint_bits_;
  const uint64_t mask = (uint64_t{1} << hint_bits_) - 1;
  *guess = hint_bits_ == 0
               ? kNoHintGuess
               : static_cast<size_t>(SizeBound(hint_bits_, static_cast<unsigned>(x & mask)));
}

uint64_t FlatTable::ReadSlot(const FileState& fs, uint64_t slot) const {
  for (;;) {
    const uint32_t s1 = fs.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;  // a writer is mid-update: its slot may be torn
    const uint64_t v = index_->Load(slot);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (fs.seq.load(std::memory_order_relaxed) == s1) return v;
  }
}

Status FlatTable::WriteSlot(FileState& fs, uint64_t slot, uint64_t value) {
  const uint32_t s = fs.seq.load(std::memory_order_relaxed);
  fs.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  Status st = index_->Store(slot, value);
  fs.seq.store(s + 2, std::memory_order_release);
  return st;
}

uint64_t FlatTable::CurrentSlotLocked(const FileState& fs, uint64_t slot) const {
  for (auto it = fs.pending.rbegin(); it != fs.pending.rend(); ++it) {
    if (it->slot == slot) return it->value;
  }
  return index_->Load(slot);
}

Status FlatTable::SyncLayout() {
  if (layout_synced_.load(std::memory_order_acquire) >=
      layout_changes_.load(std::memory_order_acquire)) {
    return Status::OK();
  }
  std::lock_guard<std::mutex> lock(layout_mu_);
  // Creations counted here happened before the syncs below, which cover them.
  const uint64_t changes = layout_changes_.load(std::memory_order_acquire);
  if (layout_synced_.load(std::memory_order_relaxed) >= changes) return Status::OK();
  if (layout_created_) {
    const std::string meta = params_.dir + "/META";
    const int fd = ::open(meta.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno("opening " + meta, errno);
    const int rc = fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno("syncing " + meta, err);
  }
  // Without this, an OS crash could drop a new name and with it records
  // that fdatasync had made durable.
  FLATKV_RETURN_IF_ERROR(SyncDirectory(params_.dir));
  if (layout_created_) {
    const std::string parent = params_.dir.substr(0, params_.dir.find_last_of('/'));
    if (!parent.empty() && parent != params_.dir) FLATKV_RETURN_IF_ERROR(SyncDirectory(parent));
    layout_created_ = false;
  }
  layout_synced_.store(changes, std::memory_order_release);
  return Status::OK();
}

Status FlatTable::EnsureWritable() {
  if (dirty_marked_.load(std::memory_order_acquire)) return Status::OK();
  std::lock_guard<std::mutex> lock(header_mu_);
  if (closed_) return Status::IOError(params_.dir + " is closed");
  if (!dirty_marked_.load(std::memory_order_relaxed)) {
    // From here until the next clean close, a crash must trigger recovery.
    FLATKV_RETURN_IF_ERROR(index_->WriteHeader(false, index_->checkpoints()));
    dirty_marked_.store(true, std::memory_order_release);
  }
  return Status::OK();
}

Status FlatTable::LogForWrite(FileState& fs, int file, LogFile** log) {
  if (fs.owner == nullptr) {
    std::unique_ptr<LogFile> created;
    FLATKV_RETURN_IF_ERROR(LogFile::Open(DataPath(file), true, &created));
    // Its name becomes durable in SyncLayout, before any of its records do.
    layout_changes_.fetch_add(1, std::memory_order_release);
    fs.log.store(created.get(), std::memory_order_release);
    fs.owner = std::move(created);
    counters_->data_files_open.fetch_add(1, std::memory_order_relaxed);
  }
  *log = fs.owner.get();
  return Status::OK();
}

uint64_t FlatTable::DeadEstimate(uint64_t size) const {
  return hint_bits_ == 0 ? size : SizeBound(hint_bits_, SizeClass(hint_bits_, size));
}

uint64_t FlatTable::RecordBytesEstimate(uint64_t slot_value, size_t fallback) const {
  if (slot_value == 0) return 0;
  if (hint_bits_ == 0) return fallback;  // no size hint: assume the same size
  uint64_t pos;
  size_t guess;
  DecodeSlot(slot_value, &pos, &guess);
  return guess;
}

Status FlatTable::Write(FileState& fs, std::unique_lock<std::mutex>& lk, int file, int64_t key,
                        RecordType type, std::string_view prefix, std::string_view value,
                        Durability durability) {
  if (!fs.error.ok()) return fs.error;
  LogFile* log;
  FLATKV_RETURN_IF_ERROR(LogForWrite(fs, file, &log));
  const size_t size = RecordSize(prefix.size() + value.size());
  if (log->end() + size >= pos_limit_) {
    return Status::NoSpace(log->path() + " reached the " + std::to_string(pos_limit_) +
                           "-byte limit of index_item_bytes=" +
                           std::to_string(params_.index.item_bytes) + "; compact the table");
  }
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  // The slot's index page first: on a full disk the write then fails before
  // its record is in the log, so a failed write never turns up later (by
  // crash recovery replaying a record whose slot was never set).
  FLATKV_RETURN_IF_ERROR(index_->Reserve(slot));
  uint64_t pos;
  size_t written;
  FLATKV_RETURN_IF_ERROR(log->Append(type, key, NowMicros(), prefix, value, &pos, &written));
  counters_->bytes_appended.fetch_add(written, std::memory_order_relaxed);
  fs.dirty.store(true, std::memory_order_relaxed);
  const uint64_t v = type == RecordType::kTombstone ? 0 : EncodeSlot(pos, written);
  // What this write makes garbage: the record it replaces (an append keeps
  // it as a part) and, for a remove, the tombstone itself once compacted.
  uint64_t dead = type == RecordType::kAppend ? 0
                                              : RecordBytesEstimate(CurrentSlotLocked(fs, slot), written);
  if (type == RecordType::kTombstone) dead += written;
  if (dead > 0) dead_bytes_.fetch_add(dead, std::memory_order_relaxed);
  if (params_.sync != SyncMode::kAlways) {
    FLATKV_RETURN_IF_ERROR(WriteSlot(fs, slot, v));
    fs.applied = log->end();
    return Status::OK();
  }
  if (durability == Durability::kNoWait) {
    // A compaction copy under sync: always: visible now, made durable with
    // the whole copy. It must not move "applied": writers queued for group
    // commit before it would take that for their own fdatasync.
    return WriteSlot(fs, slot, v);
  }
  fs.pending.push_back({slot, v});
  ++fs.queued;
  if (fs.gathering && fs.pending.size() >= fs.expected) fs.more.notify_one();
  if (durability == Durability::kQueue) return Status::OK();
  return WaitDurable(fs, lk, log->end());
}

Status FlatTable::WaitDurable(FileState& fs, std::unique_lock<std::mutex>& lk, uint64_t end) {
  while (fs.applied < end) {
    if (!fs.error.ok()) return fs.error;
    if (fs.syncing) {
      fs.cv.wait(lk);
      continue;
    }
    // Become the leader: one fdatasync covers every record appended so far.
    fs.syncing = true;
    if (fs.pending.size() < fs.expected) {
      // Back-to-back syncs split steady writers into two groups that take
      // turns, halving each batch. So wait (at most half a sync) for as many
      // writers as the last sync saw: the ones it released append again now.
      fs.gathering = true;
      const auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::nanoseconds(std::min<int64_t>(fs.last_sync_ns / 2, 1000000));
      fs.more.wait_until(lk, deadline, [&] { return fs.pending.size() >= fs.expected; });
      fs.gathering = false;
    }
    LogFile* log = fs.owner.get();
    const uint64_t target = log->end();
    const size_t batch = fs.pending.size();
    lk.unlock();
    const auto start = std::chrono::steady_clock::now();
    Status st = SyncLayout();  // a new table's or file's names first
    if (st.ok()) st = log->Sync();
    const auto took = std::chrono::steady_clock::now() - start;
    counters_->fdatasyncs.fetch_add(1, std::memory_order_relaxed);
    lk.lock();
    fs.last_sync_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
    fs.expected = std::max<size_t>(1, fs.pending.size());  // covered + arrived meanwhile
    for (size_t i = 0; st.ok() && i < batch; ++i) {
      st = WriteSlot(fs, fs.pending[i].slot, fs.pending[i].value);
    }
    fs.pending.erase(fs.pending.begin(), fs.pending.begin() + static_cast<long>(batch));
    fs.dequeued += batch;
    if (st.ok()) {
      fs.applied = target;
    } else {
      // After a failed fdatasync the page cache can no longer be trusted to
      // match the disk (PostgreSQL's fsyncgate): refuse further writes.
      spdlog::error("{}: {}; refusing further writes to this file", log->path(), st.ToString());
      fs.error = st;
    }
    fs.syncing = false;
    fs.cv.notify_all();
  }
  return Status::OK();
}

Status FlatTable::Put(int64_t key, std::string_view value) {
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const int file = static_cast<int>(slot % params_.index.data_files);
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  // Compacting: this file's mutex orders the write against the copier.
  if (FlatTable* next = successor()) {
    NoteForwardedLocked(file, slot);
    return next->Put(key, value);
  }
  lk.unlock();
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  lk.lock();
  if (FlatTable* next = successor()) {
    NoteForwardedLocked(file, slot);
    return next->Put(key, value);
  }
  return Write(fs, lk, file, key, RecordType::kValue, {}, value);
}

// Groups the items by data file, then writes each group under one hold of
// the file's mutex and, with sync: always, one group commit.
Status FlatTable::PutBatch(const std::vector<KeyValueRef>& pairs,
                           const std::vector<uint32_t>& items) {
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  const uint32_t files = params_.index.data_files;
  std::vector<uint32_t> order(items);
  auto file_of = [&](uint32_t i) {
    return (static_cast<uint64_t>(pairs[i].key) - static_cast<uint64_t>(kmin())) % files;
  };
  // Stable: a key given twice keeps its request order within its file.
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return file_of(a) < file_of(b); });
  for (size_t begin = 0; begin < order.size();) {
    const int file = static_cast<int>(file_of(order[begin]));
    size_t end = begin;
    while (end < order.size() && file_of(order[end]) == static_cast<uint64_t>(file)) ++end;
    FLATKV_RETURN_IF_ERROR(PutFileBatch(file, pairs, order.data() + begin, end - begin));
    begin = end;
  }
  return Status::OK();
}

Status FlatTable::PutFileBatch(int file, const std::vector<KeyValueRef>& pairs,
                               const uint32_t* items, size_t n) {
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  if (FlatTable* next = successor()) {
    // Compacting: the new table takes the writes, one by one (rare), with
    // this file's mutex held as Put holds it: CopyLive checks "absent from
    // the successor" and copies under it, so a write let through without it
    // could land between the two and be overwritten by the older copy (the
    // soak caught a multiPut's value lost that way, seen only by scans: the
    // cache still held the new value).
    for (size_t i = 0; i < n; ++i) {
      NoteForwardedLocked(file, static_cast<uint64_t>(pairs[items[i]].key) -
                                    static_cast<uint64_t>(kmin()));
      FLATKV_RETURN_IF_ERROR(next->Put(pairs[items[i]].key, pairs[items[i]].value));
    }
    return Status::OK();
  }
  const bool group = params_.sync == SyncMode::kAlways;
  Status st;
  for (size_t i = 0; st.ok() && i < n; ++i) {
    st = Write(fs, lk, file, pairs[items[i]].key, RecordType::kValue, {}, pairs[items[i]].value,
               group ? Durability::kQueue : Durability::kWait);
  }
  // What was queued must become durable even if a later write failed.
  if (group && fs.owner != nullptr) {
    Status durable = WaitDurable(fs, lk, fs.owner->end());
    if (st.ok()) st = durable;
  }
  return st;
}

Status FlatTable::PutCopy(int64_t key, std::string_view value) {
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const int file = static_cast<int>(slot % params_.index.data_files);
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  FLATKV_RETURN_IF_ERROR(
      Write(fs, lk, file, key, RecordType::kValue, {}, value, Durability::kNoWait));
  copied_bytes_.fetch_add(RecordSize(value.size()), std::memory_order_relaxed);
  return Status::OK();
}

Status FlatTable::Remove(int64_t key, bool* existed) {
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const int file = static_cast<int>(slot % params_.index.data_files);
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  FlatTable* next = successor();
  if (next != nullptr && successor_done_.load(std::memory_order_acquire)) {
    return next->Remove(key, existed);
  }
  // Compacting: remove here first, then from the successor. Between the two
  // (for a reader, or after a crash) the successor still shows the value the
  // key had before the remove; the other order would let a get fall back to
  // an older value here.
  const bool here = CurrentSlotLocked(fs, slot) != 0;
  if (here) FLATKV_RETURN_IF_ERROR(Write(fs, lk, file, key, RecordType::kTombstone, {}, {}));
  bool there = false;
  if (next != nullptr) {
    NoteForwardedLocked(file, slot);
    FLATKV_RETURN_IF_ERROR(next->Remove(key, &there));
  }
  if (existed != nullptr) *existed = here || there;
  return Status::OK();
}

bool FlatTable::Contains(int64_t key) const {
  if (FlatTable* next = successor()) {
    const bool done = successor_done_.load(std::memory_order_acquire);  // first: see Get()
    if (next->Contains(key)) return true;
    if (done) return false;
  }
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  return ReadSlot(files_[slot % params_.index.data_files], slot) != 0;
}

Status FlatTable::Get(int64_t key, std::string* value) const {
  if (FlatTable* next = successor()) {
    // Compacting: the successor has every write since the start and the
    // copies so far; whatever it lacks is still here (removes reach both).
    // "done" is read before the successor: a miss there means "absent" only
    // if the copy had finished before it. Read after, a key copied between
    // the miss and the switch read as absent although this table still held
    // it (a get racing a compaction's end would answer NotFound for a key
    // put long before, and a string put could then rewrite the bucket
    // without its other keys).
    const bool done = successor_done_.load(std::memory_order_acquire);
    Status st = next->Get(key, value);
    if (!st.IsNotFound() || done) return st;
  }
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const FileState& fs = files_[slot % params_.index.data_files];
  const uint64_t v = ReadSlot(fs, slot);
  if (v == 0) return Status::NotFound("key " + std::to_string(key));
  return ReadValue(fs.log.load(std::memory_order_acquire), key, v, value);
}

Status FlatTable::ReadIfSmall(int64_t key, size_t max_bytes, std::string* value,
                              bool* small) const {
  *small = false;
  if (FlatTable* next = successor()) {
    // Compacting: as Get(), the successor first; what it lacks is still here.
    const bool done = successor_done_.load(std::memory_order_acquire);
    Status st = next->ReadIfSmall(key, max_bytes, value, small);
    if (!st.IsNotFound() || done) return st;
  }
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const FileState& fs = files_[slot % params_.index.data_files];
  const uint64_t v = ReadSlot(fs, slot);
  if (v == 0) return Status::NotFound("no record");
  uint64_t pos;
  size_t guess;
  DecodeSlot(v, &pos, &guess);
  if (guess > RecordSize(max_bytes) * 2) return Status::OK();  // the hint says: too big
  thread_local std::string scratch;
  RecordView view;
  const LogFile* log = fs.log.load(std::memory_order_acquire);
  FLATKV_RETURN_IF_ERROR(ReadRecord(log, key, pos, guess, &scratch, &view));
  if (view.type == RecordType::kAppend) {
    // Appended to (a bucket that was large once, or written while its table
    // compacted): small if all its parts together are, and then read whole,
    // so the caller's rewrite makes it one record again.
    std::vector<AppendPart> parts;
    std::string_view tail;
    if (!DecodeAppendParts(view.value, &parts, &tail)) return Status::OK();  // Get() reports it
    uint64_t total = tail.size();
    for (const AppendPart& p : parts) total += p.payload_size;
    if (total > max_bytes) return Status::OK();
    const std::string newest(view.value);  // Assemble reads into the scratch
    FLATKV_RETURN_IF_ERROR(Assemble(log, key, newest, value));
    *small = true;
    return Status::OK();
  }
  if (view.type != RecordType::kValue || view.value.size() > max_bytes) return Status::OK();
  value->assign(view.value.data(), view.value.size());
  *small = true;
  return Status::OK();
}

Status FlatTable::ReadRecord(const LogFile* log, int64_t key, uint64_t pos, size_t guess,
                             std::string* buf, RecordView* view) const {
  // A slot is input from disk too: never trust it with an allocation size.
  const uint64_t end = log != nullptr ? log->end() : 0;
  if (pos + kRecordHeaderSize + kRecordKeySize > end) {
    counters_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
    return Status::Corruption(params_.dir + ": index entry for key " + std::to_string(key) +
                              " points at offset " + std::to_string(pos) +
                              ", past the end of data file " +
                              std::to_string((static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin())) %
                                             params_.index.data_files));
  }
  guess = static_cast<size_t>(std::min<uint64_t>(guess, end - pos));
  // From the read mapping (parsed in place, no system call) where
  // ReadForGet allows it, else one pread (the checksum is verified either
  // way, by ParseRecord).
  const char* data;
  size_t got;
  FLATKV_RETURN_IF_ERROR(log->ReadForGet(pos, guess, buf, &data, &got));
  const char* reason = "truncated record";
  ParseResult r = ParseRecord(data, got, view, &reason);
  if (r == ParseResult::kIncomplete && got == guess) {
    // No size hint (4-byte slots) and a record larger than the first read.
    const size_t need = static_cast<size_t>(std::min<uint64_t>(view->size, end - pos));
    if (data != buf->data()) buf->assign(data, got);
    buf->resize(need);
    size_t more = 0;
    FLATKV_RETURN_IF_ERROR(log->Read(pos + got, need - got, buf->data() + got, &more));
    r = ParseRecord(buf->data(), got + more, view, &reason);
  }
  if (r == ParseResult::kOk && view->key != key) reason = "record belongs to another key";
  if (r != ParseResult::kOk || view->key != key || view->type == RecordType::kTombstone) {
    if (r == ParseResult::kOk && view->type == RecordType::kTombstone) reason = "tombstone";
    const uint64_t seen = counters_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
    std::string msg = log->path() + " offset " + std::to_string(pos) + " (key " +
                      std::to_string(key) + "): " + reason;
    // A damaged file can fail every read: log the first few, then every 1000th.
    if (seen < 10 || seen % 1000 == 0) {
      spdlog::error("corrupt record ({} so far): {}", seen + 1, msg);
    }
    return Status::Corruption(msg);
  }
  return Status::OK();
}

bool FlatTable::ReadLargeValue(const LogFile* log, int64_t key, uint64_t pos, size_t guess,
                               std::string* out) const {
  // Anything unexpected (a bad slot, a bad or appended record) returns
  // false: the caller reads it the general way, which says what is wrong.
  const uint64_t end = log != nullptr ? log->end() : 0;
  if (pos >= end || end - pos < kSplitReadBytes) return false;
  guess = static_cast<size_t>(std::min<uint64_t>(guess, end - pos));
  // Read into the thread's buffer and swap it with *out on success, so a
  // failed read leaves *out as it was and a caller that reuses its string
  // hands its buffer back for the next read (no allocation once warm).
  thread_local std::string buf;
  char header[kRecordHeaderSize];
  buf.resize(guess - kRecordHeaderSize);
  size_t got = 0;
  if (!log->ReadSplit(pos, header, sizeof(header), buf.data(), buf.size(), &got).ok() ||
      got < kRecordHeaderSize) {
    return false;
  }
  RecordView view;
  if (ParseRecordSplit(header, buf.data(), got - kRecordHeaderSize, &view) != ParseResult::kOk ||
      view.key != key || view.type != RecordType::kValue) {
    return false;
  }
  buf.resize(view.value.size());  // the value is at the front
  out->swap(buf);
  if (buf.capacity() > kMaxScratch) std::string().swap(buf);
  return true;
}

Status FlatTable::ReadValue(const LogFile* log, int64_t key, uint64_t slot_value,
                            std::string* out) const {
  uint64_t pos;
  size_t guess;
  DecodeSlot(slot_value, &pos, &guess);
  if (guess >= kSplitReadBytes && ReadLargeValue(log, key, pos, guess, out)) {
    return Status::OK();
  }
  thread_local std::string scratch;
  std::string big;
  std::string* buf = guess > kMaxScratch ? &big : &scratch;
  RecordView view;
  FLATKV_RETURN_IF_ERROR(ReadRecord(log, key, pos, guess, buf, &view));
  if (view.type == RecordType::kAppend) {
    // Assemble reads more records into the thread's scratch: keep a copy.
    const std::string newest(view.value);
    return Assemble(log, key, newest, out);
  }
  out->assign(view.value.data(), view.value.size());
  if (buf->size() > kMaxScratch) std::string().swap(*buf);
  return Status::OK();
}

Status FlatTable::ReadPayload(const LogFile* log, int64_t key, const AppendPart& part,
                              std::string* out) const {
  std::string buf;
  RecordView view;
  FLATKV_RETURN_IF_ERROR(ReadRecord(log, key, part.record_pos, part.record_size, &buf, &view));
  std::string_view payload = view.value;
  if (view.type == RecordType::kAppend) {
    std::vector<AppendPart> ignored;
    if (!DecodeAppendParts(view.value, &ignored, &payload)) payload = {};
  }
  if (payload.size() != part.payload_size) {
    return Status::Corruption(log->path() + " offset " + std::to_string(part.record_pos) +
                              " (key " + std::to_string(key) + "): append part has " +
                              std::to_string(payload.size()) + " bytes, expected " +
                              std::to_string(part.payload_size));
  }
  out->assign(payload.data(), payload.size());
  return Status::OK();
}

Status FlatTable::Assemble(const LogFile* log, int64_t key, std::string_view newest,
                           std::string* out) const {
  std::vector<AppendPart> parts;
  std::string_view tail;
  if (!DecodeAppendParts(newest, &parts, &tail)) {
    return Status::Corruption(log->path() + ": bad append part list for key " +
                              std::to_string(key));
  }
  size_t total = tail.size();
  for (const AppendPart& p : parts) total += p.payload_size;
  std::string result;
  result.reserve(total);
  std::string piece;
  for (const AppendPart& p : parts) {
    FLATKV_RETURN_IF_ERROR(ReadPayload(log, key, p, &piece));
    result += piece;
  }
  result.append(tail.data(), tail.size());
  out->swap(result);
  return Status::OK();
}

Status FlatTable::ReadGoodSuffix(int64_t key, std::string* suffix) const {
  suffix->clear();
  if (FlatTable* next = successor()) {
    const bool done = successor_done_.load(std::memory_order_acquire);  // first: see Get()
    Status st = next->ReadGoodSuffix(key, suffix);
    if (!st.IsNotFound() || done) return st;
  }
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const FileState& fs = files_[slot % params_.index.data_files];
  const uint64_t v = ReadSlot(fs, slot);
  if (v == 0) return Status::NotFound("key " + std::to_string(key));
  const LogFile* log = fs.log.load(std::memory_order_acquire);
  uint64_t pos;
  size_t guess;
  DecodeSlot(v, &pos, &guess);
  std::string buf;
  RecordView view;
  Status st = ReadRecord(log, key, pos, guess, &buf, &view);
  if (st.IsCorruption()) return Status::OK();  // the newest record: nothing survives
  FLATKV_RETURN_IF_ERROR(st);
  if (view.type != RecordType::kAppend) {
    suffix->assign(view.value.data(), view.value.size());
    return Status::OK();
  }
  std::vector<AppendPart> parts;
  std::string_view tail;
  if (!DecodeAppendParts(view.value, &parts, &tail)) return Status::OK();
  const std::string newest(tail);
  std::string piece;
  for (const AppendPart& p : parts) {
    st = ReadPayload(log, key, p, &piece);
    if (st.IsCorruption()) {
      suffix->clear();  // lost: and with it what the parts before meant
    } else {
      FLATKV_RETURN_IF_ERROR(st);
      *suffix += piece;
    }
  }
  *suffix += newest;
  return Status::OK();
}

Status FlatTable::Append(int64_t key, std::string_view value, AppendInfo* info) {
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  const uint64_t slot = static_cast<uint64_t>(key) - static_cast<uint64_t>(kmin());
  const int file = static_cast<int>(slot % params_.index.data_files);
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  if (FlatTable* next = successor()) {
    if (successor_done_.load(std::memory_order_acquire) || next->Contains(key) ||
        CurrentSlotLocked(fs, slot) == 0) {
      NoteForwardedLocked(file, slot);
      return next->Append(key, value, info);
    }
    // The value is still only here: move it over whole (as the copier
    // would), with the new bytes.
    std::string whole;
    FLATKV_RETURN_IF_ERROR(ReadValue(fs.log.load(std::memory_order_acquire), key,
                                     CurrentSlotLocked(fs, slot), &whole));
    if (transform_ && !transform_.rewrite(&whole)) whole.clear();
    if (whole.size() + value.size() > params_.max_value_bytes) {
      return Status::ValueTooLarge("appending to key " + std::to_string(key) +
                                   " would exceed max_value_bytes");
    }
    whole.append(value.data(), value.size());
    if (info != nullptr) *info = {whole.size(), whole.size()};
    NoteForwardedLocked(file, slot);
    return next->Put(key, whole);
  }
  const uint64_t cur = CurrentSlotLocked(fs, slot);
  if (cur == 0) {
    if (info != nullptr) *info = {value.size(), value.size()};
    return Write(fs, lk, file, key, RecordType::kValue, {}, value);
  }
  if (!fs.error.ok()) return fs.error;

  // The parts of the current value, oldest first, from the newest record's
  // header (and part list, for a fragment).
  LogFile* log = fs.owner.get();
  uint64_t pos;
  size_t guess;
  DecodeSlot(cur, &pos, &guess);
  // The head: from the read mapping where ReadForGet allows it (no system
  // call), else one pread.
  std::string head;
  const char* bytes;
  size_t got;
  FLATKV_RETURN_IF_ERROR(log->ReadForGet(pos, std::min(guess, kHeadBytes), &head, &bytes, &got));
  if (bytes != head.data()) head.assign(bytes, got);
  RecordView view;
  const char* reason = "unreadable";
  if (ParseRecord(head.data(), got, &view, &reason) == ParseResult::kBad) {
    return Status::Corruption(log->path() + " offset " + std::to_string(pos) + ": " + reason);
  }
  const uint32_t value_size = static_cast<uint32_t>(view.size - RecordSize(0));
  std::vector<AppendPart> parts;
  uint32_t newest_payload = value_size;
  if (static_cast<RecordType>(head[12]) == RecordType::kAppend) {
    std::string_view payload;
    std::string_view stored(head.data() + kRecordHeaderSize,
                            std::min<size_t>(value_size, got - kRecordHeaderSize));
    const size_t n = stored.empty() ? 0 : static_cast<uint8_t>(stored[0]);
    if (!DecodeAppendParts(stored.substr(0, std::min(stored.size(), 1 + n * kAppendPartBytes)),
                           &parts, &payload)) {
      return Status::Corruption(log->path() + " offset " + std::to_string(pos) +
                                ": bad append part list for key " + std::to_string(key));
    }
    newest_payload = value_size - static_cast<uint32_t>(1 + n * kAppendPartBytes);
  }
  parts.push_back({pos, static_cast<uint32_t>(view.size), newest_payload});
  uint64_t total = value.size();
  for (const AppendPart& p : parts) total += p.payload_size;
  if (total > params_.max_value_bytes) {
    return Status::ValueTooLarge("appending " + std::to_string(value.size()) + " bytes to key " +
                                 std::to_string(key) + " would make it " + std::to_string(total) +
                                 " bytes, more than max_value_bytes " +
                                 std::to_string(params_.max_value_bytes));
  }
  // Merge rule: fold the newest part into the new bytes while it is at most
  // twice their size. Parts then shrink by more than half from oldest to
  // newest (so a value has at most log2(size) parts), and a byte is rewritten
  // only into a record at least 1.5x larger than the one it leaves, so the
  // bytes written per appended byte are O(log size), not O(size).
  std::vector<std::string> merged;
  size_t acc = value.size();
  uint64_t folded = 0;  // record bytes the merge leaves dead, counted once it wrote
  while (acc > 0 && !parts.empty() && parts.back().payload_size <= 2 * acc) {
    std::string piece;
    FLATKV_RETURN_IF_ERROR(ReadPayload(log, key, parts.back(), &piece));
    folded += parts.back().record_size;
    acc += piece.size();
    merged.push_back(std::move(piece));
    parts.pop_back();
  }
  if (info != nullptr) *info = {total, parts.empty() ? total : parts.front().payload_size};
  if (value.empty()) return Status::OK();  // nothing to add; *info still tells the sizes
  std::string data;
  if (!merged.empty()) {
    data.reserve(acc);
    for (auto it = merged.rbegin(); it != merged.rend(); ++it) data += *it;
    data.append(value.data(), value.size());
    value = data;
  }
  if (!parts.empty()) FLATKV_RETURN_IF_ERROR(NoteAppends());
  Status st = parts.empty()
                  ? Write(fs, lk, file, key, RecordType::kValue, {}, value)
                  : Write(fs, lk, file, key, RecordType::kAppend, EncodeAppendParts(parts), value);
  if (st.ok() && folded > 0) dead_bytes_.fetch_add(folded, std::memory_order_relaxed);
  return st;
}

uint64_t FlatTable::LiveKeys() const {
  const FlatTable* newer = successor();
  return newer != nullptr && successor_done_.load(std::memory_order_acquire)
             ? newer->index_->LiveSlots()
             : index_->LiveSlots();
}

uint64_t FlatTable::LiveKeysIn(int64_t from, int64_t stop, uint64_t budget) const {
  const int64_t last = static_cast<int64_t>(static_cast<uint64_t>(kmin()) + slots() - 1);
  from = std::max(from, kmin());
  stop = std::min(stop, last);
  if (from > stop) return 0;
  const uint64_t first = static_cast<uint64_t>(from) - static_cast<uint64_t>(kmin());
  const uint64_t end = static_cast<uint64_t>(stop) - static_cast<uint64_t>(kmin()) + 1;
  const FlatTable* newer = successor();
  const FlatIndex* index = newer != nullptr && successor_done_.load(std::memory_order_acquire)
                               ? newer->index_.get()
                               : index_.get();
  uint64_t live = 0, slot = first, work = 0;
  while (slot < end && work < budget) {
    ++work;
    if (const uint64_t span = EmptySpan(slot); span > 0) {
      slot = slot - slot % span + span;
      continue;
    }
    if (index->Load(slot) != 0) ++live;
    ++slot;
  }
  slot = std::min(slot, end);
  if (slot == end || slot == first) return live;
  return static_cast<uint64_t>(static_cast<long double>(live) * (end - first) / (slot - first));
}

uint64_t FlatTable::EmptySpan(uint64_t slot) const {
  const FlatTable* newer = successor();
  if (newer == nullptr) return index_->EmptySpan(slot);
  // A successor covers the same range (Store::ParamsFor); be safe anyway.
  if (newer->kmin() != kmin() || newer->slots() != slots()) return 0;
  const bool done = successor_done_.load(std::memory_order_acquire);  // first: see Get()
  const uint64_t theirs = newer->index_->EmptySpan(slot);
  if (done) return theirs;
  // The regions nest (group in chunk in table): the smaller one is empty in both.
  return std::min(theirs, index_->EmptySpan(slot));
}

Status FlatTable::ScanRead(uint64_t slot, KeyValue* kv) const {
  const FileState& fs = files_[slot % params_.index.data_files];
  Status st = Status::NotFound("");
  FlatTable* newer = successor();
  const bool done = newer != nullptr && successor_done_.load();  // first: see Get()
  if (newer != nullptr) st = newer->Get(kv->key, &kv->value);  // newer, if there
  if (st.IsNotFound() && !done) {
    const uint64_t v = ReadSlot(fs, slot);
    st = v == 0 ? Status::NotFound("")
                : ReadValue(fs.log.load(std::memory_order_acquire), kv->key, v, &kv->value);
  }
  return st;
}

Status FlatTable::Scan(int64_t from, int64_t stop, bool reverse, size_t limit, uint64_t* work,
                       std::vector<KeyValue>* out, int64_t* next, bool* done,
                       std::vector<int64_t>* corrupt) const {
  *done = true;
  const int64_t first = kmin();
  const int64_t last = static_cast<int64_t>(static_cast<uint64_t>(first) + slots() - 1);
  const int64_t low = reverse ? stop : from;
  const int64_t high = reverse ? from : stop;
  if (low > high || high < first || low > last) return Status::OK();  // nothing in range
  const auto base = static_cast<uint64_t>(first);
  const uint64_t lo = low < first ? 0 : static_cast<uint64_t>(low) - base;
  const uint64_t hi = high > last ? slots() - 1 : static_cast<uint64_t>(high) - base;
  // Walk slot s from one end of [lo, hi] to the other; "end" is the last slot.
  uint64_t s = reverse ? hi : lo;
  const uint64_t end = reverse ? lo : hi;
  uint64_t visited = 0, skipped = 0;
  uint64_t live_group = UINT64_MAX;  // the group last found to hold a live slot
  Status result;
  for (;;) {
    if (out->size() >= limit || *work == 0) {
      *next = static_cast<int64_t>(base + s);
      *done = false;
      break;
    }
    --*work;
    const uint64_t group = s / FlatIndex::kGroupSlots;
    if (group != live_group) {
      if (const uint64_t span = EmptySpan(s); span != 0) {
        // Jump over the empty region [start, stop_slot).
        ++skipped;
        const uint64_t start = s - s % span;
        const uint64_t region_end = std::min(start + span, slots());
        if (!reverse) {
          if (region_end > end) break;
          s = region_end;
        } else {
          if (start <= end) break;
          s = start - 1;
        }
        continue;
      }
      live_group = group;
    }
    ++visited;
    KeyValue kv;
    kv.key = static_cast<int64_t>(base + s);
    Status st = ScanRead(s, &kv);
    if (st.ok()) {
      out->push_back(std::move(kv));
    } else if (st.IsCorruption()) {
      if (corrupt != nullptr) corrupt->push_back(kv.key);
    } else if (!st.IsNotFound()) {
      result = st;
      break;
    }
    if (s == end) break;
    s = reverse ? s - 1 : s + 1;
  }
  counters_->scan_slots_visited.fetch_add(visited, std::memory_order_relaxed);
  counters_->scan_regions_skipped.fetch_add(skipped, std::memory_order_relaxed);
  return result;
}

Status FlatTable::ScanLog(int file, uint64_t offset, size_t limit, std::vector<KeyValue>* out,
                          int* next_file, uint64_t* next_offset, bool* done) const {
  const int n = params_.index.data_files;
  FlatTable* next = successor();
  for (int f = file; f < n; ++f, offset = 0) {
    const LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log == nullptr) continue;
    // Before the head: freed by a head cleaning, whose live records were
    // copied to the end (this scan meets them there).
    offset = std::max(offset, log->begin());
    LogReader reader(log, offset, log->end(), [&](uint64_t off, uint64_t bytes, const char* why) {
      spdlog::warn("{}: scan skipped {} bytes at offset {}: {}", log->path(), bytes, off, why);
    });
    RecordView view;
    uint64_t pos;
    for (;;) {
      if (out->size() >= limit) {
        *next_file = f;
        *next_offset = reader.offset();
        *done = false;
        return Status::OK();
      }
      if (!reader.Next(&view, &pos)) break;
      if (view.type == RecordType::kTombstone) continue;
      const uint64_t slot = static_cast<uint64_t>(view.key) - static_cast<uint64_t>(kmin());
      if (slot >= slots() || static_cast<int>(slot % n) != f) continue;
      const uint64_t v = ReadSlot(files_[f], slot);
      uint64_t live_pos;
      size_t guess;
      if (v == 0) continue;
      DecodeSlot(v, &live_pos, &guess);
      if (live_pos != pos) continue;  // an older version, or removed since
      if (next != nullptr && next->Contains(view.key)) continue;  // the successor's turn
      KeyValue kv;
      kv.key = view.key;
      if (view.type == RecordType::kAppend) {
        FLATKV_RETURN_IF_ERROR(Assemble(log, view.key, view.value, &kv.value));
      } else {
        kv.value.assign(view.value.data(), view.value.size());
      }
      out->push_back(std::move(kv));
    }
    FLATKV_RETURN_IF_ERROR(reader.status());
  }
  if (next != nullptr) {
    // While compacting, the successor's files follow ours: file n + i is its
    // file i. A key copied after this scan passed it here may come twice.
    int nf = 0;
    FLATKV_RETURN_IF_ERROR(next->ScanLog(std::max(file - n, 0), file >= n ? offset : 0, limit,
                                         out, &nf, next_offset, done));
    *next_file = nf + n;
    return Status::OK();
  }
  *done = true;
  return Status::OK();
}

void FlatTable::StartWriteback() {
  for (int f = 0; f < params_.index.data_files; ++f) {
    LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log != nullptr) log->StartWriteback();
  }
}

void FlatTable::ForEachLogLocked(void (LogFile::*call)()) {
  for (int f = 0; f < params_.index.data_files; ++f) {
    std::lock_guard<std::mutex> lock(files_[f].mu);
    LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log != nullptr) (log->*call)();
  }
}

void FlatTable::ResumeLookahead() { ForEachLogLocked(&LogFile::ResumeLookahead); }

void FlatTable::ReleaseWindows() { ForEachLogLocked(&LogFile::ReleaseWindow); }

Status FlatTable::Sync() {
  // Writes go to the successor while compacting, and after the switch too:
  // a Store::Sync that took this table's pointer before the switch syncs
  // the successor here, finished or not (syncing only an unfinished one,
  // writes acknowledged between the compaction's own sync and the switch
  // would miss that Store::Sync).
  if (FlatTable* next = successor()) FLATKV_RETURN_IF_ERROR(next->Sync());
  FLATKV_RETURN_IF_ERROR(SyncLayout());
  for (int f = 0; f < params_.index.data_files; ++f) {
    FileState& fs = files_[f];
    if (!fs.dirty.exchange(false, std::memory_order_relaxed)) continue;
    LogFile* log = fs.log.load(std::memory_order_acquire);
    if (log == nullptr) continue;
    Status st = log->Sync();
    counters_->fdatasyncs.fetch_add(1, std::memory_order_relaxed);
    if (!st.ok()) {
      fs.dirty.store(true, std::memory_order_relaxed);
      return st;
    }
  }
  return Status::OK();
}

Status FlatTable::Checkpoint(bool force) {
  if (FlatTable* next = successor(); next != nullptr && !successor_done_.load()) {
    FLATKV_RETURN_IF_ERROR(next->Checkpoint());
  }
  std::lock_guard<std::mutex> lock(header_mu_);
  if (closed_ || !dirty_marked_.load(std::memory_order_acquire)) return Status::OK();
  const int n = params_.index.data_files;
  std::vector<uint64_t> ends(n);
  for (int f = 0; f < n; ++f) {
    std::lock_guard<std::mutex> file_lock(files_[f].mu);
    ends[f] = files_[f].applied;
  }
  if (!force && ends == index_->checkpoints()) return Status::OK();
  // Log bytes first, then the slots that point at them, then the checkpoint
  // that vouches for both.
  FLATKV_RETURN_IF_ERROR(Sync());
  FLATKV_RETURN_IF_ERROR(index_->Sync());
  index_->set_dead_bytes(dead_bytes_.load(std::memory_order_relaxed));
  return index_->WriteHeader(false, ends);
}

void FlatTable::Discard() {
  std::lock_guard<std::mutex> lock(header_mu_);
  if (closed_) return;
  closed_ = true;
  for (int f = 0; f < params_.index.data_files; ++f) {
    FileState& fs = files_[f];
    std::unique_lock<std::mutex> lk(fs.mu);
    fs.cv.wait(lk, [&] { return !fs.syncing; });
    if (fs.owner == nullptr) continue;
    fs.owner->Discard();
    counters_->data_files_open.fetch_sub(1, std::memory_order_relaxed);
  }
}

Status FlatTable::Close() {
  std::lock_guard<std::mutex> lock(header_mu_);
  if (closed_) return Status::OK();
  closed_ = true;
  const int n = params_.index.data_files;
  std::vector<uint64_t> ends(n, 0);
  Status result = SyncLayout();  // before the files' fdatasync
  for (int f = 0; f < n; ++f) {
    FileState& fs = files_[f];
    std::unique_lock<std::mutex> lk(fs.mu);
    fs.cv.wait(lk, [&] { return !fs.syncing; });
    if (fs.owner == nullptr) continue;
    Status st = fs.owner->Close();  // truncate to the end and fdatasync
    counters_->data_files_open.fetch_sub(1, std::memory_order_relaxed);
    if (!st.ok() && result.ok()) result = st;
    ends[f] = fs.owner->end();
    if (!fs.error.ok() && result.ok()) result = fs.error;
  }
  if (!dirty_marked_.load(std::memory_order_acquire)) return result;
  Status st = index_->Sync();
  // Only a fully flushed table may claim to be clean.
  index_->set_dead_bytes(dead_bytes_.load(std::memory_order_relaxed));
  if (st.ok() && result.ok()) st = index_->WriteHeader(true, ends);
  return result.ok() ? st : result;
}

uint64_t FlatTable::TotalBytes() const {
  uint64_t total = 0;
  for (int f = 0; f < params_.index.data_files; ++f) {
    const LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log != nullptr) total += log->end() - std::min(log->end(), log->begin());
  }
  return total;
}

uint64_t FlatTable::ChargedBytes() const {
  uint64_t total = 0;
  for (int f = 0; f < params_.index.data_files; ++f) {
    const LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log == nullptr) continue;
    const uint64_t end = log->end();
    const uint64_t bytes = end - std::min(end, log->begin());
    const uint64_t ahead = log->allocated() - std::min(log->allocated(), end);
    const auto charged_ahead = static_cast<uint64_t>(kChargedReserve * static_cast<double>(bytes));
    total += bytes + std::min(ahead, charged_ahead);
  }
  return total;
}

uint64_t FlatTable::AllocatedBytes() const {
  uint64_t total = 0;
  for (int f = 0; f < params_.index.data_files; ++f) {
    const LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log == nullptr) continue;
    const uint64_t freed = log->begin() / LogFile::kMapPage * LogFile::kMapPage;  // a hole
    total += std::max(log->allocated(), log->end()) - freed;
  }
  return total;
}

void FlatTable::BeginCompaction(FlatTable* next, std::vector<uint64_t>* ends,
                                CopyTransform transform, bool track) {
  const int n = params_.index.data_files;
  // Taking every file mutex means no write is half-way into this table when
  // the successor appears: each later write sees it under its file mutex.
  {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (int f = 0; f < n; ++f) locks.emplace_back(files_[f].mu);
    if (successor_.load(std::memory_order_relaxed) == nullptr) {
      // A fresh successor: it holds no write yet, so noting every write
      // forwarded from now on lets AbortCompaction move them all back. A
      // successor set before (resumed after a restart) keeps what it had.
      forwarded_.reset();
      if (track) {
        const uint64_t per_file = (slots() + static_cast<uint64_t>(n) - 1) / static_cast<uint64_t>(n);
        forwarded_.reset(new std::vector<uint64_t>[n]);
        for (int f = 0; f < n; ++f) forwarded_[f].assign((per_file + 63) / 64, 0);
      }
    }
    transform_ = std::move(transform);  // read only under a file mutex
    successor_.store(next, std::memory_order_release);
    ends->assign(n, 0);
    for (int f = 0; f < n; ++f) {
      if (files_[f].owner != nullptr) (*ends)[f] = files_[f].owner->end();
    }
  }
  if (params_.sync != SyncMode::kAlways) return;
  // Writers queued for group commit released their file mutex while they
  // wait, with their slot update not yet applied: until it is, the copier
  // would take the previous version for live. Wait for the updates queued
  // before the successor appeared (later ones are removes' tombstones).
  for (int f = 0; f < n; ++f) {
    FileState& fs = files_[f];
    std::unique_lock<std::mutex> lk(fs.mu);
    const uint64_t target = fs.queued;
    fs.cv.wait(lk, [&] { return fs.dequeued >= target || !fs.error.ok(); });
  }
}

void FlatTable::NoteForwardedLocked(int file, uint64_t slot) {
  if (forwarded_ == nullptr) return;
  const uint64_t i = slot / static_cast<uint64_t>(params_.index.data_files);
  forwarded_[file][i / 64] |= uint64_t{1} << (i % 64);
}

Status FlatTable::AbortCompaction() {
  FlatTable* next = successor();
  if (next == nullptr) return Status::OK();
  const int n = params_.index.data_files;
  std::vector<std::unique_lock<std::mutex>> locks;
  for (int f = 0; f < n; ++f) locks.emplace_back(files_[f].mu);
  if (forwarded_ == nullptr || successor_done_.load()) {
    return Status::Busy(params_.dir + ": the compaction cannot be undone (its new generation " +
                        "holds writes from before a restart); it is kept and resumed later");
  }
  // Every key a write reached the successor for takes its value there (or
  // its absence) back here. Copies the successor took need nothing: the
  // value they copied is still here. Readers meanwhile try the successor
  // first, which holds the same values.
  for (int f = 0; f < n; ++f) {
    FileState& fs = files_[f];
    const std::vector<uint64_t>& bits = forwarded_[f];
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
        const uint64_t i = w * 64 + static_cast<uint64_t>(__builtin_ctzll(word));
        const uint64_t slot = i * static_cast<uint64_t>(n) + static_cast<uint64_t>(f);
        const auto key = static_cast<int64_t>(static_cast<uint64_t>(kmin()) + slot);
        std::string value;
        Status st = next->Get(key, &value);
        const uint64_t cur = CurrentSlotLocked(fs, slot);
        if (st.ok() && cur != 0) {
          // Already here (written back by an attempt that then ran out of
          // space, or the successor only took a copy): writing it again
          // would spend the room a retry needs.
          std::string here;
          if (ReadValue(fs.log.load(std::memory_order_acquire), key, cur, &here).ok() &&
              here == value) {
            continue;
          }
        }
        if (st.ok()) {
          st = Write(fs, locks[f], f, key, RecordType::kValue, {}, value, Durability::kNoWait);
        } else if (st.IsNotFound()) {
          st = cur == 0
                   ? Status::OK()
                   : Write(fs, locks[f], f, key, RecordType::kTombstone, {}, {},
                           Durability::kNoWait);
        }
        // The successor stays, holding every write: nothing is lost, and
        // the compaction is resumed (or undone) later.
        if (!st.ok()) return st;
      }
    }
  }
  transform_ = {};
  forwarded_.reset();
  successor_.store(nullptr, std::memory_order_release);
  return Status::OK();
}

// Copying a record that is a whole value, into a successor with the same
// layout, needs no decoding when the transform (if any) keeps it as it is
// (an integer key's value; a string bucket already compact): its bytes
// (checksum verified by the LogReader) are appended as they are, a batch at
// a time. Such a copy keeps the record's timestamp (when its value was
// written). Append fragments (merged into one value), buckets the transform
// rewrites and successors with another data file count take the general
// path: decode, re-encode, one record at a time.
Status FlatTable::CopyLive(int file, uint64_t end, const std::function<bool(uint64_t)>& progress) {
  FlatTable* next = successor();
  FileState& fs = files_[file];
  const LogFile* log = fs.log.load(std::memory_order_acquire);
  if (next == nullptr || log == nullptr) return Status::OK();
  const int n = params_.index.data_files;
  const bool same_layout =
      next->data_files() == n && next->kmin() == kmin() && next->slots() == slots();
  LogReader reader(log, log->begin(), end, [&](uint64_t off, uint64_t bytes, const char* why) {
    spdlog::warn("{}: compaction skipped {} bytes at offset {}: {}", log->path(), bytes, off, why);
  });
  RecordView view;
  uint64_t pos;
  std::string value;
  CopyBatch batch;
  uint64_t unreported = 0;  // bytes read since the last progress call
  // Slots (of this file, by slot / n) whose live record the reader met.
  std::vector<bool> seen((slots() + static_cast<uint64_t>(n) - 1) / static_cast<uint64_t>(n));
  int since_peek = 0;
  while (reader.Next(&view, &pos)) {
    // The records come in log order, their slots in random order: start
    // loading the slots of the next few while this one is checked (the
    // index loads were a third of a compaction's time).
    if (++since_peek == kCopyPrefetch / 2) {
      since_peek = 0;
      reader.PeekKeys(kCopyPrefetch, [&](int64_t key) { PrefetchSlot(key); });
    }
    unreported += view.size;
    if (unreported >= kCopyBatchBytes || batch.bytes.size() >= kCopyBatchBytes) {
      FLATKV_RETURN_IF_ERROR(FlushCopies(file, &batch));
      if (!progress(unreported)) return Status::Busy("compaction stopped");
      unreported = 0;
    }
    if (view.type == RecordType::kTombstone) continue;
    const uint64_t slot = static_cast<uint64_t>(view.key) - static_cast<uint64_t>(kmin());
    if (slot >= slots() || static_cast<int>(slot % n) != file) continue;
    uint64_t live_pos;
    size_t guess;
    const uint64_t v0 = ReadSlot(fs, slot);
    if (v0 == 0) continue;
    DecodeSlot(v0, &live_pos, &guess);
    if (live_pos != pos) continue;  // an older version: garbage
    seen[slot / n] = true;
    // (A record's size fits CopyBatch's 32 bits unless its padding field is
    // huge: such a record takes the general path, which drops the padding.)
    if (same_layout && view.type == RecordType::kValue && view.size <= UINT32_MAX &&
        (!transform_ || (transform_.keeps && transform_.keeps(view.value)))) {
      // Checked again under the file mutex when the batch is flushed.
      const std::string_view rec = reader.record();
      batch.items.push_back({view.key, v0, static_cast<uint32_t>(batch.bytes.size()),
                             static_cast<uint32_t>(rec.size())});
      batch.bytes.append(rec.data(), rec.size());
      continue;
    }
    // Re-check under the file mutex, which every write of this key holds:
    // the record must still be live here and the key still absent there.
    std::unique_lock<std::mutex> lk(fs.mu);
    const uint64_t v = CurrentSlotLocked(fs, slot);
    if (v != v0 || next->Contains(view.key)) continue;
    if (view.type == RecordType::kAppend) {
      FLATKV_RETURN_IF_ERROR(Assemble(log, view.key, view.value, &value));
    } else {
      value.assign(view.value.data(), view.value.size());
    }
    if (transform_ && !transform_.rewrite(&value)) continue;
    FLATKV_RETURN_IF_ERROR(next->PutCopy(view.key, value));
  }
  FLATKV_RETURN_IF_ERROR(reader.status());
  FLATKV_RETURN_IF_ERROR(FlushCopies(file, &batch));
  if (unreported > 0 && !progress(unreported)) return Status::Busy("compaction stopped");
  return CopyUnseen(file, end, seen);
}

// A live record the log reader skipped (it failed its checksum, or sat in a
// damaged stretch the reader stepped over) would be dropped by the copy:
// each is read through the index instead, and copied if it reads well.
Status FlatTable::CopyUnseen(int file, uint64_t end, const std::vector<bool>& seen) {
  FlatTable* next = successor();
  FileState& fs = files_[file];
  const LogFile* log = fs.log.load(std::memory_order_acquire);
  const auto n = static_cast<uint64_t>(params_.index.data_files);
  std::string value;
  uint64_t next_slot = static_cast<uint64_t>(file);
  while (next_slot < slots()) {
    const uint64_t slot = next_slot;
    next_slot += n;
    // Regions of the index with no live slot are skipped whole (the index
    // keeps live counts per group and chunk): a table of 16M slots holding
    // a few keys costs a few visits, not a read of its whole index (and no
    // zero pages faulted in over its holes).
    if (const uint64_t span = index_->EmptySpan(slot); span > 0) {
      const uint64_t region_end = slot - slot % span + span;
      // The first slot of this file at or after the region.
      next_slot = region_end + (static_cast<uint64_t>(file) + n - region_end % n) % n;
      continue;
    }
    if (seen[slot / n] || ReadSlot(fs, slot) == 0) continue;
    std::unique_lock<std::mutex> lk(fs.mu);
    const uint64_t v = CurrentSlotLocked(fs, slot);
    const int64_t key = static_cast<int64_t>(static_cast<uint64_t>(kmin()) + slot);
    if (v == 0 || next->Contains(key)) continue;
    uint64_t pos;
    size_t guess;
    DecodeSlot(v, &pos, &guess);
    if (pos >= end) continue;  // written after the copy began: not this pass's
    Status st = ReadValue(log, key, v, &value);
    if (st.ok()) {
      if (transform_ && !transform_.rewrite(&value)) continue;
      FLATKV_RETURN_IF_ERROR(next->PutCopy(key, value));
      continue;
    }
    if (!st.IsCorruption()) return st;
    if (!params_.lost_value) {
      return Status::Corruption(st.message() + "; this table is not compacted until the key is "
                                "repaired or overwritten (flatkv admin verify)");
    }
    spdlog::error("{}: compaction keeps key {} as lost: {}", params_.dir, key, st.message());
    FLATKV_RETURN_IF_ERROR(next->PutCopy(key, *params_.lost_value));
  }
  return Status::OK();
}

Status FlatTable::FlushCopies(int file, CopyBatch* batch) {
  if (batch->items.empty()) return Status::OK();
  FileState& fs = files_[file];
  FlatTable* next = successor();
  // The same check as a single copy's, under the same mutex, held until
  // the copies are in the successor: a write of one of these keys either
  // came before (the record is dropped here) or waits for the mutex and
  // lands after its copy, in the successor's log too (so a replay after a
  // crash also ends with the write).
  // The successor's slots of these keys are cold (random) and each is
  // looked up below: start loading them all first.
  for (const CopyBatch::Item& item : batch->items) next->PrefetchSlot(item.key);
  std::unique_lock<std::mutex> lk(fs.mu);
  batch->KeepIf([&](const CopyBatch::Item& item) {
    const uint64_t slot = static_cast<uint64_t>(item.key) - static_cast<uint64_t>(kmin());
    return CurrentSlotLocked(fs, slot) == item.slot_value && !next->Contains(item.key);
  });
  Status st = next->PutCopies(file, *batch);
  batch->items.clear();
  batch->bytes.clear();
  return st;
}

Status FlatTable::PutCopies(int file, const CopyBatch& batch) {
  if (batch.items.empty()) return Status::OK();
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  if (!fs.error.ok()) return fs.error;
  LogFile* log;
  FLATKV_RETURN_IF_ERROR(LogForWrite(fs, file, &log));
  if (log->end() + batch.bytes.size() >= pos_limit_) {
    return Status::NoSpace(log->path() + " reached the " + std::to_string(pos_limit_) +
                           "-byte limit of index_item_bytes=" +
                           std::to_string(params_.index.item_bytes) + "; compact the table");
  }
  // Index pages first, as Write does: a full disk fails the batch before
  // any of it is in the log.
  for (const CopyBatch::Item& item : batch.items) {
    FLATKV_RETURN_IF_ERROR(
        index_->Reserve(static_cast<uint64_t>(item.key) - static_cast<uint64_t>(kmin())));
  }
  uint64_t start;
  FLATKV_RETURN_IF_ERROR(log->AppendEncoded(batch.bytes, &start));
  counters_->bytes_appended.fetch_add(batch.bytes.size(), std::memory_order_relaxed);
  fs.dirty.store(true, std::memory_order_relaxed);
  // The keys are absent here (checked under the old table's mutex, which
  // every write of them holds): nothing becomes garbage.
  for (const CopyBatch::Item& item : batch.items) {
    const uint64_t slot = static_cast<uint64_t>(item.key) - static_cast<uint64_t>(kmin());
    FLATKV_RETURN_IF_ERROR(WriteSlot(fs, slot, EncodeSlot(start + item.offset, item.size)));
  }
  // Under sync: always a copy must not move "applied" (see Write).
  if (params_.sync != SyncMode::kAlways) fs.applied = log->end();
  copied_bytes_.fetch_add(batch.bytes.size(), std::memory_order_relaxed);
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Head cleaning (see flat_table.h): the oldest part of a data file is copied
// forward and freed in place, so a round copies only the live part of the
// bytes it frees. Under uniform overwrites the head is the file's least
// live part: at a store-wide 1.5x log to live ratio the whole-table
// compaction copies 2 bytes per byte it frees (3 bytes written per byte
// put); the head holds about 40 % live bytes then (0.7 copied per byte
// freed: 1.7 written per byte put).

bool FlatTable::CanCleanHead() const {
  // A value built by Append() is a chain of records, and an older record
  // of a key may be one of its parts: tables that ever held one are
  // compacted whole (META's "appends"; CopyLive merges the parts).
  if (successor() != nullptr || clean_blocked_.load(std::memory_order_relaxed) ||
      may_have_appends_.load(std::memory_order_acquire)) {
    return false;
  }
  const uint64_t limit = std::min(kMaxCleanEnd, pos_limit_ / 2);
  for (int f = 0; f < params_.index.data_files; ++f) {
    const LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log != nullptr && log->end() >= limit) return false;
  }
  return true;
}

uint64_t FlatTable::Head(int file) const {
  const LogFile* log = files_[file].log.load(std::memory_order_acquire);
  return log == nullptr ? 0 : log->begin();
}

uint64_t FlatTable::AppliedEnd(int file) {
  FileState& fs = files_[file];
  std::lock_guard<std::mutex> lock(fs.mu);
  const LogFile* log = fs.log.load(std::memory_order_acquire);
  return log == nullptr ? 0 : std::min(fs.applied, log->end());
}

Status FlatTable::NoteAppends() {
  if (may_have_appends_.load(std::memory_order_acquire)) return Status::OK();
  std::lock_guard<std::mutex> lock(meta_mu_);
  if (may_have_appends_.load(std::memory_order_relaxed)) return Status::OK();
  FLATKV_RETURN_IF_ERROR(WriteMeta(params_.dir, params_.index, true, heads_));
  may_have_appends_.store(true, std::memory_order_release);
  return Status::OK();
}

Status FlatTable::FlushHeadCopies(int file, CopyBatch* batch, uint64_t* dead,
                                  uint64_t* copied) {
  if (batch->items.empty()) return Status::OK();
  FileState& fs = files_[file];
  std::unique_lock<std::mutex> lk(fs.mu);
  // The same check as the read's, now under the mutex every write of these
  // keys holds: a write that came since made its record garbage.
  batch->KeepIf([&](const CopyBatch::Item& item) {
    const uint64_t slot = static_cast<uint64_t>(item.key) - static_cast<uint64_t>(kmin());
    if (CurrentSlotLocked(fs, slot) == item.slot_value) return true;
    *dead += DeadEstimate(item.size);  // overwritten or removed since it was read
    return false;
  });
  Status st;
  if (!batch->items.empty()) {
    LogFile* log = fs.owner.get();
    if (!fs.error.ok()) {
      st = fs.error;
    } else if (log->end() + batch->bytes.size() >= pos_limit_) {
      st = Status::NoSpace(log->path() + " reached the " + std::to_string(pos_limit_) +
                           "-byte limit of index_item_bytes=" +
                           std::to_string(params_.index.item_bytes));
    } else {
      uint64_t start;
      st = log->AppendEncoded(batch->bytes, &start);
      if (st.ok()) {
        counters_->bytes_appended.fetch_add(batch->bytes.size(), std::memory_order_relaxed);
        fs.dirty.store(true, std::memory_order_relaxed);
        // The slots' pages hold these keys already: no reservation to fail.
        for (const CopyBatch::Item& item : batch->items) {
          const uint64_t slot = static_cast<uint64_t>(item.key) - static_cast<uint64_t>(kmin());
          if (st.ok()) st = WriteSlot(fs, slot, EncodeSlot(start + item.offset, item.size));
        }
        // Under sync: always a copy must not move "applied" (see Write).
        if (params_.sync != SyncMode::kAlways) fs.applied = log->end();
        *copied += batch->bytes.size();
      }
    }
  }
  batch->items.clear();
  batch->bytes.clear();
  return st;
}

Status FlatTable::CleanHead(int file, uint64_t target,
                            const std::function<bool(uint64_t)>& progress) {
  FileState& fs = files_[file];
  LogFile* log = fs.log.load(std::memory_order_acquire);
  if (log == nullptr || !CanCleanHead()) return Status::OK();
  const uint64_t from = std::max(log->begin(), clean_to_[file]);
  // Only records whose slot updates were applied: under sync: always a
  // queued write's record is in the log before its slot points at it.
  const uint64_t limit = AppliedEnd(file);
  target = std::min(target, limit);
  if (target <= from) return Status::OK();
  FLATKV_RETURN_IF_ERROR(EnsureWritable());
  const int n = params_.index.data_files;
  uint64_t bad = UINT64_MAX;  // where the first unreadable stretch began
  LogReader reader(log, from, limit,
                   [&](uint64_t off, uint64_t bytes, const char* why) {
                     if (bad == UINT64_MAX) bad = off;
                     spdlog::warn("{}: head cleaning met {} unreadable bytes at offset {}: {}",
                                  log->path(), bytes, off, why);
                   });
  CopyBatch batch;
  // What the records freed here added to dead_bytes_ when they died (Write's
  // estimate, so the estimate does not drift from round to round).
  uint64_t dead = 0;
  uint64_t copied = 0;      // bytes of live records moved to the end
  uint64_t unreported = 0;  // bytes read since the last progress call
  uint64_t head = from;     // every record before it is handled
  int since_peek = 0;
  RecordView view;
  uint64_t pos;
  Status st;
  while (st.ok() && reader.Next(&view, &pos)) {
    if (bad != UINT64_MAX || pos >= target) break;
    if (++since_peek == kCopyPrefetch / 2) {
      since_peek = 0;
      reader.PeekKeys(kCopyPrefetch, [&](int64_t key) { PrefetchSlot(key); });
    }
    unreported += view.size;
    if (unreported >= kCopyBatchBytes || batch.bytes.size() >= kCopyBatchBytes) {
      st = FlushHeadCopies(file, &batch, &dead, &copied);
      if (!st.ok()) break;
      if (!progress(unreported)) return Status::Busy("head cleaning stopped");
      unreported = 0;
    }
    // A tombstone goes: every older record of its key lies before it, so
    // in this head or freed already.
    const uint64_t slot = static_cast<uint64_t>(view.key) - static_cast<uint64_t>(kmin());
    if (view.type != RecordType::kTombstone && slot < slots() &&
        static_cast<int>(slot % n) == file) {
      const uint64_t v = ReadSlot(fs, slot);
      uint64_t live_pos = 0;
      size_t guess;
      if (v != 0) DecodeSlot(v, &live_pos, &guess);
      const bool live = v != 0 && live_pos == pos;
      if (!live) dead += DeadEstimate(view.size);
      if (live && view.type == RecordType::kValue && view.size <= UINT32_MAX) {
        const std::string_view rec = reader.record();
        batch.items.push_back({view.key, v, static_cast<uint32_t>(batch.bytes.size()),
                               static_cast<uint32_t>(rec.size())});
        batch.bytes.append(rec.data(), rec.size());
      } else if (live) {
        // An appended value (or a record too large for a batch): not for
        // a cleaning, which cannot see which older records are its parts.
        spdlog::warn("{}: head cleaning stops at offset {}: key {} has an appended value",
                     log->path(), pos, view.key);
        clean_blocked_.store(true, std::memory_order_relaxed);
        break;
      }
    } else if (view.type == RecordType::kTombstone) {
      dead += view.size;  // Write counts a tombstone dead as it is written
    }
    head = pos + view.size;
  }
  if (bad != UINT64_MAX) {
    head = std::min(head, bad);
    clean_blocked_.store(true, std::memory_order_relaxed);
  }
  if (st.ok()) st = reader.status();
  if (st.ok()) st = FlushHeadCopies(file, &batch, &dead, &copied);
  FLATKV_RETURN_IF_ERROR(st);
  if (unreported > 0 && !progress(unreported)) return Status::Busy("head cleaning stopped");
  {
    // An append since the start (META says so before its record is
    // written, under this mutex) may have kept a record of this head as a
    // part: the round's copies stay (garbage later), the head does not move.
    std::lock_guard<std::mutex> lock(fs.mu);
    if (may_have_appends_.load(std::memory_order_acquire)) return Status::OK();
  }
  clean_to_[file] = head;
  // The estimate came from size hints; what this head held is exact. A head
  // holding (nearly) only live records means the estimate ran ahead of the
  // garbage there is: the share of it that fell on these bytes (the
  // table's estimate times their share of its bytes) drops to what this
  // round found, so the policy does not pick the table again round after
  // round for nothing (11,014 empty rounds in one test before). Only that
  // share: the garbage may all lie after the head (right after a round a
  // file's oldest bytes are often the live records the last round moved).
  // Dropping the whole table's estimate here, as before, made the live
  // bytes look up to 1.45x what they were, and the write allowance,
  // computed from them, let one table's disk reach 2.4-2.9x live.
  const uint64_t freed = head - from - std::min(head - from, copied);
  if (freed * 32 < head - from) {
    const uint64_t total = std::max<uint64_t>(TotalBytes(), 1);
    const double share = static_cast<double>(head - from) / static_cast<double>(total);
    const double estimated = share * static_cast<double>(dead_bytes_.load(std::memory_order_relaxed));
    dead = std::max(dead, static_cast<uint64_t>(estimated));
  }
  clean_freed_[file] += dead;
  return Status::OK();
}

Status FlatTable::CommitHeads() {
  const int n = params_.index.data_files;
  if (std::equal(clean_to_.begin(), clean_to_.end(), heads_.begin(),
                 [](uint64_t to, uint64_t head) { return to <= head; })) {
    return Status::OK();
  }
  // The copies, then the slots pointing at them, then the heads that free
  // what the slots pointed at before.
  FLATKV_RETURN_IF_ERROR(Sync());
  FLATKV_RETURN_IF_ERROR(Checkpoint(/*force=*/true));
  std::lock_guard<std::mutex> lock(meta_mu_);
  std::vector<uint64_t> heads = heads_;
  for (int f = 0; f < n; ++f) heads[f] = std::max(heads[f], clean_to_[f]);
  FLATKV_RETURN_IF_ERROR(WriteMeta(params_.dir, params_.index,
                                   may_have_appends_.load(std::memory_order_acquire), heads));
  heads_ = heads;
  return Status::OK();
}

Status FlatTable::DropHeads() {
  std::vector<uint64_t> heads;
  {
    std::lock_guard<std::mutex> lock(meta_mu_);
    heads = heads_;
  }
  Status result;
  for (int f = 0; f < params_.index.data_files; ++f) {
    LogFile* log = files_[f].log.load(std::memory_order_acquire);
    if (log == nullptr || heads[f] <= log->begin()) continue;
    Status st = log->DropBefore(heads[f]);
    if (!st.ok()) {
      if (result.ok()) result = st;
      continue;
    }
    const uint64_t freed = std::exchange(clean_freed_[f], 0);
    uint64_t dead = dead_bytes_.load(std::memory_order_relaxed);
    while (!dead_bytes_.compare_exchange_weak(dead, dead - std::min(dead, freed),
                                              std::memory_order_relaxed)) {
    }
  }
  return result;
}

}  // namespace flatkv::engine
