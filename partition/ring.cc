#include "partition/ring.h"

#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <limits>

namespace flatkv::partition {
namespace {

// Parses a decimal i64 covering all of "text".
bool ParseI64(std::string_view text, int64_t* out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Skips spaces, tabs and newlines.
void SkipSpace(std::string_view* s) {
  while (!s->empty() && (s->front() == ' ' || s->front() == '\t' || s->front() == '\n' ||
                         s->front() == '\r')) {
    s->remove_prefix(1);
  }
}

bool Consume(std::string_view* s, char c) {
  SkipSpace(s);
  if (s->empty() || s->front() != c) return false;
  s->remove_prefix(1);
  return true;
}

// A JSON string without escapes (our keys and values never need them).
bool ReadString(std::string_view* s, std::string* out) {
  if (!Consume(s, '"')) return false;
  const size_t end = s->find('"');
  if (end == std::string_view::npos || s->substr(0, end).find('\\') != std::string_view::npos) {
    return false;
  }
  out->assign(s->substr(0, end));
  s->remove_prefix(end + 1);
  return true;
}

bool ReadInteger(std::string_view* s, int64_t* out) {
  SkipSpace(s);
  size_t n = 0;
  while (n < s->size() && ((*s)[n] == '-' || ((*s)[n] >= '0' && (*s)[n] <= '9'))) ++n;
  if (!ParseI64(s->substr(0, n), out)) return false;
  s->remove_prefix(n);
  return true;
}

// A flat JSON object, '{"key": value, ...}', at least one key: calls
// "field" for each key with "s" at its value, which it reads and returns ""
// for, or says what is wrong with it. Returns "" or what is wrong.
std::string ParseObject(std::string_view json,
                        const std::function<std::string(const std::string& key,
                                                        std::string_view* s)>& field) {
  std::string_view s = json;
  if (!Consume(&s, '{')) return "not a JSON object";
  SkipSpace(&s);
  if (!s.empty() && s.front() == '}') return "empty";
  while (true) {
    std::string key;
    if (!ReadString(&s, &key) || !Consume(&s, ':')) return "expected \"key\": value";
    if (std::string why = field(key, &s); !why.empty()) return why;
    if (Consume(&s, '}')) break;
    if (!Consume(&s, ',')) return "expected ',' or '}'";
  }
  SkipSpace(&s);
  if (!s.empty()) return "trailing characters";
  return "";
}

}  // namespace

std::string RingSettings::ToJson() const {
  return "{\"hash_bound\": " + std::to_string(hash_bound) + ", \"replication\": \"" +
         replication + "\"}";
}

Status RingSettings::FromJson(std::string_view json, RingSettings* out) {
  // A flat object of known keys; a key we do not know is an error, since it
  // would be a ring-wide setting this instance ignores.
  RingSettings result;
  bool have_bound = false, have_replication = false;
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("ring settings '" + std::string(json) + "': " +
                                   std::string(why));
  };
  const std::string why = ParseObject(json, [&](const std::string& key, std::string_view* s) {
    if (key == "hash_bound") {
      if (!ReadInteger(s, &result.hash_bound) || result.hash_bound <= 0) {
        return std::string("hash_bound must be a positive integer");
      }
      have_bound = true;
    } else if (key == "replication") {
      if (!ReadString(s, &result.replication) ||
          (result.replication != "sync" && result.replication != "async")) {
        return std::string("replication must be \"sync\" or \"async\"");
      }
      have_replication = true;
    } else {
      return "unknown key '" + key + "'";
    }
    return std::string();
  });
  if (!why.empty()) return bad(why);
  if (!have_bound || !have_replication) return bad("needs hash_bound and replication");
  *out = result;
  return Status::OK();
}

Status RingSettings::CheckSame(const RingSettings& ring) const {
  if (hash_bound != ring.hash_bound) {
    return Status::InvalidArgument("cluster.hash_bound: this instance has " +
                                   std::to_string(hash_bound) + ", the ring has " +
                                   std::to_string(ring.hash_bound));
  }
  if (replication != ring.replication) {
    return Status::InvalidArgument("cluster.replication: this instance has " + replication +
                                   ", the ring has " + ring.replication);
  }
  return Status::OK();
}

std::string RecordedChain::ToJson() const {
  std::string out = "{\"ring_version\": " + std::to_string(ring_version) + ", \"members\": [";
  for (size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ", ";
    out += "\"" + members[i] + "\"";
  }
  return out + "]}";
}

Status RecordedChain::FromJson(std::string_view json, RecordedChain* out) {
  // Strict like RingSettings: a key we do not know may change what the
  // chain means, so the chain counts as unreadable rather than half-read.
  RecordedChain result;
  bool have_version = false, have_members = false;
  const auto bad = [&](std::string_view why) {
    // Anyone can write the node: quote only the start of what is there,
    // printable (it goes to the log).
    std::string quoted(json.substr(0, 120));
    for (char& c : quoted) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    if (json.size() > 120) quoted += "...";
    return Status::InvalidArgument("recorded chain '" + quoted + "': " + std::string(why));
  };
  const std::string why = ParseObject(json, [&](const std::string& key, std::string_view* s) {
    if (key == "ring_version" && !have_version) {
      if (!ReadInteger(s, &result.ring_version) || result.ring_version < 0) {
        return std::string("ring_version must be a non-negative integer");
      }
      have_version = true;
    } else if (key == "members" && !have_members) {
      if (!Consume(s, '[')) return std::string("members must be an array of \"host:port\"");
      while (true) {
        std::string member, host;
        int port = 0;
        if (!ReadString(s, &member) || !ParseHostPort(member, "member", &host, &port).ok()) {
          return std::string("members must be a non-empty array of \"host:port\"");
        }
        result.members.push_back(std::move(member));
        if (Consume(s, ']')) break;
        if (!Consume(s, ',')) return std::string("expected ',' or ']' in members");
      }
      have_members = true;
    } else {
      return "unknown or repeated key '" + key + "'";
    }
    return std::string();
  });
  if (!why.empty()) return bad(why);
  if (!have_version || !have_members) return bad("needs ring_version and members");
  *out = std::move(result);
  return Status::OK();
}

std::string RingChange::ToJson() const {
  std::string out = "{\"kind\": \"" + kind + "\", \"mark\": " + std::to_string(mark) +
                    ", \"into\": " + std::to_string(into) + ", \"source\": " +
                    std::to_string(source) + ", \"importer\": \"" +
                    importer + "\", \"state\": \"" + state + "\", \"ranges\": [";
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0) out += ", ";
    out += "[" + std::to_string(ranges[i].first) + ", " + std::to_string(ranges[i].second) + "]";
  }
  return out + "]}";
}

