// Registry against a real ZooKeeper (deploy/zookeeper.sh): each case starts
// its own server in a fresh temp dir on a free loopback port, so cases are
// independent and a case may kill and restart its server. ZooKeeper state is
// inspected through a second handle of the C client, as another tool (or
// another team's partition manager) would see it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zookeeper/zookeeper.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "partition/registry.h"

#if defined(__SANITIZE_THREAD__)
// libzookeeper_mt formats log text into a static buffer (a race between the
// threads of two handles; this file runs several in one process). It only
// garbles a log line; not ours to fix.
extern "C" const char* __tsan_default_suppressions() { return "race:libzookeeper_mt.so\n"; }
#endif

namespace flatkv::partition {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kSessionTimeoutMs = 2000;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// Polls "done" every 10 ms until it holds or "timeout" passes.
bool Eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// A ZooKeeper server of its own, killed and removed at the end of the case.
class ZooKeeperServer {
 public:
  explicit ZooKeeperServer(bool start = true) : port_(FreePort()) {
    char tmpl[] = "/tmp/flatkv-zk-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    if (start) Start();
  }
  ~ZooKeeperServer() {
    Script("kill " + dir_);
    std::filesystem::remove_all(dir_);
  }
  void Start() { REQUIRE(Script("start " + dir_ + " " + std::to_string(port_)) == 0); }
  // SIGKILL: a crash, as clients see it; the data dir stays.
  void Kill() { REQUIRE(Script("kill " + dir_) == 0); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // A four-letter word's answer ("mntr", "srvr").
  std::string FourLetter(const std::string& word) const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        write(fd, word.data(), word.size()) == static_cast<ssize_t>(word.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
    close(fd);
    return out;
  }

 private:
  // ZK_OWNER_PID: the server dies with this process even if it crashes.
  static int Script(const std::string& args) {
    return std::system(("ZK_OWNER_PID=" + std::to_string(getpid()) +
                        " bash " FLATKV_SOURCE_DIR "/deploy/zookeeper.sh " + args)
                           .c_str());
  }

  int port_;
  std::string dir_;
};

// Another ZooKeeper client, to look at what the registry wrote.
class Inspector {
 public:
  // With "session": a second handle on that session, which may never
  // connect (the session expired).
  explicit Inspector(const std::string& hosts, const clientid_t* session = nullptr) {
    zh_ = zookeeper_init(hosts.c_str(), &Inspector::Watch, kSessionTimeoutMs, session, this, 0);
    REQUIRE(zh_ != nullptr);
    if (session == nullptr) REQUIRE(WaitConnected(5s));
  }
  bool WaitConnected(std::chrono::milliseconds timeout) {
    return Eventually([this] { return connected_.load(); }, timeout);
  }
  ~Inspector() { Close(); }
  void Close() {
    if (zh_ != nullptr) zookeeper_close(zh_);
    zh_ = nullptr;
  }

  // ZOK with the node's stat, or ZNONODE.
  int Exists(const std::string& path, Stat* stat = nullptr) {
    Stat ignored;
    return zoo_exists(zh_, path.c_str(), 0, stat != nullptr ? stat : &ignored);
  }
  std::string Get(const std::string& path) {
    char buf[1024];
    int len = sizeof(buf);
    Stat stat;
    REQUIRE(zoo_get(zh_, path.c_str(), 0, buf, &len, &stat) == ZOK);
    return len > 0 ? std::string(buf, len) : std::string();
  }
  void Create(const std::string& path, const std::string& data = "",
              int mode = ZOO_PERSISTENT) {
    const int rc = zoo_create(zh_, path.c_str(), data.data(), static_cast<int>(data.size()),
                              &ZOO_OPEN_ACL_UNSAFE, mode, nullptr, 0);
    REQUIRE((rc == ZOK || rc == ZNODEEXISTS));
  }
  int64_t session() { return zoo_client_id(zh_)->client_id; }

