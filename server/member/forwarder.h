// Forwarder: a ring member's single-key calls for keys of other marks,
// forwarded by the I/O thread that read them, with no thread hand-off
// (shared/DESIGN.md, "Requests"). One Forwarder per EventServer I/O thread
// (EventServer::SetAsync()), on that thread's event loop:
//
//   client --get--> I/O thread: Start() routes the key --> peer connection
//                                                    (nonblocking, pipelined)
//   client <--get answer-- I/O thread <--peerGet answer--/
//
// Which calls: get, put, remove, append, sget, sput, sremove whose key the
// ring gives to another member, when that member's address has a numeric
// host (an IP literal: no name lookup on the I/O thread); and the writes
// among them for this member's own mark, which go through its chain
// (MemberHandler::StartChainWrite(), server/member/replicator.h) without a worker: the
// replicator's loop thread hands each answer back through an eventfd of
// this I/O thread (the Inbox), so a write costs two thread hand-offs and
// the writes of every connection share the chain's batches. Everything
// else is not taken: reads for this mark run inline, malformed calls and calls that
// fail before any forward (no ring yet, a mark with no member, a value too
// large) are answered inline by the handler, and batches, scans and calls to
// a member named by a host name go to the EventServer's worker pool, which
// forwards on blocking pooled connections (Cluster::Forward()).
//
// How: each I/O thread keeps a nonblocking connection per member it
// forwards to (up to 4 while calls pile up: forwarder.cc), registered in
// its own event loop. A forwarded call is the peer* method of the IDL
// carrying a PeerContext (token, ring version, mark), exactly as the
// blocking path sends it. A peer answers the frames of one connection in
// order, so each connection keeps a FIFO of the calls it sent; the calls of
// many client connections share it (pipelined), and the frames queued while
// the loop serves the ready client connections go out in one write. The peer's answer is decoded and re-encoded as the
// client method's answer (same result fields), then written to the client
// connection by the EventServer.
//
// Semantics, as the blocking path (MemberHandler::Routed()) has them:
//   - A NOT_OWNER answer: the call goes to a worker (Reply::Redo()), which
//     re-reads the ring (a blocking ZooKeeper read) and makes one more
//     attempt, with no further retry (Handler::RunAsRetry()).
//   - No answer within cluster.peer_timeout_ms of sending (counted from when
//     the call was queued, connecting included): UNAVAILABLE, text from
//     Cluster::PeerUnanswered() ("mark M: member H:P did not answer: ...").
//     The connection is then closed and every call still waiting on it
//     fails the same way (they are behind the late one).
//   - A connection that breaks (refused, reset, closed by the peer): its
//     calls fail UNAVAILABLE, except that an idempotent call (not append)
//     sent on a connection that had already completed a call is sent once
//     more on a fresh connection, as client::Client retries. A timed-out
//     call is not sent again.
//   - The client connection stays up; its pipelined calls are answered in
//     order (the EventServer serves its next frame only after the answer).
//
// Counters: the handler's calls.<method>/errors.<method> and latencies (one
// call each, CountCall()/Finish()), cluster.forwarded and
// cluster.forwarded.<address> (one per call forwarded, as Cluster::Forward()
// counts), cluster.forwarded_async (those forwarded here),
// cluster.peer_failures, cluster.peer_connections_async.
//
// Thread safety: a Forwarder is used only by its I/O thread (and destroyed
// after that thread ended). The Handler and Cluster it calls are
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "server/config.h"
#include "server/event_server.h"
#include "server/member/cluster.h"
#include "server/member/member_handler.h"
#include "server/tls.h"

struct event;

namespace flatkv::server {

class Forwarder final : public AsyncCalls {
 public:
  // "handler" and "cluster" outlive the Forwarder; "base" is the I/O
  // thread's event loop, on which the peer connections are registered.
  // "tls" (with cluster.peer_tls) gives each new peer connection its client
  // SSL on the current certificate files.
  Forwarder(event_base* base, MemberHandler* handler, Cluster* cluster, const Config& config,
            std::shared_ptr<TlsContext> tls);
  // Closes the peer connections and drops the calls in flight unanswered
  // (the EventServer frees their client connections).
  ~Forwarder() override;

