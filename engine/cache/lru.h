// LruPolicy: evicts the least recently used entry first. Entries live in an
// EntryTable (open addressing, key inline) on one intrusive list whose head
// is the most recently used; a hit is one hash lookup and a relink.
#pragma once

#include <string>

#include "engine/cache/entry_table.h"
#include "engine/cache/policy.h"

namespace flatkv::engine::cache {

class LruPolicy final : public Policy {
 public:
  explicit LruPolicy(uint64_t capacity) : Policy(capacity) {}

  bool Lookup(std::string_view key, std::string* value) override;
  void Insert(std::string_view key, std::string_view value) override;
  bool Update(std::string_view key, std::string_view value) override;
  void Erase(std::string_view key) override;
  bool Contains(std::string_view key) const override {
    return table_.Find(key, EntryTable::Hash(key)) != EntryTable::kNil;
  }
  PolicyStats stats() const override;
  const char* name() const override { return "lru"; }

  // The table, for tests (EntryTable::TEST_CheckInvariants).
  const EntryTable& TEST_table() const { return table_; }

 private:
  static constexpr int kList = 0;

  uint64_t ChargeOf(uint32_t slot) const {
    return Charge(table_.key(slot), table_.value_size(slot));
  }
  // A resident entry gets a new value and becomes the most recent; then
  // evicts from the tail until the bytes fit (never this entry, which is
  // at the head and fits alone).
  void Rewrite(uint32_t slot, std::string_view value);
  void EvictUntil(uint64_t room);  // evicts LRU entries until bytes_ + room fits

  EntryTable table_;
  uint64_t bytes_ = 0;
  PolicyStats stats_;
};

}  // namespace flatkv::engine::cache
