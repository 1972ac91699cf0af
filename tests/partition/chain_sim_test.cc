// Deterministic simulation of chain replication (partition/chain.h), in the
// manner of FoundationDB's simulator and TigerBeetle's VOPR (STYLE.md §9):
// one mark, four members, ZooKeeper and a network, all driven by one seeded
// scheduler in one thread. Messages are delayed, reordered and dropped;
// members crash (restarting with their store, or wiped; meanwhile their port
// refuses connections, and a member that hears so evicts the dead one's
// node: ChainMember::OnPeerRefused), pause (SIGSTOP) for
// less or more than their session timeout and wake up believing they still
// lead, are cut from ZooKeeper but not from their peers and clients, lose
// their sessions, and rejoin through catch-up (log replay or a fuzzy
// snapshot). Clients write through the head and read from the tail, and
// sometimes, with a stale view of the ring, from any member.
//
// ZooKeeper is modelled as its server and client behave, and the member's
// lease is the production rule (ChainMember::OnSessionAnswer): each member's
// shell sends a probe every session timeout / 8, the server notes when it
// last heard the session and expires it one timeout later, removing its
// member node; the shell reports each answered probe's send time and
// session; a client learns of its expiry only once it reaches the server
// again, and its shell then starts a new session at once, telling the
// member nothing but the new session's answers and the ring. The
// simulation never tells a member its lease is gone: it must work that out
// from the time. FLATKV_SIM_LEASE=disconnect runs the rule that counted the
// lease from the client library's disconnect report instead (2/3 of a
// timeout after the server last heard it), which must fail; so must
// FLATKV_SIM_LEASE=unnamed, a shell that does not say which session
// answered or registered, and FLATKV_SIM_LEASE=unconfirmed, a shell that
// answers a read with what it read from the store (a few milliseconds
// after the member let it through, as a server thread does) without
// asking the member again.
//
// Checked after every event: no value nobody wrote (every value is a write
// id with the one sequence number the head gave it); under sync no read went
// backwards (a read returns at least the newest write to its key that was
// acknowledged, or read, before the read began); no two writes share an
// (epoch, seq). At the end, after healing every fault and a quiet period:
// every member is back in the chain, all replicas are equal, and every
// acknowledged write is in all of them (under async, every write the chain
// still holds).
//
// Under storage.sync: always (the third mode) a member works as
// Replicator::Process does, a pipeline: a batch is logged and the writes it
// passes down go at once; its fdatasync takes a few milliseconds on the
// syncer while the member goes on taking events, whose batches are logged
// and passed down too and share the next fdatasync; everything else an
// output does (apply to the store, ack up, answer) waits, in order, until
// the sync covering it is done. An output that wipes, records, starts a
// snapshot or (de)registers, and a snapshot's load, first drain the
// pipeline (the member takes no event meanwhile). A crash then is a power
// loss: the member restarts from what it had synced, though its successor
// may hold more.
//
// A failing seed is printed and replays exactly with FLATKV_SIM_SEED=<seed>
// (and FLATKV_SIM_LEASE=disconnect for the old rule, =unnamed for a shell
// that does not say which session answered, =unconfirmed for one that does
// not confirm its reads);
// FLATKV_SIM_SEEDS=<n> runs seeds 1..n (default 1000 per mode, about 15 s);
// FLATKV_SIM_DIRECT=0|1 forces ChainOptions::direct_commit (by default on
// for even seeds, except under always).
#include "partition/chain.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using flatkv::partition::ChainConfig;
using flatkv::partition::ChainEntry;
using flatkv::partition::ChainMember;
using flatkv::partition::ChainMessage;
using flatkv::partition::ChainOptions;
using flatkv::partition::ChainOutput;
using flatkv::partition::ChainPosition;

namespace {

constexpr int kMembers = 4;
constexpr uint64_t kKeys = 12;
constexpr int64_t kSessionMs = 600;  // ZooKeeper drops a silent member after this
constexpr int64_t kProbeMs = kSessionMs / 8;  // the registry's lease probe

// How a member's shell turns its ZooKeeper session into lease evidence
// and answers reads: the production rules, or a weaker one the simulation
// must catch.
enum class LeaseRule {
  kProbe,       // the production rules: each answered probe's send time
  kDisconnect,  // the old rule: "answered now" while the client library
                // reports itself connected (the lease then ends half a
                // timeout after it reports the disconnect)
  kUnnamed,     // the production rule, but the shell does not say which
                // session answered or registered (all session 0): a
                // member cannot tell that its registration expired when a
                // new session answers
  kUnconfirmedRead,  // the production lease, but the shell answers a read
                     // with what it read from the store without asking the
                     // member again (ChainMember::ConfirmRead): the store
                     // may have taken a newer, uncommitted write meanwhile
  kUnconditionalRecord,  // a head's record of its chain lands even after a
                         // member it names left (the registry's multi
                         // without the check of the other members' nodes)
};

// A store value: the write that set it (0 = removed) and that write's seq.
struct Val {
  uint64_t write = 0;
  uint64_t seq = 0;
  bool operator==(const Val& o) const { return write == o.write && seq == o.seq; }
};
using Store = std::map<uint64_t, Val>;

// op encoding: "P <key> <write>" or "R <key> <write>" (a remove also has a
// write id, to name it in checks).
std::string EncodeOp(char kind, uint64_t key, uint64_t write) {
  return std::string(1, kind) + " " + std::to_string(key) + " " + std::to_string(write);
}
void DecodeOp(const std::string& op, char* kind, uint64_t* key, uint64_t* write) {
  std::istringstream in(op);
  in >> *kind >> *key >> *write;
}

struct Node {
  std::string address;
  std::unique_ptr<ChainMember> member;
  Store store;
  bool alive = true;
  bool paused = false;
  bool session = true;     // holds a ZooKeeper session (the server's view)
  int64_t heard = 0;       // the server: when it last heard this session
  int64_t zk_cut_until = 0;  // the link to ZooKeeper is down until then
  bool probe_in_flight = false;
  int64_t probe_sent = 0;
  int64_t client_heard = 0;  // the client: when it last heard the server
  int64_t resumed_at = 0;    // the last SIGCONT (the old rule's freeze check)
  bool registered = false;
  uint64_t gen = 0;        // session generation: a stale expiry leaves a new one alone
  bool intact = true;      // store not wiped since it last registered
  // Bumped by a crash and by a wipe: a snapshot stream this member was
  // sending breaks (its process died, or the shell stopped the streams
  // of a store it empties: Replicator::Wipe).
  uint64_t incarnation = 0;
  int64_t paused_until = 0;
  int64_t down_until = 0;  // crashed: restarts then
  std::vector<std::function<void()>> held;  // events that arrived while paused or blocked
  // storage.sync: always. The pipeline: outputs waiting for the sync of
  // their batch (the last one logged before them), batches logged, whether
  // an fdatasync runs, and the position the last finished one made durable.
  struct Waiting {
    ChainOutput out;
    uint64_t batch = 0;
  };
  std::deque<Waiting> pipeline;
  uint64_t logged = 0;
  bool sync_running = false;
  ChainPosition synced;
  // The member takes no event: it syncs a batch itself (the pipeline was
  // empty) or waits for the pipeline to drain to run after_drain.
  bool blocked = false;
  std::function<void()> after_drain;
};

struct Write {
  uint64_t key = 0;
  char kind = 'P';
  uint64_t seq = 0;  // 0 until the head applied it
  int64_t epoch = 0;
  bool acked = false;
  int64_t acked_at = 0;
};

struct Read {
  uint64_t key = 0;
  int64_t start = 0;
  int node = 0;
};

class Sim {
 public:
  Sim(uint64_t seed, bool sync, bool always = false, LeaseRule rule = LeaseRule::kProbe)
      : rng_(seed), sync_(sync), always_(always), rule_(rule) {
    options_.resend_ms = 40;
    options_.joiner_timeout_ms = 400;
    options_.backlog_bytes = 600;  // small: catch-ups need snapshots too
    options_.max_batch_entries = 8;
    options_.catchup_lag = 4;
    // As flatkv-server: under always members pass batches on before they
    // sync and the commit point climbs through the acks; else half the
    // seeds with the tail's direct kCommit, half relaying only.
    options_.sends_before_sync = always;
    late_reads_ = seed % 3 == 0;
    options_.direct_commit = !always && seed % 2 == 0;
    if (const char* direct = std::getenv("FLATKV_SIM_DIRECT")) {
      options_.direct_commit = !always && std::string(direct) == "1";
    }
    for (int i = 0; i < kMembers; ++i) {
      nodes_.emplace_back();
      Node& n = nodes_.back();
      n.address = std::string(1, 'm') + static_cast<char>('0' + i);  // (GCC 12 -Wrestrict false positive on "m" + to_string)
      n.member = std::make_unique<ChainMember>(n.address, options_, ChainPosition{});
    }
    // The first member registers on the empty mark; the others join.
    for (int i = 0; i < kMembers; ++i) {
      At(static_cast<int64_t>(i) * 30, [this, i] { Start(i); });
    }
  }

