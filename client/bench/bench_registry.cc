// flatkv-registry-bench: what membership costs ZooKeeper as a ring grows.
//
// For each N in --members it starts a ZooKeeper of its own
// (deploy/zookeeper.sh, pinned with taskset to --zk-cpu), N ring members
// in this process (the real partition/Registry, each its own ZooKeeper
// session, marks of --replicas members each) and --servers real
// flatkv-server instances of one more mark, then measures:
//   startup  all of them registering at once, until every registry's ring
//            shows every member (and the servers' chain is recorded);
//   idle     the steady rate (lease probes and pings), subtracted below;
//   leave    a registry closes its session (its node goes at once);
//   join     a new registry registers;
//   kill9    a flatkv-server is killed with SIGKILL (its node goes when
//            ZooKeeper expires its session, a session timeout later).
// For each: ZooKeeper requests (mntr's zk_packets_received; minus the idle
// rate over the same time but for startup, which shows it both ways),
// ZooKeeper CPU seconds (/proc, minus idle), the milliseconds until each
// registry's ring showed the change (p50, p99, max; kill9's from the kill),
// and how many ring reads each registry made and ZooKeeper reads they took
// (RegistryStats). One JSON object per line on stdout.
//
//   flatkv-registry-bench --members 30,100,300 --servers 3
//       --server-bin build/server/flatkv-server --zk-cpu 0 --bench-cpu 1
#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "partition/registry.h"

namespace flatkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using partition::Registry;
using partition::RegistryOptions;
using partition::RegistryStats;
using partition::Ring;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Flags {
  std::vector<int> members = {30, 100, 300};
  int replicas = 3;
  int servers = 3;
  std::string server_bin;
  std::string source_dir = FLATKV_SOURCE_DIR;
  int session_timeout_ms = 6000;
  int zk_cpu = -1;
  int bench_cpu = -1;
  std::string zk_heap = "1g";
  int timeout_s = 120;  // per phase
  double start_rate = 0;  // registries started per second at start-up; 0 = all at once
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "flatkv-registry-bench: %s\n"
               "usage: flatkv-registry-bench [--members 30,100,300] [--replicas 3] [--servers 3]\n"
               "  [--server-bin PATH] [--session-timeout-ms 6000] [--zk-cpu C] [--bench-cpu C]\n"
               "  [--zk-heap 1g] [--timeout-s 120] [--start-rate PER_SECOND]\n",
               why);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--members") {
      f.members.clear();
      std::stringstream ss(v);
      for (std::string n; std::getline(ss, n, ',');) f.members.push_back(std::stoi(n));
    } else if (a == "--replicas") {
      f.replicas = std::stoi(v);
    } else if (a == "--servers") {
      f.servers = std::stoi(v);
    } else if (a == "--server-bin") {
      f.server_bin = v;
    } else if (a == "--session-timeout-ms") {
      f.session_timeout_ms = std::stoi(v);
    } else if (a == "--zk-cpu") {
      f.zk_cpu = std::stoi(v);
    } else if (a == "--bench-cpu") {
      f.bench_cpu = std::stoi(v);
    } else if (a == "--zk-heap") {
      f.zk_heap = v;
    } else if (a == "--start-rate") {
      f.start_rate = std::stod(v);
    } else if (a == "--timeout-s") {
      f.timeout_s = std::stoi(v);
    } else {
      Usage(("unknown flag " + a).c_str());
    }
  }
  if (f.replicas < 1 || f.members.empty()) Usage("--replicas and --members must be positive");
  if (f.servers > 0 && f.server_bin.empty()) Usage("--servers needs --server-bin");
  return f;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string FourLetter(int port, const std::string& word) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
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

int64_t Mntr(int port, const std::string& key) {
  const std::string m = FourLetter(port, "mntr");
  const size_t at = m.find(key + "\t");
  return at == std::string::npos ? -1 : std::stoll(m.substr(at + key.size() + 1));
}

