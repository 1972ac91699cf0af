// Implementation notes
//
// MemberHandler, a ring member's Handler: routing the client methods
// (Routed, the Ring* batch and scan methods), ring(), and the chain's part
// of local reads and writes (the read gate, writes through the chain, read
// repair); its peer* methods are in member_handler_peer.cc. Each forwarded
// call goes to one member on a pooled connection (Cluster::Forward).
// Batches are split by owner; the calls to the other partitions are all
// sent before any answer is read, and the local part is served meanwhile,
// so a batch over P partitions costs about one round trip, not P. A
// NOT_OWNER answer means the two instances' rings differ: the ring is
// re-read from ZooKeeper and the call routed once more (UNAVAILABLE, not
// applied, if ZooKeeper does not answer).
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "engine/string_keys.h"
#include "server/event_server.h"
#include "server/member/cluster.h"
#include "server/member/member_handler.h"
#include "server/member/migration.h"
#include "server/member/peer_codec.h"
#include "server/member/replicator.h"
#include "server/methods.h"

namespace flatkv::server {
namespace {

using partition::OwnerGroup;
using partition::Router;
using partition::ScanStep;

// A scan call visits at most this many partitions before it returns
// done = false with nextKey (a ring of many empty marks must not make one
// call last long).
constexpr int kMaxScanSteps = 16;

// A part of a batch that goes to one partition.
struct Part {
  size_t group = 0;  // index in the batch's OwnerGroups
  Cluster::Target target;
  std::vector<size_t> positions;
  std::unique_ptr<client::Client> connection;
  Status status;
};

// The ring a call is routed by. None known yet, or one with no mark at all
// (read before any instance registered, this one included): UNAVAILABLE,
// since there is no owner to serve or forward to.
std::shared_ptr<const partition::Ring> RoutingRing(const Cluster& cluster) {
  auto ring = cluster.ring();
  if (!ring) ThrowKvError(Status::Unavailable("no ring known yet: ZooKeeper not reached"));
  if (ring->empty()) {
    ThrowKvError(Status::Unavailable("the ring this instance has read holds no mark yet (ring "
                                     "version " + std::to_string(ring->version()) + ")"));
  }
  return ring;
}

}  // namespace

std::string MemberHandler::NotReady() const {
  const auto ring = cluster_->ring();
  if (ring == nullptr) {
    return "no ring known yet: ZooKeeper (" + config_.cluster.zookeeper + ") not reached";
  }
  if (ring->empty()) return "the ring this instance has read holds no mark yet";
  if (replicator_ != nullptr) {
    if (const std::string full = replicator_->DiskFull(); !full.empty()) {
      return "disk full: out of mark " + std::to_string(config_.cluster.mark) + "'s chain (" +
             full + "); it rejoins by itself once the disk has room";
    }
    if (!replicator_->lease_held()) {
      return "no ZooKeeper lease: ZooKeeper (" + config_.cluster.zookeeper +
             ") has not answered for half a session timeout; every call is refused until it does";
    }
  }
  return cluster_->register_blocked();
}

bool MemberHandler::MayBlock(const uint8_t* message, uint32_t len) const {
  CallPeek call;
  // Malformed or old-style: answered at once, inline; so is a call of no
  // such method.
  if (!PeekCall(message, len, &call) || call.traits == nullptr) return false;
  switch (call.traits->dispatch) {
    case Dispatch::kInline:
      return false;
    case Dispatch::kFanOut:
    case Dispatch::kWholeStore:
      return true;
    case Dispatch::kChainWait:  // waits for the chain (server/member/replicator.h)
      return replicator_ != nullptr;
    case Dispatch::kChainFrame:
      // Answered at once on the I/O thread (Replicator::OnFrame) unless
      // the loop is behind: then on a worker, which waits for it.
      return replicator_ != nullptr && replicator_->FramesBacklogged();
    case Dispatch::kRouted:
      break;
  }
  int64_t hash = 0;
  switch (call.key) {
    case CallPeek::Key::kNone:
      return true;
    case CallPeek::Key::kMalformed:
      return false;  // a malformed call: inline
    case CallPeek::Key::kInt:
      hash = call.int_key;
      break;
    case CallPeek::Key::kString:
      hash = StringHash(std::string(call.string_key));
      break;
  }
  Cluster::Target target;
  // No ring or no member: answered UNAVAILABLE at once, inline.
  if (!cluster_->Route(hash, call.traits->write, &target).ok()) return false;
  return !target.local || (call.traits->write && replicator_ != nullptr);
}

int64_t MemberHandler::StringHash(const std::string& key) const {
  const auto ring = cluster_->ring();
  return partition::Ring::HashString(key, ring ? ring->settings().hash_bound
                                               : config_.cluster.hash_bound);
}

void MemberHandler::Routed(int64_t hash, bool write, const char* peer_method, bool idempotent,
                           const std::function<void()>& local, const RemoteCall& remote) {
  int attempt = 0;
  if (retry_.refresh) {  // RunAsRetry(): the first attempt was the Forwarder's
    retry_.refresh = false;
    ThrowIfError(cluster_->RefreshForRetry(peer_method));
    attempt = 1;
  }
  for (;; ++attempt) {
    Cluster::Target target;
    Status st = cluster_->Route(hash, write, &target);
    if (!st.ok()) ThrowKvError(st);
    if (target.local) return local();
    st = cluster_->Forward(target, peer_method, idempotent,
                           [&](rpc::FlatKVClient& c) { remote(c, target.context); });
    if (st.IsNotOwner() && attempt == 0) {
      ThrowIfError(cluster_->RefreshForRetry(peer_method));
      continue;
    }
    if (!st.ok()) ThrowKvError(st);
    return;
  }
}

// Runs a batch split by owner: "send" starts a part's call on its
// connection, "receive" reads its answer, "local" serves this instance's
// part. A part answered NOT_OWNER is routed again once, on its own.
template <typename Send, typename Receive, typename Local, typename Single>
static void RunParts(Cluster* cluster, const partition::Ring& ring,
                     const std::vector<OwnerGroup>& groups, bool write, Send&& send,
                     Receive&& receive, Local&& local, Single&& single) {
  std::vector<Part> parts(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    parts[i].group = i;
    parts[i].positions = groups[i].positions;
    Status st = cluster->RouteTo(ring, groups[i].partition, write, &parts[i].target);
    if (!st.ok()) ThrowKvError(st);  // a mark with no serving member: nothing sent yet
  }
  for (Part& p : parts) {
    if (p.target.local) continue;
    p.connection = cluster->Borrow(p.target.address);
    p.status = p.connection->Call("send", false, [&](rpc::FlatKVClient& c) { send(c, p); });
  }
  for (Part& p : parts) {
    if (p.target.local) local(p);
  }
  Status first;  // the first failure, after every part was read
  for (Part& p : parts) {
    if (p.target.local) continue;
    if (p.status.ok()) {
      p.status = p.connection->Call("receive", false, [&](rpc::FlatKVClient& c) { receive(c, p); });
    }
    if (!p.status.ok() && !write && p.connection->network_failed()) {
      // Maybe a pooled connection the peer closed (it restarted): a read
      // once more on a fresh one. (A write is not sent twice: a part that
      // did arrive could overwrite a newer write made meanwhile.)
      p.status = p.connection->Call("retry", false, [&](rpc::FlatKVClient& c) {
        send(c, p);
        receive(c, p);
      });
    }
    if (!p.status.ok()) p.status = cluster->PeerFailure(p.target, *p.connection, p.status);
    cluster->Return(std::move(p.connection));
    if (p.status.IsNotOwner()) {
      p.status = cluster->RefreshForRetry(write ? "peerMultiPut" : "peerMultiGet");
      if (p.status.ok()) single(p);  // routed afresh, one call per key
    }
    if (!p.status.ok() && first.ok()) first = p.status;
  }
  if (!first.ok()) ThrowKvError(first);
}

void MemberHandler::RingMultiGet(std::vector<rpc::GetResult>& result,
                           const std::vector<int64_t>& keys) {
  const auto ring = RoutingRing(*cluster_);
  result.assign(keys.size(), rpc::GetResult());
  const auto groups = Router::SplitByOwner(*ring, keys);
  std::vector<std::vector<int64_t>> part_keys;
  for (const OwnerGroup& g : groups) {
    part_keys.emplace_back();
    for (size_t pos : g.positions) part_keys.back().push_back(keys[pos]);
  }
  const auto place = [&](const Part& p, std::vector<rpc::GetResult>& got) {
    for (size_t i = 0; i < p.positions.size() && i < got.size(); ++i) {
      result[p.positions[i]] = std::move(got[i]);
    }
  };
  RunParts(
      cluster_, *ring, groups, false,
      [&](rpc::FlatKVClient& c, Part& p) { c.send_peerMultiGet(p.target.context, part_keys[p.group]); },
      [&](rpc::FlatKVClient& c, Part& p) {
        std::vector<rpc::GetResult> got;
        c.recv_peerMultiGet(got);
        place(p, got);
      },
      [&](Part& p) {
        std::vector<rpc::GetResult> got;
        LocalMultiGet(got, part_keys[p.group]);
        place(p, got);
      },
      [&](Part& p) {
        for (size_t pos : p.positions) get(result[pos], keys[pos]);
      });
}

void MemberHandler::RingMultiPut(const std::vector<rpc::KvPair>& pairs) {
  const auto ring = RoutingRing(*cluster_);
  std::vector<int64_t> hashes(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) hashes[i] = pairs[i].key;
  const auto groups = Router::SplitByOwner(*ring, hashes);
  std::vector<std::vector<rpc::KvPair>> part_pairs;
  for (const OwnerGroup& g : groups) {
    part_pairs.emplace_back();
    for (size_t pos : g.positions) part_pairs.back().push_back(pairs[pos]);
  }
  RunParts(
      cluster_, *ring, groups, true,
      [&](rpc::FlatKVClient& c, Part& p) { c.send_peerMultiPut(p.target.context, part_pairs[p.group]); },
      [&](rpc::FlatKVClient& c, Part&) { c.recv_peerMultiPut(); },
      [&](Part& p) { LocalMultiPut(part_pairs[p.group]); },
      [&](Part& p) {
        for (size_t pos : p.positions) put(pairs[pos].key, pairs[pos].value);
      });
}

void MemberHandler::RingScan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse) {
  if (limit <= 0) throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "scan limit must be positive");
  result.pairs.clear();
  result.done = false;
  int64_t cursor = from;
  for (int steps = 0; steps < kMaxScanSteps; ++steps) {
    const auto ring = RoutingRing(*cluster_);
    const ScanStep step = Router::Step(*ring, cursor, reverse);
    const int32_t want = limit - static_cast<int32_t>(result.pairs.size());
    rpc::ScanResult part;
    Cluster::Target target;
    Status st = cluster_->RouteTo(*ring, step.partition, false, &target);
    if (!st.ok()) ThrowKvError(st);
    if (target.local) {
      LocalScan(part, step.from, want, reverse, step.lo, step.hi);
    } else {
      st = cluster_->Forward(target, "peerScan", true, [&](rpc::FlatKVClient& c) {
        c.peerScan(part, target.context, step.from, want, reverse, step.lo, step.hi);
      });
      if (st.IsNotOwner()) {  // rings differ: re-read and redo this step
        ThrowIfError(cluster_->RefreshForRetry("peerScan"));
        continue;
      }
      if (!st.ok()) ThrowKvError(st);
    }
    for (rpc::KvPair& p : part.pairs) result.pairs.push_back(std::move(p));
    if (!part.done) {  // the partition stopped early: resume there
      result.nextKey = part.nextKey;
      return;
    }
    if (!Router::After(step, reverse, &cursor)) {
      result.done = true;
      return;
    }
    if (static_cast<int32_t>(result.pairs.size()) >= limit) break;
  }
  result.nextKey = cursor;
}

