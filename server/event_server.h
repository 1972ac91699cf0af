// EventServer: flatkv-server's own nonblocking Thrift server (framed
// transport, binary protocol) on libevent 2.1. main.cc uses it when calls
// run on the I/O threads (server.workers = 0, the default unless
// storage.sync: always); with a worker pool (server.workers > 0, which
// sync: always needs for group commit) it keeps Thrift's TNonblockingServer.
//
// Why: TNonblockingServer makes about 9 system calls per call (a 4-byte
// read for the frame header, a read for the body, an ioctl, a send and four
// epoll_ctl to switch the connection between reading and writing). Here a
// wake-up costs one epoll_wait (shared by the connections ready at once),
// one recv and one write: every complete frame in the input is answered
// (pipelined calls included), the answers are written at once with the
// connection staying registered for reading only, and only answers the
// socket cannot take at once register it for writing.
//
// Threads: server.io_threads I/O threads, each with its own event_base and
// its own listening socket bound to host:port with SO_REUSEPORT, so the
// kernel spreads accepting over them; a thread that accepts a connection
// hands it (through the serving thread's pipe) to the thread serving the
// fewest, since the kernel's hash alone splits 50 connections as unevenly
// as 30/20. A connection then lives and dies on the thread that serves it,
// and its calls run inline on that thread (FrontProcessor without a worker
// pool), so nothing about a connection is shared between threads:
// bufferevents need no locks. Only the counters (atomics), the wake-up
// pipes (handed-over sockets, answers from workers, Stop()) and the calls
// handed to workers cross threads.
//
// Offload (SetOffload()): calls that may block, such as a call forwarded
// to the peer owning its key in cluster mode, run on a small pool of
// worker threads instead, so they do not stall the other connections of
// their I/O thread. The I/O thread asks the OffloadFn about each frame; on
// yes it copies the frame, queues it for a worker and goes back to its
// loop. Until the answer comes back (through the I/O thread's wake-up
// pipe) that connection is neither read nor served, so pipelined calls are
// still answered in order; its other connections are served meanwhile. A
// connection closed while its call is on a worker (write error, Stop()) is
// freed when the answer comes back, which is then dropped; a client that
// goes away meanwhile is noticed when its answer is written. The workers'
// queue is not limited by server.max_queued_calls: each connection has at
// most one call on a worker, so at most server.max_connections calls wait.
//
// Asynchronous calls (SetAsync()): an AsyncCalls object per I/O thread,
// created on that thread's event_base, may take a call instead of running
// it: it starts the call (a forward to a peer over a nonblocking connection
// of the same event loop, server/member/forwarder.h) and answers it later on the
// same thread, with no other thread involved. While its call is taken, a
// connection is not served (its input is still read, up to one frame), so
// pipelined calls are still answered in order; a client that goes away
// meanwhile cancels the call. The AsyncCalls may instead hand the call back
// to be run on a worker (a retry that may block).
//
// Limits: a frame length of 0, negative or over server.max_frame_bytes
// closes the connection (server.protocol_errors); a connection buffers at
// most one frame of max_frame_bytes + 4 bytes of input; while more than
// max_frame_bytes of answers wait for a client that does not read, that
// client's input is not read. Exactly server.max_connections connections
// are served; one accepted past that is closed at once.
//
// Thread safety: SetOffload(), SetAsync(), Start() and Stop() are called from one thread
// (main); the counters may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <thrift/TProcessor.h>

#include "engine/status.h"
#include "server/config.h"

struct event_base;

namespace flatkv::server {

class TlsContext;

// Calls that an I/O thread starts and answers later itself (see
// "Asynchronous calls" above). One object per I/O thread, created on that
// thread's event_base by the factory given to EventServer::SetAsync(), and
// used only by that thread; destroyed (after its thread ended) before the
// base is freed, without answering the calls it still holds.
class AsyncCalls {
 public:
  // The connection a taken call came from. Each method may be called once
  // per taken call, on the I/O thread, and never from within Start() or
  // Cancel(); after either, the Reply is not the AsyncCalls' to use again.
  class Reply {
   public:
    // The answer: "len" bytes of a whole frame (header included), copied.
    virtual void Answer(const uint8_t* frame, size_t len) = 0;
    // Instead of an answer: runs the call "message" ("len" bytes, taken) on
    // a worker, as if the offload function had picked it, inside "wrap"
    // (which must call its argument once, on the worker). Without workers
    // (no SetOffload()) the connection is closed.
    virtual void Redo(std::unique_ptr<uint8_t[]> message, uint32_t len,
                      std::function<void(const std::function<void()>&)> wrap) = 0;

   protected:
    ~Reply() = default;
  };

  enum class Decision {
    kNotTaken,  // not ours: the offload function decides, as without SetAsync()
    kInline,    // run it now on the I/O thread (skips the offload function)
    kTaken,     // started: "reply" gets the answer later
  };

