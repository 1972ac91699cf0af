// The admin calls of the front (write mode, compaction, backup, verify,
// digest) and what it reports of itself (info, stats and the recent load).
#include "server/handler.h"

#include <sys/statvfs.h>

#include <cstring>
#include <type_traits>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "server/methods.h"

namespace flatkv::server {

void Handler::setWriteMode(const std::string& token, rpc::WriteMode::type mode_arg) {
  // The generated code stores any i32 from the wire in the enum; loading a
  // value outside its range as the enum is undefined behaviour (found by
  // tests/fuzz/server_fuzz: mode 258), so it is read back as its integer.
  std::underlying_type_t<rpc::WriteMode::type> raw;
  static_assert(sizeof(raw) == sizeof(mode_arg));
  std::memcpy(&raw, &mode_arg, sizeof(raw));
  Run(kSetWriteMode, [&] {
    CheckAdmin(token);
    if (raw != rpc::WriteMode::SAFE && raw != rpc::WriteMode::ASYNC) {
      throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "unknown write mode " + std::to_string(raw));
    }
    const auto mode = static_cast<rpc::WriteMode::type>(raw);
    Status st = cache_->SetMode(mode == rpc::WriteMode::SAFE ? engine::cache::WriteMode::kSafe
                                                              : engine::cache::WriteMode::kAsync);
    if (!st.ok()) ThrowKvError(st);
    spdlog::info("write mode is now {}", mode == rpc::WriteMode::SAFE ? "safe" : "async");
  });
}

rpc::WriteMode::type Handler::getWriteMode() {
  rpc::WriteMode::type mode = rpc::WriteMode::SAFE;
  Run(kGetWriteMode, [&] {
    mode = cache_->mode() == engine::cache::WriteMode::kSafe ? rpc::WriteMode::SAFE
                                                              : rpc::WriteMode::ASYNC;
  });
  return mode;
}

void Handler::compact(const std::string& token) {
  Run(kCompact, [&] {
    CheckAdmin(token);
    Status st = cache_->Flush();
    if (st.ok()) st = store_->Compact();
    if (!st.ok()) ThrowKvError(st);
  });
}

void Handler::compactionStatus(rpc::CompactionStatus& result) {
  Run(kCompactionStatus, [&] {
    const engine::CompactionStatus s = store_->GetCompactionStatus();
    result.running = s.running;
    result.percent = s.percent;
    result.bytesDone = static_cast<int64_t>(s.bytes_done);
    result.bytesTotal = static_cast<int64_t>(s.bytes_total);
    result.tablesCompacted = static_cast<int64_t>(s.tables_compacted);
    result.bytesReclaimed = static_cast<int64_t>(s.bytes_reclaimed);
    result.lastError = s.last_error;
  });
}

void Handler::backup(const std::string& token, const std::string& dir, int32_t mb_per_sec) {
  Run(kBackup, [&] {
    CheckAdmin(token);
    if (backup_disabled_) ThrowIfError(Status::InvalidArgument("backup is disabled here"));
    if (mb_per_sec < 0) ThrowIfError(Status::InvalidArgument("mbPerSec must be >= 0"));
    // Every write acknowledged so far reaches the store before the copy
    // starts reading it.
    ThrowIfError(cache_->Flush());
    ThrowIfError(backup_->Start(dir, static_cast<uint32_t>(mb_per_sec)));
  });
}

void Handler::backupStatus(rpc::BackupStatus& result) {
  Run(kBackupStatus, [&] {
    const engine::BackupStatus s = backup_->GetStatus();
    result.running = s.running;
    result.percent = s.percent;
    result.bytesDone = static_cast<int64_t>(s.bytes_done);
    result.bytesTotal = static_cast<int64_t>(s.bytes_total);
    result.keysDone = static_cast<int64_t>(s.keys_done);
    result.corruptSkipped = static_cast<int64_t>(s.corrupt_skipped);
    result.path = s.path;
    result.complete = s.complete;
    result.lastError = s.last_error;
  });
}

void Handler::info(rpc::NodeInfo& result) {
  Run(kInfo, [&] {
    result.version = "0.1.0";
    result.mark = config_.cluster.mark;
    result.keyMin = config_.storage.key_min;
    result.keyMax = config_.storage.key_max;
    result.role = Role();
    result.writeMode = cache_->mode() == engine::cache::WriteMode::kSafe ? rpc::WriteMode::SAFE
                                                                          : rpc::WriteMode::ASYNC;
    result.uptimeSeconds = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::steady_clock::now() - started_)
                               .count();
  });
}

void Handler::stats(std::map<std::string, int64_t>& result) {
  Run(kStats, [&] { CollectStats(&result); });
}

