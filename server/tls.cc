#include "server/tls.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

namespace flatkv::server {
namespace {

// OpenSSL's reason for the last failure, and its error queue emptied (a
// stale entry would be blamed on the next connection's handshake).
std::string OpenSslError() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    if (text.empty()) text = buf;
  }
  return text.empty() ? "unknown OpenSSL error" : text;
}

Status Bad(const char* key, const std::string& path, const std::string& why) {
  return Status::InvalidArgument(std::string(key) + ": " + path + ": " + why);
}

// InvalidArgument unless "path" can be opened for reading.
Status Readable(const char* key, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Bad(key, path, std::string("cannot read (") + std::strerror(errno) + ")");
  std::fclose(f);
  return Status::OK();
}

std::string AsText(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return "?";
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string text(data, static_cast<size_t>(len));
  BIO_free(bio);
  return text;
}

// The free callback of NewCountedSsl()'s ex_data: OpenSSL runs it in
// SSL_free, before the SSL's BIOs go, with ptr the counter.
void CountFailedHandshake(void* parent, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  auto* ssl = static_cast<SSL*>(parent);
  auto* counter = static_cast<std::atomic<int64_t>*>(ptr);
  if (ssl == nullptr || counter == nullptr || SSL_is_init_finished(ssl)) return;
  BIO* rbio = SSL_get_rbio(ssl);
  if (rbio == nullptr || BIO_number_read(rbio) == 0) return;  // a port probe
  const int64_t failed = counter->fetch_add(1, std::memory_order_relaxed) + 1;
  // At most one line every 10 s: a scanner must not flood the log.
  static std::atomic<int64_t> last_log{INT64_MIN / 2};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_log.load(std::memory_order_relaxed);
  if (now - last >= 10 && last_log.compare_exchange_strong(last, now)) {
    spdlog::warn("TLS handshake failed on the HTTP port, connection closed ({} since start; "
                 "a plaintext client, or one that refused the certificate)",
                 failed);
  }
}

int FailedHandshakeIndex() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, &CountFailedHandshake);
  return index;
}

}  // namespace

Status NewPeerClientContext(const ServerOptions& o, SSL_CTX** result) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return Status::IOError("cannot create a TLS context: " + OpenSslError());
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> guard(ctx, SSL_CTX_free);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_load_verify_locations(ctx, o.tls_ca_file.c_str(), nullptr) != 1) {
    return Bad("server.tls_ca_file", o.tls_ca_file, "no PEM CA certificate in it: " + OpenSslError());
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, o.tls_cert_file.c_str()) != 1) {
    return Bad("server.tls_cert_file", o.tls_cert_file, "not a PEM certificate: " + OpenSslError());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return Bad("server.tls_key_file", o.tls_key_file, "not a PEM private key: " + OpenSslError());
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  *result = guard.release();
  return Status::OK();
}

bool TlsContext::Stamp::operator==(const Stamp& o) const {
  for (int i = 0; i < 6; ++i) {
    if (v[i] != o.v[i]) return false;
  }
  return true;
}

Status TlsContext::Build(const ServerOptions& o, SSL_CTX** result) {
  ERR_clear_error();
  FLATKV_RETURN_IF_ERROR(Readable("server.tls_cert_file", o.tls_cert_file));
  FLATKV_RETURN_IF_ERROR(Readable("server.tls_key_file", o.tls_key_file));
  if (!o.tls_ca_file.empty()) FLATKV_RETURN_IF_ERROR(Readable("server.tls_ca_file", o.tls_ca_file));
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return Status::IOError("cannot create a TLS context: " + OpenSslError());
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> guard(ctx, SSL_CTX_free);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_use_certificate_chain_file(ctx, o.tls_cert_file.c_str()) != 1) {
    return Bad("server.tls_cert_file", o.tls_cert_file,
               "not a PEM certificate: " + OpenSslError());
  }
  X509* cert = SSL_CTX_get0_certificate(ctx);
  if (cert != nullptr && X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return Bad("server.tls_cert_file", o.tls_cert_file,
               "the certificate expired on " + AsText(X509_get0_notAfter(cert)));
  }
  if (cert != nullptr && X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return Bad("server.tls_cert_file", o.tls_cert_file,
               "the certificate is not valid before " + AsText(X509_get0_notBefore(cert)));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = OpenSslError();
    if (why.find("key values mismatch") != std::string::npos) {
      return Bad("server.tls_key_file", o.tls_key_file,
                 "the key does not match the certificate in server.tls_cert_file");
    }
    return Bad("server.tls_key_file", o.tls_key_file, "not a PEM private key: " + why);
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return Bad("server.tls_key_file", o.tls_key_file,
               "the key does not match the certificate in server.tls_cert_file");
  }
  if (!o.tls_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, o.tls_ca_file.c_str(), nullptr) != 1) {
      return Bad("server.tls_ca_file", o.tls_ca_file,
                 "no PEM CA certificate in it: " + OpenSslError());
    }
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.tls_ca_file.c_str());
    if (names != nullptr) SSL_CTX_set_client_CA_list(ctx, names);  // takes it
    ERR_clear_error();
  }
  int mode = SSL_VERIFY_NONE;
  if (o.tls_client_auth == "optional") mode = SSL_VERIFY_PEER;
  if (o.tls_client_auth == "required") mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(ctx, mode, nullptr);
  // Session resumption with client certificates needs a context id.
  static const unsigned char kSessionId[] = "flatkv";
  SSL_CTX_set_session_id_context(ctx, kSessionId, sizeof(kSessionId) - 1);
  *result = guard.release();
  return Status::OK();
}