  // Runs until "end" ms with faults until "faults_until", then heals.
  void Run(int64_t faults_until, int64_t end) {
    faults_until_ = faults_until;
    clients_until_ = end - 2000;  // then quiet: the chain settles
    for (int64_t t = 0; t < end; t += 5) {
      At(t, [this] { Step(); });
    }
    for (int64_t t = 0; t < end; t += 20) {
      At(t, [this] {
        for (int i = 0; i < kMembers; ++i) Deliver(i, [this, i] { Do(i, [&](ChainOutput* o) {
          // As Replicator::Tick: a member out of its chain (fenced, or
          // left) starts to catch up again.
          const std::string role = nodes_[i].member->role();
          if (role == "fenced" || role == "none") nodes_[i].member->StartJoin(now_, o);
          nodes_[i].member->OnTick(now_, o); }); });
      });
    }
    At(faults_until, [this] { Heal(); });
    while (!events_.empty() && failure_.empty()) {
      auto [time, order, fn] = events_.top();
      events_.pop();
      if (time > end) break;
      now_ = time;
      fn();
      Check();
    }
  }

  const std::string& failure() const { return failure_; }
  uint64_t overlapped() const { return overlapped_; }
  uint64_t evictions() const { return evictions_; }
  uint64_t rereads() const { return rereads_; }
  std::string Summary() const {
    std::ostringstream s;
    s << "writes " << writes_.size() << " (acked " << acked_ << "), reads " << reads_done_
      << " (read again " << rereads_ << ")"
      << ", crashes " << crashes_ << ", pauses " << pauses_ << ", ZooKeeper cuts " << cuts_
      << ", expiries " << expiries_ << ", evictions " << evictions_
      << ", snapshots " << snapshots_ << ", drops " << drops_ << ", batches overlapping a sync "
      << overlapped_ << ", chain";
    for (const std::string& m : chain_) s << " " << m;
    s << ", recorded";
    for (const std::string& m : recorded_) s << " " << m;
    for (const Node& n : nodes_) {
      s << "\n  " << n.address << ": " << n.member->role() << " applied " << n.member->applied().seq
        << " committed " << n.member->committed() << " down '" << n.member->downstream()
        << "' at " << n.member->downstream_applied() << (n.alive ? "" : " DEAD")
        << (n.paused ? " PAUSED" : "") << (n.registered ? " registered" : "")
        << (n.session ? " session" : " no-session") << " refused " << n.member->refused_messages()
        << " keys " << n.store.size() << (n.intact ? " intact" : " wiped");
    }
    return s.str();
  }

  // After the quiet period: everyone in the chain, replicas equal, every
  // acknowledged write there.
  void CheckFinal() {
    if (!failure_.empty()) return;
    if (static_cast<int>(chain_.size()) != kMembers) {
      return Fail("after healing only " + std::to_string(chain_.size()) +
                  " members are in the chain");
    }
    const Store& first = nodes_[0].store;
    for (int i = 1; i < kMembers; ++i) {
      if (!(nodes_[i].store == first)) return Fail("replicas differ: m0 and m" + std::to_string(i));
    }
    for (const auto& [id, w] : writes_) {
      if (!w.acked || (!sync_ && w.seq == 0)) continue;
      auto it = first.find(w.key);
      uint64_t have = it == first.end() ? 0 : it->second.seq;
      if (sync_ && have < w.seq) {
        return Fail("acknowledged write " + std::to_string(id) + " (seq " +
                    std::to_string(w.seq) + ") to key " + std::to_string(w.key) +
                    " is missing: the replicas hold seq " + std::to_string(have));
      }
    }
    if (acked_ == 0) Fail("no write was acknowledged at all");
  }

