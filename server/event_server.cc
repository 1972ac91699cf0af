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
#include "server/thrift_limits.h"
#include "server/tls.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
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
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

namespace flatkv::server {

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;

namespace {

constexpr int kBacklog = 1024;
constexpr size_t kFrameHeader = 4;
constexpr size_t kMaxSingleRead = 64 << 10;  // the most one recv() asks for
constexpr size_t kReadChunk = 16 << 10;      // what it asks for between large frames
// The per-thread answer buffer is reused; one grown past this by a large
// answer is replaced after that call, so memory follows the calls in flight.
constexpr uint32_t kAnswerKeep = 64 << 10;
constexpr uint32_t kAnswerInitial = 4 << 10;
// A TLS client that has not finished its handshake by then is closed.
constexpr int kHandshakeSeconds = 10;

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

// Decodes calls from, and encodes answers into, buffers reused call after
// call: one per thread that runs calls (each I/O thread and each worker).
class Caller {
 public:
  // Runs one call of "processor" on the "len" bytes at "message" (which
  // must stay put until Run() returns). On success, *answer and *size hold
  // the answer with its frame header filled in (size 0: a oneway call has
  // no answer), valid until the next Run() or Trim(). False if the processor
  // threw or gave up.
  bool Run(apache::thrift::TProcessor* processor, uint8_t* message, uint32_t len,
           uint8_t** answer, uint32_t* size);
  // Replaces an answer buffer grown past kAnswerKeep by a large answer.
  void Trim();

 private:
  std::shared_ptr<TMemoryBuffer> in_ = std::make_shared<TMemoryBuffer>();
  std::shared_ptr<TMemoryBuffer> out_ = std::make_shared<TMemoryBuffer>(kAnswerInitial);
  std::shared_ptr<TBinaryProtocol> in_protocol_ = std::make_shared<TBinaryProtocol>(in_);
  std::shared_ptr<TBinaryProtocol> out_protocol_ = std::make_shared<TBinaryProtocol>(out_);
};

bool Caller::Run(apache::thrift::TProcessor* processor, uint8_t* message, uint32_t len,
                 uint8_t** answer, uint32_t* size) {
  bool ok = false;
  try {
    in_->resetBuffer(message, len, TMemoryBuffer::OBSERVE);
    LimitToMessage(in_protocol_.get(), len);  // lengths that lie are refused unallocated
    out_->resetBuffer();
    out_->getWritePtr(kFrameHeader);
    out_->wroteBytes(kFrameHeader);  // the length, filled in below
    ok = processor->process(in_protocol_, out_protocol_, nullptr);
    in_->readEnd();  // resets the bytes counted against the message size limit
    in_->resetBuffer();
  } catch (const std::exception& e) {
    WarnRateLimited(std::string("call failed: ") + e.what());
    return false;
  } catch (...) {
    return false;
  }
  if (!ok) return false;
  uint32_t written = 0;
  out_->getBuffer(answer, &written);
  *size = 0;
  if (written > kFrameHeader) {
    const uint32_t body = written - kFrameHeader;
    (*answer)[0] = static_cast<uint8_t>(body >> 24);
    (*answer)[1] = static_cast<uint8_t>(body >> 16);
    (*answer)[2] = static_cast<uint8_t>(body >> 8);
    (*answer)[3] = static_cast<uint8_t>(body);
    *size = written;
  }
  return true;
}

void Caller::Trim() {
  if (out_->getBufferSize() <= kAnswerKeep) return;
  try {
    out_->resetBuffer(kAnswerInitial);
  } catch (const std::exception&) {
    // keeps the large buffer; a later call tries again
  }
}

// A FIFO of T linked through T::next: pushing allocates nothing, so handing
// a call between threads cannot fail. Not thread-safe by itself.
template <typename T>
class Fifo {
 public:
  bool empty() const { return head_ == nullptr; }
  void Push(T* item) {
    item->next = nullptr;
    (tail_ != nullptr ? tail_->next : head_) = item;
    tail_ = item;
  }
  T* Pop() {
    T* item = head_;
    if (item != nullptr) head_ = item->next;
    if (head_ == nullptr) tail_ = nullptr;
    return item;
  }
  void DeleteAll() {
    while (T* item = Pop()) delete item;
  }
  void Swap(Fifo& other) {
    std::swap(head_, other.head_);
    std::swap(tail_, other.tail_);
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
};

}  // namespace

// A client connection: a bufferevent (its buffers, and libevent's writing
// of answers the socket could not take at once) plus our own read event.
// Touched only by its I/O thread. It is the Reply of its call taken by the
// thread's AsyncCalls.
struct EventServer::Connection final : public AsyncCalls::Reply {
  Connection(IoThread* thread, bufferevent* b) : io(thread), bev(b) {}
  void Answer(const uint8_t* frame, size_t len) override;
  void Redo(std::unique_ptr<uint8_t[]> message, uint32_t len,
            std::function<void(const std::function<void()>&)> wrap) override;

