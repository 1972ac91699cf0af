// Implementation notes.
//
// An Op is one forwarded client call: its decoded arguments, its route
// (Cluster::Target), its Reply (null once the client went away), and when
// it was started and must be answered by. It is owned by the pending FIFO
// of the Conn it was sent on, from Send() until its answer or failure.
//
// A Conn is a nonblocking socket with its own read event (persistent),
// write event (added only while output waits for the socket, or while
// connecting), timer and input/output evbuffers. Frames are added to the
// output as calls are started; the socket is written once per event-loop
// pass for all of them (flush_event_, activated by the first frame of the
// pass: libevent runs it after the callbacks already active, i.e. after
// the other client connections that were ready together). The timer is
// armed when a call is queued on an empty FIFO and, when it fires, either
// fails the connection (its oldest call is past its deadline) or re-arms
// for the oldest call's deadline: deadlines grow along the FIFO (the same
// timeout for all), so the oldest call's is the nearest.
//
// Re-entrancy: answering a call (Reply::Answer()) makes the EventServer
// serve the client connection's next frames at once, which may Start()
// new calls and Cancel() others. So a Conn is never failed from within
// Start() (a connect() refused at once is reported through its write
// event), an Op is taken out of its FIFO and its Reply cleared before the
// Reply is called, and Fail() detaches and frees its Conn before it answers
// any of its calls (a call sent again goes to a new Conn).
#include "server/member/forwarder.h"
#include "server/methods.h"
#include "server/thrift_limits.h"
#include "server/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string_view>

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>
#include <thrift/TApplicationException.h>

#include "client/client.h"
#include "partition/ring.h"

