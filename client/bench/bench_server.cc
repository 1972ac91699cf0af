// Implementation notes
//
// One Driver per thread owns an epoll instance and its connections, each
// registered for EPOLLIN (level-triggered) and for EPOLLOUT only while a
// request is partly written. A Connection holds two TMemoryBuffers, each
// under a TBinaryProtocolT<TMemoryBuffer> shared with a generated
// FlatKVClient:
//
//   out: reset, 4 placeholder bytes, send_<method>() appends the message,
//        then the placeholder becomes the big-endian frame length. The bytes
//        go to the socket straight from the buffer.
//   in:  recv() writes into the buffer (getWritePtr/wroteBytes) until the
//        length prefix and the whole frame are there; recv_<method>() then
//        reads the message and its readEnd() rewinds the buffer for the next
//        answer (it also resets Thrift's per-message size budget).
//
// Both buffers, the request objects (keys, values, KvPairs) and the answer
// objects (GetResult, the multiGet vector) live as long as the connection,
// so the steady state allocates nothing except what Thrift's generated code
// does itself (a multiGet answer's vector is cleared and refilled).
//
// A call's latency runs from just before its first send() to the moment its
// whole answer has been read, so it includes the time the call waited in the
// epoll loop behind other connections' answers, as redis-benchmark's does.
//
// With --zk (a ring), a Connection is one logical client with one socket
// (a Link) to every member it may call, chosen per partition by
// partition::Router, the same decision the server and RingClient make. A
// call's keys are routed by owner; each Link with keys sends its part, and
// the call completes when the last part is answered, so a batch spread over P
// partitions costs one round trip to the slowest of them. Without --zk a
// Connection has one Link and every key goes to it.
//
// Which keys are written: a bitmap of [0, num) (num / 8 bytes) shared by the
// threads. A put's keys are marked when its answer arrives; a get records,
// when it is sent, which of its keys were marked, and only those must be
// found (a key marked later may have been written after the server read it).
#include "client/bench/bench_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <thrift/TApplicationException.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "FlatKV.h"
#include "client/bench/bench_histogram.h"
#include "client/ring_client.h"
#include "client/bench/bench_workload.h"
#include "engine/status.h"
#include "partition/ring.h"
#include "partition/router.h"

namespace flatkv::client {
namespace {

using apache::thrift::TApplicationException;
using apache::thrift::protocol::TBinaryProtocolT;
using apache::thrift::transport::TMemoryBuffer;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;

// recv() size while an answer's length is still unknown.
constexpr uint32_t kReadChunk = 16384;
// Largest answer frame accepted; the server's own limit is lower.
constexpr uint32_t kMaxAnswerBytes = 256u << 20;
constexpr int kMaxEvents = 256;
// Requests from this size up are named as a likely cause when the server
// drops the connection (its smallest server.max_frame_bytes is 1 KiB).
constexpr uint32_t kLargeRequestBytes = 1024;
// epoll_wait timeout: how often a thread looks at the stop flag and the
// answer timeout when nothing arrives.
constexpr int kPollMs = 100;
// Per-key bytes mb_per_sec counts besides the value: the i64 key.
constexpr uint64_t kKeyBytes = 8;

struct WorkloadInfo {
  ServerWorkload workload;
  const char* name;
  int get_percent;
};

constexpr WorkloadInfo kWorkloads[] = {
    {ServerWorkload::kFill, "fill", 0},
    {ServerWorkload::kPut, "put", 0},
    {ServerWorkload::kGet, "get", 100},
    {ServerWorkload::kReadHeavy, "readheavy", 90},
    {ServerWorkload::kWriteHeavy, "writeheavy", 10},
};

enum class CallKind : uint8_t { kGet, kPut, kMultiGet, kMultiPut };

const char* CallName(CallKind kind) {
  switch (kind) {
    case CallKind::kGet: return "get";
    case CallKind::kPut: return "put";
    case CallKind::kMultiGet: return "multiGet";
    case CallKind::kMultiPut: return "multiPut";
  }
  return "?";
}

bool IsGet(CallKind kind) { return kind == CallKind::kGet || kind == CallKind::kMultiGet; }

// The keys of [0, num) this run has seen acknowledged as written.
class WrittenKeys {
 public:
  explicit WrittenKeys(uint64_t num) : words_((num + 63) / 64) {}
  void Mark(uint64_t key) {
    words_[key >> 6].fetch_or(uint64_t{1} << (key & 63), std::memory_order_release);
  }
  bool Contains(uint64_t key) const {
    return (words_[key >> 6].load(std::memory_order_acquire) >> (key & 63)) & 1;
  }

