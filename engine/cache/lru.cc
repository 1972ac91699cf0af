#include "engine/cache/lru.h"

namespace flatkv::engine::cache {

bool LruPolicy::Lookup(std::string_view key, std::string* value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++stats_.misses;
    return false;
  }
  ++stats_.hits;
  list_.splice(list_.begin(), list_, it->second);
  *value = it->second->value;
  return true;
}

void LruPolicy::Insert(std::string_view key, std::string_view value) {
  Erase(key);
  const uint64_t charge = Charge(key, value.size());
  if (charge > capacity_) return;
  while (bytes_ + charge > capacity_ && !list_.empty()) {
    const Entry& victim = list_.back();
    bytes_ -= Charge(victim.key, victim.value.size());
    map_.erase(victim.key);
    list_.pop_back();
    ++stats_.evictions;
  }
  list_.push_front(Entry{std::string(key), std::string(value)});
  map_.emplace(list_.front().key, list_.begin());
  bytes_ += charge;
}

void LruPolicy::Erase(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  bytes_ -= Charge(it->second->key, it->second->value.size());
  List::iterator node = it->second;
  map_.erase(it);
  list_.erase(node);
}

PolicyStats LruPolicy::stats() const {
  PolicyStats s = stats_;
  s.bytes = bytes_;
  s.entries = list_.size();
  return s;
}

}  // namespace flatkv::engine::cache