void MemberHandler::RingScanLog(rpc::LogScanResult& result, const std::string& cursor,
                          int32_t limit) {
  if (limit <= 0) throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "scan limit must be positive");
  const auto ring = RoutingRing(*cluster_);
  int64_t mark = INT64_MIN;
  std::string inner;
  if (!cursor.empty()) {
    Status st = Router::DecodeLogCursor(cursor, &mark, &inner);
    if (!st.ok()) ThrowKvError(st);
  }
  size_t partition = 0;
  if (!Router::LogPartition(*ring, mark, &partition)) {
    result.pairs.clear();
    result.done = true;
    result.cursor.clear();
    return;
  }
  const int64_t at = ring->partitions()[partition].mark;
  if (at != mark) inner.clear();  // that mark left the ring: start the next afresh
  Cluster::Target target;
  Status st = cluster_->RouteTo(*ring, partition, false, &target);
  if (!st.ok()) ThrowKvError(st);
  rpc::LogScanResult part;
  if (target.local) {
    LocalScanLog(part, inner, limit);
  } else {
    st = cluster_->Forward(target, "peerScanLog", true, [&](rpc::FlatKVClient& c) {
      c.peerScanLog(part, target.context, inner, limit);
    });
    if (!st.ok()) ThrowKvError(st);
  }
  result.pairs = std::move(part.pairs);
  result.done = false;
  if (!part.done) {
    result.cursor = Router::EncodeLogCursor(at, part.cursor);
  } else if (partition + 1 < ring->partitions().size()) {
    result.cursor = Router::EncodeLogCursor(ring->partitions()[partition + 1].mark, "");
  } else {
    result.done = true;
    result.cursor.clear();
  }
}

