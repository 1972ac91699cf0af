// A full disk in a chain member: leaving the chain at once and staying up
// (LeaveForFullDisk), and rejoining once space is freed
// (RejoinAfterFullDisk).
#include <sys/statvfs.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "server/member/replicator.h"
#include "server/member/replicator_internal.h"

namespace flatkv::server {
namespace {

using partition::ChainEntry;
using partition::ChainOutput;
using partition::ChainPosition;

}  // namespace

// A full disk: rather than stop the process (as for other I/O errors), the
// member leaves the chain at once and stays up, saying why (stats, /health,
// the log), so the chain goes on without it after a ring change (about a
// second) instead of a session timeout. Its member state may claim the
// batch that failed, so it is fenced now and rebuilt from the chain log
// before it rejoins (RejoinAfterFullDisk), as a restart would.
void Replicator::LeaveForFullDisk(const char* what, const Status& st, ChainOutput* out) {
  {
    std::lock_guard<std::mutex> lock(disk_mu_);
    disk_full_reason_ = std::string(what) + ": " + st.message();
  }
  const bool first = !disk_full_.exchange(true);
  if (first) disk_full_leaves_.fetch_add(1, std::memory_order_relaxed);
  spdlog::error("chain: {}: {}; leaving mark {}'s chain (this member stays up, out of the "
                "chain, and rejoins once its disk has {} bytes free)",
                what, st.ToString(), options_.mark, RejoinFreeBytes());
  DropOutput(out, Status::NoSpace("member " + options_.self + " left its chain: " +
                                  st.message()));
  ChainOutput fenced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    member_->SetFenced(true, &fenced);
  }
  DropOutput(&fenced, Status::NoSpace("member " + options_.self + " left its chain: " +
                                      st.message()));
  coordinator_->Deregister();
}

void Replicator::DropOutput(ChainOutput* out, const Status& why) {
  for (const ChainOutput::Reply& r : out->replies) Finish(r.request, why);
  for (uint64_t r : out->reads) Finish(r, Status::Unavailable(why.message()));
  *out = ChainOutput();
}

uint64_t Replicator::RejoinFreeBytes() const {
  struct statvfs vfs;
  if (statvfs(options_.data_dir.c_str(), &vfs) != 0) return kRejoinFreeBytes;
  const uint64_t total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  return std::min<uint64_t>(kRejoinFreeBytes, total / 10);
}

bool Replicator::RejoinAfterFullDisk(int64_t now, ChainOutput* out) {
  if (now - last_space_check_ < 1000) return false;
  last_space_check_ = now;
  struct statvfs vfs;
  if (statvfs(options_.data_dir.c_str(), &vfs) != 0) return false;
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (avail < RejoinFreeBytes()) return false;
  // Start over from the position the log holds, as a restart does. Unlike
  // a restart, only the batch that failed to apply is applied again: the
  // store holds every earlier logged write already, and replaying the whole
  // log would append all of it to the store once more (on a disk that was
  // just full, enough to fill it again).
  const std::string path = options_.data_dir + "/CHAINLOG";
  ChainLog::State state;
  std::vector<ChainEntry> entries;
  std::unique_ptr<ChainLog> log;
  Status st = ChainLog::Open(path, &state, &entries, &log);
  if (st.ok() && !unapplied_.empty()) st = ApplyEntries(unapplied_);
  if (!st.ok()) {
    spdlog::warn("chain: {} bytes free, but rejoining failed: {}; trying again", avail,
                 st.ToString());
    return false;
  }
  const ChainPosition position =
      entries.empty() ? state.position : ChainPosition{entries.back().epoch, entries.back().seq};
  {
    std::lock_guard<std::mutex> lock(mu_);
    member_ = std::make_unique<partition::ChainMember>(options_.self, options_.chain, position,
                                                       state.intact);
    existed_.clear();
    seq_of_request_.clear();
    if (ring_ != nullptr) member_->OnConfig(ConfigOf(*ring_), now, out);
  }
  {
    std::lock_guard<std::mutex> lock(sync_mu_);  // the syncer is idle: nothing is held
    log_ = std::move(log);
    sync_error_ = Status::OK();
    sync_want_ = sync_done_ = logged_batch_;
  }
  logged_intact_ = intact_ = state.intact;
  unapplied_.clear();
  disk_full_.store(false);
  spdlog::info("chain: the disk has room again ({} bytes free): rejoining mark {} from epoch {} "
               "seq {}",
               avail, options_.mark, position.epoch, position.seq);
  return true;
}

std::string Replicator::DiskFull() const {
  if (!disk_full_.load()) return "";
  std::lock_guard<std::mutex> lock(disk_mu_);
  return disk_full_reason_;
}

}  // namespace flatkv::server
