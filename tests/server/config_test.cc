// flatkv-server's configuration: defaults with no file, values from YAML and
// --set overrides, and one clear error naming the key for every mistake.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <thread>

#include "server/config.h"
#include "tests/engine/test_util.h"

using flatkv::Status;
using flatkv::server::Config;
using flatkv::server::LoadConfig;

TEST_CASE("With no file every key has its documented default", "[server][config]") {
  Config c;
  REQUIRE(LoadConfig("", {}, &c).ok());
  REQUIRE(c.server.host == "127.0.0.1");
  REQUIRE(c.server.port == 9901);
  REQUIRE(c.storage.path == "./data");
  REQUIRE(c.storage.index_item_bytes == 6);
  REQUIRE(c.cache.policy == "arc");
  REQUIRE(c.cache.mode == flatkv::engine::cache::WriteMode::kSafe);
  REQUIRE(c.cluster.zookeeper.empty());  // standalone
}

TEST_CASE("YAML values and --set overrides reach every module's options", "[server][config]") {
  flatkv::test::TempDir dir;
  const std::string path = dir / "flatkv.yaml";
  flatkv::test::WriteFile(path,
                          "server:\n  port: 9911\n  max_frame_bytes: 4Mi\n"
                          "storage:\n  path: /tmp/x\n  sync: always\n  data_files: 4\n"
                          "  compaction_garbage_ratio: 0.25\n"
                          "cache:\n  policy: lru\n  capacity_bytes: 1Gi\n"
                          "write_mode: async\nadmin:\n  token: s3cret\n");
  Config c;
  REQUIRE(LoadConfig(path, {"server.port=9912", "cache.flush_threads=3"}, &c).ok());
  REQUIRE(c.server.port == 9912);  // the override wins
  REQUIRE(c.server.max_frame_bytes == 4u << 20);
  REQUIRE(c.storage.path == "/tmp/x");
  REQUIRE(c.storage.sync == flatkv::engine::SyncMode::kAlways);
  REQUIRE(c.storage.data_files == 4);
  REQUIRE(c.storage.compaction_garbage_ratio == Approx(0.25));
  REQUIRE(c.cache.policy == "lru");
  REQUIRE(c.cache.capacity_bytes == uint64_t{1} << 30);
  REQUIRE(c.cache.flush_threads == 3);
  REQUIRE(c.cache.mode == flatkv::engine::cache::WriteMode::kAsync);
  REQUIRE(c.admin_token == "s3cret");
}

TEST_CASE("Every mistake is one error naming the key", "[server][config]") {
  flatkv::test::TempDir dir;
  Config c;
  struct Case {
    std::vector<std::string> overrides;
    const char* key;
  };
  const std::vector<Case> cases = {
      {{"server.prot=1"}, "server.prot: unknown configuration key"},
      {{"server.port=70000"}, "server.port: '70000' is out of range"},
      {{"server.port=abc"}, "server.port: expected a number"},
      {{"storage.segment_keys=692233720368547758084"}, "storage.segment_keys: '6922"},
      {{"storage.segment_keys=nan"}, "storage.segment_keys: 'nan' is out of range"},
      {{"server.port=80.5"}, "server.port: expected an integer"},
      {{"storage.compaction_garbage_ratio=nan"}, "storage.compaction_garbage_ratio"},
      {{"server.port=9\n000"}, "server.port: unknown unit '\\x0a000' in '9\\x0a000'"},
      {{"storage.sync=sometimes"}, "storage.sync: must be one of none|interval|always"},
      {{"storage.index_item_bytes=9"}, "storage.index_item_bytes"},
      {{"storage.max_value_bytes=3Xi"}, "storage.max_value_bytes: unknown unit"},
      {{"write_mode=fast"}, "write_mode: must be one of safe|async"},
      {{"cache.policy=fifo"}, "cache.policy: must be one of lru|arc"},
      {{"storage.compaction_garbage_ratio=2"}, "storage.compaction_garbage_ratio"},
      {{"storage.key_min=10", "storage.key_max=5"}, "storage.key_min: must be less than"},
      {{"server.port=9000", "server.http_port=9000"}, "server.http_port: must differ"},
      {{"log.max_files=0"}, "log.max_files: '0' is out of range"},
      {{"log.max_size=-1"}, "log.max_size: '-1' is out of range"},
      {{"no-equals-sign"}, "expected section.key=value"},
  };
  for (const Case& k : cases) {
    INFO(k.overrides[0]);
    Status st = LoadConfig("", k.overrides, &c);
    REQUIRE(st.IsInvalidArgument());
    REQUIRE(st.message().find(k.key) != std::string::npos);
  }
  const std::string bad = dir / "bad.yaml";
  flatkv::test::WriteFile(bad, "server:\n  port: [1, 2\n");
  Status st = LoadConfig(bad, {}, &c);
  REQUIRE(st.IsInvalidArgument());
  REQUIRE(st.message().find("bad.yaml: line") != std::string::npos);
  REQUIRE(LoadConfig(dir / "missing.yaml", {}, &c).message().find("cannot read") !=
          std::string::npos);
}