void MemberHandler::CheckPeer(const rpc::PeerContext& ctx, int64_t lo, int64_t hi) {
  Status st = cluster_->CheckPeerRange(ctx, lo, hi);
  if (!st.ok()) ThrowKvError(st);
}

Status MemberHandler::StartChainWrite(Method method, int64_t key, const std::string& string_key,
                                std::string value, Replicator::WriteDone done) {
  const bool string_keyed = method == kSPut || method == kSRemove;
  const bool has_value = method == kPut || method == kAppend || method == kSPut;
  if (has_value) FLATKV_RETURN_IF_ERROR(ValueSize(value.size()));
  FLATKV_RETURN_IF_ERROR(string_keyed ? store_->CheckStringKey(string_key)
                                      : store_->CheckKey(key));
  FLATKV_RETURN_IF_ERROR(cluster_->CheckWritable(string_keyed ? StringHash(string_key) : key));
  if (method == kAppend) {
    replicator_->AppendAsync(key, std::move(value), max_value_bytes_, std::move(done));
    return Status::OK();
  }
  rpc::ChainOp op;
  switch (method) {
    case kPut: op.kind = rpc::ChainOpKind::PUT; break;
    case kRemove: op.kind = rpc::ChainOpKind::REMOVE; break;
    case kSPut: op.kind = rpc::ChainOpKind::SPUT; break;
    case kSRemove: op.kind = rpc::ChainOpKind::SREMOVE; break;
    default: return Status::InvalidArgument("not a single-key write");
  }
  if (string_keyed) {
    op.__set_skey(string_key);
  } else {
    op.__set_key(key);
  }
  if (has_value) op.__set_value(std::move(value));
  const uint64_t hash = static_cast<uint64_t>(string_keyed ? StringHash(string_key) : key);
  replicator_->WriteAsync({std::move(op)}, {hash}, std::move(done), /*import=*/false,
                          /*run_here=*/true);
  return Status::OK();
}