Status RingChange::FromJson(std::string_view json, RingChange* out) {
  RingChange result;
  bool have[7] = {};
  const auto bad = [&](std::string_view why) {
    std::string quoted(json.substr(0, 160));
    for (char& c : quoted) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    if (json.size() > 160) quoted += "...";
    return Status::InvalidArgument("ring change '" + quoted + "': " + std::string(why));
  };
  const std::string why = ParseObject(json, [&](const std::string& key, std::string_view* s) {
    if (key == "kind" && !have[0]) {
      if (!ReadString(s, &result.kind) || (result.kind != "add" && result.kind != "remove")) {
        return std::string("kind must be \"add\" or \"remove\"");
      }
      have[0] = true;
    } else if (key == "into" && !have[6]) {
      if (!ReadInteger(s, &result.into)) return std::string("into must be an integer");
      have[6] = true;
    } else if (key == "mark" && !have[1]) {
      if (!ReadInteger(s, &result.mark)) return std::string("mark must be an integer");
      have[1] = true;
    } else if (key == "source" && !have[2]) {
      if (!ReadInteger(s, &result.source)) return std::string("source must be an integer");
      have[2] = true;
    } else if (key == "importer" && !have[3]) {
      std::string host;
      int port = 0;
      if (!ReadString(s, &result.importer) ||
          !ParseHostPort(result.importer, "importer", &host, &port).ok()) {
        return std::string("importer must be \"host:port\"");
      }
      have[3] = true;
    } else if (key == "state" && !have[4]) {
      if (!ReadString(s, &result.state) ||
          (result.state != "precopy" && result.state != "copy" && result.state != "flip" &&
           result.state != "drop")) {
        return std::string("state must be \"precopy\", \"copy\", \"flip\" or \"drop\"");
      }
      have[4] = true;
    } else if (key == "ranges" && !have[5]) {
      if (!Consume(s, '[')) return std::string("ranges must be an array of [lo, hi]");
      while (true) {
        int64_t lo = 0, hi = 0;
        if (!Consume(s, '[') || !ReadInteger(s, &lo) || !Consume(s, ',') || !ReadInteger(s, &hi) ||
            !Consume(s, ']') || lo > hi) {
          return std::string("ranges must be a non-empty array of [lo, hi] with lo <= hi");
        }
        result.ranges.emplace_back(lo, hi);
        if (Consume(s, ']')) break;
        if (!Consume(s, ',')) return std::string("expected ',' or ']' in ranges");
      }
      have[5] = true;
    } else {
      return "unknown or repeated key '" + key + "'";
    }
    return std::string();
  });
  if (!why.empty()) return bad(why);
  for (bool h : have) {
    if (!h) return bad("needs kind, mark, into, source, importer, state and ranges");
  }
  if (result.kind == "add" ? result.into != result.mark : result.source != result.mark) {
    return bad(result.kind == "add" ? "an add's into must be its mark"
                                    : "a remove's source must be its mark");
  }
  *out = std::move(result);
  return Status::OK();
}