 private:
  std::vector<std::atomic<uint64_t>> words_;
};

// What every thread of one workload shares (read-only, except the atomics).
struct Plan {
  ServerWorkload workload = ServerWorkload::kFill;
  int get_percent = 0;
  uint64_t num = 0;
  uint32_t batch = 1;
  uint32_t value_size = 0;
  uint64_t seed = 0;                  // this workload's
  const ValueBuffer* values = nullptr;
  const ZipfTable* zipf = nullptr;    // --keys zipf only
  KeySpace space;                     // index -> the key sent (--key-dist)
  WrittenKeys* written = nullptr;
  std::atomic<bool>* stop = nullptr;  // set by the first thread that fails
  int timeout_ms = 0;
};

// One thread's share of a workload: ops left to issue, and for fill the
// next key of its slice.
struct Budget {
  uint64_t remaining = 0;
  uint64_t next_key = 0;
};

// What one thread measured.
struct ThreadResult {
  LatencyHistogram latency;  // per call, nanoseconds
  uint64_t ops = 0;          // keys answered
  uint64_t calls = 0;
  uint64_t gets = 0;         // keys read
  uint64_t puts = 0;         // keys written
  uint64_t found = 0;        // keys read that were found
  uint64_t errors = 0;       // keys of failed calls, plus failed checks
  std::string first_error;
  Clock::time_point end;
};

// Kept out of line: the hot path only counts.
[[gnu::noinline]] void AddError(ThreadResult* r, uint64_t keys, const std::string& what) {
  if (r->errors == 0) r->first_error = what;
  r->errors += keys;
}

struct Connection;

// One socket to one server (a ring member with --zk) and the part of the
// connection's call it carries.
struct Link {
  int fd = -1;
  Connection* conn = nullptr;
  size_t member = 0;  // index into Endpoints::addresses
  std::shared_ptr<TMemoryBuffer> out = std::make_shared<TMemoryBuffer>();
  std::shared_ptr<TMemoryBuffer> in = std::make_shared<TMemoryBuffer>();
  rpc::FlatKVClient rpc{std::make_shared<TBinaryProtocolT<TMemoryBuffer>>(in),
                        std::make_shared<TBinaryProtocolT<TMemoryBuffer>>(out)};
  bool want_out = false;  // EPOLLOUT registered
  SSL* ssl = nullptr;     // with --tls-ca: the TLS session over fd

  // This link's part of the call in flight.
  const uint8_t* unsent = nullptr;  // request bytes not yet written
  uint32_t unsent_len = 0;
  uint32_t request_len = 0;
  std::vector<int64_t> keys;
  std::vector<uint32_t> positions;  // of keys[i] in Connection::keys
  std::string value;                // put
  std::vector<rpc::KvPair> pairs;   // multiPut
  size_t npairs = 0;                // pairs in use (the rest keep their buffers)
  rpc::GetResult get_result;
  std::vector<rpc::GetResult> results;

  ~Link() {
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }
};

// One client: exactly one call in flight, over one Link per server it may
// call.
struct Connection {
  int number = 0;  // in [0, clients), for messages
  std::vector<std::unique_ptr<Link>> links;
  // With --zk: the link (index into links) that takes partition p's reads
  // and writes.
  std::vector<uint32_t> read_link, write_link;

  // The call in flight.
  CallKind kind = CallKind::kGet;
  Clock::time_point start;
  int pending = 0;  // links whose part is not answered yet
  std::vector<int64_t> keys;
  std::vector<uint8_t> expect;  // gets: keys[i] was known written when sent

  Rng rng{0};
  size_t value_pos = 0;
};

// Where the connections go: one server, or (with --zk) every member of a
// ring snapshot taken before the run.
struct Endpoints {
  std::vector<std::string> addresses;  // "host:port"
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> lens;
  std::shared_ptr<const partition::Ring> ring;  // null: one server
  std::shared_ptr<SSL_CTX> tls;                 // with --tls-ca
};

// OpenSSL's reason for the last failure (its error queue emptied).
std::string TlsError() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    if (text.empty()) text = buf;
  }
  return text.empty() ? "TLS failure" : text;
}

// The client context of --tls-ca/--tls-cert/--tls-key: TLS 1.2 or later,
// the server verified against the CAs.
Status MakeTlsContext(const std::string& ca, const std::string& cert, const std::string& key,
                      std::shared_ptr<SSL_CTX>* out) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx) return Status::IOError("cannot create a TLS context: " + TlsError());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_load_verify_locations(ctx.get(), ca.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("--tls-ca " + ca + ": " + TlsError());
  }
  if (!cert.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1)) {
    return Status::InvalidArgument("--tls-cert/--tls-key: " + TlsError());
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  *out = std::move(ctx);
  return Status::OK();
}

// The TLS handshake on the connected nonblocking socket "fd" to "host"
// (whose name or address the certificate must hold), within timeout_ms.
Status TlsHandshake(SSL_CTX* ctx, int fd, const std::string& host, int timeout_ms, SSL** out) {
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) return Status::IOError("SSL_new: " + TlsError());
  std::unique_ptr<SSL, void (*)(SSL*)> guard(ssl, SSL_free);
  in6_addr ip{};
  const bool is_ip = inet_pton(AF_INET, host.c_str(), &ip) == 1 ||
                     inet_pton(AF_INET6, host.c_str(), &ip) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1
            : (SSL_set_tlsext_host_name(ssl, host.c_str()) != 1 ||
               X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0) != 1)) {
    return Status::IOError("TLS: cannot set the expected name " + host + ": " + TlsError());
  }
  SSL_set_fd(ssl, fd);
  for (;;) {
    const int rc = SSL_connect(ssl);
    if (rc == 1) break;
    const int err = SSL_get_error(ssl, rc);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      const long verify = SSL_get_verify_result(ssl);
      return Status::IOError("TLS handshake: " + (verify != X509_V_OK
                                                      ? std::string(X509_verify_cert_error_string(verify))
                                                      : TlsError()));
    }
    pollfd p{fd, static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
    int n;
    do {
      n = ::poll(&p, 1, timeout_ms);
    } while (n < 0 && errno == EINTR);
    if (n == 0) return Status::IOError("TLS handshake: timed out");
  }
  *out = guard.release();
  return Status::OK();
}


std::string ErrnoText(int err) { return std::strerror(err); }

// Resolves host:port to the addresses to try, in getaddrinfo's order.
Status Resolve(const std::string& host, int port, std::vector<sockaddr_storage>* addrs,
               std::vector<socklen_t>* lens) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return Status::IOError("cannot resolve " + host + ": " + gai_strerror(rc));
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    addrs->push_back(s);
    lens->push_back(a->ai_addrlen);
  }
  ::freeaddrinfo(res);
  return Status::OK();
}

