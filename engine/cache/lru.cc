#include "engine/cache/lru.h"

namespace flatkv::engine::cache {

bool LruPolicy::Lookup(std::string_view key, std::string* value) {
  const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
  if (slot == EntryTable::kNil) {
    ++stats_.misses;
    return false;
  }
  ++stats_.hits;
  table_.MoveToFront(slot, kList);
  const std::string_view v = table_.value(slot);
  value->assign(v.data(), v.size());
  return true;
}

void LruPolicy::EvictUntil(uint64_t room) {
  while (bytes_ + room > capacity_ && table_.size() > 0) {
    const uint32_t victim = table_.tail(kList);
    bytes_ -= ChargeOf(victim);
    table_.Remove(victim);
    ++stats_.evictions;
  }
}

void LruPolicy::Rewrite(uint32_t slot, std::string_view value) {
  bytes_ -= ChargeOf(slot);
  table_.SetValue(slot, value);
  bytes_ += ChargeOf(slot);
  table_.MoveToFront(slot, kList);
  EvictUntil(0);
}

void LruPolicy::Insert(std::string_view key, std::string_view value) {
  const uint64_t hash = EntryTable::Hash(key);
  const uint32_t slot = table_.Find(key, hash);
  const uint64_t charge = Charge(key, value.size());
  if (charge > capacity_) {  // not kept; nor is the old value
    if (slot != EntryTable::kNil) {
      bytes_ -= ChargeOf(slot);
      table_.Remove(slot);
    }
    return;
  }
  if (slot != EntryTable::kNil) {
    Rewrite(slot, value);
    return;
  }
  EvictUntil(charge);
  table_.Add(key, hash, value, kList);
  bytes_ += charge;
}

bool LruPolicy::Update(std::string_view key, std::string_view value) {
  const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
  if (slot == EntryTable::kNil) return false;
  if (Charge(key, value.size()) > capacity_) {
    bytes_ -= ChargeOf(slot);
    table_.Remove(slot);
    return true;
  }
  Rewrite(slot, value);
  return true;
}

void LruPolicy::Erase(std::string_view key) {
  const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
  if (slot == EntryTable::kNil) return;
  bytes_ -= ChargeOf(slot);
  table_.Remove(slot);
}

PolicyStats LruPolicy::stats() const {
  PolicyStats s = stats_;
  s.bytes = bytes_;
  s.entries = table_.size();
  return s;
}

}  // namespace flatkv::engine::cache
