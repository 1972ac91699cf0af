// A replacement policy: a byte-bounded cache of clean (key, value) pairs.
// LruPolicy and ArcPolicy implement it; the write-back cache (write_back.h) keeps
// dirty entries outside the policy, so eviction can never drop an
// unwritten value, and inserts an entry here once it is clean.
//
// Keys are opaque bytes (the write-back layer encodes integer and string
// keys apart). An entry costs key.size() + value.size() + kEntryOverhead
// bytes against the capacity; an entry larger than the capacity is not kept.
//
// Thread safety: none; callers serialize (the write-back cache shards its
// policies and locks each shard).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flatkv::engine::cache {

struct PolicyStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t bytes = 0;  // charged bytes held now
  uint64_t entries = 0;
};

class Policy {
 public:
  static constexpr size_t kEntryOverhead = 64;  // list node, hash slot, strings

  virtual ~Policy() = default;

  // On a hit copies the value into *value, records the access and returns
  // true; on a miss returns false and leaves *value unchanged.
  virtual bool Lookup(std::string_view key, std::string* value) = 0;
  // Inserts or replaces key's value (counts as an access), evicting as needed.
  virtual void Insert(std::string_view key, std::string_view value) = 0;
  // If key is resident, replaces its value as Insert does and returns true;
  // otherwise returns false and inserts nothing (write-through without
  // write-allocate). One lookup where Contains + Insert would take two.
  virtual bool Update(std::string_view key, std::string_view value) {
    if (!Contains(key)) return false;
    Insert(key, value);
    return true;
  }
  // Whether key is resident (no stats, no recency change).
  virtual bool Contains(std::string_view key) const = 0;
  // Drops key if present (no ghost is kept: the value is gone, not cold).
  virtual void Erase(std::string_view key) = 0;

  virtual PolicyStats stats() const = 0;
  virtual const char* name() const = 0;
  uint64_t capacity() const { return capacity_; }

 protected:
  explicit Policy(uint64_t capacity) : capacity_(capacity) {}
  static uint64_t Charge(std::string_view key, size_t value_size) {
    return key.size() + value_size + kEntryOverhead;
  }

  const uint64_t capacity_;
};

}  // namespace flatkv::engine::cache
