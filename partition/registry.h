// Registry: this instance's side of ZooKeeper (shared/DESIGN.md, "Cluster"),
// on the multi-threaded C client (zookeeper_mt).
//
// It keeps one session to the ensemble and, on it:
//   - creates <service_path> and <service_path>/.cluster if missing, writes
//     the ring-wide settings there (first instance) or checks ours against
//     them (a mismatch is fatal: on_fatal, nothing written);
//   - on Register(): creates .cluster/marks/<mark> (persistent, empty; or
//     checks that it exists, Register(false)), then
//     the ephemeral member node <service_path>/thriftbinary<mark>:<host>:<port>
//     whose data is the same string, and in the same transaction its order
//     node .cluster/order/<member node name>-<sequence> (ephemeral
//     sequential: ZooKeeper numbers registrations in order);
//     Deregister() deletes both again;
//   - on RecordChain(): writes the chain of this instance's mark to
//     .cluster/chains/<mark> (persistent; JSON, RecordedChain in ring.h),
//     only through the session that holds this instance's member node;
//   - watches the children of <service_path>, .cluster/marks and
//     .cluster/chains, the data of each chain node and .cluster/change, and
//     on an event re-reads only what the event names, and of that only what
//     is new: the chain order of a new member of another mark comes from
//     one listing of .cluster/order for all of them, the creation zxid of
//     one of this instance's mark is read once per registration (a live
//     node's never changes), a chain node only when its watch fired.
//     A burst of events is read as one (kCoalesceMs, spaced up to
//     kMaxSpacingMs apart while events keep coming; the change node's at
//     once: members must follow a ring change promptly), with asynchronous
//     calls sent together (one round trip per step, not one per node); on a
//     reconnect the listings are read again. It then builds a new Ring and
//     publishes it (ring() swaps a shared_ptr<const Ring>; on_ring is
//     told). partition/README.md, "What a change costs ZooKeeper";
//   - after session expiry makes a new session by itself and, if it was
//     registered (and not deregistered since), registers again;
//   - Close() closes the session so the member node goes at once;
//   - with credentials (RegistryOptions::credentials), authenticates every
//     session and creates every node readable by anyone, writable only by
//     that identity.
// ZooKeeper's own log goes through spdlog, rate-limited. The ZooKeeper
// completion thread never blocks: watchers only wake the registry's own
// thread, which makes every (synchronous) ZooKeeper call; the blocking
// methods (RecordChain, Ping) hand their work to it and wait.
//
// The ring's version is
//   cversion(<service_path>) + cversion(.cluster/marks)
//     + cversion(.cluster/chains) + sum of data versions of .cluster/chains/*
// so it grows with every member that comes or goes, every new mark and every
// recorded chain, and every instance that read the same nodes computes the
// same number. It goes down only if someone deletes a chain node (never
// done by FlatKV itself).
//
// Thread safety: every public method may be called from any thread.
// Callbacks run on the registry's thread; they must not call Close(),
// RecordChain() or Ping() (those wait for that thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"
#include "partition/ring.h"
#include "partition/zk_auth.h"