bool MemberHandler::ChainWrite(Method method, int64_t key, const std::string& string_key,
                               const std::string& value, bool* existed) {
  if (replicator_ == nullptr) return false;
  ThrowIfError(replicator_->Wait(
      [&](Replicator::WriteDone done) {
        Status st = StartChainWrite(method, key, string_key, value, done);
        if (!st.ok()) done(st, false);
      },
      existed));
  return true;
}

// One replicated write: atomic on every member of this partition.
bool MemberHandler::ChainWriteBatch(const std::vector<rpc::KvPair>& pairs) {
  if (replicator_ == nullptr) return false;
  std::vector<rpc::ChainOp> ops(pairs.size());
  std::vector<uint64_t> keys(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    ThrowIfError(store_->CheckKey(pairs[i].key));
    ops[i].kind = rpc::ChainOpKind::PUT;
    ops[i].__set_key(pairs[i].key);
    ops[i].__set_value(pairs[i].value);
    keys[i] = static_cast<uint64_t>(pairs[i].key);
  }
  if (!ops.empty()) {
    ThrowIfError(replicator_->Write(std::move(ops), std::move(keys), nullptr, /*import=*/false,
                                    /*run_here=*/true));
  }
  return true;
}

bool MemberHandler::ReadCommitted(const int64_t* hashes, size_t n) {
  if (replicator_ == nullptr) return true;
  for (size_t i = 0; i < n; ++i) {
    if (!replicator_->ConfirmRead(static_cast<uint64_t>(hashes[i]))) return false;
  }
  // A ring change may have moved a key while it was read (the source lets
  // a range go only after its members' views refuse it).
  for (size_t i = 0; i < n; ++i) ThrowIfError(cluster_->CheckStillServed(hashes[i]));
  return true;
}