namespace flatkv::server {

using apache::thrift::TApplicationException;
using apache::thrift::protocol::T_BOOL;
using apache::thrift::protocol::T_CALL;
using apache::thrift::protocol::T_EXCEPTION;
using apache::thrift::protocol::T_I64;
using apache::thrift::protocol::T_REPLY;
using apache::thrift::protocol::T_STOP;
using apache::thrift::protocol::T_STRING;
using apache::thrift::protocol::T_STRUCT;
using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::protocol::TMessageType;
using apache::thrift::protocol::TType;
using apache::thrift::transport::TMemoryBuffer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kFrameHeader = 4;
constexpr int kReadChunk = 64 << 10;
// Nonblocking connections per peer per I/O thread. One usually suffices:
// the calls of all the thread's clients are pipelined on it, and a peer on
// the EventServer serves every frame it has read in one pass. But a peer
// with a worker pool (server.workers > 0, e.g. storage.sync: always) runs
// the frames of one connection one at a time, so when every connection has
// kDeepPipeline calls waiting another is opened, up to kMaxConnectionsPerPeer,
// and a call goes to the first connection that is not that deep.
constexpr size_t kMaxConnectionsPerPeer = 4;
constexpr size_t kDeepPipeline = 16;

void PutFrameLength(uint8_t* at, uint32_t len) {
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
const MethodTraits* FindSpec(std::string_view name, bool* peer) {
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
const char* PeerName(const MethodTraits& spec) { return TraitsOf(spec.twin).name; }
bool StringKey(const MethodTraits& spec) { return spec.key == KeyKind::kString; }

}  // namespace

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
  Clock::time_point start;
  Clock::time_point deadline;
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

Forwarder::Forwarder(event_base* base, MemberHandler* handler, Cluster* cluster, const Config& config,
                     std::shared_ptr<TlsContext> tls)
    : base_(base),
      tls_(config.cluster.peer_tls ? std::move(tls) : nullptr),
      handler_(handler),
      cluster_(cluster),
      timeout_(config.cluster.peer_timeout_ms),
      max_answer_(client::ClientOptions().max_frame_bytes),
      in_(std::make_shared<TMemoryBuffer>()),
      out_(std::make_shared<TMemoryBuffer>()),
      in_protocol_(std::make_shared<TBinaryProtocol>(in_)),
      out_protocol_(std::make_shared<TBinaryProtocol>(out_)) {
  flush_event_ = event_new(base_, -1, 0, &Forwarder::OnFlush, this);
  if (cluster_->replicator() != nullptr) {
    inbox_ = std::make_shared<Inbox>();
    inbox_->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (inbox_->fd >= 0) {
      inbox_event_ = event_new(base_, inbox_->fd, EV_READ | EV_PERSIST, &Forwarder::OnInbox, this);
    }
    if (inbox_event_ == nullptr || event_add(inbox_event_, nullptr) != 0) {
      // Without it chain writes go to the workers, as the offload function says.
      spdlog::warn("forwarder: no eventfd for chain answers: {}", std::strerror(errno));
      if (inbox_->fd >= 0) close(inbox_->fd);
      inbox_.reset();
    }
  }
}

Forwarder::~Forwarder() {
  for (auto& [address, peer] : peers_) {
    while (!peer->conns.empty()) {
      Conn* conn = peer->conns.back();
      for (Op* op : conn->pending) delete op;
      conn->pending.clear();
      Close(conn);
    }
  }
  if (flush_event_ != nullptr) event_free(flush_event_);
  if (inbox_ != nullptr) {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    inbox_->closed = true;
    for (Inbox::Done& d : inbox_->done) delete d.op;
    inbox_->done.clear();
    event_free(inbox_event_);
    close(inbox_->fd);
  }
}

void Forwarder::Inbox::Push(Op* op, const Status& status, bool existed) {
  std::lock_guard<std::mutex> lock(mu);
  if (closed) {
    delete op;  // the I/O thread is gone: no one to answer
    return;
  }
  done.push_back({op, status, existed});
  if (done.size() == 1) {
    const uint64_t one = 1;
    // Cannot fail short of the counter overflowing: a nonblocking eventfd.
    [[maybe_unused]] ssize_t n = write(fd, &one, sizeof(one));
  }
}

void Forwarder::StartLocalWrite(Op* op) {
  std::shared_ptr<Inbox> inbox = inbox_;
  Status st = handler_->StartChainWrite(
      op->spec->method, op->key, op->string_key, std::move(op->value),
      [inbox, op](const Status& status, bool existed) { inbox->Push(op, status, existed); });
  if (!st.ok()) inbox->Push(op, st, false);  // refused at once (key out of range ...)
}

void Forwarder::OnInbox(int /*fd*/, short /*what*/, void* arg) {
  static_cast<Forwarder*>(arg)->DrainInbox();
}

void Forwarder::DrainInbox() {
  uint64_t count;
  [[maybe_unused]] ssize_t n = read(inbox_->fd, &count, sizeof(count));
  std::vector<Inbox::Done> done;
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    done.swap(inbox_->done);
  }
  for (Inbox::Done& d : done) {
    Outcome outcome;
    outcome.existed = d.existed;
    if (!d.status.ok()) {
      outcome.has_err = true;
      outcome.err = ToKvError(d.status);
    }
    Answer(d.op, outcome);
  }
}

// Reads the call's name and arguments with the protocol the processor
// uses, so anything it would refuse is left to it.
bool Forwarder::Parse(const uint8_t* message, uint32_t len, Op* op, bool* inline_call) {
  *inline_call = false;
  bool ok = false;
  try {
    in_->resetBuffer(const_cast<uint8_t*>(message), len, TMemoryBuffer::OBSERVE);
    LimitToMessage(in_protocol_.get(), len);  // lengths that lie are refused unallocated
    std::string name;
    TMessageType type;
    in_protocol_->readMessageBegin(name, type, op->seqid);
    op->spec = type == T_CALL ? FindSpec(name, &op->peer) : nullptr;
    if (op->spec != nullptr) {
      // The arguments struct: (field 1 the peer's context,) then the key
      // and the value; the generated code skips unknown fields and insists
      // on the required.
      std::string ignored;
      TType ftype;
      int16_t fid;
      const int16_t key_id = op->peer ? 2 : 1;
      bool have_ctx = !op->peer, have_key = false, have_value = false;
      in_protocol_->readStructBegin(ignored);
      for (;;) {
        in_protocol_->readFieldBegin(ignored, ftype, fid);
        if (ftype == T_STOP) break;
        if (fid == 1 && op->peer && ftype == T_STRUCT) {
          op->ctx.read(in_protocol_.get());
          have_ctx = true;
        } else if (fid == key_id && !StringKey(*op->spec) && ftype == T_I64) {
          in_protocol_->readI64(op->key);
          have_key = true;
        } else if (fid == key_id && StringKey(*op->spec) && ftype == T_STRING) {
          in_protocol_->readBinary(op->string_key);
          have_key = true;
        } else if (fid == key_id + 1 && op->spec->has_value && ftype == T_STRING) {
          in_protocol_->readBinary(op->value);
          have_value = true;
        } else {
          in_protocol_->skip(ftype);
        }
        in_protocol_->readFieldEnd();
      }
      in_protocol_->readStructEnd();
      in_protocol_->readMessageEnd();
      ok = have_ctx && have_key && (have_value || !op->spec->has_value);
      *inline_call = !ok;  // a required argument missing
    }
  } catch (const std::exception&) {
    *inline_call = op->spec != nullptr;  // malformed arguments
  }
  in_->readEnd();  // resets the bytes counted against the message size limit
  in_->resetBuffer();
  return ok;
}

AsyncCalls::Decision Forwarder::Start(const uint8_t* message, uint32_t len, Reply* reply,
                                      void** ticket) {
  auto op = std::make_unique<Op>();
  bool inline_call = false;
  if (!Parse(message, len, op.get(), &inline_call)) {
    return inline_call ? Decision::kInline : Decision::kNotTaken;
  }
  const MethodTraits& spec = *op->spec;
  // The handler answers these at once, before any forward.
  if (spec.has_value && op->value.size() > handler_->max_value_bytes()) return Decision::kInline;
  const int64_t hash = StringKey(spec) ? handler_->StringHash(op->string_key) : op->key;
  if (op->peer) {
    // A peer's write for our chain: checked as the handler's peer* method
    // checks it, refused through the inbox (never inside Start()).
    if (inbox_ == nullptr) return Decision::kNotTaken;
    op->reply = reply;
    op->start = Clock::now();
    Op* raw = op.release();
    Status st = cluster_->CheckPeerRange(raw->ctx, hash, hash);
    if (st.ok()) {
      StartLocalWrite(raw);
    } else {
      inbox_->Push(raw, st, false);
    }
    handler_->CountCall(spec.twin);
    *ticket = raw;
    return Decision::kTaken;
  }
  if (!cluster_->Route(hash, spec.write, &op->target).ok()) return Decision::kInline;
  if (op->target.local) {
    // Ours. A read is answered here; a write goes through the chain
    // (answered from the inbox), or on a worker without an inbox.
    if (!spec.write || cluster_->replicator() == nullptr) return Decision::kInline;
    if (inbox_ == nullptr) return Decision::kNotTaken;
    op->reply = reply;
    op->start = Clock::now();
    Op* raw = op.release();
    StartLocalWrite(raw);
    handler_->CountCall(spec.method);
    *ticket = raw;
    return Decision::kTaken;
  }
  Peer* peer = FindPeer(op->target.address);
  if (peer == nullptr) return Decision::kNotTaken;  // a host name: the worker pool
  op->reply = reply;
  op->start = Clock::now();
  op->deadline = op->start + timeout_;
  Op* raw = op.release();
  if (!Send(peer, raw)) {
    delete raw;
    return Decision::kNotTaken;
  }
  handler_->CountCall(spec.method);
  peer->forwarded->fetch_add(1, std::memory_order_relaxed);
  cluster_->CountForwardedAsync();
  *ticket = raw;
  return Decision::kTaken;
}

void Forwarder::Cancel(void* ticket) { static_cast<Op*>(ticket)->reply = nullptr; }

Forwarder::Peer* Forwarder::FindPeer(const std::string& address) {
  auto it = peers_.find(address);
  if (it == peers_.end()) {
    auto peer = std::make_unique<Peer>();
    peer->address = address;
    peer->forwarded = cluster_->ForwardCounter(address);
    std::string host;
    int port = 0;
    if (partition::ParseHostPort(address, "member", &host, &port).ok()) {
      if (!host.empty() && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
      }
      auto* v4 = reinterpret_cast<sockaddr_in*>(&peer->addr);
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&peer->addr);
      if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(static_cast<uint16_t>(port));
        peer->addr_len = sizeof(sockaddr_in);
      } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(static_cast<uint16_t>(port));
        peer->addr_len = sizeof(sockaddr_in6);
      }
    }
    it = peers_.emplace(address, std::move(peer)).first;
  }
  return it->second->addr_len != 0 ? it->second.get() : nullptr;
}

