// server/metrics: histogram buckets, concurrent recording, and the
// Prometheus text exposition format.
#include <catch2/catch.hpp>

#include <sstream>
#include <thread>
#include <vector>

#include "server/metrics.h"

using flatkv::server::LatencyHistogram;
using flatkv::server::PrometheusText;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

TEST_CASE("LatencyHistogram puts a call in the first bucket whose bound holds it",
          "[server][metrics]") {
  REQUIRE(LatencyHistogram::BucketOf(nanoseconds(0)) == 0);
  REQUIRE(LatencyHistogram::BucketOf(nanoseconds(1000)) == 0);  // exactly 1 us
  REQUIRE(LatencyHistogram::BucketOf(nanoseconds(1001)) == 1);  // just over: <= 2 us
  REQUIRE(LatencyHistogram::BucketOf(microseconds(3)) == 2);
  REQUIRE(LatencyHistogram::BucketOf(microseconds(4)) == 2);
  REQUIRE(LatencyHistogram::BucketOf(microseconds(5)) == 3);
  REQUIRE(LatencyHistogram::BucketOf(microseconds(int64_t{1} << 24)) == 24);
  REQUIRE(LatencyHistogram::BucketOf(std::chrono::seconds(17)) == LatencyHistogram::kBuckets);
  REQUIRE(LatencyHistogram::BucketOf(std::chrono::hours(1000)) == LatencyHistogram::kBuckets);
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    const auto bound = microseconds(LatencyHistogram::BoundMicros(i));
    INFO(i);
    REQUIRE(LatencyHistogram::BucketOf(bound) == i);
    REQUIRE(LatencyHistogram::BucketOf(bound + nanoseconds(1)) == i + 1);
  }
}

TEST_CASE("LatencyHistogram reads cumulative counts, count and sum", "[server][metrics]") {
  LatencyHistogram h;
  h.Record(microseconds(1));
  h.Record(microseconds(3));
  h.Record(microseconds(3));
  h.Record(std::chrono::seconds(100));
  const LatencyHistogram::Snapshot s = h.Read();
  REQUIRE(s.count == 4);
  REQUIRE(s.cumulative[0] == 1);
  REQUIRE(s.cumulative[1] == 1);
  REQUIRE(s.cumulative[2] == 3);
  REQUIRE(s.cumulative[LatencyHistogram::kBuckets - 1] == 3);
  REQUIRE(s.cumulative[LatencyHistogram::kBuckets] == 4);
  REQUIRE(s.sum_seconds == Approx(100.000007));
}

TEST_CASE("LatencyHistogram loses no call recorded from several threads", "[server][metrics]") {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.Record(microseconds((i + t) % 5000));
    });
  }
  for (std::thread& t : threads) t.join();
  REQUIRE(h.Read().count == 40000);
}

TEST_CASE("PrometheusText has HELP and TYPE per family, labels and cumulative buckets",
          "[server][metrics]") {
  LatencyHistogram get;
  get.Record(microseconds(10));
  get.Record(microseconds(300));
  const std::string text = PrometheusText(
      {{"calls.get", 2}, {"errors.get", 0}, {"calls.put", 0}, {"cache.dirty_bytes", 5},
       {"engine.fdatasyncs", 7}, {"new.thing-x", 3}, {"cluster.forwarded", 9},
       {"cluster.forwarded.127.0.0.1:9001", 4}, {"cluster.forwarded.127.0.0.1:9002", 5}},
      {{"get", &get}});
  REQUIRE(text.back() == '\n');
  REQUIRE(text.find("# TYPE flatkv_calls_total counter\n"
                    "flatkv_calls_total{method=\"get\"} 2\n"
                    "flatkv_calls_total{method=\"put\"} 0\n") != std::string::npos);
  REQUIRE(text.find("# TYPE flatkv_errors_total counter\n") != std::string::npos);
  REQUIRE(text.find("# TYPE flatkv_cache_dirty_bytes gauge\nflatkv_cache_dirty_bytes 5\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_engine_fdatasyncs_total 7\n") != std::string::npos);
  // Forwards per member are one family labelled by peer; the total stays.
  REQUIRE(text.find("# TYPE flatkv_cluster_forwarded_to_total counter\n"
                    "flatkv_cluster_forwarded_to_total{peer=\"127.0.0.1:9001\"} 4\n"
                    "flatkv_cluster_forwarded_to_total{peer=\"127.0.0.1:9002\"} 5\n") !=
          std::string::npos);
  REQUIRE(text.find("\nflatkv_cluster_forwarded 9\n") != std::string::npos);
  // A key the table does not know still appears, sanitized and untyped.
  REQUIRE(text.find("# TYPE flatkv_new_thing_x untyped\nflatkv_new_thing_x 3\n") !=
          std::string::npos);
  REQUIRE(text.find("# TYPE flatkv_request_duration_seconds histogram\n") != std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_bucket{method=\"get\",le=\"0.000008\"} 0\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_bucket{method=\"get\",le=\"0.000016\"} 1\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_bucket{method=\"get\",le=\"0.000512\"} 2\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_bucket{method=\"get\",le=\"16.777216\"} 2\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_bucket{method=\"get\",le=\"+Inf\"} 2\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_sum{method=\"get\"} 0.00031\n") !=
          std::string::npos);
  REQUIRE(text.find("flatkv_request_duration_seconds_count{method=\"get\"} 2\n") !=
          std::string::npos);
  // Each family's HELP and TYPE come once, before its samples.
  std::istringstream lines(text);
  std::string line;
  int types = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) ++types;
  }
  REQUIRE(types == 8);
}

TEST_CASE("QuantileMicros interpolates inside the bucket that holds the rank",
          "[server][metrics]") {
  LatencyHistogram h;
  REQUIRE(flatkv::server::QuantileMicros(h.Read(), 0.99) == 0);  // no calls
  for (int i = 0; i < 100; ++i) h.Record(microseconds(3));        // bucket (2, 4]
  REQUIRE(flatkv::server::QuantileMicros(h.Read(), 0.5) == Approx(3.0));
  REQUIRE(flatkv::server::QuantileMicros(h.Read(), 1.0) == Approx(4.0));
  h.Record(std::chrono::seconds(100));  // +Inf: the largest finite bound
  REQUIRE(flatkv::server::QuantileMicros(h.Read(), 1.0) ==
          Approx(static_cast<double>(LatencyHistogram::BoundMicros(LatencyHistogram::kBuckets - 1))));
}

TEST_CASE("RecentLoad reports the calls of the last seconds, not since the start",
          "[server][metrics]") {
  using Clock = std::chrono::steady_clock;
  flatkv::server::RecentLoad recent;
  LatencyHistogram h;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 1000; ++i) h.Record(microseconds(1000));  // ~1 ms each
  flatkv::server::RecentLoad::Result r = recent.Sample(t0 + std::chrono::seconds(1), h.Read());
  REQUIRE(r.ops_per_sec > 0);
  REQUIRE(r.p99_us > 512);
  REQUIRE(r.p99_us <= 1024);
  // Then one call a second of 3 us for 20 s: the slow ones leave the window.
  for (int s = 2; s <= 21; ++s) {
    h.Record(microseconds(3));
    r = recent.Sample(t0 + std::chrono::seconds(s), h.Read());
  }
  REQUIRE(r.window_ms >= 9000);
  REQUIRE(r.window_ms <= 11000);
  REQUIRE(r.ops_per_sec == 1);
  REQUIRE(r.p99_us <= 4);
}
