// Router: the partition manager's decisions (shared/DESIGN.md, "Requests"),
// as pure functions of a Ring: which partition a key goes to and whether that
// is this instance's own mark, which member of the chain takes a read or a
// write, how a batch splits by owner, how a ring-wide scan walks the key
// space, and the cursor of a ring-wide insertion-order scan. No I/O: the
// server (server/member/cluster.*) does the calls and the ZooKeeper side
// (registry.*) supplies the rings.
//
// Thread safety: Router is immutable after construction; every method is
// const and may run concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "partition/ring.h"

namespace flatkv::partition {

// A batch's positions that one partition owns.
struct OwnerGroup {
  size_t partition = 0;           // index in Ring::partitions()
  std::vector<size_t> positions;  // indexes into the batch, ascending
};

// One step of a ring-wide key-order scan: the hash range [lo, hi] to ask
// partition "partition" for, starting at "from".
struct ScanStep {
  size_t partition = 0;
  int64_t from = 0;
  int64_t lo = 0;
  int64_t hi = 0;
};

class Router {
 public:
  explicit Router(int64_t self_mark) : self_mark_(self_mark) {}

  int64_t self_mark() const { return self_mark_; }

  // True if this instance's mark owns "hash" in "ring".
  bool IsLocal(const Ring& ring, int64_t hash) const {
    return ring.Owner(hash).mark == self_mark_;
  }

  // The member a call goes to: writes to the head; reads to the tail under
  // sync replication; under async to "self" (host:port) when it is in the
  // chain (any member serves reads: one that forwarded its own reads would
  // tie up its threads waiting on members that forward theirs), else to
  // member spread % size. nullptr when the chain is empty (no member serves
  // the mark).
  static const Member* Target(const Partition& partition, bool write,
                              std::string_view replication, uint64_t spread,
                              std::string_view self = {});

  // Groups a batch's hashes by owner, partitions in ring order; positions
  // keep the request order, so results can be put back in place.
  static std::vector<OwnerGroup> SplitByOwner(const Ring& ring,
                                              const std::vector<int64_t>& hashes);

  // The step that serves a key-order scan from "from": the part of the
  // owning range at or after "from" (forward) or at or before it (reverse).
  static ScanStep Step(const Ring& ring, int64_t from, bool reverse);
  // Where the scan goes on once "step" is exhausted: false when it was the
  // last range in that direction (the scan is done), else *next is the first
  // key of the following range.
  static bool After(const ScanStep& step, bool reverse, int64_t* next);

  // The cursor of a ring-wide insertion-order scan: the partition's mark and
  // that partition's own (standalone) cursor. An empty cursor starts at the
  // first mark.
  static std::string EncodeLogCursor(int64_t mark, std::string_view inner);
  // InvalidArgument for a cursor that is not empty and not EncodeLogCursor's.
  static Status DecodeLogCursor(std::string_view cursor, int64_t* mark, std::string* inner);
  // The partition a ring-wide insertion-order scan continues with: the one
  // of "mark", or (if that mark left the ring) the next greater one; false
  // when none is left.
  static bool LogPartition(const Ring& ring, int64_t mark, size_t* partition);

 private:
  const int64_t self_mark_;
};

}  // namespace flatkv::partition