// Encodes op's peer call (the blocking path's FlatKVClient::send_peer*
// writes the same bytes) onto the least loaded connection.
bool Forwarder::Send(Peer* peer, Op* op) {
  // The first connection not kDeepPipeline deep: the others carry only the
  // overflow, so against a peer that keeps up one connection takes
  // (nearly) all the calls and its answers come back in few reads.
  Conn* conn = nullptr;
  for (Conn* c : peer->conns) {
    if (c->pending.size() < kDeepPipeline) {
      conn = c;
      break;
    }
    if (conn == nullptr || c->pending.size() < conn->pending.size()) conn = c;
  }
  if (conn == nullptr ||
      (conn->pending.size() >= kDeepPipeline && peer->conns.size() < kMaxConnectionsPerPeer)) {
    Conn* fresh = Open(peer);
    if (fresh != nullptr) conn = fresh;
  }
  if (conn == nullptr) return false;
  const MethodTraits& spec = *op->spec;
  op->peer_seqid = conn->next_seqid++;
  op->on_used_conn = conn->completed > 0;
  try {
    out_->resetBuffer();
    out_->getWritePtr(kFrameHeader);
    out_->wroteBytes(kFrameHeader);  // the length, filled in below
    TBinaryProtocol* p = out_protocol_.get();
    p->writeMessageBegin(PeerName(spec), T_CALL, op->peer_seqid);
    p->writeStructBegin("args");
    p->writeFieldBegin("ctx", T_STRUCT, 1);
    op->target.context.write(p);
    p->writeFieldEnd();
    if (StringKey(spec)) {
      p->writeFieldBegin("key", T_STRING, 2);
      p->writeBinary(op->string_key);
    } else {
      p->writeFieldBegin("key", T_I64, 2);
      p->writeI64(op->key);
    }
    p->writeFieldEnd();
    if (spec.has_value) {
      p->writeFieldBegin("value", T_STRING, 3);
      p->writeBinary(op->value);
      p->writeFieldEnd();
    }
    p->writeFieldStop();
    p->writeStructEnd();
    p->writeMessageEnd();
  } catch (const std::exception&) {
    return false;  // out of memory
  }
  uint8_t* frame = nullptr;
  uint32_t size = 0;
  out_->getBuffer(&frame, &size);
  PutFrameLength(frame, size - static_cast<uint32_t>(kFrameHeader));
  if (evbuffer_add(conn->output, frame, size) != 0) return false;
  if (conn->pending.empty()) {
    const timeval tv{static_cast<time_t>(timeout_.count() / 1000),
                     static_cast<suseconds_t>(timeout_.count() % 1000 * 1000)};
    event_add(conn->timer, &tv);
  }
  conn->pending.push_back(op);
  ScheduleFlush(conn);
  return true;
}

