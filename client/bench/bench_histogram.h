// LatencyHistogram: an HDR-like log-linear histogram of durations in
// nanoseconds, for the per-call latencies of `flatkv-bench server`.
//
// Values below 256 ns have a bucket each. Above that, every power of two
// [2^e, 2^(e+1)) is split into 128 equal buckets, so a bucket is at most
// 1/128 of the values it holds wide, and a percentile reported as its
// bucket's midpoint is within 0.4% of the true value (HdrHistogram with 2
// significant digits does about the same). Values from 2^41 ns (about 37
// minutes) up land in the last bucket. Memory is fixed: 4480 counters
// (35 KiB), whatever the number of values.
//
//   bucket index = (s << 7) + (v >> s),  s = max(0, floor(log2 v) - 7)
//
// Thread safety: none; give each thread its own and Merge() them once the
// threads are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flatkv::client {

class LatencyHistogram {
 public:
  LatencyHistogram();

  // Adds one value. Cheap: a count-leading-zeros, shifts and four updates.
  void Record(uint64_t nanos) {
    if (nanos > kMaxValue) nanos = kMaxValue;
    ++counts_[BucketOf(nanos)];
    ++count_;
    sum_ += nanos;
    if (nanos < min_) min_ = nanos;
    if (nanos > max_) max_ = nanos;
  }

  // Adds every value of "other" to this one.
  void Merge(const LatencyHistogram& other);

  // Forgets every value.
  void Clear();

  uint64_t count() const { return count_; }
  // Exact extremes of the values recorded (after clamping to 2^41 - 1);
  // both 0 when empty.
  uint64_t min() const { return count_ == 0 ? 0 : min_; }
  uint64_t max() const { return max_; }
  // Exact mean; 0 when empty.
  double Mean() const;

  // The value at quantile q (0.5 = median, 0.999 = p99.9): the midpoint of
  // the bucket holding the ceil(q * count)-th smallest value, clamped to
  // [min(), max()]. 0 when empty. q is clamped to [0, 1].
  uint64_t Percentile(double q) const;

 private:
  static constexpr int kSubBits = 7;                        // 128 buckets per octave
  static constexpr int kMaxLog2 = 41;                       // values below 2^41 ns
  static constexpr uint64_t kMaxValue = (uint64_t{1} << kMaxLog2) - 1;
  static constexpr size_t kBuckets = size_t{kMaxLog2 - kSubBits + 1} << kSubBits;

  static size_t BucketOf(uint64_t v) {
    int log2 = v == 0 ? 0 : 63 - __builtin_clzll(v);
    int shift = log2 > kSubBits ? log2 - kSubBits : 0;
    return (static_cast<size_t>(shift) << kSubBits) + static_cast<size_t>(v >> shift);
  }
  // The midpoint of bucket "index"'s values.
  static uint64_t BucketMidpoint(size_t index);

  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = ~uint64_t{0};
  uint64_t max_ = 0;
};

}  // namespace flatkv::client
