// The EventServer's private parts, shared by its two files:
// event_server.cc (the loop, plaintext connections, workers) and
// event_server_tls.cc (TLS connections). Not for any other file.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/ssl.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "server/event_server.h"

namespace flatkv::server {
namespace event_io {

inline constexpr size_t kFrameHeader = 4;
inline constexpr size_t kMaxSingleRead = 64 << 10;  // the most one recv() asks for
inline constexpr size_t kReadChunk = 16 << 10;      // what it asks for between large frames
// The per-thread answer buffer is reused; one grown past this by a large
// answer is replaced after that call, so memory follows the calls in flight.
inline constexpr uint32_t kAnswerKeep = 64 << 10;
inline constexpr uint32_t kAnswerInitial = 4 << 10;
// A TLS client that has not finished its handshake by then is closed.
inline constexpr int kHandshakeSeconds = 10;

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
  std::shared_ptr<apache::thrift::transport::TMemoryBuffer> in_ = std::make_shared<apache::thrift::transport::TMemoryBuffer>();
  std::shared_ptr<apache::thrift::transport::TMemoryBuffer> out_ = std::make_shared<apache::thrift::transport::TMemoryBuffer>(kAnswerInitial);
  std::shared_ptr<apache::thrift::protocol::TBinaryProtocol> in_protocol_ = std::make_shared<apache::thrift::protocol::TBinaryProtocol>(in_);
  std::shared_ptr<apache::thrift::protocol::TBinaryProtocol> out_protocol_ = std::make_shared<apache::thrift::protocol::TBinaryProtocol>(out_);
};

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

}  // namespace event_io

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
  void Run(event_io::Caller* caller);

  EventServer* const server_;
  std::mutex mu_;
  std::condition_variable ready_;
  event_io::Fifo<Call> queue_;       // GUARDED_BY(mu_)
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<event_io::Caller>> callers_;
  std::vector<std::thread> threads_;
};

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
  event_io::Caller caller_;
  std::unique_ptr<AsyncCalls> async_;  // SetAsync(): this thread's
  std::mutex answered_mu_;
  event_io::Fifo<Call> answered_;            // GUARDED_BY(answered_mu_)
  bool answered_posted_ = false;   // GUARDED_BY(answered_mu_): a kAnswered is on its way
};

}  // namespace flatkv::server
