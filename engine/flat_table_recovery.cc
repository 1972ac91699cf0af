// Implementation notes
//
// Recovery. The index header holds, per data file, a checkpoint: the log
// offset up to which the slots are known to be durable and complete. A clean
// close writes checkpoints equal to the files' sizes and clean = 1; such a
// table opens with no log I/O at all. Otherwise each file's tail past its
// checkpoint is replayed (records applied in log order, bad ones reported and
// skipped) and the file is cut after its last valid record, which removes a
// torn write and the space reserved ahead. After an OS crash an index page
// may have reached the disk ahead of the log bytes its slots point at, so every
// slot pointing past its file's checkpoint must be a record the replay found;
// if one is not, the index is rebuilt from offset 0 of every file. A missing
// or damaged index is rebuilt the same way.
#include "engine/flat_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include <spdlog/spdlog.h>

namespace flatkv::engine {

// META's text: the range and layout, then (absent in older stores) whether
// an appended value was ever written here and each data file's head.
Status FlatTable::WriteMeta(const std::string& dir, const IndexParams& p, bool appends,
                            const std::vector<uint64_t>& heads, bool durable) {
  const std::string path = dir + "/META";
  const std::string tmp = path + ".tmp";
  std::string text = "flatkv-table 1\nkmin ";
  text += std::to_string(p.kmin);
  text += "\nslots " + std::to_string(p.slots);
  text += "\nitem_bytes " + std::to_string(p.item_bytes);
  text += "\ndata_files " + std::to_string(p.data_files);
  text += appends ? "\nappends 1\n" : "\nappends 0\n";
  if (std::any_of(heads.begin(), heads.end(), [](uint64_t h) { return h > 0; })) {
    text += "heads";
    for (uint64_t h : heads) text += " " + std::to_string(h);
    text += "\n";
  }
  // write() rather than a stream, so a full disk is reported as such (errno).
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("creating " + tmp, errno);
  const ssize_t n = ::write(fd, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size()) || (durable && fsync(fd) != 0)) {
    const int err = n >= 0 && n != static_cast<ssize_t>(text.size()) ? ENOSPC : errno;
    ::close(fd);
    return Status::FromErrno("writing " + tmp, err);
  }
  ::close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno("renaming " + tmp, errno);
  return durable ? SyncDirectory(dir) : Status::OK();
}

namespace {

// Reads META into *p, *appends and *heads. NotFound if absent, Corruption if
// unreadable. A META written before "appends" existed says nothing of the
// appends: *appends is then true (head cleaning checks every part).
Status ReadMeta(const std::string& dir, IndexParams* p, bool* appends,
                std::vector<uint64_t>* heads) {
  const std::string path = dir + "/META";
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + " does not exist");
  // A new table's META is made durable only with its first durable record
  // (SyncLayout): after an OS crash before that, it may be empty, and the
  // table held nothing durable. It is written again, as for a missing one.
  if (in.peek() == std::ifstream::traits_type::eof()) {
    return Status::NotFound(path + " is empty (a table created just before a crash)");
  }
  std::string magic, k;
  int version = 0;
  in >> magic >> version;
  IndexParams r;
  in >> k >> r.kmin >> k >> r.slots >> k >> r.item_bytes >> k >> r.data_files;
  if (!in || magic != "flatkv-table" || version != 1 || r.item_bytes < 4 || r.item_bytes > 8 ||
      r.data_files < 1 || r.data_files > FlatIndex::kMaxDataFiles || r.slots == 0) {
    return Status::Corruption(path + " is not a valid table description");
  }
  bool a = true;
  std::vector<uint64_t> h(static_cast<size_t>(r.data_files), 0);
  while (in >> k) {
    if (k == "appends") {
      int v = -1;
      in >> v;
      if (!in || (v != 0 && v != 1)) return Status::Corruption(path + ": bad appends line");
      a = v == 1;
    } else if (k == "heads") {
      for (uint64_t& x : h) in >> x;
      if (!in) return Status::Corruption(path + ": bad heads line");
    } else {
      return Status::Corruption(path + ": unknown field " + k);
    }
  }
  *p = r;
  *appends = a;
  *heads = std::move(h);
  return Status::OK();
}

}  // namespace