TEST_CASE("DescribeConfig lists every key with its default and meaning", "[server][config]") {
  const std::string text = flatkv::server::DescribeConfig();
  for (const char* key : {"server.host", "server.port", "server.workers", "server.max_frame_bytes",
                          "storage.path", "storage.key_min", "storage.key_max",
                          "storage.segment_keys", "storage.index_item_bytes",
                          "storage.data_files", "storage.max_value_bytes", "storage.sync",
                          "cache.policy", "cache.capacity_bytes", "write_mode", "admin.token",
                          "log.level", "log.file", "log.max_size", "log.max_files",
                          "cluster.zookeeper", "cluster.service_path",
                          "cluster.mark", "cluster.advertise", "cluster.replication"}) {
    INFO(key);
    REQUIRE(text.find(std::string(key) + " = ") != std::string::npos);
  }
  // The described defaults are the real ones.
  Config c;
  REQUIRE(LoadConfig("", {}, &c).ok());
  REQUIRE(text.find("server.port = 9901") != std::string::npos);
  REQUIRE(text.find("storage.index_item_bytes = 6") != std::string::npos);
  // The one storage default a server sets apart from the engine's.
  REQUIRE(text.find("storage.compaction_min_bytes = 64Mi") != std::string::npos);
  REQUIRE(c.storage.compaction_min_bytes == uint64_t{64} << 20);
  REQUIRE(flatkv::engine::EngineOptions{}.compaction_min_bytes == uint64_t{1} << 20);
  REQUIRE(LoadConfig("", {"storage.compaction_min_bytes=1Mi"}, &c).ok());
  REQUIRE(c.storage.compaction_min_bytes == uint64_t{1} << 20);
}

TEST_CASE("conf/flatkv.yaml loads, holds exactly the defaults and shows every key",
          "[server][config]") {
  const std::string path = std::string(FLATKV_SOURCE_DIR) + "/conf/flatkv.yaml";
  Config from_file, defaults;
  REQUIRE(LoadConfig(path, {}, &from_file).ok());
  REQUIRE(LoadConfig("", {}, &defaults).ok());
  REQUIRE(from_file.server.port == defaults.server.port);
  REQUIRE(from_file.server.max_frame_bytes == defaults.server.max_frame_bytes);
  REQUIRE(from_file.storage.key_max == defaults.storage.key_max);
  REQUIRE(from_file.storage.max_value_bytes == defaults.storage.max_value_bytes);
  REQUIRE(from_file.storage.compaction_garbage_ratio == defaults.storage.compaction_garbage_ratio);
  REQUIRE(from_file.storage.compaction_min_bytes == defaults.storage.compaction_min_bytes);
  REQUIRE(from_file.cache.capacity_bytes == defaults.cache.capacity_bytes);
  REQUIRE(from_file.cache.mode == defaults.cache.mode);
  REQUIRE(from_file.log_level == defaults.log_level);
  REQUIRE(from_file.log_file == defaults.log_file);
  REQUIRE(from_file.log_max_size == defaults.log_max_size);
  REQUIRE(from_file.log_max_files == defaults.log_max_files);
  // Every key of the schema appears (the cluster ones commented out).
  const std::string text = flatkv::test::ReadFile(path);
  std::istringstream described(flatkv::server::DescribeConfig());
  std::string line;
  int keys = 0;
  while (std::getline(described, line)) {
    if (line.empty() || line[0] == ' ') continue;  // a meaning line
    const std::string key = line.substr(0, line.find(" = "));
    const std::string leaf = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
    INFO(key);
    REQUIRE(text.find(leaf + ":") != std::string::npos);
    ++keys;
  }
  REQUIRE(keys >= 30);
}

