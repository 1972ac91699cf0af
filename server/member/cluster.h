// Cluster: what an instance of a ring adds to the standalone server
// (shared/DESIGN.md, "Cluster" and "Requests"). It owns the ZooKeeper
// registry (partition/registry.h) and the connections to the other
// instances, and tells the handler, for each key, whether this instance
// serves it or which member of which mark does:
//
//   client call --> Handler --> Cluster::Route(hash) --> local: cache/Store
//                                                  \--> remote: a peer* call
//                                                       on a pooled connection
//
// A forwarded call is a peer* method of the IDL carrying a PeerContext
// (cluster.peer_token, the sender's ring version, the mark it routed to);
// the receiver serves it only if its own ring says its mark owns the key
// (CheckPeer), else NOT_OWNER, and the sender re-reads the ring and retries
// once. Writes go to the head of the mark's chain, reads under sync to its
// tail (server/member/replicator.h), under async to any member.
//
// Thread safety: every method may be called from any thread concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "FlatKV.h"
#include "client/client.h"
#include "engine/status.h"
#include "partition/change.h"
#include "partition/registry.h"
#include "partition/ring.h"
#include "partition/router.h"
#include "server/config.h"
#include "server/handler.h"
#include "server/member/replicator.h"

namespace flatkv::server {


class Cluster : public ChainCoordinator, public RingView {
 public:
  // Where one call goes.
  struct Target {
    bool local = false;
    int64_t mark = 0;           // the owning mark
    std::string address;        // the member to call when !local
    rpc::PeerContext context;   // what that call carries
  };

  // Validates config.cluster and starts the registry, which connects in the
  // background (not registered yet: call Register() once serving).
  // "on_fatal" is called (from the registry's thread) when the ring's
  // settings differ from ours: the instance must stop with exit code 2.
  static Status Start(const Config& config, std::function<void(const Status&)> on_fatal,
                      std::unique_ptr<Cluster>* result);
  ~Cluster() override;

  // Starts chain replication of this member's store (server/member/replicator.h):
  // from then on Register() joins the chain (catch up first, then the
  // member node) instead of registering at once. Before serving. "defer":
  // ReplicatorOptions::defer (EventServer::AtRoundEnd in flatkv-server).
  Status StartReplication(const Config& config, engine::Store* store,
                          engine::cache::WriteBackCache* cache,
                          std::function<bool(std::function<void()>)> defer = nullptr);
  Replicator* replicator() const { return replicator_.get(); }

  // Serving: removes the member node this address's previous process
  // left (Registry::RemoveStale: this process holds the port now), then
  // joins the chain (with replication) or registers this instance's member
  // node (now or once ZooKeeper answers).
  void Join();

  // ChainCoordinator, over the registry. Register() goes through the ring
  // change machine (partition/change.h): a member of a mark the ring has
  // registers; a new mark imports its range first.
  void Register() override;
  void Deregister() override;
  Status RecordChain(const std::vector<std::string>& members, int64_t ring_version) override;
  partition::SessionLease lease() const override { return registry_->lease(); }
  void Evict(const std::string& member, int64_t czxid) override {
    registry_->Evict(member, czxid);
  }
  // flatkv admin remove-mark: records the change (.cluster/change, kind
  // remove) that moves mark "removed"'s keys to the next mark up, whose head
  // then does the rest (RemoveStep). InvalidArgument for a mark not in the
  // ring or the only one; Busy while another change runs.
  Status StartRemoveMark(int64_t removed);
  // flatkv admin abort-change: rolls back the ring change in progress while
  // it is still copying (Registry::AbortChange); its importer, if it runs,
  // finds the node gone and starts over.
  Status AbortChange();
  // Every new ring (registry thread; never blocks): a removed mark's members
  // leave; the inheriting mark's head starts its part.
  void OnRingChange(const partition::Ring& ring);
  // Why this instance does not register although it would (a new mark
  // whose range holds keys: server/member/migration.h); empty otherwise. For
  // /health and the log.
  std::string register_blocked() const;
  // Closes the ZooKeeper session (the member node goes at once). Idempotent.
  void Close();

  int64_t mark() const override { return router_.self_mark(); }
  const std::string& advertise() const override { return advertise_; }
  // The newest ring, or nullptr while ZooKeeper has not been reached.
  std::shared_ptr<const partition::Ring> ring() const override { return registry_->ring(); }
  // This instance's role: single | head | middle | tail, or syncing while
  // it is not (yet) a registered member of the ring it sees.
  std::string role() const;