// A nonblocking connect(): its outcome arrives as the write event (a
// refusal reported at once too, so nothing fails inside Start()).
Forwarder::Conn* Forwarder::Open(Peer* peer) {
  const int fd = socket(peer->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto conn = std::make_unique<Conn>();
  conn->owner = this;
  conn->peer = peer;
  conn->fd = fd;
  conn->read_event = event_new(base_, fd, EV_READ | EV_PERSIST, &Forwarder::OnReadable, conn.get());
  conn->write_event = event_new(base_, fd, EV_WRITE, &Forwarder::OnWritable, conn.get());
  conn->timer = evtimer_new(base_, &Forwarder::OnTimer, conn.get());
  conn->input = evbuffer_new();
  conn->output = evbuffer_new();
  if (conn->read_event == nullptr || conn->write_event == nullptr || conn->timer == nullptr ||
      conn->input == nullptr || conn->output == nullptr ||
      event_add(conn->read_event, nullptr) != 0) {
    Close(conn.release());
    return nullptr;
  }
  if (connect(fd, reinterpret_cast<const sockaddr*>(&peer->addr), peer->addr_len) == 0) {
    if (tls_ == nullptr) {
      conn->connecting = false;
    } else {
      event_active(conn->write_event, EV_WRITE, 0);  // the handshake starts there
    }
  } else if (errno == EINPROGRESS) {
    event_add(conn->write_event, nullptr);
  } else {
    conn->connect_error = errno;
    event_active(conn->write_event, EV_WRITE, 0);
  }
  peer->conns.push_back(conn.get());
  cluster_->CountAsyncConnections(1);
  return conn.release();
}

void Forwarder::ScheduleFlush(Conn* conn) {
  if (conn->dirty) return;
  conn->dirty = true;
  dirty_.push_back(conn);
  if (!flush_scheduled_) {
    flush_scheduled_ = true;
    event_active(flush_event_, EV_TIMEOUT, 0);
  }
}

void Forwarder::OnFlush(int, short, void* arg) {
  auto* self = static_cast<Forwarder*>(arg);
  self->flush_scheduled_ = false;
  // Fail() takes a failed Conn out of dirty_; one made dirty meanwhile is
  // written in this pass too.
  while (!self->dirty_.empty()) {
    Conn* conn = self->dirty_.back();
    self->dirty_.pop_back();
    conn->dirty = false;
    self->Flush(conn);
  }
}

// Writes what the socket takes; the rest waits for the write event.
void Forwarder::Flush(Conn* conn) {
  if (conn->connecting || evbuffer_get_length(conn->output) == 0) return;
  if (conn->ssl != nullptr) {
    FlushTls(conn);
    return;
  }
  const int written = evbuffer_write(conn->output, conn->fd);
  if (written < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    Fail(conn, false, false, std::strerror(errno));
    return;
  }
  if (evbuffer_get_length(conn->output) > 0) event_add(conn->write_event, nullptr);
}

// The connect() finished: true if connected (then the frames queued
// meanwhile are written), else the connection is failed.
bool Forwarder::ConnectDone(Conn* conn) {
  if (conn->ssl != nullptr) return Handshake(conn);
  int err = conn->connect_error;
  socklen_t len = sizeof(err);
  if (err == 0 && getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    Fail(conn, false, true, std::strerror(err));
    return false;
  }
  if (tls_ != nullptr) return StartTls(conn) && Handshake(conn);
  conn->connecting = false;
  return true;
}

namespace {

// OpenSSL's reason for the failure of "rc" on "ssl" (the peer's
// certificate refused, or the error queue's first entry), the queue
// emptied.
std::string TlsFailure(SSL* ssl, int rc) {
  const long verify = SSL_get_verify_result(ssl);
  std::string why;
  if (verify != X509_V_OK) why = X509_verify_cert_error_string(verify);
  if (why.empty()) {
    const unsigned long code = ERR_peek_error();
    char buf[256] = "";
    if (code != 0) ERR_error_string_n(code, buf, sizeof(buf));
    why = code != 0 ? buf : SSL_get_error(ssl, rc) == SSL_ERROR_SYSCALL ? std::strerror(errno)
                                                                      : "connection closed";
  }
  ERR_clear_error();
  return "TLS: " + why;
}

}  // namespace

// The peer's certificate must chain to server.tls_ca_file and name the
// address the ring gives for it (an IP literal: named hosts go through the
// workers' client::Client, which checks the name).
bool Forwarder::StartTls(Conn* conn) {
  conn->ssl = tls_->NewPeerSsl();  // a reloaded certificate from the next connection on
  const std::string& address = conn->peer->address;
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (conn->ssl == nullptr || SSL_set_fd(conn->ssl, conn->fd) != 1 ||
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(conn->ssl), host.c_str()) != 1) {
    ERR_clear_error();
    Fail(conn, false, true, "TLS: cannot start a session");
    return false;
  }
  SSL_set_connect_state(conn->ssl);
  return true;
}

