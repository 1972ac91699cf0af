// ARC as in the paper's Figure 4, with every count taken in bytes: |T1| is
// bytes_[kT1] and so on, c is the capacity, and a ghost hit moves p by the
// entry's charge scaled by the ratio of the ghost lists (at least one charge).
#include "engine/cache/arc.h"

#include <algorithm>

namespace flatkv::engine::cache {

void ArcPolicy::MoveTo(Loc* loc, ListId to) {
  bytes_[loc->list] -= loc->it->charge;
  bytes_[to] += loc->it->charge;
  lists_[to].splice(lists_[to].begin(), lists_[loc->list], loc->it);
  loc->list = to;
}

void ArcPolicy::DropLru(ListId list) {
  Entry& victim = lists_[list].back();
  bytes_[list] -= victim.charge;
  map_.erase(victim.key);
  lists_[list].pop_back();
}

void ArcPolicy::Replace(bool hit_in_b2) {
  const bool from_t1 = !lists_[kT1].empty() &&
                       (bytes_[kT1] > p_ || (hit_in_b2 && bytes_[kT1] >= p_) ||
                        lists_[kT2].empty());
  const ListId from = from_t1 ? kT1 : kT2;
  if (lists_[from].empty()) return;
  Entry& victim = lists_[from].back();
  victim.value.clear();
  victim.value.shrink_to_fit();  // a ghost keeps its key and size only
  Loc& loc = map_.at(victim.key);
  MoveTo(&loc, from_t1 ? kB1 : kB2);
  ++stats_.evictions;
}

void ArcPolicy::MakeRoom(uint64_t charge, bool hit_in_b2) {
  while (bytes_[kT1] + bytes_[kT2] + charge > capacity_ &&
         !(lists_[kT1].empty() && lists_[kT2].empty())) {
    Replace(hit_in_b2);
  }
}

bool ArcPolicy::Lookup(std::string_view key, std::string* value) {
  auto it = map_.find(key);
  if (it == map_.end() || it->second.list == kB1 || it->second.list == kB2) {
    ++stats_.misses;
    return false;  // the caller fetches the value and calls Insert()
  }
  ++stats_.hits;
  MoveTo(&it->second, kT2);  // seen again: frequency
  *value = it->second.it->value;
  return true;
}

void ArcPolicy::Insert(std::string_view key, std::string_view value) {
  const uint64_t charge = Charge(key, value.size());
  auto it = map_.find(key);
  if (it != map_.end() && (it->second.list == kT1 || it->second.list == kT2)) {
    Rewrite(&it->second, key, value);
    return;
  }
  if (charge > capacity_) {
    if (it != map_.end()) Erase(key);
    return;
  }
  if (it != map_.end()) {
    // A ghost hit: adapt p, then bring the key back into T2.
    Loc& loc = it->second;
    const bool in_b2 = loc.list == kB2;
    if (!in_b2) {
      const uint64_t ratio = bytes_[kB1] > 0 ? charge * bytes_[kB2] / bytes_[kB1] : 0;
      p_ = std::min(capacity_, p_ + std::max(charge, ratio));
    } else {
      const uint64_t ratio = bytes_[kB2] > 0 ? charge * bytes_[kB1] / bytes_[kB2] : 0;
      const uint64_t delta = std::max(charge, ratio);
      p_ = p_ > delta ? p_ - delta : 0;
    }
    bytes_[loc.list] -= loc.it->charge;
    lists_[loc.list].erase(loc.it);
    map_.erase(it);
    MakeRoom(charge, in_b2);
    lists_[kT2].push_front(Entry{std::string(key), std::string(value), charge});
    bytes_[kT2] += charge;
    map_.emplace(lists_[kT2].front().key, Loc{kT2, lists_[kT2].begin()});
    return;
  }
  // A new key. Keep L1 = T1 + B1 within c and L1 + L2 within 2c.
  while (bytes_[kT1] + bytes_[kB1] + charge > capacity_ && !lists_[kB1].empty()) DropLru(kB1);
  while (bytes_[kT1] + charge > capacity_ && !lists_[kT1].empty()) {
    DropLru(kT1);
    ++stats_.evictions;
  }
  while (bytes_[kT1] + bytes_[kT2] + bytes_[kB1] + bytes_[kB2] + charge > 2 * capacity_ &&
         !lists_[kB2].empty()) {
    DropLru(kB2);
  }
  MakeRoom(charge, false);
  lists_[kT1].push_front(Entry{std::string(key), std::string(value), charge});
  bytes_[kT1] += charge;
  map_.emplace(lists_[kT1].front().key, Loc{kT1, lists_[kT1].begin()});
}

void ArcPolicy::Rewrite(Loc* loc, std::string_view key, std::string_view value) {
  const uint64_t charge = Charge(key, value.size());
  bytes_[loc->list] -= loc->it->charge;
  loc->it->value.assign(value.data(), value.size());
  loc->it->charge = charge;
  bytes_[loc->list] += charge;
  MoveTo(loc, kT2);
  MakeRoom(0, false);
  if (charge > capacity_) Erase(key);
}

bool ArcPolicy::Update(std::string_view key, std::string_view value) {
  auto it = map_.find(key);
  if (it == map_.end() || it->second.list == kB1 || it->second.list == kB2) return false;
  Rewrite(&it->second, key, value);
  return true;
}

void ArcPolicy::Erase(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  Loc loc = it->second;
  bytes_[loc.list] -= loc.it->charge;
  map_.erase(it);
  lists_[loc.list].erase(loc.it);
}

PolicyStats ArcPolicy::stats() const {
  PolicyStats s = stats_;
  s.bytes = bytes_[kT1] + bytes_[kT2];
  s.entries = lists_[kT1].size() + lists_[kT2].size();
  return s;
}

}  // namespace flatkv::engine::cache
