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
// Limits: a frame length of 0, negative or over server.max_frame_bytes
// closes the connection (server.protocol_errors); a connection buffers at
// most one frame of max_frame_bytes + 4 bytes of input; while more than
// max_frame_bytes of answers wait for a client that does not read, that
// client's input is not read. Exactly server.max_connections connections
// are served; one accepted past that is closed at once.
//
// Thread safety: SetOffload(), Start() and Stop() are called from one thread
// (main); the counters may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <thrift/TProcessor.h>

#include "engine/status.h"
#include "server/config.h"

namespace flatkv::server {

class EventServer {
 public:
  // Says from a call's bytes ("message": a frame's body, one binary-protocol
  // message of "len" bytes) whether it must run on a worker thread because
  // it may block. Called on the I/O threads, concurrently, for every frame:
  // must be cheap and must not throw (a throw counts as false).
  using OffloadFn = std::function<bool(const uint8_t* message, uint32_t len)>;

  // Serves "processor" (shared with the caller; its process() runs on every
  // I/O thread concurrently) on config.server.host:config.server.port.
  EventServer(std::shared_ptr<apache::thrift::TProcessor> processor, const Config& config);
  ~EventServer();  // Stop()

  // Before Start(): the calls for which "fn" returns true run on one of
  // "workers" threads of the server's own (see Offload above). Without it,
  // or with a null "fn" or "workers" < 1, every call runs inline.
  void SetOffload(OffloadFn fn, int workers);

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
  // Calls handed to a worker (SetOffload()) since start.
  int64_t offloaded() const { return offloaded_.load(std::memory_order_relaxed); }

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
  int port_ = 0;
  std::unique_ptr<WorkerPool> workers_;  // with offload_, from Start() to Stop()
  std::vector<std::unique_ptr<IoThread>> threads_;
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> protocol_errors_{0};
  std::atomic<int64_t> offloaded_{0};
};

}  // namespace flatkv::server