Status MemberHandler::CheckMoving(int64_t key, bool write) const {
  return write ? cluster_->CheckWritable(key) : cluster_->CheckReadable(key);
}

bool MemberHandler::HasOtherCopies() const {
  return replicator_ != nullptr && cluster_->OwnChain().size() >= 2;
}

std::string MemberHandler::Role() const { return cluster_->role(); }

void MemberHandler::AddMemberStats(std::map<std::string, int64_t>* out) const {
  cluster_->AddStats(out);
}

RingView* MemberHandler::ring_view() const { return cluster_; }

// The client calls a ring serves otherwise than one store: batches split
// by owner, scans across partitions.
void MemberHandler::multiGet(std::vector<rpc::GetResult>& result,
                             const std::vector<int64_t>& keys) {
  Run(kMultiGet, [&] { RingMultiGet(result, keys); });
}

void MemberHandler::multiPut(const std::vector<rpc::KvPair>& pairs) {
  Run(kMultiPut, [&] {
    for (const rpc::KvPair& p : pairs) CheckValue(p.value.size());
    RingMultiPut(pairs);
  });
}

void MemberHandler::scan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse) {
  Run(kScan, [&] { RingScan(result, from, limit, reverse); });
}

void MemberHandler::scanLog(rpc::LogScanResult& result, const std::string& cursor,
                            int32_t limit) {
  Run(kScanLog, [&] { RingScanLog(result, cursor, limit); });
}

void MemberHandler::CheckRead(int64_t hash) {
  if (replicator_ == nullptr) return;
  // A read held back waits for an event that an I/O thread reads (maybe
  // this one): there it runs again on a worker.
  bool held = false;
  Status st = replicator_->BeforeRead(static_cast<uint64_t>(hash),
                                      EventServer::InlineOnIoThread() ? &held : nullptr);
  if (held) {
    if (EventServer::RedoOnWorker()) {
      redo_ = true;
      ThrowKvError(st);
    }
    st = replicator_->BeforeRead(static_cast<uint64_t>(hash));  // no workers: wait here
  }
  ThrowIfError(st);
}

// The digest, with the chain position it was taken at.
void MemberHandler::digest(rpc::Digest& result, const std::string& token) {
  Handler::digest(result, token);
  if (replicator_ != nullptr) {
    const partition::ChainPosition p = replicator_->applied();
    result.appliedEpoch = p.epoch;
    result.appliedSeq = static_cast<int64_t>(p.seq);
  }
}

void MemberHandler::ring(rpc::RingInfo& result) {
  Run(kRing, [&] { cluster_->Describe(&result); });
}

void MemberHandler::removeMark(const std::string& token, int64_t mark) {
  Run(kRemoveMark, [&] {
    CheckAdmin(token);
    ThrowIfError(cluster_->StartRemoveMark(mark));
  });
}

void MemberHandler::abortChange(const std::string& token) {
  Run(kAbortChange, [&] {
    CheckAdmin(token);
    ThrowIfError(cluster_->AbortChange());
  });
}

