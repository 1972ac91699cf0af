// The Forwarder's private parts, shared by forwarder.cc (connections, their
// events, timeouts, retries) and peer_codec.cc (the calls decoded, the peer
// calls encoded, the answers decoded and written back in the client
// method's terms). Not for any other file.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "server/member/forwarder.h"
#include "server/methods.h"

namespace flatkv::server {
namespace forwarder_io {

inline constexpr size_t kFrameHeader = 4;
inline constexpr int kReadChunk = 64 << 10;
// Nonblocking connections per peer per I/O thread. One usually suffices:
// the calls of all the thread's clients are pipelined on it, and a peer on
// the EventServer serves every frame it has read in one pass. But a peer
// with a worker pool (server.workers > 0, e.g. storage.sync: always) runs
// the frames of one connection one at a time, so when every connection has
// kDeepPipeline calls waiting another is opened, up to kMaxConnectionsPerPeer,
// and a call goes to the first connection that is not that deep.
inline constexpr size_t kMaxConnectionsPerPeer = 4;
inline constexpr size_t kDeepPipeline = 16;

inline void PutFrameLength(uint8_t* at, uint32_t len) {
  at[0] = static_cast<uint8_t>(len >> 24);
  at[1] = static_cast<uint8_t>(len >> 16);
  at[2] = static_cast<uint8_t>(len >> 8);
  at[3] = static_cast<uint8_t>(len);
}

// A client method forwarded here and its peer* twin (server/methods.h):
// the client's arguments are (key[, value]), the peer's (ctx, key[, value]),
// and both have the same result: field 0 "success" (none for void), field
// 1 "err" (KvError). The traits of a single-key client call, for the call
// or (*peer) for its peer* twin if that is a write; nullptr for the rest.
inline const MethodTraits* FindSpec(std::string_view name, bool* peer) {
  const MethodTraits* t = FindMethod(name);
  *peer = false;
  if (t == nullptr) return nullptr;
  if (t->dispatch == Dispatch::kRouted) return t;
  if (t->twin == Handler::kMethods) return nullptr;
  const MethodTraits& client = TraitsOf(t->twin);
  if (client.dispatch != Dispatch::kRouted || !client.write) return nullptr;
  *peer = true;
  return &client;
}

// The name of the peer* twin of a single-key client call.
inline const char* PeerName(const MethodTraits& spec) { return TraitsOf(spec.twin).name; }
inline bool StringKey(const MethodTraits& spec) { return spec.key == KeyKind::kString; }

}  // namespace forwarder_io

struct Forwarder::Op {
  const MethodTraits* spec = nullptr;
  int32_t seqid = 0;  // the client's
  bool peer = false;  // a peer write (peerPut ...) for this member's chain
  rpc::PeerContext ctx;  // its context
  int64_t key = 0;
  std::string string_key;
  std::string value;
  Cluster::Target target;
  Reply* reply = nullptr;  // null once the client connection closed
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point deadline;
  int32_t peer_seqid = 0;
  bool on_used_conn = false;  // its Conn had completed a call when it was sent
  bool sent_again = false;    // already sent on a fresh connection once
};

// What the peer answered, in the client method's terms.
struct Forwarder::Outcome {
  bool has_success = false;
  rpc::GetResult get;
  bool existed = false;
  bool has_err = false;
  rpc::KvError err;
};

// Chain writes answered by the replicator's loop thread, waiting for this
// I/O thread. The loop writes the eventfd only when the queue was empty.
// Once the Forwarder is gone ("closed") an answer is dropped with its Op.
struct Forwarder::Inbox {
  std::mutex mu;
  bool closed = false;  // GUARDED_BY(mu)
  int fd = -1;
  struct Done {
    Op* op;
    Status status;
    bool existed;
  };
  std::vector<Done> done;  // GUARDED_BY(mu)

  void Push(Op* op, const Status& status, bool existed);
};

struct Forwarder::Peer {
  std::string address;  // host:port, as the ring names the member
  sockaddr_storage addr{};
  socklen_t addr_len = 0;  // 0: the host is not an IP literal
  std::atomic<int64_t>* forwarded = nullptr;
  std::vector<Conn*> conns;
};

struct Forwarder::Conn {
  Forwarder* owner = nullptr;
  Peer* peer = nullptr;
  int fd = -1;
  event* read_event = nullptr;
  event* write_event = nullptr;
  event* timer = nullptr;
  evbuffer* input = nullptr;
  evbuffer* output = nullptr;
  bool connecting = true;  // until the TCP connect (and the TLS handshake) completed
  SSL* ssl = nullptr;      // cluster.peer_tls: the session, once TCP connected
  int connect_error = 0;  // connect() failed at once: reported by write_event
  bool dirty = false;     // in owner->dirty_
  int64_t completed = 0;  // calls answered on it
  int32_t next_seqid = 0;
  std::deque<Op*> pending;  // sent, oldest first
};

}  // namespace flatkv::server
