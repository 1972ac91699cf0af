// Implementation notes
//
// Thrift's C++ client reports everything with exceptions: KvError for the
// declared errors, TTransportException for the network, TProtocolException
// and TApplicationException for a malformed or unexpected answer. Invoke() is
// the one place they become Status values (Kudu's hms_client.cc does the
// same). After any exception other than KvError the connection's state is
// unknown (half a frame may be unread), so it is dropped.
#include "client/client.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include <thrift/TApplicationException.h>
#include <thrift/TConfiguration.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>
#include <thrift/transport/TSSLSocket.h>
#include <thrift/transport/TSocket.h>
#include <thrift/transport/TTransportException.h>

namespace flatkv::client {

using apache::thrift::TConfiguration;
using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TFramedTransport;
using apache::thrift::transport::TSocket;
using apache::thrift::transport::TSSLSocketFactory;

struct Client::Connection {
  std::shared_ptr<TSocket> socket;
  std::shared_ptr<TFramedTransport> transport;
  rpc::FlatKVClient rpc;

  Connection(std::shared_ptr<TSocket> s, std::shared_ptr<TFramedTransport> t)
      : socket(std::move(s)),
        transport(std::move(t)),
        rpc(std::make_shared<TBinaryProtocol>(transport)) {}
};

Status FromKvError(const rpc::KvError& error) {
  const std::string& m = error.message;
  switch (error.code) {
    case rpc::ErrorCode::KEY_OUT_OF_RANGE: return Status::KeyOutOfRange(m);
    case rpc::ErrorCode::VALUE_TOO_LARGE: return Status::ValueTooLarge(m);
    case rpc::ErrorCode::INVALID_ARGUMENT: return Status::InvalidArgument(m);
    case rpc::ErrorCode::STORAGE_ERROR: return Status::IOError(m);
    case rpc::ErrorCode::NOT_OWNER: return Status::NotOwner(m);
    case rpc::ErrorCode::UNAUTHORIZED: return Status::Unauthorized(m);
    case rpc::ErrorCode::OVERLOADED: return Status::Busy(m);
    case rpc::ErrorCode::UNAVAILABLE: return Status::Unavailable(m);
  }
  return Status::IOError("unknown error code " + std::to_string(error.code) + ": " + m);
}

Client::Client(ClientOptions options) : options_(std::move(options)) {}

Client::~Client() { Close(); }

std::string Client::address() const {
  return options_.host + ":" + std::to_string(options_.port);
}

int Client::socket_fd() const {
  if (!conn_ || !conn_->socket->isOpen()) return -1;
  return static_cast<int>(conn_->socket->getSocketFD());
}

Status Client::Connect() {
  if (conn_) return Status::OK();
  const int frame = static_cast<int>(std::min<uint32_t>(options_.max_frame_bytes, INT32_MAX));
  auto config = std::make_shared<TConfiguration>(frame, frame);
  std::shared_ptr<TSocket> socket;
  if (options_.tls()) {
    if (std::string stamp = TlsFilesStamp(); !tls_ || stamp != tls_stamp_) {
      tls_stamp_ = std::move(stamp);  // a refused set is not read again until it changes
      Status st = MakeTlsFactory();
      if (!tls_) return st;  // else the files loaded before stay in use
    }
    socket = tls_->createSocket(options_.host, options_.port);
  } else {
    socket = std::make_shared<TSocket>(options_.host, options_.port, config);
  }
  socket->setConnTimeout(options_.connect_timeout_ms);
  socket->setSendTimeout(options_.timeout_ms);
  socket->setRecvTimeout(options_.timeout_ms);
  socket->setNoDelay(true);
  auto transport = std::make_shared<TFramedTransport>(socket, config);
  try {
    transport->open();
  } catch (const std::exception& e) {
    network_failed_ = true;
    // Thrift keeps no errno in its exception; its message ends with the
    // system's text for it.
    refused_ = std::string_view(e.what()).find(std::strerror(ECONNREFUSED)) != std::string_view::npos;
    return Status::IOError(address() + ": cannot connect: " + e.what());
  }
  refused_ = false;
  conn_ = std::make_unique<Connection>(std::move(socket), std::move(transport));
  conn_used_ = false;
  return Status::OK();
}

// Each file's modification time and size: a rewrite or a rename over it
// changes them.
std::string Client::TlsFilesStamp() const {
  std::string stamp;
  for (const std::string* path : {&options_.tls_ca_file, &options_.tls_cert_file,
                                  &options_.tls_key_file}) {
    struct stat st {};
    if (path->empty() || ::stat(path->c_str(), &st) != 0) {
      stamp += "-;";
      continue;
    }
    stamp += std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "/" +
             std::to_string(st.st_size) + ";";
  }
  return stamp;
}

Status Client::MakeTlsFactory() {
  if (options_.tls_cert_file.empty() != options_.tls_key_file.empty()) {
    return Status::InvalidArgument("a TLS client certificate needs its key and the key its "
                                   "certificate");
  }
  try {
    auto factory = std::make_shared<TSSLSocketFactory>(apache::thrift::transport::TLSv1_2);
    factory->loadTrustedCertificates(options_.tls_ca_file.c_str());
    if (!options_.tls_cert_file.empty()) {
      factory->loadCertificate(options_.tls_cert_file.c_str());
      factory->loadPrivateKey(options_.tls_key_file.c_str());
    }
    factory->authenticate(true);  // the server's certificate must verify
    // ... and name the host connected to.
    factory->access(std::make_shared<apache::thrift::transport::DefaultClientAccessManager>());
    tls_ = std::move(factory);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("TLS settings: ") + e.what());
  }
  return Status::OK();
}