 private:
  using Event = std::tuple<int64_t, uint64_t, std::function<void()>>;
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b)
                                              : std::get<1>(a) > std::get<1>(b);
    }
  };

  int64_t Rand(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Chance(int percent) { return Rand(0, 99) < percent; }
  void At(int64_t t, std::function<void()> fn) { events_.emplace(t, order_++, std::move(fn)); }
  void Fail(const std::string& what) {
    if (failure_.empty()) failure_ = "t=" + std::to_string(now_) + ": " + what;
  }

  // Runs fn on node i now, or when it wakes (paused), or never (dead).
  void Deliver(int i, std::function<void()> fn) {
    Node& n = nodes_[i];
    if (!n.alive) return;
    if (n.paused || n.blocked) {
      n.held.push_back(std::move(fn));
      return;
    }
    fn();
  }
  // Runs what node i held, in order, until it pauses or blocks again.
  void RunHeld(int i) {
    Node& n = nodes_[i];
    while (n.alive && !n.paused && !n.blocked && !n.held.empty()) {
      std::function<void()> fn = std::move(n.held.front());
      n.held.erase(n.held.begin());
      fn();
    }
  }

  ChainConfig Config() const {
    ChainConfig c;
    c.sync = sync_;
    c.members = chain_;
    uint64_t id = 1469598103934665603ULL;
    for (size_t k = 0; k < chain_.size(); ++k) {
      c.epochs.push_back(czxid_.at(chain_[k]));
      for (char ch : chain_[k]) id = (id ^ static_cast<uint8_t>(ch)) * 1099511628211ULL;
      id = (id ^ static_cast<uint64_t>(c.epochs.back())) * 1099511628211ULL;
    }
    c.id = id;
    c.version = version_;
    c.recorded = recorded_;
    c.recorded_version = recorded_version_;
    c.recorded_zxid = recorded_zxid_;
    return c;
  }

  // ZooKeeper changed: every live member learns the new chain, each after
  // its own delay (watch delivery is not simultaneous).
  void Publish() {
    ++version_;
    ChainConfig c = Config();
    if (trace_) {
      std::string m, r;
      for (const auto& x : c.members) m += x + " ";
      for (const auto& x : c.recorded) r += x + " ";
      std::fprintf(stderr, "%6lld CONFIG %llx [%s] recorded [%s]\n", static_cast<long long>(now_),
                   static_cast<unsigned long long>(c.id & 0xffff), m.c_str(), r.c_str());
    }
    for (int i = 0; i < kMembers; ++i) {
      // A ZooKeeper client sees changes in order: FIFO per member.
      int64_t at = std::max(config_due_[i], now_ + Rand(1, 30));
      config_due_[i] = at;
      DeliverConfig(i, c, at);
    }
  }
  // A watch reaches a member only over its link to ZooKeeper: one cut
  // from it reads the ring again once the link is back.
  void DeliverConfig(int i, const ChainConfig& c, int64_t at) {
    At(at, [this, i, c] {
      if (!ZkLinkUp(i)) return DeliverConfig(i, c, nodes_[i].zk_cut_until + Rand(1, 30));
      Deliver(i, [this, i, c] {
        if (trace_) std::fprintf(stderr, "%6lld %s gets config v%lld (%zu members)\n",
                                 static_cast<long long>(now_), nodes_[i].address.c_str(),
                                 static_cast<long long>(c.version), c.members.size());
        Do(i, [&](ChainOutput* o) { nodes_[i].member->OnConfig(c, now_, o); });
      });
    });
  }

  void Register(int i) {
    Node& n = nodes_[i];
    if (!n.alive || n.registered || n.paused) return;
    // Asked while the session expires: the registry makes it through the
    // next one.
    if (!n.session) return At(now_ + Rand(10, 50), [this, i] { RegisterLater(i); });
    if (!n.member->wants_registration()) return;
    n.registered = true;
    n.intact = true;
    czxid_[n.address] = ++zxid_;
    n.member->OnRegistered(zxid_, SessionName(n.gen), now_);  // zoo_create returns it to the shell
    chain_.push_back(n.address);
    Publish();
  }
  // The registry retries a request while its link to ZooKeeper is down,
  // and carries it out once a stopped process goes on.
  void RegisterLater(int i) {
    const Node& n = nodes_[i];
    if (ZkLinkUp(i) && !n.paused) return Register(i);
    const int64_t after = n.paused ? std::max(now_, n.paused_until) : n.zk_cut_until;
    At(after + Rand(1, 10), [this, i] { RegisterLater(i); });
  }
  void RecordLater(int i, std::vector<std::string> rec, int64_t version, uint64_t gen, int64_t at) {
    At(at, [this, rec, version, i, gen] {
      if (!nodes_[i].alive || !nodes_[i].session || nodes_[i].gen != gen) return;
      // The connection is lost around the write and it did not land (the
      // shell hears of it or not: the member learns only from the ring).
      if (Chance(5)) return;
      if (!ZkLinkUp(i)) {
        return RecordLater(i, rec, version, gen, nodes_[i].zk_cut_until + Rand(1, 10));
      }
      if (version < recorded_version_) return;
      if (version == recorded_version_ && rec == recorded_) return;  // nothing to write
      // And only while every member it names is registered (Registry's
      // multi checks their nodes): one that left may lack what a chain
      // without it committed since, under an older record.
      if (rule_ != LeaseRule::kUnconditionalRecord) {
        for (const std::string& m : rec) {
          if (!nodes_[IndexOf(m)].registered) return;
        }
      }
      recorded_version_ = version;
      recorded_ = rec;
      recorded_zxid_ = ++zxid_;
      Publish();  // a watch on the mark node
    });
  }
  // Registry::Evict: through the member's own session, the node of that
  // registration (same creation zxid) only.
  void EvictLater(int i, ChainOutput::Evict e, uint64_t gen, int64_t at) {
    At(at, [this, i, e, gen] {
      if (!nodes_[i].alive || !nodes_[i].session || nodes_[i].gen != gen) return;
      if (Chance(5)) return;  // lost with the connection
      if (!ZkLinkUp(i)) return EvictLater(i, e, gen, nodes_[i].zk_cut_until + Rand(1, 10));
      const int j = IndexOf(e.member);
      if (!nodes_[j].registered || czxid_.at(e.member) != e.epoch) return;
      ++evictions_;
      if (trace_) std::fprintf(stderr, "%6lld %s EVICTS %s\n", static_cast<long long>(now_),
                               nodes_[i].address.c_str(), e.member.c_str());
      Unregister(j);
    });
  }
  void Unregister(int i) {
    Node& n = nodes_[i];
    if (!n.registered) return;
    n.registered = false;
    chain_.erase(std::find(chain_.begin(), chain_.end(), n.address));
    Publish();
  }

  void Start(int i) {
    Node& n = nodes_[i];
    // Killed before its first start: it starts when the crash's restart
    // comes (Restart), not over the dead process's state now.
    if (!n.alive) return;
    n.alive = true;
    n.session = true;
    n.heard = now_;
    n.client_heard = now_;
    n.probe_in_flight = false;
    ++n.gen;
    // A restarted instance replaces the member node its dead process left.
    if (n.registered) Unregister(i);
    ChainConfig c = Config();
    Do(i, [&](ChainOutput* o) {
      n.member->OnConfig(c, now_, o);
      n.member->StartJoin(now_, o);
    });
  }

  // Calls fn on node i's member and carries out its output.
  void Do(int i, const std::function<void(ChainOutput*)>& fn) {
    ChainOutput out;
    std::string before = trace_ ? nodes_[i].member->role() : "";
    fn(&out);
    if (trace_ && before != nodes_[i].member->role()) {
      std::fprintf(stderr, "%6lld %s ROLE %s -> %s\n", static_cast<long long>(now_),
                   nodes_[i].address.c_str(), before.c_str(), nodes_[i].member->role());
    }
    Carry(i, out);
  }

  void Carry(int i, const ChainOutput& out) {
    Node& n = nodes_[i];
    if (!always_) {
      CarryNow(i, out);
      n.synced = n.member->applied();
      return;
    }
    const bool drain = out.wipe || !out.record.empty() || !out.snapshots.empty() ||
                       out.deregister || out.register_now;
    if (drain) return DrainThen(i, [this, i, out] { CarryAlone(i, out); });
    if (n.pipeline.empty() && out.apply.empty()) return CarryAlone(i, out);
    ChainOutput rest = out;
    if (!out.apply.empty()) {
      SendDownFirst(i, &rest);
      ++n.logged;
      if (n.sync_running) ++overlapped_;  // logged and sent while the last batch syncs
      if (!n.sync_running) StartSync(i);
    }
    n.pipeline.push_back({std::move(rest), n.logged});
  }

  // What goes down the chain leaves now, unless a message to the same
  // member waits before it (in this output or the pipeline).
  void SendDownFirst(int i, ChainOutput* out) {
    const Node& n = nodes_[i];
    auto waits = [](const std::vector<ChainOutput::Send>& sends, const std::string& to) {
      return std::any_of(sends.begin(), sends.end(),
                         [&](const ChainOutput::Send& w) { return w.to == to; });
    };
    std::vector<ChainOutput::Send> later;
    for (const ChainOutput::Send& s : out->sends) {
      const bool blocked =
          waits(later, s.to) || std::any_of(n.pipeline.begin(), n.pipeline.end(),
                                            [&](const Node::Waiting& w) {
                                              return waits(w.out.sends, s.to);
                                            });
      if (s.msg.kind == ChainMessage::Kind::kReplicate && !blocked) {
        Send(i, s);
      } else {
        later.push_back(s);
      }
    }
    out->sends = std::move(later);
  }

  // An output carried out with the pipeline empty: at once, or (writes)
  // logged, passed down, synced by the member itself and then the rest.
  void CarryAlone(int i, const ChainOutput& out) {
    Node& n = nodes_[i];
    if (out.apply.empty()) {
      CarryNow(i, out);
      n.synced = n.member->applied();
      return;
    }
    ChainOutput rest = out;
    SendDownFirst(i, &rest);
    n.blocked = true;
    const ChainPosition pos = n.member->applied();
    At(now_ + Rand(1, 4), [this, i, rest, pos, inc = n.incarnation] {
      SyncedAlone(i, rest, pos, inc);
    });
  }
  void SyncedAlone(int i, const ChainOutput& rest, ChainPosition pos, uint64_t incarnation) {
    Node& n = nodes_[i];
    if (!n.alive || n.incarnation != incarnation) return;  // lost with the power
    if (n.paused) {  // synced, but the process is stopped: it goes on at SIGCONT
      At(std::max(now_, n.paused_until) + 1,
         [this, i, rest, pos, incarnation] { SyncedAlone(i, rest, pos, incarnation); });
      return;
    }
    n.blocked = false;
    n.synced = pos;
    CarryNow(i, rest);
    if (!n.blocked && n.pipeline.empty()) n.synced = n.member->applied();
    RunHeld(i);
  }

  // Runs fn once the pipeline is empty; the member takes no event until then.
  void DrainThen(int i, std::function<void()> fn) {
    Node& n = nodes_[i];
    if (n.pipeline.empty()) return fn();
    n.blocked = true;
    n.after_drain = std::move(fn);
  }

  // The syncer's fdatasync of every batch logged so far.
  void StartSync(int i) {
    Node& n = nodes_[i];
    n.sync_running = true;
    const uint64_t target = n.logged;
    const ChainPosition pos = n.member->applied();
    At(now_ + Rand(1, 4), [this, i, target, pos, inc = n.incarnation] {
      SyncDone(i, target, pos, inc);
    });
  }
  void SyncDone(int i, uint64_t target, ChainPosition pos, uint64_t incarnation) {
    Node& n = nodes_[i];
    if (!n.alive || n.incarnation != incarnation) return;  // lost with the power
    if (n.paused) {
      At(std::max(now_, n.paused_until) + 1,
         [this, i, target, pos, incarnation] { SyncDone(i, target, pos, incarnation); });
      return;
    }
    n.sync_running = false;
    n.synced = pos;
    while (!n.pipeline.empty() && n.pipeline.front().batch <= target) {
      ChainOutput out = std::move(n.pipeline.front().out);
      n.pipeline.pop_front();
      CarryNow(i, out);
    }
    if (n.logged > target) StartSync(i);
    if (n.pipeline.empty() && n.after_drain) {
      std::function<void()> fn = std::move(n.after_drain);
      n.after_drain = nullptr;
      n.blocked = false;
      fn();
    }
    RunHeld(i);
  }

  void CarryNow(int i, const ChainOutput& out) {
    Node& n = nodes_[i];
    if (out.wipe) {
      n.store.clear();
      n.intact = false;
      ++n.incarnation;
    }
    for (const ChainEntry& e : out.apply) {
      char kind;
      uint64_t key, write;
      DecodeOp(e.op, &kind, &key, &write);
      auto [it, fresh] = applied_ids_.emplace(std::make_pair(e.epoch, e.seq), write);
      if (!fresh && it->second != write) {
        Fail("two writes share epoch " + std::to_string(e.epoch) + " seq " +
             std::to_string(e.seq) + ": " + std::to_string(it->second) + " and " +
             std::to_string(write));
      }
      Write& w = writes_.at(write);
      if (w.seq == 0) {
        w.seq = e.seq;
        w.epoch = e.epoch;
      } else if (w.seq != e.seq || w.epoch != e.epoch) {
        Fail("write " + std::to_string(write) + " applied as seq " + std::to_string(e.seq) +
             " and as seq " + std::to_string(w.seq));
      }
      n.store[key] = Val{kind == 'P' ? write : 0, e.seq};
    }
    if (!out.record.empty()) {
      // A conditional write: a record based on an older ring is refused.
      // Written through the member's own session: an expired session (a
      // member that woke from a pause) cannot write.
      RecordLater(i, out.record, out.record_version, n.gen, now_ + Rand(1, 10));
    }
    for (const ChainOutput::Send& s : out.sends) Send(i, s);
    for (const ChainOutput::Reply& r : out.replies) Reply(r.request, r.status.ok());
    for (uint64_t r : out.reads) ReadStore(r, i);
    for (const ChainOutput::Snapshot& s : out.snapshots) Snapshot(i, s);
    for (const ChainOutput::Evict& e : out.evict) EvictLater(i, e, n.gen, now_ + Rand(1, 10));
    if (trace_ && (out.register_now || out.deregister || out.wipe)) {
      std::fprintf(stderr, "%6lld %s%s%s%s\n", static_cast<long long>(now_), n.address.c_str(),
                   out.register_now ? " REGISTER" : "", out.deregister ? " DEREGISTER" : "",
                   out.wipe ? " WIPE" : "");
    }
    if (out.register_now) At(now_ + Rand(1, 10), [this, i] { RegisterLater(i); });
    if (out.deregister) Unregister(i);
  }

  int IndexOf(const std::string& address) const { return address[1] - '0'; }

  void Send(int from, const ChainOutput::Send& s) {
    if (trace_) {
      std::fprintf(stderr, "%6lld %s -> %s kind %d chain %llx entries %zu applied %llu committed %llu pos %llu\n",
                   static_cast<long long>(now_), nodes_[from].address.c_str(), s.to.c_str(),
                   static_cast<int>(s.msg.kind), static_cast<unsigned long long>(s.msg.chain & 0xffff),
                   s.msg.entries.size(), static_cast<unsigned long long>(s.msg.applied),
                   static_cast<unsigned long long>(s.msg.committed),
                   static_cast<unsigned long long>(s.msg.position.seq));
    }
    if (Chance(3)) {
      ++drops_;
      return;
    }
    int to = IndexOf(s.to);
    std::string sender = nodes_[from].address;
    ChainMessage msg = s.msg;
    At(now_ + Rand(1, 15), [this, from, to, sender, msg] {
      if (!nodes_[to].alive) {
        // Nothing listens on a dead process's port: its host refuses the
        // connection, and the sender hears so (a stopped process keeps
        // its port: the kernel still accepts).
        const std::string refused = nodes_[to].address;
        At(now_ + Rand(1, 5), [this, from, refused] {
          Deliver(from, [this, from, refused] { Do(from, [&](ChainOutput* o) {
            nodes_[from].member->OnPeerRefused(refused, now_, o); }); });
        });
        return;
      }
      Deliver(to, [this, to, sender, msg] { Do(to, [&](ChainOutput* o) {
        nodes_[to].member->OnMessage(sender, msg, now_, o); }); });
    });
  }

  // The stream begins at the joiner, then the source's store is copied as
  // it is later (writes went on meanwhile: a fuzzy copy) and loaded, then
  // the joiner resumes after "at". A source that dies or pauses breaks it.
  void Snapshot(int from, const ChainOutput::Snapshot& s) {
    ++snapshots_;
    int to = IndexOf(s.to);
    ChainPosition at = s.at;
    std::string source = nodes_[from].address;
    const uint64_t incarnation = nodes_[from].incarnation;
    At(now_ + Rand(1, 30), [this, from, to, at, source, incarnation] {
      if (!nodes_[from].alive || nodes_[from].paused || nodes_[from].incarnation != incarnation) {
        return;
      }
      Deliver(to, [this, from, to, at, source, incarnation] {
        uint64_t token = 0;
        Do(to, [&](ChainOutput* o) {
          token = nodes_[to].member->OnSnapshotBegin(source, at, now_, o);
        });
        const bool accepted = token != 0;
        if (trace_) {
          std::fprintf(stderr, "%6lld SNAPSHOT %s -> %s at %llu %s\n", static_cast<long long>(now_),
                       source.c_str(), nodes_[to].address.c_str(),
                       static_cast<unsigned long long>(at.seq), accepted ? "begins" : "refused");
        }
        if (!accepted) return;
        At(now_ + Rand(5, 40), [this, from, to, token, incarnation] {
          if (!nodes_[from].alive || nodes_[from].paused ||
              nodes_[from].incarnation != incarnation) {
            // The stream broke: the joiner's shell notices.
            Deliver(to, [this, to, token] { Do(to, [&](ChainOutput* o) {
              nodes_[to].member->OnSnapshotFailed(token, now_, o); }); });
            return;
          }
          Store copy = nodes_[from].store;
          // The newest write the copy may hold.
          const ChainPosition end = nodes_[from].member->applied();
          // Loaded on the store as the member's state names it (the shell's
          // page loads are serial events): after the pipeline drained.
          Deliver(to, [this, to, token, copy, end] { DrainThen(to, [this, to, token, copy, end] {
            if (!nodes_[to].member->snapshot_current(token)) return;
            nodes_[to].store = copy;
            if (trace_) {
              auto k1 = copy.find(1);
              std::fprintf(stderr, "%6lld SNAPSHOT loaded at %s: %zu keys, key 1 at seq %llu\n",
                           static_cast<long long>(now_), nodes_[to].address.c_str(), copy.size(),
                           static_cast<unsigned long long>(k1 == copy.end() ? 0 : k1->second.seq));
            }
            Do(to, [&](ChainOutput* o) { nodes_[to].member->OnSnapshotLoaded(token, end, now_, o); });
          }); });
        });
      });
    });
  }

  void Reply(uint64_t request, bool ok) {
    if (pending_reads_.erase(request) > 0) return;  // a parked read refused
    auto it = requests_.find(request);
    if (it == requests_.end()) return Fail("a reply to an unknown request");
    uint64_t write = it->second;
    requests_.erase(it);
    if (!ok) return;
    Write& w = writes_.at(write);
    if (trace_) std::fprintf(stderr, "%6lld ACK write %llu seq %llu\n", static_cast<long long>(now_),
                             static_cast<unsigned long long>(write), static_cast<unsigned long long>(w.seq));
    if (w.seq == 0) return Fail("write " + std::to_string(write) + " acknowledged, never applied");
    w.acked = true;
    w.acked_at = now_;
    ++acked_;
    uint64_t& floor = floor_[w.key];
    floor = std::max(floor, w.seq);
  }

  // Answers read "request" at "node" with "got", and checks it.
  void ServeRead(uint64_t request, int node, Val got) {
    auto it = pending_reads_.find(request);
    if (it == pending_reads_.end()) return;
    Read r = it->second;
    pending_reads_.erase(it);
    ++reads_done_;
    if (got.write != 0) {
      auto w = writes_.find(got.write);
      if (w == writes_.end() || w->second.key != r.key || w->second.seq != got.seq) {
        return Fail("read of key " + std::to_string(r.key) + " returned write " +
                    std::to_string(got.write) + " that nobody wrote there");
      }
    }
    if (trace_) {
      std::fprintf(stderr, "%6lld READ key %llu at %s seq %llu\n", static_cast<long long>(now_),
                   static_cast<unsigned long long>(r.key), nodes_[node].address.c_str(),
                   static_cast<unsigned long long>(got.seq));
    }
    if (!sync_) return;
    // Linearizable: at least everything acknowledged or read before it began.
    auto f = floor_at_.find(request);
    uint64_t floor = f == floor_at_.end() ? 0 : f->second;
    floor_at_.erase(request);
    if (got.seq < floor) {
      return Fail("read of key " + std::to_string(r.key) + " at " + nodes_[node].address +
                  " went backwards: seq " + std::to_string(got.seq) + ", but seq " +
                  std::to_string(floor) + " was acknowledged or read before it began");
    }
    uint64_t& fl = floor_[r.key];
    fl = std::max(fl, got.seq);
  }

  bool ZkLinkUp(int i) const { return now_ >= nodes_[i].zk_cut_until; }
  uint64_t SessionName(uint64_t gen) const { return rule_ == LeaseRule::kUnnamed ? 0 : gen; }

  // The server expires a session it has not heard for a timeout; the
  // shells send their probes; the old rule's shell reports the client's view.
  void Sessions() {
    for (int i = 0; i < kMembers; ++i) {
      Node& n = nodes_[i];
      if (n.session && now_ - n.heard > kSessionMs) {
        ++expiries_;
        Expire(i, n.gen);
      }
      if (!n.alive || n.paused || n.blocked) continue;
      // A request unanswered this long failed with the connection.
      if (n.probe_in_flight && now_ - n.probe_sent > kSessionMs * 2 / 3) n.probe_in_flight = false;
      if (!n.probe_in_flight && now_ - n.probe_sent >= kProbeMs) Probe(i);
      if (rule_ == LeaseRule::kDisconnect && now_ - n.client_heard < kSessionMs * 2 / 3 &&
          n.client_heard > n.resumed_at) {
        Do(i, [&](ChainOutput* o) { n.member->OnSessionAnswer(now_, kSessionMs, now_, o, n.gen); });
      }
    }
  }

  // One probe: the server hears it if the link is up when it arrives, and
  // the answer reaches the shell if the link is up then (held while the
  // process is stopped).
  void Probe(int i) {
    Node& n = nodes_[i];
    n.probe_in_flight = true;
    n.probe_sent = now_;
    const int64_t sent = now_;
    const uint64_t gen = n.gen;
    At(now_ + Rand(1, 5), [this, i, sent, gen] {
      Node& m = nodes_[i];
      if (!ZkLinkUp(i) || !m.session || m.gen != gen) return;
      m.heard = now_;
      At(now_ + Rand(1, 5), [this, i, sent, gen] {
        if (!ZkLinkUp(i)) return;
        Deliver(i, [this, i, sent, gen] {
          Node& k = nodes_[i];
          if (k.gen != gen) return;
          k.client_heard = now_;
          if (k.probe_sent == sent) k.probe_in_flight = false;
          if (rule_ == LeaseRule::kDisconnect) return;
          if (trace_) std::fprintf(stderr, "%6lld %s ANSWER sent %lld gen %llu\n", static_cast<long long>(now_),
                                   k.address.c_str(), static_cast<long long>(sent),
                                   static_cast<unsigned long long>(gen));
          Do(i, [&](ChainOutput* o) {
            k.member->OnSessionAnswer(sent, kSessionMs, now_, o, SessionName(gen));
          });
        });
      });
    });
  }

  void Step() {
    Sessions();
    if (now_ < clients_until_ && Chance(35)) ClientWrite();
    if (now_ < clients_until_ && Chance(25)) ClientRead();
    if (now_ < faults_until_ && Chance(2)) Fault();
    // Wake paused members, restart crashed ones.
    for (int i = 0; i < kMembers; ++i) {
      Node& n = nodes_[i];
      if (n.paused && now_ >= n.paused_until) Resume(i);
      if (!n.alive && now_ >= n.down_until) Restart(i);
    }
  }

  void ClientWrite() {
    if (chain_.empty()) return;
    int head = IndexOf(chain_.front());
    uint64_t write = ++next_write_;
    Write w;
    w.key = static_cast<uint64_t>(Rand(0, kKeys - 1));
    w.kind = Chance(15) ? 'R' : 'P';
    writes_[write] = w;
    uint64_t request = ++next_request_;
    requests_[request] = write;
    // Sometimes the client's view is stale: it writes to a random member.
    if (Chance(10)) head = static_cast<int>(Rand(0, kMembers - 1));
    At(now_ + Rand(0, 5), [this, head, request, write, w] {
      if (!nodes_[head].alive) {
        requests_.erase(request);
        return;
      }
      Deliver(head, [this, head, request, write, w] { Do(head, [&](ChainOutput* o) {
        nodes_[head].member->OnWrite(request, {w.key}, EncodeOp(w.kind, w.key, write), now_, o);
      }); });
    });
  }

  void ClientRead() {
    if (chain_.empty()) return;
    int node = IndexOf(sync_ ? chain_.back() : chain_[static_cast<size_t>(
                                                   Rand(0, static_cast<int64_t>(chain_.size()) - 1))]);
    // A client with a stale view of the ring (the chain changed since it
    // looked) asks a member that may no longer be the tail.
    if (Chance(30)) node = static_cast<int>(Rand(0, kMembers - 1));
    uint64_t request = ++next_request_;
    Read r;
    r.key = static_cast<uint64_t>(Rand(0, kKeys - 1));
    r.start = now_;
    r.node = node;
    // The floor is fixed when the read begins.
    floor_at_[request] = floor_[r.key];
    pending_reads_[request] = r;
    At(now_ + Rand(0, 5), [this, node, request, r] {
      if (!nodes_[node].alive) {
        pending_reads_.erase(request);
        return;
      }
      Deliver(node, [this, node, request, r] {
        ChainOutput o;
        AskRead(node, request, r.key, &o);
        Carry(node, o);
      });
    });
  }

  void AskRead(int node, uint64_t request, uint64_t key, ChainOutput* o) {
    ChainMember::Read verdict = nodes_[node].member->OnRead(request, key, now_, o);
    if (verdict == ChainMember::Read::kServe) {
      ReadStore(request, node);
    } else if (verdict == ChainMember::Read::kRefuse) {
      pending_reads_.erase(request);
    }
  }

  // The shell reads the store a little after the member let the read
  // through (on the caller's thread, while the loop applies writes), and
  // asks the member again a little after that (ChainMember::ConfirmRead):
  // confirmed, it answers with what it read; not, it asks OnRead again.
  // In two seeds of three the store is read and the read answered at once
  // (nothing ran between).
  void ReadStore(uint64_t request, int node) {
    if (!late_reads_) {
      auto it = pending_reads_.find(request);
      if (it == pending_reads_.end()) return;
      const Store& store = nodes_[node].store;
      auto v = store.find(it->second.key);
      return ServeRead(request, node, v == store.end() ? Val{} : v->second);
    }
    const uint64_t incarnation = nodes_[node].incarnation;
    At(now_ + Rand(0, 3), [this, request, node, incarnation] {
      Deliver(node, [this, request, node, incarnation] {
        auto it = pending_reads_.find(request);
        if (it == pending_reads_.end()) return;
        if (nodes_[node].incarnation != incarnation) {
          pending_reads_.erase(it);  // its process died with the read
          return;
        }
        const Store& store = nodes_[node].store;
        auto v = store.find(it->second.key);
        const Val got = v == store.end() ? Val{} : v->second;
        if (trace_) {
          std::fprintf(stderr, "%6lld READ STORE key %llu at %s seq %llu\n",
                       static_cast<long long>(now_),
                       static_cast<unsigned long long>(it->second.key),
                       nodes_[node].address.c_str(), static_cast<unsigned long long>(got.seq));
        }
        if (rule_ == LeaseRule::kUnconfirmedRead) return ServeRead(request, node, got);
        At(now_ + Rand(0, 2), [this, request, node, incarnation, got] {
          Deliver(node, [this, request, node, incarnation, got] {
            auto p = pending_reads_.find(request);
            if (p == pending_reads_.end()) return;
            if (nodes_[node].incarnation != incarnation) {
              pending_reads_.erase(p);
              return;
            }
            if (nodes_[node].member->ConfirmRead(p->second.key, now_)) {
              return ServeRead(request, node, got);
            }
            ++rereads_;
            ChainOutput o;
            AskRead(node, request, p->second.key, &o);
            Carry(node, o);
          });
        });
      });
    });
  }

  void Fault() {
    int i = static_cast<int>(Rand(0, kMembers - 1));
    Node& n = nodes_[i];
    if (!n.alive || n.paused) return;
    int alive = 0;
    for (const Node& m : nodes_) alive += m.alive && !m.paused ? 1 : 0;
    if (alive <= 2) return;  // keep a quorum of the living: the chain must go on
    switch (Rand(0, 3)) {
      case 0: {  // kill -9: the session times out later; restart with or without data
        ++crashes_;
        if (trace_) std::fprintf(stderr, "%6lld %s CRASH\n", static_cast<long long>(now_), n.address.c_str());
        n.alive = false;
        ++n.incarnation;
        n.held.clear();
        n.down_until = now_ + Rand(50, 600);
        break;
      }
      case 1: {  // SIGSTOP for less or more than the session timeout, then SIGCONT
        ++pauses_;
        if (trace_) std::fprintf(stderr, "%6lld %s PAUSE\n", static_cast<long long>(now_), n.address.c_str());
        n.paused = true;
        n.paused_until = now_ + Rand(kSessionMs * 3 / 10, kSessionMs * 3);
        break;
      }
      case 2:
      case 3: {  // cut from ZooKeeper only: peers and clients still reach it
        ++cuts_;
        if (trace_) std::fprintf(stderr, "%6lld %s ZK CUT\n", static_cast<long long>(now_), n.address.c_str());
        n.zk_cut_until = now_ + Rand(kSessionMs / 4, kSessionMs * 3);
        break;
      }
    }
  }

  // ZooKeeper drops member i's node. A live member's client learns it on
  // its next contact with ZooKeeper (once its link is up; held while
  // paused), and the shell starts a new session at once. Nothing tells the
  // member itself: it hears of it only through the new session's answers
  // and the ring (ChainMember::OnSessionAnswer), in whichever order they
  // come, as from the registry.
  void Expire(int i, uint64_t gen) {
    if (nodes_[i].gen != gen) return;
    if (nodes_[i].registered) Unregister(i);
    nodes_[i].session = false;
    Learn(i, gen);
  }
  void Learn(int i, uint64_t gen) {
    At(std::max(now_, nodes_[i].zk_cut_until) + Rand(1, 50), [this, i, gen] {
      if (!ZkLinkUp(i)) return Learn(i, gen);  // cut again meanwhile
      Deliver(i, [this, i, gen] {
        Node& n = nodes_[i];
        if (n.gen != gen) return;
        if (trace_) std::fprintf(stderr, "%6lld %s NEW SESSION\n", static_cast<long long>(now_), n.address.c_str());
        n.session = true;
        n.heard = now_;
        n.client_heard = now_;
        n.probe_in_flight = false;
        n.probe_sent = 0;  // the new session probes at once
        ++n.gen;
      });
    });
  }

  void Resume(int i) {
    Node& n = nodes_[i];
    if (trace_) std::fprintf(stderr, "%6lld %s RESUME\n", static_cast<long long>(now_), n.address.c_str());
    n.paused = false;
    n.resumed_at = now_;
    // What arrived meanwhile, in order (stale configs and messages included).
    RunHeld(i);
  }

  void Restart(int i) {
    Node& n = nodes_[i];
    if (trace_) std::fprintf(stderr, "%6lld %s RESTART\n", static_cast<long long>(now_), n.address.c_str());
    // With its data (a clean restart keeps the exact position; after a
    // power loss under always, what it had synced) or wiped.
    ChainPosition durable = always_ ? n.synced : n.member->applied();
    n.blocked = false;
    n.after_drain = nullptr;
    n.pipeline.clear();
    n.logged = 0;
    n.sync_running = false;
    // A store wiped for a snapshot stays incomplete across a restart until
    // the member registers again (the shell keeps a marker file for it).
    bool intact = n.intact;
    // Lose its data only if another member of the recorded chain still has
    // its own: losing every copy of acknowledged writes is beyond repair
    // (the mark then waits for an operator, as it should).
    bool other_copy = false;
    for (const std::string& r : recorded_) {
      int j = IndexOf(r);
      if (j != i && nodes_[j].intact) other_copy = true;
    }
    if (Chance(50) && (other_copy || recorded_.empty())) {
      n.intact = false;
      n.store.clear();
      durable = {};
      intact = false;
    }
    n.member = std::make_unique<ChainMember>(n.address, options_, durable, intact);
    n.held.clear();
    n.alive = true;
    Start(i);
  }

  void Heal() {
    faults_until_ = 0;
    for (int i = 0; i < kMembers; ++i) {
      Node& n = nodes_[i];
      if (n.paused) n.paused_until = now_;
      if (!n.alive) n.down_until = now_;
      n.zk_cut_until = std::min(n.zk_cut_until, now_);
    }
  }

  void Check() {
    // Requests in flight are bounded; nothing else to check per event
    // beyond what ServeRead and Carry check as they happen.
  }

  std::mt19937_64 rng_;
  const bool trace_ = std::getenv("FLATKV_SIM_TRACE") != nullptr;
  const bool sync_;
  const bool always_;  // storage.sync: always (power loss, SendDownFirst)
  const LeaseRule rule_;
  ChainOptions options_;
  std::vector<Node> nodes_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t order_ = 0;
  int64_t now_ = 0;
  int64_t faults_until_ = 0;
  int64_t clients_until_ = 0;
  std::string failure_;

  std::vector<std::string> chain_;           // ZooKeeper: registered, in czxid order
  std::vector<std::string> recorded_;        // .cluster/marks/<mark>: the recorded chain
  int64_t version_ = 1;
  int64_t recorded_version_ = 0;
  int64_t recorded_zxid_ = 0;
  int64_t config_due_[kMembers] = {};
  std::map<std::string, int64_t> czxid_;
  int64_t zxid_ = 1000;

  std::map<uint64_t, Write> writes_;
  std::map<uint64_t, uint64_t> requests_;    // request -> write
  std::map<uint64_t, Read> pending_reads_;
  std::map<uint64_t, uint64_t> floor_at_;    // read request -> floor seq when it began
  std::map<uint64_t, uint64_t> floor_;       // key -> highest seq acked or read
  std::map<std::pair<int64_t, uint64_t>, uint64_t> applied_ids_;
  uint64_t next_write_ = 0, next_request_ = 0;
  uint64_t acked_ = 0, reads_done_ = 0;
  uint64_t crashes_ = 0, pauses_ = 0, cuts_ = 0, expiries_ = 0, snapshots_ = 0, drops_ = 0;
  uint64_t evictions_ = 0;
  uint64_t overlapped_ = 0;  // always: batches logged while an earlier one synced
  uint64_t rereads_ = 0;     // reads not confirmed after the store read, asked again
  bool late_reads_ = false;  // the store read may come a few ms after the member's yes
};