// Called again by the connection's events until done; false until then
// (or after a failure, which failed the connection).
bool Forwarder::Handshake(Conn* conn) {
  const int rc = SSL_do_handshake(conn->ssl);
  if (rc == 1) {
    conn->connecting = false;
    // Done on a read event (the peer's last handshake bytes): the frames
    // queued meanwhile wait for no write event, so they are flushed now.
    if (evbuffer_get_length(conn->output) > 0) ScheduleFlush(conn);
    return true;
  }
  const int err = SSL_get_error(conn->ssl, rc);
  if (err == SSL_ERROR_WANT_READ) return false;  // the read event is registered
  if (err == SSL_ERROR_WANT_WRITE) {
    event_add(conn->write_event, nullptr);
    return false;
  }
  Fail(conn, false, true, TlsFailure(conn->ssl, rc));
  return false;
}

// SSL_write of the output, chunk by chunk; the rest waits for the write
// event. False if the connection failed.
bool Forwarder::FlushTls(Conn* conn) {
  while (evbuffer_get_length(conn->output) > 0) {
    evbuffer_iovec chunk{};
    evbuffer_peek(conn->output, -1, nullptr, &chunk, 1);
    const int n = SSL_write(conn->ssl, chunk.iov_base, static_cast<int>(chunk.iov_len));
    if (n > 0) {
      evbuffer_drain(conn->output, static_cast<size_t>(n));
      continue;
    }
    const int err = SSL_get_error(conn->ssl, n);
    if (err == SSL_ERROR_WANT_WRITE) {
      event_add(conn->write_event, nullptr);
      return true;
    }
    // Wants the peer's bytes first (renegotiation is off; a key update):
    // the next flush, once more frames are queued, retries.
    if (err == SSL_ERROR_WANT_READ) return true;
    Fail(conn, false, false, TlsFailure(conn->ssl, n));
    return false;
  }
  return true;
}

