// Private to the replicator's own files (replicator*.cc, one per seam: the
// loop and its events, peer links, snapshots, write tracking, repair, the
// sync pipeline, a full disk): the helpers they share and the classes
// behind Replicator's peer links and snapshot streams. Nothing outside
// server/member/replicator*.cc includes it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "FlatKV.h"
#include "client/client.h"
#include "engine/status.h"
#include "partition/chain.h"
#include "partition/registry.h"
#include "server/member/replicator.h"

namespace flatkv::server {
namespace replicator_internal {

// The member's clock: the lease's (it never jumps and counts pauses).
inline int64_t NowMs() { return partition::BootTimeMs(); }

// A write that reached neither the log nor the store cannot be taken back
// from the member's history: stop, as etcd does when its WAL fails, rather
// than acknowledge or pass on what this member may not hold. A restart
// replays the log and catches up from the chain.
[[noreturn]] void Fatal(const char* what, const Status& st);

// A connection to the member at "address" ("host:port") and the context
// its peer calls carry.
client::ClientOptions PeerOptions(const std::string& address, int timeout_ms,
                                  const ReplicatorOptions& options);
rpc::PeerContext PeerContextOf(const ReplicatorOptions& options);

}  // namespace replicator_internal

struct Replicator::Waiter {
  std::condition_variable cv;
  bool done = false;
  Status status;
  bool existed = false;
};

// Sends the frames queued for one neighbour, in order, on one connection
// (replicator_peer.cc).
class Replicator::PeerLink {
 public:
  // "refused" runs (on the sending thread, no lock held) after each
  // connection attempt the neighbour's host refused.
  PeerLink(const std::string& address, const ReplicatorOptions& options,
           std::atomic<int64_t>* sent, std::atomic<int64_t>* failed,
           std::function<void()> refused);
  ~PeerLink();
  // Sends "frame" after every frame pushed before it. peerChain is a
  // oneway call: nothing answers a frame (the neighbour's acks are frames
  // of their own), so a frame costs one write here and one read there. On
  // the caller's thread (the one running the member's events) while the
  // connection is up, nothing waits in the queue, the frame is small
  // (kDirectBytes) and the socket holds less than kDirectBytes not yet
  // taken by the neighbour: it then fits the socket buffers, so the send
  // cannot block on a slow or stopped peer. Otherwise the link's thread
  // sends it, merged with what queued meanwhile. So a frame on an idle
  // hop costs no thread wake-up here, and a busy hop carries batches.
  void Push(rpc::ChainFrame frame);

 private:
  // The largest frame Push() sends itself: far below an idle loopback or
  // LAN connection's buffers.
  static constexpr size_t kDirectBytes = 48 << 10;
  static size_t FrameBytes(const rpc::ChainFrame& frame);
  size_t Unsent() const;
  void Failed(const Status& st);  // mu_ held
  void Run();
  static std::vector<rpc::ChainFrame> Coalesce(std::deque<rpc::ChainFrame>* queued);

  const std::string address_;
  const ReplicatorOptions options_;
  const rpc::PeerContext ctx_;
  // Used by the thread that set sending_, only.
  client::Client conn_;
  std::atomic<int64_t>* const sent_;
  std::atomic<int64_t>* const failed_;
  const std::function<void()> refused_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rpc::ChainFrame> queue_;  // GUARDED_BY(mu_), and the fields below
  bool sending_ = false;    // a thread uses conn_
  bool healthy_ = false;    // the last send on conn_ went out
  bool backoff_ = false;    // the connection failed: wait before the next try
  bool stop_ = false;
  std::thread thread_;
};

// Streams this member's store to a joiner as peerSnapshot pages
// (replicator_snapshot.cc).
class Replicator::SnapshotSender {
 public:
  SnapshotSender(Replicator* owner, const std::string& to, partition::ChainPosition at);
  ~SnapshotSender();
  bool done() const { return done_.load(); }
  // Still streaming: not sent whole, not failed.
  bool running() const { return !ended_.load(); }
  partition::ChainPosition at() const { return at_; }
  int64_t started_ms() const { return started_ms_; }

 private:
  void Run();

  Replicator* const owner_;
  const std::string to_;
  const partition::ChainPosition at_;
  const int64_t started_ms_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};   // sent whole
  std::atomic<bool> ended_{false};  // sent whole, or stopped
  std::thread thread_;
};

}  // namespace flatkv::server