  virtual ~AsyncCalls() = default;
  // Called for every frame ("message": a frame's body, one binary-protocol
  // message of "len" bytes, valid only during the call). On kTaken, *ticket
  // names the call for Cancel(). Must not throw.
  virtual Decision Start(const uint8_t* message, uint32_t len, Reply* reply, void** ticket) = 0;
  // The connection of a taken call closed: its Reply is gone.
  virtual void Cancel(void* ticket) = 0;
};

// Logs "what" as a warning unless one was logged this second (all threads
// together): for bad input from the network, which must not flood the log.
void WarnRateLimited(const std::string& what);

class EventServer {
 public:
  // Says from a call's bytes ("message": a frame's body, one binary-protocol
  // message of "len" bytes) whether it must run on a worker thread because
  // it may block. Called on the I/O threads, concurrently, for every frame:
  // must be cheap and must not throw (a throw counts as false).
  using OffloadFn = std::function<bool(const uint8_t* message, uint32_t len)>;
  // Makes the AsyncCalls of one I/O thread (called on the thread that calls
  // Start(), once per I/O thread). Null: no asynchronous calls.
  using AsyncFactory = std::function<std::unique_ptr<AsyncCalls>(event_base* base)>;

  // Serves "processor" (shared with the caller; its process() runs on every
  // I/O thread concurrently) on config.server.host:config.server.port.
  EventServer(std::shared_ptr<apache::thrift::TProcessor> processor, const Config& config);
  ~EventServer();  // Stop()

  // Before Start(): the calls for which "fn" returns true run on one of
  // "workers" threads of the server's own (see Offload above). Without it,
  // or with a null "fn" or "workers" < 1, every call runs inline.
  void SetOffload(OffloadFn fn, int workers);
  // Before Start(): every frame is offered to the I/O thread's AsyncCalls
  // first (see Asynchronous calls above).
  void SetAsync(AsyncFactory factory) { async_factory_ = std::move(factory); }
  // Before Start(): every connection speaks TLS with "tls"'s current
  // certificate (server/tls.h); a connection that fails the handshake is
  // closed and counted (tls_handshake_errors()).
  void SetTls(std::shared_ptr<TlsContext> tls) { tls_ = std::move(tls); }

  // For a call running inline on an I/O thread that finds it must block
  // after all (a read meeting a corrupt record, repaired from the chain):
  // asks that the call run again from the start on a worker; whatever it
  // answers here is discarded. True if it will; false when the caller is
  // not inline on an I/O thread (a worker may block) or there are no
  // workers. Reads only: the call runs twice.
  static bool RedoOnWorker();
  // Whether the caller is a call running inline on an I/O thread (which
  // must not wait for long).
  static bool InlineOnIoThread();
  // On an I/O thread: runs "fn" on it once it has served every connection
  // that was ready with the current one (the calls of one wake-up), and
  // returns true; elsewhere returns false and drops "fn". So work that the
  // calls of one wake-up each start can be done once for all of them.
  static bool AtRoundEnd(std::function<void()> fn);

  // Binds server.io_threads listening sockets to host:port (port 0: a free
  // port, the same for all) and starts the I/O threads. Returns IOError
  // naming the address and the reason when the port is taken or cannot be
  // bound; nothing is left running then.
  Status Start();

  // The bound port (after a successful Start()).
  int port() const { return port_; }

  // Closes the listening sockets, breaks every event loop (a call being
  // answered finishes first), joins the I/O threads, waits for the calls
  // running on workers (their answers are dropped; calls still queued are
  // not run), joins the workers and closes every connection. Safe to call
  // more than once and without Start().
  void Stop();

  // Connections open now / served since start.
  int64_t connections() const { return open_.load(std::memory_order_relaxed); }
  int64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  // Connections closed for a bad frame length or a call that could not be
  // answered (an exception out of the processor).
  int64_t protocol_errors() const { return protocol_errors_.load(std::memory_order_relaxed); }
  // Connections closed before their TLS handshake completed (a plaintext
  // client, a client refusing our certificate or refused for its own, a
  // handshake that timed out).
  int64_t tls_handshake_errors() const {
    return tls_handshake_errors_.load(std::memory_order_relaxed);
  }
  // Calls handed to a worker since start: picked by the offload function,
  // or handed back by an AsyncCalls (Reply::Redo()).
  int64_t offloaded() const { return offloaded_.load(std::memory_order_relaxed); }
  // Calls taken by the I/O threads' AsyncCalls (SetAsync()) since start.
  int64_t async_taken() const { return async_taken_.load(std::memory_order_relaxed); }

  EventServer(const EventServer&) = delete;
  EventServer& operator=(const EventServer&) = delete;

 private:
  class IoThread;
  class WorkerPool;
  struct Connection;
  struct Call;
  friend class IoThread;
  friend class WorkerPool;

  // Binds and listens on every I/O thread's socket; sets port_.
  Status Listen();

  const std::shared_ptr<apache::thrift::TProcessor> processor_;
  const Config config_;
  OffloadFn offload_;  // null: every call inline
  int offload_workers_ = 0;
  AsyncFactory async_factory_;  // null: no asynchronous calls
  std::shared_ptr<TlsContext> tls_;  // null: plaintext
  int port_ = 0;
  std::unique_ptr<WorkerPool> workers_;  // with offload_, from Start() to Stop()
  std::vector<std::unique_ptr<IoThread>> threads_;
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> protocol_errors_{0};
  std::atomic<int64_t> offloaded_{0};
  std::atomic<int64_t> async_taken_{0};
  std::atomic<int64_t> tls_handshake_errors_{0};
};

}  // namespace flatkv::server
