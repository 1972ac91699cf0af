// Ring: the cluster as one immutable, versioned value (shared/DESIGN.md,
// "Cluster"). It is built from what ZooKeeper holds under the service path
// (the recorded marks, the registered member nodes with their creation
// zxids, and each mark's recorded chain) and answers, without any I/O: which
// mark owns a hash, the hash of an integer or string key, each mark's chain
// in registration order, each member's role, and the key ranges each mark
// owns in key order (for scans).
//
//   marks N0 < N1 < ... < Np
//   owner(h) = smallest Ni > h, or N0 if there is none
//
//       -inf ......... N0 ......... N1 ... N(p-1) ......... Np ......... +inf
//       |---- N0 -----|---- N1 ----|  ...  |----- Np -------|---- N0 ----|
//
// So mark Ni owns [N(i-1), Ni) and N0 owns h >= Np and h < N0.
// hash(k) = k for an integer key; hash(s) = XXH64(s, seed 0) mod hash_bound
// for a string key.
//
// The version grows with every change ZooKeeper makes to any of it (a
// member, a mark, a recorded chain): the registry computes it as
//
//   cversion(<service_path>) + cversion(.cluster/marks)
//     + cversion(.cluster/chains) + sum of the data versions of .cluster/chains/*
//
// (cversion counts child creations and deletions, a data version counts
// writes; each term only grows, so the sum does, as long as no chain node
// is deleted: deleting one takes its data version out of the sum). Every
// instance that read the same nodes computes the same version.
//
// Thread safety: a Ring is immutable once built; share it as
// std::shared_ptr<const Ring> and swap the pointer atomically to publish a
// new one (registry.h does).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"
#include "partition/chain.h"

namespace flatkv::partition {

inline constexpr int64_t kDefaultHashBound = INT64_MAX;  // 9223372036854775807
inline constexpr const char* kMemberPrefix = "thriftbinary";

// The ring-wide settings kept as JSON in <service_path>/.cluster. Every
// instance of a ring must agree on them.
struct RingSettings {
  int64_t hash_bound = kDefaultHashBound;  // cluster.hash_bound
  std::string replication = "sync";        // cluster.replication: sync | async

  // {"hash_bound": 9223372036854775807, "replication": "sync"}
  std::string ToJson() const;
  // Parses ToJson()'s output (keys in any order, whitespace allowed).
  // InvalidArgument naming what is wrong for anything else.
  static Status FromJson(std::string_view json, RingSettings* out);
  // OK if "other" equals this; otherwise InvalidArgument naming the first
  // key that differs with both values ("cluster.hash_bound: this instance
  // has 100, the ring has 9223372036854775807").
  Status CheckSame(const RingSettings& ring) const;
};

// One registered instance.
struct Member {
  std::string host;
  int port = 0;
  // Chain order: the creation zxid of its member node, or, in a view
  // (Registry) of another mark whose members each have one order node, its
  // registration's sequence number there (.cluster/order), which orders the
  // same way. The members of one partition are keyed alike.
  int64_t czxid = 0;

  std::string address() const { return host + ":" + std::to_string(port); }
  bool operator==(const Member& o) const { return host == o.host && port == o.port; }
};

// The chain a mark's head last recorded in ZooKeeper, as the JSON data of
// <service_path>/.cluster/chains/<mark> (partition/README.md, "The recorded
// chain"):
//   {"ring_version": 17, "members": ["127.0.0.1:9001", "127.0.0.1:9002"]}
// members in chain order (head first), each "host:port"; ring_version is
// the version of the ring the head saw when it decided to record it, so a
// chain decided on an older ring never replaces one decided on a newer.
struct RecordedChain {
  int64_t ring_version = 0;
  std::vector<std::string> members;
  // The zxid of the write that recorded it (the node's mzxid as read; not
  // part of the JSON, 0 when not read from ZooKeeper). Later than every
  // registration of the chain it recorded: a record older than a member's
  // registration names an earlier life of that address.
  int64_t zxid = 0;

