// LruPolicy: evicts the least recently used entry first.
#pragma once

#include <list>
#include <string>
#include <unordered_map>

#include "engine/cache/policy.h"

namespace flatkv::engine::cache {

class LruPolicy final : public Policy {
 public:
  explicit LruPolicy(uint64_t capacity) : Policy(capacity) {}

  bool Lookup(std::string_view key, std::string* value) override;
  void Insert(std::string_view key, std::string_view value) override;
  void Erase(std::string_view key) override;
  bool Contains(std::string_view key) const override { return map_.count(key) > 0; }
  PolicyStats stats() const override;
  const char* name() const override { return "lru"; }

 private:
  struct Entry {
    std::string key;
    std::string value;
  };
  using List = std::list<Entry>;  // front = most recently used

  List list_;
  std::unordered_map<std::string_view, List::iterator> map_;  // views into list_ keys
  uint64_t bytes_ = 0;
  PolicyStats stats_;
};

}  // namespace flatkv::engine::cache