 private:
  static void Watch(zhandle_t*, int type, int state, const char*, void* ctx) {
    if (type == ZOO_SESSION_EVENT && state == ZOO_CONNECTED_STATE) {
      static_cast<Inspector*>(ctx)->connected_ = true;
    }
  }

  zhandle_t* zh_ = nullptr;
  std::atomic<bool> connected_{false};
};

// Records what the registry reports through its callbacks.
struct Recorder {
  std::mutex mu;
  std::vector<Status> fatal;
  int rings = 0;

  void Attach(RegistryOptions* o) {
    o->on_fatal = [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      fatal.push_back(s);
    };
    o->on_ring = [this](std::shared_ptr<const Ring>) {
      std::lock_guard<std::mutex> lock(mu);
      ++rings;
    };
  }
  size_t fatal_count() {
    std::lock_guard<std::mutex> lock(mu);
    return fatal.size();
  }
};

RegistryOptions Options(const ZooKeeperServer& zk, int64_t mark, int port,
                        const std::string& service_path = "/flatkv") {
  RegistryOptions o;
  o.zookeeper = zk.address();
  o.service_path = service_path;
  o.mark = mark;
  o.advertise = "127.0.0.1:" + std::to_string(port);
  o.session_timeout_ms = kSessionTimeoutMs;
  return o;
}

std::unique_ptr<Registry> StartRegistry(RegistryOptions o, bool do_register = true) {
  std::unique_ptr<Registry> r;
  REQUIRE(Registry::Start(std::move(o), &r).ok());
  if (do_register) r->Register();
  return r;
}

// "10=[a:1,b:2] 20=[]" for the registry's ring, "" while it has none.
std::string RingOf(const Registry& r) {
  const std::shared_ptr<const Ring> ring = r.ring();
  return ring ? ring->ToString() : "";
}

bool AllSee(const std::vector<Registry*>& registries, const std::string& expected,
            std::chrono::milliseconds timeout) {
  return Eventually(
      [&] {
        for (const Registry* r : registries) {
          if (RingOf(*r) != expected) return false;
        }
        return true;
      },
      timeout);
}

// CPU time of this process (all threads), in seconds.
double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

int64_t MntrValue(const std::string& mntr, const std::string& key) {
  const size_t at = mntr.find(key + "\t");
  return at == std::string::npos ? -1 : std::stoll(mntr.substr(at + key.size() + 1));
}

// The inspecting handles log to stderr; the registry's own ZooKeeper log goes
// through spdlog at its own levels either way.
const bool kQuietClient = [] {
  zoo_set_debug_level(ZOO_LOG_LEVEL_WARN);
  return true;
}();

}  // namespace

TEST_CASE("Registration creates the ephemeral member node, .cluster with the settings and the mark",
          "[partition][registry]") {
  ZooKeeperServer zk;
  // A multi-level service path: its parents are created too.
  std::unique_ptr<Registry> r = StartRegistry(Options(zk, 100, 9001, "/apps/flatkv"));
  REQUIRE(r->WaitRegistered(5000).ok());

  Inspector zoo(zk.address());
  const std::string name = "thriftbinary100:127.0.0.1:9001";
  Stat stat;
  REQUIRE(zoo.Exists("/apps/flatkv/" + name, &stat) == ZOK);
  CHECK(zoo.Get("/apps/flatkv/" + name) == name);
  int64_t session = 0;
  std::string password;
  REQUIRE(r->TEST_SessionId(&session, &password));
  CHECK(stat.ephemeralOwner == session);  // ephemeral, owned by the registry's session
  CHECK(zoo.Get("/apps/flatkv/.cluster") ==
        R"({"hash_bound": 9223372036854775807, "replication": "sync"})");
  REQUIRE(zoo.Exists("/apps/flatkv/.cluster/marks/100", &stat) == ZOK);
  CHECK(stat.ephemeralOwner == 0);  // persistent: the mark outlives its members

  REQUIRE(Eventually([&] { return RingOf(*r) == "100=[127.0.0.1:9001]"; }, 1s));
  const std::shared_ptr<const Ring> ring = r->ring();
  CHECK(ring->RoleOf(100, "127.0.0.1:9001") == "single");
  CHECK(ring->Find(100)->chain[0].czxid > 0);
  std::shared_ptr<const Ring> refreshed;
  REQUIRE(r->Refresh(&refreshed).ok());
  CHECK(refreshed->version() == ring->version());
  CHECK(r->connected());
  CHECK(r->disconnected_ms() == 0);
  const RegistryStats stats = r->stats();
  CHECK(stats.sessions == 1);
  CHECK(stats.registrations == 1);
  CHECK(stats.members_seen == 1);
  CHECK(stats.ring_version == ring->version());
}

TEST_CASE("A member node left by an earlier process at the same address is replaced",
          "[partition][registry]") {
  ZooKeeperServer zk;
  // The earlier process: its session is still alive (as after kill -9,
  // until the session timeout), so its ephemeral node is still there.
  Inspector earlier(zk.address());
  earlier.Create("/flatkv");
  const std::string node = "/flatkv/thriftbinary100:127.0.0.1:9001";
  earlier.Create(node, "thriftbinary100:127.0.0.1:9001", ZOO_EPHEMERAL);
  Stat before;
  REQUIRE(earlier.Exists(node, &before) == ZOK);
  REQUIRE(before.ephemeralOwner == earlier.session());

  std::unique_ptr<Registry> r = StartRegistry(Options(zk, 100, 9001));
  REQUIRE(r->WaitRegistered(5000).ok());
  Stat after;
  REQUIRE(earlier.Exists(node, &after) == ZOK);
  int64_t session = 0;
  std::string password;
  REQUIRE(r->TEST_SessionId(&session, &password));
  CHECK(after.ephemeralOwner == session);
  CHECK(after.czxid > before.czxid);  // a new node: it rejoins at the tail
  CHECK(Eventually([&] { return RingOf(*r) == "100=[127.0.0.1:9001]"; }, 1s));
}

TEST_CASE("Every registry's ring converges to all marks, a shared mark's chain oldest first",
          "[partition][registry]") {
  ZooKeeperServer zk;
  std::unique_ptr<Registry> a = StartRegistry(Options(zk, 100, 9001));
  std::unique_ptr<Registry> b = StartRegistry(Options(zk, 200, 9002));
  REQUIRE(a->WaitRegistered(5000).ok());
  REQUIRE(b->WaitRegistered(5000).ok());
  // Registered after a, so it is a's successor in mark 100's chain.
  std::unique_ptr<Registry> c = StartRegistry(Options(zk, 100, 9003));
  REQUIRE(c->WaitRegistered(5000).ok());

  const std::string expected = "100=[127.0.0.1:9001,127.0.0.1:9003] 200=[127.0.0.1:9002]";
  REQUIRE(AllSee({a.get(), b.get(), c.get()}, expected, 1s));
  const std::shared_ptr<const Ring> ring = b->ring();
  CHECK(ring->RoleOf(100, "127.0.0.1:9001") == "head");
  CHECK(ring->RoleOf(100, "127.0.0.1:9003") == "tail");
  CHECK(ring->RoleOf(200, "127.0.0.1:9002") == "single");
  CHECK(a->ring()->version() == ring->version());
  CHECK(c->ring()->version() == ring->version());
}

TEST_CASE("Close() removes the member node at once and the other rings drop it within 1 s",
          "[partition][registry]") {
  ZooKeeperServer zk;
  std::unique_ptr<Registry> a = StartRegistry(Options(zk, 100, 9001));
  std::unique_ptr<Registry> b = StartRegistry(Options(zk, 200, 9002));
  REQUIRE(a->WaitRegistered(5000).ok());
  REQUIRE(b->WaitRegistered(5000).ok());
  REQUIRE(AllSee({a.get()}, "100=[127.0.0.1:9001] 200=[127.0.0.1:9002]", 1s));
  const int64_t version = a->ring()->version();

  Inspector zoo(zk.address());
  b->Close();
  b->Close();  // idempotent
  CHECK(Eventually([&] { return zoo.Exists("/flatkv/thriftbinary200:127.0.0.1:9002") == ZNONODE; },
                   200ms));
  // Mark 200 stays in the ring (recorded in .cluster/marks) with no member:
  // its keys are unavailable, never served by mark 100.
  CHECK(AllSee({a.get()}, "100=[127.0.0.1:9001] 200=[]", 1s));
  CHECK(a->ring()->version() > version);
  CHECK(b->ring() != nullptr);  // the last ring stays readable after Close()
}

TEST_CASE("A registry whose settings differ from the ring's gets on_fatal naming the key and "
          "writes nothing",
          "[partition][registry]") {
  ZooKeeperServer zk;
  std::unique_ptr<Registry> first = StartRegistry(Options(zk, 100, 9001));
  REQUIRE(first->WaitRegistered(5000).ok());
  Inspector zoo(zk.address());

  struct Variant {
    const char* key;
    std::function<void(RingSettings*)> change;
  };
  const Variant variants[] = {
      {"cluster.hash_bound", [](RingSettings* s) { s->hash_bound = 1000; }},
      {"cluster.replication", [](RingSettings* s) { s->replication = "async"; }},
  };
  for (const Variant& v : variants) {
    INFO(v.key);
    Recorder recorder;
    RegistryOptions o = Options(zk, 300, 9003);
    v.change(&o.settings);
    recorder.Attach(&o);
    std::unique_ptr<Registry> r = StartRegistry(std::move(o));
    const Status s = r->WaitRegistered(5000);
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains(v.key));
    REQUIRE(recorder.fatal_count() == 1);
    CHECK(recorder.fatal[0].IsInvalidArgument());
    CHECK_THAT(recorder.fatal[0].message(), Catch::Contains(v.key));
    std::shared_ptr<const Ring> ring;
    CHECK(r->Refresh(&ring).IsInvalidArgument());
    CHECK(r->ring() == nullptr);
    CHECK(zoo.Exists("/flatkv/thriftbinary300:127.0.0.1:9003") == ZNONODE);
    CHECK(zoo.Exists("/flatkv/.cluster/marks/300") == ZNONODE);
    CHECK(zoo.Get("/flatkv/.cluster") ==
          R"({"hash_bound": 9223372036854775807, "replication": "sync"})");
  }
}