std::vector<uint64_t> Seeds() {
  std::vector<uint64_t> seeds;
  if (const char* env = std::getenv("FLATKV_SIM_SEED")) {
    seeds.push_back(std::strtoull(env, nullptr, 10));
    return seeds;
  }
  uint64_t n = 1000;
  if (const char* env = std::getenv("FLATKV_SIM_SEEDS")) n = std::strtoull(env, nullptr, 10);
  for (uint64_t s = 1; s <= n; ++s) seeds.push_back(s);
  return seeds;
}

LeaseRule RuleFromEnv() {
  const char* env = std::getenv("FLATKV_SIM_LEASE");
  const std::string rule = env != nullptr ? env : "";
  return rule == "disconnect"    ? LeaseRule::kDisconnect
         : rule == "unnamed"     ? LeaseRule::kUnnamed
         : rule == "unconfirmed" ? LeaseRule::kUnconfirmedRead
         : rule == "unconditional-record" ? LeaseRule::kUnconditionalRecord
                                          : LeaseRule::kProbe;
}

void RunSeeds(bool sync, bool always = false) {
  uint64_t overlapped = 0, evictions = 0, runs = 0;
  for (uint64_t seed : Seeds()) {
    Sim sim(seed, sync, always, RuleFromEnv());
    sim.Run(/*faults_until=*/6000, /*end=*/10000);
    sim.CheckFinal();
    overlapped += sim.overlapped();
    evictions += sim.evictions();
    ++runs;
    INFO("replay with FLATKV_SIM_SEED=" << seed << " ("
                                        << (always ? "sync, always" : sync ? "sync" : "async")
                                        << "): " << sim.Summary());
    CHECK(sim.failure() == "");
    if (!sim.failure().empty()) break;  // one failing seed at a time
  }
  // Under always the runs must have met the pipeline's hard case: a batch
  // logged and passed down while the one before it still synced.
  if (always) CHECK(overlapped > 0);
  // And the fast path: members removed, on a refused connection, before
  // their sessions expired (a single replayed seed may have none).
  if (runs >= 100) CHECK(evictions > 0);
}

