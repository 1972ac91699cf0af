// EventServer with and without an offload (SetOffload()): a real server on a
// loopback port with one I/O thread, a tiny FlatKV handler whose get() of a
// positive key blocks (a stand-in for a call forwarded to a peer) and an
// offload predicate that parses the frame and picks exactly those gets.
// Real Thrift clients (framed, binary) or raw sockets drive it.
//
// Blocking calls wait on a gate the test opens, not on timers, so "answered
// while the slow call is outstanding" is checked by counting, not timing.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <event2/event.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>
#include <thrift/transport/TSocket.h>
#include <thrift/transport/TTransportException.h>

#include "FlatKV.h"
#include "server/config.h"
#include "server/event_server.h"

namespace {

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TFramedTransport;
using apache::thrift::transport::TMemoryBuffer;
using apache::thrift::transport::TSocket;
using apache::thrift::transport::TTransportException;
using flatkv::server::Config;
using flatkv::server::EventServer;
using flatkv::rpc::GetResult;
using Clock = std::chrono::steady_clock;

// get(kGated) blocks until the test opens the gate; it is offloaded.
constexpr int64_t kGated = 1'000'000'000;
constexpr auto kDeadline = std::chrono::seconds(30);

// get(key): key > 0 is a slow call (sleeps key ms; kGated waits for the
// gate) answered with the decimal key; key <= 0 answers at once, with -key
// bytes of 'x' for key < 0. put() only counts.
class TestHandler : public flatkv::rpc::FlatKVNull {
 public:
  void get(GetResult& result, const int64_t key) override {
    if (key > 0) {
      started.fetch_add(1);
      if (key == kGated) {
        std::unique_lock<std::mutex> lock(mu_);
        gate_cv_.wait(lock, [&] { return open_; });
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(key));
      }
    }
    result.found = true;
    result.value = key < 0 ? std::string(static_cast<size_t>(-key), 'x') : std::to_string(key);
    if (key > 0) finished.fetch_add(1);
  }
  void put(const int64_t, const std::string&) override { puts.fetch_add(1); }
  // Asks for work at the end of the I/O thread's round, which records how
  // many removes had run by then and on which thread it ran.
  bool remove(const int64_t) override {
    removes.fetch_add(1);
    const std::thread::id caller = std::this_thread::get_id();
    const bool deferred = EventServer::AtRoundEnd([this, caller] {
      std::lock_guard<std::mutex> lock(mu_);
      round_ends.push_back({removes.load(), caller == std::this_thread::get_id()});
    });
    if (!deferred) not_deferred.fetch_add(1);
    return true;
  }
  struct RoundEnd {
    int removes_before;  // removes run when it ran
    bool same_thread;
  };
  std::vector<RoundEnd> RoundEnds() {
    std::lock_guard<std::mutex> lock(mu_);
    return round_ends;
  }
  std::atomic<int> removes{0};
  std::atomic<int> not_deferred{0};

  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    gate_cv_.notify_all();
  }

  std::atomic<int> started{0};   // slow gets begun
  std::atomic<int> finished{0};  // slow gets answered by the handler
  std::atomic<int> puts{0};

 private:
  std::vector<RoundEnd> round_ends;  // GUARDED_BY(mu_)
  std::mutex mu_;
  std::condition_variable gate_cv_;
  bool open_ = false;
};

uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// The offload predicate: a strict binary-protocol CALL of "get" whose first
// field is the i64 key 1 and positive. Anything else (puts, short or odd
// messages) runs inline.
bool IsSlowGet(const uint8_t* message, uint32_t len) {
  // version|type (4), name length (4), "get" (3), seqid (4),
  // field type (1) = T_I64, field id (2) = 1, key (8)
  constexpr uint32_t kNeeded = 4 + 4 + 3 + 4 + 1 + 2 + 8;
  if (len < kNeeded || Be32(message) != 0x80010001u || Be32(message + 4) != 3 ||
      std::memcmp(message + 8, "get", 3) != 0) {
    return false;
  }
  const uint8_t* field = message + 15;
  if (field[0] != 10 || field[1] != 0 || field[2] != 1) return false;
  const auto key = static_cast<int64_t>(uint64_t{Be32(field + 3)} << 32 | Be32(field + 7));
  return key > 0;
}

