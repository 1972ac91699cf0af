// Moving a hash range between marks (shared/DESIGN.md, "Changing the
// ring"): what the owner of a range exports (peerExport, peerDrop)
// for a ring change (partition/change.h says which ranges move and when).
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
#include "server/member/replicator.h"

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

// Removes up to "limit" of the records of "store" whose hash lies in [lo,
// hi] through "replicator"'s chain (a ring change's own writes, not checked
// as a moving range's: the drop at a source, a remove's wipe at the mark
// inheriting the range) and adds how many to *dropped (0 added: none left).
// The caller flushed "store"'s cache.
Status DropRange(const engine::Store& store, Replicator* replicator, int64_t hash_bound,
                 int64_t lo, int64_t hi, int64_t limit, int64_t* dropped);

// The ops of a ring change's import through a chain: a put of each pair, a
// remove of each key in "removed"/"sremoved"; "hashes" gets each op's hash.
// Adds the key and value bytes to *bytes. Moves the values out.
void ImportOps(std::vector<rpc::KvPair>* pairs, std::vector<rpc::StringKvPair>* spairs,
               const std::vector<int64_t>& removed, const std::vector<std::string>& sremoved,
               int64_t hash_bound, std::vector<rpc::ChainOp>* ops, std::vector<uint64_t>* hashes,
               uint64_t* bytes);

}  // namespace flatkv::server