namespace flatkv::partition {

struct RegistryOptions {
  std::string zookeeper;                  // cluster.zookeeper: "host:port,..."
  std::string service_path = "/flatkv";   // cluster.service_path
  int64_t mark = 0;                       // cluster.mark
  std::string advertise;                  // cluster.advertise: "host:port"
  RingSettings settings;                  // cluster.hash_bound, cluster.replication
  int session_timeout_ms = 6000;          // cluster.session_timeout_ms
  // cluster.zookeeper_auth_file's content (partition/zk_auth.h). When set,
  // every session authenticates with it before any request (the first
  // session and each new one after expiry), every node the registry
  // creates gets the ACL "this identity: all; anyone: read", and the first
  // settings check refuses a ring with a node the world may write
  // (on_fatal, InvalidArgument naming the node and `flatkv admin
  // secure-ring`) unless its ACL gives this identity all too (the
  // transitional ACL of zk_auth.h: a warning). Unset: nodes are open to
  // the world. Not used by an observer, which only reads.
  ZkCredentials credentials;
  // A client's view (client/ring_client.h): only reads and watches the ring
  // (settings from .cluster when present); never creates, writes or checks
  // anything, and Register() does nothing. mark, advertise and settings are
  // not used.
  bool observer = false;
  // Called once, from the registry's thread, when the ring's settings
  // differ from ours (the message names the key) or the service path cannot
  // be used at all; the instance must stop (exit 2). Nothing was written.
  // It runs before WaitRegistered() and Refresh() return the same error.
  std::function<void(const Status&)> on_fatal;
  // Called after each new Ring is published.
  std::function<void(std::shared_ptr<const Ring>)> on_ring;
  // Called after each successful registration (the first, after Register()
  // following Deregister(), and every re-registration after session expiry)
  // with the member node's creation zxid: the registration's name in
  // ChainConfig::epochs (ChainMember::OnRegistered), and the session that
  // made it (SessionLease::session's numbering).
  std::function<void(int64_t czxid, uint64_t session)> on_registered;
  // After a registration is lost (session expiry, the node deleted), make
  // it again by itself. A chain member turns this off: it must catch up
  // before it registers again (server/member/replicator.h calls Register()).
  bool reregister_after_expiry = true;
};

// Counters for stats() and /metrics.
struct RegistryStats {
  int64_t sessions = 0;          // sessions established (1 + re-connections after expiry)
  int64_t registrations = 0;     // member nodes created
  int64_t ring_reads = 0;        // times the ring was read (and published if it changed)
  int64_t zk_reads = 0;          // ZooKeeper reads sent for those (listings, nodes, czxids)
  int64_t connected = 0;         // 1 while the session is connected
  int64_t members_seen = 0;      // members in the current ring
  int64_t ring_version = 0;      // version of the current ring (-1: none yet)
  int64_t chains_recorded = 0;   // chain nodes written by RecordChain()
};

// The clock of ZooKeeper leases (CLOCK_BOOTTIME, in milliseconds): it never
// jumps, and it counts time the process was stopped or the machine
// suspended, as ZooKeeper's server does while it waits for a silent client.
int64_t BootTimeMs();

// What a lease is computed from (partition/chain.h, OnSessionAnswer): the
// send time (BootTimeMs) of the latest request the current session sent
// that ZooKeeper answered, the session timeout the server granted, and
// which session it was.
// sent_ms is 0 while none has been answered since the session began.
struct SessionLease {
  int64_t sent_ms = 0;
  int64_t timeout_ms = 0;
  uint64_t session = 0;  // changes with every new session (the ZooKeeper handle's)
};

class Registry {
 public:
  // Validates the options (InvalidArgument naming the key: an empty or
  // malformed cluster.zookeeper, a service path not starting with '/', an
  // advertise that is not host:port or whose host is a wildcard such as
  // 0.0.0.0 or ::) and starts the registry's thread, which connects in the
  // background and retries for as long as ZooKeeper is unreachable. Does
  // not wait for ZooKeeper.
  static Status Start(RegistryOptions options, std::unique_ptr<Registry>* result);