int Forwarder::ReadSome(Conn* conn) {
  if (conn->ssl == nullptr) return evbuffer_read(conn->input, conn->fd, kReadChunk);
  int total = 0;
  for (;;) {
    evbuffer_iovec space{};
    if (evbuffer_reserve_space(conn->input, kReadChunk, &space, 1) < 1) {
      errno = ENOMEM;
      return -1;
    }
    const int n = SSL_read(conn->ssl, space.iov_base,
                           static_cast<int>(std::min<size_t>(space.iov_len, kReadChunk)));
    if (n > 0) {
      space.iov_len = static_cast<size_t>(n);
      evbuffer_commit_space(conn->input, &space, 1);
      total += n;
      continue;
    }
    const int err = SSL_get_error(conn->ssl, n);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      if (total > 0) return total;
      errno = EAGAIN;
      return -1;
    }
    if (total > 0) return total;  // the failure shows on the next read
    if (err == SSL_ERROR_ZERO_RETURN) return 0;
    ERR_clear_error();
    errno = ECONNRESET;
    return -1;
  }
}

void Forwarder::OnWritable(int, short, void* arg) {
  auto* conn = static_cast<Conn*>(arg);
  if (conn->connecting && !conn->owner->ConnectDone(conn)) return;
  conn->owner->Flush(conn);
}

void Forwarder::OnReadable(int, short, void* arg) {
  auto* conn = static_cast<Conn*>(arg);
  if (conn->connecting && !conn->owner->ConnectDone(conn)) return;
  conn->owner->Read(conn);
}

// One read, then every whole answer in the input.
void Forwarder::Read(Conn* conn) {
  const int got = ReadSome(conn);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (got <= 0) {
    Fail(conn, false, false, got == 0 ? "connection closed by the peer" : std::strerror(errno));
    return;
  }
  for (;;) {
    const size_t have = evbuffer_get_length(conn->input);
    if (have < kFrameHeader) return;
    uint8_t head[kFrameHeader];
    evbuffer_copyout(conn->input, head, kFrameHeader);
    const uint32_t len = uint32_t{head[0]} << 24 | uint32_t{head[1]} << 16 |
                         uint32_t{head[2]} << 8 | uint32_t{head[3]};
    if (len == 0 || len > max_answer_) {
      Fail(conn, false, false, "answer frame of " + std::to_string(len) + " bytes");
      return;
    }
    if (have < kFrameHeader + len) return;
    uint8_t* frame = evbuffer_pullup(conn->input, static_cast<ev_ssize_t>(kFrameHeader + len));
    if (frame == nullptr || !Complete(conn, frame + kFrameHeader, len)) {
      Fail(conn, false, false, frame == nullptr ? "out of memory" : "answer out of step");
      return;
    }
  }
}

