// flatkv-redis-bench: the anchor a FlatKV chain is measured against (issue
// 10): Redis SETs, each followed by `WAIT <replicas> 0` (the primary
// answers once that many replicas have received the write), driven the way
// `flatkv-bench server` drives FlatKV: --clients connections from one epoll
// loop, one call in flight on each, uniform keys over [0, --num), latency
// per call (the SET and its WAIT, sent together in one write) in the same
// histogram and printed in the same line format. redis-benchmark cannot
// pair a WAIT with each SET.
//
//   flatkv-redis-bench [--host H] [--port P] [--clients C] [--ops N] [--num K]
//                      [--value-size B] [--wait R] [--seed S]
//
// --wait 0 sends the SETs alone. A WAIT answering fewer than R replicas, or
// any error reply, counts as an error (reported; exit 1).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "client/bench/bench_histogram.h"

namespace {

struct Flags {
  std::string host = "127.0.0.1";
  int port = 6379;
  int clients = 50;
  uint64_t ops = 100000;
  uint64_t num = 0;  // 0: --ops
  size_t value_size = 100;
  int wait = 1;
  uint64_t seed = 301;
};

struct Conn {
  int fd = -1;
  std::string out;      // request bytes not yet written
  size_t out_off = 0;
  std::string in;       // reply bytes not yet parsed
  int replies_due = 0;  // replies the call in flight still needs
  bool failed_call = false;
  uint64_t started = 0;
};

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void Bulk(std::string* out, std::string_view s) {
  *out += '$';
  *out += std::to_string(s.size());
  *out += "\r\n";
  out->append(s.data(), s.size());
  *out += "\r\n";
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "flatkv-redis-bench: %s\nusage: flatkv-redis-bench [--host H] [--port P] "
               "[--clients C] [--ops N] [--num K] [--value-size B] [--wait R] [--seed S]\n",
               why);
  return 2;
}

bool ParseU64(const char* s, uint64_t* v) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') return false;
  *v = x;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      Usage("SET + WAIT load against a Redis primary");
      return 0;
    }
    if (i + 1 >= argc) return Usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    uint64_t x = 0;
    if (a == "--host") {
      f.host = v;
      continue;
    }
    if (!ParseU64(v, &x)) return Usage(("not a number: " + a + " " + v).c_str());
    if (a == "--port" && x > 0 && x < 65536) f.port = static_cast<int>(x);
    else if (a == "--clients" && x > 0 && x <= 10000) f.clients = static_cast<int>(x);
    else if (a == "--ops" && x > 0) f.ops = x;
    else if (a == "--num" && x > 0) f.num = x;
    else if (a == "--value-size" && x > 0 && x <= (64u << 20)) f.value_size = x;
    else if (a == "--wait" && x <= 100) f.wait = static_cast<int>(x);
    else if (a == "--seed") f.seed = x;
    else return Usage(("bad option or value: " + a + " " + v).c_str());
  }
  if (f.num == 0) f.num = f.ops;

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(f.port));
  if (inet_pton(AF_INET, f.host.c_str(), &addr.sin_addr) != 1) return Usage("--host: an IPv4 address");

  const int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<Conn> conns(static_cast<size_t>(f.clients));
  for (size_t i = 0; i < conns.size(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      std::fprintf(stderr, "flatkv-redis-bench: connect %s:%d: %s\n", f.host.c_str(), f.port,
                   std::strerror(errno));
      return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conns[i].fd = fd;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }

  std::mt19937_64 rng(f.seed);
  const std::string value(f.value_size, 'v');
  std::string wait_cmd;
  if (f.wait > 0) {
    wait_cmd = "*3\r\n";
    Bulk(&wait_cmd, "WAIT");
    Bulk(&wait_cmd, std::to_string(f.wait));
    Bulk(&wait_cmd, "0");
  }
  uint64_t sent = 0, done = 0, errors = 0;
  flatkv::client::LatencyHistogram latency;

  auto flush_out = [&](Conn& c) -> bool {
    while (c.out_off < c.out.size()) {
      ssize_t n = write(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;  // blocking socket: not expected
      if (n <= 0) return false;
      c.out_off += static_cast<size_t>(n);
    }
    return true;
  };
  auto start_call = [&](Conn& c) -> bool {
    std::string key = std::to_string(rng() % f.num);
    key.insert(key.begin(), 'k');
    c.out = "*3\r\n";
    Bulk(&c.out, "SET");
    Bulk(&c.out, key);
    Bulk(&c.out, value);
    c.out += wait_cmd;
    c.out_off = 0;
    c.replies_due = f.wait > 0 ? 2 : 1;
    c.failed_call = false;
    c.started = NowNs();
    ++sent;
    return flush_out(c);
  };

  const uint64_t t0 = NowNs();
  for (Conn& c : conns) {
    if (sent < f.ops && !start_call(c)) {
      std::fprintf(stderr, "flatkv-redis-bench: write: %s\n", std::strerror(errno));
      return 1;
    }
  }
  std::vector<epoll_event> events(conns.size());
  char buf[65536];
  while (done < sent) {
    int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 30000);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "flatkv-redis-bench: no answer in 30 s\n");
      return 1;
    }
    for (int e = 0; e < n; ++e) {
      Conn& c = conns[events[e].data.u64];
      ssize_t r = read(c.fd, buf, sizeof(buf));
      if (r <= 0) {
        std::fprintf(stderr, "flatkv-redis-bench: connection closed: %s\n",
                     r < 0 ? std::strerror(errno) : "EOF");
        return 1;
      }
      c.in.append(buf, static_cast<size_t>(r));
      // Every reply here is one line: +OK, :<replicas>, or -ERR ...
      size_t eol;
      while (c.replies_due > 0 && (eol = c.in.find("\r\n")) != std::string::npos) {
        const std::string line = c.in.substr(0, eol);
        c.in.erase(0, eol + 2);
        const bool is_wait = f.wait > 0 && c.replies_due == 1;
        if (line.empty() || line[0] == '-' ||
            (is_wait && (line[0] != ':' || std::atoi(line.c_str() + 1) < f.wait)) ||
            (!is_wait && line != "+OK")) {
          if (!c.failed_call && errors < 5) {
            std::fprintf(stderr, "flatkv-redis-bench: unexpected reply: %s\n", line.c_str());
          }
          c.failed_call = true;
        }
        if (--c.replies_due == 0) {
          latency.Record(NowNs() - c.started);
          ++done;
          if (c.failed_call) ++errors;
          if (sent < f.ops && !start_call(c)) {
            std::fprintf(stderr, "flatkv-redis-bench: write: %s\n", std::strerror(errno));
            return 1;
          }
        }
      }
    }
  }
  const double seconds = static_cast<double>(NowNs() - t0) / 1e9;
  auto us = [&](double q) { return static_cast<double>(latency.Percentile(q)) / 1e3; };
  std::printf("put        : %8.0f ops/sec %6.1f MB/s  p50 %.1f p99 %.1f p999 %.1f max %.1f us  "
              "(redis at %s:%d, SET + WAIT %d, %zu B, uniform, %d clients, %llu errors)\n",
              static_cast<double>(done) / seconds,
              static_cast<double>(done * f.value_size) / seconds / 1e6, us(0.5), us(0.99),
              us(0.999), static_cast<double>(latency.max()) / 1e3, f.host.c_str(), f.port, f.wait,
              f.value_size, f.clients, static_cast<unsigned long long>(errors));
  for (Conn& c : conns) close(c.fd);
  close(ep);
  return errors == 0 ? 0 : 1;
}