bool RingChange::Covers(int64_t h) const {
  for (const auto& [lo, hi] : ranges) {
    if (h >= lo && h <= hi) return true;
  }
  return false;
}

std::shared_ptr<const Ring> Ring::Make(int64_t version, RingSettings settings,
                                       std::vector<int64_t> marks,
                                       std::vector<Registration> registrations,
                                       std::map<int64_t, RecordedChain> recorded,
                                       std::optional<RingChange> change) {
  std::sort(marks.begin(), marks.end());
  marks.erase(std::unique(marks.begin(), marks.end()), marks.end());
  const std::vector<int64_t> recorded_marks = marks;
  for (const Registration& r : registrations) marks.push_back(r.mark);
  std::sort(marks.begin(), marks.end());
  marks.erase(std::unique(marks.begin(), marks.end()), marks.end());
  // Chain order: registration order, so a member that registers again
  // (larger czxid) rejoins at the tail. The address breaks ties only to keep
  // every instance's view identical.
  std::sort(registrations.begin(), registrations.end(),
            [](const Registration& a, const Registration& b) {
              if (a.member.czxid != b.member.czxid) return a.member.czxid < b.member.czxid;
              return a.member.address() < b.member.address();
            });
  std::shared_ptr<Ring> ring(new Ring());
  ring->version_ = version;
  ring->settings_ = std::move(settings);
  ring->partitions_.reserve(marks.size());
  for (int64_t m : marks) {
    Partition p;
    p.mark = m;
    p.in_marks = std::binary_search(recorded_marks.begin(), recorded_marks.end(), m);
    ring->partitions_.push_back(std::move(p));
  }
  for (Registration& r : registrations) {
    Partition* p = const_cast<Partition*>(ring->Find(r.mark));
    // The same address registered twice (a stale node not yet expired)
    // serves once, at its oldest position.
    if (std::find(p->chain.begin(), p->chain.end(), r.member) == p->chain.end()) {
      p->chain.push_back(std::move(r.member));
    }
  }
  for (auto& [mark, chain] : recorded) {
    Partition* p = const_cast<Partition*>(ring->Find(mark));
    if (p == nullptr) continue;
    p->recorded = std::move(chain.members);
    p->recorded_ring_version = chain.ring_version;
    p->recorded_zxid = chain.zxid;
  }
  ring->change_ = std::move(change);
  return ring;
}

std::shared_ptr<const Ring> Ring::Standalone(const std::string& host, int port) {
  return Make(0, RingSettings{}, {0}, {Registration{0, Member{host, port, 0}}});
}

size_t Ring::OwnerIndex(int64_t h) const {
  // The first mark greater than h; past the last mark the ring wraps to N0.
  auto it = std::upper_bound(partitions_.begin(), partitions_.end(), h,
                             [](int64_t v, const Partition& p) { return v < p.mark; });
  return it == partitions_.end() ? 0 : static_cast<size_t>(it - partitions_.begin());
}

const Partition* Ring::Find(int64_t mark) const {
  auto it = std::lower_bound(partitions_.begin(), partitions_.end(), mark,
                             [](const Partition& p, int64_t v) { return p.mark < v; });
  return it != partitions_.end() && it->mark == mark ? &*it : nullptr;
}

int64_t Ring::HashString(std::string_view key, int64_t hash_bound) {
  const uint64_t h = XXH64(key.data(), key.size(), 0);
  return static_cast<int64_t>(h % static_cast<uint64_t>(hash_bound));
}

std::vector<HashRange> Ring::KeyOrder() const {
  std::vector<HashRange> out;
  if (partitions_.empty()) return out;
  const auto add = [&out](int64_t lo, int64_t hi, size_t owner) {
    if (!out.empty() && out.back().partition == owner && out.back().hi + 1 == lo) {
      out.back().hi = hi;
    } else {
      out.push_back(HashRange{lo, hi, owner});
    }
  };
  // Below N0 belongs to N0; [N(i-1), Ni - 1] to Ni; from Np up to N0 again.
  if (partitions_[0].mark > INT64_MIN) add(INT64_MIN, partitions_[0].mark - 1, 0);
  for (size_t i = 1; i < partitions_.size(); ++i) {
    add(partitions_[i - 1].mark, partitions_[i].mark - 1, i);
  }
  add(partitions_.back().mark, INT64_MAX, 0);
  return out;
}