TEST_CASE("A foreign child under the service path is skipped and the ring is built from the rest",
          "[partition][registry]") {
  ZooKeeperServer zk;
  {
    Inspector zoo(zk.address());
    zoo.Create("/flatkv");
    zoo.Create("/flatkv/zookeeper-locks");     // another tool's node
    zoo.Create("/flatkv/thriftbinaryXYZ");     // malformed: no mark, no address
    zoo.Create("/flatkv/thriftbinary5:host");  // malformed: no port
  }
  std::unique_ptr<Registry> r = StartRegistry(Options(zk, 100, 9001));
  REQUIRE(r->WaitRegistered(5000).ok());
  REQUIRE(Eventually([&] { return RingOf(*r) == "100=[127.0.0.1:9001]"; }, 1s));

  // A member that another tool wrote by hand counts; a new foreign child
  // changes the version but not the ring.
  Inspector zoo(zk.address());
  zoo.Create("/flatkv/thriftbinary200:10.0.0.2:9000", "thriftbinary200:10.0.0.2:9000");
  CHECK(Eventually(
      [&] { return RingOf(*r) == "100=[127.0.0.1:9001] 200=[10.0.0.2:9000]"; }, 1s));
  const int64_t version = r->ring()->version();
  zoo.Create("/flatkv/thriftbinary-notes");
  CHECK(Eventually([&] { return r->ring()->version() > version; }, 1s));
  CHECK(RingOf(*r) == "100=[127.0.0.1:9001] 200=[10.0.0.2:9000]");
}

