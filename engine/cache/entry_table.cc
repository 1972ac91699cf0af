// Implementation notes
//
// Linear probing keeps inserts from moving anything: an entry lands in the
// first empty slot of its probe run. Only Remove() moves entries (Knuth's
// Algorithm R, "backward shift"): after emptying slot `hole`, it walks the
// run; an entry at j whose home h lies cyclically at or before the hole
// (hole in [h, j)) may move there, and the hole moves to j. Each moved entry
// is relinked: its list neighbours (or its list's head/tail) held its old
// index. No tombstones, so probe runs never fill with dead slots.
//
// The table grows to twice its slots when an Add would pass 3/4 load. Growth
// re-adds each list's entries from tail to head, each at the head of the same
// list of the new array: order is kept and no old-to-new index map is needed.
#include "engine/cache/entry_table.h"

#include <xxhash.h>

#include <sys/mman.h>

#include <cassert>
#include <cstring>
#include <utility>

namespace flatkv::engine::cache {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Equal bytes; keys of 8..16 bytes (an integer key is 9) with two pairs of
// overlapping 8-byte loads instead of a call to memcmp.
bool BytesEqual(const char* a, const char* b, size_t n) {
  if (n >= 8 && n <= 16) {
    uint64_t a0, b0, a1, b1;
    std::memcpy(&a0, a, 8);
    std::memcpy(&b0, b, 8);
    std::memcpy(&a1, a + n - 8, 8);
    std::memcpy(&b1, b + n - 8, 8);
    return a0 == b0 && a1 == b1;
  }
  return std::memcmp(a, b, n) == 0;
}

}  // namespace

EntryTable::SlotArray::SlotArray(uint32_t slots) : bytes_(size_t{slots} * sizeof(Slot)) {
  if (bytes_ >= kHugePage) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      static_cast<void>(madvise(p, bytes_, MADV_HUGEPAGE));  // a hint: fine if refused
      p_ = static_cast<Slot*>(p);  // anonymous pages are zero
      mapped_ = true;
      return;
    }
  }
  p_ = new Slot[slots]();
}

EntryTable::SlotArray::~SlotArray() {
  if (mapped_) {
    munmap(p_, bytes_);
  } else {
    delete[] p_;
  }
}

void EntryTable::SlotArray::swap(SlotArray& other) {
  std::swap(p_, other.p_);
  std::swap(bytes_, other.bytes_);
  std::swap(mapped_, other.mapped_);
}

EntryTable::EntryTable() : slots_(kInitialSlots), mask_(kInitialSlots - 1) {}

EntryTable::~EntryTable() {
  for (uint32_t i = 0; i <= mask_; ++i) {
    if (slots_[i].hash != 0) delete[] slots_[i].data;
  }
}

uint64_t EntryTable::Hash(std::string_view key) {
  const uint64_t h = XXH3_64bits(key.data(), key.size());
  return h == 0 ? 1 : h;
}

uint32_t EntryTable::Find(std::string_view key, uint64_t hash) const {
  if (hash == 0) hash = 1;
  for (uint32_t i = static_cast<uint32_t>(hash) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return kNil;
    if (s.hash == hash && s.key_size == key.size() &&
        BytesEqual(KeyBytes(s), key.data(), key.size())) {
      return i;
    }
  }
}

void EntryTable::Fill(Slot* s, std::string_view key, std::string_view value) {
  s->key_size = static_cast<uint32_t>(key.size());
  s->value_size = static_cast<uint32_t>(value.size());
  s->has_value = 1;
  const size_t spill = key.size() > kInlineKey ? key.size() : 0;
  if (spill == 0) std::memcpy(s->key, key.data(), key.size());
  s->data = spill + value.size() == 0 ? nullptr : new char[spill + value.size()];
  if (spill > 0) std::memcpy(s->data, key.data(), spill);
  if (!value.empty()) std::memcpy(s->data + spill, value.data(), value.size());
}

uint32_t EntryTable::EmptySlotFor(const Slot* slots, uint32_t mask, uint64_t hash) {
  uint32_t i = static_cast<uint32_t>(hash) & mask;
  while (slots[i].hash != 0) i = (i + 1) & mask;
  return i;
}

uint32_t EntryTable::Add(std::string_view key, uint64_t hash, std::string_view value, int list) {
  if (hash == 0) hash = 1;
  assert(Find(key, hash) == kNil);
  if ((size_ + 1) * 4 > (uint64_t{mask_} + 1) * 3) Grow();
  const uint32_t i = EmptySlotFor(slots_.get(), mask_, hash);
  Slot& s = slots_[i];
  s.hash = hash;
  Fill(&s, key, value);
  ++size_;
  PushFront(i, list);
  return i;
}

void EntryTable::Remove(uint32_t slot) {
  Unlink(slot);
  delete[] slots_[slot].data;
  --size_;
  uint32_t hole = slot;
  for (uint32_t j = (slot + 1) & mask_; slots_[j].hash != 0; j = (j + 1) & mask_) {
    const uint32_t home = static_cast<uint32_t>(slots_[j].hash) & mask_;
    // The entry may fill the hole iff the hole lies in [home, j), cyclically.
    if (((j - hole) & mask_) <= ((j - home) & mask_)) {
      slots_[hole] = slots_[j];
      Relink(hole);
      hole = j;
    }
  }
  slots_[hole] = Slot{};
}

void EntryTable::MoveToFront(uint32_t slot, int to) {
  const Slot& s = slots_[slot];
  // A hit relinks two neighbours that are often cold and then copies the
  // value: start all three misses now, so they overlap instead of queueing.
  if (s.data != nullptr) __builtin_prefetch(s.data);
  if (lists_[to].head == slot) return;
  if (s.prev != kNil) __builtin_prefetch(&slots_[s.prev], 1);
  if (s.next != kNil) __builtin_prefetch(&slots_[s.next], 1);
  Unlink(slot);
  PushFront(slot, to);
}