// Decodes the answer to the oldest call, as the generated recv_peer* would
// (result field 0 or field 1, unknown fields skipped), drains it, then
// answers the client or hands the call to a worker (NOT_OWNER).
bool Forwarder::Complete(Conn* conn, uint8_t* body, uint32_t len) {
  if (conn->pending.empty()) return false;
  Op* op = conn->pending.front();
  const MethodTraits& spec = *op->spec;
  Outcome outcome;
  std::string failure;
  bool in_step = true;
  try {
    in_->resetBuffer(body, len, TMemoryBuffer::OBSERVE);
    TBinaryProtocol* p = in_protocol_.get();
    // A peer's answer is no more trusted than a client's call: no string or
    // list longer than the frame (answers to forwarded calls hold no list
    // of small elements, so this refuses only lengths that lie).
    p->setStringSizeLimit(static_cast<int32_t>(std::min<uint32_t>(len, INT32_MAX)));
    p->setContainerSizeLimit(static_cast<int32_t>(std::min<uint32_t>(len, INT32_MAX)));
    std::string name;
    TMessageType type;
    int32_t seqid = 0;
    p->readMessageBegin(name, type, seqid);
    if (seqid != op->peer_seqid || name != PeerName(spec)) {
      in_step = false;
    } else if (type == T_EXCEPTION) {
      TApplicationException e;
      e.read(p);
      failure = e.what();
    } else if (type != T_REPLY) {
      in_step = false;
    } else {
      std::string ignored;
      TType ftype;
      int16_t fid;
      p->readStructBegin(ignored);
      for (;;) {
        p->readFieldBegin(ignored, ftype, fid);
        if (ftype == T_STOP) break;
        if (fid == 0 && spec.result == ResultKind::kGetResult && ftype == T_STRUCT) {
          outcome.get.read(p);
          outcome.has_success = true;
        } else if (fid == 0 && spec.result == ResultKind::kBool && ftype == T_BOOL) {
          p->readBool(outcome.existed);
          outcome.has_success = true;
        } else if (fid == 1 && ftype == T_STRUCT) {
          outcome.err.read(p);
          outcome.has_err = true;
          // Passed on to the client as the peer said it, unless the code is
          // none this build knows (read as its integer: RawEnum).
          const int64_t code = RawEnum(outcome.err.code);
          if (code < rpc::ErrorCode::KEY_OUT_OF_RANGE || code > rpc::ErrorCode::UNAVAILABLE) {
            outcome.err.code = rpc::ErrorCode::UNAVAILABLE;
            outcome.err.message = "member " + conn->peer->address +
                                  " answered an unknown error code " + std::to_string(code) +
                                  ": " + outcome.err.message;
          }
        } else {
          p->skip(ftype);
        }
        p->readFieldEnd();
      }
      p->readStructEnd();
      p->readMessageEnd();
      if (!outcome.has_err && !outcome.has_success && spec.result != ResultKind::kVoid) {
        failure = std::string(PeerName(spec)) + " failed: unknown result";  // as recv_peer*
      }
    }
  } catch (const std::exception& e) {
    in_step = false;  // a malformed answer: the connection's state is unknown
  }
  in_->readEnd();
  in_->resetBuffer();
  if (!in_step) return false;
  evbuffer_drain(conn->input, kFrameHeader + len);
  conn->pending.pop_front();
  ++conn->completed;
  if (!failure.empty()) {
    FailOp(op, conn->peer->address + ": " + PeerName(spec) + ": " + failure);
  } else if (outcome.has_err && outcome.err.code == rpc::ErrorCode::NOT_OWNER) {
    Redo(op);
  } else {
    Answer(op, outcome);
  }
  return true;
}

// Writes the client method's answer exactly as its generated *_result
// would: "success" if set, else "err" if set (never both).
void Forwarder::Answer(Op* op, const Outcome& outcome) {
  std::unique_ptr<Op> owned(op);
  const MethodTraits& spec = *op->spec;
  handler_->Finish(op->peer ? spec.twin : spec.method, op->start, outcome.has_err);
  Reply* reply = op->reply;
  op->reply = nullptr;
  if (reply == nullptr) return;  // the client went away
  uint8_t* frame = nullptr;
  uint32_t size = 0;
  try {
    out_->resetBuffer();
    out_->getWritePtr(kFrameHeader);
    out_->wroteBytes(kFrameHeader);
    TBinaryProtocol* p = out_protocol_.get();
    p->writeMessageBegin(op->peer ? PeerName(spec) : spec.name, T_REPLY, op->seqid);
    p->writeStructBegin("result");
    if (outcome.has_err) {
      p->writeFieldBegin("err", T_STRUCT, 1);
      outcome.err.write(p);
      p->writeFieldEnd();
    } else if (spec.result == ResultKind::kGetResult) {
      p->writeFieldBegin("success", T_STRUCT, 0);
      outcome.get.write(p);
      p->writeFieldEnd();
    } else if (spec.result == ResultKind::kBool) {
      p->writeFieldBegin("success", T_BOOL, 0);
      p->writeBool(outcome.existed);
      p->writeFieldEnd();
    }
    p->writeFieldStop();
    p->writeStructEnd();
    p->writeMessageEnd();
    out_->getBuffer(&frame, &size);
    PutFrameLength(frame, size - static_cast<uint32_t>(kFrameHeader));
  } catch (const std::exception&) {
    size = 0;
  }
  // Copied before anything else runs on this thread; an empty answer (out
  // of memory) closes the client connection.
  reply->Answer(frame, size);
}

void Forwarder::FailOp(Op* op, const std::string& why, bool sent) {
  cluster_->CountPeerFailure();
  Outcome outcome;
  outcome.has_err = true;
  outcome.err.code = rpc::ErrorCode::UNAVAILABLE;
  outcome.err.message = cluster_->PeerUnanswered(op->target, why, sent).message();
  Answer(op, outcome);
}