  std::string ToJson() const;
  // Parses ToJson()'s output (keys in any order, whitespace allowed; both
  // keys needed, no others; ring_version >= 0; every member host:port).
  // InvalidArgument naming what is wrong for anything else.
  static Status FromJson(std::string_view json, RecordedChain* out);
  bool operator==(const RecordedChain& o) const {
    return ring_version == o.ring_version && members == o.members;
  }
};

// A ring change in progress (partition/change.h, server/member/migration.h), as the JSON
// data of <service_path>/.cluster/change (persistent; one change at a time:
// whoever creates the node holds the change):
//   {"kind": "add", "mark": 1800, "into": 1800, "source": 1000,
//    "importer": "127.0.0.1:9003", "state": "copy", "ranges": [[1200, 1799]]}
// "add": an instance of the new mark "mark" (= "into") takes the hash ranges
// (inclusive) over from mark "source". "remove": mark "mark" (= "source")
// leaves the ring and the mark that inherits its ranges, "into", takes them
// over; "importer" is the head of "into". state "precopy" (add only): the
// source still takes writes to the ranges and its head records the keys
// written there (peerTrack) while the importer copies everything; from
// state "copy" on the source refuses writes to the ranges: the importer
// copies only the recorded keys (peerDelta), or everything again when the
// record is not continuous (a restarted importer copies everything); "flip": its copy is complete and
// durable (never copied again), the ring flips (add: the importer
// registers; remove: the source's members deregister and exit, its mark
// node goes); "drop" (add): the source drops its copies; then the node is
// deleted.
struct RingChange {
  std::string kind = "add";
  int64_t mark = 0;
  int64_t into = 0;
  int64_t source = 0;
  std::string importer;  // host:port
  std::string state = "copy";
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t czxid = 0;  // the node's creation zxid (not in the JSON)

  std::string ToJson() const;
  // Strict, like RecordedChain::FromJson: InvalidArgument naming what is wrong.
  static Status FromJson(std::string_view json, RingChange* out);
  bool Covers(int64_t h) const;
  bool operator==(const RingChange& o) const {
    return kind == o.kind && mark == o.mark && into == o.into && source == o.source &&
           importer == o.importer &&
           state == o.state && ranges == o.ranges && czxid == o.czxid;
  }
};

// The instances of one mark, ordered into a chain: head (oldest
// registration) first, tail (newest) last. Empty when no member serves.
struct Partition {
  int64_t mark = 0;
  std::vector<Member> chain;
  // The recorded chain (RecordedChain::members) and the ring version it was
  // recorded under; empty and 0 when none was recorded, or when its node
  // could not be read or parsed. ChainConfig::recorded takes it.
  std::vector<std::string> recorded;
  int64_t recorded_ring_version = 0;
  int64_t recorded_zxid = 0;  // RecordedChain::zxid
  // Its node .cluster/marks/<mark> exists (else the mark is in the ring only
  // through a member node: its mark node was deleted by a remove-mark).
  bool in_marks = false;

  const Member* head() const { return chain.empty() ? nullptr : &chain.front(); }
  const Member* tail() const { return chain.empty() ? nullptr : &chain.back(); }
};

// An inclusive range of hash values [lo, hi] and the index (in
// Ring::partitions()) of the partition that owns it.
struct HashRange {
  int64_t lo = 0;
  int64_t hi = 0;
  size_t partition = 0;
};

class Ring {
 public:
  // A member node as read from ZooKeeper: its mark and its Member.
  struct Registration {
    int64_t mark = 0;
    Member member;
  };

