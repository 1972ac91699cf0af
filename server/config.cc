// Implementation notes
//
// The schema is a table of keys; each entry parses its YAML scalar into one
// field and checks its range. yaml-cpp reports problems with exceptions: they
// are caught right here and turned into a Status naming the key (nothing in
// server/ throws). Unknown keys are errors, so a typo never silently leaves
// a default in place.
#include "server/config.h"

#include "partition/ring.h"

#include <yaml-cpp/yaml.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>

namespace flatkv::server {
namespace {

using Setter = std::function<Status(const std::string& text, Config* c)>;

struct Key {
  const char* name;
  const char* default_text;
  const char* meaning;
  Setter set;
};

Status Bad(const std::string& key, const std::string& why) {
  return Status::InvalidArgument(key + ": " + why);
}

// Parses an integer in [lo, hi]; accepts K/M/G/Ki/Mi/Gi suffixes.
template <typename T>
Setter Int(std::function<T*(Config*)> field, int64_t lo, int64_t hi, const char* key) {
  return [=](const std::string& text, Config* c) -> Status {
    size_t pos = 0;
    long double v;
    try {
      v = std::stold(text, &pos);
    } catch (const std::exception&) {
      return Bad(key, "expected a number, got '" + text + "'");
    }
    std::string suffix = text.substr(pos);
    const std::pair<const char*, long double> units[] = {
        {"", 1}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"Ki", 1024.0L}, {"Mi", 1048576.0L},
        {"Gi", 1073741824.0L}};
    bool known = false;
    for (const auto& [unit, scale] : units) {
      if (suffix == unit) {
        v *= scale;
        known = true;
      }
    }
    if (!known) return Bad(key, "unknown unit '" + suffix + "' in '" + text + "'");
    // The range first: converting a value beyond int64 (or NaN, or inf) to
    // an integer is undefined behaviour (found by tests/fuzz/config_fuzz:
    // segment_keys: 692233720368547758084).
    if (!(v >= static_cast<long double>(lo) && v <= static_cast<long double>(hi))) {
      return Bad(key, "'" + text + "' is out of range [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
    }
    if (v != std::trunc(v)) return Bad(key, "expected an integer, got '" + text + "'");
    *field(c) = static_cast<T>(v);
    return Status::OK();
  };
}

Setter Str(std::function<std::string*(Config*)> field, std::vector<std::string> allowed,
           const char* key) {
  return [=](const std::string& text, Config* c) -> Status {
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : "|") + a;
      return Bad(key, "must be one of " + list + ", not '" + text + "'");
    }
    *field(c) = text;
    return Status::OK();
  };
}

