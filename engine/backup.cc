// Implementation notes
//
// The copy reads the source only through its public, thread-safe calls
// (Scan, SScan, LiveBytesEstimate), which serve concurrently with writers;
// it never touches the source's files, so compaction, checkpoints and the
// open-file budget go on as usual. It writes into DIR.partial and renames
// it to DIR only after the new store closed cleanly (and the parent
// directory is synced), so DIR either does not exist or is complete.
#include "engine/backup.h"

#include "engine/log_file.h"
#include "engine/store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>
#include <vector>

namespace flatkv::engine {
namespace {

constexpr size_t kPage = 1024;  // pairs per scan call and per batch written

uint64_t NowNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

Backup::Backup(const Store* source) : source_(source) {}

Backup::~Backup() { Stop(); }

Status Backup::Start(const std::string& dir, uint32_t mb_per_sec) {
  namespace fs = std::filesystem;
  const fs::path path(dir);
  if (dir.empty() || !path.is_absolute()) {
    return Status::InvalidArgument("backup directory must be an absolute path: '" + dir + "'");
  }
  std::error_code ec;
  if (fs::exists(path, ec) || fs::exists(dir + ".partial", ec)) {
    return Status::InvalidArgument("backup directory " + dir + " (or .partial) exists already");
  }
  if (!fs::is_directory(path.parent_path(), ec)) {
    return Status::InvalidArgument("backup directory's parent " + path.parent_path().string() +
                                   " is not a directory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) return Status::Busy("a backup to " + path_ + " is running");
  if (thread_.joinable()) thread_.join();  // the last one, finished
  running_ = true;
  complete_ = false;
  path_ = dir;
  last_error_.clear();
  bytes_total_ = source_->LiveBytesEstimate();
  bytes_done_ = 0;
  keys_done_ = 0;
  corrupt_skipped_ = 0;
  stop_ = false;
  thread_ = std::thread([this, dir, mb_per_sec] { Run(dir, mb_per_sec); });
  return Status::OK();
}

BackupStatus Backup::GetStatus() const {
  BackupStatus s;
  std::lock_guard<std::mutex> lock(mu_);
  s.running = running_;
  s.complete = complete_;
  s.path = path_;
  s.last_error = last_error_;
  s.bytes_total = bytes_total_;
  s.bytes_done = bytes_done_.load();
  s.keys_done = keys_done_.load();
  s.corrupt_skipped = corrupt_skipped_.load();
  if (complete_) {
    s.percent = 100;
  } else if (s.bytes_total > 0) {
    // bytes_total counts record headers too: never claim 100 before the end.
    s.percent = std::min(99.9, 100.0 * static_cast<double>(s.bytes_done) /
                                   static_cast<double>(s.bytes_total));
  }
  return s;
}

void Backup::Stop() {
  stop_ = true;
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

void Backup::Run(std::string dir, uint32_t mb_per_sec) {
  const std::string partial = dir + ".partial";
  const uint64_t start = NowNanos();
  spdlog::info("backup to {}: started ({} MB/s{})", dir, mb_per_sec,
               mb_per_sec == 0 ? ", unlimited" : "");
  Status st = Copy(partial, mb_per_sec);
  if (st.ok()) {
    std::error_code ec;
    std::filesystem::rename(partial, dir, ec);
    if (ec) st = Status::IOError("rename " + partial + " to " + dir + ": " + ec.message());
  }
  if (st.ok()) st = SyncDirectory(std::filesystem::path(dir).parent_path().string());
  if (!st.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(partial, ec);
    spdlog::error("backup to {}: {}", dir, st.ToString());
  } else {
    const double seconds = static_cast<double>(NowNanos() - start) / 1e9;
    spdlog::info("backup to {}: done, {} keys, {:.1f} MB in {:.1f} s ({:.1f} MB/s){}", dir,
                 keys_done_.load(), static_cast<double>(bytes_done_.load()) / 1e6, seconds,
                 static_cast<double>(bytes_done_.load()) / 1e6 / std::max(seconds, 1e-3),
                 corrupt_skipped_.load() == 0
                     ? std::string()
                     : ", " + std::to_string(corrupt_skipped_.load()) + " corrupt records skipped");
  }
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
  complete_ = st.ok();
  last_error_ = st.ok() ? std::string() : st.ToString();
}

bool Backup::Throttle(uint32_t mb_per_sec, uint64_t start_ns) {
  if (mb_per_sec == 0) return !stop_;
  // The time the bytes so far should have taken; sleep off any lead, in
  // steps short enough to notice Stop().
  const double due_s = static_cast<double>(bytes_done_.load()) / (mb_per_sec * 1e6);
  while (!stop_) {
    const double ahead = due_s - static_cast<double>(NowNanos() - start_ns) / 1e9;
    if (ahead <= 0) break;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(ahead, 0.05)));
  }
  return !stop_;
}

Status Backup::Copy(const std::string& partial, uint32_t mb_per_sec) {
  EngineOptions options = source_->options();
  options.path = partial;
  // One Sync() at the end makes the copy durable; fdatasync per batch
  // (sync: always) would only slow it. A few descriptors are enough for a
  // writer going through the key space in order.
  options.sync = SyncMode::kNone;
  options.max_open_files = std::min<uint32_t>(options.max_open_files, 256);
  std::unique_ptr<Store> dst;
  FLATKV_RETURN_IF_ERROR(Store::Open(options, &dst));
  const uint64_t start = NowNanos();
  auto copy = [&]() -> Status {
    // Integer keys, in key order, a page at a time.
    std::vector<KeyValue> page;
    std::vector<KeyValueRef> refs;
    std::vector<int64_t> corrupt;
    int64_t from = std::numeric_limits<int64_t>::min();
    for (bool done = false; !done;) {
      if (!Throttle(mb_per_sec, start)) return Status::Unavailable("backup stopped");
      int64_t next = 0;
      corrupt.clear();
      FLATKV_RETURN_IF_ERROR(source_->Scan(from, false, kPage, std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max(), &page, &next,
                                           &done, &corrupt));
      corrupt_skipped_ += corrupt.size();
      if (!page.empty()) {
        refs.clear();
        uint64_t bytes = 0;
        for (const KeyValue& kv : page) {
          refs.push_back({kv.key, kv.value});
          bytes += sizeof(int64_t) + kv.value.size();
        }
        FLATKV_RETURN_IF_ERROR(dst->PutBatch(refs));
        bytes_done_ += bytes;
        keys_done_ += page.size();
      }
      from = next;
    }
    // String keys, in hash order.
    std::vector<StringKeyValue> spage;
    std::string cursor;
    for (bool done = false; !done;) {
      if (!Throttle(mb_per_sec, start)) return Status::Unavailable("backup stopped");
      std::string next;
      FLATKV_RETURN_IF_ERROR(source_->SScan(cursor, kPage, &spage, &next, &done));
      for (const StringKeyValue& kv : spage) {
        FLATKV_RETURN_IF_ERROR(dst->SPut(kv.key, kv.value));
        bytes_done_ += kv.key.size() + kv.value.size();
        ++keys_done_;
      }
      cursor = std::move(next);
    }
    return Status::OK();
  };
  Status st = copy();
  if (st.ok()) st = dst->Sync();  // the copy is durable before the rename
  Status closed = dst->Close();
  return st.ok() ? closed : st;
}

}  // namespace flatkv::engine