// Opens a nonblocking TCP connection with TCP_NODELAY, waiting at most
// timeout_ms for the handshake.
Status ConnectOne(const sockaddr_storage& addr, socklen_t len, int timeout_ms, int* fd_out) {
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("socket: " + ErrnoText(errno));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    int err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int rc;
      do {
        rc = ::poll(&p, 1, timeout_ms);
      } while (rc < 0 && errno == EINTR);
      socklen_t err_len = sizeof(err);
      if (rc == 0) {
        err = ETIMEDOUT;
      } else if (rc < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) {
        err = errno;
      }
    }
    if (err != 0) {
      ::close(fd);
      return Status::IOError(ErrnoText(err));
    }
  }
  *fd_out = fd;
  return Status::OK();
}

// One thread's epoll loop over its connections.
class Driver {
 public:
  Driver(const ServerBenchFlags& flags, const Endpoints& endpoints, int first_connection,
         int connections)
      : flags_(flags), ends_(endpoints), first_(first_connection), count_(connections) {}
  ~Driver() {
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Opens this driver's connections: one link to the server, or with a ring
  // one to each member that some partition's reads or writes go to.
  Status Connect() {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return Status::IOError("epoll_create1: " + ErrnoText(errno));
    for (int i = 0; i < count_; ++i) {
      auto c = std::make_unique<Connection>();
      c->number = first_ + i;
      c->keys.reserve(flags_.batch);
      c->expect.resize(flags_.batch);
      if (ends_.ring) {
        FLATKV_RETURN_IF_ERROR(RouteConnection(c.get()));
      } else {
        FLATKV_RETURN_IF_ERROR(AddLink(c.get(), 0));
      }
      connections_.push_back(std::move(c));
    }
    return Status::OK();
  }

  // Runs this thread's share of a workload to the end, or until a transport
  // failure here (returned) or in another thread (plan.stop; returns OK).
  Status Run(const Plan& plan, Budget budget, int position, ThreadResult* r) {
    plan_ = &plan;
    budget_ = budget;
    for (auto& c : connections_) {
      c->rng = Rng(SplitMix64(plan.seed ^ SplitMix64(static_cast<uint64_t>(c->number) + 1)));
      c->value_pos = (static_cast<size_t>(c->number) * 4099 + static_cast<size_t>(position)) %
                     plan.values->size();
    }
    Status s = Loop(r);
    r->end = Clock::now();
    if (!s.ok()) plan.stop->store(true);
    return s;
  }

 private:
  // Chooses, for each partition, the member its reads and its writes go to
  // (Router::Target, spread by connection number) and opens a link to each
  // member chosen.
  Status RouteConnection(Connection* c) {
    const partition::Ring& ring = *ends_.ring;
    std::vector<int> link_of(ends_.addresses.size(), -1);
    auto link_for = [&](const partition::Partition& p, bool write, uint32_t* link) -> Status {
      const partition::Member* m = partition::Router::Target(
          p, write, ring.settings().replication, static_cast<uint64_t>(c->number));
      if (m == nullptr) {
        return Status::Unavailable("mark " + std::to_string(p.mark) + " has no member serving");
      }
      size_t member = static_cast<size_t>(
          std::find(ends_.addresses.begin(), ends_.addresses.end(), m->address()) -
          ends_.addresses.begin());
      if (link_of[member] < 0) {
        link_of[member] = static_cast<int>(c->links.size());
        FLATKV_RETURN_IF_ERROR(AddLink(c, member));
      }
      *link = static_cast<uint32_t>(link_of[member]);
      return Status::OK();
    };
    for (const partition::Partition& p : ring.partitions()) {
      c->read_link.push_back(0);
      c->write_link.push_back(0);
      FLATKV_RETURN_IF_ERROR(link_for(p, false, &c->read_link.back()));
      FLATKV_RETURN_IF_ERROR(link_for(p, true, &c->write_link.back()));
    }
    return Status::OK();
  }

  Status AddLink(Connection* c, size_t member) {
    auto l = std::make_unique<Link>();
    l->conn = c;
    l->member = member;
    l->keys.reserve(flags_.batch);
    l->positions.reserve(flags_.batch);
    Status s = ConnectOne(ends_.addrs[member], ends_.lens[member], flags_.timeout_ms, &l->fd);
    if (s.ok() && ends_.tls) {
      const std::string& address = ends_.addresses[member];
      std::string host = address.substr(0, address.rfind(':'));
      if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
      s = TlsHandshake(ends_.tls.get(), l->fd, host, flags_.timeout_ms, &l->ssl);
    }
    if (!s.ok()) {
      return Status::IOError("cannot connect to " + ends_.addresses[member] + ": " + s.message());
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = l.get();
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, l->fd, &ev) != 0) {
      return Status::IOError("epoll_ctl: " + ErrnoText(errno));
    }
    c->links.push_back(std::move(l));
    return Status::OK();
  }

  std::string Where(const Link& l) const {
    return "connection " + std::to_string(l.conn->number) + " to " + ends_.addresses[l.member];
  }
  // The call a lost connection had in flight; the server closes the
  // connection of a request over its server.max_frame_bytes, which a large
  // --value-size or --batch can reach.
  static std::string InFlight(const Link& l) {
    std::string s = " during a " + std::string(CallName(l.conn->kind)) + " call of " +
                    std::to_string(l.request_len) + " bytes";
    if (l.request_len > kLargeRequestBytes) s += " (over the server's server.max_frame_bytes?)";
    return s;
  }
  std::string Servers() const {
    return ends_.ring ? "the ring's " + std::to_string(ends_.addresses.size()) + " members"
                      : ends_.addresses[0];
  }