// 0 (off) or a multiple in [1.1, 1000] (storage.compaction_disk_ratio).
Setter Multiple(std::function<double*(Config*)> field, const char* key) {
  return [=](const std::string& text, Config* c) -> Status {
    size_t pos = 0;
    double v = -1;
    try {
      v = std::stod(text, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != text.size() || !(v == 0 || (v >= 1.1 && v <= 1000))) {  // NaN fails too
      return Bad(key, "expected 0 (off) or a number in [1.1, 1000], got '" + text + "'");
    }
    *field(c) = v;
    return Status::OK();
  };
}

Setter Ratio(std::function<double*(Config*)> field, const char* key) {
  return [=](const std::string& text, Config* c) -> Status {
    size_t pos = 0;
    double v;
    try {
      v = std::stod(text, &pos);
    } catch (const std::exception&) {
      return Bad(key, "expected a number in [0, 1], got '" + text + "'");
    }
    if (pos != text.size() || !(v >= 0 && v <= 1)) {  // NaN is not in [0, 1] either
      return Bad(key, "expected a number in [0, 1], got '" + text + "'");
    }
    *field(c) = v;
    return Status::OK();
  };
}

Setter Bool(std::function<bool*(Config*)> field, const char* key) {
  return [=](const std::string& text, Config* c) -> Status {
    if (text != "true" && text != "false") {
      return Bad(key, "must be true or false, not '" + text + "'");
    }
    *field(c) = text == "true";
    return Status::OK();
  };
}

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

const std::vector<Key>& Schema() {
  static const std::vector<Key> keys = {
      {"server.host", "127.0.0.1", "address to listen on",
       Str([](Config* c) { return &c->server.host; }, {}, "server.host")},
      {"server.port", "9901", "Thrift port (binary protocol, framed transport); 0 = any",
       Int<int>([](Config* c) { return &c->server.port; }, 0, 65535, "server.port")},
      {"server.workers", "auto",
       "handler threads; 0 = calls run on the I/O threads; auto = 0, or 16 with storage.sync: "
       "always outside a ring",
       [](const std::string& text, Config* c) -> Status {
         if (text == "auto") {
           c->server.workers = -1;
           return Status::OK();
         }
         return Int<int>([](Config* c2) { return &c2->server.workers; }, 0, 1024,
                         "server.workers")(text, c);
       }},
      {"server.io_threads", "auto", "I/O threads; auto = half the CPU cores, at least 1",
       [](const std::string& text, Config* c) -> Status {
         if (text == "auto") {
           c->server.io_threads = -1;
           return Status::OK();
         }
         return Int<int>([](Config* c2) { return &c2->server.io_threads; }, 1, 64,
                         "server.io_threads")(text, c);
       }},
      {"server.max_frame_bytes", "16Mi", "largest request frame; a larger one closes the connection",
       Int<uint64_t>([](Config* c) { return &c->server.max_frame_bytes; }, 1024,
                     int64_t{1} << 30, "server.max_frame_bytes")},
      {"server.max_connections", "1024", "connections accepted at once",
       Int<int>([](Config* c) { return &c->server.max_connections; }, 1, 1000000,
                "server.max_connections")},
      {"server.max_queued_calls", "256",
       "calls waiting for a worker beyond which new ones are answered OVERLOADED",
       Int<int>([](Config* c) { return &c->server.max_queued_calls; }, 1, 1000000,
                "server.max_queued_calls")},
      {"server.http_port", "0", "HTTP port for /metrics, /health and /kv; 0 = off",
       Int<int>([](Config* c) { return &c->server.http_port; }, 0, 65535,
                "server.http_port")},
      {"server.tls_cert_file", "",
       "PEM certificate (chain) of this instance: with tls_key_file, the Thrift port speaks TLS "
       "1.2/1.3 only (a plaintext connection is closed) and the HTTP port HTTPS; reloaded when "
       "the file changes; empty = plaintext",
       Str([](Config* c) { return &c->server.tls_cert_file; }, {}, "server.tls_cert_file")},
      {"server.tls_key_file", "", "PEM private key of tls_cert_file (chmod 600)",
       Str([](Config* c) { return &c->server.tls_key_file; }, {}, "server.tls_key_file")},
      {"server.tls_ca_file", "",
       "PEM CA certificates client certificates (and peers' with cluster.peer_tls) are "
       "verified against",
       Str([](Config* c) { return &c->server.tls_ca_file; }, {}, "server.tls_ca_file")},
      {"server.tls_client_auth", "none",
       "none | optional (a client certificate, if sent, must verify against tls_ca_file) | "
       "required (a client without a certificate that verifies is refused)",
       Str([](Config* c) { return &c->server.tls_client_auth; }, {"none", "optional", "required"},
           "server.tls_client_auth")},
      {"storage.path", "./data", "directory of the store",
       Str([](Config* c) { return &c->storage.path; }, {}, "storage.path")},
      {"storage.key_min", "0", "smallest integer key accepted",
       Int<int64_t>([](Config* c) { return &c->storage.key_min; }, kI64Min, kI64Max,
                    "storage.key_min")},
      {"storage.key_max", "9223372036854775807", "integer keys are below this",
       Int<int64_t>([](Config* c) { return &c->storage.key_max; }, kI64Min, kI64Max,
                    "storage.key_max")},
      {"storage.segment_keys", "16777216", "keys per flat table (created on first write)",
       Int<uint64_t>([](Config* c) { return &c->storage.segment_keys; }, 1,
                     int64_t{1} << 40, "storage.segment_keys")},
      {"storage.index_item_bytes", "6", "bytes per index slot, 4..8 (1 TiB per data file at 6)",
       Int<int>([](Config* c) { return &c->storage.index_item_bytes; }, 4, 8,
                "storage.index_item_bytes")},
      {"storage.data_files", "16", "append-only data files per table (key k in file k mod N)",
       Int<int>([](Config* c) { return &c->storage.data_files; }, 1, 505,
                "storage.data_files")},
      {"storage.max_value_bytes", "64Mi", "largest value accepted",
       Int<uint32_t>([](Config* c) { return &c->storage.max_value_bytes; }, 0,
                     int64_t{1} << 30, "storage.max_value_bytes")},
      {"storage.max_key_bytes", "4096", "longest string key accepted",
       Int<uint32_t>([](Config* c) { return &c->storage.max_key_bytes; }, 1, 1 << 20,
                     "storage.max_key_bytes")},
      {"storage.string_slots", "16777216", "slots of the string-key table (about the number of string keys)",
       Int<uint64_t>([](Config* c) { return &c->storage.string_slots; }, 1,
                     int64_t{1} << 34, "storage.string_slots")},
      {"storage.sync", "none", "none | interval (fdatasync every sync_interval_ms) | always",
       [](const std::string& text, Config* c) -> Status {
         if (!engine::ParseSyncMode(text, &c->storage.sync)) {
           return Bad("storage.sync", "must be one of none|interval|always, not '" + text + "'");
         }
         return Status::OK();
       }},
      {"storage.sync_interval_ms", "1000", "fdatasync period with sync: interval",
       Int<uint32_t>([](Config* c) { return &c->storage.sync_interval_ms; }, 1, 3600000,
                     "storage.sync_interval_ms")},
      {"storage.checkpoint_interval_ms", "10000", "index checkpoint period (bounds crash replay); 0 = off",
       Int<uint32_t>([](Config* c) { return &c->storage.checkpoint_interval_ms; }, 0,
                     86400000, "storage.checkpoint_interval_ms")},
      {"storage.max_open_files", "4096", "descriptors kept open for tables (idle ones are closed); lowered to fit RLIMIT_NOFILE",
       Int<uint32_t>([](Config* c) { return &c->storage.max_open_files; }, 2, 1 << 24,
                     "storage.max_open_files")},
      {"storage.compaction_mb_per_sec", "0", "compaction read budget in MB/s; 0 = unlimited",
       Int<uint32_t>([](Config* c) { return &c->storage.compaction_mb_per_sec; }, 0,
                     100000, "storage.compaction_mb_per_sec")},
      {"storage.compaction_garbage_ratio", "0.5", "compact a table once this share is garbage; 0 = never by itself",
       Ratio([](Config* c) { return &c->storage.compaction_garbage_ratio; },
             "storage.compaction_garbage_ratio")},
      {"storage.compaction_min_bytes", "64Mi",
       "no automatic compaction while the log bytes are under this (the whole store's for compaction_disk_ratio, a table's for compaction_garbage_ratio)",
       Int<uint64_t>([](Config* c) { return &c->storage.compaction_min_bytes; }, 1,
                     int64_t{1} << 50, "storage.compaction_min_bytes")},
      {"storage.compaction_disk_ratio", "1.5",
       "keep the log bytes under this multiple of the live bytes (compact the table with the most garbage; writes wait for the compactor past +0.1); 0 = off",
       Multiple([](Config* c) { return &c->storage.compaction_disk_ratio; },
                "storage.compaction_disk_ratio")},
      {"storage.compaction_mode", "whole",
       "whole (copy each table into a new generation) | in_place (free each data file's oldest part, copying its live records to its end: less disk, more writes reach it)",
       [](const std::string& text, Config* c) -> Status {
         if (text != "in_place" && text != "whole") {
           return Bad("storage.compaction_mode", "must be one of in_place|whole, not '" + text + "'");
         }
         c->storage.compaction_in_place = text == "in_place";
         return Status::OK();
       }},
      {"storage.sparse_tier", "off",
       "on: keys of a segment without a flat table go to the sparse tier (a hashed table, its key order kept in memory) until they are dense enough for one; off: every segment is a flat table",
       [](const std::string& text, Config* c) -> Status {
         if (text != "on" && text != "off") {
           return Bad("storage.sparse_tier", "must be one of on|off, not '" + text + "'");
         }
         c->storage.sparse_tier = text == "on";
         return Status::OK();
       }},
      {"storage.sparse_slots", "16777216", "slots of the sparse tier's hashed table (about twice the number of keys it holds)",
       Int<uint64_t>([](Config* c) { return &c->storage.sparse_slots; }, 1,
                     int64_t{1} << 34, "storage.sparse_slots")},
      {"cache.policy", "arc", "lru | arc",
       Str([](Config* c) { return &c->cache.policy; }, {"lru", "arc"}, "cache.policy")},
      {"cache.capacity_bytes", "256Mi", "bytes of clean cached values",
       Int<uint64_t>([](Config* c) { return &c->cache.capacity_bytes; }, 0,
                     int64_t{1} << 44, "cache.capacity_bytes")},
      {"cache.flush_threads", "2", "threads writing dirty entries in async mode",
       Int<int>([](Config* c) { return &c->cache.flush_threads; }, 1, 64,
                "cache.flush_threads")},
      {"cache.flush_interval_ms", "100", "a dirty entry is written within this",
       Int<uint32_t>([](Config* c) { return &c->cache.flush_interval_ms; }, 1, 3600000,
                     "cache.flush_interval_ms")},
      {"cache.max_dirty_bytes", "64Mi", "past this, async writers wait for the flushers",
       Int<uint64_t>([](Config* c) { return &c->cache.max_dirty_bytes; }, 1,
                     int64_t{1} << 44, "cache.max_dirty_bytes")},
      {"write_mode", "safe", "safe | async (switchable at run time with setWriteMode)",
       [](const std::string& text, Config* c) -> Status {
         if (!engine::cache::ParseWriteMode(text, &c->cache.mode)) {
           return Bad("write_mode", "must be one of safe|async, not '" + text + "'");
         }
         return Status::OK();
       }},
      {"admin.token", "", "token admin methods require; empty = none",
       Str([](Config* c) { return &c->admin_token; }, {}, "admin.token")},
      {"admin.token_file", "",
       "file whose content (trailing newline stripped) is the admin token; wins over "
       "admin.token; empty = none",
       Str([](Config* c) { return &c->admin_token_file; }, {}, "admin.token_file")},
      {"log.level", "info", "trace | debug | info | warn | error | critical | off",
       Str([](Config* c) { return &c->log_level; },
           {"trace", "debug", "info", "warn", "error", "critical", "off"}, "log.level")},
      {"log.file", "", "log file; empty = stderr",
       Str([](Config* c) { return &c->log_file; }, {}, "log.file")},
      {"log.max_size", "100Mi",
       "log.file is rotated when it would grow past this (to NAME.1.EXT, NAME.2.EXT, ...); "
       "0 = never",
       Int<uint64_t>([](Config* c) { return &c->log_max_size; }, 0, int64_t{1} << 40,
                     "log.max_size")},
      {"log.max_files", "5", "rotated log files kept besides the current one; older ones are deleted",
       Int<int>([](Config* c) { return &c->log_max_files; }, 1, 1000, "log.max_files")},
      {"cluster.zookeeper", "", "ZooKeeper hosts (host:port,...); empty = standalone",
       Str([](Config* c) { return &c->cluster.zookeeper; }, {}, "cluster.zookeeper")},
      {"cluster.service_path", "/flatkv", "ZooKeeper path instances register under",
       Str([](Config* c) { return &c->cluster.service_path; }, {}, "cluster.service_path")},
      {"cluster.mark", "0",
       "this instance's ring position (any i64): it owns hashes from the next lower mark up to "
       "this one, exclusive",
       Int<int64_t>([](Config* c) { return &c->cluster.mark; }, kI64Min, kI64Max,
                    "cluster.mark")},
      {"cluster.advertise", "",
       "host:port other instances and clients reach this one at; empty = server.host:server.port "
       "(a wildcard host is refused)",
       Str([](Config* c) { return &c->cluster.advertise; }, {}, "cluster.advertise")},
      {"cluster.replication", "sync",
       "sync (chain replication: the tail acknowledges) | async (the head acknowledges); "
       "ring-wide",
       Str([](Config* c) { return &c->cluster.replication; }, {"async", "sync"},
           "cluster.replication")},
      {"cluster.hash_bound", "9223372036854775807",
       "string keys hash to XXH64(key, seed 0) mod this; ring-wide",
       Int<int64_t>([](Config* c) { return &c->cluster.hash_bound; }, 1, kI64Max,
                    "cluster.hash_bound")},
      {"cluster.session_timeout_ms", "6000",
       "ZooKeeper session timeout: a member that is paused, cut off or on a dead host leaves the "
       "ring after about this long (a dead process on a live host leaves at once)",
       Int<int>([](Config* c) { return &c->cluster.session_timeout_ms; }, 100, 3600000,
                "cluster.session_timeout_ms")},
      {"cluster.zookeeper_auth_file", "",
       "file holding user:password for ZooKeeper's digest scheme: the instance authenticates "
       "every session and creates every ring node writable by that identity only (readable "
       "by anyone); it refuses a ring the world may write (flatkv admin secure-ring); "
       "empty = nodes open to anyone",
       Str([](Config* c) { return &c->cluster.zookeeper_auth_file; }, {},
           "cluster.zookeeper_auth_file")},
      {"cluster.peer_token", "", "token every call between instances carries; empty = none",
       Str([](Config* c) { return &c->cluster.peer_token; }, {}, "cluster.peer_token")},
      {"cluster.peer_token_file", "",
       "file whose content (trailing newline stripped) is the peer token; wins over "
       "cluster.peer_token; empty = none",
       Str([](Config* c) { return &c->cluster.peer_token_file; }, {}, "cluster.peer_token_file")},
      {"cluster.peer_tls", "false",
       "true: calls between instances use TLS with server.tls_cert_file and verify the peer's "
       "certificate against server.tls_ca_file (and its name against its advertise host); "
       "needed by a ring member with a certificate",
       Bool([](Config* c) { return &c->cluster.peer_tls; }, "cluster.peer_tls")},
      {"cluster.peer_timeout_ms", "2000",
       "connect and I/O timeout of a call forwarded to another instance",
       Int<int>([](Config* c) { return &c->cluster.peer_timeout_ms; }, 10, 600000,
                "cluster.peer_timeout_ms")},
      {"cluster.backlog_bytes", "67108864",
       "committed replicated writes each member keeps so a returning member catches up from "
       "them instead of a full copy",
       Int<int64_t>([](Config* c) { return &c->cluster.backlog_bytes; }, 0, kI64Max,
                    "cluster.backlog_bytes")},
      {"cluster.resync_mb_per_sec", "0",
       "rate limit of a full copy to a joining member, MiB/s; 0 = none",
       Int<int64_t>([](Config* c) { return &c->cluster.resync_mb_per_sec; }, 0, 1000000,
                    "cluster.resync_mb_per_sec")},
      {"cluster.migrate_mb_per_sec", "0",
       "rate limit of a new mark's import of its range from the mark that owned it, MiB/s; "
       "0 = none",
       Int<int64_t>([](Config* c) { return &c->cluster.migrate_mb_per_sec; }, 0, 1000000,
                    "cluster.migrate_mb_per_sec")},
      {"cluster.track_max_keys", "1000000",
       "keys a source's head records while a new mark pre-copies its range (writes still "
       "flowing); past it the record is dropped and the import copies everything again with "
       "writes to the range refused",
       Int<int64_t>([](Config* c) { return &c->cluster.track_max_keys; }, 1, kI64Max,
                    "cluster.track_max_keys")},
  };
  return keys;
}

const Key* FindKey(const std::string& name) {
  for (const Key& k : Schema()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

Status Apply(const std::string& name, const std::string& text, Config* config) {
  const Key* key = FindKey(name);
  if (key == nullptr) return Status::InvalidArgument(name + ": unknown configuration key");
  return key->set(text, config);
}

// Flattens a YAML map into "section.key" -> scalar text.
Status Flatten(const YAML::Node& node, const std::string& prefix,
               std::vector<std::pair<std::string, std::string>>* out) {
  if (!node.IsMap()) {
    return Status::InvalidArgument((prefix.empty() ? "the file" : prefix) + ": expected a map");
  }
  for (const auto& item : node) {
    const std::string name = prefix.empty() ? item.first.as<std::string>()
                                            : prefix + "." + item.first.as<std::string>();
    if (item.second.IsMap()) {
      FLATKV_RETURN_IF_ERROR(Flatten(item.second, name, out));
    } else if (item.second.IsScalar() || item.second.IsNull()) {
      out->emplace_back(name, item.second.IsNull() ? "" : item.second.as<std::string>());
    } else {
      return Status::InvalidArgument(name + ": expected a single value");
    }
  }
  return Status::OK();
}

// The cluster keys that need more than a range check; fills in the
// default advertise address.
Status CheckCluster(Config* config) {
  ClusterOptions& cl = config->cluster;
  std::string host;
  int port = 0;
  size_t start = 0;
  while (start <= cl.zookeeper.size()) {  // host:port,host:port
    const size_t comma = std::min(cl.zookeeper.find(',', start), cl.zookeeper.size());
    FLATKV_RETURN_IF_ERROR(partition::ParseHostPort(
        std::string_view(cl.zookeeper).substr(start, comma - start), "cluster.zookeeper", &host,
        &port));
    start = comma + 1;
  }
  if (cl.service_path.empty() || cl.service_path[0] != '/' ||
      (cl.service_path.size() > 1 && cl.service_path.back() == '/') ||
      cl.service_path.find("//") != std::string::npos) {
    return Bad("cluster.service_path",
               "'" + cl.service_path + "' is not an absolute ZooKeeper path such as /flatkv");
  }
  if (cl.advertise.empty()) {
    if (config->server.port == 0) {
      return Bad("cluster.advertise", "server.port is 0 (any): set a port or cluster.advertise");
    }
    cl.advertise = config->server.host + ":" + std::to_string(config->server.port);
  }
  FLATKV_RETURN_IF_ERROR(partition::ParseHostPort(cl.advertise, "cluster.advertise", &host, &port));
  if (host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*") {
    return Bad("cluster.advertise",
               "'" + cl.advertise + "' has a wildcard host that other instances cannot reach; "
               "set cluster.advertise to this machine's address");
  }
  if (!cl.zookeeper_auth_file.empty()) {
    FLATKV_RETURN_IF_ERROR(partition::ReadZkCredentials("cluster.zookeeper_auth_file",
                                                        cl.zookeeper_auth_file,
                                                        &cl.zookeeper_credentials,
                                                        &cl.zookeeper_auth_file_open));
  }
  return Status::OK();
}

// Reads the secret in "path" (key names it in errors): the whole file with
// one trailing newline (LF or CRLF) stripped. InvalidArgument for a missing,
// unreadable, empty or oversized file; the message never holds the secret.
// Adds a warning to config->warnings when group or others may read it.
Status ReadSecretFile(const std::string& key, const std::string& path, std::string* secret,
                      Config* config) {
  constexpr size_t kMaxSecretBytes = 4096;
  const std::string where = key + ": " + path + ": ";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Bad(key, path + ": cannot read (" + std::strerror(errno) + ")");
  std::string text(kMaxSecretBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return Bad(key, path + ": cannot read (" + std::strerror(errno) + ")");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxSecretBytes) return Bad(key, path + ": larger than 4096 bytes");
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return Bad(key, path + ": empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    config->warnings.push_back(where + "may be read by group or others; chmod 600 it");
  }
  *secret = std::move(text);
  return Status::OK();
}

// The server.tls_* keys that go together; the files themselves are read
// by TlsContext (server/tls.h) at start.
Status CheckTls(Config* config) {
  const ServerOptions& s = config->server;
  if (s.tls_cert_file.empty() != s.tls_key_file.empty()) {
    return s.tls_cert_file.empty() ? Bad("server.tls_key_file", "set without server.tls_cert_file")
                                   : Bad("server.tls_cert_file", "set without server.tls_key_file");
  }
  if (s.tls_client_auth != "none" && s.tls_ca_file.empty()) {
    return Bad("server.tls_client_auth",
               s.tls_client_auth + " needs server.tls_ca_file to verify client certificates");
  }
  if (s.tls_client_auth != "none" && !s.tls()) {
    return Bad("server.tls_client_auth", s.tls_client_auth + " needs server.tls_cert_file");
  }
  // A ring member's peers call its port: with TLS there, they must speak
  // TLS too.
  if (config->cluster.peer_tls && (!s.tls() || s.tls_ca_file.empty())) {
    return Bad("cluster.peer_tls",
               "needs server.tls_cert_file, server.tls_key_file and server.tls_ca_file");
  }
  if (s.tls() && config->cluster.enabled() && !config->cluster.peer_tls) {
    return Bad("server.tls_cert_file",
               "a ring member with TLS on its port needs cluster.peer_tls: true (its peers "
               "call that port)");
  }
  if (config->cluster.peer_tls) {
    config->cluster.peer_tls_ca_file = s.tls_ca_file;
    config->cluster.peer_tls_cert_file = s.tls_cert_file;
    config->cluster.peer_tls_key_file = s.tls_key_file;
  }
  if (s.tls() && config->cluster.enabled() && config->server.workers > 0) {
    return Bad("server.tls_cert_file",
               "a ring member's TLS port runs its calls on the I/O threads: set server.workers "
               "to 0 or auto");
  }
  if (s.tls()) {
    struct stat st {};
    if (::stat(s.tls_key_file.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      config->warnings.push_back("server.tls_key_file: " + s.tls_key_file +
                                 ": may be read by group or others; chmod 600 it");
    }
  }
  return Status::OK();
}

// An error names text from the file or the command line; control bytes in
// it (a newline in a quoted YAML value or an override) would break the
// promise of one line per error, so they are shown escaped (\x0a).
Status OneLine(const Status& st) {
  if (st.ok()) return st;
  std::string line;
  for (const char c : st.message()) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      line += "\\x";
      line += kHex[u >> 4];
      line += kHex[u & 15];
    } else {
      line += c;
    }
  }
  return Status::InvalidArgument(line);
}

Status LoadConfigInner(const std::string& path, const std::vector<std::string>& overrides,
                       Config* config);

}  // namespace

engine::EngineOptions ServerStorageDefaults() {
  engine::EngineOptions o;
  o.compaction_min_bytes = uint64_t{64} << 20;
  return o;
}

Status LoadConfig(const std::string& path, const std::vector<std::string>& overrides,
                  Config* config) {
  return OneLine(LoadConfigInner(path, overrides, config));
}

namespace {

Status LoadConfigInner(const std::string& path, const std::vector<std::string>& overrides,
                       Config* config) {
  *config = Config();
  if (!path.empty()) {
    std::vector<std::pair<std::string, std::string>> values;
    try {
      YAML::Node root = YAML::LoadFile(path);
      if (!root.IsNull()) FLATKV_RETURN_IF_ERROR(Flatten(root, "", &values));
    } catch (const YAML::BadFile&) {
      return Status::InvalidArgument(path + ": cannot read the configuration file");
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument(path + ": line " + std::to_string(e.mark.line + 1) + ": " +
                                     e.msg);
    }
    for (const auto& [name, text] : values) FLATKV_RETURN_IF_ERROR(Apply(name, text, config));
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument("--set " + o + ": expected section.key=value");
    }
    FLATKV_RETURN_IF_ERROR(Apply(o.substr(0, eq), o.substr(eq + 1), config));
  }
  // Calls that take microseconds are fastest on the I/O threads; a call
  // that waits for fdatasync would stall every connection of its thread
  // there, and group commit needs many such calls at once.
  // Half the cores leaves the other half to the handlers' disk work, the
  // cache flushers and, on a shared machine, the clients (measured on 2
  // cores: 1 I/O thread answers more calls, with a lower p99, than 2).
  if (config->server.io_threads < 0) {
    config->server.io_threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency() / 2));
  }
  if (config->server.workers < 0) {
    // A standalone put under sync: always waits for fdatasync: on a worker,
    // so that many wait together (group commit). A ring member's writes
    // wait for their chain without holding any thread (server/member/forwarder.h).
    config->server.workers =
        config->storage.sync == engine::SyncMode::kAlways && !config->cluster.enabled() ? 16 : 0;
  }
  if (config->storage.key_min >= config->storage.key_max) {
    return Status::InvalidArgument("storage.key_min: must be less than storage.key_max");
  }
  if (config->server.http_port != 0 && config->server.http_port == config->server.port) {
    return Status::InvalidArgument("server.http_port: must differ from server.port");
  }
  if (!config->admin_token_file.empty()) {
    FLATKV_RETURN_IF_ERROR(ReadSecretFile("admin.token_file", config->admin_token_file,
                                          &config->admin_token, config));
  }
  if (!config->cluster.peer_token_file.empty()) {
    FLATKV_RETURN_IF_ERROR(ReadSecretFile("cluster.peer_token_file",
                                          config->cluster.peer_token_file,
                                          &config->cluster.peer_token, config));
  }
  FLATKV_RETURN_IF_ERROR(CheckTls(config));
  if (config->cluster.enabled()) FLATKV_RETURN_IF_ERROR(CheckCluster(config));
  return Status::OK();
}

}  // namespace

std::string DescribeConfig() {
  std::ostringstream out;
  for (const Key& k : Schema()) {
    out << k.name << " = " << (*k.default_text ? k.default_text : "\"\"") << "\n    "
        << k.meaning << "\n";
  }
  return out.str();
}

}  // namespace flatkv::server
