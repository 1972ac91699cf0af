#include "server/member/migration.h"

#include <algorithm>
#include <cstring>

namespace flatkv::server {
namespace {

// Cursor: 'i' | next integer key (8 bytes, little-endian), or 's' | the
// string-key scan's cursor.
std::string IntCursor(int64_t next) {
  std::string c(1 + sizeof(next), 'i');
  std::memcpy(c.data() + 1, &next, sizeof(next));
  return c;
}

// Buckets read per page beyond "limit" matches: a range holding few string
// keys must not make one call walk every bucket.
constexpr size_t kStringWalkFactor = 8;

}  // namespace

Status ExportRange(const engine::Store& store, int64_t hash_bound, int64_t lo, int64_t hi,
                   const std::string& cursor, size_t limit, rpc::ExportPage* page) {
  page->pairs.clear();
  page->spairs.clear();
  page->done = false;
  page->cursor.clear();
  if (limit == 0 || lo > hi) return Status::InvalidArgument("export: empty range or zero limit");
  const int64_t key_lo = std::max(lo, store.options().key_min);
  const int64_t key_hi = std::min(hi, store.options().key_max - 1);
  std::string strings_cursor;
  bool in_strings = true;
  int64_t from = key_lo;
  if (cursor.empty()) {
    in_strings = key_lo > key_hi;
  } else if (cursor[0] == 'i' && cursor.size() == 1 + sizeof(int64_t)) {
    std::memcpy(&from, cursor.data() + 1, sizeof(from));
    in_strings = false;
  } else if (cursor[0] == 's') {
    strings_cursor = cursor.substr(1);
  } else {
    return Status::InvalidArgument("export: not a cursor this server gave");
  }
  if (!in_strings) {
    if (from < key_lo || from > key_hi) return Status::InvalidArgument("export: cursor out of range");
    std::vector<engine::KeyValue> out;
    std::vector<int64_t> bad;
    int64_t next = from;
    bool done = false;
    FLATKV_RETURN_IF_ERROR(store.Scan(from, false, limit, key_lo, key_hi, &out, &next, &done, &bad));
    if (!bad.empty()) {
      return Status::Corruption("export: key " + std::to_string(bad.front()) +
                                " fails its checksum (flatkv admin verify repairs it)");
    }
    for (engine::KeyValue& kv : out) {
      rpc::KvPair p;
      p.key = kv.key;
      p.value = std::move(kv.value);
      page->pairs.push_back(std::move(p));
    }
    page->cursor = done ? "s" : IntCursor(next);
    return Status::OK();
  }
  // String keys: every bucket, filtered by hash.
  size_t walked = 0;
  bool done = false;
  while (!done && page->spairs.size() < limit && walked < kStringWalkFactor * limit) {
    std::vector<engine::StringKeyValue> out;
    std::string next;
    // At most what the page still has room for: each entry scanned may match.
    std::vector<int64_t> bad;  // an export without a bucket's keys would hide them
    FLATKV_RETURN_IF_ERROR(
        store.SScan(strings_cursor, limit - page->spairs.size(), &out, &next, &done, &bad));
    if (!bad.empty()) {
      return Status::Corruption("export: string-key bucket " + std::to_string(bad.front()) +
                                " fails its checksum (flatkv admin verify repairs it)");
    }
    walked += out.size() + 1;
    for (engine::StringKeyValue& kv : out) {
      const int64_t h = partition::Ring::HashString(kv.key, hash_bound);
      if (h < lo || h > hi) continue;
      rpc::StringKvPair p;
      p.key = std::move(kv.key);
      p.value = std::move(kv.value);
      page->spairs.push_back(std::move(p));
    }
    strings_cursor = std::move(next);
  }
  page->done = done;
  if (!done) page->cursor = "s" + strings_cursor;
  return Status::OK();
}

Status DropRange(const engine::Store& store, Replicator* replicator, int64_t hash_bound,
                 int64_t lo, int64_t hi, int64_t limit, int64_t* dropped) {
  std::string cursor;
  int64_t n = 0;
  for (bool done = false; !done && n < limit;) {
    rpc::ExportPage page;
    const size_t want = static_cast<size_t>(std::min<int64_t>(512, limit - n));
    FLATKV_RETURN_IF_ERROR(ExportRange(store, hash_bound, lo, hi, cursor, want, &page));
    std::vector<int64_t> keys;
    std::vector<std::string> skeys;
    for (const rpc::KvPair& p : page.pairs) keys.push_back(p.key);
    for (rpc::StringKvPair& p : page.spairs) skeys.push_back(std::move(p.key));
    std::vector<rpc::ChainOp> ops;
    std::vector<uint64_t> hashes;
    uint64_t bytes = 0;
    ImportOps(nullptr, nullptr, keys, skeys, hash_bound, &ops, &hashes, &bytes);
    if (!ops.empty()) {
      n += static_cast<int64_t>(ops.size());
      FLATKV_RETURN_IF_ERROR(
          replicator->Write(std::move(ops), std::move(hashes), nullptr, /*import=*/true));
    }
    done = page.done;
    cursor = page.cursor;
  }
  *dropped += n;
  return Status::OK();
}

void ImportOps(std::vector<rpc::KvPair>* pairs, std::vector<rpc::StringKvPair>* spairs,
               const std::vector<int64_t>& removed, const std::vector<std::string>& sremoved,
               int64_t hash_bound, std::vector<rpc::ChainOp>* ops, std::vector<uint64_t>* hashes,
               uint64_t* bytes) {
  auto add = [&](rpc::ChainOpKind::type kind, uint64_t hash, rpc::ChainOp op) {
    op.kind = kind;
    ops->push_back(std::move(op));
    hashes->push_back(hash);
  };
  for (size_t i = 0; pairs != nullptr && i < pairs->size(); ++i) {
    rpc::KvPair& kv = (*pairs)[i];
    rpc::ChainOp op;
    op.__set_key(kv.key);
    *bytes += kv.value.size() + 8;
    op.__set_value(std::move(kv.value));
    add(rpc::ChainOpKind::PUT, static_cast<uint64_t>(kv.key), std::move(op));
  }
  for (size_t i = 0; spairs != nullptr && i < spairs->size(); ++i) {
    rpc::StringKvPair& kv = (*spairs)[i];
    rpc::ChainOp op;
    const auto hash = static_cast<uint64_t>(partition::Ring::HashString(kv.key, hash_bound));
    *bytes += kv.key.size() + kv.value.size();
    op.__set_skey(std::move(kv.key));
    op.__set_value(std::move(kv.value));
    add(rpc::ChainOpKind::SPUT, hash, std::move(op));
  }
  for (int64_t k : removed) {
    rpc::ChainOp op;
    op.__set_key(k);
    add(rpc::ChainOpKind::REMOVE, static_cast<uint64_t>(k), std::move(op));
  }
  for (const std::string& k : sremoved) {
    rpc::ChainOp op;
    op.__set_skey(k);
    add(rpc::ChainOpKind::SREMOVE,
        static_cast<uint64_t>(partition::Ring::HashString(k, hash_bound)), std::move(op));
  }
}

}  // namespace flatkv::server