  Status Loop(ThreadResult* r) {
    int in_flight = 0;
    for (auto& c : connections_) {
      if (!NextCall(c.get())) break;
      FLATKV_RETURN_IF_ERROR(Send(c.get()));
      ++in_flight;
    }
    epoll_event events[kMaxEvents];
    Clock::time_point last_answer = Clock::now();
    while (in_flight > 0) {
      if (plan_->stop->load(std::memory_order_relaxed)) return Status::OK();
      int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, kPollMs);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::IOError("epoll_wait: " + ErrnoText(errno));
      }
      if (n == 0) {
        auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                                            last_answer);
        if (waited.count() >= plan_->timeout_ms) {
          return Status::IOError("no answer from " + Servers() + " in " +
                                 std::to_string(plan_->timeout_ms) + " ms (" +
                                 std::to_string(in_flight) + " calls in flight)");
        }
        continue;
      }
      for (int i = 0; i < n; ++i) {
        Link* l = static_cast<Link*>(events[i].data.ptr);
        if ((events[i].events & EPOLLOUT) && l->unsent_len > 0) {
          FLATKV_RETURN_IF_ERROR(Write(l));
        }
        if (!(events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
        bool complete = false;
        FLATKV_RETURN_IF_ERROR(Read(l, &complete));
        if (!complete) continue;
        last_answer = Clock::now();
        FLATKV_RETURN_IF_ERROR(FinishPart(l, r));
        Connection* c = l->conn;
        if (--c->pending > 0) continue;
        FinishCall(c, last_answer, r);
        if (NextCall(c)) {
          FLATKV_RETURN_IF_ERROR(Send(c));
        } else {
          --in_flight;
        }
      }
    }
    return Status::OK();
  }

  int64_t NextKey(Connection* c) {
    if (plan_->workload == ServerWorkload::kFill) return static_cast<int64_t>(budget_.next_key++);
    if (plan_->zipf != nullptr) return plan_->zipf->Draw(c->rng);
    return static_cast<int64_t>(c->rng.Uniform(plan_->num));
  }

  // Chooses c's next call (kind and keys) from the thread's budget; false
  // once the budget is spent.
  bool NextCall(Connection* c) {
    if (budget_.remaining == 0) return false;
    const Plan& p = *plan_;
    uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(p.batch, budget_.remaining));
    budget_.remaining -= n;
    bool get = p.get_percent >= 100 ||
               (p.get_percent > 0 && c->rng.Uniform(100) < static_cast<uint64_t>(p.get_percent));
    c->keys.resize(n);
    for (uint32_t i = 0; i < n; ++i) c->keys[i] = NextKey(c);
    if (get) {
      c->kind = p.batch > 1 ? CallKind::kMultiGet : CallKind::kGet;
      for (uint32_t i = 0; i < n; ++i) {
        c->expect[i] = p.written->Contains(static_cast<uint64_t>(c->keys[i]));
      }
    } else {
      c->kind = p.batch > 1 ? CallKind::kMultiPut : CallKind::kPut;
    }
    return true;
  }

  // Hands each of c's keys (and, for puts, its value) to the link that
  // serves it.
  void Split(Connection* c) {
    for (auto& l : c->links) {
      l->keys.clear();
      l->positions.clear();
      l->npairs = 0;
    }
    const bool write = !IsGet(c->kind);
    for (uint32_t i = 0; i < c->keys.size(); ++i) {
      // Connections count in indexes of [0, num); the call carries the key.
      const int64_t key = plan_->space.Key(static_cast<uint64_t>(c->keys[i]));
      Link* l = c->links[0].get();
      if (ends_.ring) {
        size_t p = ends_.ring->OwnerIndex(partition::Ring::HashKey(key));
        l = c->links[write ? c->write_link[p] : c->read_link[p]].get();
      }
      l->keys.push_back(key);
      l->positions.push_back(i);
      if (c->kind == CallKind::kPut) {
        l->value.assign(plan_->values->Next(&c->value_pos));
      } else if (c->kind == CallKind::kMultiPut) {
        if (l->pairs.size() == l->npairs) l->pairs.emplace_back();
        rpc::KvPair& pair = l->pairs[l->npairs++];
        pair.key = key;
        pair.value.assign(plan_->values->Next(&c->value_pos));
      }
    }
  }

  // Encodes l's part of the call as one frame in l->out (see the
  // implementation notes).
  Status Encode(Link* l) {
    const CallKind kind = l->conn->kind;
    try {
      l->out->resetBuffer();
      static const uint8_t kPlaceholder[4] = {0, 0, 0, 0};
      l->out->write(kPlaceholder, sizeof(kPlaceholder));
      switch (kind) {
        case CallKind::kGet: l->rpc.send_get(l->keys[0]); break;
        case CallKind::kPut: l->rpc.send_put(l->keys[0], l->value); break;
        case CallKind::kMultiGet: l->rpc.send_multiGet(l->keys); break;
        case CallKind::kMultiPut:
          l->pairs.resize(l->npairs);
          l->rpc.send_multiPut(l->pairs);
          break;
      }
    } catch (const std::exception& e) {
      return Status::IOError(std::string("encoding a ") + CallName(kind) + ": " + e.what());
    }
    uint8_t* frame = nullptr;
    uint32_t len = 0;
    l->out->getBuffer(&frame, &len);
    uint32_t body = htonl(len - 4);
    std::memcpy(frame, &body, sizeof(body));
    l->unsent = frame;
    l->unsent_len = len;
    l->request_len = len;
    return Status::OK();
  }

  // Sends every part of c's call.
  Status Send(Connection* c) {
    Split(c);
    c->pending = 0;
    c->start = Clock::now();
    for (auto& l : c->links) {
      if (l->keys.empty()) continue;
      FLATKV_RETURN_IF_ERROR(Encode(l.get()));
      FLATKV_RETURN_IF_ERROR(Write(l.get()));
      ++c->pending;
    }
    return Status::OK();
  }

  // An SSL_read/SSL_write result "rc" as send()/recv() would give it: the
  // bytes, 0 at a clean close, or -1 with errno (EAGAIN: wait for epoll).
  static ssize_t TlsIo(SSL* ssl, int rc) {
    if (rc > 0) return rc;
    switch (SSL_get_error(ssl, rc)) {
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE:
        errno = EAGAIN;
        return -1;
      case SSL_ERROR_ZERO_RETURN:
        return 0;
      default:
        ERR_clear_error();
        errno = ECONNRESET;
        return -1;
    }
  }

  // Writes what the socket takes of l's request; waits for EPOLLOUT while
  // some is left.
  Status Write(Link* l) {
    while (l->unsent_len > 0) {
      ssize_t n = l->ssl != nullptr ? TlsIo(l->ssl, SSL_write(l->ssl, l->unsent, static_cast<int>(l->unsent_len)))
                                    : ::send(l->fd, l->unsent, l->unsent_len, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return Status::IOError(Where(*l) + ": send: " + ErrnoText(errno) + InFlight(*l));
      }
      l->unsent += n;
      l->unsent_len -= static_cast<uint32_t>(n);
    }
    bool want_out = l->unsent_len > 0;
    if (want_out == l->want_out) return Status::OK();
    epoll_event ev{};
    ev.events = want_out ? uint32_t{EPOLLIN | EPOLLOUT} : uint32_t{EPOLLIN};
    ev.data.ptr = l;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, l->fd, &ev) != 0) {
      return Status::IOError("epoll_ctl: " + ErrnoText(errno));
    }
    l->want_out = want_out;
    return Status::OK();
  }

  static uint32_t FrameLength(Link* l) {
    uint8_t* p = nullptr;
    uint32_t have = 0;
    l->in->getBuffer(&p, &have);
    uint32_t len = 0;
    std::memcpy(&len, p, sizeof(len));
    return ntohl(len);
  }

  // One recv() into l->in; *complete once it holds one whole answer frame.
  Status Read(Link* l, bool* complete) {
    uint32_t have = l->in->available_read();
    uint32_t want = have >= 4 ? 4 + FrameLength(l) - have : kReadChunk;
    uint8_t* dst = l->in->getWritePtr(want);
    ssize_t n = l->ssl != nullptr ? TlsIo(l->ssl, SSL_read(l->ssl, dst, static_cast<int>(want)))
                                  : ::recv(l->fd, dst, want, 0);
    if (n == 0) {
      return Status::IOError(Where(*l) + ": the server closed the connection" + InFlight(*l));
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::OK();
      return Status::IOError(Where(*l) + ": recv: " + ErrnoText(errno) + InFlight(*l));
    }
    l->in->wroteBytes(static_cast<uint32_t>(n));
    have += static_cast<uint32_t>(n);
    if (have < 4) {
      if (l->ssl != nullptr && SSL_pending(l->ssl) > 0) return Read(l, complete);
      return Status::OK();
    }
    uint32_t frame = FrameLength(l);
    if (frame > kMaxAnswerBytes) {
      return Status::IOError(Where(*l) + ": malformed answer: frame of " + std::to_string(frame) +
                             " bytes");
    }
    if (have - 4 < frame) {
      // TLS: the rest may already be decrypted inside the SSL, where epoll
      // cannot see it.
      if (l->ssl != nullptr && SSL_pending(l->ssl) > 0) return Read(l, complete);
      return Status::OK();
    }
    if (have - 4 > frame) {
      return Status::IOError(Where(*l) + ": malformed answer: " + std::to_string(have - 4 - frame) +
                             " bytes after the frame");
    }
    *complete = true;
    return Status::OK();
  }

  // Decodes the answer in l->in. A KvError or TApplicationException is an
  // answer: its text goes to *error. Anything else means the bytes were not
  // a valid answer to the call: IOError.
  Status Decode(Link* l, std::string* error) {
    const CallKind kind = l->conn->kind;
    try {
      uint8_t header[4];
      l->in->readAll(header, sizeof(header));
      switch (kind) {
        case CallKind::kGet: l->rpc.recv_get(l->get_result); break;
        case CallKind::kPut: l->rpc.recv_put(); break;
        case CallKind::kMultiGet: l->rpc.recv_multiGet(l->results); break;
        case CallKind::kMultiPut: l->rpc.recv_multiPut(); break;
      }
    } catch (const rpc::KvError& e) {
      *error = "KvError " + rpc::to_string(e.code) + ": " + e.message;
    } catch (const TApplicationException& e) {
      *error = std::string("TApplicationException: ") + e.what();
    } catch (const std::exception& e) {
      return Status::IOError(Where(*l) + ": malformed answer to " + CallName(kind) + ": " +
                             e.what());
    }
    if (l->in->available_read() != 0) {
      return Status::IOError(Where(*l) + ": malformed answer to " + CallName(kind) + ": " +
                             std::to_string(l->in->available_read()) + " bytes left over");
    }
    return Status::OK();
  }

  // l's part of the call has its answer: decode it and check it.
  Status FinishPart(Link* l, ThreadResult* r) {
    const Connection& c = *l->conn;
    const uint32_t n = static_cast<uint32_t>(l->keys.size());
    std::string error;
    FLATKV_RETURN_IF_ERROR(Decode(l, &error));
    if (!error.empty()) {
      AddError(r, n, std::string(CallName(c.kind)) + " of key " + std::to_string(l->keys[0]) +
                         (n > 1 ? " and " + std::to_string(n - 1) + " more" : "") + " at " +
                         ends_.addresses[l->member] + ": " + error);
      return Status::OK();
    }
    switch (c.kind) {
      case CallKind::kPut:
      case CallKind::kMultiPut:
        for (uint32_t pos : l->positions) plan_->written->Mark(static_cast<uint64_t>(c.keys[pos]));
        break;
      case CallKind::kGet:
        Check(c, l->positions[0], l->get_result, r);
        break;
      case CallKind::kMultiGet:
        if (l->results.size() != n) {
          AddError(r, n, "multiGet of " + std::to_string(n) + " keys answered " +
                             std::to_string(l->results.size()) + " results");
          break;
        }
        for (uint32_t i = 0; i < n; ++i) Check(c, l->positions[i], l->results[i], r);
        break;
    }
    return Status::OK();
  }

  // Every part of c's call is answered: time and count it.
  static void FinishCall(const Connection* c, Clock::time_point now, ThreadResult* r) {
    r->latency.Record(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - c->start).count()));
    const uint64_t n = c->keys.size();
    ++r->calls;
    r->ops += n;
    (IsGet(c->kind) ? r->gets : r->puts) += n;
  }

  // A get of a key known written must find --value-size bytes.
  void Check(const Connection& c, uint32_t i, const rpc::GetResult& got, ThreadResult* r) {
    if (got.found) {
      ++r->found;
      if (c.expect[i] && got.value.size() != plan_->value_size) {
        AddError(r, 1, "get of key " + std::to_string(c.keys[i]) + " returned " +
                           std::to_string(got.value.size()) + " bytes, expected " +
                           std::to_string(plan_->value_size));
      }
    } else if (c.expect[i]) {
      AddError(r, 1, "key " + std::to_string(c.keys[i]) +
                         " was written (acknowledged) but a later get did not find it");
    }
  }

  const ServerBenchFlags& flags_;
  const Endpoints& ends_;
  const int first_;  // number of this driver's first connection
  const int count_;
  int epoll_fd_ = -1;
  std::vector<std::unique_ptr<Connection>> connections_;
  const Plan* plan_ = nullptr;
  Budget budget_;
};

