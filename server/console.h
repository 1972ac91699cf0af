// Console: what the operator console on the HTTP port (GET /ui, the page
// server/console.html) shows and does, as JSON for the routes in http.cc:
//
//   RingJson()     the ring as this instance's registry sees it: each mark
//                  with its hash ranges, its share of the integer keys and
//                  of the string hashes, its chain; the ring change, if any,
//                  with its state and the importer's copy percent.
//   MembersJson()  every member of the ring with its own figures: role,
//                  write mode, ops/s and p99 (recent.*), lag, disk and live
//                  bytes, compaction and snapshot progress; plus members
//                  that left the ring a short while ago (a gap in their
//                  chain), joiners the tails report and a change's importer.
//   SetWriteMode(), Compact(), RemoveMark(), AbortChange()
//                  the admin calls the CLI makes, on this instance's Handler
//                  or, for another member, over a peer connection; a failure
//                  is the Status the CLI would print ("flatkv: " +
//                  ToString()).
//
// Any instance shows the whole ring: a poller thread asks every member for
// stats() and info() over Thrift (the pooled peer connections of the
// Cluster, with the peer TLS settings), once a second while the console is
// being looked at (a members request in the last 30 s), never otherwise.
// Thrift, not the other members' HTTP ports: their Thrift addresses are in
// ZooKeeper and every member serves them, while an HTTP port is optional and
// advertised nowhere. A member that does not answer within a round keeps its
// last figures, marked with their age and the error; its call goes on in
// the background and is not asked again until it ends.
//
// Thread safety: every method may be called from any thread (the HTTP
// thread calls them); the poller's figures are GUARDED_BY(mu_).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "FlatKV.h"
#include "engine/status.h"
#include "server/config.h"

namespace flatkv::client {
class Client;
}

namespace flatkv::partition {
class Ring;
}

namespace flatkv::server {

class Handler;
class RingView;

class Console {
 public:
  // Polls an idle console no more: this long after the last MembersJson().
  static constexpr std::chrono::seconds kIdleAfter{30};
  // A member that left the ring stays listed (as a gap) this long.
  static constexpr std::chrono::seconds kGoneFor{300};

  // "handler" (not owned) must outlive the Console; its ring_view() is the
  // ring (null: a standalone instance, a ring of itself).
  Console(Handler* handler, const Config& config);
  ~Console();  // Stop()

  // GET /admin/ring: one JSON object (README, "Operator console").
  std::string RingJson() const;
  // GET /admin/members: one JSON object. Wakes the poller; a first request
  // after an idle spell waits (at most about a second) for a round.
  std::string MembersJson();

  // The admin actions. "member" is host:port of a ring member (or of this
  // instance); NotFound for any other address. Otherwise the answer of the
  // member's own setWriteMode() / compact(): OK, or its KvError as the
  // client maps it, or the client's network failure.
  Status SetWriteMode(const std::string& member, const std::string& token,
                      rpc::WriteMode::type mode);
  Status Compact(const std::string& member, const std::string& token);
  // removeMark() / abortChange() of this instance.
  Status RemoveMark(const std::string& token, int64_t mark);
  Status AbortChange(const std::string& token);

  // Ends the poller and waits for the calls in flight (each bounded by
  // cluster.peer_timeout_ms). Idempotent.
  void Stop();

  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

 private:
  // What one member answered.
  struct Sample {
    bool ok = false;
    std::string error;  // why not (the Status text)
    rpc::NodeInfo info;
    std::map<std::string, int64_t> stats;
  };
  // The newest sample of a member, and when it was taken.
  struct View {
    Sample last;              // last.ok: figures valid (maybe old)
    bool answered = false;    // its last round answered
    std::string error;        // the last round's failure
    std::chrono::steady_clock::time_point at;  // of "last"
  };
  // A listed member: its mark, chain position, ring role and state.
  struct Entry {
    std::string address;
    int64_t mark = 0;
    int position = -1;      // in its chain; -1: in none
    std::string ring_role;  // RoleOf in the ring; empty when in no chain
    std::string state;      // serving | joining | importing | gone | starting
  };
  // A member that left the ring, with its mark, since when.
  struct Gone {
    int64_t mark = 0;
    std::chrono::steady_clock::time_point since;
  };

  std::string Self() const;
  bool IsSelf(const std::string& address) const;
  Sample SampleSelf() const;
  Sample SampleRemote(const std::string& address) const;
  // The addresses to poll now (with their marks): the ring's members,
  // those gone a short while ago, joiners the tails report, the importer.
  std::map<std::string, int64_t> Targets();  // EXCLUSIVE_LOCKS_REQUIRED(mu_)
  void Loop();
  void Round();
  // Every member to list, chain by chain, then the others (mu_ held);
  // "upstream" gets each chain member's predecessor.
  std::vector<Entry> Entries(const partition::Ring* ring,
                             std::map<std::string, std::string>* upstream) const;
  bool Known(const std::string& address);
  // Runs the next round at once (after an action).
  void Kick();
  // Runs "local" on this instance or "remote" on a pooled connection to
  // "member" (which must be known): the Status the CLI would get.
  Status OnMember(const std::string& member, const std::function<void()>& local,
                  const std::function<Status(client::Client&)>& remote);

  Handler* const handler_;
  RingView* const ring_view_;
  const Config config_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
  bool kick_ = false;  // a round now (an action changed a member)
  uint64_t rounds_ = 0;
  std::chrono::steady_clock::time_point wanted_;  // the last MembersJson()
  std::map<std::string, View> views_;             // by address
  std::map<std::string, int64_t> seen_;           // ring members of the last round, by mark
  std::map<std::string, int64_t> marks_;          // the last round's targets, by mark
  std::map<std::string, Gone> gone_;
  // The calls in flight, by address: the poller thread's alone.
  std::map<std::string, std::future<Sample>> inflight_;
};

}  // namespace flatkv::server
