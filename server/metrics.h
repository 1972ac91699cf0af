// Metrics: per-method latency histograms and the Prometheus text exposition
// (format 0.0.4) that GET /metrics serves.
//
// A LatencyHistogram has fixed buckets whose upper bounds are powers of two
// in microseconds, 1 us .. 2^24 us (about 16.8 s), plus +Inf. Record() is
// a handful of relaxed atomic increments: no allocation, no lock, so the
// handler records every call. Bucket counts are kept per bucket and made
// cumulative only when read.
//
// Thread safety: Record() and Read() may run concurrently from any threads.
// A Read() racing with Record() may see a call in the buckets but not yet in
// the sum (or the other way round); each value is itself consistent.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace flatkv::server {

class LatencyHistogram {
 public:
  // Finite buckets; bucket i holds calls of at most BoundMicros(i) that do
  // not fit bucket i-1. One more bucket (index kBuckets) is +Inf.
  static constexpr int kBuckets = 25;

  // Upper bound of finite bucket "i" (0 <= i < kBuckets) in microseconds.
  static constexpr uint64_t BoundMicros(int i) { return uint64_t{1} << i; }

  // Index of the bucket a call of "elapsed" falls into (kBuckets = +Inf).
  static int BucketOf(std::chrono::nanoseconds elapsed);

  // Counts one call that took "elapsed". Lock-free, allocation-free.
  void Record(std::chrono::nanoseconds elapsed);

  struct Snapshot {
    // cumulative[i] = calls of at most BoundMicros(i); cumulative[kBuckets]
    // (+Inf) equals count.
    std::array<uint64_t, kBuckets + 1> cumulative{};
    uint64_t count = 0;
    double sum_seconds = 0;
  };
  Snapshot Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> buckets_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

// The value below which a fraction "q" (0..1) of the calls of "s" fall,
// in microseconds, interpolated linearly inside its bucket as Prometheus's
// histogram_quantile() does (so at most a factor of two off). A quantile
// in the +Inf bucket is the largest finite bound; 0 for no calls.
double QuantileMicros(const LatencyHistogram::Snapshot& s, double q);

// The calls of a histogram (several methods' added up) over about the last
// ten seconds, from successive reads of it: the console's ops/s and p99 of
// a member (Handler::CollectStats, "recent.*").
//
// Thread safety: Sample() may be called from any thread.
class RecentLoad {
 public:
  static constexpr std::chrono::seconds kWindow{10};

  struct Result {
    int64_t window_ms = 0;    // the span the figures cover
    int64_t ops_per_sec = 0;  // calls finished per second in it
    int64_t p99_us = 0;       // their 99th percentile latency
  };
  // "now": when "total" (the cumulative histogram) was read. The window
  // starts at the oldest read kept that is at most kWindow old (or the
  // newest older one, or construction): reads are kept one a second.
  Result Sample(std::chrono::steady_clock::time_point now, const LatencyHistogram::Snapshot& total);

 private:
  using Point = std::pair<std::chrono::steady_clock::time_point, LatencyHistogram::Snapshot>;
  std::mutex mu_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::deque<Point> points_;  // GUARDED_BY(mu_), oldest first
};

// Records the time from construction to destruction into a histogram, so
// every exit of a scope (return or exception) is timed.
class ScopedLatency {
 public:
  explicit ScopedLatency(LatencyHistogram* histogram)
      : histogram_(histogram), start_(std::chrono::steady_clock::now()) {}
  // Counts from "start" instead (a call begun earlier, elsewhere).
  ScopedLatency(LatencyHistogram* histogram, std::chrono::steady_clock::time_point start)
      : histogram_(histogram), start_(start) {}
  ~ScopedLatency() { histogram_->Record(std::chrono::steady_clock::now() - start_); }

  ScopedLatency(const ScopedLatency&) = delete;
  ScopedLatency& operator=(const ScopedLatency&) = delete;

 private:
  LatencyHistogram* const histogram_;
  const std::chrono::steady_clock::time_point start_;
};

// A histogram with the name of the method it times.
using NamedLatency = std::pair<std::string, const LatencyHistogram*>;

// Renders the Prometheus text exposition format 0.0.4: every entry of
// "stats" (the map Handler::stats() returns) as a flatkv_* sample, with
// "calls.<method>" and "errors.<method>" as flatkv_calls_total and
// flatkv_errors_total labelled by method, and each histogram of
// "latencies" as flatkv_request_duration_seconds{method=...}. Every family
// has its # HELP and # TYPE lines; the text ends with a newline.
std::string PrometheusText(const std::map<std::string, int64_t>& stats,
                           const std::vector<NamedLatency>& latencies);

}  // namespace flatkv::server
