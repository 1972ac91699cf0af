// MemberHandler's peer* methods: the calls other instances send this
// member (forwarded client calls, the chain's frames and snapshots, read
// repair's questions, a ring change's export, fence, tracking and drop).
// Each checks first that the caller is a member of the ring (the peer
// token) and that this mark owns what the call names (CheckPeer), or that
// this member is the head of the chain it names (CheckHeadOf).
#include <spdlog/spdlog.h>

#include "server/event_server.h"
#include "server/member/cluster.h"
#include "server/member/member_handler.h"
#include "server/member/migration.h"
#include "server/member/replicator.h"

namespace flatkv::server {

void MemberHandler::peerChain(const rpc::PeerContext& ctx, const std::string& from,
                        const rpc::ChainFrame& frame) {
  try {
    Run(kPeerChain, [&] {
      if (replicator_ == nullptr) {
        ThrowKvError(Status::NotOwner("this instance is not a member of a chain"));
      }
      ThrowIfError(cluster_->CheckPeerMark(ctx));
      ThrowIfError(replicator_->OnFrame(from, frame, !EventServer::InlineOnIoThread()));
    });
  } catch (const rpc::KvError& e) {
    // A oneway call: the refusal reaches only errors.peerChain (Run) and
    // the log (a refused sender resends every resend interval).
    WarnRateLimited("chain: refused a message from " + from + ": " + e.message);
  }
}

int64_t MemberHandler::peerSnapshot(const rpc::PeerContext& ctx, const std::string& from,
                              const rpc::SnapshotPage& page) {
  int64_t token = 0;
  Run(kPeerSnapshot, [&] {
    if (replicator_ == nullptr) {
      ThrowKvError(Status::NotOwner("this instance is not a member of a chain"));
    }
    ThrowIfError(cluster_->CheckPeerMark(ctx));
    for (const rpc::KvPair& p : page.pairs) ThrowIfError(store_->CheckKey(p.key));
    ThrowIfError(replicator_->OnSnapshotPage(from, page, &token));
  });
  return token;
}

void MemberHandler::peerGet(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) {
  Run(kPeerGet, [&] {
    CheckPeer(ctx, key, key);
    if (!ctx.ownCopy) return LocalGet(result, key);
    // Read repair's question: this member's own copy, no gate, no repair;
    // only from a member in the chain (one catching up may lack writes).
    const partition::ChainRole role =
        replicator_ != nullptr ? replicator_->chain_role() : partition::ChainRole::kNone;
    if (role != partition::ChainRole::kHead && role != partition::ChainRole::kMiddle &&
        role != partition::ChainRole::kTail) {
      ThrowKvError(Status::Unavailable(
          "member " + cluster_->advertise() + " is " +
          (replicator_ == nullptr ? "not in a chain" : partition::RoleName(role)) +
          ": no copy to repair from"));
    }
    Status st = cache_->Get(key, &result.value);
    result.found = st.ok();
    if (!st.ok() && !st.IsNotFound()) ThrowKvError(st);
  });
}

void MemberHandler::peerExport(rpc::ExportPage& result, const rpc::PeerContext& ctx, int64_t lo,
                         int64_t hi, const std::string& cursor, int32_t limit) {
  Run(kPeerExport, [&] {
    if (limit <= 0 || lo > hi) {
      throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT,
                      "peerExport: limit must be positive and lo at most hi");
    }
    CheckPeer(ctx, lo, hi);
    ThrowIfError(cache_->Flush());  // writes still in an async cache too
    const auto ring = cluster_->ring();
    const int64_t bound = ring ? ring->settings().hash_bound : config_.cluster.hash_bound;
    ThrowIfError(ExportRange(*store_, bound, lo, hi, cursor, static_cast<size_t>(limit), &result));
    if (cursor.empty()) {
      // For the importer's percent: the range's share of this store.
      // String hashes lie in [0, bound).
      const double from = static_cast<double>(std::max<int64_t>(lo, 0));
      const double to = static_cast<double>(std::min<int64_t>(hi, bound - 1));
      const double strings = to < from ? 0.0 : (to - from + 1) / static_cast<double>(bound);
      result.__set_totalBytes(static_cast<int64_t>(store_->LiveBytesEstimate(lo, hi, strings)));
    }
  });
}