Status FlatTable::Open(const TableParams& requested, bool create, EngineCounters* counters,
                       std::unique_ptr<FlatTable>* result) {
  TableParams params = requested;
  IndexParams meta;
  bool created = false;  // META written by this call: the table is new
  bool appends = false;
  std::vector<uint64_t> heads(static_cast<size_t>(params.index.data_files), 0);
  Status st = ReadMeta(params.dir, &meta, &appends, &heads);
  if (st.ok()) {
    if (meta.kmin != params.index.kmin || meta.slots != params.index.slots) {
      return Status::InvalidArgument(params.dir + " covers keys [" + std::to_string(meta.kmin) +
                                     ", +" + std::to_string(meta.slots) +
                                     "), which the configuration does not match (storage."
                                     "key_min and segment_keys set a segment's keys, "
                                     "storage.string_slots the string-key table's slots, "
                                     "storage.sparse_slots the sparse tier's)");
    }
    params.index = meta;  // existing tables keep their width and file count
  } else if (st.IsNotFound() && create) {
    if (mkdir(params.dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::FromErrno("creating " + params.dir, errno);
    }
    FLATKV_RETURN_IF_ERROR(WriteMeta(params.dir, params.index, false, heads, /*durable=*/false));
    created = true;
  } else {
    return st;
  }
  std::unique_ptr<FlatTable> table(new FlatTable(params, counters));
  if (created) {
    table->layout_created_ = true;
    table->layout_changes_.store(1, std::memory_order_relaxed);
  }
  table->may_have_appends_.store(appends, std::memory_order_relaxed);
  table->heads_ = heads;
  bool rebuild = false;
  const std::string index_path = params.dir + "/index";
  const bool index_missing = access(index_path.c_str(), F_OK) != 0;
  if (index_missing) {
    for (int f = 0; f < params.index.data_files && !rebuild; ++f) {
      rebuild = access(table->DataPath(f).c_str(), F_OK) == 0;
    }
    if (rebuild) spdlog::warn("{} is missing; rebuilding it from the data files", index_path);
  }
  st = FlatIndex::Open(index_path, params.index, true, &table->index_);
  if (st.IsCorruption()) {
    spdlog::warn("{}; rebuilding it from the data files", st.ToString());
    if (unlink(index_path.c_str()) != 0) return Status::FromErrno("removing " + index_path, errno);
    st = FlatIndex::Open(index_path, params.index, true, &table->index_);
    rebuild = true;
  }
  FLATKV_RETURN_IF_ERROR(st);
  FLATKV_RETURN_IF_ERROR(table->OpenFiles(create));
  FLATKV_RETURN_IF_ERROR(table->Recover(rebuild));
  if (index_missing && !rebuild) {
    // A new index says clean with every checkpoint 0, which vouches only for
    // an empty table (Recover treats one with a live slot as dirty), so its
    // first write need not mark it dirty (a synchronous header write).
    table->dirty_marked_.store(true, std::memory_order_relaxed);
  }
  *result = std::move(table);
  return Status::OK();
}

Status FlatTable::OpenFiles(bool create) {
  (void)create;
  for (int f = 0; f < params_.index.data_files; ++f) {
    const std::string path = DataPath(f);
    if (access(path.c_str(), F_OK) != 0) continue;  // created on first write
    std::unique_ptr<LogFile> log;
    FLATKV_RETURN_IF_ERROR(LogFile::Open(path, false, &log));
    files_[f].log.store(log.get(), std::memory_order_release);
    files_[f].owner = std::move(log);
    counters_->data_files_open.fetch_add(1, std::memory_order_relaxed);
    // Below the head is what a head cleaning freed: punched again here, in
    // case the process died between writing META and punching.
    if (heads_[f] > 0) FLATKV_RETURN_IF_ERROR(files_[f].owner->DropBefore(heads_[f]));
  }
  return Status::OK();
}

Status FlatTable::Recover(bool force_rebuild) {
  const int n = params_.index.data_files;
  const std::vector<uint64_t> checkpoints = index_->checkpoints();
  bool needed = force_rebuild || !index_->clean();
  bool rebuild = force_rebuild;
  for (int f = 0; f < n; ++f) {
    const LogFile* log = files_[f].owner.get();
    const uint64_t size = log != nullptr ? log->end() : 0;
    if (size != checkpoints[f]) needed = true;
    if (size < checkpoints[f]) rebuild = true;  // the log lost bytes the index saw
  }
  // Clean with every checkpoint 0 is a new table's header, never marked
  // dirty (FlatTable::Open): after an OS crash its slots may have reached
  // the disk without the records they point at.
  if (!needed && index_->LiveSlots() > 0 &&
      std::all_of(checkpoints.begin(), checkpoints.end(), [](uint64_t c) { return c == 0; })) {
    needed = true;
  }
  dead_bytes_.store(index_->dead_bytes(), std::memory_order_relaxed);
  if (!needed) {
    for (int f = 0; f < n; ++f) files_[f].applied = checkpoints[f];
    return Status::OK();
  }
  for (;;) {
    if (rebuild) {
      spdlog::warn("rebuilding the index of {} from its data files", params_.dir);
      FLATKV_RETURN_IF_ERROR(index_->Clear());
      counters_->index_rebuilds.fetch_add(1, std::memory_order_relaxed);
    }
    std::vector<std::vector<uint64_t>> positions(n);
    for (int f = 0; f < n; ++f) {
      // Nothing before a file's head is read: it was freed (a hole of zeros).
      const uint64_t head = files_[f].owner != nullptr ? files_[f].owner->begin() : 0;
      FLATKV_RETURN_IF_ERROR(
          Replay(f, rebuild ? head : std::max(head, checkpoints[f]), rebuild, &positions[f]));
    }
    if (rebuild) break;
    // Every slot pointing past its checkpoint must be a record replay found.
    bool stale = false;
    for (uint64_t s = 0; s < params_.index.slots && !stale; ++s) {
      const uint64_t v = index_->Load(s);
      if (v == 0) continue;
      uint64_t pos;
      size_t guess;
      DecodeSlot(v, &pos, &guess);
      const int f = static_cast<int>(s % n);
      const LogFile* log = files_[f].owner.get();
      if (log == nullptr || pos < log->begin()) {
        spdlog::warn("{}: slot {} points at offset {} of data file {}, before its head (freed)",
                     params_.dir, s, pos, f);
        stale = true;
        break;
      }
      if (pos >= checkpoints[f] &&
          !std::binary_search(positions[f].begin(), positions[f].end(), pos)) {
        spdlog::warn("{}: slot {} points at offset {} of data file {}, past its checkpoint, "
                     "where no valid record is",
                     params_.dir, s, pos, f);
        stale = true;
      }
    }
    if (!stale) break;
    rebuild = true;
  }
  std::vector<uint64_t> ends(n, 0);
  for (int f = 0; f < n; ++f) {
    if (files_[f].owner != nullptr) ends[f] = files_[f].owner->end();
    files_[f].applied = ends[f];
  }
  // The index now agrees with the logs: make that durable as a clean state.
  FLATKV_RETURN_IF_ERROR(index_->Sync());
  return index_->WriteHeader(true, ends);
}

Status FlatTable::Replay(int file, uint64_t from, bool rebuild, std::vector<uint64_t>* positions) {
  LogFile* log = files_[file].owner.get();
  if (log == nullptr) return Status::OK();
  const int n = params_.index.data_files;
  const std::string path = log->path();
  const uint64_t limit = log->allocated();
  LogReader reader(log, from, limit, [&](uint64_t offset, uint64_t bytes, const char* reason) {
    if (offset + bytes >= limit) {
      // After a crash the tail holds a torn write and/or reserved zeros.
      spdlog::info("{}: dropping {} bytes after the last valid record at offset {} ({})", path,
                   bytes, offset, reason);
      return;
    }
    counters_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("{}: skipped {} corrupt bytes at offset {}: {}", path, bytes, offset, reason);
  });
  RecordView view;
  uint64_t pos;
  uint64_t applied = 0;
  while (reader.Next(&view, &pos)) {
    const uint64_t slot = static_cast<uint64_t>(view.key) - static_cast<uint64_t>(kmin());
    if (slot >= slots() || static_cast<int>(slot % n) != file) {
      counters_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("{}: record at offset {} has key {}, which does not belong in this file",
                   path, pos, view.key);
      continue;
    }
    const uint64_t v = view.type == RecordType::kTombstone ? 0 : EncodeSlot(pos, view.size);
    FLATKV_RETURN_IF_ERROR(index_->Store(slot, v));
    positions->push_back(pos);
    ++applied;
  }
  counters_->recovery_bytes_scanned.fetch_add(reader.bytes_read(), std::memory_order_relaxed);
  counters_->recovery_records.fetch_add(applied, std::memory_order_relaxed);
  FLATKV_RETURN_IF_ERROR(reader.status());
  spdlog::info("{}: {} {} records from offset {} to {}", path, rebuild ? "rebuilt" : "replayed",
               applied, from, reader.valid_end());
  if (reader.valid_end() != log->allocated()) FLATKV_RETURN_IF_ERROR(log->Truncate(reader.valid_end()));
  return log->Sync();
}

}  // namespace flatkv::engine