// An EventServer on 127.0.0.1, a free port, one I/O thread.
struct TestServer {
  explicit TestServer(int workers) : TestServer(0, nullptr, workers) {}
  // "setup" is called before Start() (e.g. SetAsync()).
  TestServer(int, const std::function<void(EventServer*)>& setup, int workers) {
    signal(SIGPIPE, SIG_IGN);  // as main.cc: a write to a reset client fails, not kills
    Config config;
    config.server.host = "127.0.0.1";
    config.server.port = 0;
    config.server.io_threads = 1;
    server = std::make_unique<EventServer>(
        std::make_shared<flatkv::rpc::FlatKVProcessor>(handler), config);
    if (workers > 0) server->SetOffload(&IsSlowGet, workers);
    if (setup) setup(server.get());
    REQUIRE(server->Start().ok());
  }

  // True once connections() == n, false after kDeadline.
  bool WaitForConnections(int64_t n) const;

  std::shared_ptr<TestHandler> handler = std::make_shared<TestHandler>();
  std::unique_ptr<EventServer> server;
};

// Waits until "done" returns true; false after kDeadline.
template <typename Done>
bool Eventually(Done done) {
  const auto deadline = Clock::now() + kDeadline;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Waits until "counter" reaches "n"; false after kDeadline.
bool WaitFor(const std::atomic<int>& counter, int n) {
  return Eventually([&] { return counter.load() >= n; });
}

bool TestServer::WaitForConnections(int64_t n) const {
  return Eventually([&] { return server->connections() == n; });
}

// A Thrift client (TSocket + TFramedTransport + TBinaryProtocol), connected.
struct TestClient {
  explicit TestClient(int port)
      : socket(std::make_shared<TSocket>("127.0.0.1", port)),
        transport(std::make_shared<TFramedTransport>(socket)),
        client(std::make_shared<TBinaryProtocol>(transport)) {
    socket->setRecvTimeout(60000);  // a server that never answers fails the test
    transport->open();
  }
  std::string Get(int64_t key) {
    GetResult result;
    client.get(result, key);
    return result.value;
  }

  std::shared_ptr<TSocket> socket;
  std::shared_ptr<TFramedTransport> transport;
  flatkv::rpc::FlatKVClient client;
};

// The framed bytes of a get(key) call, as FlatKVClient sends them.
std::string EncodeGet(int64_t key) {
  auto memory = std::make_shared<TMemoryBuffer>();
  flatkv::rpc::FlatKVClient client(
      std::make_shared<TBinaryProtocol>(std::make_shared<TFramedTransport>(memory)));
  client.send_get(key);
  return memory->getBufferAsString();
}

// A raw loopback socket with a tiny receive buffer, so answers pile up in
// the server's output.
int ConnectSmallWindow(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  const int small = 4096;
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

}  // namespace

TEST_CASE("The offload predicate picks exactly the gets of a positive key",
          "[server][event_server]") {
  const auto picks = [](const std::string& frame) {
    return IsSlowGet(reinterpret_cast<const uint8_t*>(frame.data()) + 4,
                     static_cast<uint32_t>(frame.size() - 4));
  };
  CHECK(picks(EncodeGet(1)));
  CHECK(picks(EncodeGet(kGated)));
  CHECK_FALSE(picks(EncodeGet(0)));
  CHECK_FALSE(picks(EncodeGet(-5)));
  CHECK_FALSE(IsSlowGet(reinterpret_cast<const uint8_t*>("get"), 3));
}

TEST_CASE("EventServer without an offload answers every call inline", "[server][event_server]") {
  TestServer s(0);
  TestClient c(s.server->port());
  CHECK(c.Get(0) == "0");
  CHECK(c.Get(5) == "5");  // a slow call, run on the I/O thread
  c.client.put(1, "v");
  CHECK(s.handler->puts == 1);
  CHECK(s.server->offloaded() == 0);
}

TEST_CASE("EventServer serves other connections while a call runs on a worker",
          "[server][event_server]") {
  TestServer s(2);
  std::string slow_answer;
  std::thread slow([&] {
    TestClient c(s.server->port());
    slow_answer = c.Get(kGated);
  });
  REQUIRE(WaitFor(s.handler->started, 1));

  // The same (only) I/O thread serves these meanwhile: inline calls, and a
  // few offloaded ones on the second worker.
  TestClient other(s.server->port());
  int answered = 0;
  for (int i = 0; i < 100; ++i) {
    if (i % 10 == 9) {
      if (other.Get(1) == "1") ++answered;  // 1 ms on the other worker
    } else if (i % 2 == 0) {
      if (other.Get(0) == "0") ++answered;
    } else {
      other.client.put(i, "v");
      ++answered;
    }
  }
  CHECK(answered == 100);
  CHECK(s.handler->finished == 10);  // the gated call is still outstanding
  CHECK(s.server->connections() == 2);

  s.handler->OpenGate();
  slow.join();
  CHECK(slow_answer == std::to_string(kGated));
  CHECK(s.server->offloaded() == 11);
  CHECK(s.server->protocol_errors() == 0);
}

TEST_CASE("EventServer answers pipelined calls in order when some run on workers",
          "[server][event_server]") {
  TestServer s(4);
  TestClient c(s.server->port());
  // Slow ones take longer the earlier they come: a server answering in
  // completion order would reverse them.
  const std::vector<int64_t> keys = {300, 0, -3, 20, 0, 5, -1};
  for (size_t i = 0; i < keys.size(); ++i) {
    c.client.send_get(keys[i]);
    if (i == 3) c.client.send_put(7, "v");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    GetResult result;
    c.client.recv_get(result);
    const std::string want =
        keys[i] < 0 ? std::string(static_cast<size_t>(-keys[i]), 'x') : std::to_string(keys[i]);
    CHECK(result.value == want);
    if (i == 3) c.client.recv_put();
  }
  CHECK(s.handler->puts == 1);
  CHECK(s.server->offloaded() == 3);
  CHECK(c.Get(0) == "0");  // the connection keeps serving
}

TEST_CASE("EventServer runs AtRoundEnd work on the I/O thread after every call of its round",
          "[server][event_server]") {
  TestServer s(0);
  CHECK_FALSE(EventServer::AtRoundEnd([] {}));  // not an I/O thread
  // Five removes reach the server in one segment: one read, one round.
  auto mem = std::make_shared<TMemoryBuffer>();
  auto framed = std::make_shared<TFramedTransport>(mem);
  flatkv::rpc::FlatKVClient encoder(std::make_shared<TBinaryProtocol>(framed));
  for (int i = 0; i < 5; ++i) encoder.send_remove(i);
  auto socket = std::make_shared<TSocket>("127.0.0.1", s.server->port());
  socket->open();
  uint8_t* bytes;
  uint32_t len;
  mem->getBuffer(&bytes, &len);
  socket->write(bytes, len);
  flatkv::rpc::FlatKVClient decoder(
      std::make_shared<TBinaryProtocol>(std::make_shared<TFramedTransport>(socket)));
  for (int i = 0; i < 5; ++i) CHECK(decoder.recv_remove());
  REQUIRE(WaitFor(s.handler->removes, 5));
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (s.handler->RoundEnds().size() < 5 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto ends = s.handler->RoundEnds();
  REQUIRE(ends.size() == 5);
  for (const auto& e : ends) {
    CHECK(e.removes_before == 5);  // after the whole round, not after its own call
    CHECK(e.same_thread);
  }
  CHECK(s.handler->not_deferred == 0);
  socket->close();
}

TEST_CASE("EventServer keeps serving after a client leaves while its call is on a worker",
          "[server][event_server]") {
  TestServer s(1);
  {
    TestClient gone(s.server->port());
    gone.client.send_get(kGated);
    REQUIRE(WaitFor(s.handler->started, 1));
    gone.transport->close();
  }
  TestClient other(s.server->port());
  CHECK(other.Get(0) == "0");  // while the call of the gone client blocks
  s.handler->OpenGate();
  REQUIRE(WaitFor(s.handler->finished, 1));
  // The answer goes nowhere; the gone connection is closed and freed.
  CHECK(s.WaitForConnections(1));
  CHECK(other.Get(7) == "7");  // the worker is free again
  CHECK(s.server->offloaded() == 2);
}

TEST_CASE("EventServer frees a connection closed by a write error while its call is on a worker",
          "[server][event_server]") {
  TestServer s(1);
  // An 8 MiB inline answer the client does not read (the server's output
  // keeps most of it and waits for EV_WRITE), then a call for the worker.
  const int fd = ConnectSmallWindow(s.server->port());
  const std::string calls = EncodeGet(-(8 << 20)) + EncodeGet(kGated);
  REQUIRE(send(fd, calls.data(), calls.size(), 0) == static_cast<ssize_t>(calls.size()));
  REQUIRE(WaitFor(s.handler->started, 1));
  // A reset: the pending write fails, and the connection is closed while
  // its call still blocks on the worker.
  const linger reset{1, 0};
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)) == 0);
  close(fd);
  CHECK(s.WaitForConnections(0));
  CHECK(s.handler->finished == 0);

  s.handler->OpenGate();  // the answer comes back to a closed connection
  REQUIRE(WaitFor(s.handler->finished, 1));
  TestClient other(s.server->port());
  CHECK(other.Get(3) == "3");
  CHECK(s.server->connections() == 1);
}

