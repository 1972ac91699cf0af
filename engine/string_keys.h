// String keys (paper §2.8): a string key skey is stored under the integer key
// ikey = HashStringKey(skey) mod string_slots of a dedicated flat table, whose
// value is the bucket of every (skey, value) with that ikey.
//
// A bucket is a log of entries, oldest first; the newest entry for a key
// wins. A put appends one entry (FlatTable::Append, so its cost is the entry's
// size, not the bucket's), and the bucket is rewritten with only its live
// entries once it has grown past twice its last rewritten size (plus 4 KiB),
// so each written byte is rewritten O(1) times on average: puts into a bucket
// of n keys are not O(n) each.
//
//   entry := kind u8 (1 = put, 2 = remove) | varint key_size | key
//            | (put only) varint value_size | value
//
// HashStringKey is XXH64 with seed 0 (the xxHash specification, from Debian's
// libxxhash), fixed so that files and the ring stay valid across versions.
//
// Thread safety: free functions on caller-owned data.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace flatkv::engine {

uint64_t HashStringKey(std::string_view key);

enum class BucketEntryKind : uint8_t { kPut = 1, kRemove = 2 };

void AppendBucketPut(std::string* bucket, std::string_view key, std::string_view value);
void AppendBucketRemove(std::string* bucket, std::string_view key);

// Calls fn for each entry in order; returns false if the bucket is malformed.
bool ForEachBucketEntry(
    std::string_view bucket,
    const std::function<void(BucketEntryKind, std::string_view key, std::string_view value)>& fn);

// The newest entry for "key": true and *value set if it is a put.
bool FindInBucket(std::string_view bucket, std::string_view key, std::string* value);

// The live (key, value) pairs of a bucket, sorted by key.
std::vector<std::pair<std::string, std::string>> LiveBucketEntries(std::string_view bucket);

}  // namespace flatkv::engine