// The first failure a weaker rule "rule" lets through within seeds
// 1..max_seed (sync), or "" if none.
std::string FirstFailure(LeaseRule rule, uint64_t max_seed) {
  for (uint64_t seed = 1; seed <= max_seed; ++seed) {
    Sim sim(seed, /*sync=*/true, /*always=*/false, rule);
    sim.Run(/*faults_until=*/6000, /*end=*/10000);
    if (!sim.failure().empty()) {
      return "seed " + std::to_string(seed) + ": " + sim.failure();
    }
  }
  return "";
}

}  // namespace

// The simulation has the power to find the stale read that a lease counted
// from the client library's disconnect report allows (a member cut from
// ZooKeeper, expired and replaced, still serving reads for 1/6 of a
// timeout): with that rule some seed among the first few hundred fails.
TEST_CASE("chain simulation finds the stale read of a lease counted from the disconnect") {
  const std::string found = FirstFailure(LeaseRule::kDisconnect, 400);
  INFO(found);
  CHECK(found.find("went backwards") != std::string::npos);
}

// And the one a member allows that takes the first answer of a new
// ZooKeeper session (its registration's session expired) as its lease
// while its view still shows it in its old chain.
TEST_CASE("chain simulation finds the stale read of a lease renewed by a new session") {
  const std::string found = FirstFailure(LeaseRule::kUnnamed, 3000);
  INFO(found);
  CHECK(found.find("went backwards") != std::string::npos);
}

