// Implementation notes.
//
// Each IoThread owns an event_base, a listener, a wake-up pipe and the
// Connections it accepted. A Connection is a bufferevent (its buffers, and
// libevent's writing of answers the socket could not take at once) plus a
// read event of our own: the bufferevent's reading would ask the kernel
// for FIONREAD before each read, one system call more per call. OnReadable
// reads with one recv() straight into space reserved at the end of the
// input (evbuffer_reserve_space: 16 KiB, or what a large partial frame
// still lacks, so one read takes every frame a client has sent, and a
// request is never copied on its way to the decoder), answers every
// complete frame into the output, then writes the output to the socket
// itself (evbuffer_write: one writev for all the answers). Only if the socket does not
// take it all is the bufferevent's EV_WRITE enabled, and OnWrite disables
// it again once the output drained, so a connection whose answers fit the
// socket buffer never changes its epoll registration: a call costs an
// epoll_wait (shared by the connections ready at once), a recv and a
// write. Libevent is used without evthread_use_pthreads(): nothing of a base
// is touched from another thread except through the pipe, whose callback
// runs on the base's own thread (as in http.cc).
//
// Offload: ServeFrames() copies a frame the OffloadFn picks into a Call,
// marks its Connection busy (its read event deleted, so neither read nor
// served) and queues the Call for the WorkerPool. A worker runs it with its
// own Caller (buffers and protocols, like each I/O thread's), stores the
// answer bytes in the Call and hands it to the Connection's I/O thread:
// a queue under answered_mu_ plus one kAnswered message in the wake-up pipe
// (written only when the queue was empty, so the pipe never fills with
// them). Resume() then appends the answer to the output, adds the read event
// again and serves the rest of the input. Queues are lists linked through
// Call::next, so handing a call over allocates nothing and cannot fail.
// Close() of a busy Connection frees its socket and events but not the
// Connection: the Call still points to it. Resume() frees it then; Free()
// frees what Stop() left (workers joined by then, so nothing points to it).
// The worker only reads and writes its Call, never the Connection.
//
// Asynchronous calls: ServeFrames() offers each frame to the thread's
// AsyncCalls first. On kTaken the Connection is marked waiting and the
// frame drained; the loop stops serving it (later frames stay in the input)
// but its read event stays registered: a client with one call in flight
// sends nothing meanwhile, so keeping it costs nothing, and deleting and
// adding it again would cost two epoll_ctl per call. A pipelining client
// may fill the input up to one frame; Read() then deletes the read event
// (stalled) until the answer. The AsyncCalls answers through the
// Connection (its Reply): AsyncAnswered() appends the answer, re-adds a
// stalled read event and serves the rest of the input, like Resume(). Or it
// hands the call back (AsyncRedo()): a Call with a copy of the message and
// a wrapper the worker runs it in, exactly as an offloaded call. Close() of
// a waiting Connection cancels its call (AsyncCalls::Cancel()) and frees
// the Connection at once: the AsyncCalls forgets the Reply. Free() destroys
// the AsyncCalls before the Connections, so it never calls a freed Reply.
//
// TLS (SetTls()): a connection also holds an OpenSSL session on its socket
// (SSL_set_fd) and a write event. Its read event runs the handshake (with
// a kHandshakeSeconds timeout until it completes), then SSL_read straight
// into the input, like Read(); Flush() writes the output with SSL_write, a
// record per call, and only a session that wants the socket writable adds
// the write event. So a TLS call costs the system calls of a plaintext one:
// no extra read to find the socket drained, no epoll_ctl to enable or
// disable writing. A session reads ahead: what it holds decrypted or
// undecrypted is not in the socket, so whenever reading stops with bytes
// still held (SSL_has_pending), the read event is made active by hand. A
// connection whose handshake fails (a plaintext client, a certificate
// refused either way) or does not finish in time is closed and counted;
// nothing is served to it.
//
// Stop() order: every thread frees its listener and breaks its loop from
// the wake-up callback, so no connection is accepted after Stop() began and
// no inline call is half-answered (they run inline in OnReadable); then the
// I/O threads are joined, then the workers (their calls running finish, the
// answers wait in the I/O threads' queues; queued calls are dropped), and
// the connections, calls, listeners and bases are freed on the caller's
// thread, which is safe because every other thread has ended.
#include "server/event_server.h"
#include "server/event_server_internal.h"
#include "server/tls.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

