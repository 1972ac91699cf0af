// EntryTable: the storage under LruPolicy and ArcPolicy. One open-addressing
// hash table (linear probing, backward-shift deletion, no tombstones) whose
// slots hold the key inline, and up to kMaxLists intrusive doubly linked
// lists threaded through the slots by 32-bit slot indices (LRU's recency
// list; ARC's T1, T2, B1, B2). A hit is one probe sequence over contiguous
// 64-byte slots and one copy of the value: no node per entry, no second map.
//
//   Slot (64 bytes, one cache line)
//   +------+------+------+------+---------+-----------+------+-----+---------------+
//   | hash | data | prev | next | key_size| value_size| list | has | key (inline,  |
//   | u64  | ptr  | u32  | u32  | u32     | u32       | u8   | val | <= 30 bytes)  |
//   +------+------+------+------+---------+-----------+------+-----+---------------+
//   data -> [key bytes, only if key_size > kInlineKey][value bytes]   (one allocation)
//
// hash == 0 marks an empty slot (Hash() never returns 0). Every entry is on
// exactly one list; list heads are the most recent end. A ghost (ARC's B1,
// B2) keeps its key and value_size (so its charge) but not its value bytes.
//
// Slot indices are stable until the next Add() (which may grow the table)
// or Remove() (which shifts later entries of the probe run back into the
// hole and relinks their list neighbours); every other call keeps them.
//
// Thread safety: none; the policies' callers serialize.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flatkv::engine::cache {

class EntryTable {
 public:
  static constexpr uint32_t kNil = UINT32_MAX;
  static constexpr int kMaxLists = 4;
  static constexpr size_t kInlineKey = 30;
  static constexpr uint32_t kInitialSlots = 64;

  EntryTable();
  ~EntryTable();

  // The hash the table expects (XXH3, never 0). Callers compute it once and
  // pass it to Find() and Add(); tests may pass any nonzero value instead
  // to force collisions (a hash of 0 is taken as 1).
  static uint64_t Hash(std::string_view key);

  // The slot holding key, or kNil. Does not change recency.
  uint32_t Find(std::string_view key, uint64_t hash) const;
  // Adds key, which must be absent, at the head of "list" with "value".
  // May grow the table (invalidating slot indices). Returns its slot.
  uint32_t Add(std::string_view key, uint64_t hash, std::string_view value, int list);
  // Unlinks and frees the entry at "slot" and closes the hole by shifting
  // the rest of its probe run back (invalidating slot indices).
  void Remove(uint32_t slot);
  // Moves the entry to the head of list "to" (its own list or another).
  void MoveToFront(uint32_t slot, int to);
  // Replaces the value (a ghost gets one back).
  void SetValue(uint32_t slot, std::string_view value);
  // Frees the value bytes but keeps value_size: the entry becomes a ghost.
  void DropValue(uint32_t slot);

  std::string_view key(uint32_t slot) const;
  std::string_view value(uint32_t slot) const;  // empty for a ghost
  uint32_t value_size(uint32_t slot) const { return slots_[slot].value_size; }
  bool has_value(uint32_t slot) const { return slots_[slot].has_value != 0; }
  int list(uint32_t slot) const { return slots_[slot].list; }
  uint32_t head(int list) const { return lists_[list].head; }  // most recent, or kNil
  uint32_t tail(int list) const { return lists_[list].tail; }  // least recent, or kNil
  uint32_t next(uint32_t slot) const { return slots_[slot].next; }  // toward the tail
  uint64_t list_size(int list) const { return lists_[list].count; }
  uint64_t size() const { return size_; }
  uint32_t capacity() const { return mask_ + 1; }

  // Checks every structural invariant (each entry reachable from its home
  // slot with no empty slot between, list links symmetric, heads and tails
  // right, counts right, every entry on exactly one list). Returns "" or a
  // description of the first violation. O(capacity); for tests.
  std::string TEST_CheckInvariants() const;
  // The home slot of an entry (hash & mask), for tests that force wraparound.
  uint32_t TEST_Home(uint32_t slot) const { return static_cast<uint32_t>(slots_[slot].hash) & mask_; }

  EntryTable(const EntryTable&) = delete;
  EntryTable& operator=(const EntryTable&) = delete;

 private:
  struct alignas(64) Slot {
    uint64_t hash;         // 0: empty
    char* data;            // [spilled key][value]; null when both are empty/inline
    uint32_t prev;         // toward the head, or kNil
    uint32_t next;         // toward the tail, or kNil
    uint32_t key_size;
    uint32_t value_size;   // kept by a ghost: its charge
    uint8_t list;
    uint8_t has_value;
    char key[kInlineKey];  // the key if key_size <= kInlineKey
  };
  static_assert(sizeof(Slot) == 64, "a slot is one cache line");
  // The slot array: new[] while small, from 2 MiB an anonymous mapping
  // with MADV_HUGEPAGE (THP is often "madvise" only). A cold key's probe is
  // a cache miss anyway; on 4 KiB pages a table of a million slots spans
  // 16k pages and the probe was a TLB miss as well.
  class SlotArray {
   public:
    explicit SlotArray(uint32_t slots);  // zeroed
    ~SlotArray();
    Slot& operator[](uint32_t i) { return p_[i]; }
    const Slot& operator[](uint32_t i) const { return p_[i]; }
    const Slot* get() const { return p_; }
    void swap(SlotArray& other);
    SlotArray(const SlotArray&) = delete;
    SlotArray& operator=(const SlotArray&) = delete;

   private:
    Slot* p_;
    size_t bytes_;
    bool mapped_ = false;
  };
  struct ListEnds {
    uint32_t head = kNil;
    uint32_t tail = kNil;
    uint64_t count = 0;
  };

  static bool Spilled(const Slot& s) { return s.key_size > kInlineKey; }
  static const char* KeyBytes(const Slot& s) { return Spilled(s) ? s.data : s.key; }
  // Puts key and value bytes into s (allocating data if needed); frees nothing.
  static void Fill(Slot* s, std::string_view key, std::string_view value);
  // The first empty slot of hash's probe run in slots (mask = size - 1).
  static uint32_t EmptySlotFor(const Slot* slots, uint32_t mask, uint64_t hash);
  void PushFront(uint32_t slot, int list);
  void Unlink(uint32_t slot);
  // After an entry moved into "slot", points its neighbours (or its list's
  // ends) at its new place.
  void Relink(uint32_t slot);
  void Grow();

  SlotArray slots_;
  uint32_t mask_;
  uint64_t size_ = 0;
  ListEnds lists_[kMaxLists];
};

}  // namespace flatkv::engine::cache