Status TlsContext::BuildBoth(SSL_CTX** ctx, SSL_CTX** peer) const {
  FLATKV_RETURN_IF_ERROR(Build(options_, ctx));
  if (!peer_client_) return Status::OK();
  Status st = NewPeerClientContext(options_, peer);
  if (!st.ok()) {
    SSL_CTX_free(*ctx);
    *ctx = nullptr;
  }
  return st;
}

Status TlsContext::Create(const ServerOptions& options, bool peer_client,
                          std::shared_ptr<TlsContext>* result) {
  std::shared_ptr<TlsContext> tls(new TlsContext(options, peer_client));
  // The stamp before the files are read: a change while they are read is
  // then seen by the next check.
  tls->loaded_ = tls->Current();
  FLATKV_RETURN_IF_ERROR(tls->BuildBoth(&tls->ctx_, &tls->peer_ctx_));
  *result = std::move(tls);
  return Status::OK();
}

TlsContext::~TlsContext() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  if (peer_ctx_ != nullptr) SSL_CTX_free(peer_ctx_);
}

SSL* TlsContext::NewSsl() {
  std::lock_guard<std::mutex> lock(mu_);
  return SSL_new(ctx_);  // the SSL holds its own reference to ctx_
}

SSL* TlsContext::NewPeerSsl() {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_ctx_ != nullptr ? SSL_new(peer_ctx_) : nullptr;
}

SSL* TlsContext::NewCountedSsl() {
  SSL* ssl = NewSsl();
  const int index = FailedHandshakeIndex();
  if (ssl != nullptr && (index < 0 || SSL_set_ex_data(ssl, index, &failed_handshakes_) != 1)) {
    SSL_free(ssl);
    return nullptr;
  }
  return ssl;
}

TlsContext::Stamp TlsContext::Current() const {
  Stamp stamp;
  const std::string* files[] = {&options_.tls_cert_file, &options_.tls_key_file,
                                &options_.tls_ca_file};
  for (int i = 0; i < 3; ++i) {
    struct stat st {};
    if (files[i]->empty() || ::stat(files[i]->c_str(), &st) != 0) continue;
    stamp.v[2 * i] = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    stamp.v[2 * i + 1] = static_cast<int64_t>(st.st_size);
  }
  return stamp;
}

bool TlsContext::CheckFiles() {
  const Stamp now = Current();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (now == loaded_) return false;
    loaded_ = now;  // a refused set of files is not tried again until it changes
  }
  SSL_CTX* fresh = nullptr;
  SSL_CTX* fresh_peer = nullptr;
  Status st = BuildBoth(&fresh, &fresh_peer);
  if (!st.ok()) {
    reload_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("TLS certificate not reloaded, the previous one stays in use: {}",
                  st.message());
    return false;
  }
  SSL_CTX* old = nullptr;
  SSL_CTX* old_peer = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = ctx_;
    old_peer = peer_ctx_;
    ctx_ = fresh;
    peer_ctx_ = fresh_peer;
  }
  SSL_CTX_free(old);  // connections on it keep their own references
  if (old_peer != nullptr) SSL_CTX_free(old_peer);
  reloads_.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("TLS certificate reloaded from {}", options_.tls_cert_file);
  return true;
}

void TlsContext::Watch() {
  if (watcher_.joinable()) return;
  watcher_ = std::thread([this] { Run(); });
}

void TlsContext::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::seconds(1));
    if (stopping_) break;
    lock.unlock();
    CheckFiles();
    lock.lock();
  }
}

}  // namespace flatkv::server