TEST_CASE("EventServer Stop waits for the call on a worker and drops the queued ones",
          "[server][event_server]") {
  TestServer s(1);
  TestClient running(s.server->port());
  TestClient queued(s.server->port());
  running.client.send_get(kGated);
  REQUIRE(WaitFor(s.handler->started, 1));
  queued.client.send_get(kGated);  // waits for the only worker
  REQUIRE(Eventually([&] { return s.server->offloaded() == 2; }));

  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    s.server->Stop();
    stopped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(stopped);  // the running call blocks it
  s.handler->OpenGate();
  stopper.join();
  CHECK(s.handler->started == 1);  // the queued call never ran
  CHECK(s.handler->finished == 1);
  CHECK(s.server->connections() == 0);
  GetResult result;
  CHECK_THROWS_AS(running.client.recv_get(result), TTransportException);
  CHECK_THROWS_AS(queued.client.recv_get(result), TTransportException);
  s.server->Stop();  // again: a no-op
}

// --- AsyncCalls (SetAsync()) -------------------------------------------------

namespace {

constexpr int64_t kAsyncBase = -1'000'000;  // get(key < kAsyncBase) is taken
constexpr int64_t kRedo = -2'000'000;       // ... and handed back to a worker

// Takes get(key) for key < kAsyncBase and answers "async <key>" after
// (kAsyncBase - key) ms, from a timer of the same event loop; get(kRedo) is
// handed back to run on a worker instead. Counts what it sees; the counters
// are read by the test thread.
class TestAsync final : public flatkv::server::AsyncCalls {
 public:
  struct Pending {
    TestAsync* owner;
    Reply* reply;  // null once cancelled
    int32_t seqid;
    int64_t key;
  };