void Handler::CollectStats(std::map<std::string, int64_t>* out) const {
  std::map<std::string, int64_t>& result = *out;
  for (int m = 0; m < kMethods; ++m) {
    result[std::string("calls.") + TraitsOf(static_cast<Method>(m)).name] = calls_[m].load();
    result[std::string("errors.") + TraitsOf(static_cast<Method>(m)).name] = errors_[m].load();
  }
  const engine::cache::CacheStats c = cache_->stats();
  result["cache.hits"] = static_cast<int64_t>(c.hits);
  result["cache.misses"] = static_cast<int64_t>(c.misses);
  result["cache.evictions"] = static_cast<int64_t>(c.evictions);
  result["cache.dirty_bytes"] = static_cast<int64_t>(c.dirty_bytes);
  result["cache.flushes"] = static_cast<int64_t>(c.flushes);
  result["cache.coalesced"] = static_cast<int64_t>(c.coalesced);
  result["cache.writer_waits"] = static_cast<int64_t>(c.writer_waits);
  result["cache.flush_failures"] = static_cast<int64_t>(c.flush_failures);
  const engine::EngineStats e = store_->GetStats();
  result["engine.segments"] = static_cast<int64_t>(e.segments);
  result["engine.segments_open"] = static_cast<int64_t>(e.segments_open);
  result["engine.segment_opens"] = static_cast<int64_t>(e.segment_opens);
  result["engine.segment_closes"] = static_cast<int64_t>(e.segment_closes);
  result["engine.data_files_open"] = static_cast<int64_t>(e.data_files_open);
  result["engine.bytes_appended"] = static_cast<int64_t>(e.bytes_appended);
  result["engine.fdatasyncs"] = static_cast<int64_t>(e.fdatasyncs);
  result["engine.corrupt_records"] = static_cast<int64_t>(e.corrupt_records);
  result["engine.buckets_damaged"] = static_cast<int64_t>(e.buckets_damaged);
  result["engine.recovery_records"] = static_cast<int64_t>(e.recovery_records);
  result["engine.recovery_bytes_scanned"] = static_cast<int64_t>(e.recovery_bytes_scanned);
  result["engine.index_rebuilds"] = static_cast<int64_t>(e.index_rebuilds);
  result["engine.string_filter_skips"] = static_cast<int64_t>(e.string_filter_skips);
  result["engine.sparse_keys"] = static_cast<int64_t>(e.sparse_keys);
  result["engine.sparse_promotions"] = static_cast<int64_t>(e.sparse_promotions);
  result["engine.live_bytes"] = static_cast<int64_t>(store_->LiveBytesEstimate());
  // Compaction progress, as compactionStatus() gives it (percent in
  // hundredths: stats are integers).
  const engine::CompactionStatus cs = store_->GetCompactionStatus();
  result["compaction.running"] = cs.running ? 1 : 0;
  result["compaction.percent_x100"] = static_cast<int64_t>(cs.percent * 100);
  result["compaction.round_done_bytes"] = static_cast<int64_t>(cs.bytes_done);
  result["compaction.round_bytes"] = static_cast<int64_t>(cs.bytes_total);
  result["compaction.tables_compacted"] = static_cast<int64_t>(cs.tables_compacted);
  result["compaction.heads_cleaned"] = static_cast<int64_t>(cs.heads_cleaned);
  result["compaction.bytes_reclaimed"] = static_cast<int64_t>(cs.bytes_reclaimed);
  // The file system holding the store: one statvfs, cheap enough per call.
  struct statvfs fs;
  if (statvfs(store_->options().path.c_str(), &fs) == 0) {
    result["disk.total_bytes"] = static_cast<int64_t>(fs.f_blocks) * static_cast<int64_t>(fs.f_frsize);
    result["disk.free_bytes"] = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }
  result["engine.no_space_errors"] = static_cast<int64_t>(e.no_space_errors);
  result["engine.disk_full"] = static_cast<int64_t>(e.disk_full);
  result["engine.write_stalls"] = static_cast<int64_t>(e.write_stalls);
  result["engine.write_stall_ms"] = static_cast<int64_t>(e.write_stall_us / 1000);
  result["cache.flush_failing"] = c.flush_failing ? 1 : 0;
  AddRecentLoad(&result);
  AddMemberStats(&result);
  if (server_stats_) server_stats_(&result);
}

