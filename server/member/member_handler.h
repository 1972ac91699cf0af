// MemberHandler: the Handler (server/handler.h) of a ring member. The
// front's Handler serves every call from this instance's store; this
// subclass fills its hooks with the ring's rules and I/O:
//
// - every data method is served here only for the keys this instance's
//   mark owns and forwarded to the owner otherwise (Routed(); batches split
//   by owner and scans across partitions: the Ring* methods);
// - a local read passes the chain's read gate and is confirmed committed
//   (Replicator::BeforeRead, ConfirmRead), a local write goes through the
//   chain (Replicator::Write), a record failing its checksum is repaired
//   from another member of the chain;
// - the peer* methods, the calls other instances forward or the chain
//   sends, served only when this mark owns the key.
//
// Under the EventServer, single-key calls for other marks do not reach the
// handler at all: the I/O thread's Forwarder (forwarder.h) forwards them,
// counts them here (CountCall(), Finish()) and starts this mark's writes
// through the chain without a worker (StartChainWrite()).
//
// Thread safety: as the Handler's; the Cluster and the Replicator are
// thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "server/handler.h"
#include "server/member/cluster.h"
#include "server/member/replicator.h"

namespace flatkv::server {

class MemberHandler final : public Handler {
 public:
  // "cluster" and "replicator" (the cluster's, started) outlive the
  // handler's calls.
  MemberHandler(engine::Store* store, engine::cache::WriteBackCache* cache, const Config& config,
                Cluster* cluster, Replicator* replicator)
      : Handler(store, cache, config), cluster_(cluster), replicator_(replicator) {}

  void multiGet(std::vector<rpc::GetResult>& result, const std::vector<int64_t>& keys) override;
  void multiPut(const std::vector<rpc::KvPair>& pairs) override;
  void scan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse) override;
  void scanLog(rpc::LogScanResult& result, const std::string& cursor, int32_t limit) override;
  void ring(rpc::RingInfo& result) override;
  void digest(rpc::Digest& result, const std::string& token) override;
  void removeMark(const std::string& token, int64_t mark) override;
  void abortChange(const std::string& token) override;

  void peerGet(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) override;
  void peerPut(const rpc::PeerContext& ctx, int64_t key, const std::string& value) override;
  bool peerRemove(const rpc::PeerContext& ctx, int64_t key) override;
  void peerAppend(const rpc::PeerContext& ctx, int64_t key, const std::string& value) override;
  void peerMultiGet(std::vector<rpc::GetResult>& result, const rpc::PeerContext& ctx,
                    const std::vector<int64_t>& keys) override;
  void peerMultiPut(const rpc::PeerContext& ctx, const std::vector<rpc::KvPair>& pairs) override;
  void peerScan(rpc::ScanResult& result, const rpc::PeerContext& ctx, int64_t from, int32_t limit,
                bool reverse, int64_t lo, int64_t hi) override;
  void peerScanLog(rpc::LogScanResult& result, const rpc::PeerContext& ctx,
                   const std::string& cursor, int32_t limit) override;
  void peerSGet(rpc::GetResult& result, const rpc::PeerContext& ctx,
                const std::string& key) override;
  void peerSPut(const rpc::PeerContext& ctx, const std::string& key,
                const std::string& value) override;
  bool peerSRemove(const rpc::PeerContext& ctx, const std::string& key) override;
  void peerChain(const rpc::PeerContext& ctx, const std::string& from,
                 const rpc::ChainFrame& frame) override;
  int64_t peerSnapshot(const rpc::PeerContext& ctx, const std::string& from,
                       const rpc::SnapshotPage& page) override;
  void peerRepair(rpc::GetResult& result, const rpc::PeerContext& ctx, int64_t key) override;
  void peerBucket(std::string& result, const rpc::PeerContext& ctx, int64_t slots, int64_t slot,
                  bool repair) override;
  void peerExport(rpc::ExportPage& result, const rpc::PeerContext& ctx, int64_t lo, int64_t hi,
                  const std::string& cursor, int32_t limit) override;
  void peerFence(const rpc::PeerContext& ctx) override;
  void peerTrack(rpc::TrackToken& result, const rpc::PeerContext& ctx, int64_t czxid) override;
  void peerDelta(rpc::DeltaPage& result, const rpc::PeerContext& ctx,
                 const rpc::TrackToken& token, const std::string& cursor,
                 int32_t limit) override;
  int64_t peerDrop(const rpc::PeerContext& ctx, int64_t lo, int64_t hi, int32_t limit) override;