void MemberHandler::CheckHeadOf(const rpc::PeerContext& ctx, const char* what) {
  if (replicator_ == nullptr) {
    ThrowKvError(Status::NotOwner("this instance is not a member of a chain"));
  }
  ThrowIfError(cluster_->CheckPeerMark(ctx));
  if (replicator_->head() != cluster_->advertise()) {
    ThrowKvError(Status::NotOwner(std::string(what) + ": member " + cluster_->advertise() +
                                  " is not the head of mark " +
                                  std::to_string(cluster_->mark()) + "'s chain"));
  }
}

void MemberHandler::peerFence(const rpc::PeerContext& ctx) {
  Run(kPeerFence, [&] {
    CheckHeadOf(ctx, "peerFence");
    // The change node, read before anything else is accepted (if ZooKeeper
    // does not answer, the check below judges the ring that was there).
    (void)cluster_->Refresh();
    const auto ring = cluster_->ring();
    const partition::RingChange* change = ring ? ring->change() : nullptr;
    if (change == nullptr || change->state != "copy" || change->source != cluster_->mark()) {
      ThrowKvError(Status::InvalidArgument("peerFence: no ring change copies keys from mark " +
                                           std::to_string(cluster_->mark())));
    }
    // An empty write: answered once everything sequenced before it is.
    ThrowIfError(replicator_->Write({}, {}, nullptr));
  });
}

void MemberHandler::peerTrack(rpc::TrackToken& result, const rpc::PeerContext& ctx, int64_t czxid) {
  Run(kPeerTrack, [&] {
    CheckHeadOf(ctx, "peerTrack");
    (void)cluster_->Refresh();  // as peerFence
    const auto ring = cluster_->ring();
    const partition::RingChange* change = ring ? ring->change() : nullptr;
    if (change == nullptr || change->state != "precopy" || change->czxid != czxid ||
        change->source != cluster_->mark()) {
      ThrowKvError(Status::InvalidArgument(
          "peerTrack: no ring change in state precopy (czxid " + std::to_string(czxid) +
          ") copies keys from mark " + std::to_string(cluster_->mark())));
    }
    ThrowIfError(replicator_->StartTracking(*change, ring->settings().hash_bound, &result));
    spdlog::info("ring change: recording writes to {} for the importer {} (pre-copy)",
                 change->ToJson(), change->importer);
  });
}

void MemberHandler::peerDelta(rpc::DeltaPage& result, const rpc::PeerContext& ctx,
                        const rpc::TrackToken& token, const std::string& cursor, int32_t limit) {
  Run(kPeerDelta, [&] {
    if (limit <= 0) {
      throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "peerDelta: limit must be positive");
    }
    CheckHeadOf(ctx, "peerDelta");
    std::vector<int64_t> keys;
    std::vector<std::string> skeys;
    result.done = true;
    replicator_->Tracked(token, cursor, static_cast<size_t>(limit), &keys, &skeys, &result.done,
                         &result.cursor, &result.recorded, &result.reason);
    result.continuous = result.reason.empty();
    if (!result.continuous) return;
    // After the fence nothing is written to these keys: this head's values
    // are the newest (every write it sequenced is committed). A page ends
    // early past 8 MiB of values (the frame limits).
    constexpr uint64_t kPageBytes = 8 << 20;
    uint64_t bytes = 0;
    std::string last;  // resumes after the last key this page holds
    auto full = [&] {
      if (bytes < kPageBytes || last.empty()) return false;
      result.done = false;
      result.cursor = last;
      return true;
    };
    for (int64_t k : keys) {
      if (full()) return;
      last = Replicator::TrackedCursorAfter(k);
      rpc::KvPair p;
      Status st = cache_->Get(k, &p.value);
      if (st.IsNotFound()) {
        result.removed.push_back(k);
        continue;
      }
      ThrowIfError(st);
      p.key = k;
      bytes += p.value.size() + 8;
      result.pairs.push_back(std::move(p));
    }
    for (std::string& k : skeys) {
      if (full()) return;
      last = Replicator::TrackedCursorAfter(k);
      rpc::StringKvPair p;
      Status st = cache_->SGet(k, &p.value);
      if (st.IsNotFound()) {
        result.sremoved.push_back(std::move(k));
        continue;
      }
      ThrowIfError(st);
      bytes += k.size() + p.value.size();
      p.key = std::move(k);
      result.spairs.push_back(std::move(p));
    }
  });
}