  IoThread* io;
  bufferevent* bev;              // EV_READ never enabled (read_event reads); null once closed
  event* read_event = nullptr;   // null once closed
  // TLS (SetTls()): the session on the socket, and the write event its
  // SSL_ERROR_WANT_WRITE waits for (bev's own writing would send plaintext).
  SSL* ssl = nullptr;
  event* write_event = nullptr;
  bool handshaken = false;        // ssl: the handshake completed
  bool read_wants_write = false;  // ssl: SSL_read waits for the socket to take bytes
  bool write_wants_read = false;  // ssl: SSL_write waits for bytes from the client
  bool paused = false;   // input not read until the pending answers are written
  bool busy = false;     // a call is on a worker: input neither read nor served
  bool waiting = false;  // a call is with the AsyncCalls: input read (one frame at most), not served
  bool stalled = false;  // waiting with a full input: read_event deleted until the answer
  void* ticket = nullptr;  // the waiting call's, for AsyncCalls::Cancel()
};

// A call handed to a worker and, once run, its answer handed back. Owned by
// the list or the thread holding it: the pool's queue, a worker, then the
// I/O thread's answered list. The worker touches only message, answer and ok.
struct EventServer::Call {
  IoThread* io = nullptr;
  Connection* conn = nullptr;           // touched only by the I/O thread
  std::unique_ptr<uint8_t[]> message;   // a copy of the frame's body
  uint32_t len = 0;
  std::vector<uint8_t> answer;          // with its frame header; empty: oneway
  bool ok = false;                      // false: close the connection
  // Set by Reply::Redo(): the worker runs the call inside it.
  std::function<void(const std::function<void()>&)> wrap;
  Call* next = nullptr;                 // in a Fifo
};

// The workers of SetOffload(): a fixed set of threads taking Calls off one
// queue, each with its own Caller; a worker hands each call back, answered,
// to its I/O thread (IoThread::Answered()).
class EventServer::WorkerPool {
 public:
  explicit WorkerPool(EventServer* server) : server_(server) {}
  ~WorkerPool() { Stop(); }

  // Starts "workers" threads. IOError if one cannot be started (the others
  // are stopped by Stop()).
  Status Start(int workers);
  // From an I/O thread: queues "call" (taken) for the next free worker.
  void Submit(Call* call);
  // Waits for the calls being run (their answers go to their I/O threads),
  // joins the workers and deletes the calls still queued. Idempotent.
  void Stop();

 private:
  void Run(Caller* caller);

  EventServer* const server_;
  std::mutex mu_;
  std::condition_variable ready_;
  Fifo<Call> queue_;       // GUARDED_BY(mu_)
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<Caller>> callers_;
  std::vector<std::thread> threads_;
};

Status EventServer::WorkerPool::Start(int workers) {
  try {
    for (int i = 0; i < workers; ++i) {
      callers_.push_back(std::make_unique<Caller>());
      threads_.emplace_back([this, caller = callers_.back().get()] { Run(caller); });
    }
  } catch (const std::exception& e) {
    return Status::IOError(std::string("cannot start a worker: ") + e.what());
  }
  return Status::OK();
}

void EventServer::WorkerPool::Submit(Call* call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.Push(call);
  }
  ready_.notify_one();
}

void EventServer::WorkerPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.DeleteAll();  // their connections are closed by IoThread::Free()
}

// One I/O thread: its base, listener, wake-up pipe, connections, and the
// reused buffers and protocols calls are decoded from and answered into.
// Everything here is touched only by the thread itself, except Init() and
// Start() (before the thread runs), Free() (after it and the workers were
// joined), and Post(), Wake(), Answered() and load(), which any thread may
// call.
class EventServer::IoThread {
 public:
  explicit IoThread(EventServer* server) : server_(server) {}
  ~IoThread() { Free(); }