namespace flatkv::server {


namespace {

using event_io::kFrameHeader;
using event_io::kHandshakeSeconds;
using event_io::kMaxSingleRead;
using event_io::kReadChunk;

constexpr int kBacklog = 1024;

Status Resolve(const std::string& host, int port, sockaddr_storage* addr, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::IOError(host + ": cannot resolve: " + gai_strerror(rc));
  }
  std::memcpy(addr, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  freeaddrinfo(found);
  return Status::OK();
}

void SetPort(sockaddr_storage* addr, int port) {
  if (addr->ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(static_cast<uint16_t>(port));
  }
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

// A socket bound to "addr": with SO_REUSEPORT and listening for a server
// socket, without both for the probe that claims the port (see Listen()).
Status BindSocket(const sockaddr_storage& addr, socklen_t len, bool serve, int* fd) {
  *fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (*fd < 0 || setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      (serve && setsockopt(*fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) ||
      bind(*fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      (serve && listen(*fd, kBacklog) != 0)) {
    const int err = errno;
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return Status::FromErrno("bind", err);
  }
  return Status::OK();
}

}  // namespace


Status EventServer::IoThread::Init(int fd) {
  base_ = event_base_new();
  if (base_ == nullptr || pipe2(wake_fds_, O_NONBLOCK | O_CLOEXEC) != 0) {
    close(fd);
    return Status::IOError("cannot create an event loop");
  }
  wakeup_ = event_new(base_, wake_fds_[0], EV_READ | EV_PERSIST, &IoThread::OnWakeup, this);
  round_end_ = event_new(base_, -1, 0, &IoThread::OnRoundEnd, this);
  if (server_->async_factory_) async_ = server_->async_factory_(base_);
  // -1: the socket already listens.
  listener_ = evconnlistener_new(base_, &IoThread::OnAccept, this, LEV_OPT_CLOSE_ON_FREE, -1, fd);
  if (listener_ == nullptr) close(fd);
  if (wakeup_ == nullptr || round_end_ == nullptr || event_add(wakeup_, nullptr) != 0 ||
      listener_ == nullptr) {
    return Status::IOError("cannot create an event loop");
  }
  return Status::OK();
}

Status EventServer::IoThread::Start() {
  try {
    thread_ = std::thread([this] {
      current = this;
      event_base_dispatch(base_);
      current = nullptr;
    });
  } catch (const std::system_error& e) {
    return Status::IOError(std::string("cannot start an I/O thread: ") + e.what());
  }
  return Status::OK();
}

thread_local EventServer::IoThread* EventServer::IoThread::current = nullptr;

bool EventServer::IoThread::AtRoundEnd(std::function<void()> fn) {
  at_round_end_.push_back(std::move(fn));
  if (at_round_end_.size() == 1) event_active(round_end_, EV_TIMEOUT, 0);
  return true;
}

void EventServer::IoThread::OnRoundEnd(evutil_socket_t, short, void* arg) {
  auto* self = static_cast<IoThread*>(arg);
  std::vector<std::function<void()>> run;
  run.swap(self->at_round_end_);
  for (auto& fn : run) fn();
}

bool EventServer::AtRoundEnd(std::function<void()> fn) {
  IoThread* io = IoThread::current;
  return io != nullptr && io->AtRoundEnd(std::move(fn));
}

// A write of 4 bytes to a pipe is atomic: messages from several threads
// never interleave.
bool EventServer::IoThread::Post(int message) {
  ssize_t n;
  while ((n = write(wake_fds_[1], &message, sizeof(message))) < 0 && errno == EINTR) {
  }
  return n == static_cast<ssize_t>(sizeof(message));
}

// Serves (or, once stopped, closes) the sockets handed over; kStop frees
// the listener and breaks the loop; then, unless stopped, takes the calls
// the workers answered.
void EventServer::IoThread::DrainPipe(bool stopped) {
  int message;
  while (read(wake_fds_[0], &message, sizeof(message)) == static_cast<ssize_t>(sizeof(message))) {
    if (message == kAnswered) {
      continue;  // taken below
    } else if (message != kStop && !stopped) {
      Adopt(message);
    } else if (message != kStop) {
      close(message);
      server_->open_.fetch_sub(1, std::memory_order_relaxed);
    } else {
      if (listener_ != nullptr) evconnlistener_free(listener_);  // stop accepting first
      listener_ = nullptr;
      event_base_loopbreak(base_);
      stopped = true;
    }
  }
  // Also when no kAnswered came: a worker that found the pipe full did not
  // write one (the full pipe brought us here anyway).
  if (!stopped) TakeAnswers();
}

void EventServer::IoThread::Answered(Call* call) {
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(answered_mu_);
    answered_.Push(call);
    post = !answered_posted_;
    answered_posted_ = true;
  }
  // If the pipe is full, its reader runs soon and takes the call anyway.
  if (post) Post(kAnswered);
}

void EventServer::IoThread::TakeAnswers() {
  event_io::Fifo<Call> calls;
  {
    std::lock_guard<std::mutex> lock(answered_mu_);
    calls.Swap(answered_);
    answered_posted_ = false;
  }
  while (Call* call = calls.Pop()) Resume(std::unique_ptr<Call>(call));
}

void EventServer::IoThread::Free() {
  if (wake_fds_[0] >= 0) DrainPipe(true);  // sockets handed over too late
  // Drops the calls it holds without answering them: their connections
  // are freed below.
  async_.reset();
  {
    // The workers are joined (Stop()): nothing points to a Connection any
    // more, busy or not, and the answers left are dropped.
    std::lock_guard<std::mutex> lock(answered_mu_);
    answered_.DeleteAll();
  }
  for (Connection* conn : connections_) {
    if (conn->bev != nullptr) Disconnect(conn);
    delete conn;
  }
  connections_.clear();
  if (listener_ != nullptr) evconnlistener_free(listener_);
  if (wakeup_ != nullptr) event_free(wakeup_);
  if (round_end_ != nullptr) event_free(round_end_);
  if (base_ != nullptr) event_base_free(base_);
  for (int& fd : wake_fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  listener_ = nullptr;
  wakeup_ = nullptr;
  base_ = nullptr;
}

void EventServer::IoThread::OnWakeup(evutil_socket_t, short, void* arg) {
  static_cast<IoThread*>(arg)->DrainPipe(false);
}

void EventServer::IoThread::OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr*, int,
                                     void* arg) {
  static_cast<IoThread*>(arg)->Accept(fd);
}

// Counts the connection against server.max_connections over all threads
// before serving it: past the limit it is closed at once. The connection
// goes to the thread serving the fewest: SO_REUSEPORT spreads connections
// by a hash of their addresses, which left 50 connections split as unevenly
// as 30/20 and the busier thread's clients waiting longer.
void EventServer::IoThread::Accept(evutil_socket_t fd) {
  const int64_t limit = server_->config_.server.max_connections;
  if (server_->open_.fetch_add(1, std::memory_order_relaxed) >= limit) {
    server_->open_.fetch_sub(1, std::memory_order_relaxed);
    close(fd);
    WarnRateLimited("connection refused: server.max_connections (" + std::to_string(limit) +
                    ") reached");
    return;
  }
  IoThread* target = this;
  for (auto& io : server_->threads_) {
    if (io->load() < target->load()) target = io.get();
  }
  if (target == this || !target->Post(fd)) Adopt(fd);
}

void EventServer::IoThread::Adopt(evutil_socket_t fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  bufferevent* bev = bufferevent_socket_new(base_, fd, BEV_OPT_CLOSE_ON_FREE);
  Connection* conn = bev != nullptr ? new (std::nothrow) Connection(this, bev) : nullptr;
  if (conn != nullptr) {
    conn->read_event = event_new(base_, fd, EV_READ | EV_PERSIST, &IoThread::OnReadable, conn);
  }
  // A TLS client has kHandshakeSeconds to finish its handshake: the read
  // event's timeout until then.
  const timeval handshake{kHandshakeSeconds, 0};
  const bool tls = server_->tls_ != nullptr;
  if (conn == nullptr || conn->read_event == nullptr || (tls && !StartTls(conn, fd)) ||
      event_add(conn->read_event, tls ? &handshake : nullptr) != 0) {
    if (conn != nullptr) {
      if (conn->read_event != nullptr) event_free(conn->read_event);
      if (conn->write_event != nullptr) event_free(conn->write_event);
      if (conn->ssl != nullptr) SSL_free(conn->ssl);
      delete conn;
    }
    if (bev != nullptr) bufferevent_free(bev);
    else close(fd);
    server_->open_.fetch_sub(1, std::memory_order_relaxed);
    spdlog::error("cannot serve a connection: out of memory");
    return;
  }
  connections_.insert(conn);
  load_.fetch_add(1, std::memory_order_relaxed);
  server_->accepted_.fetch_add(1, std::memory_order_relaxed);
  bufferevent_setcb(bev, nullptr, &IoThread::OnWrite, &IoThread::OnEvent, conn);
  bufferevent_disable(bev, EV_READ | EV_WRITE);
}

void EventServer::IoThread::StopReading(Connection* conn) { event_del(conn->read_event); }

// Bytes a TLS session read ahead and holds are not in the socket: epoll
// would not report them, so the read event is made active for them.
bool EventServer::IoThread::ResumeReading(Connection* conn) {
  if (event_add(conn->read_event, nullptr) != 0) return false;
  if (conn->ssl != nullptr && SSL_has_pending(conn->ssl) != 0) {
    event_active(conn->read_event, EV_READ, 1);
  }
  return true;
}

void EventServer::IoThread::OnReadable(evutil_socket_t fd, short what, void* arg) {
  auto* conn = static_cast<Connection*>(arg);
  if (conn->ssl != nullptr) return conn->io->TlsReadable(conn, (what & EV_TIMEOUT) != 0);
  conn->io->Read(conn, fd);
}

// One recv(), at most up to one largest frame plus its header buffered,
// straight into the input's own memory (no copy of the request between
// the socket and the frame the call is decoded from); end of stream or an
// error closes the connection.
void EventServer::IoThread::Read(Connection* conn, evutil_socket_t fd) {
  evbuffer* input = bufferevent_get_input(conn->bev);
  const size_t have = evbuffer_get_length(input);
  const size_t room = max_frame_ + kFrameHeader - have;
  // A full input holds a complete frame, answered (and drained) before the
  // connection reads again; only a connection waiting for its call's
  // answer gets here with no room: it stops reading until the answer.
  if (room == 0) {
    conn->stalled = true;
    event_del(conn->read_event);
    return;
  }
  // A socket bufferevent keeps its input's end frozen outside its own read
  // callback; thawed here for this one read on the same thread.
  evbuffer_unfreeze(input, 0);
  evbuffer_iovec space;
  const size_t want = std::min(room, ReadSize(input, have));
  const bool reserved = evbuffer_reserve_space(input, static_cast<ev_ssize_t>(want), &space, 1) == 1;
  ssize_t got = -1;
  int err = ENOMEM;
  if (reserved) {
    got = recv(fd, space.iov_base, std::min(want, space.iov_len), 0);
    err = errno;
    space.iov_len = got > 0 ? static_cast<size_t>(got) : 0;
    if (got > 0 && evbuffer_commit_space(input, &space, 1) != 0) {
      got = -1;
      err = ENOMEM;
    }
  }
  evbuffer_freeze(input, 0);
  if (got < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) return;
  if (got <= 0) {
    Close(conn);  // end of stream, a reset, or out of memory
    return;
  }
  ServeFrames(conn);
}

// How much the next read asks for: what the partial frame at the front of
// the input still lacks when that is more than kReadChunk (a large frame
// arrives in few reads), else kReadChunk (a few small frames, pipelined
// ones too, per read; a chunk this size comes from the allocator's
// thread cache), never more than kMaxSingleRead.
size_t EventServer::IoThread::ReadSize(evbuffer* input, size_t have) {
  size_t want = kReadChunk;
  if (have >= kFrameHeader) {
    uint8_t head[kFrameHeader];
    evbuffer_copyout(input, head, kFrameHeader);
    const uint64_t len = uint64_t{head[0]} << 24 | uint64_t{head[1]} << 16 |
                         uint64_t{head[2]} << 8 | uint64_t{head[3]};
    if (kFrameHeader + len > have) want = std::max<uint64_t>(want, kFrameHeader + len - have);
  }
  return std::min(want, kMaxSingleRead);
}

// Libevent wrote the last pending answer: back to reading only, and serve
// the frames that arrived while the connection was paused.
void EventServer::IoThread::OnWrite(bufferevent* bev, void* arg) {
  auto* conn = static_cast<Connection*>(arg);
  bufferevent_disable(bev, EV_WRITE);
  if (conn->paused) {
    conn->paused = false;
    if (!conn->io->ResumeReading(conn)) {
      conn->io->Close(conn);
      return;
    }
    conn->io->ServeFrames(conn);
  }
}

// Libevent could not write pending answers (the client reset or went
// away); end of stream itself shows up in Read().
void EventServer::IoThread::OnEvent(bufferevent*, short what, void* arg) {
  auto* conn = static_cast<Connection*>(arg);
  if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) != 0) conn->io->Close(conn);
}

// Answers every complete frame in the input, then writes the answers; a
// frame for a worker stops the serving until its answer is back. A frame
// length out of bounds or a call that cannot be answered closes the
// connection (conn is gone when this returns then).
void EventServer::IoThread::ServeFrames(Connection* conn) {
  evbuffer* input = bufferevent_get_input(conn->bev);
  evbuffer* output = bufferevent_get_output(conn->bev);
  while (!conn->busy && !conn->waiting) {
    // A client that sends calls without reading the answers: stop reading
    // it until they are written.
    if (evbuffer_get_length(output) > max_frame_) {
      if (!Flush(conn)) return;
      if (evbuffer_get_length(output) > max_frame_) {
        conn->paused = true;
        StopReading(conn);
        return;
      }
    }
    const size_t have = evbuffer_get_length(input);
    if (have < kFrameHeader) break;
    uint8_t head[kFrameHeader];
    evbuffer_copyout(input, head, kFrameHeader);
    const int32_t len = static_cast<int32_t>(uint32_t{head[0]} << 24 | uint32_t{head[1]} << 16 |
                                             uint32_t{head[2]} << 8 | uint32_t{head[3]});
    if (len <= 0 || static_cast<uint64_t>(len) > max_frame_) {
      ProtocolError(conn, "frame size " + std::to_string(len) + " out of range (1 to " +
                              "server.max_frame_bytes = " + std::to_string(max_frame_) +
                              "); client not using framed transport?");
      return;
    }
    const size_t total = kFrameHeader + static_cast<size_t>(len);
    if (have < total) break;  // a partial frame waits for the rest
    uint8_t* frame = evbuffer_pullup(input, static_cast<ev_ssize_t>(total));
    if (frame == nullptr) {
      ProtocolError(conn, "a call could not be answered; connection closed");
      return;
    }
    uint8_t* message = frame + kFrameHeader;
    const auto size = static_cast<uint32_t>(len);
    AsyncCalls::Decision decision = AsyncCalls::Decision::kNotTaken;
    if (async_ != nullptr) decision = async_->Start(message, size, conn, &conn->ticket);
    if (decision == AsyncCalls::Decision::kTaken) {
      conn->waiting = true;  // ends the loop: answered in AsyncAnswered()
      server_->async_taken_.fetch_add(1, std::memory_order_relaxed);
    } else if (decision == AsyncCalls::Decision::kNotTaken && WantsWorker(message, size)) {
      if (!Offload(conn, message, size)) {
        spdlog::error("cannot hand a call to a worker: out of memory; connection closed");
        Close(conn);
        return;
      }
    } else {
      bool redo = false;
      if (!Answer(message, size, output, &redo)) {
        ProtocolError(conn, "a call could not be answered; connection closed");
        return;
      }
      if (redo && !Offload(conn, message, size)) {
        spdlog::error("cannot hand a call to a worker: out of memory; connection closed");
        Close(conn);
        return;
      }
    }
    evbuffer_drain(input, total);
  }
  Flush(conn);
}

// Writes what the socket takes now; the rest waits for EV_WRITE. False if
// the connection failed (it is closed then).
bool EventServer::IoThread::Flush(Connection* conn) {
  if (conn->ssl != nullptr) return TlsFlush(conn);
  evbuffer* output = bufferevent_get_output(conn->bev);
  if (evbuffer_get_length(output) == 0) return true;
  // A socket bufferevent keeps its output's start frozen outside its own
  // write callback; thawed here for this one write on the same thread.
  evbuffer_unfreeze(output, 1);
  const int written = evbuffer_write(output, bufferevent_getfd(conn->bev));
  const int err = errno;
  evbuffer_freeze(output, 1);
  if (written < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
    Close(conn);
    return false;
  }
  if (evbuffer_get_length(output) > 0) bufferevent_enable(conn->bev, EV_WRITE);
  return true;
}

void EventServer::IoThread::ProtocolError(Connection* conn, const std::string& what) {
  server_->protocol_errors_.fetch_add(1, std::memory_order_relaxed);
  WarnRateLimited(what);
  Close(conn);
}

void EventServer::IoThread::Close(Connection* conn) {
  if (conn->waiting) {  // its call is dropped: nothing will answer it
    conn->waiting = false;
    async_->Cancel(conn->ticket);
    conn->ticket = nullptr;
  }
  Disconnect(conn);
  // A call on a worker still points to a busy connection: it is freed when
  // the call comes back (Resume()) or by Free().
  if (conn->busy) return;
  connections_.erase(conn);
  delete conn;
}

// Closes the socket and frees the events; the Connection stays.
void EventServer::IoThread::Disconnect(Connection* conn) {
  load_.fetch_sub(1, std::memory_order_relaxed);
  if (conn->read_event != nullptr) event_free(conn->read_event);
  if (conn->write_event != nullptr) event_free(conn->write_event);
  if (conn->ssl != nullptr) SSL_free(conn->ssl);  // the socket is not its to close
  bufferevent_free(conn->bev);  // closes the socket
  conn->read_event = nullptr;
  conn->write_event = nullptr;
  conn->ssl = nullptr;
  conn->bev = nullptr;
  server_->open_.fetch_sub(1, std::memory_order_relaxed);
}

EventServer::EventServer(std::shared_ptr<apache::thrift::TProcessor> processor,
                         const Config& config)
    : processor_(std::move(processor)), config_(config) {}

EventServer::~EventServer() { Stop(); }

void EventServer::SetOffload(OffloadFn fn, int workers) {
  const bool on = fn != nullptr && workers >= 1;
  offload_ = on ? std::move(fn) : nullptr;
  offload_workers_ = on ? workers : 0;
}

Status EventServer::Start() {
  event_set_log_callback([](int severity, const char* message) {
    if (severity == EVENT_LOG_ERR) spdlog::error("libevent: {}", message);
  });
  Status st = Listen();
  if (st.ok() && offload_) {  // before the I/O threads hand calls to it
    workers_ = std::make_unique<WorkerPool>(this);
    st = workers_->Start(offload_workers_);
  }
  for (size_t i = 0; st.ok() && i < threads_.size(); ++i) st = threads_[i]->Start();
  if (!st.ok()) Stop();
  return st;
}

// A probe socket without SO_REUSEPORT claims the port first: it fails if
// anything listens there (another server with SO_REUSEPORT would otherwise
// silently share the port), and picks the port when server.port is 0. It
// is closed just before the serving sockets bind the same port.
Status EventServer::Listen() {
  const std::string address = config_.server.host + ":" + std::to_string(config_.server.port);
  sockaddr_storage addr{};
  socklen_t len = 0;
  FLATKV_RETURN_IF_ERROR(Resolve(config_.server.host, config_.server.port, &addr, &len));
  int probe = -1;
  Status st = BindSocket(addr, len, false, &probe);
  if (!st.ok()) return Status::IOError(address + ": " + st.message());
  port_ = BoundPort(probe);
  SetPort(&addr, port_);
  close(probe);
  for (int i = 0; i < config_.server.io_threads; ++i) {
    int fd = -1;
    st = BindSocket(addr, len, true, &fd);
    if (!st.ok()) return Status::IOError(address + ": " + st.message());
    threads_.push_back(std::make_unique<IoThread>(this));
    st = threads_.back()->Init(fd);
    if (!st.ok()) return Status::IOError(address + ": " + st.message());
  }
  return Status::OK();
}

void EventServer::Stop() {
  for (auto& io : threads_) io->Wake();
  for (auto& io : threads_) io->Join();
  // The calls running finish first; their answers wait in the I/O threads'
  // queues, which the IoThreads drop with the connections below.
  if (workers_ != nullptr) workers_->Stop();
  workers_.reset();
  threads_.clear();  // frees connections, listeners and bases
}

void WarnRateLimited(const std::string& what) {
  static std::atomic<int64_t> last_log_second{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (last_log_second.exchange(now) != now) spdlog::warn("{}", what);
}

}  // namespace flatkv::server
