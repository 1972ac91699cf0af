// Implementation notes
//
// The Handler's ring half: routing the client methods (Routed, the Ring*
// batch and scan methods), the peer* methods other instances forward, and
// ring(). Each forwarded call goes to one member on a pooled connection
// (Cluster::Forward). Batches are split by owner; the calls to the other
// partitions are all sent before any answer is read, and the local part is
// served meanwhile, so a batch over P partitions costs about one round trip,
// not P. A NOT_OWNER answer means the two instances' rings differ: the
// ring is re-read from ZooKeeper and the call routed once more.
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "engine/string_keys.h"
#include "server/event_server.h"
#include "server/handler.h"
#include "server/member/cluster.h"
#include "server/member/migration.h"
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

}  // namespace

std::string Handler::NotReady() const {
  if (cluster_ == nullptr) return "";
  if (cluster_->ring() == nullptr) {
    return "no ring known yet: ZooKeeper (" + config_.cluster.zookeeper + ") not reached";
  }
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

namespace {

// A cursor over a binary-protocol message (big-endian), enough to read the
// call's name and its first argument. Every read checks the bounds.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool Take(size_t n, const uint8_t** out) {
    if (static_cast<size_t>(end - p) < n) return false;
    *out = p;
    p += n;
    return true;
  }
  bool I32(int32_t* v) {
    const uint8_t* b;
    if (!Take(4, &b)) return false;
    *v = static_cast<int32_t>(uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 |
                              uint32_t{b[3]});
    return true;
  }
  bool I64(int64_t* v) {
    int32_t hi, lo;
    if (!I32(&hi) || !I32(&lo)) return false;
    *v = static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32 |
                              static_cast<uint32_t>(lo));
    return true;
  }
  bool Bytes(std::string_view* v) {
    int32_t n;
    const uint8_t* b;
    if (!I32(&n) || n < 0 || !Take(static_cast<size_t>(n), &b)) return false;
    *v = std::string_view(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
    return true;
  }
};

constexpr uint8_t kTypeI64 = 10;
constexpr uint8_t kTypeString = 11;

}  // namespace

bool Handler::MayBlock(const uint8_t* message, uint32_t len) const {
  if (cluster_ == nullptr) return false;
  Reader r{message, message + len};
  int32_t version, seqid;
  std::string_view name;
  if (!r.I32(&version) || (static_cast<uint32_t>(version) & 0xffff0000u) != 0x80010000u ||
      !r.Bytes(&name) || !r.I32(&seqid)) {
    return false;  // malformed or old-style: answered at once, inline
  }
  const MethodTraits* traits = FindMethod(name);
  if (traits == nullptr) return false;  // answered at once: no such method
  switch (traits->dispatch) {
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
  const bool int_key = traits->key == KeyKind::kInt;
  const uint8_t* type;
  const uint8_t* id;
  if (!r.Take(1, &type) || !r.Take(2, &id) || (id[0] << 8 | id[1]) != 1) return true;
  int64_t hash = 0;
  if (int_key) {
    if (*type != kTypeI64 || !r.I64(&hash)) return false;  // a malformed call: inline
  } else {
    std::string_view key;
    if (*type != kTypeString || !r.Bytes(&key)) return false;
    hash = StringHash(std::string(key));
  }
  Cluster::Target target;
  // No ring or no member: answered UNAVAILABLE at once, inline.
  if (!cluster_->Route(hash, traits->write, &target).ok()) return false;
  return !target.local || (traits->write && replicator_ != nullptr);
}

thread_local Handler::Retry Handler::retry_;

void Handler::RunAsRetry(std::chrono::steady_clock::time_point start,
                         const std::function<void()>& run) {
  retry_.active = true;
  retry_.refresh = true;
  retry_.start = start;
  run();
  retry_ = Retry();  // whatever the call did not consume
}

void Handler::Finish(Method method, std::chrono::steady_clock::time_point start, bool error) {
  latency_[method].Record(std::chrono::steady_clock::now() - start);
  if (error) errors_[method].fetch_add(1, std::memory_order_relaxed);
}

int64_t Handler::StringHash(const std::string& key) const {
  if (cluster_ == nullptr) return 0;
  const auto ring = cluster_->ring();
  return partition::Ring::HashString(key, ring ? ring->settings().hash_bound
                                               : config_.cluster.hash_bound);
}

void Handler::Routed(
    int64_t hash, bool write, const char* peer_method, bool idempotent,
    const std::function<void()>& local,
    const std::function<void(rpc::FlatKVClient&, const rpc::PeerContext&)>& remote) {
  if (cluster_ == nullptr) return local();
  int attempt = 0;
  if (retry_.refresh) {  // RunAsRetry(): the first attempt was the Forwarder's
    retry_.refresh = false;
    cluster_->Refresh();
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
      cluster_->Refresh();
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
      cluster->Refresh();
      single(p);  // routed afresh, one call per key
      p.status = Status::OK();
    }
    if (!p.status.ok() && first.ok()) first = p.status;
  }
  if (!first.ok()) ThrowKvError(first);
}