  bool MayBlock(const uint8_t* message, uint32_t len) const override;
  int64_t StringHash(const std::string& key) const override;
  std::string NotReady() const override;
  RingView* ring_view() const override;

  // A single-key write (put, remove, append, sput, sremove: "string_key"
  // for the last two, "value" for the writes that carry one) of this
  // member's own mark, started through its chain without blocking (the
  // Forwarder's, on an I/O thread): "done" gets the answer, on another
  // thread. A write refused at once (value too large, key out of range)
  // returns its error and "done" is not called.
  Status StartChainWrite(Method method, int64_t key, const std::string& string_key,
                         std::string value, Replicator::WriteDone done);

 protected:
  void Routed(int64_t hash, bool write, const char* peer_method, bool idempotent,
              const std::function<void()>& local, const RemoteCall& remote) override;
  // Waits until the newest write of "hash" is committed (a read held back
  // inline on an I/O thread runs again on a worker: EventServer::RedoOnWorker).
  void CheckRead(int64_t hash) override;
  bool ReadCommitted(const int64_t* hashes, size_t n) override;
  Status CheckMoving(int64_t key, bool write) const override;
  bool ChainWrite(Method method, int64_t key, const std::string& string_key,
                  const std::string& value, bool* existed) override;
  bool ChainWriteBatch(const std::vector<rpc::KvPair>& pairs) override;
  // In a chain of several members the head rewrites the key with its newest
  // value (Replicator::Repair; asked with peerRepair unless this member is
  // the head). Inline on an I/O thread it asks to run on a worker instead
  // (EventServer::RedoOnWorker, sets redo_) and returns "bad".
  Status RepairRead(int64_t key, const Status& bad, rpc::GetResult* result) override;
  Status RepairStringRead(const std::string& key, const Status& bad,
                          rpc::GetResult* result) override;
  bool HasOtherCopies() const override;
  // At the head: Replicator::RepairBucket; elsewhere asked with peerBucket.
  // Blocks: a worker's call.
  Status RepairBucket(int64_t slot, std::string* bucket) override;
  std::string Role() const override;
  void AddMemberStats(std::map<std::string, int64_t>* out) const override;

 private:
  void RingMultiGet(std::vector<rpc::GetResult>& result, const std::vector<int64_t>& keys);
  void RingMultiPut(const std::vector<rpc::KvPair>& pairs);
  void RingScan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse);
  void RingScanLog(rpc::LogScanResult& result, const std::string& cursor, int32_t limit);
  // Throws NOT_OWNER/UNAUTHORIZED unless this mark owns every hash of
  // [lo, hi] (a peer call's keys).
  void CheckPeer(const rpc::PeerContext& ctx, int64_t lo, int64_t hi);
  // Throws NOT_OWNER unless this instance is the head of ctx.mark's chain
  // (and ctx's token and mark are right).
  void CheckHeadOf(const rpc::PeerContext& ctx, const char* what);
  // The head's side of a repair: another member's copy of "key" (peerGet
  // with ownCopy), from the first member after the head that has a good one.
  Status FetchCopy(int64_t key, rpc::GetResult* result);
  // The same for a string-key bucket (peerBucket without repair).
  Status FetchBucket(int64_t slots, int64_t slot, std::string* bucket);

  Cluster* const cluster_;
  Replicator* const replicator_;
};

}  // namespace flatkv::server
