// A ring change's side of the replicator: adopting an import's epoch, and
// tracking the writes to a moving range (StartTracking, Track, Tracked) so
// the importer can copy what changed while it copied.
#include <random>

#include <spdlog/spdlog.h>

#include "engine/string_keys.h"
#include "server/member/replicator.h"
#include "server/member/replicator_internal.h"

namespace flatkv::server {
namespace {

using partition::ChainOutput;
using partition::ChainRole;
using partition::RoleName;

}  // namespace

Status Replicator::AdoptImport(int64_t epoch) {
  Waiter w;
  Event ev;
  ev.done = &w;
  ev.serial = true;
  ev.run = [](int64_t, ChainOutput*) {};
  ev.after = [this, epoch, &w](int64_t, ChainOutput*) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!member_->Rebase({epoch, 0})) {
        w.status = Status::InvalidArgument("cannot adopt an import: member " + options_.self +
                                           " is " + member_->role() + " and applied seq " +
                                           std::to_string(member_->applied().seq));
        return;
      }
    }
    intact_ = true;
    Checkpoint();
    if (!logged_intact_) w.status = Status::IOError("the chain log was not rewritten");
  };
  Post(std::move(ev));
  std::unique_lock<std::mutex> lk(mu_);
  w.cv.wait(lk, [&] { return w.done; });
  return w.status;
}

int64_t Replicator::DrawNonce() {
  std::random_device rd;
  return static_cast<int64_t>((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

Status Replicator::StartTracking(const partition::RingChange& change, int64_t hash_bound,
                                 rpc::TrackToken* token) {
  token->head = options_.self;
  token->nonce = nonce_;
  token->czxid = change.czxid;
  return Wait(
      [&](WriteDone done) {
        Sequence(
            false, "track",
            [this, change, hash_bound](uint64_t request, int64_t now, ChainOutput* out) {
              const ChainRole role = member_->chain_role();
              if (role != ChainRole::kHead && role != ChainRole::kSingle) {
                out->replies.push_back({request, Status::NotOwner(
                                                     "peerTrack: member " + options_.self +
                                                     " is " + RoleName(role) + ", not the head")});
                return;
              }
              tracker_ = Tracker();
              tracker_.on = true;
              tracker_.czxid = change.czxid;
              tracker_.epoch = member_->head_epoch();
              tracker_.change = change;
              tracker_.hash_bound = hash_bound;
              // The barrier: an empty write, committed after everything before it.
              member_->OnWrite(request, {}, EncodeChainOps({}), now, out);
            },
            std::move(done));
      },
      nullptr);
}

void Replicator::Track(const std::vector<uint64_t>& hashes, const std::string& op) {
  Tracker& t = tracker_;
  if (!t.on || !t.overflow.empty()) return;
  if (std::none_of(hashes.begin(), hashes.end(),
                   [&](uint64_t h) { return t.change.Covers(static_cast<int64_t>(h)); })) {
    return;
  }
  tracked_writes_.fetch_add(1, std::memory_order_relaxed);
  // Decoded only for a write into the ranges while tracking (string keys
  // are known by their hash alone in "hashes").
  std::vector<rpc::ChainOp> ops;
  if (Status st = DecodeChainOps(op, &ops); !st.ok()) {
    t.overflow = "a write could not be read back: " + st.ToString();
  }
  auto track_skey = [&t](const std::string& skey) {
    if (!t.change.Covers(partition::Ring::HashString(skey, t.hash_bound))) return;
    if (t.skeys.insert(skey).second) t.skey_bytes += skey.size();
  };
  for (const rpc::ChainOp& o : ops) {
    if (o.kind == rpc::ChainOpKind::SPUT || o.kind == rpc::ChainOpKind::SREMOVE) {
      track_skey(o.skey);
    } else if (o.kind == rpc::ChainOpKind::SBUCKET) {  // a repair: key is a slot
      for (const engine::StringKeyValue& kv : DecodeBucket(o.value)) track_skey(kv.key);
    } else if (t.change.Covers(o.key)) {
      t.keys.insert(o.key);
    }
  }
  constexpr uint64_t kMaxSkeyBytes = 64 << 20;
  if (t.keys.size() + t.skeys.size() > options_.track_max_keys || t.skey_bytes > kMaxSkeyBytes) {
    t.overflow = "the record overflowed at " + std::to_string(t.keys.size() + t.skeys.size()) +
                 " keys (cluster.track_max_keys " + std::to_string(options_.track_max_keys) + ")";
  }
  if (!t.overflow.empty()) {
    track_overflows_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("ring change {}: {}; the import copies everything again, fenced", t.czxid,
                 t.overflow);
    t.keys.clear();
    t.skeys.clear();
    t.skey_bytes = 0;
  }
}

void Replicator::Tracked(const rpc::TrackToken& token, const std::string& cursor, size_t limit,
                         std::vector<int64_t>* keys, std::vector<std::string>* skeys, bool* done,
                         std::string* next, int64_t* recorded, std::string* reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Tracker& t = tracker_;
  const ChainRole role = member_->chain_role();
  if (token.head != options_.self || token.nonce != nonce_) {
    *reason = "no record here for " + token.head + " (another member or process recorded it)";
  } else if (!t.on || t.czxid != token.czxid) {
    *reason = "no record here for ring change " + std::to_string(token.czxid);
  } else if ((role != ChainRole::kHead && role != ChainRole::kSingle) ||
             member_->head_epoch() != t.epoch) {
    *reason = "member " + options_.self + " stopped heading the chain since the record began";
  } else if (!t.overflow.empty()) {
    *reason = t.overflow;
  }
  if (!reason->empty()) return;
  *recorded = static_cast<int64_t>(t.keys.size() + t.skeys.size());
  // Cursor: empty, 'i' + the last integer key (8 bytes), or 's' + the last string key.
  auto ki = t.keys.begin();
  auto si = t.skeys.begin();
  if (!cursor.empty() && cursor[0] == 'i' && cursor.size() == 1 + sizeof(int64_t)) {
    int64_t last = 0;
    std::memcpy(&last, cursor.data() + 1, sizeof(last));
    ki = t.keys.upper_bound(last);
  } else if (!cursor.empty() && cursor[0] == 's') {
    ki = t.keys.end();
    si = t.skeys.upper_bound(cursor.substr(1));
  }
  for (; ki != t.keys.end() && keys->size() < limit; ++ki) keys->push_back(*ki);
  if (ki != t.keys.end()) {
    *done = false;
    *next = TrackedCursorAfter(keys->back());
    return;
  }
  for (; si != t.skeys.end() && keys->size() + skeys->size() < limit; ++si) skeys->push_back(*si);
  *done = si == t.skeys.end();
  if (*done) return;
  // (No string key fits: the page filled with the last integer keys.)
  *next = skeys->empty() ? TrackedCursorAfter(keys->back()) : TrackedCursorAfter(skeys->back());
}

void Replicator::StopTracking() {
  std::lock_guard<std::mutex> lock(mu_);
  tracker_ = Tracker();
}

std::string Replicator::TrackedCursorAfter(int64_t key) {
  std::string c(1 + sizeof(key), 'i');
  std::memcpy(c.data() + 1, &key, sizeof(key));
  return c;
}

std::string Replicator::TrackedCursorAfter(const std::string& skey) { return "s" + skey; }

}  // namespace flatkv::server
