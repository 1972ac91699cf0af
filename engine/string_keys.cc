#include "engine/string_keys.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <optional>

namespace flatkv::engine {
namespace {

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(std::string_view* in, uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 63 && !in->empty(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    result |= uint64_t{byte & 0x7fu} << shift;
    if (byte < 0x80) {
      *v = result;
      return true;
    }
  }
  return false;
}

bool GetSized(std::string_view* in, std::string_view* out) {
  uint64_t n;
  if (!GetVarint(in, &n) || n > in->size()) return false;
  *out = in->substr(0, n);
  in->remove_prefix(n);
  return true;
}

template <typename Fn>
bool WalkBucket(std::string_view bucket, Fn&& fn) {
  while (!bucket.empty()) {
    const auto kind = static_cast<BucketEntryKind>(bucket.front());
    bucket.remove_prefix(1);
    std::string_view key, value;
    if (kind == BucketEntryKind::kDamaged) {
      fn(kind, key, value);
      continue;
    }
    if (!GetSized(&bucket, &key)) return false;
    if (kind == BucketEntryKind::kPut) {
      if (!GetSized(&bucket, &value)) return false;
    } else if (kind != BucketEntryKind::kRemove) {
      return false;
    }
    fn(kind, key, value);
  }
  return true;
}

}  // namespace

uint64_t HashStringKey(std::string_view key) { return XXH64(key.data(), key.size(), 0); }

void AppendBucketPut(std::string* bucket, std::string_view key, std::string_view value) {
  bucket->push_back(static_cast<char>(BucketEntryKind::kPut));
  PutVarint(bucket, key.size());
  bucket->append(key);
  PutVarint(bucket, value.size());
  bucket->append(value);
}

void AppendBucketRemove(std::string* bucket, std::string_view key) {
  bucket->push_back(static_cast<char>(BucketEntryKind::kRemove));
  PutVarint(bucket, key.size());
  bucket->append(key);
}

void AppendBucketDamaged(std::string* bucket) {
  bucket->push_back(static_cast<char>(BucketEntryKind::kDamaged));
}

bool ForEachBucketEntry(
    std::string_view bucket,
    const std::function<void(BucketEntryKind, std::string_view, std::string_view)>& fn) {
  return WalkBucket(bucket, fn);
}

BucketLookup FindInBucket(std::string_view bucket, std::string_view key, std::string* value) {
  BucketLookup result = BucketLookup::kAbsent;
  std::string_view newest;
  WalkBucket(bucket, [&](BucketEntryKind kind, std::string_view k, std::string_view v) {
    if (kind == BucketEntryKind::kDamaged) {
      result = BucketLookup::kUnknown;  // what came before is lost
    } else if (k == key) {
      result = kind == BucketEntryKind::kPut ? BucketLookup::kFound : BucketLookup::kAbsent;
      newest = v;
    }
  });
  if (result == BucketLookup::kFound) value->assign(newest.data(), newest.size());
  return result;
}

bool BucketDamaged(std::string_view bucket) {
  bool damaged = false;
  ForEachBucketEntry(bucket, [&](BucketEntryKind kind, std::string_view, std::string_view) {
    if (kind == BucketEntryKind::kDamaged) damaged = true;
  });
  return damaged;
}

std::string CompactBucket(std::string_view bucket) {
  // Newest entry per key: a put's value, or nullopt for a remove.
  std::map<std::string_view, std::optional<std::string_view>> newest;
  bool damaged = false;
  ForEachBucketEntry(bucket, [&](BucketEntryKind kind, std::string_view k, std::string_view v) {
    if (kind == BucketEntryKind::kDamaged) {
      damaged = true;
      newest.clear();  // lost, like everything before the mark
    } else if (kind == BucketEntryKind::kPut) {
      newest[k] = v;
    } else {
      newest[k] = std::nullopt;
    }
  });
  std::string out;
  if (damaged) AppendBucketDamaged(&out);
  for (const auto& [k, v] : newest) {
    if (v) {
      AppendBucketPut(&out, k, *v);
    } else if (damaged) {
      AppendBucketRemove(&out, k);
    }
  }
  return out;
}

namespace {

// Walks a bucket in CompactBucket's form: an optional damaged mark first,
// then entries in strictly increasing key order (std::map's), puts only, or
// puts and removes after a mark. Calls fn(key, whole entry) for each entry;
// returns false as soon as the bucket is not in that form.
template <typename Fn>
bool ForEachCompactEntry(std::string_view bucket, bool* damaged, Fn fn) {
  *damaged = !bucket.empty() && static_cast<BucketEntryKind>(bucket.front()) ==
                                    BucketEntryKind::kDamaged;
  if (*damaged) bucket.remove_prefix(1);
  std::string_view last;
  bool first = true;
  while (!bucket.empty()) {
    const std::string_view entry = bucket;
    const auto kind = static_cast<BucketEntryKind>(bucket.front());
    if (kind != BucketEntryKind::kPut && !(kind == BucketEntryKind::kRemove && *damaged)) {
      return false;
    }
    bucket.remove_prefix(1);
    std::string_view key, value;
    if (!GetSized(&bucket, &key)) return false;
    if (kind == BucketEntryKind::kPut && !GetSized(&bucket, &value)) return false;
    if (!first && !(last < key)) return false;
    last = key;
    first = false;
    fn(key, entry.substr(0, entry.size() - bucket.size()));
  }
  return true;
}

}  // namespace

bool BucketIsCompact(std::string_view bucket) {
  bool damaged;
  bool any = false;
  return ForEachCompactEntry(bucket, &damaged, [&](std::string_view, std::string_view) {
           any = true;
         }) &&
         (any || damaged);
}

bool PutInCompactBucket(std::string_view bucket, std::string_view key, std::string_view value,
                        std::string* out, bool* replaced) {
  out->clear();
  out->reserve(bucket.size() + key.size() + value.size() + 21);  // 1 + two varints
  bool damaged;
  if (!bucket.empty() && static_cast<BucketEntryKind>(bucket.front()) == BucketEntryKind::kDamaged) {
    AppendBucketDamaged(out);
  }
  bool placed = false, found = false;
  const bool ok = ForEachCompactEntry(bucket, &damaged, [&](std::string_view k,
                                                            std::string_view entry) {
    if (!placed && !(k < key)) {
      AppendBucketPut(out, key, value);  // before k, or in place of it
      placed = true;
      found = k == key;
      if (found) return;
    }
    out->append(entry);
  });
  if (!ok) return false;
  // A compact bucket's entries after a damaged mark may be removes.
  if (replaced != nullptr) *replaced = found && !damaged;
  // (A damaged mark alone or with removes only is compact: BucketIsCompact.)
  if (!placed) AppendBucketPut(out, key, value);
  return true;
}

bool RemoveFromCompactBucket(std::string_view bucket, std::string_view key, std::string* out,
                             bool* found) {
  out->clear();
  *found = false;
  bool damaged;
  const bool ok = ForEachCompactEntry(bucket, &damaged, [&](std::string_view k,
                                                            std::string_view entry) {
    if (k == key) {
      *found = true;
    } else {
      out->append(entry);
    }
  });
  return ok && !damaged && !bucket.empty();
}

uint8_t BucketFilter(std::string_view bucket) {
  uint8_t bits = kFilterKnown;
  bool damaged;
  // The common case, written so by every whole write: live puts only.
  if (ForEachCompactEntry(bucket, &damaged, [&](std::string_view key, std::string_view) {
        bits |= BucketFilterBit(HashStringKey(key));
      })) {
    return damaged ? 0 : bits;
  }
  bool bad = false;
  bits = kFilterKnown;
  if (!ForEachBucketEntry(bucket, [&](BucketEntryKind kind, std::string_view, std::string_view) {
        if (kind == BucketEntryKind::kDamaged) bad = true;
      }) ||
      bad) {
    return 0;
  }
  for (const auto& [key, value] : LiveBucketEntries(bucket)) {
    bits |= BucketFilterBit(HashStringKey(key));
  }
  return bits;
}

std::vector<std::pair<std::string, std::string>> LiveBucketEntries(std::string_view bucket) {
  std::map<std::string_view, std::string_view> live;
  ForEachBucketEntry(bucket, [&](BucketEntryKind kind, std::string_view k, std::string_view v) {
    if (kind == BucketEntryKind::kPut) {
      live[k] = v;
    } else if (kind == BucketEntryKind::kRemove) {
      live.erase(k);
    } else {
      live.clear();
    }
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(live.size());
  for (const auto& [k, v] : live) out.emplace_back(std::string(k), std::string(v));
  return out;
}

}  // namespace flatkv::engine