HashRange Ring::RangeOf(int64_t h) const {
  // The same ranges as KeyOrder(), without building them (this runs for
  // every key a peer call carries).
  const size_t i = OwnerIndex(h);
  if (partitions_.size() == 1) return HashRange{INT64_MIN, INT64_MAX, 0};
  if (i > 0) return HashRange{partitions_[i - 1].mark, partitions_[i].mark - 1, i};
  if (h < partitions_[0].mark) return HashRange{INT64_MIN, partitions_[0].mark - 1, 0};
  return HashRange{partitions_.back().mark, INT64_MAX, 0};
}

ChainRole Ring::ChainRoleOf(int64_t mark, std::string_view address) const {
  const Partition* p = Find(mark);
  if (p == nullptr) return ChainRole::kNone;
  for (size_t i = 0; i < p->chain.size(); ++i) {
    if (p->chain[i].address() != address) continue;
    if (p->chain.size() == 1) return ChainRole::kSingle;
    if (i == 0) return ChainRole::kHead;
    return i + 1 == p->chain.size() ? ChainRole::kTail : ChainRole::kMiddle;
  }
  return ChainRole::kNone;
}

std::string Ring::RoleOf(int64_t mark, std::string_view address) const {
  const ChainRole role = ChainRoleOf(mark, address);
  return role == ChainRole::kNone ? "" : RoleName(role);
}

std::string Ring::ToString() const {
  std::string out;
  for (const Partition& p : partitions_) {
    if (!out.empty()) out += ' ';
    out += std::to_string(p.mark) + "=[";
    for (size_t i = 0; i < p.chain.size(); ++i) {
      if (i > 0) out += ',';
      out += p.chain[i].address();
    }
    out += ']';
  }
  return out;
}

bool Ring::SameAs(const Ring& o) const {
  if (change_ != o.change_) return false;
  if (version_ != o.version_ || settings_.hash_bound != o.settings_.hash_bound ||
      settings_.replication != o.settings_.replication ||
      partitions_.size() != o.partitions_.size()) {
    return false;
  }
  for (size_t i = 0; i < partitions_.size(); ++i) {
    const Partition& a = partitions_[i];
    const Partition& b = o.partitions_[i];
    if (a.mark != b.mark || a.recorded != b.recorded ||
        a.recorded_ring_version != b.recorded_ring_version ||
        a.recorded_zxid != b.recorded_zxid || a.chain.size() != b.chain.size()) {
      return false;
    }
    for (size_t j = 0; j < a.chain.size(); ++j) {
      if (!(a.chain[j] == b.chain[j]) || a.chain[j].czxid != b.chain[j].czxid) return false;
    }
  }
  return true;
}

std::string MemberNodeName(int64_t mark, std::string_view address) {
  return std::string(kMemberPrefix) + std::to_string(mark) + ":" + std::string(address);
}

bool ParseMemberNode(std::string_view name, int64_t* mark, std::string* host, int* port) {
  const std::string_view prefix = kMemberPrefix;
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  const size_t colon = name.find(':');
  if (colon == std::string_view::npos || !ParseI64(name.substr(0, colon), mark)) return false;
  return ParseHostPort(name.substr(colon + 1), "member", host, port).ok();
}

bool ParseOrderNode(std::string_view name, std::string* member, int64_t* seq) {
  const size_t dash = name.rfind('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == name.size()) return false;
  const std::string_view digits = name.substr(dash + 1);
  if (digits.find_first_not_of("0123456789") != std::string_view::npos) return false;
  if (!ParseI64(digits, seq)) return false;
  member->assign(name.substr(0, dash));
  return true;
}

Status ParseHostPort(std::string_view text, std::string_view what, std::string* host, int* port) {
  // The port follows the last ':' so an IPv6 address in brackets works too.
  const size_t colon = text.rfind(':');
  int64_t p = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !ParseI64(text.substr(colon + 1), &p) || p < 1 || p > 65535) {
    return Status::InvalidArgument(std::string(what) + ": '" + std::string(text) +
                                   "' is not host:port (port 1-65535)");
  }
  host->assign(text.substr(0, colon));
  *port = static_cast<int>(p);
  return Status::OK();
}

}  // namespace flatkv::partition