int64_t MemberHandler::peerDrop(const rpc::PeerContext& ctx, int64_t lo, int64_t hi, int32_t limit) {
  int64_t dropped = 0;
  Run(kPeerDrop, [&] {
    if (limit < 0 || lo > hi) {
      throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT,
                      "peerDrop: limit must not be negative and lo must be at most hi");
    }
    // Limit 0 asks any member to confirm it lets the hashes go: from its
    // answer on its view refuses them (partition::ReleasedBy).
    if (limit > 0) {
      CheckHeadOf(ctx, "peerDrop");
    } else {
      ThrowIfError(cluster_->CheckPeerMark(ctx));
    }
    (void)cluster_->Refresh();  // as peerFence
    const auto ring = cluster_->ring();
    // Never drop what this mark still owns.
    for (const partition::HashRange& r : ring->KeyOrder()) {
      if (r.hi < lo || r.lo > hi) continue;
      if (ring->partitions()[r.partition].mark == cluster_->mark()) {
        ThrowKvError(Status::InvalidArgument(
            "peerDrop: mark " + std::to_string(cluster_->mark()) + " still owns hashes [" +
            std::to_string(std::max(lo, r.lo)) + ", " + std::to_string(std::min(hi, r.hi)) + "]"));
      }
    }
    if (limit == 0) return;
    replicator_->StopTracking();  // the change is past its copy: the record is done with
    ThrowIfError(cache_->Flush());
    ThrowIfError(DropRange(*store_, replicator_, ring->settings().hash_bound, lo, hi, limit,
                           &dropped));
  });
  return dropped;
}

void MemberHandler::peerBucket(std::string& result, const rpc::PeerContext& ctx, int64_t slots,
                         int64_t slot, bool repair) {
  Run(kPeerBucket, [&] {
    if (replicator_ == nullptr) {
      ThrowKvError(Status::NotOwner("this instance is not a member of a chain"));
    }
    ThrowIfError(cluster_->CheckPeerMark(ctx));
    if (repair) {
      CheckHeadOf(ctx, "repairing a string-key bucket");
      ThrowIfError(replicator_->RepairBucket(
          slots, slot, [&](std::string* copy) { return FetchBucket(slots, slot, copy); },
          &result));
      return;
    }
    // Read repair's question: this member's own copy, as peerGet's ownCopy.
    const partition::ChainRole role = replicator_->chain_role();
    if (role != partition::ChainRole::kHead && role != partition::ChainRole::kMiddle &&
        role != partition::ChainRole::kTail) {
      ThrowKvError(Status::Unavailable("member " + cluster_->advertise() + " is " +
                                       partition::RoleName(role) + ": no copy to repair from"));
    }
    if (slots != static_cast<int64_t>(store_->options().string_slots)) {
      ThrowKvError(Status::InvalidArgument(
          "storage.string_slots differs: " + std::to_string(slots) + " asked, " +
          std::to_string(store_->options().string_slots) + " on member " +
          cluster_->advertise()));
    }
    if (slot < 0 || slot >= slots) {
      ThrowKvError(Status::InvalidArgument("string-key slot " + std::to_string(slot) +
                                           " outside [0, " + std::to_string(slots) + ")"));
    }
    std::vector<engine::StringKeyValue> live;
    ThrowIfError(cache_->SReadBucket(slot, &live));
    result = EncodeBucket(live);
  });
}