void Client::Close() {
  if (!conn_) return;
  try {
    conn_->transport->close();
  } catch (const std::exception&) {
    // Closing a broken socket may complain; it is gone either way.
  }
  conn_.reset();
}

template <typename Fn>
Status Client::Invoke(const char* method, bool idempotent, Fn&& call) {
  for (int attempt = 0;; ++attempt) {
    const bool reused = conn_ != nullptr && conn_used_;
    network_failed_ = true;  // until the server answers
    refused_ = false;
    FLATKV_RETURN_IF_ERROR(Connect());
    std::string failure;
    try {
      call(conn_->rpc);
      conn_used_ = true;
      network_failed_ = false;
      return Status::OK();
    } catch (const rpc::KvError& e) {
      conn_used_ = true;  // a typed answer: the connection is in sync
      network_failed_ = false;
      return FromKvError(e);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    Close();
    if (!(reused && idempotent && attempt == 0)) {
      return Status::IOError(address() + ": " + method + ": " + failure);
    }
  }
}

Status Client::Get(int64_t key, std::string* value) {
  rpc::GetResult r;
  FLATKV_RETURN_IF_ERROR(Invoke("get", true, [&](rpc::FlatKVClient& c) { c.get(r, key); }));
  if (!r.found) return Status::NotFound("key " + std::to_string(key));
  *value = std::move(r.value);
  return Status::OK();
}

Status Client::Put(int64_t key, std::string_view value) {
  const std::string v(value);
  return Invoke("put", true, [&](rpc::FlatKVClient& c) { c.put(key, v); });
}

Status Client::Remove(int64_t key, bool* existed) {
  bool e = false;
  FLATKV_RETURN_IF_ERROR(Invoke("remove", true, [&](rpc::FlatKVClient& c) { e = c.remove(key); }));
  if (existed != nullptr) *existed = e;
  return Status::OK();
}

Status Client::Append(int64_t key, std::string_view value) {
  const std::string v(value);
  return Invoke("append", false, [&](rpc::FlatKVClient& c) { c.append(key, v); });
}

Status Client::MultiGet(const std::vector<int64_t>& keys, std::vector<rpc::GetResult>* results) {
  return Invoke("multiGet", true, [&](rpc::FlatKVClient& c) { c.multiGet(*results, keys); });
}

Status Client::MultiPut(const std::vector<rpc::KvPair>& pairs) {
  return Invoke("multiPut", true, [&](rpc::FlatKVClient& c) { c.multiPut(pairs); });
}

Status Client::Scan(int64_t from, int32_t limit, bool reverse, rpc::ScanResult* result) {
  return Invoke("scan", true,
                [&](rpc::FlatKVClient& c) { c.scan(*result, from, limit, reverse); });
}

Status Client::ScanLog(const std::string& cursor, int32_t limit, rpc::LogScanResult* result) {
  return Invoke("scanLog", true, [&](rpc::FlatKVClient& c) { c.scanLog(*result, cursor, limit); });
}

Status Client::SGet(std::string_view key, std::string* value) {
  rpc::GetResult r;
  const std::string k(key);
  FLATKV_RETURN_IF_ERROR(Invoke("sget", true, [&](rpc::FlatKVClient& c) { c.sget(r, k); }));
  if (!r.found) return Status::NotFound("string key of " + std::to_string(k.size()) + " bytes");
  *value = std::move(r.value);
  return Status::OK();
}

Status Client::SPut(std::string_view key, std::string_view value) {
  const std::string k(key), v(value);
  return Invoke("sput", true, [&](rpc::FlatKVClient& c) { c.sput(k, v); });
}

Status Client::SRemove(std::string_view key, bool* existed) {
  bool e = false;
  const std::string k(key);
  FLATKV_RETURN_IF_ERROR(Invoke("sremove", true, [&](rpc::FlatKVClient& c) { e = c.sremove(k); }));
  if (existed != nullptr) *existed = e;
  return Status::OK();
}

Status Client::SetWriteMode(const std::string& token, rpc::WriteMode::type mode) {
  return Invoke("setWriteMode", true, [&](rpc::FlatKVClient& c) { c.setWriteMode(token, mode); });
}

Status Client::GetWriteMode(rpc::WriteMode::type* mode) {
  return Invoke("getWriteMode", true, [&](rpc::FlatKVClient& c) { *mode = c.getWriteMode(); });
}

Status Client::Compact(const std::string& token) {
  return Invoke("compact", true, [&](rpc::FlatKVClient& c) { c.compact(token); });
}

Status Client::GetCompactionStatus(rpc::CompactionStatus* status) {
  return Invoke("compactionStatus", true,
                [&](rpc::FlatKVClient& c) { c.compactionStatus(*status); });
}

Status Client::Info(rpc::NodeInfo* info) {
  return Invoke("info", true, [&](rpc::FlatKVClient& c) { c.info(*info); });
}

Status Client::Stats(std::map<std::string, int64_t>* stats) {
  return Invoke("stats", true, [&](rpc::FlatKVClient& c) { c.stats(*stats); });
}

Status Client::Ring(rpc::RingInfo* ring) {
  return Invoke("ring", true, [&](rpc::FlatKVClient& c) { c.ring(*ring); });
}

Status Client::Call(const char* method, bool idempotent,
                    const std::function<void(rpc::FlatKVClient&)>& call) {
  return Invoke(method, idempotent, call);
}

}  // namespace flatkv::client