TEST_CASE("After session expiry the registry makes a new session and registers again by itself",
          "[partition][registry]") {
  ZooKeeperServer zk;
  std::unique_ptr<Registry> r = StartRegistry(Options(zk, 100, 9001));
  REQUIRE(r->WaitRegistered(5000).ok());
  const std::string node = "/flatkv/thriftbinary100:127.0.0.1:9001";
  Inspector zoo(zk.address());
  Stat before;
  REQUIRE(zoo.Exists(node, &before) == ZOK);

  // ZooKeeper's FAQ: a second handle on the same session, closed, expires it.
  // The two handles take the session from each other, and the registry
  // reconnects within milliseconds: if it took the session back before the
  // close, the close did not reach the server. Try again then.
  clientid_t id{};
  std::string password;
  REQUIRE(r->TEST_SessionId(&id.client_id, &password));
  REQUIRE(password.size() == sizeof(id.passwd));
  std::copy(password.begin(), password.end(), id.passwd);
  for (int attempt = 0; attempt < 10 && r->stats().sessions < 2; ++attempt) {
    Inspector twin(zk.address(), &id);
    if (twin.WaitConnected(2s)) twin.Close();
    Eventually([&] { return r->stats().sessions == 2; }, 1s);
  }
  REQUIRE(Eventually([&] { return r->stats().sessions == 2; }, 5s));
  REQUIRE(r->WaitRegistered(5000).ok());
  Stat after;
  REQUIRE(Eventually([&] { return zoo.Exists(node, &after) == ZOK; }, 1s));
  int64_t session = 0;
  REQUIRE(r->TEST_SessionId(&session, &password));
  CHECK(session != id.client_id);
  CHECK(after.ephemeralOwner == session);
  CHECK(after.czxid > before.czxid);  // a new registration: it rejoins at the tail
  CHECK(r->stats().registrations == 2);
  CHECK(Eventually(
      [&] {
        const std::shared_ptr<const Ring> ring = r->ring();
        return ring && ring->Find(100) && ring->Find(100)->chain.size() == 1 &&
               ring->Find(100)->chain[0].czxid == after.czxid;
      },
      1s));
}

