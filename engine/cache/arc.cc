// ARC as in the paper's Figure 4, with every count taken in bytes: |T1| is
// bytes_[kT1] and so on, c is the capacity, and a ghost hit moves p by the
// entry's charge scaled by the ratio of the ghost lists (at least one charge).
//
// Slot indices of table_ die at every Add() and Remove() (growth, backward
// shift), so each path below finds its slot, does what keeps slots in place
// (MoveTo, Replace, value changes), and only then removes or adds.
#include "engine/cache/arc.h"

#include <algorithm>

namespace flatkv::engine::cache {

void ArcPolicy::MoveTo(uint32_t slot, ListId to) {
  const uint64_t charge = ChargeOf(slot);
  bytes_[table_.list(slot)] -= charge;
  bytes_[to] += charge;
  table_.MoveToFront(slot, to);
}

void ArcPolicy::EraseSlot(uint32_t slot) {
  bytes_[table_.list(slot)] -= ChargeOf(slot);
  table_.Remove(slot);
}

void ArcPolicy::DropLru(ListId list) { EraseSlot(table_.tail(list)); }

void ArcPolicy::Replace(bool hit_in_b2) {
  const bool t1_empty = table_.list_size(kT1) == 0;
  const bool from_t1 = !t1_empty && (bytes_[kT1] > p_ || (hit_in_b2 && bytes_[kT1] >= p_) ||
                                     table_.list_size(kT2) == 0);
  const ListId from = from_t1 ? kT1 : kT2;
  if (table_.list_size(from) == 0) return;
  const uint32_t victim = table_.tail(from);
  table_.DropValue(victim);  // a ghost keeps its key and size only
  MoveTo(victim, from_t1 ? kB1 : kB2);
  ++stats_.evictions;
}

void ArcPolicy::MakeRoom(uint64_t charge, bool hit_in_b2) {
  while (bytes_[kT1] + bytes_[kT2] + charge > capacity_ &&
         table_.list_size(kT1) + table_.list_size(kT2) > 0) {
    Replace(hit_in_b2);
  }
}

bool ArcPolicy::Lookup(std::string_view key, std::string* value) {
  const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
  if (slot == EntryTable::kNil || !Resident(slot)) {
    ++stats_.misses;
    return false;  // the caller fetches the value and calls Insert()
  }
  ++stats_.hits;
  MoveTo(slot, kT2);  // seen again: frequency
  const std::string_view v = table_.value(slot);
  value->assign(v.data(), v.size());
  return true;
}

void ArcPolicy::Insert(std::string_view key, std::string_view value) {
  const uint64_t hash = EntryTable::Hash(key);
  const uint64_t charge = Charge(key, value.size());
  const uint32_t slot = table_.Find(key, hash);
  if (slot != EntryTable::kNil && Resident(slot)) {
    Rewrite(slot, value);
    return;
  }
  if (charge > capacity_) {
    if (slot != EntryTable::kNil) EraseSlot(slot);
    return;
  }
  if (slot != EntryTable::kNil) {
    // A ghost hit: adapt p, then bring the key back into T2.
    const bool in_b2 = table_.list(slot) == kB2;
    if (!in_b2) {
      const uint64_t ratio = bytes_[kB1] > 0 ? charge * bytes_[kB2] / bytes_[kB1] : 0;
      p_ = std::min(capacity_, p_ + std::max(charge, ratio));
    } else {
      const uint64_t ratio = bytes_[kB2] > 0 ? charge * bytes_[kB1] / bytes_[kB2] : 0;
      const uint64_t delta = std::max(charge, ratio);
      p_ = p_ > delta ? p_ - delta : 0;
    }
    EraseSlot(slot);
    MakeRoom(charge, in_b2);
    table_.Add(key, hash, value, kT2);
    bytes_[kT2] += charge;
    return;
  }
  // A new key. Keep L1 = T1 + B1 within c and L1 + L2 within 2c.
  while (bytes_[kT1] + bytes_[kB1] + charge > capacity_ && table_.list_size(kB1) > 0) DropLru(kB1);
  while (bytes_[kT1] + charge > capacity_ && table_.list_size(kT1) > 0) {
    DropLru(kT1);
    ++stats_.evictions;
  }
  while (bytes_[kT1] + bytes_[kT2] + bytes_[kB1] + bytes_[kB2] + charge > 2 * capacity_ &&
         table_.list_size(kB2) > 0) {
    DropLru(kB2);
  }
  MakeRoom(charge, false);
  table_.Add(key, hash, value, kT1);
  bytes_[kT1] += charge;
}

void ArcPolicy::Rewrite(uint32_t slot, std::string_view value) {
  bytes_[table_.list(slot)] -= ChargeOf(slot);
  table_.SetValue(slot, value);
  const uint64_t charge = ChargeOf(slot);
  bytes_[table_.list(slot)] += charge;
  MoveTo(slot, kT2);
  MakeRoom(0, false);  // moves entries to ghost lists only: slot stays valid
  if (charge > capacity_) EraseSlot(slot);
}

bool ArcPolicy::Update(std::string_view key, std::string_view value) {
  const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
  if (slot == EntryTable::kNil || !Resident(slot)) return false;
  Rewrite(slot, value);
  return true;
}

void ArcPolicy::Erase(std::string_view key) {
  const uint32_t slot = table_.Find(key, EntryTable::Hash(key));
  if (slot != EntryTable::kNil) EraseSlot(slot);
}

PolicyStats ArcPolicy::stats() const {
  PolicyStats s = stats_;
  s.bytes = bytes_[kT1] + bytes_[kT2];
  s.entries = table_.list_size(kT1) + table_.list_size(kT2);
  return s;
}

}  // namespace flatkv::engine::cache