TEST_CASE("conf/ring.yaml loads as a ring member with its cluster section", "[server][config]") {
  const std::string path = std::string(FLATKV_SOURCE_DIR) + "/conf/ring.yaml";
  Config c;
  const Status st = LoadConfig(path, {}, &c);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(c.cluster.enabled());
  REQUIRE(c.cluster.zookeeper == "zk1:2181,zk2:2181,zk3:2181");
  REQUIRE(c.cluster.service_path == "/flatkv");
  REQUIRE(c.cluster.mark == 6148914691236517204);
  REQUIRE(c.cluster.advertise == "kv2.example.internal:9901");  // server.host is 0.0.0.0
  REQUIRE(c.cluster.replication == "sync");
  REQUIRE(c.cluster.hash_bound == INT64_MAX);
  REQUIRE(c.cluster.session_timeout_ms == 6000);
  REQUIRE(!c.cluster.peer_token.empty());
  // Without its advertise the wildcard listen address is refused, naming the key.
  const Status no_advertise = LoadConfig(path, {"cluster.advertise="}, &c);
  REQUIRE(no_advertise.message().find("cluster.advertise") != std::string::npos);
}

TEST_CASE("server.workers auto runs calls on the I/O threads unless every write waits for fdatasync",
          "[server][config]") {
  Config c;
  REQUIRE(LoadConfig("", {}, &c).ok());
  REQUIRE(c.server.workers == 0);
  REQUIRE(LoadConfig("", {"storage.sync=always"}, &c).ok());
  REQUIRE(c.server.workers == 16);
  REQUIRE(LoadConfig("", {"storage.sync=always", "server.workers=3"}, &c).ok());
  REQUIRE(c.server.workers == 3);
  Status st = LoadConfig("", {"server.workers=many"}, &c);
  REQUIRE(st.IsInvalidArgument());
  REQUIRE(st.message().find("server.workers") != std::string::npos);
}

