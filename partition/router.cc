#include "partition/router.h"

#include <algorithm>
#include <charconv>
#include <map>

namespace flatkv::partition {
const Member* Router::Target(const Partition& partition, bool write,
                             std::string_view replication, uint64_t spread,
                             std::string_view self) {
  if (partition.chain.empty()) return nullptr;
  // Writes enter at the head; under sync only the tail serves reads (it
  // holds exactly the acknowledged writes), under async any member does.
  if (write) return partition.head();
  if (replication == "sync") return partition.tail();
  if (!self.empty()) {
    for (const Member& m : partition.chain) {
      if (m.address() == self) return &m;
    }
  }
  return &partition.chain[spread % partition.chain.size()];
}

std::vector<OwnerGroup> Router::SplitByOwner(const Ring& ring, const std::vector<int64_t>& hashes) {
  std::map<size_t, std::vector<size_t>> by_owner;  // ordered: groups in ring order
  for (size_t i = 0; i < hashes.size(); ++i) by_owner[ring.OwnerIndex(hashes[i])].push_back(i);
  std::vector<OwnerGroup> out;
  out.reserve(by_owner.size());
  for (auto& [partition, positions] : by_owner) {
    out.push_back(OwnerGroup{partition, std::move(positions)});
  }
  return out;
}

ScanStep Router::Step(const Ring& ring, int64_t from, bool reverse) {
  const HashRange r = ring.RangeOf(from);
  ScanStep step{r.partition, from, r.lo, r.hi};
  // The range's far side is kept; the near side starts at "from".
  if (reverse) {
    step.hi = from;
  } else {
    step.lo = from;
  }
  return step;
}

bool Router::After(const ScanStep& step, bool reverse, int64_t* next) {
  if (reverse) {
    if (step.lo == INT64_MIN) return false;
    *next = step.lo - 1;
  } else {
    if (step.hi == INT64_MAX) return false;
    *next = step.hi + 1;
  }
  return true;
}

// "r" + decimal mark + "/" + the partition's cursor bytes.
std::string Router::EncodeLogCursor(int64_t mark, std::string_view inner) {
  std::string out(1, 'r');
  out += std::to_string(mark);
  out += '/';
  out += inner;
  return out;
}

Status Router::DecodeLogCursor(std::string_view cursor, int64_t* mark, std::string* inner) {
  const size_t slash = cursor.find('/');
  if (cursor.size() < 3 || cursor[0] != 'r' || slash == std::string_view::npos) {
    return Status::InvalidArgument("not a ring scanLog cursor (pass back the cursor returned)");
  }
  const char* begin = cursor.data() + 1;
  const char* end = cursor.data() + slash;
  auto [ptr, ec] = std::from_chars(begin, end, *mark);
  if (ec != std::errc() || ptr != end || begin == end) {
    return Status::InvalidArgument("not a ring scanLog cursor: bad mark");
  }
  inner->assign(cursor.substr(slash + 1));
  return Status::OK();
}

bool Router::LogPartition(const Ring& ring, int64_t mark, size_t* partition) {
  const auto& parts = ring.partitions();
  auto it = std::lower_bound(parts.begin(), parts.end(), mark,
                             [](const Partition& p, int64_t v) { return p.mark < v; });
  if (it == parts.end()) return false;
  *partition = static_cast<size_t>(it - parts.begin());
  return true;
}

}  // namespace flatkv::partition
