// flatkv-server: parses the configuration, opens the Store and the cache,
// serves the FlatKV Thrift service (binary protocol, framed transport: our
// EventServer when calls run on the I/O threads, server.workers = 0;
// Thrift's TNonblockingServer with a worker pool) and on SIGTERM/SIGINT stops
// accepting, finishes in-flight calls, flushes the cache and closes the
// Store cleanly, exiting 0. A bad configuration exits 2 with one line.
// With server.http_port it also serves /health, /metrics and an HTTP data
// API (server/http.h) on a thread of its own.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <thrift/concurrency/ThreadFactory.h>
#include <thrift/concurrency/ThreadManager.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/server/TNonblockingServer.h>
#include <thrift/transport/TNonblockingServerSocket.h>

#include "server/config.h"
#include "server/event_server.h"
#include "server/front_processor.h"
#include "server/handler.h"
#include "server/http.h"
#include "server/member/cluster.h"
#include "server/member/forwarder.h"
#include "server/member/member_handler.h"
#include "server/thrift_limits.h"
#include "server/tls.h"

namespace {

using apache::thrift::concurrency::ThreadFactory;
using apache::thrift::concurrency::ThreadManager;
using apache::thrift::server::TNonblockingServer;
using apache::thrift::transport::TNonblockingServerSocket;

constexpr int kExitBadConfig = 2;
// Threads that run the ring member's calls that may block: batches and
// scans (which may fan out), calls to a member named by a host name, and the
// retry after a NOT_OWNER answer (each blocks for a round trip to another
// instance or to ZooKeeper, or its timeout). Single-key calls for other
// marks are forwarded by the I/O threads themselves (server/member/forwarder.h).
// A multiPut of the member's own keys holds one until its chain
// acknowledged it; single-key writes hold none (the Forwarder's inbox).
constexpr int kForwardThreads = 32;

void Usage(FILE* out) {
  std::fputs(
      "usage: flatkv-server [--config FILE] [--set section.key=value ...]\n"
      "       flatkv-server --describe-config\n"
      "With no configuration it serves on 127.0.0.1:9901 with data under ./data.\n",
      out);
}

// Counts connections and logs the real port once the server listens (port
// 0 picks one). TNonblockingServer calls these from its I/O threads.
class ServerEvents : public apache::thrift::server::TServerEventHandler {
 public:
  ServerEvents(TNonblockingServer** server, std::function<void()> serving)
      : server_(server), serving_(std::move(serving)) {}
  void preServe() override {
    spdlog::info("serving FlatKV on port {}", (*server_)->getListenPort());
    serving_();
  }
  void* createContext(std::shared_ptr<apache::thrift::protocol::TProtocol>,
                      std::shared_ptr<apache::thrift::protocol::TProtocol>) override {
    open_.fetch_add(1, std::memory_order_relaxed);
    accepted_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  void deleteContext(void*, std::shared_ptr<apache::thrift::protocol::TProtocol>,
                     std::shared_ptr<apache::thrift::protocol::TProtocol>) override {
    open_.fetch_sub(1, std::memory_order_relaxed);
  }
  int64_t open() const { return open_.load(std::memory_order_relaxed); }
  int64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }

 private:
  TNonblockingServer** server_;
  std::function<void()> serving_;
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> accepted_{0};
};

// Thrift reports a connection it closes for a bad frame (oversized or
// unframed) or a call it could not decode only through GlobalOutput, among
// its start and stop notices: count the former and log both, the former
// rate-limited, instead of printing to stderr.
std::atomic<int64_t> g_protocol_errors{0};

void ThriftOutput(const char* message) {
  const bool bad_input = std::strstr(message, "frame size") != nullptr ||
                         std::strstr(message, "workSocket") != nullptr ||
                         std::strstr(message, "exception") != nullptr ||
                         std::strstr(message, "client died") != nullptr;
  if (!bad_input) {
    spdlog::info("thrift: {}", message);
    return;
  }
  g_protocol_errors.fetch_add(1, std::memory_order_relaxed);
  static std::atomic<int64_t> last_log_second{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (last_log_second.exchange(now) != now) spdlog::warn("thrift: {}", message);
}

// The Thrift port. Run() serves until Stop() (called from another thread)
// and returns once no call is being answered; it returns IOError at once if
// the port cannot be served.
class ThriftPort {
 public:
  virtual ~ThriftPort() = default;
  // Called once the port serves (a ring member registers then).
  void OnServing(std::function<void()> fn) { on_serving_ = std::move(fn); }
  virtual flatkv::Status Run() = 0;
  virtual void Stop() = 0;
  // Sets server.connections and server.connections_accepted and adds to
  // server.protocol_errors.
  virtual void AddStats(std::map<std::string, int64_t>* out) const = 0;

 protected:
  void Serving() {
    if (on_serving_) on_serving_();
  }

 private:
  std::function<void()> on_serving_;
};

// Calls on the I/O threads: FlatKV's own EventServer (fewer system calls
// per call than TNonblockingServer, see server/event_server.h).
class EventPort final : public ThriftPort {
 public:
  EventPort(std::shared_ptr<flatkv::server::FrontProcessor> processor,
            const flatkv::server::Config& config)
      : server_(std::move(processor), config) {}
  // Calls "may_block" says yes to run on "threads" workers (a ring member's
  // forwarded calls), the rest inline on the I/O threads.
  // Single-key calls for other marks are forwarded by each I/O thread's own
  // AsyncCalls (made by "async").
  void SetTls(std::shared_ptr<flatkv::server::TlsContext> tls) { server_.SetTls(std::move(tls)); }
  void Offload(flatkv::server::EventServer::OffloadFn may_block, int threads,
               flatkv::server::EventServer::AsyncFactory async) {
    server_.SetAsync(std::move(async));
    server_.SetOffload(std::move(may_block), threads);
  }

  flatkv::Status Run() override {
    FLATKV_RETURN_IF_ERROR(server_.Start());
    spdlog::info("serving FlatKV on port {}", server_.port());
    Serving();
    std::unique_lock<std::mutex> lock(mu_);
    stop_cv_.wait(lock, [&] { return stopping_; });
    lock.unlock();
    server_.Stop();  // answers the calls being read, closes every connection
    return flatkv::Status::OK();
  }
  void Stop() override {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    stop_cv_.notify_all();
  }
  void AddStats(std::map<std::string, int64_t>* out) const override {
    (*out)["server.connections"] = server_.connections();
    (*out)["server.connections_accepted"] = server_.accepted();
    (*out)["server.protocol_errors"] += server_.protocol_errors();
    (*out)["server.offloaded"] = server_.offloaded();
    (*out)["server.async_calls"] = server_.async_taken();
    (*out)["server.tls_handshake_errors"] += server_.tls_handshake_errors();
  }

 private:
  flatkv::server::EventServer server_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // GUARDED_BY(mu_)
};

// A worker pool: Thrift's TNonblockingServer hands each call to a worker.
class PoolPort final : public ThriftPort {
 public:
  PoolPort(std::shared_ptr<flatkv::server::FrontProcessor> processor,
           std::shared_ptr<ThreadManager> workers, const flatkv::server::Config& config)
      : events_(std::make_shared<ServerEvents>(&raw_, [this] { Serving(); })) {
    auto socket =
        std::make_shared<TNonblockingServerSocket>(config.server.host, config.server.port);
    server_ = std::make_shared<TNonblockingServer>(
        std::move(processor), flatkv::server::LimitedProtocolFactory(config.server.max_frame_bytes), socket,
        std::move(workers));
    raw_ = server_.get();
    server_->setNumIOThreads(static_cast<size_t>(config.server.io_threads));
    server_->setMaxFrameSize(config.server.max_frame_bytes);
    // Thrift checks the limit before counting the connection it accepts (so
    // it would allow one more) and without an overload action only logs it;
    // with these settings exactly max_connections are served and a new one
    // is closed at once until one of them goes.
    server_->setMaxConnections(static_cast<size_t>(config.server.max_connections - 1));
    server_->setOverloadAction(apache::thrift::server::T_OVERLOAD_CLOSE_ON_ACCEPT);
    server_->setOverloadHysteresis(1.0);
    server_->setServerEventHandler(events_);
    // A connection keeps its largest frame's buffers (up to max_frame_bytes)
    // until Thrift checks them; check after every call so memory follows
    // the calls in flight, not the largest value each connection ever sent.
    server_->setResizeBufferEveryN(1);
    server_->setIdleReadBufferLimit(64 << 10);
    server_->setIdleWriteBufferLimit(64 << 10);
  }

  flatkv::Status Run() override {
    try {
      server_->serve();
    } catch (const std::exception& e) {
      return flatkv::Status::IOError(e.what());
    }
    return flatkv::Status::OK();
  }
  void Stop() override { server_->stop(); }
  void AddStats(std::map<std::string, int64_t>* out) const override {
    (*out)["server.connections"] = events_->open();
    (*out)["server.connections_accepted"] = events_->accepted();
  }

 private:
  TNonblockingServer* raw_ = nullptr;
  std::shared_ptr<ServerEvents> events_;
  std::shared_ptr<TNonblockingServer> server_;
};

// Blocks SIGTERM and SIGINT in this thread and every thread started after
// it: one waiter thread takes them with sigwait().
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // SIGHUP (reload the TLS files) is taken by the waiter thread in Serve();
  // blocked here, before any thread starts, so no other thread dies of it.
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &hup, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

// Closes the cache (writing everything dirty) and then the store; false if
// either failed (logged).
bool CloseEngine(flatkv::engine::cache::WriteBackCache* cache, flatkv::engine::Store* store,
                 const sigset_t* signals) {
  bool ok = true;
  flatkv::Status st = cache->Close();
  // Acknowledged async writes the full disk cannot take: keep trying (once a
  // second) rather than exit without them; another SIGTERM/SIGINT gives up.
  for (int waited = 0; st.IsNoSpace() && signals != nullptr && cache->stats().dirty_entries > 0;
       ++waited) {
    if (waited % 10 == 0) {
      spdlog::error("stopping: {} acknowledged writes cannot be written ({}); retrying every "
                    "second until space is freed; SIGTERM/SIGINT again exits without them",
                    cache->stats().dirty_entries, st.ToString());
    }
    const timespec second{1, 0};
    if (sigtimedwait(signals, nullptr, &second) > 0) {
      spdlog::critical("stopping without {} acknowledged writes (second stop signal)",
                       cache->stats().dirty_entries);
      break;
    }
    st = cache->Flush();
  }
  if (!st.ok()) {
    spdlog::error("flushing the cache: {}", st.ToString());
    ok = false;
  }
  st = store->Close();
  if (!st.ok()) {
    spdlog::error("closing the store: {}", st.ToString());
    ok = false;
  }
  return ok;
}

// Raises the soft RLIMIT_NOFILE to the hard limit (as Redis does) and fits
// the descriptors into what it got: min(max_connections + 64, limit / 2)
// are kept for connections, of which 32 for the listening sockets, the HTTP
// port, ZooKeeper, wake-up pipes and logs; server.max_connections is
// lowered to the rest (an accept() that fails with EMFILE would leave
// libevent's listener readable and spinning) and storage.max_open_files to
// what remains for tables. Returns what was obtained; Serve() logs it with
// the start-up summary (a start-up that fails keeps its one line of error).
std::string FitOpenFiles(flatkv::server::Config* config) {
  const uint32_t wanted = config->storage.max_open_files;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    return std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno) +
           "; open-file budgets unchanged";
  }
  const rlim_t before = lim.rlim_cur;
  std::string failed;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      lim = raised;
    } else {
      failed = std::string(" (raising it failed: ") + std::strerror(errno) + ")";
    }
  }
  auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
  };
  const uint64_t limit = lim.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 30 : lim.rlim_cur;
  const uint64_t reserve =
      std::min<uint64_t>(static_cast<uint64_t>(config->server.max_connections) + 64, limit / 2);
  const uint64_t fit = std::max<uint64_t>(2, std::min<uint64_t>(wanted, limit - reserve));
  config->storage.max_open_files = static_cast<uint32_t>(fit);
  std::string report = "open files: limit " + text(lim.rlim_cur) + " (was " + text(before) +
                       ", hard " + text(lim.rlim_max) + ")" + failed + "; " +
                       std::to_string(fit) + " for tables" +
                       (fit < wanted ? " (storage.max_open_files " + std::to_string(wanted) +
                                           " lowered to fit)"
                                     : "") +
                       ", " + std::to_string(reserve) + " kept for connections";
  const int64_t connections = std::max<int64_t>(1, static_cast<int64_t>(reserve) - 32);
  if (config->server.max_connections > connections) {
    report += " (server.max_connections " + std::to_string(config->server.max_connections) +
              " lowered to " + std::to_string(connections) + ")";
    config->server.max_connections = static_cast<int>(connections);
  }
  return report;
}

