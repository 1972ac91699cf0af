// Implementation notes
//
// Buckets are powers of two in microseconds so that finding one is a
// bit_width, not a search. The text format groups samples by family (one
// # HELP and # TYPE per family, its samples right after), as the format
// requires. Stats keys the table below does not know still appear, as
// untyped samples with a sanitized name, so a counter added to stats() is
// never missing from /metrics.
#include "server/metrics.h"

#include <algorithm>
#include <bit>
#include <charconv>

namespace flatkv::server {

int LatencyHistogram::BucketOf(std::chrono::nanoseconds elapsed) {
  const int64_t ns = elapsed.count();
  if (ns <= 1000) return 0;
  const uint64_t micros = (static_cast<uint64_t>(ns) + 999) / 1000;  // rounded up
  const int index = static_cast<int>(std::bit_width(micros - 1));
  return index < kBuckets ? index : kBuckets;
}

void LatencyHistogram::Record(std::chrono::nanoseconds elapsed) {
  buckets_[BucketOf(elapsed)].fetch_add(1, std::memory_order_relaxed);
  const int64_t ns = elapsed.count();
  sum_nanos_.fetch_add(ns > 0 ? static_cast<uint64_t>(ns) : 0, std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot s;
  uint64_t total = 0;
  for (int i = 0; i <= kBuckets; ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum_seconds = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

double QuantileMicros(const LatencyHistogram::Snapshot& s, double q) {
  if (s.count == 0) return 0;
  const double rank = q * static_cast<double>(s.count);
  constexpr int kLast = LatencyHistogram::kBuckets - 1;
  for (int i = 0; i <= kLast; ++i) {
    if (static_cast<double>(s.cumulative[i]) < rank) continue;
    const double below = i == 0 ? 0 : static_cast<double>(s.cumulative[i - 1]);
    const double in = static_cast<double>(s.cumulative[i]) - below;
    const double lo = i == 0 ? 0 : static_cast<double>(LatencyHistogram::BoundMicros(i - 1));
    const double hi = static_cast<double>(LatencyHistogram::BoundMicros(i));
    return in <= 0 ? hi : lo + (hi - lo) * (rank - below) / in;
  }
  return static_cast<double>(LatencyHistogram::BoundMicros(kLast));
}

RecentLoad::Result RecentLoad::Sample(std::chrono::steady_clock::time_point now,
                                      const LatencyHistogram::Snapshot& total) {
  std::lock_guard<std::mutex> lock(mu_);
  while (points_.size() >= 2 && now - points_[1].first >= kWindow) points_.pop_front();
  const Point base = points_.empty() ? Point{start_, {}} : points_.front();
  if (points_.empty() || now - points_.back().first >= std::chrono::seconds(1)) {
    points_.emplace_back(now, total);
  }
  LatencyHistogram::Snapshot delta;
  delta.count = total.count >= base.second.count ? total.count - base.second.count : 0;
  for (size_t i = 0; i < delta.cumulative.size(); ++i) {
    const uint64_t a = total.cumulative[i];
    const uint64_t b = base.second.cumulative[i];
    delta.cumulative[i] = a >= b ? a - b : 0;
  }
  Result r;
  r.window_ms = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(now - base.first).count());
  r.ops_per_sec = static_cast<int64_t>(delta.count * 1000 / static_cast<uint64_t>(r.window_ms));
  r.p99_us = static_cast<int64_t>(QuantileMicros(delta, 0.99) + 0.5);
  return r;
}

namespace {

constexpr const char* kPrefix = "flatkv_";

struct KnownStat {
  const char* key;   // stats() key
  const char* name;  // metric name without the prefix
  const char* type;  // counter | gauge
  const char* help;
};

constexpr KnownStat kKnownStats[] = {
    {"cache.hits", "cache_hits_total", "counter", "Cache lookups that found the key."},
    {"cache.misses", "cache_misses_total", "counter", "Cache lookups that went to the store."},
    {"cache.evictions", "cache_evictions_total", "counter", "Clean entries evicted from the cache."},
    {"cache.dirty_bytes", "cache_dirty_bytes", "gauge", "Bytes written in async mode, not yet on disk."},
    {"cache.flushes", "cache_flushes_total", "counter", "Dirty entries written by the flushers."},
    {"cache.coalesced", "cache_coalesced_total", "counter",
     "Async writes that replaced a still-dirty value of the same key."},
    {"cache.writer_waits", "cache_writer_waits_total", "counter",
     "Async writes that waited for the flushers (past cache.max_dirty_bytes)."},
    {"cache.flush_failures", "cache_flush_failures_total", "counter",
     "Flusher passes that failed to write an entry (a full disk, an I/O error)."},
    {"cluster.ring_reads", "cluster_ring_reads_total", "counter",
     "Times this member read the ring from ZooKeeper after a watch fired (or on a retry)."},
    {"cluster.zk_reads", "cluster_zk_reads_total", "counter",
     "ZooKeeper reads sent for those (listings, member and chain nodes, creation zxids)."},
    {"engine.segments", "engine_segments", "gauge", "Flat tables (segments) in the store."},
    {"engine.segments_open", "engine_segments_open", "gauge",
     "Flat tables open now (idle ones are closed past storage.max_open_files)."},
    {"engine.segment_opens", "engine_segment_opens_total", "counter",
     "Tables reopened after the open-file budget had closed them."},
    {"engine.segment_closes", "engine_segment_closes_total", "counter",
     "Idle tables closed to stay within storage.max_open_files."},
    {"engine.data_files_open", "engine_data_files_open", "gauge", "Data files with an open descriptor."},
    {"engine.bytes_appended", "engine_bytes_appended_total", "counter",
     "Bytes appended to the data files."},
    {"engine.fdatasyncs", "engine_fdatasyncs_total", "counter", "fdatasync calls made by the engine."},
    {"engine.corrupt_records", "engine_corrupt_records_total", "counter",
     "Records skipped because their checksum did not match."},
    {"engine.buckets_damaged", "engine_buckets_damaged_total", "counter",
     "String-key buckets written anew with a damaged mark after a write met a bad record."},
    {"engine.recovery_records", "engine_recovery_records_total", "counter",
     "Log records crash recovery or an index rebuild applied to an index since start "
     "(0 after a clean stop)."},
    {"engine.recovery_bytes_scanned", "engine_recovery_bytes_scanned_total", "counter",
     "Log bytes crash recovery or an index rebuild read since start."},
    {"engine.index_rebuilds", "engine_index_rebuilds_total", "counter",
     "Tables whose index was rebuilt from their logs since start."},
    {"engine.sparse_keys", "engine_sparse_keys", "gauge",
     "Keys in the sparse tier; 0 with storage.sparse_tier off."},
    {"engine.sparse_promotions", "engine_sparse_promotions_total", "counter",
     "Segments moved from the sparse tier to a flat table."},
    {"engine.string_filter_skips", "engine_string_filter_skips_total", "counter",
     "String-key gets and removes of absent keys answered by the in-memory bucket filter, "
     "without reading the bucket."},
    {"engine.live_bytes", "engine_live_bytes", "gauge",
     "Bytes of live records in the data files (estimated; the rest is garbage compaction reclaims)."},
    {"compaction.running", "compaction_running", "gauge", "1 while a compaction round runs."},
    {"compaction.percent_x100", "compaction_percent_x100", "gauge",
     "Progress of the current compaction round in hundredths of a percent."},
    {"compaction.round_done_bytes", "compaction_round_done_bytes", "gauge",
     "Log bytes the current compaction round has read."},
    {"compaction.round_bytes", "compaction_round_bytes", "gauge",
     "Log bytes the current compaction round reads in all."},
    {"compaction.tables_compacted", "compaction_tables_compacted_total", "counter",
     "Tables compacted whole (into a new generation) since the server started."},
    {"compaction.heads_cleaned", "compaction_heads_cleaned_total", "counter",
     "Rounds of compaction in place (each data file's oldest part freed) since the server started."},
    {"compaction.bytes_reclaimed", "compaction_bytes_reclaimed_total", "counter",
     "Log bytes compaction gave back since the server started."},
    {"recent.window_ms", "recent_window_ms", "gauge",
     "The span (about the last 10 s) the recent.* figures cover."},
    {"recent.ops_per_sec", "recent_ops_per_sec", "gauge",
     "Data calls (client and forwarded) finished per second over recent.window_ms."},
    {"recent.p99_us", "recent_p99_us", "gauge",
     "99th percentile latency of those calls in microseconds (interpolated in its bucket)."},
    {"disk.total_bytes", "disk_total_bytes", "gauge", "Size of the file system holding storage.path."},
    {"disk.free_bytes", "disk_free_bytes", "gauge",
     "Bytes available to the server on the file system holding storage.path."},
    {"server.connections", "server_connections", "gauge", "Thrift connections open."},
    {"server.connections_accepted", "server_connections_accepted_total", "counter",
     "Thrift connections accepted."},
    {"server.queued_calls", "server_queued_calls", "gauge", "Calls waiting for a worker."},
    {"server.overloaded", "server_overloaded_total", "counter", "Calls answered OVERLOADED."},
    {"server.malformed_calls", "server_malformed_calls_total", "counter",
     "Calls that could not be decoded."},
    {"server.protocol_errors", "server_protocol_errors_total", "counter",
     "Connections closed for a bad frame or protocol error."},
    {"server.tls_handshake_errors", "server_tls_handshake_errors_total", "counter",
     "TLS connections closed before their handshake completed (plaintext clients, refused "
     "certificates)."},
};

// Labelled families: "<group>.<label value>" keys, e.g. "calls.get" ->
// flatkv_calls_total{method="get"}.
struct LabelledFamily {
  const char* group;
  const char* name;
  const char* label;
  const char* help;
};

constexpr LabelledFamily kLabelledFamilies[] = {
    {"calls", "calls_total", "method",
     "Calls per service method (HTTP routes count as the method they call)."},
    {"errors", "errors_total", "method", "Calls per service method that ended in an error."},
    // A ring member's forwards per member ("cluster.forwarded.<host:port>"):
    // a label, not a metric name per member, so a dashboard can sum them.
    {"cluster.forwarded", "cluster_forwarded_to_total", "peer",
     "Calls this instance forwarded to each other member (host:port)."},
};

struct Family {
  std::string type;
  std::string help;
  std::vector<std::string> samples;  // complete lines without the newline
};

// Metric names allow [a-zA-Z0-9_:] (no leading digit; ours have the prefix).
std::string SanitizeName(const std::string& key) {
  std::string out = key;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == ':';
    if (!ok) c = '_';
  }
  return out;
}

// Label values escape backslash, double quote and newline.
std::string EscapeLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string FormatDouble(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

// Exact decimal seconds for a whole number of microseconds: 1 -> 0.000001.
std::string MicrosAsSeconds(uint64_t micros) {
  std::string frac = std::to_string(micros % 1000000);
  frac.insert(0, 6 - frac.size(), '0');
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return std::to_string(micros / 1000000) + (frac.empty() ? "" : "." + frac);
}

// Puts one stats() entry into its family.
void AddStat(const std::string& key, int64_t value, std::map<std::string, Family>* families) {
  const std::string v = std::to_string(value);
  for (const LabelledFamily& m : kLabelledFamilies) {
    const std::string group = std::string(m.group) + ".";
    if (key.compare(0, group.size(), group) == 0) {
      Family& f = (*families)[kPrefix + std::string(m.name)];
      f.type = "counter";
      f.help = m.help;
      f.samples.push_back(kPrefix + std::string(m.name) + "{" + m.label + "=\"" +
                          EscapeLabel(key.substr(group.size())) + "\"} " + v);
      return;
    }
  }
  for (const KnownStat& k : kKnownStats) {
    if (key == k.key) {
      Family& f = (*families)[kPrefix + std::string(k.name)];
      f.type = k.type;
      f.help = k.help;
      f.samples.push_back(kPrefix + std::string(k.name) + " " + v);
      return;
    }
  }
  const std::string name = kPrefix + SanitizeName(key);
  Family& f = (*families)[name];
  f.type = "untyped";
  f.help = "stats() value " + key + ".";
  f.samples.push_back(name + " " + v);
}

void AppendHistograms(const std::vector<NamedLatency>& latencies, std::string* out) {
  const std::string name = std::string(kPrefix) + "request_duration_seconds";
  *out += "# HELP " + name + " Time spent handling a call, per service method.\n";
  *out += "# TYPE " + name + " histogram\n";
  for (const auto& [method, histogram] : latencies) {
    const LatencyHistogram::Snapshot s = histogram->Read();
    const std::string label = "method=\"" + EscapeLabel(method) + "\"";
    for (int i = 0; i <= LatencyHistogram::kBuckets; ++i) {
      const std::string le = i < LatencyHistogram::kBuckets
                                 ? MicrosAsSeconds(LatencyHistogram::BoundMicros(i))
                                 : "+Inf";
      *out += name + "_bucket{" + label + ",le=\"" + le + "\"} " +
              std::to_string(s.cumulative[i]) + "\n";
    }
    *out += name + "_sum{" + label + "} " + FormatDouble(s.sum_seconds) + "\n";
    *out += name + "_count{" + label + "} " + std::to_string(s.count) + "\n";
  }
}

}  // namespace

std::string PrometheusText(const std::map<std::string, int64_t>& stats,
                           const std::vector<NamedLatency>& latencies) {
  std::map<std::string, Family> families;
  for (const auto& [key, value] : stats) AddStat(key, value, &families);
  std::string out;
  for (const auto& [name, f] : families) {
    out += "# HELP " + name + " " + f.help + "\n";
    out += "# TYPE " + name + " " + f.type + "\n";
    for (const std::string& line : f.samples) out += line + "\n";
  }
  AppendHistograms(latencies, &out);
  return out;
}

}  // namespace flatkv::server