// One output line's worth of numbers.
struct Report {
  const char* workload = "";
  uint64_t ops = 0;
  uint64_t calls = 0;
  uint64_t gets = 0;
  uint64_t puts = 0;
  uint64_t found = 0;
  uint64_t errors = 0;
  double seconds = 0;
  double ops_per_sec = 0;
  double calls_per_sec = 0;
  double mb_per_sec = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0, max_us = 0, min_us = 0, mean_us = 0;
  size_t members = 1;  // servers called: 1, or the ring's members with --zk
};

double Micros(uint64_t nanos) { return static_cast<double>(nanos) / 1e3; }

Report MakeReport(const ServerBenchFlags& f, ServerWorkload w, double seconds,
                  const std::vector<ThreadResult>& per_thread, std::string* first_error) {
  Report rep;
  rep.workload = ServerWorkloadName(w);
  rep.seconds = seconds;
  LatencyHistogram latency;
  for (const ThreadResult& r : per_thread) {
    latency.Merge(r.latency);
    rep.ops += r.ops;
    rep.calls += r.calls;
    rep.gets += r.gets;
    rep.puts += r.puts;
    rep.found += r.found;
    if (rep.errors == 0 && r.errors > 0) *first_error = r.first_error;
    rep.errors += r.errors;
  }
  // A zero interval reports 0, never inf: JSON has no infinity.
  if (seconds > 0) {
    rep.ops_per_sec = static_cast<double>(rep.ops) / seconds;
    rep.calls_per_sec = static_cast<double>(rep.calls) / seconds;
    rep.mb_per_sec =
        static_cast<double>(rep.ops) * static_cast<double>(kKeyBytes + f.value_size) / seconds / 1e6;
  }
  rep.p50_us = Micros(latency.Percentile(0.50));
  rep.p99_us = Micros(latency.Percentile(0.99));
  rep.p999_us = Micros(latency.Percentile(0.999));
  rep.max_us = Micros(latency.max());
  rep.min_us = Micros(latency.min());
  rep.mean_us = latency.Mean() / 1e3;
  return rep;
}