int Serve(const flatkv::server::Config& config, const std::string& open_files,
          const std::shared_ptr<flatkv::server::TlsContext>& tls) {
  sigset_t signals = BlockStopSignals();
  std::unique_ptr<flatkv::engine::Store> store;
  flatkv::engine::EngineOptions engine_options = config.storage;
  if (config.cluster.enabled() && engine_options.sync == flatkv::engine::SyncMode::kAlways) {
    // A ring member's writes are made durable by its chain log, one
    // fdatasync per batch (server/member/chain_log.h); the engine syncs on the
    // interval and at the log's checkpoints.
    engine_options.sync = flatkv::engine::SyncMode::kInterval;
  }
  flatkv::Status st = flatkv::engine::Store::Open(engine_options, &store);
  if (!st.ok()) {
    spdlog::critical("cannot open the store: {}", st.ToString());
    return 1;
  }
  std::unique_ptr<flatkv::engine::cache::WriteBackCache> cache;
  st = flatkv::engine::cache::WriteBackCache::Open(store.get(), config.cache, &cache);
  if (!st.ok()) {
    spdlog::critical("cannot start the cache: {}", st.ToString());
    return 1;
  }
  std::shared_ptr<flatkv::server::Handler> handler;
  // A ring member's handler, for its Forwarder (null standalone).
  flatkv::server::MemberHandler* member = nullptr;
  // A ring member: the registry connects to ZooKeeper in the background;
  // data calls answer UNAVAILABLE until a ring is known, and the member node
  // is created once the port serves. Settings that differ from the ring's
  // stop the server with exit code 2 (fatal_ set from the registry thread).
  std::unique_ptr<flatkv::server::Cluster> cluster;
  std::atomic<bool> fatal{false};
  if (config.cluster.enabled()) {
    st = flatkv::server::Cluster::Start(
        config,
        [&fatal](const flatkv::Status& why) {
          spdlog::critical("refusing to join the ring: {}", why.message());
          fatal.store(true);
          kill(getpid(), SIGTERM);  // the waiter thread stops the server
        },
        &cluster);
    if (!st.ok()) {
      spdlog::critical("cannot join the ring: {}", st.ToString());
      CloseEngine(cache.get(), store.get(), nullptr);
      return kExitBadConfig;
    }
    st = cluster->StartReplication(config, store.get(), cache.get(),
                                   &flatkv::server::EventServer::AtRoundEnd);
    if (!st.ok()) {
      spdlog::critical("cannot start chain replication: {}", st.ToString());
      cluster->Close();
      CloseEngine(cache.get(), store.get(), nullptr);
      return 1;
    }
    auto member_handler = std::make_shared<flatkv::server::MemberHandler>(
        store.get(), cache.get(), config, cluster.get(), cluster->replicator());
    member = member_handler.get();
    handler = std::move(member_handler);
    spdlog::info("ring member: mark {} at {}, ZooKeeper {}{}", config.cluster.mark,
                 config.cluster.advertise, config.cluster.zookeeper, config.cluster.service_path);
  }
  if (!handler) {
    handler = std::make_shared<flatkv::server::Handler>(store.get(), cache.get(), config);
  }
  // server.workers = 0: no pool; each call runs on the I/O thread that read
  // it (no hand-off between threads, no queue to overflow). With TLS the
  // workers are the EventPort's own (below): Thrift's pool port has no TLS.
  std::shared_ptr<ThreadManager> workers;
  if (config.server.workers > 0 && !tls) {
    workers = ThreadManager::newSimpleThreadManager(static_cast<size_t>(config.server.workers));
    workers->threadFactory(std::make_shared<ThreadFactory>());
    workers->start();
  }
  auto processor = std::make_shared<flatkv::server::FrontProcessor>(
      handler, workers, static_cast<size_t>(config.server.max_queued_calls));
  std::unique_ptr<ThriftPort> port;
  if (workers) {
    port = std::make_unique<PoolPort>(processor, workers, config);
  } else {
    auto events = std::make_unique<EventPort>(processor, config);
    if (tls) events->SetTls(tls);
    // A ring member answers its own keys inline, forwards single-key
    // calls for other marks from the I/O thread over nonblocking
    // connections (no hand-off between threads), and hands the calls that
    // may block (batches, scans, retries) to workers, so they never stall
    // the I/O thread's other connections.
    if (cluster) {
      events->Offload(
          [h = handler.get()](const uint8_t* m, uint32_t n) { return h->MayBlock(m, n); },
          kForwardThreads,
          [h = member, c = cluster.get(), &config, tls](event_base* base) {
            return std::make_unique<flatkv::server::Forwarder>(base, h, c, config, tls);
          });
    } else if (config.server.workers > 0) {
      // TLS with workers: the I/O threads do the TLS and hand every call
      // to a worker, as Thrift's pool port does without TLS.
      events->Offload([](const uint8_t*, uint32_t) { return true; }, config.server.workers,
                      nullptr);
    }
    port = std::move(events);
  }
  if (cluster) port->OnServing([&cluster] { cluster->Join(); });
  // Reads objects that live until Serve() returns; the HTTP thread, the
  // only caller once the Thrift port stops, is stopped before that.
  handler->SetServerStats([&](std::map<std::string, int64_t>* out) {
    (*out)["server.queued_calls"] = workers ? static_cast<int64_t>(workers->pendingTaskCount()) : 0;
    (*out)["server.overloaded"] = processor->overloaded();
    (*out)["server.malformed_calls"] = processor->malformed();
    (*out)["server.protocol_errors"] = g_protocol_errors.load(std::memory_order_relaxed);
    // The HTTP port's failed handshakes; the EventPort adds its own.
    (*out)["server.tls_handshake_errors"] = tls ? tls->failed_handshakes() : 0;
    port->AddStats(out);
  });

  // The HTTP port (server.http_port) calls the handler from its own thread:
  // it starts once the handler exists and stops before the cache and the
  // store close. A port it cannot bind stops start-up (exit 1).
  std::unique_ptr<flatkv::server::HttpServer> http;
  if (config.server.http_port != 0) {
    http = std::make_unique<flatkv::server::HttpServer>(handler.get(), config);
    if (tls) http->SetTls(tls);  // HTTPS with the same certificate
    st = http->Start();
    if (!st.ok()) {
      spdlog::critical("cannot serve HTTP: {}", st.ToString());
      if (workers) workers->stop();
      if (cluster) cluster->Close();
      CloseEngine(cache.get(), store.get(), nullptr);
      return 1;
    }
  }

  // SIGHUP: the TLS certificate files are looked at again at once.
  sigset_t waited = signals;
  sigaddset(&waited, SIGHUP);
  if (tls) tls->Watch();
  std::thread waiter([&] {
    int sig = 0;
    while (sigwait(&waited, &sig) == 0 && sig == SIGHUP) {
      spdlog::info("SIGHUP: {}", tls ? "checking the TLS certificate files" : "nothing to reload");
      if (tls) tls->Reload();
    }
    spdlog::info("{}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    if (http) http->SetStopping();  // /health answers 503 from now on
    // Leave the ring first: the member node goes at once, so the others
    // stop routing here while this instance still answers.
    if (cluster) cluster->Close();
    port->Stop();
  });
  spdlog::info("store {} open, cache {} ({} mode), {} I/O threads, {}", config.storage.path,
               config.cache.policy, flatkv::engine::cache::WriteModeName(config.cache.mode),
               config.server.io_threads,
               workers ? std::to_string(config.server.workers) + " workers"
                       : std::string("calls run on the I/O threads"));
  spdlog::info("{}", open_files);
  int code = 0;
  st = port->Run();
  if (!st.ok()) {
    spdlog::critical("server failed: {}", st.ToString());
    code = 1;
    pthread_kill(waiter.native_handle(), SIGTERM);
  }
  waiter.join();
  if (http) http->Stop();  // no HTTP call may reach the cache or store past here
  if (workers) workers->stop();  // in-flight calls finish
  if (cluster) cluster->Close();
  handler->StopBackup();  // a backup still copying is abandoned (its DIR.partial removed)
  if (!CloseEngine(cache.get(), store.get(), &signals)) code = 1;
  if (fatal.load()) code = kExitBadConfig;
  spdlog::info("stopped cleanly");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--describe-config") {
      std::fputs(flatkv::server::DescribeConfig().c_str(), stdout);
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    } else if (arg == "--config" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg == "--set" && i + 1 < argc) {
      overrides.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "flatkv-server: unknown or incomplete argument '%s'\n", arg.c_str());
      Usage(stderr);
      return kExitBadConfig;
    }
  }
  flatkv::server::Config config;
  flatkv::Status st = flatkv::server::LoadConfig(path, overrides, &config);
  if (!st.ok()) {
    std::fprintf(stderr, "flatkv-server: bad configuration: %s\n", st.message().c_str());
    return kExitBadConfig;
  }
  if (!config.log_file.empty()) {
    try {
      // Rotation by size: past log.max_size the file becomes NAME.1.EXT (the
      // older ones shift up, the one past log.max_files is deleted).
      spdlog::set_default_logger(
          config.log_max_size == 0
              ? spdlog::basic_logger_mt("flatkv", config.log_file)
              : spdlog::rotating_logger_mt("flatkv", config.log_file, config.log_max_size,
                                           static_cast<size_t>(config.log_max_files)));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flatkv-server: bad configuration: log.file: %s\n", e.what());
      return kExitBadConfig;
    }
  } else {
    spdlog::set_default_logger(spdlog::stderr_color_mt("flatkv"));
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::flush_on(spdlog::level::info);
  apache::thrift::GlobalOutput.setOutputFunction(ThriftOutput);
  for (const std::string& warning : config.warnings) spdlog::warn("{}", warning);
  // The certificate and key are read (and checked) before anything starts:
  // a bad one is a configuration error.
  std::shared_ptr<flatkv::server::TlsContext> tls;
  if (config.server.tls()) {
    st = flatkv::server::TlsContext::Create(config.server, config.cluster.peer_tls, &tls);
    if (!st.ok()) {
      std::fprintf(stderr, "flatkv-server: bad configuration: %s\n", st.message().c_str());
      return kExitBadConfig;
    }
    spdlog::info("TLS on port {} with {} (client certificates: {})", config.server.port,
                 config.server.tls_cert_file, config.server.tls_client_auth);
  }
  const std::string open_files = FitOpenFiles(&config);
  return Serve(config, open_files, tls);
}