  // Builds a ring. "marks" are the recorded marks (.cluster/marks, any order,
  // duplicates allowed); the mark of every registration is included too.
  // Each partition's chain is its registrations sorted by czxid (ties by
  // address, so the order is the same on every instance). "recorded" are
  // the recorded chains by mark (.cluster/chains); one of a mark not in the
  // ring is ignored (it never brings its mark back: a mark is in the ring by
  // .cluster/marks or a member).
  static std::shared_ptr<const Ring> Make(int64_t version, RingSettings settings,
                                          std::vector<int64_t> marks,
                                          std::vector<Registration> registrations,
                                          std::map<int64_t, RecordedChain> recorded = {},
                                          std::optional<RingChange> change = std::nullopt);
  // What a standalone instance answers: one partition of mark 0 holding
  // itself.
  static std::shared_ptr<const Ring> Standalone(const std::string& host, int port);

  int64_t version() const { return version_; }
  const RingSettings& settings() const { return settings_; }
  // Sorted by mark, ascending; empty only for a ring with no marks at all.
  const std::vector<Partition>& partitions() const { return partitions_; }
  bool empty() const { return partitions_.empty(); }
  // The ring change in progress (.cluster/change), or null.
  const RingChange* change() const { return change_ ? &*change_ : nullptr; }

  // Index in partitions() of the owner of hash "h" (the smallest mark
  // greater than h, or the first if there is none). The ring must not be
  // empty. O(log marks).
  size_t OwnerIndex(int64_t h) const;
  const Partition& Owner(int64_t h) const { return partitions_[OwnerIndex(h)]; }
  // The partition of "mark", or nullptr if the mark is not in the ring.
  const Partition* Find(int64_t mark) const;

  // hash(k) = k.
  static int64_t HashKey(int64_t key) { return key; }
  // XXH64(s, seed 0) mod hash_bound (hash_bound > 0).
  static int64_t HashString(std::string_view key, int64_t hash_bound);
  int64_t HashString(std::string_view key) const {
    return HashString(key, settings_.hash_bound);
  }

  // The hash ranges of the whole i64 space in ascending order, adjacent
  // ranges of one owner merged: with marks {10, 20} that is
  // [INT64_MIN, 9] -> 10, [10, 19] -> 20, [20, INT64_MAX] -> 10.
  // A ring-wide key-order scan walks these. Empty for an empty ring.
  std::vector<HashRange> KeyOrder() const;
  // The range of KeyOrder() that holds "h" (the ring must not be empty).
  // O(log marks).
  HashRange RangeOf(int64_t h) const;

  // kSingle, kHead, kMiddle or kTail for the member at "address" in mark's
  // chain (partition/chain.h); kNone if it is not there.
  ChainRole ChainRoleOf(int64_t mark, std::string_view address) const;
  // Its name: "single", "head", "middle" or "tail"; empty if it is not there.
  std::string RoleOf(int64_t mark, std::string_view address) const;

  // Every member of every mark, for logs: "10=[a:1,b:2] 20=[]". Without
  // the recorded chains (see SameAs).
  std::string ToString() const;
  // True if "o" has the same version, settings, marks, chains (with czxids)
  // and recorded chains.
  bool SameAs(const Ring& o) const;

 private:
  Ring() = default;

  int64_t version_ = 0;
  RingSettings settings_;
  std::vector<Partition> partitions_;
  std::optional<RingChange> change_;
};

// The member node's name and data: "thriftbinary<mark>:<host>:<port>".
std::string MemberNodeName(int64_t mark, std::string_view address);
// Parses a member node name. False for a name that does not start with
// "thriftbinary" or is malformed (not a member: callers skip it).
bool ParseMemberNode(std::string_view name, int64_t* mark, std::string* host, int* port);
// Parses an order node's name, "<member node name>-<sequence>" (a
// sequential node ZooKeeper numbered): false unless it ends in '-' and
// decimal digits after a non-empty name.
bool ParseOrderNode(std::string_view name, std::string* member, int64_t* seq);
// Parses "host:port" (port 1..65535, host non-empty). InvalidArgument
// naming "what" otherwise.
Status ParseHostPort(std::string_view text, std::string_view what, std::string* host, int* port);

}  // namespace flatkv::partition