// The host as a JSON string body: it is the one user-given string printed.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

// Field names are a contract (client/bench/README.md): add, never rename.
void PrintJson(const ServerBenchFlags& f, const Report& r) {
  std::printf(
      "{\"mode\":\"server\",\"workload\":\"%s\",\"keys\":\"%s\",\"clients\":%d,\"threads\":%d,"
      "\"batch\":%u,\"ops\":%" PRIu64 ",\"calls\":%" PRIu64
      ",\"seconds\":%.9f,\"ops_per_sec\":%.1f,\"calls_per_sec\":%.1f,\"mb_per_sec\":%.3f,"
      "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"errors\":%" PRIu64
      ",\"value_size\":%u,\"host\":\"%s\",\"port\":%d,\"num\":%" PRIu64 ",\"gets\":%" PRIu64
      ",\"puts\":%" PRIu64 ",\"found\":%" PRIu64
      ",\"min_us\":%.1f,\"mean_us\":%.1f,\"zk\":\"%s\",\"path\":\"%s\",\"members\":%zu,"
      "\"key_dist\":\"%s\"}\n",
      r.workload, KeyDistributionName(f.keys), f.clients, f.threads, f.batch, r.ops, r.calls,
      r.seconds, r.ops_per_sec, r.calls_per_sec, r.mb_per_sec, r.p50_us, r.p99_us, r.p999_us,
      r.max_us, r.errors, f.value_size, JsonEscape(f.host).c_str(), f.port, ServerKeySpace(f),
      r.gets, r.puts, r.found, r.min_us, r.mean_us, JsonEscape(f.zk).c_str(),
      JsonEscape(f.zk_path).c_str(), r.members, KeyDistName(f.space.dist));
}

