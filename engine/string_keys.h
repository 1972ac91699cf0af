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
//          | kind u8 (3 = damaged)
//
// "Damaged" (builds without kind 3 read such a bucket as a bad record)
// marks a bucket rebuilt after its record
// failed its checksum: the entries before it were lost. A key with an entry
// after it reads as that entry says; any other key of the bucket is
// unknown (Corruption) until the bucket is written whole again from a good
// copy (Store::SWriteBucket, read repair in a chain).
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

enum class BucketEntryKind : uint8_t { kPut = 1, kRemove = 2, kDamaged = 3 };

void AppendBucketPut(std::string* bucket, std::string_view key, std::string_view value);
void AppendBucketRemove(std::string* bucket, std::string_view key);
void AppendBucketDamaged(std::string* bucket);

// Calls fn for each entry in order (a kDamaged one with empty key and
// value); returns false if the bucket is malformed.
bool ForEachBucketEntry(
    std::string_view bucket,
    const std::function<void(BucketEntryKind, std::string_view key, std::string_view value)>& fn);

// What a bucket says of one key: its newest entry is a put (*value set) or
// a remove, or there is none (kAbsent, or kUnknown past a damaged mark).
enum class BucketLookup { kFound, kAbsent, kUnknown };
BucketLookup FindInBucket(std::string_view bucket, std::string_view key, std::string* value);

// The live (key, value) pairs of a bucket, sorted by key (of a damaged
// bucket: those written since it was damaged).
std::vector<std::pair<std::string, std::string>> LiveBucketEntries(std::string_view bucket);

// Whether the bucket carries a damaged mark.
bool BucketDamaged(std::string_view bucket);

// The bucket rewritten with only what a lookup needs: its live puts; for a
// damaged bucket the mark first and then the newest entry of each key
// written since, removes included (a removed key is absent, not unknown).
// Empty if nothing is left (the bucket can be dropped).
std::string CompactBucket(std::string_view bucket);

// Whether CompactBucket(bucket) == bucket, without building it: live puts
// in strictly increasing key order; or a damaged mark first, then puts and
// removes in that order.
bool BucketIsCompact(std::string_view bucket);

// The bucket filter: one byte per bucket, kept by the Store in memory (never
// on disk), so that a lookup of an absent key rarely reads a bucket. With
// kFilterKnown set, bit BucketFilterBit(HashStringKey(k)) of the low seven is
// set for every key k the bucket may hold (a removed key may keep its bit
// until the bucket is written whole again); without it the byte says
// nothing and the bucket must be read. A bucket of one key answers 6 of 7
// absent keys without a read.
inline constexpr uint8_t kFilterKnown = 0x80;
inline uint8_t BucketFilterBit(uint64_t hash) {
  // The high half of the hash (the slot, hash mod string_slots, is mostly
  // the low half), scaled to 0..6.
  return static_cast<uint8_t>(1u << (((hash >> 32) * 7) >> 32));
}
// The exact filter of a whole bucket: kFilterKnown with the bits of its
// live keys (kFilterKnown alone for an empty one), or 0 (nothing known) for
// a damaged or malformed bucket, whose other keys must read as unknown.
uint8_t BucketFilter(std::string_view bucket);

// CompactBucket(bucket + a put of key), in one pass and one allocation, for
// a compact bucket (BucketIsCompact) or an empty one: stores it in *out and
// returns true, with *replaced (if given) true when the bucket held a live
// put of key (never for a damaged bucket, whose other keys are unknown).
// Returns false, *out and *replaced unspecified, for any other bucket.
bool PutInCompactBucket(std::string_view bucket, std::string_view key, std::string_view value,
                        std::string* out, bool* replaced = nullptr);

// CompactBucket(bucket + a remove of key), in one pass, for a compact bucket
// without a damaged mark (live puts only): stores it in *out (empty when
// key was the only one), sets *found to whether key was there, and returns
// true. Returns false, *out and *found unspecified, for any other bucket
// (a damaged bucket keeps removes, so SRemove appends one instead).
bool RemoveFromCompactBucket(std::string_view bucket, std::string_view key, std::string* out,
                             bool* found);

}  // namespace flatkv::engine