// NOT_OWNER: the two rings differ. Re-reading ours blocks (ZooKeeper), so
// the call goes to a worker as the client sent it, where the handler
// re-reads the ring and makes the one retry.
void Forwarder::Redo(Op* op) {
  std::unique_ptr<Op> owned(op);
  const MethodTraits& spec = *op->spec;
  Reply* reply = op->reply;
  op->reply = nullptr;
  if (reply == nullptr) {
    handler_->Finish(spec.method, op->start, true);
    return;
  }
  std::unique_ptr<uint8_t[]> message;
  uint32_t size = 0;
  try {
    out_->resetBuffer();
    TBinaryProtocol* p = out_protocol_.get();
    p->writeMessageBegin(spec.name, T_CALL, op->seqid);
    p->writeStructBegin("args");
    if (StringKey(spec)) {
      p->writeFieldBegin("key", T_STRING, 1);
      p->writeBinary(op->string_key);
    } else {
      p->writeFieldBegin("key", T_I64, 1);
      p->writeI64(op->key);
    }
    p->writeFieldEnd();
    if (spec.has_value) {
      p->writeFieldBegin("value", T_STRING, 2);
      p->writeBinary(op->value);
      p->writeFieldEnd();
    }
    p->writeFieldStop();
    p->writeStructEnd();
    p->writeMessageEnd();
    uint8_t* bytes = nullptr;
    out_->getBuffer(&bytes, &size);
    message.reset(new uint8_t[size]);
    std::memcpy(message.get(), bytes, size);
  } catch (const std::exception&) {
    reply->Answer(nullptr, 0);  // out of memory: closes the client connection
    return;
  }
  const Clock::time_point start = op->start;
  reply->Redo(std::move(message), size, [start](const std::function<void()>& run) {
    Handler::RunAsRetry(start, run);
  });
}

void Forwarder::OnTimer(int, short, void* arg) {
  auto* conn = static_cast<Conn*>(arg);
  conn->owner->Expire(conn);
}

void Forwarder::Expire(Conn* conn) {
  if (conn->pending.empty()) return;
  const Clock::time_point now = Clock::now();
  const Clock::time_point deadline = conn->pending.front()->deadline;
  if (now >= deadline) {
    Fail(conn, true, conn->connecting,
         "no answer within cluster.peer_timeout_ms (" + std::to_string(timeout_.count()) + " ms)");
    return;
  }
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
  const timeval tv{static_cast<time_t>(left.count() / 1000000),
                   static_cast<suseconds_t>(left.count() % 1000000)};
  event_add(conn->timer, &tv);
}

void Forwarder::Fail(Conn* conn, bool timed_out, bool connecting, const std::string& why) {
  Peer* peer = conn->peer;
  std::deque<Op*> ops;
  ops.swap(conn->pending);
  Close(conn);  // out of the peer's connections and of dirty_: nothing reaches it now
  for (Op* op : ops) {
    if (!timed_out && !connecting && op->on_used_conn && op->spec->idempotent &&
        !op->sent_again && op->reply != nullptr) {
      // As client::Client: a call on a connection that had served a call
      // (the peer may have restarted since) is sent once more, fresh.
      op->sent_again = true;
      op->deadline = Clock::now() + timeout_;
      if (Send(peer, op)) continue;
    }
    FailOp(op,
           peer->address + (connecting ? ": cannot connect: "
                                       : std::string(": ") + PeerName(*op->spec) + ": ") +
               why,
           // In doubt if any attempt went out: a call sent again whose fresh
           // connection could not be made was sent once before it.
           /*sent=*/!connecting || op->sent_again);
  }
}

// Frees the connection; its pending calls must have been taken.
void Forwarder::Close(Conn* conn) {
  auto& conns = conn->peer->conns;
  const auto it = std::find(conns.begin(), conns.end(), conn);
  if (it != conns.end()) {
    conns.erase(it);
    cluster_->CountAsyncConnections(-1);
  }
  if (conn->dirty) dirty_.erase(std::find(dirty_.begin(), dirty_.end(), conn));
  if (conn->read_event != nullptr) event_free(conn->read_event);
  if (conn->write_event != nullptr) event_free(conn->write_event);
  if (conn->timer != nullptr) event_free(conn->timer);
  if (conn->input != nullptr) evbuffer_free(conn->input);
  if (conn->output != nullptr) evbuffer_free(conn->output);
  if (conn->ssl != nullptr) SSL_free(conn->ssl);
  if (conn->fd >= 0) close(conn->fd);
  delete conn;
}

}  // namespace flatkv::server
