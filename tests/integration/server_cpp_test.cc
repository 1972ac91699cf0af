// Integration tests: the real flatkv-server (FLATKV_SERVER_BIN), started with
// fork/exec on a free loopback port in its own temporary directory, driven
// through flatkv::client::Client. Every method of the service is called, the
// typed errors are checked, and restarts (SIGTERM, then the same port and
// directory) must keep every acknowledged write in both write modes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"

namespace {

using flatkv::Status;
using flatkv::client::Client;
using flatkv::client::ClientOptions;
using flatkv::rpc::KvPair;
using flatkv::rpc::WriteMode;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "secret";
// Generous: sanitizer builds start and stop slowly on a shared machine.
constexpr auto kDeadline = std::chrono::seconds(60);

// "prefix" followed by the decimal k (built with append: g++ 12 warns
// falsely about "literal" + std::string&&).
std::string Numbered(std::string prefix, int64_t k) {
  prefix.append(std::to_string(k));
  return prefix;
}

// A port nothing listens on right now (the kernel's pick for port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// One flatkv-server process: its own temporary directory (data and log),
// a free port kept across restarts, "--set" settings. The destructor kills
// a server still running and removes the directory.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> settings = {})
      : settings_(std::move(settings)), port_(FreePort()) {
    char dir[] = "/tmp/flatkv-cpp-it-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    dir_ = dir;
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts the server and waits until it accepts connections.
  void Start(const std::vector<std::string>& extra = {}) {
    REQUIRE(pid_ < 0);
    std::vector<std::string> args = {FLATKV_SERVER_BIN,
                                     "--set", Numbered("server.port=", port_),
                                     "--set", "storage.path=" + dir_ + "/data",
                                     "--set", std::string("admin.token=") + kToken};
    for (const std::vector<std::string>* list : {&settings_, &extra}) {
      for (const std::string& s : *list) {
        args.push_back("--set");
        args.push_back(s);
      }
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_ + "/server.log";
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // Dies with the test even when the test cannot run its destructors
      // (a sanitizer abort, ctest's timeout kill).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    WaitUntilAccepting();
  }

  // Sends "sig" and reaps the server; returns its exit code, or 128 + the
  // signal that ended it.
  int Stop(int sig = SIGTERM) {
    REQUIRE(pid_ > 0);
    kill(pid_, sig);
    int status = 0;
    const Clock::time_point end = Clock::now() + kDeadline;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > end) FAIL("flatkv-server did not stop\n" << Log());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  ClientOptions Options() const {
    ClientOptions o;
    o.port = port_;
    return o;
  }

  std::string Log() const {
    std::ifstream in(dir_ + "/server.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  void WaitUntilAccepting() {
    const Clock::time_point end = Clock::now() + kDeadline;
    while (!Accepts(port_)) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("flatkv-server exited at start-up\n" << Log());
      }
      if (Clock::now() > end) FAIL("flatkv-server does not accept\n" << Log());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const std::vector<std::string> settings_;
  const int port_;
  std::string dir_;
  pid_t pid_ = -1;
};

std::string GetOrDie(Client* c, int64_t key) {
  std::string value;
  Status st = c->Get(key, &value);
  INFO("get " << key << ": " << st.ToString());
  REQUIRE(st.ok());
  return value;
}

std::map<std::string, int64_t> StatsOrDie(Client* c) {
  std::map<std::string, int64_t> stats;
  REQUIRE(c->Stats(&stats).ok());
  return stats;
}

// Keys and values of a scan that follows nextKey to the end, "page" at a time.
std::vector<KvPair> ScanAll(Client* c, int64_t from, int32_t page, bool reverse) {
  std::vector<KvPair> all;
  for (int calls = 0; calls < 10000; ++calls) {
    flatkv::rpc::ScanResult r;
    REQUIRE(c->Scan(from, page, reverse, &r).ok());
    REQUIRE(r.pairs.size() <= static_cast<size_t>(page));
    all.insert(all.end(), r.pairs.begin(), r.pairs.end());
    if (r.done) return all;
    from = r.nextKey;
  }
  FAIL("scan never finished");
  return all;
}

std::vector<int64_t> KeysOf(const std::vector<KvPair>& pairs) {
  std::vector<int64_t> keys;
  for (const KvPair& p : pairs) keys.push_back(p.key);
  return keys;
}

KvPair Pair(int64_t key, std::string value) {
  KvPair p;
  p.key = key;
  p.value = std::move(value);
  return p;
}

TEST_CASE("Integer keys round-trip through get, put, remove, append, multiGet and multiPut",
          "[integration][server]") {
  ServerProcess server;
  server.Start();
  Client c(server.Options());
  REQUIRE(c.Connect().ok());

  std::string value = "untouched";
  CHECK(c.Get(1, &value).IsNotFound());
  CHECK(value == "untouched");
  REQUIRE(c.Put(1, "hello").ok());
  CHECK(GetOrDie(&c, 1) == "hello");
  REQUIRE(c.Put(1, std::string("bin\0ary", 7)).ok());
  CHECK(GetOrDie(&c, 1) == std::string("bin\0ary", 7));
  REQUIRE(c.Put(2, "").ok());
  CHECK(GetOrDie(&c, 2).empty());  // an empty value is a value

  REQUIRE(c.Append(3, "ab").ok());  // creates the key
  REQUIRE(c.Append(3, "cd").ok());
  CHECK(GetOrDie(&c, 3) == "abcd");

  bool existed = false;
  REQUIRE(c.Remove(3, &existed).ok());
  CHECK(existed);
  REQUIRE(c.Remove(3, &existed).ok());
  CHECK_FALSE(existed);
  CHECK(c.Get(3, &value).IsNotFound());

  REQUIRE(c.MultiPut({Pair(10, "ten"), Pair(11, "eleven"), Pair(12, std::string(100000, 'x'))}).ok());
  std::vector<flatkv::rpc::GetResult> got;
  REQUIRE(c.MultiGet({12, 99, 10, 11}, &got).ok());
  REQUIRE(got.size() == 4);
  CHECK((got[0].found && got[0].value == std::string(100000, 'x')));
  CHECK_FALSE(got[1].found);
  CHECK((got[2].found && got[2].value == "ten"));
  CHECK((got[3].found && got[3].value == "eleven"));
  REQUIRE(c.MultiGet({}, &got).ok());
  CHECK(got.empty());
}

TEST_CASE("Scans walk key order in both directions and resume from nextKey",
          "[integration][server]") {
  // Small segments so the keys span several flat tables.
  ServerProcess server({"storage.segment_keys=64"});
  server.Start();
  Client c(server.Options());
  std::vector<KvPair> pairs;
  std::vector<int64_t> keys;
  for (int64_t k = 5; k < 1000; k += 7) {
    pairs.push_back(Pair(k, Numbered("v", k)));
    keys.push_back(k);
  }
  REQUIRE(c.MultiPut(pairs).ok());

  std::vector<KvPair> forward = ScanAll(&c, 0, 13, false);
  CHECK(KeysOf(forward) == keys);
  CHECK(forward[3].value == "v26");
  CHECK(KeysOf(ScanAll(&c, 0, 1000, false)) == keys);  // one page

  std::vector<int64_t> reversed(keys.rbegin(), keys.rend());
  CHECK(KeysOf(ScanAll(&c, 999, 13, true)) == reversed);

  // From a key in the middle: >= from going up, <= from going down.
  flatkv::rpc::ScanResult r;
  REQUIRE(c.Scan(500, 3, false, &r).ok());
  CHECK(KeysOf(r.pairs) == std::vector<int64_t>{502, 509, 516});
  CHECK_FALSE(r.done);
  REQUIRE(c.Scan(502, 3, true, &r).ok());
  CHECK(KeysOf(r.pairs) == std::vector<int64_t>{502, 495, 488});

  // Past the last key: nothing, done.
  REQUIRE(c.Scan(1000, 10, false, &r).ok());
  CHECK(r.pairs.empty());
  CHECK(r.done);
}

TEST_CASE("scanLog returns live keys in insertion order and resumes from its cursor",
          "[integration][server]") {
  // One data file: a segment's log is then its whole insertion order.
  ServerProcess server({"storage.data_files=1"});
  server.Start();
  Client c(server.Options());
  const std::vector<int64_t> order = {42, 7, 300, 1, 99, 8, 1000, 3};
  for (int64_t k : order) REQUIRE(c.Put(k, Numbered("first", k)).ok());
  REQUIRE(c.Remove(300).ok());
  REQUIRE(c.Put(7, "second").ok());  // now lives at the end of the log

  std::vector<KvPair> all;
  std::string cursor;
  for (int calls = 0;; ++calls) {
    REQUIRE(calls < 100);
    flatkv::rpc::LogScanResult r;
    REQUIRE(c.ScanLog(cursor, 3, &r).ok());
    CHECK(r.pairs.size() <= 3);
    all.insert(all.end(), r.pairs.begin(), r.pairs.end());
    if (r.done) break;
    cursor = r.cursor;
  }
  CHECK(KeysOf(all) == std::vector<int64_t>{42, 1, 99, 8, 1000, 3, 7});
  CHECK(all.back().value == "second");
}

TEST_CASE("String keys of any bytes round-trip through sput, sget and sremove",
          "[integration][server]") {
  ServerProcess server;
  server.Start();
  Client c(server.Options());
  const std::string binary("\0key\xff", 5);
  std::string value = "untouched";
  CHECK(c.SGet("user:42", &value).IsNotFound());
  CHECK(value == "untouched");
  REQUIRE(c.SPut("user:42", "{}").ok());
  REQUIRE(c.SPut(binary, std::string("v\0", 2)).ok());
  REQUIRE(c.SGet("user:42", &value).ok());
  CHECK(value == "{}");
  REQUIRE(c.SGet(binary, &value).ok());
  CHECK(value == std::string("v\0", 2));
  REQUIRE(c.SPut("user:42", "{\"n\":1}").ok());
  REQUIRE(c.SGet("user:42", &value).ok());
  CHECK(value == "{\"n\":1}");

  bool existed = false;
  REQUIRE(c.SRemove("user:42", &existed).ok());
  CHECK(existed);
  REQUIRE(c.SRemove("user:42", &existed).ok());
  CHECK_FALSE(existed);
  CHECK(c.SGet("user:42", &value).IsNotFound());
  REQUIRE(c.SGet(binary, &value).ok());  // its neighbour is untouched
  // Integer key 0 and string keys live apart.
  CHECK(c.Get(0, &value).IsNotFound());
}

TEST_CASE("Admin calls switch the write mode, run a compaction and report info and stats",
          "[integration][server]") {
  ServerProcess server({"storage.segment_keys=1024"});
  server.Start();
  Client c(server.Options());

  WriteMode::type mode = WriteMode::ASYNC;
  REQUIRE(c.GetWriteMode(&mode).ok());
  CHECK(mode == WriteMode::SAFE);
  REQUIRE(c.SetWriteMode(kToken, WriteMode::ASYNC).ok());
  REQUIRE(c.GetWriteMode(&mode).ok());
  CHECK(mode == WriteMode::ASYNC);
  flatkv::rpc::NodeInfo info;
  REQUIRE(c.Info(&info).ok());
  CHECK(info.writeMode == WriteMode::ASYNC);
  REQUIRE(c.SetWriteMode(kToken, WriteMode::SAFE).ok());

  const std::map<std::string, int64_t> before = StatsOrDie(&c);
  // Garbage to reclaim: every key written three times, in two segments.
  for (int round = 0; round < 3; ++round) {
    for (int64_t k = 0; k < 2000; k += 10) {
      REQUIRE(c.Put(k, std::string(1000, static_cast<char>('a' + round))).ok());
    }
  }
  REQUIRE(c.SPut("s", "v").ok());
  flatkv::rpc::CompactionStatus status;
  REQUIRE(c.GetCompactionStatus(&status).ok());
  const int64_t compacted_before = status.tablesCompacted;
  REQUIRE(c.Compact(kToken).ok());
  // The compactor picks the request up asynchronously: wait for the tables
  // to be counted and the round to end.
  const Clock::time_point end = Clock::now() + kDeadline;
  do {
    REQUIRE(Clock::now() < end);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(c.GetCompactionStatus(&status).ok());
    CHECK(status.percent >= 0.0);
    CHECK(status.percent <= 100.0);
  } while (status.running || status.tablesCompacted < compacted_before + 2);
  CHECK(status.lastError.empty());
  CHECK(status.bytesReclaimed > 2 * 200 * 1000);  // two of three copies, at least
  CHECK(status.bytesDone == status.bytesTotal);
  for (int64_t k = 0; k < 2000; k += 10) REQUIRE(GetOrDie(&c, k) == std::string(1000, 'c'));

  REQUIRE(c.Info(&info).ok());
  CHECK(info.version == "0.1.0");
  CHECK(info.role == "standalone");
  CHECK(info.keyMin == 0);
  CHECK(info.keyMax == INT64_MAX);
  CHECK(info.writeMode == WriteMode::SAFE);
  CHECK(info.uptimeSeconds >= 0);

  const std::map<std::string, int64_t> after = StatsOrDie(&c);
  CHECK(after.at("calls.put") - before.at("calls.put") == 600);
  CHECK(after.at("calls.get") - before.at("calls.get") == 200);
  CHECK(after.at("calls.sput") - before.at("calls.sput") == 1);
  CHECK(after.at("calls.compact") == 1);
  CHECK(after.at("calls.setWriteMode") == 2);
  CHECK(after.at("calls.stats") == before.at("calls.stats") + 1);
  CHECK(after.at("errors.put") == 0);
  CHECK(after.at("engine.bytes_appended") - before.at("engine.bytes_appended") > 600 * 1000);
  CHECK(after.at("engine.segments") >= 2);
}

TEST_CASE("Each kind of failure comes back as its typed Status", "[integration][server]") {
  ServerProcess server({"storage.key_min=10", "storage.key_max=1000",
                        "storage.max_value_bytes=1024", "storage.max_key_bytes=64"});
  server.Start();
  Client c(server.Options());
  std::string value;

  SECTION("keys outside [key_min, key_max) are KeyOutOfRange") {
    for (int64_t key : {int64_t{1000}, int64_t{9}, int64_t{-1}, INT64_MAX, INT64_MIN}) {
      Status st = c.Put(key, "x");
      INFO(key << ": " << st.ToString());
      CHECK(st.IsKeyOutOfRange());
      CHECK(st.message().find(std::to_string(key)) != std::string::npos);
    }
    CHECK(c.Append(1000, "x").IsKeyOutOfRange());
    CHECK(c.MultiPut({Pair(10, "ok"), Pair(5000, "no")}).IsKeyOutOfRange());
    CHECK(c.Put(999, "x").ok());  // the last key in range
    CHECK(c.Put(10, "x").ok());   // the first
  }
  SECTION("values over storage.max_value_bytes are ValueTooLarge and store nothing") {
    CHECK(c.Put(10, std::string(1024, 'v')).ok());
    CHECK(c.Put(11, std::string(1025, 'v')).IsValueTooLarge());
    CHECK(c.Append(11, std::string(1025, 'v')).IsValueTooLarge());
    CHECK(c.SPut("k", std::string(1025, 'v')).IsValueTooLarge());
    CHECK(c.MultiPut({Pair(12, "small"), Pair(13, std::string(2000, 'v'))}).IsValueTooLarge());
    CHECK(c.Get(11, &value).IsNotFound());
    CHECK(c.Get(12, &value).IsNotFound());  // checked before anything is written
  }
  SECTION("admin calls with a wrong or missing token are Unauthorized") {
    CHECK(c.SetWriteMode("wrong", WriteMode::ASYNC).IsUnauthorized());
    CHECK(c.SetWriteMode("", WriteMode::ASYNC).IsUnauthorized());
    CHECK(c.Compact("secret2").IsUnauthorized());
    WriteMode::type mode = WriteMode::ASYNC;
    REQUIRE(c.GetWriteMode(&mode).ok());  // reading the mode needs no token
    CHECK(mode == WriteMode::SAFE);
  }
  SECTION("bad scan limits, cursors and string keys are InvalidArgument") {
    flatkv::rpc::ScanResult r;
    CHECK(c.Scan(10, 0, false, &r).IsInvalidArgument());
    CHECK(c.Scan(10, -5, true, &r).IsInvalidArgument());
    flatkv::rpc::LogScanResult lr;
    CHECK(c.ScanLog("", 0, &lr).IsInvalidArgument());
    CHECK(c.ScanLog("not a cursor", 10, &lr).IsInvalidArgument());
    CHECK(c.SPut(std::string(65, 'k'), "v").IsInvalidArgument());
    // 3 is no WriteMode but lies inside the enum's range (0..3). A value
    // outside it, such as 7, is undefined behaviour in Thrift's generated
    // code on both sides and aborts a UBSan build of the server.
    CHECK(c.SetWriteMode(kToken, static_cast<WriteMode::type>(3)).IsInvalidArgument());
  }
  // Whatever failed, the connection stays in sync and the server counts it.
  CHECK_FALSE(c.network_failed());
  REQUIRE(c.Put(500, "still fine").ok());
  CHECK(GetOrDie(&c, 500) == "still fine");
  const std::map<std::string, int64_t> stats = StatsOrDie(&c);
  int64_t errors = 0;
  for (const auto& [name, n] : stats) {
    if (name.rfind("errors.", 0) == 0) errors += n;
  }
  CHECK(errors > 0);
}

TEST_CASE("One Client reconnects after the server restarts and finds its data",
          "[integration][server]") {
  ServerProcess server;
  server.Start();
  ClientOptions options = server.Options();
  options.timeout_ms = 5000;
  Client c(options);
  REQUIRE(c.Put(7, "before restart").ok());
  REQUIRE(c.SPut("s", "string before").ok());
  REQUIRE(server.Stop() == 0);

  // Down: a network failure, told apart from an error the server answers.
  std::string value;
  Status st = c.Get(7, &value);
  CHECK(st.IsIOError());
  CHECK(c.network_failed());
  CHECK(st.message().find(c.address()) != std::string::npos);

  server.Start();
  CHECK(GetOrDie(&c, 7) == "before restart");
  CHECK_FALSE(c.network_failed());
  REQUIRE(c.SGet("s", &value).ok());
  CHECK(value == "string before");

  // Restarted under a connection that had served calls: the first call is
  // retried once on a new connection, so the caller sees no error.
  REQUIRE(server.Stop() == 0);
  server.Start();
  CHECK(GetOrDie(&c, 7) == "before restart");
  REQUIRE(c.Put(8, "after").ok());
  CHECK(GetOrDie(&c, 8) == "after");
}

TEST_CASE("Acknowledged writes survive SIGTERM in both write modes", "[integration][server]") {
  const std::string mode = GENERATE("safe", "async");
  // A flush interval of an hour: in async mode every write is still dirty
  // when SIGTERM arrives, so only the shutdown flush can save it.
  ServerProcess server({"write_mode=" + mode, "cache.flush_interval_ms=3600000"});
  server.Start();
  Client c(server.Options());
  WriteMode::type wire_mode = WriteMode::SAFE;
  REQUIRE(c.GetWriteMode(&wire_mode).ok());
  CHECK(wire_mode == (mode == "async" ? WriteMode::ASYNC : WriteMode::SAFE));
  for (int64_t k = 0; k < 500; ++k) REQUIRE(c.Put(k, Numbered(mode, k)).ok());
  REQUIRE(c.Append(0, "+tail").ok());
  REQUIRE(c.Remove(1).ok());
  REQUIRE(c.SPut("skey", mode).ok());
  if (mode == "async") {
    const std::map<std::string, int64_t> stats = StatsOrDie(&c);
    CHECK(stats.at("cache.dirty_bytes") > 0);  // the test proves the flush on exit
  }
  c.Close();
  REQUIRE(server.Stop(SIGTERM) == 0);

  server.Start();
  CHECK(GetOrDie(&c, 0) == mode + "0+tail");
  std::string value;
  CHECK(c.Get(1, &value).IsNotFound());
  for (int64_t k = 2; k < 500; ++k) REQUIRE(GetOrDie(&c, k) == Numbered(mode, k));
  REQUIRE(c.SGet("skey", &value).ok());
  CHECK(value == mode);
  REQUIRE(c.GetWriteMode(&wire_mode).ok());  // the configured mode again
  CHECK(wire_mode == (mode == "async" ? WriteMode::ASYNC : WriteMode::SAFE));
}

// A CA and a server certificate for 127.0.0.1 and localhost, plus a second
// CA and a client certificate of the first, made with the openssl command
// in "dir" (ca.pem, server.pem/.key, client.pem/.key, other.pem).
void MakeCertificates(const std::string& dir) {
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
  const std::string script =
      "set -e\ncd " + dir + "\nexec >/dev/null 2>&1\n"
      "openssl req -x509" + ec + " -keyout ca.key -out ca.pem -days 30 -subj /CN=ca\n"
      "openssl req -x509" + ec + " -keyout other.key -out other.pem -days 30 -subj /CN=other\n"
      "echo subjectAltName=IP:127.0.0.1,DNS:localhost > san.ext\n"
      "for n in server client; do\n"
      "openssl req" + ec + " -keyout $n.key -out $n.csr -subj /CN=$n\n"
      "openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 "
      "-extfile san.ext -out $n.pem\ndone\nchmod 600 *.key\n";
  std::ofstream(dir + "/make.sh") << script;
  REQUIRE(std::system(("sh " + dir + "/make.sh").c_str()) == 0);
}

TEST_CASE("The C++ client talks TLS to a server with a certificate and plaintext is refused",
          "[integration][tls]") {
  char made[] = "/tmp/flatkv-cpp-tls-XXXXXX";
  REQUIRE(mkdtemp(made) != nullptr);
  const std::string certs = made;
  MakeCertificates(certs);
  ServerProcess server({"server.tls_cert_file=" + certs + "/server.pem",
                        "server.tls_key_file=" + certs + "/server.key",
                        "server.tls_ca_file=" + certs + "/ca.pem",
                        "server.tls_client_auth=optional"});
  server.Start();

  ClientOptions tls = server.Options();
  tls.tls_ca_file = certs + "/ca.pem";
  Client c(tls);
  REQUIRE(c.Put(5, "five").ok());
  CHECK(GetOrDie(&c, 5) == "five");

  ClientOptions certified = tls;
  certified.tls_cert_file = certs + "/client.pem";
  certified.tls_key_file = certs + "/client.key";
  Client with_cert(certified);
  CHECK(GetOrDie(&with_cert, 5) == "five");

  Client plain(server.Options());
  std::string value;
  Status st = plain.Get(5, &value);
  CHECK(st.IsIOError());
  CHECK(plain.network_failed());

  ClientOptions distrust = tls;
  distrust.tls_ca_file = certs + "/other.pem";
  Client wrong_ca(distrust);
  st = wrong_ca.Get(5, &value);
  CHECK(st.IsIOError());
  CHECK(st.message().find("certificate verify failed") != std::string::npos);

  ClientOptions by_name = tls;
  by_name.host = "localhost";
  Client named(by_name);
  CHECK(GetOrDie(&named, 5) == "five");  // the name is in the certificate

  const std::map<std::string, int64_t> stats = StatsOrDie(&c);
  CHECK(stats.at("server.tls_handshake_errors") >= 1);  // the plaintext client
  c.Close();
  REQUIRE(server.Stop(SIGTERM) == 0);
  std::error_code ignored;
  std::filesystem::remove_all(certs, ignored);
}

}  // namespace
