// HttpServer: the optional HTTP port of flatkv-server (server.http_port),
// served by libevent's evhttp on one thread with its own event_base.
//
//   GET  /health                  200 "ok"; 503 "stopping" once shutdown began,
//                                 503 and the reason while a ring member knows
//                                 no ring yet (ZooKeeper not reached)
//   GET  /metrics                 Prometheus text format 0.0.4 (flatkv_*)
//   GET|PUT|POST|DELETE /kv/<int64>          get, put, append, remove
//   GET|PUT|POST|DELETE /skv/<url-encoded>   the same for string keys
//   GET  /admin/info | /admin/stats | /admin/compaction   JSON objects
//   GET  /admin/write-mode        "safe" or "async"
//   PUT  /admin/write-mode        body safe|async       (admin token)
//   POST /admin/compact           start a compaction    (admin token)
//   GET  /ui                      the operator console (server/console.html)
//   GET  /admin/ring | /admin/members       its JSON (server/console.h)
//   PUT  /admin/members/<host:port>/write-mode   body safe|async (admin token)
//   POST /admin/members/<host:port>/compact      (admin token)
//   POST /admin/ring/remove-mark  body: the mark     (admin token)
//   POST /admin/ring/abort-change                    (admin token)
//
// The console's actions answer JSON: {"ok":true,"message":...}, or with
// the error's HTTP status {"ok":false,"code":...,"error":...} where
// "error" is the line the CLI prints for the same failure.
// Every data and admin route calls the same Handler method as the Thrift
// service, so limits, counters, latency histograms and errors are the same.
// A KvError becomes an HTTP status (see StatusForError in http.cc and the
// README) with a one-line reason as the body and its code name in the
// X-FlatKV-Error header. The admin token travels in "Authorization: Bearer
// <token>" or "X-FlatKV-Token: <token>" and is checked by the Handler.
// Bodies are limited before they are buffered: evhttp answers a body larger
// than the value limit plus 64 KiB with its own 413, reading and dropping
// the rest rather than storing it, and closes that connection.
//
// HTTPS (SetTls()): every connection is then a libevent OpenSSL
// bufferevent on the instance's TLS certificate (server/tls.h, reloaded
// with it); a client that fails the handshake, plaintext HTTP included, is
// closed by evhttp without an answer and counted in
// server.tls_handshake_errors (TlsContext::NewCountedSsl).
//
// Thread safety: Start() and Stop() are called from one thread (main);
// SetStopping() from any thread. Requests run one at a time on the HTTP
// thread, which calls the Handler directly: a slow call (an async->safe
// switch waiting for the flush) delays the other HTTP clients, never the
// Thrift ones.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/status.h"
#include "server/config.h"
#include "server/handler.h"

struct bufferevent;
struct event;
struct event_base;
struct evhttp;
struct evhttp_request;

namespace flatkv::server {

class Console;
class TlsContext;

class HttpServer {
 public:
  // Serves "handler" (not owned; must outlive Stop()) on
  // config.server.host:config.server.http_port once started.
  HttpServer(Handler* handler, const Config& config);
  ~HttpServer();  // Stop()

  // Binds the port (0 = any free port) and starts the HTTP thread. Returns
  // IOError naming the address and the reason when the port cannot be bound;
  // nothing is left running then.
  Status Start();
  // Before Start(): serve HTTPS only, with "tls"'s certificate.
  void SetTls(std::shared_ptr<TlsContext> tls) { tls_ = std::move(tls); }

  // The bound port (after a successful Start()).
  int port() const { return port_; }

  // From now on /health answers 503 "stopping" (shutdown has begun).
  void SetStopping() { stopping_.store(true, std::memory_order_relaxed); }

  // Breaks the event loop, joins the HTTP thread and closes every HTTP
  // connection. The request being handled, if any, finishes first. Safe to
  // call more than once and without Start().
  void Stop();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

 private:
  static void OnRequest(evhttp_request* req, void* arg);
  static void OnWakeup(int fd, short what, void* arg);
  static bufferevent* NewTlsBufferevent(event_base* base, void* arg);

  void Handle(evhttp_request* req);
  void Route(evhttp_request* req, const std::string& path);
  void Free();

  // What may wait on another member (a console action, the first members
  // poll after an idle spell) runs on the defer thread, so /health,
  // /metrics and /kv keep answering meanwhile: "work" runs there and
  // returns what answers "req", which the loop calls once woken (evhttp
  // keeps the request until then, and frees it itself if its client went
  // away). One thread: actions run one at a time, in order.
  using Answer = std::function<void(evhttp_request*)>;
  void Defer(evhttp_request* req, std::function<Answer()> work);
  void DeferLoop();     // the defer thread
  void SendDeferred();  // on the loop: the answers done so far
  void StopDeferring();

  Handler* const handler_;
  const Config config_;
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  event* wakeup_ = nullptr;     // read end of wake_fds_: Stop() breaks the loop
  int wake_fds_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<TlsContext> tls_;  // null: plain HTTP
  std::unique_ptr<Console> console_;  // the /ui page's routes (from Start())

  std::thread thread_;

  std::mutex defer_mu_;
  std::condition_variable defer_cv_;
  std::deque<std::pair<evhttp_request*, std::function<Answer()>>> jobs_;  // GUARDED_BY(defer_mu_)
  std::vector<std::pair<evhttp_request*, Answer>> answers_;              // GUARDED_BY(defer_mu_)
  bool defer_stop_ = false;                                              // GUARDED_BY(defer_mu_)
  std::thread defer_thread_;
};

}  // namespace flatkv::server