  explicit TestAsync(event_base* base) : base_(base) {}
  ~TestAsync() override {
    for (Pending* p : live_) delete p;  // never answered: the loop ended
  }

  Decision Start(const uint8_t* message, uint32_t len, Reply* reply, void** ticket) override {
    auto in = std::make_shared<TMemoryBuffer>(const_cast<uint8_t*>(message), len);
    TBinaryProtocol protocol(in);
    std::string name;
    apache::thrift::protocol::TMessageType type;
    int32_t seqid = 0;
    flatkv::rpc::FlatKV_get_args args;
    try {
      protocol.readMessageBegin(name, type, seqid);
      if (name != "get") return Decision::kNotTaken;
      args.read(&protocol);
    } catch (const std::exception&) {
      return Decision::kInline;
    }
    if (args.key >= kAsyncBase) return args.key > 0 ? Decision::kNotTaken : Decision::kInline;
    auto* p = new Pending{this, reply, seqid, args.key};
    live_.push_back(p);
    *ticket = p;
    taken++;
    const int64_t ms = args.key == kRedo ? 0 : kAsyncBase - args.key;
    const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
    event_base_once(base_, -1, EV_TIMEOUT, &TestAsync::OnTimer, p, &tv);
    return Decision::kTaken;
  }

  void Cancel(void* ticket) override {
    static_cast<Pending*>(ticket)->reply = nullptr;
    cancelled++;
  }

  std::atomic<int> taken{0};
  std::atomic<int> answered{0};
  std::atomic<int> cancelled{0};
  static std::atomic<int> wrapped;  // wraps run on a worker

 private:
  static void OnTimer(evutil_socket_t, short, void* arg) {
    auto* p = static_cast<Pending*>(arg);
    TestAsync* self = p->owner;
    self->live_.erase(std::find(self->live_.begin(), self->live_.end(), p));
    std::unique_ptr<Pending> owned(p);
    if (p->reply == nullptr) return;
    if (p->key == kRedo) {
      const std::string frame = EncodeGet(p->key);
      std::unique_ptr<uint8_t[]> message(new uint8_t[frame.size() - 4]);
      std::memcpy(message.get(), frame.data() + 4, frame.size() - 4);
      p->reply->Redo(std::move(message), static_cast<uint32_t>(frame.size() - 4),
                     [](const std::function<void()>& run) {
                       wrapped++;
                       run();
                     });
      return;
    }
    auto out = std::make_shared<TMemoryBuffer>();
    TBinaryProtocol protocol(out);
    flatkv::rpc::FlatKV_get_result result;
    result.success.found = true;
    result.success.value = "async " + std::to_string(p->key);
    result.__isset.success = true;
    protocol.writeMessageBegin("get", apache::thrift::protocol::T_REPLY, p->seqid);
    result.write(&protocol);
    protocol.writeMessageEnd();
    const std::string body = out->getBufferAsString();
    const auto n = static_cast<uint32_t>(body.size());
    const char head[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                          static_cast<char>(n >> 8), static_cast<char>(n)};
    const std::string frame = std::string(head, 4) + body;
    self->answered++;
    p->reply->Answer(reinterpret_cast<const uint8_t*>(frame.data()), frame.size());
  }