void EntryTable::SetValue(uint32_t slot, std::string_view value) {
  Slot& s = slots_[slot];
  const size_t spill = Spilled(s) ? s.key_size : 0;
  if (s.has_value && s.value_size == value.size()) {  // same size: in place
    if (!value.empty()) std::memcpy(s.data + spill, value.data(), value.size());
    return;
  }
  char* data = spill + value.size() == 0 ? nullptr : new char[spill + value.size()];
  if (spill > 0) std::memcpy(data, s.data, spill);
  if (!value.empty()) std::memcpy(data + spill, value.data(), value.size());
  delete[] s.data;
  s.data = data;
  s.value_size = static_cast<uint32_t>(value.size());
  s.has_value = 1;
}

void EntryTable::DropValue(uint32_t slot) {
  Slot& s = slots_[slot];
  if (!s.has_value) return;
  char* old = s.data;
  if (Spilled(s)) {
    s.data = new char[s.key_size];
    std::memcpy(s.data, old, s.key_size);
  } else {
    s.data = nullptr;
  }
  delete[] old;
  s.has_value = 0;
}

std::string_view EntryTable::key(uint32_t slot) const {
  const Slot& s = slots_[slot];
  return std::string_view(KeyBytes(s), s.key_size);
}

std::string_view EntryTable::value(uint32_t slot) const {
  const Slot& s = slots_[slot];
  if (!s.has_value || s.value_size == 0) return std::string_view();
  return std::string_view(s.data + (Spilled(s) ? s.key_size : 0), s.value_size);
}

void EntryTable::PushFront(uint32_t slot, int list) {
  Slot& s = slots_[slot];
  ListEnds& l = lists_[list];
  s.list = static_cast<uint8_t>(list);
  s.prev = kNil;
  s.next = l.head;
  if (l.head != kNil) {
    slots_[l.head].prev = slot;
  } else {
    l.tail = slot;
  }
  l.head = slot;
  ++l.count;
}

void EntryTable::Unlink(uint32_t slot) {
  Slot& s = slots_[slot];
  ListEnds& l = lists_[s.list];
  if (s.prev != kNil) {
    slots_[s.prev].next = s.next;
  } else {
    l.head = s.next;
  }
  if (s.next != kNil) {
    slots_[s.next].prev = s.prev;
  } else {
    l.tail = s.prev;
  }
  s.prev = s.next = kNil;
  --l.count;
}

void EntryTable::Relink(uint32_t slot) {
  const Slot& s = slots_[slot];
  ListEnds& l = lists_[s.list];
  if (s.prev != kNil) {
    slots_[s.prev].next = slot;
  } else {
    l.head = slot;
  }
  if (s.next != kNil) {
    slots_[s.next].prev = slot;
  } else {
    l.tail = slot;
  }
}

void EntryTable::Grow() {
  const uint32_t new_slots = (mask_ + 1) * 2;
  SlotArray old(new_slots);
  old.swap(slots_);
  mask_ = new_slots - 1;
  ListEnds old_lists[kMaxLists];
  for (int l = 0; l < kMaxLists; ++l) {
    old_lists[l] = lists_[l];
    lists_[l] = ListEnds();
  }
  for (int l = 0; l < kMaxLists; ++l) {
    for (uint32_t i = old_lists[l].tail; i != kNil; i = old[i].prev) {  // tail first
      const uint32_t j = EmptySlotFor(slots_.get(), mask_, old[i].hash);
      slots_[j] = old[i];
      PushFront(j, l);
    }
  }
}

std::string EntryTable::TEST_CheckInvariants() const {
  uint64_t occupied = 0;
  for (uint32_t i = 0; i <= mask_; ++i) {
    const Slot& s = slots_[i];
    if (s.hash == 0) continue;
    ++occupied;
    // No empty slot between the entry's home and the entry.
    for (uint32_t k = static_cast<uint32_t>(s.hash) & mask_; k != i; k = (k + 1) & mask_) {
      if (slots_[k].hash == 0) return "slot " + std::to_string(i) + " unreachable from its home";
    }
    if (Find(key(i), s.hash) != i) return "slot " + std::to_string(i) + " not found by its key";
    if (s.list >= kMaxLists) return "slot " + std::to_string(i) + " has a bad list";
  }
  if (occupied != size_) return "size " + std::to_string(size_) + " but " + std::to_string(occupied) + " occupied";
  uint64_t linked = 0;
  for (int l = 0; l < kMaxLists; ++l) {
    uint64_t n = 0;
    uint32_t prev = kNil;
    for (uint32_t i = lists_[l].head; i != kNil; prev = i, i = slots_[i].next) {
      if (i > mask_ || slots_[i].hash == 0) return "list " + std::to_string(l) + " reaches an empty slot";
      if (slots_[i].list != l) return "slot " + std::to_string(i) + " on list " + std::to_string(l) + " says another";
      if (slots_[i].prev != prev) return "slot " + std::to_string(i) + " has a wrong prev link";
      if (++n > size_) return "list " + std::to_string(l) + " has a cycle";
    }
    if (lists_[l].tail != prev) return "list " + std::to_string(l) + " has a wrong tail";
    if (n != lists_[l].count) return "list " + std::to_string(l) + " count is wrong";
    linked += n;
  }
  if (linked != size_) return "lists hold " + std::to_string(linked) + " of " + std::to_string(size_);
  return "";
}

}  // namespace flatkv::engine::cache