  ~Registry();  // Close()
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Asks the registry to register this instance (now, or as soon as it is
  // connected and the settings are checked) and to keep it registered
  // across session expiry. Returns at once. "create_mark": create
  // .cluster/marks/<mark> if missing (a new ring's first mark, a new mark
  // past its import); false: register only while that node exists (one
  // multi), retrying while it does not (partition/change.h).
  void Register(bool create_mark = true);
  // Blocks until the member node exists or "timeout_ms" passes (Unavailable
  // then). For tests and start-up logs.
  Status WaitRegistered(int timeout_ms);

  // Deletes this instance's member node (if it exists and is held by our
  // session) and stops registering again after session expiry, until the
  // next Register(), which registers anew (a new node, a new czxid: the
  // member rejoins at the tail). Returns at once; the registry thread
  // deletes the node as soon as it is connected. registration_czxid() is 0
  // from the moment it returns.
  void Deregister();
  // The creation zxid of this instance's current member node, 0 while it is
  // not registered (before the first registration, after Deregister(), and
  // from session expiry until the registry has registered again). Equals
  // the czxid of this member in ring()'s chain once that ring was read.
  int64_t registration_czxid() const;

  // Records "members" (chain order, head first, each "host:port") as this
  // instance's mark's chain, decided on the ring of version "ring_version"
  // (ChainOutput::record and record_version):
  //   - if .cluster/chains/<mark> already holds a greater ring_version, a
  //     later chain is recorded: nothing is written, OK;
  //   - if it already holds this very chain, nothing is written, OK (a
  //     write would only change the ring's version);
  //   - else it is written in one zoo_multi with a check of this instance's
  //     member node, so only a currently registered member can record, and
  //     only through the session that holds its node: a member whose
  //     session expired cannot; a write by another instance between our
  //     read and our write is seen (version check) and the rule applied
  //     again, a few times at most;
  //   - the same zoo_multi checks that the member node of every other
  //     member named still exists: if one left, nothing is written, OK (a
  //     chain without it, deciding on an older record of its own members,
  //     may already have committed writes it lacks, so a record naming it
  //     must not land late).
  // OK once written (or found not to need writing) and, unless ZooKeeper
  // failed right after, once ring() shows what the node holds now.
  // Unavailable "not registered" when this instance does not hold its
  // member node (never registered, after Deregister(), after session
  // expiry, an observer): nothing written. Unavailable when ZooKeeper does
  // not answer within the session timeout (the message says whether the
  // write may still have happened). InvalidArgument for an empty chain, a
  // member that is not host:port or a negative version. Blocks the caller:
  // never call it from a callback (the registry thread).
  Status RecordChain(const std::vector<std::string>& members, int64_t ring_version);

  // Removes the member node of "member" ("host:port", this instance's mark)
  // if its creation zxid is still "czxid": that registration's process is
  // gone (ChainMember::OnPeerRefused). Returns at once; the registry thread
  // deletes it once connected, and nobody learns the outcome but from the
  // ring.
  void Evict(const std::string& member, int64_t czxid);
  // Removes a member node of this instance's own address that another
  // session holds: the previous process's, which is gone since this one
  // serves its port (call only then). Its chain re-forms at once instead
  // of a session timeout later. Returns at once.
  void RemoveStale();

  // One round trip to ZooKeeper through the current session (a read: the
  // server it is connected to answers it from its own copy). OK means that
  // server answered, after this call began, on a session it holds valid.
  // It says nothing about the registration: after session expiry the new
  // session answers too, so compare registration_czxid(); nor about the
  // lease (lease()). Unavailable if no answer within "timeout_ms". Blocks
  // the caller.
  Status Ping(int timeout_ms);

  // The ring change node (.cluster/change, RingChange in ring.h),
  // written on the registry's thread; each returns once ring() shows the
  // result. CreateChange is Busy, naming the change, while another one
  // exists (one change at a time). UpdateChange overwrites the data and
  // DeleteChange removes the node only if it is still "change"'s (same
  // czxid; Busy otherwise; NotFound / OK if it is gone). AbortChange
  // removes whatever change runs if it is still in state "copy" (nothing
  // registered yet: a roll-back), InvalidArgument past that. Blocking.
  Status CreateChange(const RingChange& change);
  Status UpdateChange(const RingChange& change);
  Status DeleteChange(const RingChange& change);
  Status AbortChange();
  // Removes .cluster/marks/<change.source> (the mark "change" removes, once
  // no member of it is registered), atomically with a check that the change
  // node is still this change's (its czxid): Busy, deleting nothing, once it
  // is gone or another change's (the remove was finished by another member,
  // and the mark may have been added back since). OK if the mark node is
  // gone. Blocking.
  Status DeleteMark(const RingChange& change);

  // The newest ring, or nullptr while none has been read yet (ZooKeeper
  // unreachable since start). Never blocks.
  std::shared_ptr<const Ring> ring() const;
  // Re-reads the children now (used after a NOT_OWNER) and returns the new
  // ring; Unavailable if ZooKeeper cannot be reached within the session
  // timeout. Blocks the caller, not the completion thread.
  Status Refresh(std::shared_ptr<const Ring>* ring);

  // The lease evidence of the current session. While connected the
  // registry sends a sync() of its own every session timeout / 8, so a
  // session that is heard answers renews it that often; each answer to one
  // counts from its send time. Only syncs count: a sync is answered once it
  // went to the ensemble's leader and back, while a read is answered by
  // whichever server the session is connected to, from its own copy,
  // even by a follower cut from the leader (which may have expired the
  // session already).
  SessionLease lease() const;

  // True while the session is connected.
  bool connected() const;
  // Milliseconds since the session was last connected (0 while connected;
  // since Start() if it never was). Set by the ZooKeeper client's own
  // detection: 2/3 of the session timeout without an answer, or at once
  // when the connection breaks.
  int64_t disconnected_ms() const;
  RegistryStats stats() const;

  // Closes the session (the member node goes at once) and stops the thread.
  // Idempotent.
  void Close();

  // TEST_: the current session's id and password, to expire it from a test
  // (open a second handle with them and close it).
  bool TEST_SessionId(int64_t* id, std::string* password) const;

 private:
  struct Impl;
  explicit Registry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The rule a ring read publishes its view by. "dirty" maps each path whose
// watch fired since it was read (or "*": read everything) to the order of
// that event among the session's events and answers; "change_seq" is the
// order of the change node's answer the view holds; "pass" counts the
// read steps so far. Another step is needed when
//   - a path changed before the change node was read: the view would show
//     the ring older than its change state (a member or mark the change
//     depends on missing);
//   - the change node itself (or everything) changed since it was read:
//     the view holds nodes written after the change node's new state (a
//     chain a member joined after a range was released, say) beside its
//     old state, and a member could serve a range it no longer owns;
//   - anything else changed, for the first kReadPasses steps; after that
//     the view is published and the next event reads it again, so a ring
//     that never stops changing still gets views.
// "change_path" names the change node; "all" the everything key.
bool ReadAgain(const std::map<std::string, uint64_t>& dirty, uint64_t change_seq,
               const std::string& change_path, const std::string& all, int pass, int read_passes);

}  // namespace flatkv::partition