TEST_CASE("A ZooKeeper restart leaves the ring whole without restarting the registries",
          "[partition][registry]") {
  ZooKeeperServer zk;
  std::unique_ptr<Registry> a = StartRegistry(Options(zk, 100, 9001));
  std::unique_ptr<Registry> b = StartRegistry(Options(zk, 200, 9002));
  REQUIRE(a->WaitRegistered(5000).ok());
  REQUIRE(b->WaitRegistered(5000).ok());
  const std::string whole = "100=[127.0.0.1:9001] 200=[127.0.0.1:9002]";
  REQUIRE(AllSee({a.get(), b.get()}, whole, 1s));
  const std::shared_ptr<const Ring> last = a->ring();

  zk.Kill();
  // The client notices after 2/3 of the session timeout without an answer.
  REQUIRE(Eventually([&] { return !a->connected(); }, 3s));
  CHECK(a->ring() == last);  // still serving with the last ring
  std::this_thread::sleep_for(300ms);
  CHECK(a->disconnected_ms() >= 300);
  CHECK(a->ring() == last);

  zk.Start();
  CHECK(Eventually([&] { return a->connected() && b->connected(); }, 5s));
  CHECK(AllSee({a.get(), b.get()}, whole, 5s));
  Inspector zoo(zk.address());
  CHECK(zoo.Exists("/flatkv/thriftbinary100:127.0.0.1:9001") == ZOK);
  CHECK(zoo.Exists("/flatkv/thriftbinary200:127.0.0.1:9002") == ZOK);
  std::shared_ptr<const Ring> ring;
  CHECK(a->Refresh(&ring).ok());
  CHECK(ring->ToString() == whole);
}