  // Creates the base, the wake-up pipe and a listener on "fd" (taken).
  Status Init(int fd);
  Status Start();
  // From any thread: makes the loop free its listener and return.
  void Wake() { Post(kStop); }
  // From any thread: hands an accepted socket to this thread. False if
  // the pipe is full (the caller serves it itself).
  bool Post(int message);
  // From a worker: hands back "call" (taken), answered; this thread then
  // writes the answer and serves its connection again (Resume()).
  void Answered(Call* call);
  // On this thread: the AsyncCalls answered the waiting call of "conn", or
  // handed it back for a worker (Connection's Reply methods).
  void AsyncAnswered(Connection* conn, const uint8_t* frame, size_t len);
  void AsyncRedo(Connection* conn, std::unique_ptr<uint8_t[]> message, uint32_t len,
                 std::function<void(const std::function<void()>&)> wrap);
  // Connections served by this thread now (read by the other threads).
  int load() const { return load_.load(std::memory_order_relaxed); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // Closes every connection, drops the answered calls and frees the base
  // (thread and workers not running).
  void Free();

 private:

  static void OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg);
  static void OnWakeup(evutil_socket_t, short, void* arg);
  static void OnReadable(evutil_socket_t fd, short what, void* arg);
  static void OnTlsWritable(evutil_socket_t fd, short, void* arg);
  static void OnWrite(bufferevent*, void* arg);
  static void OnEvent(bufferevent*, short what, void* arg);

  void Accept(evutil_socket_t fd);
  void Adopt(evutil_socket_t fd);
  // Makes "conn" (its read event not yet added) a TLS server session with
  // the current certificate; false if out of memory.
  bool StartTls(Connection* conn, evutil_socket_t fd);
  // Stop / start reading the client (its read event; a TLS session's
  // decrypted bytes already buffered are read at once too). ResumeReading
  // is false on failure.
  void StopReading(Connection* conn);
  bool ResumeReading(Connection* conn);
  void DrainPipe(bool stopped);
  void TakeAnswers();
  void Read(Connection* conn, evutil_socket_t fd);
  void TlsReadable(Connection* conn, bool timed_out);
  // One step of the server handshake; true once it completed. A failure
  // (or "timed_out") closes the connection and counts it.
  bool Handshake(Connection* conn, bool timed_out);
  void TlsRead(Connection* conn);
  bool TlsFlush(Connection* conn);
  static size_t ReadSize(evbuffer* input, size_t have);
  void ServeFrames(Connection* conn);
  bool WantsWorker(const uint8_t* message, uint32_t len) const;
  bool Offload(Connection* conn, const uint8_t* message, uint32_t len);
  bool Submit(Connection* conn, std::unique_ptr<Call> call);
  void Resume(std::unique_ptr<Call> call);
  // Runs the call inline; *redo if it asked for a worker (RedoOnWorker):
  // then nothing is written.
  bool Answer(uint8_t* message, uint32_t len, evbuffer* output, bool* redo);
  bool Flush(Connection* conn);
  void ProtocolError(Connection* conn, const std::string& what);
  void Close(Connection* conn);
  void Disconnect(Connection* conn);

  EventServer* const server_;
  const uint64_t max_frame_ = server_->config_.server.max_frame_bytes;
  event_base* base_ = nullptr;
  evconnlistener* listener_ = nullptr;
  event* wakeup_ = nullptr;
  // AtRoundEnd(): made active behind the events already active, it runs
  // at_round_end_ (this thread's only).
  event* round_end_ = nullptr;
  std::vector<std::function<void()>> at_round_end_;
  static void OnRoundEnd(evutil_socket_t, short, void* arg);

 public:
  // The I/O thread the caller runs on, if any.
  static thread_local IoThread* current;
  bool AtRoundEnd(std::function<void()> fn);

 private:
  // Wake-up pipe: ints, each an accepted socket handed over by another
  // thread, kStop, or kAnswered (calls wait in answered_).
  static constexpr int kStop = -1;
  static constexpr int kAnswered = -2;
  int wake_fds_[2] = {-1, -1};
  std::atomic<int> load_{0};
  std::thread thread_;
  // Served connections, and closed ones whose call is still on a worker.
  std::unordered_set<Connection*> connections_;
  Caller caller_;
  std::unique_ptr<AsyncCalls> async_;  // SetAsync(): this thread's
  std::mutex answered_mu_;
  Fifo<Call> answered_;            // GUARDED_BY(answered_mu_)
  bool answered_posted_ = false;   // GUARDED_BY(answered_mu_): a kAnswered is on its way
};

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
  Fifo<Call> calls;
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