// get        :   52341 ops/sec   5.6 MB/s  p50 901.1 p99 2210.3 p999 4000.2 max 9000.1 us
//     (127.0.0.1:9901, 100 B, uniform, 50 clients, 1 thr, 100000 of 100000 found)
void PrintText(const ServerBenchFlags& f, const Report& r) {
  std::string extra;
  if (f.batch > 1) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", batch %u: %.0f calls/sec", f.batch, r.calls_per_sec);
    extra += buf;
  }
  if (r.gets > 0) extra += ", " + std::to_string(r.found) + " of " + std::to_string(r.gets) + " found";
  if (r.errors > 0) extra += ", " + std::to_string(r.errors) + " errors";
  std::string where = f.host + ":" + std::to_string(f.port);
  if (!f.zk.empty()) where = "ring of " + std::to_string(r.members) + " at " + f.zk + f.zk_path;
  std::printf("%-10s : %8.0f ops/sec %6.1f MB/s  p50 %.1f p99 %.1f p999 %.1f max %.1f us"
              "  (%s, %u B, %s, %s keys, %d clients, %d thr%s)\n",
              r.workload, r.ops_per_sec, r.mb_per_sec, r.p50_us, r.p99_us, r.p999_us, r.max_us,
              where.c_str(), f.value_size, KeyDistributionName(f.keys), KeyDistName(f.space.dist),
              f.clients,
              f.threads, extra.c_str());
}

// Runs one workload on every driver. Returns a transport failure; op errors
// are in the report.
Status RunOne(const ServerBenchFlags& f, ServerWorkload w, int position,
              const std::vector<std::unique_ptr<Driver>>& drivers, const ValueBuffer& values,
              WrittenKeys* written, Report* report, std::string* first_error) {
  const uint64_t num = ServerKeySpace(f);
  Plan plan;
  plan.workload = w;
  plan.get_percent = ServerWorkloadGetPercent(w);
  plan.num = num;
  plan.space = f.space;
  plan.space.seed = SplitMix64(f.seed ^ 0x6b65792d64697374ULL);  // as engine mode's
  plan.batch = f.batch;
  plan.value_size = f.value_size;
  plan.seed = SplitMix64(f.seed + static_cast<uint64_t>(position) * 0x9e3779b97f4a7c15ULL);
  plan.values = &values;
  plan.written = written;
  std::atomic<bool> stop{false};
  plan.stop = &stop;
  plan.timeout_ms = f.timeout_ms;
  // Built before the clock starts; the same seed every workload, so every
  // Zipf workload of a run has the same hot keys.
  std::unique_ptr<ZipfTable> zipf;
  if (f.keys == KeyDistribution::kZipf && w != ServerWorkload::kFill) {
    zipf = std::make_unique<ZipfTable>(num, SplitMix64(f.seed ^ 0x7a697066ULL));
    plan.zipf = zipf.get();
  }
  const uint64_t total = w == ServerWorkload::kFill ? num : f.ops;
  const uint64_t threads = drivers.size();
  std::vector<ThreadResult> per_thread(threads);
  std::vector<Status> status(threads);
  Clock::time_point start = RunTogether(static_cast<int>(threads), [&](int t) {
    uint64_t ut = static_cast<uint64_t>(t);
    Budget b;
    b.next_key = total * ut / threads;
    b.remaining = total * (ut + 1) / threads - b.next_key;
    status[t] = drivers[t]->Run(plan, b, position, &per_thread[t]);
  });
  for (const Status& s : status) {
    if (!s.ok()) return s;
  }
  Clock::time_point end = start;
  for (const ThreadResult& r : per_thread) end = std::max(end, r.end);
  *report = MakeReport(f, w, std::chrono::duration<double>(end - start).count(), per_thread,
                       first_error);
  return Status::OK();
}

}  // namespace

bool ParseServerWorkload(std::string_view name, ServerWorkload* workload) {
  for (const WorkloadInfo& info : kWorkloads) {
    if (name == info.name) {
      *workload = info.workload;
      return true;
    }
  }
  return false;
}

const char* ServerWorkloadName(ServerWorkload workload) {
  for (const WorkloadInfo& info : kWorkloads) {
    if (info.workload == workload) return info.name;
  }
  return "unknown";
}

const char* ServerWorkloadNameList() { return "fill|put|get|readheavy|writeheavy"; }

int ServerWorkloadGetPercent(ServerWorkload workload) {
  for (const WorkloadInfo& info : kWorkloads) {
    if (info.workload == workload) return info.get_percent;
  }
  return 0;
}

bool ParseKeyDistribution(std::string_view name, KeyDistribution* distribution) {
  if (name == "uniform") {
    *distribution = KeyDistribution::kUniform;
  } else if (name == "zipf") {
    *distribution = KeyDistribution::kZipf;
  } else {
    return false;
  }
  return true;
}