// User + system CPU seconds of process "pid" (all its threads).
double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::stringstream ss(stat.substr(close_paren + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; ss >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stod(field);
    if (i == 15) {
      stime = std::stod(field);
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

class ZooKeeper {
 public:
  ZooKeeper(const Flags& f) : flags_(f), port_(FreePort()) {
    char tmpl[] = "/tmp/flatkv-regbench-zk-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
    if (Script("start " + dir_ + " " + std::to_string(port_)) != 0) {
      throw std::runtime_error("deploy/zookeeper.sh start failed");
    }
    std::ifstream in(dir_ + "/zookeeper.pid");
    in >> pid_;
    if (f.zk_cpu >= 0) {
      std::system(("taskset -a -p -c " + std::to_string(f.zk_cpu) + " " + std::to_string(pid_) +
                   " >/dev/null")
                      .c_str());
    }
  }
  ~ZooKeeper() {
    Script("kill " + dir_);
    std::filesystem::remove_all(dir_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  int64_t packets() const { return Mntr(port_, "zk_packets_received"); }
  double cpu() const { return CpuSeconds(pid_); }

 private:
  int Script(const std::string& args) const {
    return std::system(("ZK_OWNER_PID=" + std::to_string(getpid()) +
                        " ZK_MAX_CLIENT_CNXNS=0 ZK_HEAP=" + flags_.zk_heap + " bash " +
                        flags_.source_dir + "/deploy/zookeeper.sh " + args + " >/dev/null")
                           .c_str());
  }
  const Flags& flags_;
  int port_;
  int pid_ = 0;
  std::string dir_;
};

// A flatkv-server of the ring, killed at the end.
struct Server {
  int pid = 0;
  int port = 0;
  std::string dir;
};

Server StartServer(const Flags& f, const ZooKeeper& zk, int64_t mark) {
  Server s;
  s.port = FreePort();
  char tmpl[] = "/tmp/flatkv-regbench-srv-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
  s.dir = tmpl;
  const std::vector<std::string> args = {
      f.server_bin,
      "--set", "server.port=" + std::to_string(s.port),
      "--set", "storage.path=" + s.dir + "/data",
      "--set", "cluster.zookeeper=" + zk.address(),
      "--set", "cluster.mark=" + std::to_string(mark),
      "--set", "cluster.session_timeout_ms=" + std::to_string(f.session_timeout_ms),
      "--set", "log.level=warn",
  };
  s.pid = fork();
  if (s.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the bench
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int log = open((s.dir + "/log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return s;
}

void StopServer(Server* s, int sig) {
  if (s->pid <= 0) return;
  kill(s->pid, sig);
  waitpid(s->pid, nullptr, 0);
  s->pid = 0;
  if (std::getenv("FLATKV_BENCH_KEEP") == nullptr) std::filesystem::remove_all(s->dir);
}

// Each registry's view of one thing: when its ring first showed it.
struct Watcher {
  std::mutex mu;
  std::string member;       // "host:port" looked for...
  bool present = true;      // ...to be present (or absent)
  size_t count = 0;         // or (member empty) this many members
  std::vector<int64_t> seen_ms;  // per registry: -1 not yet
};

bool Shows(const Ring& ring, const Watcher& w) {
  if (w.member.empty()) {
    size_t n = 0;
    for (const auto& p : ring.partitions()) n += p.chain.size();
    return n >= w.count;
  }
  for (const auto& p : ring.partitions()) {
    for (const auto& m : p.chain) {
      if (m.address() == w.member) return w.present;
    }
  }
  return !w.present;
}

struct Member {
  std::unique_ptr<Registry> registry;
  std::string address;
};

class Bench {
 public:
  Bench(const Flags& f, int n) : f_(f), n_(n), zk_(f) {}

  void Run() {
    const int64_t server_mark = 50;  // the first mark: nothing to import
    watcher_.seen_ms.assign(n_ + 1, -1);

    // Start-up: every registry and server at once.
    const auto s0 = Snapshot();
    Expect("", true, n_ + f_.servers);
    // The servers first: a mark that joins a ring imports its range from
    // the mark that owns it, and the registries here serve nothing.
    for (int i = 0; i < f_.servers; ++i) servers_.push_back(StartServer(f_, zk_, server_mark));
    if (f_.servers > 0) WaitServers();
    for (int i = 0; i < n_; ++i) {
      if (f_.start_rate > 0) {
        const int64_t due = s0.ms + static_cast<int64_t>(i * 1000 / f_.start_rate);
        if (due > NowMs()) std::this_thread::sleep_for(std::chrono::milliseconds(due - NowMs()));
      }
      members_.push_back(StartMember(i, 100 * (i / f_.replicas + 1)));
    }
    const bool all = WaitAll(s0.ms);
    // The servers' head records its chain once the chain formed; wait for
    // that to settle as part of start-up.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const auto s1 = Snapshot();

    // Idle rate: lease probes and the client's pings.
    std::this_thread::sleep_for(std::chrono::seconds(5));
    const auto s2 = Snapshot();
    idle_packets_per_s_ = (s2.packets - s1.packets) / ((s2.ms - s1.ms) / 1000.0);
    idle_cpu_per_s_ = (s2.cpu - s1.cpu) / ((s2.ms - s1.ms) / 1000.0);
    Print("startup", s0, s1, all, /*from_ms=*/s0.ms, /*subtract_idle=*/false);
    Print("idle", s1, s2, true, s1.ms, false);

    // Leave: a registry closes its session.
    {
      Member& m = members_[n_ - 1];
      const auto b = Snapshot();
      Expect(m.address, false, 0);
      MarkSelf(n_ - 1);
      m.registry->Close();
      const bool ok = WaitAll(b.ms);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      Print("leave", b, Snapshot(), ok, b.ms, true);
    }
    // Join: a new registry of the same mark.
    {
      const auto b = Snapshot();
      Expect("127.0.0.1:" + std::to_string(40000 + n_), true, 0);
      MarkSelf(n_ - 1);
      Replace(n_ - 1, StartMember(n_, 100 * ((n_ - 1) / f_.replicas + 1)));
      const bool ok = WaitAll(b.ms);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      Print("join", b, Snapshot(), ok, b.ms, true);
    }
    // kill -9 of a real instance (the chain's tail): seen once ZooKeeper
    // expires its session.
    if (!servers_.empty()) {
      Server& victim = servers_.back();
      const auto b = Snapshot();
      Expect("127.0.0.1:" + std::to_string(victim.port), false, 0);
      StopServer(&victim, SIGKILL);
      const bool ok = WaitAll(b.ms);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      Print("kill9", b, Snapshot(), ok, b.ms, true);
    }
    for (Server& s : servers_) StopServer(&s, SIGTERM);
    // Closing a thousand sessions one after another is itself a thousand
    // changes; close the handles without waiting for the ring.
    members_.clear();
  }

 private:
  struct Snap {
    int64_t ms;
    int64_t packets;
    double cpu;
    int64_t ring_reads;  // the registries' (RegistryStats), closed ones' included
    int64_t zk_reads;
  };
  Snap Snapshot() {
    Snap s{NowMs(), zk_.packets(), zk_.cpu(), retired_.ring_reads, retired_.zk_reads};
    for (const Member& m : members_) {
      if (!m.registry) continue;
      const RegistryStats st = m.registry->stats();
      s.ring_reads += st.ring_reads;
      s.zk_reads += st.zk_reads;
    }
    return s;
  }
  // Replaces member i, keeping the counters of the one it replaces.
  void Replace(int i, Member m) {
    if (members_[i].registry) {
      const RegistryStats st = members_[i].registry->stats();
      retired_.ring_reads += st.ring_reads;
      retired_.zk_reads += st.zk_reads;
    }
    members_[i] = std::move(m);
  }

  Member StartMember(int i, int64_t mark) {
    Member m;
    const int port = 40000 + i;
    m.address = "127.0.0.1:" + std::to_string(port);
    RegistryOptions o;
    o.zookeeper = zk_.address();
    o.mark = mark;
    o.advertise = m.address;
    o.session_timeout_ms = f_.session_timeout_ms;
    const int slot = std::min(i, n_ - 1);
    o.on_ring = [this, slot](std::shared_ptr<const Ring> ring) {
      std::lock_guard<std::mutex> lock(watcher_.mu);
      if (watcher_.seen_ms[slot] == -1 && Shows(*ring, watcher_)) watcher_.seen_ms[slot] = NowMs();
    };
    if (!Registry::Start(o, &m.registry).ok()) throw std::runtime_error("Registry::Start");
    m.registry->Register();
    return m;
  }

  // Until an observer's ring shows every server registered.
  void WaitServers() {
    RegistryOptions o;
    o.zookeeper = zk_.address();
    o.observer = true;
    o.session_timeout_ms = f_.session_timeout_ms;
    std::unique_ptr<Registry> observer;
    if (!Registry::Start(o, &observer).ok()) throw std::runtime_error("Registry::Start");
    const int64_t deadline = NowMs() + f_.timeout_s * 1000;
    while (NowMs() < deadline) {
      const auto ring = observer->ring();
      size_t n = 0;
      for (const auto& p : ring ? ring->partitions() : std::vector<partition::Partition>{}) {
        n += p.chain.size();
      }
      if (n >= static_cast<size_t>(f_.servers)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("the flatkv-server instances did not register");
  }

  void Expect(const std::string& member, bool present, size_t count) {
    std::lock_guard<std::mutex> lock(watcher_.mu);
    watcher_.member = member;
    watcher_.present = present;
    watcher_.count = count;
    std::fill(watcher_.seen_ms.begin(), watcher_.seen_ms.end(), -1);
    // A registry whose current ring already shows it.
    for (size_t i = 0; i < members_.size(); ++i) {
      const auto ring = members_[i].registry ? members_[i].registry->ring() : nullptr;
      if (ring && Shows(*ring, watcher_)) watcher_.seen_ms[i] = NowMs();
    }
  }
  // The registry that makes the change does not count.
  void MarkSelf(int slot) {
    std::lock_guard<std::mutex> lock(watcher_.mu);
    watcher_.seen_ms[slot] = -2;
  }

  bool WaitAll(int64_t from_ms) {
    const int64_t deadline = from_ms + f_.timeout_s * 1000;
    while (NowMs() < deadline) {
      {
        std::lock_guard<std::mutex> lock(watcher_.mu);
        bool all = true;
        for (int i = 0; i < n_; ++i) all = all && watcher_.seen_ms[i] != -1;
        if (all) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  void Print(const char* phase, const Snap& b, const Snap& a, bool all_seen, int64_t from_ms,
             bool subtract_idle) {
    const double seconds = (a.ms - b.ms) / 1000.0;
    double requests = static_cast<double>(a.packets - b.packets);
    double cpu = a.cpu - b.cpu;
    const double beyond_idle = requests - idle_packets_per_s_ * seconds;
    if (subtract_idle) {
      requests = beyond_idle;
      cpu -= idle_cpu_per_s_ * seconds;
    }
    std::vector<int64_t> lat;
    {
      std::lock_guard<std::mutex> lock(watcher_.mu);
      for (int i = 0; i < n_; ++i) {
        if (watcher_.seen_ms[i] >= 0) lat.push_back(std::max<int64_t>(0, watcher_.seen_ms[i] - from_ms));
      }
    }
    std::sort(lat.begin(), lat.end());
    const auto pct = [&](double p) -> int64_t {
      if (lat.empty()) return -1;
      return lat[std::min(lat.size() - 1, static_cast<size_t>(p * (lat.size() - 1) + 0.5))];
    };
    const int members = n_ + f_.servers;
    std::printf(
        "{\"phase\": \"%s\", \"members\": %d, \"registries\": %d, \"servers\": %d, "
        "\"session_timeout_ms\": %d, \"seconds\": %.2f, \"zk_requests\": %.0f, "
        "\"requests_per_member\": %.2f, \"zk_cpu_s\": %.2f, \"all_seen\": %s, \"seen\": %zu, "
        "\"p50_ms\": %lld, \"p99_ms\": %lld, \"max_ms\": %lld, "
        "\"beyond_idle_per_member\": %.2f, \"ring_reads_per_registry\": %.2f, "
        "\"zk_reads_per_registry\": %.2f}\n",
        phase, members, n_, f_.servers, f_.session_timeout_ms, seconds, requests,
        requests / members, cpu, all_seen ? "true" : "false", lat.size(),
        static_cast<long long>(pct(0.5)), static_cast<long long>(pct(0.99)),
        static_cast<long long>(lat.empty() ? -1 : lat.back()),
        beyond_idle / members, static_cast<double>(a.ring_reads - b.ring_reads) / n_,
        static_cast<double>(a.zk_reads - b.zk_reads) / n_);
    std::fflush(stdout);
  }

  const Flags& f_;
  const int n_;
  ZooKeeper zk_;
  std::vector<Member> members_;
  std::vector<Server> servers_;
  Watcher watcher_;
  RegistryStats retired_;  // of registries replaced since the start
  double idle_packets_per_s_ = 0;
  double idle_cpu_per_s_ = 0;
};

}  // namespace
}  // namespace flatkv::bench

int main(int argc, char** argv) {
  using namespace flatkv::bench;
  const Flags flags = ParseFlags(argc, argv);
  // stdout is the JSON lines: the registries' (and ZooKeeper's) log goes
  // to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("flatkv-registry-bench"));
  spdlog::set_level(spdlog::level::err);
  if (flags.bench_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(flags.bench_cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  // A thread and a socket per session, two more threads per handle.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  signal(SIGPIPE, SIG_IGN);
  for (const int n : flags.members) {
    try {
      Bench(flags, n).Run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flatkv-registry-bench: N=%d: %s\n", n, e.what());
      return 1;
    }
  }
  return 0;
}
