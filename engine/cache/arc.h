// ArcPolicy: Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), counted
// in bytes as ZFS's ARC is. Two resident lists, T1 (seen once recently) and
// T2 (seen at least twice), and two ghost lists of recently evicted keys, B1
// and B2 (keys and sizes only). A miss that hits a ghost adapts the target
// size p of T1: a B1 ghost says recency deserved more room, a B2 ghost says
// frequency did. A one-time scan only ever flows through T1, so a reused
// working set in T2 survives it, where LRU would be flushed.
//
// All four lists are intrusive lists in one EntryTable (open addressing, key
// inline): a hit is one hash lookup and a relink, a ghost is a slot with
// its key and size but no value bytes.
#pragma once

#include <string>

#include "engine/cache/entry_table.h"
#include "engine/cache/policy.h"

namespace flatkv::engine::cache {

class ArcPolicy final : public Policy {
 public:
  explicit ArcPolicy(uint64_t capacity) : Policy(capacity) {}

  bool Lookup(std::string_view key, std::string* value) override;
  void Insert(std::string_view key, std::string_view value) override;
  void Erase(std::string_view key) override;
  bool Update(std::string_view key, std::string_view value) override;
  bool Contains(std::string_view key) const override {
    const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
    return slot != EntryTable::kNil && Resident(slot);
  }
  PolicyStats stats() const override;
  const char* name() const override { return "arc"; }

  // The adaptive target for T1, in bytes (for tests and metrics).
  uint64_t target_t1() const { return p_; }

  enum ListId { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3 };
  // Charged bytes on one list, and the table, for tests.
  uint64_t TEST_list_bytes(ListId list) const { return bytes_[list]; }
  const EntryTable& TEST_table() const { return table_; }

 private:
  bool Resident(uint32_t slot) const { return table_.list(slot) <= kT2; }
  uint64_t ChargeOf(uint32_t slot) const {
    return Charge(table_.key(slot), table_.value_size(slot));
  }
  void MoveTo(uint32_t slot, ListId to);
  void DropLru(ListId list);  // removes the LRU entry of a list for good
  void EraseSlot(uint32_t slot);
  // Evicts the LRU of T1 (into B1) or of T2 (into B2), as ARC's REPLACE.
  // Moves no slot (a ghost stays where it was), so slot indices survive.
  void Replace(bool hit_in_b2);
  void MakeRoom(uint64_t charge, bool hit_in_b2);
  // A resident entry gets a new value; counts as a reuse (moves to T2).
  void Rewrite(uint32_t slot, std::string_view value);

  EntryTable table_;
  uint64_t bytes_[4] = {0, 0, 0, 0};
  uint64_t p_ = 0;
  PolicyStats stats_;
};

}  // namespace flatkv::engine::cache