  // Routes a call for "hash": a write goes to the head of the owner's chain,
  // a read to the member the replication mode names. Unavailable when no
  // ring is known yet or the owning mark has no serving member (naming it).
  Status Route(int64_t hash, bool write, Target* target);
  // The same for a partition already chosen (batches, scans).
  Status RouteTo(const partition::Ring& ring, size_t partition, bool write, Target* target);
  // The members of this instance's own mark, in chain order (head first),
  // as targets of peer calls (this instance's own entry has local = true).
  // Empty while no ring is known.
  std::vector<Target> OwnChain();
  // Re-reads the ring from ZooKeeper (after a NOT_OWNER answer); waits up
  // to the session timeout. Unavailable if ZooKeeper did not answer: the
  // ring is then the one that was there.
  Status Refresh();
  // After a NOT_OWNER answer to "what" (so nothing was applied): Refresh(),
  // so the call may go once more. Unavailable, saying nothing was applied,
  // if ZooKeeper did not answer: the ring that was refused would only send
  // the call back to the same member, a session timeout after the client
  // called, when a write could land after its client gave up and after a
  // newer write of the same key.
  Status RefreshForRetry(std::string_view what);

  // Runs "call" on a pooled connection to target.address. A network failure
  // is Unavailable naming the member and the mark; a KvError keeps its code.
  Status Forward(const Target& target, const char* method, bool idempotent,
                 const std::function<void(rpc::FlatKVClient&)>& call);
  // For calls sent to several members before any answer is read: a
  // connection of the pool, and its return (kept only if it is healthy).
  std::unique_ptr<client::Client> Borrow(const std::string& address) override;
  void Return(std::unique_ptr<client::Client> connection) override;
  // The Status Forward() gives for a failure of "connection".
  Status PeerFailure(const Target& target, const client::Client& connection, Status st) const;
  // The Unavailable status of a forwarded call the member of "target" did
  // not answer; "why" names the member and the failure ("host:port:
  // peerGet: ...", "host:port: cannot connect: ...").
  // "sent": the call may have reached the peer (it was written, or it is
  // not known that it was not), so a write may have been applied: the
  // message says so (the client's retry contract).
  Status PeerUnanswered(const Target& target, const std::string& why, bool sent = true) const;

  // For the I/O threads' Forwarders (server/member/forwarder.h), which forward
  // without Forward(): the counter of calls forwarded to "address"
  // (cluster.forwarded.<address>; valid as long as the Cluster), and the
  // counts of their own (cluster.forwarded_async, cluster.peer_failures,
  // cluster.peer_connections_async).
  std::atomic<int64_t>* ForwardCounter(const std::string& address);
  void CountForwardedAsync() { forwarded_async_.fetch_add(1, std::memory_order_relaxed); }
  void CountPeerFailure() { peer_failures_.fetch_add(1, std::memory_order_relaxed); }
  void CountAsyncConnections(int delta) {
    async_connections_.fetch_add(delta, std::memory_order_relaxed);
  }

  // Checks a call from another instance: the token, and that this
  // instance's mark owns its keys in its own ring (NOT_OWNER otherwise,
  // naming the owner and both ring versions). Counts refusals.
  // A hash range [lo, hi] (one key: lo = hi; peerScan: a range) must lie
  // within one range this mark owns. CheckPeerMark checks only the token
  // and the mark (peerScanLog covers the whole partition).
  Status CheckPeerRange(const rpc::PeerContext& context, int64_t lo, int64_t hi);
  Status CheckPeerMark(const rpc::PeerContext& context);
  // Unavailable while a ring change moves "hash" (partition::Moving): from
  // this mark (writes in every state, reads from state flip on) or to it
  // (until its importer knows the source has seen the flip).
  Status CheckWritable(int64_t hash) const override { return CheckMoving(hash, true); }
  Status CheckReadable(int64_t hash) const { return CheckMoving(hash, false); }
  // After a local read of "hash": the newest view still has this mark own
  // it and serve its reads (NotOwner or Unavailable: the answer must not be
  // given, a ring change moved the key meanwhile).
  Status CheckStillServed(int64_t hash) const;

  // The ring as the IDL's RingInfo.
  void Describe(rpc::RingInfo* info) const;
  // cluster.* counters for stats() and /metrics.
  void AddStats(std::map<std::string, int64_t>* out) const;

  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