// The session reads ahead (one read() takes whatever the client sent, not
// a record header and then its body) and writes record by record
// (SSL_MODE_ENABLE_PARTIAL_WRITE: the output is drained as records go out).
bool EventServer::IoThread::StartTls(Connection* conn, evutil_socket_t fd) {
  conn->ssl = server_->tls_->NewSsl();
  conn->write_event = event_new(base_, fd, EV_WRITE, &IoThread::OnTlsWritable, conn);
  if (conn->ssl == nullptr || conn->write_event == nullptr || SSL_set_fd(conn->ssl, fd) != 1) {
    return false;
  }
  SSL_set_accept_state(conn->ssl);
  SSL_set_mode(conn->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_set_read_ahead(conn->ssl, 1);
  return true;
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

void EventServer::IoThread::OnTlsWritable(evutil_socket_t, short, void* arg) {
  auto* conn = static_cast<Connection*>(arg);
  IoThread* io = conn->io;
  if (!conn->handshaken) {
    if (io->Handshake(conn, false)) io->TlsRead(conn);
    return;
  }
  if (conn->read_wants_write) {  // read again in this round
    conn->read_wants_write = false;
    event_active(conn->read_event, EV_READ, 1);
  }
  if (!io->TlsFlush(conn)) return;
  if (evbuffer_get_length(bufferevent_get_output(conn->bev)) == 0) OnWrite(conn->bev, conn);
}

void EventServer::IoThread::TlsReadable(Connection* conn, bool timed_out) {
  if (!conn->handshaken && !Handshake(conn, timed_out)) return;
  if (conn->write_wants_read) {
    conn->write_wants_read = false;
    event_active(conn->write_event, EV_WRITE, 1);
  }
  if (!conn->paused) TlsRead(conn);
}

bool EventServer::IoThread::Handshake(Connection* conn, bool timed_out) {
  std::string reason = "not finished within " + std::to_string(kHandshakeSeconds) + " s";
  bool count = true;
  if (!timed_out) {
    ERR_clear_error();
    const int rc = SSL_do_handshake(conn->ssl);
    if (rc == 1) {
      conn->handshaken = true;
      // No timeout from now on: an idle client stays connected.
      event_del(conn->read_event);
      if (event_add(conn->read_event, nullptr) != 0) {
        Close(conn);
        return false;
      }
      return true;
    }
    const int err = SSL_get_error(conn->ssl, rc);
    if (err == SSL_ERROR_WANT_READ) return false;  // the read event is added
    if (err == SSL_ERROR_WANT_WRITE) {
      if (event_add(conn->write_event, nullptr) != 0) Close(conn);
      return false;
    }
    const int sys = errno;
    const unsigned long code = ERR_peek_error();
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    reason = code != 0 ? buf : sys != 0 ? std::strerror(sys) : "connection closed";
    // A client that closes before finishing its hello (a port probe that
    // connects and closes) is not counted.
    count = !(err == SSL_ERROR_ZERO_RETURN || (code == 0 && sys == 0) ||
              ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING);
    ERR_clear_error();
  }
  if (count) {
    server_->tls_handshake_errors_.fetch_add(1, std::memory_order_relaxed);
    WarnRateLimited("TLS handshake failed; connection closed: " + reason);
  }
  Close(conn);
  return false;
}

// SSL_read straight into the input's own memory, record after record while
// the session holds more (read ahead), up to one largest frame plus its
// header; then the frames are served. End of stream or an error closes
// the connection.
void EventServer::IoThread::TlsRead(Connection* conn) {
  evbuffer* input = bufferevent_get_input(conn->bev);
  const size_t limit = max_frame_ + kFrameHeader;
  if (evbuffer_get_length(input) >= limit) {  // as in Read(): waiting, input full
    conn->stalled = true;
    event_del(conn->read_event);
    return;
  }
  evbuffer_unfreeze(input, 0);
  bool got = false;
  bool failed = false;
  for (size_t have = evbuffer_get_length(input); have < limit; have = evbuffer_get_length(input)) {
    evbuffer_iovec space;
    const size_t want = std::min(limit - have, ReadSize(input, have));
    if (evbuffer_reserve_space(input, static_cast<ev_ssize_t>(want), &space, 1) != 1) {
      failed = true;
      break;
    }
    ERR_clear_error();
    const int n = SSL_read(conn->ssl, space.iov_base,
                           static_cast<int>(std::min({want, space.iov_len, size_t{INT_MAX}})));
    if (n > 0) {
      space.iov_len = static_cast<size_t>(n);
      if (evbuffer_commit_space(input, &space, 1) != 0) {
        failed = true;
        break;
      }
      got = true;
      if (SSL_has_pending(conn->ssl) == 0) break;
      continue;
    }
    const int err = SSL_get_error(conn->ssl, n);
    if (err == SSL_ERROR_WANT_WRITE) {
      conn->read_wants_write = true;
      failed = event_add(conn->write_event, nullptr) != 0;
    } else if (err != SSL_ERROR_WANT_READ) {
      failed = true;  // close_notify, end of stream, a reset, a bad record
    }
    ERR_clear_error();
    break;
  }
  evbuffer_freeze(input, 0);
  if (failed) {
    Close(conn);
    return;
  }
  // Stopped with a full input while the session holds more: read on once
  // the frames are served (or at ResumeReading()).
  if (SSL_has_pending(conn->ssl) != 0) event_active(conn->read_event, EV_READ, 1);
  if (got) ServeFrames(conn);
}

// SSL_write of the output, a record (at most 16 KiB) at a time; what the
// socket does not take waits for the write event. False if the connection
// failed (it is closed then).
bool EventServer::IoThread::TlsFlush(Connection* conn) {
  constexpr size_t kRecord = 16 << 10;
  evbuffer* output = bufferevent_get_output(conn->bev);
  evbuffer_unfreeze(output, 1);
  bool failed = false;
  for (size_t len = evbuffer_get_length(output); len > 0; len = evbuffer_get_length(output)) {
    const size_t n = std::min(len, kRecord);
    uint8_t* data = evbuffer_pullup(output, static_cast<ev_ssize_t>(n));
    if (data == nullptr) {
      failed = true;
      break;
    }
    ERR_clear_error();
    const int written = SSL_write(conn->ssl, data, static_cast<int>(n));
    if (written > 0) {
      evbuffer_drain(output, static_cast<size_t>(written));
      continue;
    }
    const int err = SSL_get_error(conn->ssl, written);
    if (err == SSL_ERROR_WANT_WRITE) {
      failed = event_add(conn->write_event, nullptr) != 0;
    } else if (err == SSL_ERROR_WANT_READ) {
      conn->write_wants_read = true;
      failed = event_add(conn->read_event, nullptr) != 0;
    } else {
      failed = true;
    }
    ERR_clear_error();
    break;
  }
  evbuffer_freeze(output, 1);
  if (failed) Close(conn);
  return !failed;
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

bool EventServer::IoThread::WantsWorker(const uint8_t* message, uint32_t len) const {
  if (!server_->offload_) return false;
  try {
    return server_->offload_(message, len);
  } catch (...) {
    return false;  // documented as not throwing; inline is always correct
  }
}

// Hands a copy of the call in "message" to a worker; "conn" is neither read
// nor served until it comes back (Resume()). False if out of memory.
bool EventServer::IoThread::Offload(Connection* conn, const uint8_t* message, uint32_t len) {
  std::unique_ptr<Call> call(new (std::nothrow) Call);
  if (call == nullptr) return false;
  call->message.reset(new (std::nothrow) uint8_t[len]);
  if (call->message == nullptr) return false;
  std::memcpy(call->message.get(), message, len);
  call->len = len;
  return Submit(conn, std::move(call));
}

// Queues "call" (message and len set) for a worker on behalf of "conn",
// which is neither read nor served until it comes back. False (conn then
// untouched) without workers.
bool EventServer::IoThread::Submit(Connection* conn, std::unique_ptr<Call> call) {
  if (server_->workers_ == nullptr) return false;
  call->io = this;
  call->conn = conn;
  conn->busy = true;
  StopReading(conn);
  server_->workers_->Submit(call.release());
  server_->offloaded_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void EventServer::Connection::Answer(const uint8_t* frame, size_t len) {
  io->AsyncAnswered(this, frame, len);
}

void EventServer::Connection::Redo(std::unique_ptr<uint8_t[]> message, uint32_t len,
                                   std::function<void(const std::function<void()>&)> wrap) {
  io->AsyncRedo(this, std::move(message), len, std::move(wrap));
}

// The AsyncCalls answered the call "conn" waited for: written like an
// answer given inline, then the frames that arrived meanwhile are served.
void EventServer::IoThread::AsyncAnswered(Connection* conn, const uint8_t* frame, size_t len) {
  conn->waiting = false;
  conn->ticket = nullptr;
  if (evbuffer_add(bufferevent_get_output(conn->bev), frame, len) != 0) {
    ProtocolError(conn, "a call could not be answered; connection closed");
    return;
  }
  if (conn->stalled) {
    conn->stalled = false;
    if (!ResumeReading(conn)) {
      Close(conn);
      return;
    }
  }
  ServeFrames(conn);
}

void EventServer::IoThread::AsyncRedo(Connection* conn, std::unique_ptr<uint8_t[]> message,
                                      uint32_t len,
                                      std::function<void(const std::function<void()>&)> wrap) {
  conn->waiting = false;
  conn->ticket = nullptr;
  conn->stalled = false;  // Resume() adds the read event again
  std::unique_ptr<Call> call(new (std::nothrow) Call);
  if (call != nullptr) {
    call->message = std::move(message);
    call->len = len;
    call->wrap = std::move(wrap);
  }
  if (call == nullptr || !Submit(conn, std::move(call))) {
    spdlog::error("cannot hand a call to a worker; connection closed");
    Close(conn);
  }
}

// The call of "call->conn" came back from its worker: its answer is written
// like one answered inline, then the connection is read and served again.
void EventServer::IoThread::Resume(std::unique_ptr<Call> call) {
  Connection* conn = call->conn;
  conn->busy = false;
  if (conn->bev == nullptr) {  // closed while the call was on the worker
    connections_.erase(conn);
    delete conn;
    return;
  }
  evbuffer* output = bufferevent_get_output(conn->bev);
  if (!call->ok || (!call->answer.empty() &&
                    evbuffer_add(output, call->answer.data(), call->answer.size()) != 0)) {
    ProtocolError(conn, "a call could not be answered; connection closed");
    return;
  }
  call.reset();
  if (!ResumeReading(conn)) {
    Close(conn);
    return;
  }
  ServeFrames(conn);  // the frames that arrived meanwhile, then the write
}

// Runs one call on "message"; the answer (with its frame header) goes to
// "output". False if the processor threw or gave up; the connection must
// then be closed.
namespace {
// The call running inline on this I/O thread (RedoOnWorker()).
struct InlineCall {
  bool active = false;
  bool can_redo = false;  // the server has workers
  bool redo = false;
};
thread_local InlineCall inline_call;
}  // namespace

bool EventServer::InlineOnIoThread() { return inline_call.active; }

bool EventServer::RedoOnWorker() {
  if (!inline_call.active || !inline_call.can_redo) return false;
  inline_call.redo = true;
  return true;
}

bool EventServer::IoThread::Answer(uint8_t* message, uint32_t len, evbuffer* output,
                                   bool* redo) {
  uint8_t* answer = nullptr;
  uint32_t size = 0;
  inline_call = {true, server_->workers_ != nullptr, false};
  bool ok = caller_.Run(server_->processor_.get(), message, len, &answer, &size);
  *redo = inline_call.redo;
  inline_call = InlineCall();
  if (ok && !*redo && size > 0) ok = evbuffer_add(output, answer, size) == 0;
  caller_.Trim();
  return ok;
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

void EventServer::WorkerPool::Run(Caller* caller) {
  for (;;) {
    Call* call = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      call = queue_.Pop();
    }
    const auto run = [&] {
      uint8_t* answer = nullptr;
      uint32_t size = 0;
      call->ok = caller->Run(server_->processor_.get(), call->message.get(), call->len, &answer,
                             &size);
      if (call->ok) {
        try {
          call->answer.assign(answer, answer + size);
        } catch (const std::bad_alloc&) {
          call->ok = false;
        }
      }
      caller->Trim();
    };
    if (call->wrap) {
      call->wrap(run);
      call->wrap = nullptr;  // on this thread: what it holds is freed here
    } else {
      run();
    }
    call->message.reset();
    call->io->Answered(call);
  }
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