const char* KeyDistributionName(KeyDistribution distribution) {
  return distribution == KeyDistribution::kZipf ? "zipf" : "uniform";
}

uint64_t ServerKeySpace(const ServerBenchFlags& flags) {
  return flags.num != 0 ? flags.num : flags.ops;
}

namespace {

// The one server of --host/--port: the first of its addresses that accepts a
// connection.
Status ServerEndpoint(const ServerBenchFlags& f, Endpoints* ends) {
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> lens;
  FLATKV_RETURN_IF_ERROR(Resolve(f.host, f.port, &addrs, &lens));
  Status s;
  for (size_t i = 0; i < addrs.size(); ++i) {
    int fd = -1;
    s = ConnectOne(addrs[i], lens[i], f.timeout_ms, &fd);
    if (s.ok()) {
      ::close(fd);
      ends->addresses.push_back(f.host + ":" + std::to_string(f.port));
      ends->addrs.push_back(addrs[i]);
      ends->lens.push_back(lens[i]);
      return Status::OK();
    }
  }
  return Status::IOError("cannot connect to " + f.host + ":" + std::to_string(f.port) + ": " +
                         s.message());
}

// Every member of the ring under --zk/--path, read once: the run routes by
// this snapshot (a ring change during the run shows as NOT_OWNER errors).
Status RingEndpoints(const ServerBenchFlags& f, Endpoints* ends) {
  RingClientOptions o;
  o.zookeeper = f.zk;
  o.service_path = f.zk_path;
  o.open_timeout_ms = f.timeout_ms;
  std::unique_ptr<RingClient> rc;
  FLATKV_RETURN_IF_ERROR(RingClient::Open(std::move(o), &rc));
  ends->ring = rc->ring();
  for (const partition::Partition& p : ends->ring->partitions()) {
    for (const partition::Member& m : p.chain) {
      if (std::find(ends->addresses.begin(), ends->addresses.end(), m.address()) !=
          ends->addresses.end()) {
        continue;
      }
      std::vector<sockaddr_storage> addrs;
      std::vector<socklen_t> lens;
      FLATKV_RETURN_IF_ERROR(Resolve(m.host, m.port, &addrs, &lens));
      if (addrs.empty()) return Status::IOError("no address for ring member " + m.address());
      ends->addresses.push_back(m.address());
      ends->addrs.push_back(addrs[0]);
      ends->lens.push_back(lens[0]);
    }
  }
  if (ends->addresses.empty()) {
    return Status::Unavailable("the ring at " + f.zk + f.zk_path + " has no members");
  }
  return Status::OK();
}

}  // namespace

int RunServerBench(const ServerBenchFlags& f) {
  Endpoints ends;
  Status s = f.zk.empty() ? ServerEndpoint(f, &ends) : RingEndpoints(f, &ends);
  if (s.ok() && f.tls_ca.empty() && !(f.tls_cert.empty() && f.tls_key.empty())) {
    s = Status::InvalidArgument("--tls-cert and --tls-key need --tls-ca");
  }
  if (s.ok() && !f.tls_ca.empty()) s = MakeTlsContext(f.tls_ca, f.tls_cert, f.tls_key, &ends.tls);
  if (!s.ok()) {
    std::fprintf(stderr, "flatkv-bench: %s\n", s.message().c_str());
    return kExitFailure;
  }
  if (ends.ring) {
    std::fprintf(stderr, "flatkv-bench: ring version %" PRId64 ", %zu members: %s\n",
                 ends.ring->version(), ends.addresses.size(), ends.ring->ToString().c_str());
  }
  std::vector<std::unique_ptr<Driver>> drivers;
  for (int t = 0; t < f.threads; ++t) {
    int first = f.clients * t / f.threads;
    int count = f.clients * (t + 1) / f.threads - first;
    drivers.push_back(std::make_unique<Driver>(f, ends, first, count));
    s = drivers.back()->Connect();
    if (!s.ok()) {
      std::fprintf(stderr, "flatkv-bench: %s\n", s.message().c_str());
      return kExitFailure;
    }
  }
  ValueBuffer values(f.value_size, f.seed);
  WrittenKeys written(ServerKeySpace(f));
  int exit_code = kExitOk;
  for (size_t i = 0; i < f.workloads.size(); ++i) {
    ServerWorkload w = f.workloads[i];
    Report rep;
    std::string first_error;
    s = RunOne(f, w, static_cast<int>(i), drivers, values, &written, &rep, &first_error);
    rep.members = ends.addresses.size();
    if (!s.ok()) {
      std::fprintf(stderr, "flatkv-bench: %s: %s\n", ServerWorkloadName(w), s.message().c_str());
      return kExitFailure;
    }
    if (f.json) {
      PrintJson(f, rep);
    } else {
      PrintText(f, rep);
    }
    std::fflush(stdout);
    if (rep.errors > 0) {
      std::fprintf(stderr, "flatkv-bench: %s: %" PRIu64 " errors; first: %s\n", rep.workload,
                   rep.errors, first_error.c_str());
      exit_code = kExitFailure;
    }
    if (rep.errors == 0 && rep.found < rep.gets) {
      std::fprintf(stderr,
                   "flatkv-bench: note: %s: %" PRIu64 " of %" PRIu64
                   " gets found nothing (keys never written; run fill first, e.g. "
                   "--workload fill,%s)\n",
                   rep.workload, rep.gets - rep.found, rep.gets, rep.workload);
    }
  }
  return exit_code;
}

}  // namespace flatkv::client
