// Config: the YAML file of flatkv-server (plus --set overrides) mapped onto
// the option structs of each module, validated once, with every key named in
// its error. One table (config.cc) lists every key, its default and its
// meaning; it drives parsing, --describe-config and conf/flatkv.yaml alike.
//
// Thread safety: plain values; LoadConfig is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/cache/write_back.h"
#include "engine/options.h"
#include "engine/status.h"
#include "partition/zk_auth.h"

namespace flatkv::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 9901;
  int workers = -1;                        // handler threads; 0 = on the I/O
                                           // threads; -1 (auto) is resolved
                                           // by LoadConfig
  int io_threads = -1;                     // I/O threads; -1 (auto: half
                                           // the cores) is resolved by
                                           // LoadConfig
  uint64_t max_frame_bytes = 16u << 20;    // larger frames close the connection
  int max_connections = 1024;
  int max_queued_calls = 256;              // more waiting: answer OVERLOADED
  int http_port = 0;                       // /metrics, /health, /kv; 0 = off
  // TLS (server/tls.h): with a certificate and its key, the Thrift port
  // accepts TLS 1.2/1.3 only.
  std::string tls_cert_file;               // PEM certificate (chain); empty = plaintext
  std::string tls_key_file;                // PEM private key of tls_cert_file
  std::string tls_ca_file;                 // PEM CAs client (and peer) certificates are checked against
  std::string tls_client_auth = "none";    // none | optional | required

  bool tls() const { return !tls_cert_file.empty(); }
};

// The cluster.* keys (shared/DESIGN.md, "Cluster"). With zookeeper empty
// the instance is standalone and none of the rest is used.
struct ClusterOptions {
  std::string zookeeper;                   // "host:port,..."; empty = standalone
  std::string service_path = "/flatkv";
  int64_t mark = 0;                        // any i64
  std::string advertise;                   // host:port others reach us at;
                                           // LoadConfig fills in
                                           // server.host:server.port
  std::string replication = "sync";        // sync (chain replication) | async
  int64_t hash_bound = INT64_MAX;          // string key hash = XXH64 mod this
  int session_timeout_ms = 6000;           // ZooKeeper session timeout
  std::string peer_token;                  // carried by calls between instances
  std::string peer_token_file;             // its content replaces peer_token
  bool peer_tls = false;                   // calls between instances over TLS
  // With peer_tls LoadConfig copies server.tls_ca_file, tls_cert_file and
  // tls_key_file here: the CA peers are verified against and the
  // certificate presented to them. Empty = plaintext peer calls.
  std::string peer_tls_ca_file;
  std::string peer_tls_cert_file;
  std::string peer_tls_key_file;
  std::string zookeeper_auth_file;         // "user:password" for ZooKeeper's digest
                                           // scheme; empty = nodes open to all
  partition::ZkCredentials zookeeper_credentials;  // LoadConfig reads the file
  bool zookeeper_auth_file_open = false;   // LoadConfig: group/others may read it
  int peer_timeout_ms = 2000;              // connect and I/O timeout of a forwarded call
  int64_t backlog_bytes = 64 << 20;        // replicated writes kept for catch-up
  int64_t resync_mb_per_sec = 0;           // full-copy rate limit; 0 = none
  int64_t migrate_mb_per_sec = 0;          // a new mark's import rate limit; 0 = none
  int64_t track_max_keys = 1000000;        // keys a source's head records during a pre-copy

  bool enabled() const { return !zookeeper.empty(); }
};

// The engine's defaults, but for storage.compaction_min_bytes: a server's
// store compacts on its own only once its log holds 64 MiB (the engine's
// default is 1 MiB), as Redis rewrites its append-only file only past
// 64 MB. Below that a compaction at the default ratio of 1.5 copies two
// bytes per byte it frees, many times a minute under overwrites, on the
// core that answers the calls: it made most of a put's tail and CPU beyond
// Redis's (docs/performance.md, "Compaction's share of a put"). The floor
// costs at most 64 MiB of disk; past it the ratio holds as before.
engine::EngineOptions ServerStorageDefaults();

struct Config {
  ServerOptions server;
  engine::EngineOptions storage = ServerStorageDefaults();
  engine::cache::CacheOptions cache;       // includes write_mode
  ClusterOptions cluster;
  std::string admin_token;                 // admin.token; empty = no check
  std::string admin_token_file;            // admin.token_file: its content replaces admin_token
  // Filled by LoadConfig: secret files (token files) that group or others
  // may read, one line each naming the key and the file; main logs them.
  std::vector<std::string> warnings;
  std::string log_level = "info";          // trace|debug|info|warn|error|critical|off
  std::string log_file;                    // empty = stderr
  uint64_t log_max_size = 100 << 20;       // rotate log_file past this many bytes; 0 = never
  int log_max_files = 5;                   // rotated files kept (file.1.log .. file.N.log)
};

// Reads "path" (empty = no file: all defaults), then applies each override
// "section.key=value" in order. Returns InvalidArgument with one line naming
// the key and the reason for a missing file, bad YAML, an unknown key, a
// value of the wrong type, or a value out of range.
Status LoadConfig(const std::string& path, const std::vector<std::string>& overrides,
                  Config* config);

// Every key, its default and its meaning, one per line (--describe-config).
std::string DescribeConfig();

}  // namespace flatkv::server