 private:
  // The registry's callbacks reach the replicator through this (set once
  // replication starts; the registry may call before).
  struct Hooks {
    std::atomic<Replicator*> replicator{nullptr};
    std::atomic<Cluster*> cluster{nullptr};
  };
  Cluster(const Config& config, std::unique_ptr<partition::Registry> registry,
          std::shared_ptr<Hooks> hooks);
  Status CheckToken(const rpc::PeerContext& context);
  // CheckPeerMark's mark checks, against a ring the caller already holds.
  Status CheckMarkIn(const rpc::PeerContext& context, const partition::Ring* ring);
  Status RefuseNotOwner(const rpc::PeerContext& context, const partition::Ring* ring,
                        const std::string& why);
  void CountForward(const std::string& address);
  Status CheckMoving(int64_t hash, bool write) const;
  // The same against a ring the caller already holds (one load per call).
  Status CheckMoving(const partition::Ring* ring, int64_t hash, bool write) const;
  // The ring change machine's thread (machine_): started by Register() and
  // by a ring whose change concerns this member; runs the steps the machine
  // asks for until it has none.
  void KickChange();
  void ChangeLoop();
  bool GateStopped() const;
  Status RunStep(const partition::ChangeStep& step, const partition::Ring& ring);
  // kCopy: the change's ranges from the source's reader, into this store
  // (add) or through this mark's chain (remove).
  Status CopyRanges(const partition::RingChange& change, const partition::Ring& ring);
  // kDrop: the source's head drops the change's ranges.
  // kRelease: every member of the source's chain confirms it let the
  // ranges go (partition::ReleasedBy), the head last, dropping one key
  // ("dropped": how many it did).
  Status ReleaseSource(const partition::RingChange& change, int64_t* dropped);
  Status DropAtSource(const partition::RingChange& change, const partition::Ring& ring);
  // kFence: the source's head stops writes to the ranges.
  Status FenceSource(const partition::RingChange& change, const partition::Ring& ring);
  // kTrack: the source's head starts recording writes to the ranges
  // (track_token_ names the record).
  Status TrackSource(const partition::RingChange& change, const partition::Ring& ring);
  // kDelta: the recorded keys from the source's head into this store;
  // NotFound if it has no continuous record (the machine copies everything).
  Status CopyDelta(const partition::RingChange& change, const partition::Ring& ring);
  // The head of the change's source mark, as the target of a peer call.
  Status SourceHead(const partition::RingChange& change, const partition::Ring& ring,
                    Target* head);
  Status WipeStore();
  // kWipe of a remove: removes through this mark's chain what an earlier
  // attempt copied into the change's ranges (this mark keeps its own keys).
  Status WipeRanges(const partition::RingChange& change, const partition::Ring& ring);
  // A remove's copy or delta: puts and removes through this mark's chain.
  Status ImportThroughChain(std::vector<rpc::KvPair>* pairs,
                            std::vector<rpc::StringKvPair>* spairs,
                            const std::vector<int64_t>& removed,
                            const std::vector<std::string>& sremoved, int64_t hash_bound,
                            uint64_t* bytes);
  // Index of "mark" in ring.partitions(), or Unavailable naming "what".
  static Status IndexOf(const partition::Ring& ring, int64_t mark, const char* what,
                        size_t* index);
  static int64_t NowMillis();
  // An import's progress in percent: of the source's estimate, 100 once
  // the copy is complete.
  static int64_t ImportPercent(uint64_t bytes, uint64_t total, bool copied);

  const ClusterOptions options_;
  const partition::Router router_;
  const std::string advertise_;
  std::unique_ptr<partition::Registry> registry_;
  std::shared_ptr<Hooks> hooks_;
  std::unique_ptr<Replicator> replicator_;
  std::atomic<uint64_t> spread_{0};  // picks a member for async reads

  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::unique_ptr<client::Client>>> idle_;  // GUARDED_BY(mu_)
  // The map is GUARDED_BY(mu_); its counters are atomics, updated without it.
  std::map<std::string, std::atomic<int64_t>> forwarded_;
  std::atomic<int64_t> not_owner_sent_{0};     // NOT_OWNER answers this instance gave
  std::atomic<int64_t> not_owner_retries_{0};  // re-reads after a NOT_OWNER it got
  std::atomic<int64_t> peer_failures_{0};      // forwarded calls without an answer
  std::atomic<int64_t> unauthorized_{0};       // peer calls with a wrong token
  std::atomic<int64_t> forwarded_async_{0};    // of forwarded_: by an I/O thread
  std::atomic<int64_t> async_connections_{0};  // the I/O threads' open peer connections

  // The ring change machine and its thread. gate_reason_, gate_stop_,
  // gate_running_, gate_kicked_, import_ and leaving_ GUARDED_BY(gate_mu_);
  // machine_ GUARDED_BY(machine_mu_) (request threads ask it Released()).
  mutable std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  std::thread gate_;
  bool gate_stop_ = false;
  bool gate_running_ = false;
  bool gate_kicked_ = false;
  std::string gate_reason_;
  mutable std::mutex machine_mu_;
  partition::ChangeMachine machine_;
  // A ring change's copy (add or remove), for stats().
  struct ImportProgress {
    bool running = false;
    int64_t start_ms = 0;
    int64_t copied_ms = 0;
    uint64_t keys = 0;
    uint64_t bytes = 0;
    uint64_t total = 0;  // the source's estimate of the ranges' bytes (0: none)
    int64_t dropped = 0;
    uint64_t delta_keys = 0;  // copied after the fence from the source's record
    bool full = false;        // the copy after the fence was of everything
  };
  ImportProgress import_;
  // The writes-refused window as this importer saw it: from the fence (its
  // state copy written, or its first fence) to the release.
  int64_t fenced_ms_ = 0;     // 0: not fenced by this process
  int64_t fence_window_ms_ = -1;
  rpc::TrackToken track_token_;  // kTrack's answer (change thread only)
  bool leaving_ = false;  // this member's mark was removed
  engine::Store* store_ = nullptr;                     // set by StartReplication
  engine::cache::WriteBackCache* cache_ = nullptr;
};

}  // namespace flatkv::server
