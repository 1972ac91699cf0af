// Moving a hash range between marks (shared/DESIGN.md, "Changing the
// ring"; issue 11): what the owner of a range exports and what a new mark
// checks before it registers.
//
// A new mark N takes over the hashes [pred(N), N - 1] (two ranges when N
// becomes the lowest or highest mark and the range wraps) from the mark that
// owns them now. Until the import of such a range is built, an instance
// with a new mark registers only if the current owner holds no key there
// (RegisterGate): registering over a range that holds keys would hide them.
//
// Thread safety: free functions on caller-owned data; the Store is
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "FlatKV.h"
#include "engine/status.h"
#include "engine/store.h"
#include "partition/ring.h"

namespace flatkv::server {

// Fills "page" with up to "limit" records of "store" whose hash lies in
// [lo, hi]: integer keys (hash = key) in key order by a range scan, then
// string keys (hash = Ring::HashString(key, hash_bound)) by a walk of every
// bucket. "cursor" is empty to start, else a page's cursor. A page does
// bounded work and may hold fewer records (even none) with done = false.
// A record failing its checksum fails the page (Corruption): a range must
// never move without one of its keys. InvalidArgument for a bad cursor.
Status ExportRange(const engine::Store& store, int64_t hash_bound, int64_t lo, int64_t hi,
                   const std::string& cursor, size_t limit, rpc::ExportPage* page);

// The hash ranges mark "mark" would take over if it joined "ring" (whose
// partitions do not include it), each with the index of its current owner
// in ring.partitions(). Empty if the ring has no marks or already has it.
std::vector<partition::HashRange> RangesTakenBy(const partition::Ring& ring, int64_t mark);

}  // namespace flatkv::server
