// Fuzz target: the string-key bucket decoder (string_keys.h). A bucket is a
// value read from disk: any bytes must decode to some entries (or none),
// never crash or read past the value.
#include <cstdint>
#include <string>

#include "engine/string_keys.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flatkv::engine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte: length of the key looked up (taken from the input's tail).
  const size_t key_len = std::min<size_t>(data[0], size - 1);
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string_view key = all.substr(all.size() - key_len);
  const std::string_view bucket = all;
  std::string value;
  const BucketLookup found = FindInBucket(bucket, key, &value);
  const auto live = LiveBucketEntries(bucket);
  // What LiveBucketEntries lists, FindInBucket finds with the same value.
  for (const auto& [k, v] : live) {
    std::string got;
    if (FindInBucket(bucket, k, &got) != BucketLookup::kFound || got != v) __builtin_trap();
    if (k == key && (found != BucketLookup::kFound || value != v)) __builtin_trap();
  }
  // Only a damaged bucket leaves a key unknown.
  if (found == BucketLookup::kUnknown && !BucketDamaged(bucket)) __builtin_trap();
  // Compacting changes no lookup: the same live entries, the same mark, and
  // the looked-up key answers the same.
  const std::string compact = CompactBucket(bucket);
  if (LiveBucketEntries(compact) != live || BucketDamaged(compact) != BucketDamaged(bucket)) {
    __builtin_trap();
  }
  std::string again;
  if (FindInBucket(compact, key, &again) != found ||
      (found == BucketLookup::kFound && again != value)) {
    __builtin_trap();
  }
  // Re-encoding the live entries gives a bucket that decodes to the same.
  std::string rebuilt;
  for (const auto& [k, v] : live) AppendBucketPut(&rebuilt, k, v);
  if (LiveBucketEntries(rebuilt) != live) __builtin_trap();
  AppendBucketRemove(&rebuilt, key);
  std::string ignored;
  if (FindInBucket(rebuilt, key, &ignored) != BucketLookup::kAbsent) __builtin_trap();
  return 0;
}
