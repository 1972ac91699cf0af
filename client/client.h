// Client is the C++ client of one FlatKV server (shared/DESIGN.md, "Service
// contract"): one framed binary-protocol Thrift connection, opened on first
// use and reused by every call, with connect and I/O timeouts.
//
// Errors are Status values, never exceptions. A KvError from the server maps
// onto the Status code of the same name (KEY_OUT_OF_RANGE -> KeyOutOfRange,
// VALUE_TOO_LARGE -> ValueTooLarge, INVALID_ARGUMENT -> InvalidArgument,
// STORAGE_ERROR -> IOError, NOT_OWNER -> NotOwner, UNAUTHORIZED ->
// Unauthorized, OVERLOADED -> Busy, UNAVAILABLE -> Unavailable) and keeps the
// server's message. A network failure (refused, timed out, connection lost,
// a malformed answer) is IOError naming host:port; the connection is then
// dropped and the next call opens a new one.
//
// Retries: a call that fails on a connection that had already served a call
// (the server restarted, an idle connection was closed) is retried once on a
// fresh connection, except append, which is not idempotent. Nothing else is
// retried, and errors from the server are never retried.
//
// Thread safety: a Client is one connection; use one per thread. Distinct
// Clients are independent.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "FlatKV.h"
#include "engine/status.h"

namespace apache::thrift::transport {
class TSSLSocketFactory;
}

namespace flatkv::client {

struct ClientOptions {
  std::string host = "127.0.0.1";
  int port = 9901;
  int connect_timeout_ms = 2000;  // 0 = the OS's
  int timeout_ms = 30000;         // per send and per receive; 0 = none
  // Largest answer frame accepted; Thrift's client default (16,384,000
  // bytes) would refuse a get of a value near the server's 16 MiB limit.
  uint32_t max_frame_bytes = 256u << 20;
  // TLS (a server with server.tls_cert_file): on when tls_ca_file is set.
  // The server's certificate must verify against tls_ca_file and name
  // "host" (a DNS or IP subject alternative name); TLS 1.2 or later. The
  // files are read again by the next connection after one of them changed
  // (a renewed certificate needs no new Client); if the new ones do not
  // load, the Client goes on with those it had.
  std::string tls_ca_file;    // PEM CA certificates; empty = plaintext
  std::string tls_cert_file;  // PEM client certificate, for server.tls_client_auth
  std::string tls_key_file;   // PEM key of tls_cert_file

  bool tls() const { return !tls_ca_file.empty(); }
};

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Opens the connection now (calls open it on demand anyway). IOError if
  // the server cannot be reached within connect_timeout_ms.
  Status Connect();
  // Closes the connection; the next call reconnects.
  void Close();
  // "host:port", for messages.
  std::string address() const;
  // The open connection's socket (-1 if none): to poll() whether an answer
  // to a call sent with send_x has arrived before reading it.
  int socket_fd() const;
  // True when the last call failed without an answer from the server (it
  // could not connect, the connection broke or timed out, or the answer was
  // malformed): an IOError naming host:port. False after a success and after
  // an error the server answered (a KvError; STORAGE_ERROR is IOError too,
  // which is why callers that must tell the two apart ask here).
  bool network_failed() const { return network_failed_; }
  // True when the last call failed because the server's host refused the
  // connection (ECONNREFUSED: the host is up and nothing listens on that
  // port), as opposed to a timeout, an unreachable host or a broken
  // connection.
  bool refused() const { return refused_; }

  // On a hit stores the value in *value and returns OK; an absent key is
  // NotFound and leaves *value unchanged.
  Status Get(int64_t key, std::string* value);
  Status Put(int64_t key, std::string_view value);
  // *existed (optional) says whether the key was there.
  Status Remove(int64_t key, bool* existed = nullptr);
  // Adds bytes to the value, creating the key if absent. Never retried.
  Status Append(int64_t key, std::string_view value);
  // One result per key, in request order (found = false for absent keys).
  Status MultiGet(const std::vector<int64_t>& keys, std::vector<rpc::GetResult>* results);
  Status MultiPut(const std::vector<rpc::KvPair>& pairs);
  // Key order from "from" (see the service contract); resume with
  // result->nextKey until result->done.
  Status Scan(int64_t from, int32_t limit, bool reverse, rpc::ScanResult* result);
  // Insertion order; an empty cursor starts, result->cursor resumes.
  Status ScanLog(const std::string& cursor, int32_t limit, rpc::LogScanResult* result);

  // String keys: same contracts as the integer-key calls.
  Status SGet(std::string_view key, std::string* value);
  Status SPut(std::string_view key, std::string_view value);
  Status SRemove(std::string_view key, bool* existed = nullptr);

  // Admin calls. "token" is the server's admin.token (empty when none).
  Status SetWriteMode(const std::string& token, rpc::WriteMode::type mode);
  Status GetWriteMode(rpc::WriteMode::type* mode);
  Status Compact(const std::string& token);
  Status GetCompactionStatus(rpc::CompactionStatus* status);
  Status Info(rpc::NodeInfo* info);
  Status Stats(std::map<std::string, int64_t>* stats);
  // The ring as the server sees it (one partition of mark 0 standalone).
  Status Ring(rpc::RingInfo* ring);

  // Runs "call" with the generated client of this connection, with the same
  // connection handling and Status mapping as the calls above; retried once
  // on a fresh connection only if "idempotent" (see the file comment). For
  // the methods this class does not wrap, such as the calls between
  // instances, and for sending several calls before reading their answers
  // (send_x here, recv_x in a second Call with idempotent = false).
  Status Call(const char* method, bool idempotent,
              const std::function<void(rpc::FlatKVClient&)>& call);

 private:
  struct Connection;

  // Runs "call" on the connection, connecting first if needed, and maps
  // every exception onto a Status (see the file comment for the retry).
  template <typename Fn>
  Status Invoke(const char* method, bool idempotent, Fn&& call);

  // The TLS settings of options_, made on the first Connect() and again
  // when the files' stamp (TlsFilesStamp) changed.
  Status MakeTlsFactory();
  std::string TlsFilesStamp() const;

  const ClientOptions options_;
  std::shared_ptr<apache::thrift::transport::TSSLSocketFactory> tls_;  // with options_.tls()
  std::string tls_stamp_;  // of the files tls_ was made from (or last refused)
  std::unique_ptr<Connection> conn_;
  bool conn_used_ = false;  // the connection has completed a call
  bool network_failed_ = false;  // see network_failed()
  bool refused_ = false;         // see refused()
};

// The Status for a server's KvError (exposed for the ring-aware client).
Status FromKvError(const rpc::KvError& error);

}  // namespace flatkv::client