TEST_CASE("A registry started while ZooKeeper is down registers as soon as it comes up",
          "[partition][registry]") {
  ZooKeeperServer zk(/*start=*/false);
  std::unique_ptr<Registry> r = StartRegistry(Options(zk, 100, 9001));
  CHECK(r->ring() == nullptr);
  CHECK(!r->connected());
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  std::shared_ptr<const Ring> ring;
  const Status refresh = r->Refresh(&ring);  // waits up to the session timeout
  CHECK(refresh.IsUnavailable());
  CHECK(Clock::now() - t0 >= std::chrono::milliseconds(kSessionTimeoutMs));
  // Waiting is not spinning: the 2 s wait burns well under a second of CPU.
  CHECK(CpuSeconds() - cpu0 < 0.5);
  CHECK(r->ring() == nullptr);
  CHECK(r->WaitRegistered(10).IsUnavailable());
  CHECK(r->disconnected_ms() >= kSessionTimeoutMs);

  zk.Start();
  REQUIRE(r->WaitRegistered(5000).ok());
  CHECK(Eventually([&] { return RingOf(*r) == "100=[127.0.0.1:9001]"; }, 1s));
  CHECK(r->stats().sessions == 1);
}

TEST_CASE("In steady state a registry sends ZooKeeper nothing but pings",
          "[partition][registry]") {
  ZooKeeperServer zk;
  std::unique_ptr<Registry> a = StartRegistry(Options(zk, 100, 9001));
  std::unique_ptr<Registry> b = StartRegistry(Options(zk, 200, 9002));
  REQUIRE(AllSee({a.get(), b.get()}, "100=[127.0.0.1:9001] 200=[127.0.0.1:9002]", 2s));
  std::this_thread::sleep_for(200ms);
  const int64_t reads = a->stats().ring_reads + b->stats().ring_reads;
  const int64_t before = MntrValue(zk.FourLetter("mntr"), "zk_packets_received");
  std::this_thread::sleep_for(2s);
  const int64_t after = MntrValue(zk.FourLetter("mntr"), "zk_packets_received");
  REQUIRE(before >= 0);
  // Two clients pinging every third of a 2 s timeout: ~6 packets in 2 s.
  CHECK(after - before <= 12);
  CHECK(a->stats().ring_reads + b->stats().ring_reads == reads);
}

TEST_CASE("Start refuses bad options, naming the key", "[partition][registry]") {
  RegistryOptions good;
  good.zookeeper = "127.0.0.1:" + std::to_string(FreePort());  // nobody listens
  good.advertise = "10.0.0.1:9901";
  struct Case {
    const char* key;
    std::function<void(RegistryOptions*)> change;
  };
  const Case cases[] = {
      {"cluster.advertise", [](RegistryOptions* o) { o->advertise = "0.0.0.0:9901"; }},
      {"cluster.advertise", [](RegistryOptions* o) { o->advertise = "[::]:9901"; }},
      {"cluster.advertise", [](RegistryOptions* o) { o->advertise = "10.0.0.1"; }},
      {"cluster.advertise", [](RegistryOptions* o) { o->advertise = ""; }},
      {"cluster.zookeeper", [](RegistryOptions* o) { o->zookeeper = ""; }},
      {"cluster.zookeeper", [](RegistryOptions* o) { o->zookeeper = "zk1:2181,zk2"; }},
      {"cluster.service_path", [](RegistryOptions* o) { o->service_path = "flatkv"; }},
      {"cluster.service_path", [](RegistryOptions* o) { o->service_path = std::string(1, '/'); }},
      {"cluster.service_path", [](RegistryOptions* o) { o->service_path = "/flatkv/"; }},
      {"cluster.session_timeout_ms", [](RegistryOptions* o) { o->session_timeout_ms = 0; }},
  };
  for (const Case& c : cases) {
    RegistryOptions o = good;
    c.change(&o);
    INFO(c.key << " zookeeper='" << o.zookeeper << "' advertise='" << o.advertise
               << "' service_path='" << o.service_path << "'");
    std::unique_ptr<Registry> r;
    const Status s = Registry::Start(std::move(o), &r);
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains(c.key));
    CHECK(r == nullptr);
  }
  std::unique_ptr<Registry> r;
  CHECK(Registry::Start(good, &r).ok());  // the good options start (and retry quietly)
}

}  // namespace flatkv::partition