Status MemberHandler::RepairRead(int64_t key, const Status& bad, rpc::GetResult* result) {
  if (replicator_ == nullptr) return bad;
  std::vector<Cluster::Target> chain = cluster_->OwnChain();
  if (chain.size() < 2) return bad;  // no other copy
  if (EventServer::RedoOnWorker()) {
    redo_ = true;  // this may block: again, on a worker
    return bad;
  }
  spdlog::warn("key {}: {}; repairing it from the chain", key, bad.message());
  Status st;
  if (replicator_->head() == cluster_->advertise()) {
    st = replicator_->Repair(
        key, [&](rpc::GetResult* copy) { return FetchCopy(key, copy); }, result);
  } else {
    const Cluster::Target& head = chain.front();
    st = cluster_->Forward(head, "peerRepair", true, [&](rpc::FlatKVClient& c) {
      c.peerRepair(*result, head.context, key);
    });
  }
  if (!st.ok()) {
    spdlog::error("key {}: repair failed: {}", key, st.ToString());
    return Status::Corruption(bad.message() + "; repair from the chain failed: " + st.message());
  }
  return Status::OK();
}

Status MemberHandler::RepairStringRead(const std::string& key, const Status& bad,
                                 rpc::GetResult* result) {
  if (replicator_ == nullptr) return bad;
  if (cluster_->OwnChain().size() < 2) return bad;  // no other copy
  if (EventServer::RedoOnWorker()) {
    redo_ = true;  // this may block: again, on a worker
    return bad;
  }
  const int64_t slot = store_->StringSlot(key);
  spdlog::warn("string key of {} bytes (bucket {}): {}; repairing the bucket from the chain",
               key.size(), slot, bad.message());
  std::string bucket;
  Status st = RepairBucket(slot, &bucket);
  if (!st.ok()) {
    spdlog::error("string-key bucket {}: repair failed: {}", slot, st.ToString());
    return Status::Corruption(bad.message() + "; repair from the chain failed: " + st.message());
  }
  result->found = engine::FindInBucket(bucket, key, &result->value) == engine::BucketLookup::kFound;
  return result->found ? Status::OK() : Status::NotFound("string key");
}

Status MemberHandler::RepairBucket(int64_t slot, std::string* bucket) {
  const auto slots = static_cast<int64_t>(store_->options().string_slots);
  if (replicator_->head() == cluster_->advertise()) {
    return replicator_->RepairBucket(
        slots, slot, [&](std::string* copy) { return FetchBucket(slots, slot, copy); }, bucket);
  }
  std::vector<Cluster::Target> chain = cluster_->OwnChain();
  if (chain.empty()) return Status::Unavailable("no chain for mark " + std::to_string(cluster_->mark()));
  const Cluster::Target& head = chain.front();
  return cluster_->Forward(head, "peerBucket", true, [&](rpc::FlatKVClient& c) {
    c.peerBucket(*bucket, head.context, slots, slot, true);
  });
}

Status MemberHandler::FetchBucket(int64_t slots, int64_t slot, std::string* bucket) {
  std::string why;
  for (Cluster::Target& t : cluster_->OwnChain()) {
    if (t.local) continue;
    Status st = cluster_->Forward(t, "peerBucket", true, [&](rpc::FlatKVClient& c) {
      c.peerBucket(*bucket, t.context, slots, slot, false);
    });
    if (st.ok()) return st;
    why += "; " + st.ToString();
  }
  return Status::Corruption("no other member of mark " + std::to_string(cluster_->mark()) +
                            " has a good copy of string-key bucket " + std::to_string(slot) + why);
}

Status MemberHandler::FetchCopy(int64_t key, rpc::GetResult* result) {
  std::string why;
  for (Cluster::Target& t : cluster_->OwnChain()) {
    if (t.local) continue;
    t.context.__set_ownCopy(true);
    Status st = cluster_->Forward(t, "peerGet", true, [&](rpc::FlatKVClient& c) {
      c.peerGet(*result, t.context, key);
    });
    if (st.ok()) return st;
    why += "; " + st.ToString();
  }
  return Status::Corruption("no other member of mark " + std::to_string(cluster_->mark()) +
                            " has a good copy of key " + std::to_string(key) + why);
}

}  // namespace flatkv::server
