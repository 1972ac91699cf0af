// TlsContext: the server side of TLS on flatkv-server's ports
// (server.tls_cert_file, server.tls_key_file, server.tls_ca_file,
// server.tls_client_auth): an OpenSSL SSL_CTX built from the files, TLS 1.2
// and 1.3 only, swapped for a new one when the files change.
//
// With peer_client (cluster.peer_tls) it also holds the client side of
// calls between instances (NewPeerClientContext), reloaded with it.
//
// Reload: Watch() starts a thread that looks at the three files' mtime and
// size every second (and at once after Reload() is called, e.g. on
// SIGHUP); when one changed it builds a new SSL_CTX (two with peer_client)
// from them. If that fails (a half-written file, a key that does not
// match, an expired certificate) the error is logged once per change and
// the old context stays. A connection keeps the context it was accepted
// with (an SSL holds a reference to its SSL_CTX), so no connection is
// dropped by a reload.
//
// Thread safety: the New*Ssl() calls, Reload() and the counters may be
// called from any
// thread; Create() and the destructor from one.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/status.h"
#include "server/config.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace flatkv::server {

// The client side of calls between instances (cluster.peer_tls): a new
// SSL_CTX (TLS 1.2 or later) presenting options.tls_cert_file/tls_key_file
// and verifying the peer against options.tls_ca_file. The caller owns it
// (SSL_CTX_free). InvalidArgument naming the key if a file does not load.
Status NewPeerClientContext(const ServerOptions& options, SSL_CTX** result);

class TlsContext {
 public:
  // Builds the context from options.tls_* (options.tls() must be true).
  // Returns InvalidArgument naming the key and the file for a file that
  // cannot be read or parsed, a certificate that has expired or is not yet
  // valid, a key that does not match the certificate, or a CA file without
  // a certificate.
  static Status Create(const ServerOptions& options, bool peer_client,
                       std::shared_ptr<TlsContext>* result);
  ~TlsContext();

  // A new server-side SSL on the current certificate; the caller owns it
  // (SSL_free). Null if OpenSSL is out of memory.
  SSL* NewSsl();
  // The same, for a port whose library owns the connection's events (the
  // HTTP port: evhttp): a handshake that read bytes from the client and
  // did not complete is counted in failed_handshakes() and logged (rate
  // limited) when the SSL is freed. A client that connects and closes
  // without a byte (a port probe) is not counted.
  SSL* NewCountedSsl();
  int64_t failed_handshakes() const { return failed_handshakes_.load(std::memory_order_relaxed); }
  // A new client-side SSL for a call to a peer, on the current files; the
  // caller owns it. Null without peer_client, or if OpenSSL is out of
  // memory.
  SSL* NewPeerSsl();

  // Starts the thread that reloads the files when they change. Idempotent.
  void Watch();
  // Asks the watcher to look at the files now (from any thread, e.g. a
  // signal-waiting thread on SIGHUP).
  void Reload() { wake_.notify_all(); }
  // Certificates loaded since start (the first one excluded) / new files
  // that were refused.
  int64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }
  int64_t reload_errors() const { return reload_errors_.load(std::memory_order_relaxed); }
  // For tests: checks the files once, as the watcher does; true if a new
  // certificate was loaded.
  bool TEST_CheckFiles() { return CheckFiles(); }

  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

 private:
  // The files' mtimes and sizes: a change of any means a reload.
  struct Stamp {
    int64_t v[6] = {0, 0, 0, 0, 0, 0};
    bool operator==(const Stamp& o) const;
  };

  TlsContext(const ServerOptions& options, bool peer_client)
      : options_(options), peer_client_(peer_client) {}
  // The server side, and with peer_client the client side (else *peer is
  // left null): both or neither.
  Status BuildBoth(SSL_CTX** ctx, SSL_CTX** peer) const;
  static Status Build(const ServerOptions& options, SSL_CTX** ctx);
  Stamp Current() const;
  bool CheckFiles();
  void Run();

  const ServerOptions options_;
  const bool peer_client_;
  std::mutex mu_;
  SSL_CTX* ctx_ = nullptr;       // GUARDED_BY(mu_); one reference is ours
  SSL_CTX* peer_ctx_ = nullptr;  // GUARDED_BY(mu_); with peer_client_
  Stamp loaded_;            // the files ctx_ (or the last refused try) was built from
  std::condition_variable wake_;
  bool stopping_ = false;   // GUARDED_BY(mu_)
  std::thread watcher_;
  std::atomic<int64_t> reloads_{0};
  std::atomic<int64_t> reload_errors_{0};
  std::atomic<int64_t> failed_handshakes_{0};  // of NewCountedSsl()'s SSLs
};

}  // namespace flatkv::server
