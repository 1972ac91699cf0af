#include "client/bench/bench_histogram.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace flatkv::client {
namespace {

// The exact value at quantile q, by the same rank rule as Percentile().
uint64_t ExactPercentile(std::vector<uint64_t> values, double q) {
  std::sort(values.begin(), values.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  rank = std::clamp<size_t>(rank, 1, values.size());
  return values[rank - 1];
}

TEST_CASE("LatencyHistogram of nothing reports zeros", "[client][bench][histogram]") {
  LatencyHistogram h;
  CHECK(h.count() == 0);
  CHECK(h.Percentile(0.5) == 0);
  CHECK(h.min() == 0);
  CHECK(h.max() == 0);
  CHECK(h.Mean() == 0);
}

TEST_CASE("LatencyHistogram is exact below 256 ns", "[client][bench][histogram]") {
  LatencyHistogram h;
  for (uint64_t v = 0; v < 256; ++v) h.Record(v);
  CHECK(h.Percentile(0.5) == ExactPercentile([] {
          std::vector<uint64_t> v(256);
          for (uint64_t i = 0; i < 256; ++i) v[i] = i;
          return v;
        }(), 0.5));
  CHECK(h.Percentile(0) == 0);
  CHECK(h.Percentile(1) == 255);
  CHECK(h.min() == 0);
  CHECK(h.max() == 255);
}

TEST_CASE("LatencyHistogram percentiles are within 1% of the exact ones",
          "[client][bench][histogram]") {
  std::mt19937_64 rng(7);
  // Log-uniform from 1 us to 100 ms: every octave of a real latency range.
  std::uniform_real_distribution<double> exponent(3, 8);
  std::vector<uint64_t> values;
  LatencyHistogram h;
  for (int i = 0; i < 200000; ++i) {
    uint64_t v = static_cast<uint64_t>(std::pow(10.0, exponent(rng)));
    values.push_back(v);
    h.Record(v);
  }
  for (double q : {0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0}) {
    double exact = static_cast<double>(ExactPercentile(values, q));
    double got = static_cast<double>(h.Percentile(q));
    INFO("q = " << q << ", exact " << exact << ", got " << got);
    CHECK(std::abs(got - exact) <= 0.01 * exact);
  }
  CHECK(h.max() == *std::max_element(values.begin(), values.end()));
  CHECK(h.min() == *std::min_element(values.begin(), values.end()));
}

TEST_CASE("LatencyHistogram Merge equals recording everything in one",
          "[client][bench][histogram]") {
  LatencyHistogram a, b, all;
  for (uint64_t v = 1; v < 100000; v += 37) {
    (v % 2 ? a : b).Record(v * 11);
    all.Record(v * 11);
  }
  a.Merge(b);
  CHECK(a.count() == all.count());
  CHECK(a.Mean() == all.Mean());
  CHECK(a.min() == all.min());
  CHECK(a.max() == all.max());
  for (double q : {0.5, 0.99, 0.999}) CHECK(a.Percentile(q) == all.Percentile(q));
}

TEST_CASE("LatencyHistogram clamps huge values into its last bucket",
          "[client][bench][histogram]") {
  LatencyHistogram h;
  h.Record(~uint64_t{0});
  h.Record(1000);
  CHECK(h.count() == 2);
  CHECK(h.max() == (uint64_t{1} << 41) - 1);
  CHECK(h.Percentile(1.0) <= h.max());
  // 1000 sits in the 4-wide bucket [1000, 1004), reported as its midpoint.
  CHECK(h.Percentile(0.5) == 1001);
}

}  // namespace
}  // namespace flatkv::client