  // kTaken for a single-key call forwarded here (see above), kInline for
  // one the handler answers at once, kNotTaken for the rest.
  Decision Start(const uint8_t* message, uint32_t len, Reply* reply, void** ticket) override;
  // The client went away: the call's answer, when it comes, is dropped.
  void Cancel(void* ticket) override;

  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

 private:
  struct Op;
  struct Peer;
  struct Conn;
  struct Outcome;
  struct Inbox;

  // Starts op (taken) through this member's chain; its answer, or its
  // refusal, comes through the inbox.
  void StartLocalWrite(Op* op);
  // Answers the chain writes the replicator finished (I/O thread).
  void DrainInbox();
  static void OnInbox(int fd, short what, void* arg);

  // Decodes a client call; false if it is not a single-key call we know
  // (*inline_call: malformed, the handler answers it).
  bool Parse(const uint8_t* message, uint32_t len, Op* op, bool* inline_call);
  Peer* FindPeer(const std::string& address);
  // Queues "op" on a connection to its peer (opening one if needed); false
  // if no socket could be made.
  bool Send(Peer* peer, Op* op);
  // op's peer* call with "seqid", encoded into out_ (peer_codec.cc):
  // *frame and *size (the length included) until the next encoding. False
  // if out of memory.
  bool EncodePeerCall(const Op& op, int32_t seqid, uint8_t** frame, uint32_t* size);
  Conn* Open(Peer* peer);
  // cluster.peer_tls: the TLS session on a connected socket, then its
  // handshake, driven by the connection's events; true once done.
  bool StartTls(Conn* conn);
  bool Handshake(Conn* conn);
  // One read (TLS: every byte OpenSSL has) into conn->input: as recv().
  int ReadSome(Conn* conn);
  bool FlushTls(Conn* conn);
  void ScheduleFlush(Conn* conn);
  void Flush(Conn* conn);
  void Read(Conn* conn);
  bool ConnectDone(Conn* conn);
  void Expire(Conn* conn);
  // Closes "conn" and fails (or sends again) every call it holds.
  void Fail(Conn* conn, bool timed_out, bool connecting, const std::string& why);
  void Close(Conn* conn);
  // One whole answer frame's body from the peer for the oldest call of
  // "conn"; false if the connection is out of step (it must be failed).
  bool Complete(Conn* conn, uint8_t* body, uint32_t len);
  void Answer(Op* op, const Outcome& outcome);
  // "sent": the call was written to the peer (Cluster::PeerUnanswered).
  void FailOp(Op* op, const std::string& why, bool sent = true);
  void Redo(Op* op);

  static void OnReadable(int fd, short what, void* arg);
  static void OnWritable(int fd, short what, void* arg);
  static void OnTimer(int fd, short what, void* arg);
  static void OnFlush(int fd, short what, void* arg);

  event_base* const base_;
  const std::shared_ptr<TlsContext> tls_;  // with cluster.peer_tls
  MemberHandler* const handler_;
  Cluster* const cluster_;
  const std::chrono::milliseconds timeout_;
  const uint32_t max_answer_;
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
  std::vector<Conn*> dirty_;        // connections with frames to write
  std::shared_ptr<Inbox> inbox_;    // shared with the replicator's callbacks
  event* inbox_event_ = nullptr;    // the inbox's eventfd is readable
  event* flush_event_ = nullptr;    // made active when dirty_ gets its first
  bool flush_scheduled_ = false;
  // Decoding of client calls and peer answers, encoding of peer calls and
  // client answers: buffers reused call after call.
  std::shared_ptr<apache::thrift::transport::TMemoryBuffer> in_;
  std::shared_ptr<apache::thrift::transport::TMemoryBuffer> out_;
  std::shared_ptr<apache::thrift::protocol::TBinaryProtocol> in_protocol_;
  std::shared_ptr<apache::thrift::protocol::TBinaryProtocol> out_protocol_;
};

}  // namespace flatkv::server
