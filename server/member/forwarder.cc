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
#include "server/member/forwarder_internal.h"
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
using apache::thrift::protocol::T_CALL;
using apache::thrift::protocol::T_I64;
using apache::thrift::protocol::T_STRING;
using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;
using Clock = std::chrono::steady_clock;
using forwarder_io::kDeepPipeline;
using forwarder_io::kFrameHeader;
using forwarder_io::kMaxConnectionsPerPeer;
using forwarder_io::kReadChunk;
using forwarder_io::PeerName;
using forwarder_io::StringKey;

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

// Sends op's peer call on the least loaded connection.
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
  op->peer_seqid = conn->next_seqid++;
  op->on_used_conn = conn->completed > 0;
  uint8_t* frame = nullptr;
  uint32_t size = 0;
  if (!EncodePeerCall(*op, op->peer_seqid, &frame, &size)) return false;
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