  event_base* const base_;
  std::vector<Pending*> live_;  // on the I/O thread only
};

std::atomic<int> TestAsync::wrapped{0};

// A TestServer whose I/O thread has a TestAsync (and "workers" workers).
struct AsyncServer {
  explicit AsyncServer(int workers)
      : made(std::make_shared<TestAsync*>(nullptr)),
        test(0,
             [made = made](EventServer* s) {
               s->SetAsync([made](event_base* base) {
                 auto calls = std::make_unique<TestAsync>(base);
                 *made = calls.get();
                 return calls;
               });
             },
             workers),
        server(test.server.get()),
        async(*made) {}
  bool WaitForConnections(int64_t n) const { return test.WaitForConnections(n); }

  std::shared_ptr<TestAsync*> made;
  TestServer test;
  EventServer* server;
  TestAsync* async;
};

}  // namespace

TEST_CASE("EventServer answers pipelined calls in order when some are taken by its AsyncCalls",
          "[server][event_server][async]") {
  AsyncServer s(1);
  TestClient c(s.server->port());
  // The first taken call is answered last by its timer: a server writing
  // answers in completion order would reverse them.
  const std::vector<int64_t> keys = {kAsyncBase - 80, 0, kAsyncBase - 1, -3, 5, kAsyncBase - 20};
  for (int64_t k : keys) c.client.send_get(k);
  c.client.send_put(7, "v");
  for (int64_t k : keys) {
    GetResult result;
    c.client.recv_get(result);
    const std::string want = k < kAsyncBase ? "async " + std::to_string(k)
                             : k < 0        ? std::string(static_cast<size_t>(-k), 'x')
                                            : std::to_string(k);
    CHECK(result.value == want);
  }
  c.client.recv_put();
  CHECK(s.async->taken == 3);
  CHECK(s.async->answered == 3);
  CHECK(s.server->async_taken() == 3);
  CHECK(s.server->offloaded() == 1);  // get(5): the offload function's
  CHECK(c.Get(kAsyncBase - 2) == "async " + std::to_string(kAsyncBase - 2));
}

TEST_CASE("EventServer cancels the taken call of a client that leaves and keeps serving",
          "[server][event_server][async]") {
  AsyncServer s(1);
  {
    TestClient gone(s.server->port());
    gone.client.send_get(kAsyncBase - 300);
    REQUIRE(Eventually([&] { return s.async->taken == 1; }));
    gone.transport->close();
  }
  REQUIRE(s.WaitForConnections(0));
  CHECK(s.async->cancelled == 1);
  TestClient other(s.server->port());
  CHECK(other.Get(kAsyncBase - 1) == "async " + std::to_string(kAsyncBase - 1));
  CHECK(other.Get(0) == "0");
  // The cancelled call's timer fires later and answers nothing.
  REQUIRE(Eventually([&] { return s.async->taken == 2 && s.async->answered == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK(s.async->answered == 1);
  CHECK(other.Get(-2) == "xx");
  CHECK(s.server->protocol_errors() == 0);
}

TEST_CASE("EventServer runs a call its AsyncCalls hands back on a worker, inside the wrap",
          "[server][event_server][async]") {
  AsyncServer s(1);
  TestClient c(s.server->port());
  const int wrapped = TestAsync::wrapped;
  c.client.send_get(kRedo);
  c.client.send_get(kAsyncBase - 1);  // pipelined behind it: still in order
  GetResult first, second;
  c.client.recv_get(first);
  c.client.recv_get(second);
  CHECK(first.value == std::string(static_cast<size_t>(-kRedo), 'x'));  // the handler's
  CHECK(second.value == "async " + std::to_string(kAsyncBase - 1));
  CHECK(TestAsync::wrapped == wrapped + 1);
  CHECK(s.server->offloaded() == 1);
  CHECK(s.server->async_taken() == 2);
}

TEST_CASE("EventServer Stop drops the calls its AsyncCalls still holds", "[server][event_server][async]") {
  AsyncServer s(1);
  TestClient c(s.server->port());
  c.client.send_get(kAsyncBase - 60000);  // answered in a minute: never
  REQUIRE(Eventually([&] { return s.async->taken == 1; }));
  s.server->Stop();
  GetResult result;
  CHECK_THROWS_AS(c.client.recv_get(result), TTransportException);
}