void Handler::RingMultiGet(std::vector<rpc::GetResult>& result,
                           const std::vector<int64_t>& keys) {
  const auto ring = cluster_->ring();
  if (!ring) ThrowKvError(Status::Unavailable("no ring known yet: ZooKeeper not reached"));
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

void Handler::RingMultiPut(const std::vector<rpc::KvPair>& pairs) {
  const auto ring = cluster_->ring();
  if (!ring) ThrowKvError(Status::Unavailable("no ring known yet: ZooKeeper not reached"));
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

void Handler::RingScan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse) {
  if (limit <= 0) throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "scan limit must be positive");
  result.pairs.clear();
  result.done = false;
  int64_t cursor = from;
  for (int steps = 0; steps < kMaxScanSteps; ++steps) {
    const auto ring = cluster_->ring();
    if (!ring) ThrowKvError(Status::Unavailable("no ring known yet: ZooKeeper not reached"));
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
        cluster_->Refresh();
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

void Handler::RingScanLog(rpc::LogScanResult& result, const std::string& cursor,
                          int32_t limit) {
  if (limit <= 0) throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "scan limit must be positive");
  const auto ring = cluster_->ring();
  if (!ring) ThrowKvError(Status::Unavailable("no ring known yet: ZooKeeper not reached"));
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

void Handler::CheckPeer(const rpc::PeerContext& ctx, int64_t lo, int64_t hi) {
  if (cluster_ == nullptr) {
    ThrowKvError(Status::NotOwner("this instance is standalone, not a member of a ring"));
  }
  Status st = cluster_->CheckPeerRange(ctx, lo, hi);
  if (!st.ok()) ThrowKvError(st);
}

Status Handler::StartChainWrite(Method method, int64_t key, const std::string& string_key,
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

void Handler::ReplicatedWrite(Method method, int64_t key, const std::string& string_key,
                              const std::string& value, bool* existed) {
  ThrowIfError(replicator_->Wait(
      [&](Replicator::WriteDone done) {
        Status st = StartChainWrite(method, key, string_key, value, done);
        if (!st.ok()) done(st, false);
      },
      existed));
}

void Handler::CheckRead(int64_t hash) {
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

void Handler::peerChain(const rpc::PeerContext& ctx, const std::string& from,
                        const rpc::ChainFrame& frame) {
  try {
    Run(kPeerChain, [&] {
      if (cluster_ == nullptr || replicator_ == nullptr) {
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

int64_t Handler::peerSnapshot(const rpc::PeerContext& ctx, const std::string& from,
                              const rpc::SnapshotPage& page) {
  int64_t token = 0;
  Run(kPeerSnapshot, [&] {
    if (cluster_ == nullptr || replicator_ == nullptr) {
      ThrowKvError(Status::NotOwner("this instance is not a member of a chain"));
    }
    ThrowIfError(cluster_->CheckPeerMark(ctx));
    for (const rpc::KvPair& p : page.pairs) ThrowIfError(store_->CheckKey(p.key));
    ThrowIfError(replicator_->OnSnapshotPage(from, page, &token));
  });
  return token;
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
      if (!repair || replicator_ == nullptr || cluster_ == nullptr ||
          cluster_->OwnChain().size() < 2) {
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
    if (replicator_ != nullptr) {
      const partition::ChainPosition p = replicator_->applied();
      result.appliedEpoch = p.epoch;
      result.appliedSeq = static_cast<int64_t>(p.seq);
    }
  });
}

void Handler::ring(rpc::RingInfo& result) {
  Run(kRing, [&] {
    if (cluster_ != nullptr) return cluster_->Describe(&result);
    result.version = 0;
    result.hashBound = config_.cluster.hash_bound;
    result.replication = config_.cluster.replication;
    rpc::Member self;
    self.host = config_.server.host;
    self.port = config_.server.port;
    rpc::Partition p;
    p.mark = 0;
    p.chain.push_back(self);
    result.partitions = {p};
  });
}

void Handler::peerGet(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) {
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

void Handler::peerExport(rpc::ExportPage& result, const rpc::PeerContext& ctx, int64_t lo,
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

void Handler::CheckHeadOf(const rpc::PeerContext& ctx, const char* what) {
  if (cluster_ == nullptr || replicator_ == nullptr) {
    ThrowKvError(Status::NotOwner("this instance is not a member of a chain"));
  }
  ThrowIfError(cluster_->CheckPeerMark(ctx));
  if (replicator_->head() != cluster_->advertise()) {
    ThrowKvError(Status::NotOwner(std::string(what) + ": member " + cluster_->advertise() +
                                  " is not the head of mark " +
                                  std::to_string(cluster_->mark()) + "'s chain"));
  }
}

void Handler::removeMark(const std::string& token, int64_t mark) {
  Run(kRemoveMark, [&] {
    CheckAdmin(token);
    if (cluster_ == nullptr) {
      ThrowKvError(Status::InvalidArgument("removeMark: this instance is not a ring member"));
    }
    ThrowIfError(cluster_->StartRemoveMark(mark));
  });
}

void Handler::abortChange(const std::string& token) {
  Run(kAbortChange, [&] {
    CheckAdmin(token);
    if (cluster_ == nullptr) {
      ThrowKvError(Status::InvalidArgument("abortChange: this instance is not a ring member"));
    }
    ThrowIfError(cluster_->AbortChange());
  });
}

void Handler::peerFence(const rpc::PeerContext& ctx) {
  Run(kPeerFence, [&] {
    CheckHeadOf(ctx, "peerFence");
    cluster_->Refresh();  // the change node, read before anything else is accepted
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

void Handler::peerTrack(rpc::TrackToken& result, const rpc::PeerContext& ctx, int64_t czxid) {
  Run(kPeerTrack, [&] {
    CheckHeadOf(ctx, "peerTrack");
    cluster_->Refresh();
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

void Handler::peerDelta(rpc::DeltaPage& result, const rpc::PeerContext& ctx,
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

int64_t Handler::peerDrop(const rpc::PeerContext& ctx, int64_t lo, int64_t hi, int32_t limit) {
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
      if (cluster_ == nullptr) ThrowKvError(Status::NotOwner("this instance is not a ring member"));
      ThrowIfError(cluster_->CheckPeerMark(ctx));
    }
    cluster_->Refresh();
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

thread_local bool Handler::redo_ = false;

Status Handler::RepairRead(int64_t key, const Status& bad, rpc::GetResult* result) {
  if (replicator_ == nullptr || cluster_ == nullptr) return bad;
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

Status Handler::RepairStringRead(const std::string& key, const Status& bad,
                                 rpc::GetResult* result) {
  if (replicator_ == nullptr || cluster_ == nullptr) return bad;
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

Status Handler::RepairBucket(int64_t slot, std::string* bucket) {
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

Status Handler::FetchBucket(int64_t slots, int64_t slot, std::string* bucket) {
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

void Handler::peerBucket(std::string& result, const rpc::PeerContext& ctx, int64_t slots,
                         int64_t slot, bool repair) {
  Run(kPeerBucket, [&] {
    if (cluster_ == nullptr || replicator_ == nullptr) {
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

Status Handler::FetchCopy(int64_t key, rpc::GetResult* result) {
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

void Handler::peerRepair(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) {
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

void Handler::peerPut(const rpc::PeerContext& ctx, int64_t key, const std::string& value) {
  Run(kPeerPut, [&] {
    CheckPeer(ctx, key, key);
    LocalPut(key, value);
  });
}

bool Handler::peerRemove(const rpc::PeerContext& ctx, int64_t key) {
  bool existed = false;
  Run(kPeerRemove, [&] {
    CheckPeer(ctx, key, key);
    existed = LocalRemove(key);
  });
  return existed;
}

void Handler::peerAppend(const rpc::PeerContext& ctx, int64_t key, const std::string& value) {
  Run(kPeerAppend, [&] {
    CheckPeer(ctx, key, key);
    LocalAppend(key, value);
  });
}

void Handler::peerMultiGet(std::vector<rpc::GetResult>& result, const rpc::PeerContext& ctx,
                           const std::vector<int64_t>& keys) {
  Run(kPeerMultiGet, [&] {
    for (int64_t k : keys) CheckPeer(ctx, k, k);
    LocalMultiGet(result, keys);
  });
}

void Handler::peerMultiPut(const rpc::PeerContext& ctx, const std::vector<rpc::KvPair>& pairs) {
  Run(kPeerMultiPut, [&] {
    for (const rpc::KvPair& p : pairs) CheckPeer(ctx, p.key, p.key);
    LocalMultiPut(pairs);
  });
}

void Handler::peerScan(rpc::ScanResult& result, const rpc::PeerContext& ctx, int64_t from,
                       int32_t limit, bool reverse, int64_t lo, int64_t hi) {
  Run(kPeerScan, [&] {
    if (lo > hi || from < lo || from > hi) {
      throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "peerScan: from must lie in [lo, hi]");
    }
    CheckPeer(ctx, lo, hi);
    LocalScan(result, from, limit, reverse, lo, hi);
  });
}

void Handler::peerScanLog(rpc::LogScanResult& result, const rpc::PeerContext& ctx,
                          const std::string& cursor, int32_t limit) {
  Run(kPeerScanLog, [&] {
    // Insertion order covers the whole partition: only the mark is checked.
    if (cluster_ == nullptr) CheckPeer(ctx, 0, 0);  // NOT_OWNER
    Status st = cluster_->CheckPeerMark(ctx);
    if (!st.ok()) ThrowKvError(st);
    LocalScanLog(result, cursor, limit);
  });
}

void Handler::peerSGet(rpc::GetResult& result, const rpc::PeerContext& ctx,
                       const std::string& key) {
  Run(kPeerSGet, [&] {
    CheckPeer(ctx, StringHash(key), StringHash(key));
    LocalSGet(result, key);
  });
}

void Handler::peerSPut(const rpc::PeerContext& ctx, const std::string& key,
                       const std::string& value) {
  Run(kPeerSPut, [&] {
    CheckPeer(ctx, StringHash(key), StringHash(key));
    LocalSPut(key, value);
  });
}

bool Handler::peerSRemove(const rpc::PeerContext& ctx, const std::string& key) {
  bool existed = false;
  Run(kPeerSRemove, [&] {
    CheckPeer(ctx, StringHash(key), StringHash(key));
    existed = LocalSRemove(key);
  });
  return existed;
}

}  // namespace flatkv::server