// The data calls, a client's and those forwarded here, as one histogram:
// a member's load, whichever instance the clients talk to.
void Handler::AddRecentLoad(std::map<std::string, int64_t>* out) const {
  static constexpr Method kData[] = {
      kGet, kPut, kRemove, kAppend, kMultiGet, kMultiPut, kScan, kScanLog, kSGet, kSPut, kSRemove,
      kPeerGet, kPeerPut, kPeerRemove, kPeerAppend, kPeerMultiGet, kPeerMultiPut, kPeerScan,
      kPeerScanLog, kPeerSGet, kPeerSPut, kPeerSRemove};
  LatencyHistogram::Snapshot total;
  for (Method m : kData) {
    const LatencyHistogram::Snapshot s = latency_[m].Read();
    total.count += s.count;
    for (size_t i = 0; i < total.cumulative.size(); ++i) total.cumulative[i] += s.cumulative[i];
  }
  const RecentLoad::Result r = recent_.Sample(std::chrono::steady_clock::now(), total);
  (*out)["recent.window_ms"] = r.window_ms;
  (*out)["recent.ops_per_sec"] = r.ops_per_sec;
  (*out)["recent.p99_us"] = r.p99_us;
}

void Handler::verify(rpc::VerifyResult& result, const std::string& token, bool repair) {
  Run(kVerify, [&] {
    CheckAdmin(token);
    ThrowIfError(cache_->Flush());  // async writes reach the store first
    engine::Store::VerifyReport report;
    ThrowIfError(store_->Verify(&report));
    result.records = static_cast<int64_t>(report.records);
    result.bytes = static_cast<int64_t>(report.bytes);
    result.corrupt = static_cast<int64_t>(report.corrupt_keys.size() +
                                          report.corrupt_buckets.size());
    result.repaired = 0;
    constexpr size_t kMaxProblems = 100;
    auto note = [&](std::string line) {
      spdlog::warn("verify: {}", line);
      if (result.problems.size() < kMaxProblems) result.problems.push_back(std::move(line));
    };
    for (int64_t key : report.corrupt_keys) {
      std::string value;
      Status bad = store_->Get(key, &value);  // its message names the file and offset
      if (!bad.IsCorruption()) {
        note("key " + std::to_string(key) + ": bad when read, rewritten since");
        continue;
      }
      if (!repair) {
        note(bad.message());
        continue;
      }
      rpc::GetResult ignored;
      Status st = RepairRead(key, bad, &ignored);
      if (st.ok()) {
        ++result.repaired;
        note(bad.message() + ": repaired from the chain");
      } else if (st.message() == bad.message()) {
        note(bad.message() + ": not repaired (no other member holds a copy)");
      } else {
        note(st.message());
      }
    }
    for (int64_t slot : report.corrupt_buckets) {
      std::vector<engine::StringKeyValue> live;
      Status bad = store_->SReadBucket(slot, &live);
      const std::string what = "string-key bucket " + std::to_string(slot);
      if (!bad.IsCorruption()) {
        note(what + ": bad when read, rewritten since");
        continue;
      }
      if (!repair || !HasOtherCopies()) {
        note(what + ": " + bad.message() +
             (repair ? ": not repaired (no other member holds a copy)" : ""));
        continue;
      }
      std::string bucket;
      Status st = RepairBucket(slot, &bucket);
      if (st.ok()) {
        ++result.repaired;
        note(what + ": " + bad.message() + ": repaired from the chain");
      } else {
        note(what + ": " + bad.message() + "; repair from the chain failed: " + st.message());
      }
    }
  });
}

void Handler::digest(rpc::Digest& result, const std::string& token) {
  Run(kDigest, [&] {
    CheckAdmin(token);
    // What the store holds now: writes still in an async cache first.
    ThrowIfError(cache_->Flush());
    uint64_t x = 0;
    int64_t keys = 0;
    int64_t skeys = 0;
    std::string buf;
    ThrowIfError(ForEachPage(
        *store_, 1024,
        [&](std::vector<engine::KeyValue>* out) {
          for (const engine::KeyValue& kv : *out) {
            buf.assign(reinterpret_cast<const char*>(&kv.key), sizeof(kv.key));
            buf += kv.value;
            x ^= XXH64(buf.data(), buf.size(), 0);
          }
          keys += static_cast<int64_t>(out->size());
          return true;
        },
        [&](std::vector<engine::StringKeyValue>* out) {
          for (const engine::StringKeyValue& kv : *out) {
            // Length-prefixed so ("ab", "c") and ("a", "bc") differ; seed 1
            // keeps string keys apart from integer ones.
            const uint32_t n = static_cast<uint32_t>(kv.key.size());
            buf.assign(reinterpret_cast<const char*>(&n), sizeof(n));
            buf += kv.key;
            buf += kv.value;
            x ^= XXH64(buf.data(), buf.size(), 1);
          }
          skeys += static_cast<int64_t>(out->size());
          return true;
        }));
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(x));
    result.keys = keys;
    result.stringKeys = skeys;
    result.digest = hex;
  });
}

}  // namespace flatkv::server
