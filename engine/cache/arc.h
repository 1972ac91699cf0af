// ArcPolicy: Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), counted
// in bytes as ZFS's ARC is. Two resident lists, T1 (seen once recently) and
// T2 (seen at least twice), and two ghost lists of recently evicted keys, B1
// and B2 (keys and sizes only). A miss that hits a ghost adapts the target
// size p of T1: a B1 ghost says recency deserved more room, a B2 ghost says
// frequency did. A one-time scan only ever flows through T1, so a reused
// working set in T2 survives it, where LRU would be flushed.
#pragma once

#include <list>
#include <string>
#include <unordered_map>

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
    auto it = map_.find(key);
    return it != map_.end() && (it->second.list == kT1 || it->second.list == kT2);
  }
  PolicyStats stats() const override;
  const char* name() const override { return "arc"; }

  // The adaptive target for T1, in bytes (for tests and metrics).
  uint64_t target_t1() const { return p_; }

 private:
  enum ListId { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3 };
  struct Entry {
    std::string key;
    std::string value;  // empty for ghosts
    uint64_t charge;
  };
  using List = std::list<Entry>;  // front = most recent
  struct Loc {
    ListId list;
    List::iterator it;
  };

  void MoveTo(Loc* loc, ListId to);
  void DropLru(ListId list);  // removes the LRU entry of a list for good
  // Evicts the LRU of T1 (into B1) or of T2 (into B2), as ARC's REPLACE.
  void Replace(bool hit_in_b2);
  void MakeRoom(uint64_t charge, bool hit_in_b2);
  // A resident entry gets a new value; counts as a reuse (moves to T2).
  void Rewrite(Loc* loc, std::string_view key, std::string_view value);

  List lists_[4];
  uint64_t bytes_[4] = {0, 0, 0, 0};
  std::unordered_map<std::string_view, Loc> map_;  // views into the entries' keys
  uint64_t p_ = 0;
  PolicyStats stats_;
};

}  // namespace flatkv::engine::cache