void MemberHandler::peerRepair(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) {
  Run(kPeerRepair, [&] {
    CheckPeer(ctx, key, key);
    if (replicator_ == nullptr || replicator_->head() != cluster_->advertise()) {
      ThrowKvError(Status::NotOwner("member " + cluster_->advertise() +
                                    " is not the head of mark " +
                                    std::to_string(cluster_->mark()) + "'s chain"));
    }
    ThrowIfError(replicator_->Repair(
        key, [&](rpc::GetResult* copy) { return FetchCopy(key, copy); }, &result));
  });
}

void MemberHandler::peerPut(const rpc::PeerContext& ctx, int64_t key, const std::string& value) {
  Run(kPeerPut, [&] {
    CheckPeer(ctx, key, key);
    LocalPut(key, value);
  });
}

bool MemberHandler::peerRemove(const rpc::PeerContext& ctx, int64_t key) {
  bool existed = false;
  Run(kPeerRemove, [&] {
    CheckPeer(ctx, key, key);
    existed = LocalRemove(key);
  });
  return existed;
}

void MemberHandler::peerAppend(const rpc::PeerContext& ctx, int64_t key, const std::string& value) {
  Run(kPeerAppend, [&] {
    CheckPeer(ctx, key, key);
    LocalAppend(key, value);
  });
}

void MemberHandler::peerMultiGet(std::vector<rpc::GetResult>& result, const rpc::PeerContext& ctx,
                           const std::vector<int64_t>& keys) {
  Run(kPeerMultiGet, [&] {
    for (int64_t k : keys) CheckPeer(ctx, k, k);
    LocalMultiGet(result, keys);
  });
}

void MemberHandler::peerMultiPut(const rpc::PeerContext& ctx, const std::vector<rpc::KvPair>& pairs) {
  Run(kPeerMultiPut, [&] {
    for (const rpc::KvPair& p : pairs) CheckPeer(ctx, p.key, p.key);
    LocalMultiPut(pairs);
  });
}

void MemberHandler::peerScan(rpc::ScanResult& result, const rpc::PeerContext& ctx, int64_t from,
                       int32_t limit, bool reverse, int64_t lo, int64_t hi) {
  Run(kPeerScan, [&] {
    if (lo > hi || from < lo || from > hi) {
      throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "peerScan: from must lie in [lo, hi]");
    }
    CheckPeer(ctx, lo, hi);
    LocalScan(result, from, limit, reverse, lo, hi);
  });
}

void MemberHandler::peerScanLog(rpc::LogScanResult& result, const rpc::PeerContext& ctx,
                          const std::string& cursor, int32_t limit) {
  Run(kPeerScanLog, [&] {
    // Insertion order covers the whole partition: only the mark is checked.
    Status st = cluster_->CheckPeerMark(ctx);
    if (!st.ok()) ThrowKvError(st);
    LocalScanLog(result, cursor, limit);
  });
}

void MemberHandler::peerSGet(rpc::GetResult& result, const rpc::PeerContext& ctx,
                       const std::string& key) {
  Run(kPeerSGet, [&] {
    CheckPeer(ctx, StringHash(key), StringHash(key));
    LocalSGet(result, key);
  });
}

void MemberHandler::peerSPut(const rpc::PeerContext& ctx, const std::string& key,
                       const std::string& value) {
  Run(kPeerSPut, [&] {
    CheckPeer(ctx, StringHash(key), StringHash(key));
    LocalSPut(key, value);
  });
}

bool MemberHandler::peerSRemove(const rpc::PeerContext& ctx, const std::string& key) {
  bool existed = false;
  Run(kPeerSRemove, [&] {
    CheckPeer(ctx, StringHash(key), StringHash(key));
    existed = LocalSRemove(key);
  });
  return existed;
}

}  // namespace flatkv::server