// And the dirty read of a tail that answers with what it read from the
// store without asking the member again: a joiner catching up from it
// holds its commit point back, the store took a write of the key that was
// not committed between the member's yes and the read, and the next tail
// (the joiner) has not got it.
TEST_CASE("chain simulation finds the dirty read of a tail that does not confirm its store read") {
  const std::string found = FirstFailure(LeaseRule::kUnconfirmedRead, 3000);
  INFO(found);
  CHECK(found.find("went backwards") != std::string::npos);
}

// And the lost write of a record that lands after a member it names left:
// the chain without that member commits writes under an older record of
// its own members, the late record names the member that lacks them, and
// once the others are gone it starts the mark alone from its older store.
// Rare (the first seed is past 12,000, too slow to search here), so the
// seed is replayed under both rules; a change to the simulation that moves
// it needs a new one: FLATKV_SIM_LEASE=unconditional-record
// FLATKV_SIM_SEEDS=30000 finds it.
TEST_CASE("chain simulation finds the lost write of a record that lands after a member left") {
  constexpr uint64_t kSeed = 12810;
  Sim old_rule(kSeed, /*sync=*/true, /*always=*/false, LeaseRule::kUnconditionalRecord);
  old_rule.Run(/*faults_until=*/6000, /*end=*/10000);
  INFO(old_rule.failure());
  CHECK(old_rule.failure().find("went backwards") != std::string::npos);
  Sim production(kSeed, /*sync=*/true, /*always=*/false, LeaseRule::kProbe);
  production.Run(/*faults_until=*/6000, /*end=*/10000);
  production.CheckFinal();
  INFO(production.failure());
  CHECK(production.failure() == "");
}

TEST_CASE("chain simulation, sync: no acknowledged write lost, no read backwards") {
  RunSeeds(true);
}

TEST_CASE("chain simulation, async: replicas converge, nothing invented") {
  RunSeeds(false);
}

TEST_CASE("chain simulation, sync with storage.sync always: power loss loses nothing acknowledged") {
  RunSeeds(true, /*always=*/true);
}
