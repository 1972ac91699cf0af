#include "client/bench/bench_histogram.h"

#include <algorithm>
#include <cmath>

namespace flatkv::client {

LatencyHistogram::LatencyHistogram() : counts_(kBuckets, 0) {}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

void LatencyHistogram::Clear() { *this = LatencyHistogram(); }

double LatencyHistogram::Mean() const {
  return count_ == 0 ? 0 : static_cast<double>(sum_) / static_cast<double>(count_);
}

uint64_t LatencyHistogram::BucketMidpoint(size_t index) {
  // Indexes below 256 are the values themselves (shift 0); above, shift s
  // holds indexes [128 (s + 1), 128 (s + 2)), each 2^s values wide.
  size_t shift = index < (size_t{2} << kSubBits) ? 0 : (index >> kSubBits) - 1;
  uint64_t sub = index - (shift << kSubBits);
  uint64_t low = sub << shift;
  return low + ((uint64_t{1} << shift) - 1) / 2;
}

uint64_t LatencyHistogram::Percentile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  rank = std::clamp<uint64_t>(rank, 1, count_);
  uint64_t seen = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::clamp(BucketMidpoint(i), min(), max());
  }
  return max_;  // not reached: the counts add up to count_
}

}  // namespace flatkv::client