TEST_CASE("The configuration reference lists every key", "[server][config]") {
  // docs/configuration.md's table and the code's table of keys, equal both
  // ways: every key of the code is documented with the code's default, and
  // every documented key exists.
  const std::string page =
      flatkv::test::ReadFile(std::string(FLATKV_SOURCE_DIR) + "/docs/configuration.md");
  std::map<std::string, std::string> code;  // key -> default, as --describe-config prints them
  std::istringstream described(flatkv::server::DescribeConfig());
  std::string line;
  while (std::getline(described, line)) {
    if (line.empty() || line[0] == ' ') continue;
    const size_t eq = line.find(" = ");
    REQUIRE(eq != std::string::npos);
    code[line.substr(0, eq)] = line.substr(eq + 3);
  }
  REQUIRE(code.size() > 40);

  // The page's rows: "| `key` | `default` | meaning |".
  std::map<std::string, std::string> documented;
  std::istringstream rows(page);
  while (std::getline(rows, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t key_end = line.find("` | `", 3);
    if (key_end == std::string::npos) continue;
    const std::string key = line.substr(3, key_end - 3);
    const size_t default_begin = key_end + 5;
    const size_t default_end = line.find("` |", default_begin);
    REQUIRE(default_end != std::string::npos);
    INFO(line);
    REQUIRE(documented.count(key) == 0);  // documented once
    documented[key] = line.substr(default_begin, default_end - default_begin);
  }

  for (const auto& [key, default_text] : code) {
    INFO("in the code, not documented (or with another default): " << key);
    REQUIRE(documented.count(key) == 1);
    REQUIRE(documented[key] == default_text);
  }
  for (const auto& [key, default_text] : documented) {
    INFO("documented, not in the code: " << key);
    REQUIRE(code.count(key) == 1);
  }
}

TEST_CASE("server.io_threads auto uses half the cores, at least one", "[server][config]") {
  Config c;
  REQUIRE(LoadConfig("", {}, &c).ok());
  REQUIRE(c.server.io_threads == std::max(1, static_cast<int>(std::thread::hardware_concurrency() / 2)));
  REQUIRE(LoadConfig("", {"server.io_threads=3"}, &c).ok());
  REQUIRE(c.server.io_threads == 3);
  REQUIRE(LoadConfig("", {"server.io_threads=0"}, &c).IsInvalidArgument());
}

TEST_CASE("cluster.zookeeper_auth_file is read once, and a bad file is one error naming it",
          "[server][config]") {
  flatkv::test::TempDir dir;
  const std::string good = dir / "zk.auth";
  flatkv::test::WriteFile(good, "flatkv:pa:ss\n");
  REQUIRE(chmod(good.c_str(), 0600) == 0);
  const std::vector<std::string> ring = {"cluster.zookeeper=127.0.0.1:2181",
                                         "cluster.zookeeper_auth_file=" + good};
  Config c;
  REQUIRE(LoadConfig("", ring, &c).ok());
  REQUIRE(c.cluster.zookeeper_credentials.user == "flatkv");
  REQUIRE(c.cluster.zookeeper_credentials.password == "pa:ss");  // the first ':' splits
  REQUIRE(!c.cluster.zookeeper_auth_file_open);
  REQUIRE(chmod(good.c_str(), 0640) == 0);
  REQUIRE(LoadConfig("", ring, &c).ok());
  REQUIRE(c.cluster.zookeeper_auth_file_open);  // the instance warns

  struct Case {
    const char* content;  // nullptr: no file
    const char* why;
  };
  for (const Case& k : {Case{nullptr, "cannot read"}, Case{"", "empty"},
                        Case{"flatkv-s3cret\n", "no ':'"}, Case{":s3cret", "empty user"},
                        Case{"a:b\nc:d\n", "more than one line"}}) {
    const std::string path = dir / "bad.auth";
    std::remove(path.c_str());
    if (k.content != nullptr) flatkv::test::WriteFile(path, k.content);
    const Status st =
        LoadConfig("", {"cluster.zookeeper=127.0.0.1:2181", "cluster.zookeeper_auth_file=" + path},
                   &c);
    INFO(st.ToString());
    REQUIRE(st.IsInvalidArgument());
    REQUIRE(st.message().rfind("cluster.zookeeper_auth_file: " + path + ": ", 0) == 0);
    REQUIRE(st.message().find(k.why) != std::string::npos);
    REQUIRE(st.message().find("s3cret") == std::string::npos);  // never the password
  }
}

TEST_CASE("The digest ACL id is user:base64(sha1(user:password)), as ZooKeeper computes it",
          "[server][config]") {
  // The value of ZooKeeper's DigestAuthenticationProvider.generateDigest("flatkv:s3cret").
  flatkv::partition::ZkCredentials c{"flatkv", "s3cret"};
  REQUIRE(c.DigestId() == "flatkv:XLw1Aw/7mLBnO4p6tsdMW2zfrsk=");
  REQUIRE(c.Certificate() == "flatkv:s3cret");
}

TEST_CASE("Token files: the content without its trailing newline wins over the token key",
          "[server][config]") {
  flatkv::test::TempDir dir;
  const std::string admin = dir / "admin.token";
  const std::string peer = dir / "peer.token";
  flatkv::test::WriteFile(admin, "adm-secret\n");
  flatkv::test::WriteFile(peer, "peer-secret\r\n");
  chmod(admin.c_str(), 0600);
  chmod(peer.c_str(), 0644);
  Config c;
  REQUIRE(LoadConfig("", {"admin.token=plain", "admin.token_file=" + admin,
                          "cluster.peer_token=plain", "cluster.peer_token_file=" + peer},
                     &c)
              .ok());
  REQUIRE(c.admin_token == "adm-secret");
  REQUIRE(c.cluster.peer_token == "peer-secret");
  // Only the file others may read gets a warning, and no warning holds a secret.
  REQUIRE(c.warnings.size() == 1);
  REQUIRE(c.warnings[0].find("cluster.peer_token_file") == 0);
  REQUIRE(c.warnings[0].find("secret") == std::string::npos);

  Status st = LoadConfig("", {"admin.token_file=" + dir / "missing"}, &c);
  REQUIRE(st.message().find("admin.token_file: ") == 0);
  REQUIRE(st.message().find("cannot read") != std::string::npos);
  flatkv::test::WriteFile(admin, "\n");
  st = LoadConfig("", {"admin.token_file=" + admin}, &c);
  REQUIRE(st.message() == "admin.token_file: " + admin + ": empty");
  // --describe-config shows defaults only, never a value.
  REQUIRE(flatkv::server::DescribeConfig().find("adm-secret") == std::string::npos);
}

TEST_CASE("TLS keys that go together are checked together", "[server][config]") {
  Config c;
  Status st = LoadConfig("", {"server.tls_cert_file=/x.pem"}, &c);
  REQUIRE(st.message() == "server.tls_cert_file: set without server.tls_key_file");
  st = LoadConfig("", {"server.tls_key_file=/x.key"}, &c);
  REQUIRE(st.message() == "server.tls_key_file: set without server.tls_cert_file");
  st = LoadConfig("", {"server.tls_cert_file=/x.pem", "server.tls_key_file=/x.key",
                       "server.tls_client_auth=required"},
                  &c);
  REQUIRE(st.message().find("server.tls_client_auth: required needs server.tls_ca_file") == 0);
  st = LoadConfig("", {"server.tls_client_auth=sometimes"}, &c);
  REQUIRE(st.message().find("server.tls_client_auth: must be one of") == 0);
  // A ring member's TLS port has no worker pool; a standalone one has.
  st = LoadConfig("", {"server.tls_cert_file=/x.pem", "server.tls_key_file=/x.key",
                       "server.tls_ca_file=/ca.pem", "server.workers=4",
                       "cluster.zookeeper=127.0.0.1:2181", "cluster.peer_tls=true"},
                  &c);
  REQUIRE(st.message().find("server.tls_cert_file: a ring member's TLS port runs its calls on "
                            "the I/O threads") == 0);
  REQUIRE(LoadConfig("", {"server.tls_cert_file=/x.pem", "server.tls_key_file=/x.key",
                          "server.workers=4"},
                     &c)
              .ok());
  REQUIRE(c.server.workers == 4);
  // storage.sync: always picks 16 workers with TLS too (auto), so puts
  // waiting for fdatasync wait on workers, not on the I/O threads.
  REQUIRE(LoadConfig("", {"server.tls_cert_file=/x.pem", "server.tls_key_file=/x.key",
                          "storage.sync=always"},
                     &c)
              .ok());
  REQUIRE(c.server.workers == 16);
  REQUIRE(c.server.tls_client_auth == "none");
  st = LoadConfig("", {"cluster.peer_tls=yes"}, &c);
  REQUIRE(st.message() == "cluster.peer_tls: must be true or false, not 'yes'");
}
