// Registry: the ZooKeeper side of one instance (registry.h).
//
// Implementation note
// -------------------
// Three kinds of threads touch a Registry:
//   - callers of the public methods (any thread);
//   - the ZooKeeper client's completion thread, which runs Watch(). It only
//     records what happened (session state, "the children changed") under
//     mu_ and wakes the registry thread: it never calls ZooKeeper and never
//     waits for anything but the short critical sections below;
//   - the registry thread (Run()), the only one that calls zoo_*. It owns the
//     handle and runs a reconcile loop: each pass (Step()) compares what is
//     wanted with what is known and does what is missing, in this order:
//
//       handle? -> connected? -> lease probe -> pings -> settings checked?
//         -> deregistered?
//         -> registered? -> chains to record -> ring read?
//
//     The ring read is asynchronous too (its own section below): its
//     requests go out together and the registry thread waits for their
//     answers, which the completion thread records.
//
//     The lease probe is asynchronous as well: a sync() sent every
//     session timeout / 8 while connected, whose answer (on the completion
//     thread) records its send time for lease(). One is in flight at a time;
//     a lost connection fails it, and a new session starts with no lease.
//     A sync, not a read: a follower answers reads (and the client's pings)
//     from its own copy for as long as its syncLimit after it last heard
//     from the leader, while the leader, which alone expires sessions, may
//     have expired ours already; a sync is answered only after the request
//     went to the leader and back, and the follower reports our session's
//     activity to the leader on that same link.
//
//     RecordChain() and Ping() queue a Request and wait for a pass to serve
//     it (or for their deadline: a request not started by then is taken
//     back, so a late pass never writes what the caller gave up on). A
//     recorded chain's request is answered after the ring read of the same
//     pass, so the caller finds it in ring().
//
//     A pass that fails for a transient reason (connection loss, a node that
//     vanished meanwhile) retries after a back-off; one that fails for a
//     permanent reason (settings mismatch, no permission) calls on_fatal and
//     stops. A pass with nothing to do waits for the next event: in steady
//     state the registry sends nothing but the client's own pings.
//
// ZooKeeper facts this relies on (ZooKeeper Programmer's Guide):
//   - watches fire once: every read of a path re-arms its watch; on a
//     reconnect the client sets the session's watches again and the server
//     fires those whose node changed meanwhile, and the registry reads the
//     listings again besides;
//   - the same session survives a disconnection (and a server restart) as
//     long as the client reconnects within the session timeout: its
//     ephemeral node stays and nothing needs re-registering;
//   - after ZOO_EXPIRED_SESSION_STATE the handle is dead for good: close it,
//     make a new one, register again;
//   - zookeeper_close() joins the client's threads, so no watcher of a closed
//     handle runs afterwards, and it ends the session on the server, so the
//     ephemeral member node goes at once.
//
// Locking: mu_ guards the fields marked GUARDED_BY(mu_) and is never held
// across a zoo_* call or a user callback (zookeeper_close() joins the
// completion thread, which may be waiting for mu_ in Watch()). close_mu_ only
// serializes Close() callers, and ring_mu_ only guards the published ring
// pointer (a leaf: nothing else is taken under it). Lock order:
// close_mu_ -> mu_; ring_mu_ alone.
#include "partition/registry.h"

#include <spdlog/spdlog.h>
#include <zookeeper/zookeeper.h>

#include <time.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "partition/zk_hosts.h"
#include "partition/zk_multi.h"

namespace flatkv::partition {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

constexpr int kProbesPerTimeout = 8;   // lease probes per session timeout
constexpr int kRetryMinMs = 50;         // first back-off after a failed pass
constexpr int kRetryMaxMs = 2000;       // back-off ceiling
constexpr int kInitRetryMs = 1000;      // zookeeper_init2 itself failed (bad host name)
constexpr int kClusterDataMax = 4096;   // .cluster holds ~60 bytes of JSON
constexpr int kChainDataMax = 16384;    // a chain node: ~25 bytes per member
constexpr int kRecordAttempts = 5;      // RecordChain: re-reads after a lost race
constexpr int kCoalesceMs = 20;         // a burst of watch events is read as one
constexpr int kStormGapMs = 500;        // reads closer than this: events keep coming...
constexpr int kMaxSpacingMs = 250;      // ...so space watch reads, doubling up to this
constexpr int kReadPasses = 3;          // read steps before a view is published anyway
constexpr int kReadPassesMax = 32;      // ...unless its change node keeps changing
constexpr int kCloseWaitMs = 1000;      // Close(): answers in flight still read for this long
const std::string kAllPaths = "*";      // a dirty_ key: read everything
constexpr int kLogBurst = 5;            // ZooKeeper log lines per window...
constexpr int64_t kLogWindowMs = 10000; // ...then one "suppressed" line

// ---- ZooKeeper's log, through spdlog, rate-limited ----------------------

// The client formats "<date> <time>,<ms>:<pid>(0x<tid>):ZOO_ERROR@<func>@<line>:
// <text>". spdlog adds its own time, so keep "<func>@<line>: <text>".
spdlog::level::level_enum ZkLevel(std::string_view* line) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"ZOO_ERROR@", spdlog::level::err},
      {"ZOO_WARN@", spdlog::level::warn},
      // The client's INFO is chatty (a dozen "Client environment" lines per
      // handle); the registry logs the state changes that matter itself.
      {"ZOO_INFO@", spdlog::level::debug},
      {"ZOO_DEBUG@", spdlog::level::trace},
  };
  for (const auto& [tag, level] : kLevels) {
    const size_t at = line->find(tag);
    if (at != std::string_view::npos) {
      line->remove_prefix(at + tag.size());
      return level;
    }
  }
  return spdlog::level::info;
}

// While the server is down the client logs an error every ~33 ms: let
// kLogBurst lines through per window and count the rest. The callback has
// no context argument, so the limiter is process-wide.
void ZkLog(const char* message) {
  std::string_view line(message);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  const spdlog::level::level_enum level = ZkLevel(&line);
  if (!spdlog::should_log(level)) return;
  static std::mutex mu;
  static int64_t window_start = 0;   // GUARDED_BY(mu)
  static int in_window = 0;          // GUARDED_BY(mu)
  static int64_t suppressed = 0;     // GUARDED_BY(mu)
  std::lock_guard<std::mutex> lock(mu);
  const int64_t now = NowMs();
  if (now - window_start >= kLogWindowMs) {
    if (suppressed > 0) {
      spdlog::warn("zookeeper client: {} more log lines suppressed", suppressed);
    }
    window_start = now;
    in_window = 0;
    suppressed = 0;
  }
  if (++in_window > kLogBurst) {
    ++suppressed;
    return;
  }
  spdlog::log(level, "zookeeper client: {}", line);
}

// ---- option checks --------------------------------------------------------

Status CheckZookeeper(std::string_view hosts) {
  if (hosts.empty()) return Status::InvalidArgument("cluster.zookeeper: empty (host:port,...)");
  while (true) {
    const size_t comma = hosts.find(',');
    std::string host;
    int port = 0;
    Status s = ParseHostPort(hosts.substr(0, comma), "cluster.zookeeper", &host, &port);
    if (!s.ok()) return s;
    if (comma == std::string_view::npos) return Status::OK();
    hosts.remove_prefix(comma + 1);
  }
}

bool IsWildcard(std::string_view host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*" ||
         host == "[0:0:0:0:0:0:0:0]";
}

Status CheckAdvertise(const std::string& advertise) {
  std::string host;
  int port = 0;
  Status s = ParseHostPort(advertise, "cluster.advertise", &host, &port);
  if (!s.ok()) return s;
  if (IsWildcard(host)) {
    return Status::InvalidArgument("cluster.advertise: '" + advertise +
                                   "' has a wildcard host; give an address peers can reach");
  }
  return Status::OK();
}

Status CheckServicePath(const std::string& path) {
  if (path.size() < 2 || path[0] != '/' || path.back() == '/' ||
      path.find("//") != std::string::npos) {
    return Status::InvalidArgument("cluster.service_path: '" + path +
                                   "' is not an absolute ZooKeeper path such as /flatkv");
  }
  return Status::OK();
}

Status CheckOptions(const RegistryOptions& o) {
  Status s = CheckZookeeper(o.zookeeper);
  if (s.ok()) s = CheckServicePath(o.service_path);
  if (s.ok() && !o.observer) s = CheckAdvertise(o.advertise);
  if (s.ok() && o.session_timeout_ms <= 0) {
    s = Status::InvalidArgument("cluster.session_timeout_ms: must be positive");
  }
  if (s.ok()) {
    // Validates hash_bound and replication with the same rules as .cluster.
    RingSettings copy;
    s = RingSettings::FromJson(o.settings.ToJson(), &copy);
  }
  return s;
}

bool ParseMark(std::string_view text, int64_t* mark) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *mark);
  return !text.empty() && ec == std::errc() && ptr == end;
}

// The session states are `extern const int`, so no switch.
const char* StateName(int state) {
  if (state == ZOO_CONNECTED_STATE) return "connected";
  if (state == ZOO_CONNECTING_STATE) return "connecting";
  if (state == ZOO_ASSOCIATING_STATE) return "associating";
  if (state == ZOO_EXPIRED_SESSION_STATE) return "session expired";
  if (state == ZOO_AUTH_FAILED_STATE) return "authentication failed";
  if (state == ZOO_READONLY_STATE) return "read-only";
  return "not connected";
}

// A failed zoo_* call. No permission will not fix itself: it is fatal
// (InvalidArgument); everything else is retried (Unavailable).
Status ZkError(std::string_view what, const std::string& path, int rc) {
  const std::string msg = "zookeeper " + std::string(what) + " " + path + ": " + zerror(rc);
  return rc == ZNOAUTH ? Status::InvalidArgument(msg) : Status::Unavailable(msg);
}

}  // namespace

int64_t BootTimeMs() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// A RecordChain() or Ping() waiting for the registry thread.
struct Request {
  enum class Kind { kPing, kRecord, kChange, kEvict };
  Kind kind = Kind::kPing;
  RecordedChain chain;  // kRecord
  std::string member;   // kEvict: "host:port" of this mark...
  int64_t czxid = 0;    // ...whose node has this creation zxid (0: any
                        // node of our own address not held by our session)
  // kChange: create, set or delete .cluster/change; "change" for the first two.
  enum class ChangeOp { kCreate, kSet, kDelete, kDeleteMark, kAbort };
  ChangeOp change_op = ChangeOp::kCreate;
  RingChange change;  // kDeleteMark: change.mark
  bool started = false;  // GUARDED_BY(Impl::mu_): taken by the registry thread
  bool done = false;     // GUARDED_BY(Impl::mu_)
  Status status;         // GUARDED_BY(Impl::mu_): the answer, once done
};

struct Registry::Impl {
  explicit Impl(RegistryOptions o);

  // Callers' threads.
  Status Submit(const std::shared_ptr<Request>& request, int timeout_ms, std::string_view what);

  // Completion thread.
  static void Watch(zhandle_t* zh, int type, int state, const char* path, void* ctx);
  void OnEvent(int type, int state, const char* path);
  struct Probe {
    Impl* impl;
    uint64_t session;  // session_gen_ when sent
    int64_t sent_ms;   // BootTimeMs() before it was sent
    int64_t timeout_ms;
  };
  static void ProbeDone(int rc, const char* value, const void* data);

  // Registry thread: sends a lease probe if one is due; returns the
  // milliseconds until the next one is.
  int ProbeLease();

  // Registry thread.
  void Run();
  int Step();
  int Failed(const Status& s);
  bool OpenSession();
  void CloseSession();
  void NoteState(int state);
  void OnConnected();
  Status EnsureSettings();
  Status ReadSettings();  // an observer's: the ring's settings, never ours
  Status CreateParents();
  Status CheckClusterNode();
  Status RegisterNode();
  Status TakeOver(int64_t session, bool create_mark, int64_t* czxid);
  int CreateMember(bool create_mark, int64_t* czxid);
  int DeleteOwnOrderNode();
  std::vector<std::string> OrderNodesOf(const std::string& name, int64_t czxid);
  void DeleteOrderNodes(const std::string& name, int64_t czxid);
  Status MemberError(int rc);
  static constexpr int kMarkGone = -10000;  // CreateMember: the mark node is gone
  Status RemoveNode();
  std::vector<std::shared_ptr<Request>> Take(Request::Kind kind);
  void Answer(const std::vector<std::shared_ptr<Request>>& requests);
  void ServePings();
  void ServeEvictions();
  std::vector<std::shared_ptr<Request>> ServeRecords();
  Status RecordNow(const RecordedChain& chain);
  std::vector<std::shared_ptr<Request>> ServeChanges();
  Status ChangeNow(const Request& request);
  // Reading the ring (the section "reading the ring" below).
  enum class ReadKind { kGet, kExists, kChildren };
  struct ReadOp;
  struct ReadBatch;
  struct PendingRead;
  struct MemberNode {
    Ring::Registration reg;  // with the node's czxid, or its order (by_seq)
    int64_t owner = 0;       // its ephemeralOwner (session), when its czxid was read
    bool by_seq = false;     // reg.member.czxid is its order node's sequence number
  };
  struct ChainNode {
    int32_t version = 0;     // data version: a term of the ring's version
    bool parsed = false;     // else no recorded chain (empty or malformed)
    RecordedChain chain;     // zxid = the node's mzxid
  };
  // What the current ring was built from. Registry thread only.
  struct View {
    bool valid = false;                       // read once in this session
    std::optional<RingChange> change;         // .cluster/change
    bool children_read = false;
    std::vector<std::string> children;        // of <service_path>
    int32_t children_cversion = 0;
    std::map<std::string, MemberNode> members;  // member node name -> its node
    std::vector<int64_t> marks;               // .cluster/marks
    int32_t marks_cversion = 0;
    int32_t chains_cversion = 0;              // .cluster/chains
    std::map<std::string, ChainNode> chains;  // child name -> its node
  };
  static void ReadAnswered(const void* data, int rc, const Stat* stat);
  static void DataDone(int rc, const char* value, int len, const Stat* stat, const void* data);
  static void StatDone(int rc, const Stat* stat, const void* data);
  static void ChildrenDone(int rc, const String_vector* strings, const Stat* stat,
                           const void* data);
  ReadOp* Send(const std::shared_ptr<ReadBatch>& batch, ReadKind kind, const std::string& path,
               bool watch);
  Status Wait(const std::shared_ptr<ReadBatch>& batch);
  void MarkDirty(const std::string& path);
  void MarkDirtyLocked(const std::string& path, bool urgent);
  void MarkListingsLocked();
  int ReadDelayMs();
  void NoteRead(int64_t started_ms);
  Status ReadRing();
  Status ReadPass(const std::map<std::string, uint64_t>& dirty);
  RingChange ParseChange(const std::string& data, const Stat& stat);
  ChainNode ParseChainNode(const std::string& name, const ReadOp& op);
  using AddRead = std::function<Status(const std::string& name, const ReadOp& exists)>;
  Status OrderMembers(const ReadOp* order, const std::vector<std::string>& unordered, View* next,
                      const AddRead& add_read);
  bool OwnMark(int64_t mark) const { return !opt_.observer && mark == opt_.mark; }
  void CheckOwnNode();
  std::shared_ptr<const Ring> BuildRing() const;
  int GetData(const std::string& path, bool watch, std::string* data, Stat* stat);
  void Publish(std::shared_ptr<const Ring> ring, uint64_t ticket);
  void WarnOnce(const std::string& child, std::string_view why);
  void Fatal(const Status& s);
  int Create(const std::string& path, const std::string& data, int mode);
  Status CheckAcls();
  bool SetRegistered(bool registered, int64_t czxid = 0);
  std::shared_ptr<const Ring> LoadRing() const {
    std::lock_guard<std::mutex> lock(ring_mu_);
    return ring_;
  }

  RegistryOptions opt_;  // settings are replaced by the ring's in an observer
  const NodeAcl acl_;    // of every node the registry creates
  const std::string member_name_;   // thriftbinary<mark>:<host>:<port>
  const std::string member_path_;   // <service_path>/<member_name_>
  const std::string cluster_path_;  // <service_path>/.cluster
  const std::string marks_path_;    // <service_path>/.cluster/marks
  const std::string mark_path_;     // <service_path>/.cluster/marks/<mark>
  const std::string chains_path_;   // <service_path>/.cluster/chains
  const std::string change_path_;   // <service_path>/.cluster/change
  const std::string chain_path_;    // <service_path>/.cluster/chains/<mark>
  const std::string order_path_;    // <service_path>/.cluster/order
  std::thread thread_;
  std::mutex close_mu_;             // serializes Close()
  // The published ring. Its own mutex, held only to copy the pointer, so
  // ring() never waits behind the registry's state changes. (libstdc++ 12's
  // std::atomic<std::shared_ptr> would do, but TSan cannot see through its
  // lock bit and reports races.)
  mutable std::mutex ring_mu_;
  std::shared_ptr<const Ring> ring_;  // GUARDED_BY(ring_mu_)

  mutable std::mutex mu_;
  std::condition_variable wake_;      // the registry thread waits on it
  std::condition_variable progress_;  // WaitRegistered() and Refresh() wait on it
  bool stop_ = false;                 // GUARDED_BY(mu_)
  int zk_state_ = 0;                  // GUARDED_BY(mu_): last session state seen
  bool state_event_ = false;          // GUARDED_BY(mu_): zk_state_ changed
  bool ring_event_ = false;           // GUARDED_BY(mu_): a watched node changed
  // Events and read answers, numbered in the order the completion thread
  // saw them (reading the ring, below).
  uint64_t seq_ = 0;                  // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> dirty_;  // GUARDED_BY(mu_): path to read -> seq of its first event
  bool urgent_ = false;               // GUARDED_BY(mu_): read dirty_ without waiting for more
  int64_t dirty_since_ms_ = 0;        // GUARDED_BY(mu_): when dirty_ became non-empty
  int64_t last_read_ms_ = 0;          // GUARDED_BY(mu_): when the last ring read ended
  int spacing_ms_ = 0;                // GUARDED_BY(mu_): least time between watch reads
  uint64_t change_seq_ = 0;           // GUARDED_BY(mu_): seq of the change node's last answer
  std::condition_variable reads_cv_;  // the registry thread waits on it for answers
  bool register_event_ = false;       // GUARDED_BY(mu_): Register() was called
  bool refresh_event_ = false;        // GUARDED_BY(mu_): Refresh() was called
  bool request_event_ = false;        // GUARDED_BY(mu_): a Request was queued
  bool want_register_ = false;        // GUARDED_BY(mu_)
  bool create_mark_ = true;           // GUARDED_BY(mu_): Register()'s argument
  bool deregister_ = false;           // GUARDED_BY(mu_): delete our node (Deregister())
  bool registered_ = false;           // GUARDED_BY(mu_): our member node exists
  int64_t czxid_ = 0;                 // GUARDED_BY(mu_): its czxid while registered_
  std::deque<std::shared_ptr<Request>> requests_;  // GUARDED_BY(mu_): not yet started
  bool connected_ = false;            // GUARDED_BY(mu_)
  int64_t disconnected_since_ms_;     // GUARDED_BY(mu_)
  uint64_t session_gen_ = 0;          // GUARDED_BY(mu_): bumped with every new handle
  bool probe_in_flight_ = false;      // GUARDED_BY(mu_)
  SessionLease lease_;                // GUARDED_BY(mu_)
  uint64_t refresh_asked_ = 0;        // GUARDED_BY(mu_): Refresh() tickets issued
  uint64_t refresh_done_ = 0;         // GUARDED_BY(mu_): tickets a read has served
  bool fatal_set_ = false;            // GUARDED_BY(mu_): on_fatal was called with...
  Status fatal_status_;               // GUARDED_BY(mu_): ...this
  int64_t session_id_ = 0;            // GUARDED_BY(mu_)
  std::string session_passwd_;        // GUARDED_BY(mu_)
  RegistryStats stats_;               // GUARDED_BY(mu_)

  // Registry thread only.
  zhandle_t* zh_ = nullptr;
  bool settings_ok_ = false;     // .cluster checked in this process
  View view_;                    // what the current ring was built from
  bool need_register_ = false;   // a copy of want_register_ && !registered_
  std::string own_order_path_;   // our order node (.cluster/order) while we may hold one
  bool was_connected_ = false;   // for logging transitions
  int64_t next_probe_ms_ = 0;    // BootTimeMs() at which the next lease probe is due
  bool yielded_ = false;         // our address is held by another live session
  bool gave_up_ = false;         // after on_fatal: wait for Close()
  int backoff_ms_ = kRetryMinMs;
  std::set<std::string> warned_;  // children already warned about
};

Registry::Impl::Impl(RegistryOptions o)
    : opt_(std::move(o)),
      acl_(opt_.observer ? ZkCredentials() : opt_.credentials),
      member_name_(MemberNodeName(opt_.mark, opt_.advertise)),
      member_path_(opt_.service_path + "/" + member_name_),
      cluster_path_(opt_.service_path + "/.cluster"),
      marks_path_(cluster_path_ + "/marks"),
      mark_path_(marks_path_ + "/" + std::to_string(opt_.mark)),
      chains_path_(cluster_path_ + "/chains"),
      change_path_(cluster_path_ + "/change"),
      chain_path_(chains_path_ + "/" + std::to_string(opt_.mark)),
      order_path_(cluster_path_ + "/order"),
      disconnected_since_ms_(NowMs()) {
  stats_.ring_version = -1;
  MarkDirtyLocked(kAllPaths, /*urgent=*/true);
}

// ---- completion thread ----------------------------------------------------

void Registry::Impl::Watch(zhandle_t*, int type, int state, const char* path, void* ctx) {
  static_cast<Impl*>(ctx)->OnEvent(type, state, path);
}

void Registry::Impl::OnEvent(int type, int state, const char* path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (type == ZOO_SESSION_EVENT) {
    const bool now_connected = state == ZOO_CONNECTED_STATE;
    if (connected_ && !now_connected) disconnected_since_ms_ = NowMs();
    connected_ = now_connected;
    stats_.connected = now_connected ? 1 : 0;
    zk_state_ = state;
    state_event_ = true;
  } else {
    // A child of the service path, .cluster/marks or .cluster/chains came
    // or went, one of those two was created, a chain node was written, or
    // the change node came, went or was written: read that path again.
    // The change node at once, not after kCoalesceMs: every member decides
    // from it what it serves (change.h, Moving), and an importer goes from
    // writing it to acting on it within one round trip to the source's
    // head (whose Refresh reads at once), so a member waiting for a burst
    // would lag the change it must follow. It is written a few times per
    // ring change: there is no burst to merge.
    const std::string dirty = path != nullptr && path[0] == '/' ? std::string(path) : kAllPaths;
    MarkDirtyLocked(dirty, /*urgent=*/dirty == change_path_ || dirty == kAllPaths);
    ring_event_ = true;
  }
  wake_.notify_one();
}

// Any answer from the server (the root may not exist under a chroot) means
// it heard the session after the probe was sent. Runs on the completion
// thread, or in zookeeper_close() for a probe still in flight (ZCLOSING).
void Registry::Impl::ProbeDone(int rc, const char*, const void* data) {
  std::unique_ptr<const Probe> probe(static_cast<const Probe*>(data));
  Impl* impl = probe->impl;
  std::lock_guard<std::mutex> lock(impl->mu_);
  if (probe->session != impl->session_gen_) return;  // an earlier session's
  impl->probe_in_flight_ = false;
  if (rc != ZOK) return;
  impl->lease_.sent_ms = std::max(impl->lease_.sent_ms, probe->sent_ms);
  impl->lease_.timeout_ms = probe->timeout_ms;
  impl->lease_.session = probe->session;
}

// ---- registry thread: the loop ------------------------------------------

int Registry::Impl::ProbeLease() {
  // The timeout the server granted (it may clamp the one asked for).
  const int timeout = zoo_recv_timeout(zh_);
  const int every = std::max(1, (timeout > 0 ? timeout : opt_.session_timeout_ms) /
                                    kProbesPerTimeout);
  const int64_t now = BootTimeMs();
  if (now < next_probe_ms_) return static_cast<int>(next_probe_ms_ - now);
  uint64_t session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (probe_in_flight_) return every;  // answered or failed with the connection
    probe_in_flight_ = true;
    session = session_gen_;
  }
  auto* probe = new Probe{this, session, now, timeout};
  const int rc = zoo_async(zh_, "/", &Impl::ProbeDone, probe);
  if (rc != ZOK) {  // not sent: the completion never runs
    delete probe;
    std::lock_guard<std::mutex> lock(mu_);
    probe_in_flight_ = false;
  }
  next_probe_ms_ = now + every;
  return every;
}

void Registry::Impl::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    const int wait_ms = Step();
    lock.lock();
    // One-shot flags only: a condition that stays true while disconnected
    // (an unserved Refresh()) would spin this loop.
    const auto pending = [this] {
      return stop_ || state_event_ || ring_event_ || register_event_ || refresh_event_ ||
             request_event_;
    };
    if (gave_up_) {
      wake_.wait(lock, [this] { return stop_; });
    } else if (wait_ms < 0) {
      wake_.wait(lock, pending);
    } else {
      wake_.wait_for(lock, std::chrono::milliseconds(wait_ms), pending);
    }
  }
  lock.unlock();
  CloseSession();
}

// One reconcile pass. Returns how long to wait for an event before the next
// pass: -1 for as long as it takes (nothing left to do), else a retry delay.
int Registry::Impl::Step() {
  int state;
  bool state_event;
  bool deregister;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state = zk_state_;
    state_event = std::exchange(state_event_, false);
    request_event_ = false;  // the queue itself says what is left
    deregister = deregister_;
    // What to read is in dirty_; a Refresh() is served by the next
    // successful read, however late.
    ring_event_ = false;
    refresh_event_ = false;
    register_event_ = false;
    need_register_ = want_register_ && !registered_;
  }
  if (zh_ != nullptr && (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE)) {
    spdlog::warn("zookeeper: {}; starting a new session", StateName(state));
    CloseSession();
  }
  if (zh_ == nullptr) return OpenSession() ? -1 : kInitRetryMs;
  if (state_event) NoteState(state);
  if (state != ZOO_CONNECTED_STATE) return -1;  // Watch() tells us when it connects
  // The next pass comes in time for the next lease probe, if nothing
  // wakes it sooner.
  const int probe_wait = ProbeLease();
  const auto or_probe = [probe_wait](int wait) {
    return wait < 0 ? probe_wait : std::min(wait, probe_wait);
  };
  // A lease renewal waits for nothing else; a dead member's eviction only
  // for it.
  ServePings();
  ServeEvictions();
  Status s;
  if (!settings_ok_) s = opt_.observer ? ReadSettings() : EnsureSettings();
  if (s.ok() && deregister) s = RemoveNode();
  if (s.ok() && need_register_ && !yielded_) s = RegisterNode();
  std::vector<std::shared_ptr<Request>> records;
  if (s.ok()) records = ServeRecords();
  if (s.ok()) {
    std::vector<std::shared_ptr<Request>> changes = ServeChanges();
    records.insert(records.end(), changes.begin(), changes.end());
  }
  int read_wait = -1;  // a burst of events still coming in
  if (s.ok()) {
    read_wait = ReadDelayMs();
    if (read_wait == 0) {
      s = ReadRing();
      // What the read itself found changed (a node created between a
      // listing and its exists) is read at once, not at the next probe.
      read_wait = s.ok() ? ReadDelayMs() : -1;
    }
  }
  Answer(records);
  if (!s.ok()) return or_probe(Failed(s));
  backoff_ms_ = kRetryMinMs;
  // The read found our node gone: register again at once.
  const int wait = need_register_ && !yielded_ ? 0 : -1;
  return or_probe(wait < 0 ? read_wait : read_wait < 0 ? wait : std::min(wait, read_wait));
}

int Registry::Impl::Failed(const Status& s) {
  if (s.IsInvalidArgument()) {
    Fatal(s);
    return -1;
  }
  spdlog::warn("registry: {} (retrying in {} ms)", s.ToString(), backoff_ms_);
  const int wait = backoff_ms_;
  backoff_ms_ = std::min(backoff_ms_ * 2, kRetryMaxMs);
  return wait;
}

// on_fatal runs before WaitRegistered()/Refresh() return the error, so a
// caller that sees the error knows the instance was told to stop.
void Registry::Impl::Fatal(const Status& s) {
  spdlog::error("registry: {}; giving up", s.ToString());
  CloseSession();
  gave_up_ = true;
  if (opt_.on_fatal) opt_.on_fatal(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fatal_status_ = s;
    fatal_set_ = true;
  }
  progress_.notify_all();
}

// ---- registry thread: the session ---------------------------------------

bool Registry::Impl::OpenSession() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    zk_state_ = ZOO_CONNECTING_STATE;  // forget the old handle's last state
    state_event_ = false;
    ++session_gen_;  // a new session holds no lease
    lease_ = SessionLease();
    probe_in_flight_ = false;
  }
  next_probe_ms_ = 0;
  spdlog::info("zookeeper: connecting to {} (session timeout {} ms)", opt_.zookeeper,
               opt_.session_timeout_ms);
  zh_ = zookeeper_init2(ClientHosts(opt_.zookeeper).c_str(), &Impl::Watch,
                        opt_.session_timeout_ms, nullptr, this, 0, &ZkLog);
  if (zh_ == nullptr) {
    spdlog::warn("zookeeper: cannot create a handle for {}: {}", opt_.zookeeper,
                 std::strerror(errno));
    return false;
  }
  // Queued on the new handle before any request: the client sends it on
  // every (re)connection of this session, ahead of our calls. A session
  // after expiry is a new handle, so it comes here again.
  if (!opt_.observer && opt_.credentials.set()) {
    const Status s = AddAuth(zh_, opt_.credentials);
    if (!s.ok()) {
      spdlog::warn("{}", s.ToString());
      CloseSession();
      return false;
    }
    spdlog::info("zookeeper: authenticating as '{}' (digest)", opt_.credentials.user);
  }
  return true;
}

// Ends the session (its ephemeral node goes at once if the server hears
// the close) and joins the client's threads.
void Registry::Impl::CloseSession() {
  if (zh_ == nullptr) return;
  const int rc = zookeeper_close(zh_);
  zh_ = nullptr;
  if (rc != ZOK) spdlog::debug("zookeeper: close: {}", zerror(rc));
  SetRegistered(false);
  yielded_ = false;
  was_connected_ = false;
  view_ = View();  // a new session has none of the old one's watches
  std::lock_guard<std::mutex> lock(mu_);
  MarkDirtyLocked(kAllPaths, /*urgent=*/true);
  connected_ = false;
  stats_.connected = 0;
  disconnected_since_ms_ = NowMs();
  ++session_gen_;
  lease_ = SessionLease();
  probe_in_flight_ = false;
}

void Registry::Impl::NoteState(int state) {
  const bool connected = state == ZOO_CONNECTED_STATE;
  if (connected) {
    OnConnected();
  } else if (was_connected_) {
    spdlog::warn("zookeeper: disconnected from {} ({}); keeping the last ring", opt_.zookeeper,
                 StateName(state));
  }
  was_connected_ = connected;
}

// Connected, or reconnected: events may have been lost meanwhile, so read
// the listings and the change node again (the client sets the session's
// watches again on reconnecting, and the server fires those whose node
// changed meanwhile; a member node's czxid cannot have changed, and a name
// that went and came back shows in the listing's cversion). A new session
// id means a new session (the first, or one after expiry); the same id
// means the old one survived the disconnection.
void Registry::Impl::OnConnected() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    MarkListingsLocked();
  }
  const clientid_t* id = zoo_client_id(zh_);
  const int timeout_ms = zoo_recv_timeout(zh_);
  std::lock_guard<std::mutex> lock(mu_);
  if (id->client_id == session_id_) {
    spdlog::info("zookeeper: reconnected to {}, session 0x{:x} still valid", opt_.zookeeper,
                 session_id_);
    return;
  }
  session_id_ = id->client_id;
  session_passwd_.assign(id->passwd, sizeof(id->passwd));
  ++stats_.sessions;
  spdlog::info("zookeeper: session 0x{:x} established with {} (timeout {} ms)", session_id_,
               opt_.zookeeper, timeout_ms);
}

// False if a registration just made does not count: Deregister() was
// called meanwhile, and the next pass deletes the node.
bool Registry::Impl::SetRegistered(bool registered, int64_t czxid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (registered && deregister_) registered = false;
  // A registration lost (session expired, node gone): without
  // reregister_after_expiry the owner decides when to register again.
  if (!registered && registered_ && !opt_.reregister_after_expiry) want_register_ = false;
  registered_ = registered;
  czxid_ = registered ? czxid : 0;
  need_register_ = want_register_ && !registered;
  if (registered) progress_.notify_all();
  return registered;
}

int Registry::Impl::Create(const std::string& path, const std::string& data, int mode) {
  return zoo_create(zh_, path.c_str(), data.data(), static_cast<int>(data.size()), acl_.get(),
                    mode, nullptr, 0);
}

// With credentials, a node of the ring the world may still write (a ring
// made without them) would let anyone change the ring: refuse to run on it
// until `flatkv admin secure-ring` has protected it. A node left writable
// on purpose by `secure-ring --transitional` (its ACL gives our identity
// all) is run on, with a warning: the ring is being moved to credentials.
Status Registry::Impl::CheckAcls() {
  if (opt_.observer || !opt_.credentials.set()) return Status::OK();
  OpenNodes found;
  FLATKV_RETURN_IF_ERROR(FindOpenNode(zh_, opt_.service_path, opt_.credentials, &found));
  const std::string secure = "flatkv --zk " + opt_.zookeeper + " --path " + opt_.service_path +
                             " admin secure-ring --zk-auth-file <cluster.zookeeper_auth_file>";
  if (!found.open.empty()) {
    return Status::InvalidArgument("zookeeper node " + found.open +
                                   " is writable by anyone (world:anyone has more than read); "
                                   "protect the ring first: " + secure);
  }
  if (!found.transitional.empty()) {
    spdlog::warn("registry: zookeeper node {} and maybe others are still writable by anyone "
                 "(secure-ring --transitional); once every instance runs with credentials, "
                 "finish with: {}", found.transitional, secure);
  }
  return Status::OK();
}

// ---- registry thread: settings ------------------------------------------

// .cluster holds the ring's settings. Every instance but the first finds
// it, so it is read first (one request) and created only when missing: the
// first instance creates it with the settings as its data in one request,
// so no instance ever sees a .cluster without settings from us.
Status Registry::Impl::EnsureSettings() {
  Status s = CheckClusterNode();
  if (s.IsNotFound()) {
    const std::string json = opt_.settings.ToJson();
    int rc = Create(cluster_path_, json, ZOO_PERSISTENT);
    if (rc == ZNONODE) {
      s = CreateParents();
      if (!s.ok()) return s;
      rc = Create(cluster_path_, json, ZOO_PERSISTENT);
    }
    if (rc == ZOK) {
      spdlog::info("registry: wrote the ring settings {} to {}", json, cluster_path_);
      s = Status::OK();
    } else if (rc == ZNODEEXISTS) {  // another instance created it first
      s = CheckClusterNode();
    } else {
      s = ZkError("create", cluster_path_, rc);
    }
  }
  if (s.ok()) s = CheckAcls();
  if (s.ok()) settings_ok_ = true;
  return s;
}

// An observer takes the ring's settings (the string-key hash bound) from
// .cluster and writes nothing; no ring yet is Unavailable, retried.
Status Registry::Impl::ReadSettings() {
  char buf[kClusterDataMax];
  int len = sizeof(buf);
  Stat stat{};
  const int rc = zoo_get(zh_, cluster_path_.c_str(), 0, buf, &len, &stat);
  if (rc == ZNONODE) {
    return Status::Unavailable("no ring at " + opt_.service_path + " (no instance has joined)");
  }
  if (rc != ZOK) return ZkError("get", cluster_path_, rc);
  if (len > 0) {
    RingSettings ring;
    Status s = RingSettings::FromJson(std::string_view(buf, static_cast<size_t>(len)), &ring);
    if (!s.ok()) return Status::Unavailable(s.message());
    opt_.settings = ring;
  }
  settings_ok_ = true;
  return Status::OK();
}

// /a, /a/b, ... up to the service path itself (persistent, empty).
Status Registry::Impl::CreateParents() {
  const std::string& path = opt_.service_path;
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    const int rc = Create(prefix, "", ZOO_PERSISTENT);
    if (rc != ZOK && rc != ZNODEEXISTS) return ZkError("create", prefix, rc);
    if (slash == std::string::npos) return Status::OK();
  }
}

// Checks our settings against .cluster's, or fills them in if another tool
// created it empty. NotFound: there is no .cluster.
Status Registry::Impl::CheckClusterNode() {
  char buf[kClusterDataMax];
  int len = sizeof(buf);
  Stat stat{};
  const int rc = zoo_get(zh_, cluster_path_.c_str(), 0, buf, &len, &stat);
  if (rc == ZNONODE) return Status::NotFound(cluster_path_);
  if (rc != ZOK) return ZkError("get", cluster_path_, rc);
  if (len <= 0) {
    const std::string json = opt_.settings.ToJson();
    const int set = zoo_set(zh_, cluster_path_.c_str(), json.data(),
                            static_cast<int>(json.size()), stat.version);
    // ZBADVERSION: another instance filled it in first; the retry checks it.
    return set == ZOK ? Status::OK() : ZkError("set", cluster_path_, set);
  }
  RingSettings ring;
  Status s = RingSettings::FromJson(std::string_view(buf, std::min(len, kClusterDataMax)), &ring);
  if (!s.ok()) return s.WithContext(cluster_path_);
  return opt_.settings.CheckSame(ring);
}

// ---- registry thread: registration --------------------------------------

Status Registry::Impl::RegisterNode() {
  bool create_mark;
  int64_t session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    create_mark = create_mark_;
    session = session_id_;
  }
  int64_t czxid = 0;
  int rc = CreateMember(create_mark, &czxid);
  Status s = rc == ZOK ? Status::OK()
             : rc == ZNODEEXISTS ? TakeOver(session, create_mark, &czxid)
                                 : MemberError(rc);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.registrations;
  }
  if (!SetRegistered(true, czxid)) {
    spdlog::info("registry: registered {} as Deregister() was called; deleting it", member_path_);
    return Status::OK();
  }
  spdlog::info("registry: registered {} (session 0x{:x}, czxid 0x{:x})", member_path_, session,
               czxid);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gen = session_gen_;
  }
  MarkDirty(opt_.service_path);
  MarkDirty(marks_path_);
  if (opt_.on_registered) opt_.on_registered(czxid, gen);
  return Status::OK();
}

// Our member node already exists. If our own session made it (a create whose
// answer was lost to a disconnection) it is ours. Otherwise it is left by an
// earlier process at the same address whose session has not expired yet:
// delete it and create ours, which rejoins the chain at the tail.
Status Registry::Impl::TakeOver(int64_t session, bool create_mark, int64_t* czxid) {
  Stat stat{};
  int rc = zoo_exists(zh_, member_path_.c_str(), 0, &stat);
  if (rc == ZOK && stat.ephemeralOwner == session) {
    *czxid = stat.czxid;
    // Its order node was made with it; its name came back with the answer
    // that was lost.
    const std::vector<std::string> order = OrderNodesOf(member_name_, stat.czxid);
    if (!order.empty()) own_order_path_ = order.front();
    return Status::OK();
  }
  if (rc == ZOK) {
    spdlog::warn("registry: {} is held by session 0x{:x}, not ours; replacing it",
                 member_path_, stat.ephemeralOwner);
    rc = zoo_delete(zh_, member_path_.c_str(), stat.version);
    if (rc != ZOK && rc != ZNONODE) return ZkError("delete", member_path_, rc);
    if (rc == ZOK) DeleteOrderNodes(member_name_, stat.czxid);
  } else if (rc != ZNONODE) {
    return ZkError("exists", member_path_, rc);
  }
  rc = CreateMember(create_mark, czxid);
  return rc == ZOK ? Status::OK() : MemberError(rc);
}

// Creates our member node and its order node in one multi that also checks
// that our mark's node exists. Without create_mark a missing mark node is
// kMarkGone: a mark a remove-mark deleted never comes back through a member
// that registers again (partition/change.h). With it, the mark's node (and
// .cluster/marks, .cluster/order) is created when missing and the multi sent
// again; in a ring that has them, registering is that one request.
int Registry::Impl::CreateMember(bool create_mark, int64_t* czxid) {
  // An order node an earlier registration of this session left (our member
  // node deleted by hand, a Deregister() whose delete failed): two order
  // nodes of one name make every instance read czxids for our mark.
  if (const int rc = DeleteOwnOrderNode(); rc != ZOK) return rc;
  const std::string order_prefix = order_path_ + "/" + member_name_ + "-";
  bool made_mark = false;
  bool made_order = false;
  for (;;) {
    zoo_op_t ops[4];
    zoo_op_result_t results[4] = {};
    zoo_check_op_init(&ops[0], mark_path_.c_str(), -1);
    zoo_create_op_init(&ops[1], member_path_.c_str(), member_name_.data(),
                       static_cast<int>(member_name_.size()), acl_.get(), ZOO_EPHEMERAL, nullptr,
                       0);
    // A set of the node just made, with the data it was made with: its
    // answer carries the node's Stat, so the czxid costs no request of its
    // own (a multi's create answers with the path only).
    Stat stat{};
    zoo_set_op_init(&ops[2], member_path_.c_str(), member_name_.data(),
                    static_cast<int>(member_name_.size()), 0, &stat);
    std::vector<char> order_buf(order_prefix.size() + 64);
    zoo_create_op_init(&ops[3], order_prefix.c_str(), nullptr, -1, acl_.get(),
                       ZOO_EPHEMERAL_SEQUENTIAL, order_buf.data(),
                       static_cast<int>(order_buf.size()));
    const int rc = ZkMulti(zh_, 4, ops, results);
    if (rc == ZOK) {
      own_order_path_ = order_buf.data();
      *czxid = stat.czxid;
      return ZOK;
    }
    if (results[0].err == ZNONODE) {
      if (!create_mark) return kMarkGone;
      if (made_mark) return ZNONODE;  // deleted again at once: retried later
      for (const std::string* path : {&marks_path_, &mark_path_}) {
        const int made = Create(*path, "", ZOO_PERSISTENT);
        if (made == ZNONODE) settings_ok_ = false;  // .cluster was deleted: recreate it
        if (made != ZOK && made != ZNODEEXISTS) return made;
      }
      made_mark = true;
      continue;
    }
    if (results[3].err == ZNONODE && !made_order) {
      // No .cluster/order yet (a ring an earlier version made): create it.
      const int made = Create(order_path_, "", ZOO_PERSISTENT);
      if (made == ZNONODE) settings_ok_ = false;  // .cluster was deleted: recreate it
      if (made != ZOK && made != ZNODEEXISTS) return made;
      made_order = true;
      continue;
    }
    const int err = results[1].err;
    return err != ZOK && err != ZRUNTIMEINCONSISTENCY ? err : rc;
  }
}

// Deletes the order node of our last registration, if we may still hold
// one: ZOK once there is none. Kept on any other answer, to try again.
int Registry::Impl::DeleteOwnOrderNode() {
  if (own_order_path_.empty()) return ZOK;
  const int rc = zoo_delete(zh_, own_order_path_.c_str(), -1);
  if (rc != ZOK && rc != ZNONODE) return rc;
  own_order_path_.clear();
  return ZOK;
}

// The paths of the order nodes of member node "name" made with creation
// zxid "czxid" (the transaction that made that member node made them).
std::vector<std::string> Registry::Impl::OrderNodesOf(const std::string& name, int64_t czxid) {
  std::vector<std::string> out;
  String_vector children{};
  if (zoo_get_children(zh_, order_path_.c_str(), 0, &children) != ZOK) return out;
  std::vector<std::string> names(children.data, children.data + children.count);
  deallocate_String_vector(&children);
  for (const std::string& child : names) {
    std::string of;
    int64_t seq;
    if (!ParseOrderNode(child, &of, &seq) || of != name) continue;
    const std::string path = order_path_ + "/" + child;
    Stat stat{};
    if (zoo_exists(zh_, path.c_str(), 0, &stat) == ZOK && stat.czxid == czxid) {
      out.push_back(path);
    }
  }
  return out;
}

// Deletes those order nodes once that registration's member node is gone,
// so that a later registration of the name is the only one with an order
// node. Best effort: a node left over goes with its session, and until
// then instances read czxids for that mark.
void Registry::Impl::DeleteOrderNodes(const std::string& name, int64_t czxid) {
  for (const std::string& path : OrderNodesOf(name, czxid)) {
    const int rc = zoo_delete(zh_, path.c_str(), -1);
    if (rc != ZOK && rc != ZNONODE) {
      spdlog::warn("registry: removing {}: {}", path, ZkError("delete", path, rc).ToString());
    }
  }
}

Status Registry::Impl::MemberError(int rc) {
  if (rc == kMarkGone) {
    return Status::NotFound(mark_path_ + " is gone: mark " + std::to_string(opt_.mark) +
                            " was removed from the ring, so this member does not register "
                            "(start it with a new mark, or let it import its range as one)");
  }
  return ZkError("create", member_path_, rc);
}

// Deregister(): delete our member node if our session holds it (a node of
// our address held by another session is not ours to delete). After
// expiry there is nothing left to delete.
Status Registry::Impl::RemoveNode() {
  int64_t session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session = session_id_;
  }
  Stat stat{};
  int rc = zoo_exists(zh_, member_path_.c_str(), 0, &stat);
  if (rc == ZOK && stat.ephemeralOwner == session) {
    rc = zoo_delete(zh_, member_path_.c_str(), -1);
    if (rc == ZOK) spdlog::info("registry: deregistered {}", member_path_);
  }
  if (rc != ZOK && rc != ZNONODE) return ZkError("delete", member_path_, rc);
  rc = DeleteOwnOrderNode();
  if (rc != ZOK) return ZkError("delete", own_order_path_, rc);
  {
    std::lock_guard<std::mutex> lock(mu_);
    deregister_ = false;
  }
  SetRegistered(false);
  MarkDirty(opt_.service_path);
  return Status::OK();
}

// ---- registry thread: requests (RecordChain, Ping) -----------------------

// Takes the queued requests of one kind, marking them started: from here
// their callers wait for the answer rather than take them back.
std::vector<std::shared_ptr<Request>> Registry::Impl::Take(Request::Kind kind) {
  std::vector<std::shared_ptr<Request>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = requests_.begin(); it != requests_.end();) {
    if ((*it)->kind == kind) {
      (*it)->started = true;
      out.push_back(std::move(*it));
      it = requests_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Registry::Impl::Answer(const std::vector<std::shared_ptr<Request>>& requests) {
  if (requests.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : requests) r->done = true;
  }
  progress_.notify_all();
}

// One exists() each: any answer from the server (the service path may not
// exist yet for an observer) means the session is alive now.
void Registry::Impl::ServePings() {
  std::vector<std::shared_ptr<Request>> pings = Take(Request::Kind::kPing);
  for (const auto& ping : pings) {
    Stat stat{};
    const int rc = zoo_exists(zh_, opt_.service_path.c_str(), 0, &stat);
    const Status s = rc == ZOK || rc == ZNONODE ? Status::OK()
                                                : ZkError("exists", opt_.service_path, rc);
    std::lock_guard<std::mutex> lock(mu_);
    ping->status = s;
  }
  Answer(pings);
}

// Deletes each queued member node that still has the creation zxid the
// eviction names (not a later registration at the same address), with the
// version just read. Nobody waits for the answer: the ring read its
// deletion triggers is what counts.
void Registry::Impl::ServeEvictions() {
  std::vector<std::shared_ptr<Request>> evictions = Take(Request::Kind::kEvict);
  for (const auto& e : evictions) {
    const std::string path = opt_.service_path + "/" + MemberNodeName(opt_.mark, e->member);
    Stat stat{};
    int rc = zoo_exists(zh_, path.c_str(), 0, &stat);
    const bool stale = e->czxid == 0 ? stat.ephemeralOwner != zoo_client_id(zh_)->client_id
                                     : stat.czxid == e->czxid;
    if (rc == ZOK && stale) {
      rc = zoo_delete(zh_, path.c_str(), stat.version);
      if (rc == ZOK) {
        DeleteOrderNodes(MemberNodeName(opt_.mark, e->member), stat.czxid);
        spdlog::warn("registry: removed {} (czxid 0x{:x}): {}", path, stat.czxid,
                     e->czxid == 0 ? "left by this instance's previous process"
                                   : "its host refused connections to it");
      }
    }
    if (rc != ZOK && rc != ZNONODE && rc != ZBADVERSION) {
      spdlog::warn("registry: removing {}: {}", path, ZkError("delete", path, rc).ToString());
    }
  }
  Answer(evictions);
}

// Writes each queued chain; answered by the caller of this (Step) after the
// ring read that follows, so ring() shows what was recorded.
std::vector<std::shared_ptr<Request>> Registry::Impl::ServeRecords() {
  std::vector<std::shared_ptr<Request>> records = Take(Request::Kind::kRecord);
  for (const auto& record : records) {
    const Status s = RecordNow(record->chain);
    if (!s.ok()) {
      spdlog::warn("registry: recording the chain of mark {}: {}", opt_.mark, s.ToString());
    }
    std::lock_guard<std::mutex> lock(mu_);
    record->status = s;
  }
  return records;
}

// RecordChain()'s rules (registry.h). The multi holds:
//   check  <our member node>, at the data version just read
//   check  the member node of every other member named, at any version
//   set    .cluster/chains/<mark>, at the data version just read
//          (create it instead if it did not exist)
// The first check makes the write conditional on our member node existing; it
// runs through our session, and we checked just before that the node is
// held by this very session, so an expired member (its node gone, or a new
// one of the same address held by another session) cannot record. A
// ZBADVERSION or ZNODEEXISTS on the chain node is another head's write
// since our read: read again and apply the rules again.
Status Registry::Impl::RecordNow(const RecordedChain& chain) {
  const std::string json = chain.ToJson();
  const Status not_registered = Status::Unavailable(
      "cannot record the chain of mark " + std::to_string(opt_.mark) + ": not registered (" +
      member_path_ + " is not held by this instance's session)");
  for (int attempt = 0; attempt < kRecordAttempts; ++attempt) {
    int64_t session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!registered_) return not_registered;
      session = session_id_;
    }
    Stat mine{};
    int rc = zoo_exists(zh_, member_path_.c_str(), 0, &mine);
    if (rc == ZNONODE || (rc == ZOK && mine.ephemeralOwner != session)) return not_registered;
    if (rc != ZOK) return ZkError("exists", member_path_, rc);

    std::string data;
    Stat stat{};
    rc = GetData(chain_path_, /*watch=*/false, &data, &stat);
    if (rc != ZOK && rc != ZNONODE) return ZkError("get", chain_path_, rc);
    const bool exists = rc == ZOK;
    RecordedChain current;
    if (exists && RecordedChain::FromJson(data, &current).ok()) {
      // Nothing to write. Read the ring anyway: the caller then finds in
      // ring() the chain that stands (our watch may not have fired yet).
      if (current.ring_version > chain.ring_version) {
        spdlog::info("registry: not recording {} for ring version {}: {} holds ring version {}",
                     json, chain.ring_version, chain_path_, current.ring_version);
        MarkDirty(chain_path_);
        MarkDirty(chains_path_);
        return Status::OK();
      }
      if (current == chain) {
        MarkDirty(chain_path_);
        MarkDirty(chains_path_);
        return Status::OK();
      }
    }  // else absent, empty or unreadable: ours replaces it

    struct Other {
      std::string member;
      std::string path;
    };
    std::vector<Other> others;
    for (const std::string& m : chain.members) {
      if (m != opt_.advertise) {
        others.push_back({m, opt_.service_path + "/" + MemberNodeName(opt_.mark, m)});
      }
    }
    const size_t n = others.size() + 2;
    std::vector<zoo_op_t> ops(n);
    std::vector<zoo_op_result_t> results(n);
    Stat written{};
    char created[1];  // the created path is not needed
    zoo_check_op_init(&ops[0], member_path_.c_str(), mine.version);
    for (size_t k = 0; k < others.size(); ++k) {
      zoo_check_op_init(&ops[k + 1], others[k].path.c_str(), -1);
    }
    if (exists) {
      zoo_set_op_init(&ops[n - 1], chain_path_.c_str(), json.data(),
                      static_cast<int>(json.size()), stat.version, &written);
    } else {
      zoo_create_op_init(&ops[n - 1], chain_path_.c_str(), json.data(),
                         static_cast<int>(json.size()), acl_.get(), ZOO_PERSISTENT, created,
                         sizeof(created));
    }
    rc = ZkMulti(zh_, static_cast<int>(n), ops.data(), results.data());
    if (rc == ZOK) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.chains_recorded;
      }
      MarkDirty(chain_path_);
      MarkDirty(chains_path_);
      spdlog::info("registry: recorded {} in {}", json, chain_path_);
      return Status::OK();
    }
    // The server answers a failed multi with each op's error: ZOK before
    // the failed one, its own error, ZRUNTIMEINCONSISTENCY after it. A
    // failure of the call itself (connection loss) leaves them as zeroed.
    const int check = results[0].err;
    const int write = results[n - 1].err;
    if (check == ZNONODE) return not_registered;
    if (check == ZBADVERSION) continue;  // our node's data was set: read it again
    for (size_t k = 0; k < others.size(); ++k) {
      if (results[k + 1].err != ZNONODE) continue;
      spdlog::info("registry: not recording {}: {} left since (the chain changed)", json,
                   others[k].member);
      MarkDirty(chain_path_);
      MarkDirty(chains_path_);
      return Status::OK();
    }
    if (write == ZBADVERSION || write == ZNODEEXISTS) continue;
    if (write == ZNONODE && exists) continue;  // deleted since our read: create it
    if (write == ZNONODE) {
      // .cluster/chains is missing: create it (empty, persistent) and retry.
      const int made = Create(chains_path_, "", ZOO_PERSISTENT);
      if (made == ZNONODE) settings_ok_ = false;  // .cluster was deleted: recreate it
      if (made != ZOK && made != ZNODEEXISTS) return ZkError("create", chains_path_, made);
      continue;
    }
    return ZkError("multi (check, write)", chain_path_, rc);
  }
  return Status::Unavailable("cannot record the chain of mark " + std::to_string(opt_.mark) +
                             ": " + chain_path_ + " kept changing (" +
                             std::to_string(kRecordAttempts) + " attempts)");
}

// ---- registry thread: reading the ring ----------------------------------
//
// What was read stays in view_ between reads, and each watch event names
// the path it is about, so a read asks ZooKeeper only for what changed: the
// listing whose watch fired, a chain node whose watch fired, and the chain
// order of a member name not seen before (a live node's never changes):
// one listing of the order nodes for those of other marks (OrderMembers),
// the creation zxid of one of our own mark. A name deleted and created
// again between two listings shows in both; the listing's cversion (one
// per child created or deleted) then grows by more than the names that
// came and went, and every member's order is read again.
//
// The reads of one step are sent together with the asynchronous API and
// answered on the completion thread, in the order sent, after every watch
// event the server sent before them (one session's replies and events
// arrive in order, and both go through the completion thread). seq_ numbers
// events and answers in that order, so "this node changed before that read
// was answered" is a comparison.
//
// The change node first: a view without it must show every member and mark
// registered before it went (partition/change.h relies on it). Its read is
// sent before the others of its step (an exists while the view has no
// change node; the get that follows if it came is answered after them, so
// more of the step may need reading again); what is not read again in that step
// is used only if no event about it came before the change node's answer
// (else another step reads it). A view whose every path is clean when the
// last answer came is ZooKeeper's state at that answer; after kReadPasses
// steps a view is published as long as the change node rule holds and the
// change node has not changed since its read (ReadAgain in registry.h).

struct Registry::Impl::ReadOp {
  ReadKind kind = ReadKind::kGet;
  std::string path;
  // Written on the completion thread before the batch's count drops, read
  // by the registry thread once it is zero (both under mu_).
  int rc = ZOK;
  Stat stat{};
  std::string data;
  std::vector<std::string> children;
  uint64_t seq = 0;  // seq_ when answered
};

struct Registry::Impl::ReadBatch {
  std::vector<std::unique_ptr<ReadOp>> ops;  // registry thread only
  int pending = 0;                           // GUARDED_BY(Impl::mu_)
};

// One request in flight: the completion's data.
struct Registry::Impl::PendingRead {
  Impl* impl;
  std::shared_ptr<ReadBatch> batch;  // kept alive until answered
  ReadOp* op;
};

void Registry::Impl::ReadAnswered(const void* data, int rc, const Stat* stat) {
  std::unique_ptr<const PendingRead> p(static_cast<const PendingRead*>(data));
  p->op->rc = rc;
  if (stat != nullptr) p->op->stat = *stat;
  std::lock_guard<std::mutex> lock(p->impl->mu_);
  p->op->seq = ++p->impl->seq_;
  if (--p->batch->pending == 0) p->impl->reads_cv_.notify_all();
}

void Registry::Impl::DataDone(int rc, const char* value, int len, const Stat* stat,
                              const void* data) {
  const auto* p = static_cast<const PendingRead*>(data);
  if (rc == ZOK && value != nullptr && len > 0) p->op->data.assign(value, static_cast<size_t>(len));
  ReadAnswered(data, rc, stat);
}

void Registry::Impl::StatDone(int rc, const Stat* stat, const void* data) {
  ReadAnswered(data, rc, stat);
}

void Registry::Impl::ChildrenDone(int rc, const String_vector* strings, const Stat* stat,
                                  const void* data) {
  const auto* p = static_cast<const PendingRead*>(data);
  if (rc == ZOK && strings != nullptr) {
    p->op->children.assign(strings->data, strings->data + strings->count);
  }
  ReadAnswered(data, rc, stat);
}

Registry::Impl::ReadOp* Registry::Impl::Send(const std::shared_ptr<ReadBatch>& batch,
                                             ReadKind kind, const std::string& path,
                                             bool watch) {
  auto op = std::make_unique<ReadOp>();
  op->kind = kind;
  op->path = path;
  ReadOp* raw = op.get();
  batch->ops.push_back(std::move(op));
  auto* pending = new PendingRead{this, batch, raw};
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++batch->pending;
    ++stats_.zk_reads;
  }
  watcher_fn watcher = watch ? &Impl::Watch : nullptr;
  int rc = ZOK;
  switch (kind) {
    case ReadKind::kGet:
      rc = zoo_awget(zh_, path.c_str(), watcher, this, &Impl::DataDone, pending);
      break;
    case ReadKind::kExists:
      rc = zoo_awexists(zh_, path.c_str(), watcher, this, &Impl::StatDone, pending);
      break;
    case ReadKind::kChildren:
      rc = zoo_awget_children2(zh_, path.c_str(), watcher, this, &Impl::ChildrenDone, pending);
      break;
  }
  if (rc != ZOK) {  // not sent: the completion never runs
    delete pending;
    raw->rc = rc;
    std::lock_guard<std::mutex> lock(mu_);
    --batch->pending;
  }
  return raw;
}

// Waits for every answer of "batch". A lost connection fails the requests
// in flight (ZCONNECTIONLOSS) within the session timeout.
// Closing: the answers on their way still get a moment to come in, since
// zookeeper_close() drops an answer the client received but had not yet
// handed to its completion (never calling it: a leak).
Status Registry::Impl::Wait(const std::shared_ptr<ReadBatch>& batch) {
  std::unique_lock<std::mutex> lock(mu_);
  reads_cv_.wait(lock, [&] { return batch->pending == 0 || stop_; });
  if (batch->pending > 0) {
    reads_cv_.wait_for(lock, std::chrono::milliseconds(kCloseWaitMs),
                       [&] { return batch->pending == 0; });
  }
  return batch->pending == 0 ? Status::OK() : Status::Unavailable("the registry is closed");
}

void Registry::Impl::MarkDirty(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  MarkDirtyLocked(path, /*urgent=*/true);
}

// The change node and the three listings: what a reconnect or a Refresh()
// reads again.
void Registry::Impl::MarkListingsLocked() {
  MarkDirtyLocked(change_path_, /*urgent=*/true);
  MarkDirtyLocked(opt_.service_path, /*urgent=*/true);
  MarkDirtyLocked(marks_path_, /*urgent=*/true);
  MarkDirtyLocked(chains_path_, /*urgent=*/true);
}

void Registry::Impl::MarkDirtyLocked(const std::string& path, bool urgent) {
  if (dirty_.empty()) dirty_since_ms_ = NowMs();
  dirty_.emplace(path, ++seq_);
  urgent_ = urgent_ || urgent;
}

// -1: nothing to read; 0: read now; else the milliseconds until the burst
// of events that made paths dirty is read as one: kCoalesceMs after its
// first event, and no sooner than spacing_ms_ after the last read.
int Registry::Impl::ReadDelayMs() {
  std::lock_guard<std::mutex> lock(mu_);
  if (dirty_.empty()) return -1;
  if (urgent_) return 0;
  const int64_t due = std::max(dirty_since_ms_ + kCoalesceMs, last_read_ms_ + spacing_ms_);
  return static_cast<int>(std::max<int64_t>(0, due - NowMs()));
}

// A storm of changes (a ring starting, a rolling restart) fires every
// instance's watches many times a second, and each read costs ZooKeeper a
// request or two per instance and the instance O(members) of work. A read
// that begins within kStormGapMs of the last one's end doubles the spacing
// of the watch reads after it (from kCoalesceMs up to kMaxSpacingMs, so a
// change still shows within 1 s); one after a quiet gap resets it. Reads
// the registry needs at once (urgent_) are never held back.
void Registry::Impl::NoteRead(int64_t started_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (last_read_ms_ != 0 && started_ms - last_read_ms_ < kStormGapMs) {
    spacing_ms_ = std::min(kMaxSpacingMs, std::max(kCoalesceMs, 2 * spacing_ms_));
  } else {
    spacing_ms_ = 0;
  }
  last_read_ms_ = NowMs();
}

bool ReadAgain(const std::map<std::string, uint64_t>& dirty, uint64_t change_seq,
               const std::string& change_path, const std::string& all, int pass, int read_passes) {
  for (const auto& [path, seq] : dirty) {
    if (seq < change_seq || path == change_path || path == all) return true;
  }
  return !dirty.empty() && pass < read_passes;
}

Status Registry::Impl::ReadRing() {
  const int64_t started_ms = NowMs();
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = refresh_asked_;
  }
  for (int pass = 1;; ++pass) {
    std::map<std::string, uint64_t> dirty;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dirty.swap(dirty_);
      urgent_ = false;
    }
    const Status s = ReadPass(dirty);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [path, seq] : dirty) dirty_.emplace(path, seq);
      return s;
    }
    bool again;
    {
      std::lock_guard<std::mutex> lock(mu_);
      again = ReadAgain(dirty_, change_seq_, change_path_, kAllPaths, pass, kReadPasses);
    }
    if (!again) break;
    // What is dirty stays dirty: the step after the back-off reads it.
    if (pass >= kReadPassesMax) {
      return Status::Busy("the ring's change node changed in each of " +
                          std::to_string(pass) + " reads; no view published");
    }
  }
  CheckOwnNode();
  Publish(BuildRing(), ticket);
  NoteRead(started_ms);
  return Status::OK();
}

// One step: reads what "dirty" names (everything if the view is new or
// "dirty" holds kAllPaths), then what those answers show to be new.
Status Registry::Impl::ReadPass(const std::map<std::string, uint64_t>& dirty) {
  const bool all = !view_.valid || dirty.count(kAllPaths) > 0;
  const auto wanted = [&](const std::string& path) { return all || dirty.count(path) > 0; };
  using Kind = ReadKind;
  View next = view_;

  auto first = std::make_shared<ReadBatch>();
  // The change node is there only while a ring change runs: where the view
  // has none, an exists (which watches its creation) asks for it, and its
  // data is read only if it came.
  const bool change_wanted = wanted(change_path_);
  ReadOp* change_probe = change_wanted && !view_.change
                             ? Send(first, Kind::kExists, change_path_, true)
                             : nullptr;
  ReadOp* change = change_wanted && view_.change ? Send(first, Kind::kGet, change_path_, true)
                                                 : nullptr;
  ReadOp* children = wanted(opt_.service_path)
                         ? Send(first, Kind::kChildren, opt_.service_path, true)
                         : nullptr;
  ReadOp* marks = wanted(marks_path_) ? Send(first, Kind::kChildren, marks_path_, true) : nullptr;
  ReadOp* chains = wanted(chains_path_) ? Send(first, Kind::kChildren, chains_path_, true)
                                        : nullptr;
  std::vector<std::pair<std::string, ReadOp*>> chain_reads;
  for (const auto& [name, node] : view_.chains) {
    const std::string path = chains_path_ + "/" + name;
    if (wanted(path)) chain_reads.emplace_back(name, Send(first, Kind::kGet, path, true));
  }
  FLATKV_RETURN_IF_ERROR(Wait(first));

  auto second = std::make_shared<ReadBatch>();
  ReadOp* change_exists = nullptr;
  ReadOp* change_data = nullptr;  // the get after an exists that found it
  // The answer that read the change node's state: the rule on what else a
  // view may use is ordered by it (ReadAgain).
  ReadOp* change_read = change != nullptr ? change : change_probe;
  if (change_probe != nullptr) {
    if (change_probe->rc == ZOK) {
      change_data = Send(second, Kind::kGet, change_path_, true);
      change_read = change_data;
    } else if (change_probe->rc != ZNONODE) {
      return ZkError("exists", change_path_, change_probe->rc);
    }
    next.change.reset();
  } else if (change != nullptr) {
    if (change->rc == ZNONODE) {
      next.change.reset();
      // No watch was left by the get: watch its creation.
      change_exists = Send(second, Kind::kExists, change_path_, true);
    } else if (change->rc != ZOK) {
      return ZkError("get", change_path_, change->rc);
    } else {
      next.change = ParseChange(change->data, change->stat);
    }
  }
  std::vector<std::pair<std::string, ReadOp*>> member_reads;
  std::vector<std::string> unordered;  // of other marks, to key by order nodes
  if (children != nullptr) {
    if (children->rc == ZNONODE) settings_ok_ = false;  // the service path was deleted: recreate it
    if (children->rc != ZOK) return ZkError("get children", opt_.service_path, children->rc);
    const std::set<std::string> before(view_.children.begin(), view_.children.end());
    const std::set<std::string> after(children->children.begin(), children->children.end());
    int64_t came = 0;
    int64_t went = 0;
    for (const std::string& c : after) came += before.count(c) == 0 ? 1 : 0;
    for (const std::string& c : before) went += after.count(c) == 0 ? 1 : 0;
    const int64_t ops = int64_t{children->stat.cversion} - view_.children_cversion;
    // Some name went and came back (or the path was made again): its node
    // may be a new one. Read every czxid again.
    const bool churn = !view_.children_read || ops != came + went;
    // One child created since the last listing and nothing else: its czxid
    // is the listing's pzxid (the zxid of the newest child created or
    // deleted). Our own node is read all the same: the check of it needs
    // its session.
    const bool one_new = view_.children_read && ops == 1 && came == 1 && went == 0;
    next.children = std::move(children->children);
    next.children_cversion = children->stat.cversion;
    next.children_read = true;
    next.members.clear();
    for (const std::string& child : next.children) {
      Ring::Registration r;
      if (!ParseMemberNode(child, &r.mark, &r.member.host, &r.member.port)) {
        if (child != ".cluster") {
          WarnOnce(child, child.starts_with(kMemberPrefix) ? "a malformed member name"
                                                           : "not a member");
        }
        continue;
      }
      const auto known = view_.members.find(child);
      if (!churn && known != view_.members.end()) {
        next.members.emplace(child, known->second);
      } else if (!OwnMark(r.mark)) {
        unordered.push_back(child);  // ordered by the order listing below
      } else if (one_new && child != member_name_) {
        MemberNode m;
        m.reg = std::move(r);
        m.reg.member.czxid = children->stat.pzxid;
        next.members.emplace(child, std::move(m));
      } else {
        member_reads.emplace_back(
            child, Send(second, Kind::kExists, opt_.service_path + "/" + child, false));
      }
    }
  }
  // Members of other marks are ordered by their order nodes: one listing
  // instead of an exists each. Sent after the service path's listing, so it
  // shows the order node of every member that listing holds (both were
  // made in one transaction) unless the member has gone since.
  ReadOp* order = unordered.empty() ? nullptr
                                    : Send(second, Kind::kChildren, order_path_, false);
  ReadOp* marks_exists = nullptr;
  if (marks != nullptr) {
    next.marks.clear();
    next.marks_cversion = 0;
    if (marks->rc == ZNONODE) {
      // No mark was ever recorded: watch the creation of .cluster/marks.
      marks_exists = Send(second, Kind::kExists, marks_path_, true);
    } else if (marks->rc != ZOK) {
      return ZkError("get children", marks_path_, marks->rc);
    } else {
      next.marks_cversion = marks->stat.cversion;
      for (const std::string& child : marks->children) {
        int64_t mark;
        if (ParseMark(child, &mark)) {
          next.marks.push_back(mark);
        } else {
          WarnOnce(".cluster/marks/" + child, "not a decimal mark");
        }
      }
    }
  }
  for (const auto& [name, op] : chain_reads) {
    if (op->rc == ZNONODE) {  // deleted: the listing's watch tells if it comes back
      next.chains.erase(name);
      continue;
    }
    if (op->rc != ZOK) return ZkError("get", op->path, op->rc);
    next.chains[name] = ParseChainNode(name, *op);
  }
  ReadOp* chains_exists = nullptr;
  std::vector<std::pair<std::string, ReadOp*>> new_chains;
  if (chains != nullptr) {
    next.chains_cversion = 0;
    if (chains->rc == ZNONODE) {
      next.chains.clear();
      chains_exists = Send(second, Kind::kExists, chains_path_, true);
    } else if (chains->rc != ZOK) {
      return ZkError("get children", chains_path_, chains->rc);
    } else {
      next.chains_cversion = chains->stat.cversion;
      std::map<std::string, ChainNode> kept;
      for (const std::string& child : chains->children) {
        int64_t mark;
        if (!ParseMark(child, &mark)) {
          WarnOnce(".cluster/chains/" + child, "not a decimal mark");
          continue;
        }
        const auto known = next.chains.find(child);
        if (known != next.chains.end()) {
          kept.emplace(child, known->second);
        } else {
          new_chains.emplace_back(child,
                                  Send(second, Kind::kGet, chains_path_ + "/" + child, true));
        }
      }
      next.chains = std::move(kept);
    }
  }
  FLATKV_RETURN_IF_ERROR(Wait(second));

  // ZNONODE: deleted since the exists, whose watch tells.
  if (change_data != nullptr && change_data->rc == ZOK) {
    next.change = ParseChange(change_data->data, change_data->stat);
  } else if (change_data != nullptr && change_data->rc != ZNONODE) {
    return ZkError("get", change_path_, change_data->rc);
  }
  const auto add_read = [&](const std::string& name, const ReadOp& op) -> Status {
    if (op.rc == ZNONODE) return Status::OK();  // gone since the listing; its watch event follows
    if (op.rc != ZOK) return ZkError("exists", op.path, op.rc);
    MemberNode m;
    ParseMemberNode(name, &m.reg.mark, &m.reg.member.host, &m.reg.member.port);
    m.reg.member.czxid = op.stat.czxid;
    m.owner = op.stat.ephemeralOwner;
    next.members[name] = std::move(m);
    return Status::OK();
  };
  for (const auto& [name, op] : member_reads) FLATKV_RETURN_IF_ERROR(add_read(name, *op));
  FLATKV_RETURN_IF_ERROR(OrderMembers(order, unordered, &next, add_read));
  for (const auto& [name, op] : new_chains) {
    if (op->rc == ZNONODE) continue;  // deleted since the listing, whose watch fires
    if (op->rc != ZOK) return ZkError("get", op->path, op->rc);
    next.chains[name] = ParseChainNode(name, *op);
  }
  // ZOK: created since the read, and its exists set a watch only on its
  // changes: marked dirty, it is read by the next pass.
  for (ReadOp* op : {change_exists, marks_exists, chains_exists}) {
    if (op == nullptr) continue;
    if (op->rc == ZOK) MarkDirty(op->path);
    if (op->rc != ZOK && op->rc != ZNONODE) return ZkError("exists", op->path, op->rc);
  }
  next.valid = true;
  view_ = std::move(next);
  if (change_read != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    change_seq_ = change_read->seq;
  }
  return Status::OK();
}

// Keys the members "unordered" names (of other marks, new to this view) by
// the listing "order" of .cluster/order: a member with exactly one order
// node by its sequence number. Every member of a mark is keyed alike, so a
// mark where a member has none (a node made by other software or an
// earlier version) or several (an earlier registration's not yet gone) is
// keyed by czxids: they are read for each of its members not read before,
// and kept (the mark stays keyed so while this view lasts). This
// instance's own mark is always keyed by czxids (ChainConfig's epochs).
Status Registry::Impl::OrderMembers(const ReadOp* order, const std::vector<std::string>& unordered,
                                    View* next, const AddRead& add_read) {
  if (order == nullptr) return Status::OK();
  if (order->rc != ZOK && order->rc != ZNONODE) {
    return ZkError("get children", order_path_, order->rc);
  }
  std::map<std::string, std::vector<int64_t>> seqs;
  for (const std::string& child : order->children) {
    std::string name;
    int64_t seq;
    if (ParseOrderNode(child, &name, &seq)) seqs[name].push_back(seq);
  }
  for (const std::string& name : unordered) {
    MemberNode m;
    ParseMemberNode(name, &m.reg.mark, &m.reg.member.host, &m.reg.member.port);
    const auto it = seqs.find(name);
    if (it != seqs.end() && it->second.size() == 1) {
      m.reg.member.czxid = it->second.front();
      m.by_seq = true;
    }
    next->members[name] = std::move(m);
  }
  std::set<int64_t> by_czxid;
  for (const auto& [name, m] : next->members) {
    if (!OwnMark(m.reg.mark) && !m.by_seq) by_czxid.insert(m.reg.mark);
  }
  auto third = std::make_shared<ReadBatch>();
  std::vector<std::pair<std::string, ReadOp*>> reads;
  for (const auto& [name, m] : next->members) {
    if (by_czxid.count(m.reg.mark) == 0 || (!m.by_seq && m.reg.member.czxid != 0)) continue;
    reads.emplace_back(name,
                       Send(third, ReadKind::kExists, opt_.service_path + "/" + name, false));
  }
  if (reads.empty()) return Status::OK();
  FLATKV_RETURN_IF_ERROR(Wait(third));
  for (const auto& [name, op] : reads) {
    next->members.erase(name);
    FLATKV_RETURN_IF_ERROR(add_read(name, *op));
  }
  return Status::OK();
}

// The ring change in progress (.cluster/change). A node that does not
// parse counts as a change nobody can finish: it is logged and kept, so
// writes stay safe.
RingChange Registry::Impl::ParseChange(const std::string& data, const Stat& stat) {
  RingChange c;
  Status s = RingChange::FromJson(data, &c);
  if (!s.ok()) {
    WarnOnce(".cluster/change (data version " + std::to_string(stat.version) + ")",
             s.message() + "; delete the node once no ring change runs");
    c = RingChange();
    c.kind = "unknown";
  }
  c.czxid = stat.czxid;
  return c;
}

// A recorded chain (.cluster/chains/<mark>). One that cannot be parsed
// counts as no recorded chain (warned once per write); its data version
// still counts in the ring's version.
Registry::Impl::ChainNode Registry::Impl::ParseChainNode(const std::string& name,
                                                         const ReadOp& op) {
  ChainNode node;
  node.version = op.stat.version;
  if (op.data.empty()) return node;  // created empty (by hand): nothing recorded
  Status s = op.stat.dataLength > kChainDataMax
                 ? Status::InvalidArgument(std::to_string(op.stat.dataLength) + " bytes, over " +
                                           std::to_string(kChainDataMax))
                 : RecordedChain::FromJson(op.data, &node.chain);
  if (!s.ok()) {
    WarnOnce(".cluster/chains/" + name + " (data version " + std::to_string(op.stat.version) + ")",
             s.message() + "; no recorded chain for mark " + name);
    return node;
  }
  node.chain.zxid = op.stat.mzxid;
  node.parsed = true;
  return node;
}

// Notices whether our own node is still there and still ours.
void Registry::Impl::CheckOwnNode() {
  bool registered;
  int64_t session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registered = registered_;
    session = session_id_;
  }
  if (!registered) return;
  const auto mine = view_.members.find(member_name_);
  if (mine != view_.members.end() && mine->second.owner == session) return;
  // Deleted by hand, or replaced by another process that advertises our
  // address. Re-create it in the first case; do not fight in the second.
  yielded_ = std::find(view_.children.begin(), view_.children.end(), member_name_) !=
             view_.children.end();
  spdlog::warn("registry: our member node {} {}", member_path_,
               yielded_ ? "is now held by another session (same cluster.advertise?)"
                        : "is gone; registering again");
  SetRegistered(false);
}

// The ring as view_ holds it. The version: registry.h.
std::shared_ptr<const Ring> Registry::Impl::BuildRing() const {
  std::vector<Ring::Registration> regs;
  regs.reserve(view_.members.size());
  for (const auto& [name, m] : view_.members) regs.push_back(m.reg);
  int64_t version = int64_t{view_.children_cversion} + view_.marks_cversion +
                    view_.chains_cversion;
  std::map<int64_t, RecordedChain> chains;
  for (const auto& [name, node] : view_.chains) {
    version += node.version;
    int64_t mark;
    if (node.parsed && ParseMark(name, &mark)) chains[mark] = node.chain;
  }
  return Ring::Make(version, opt_.settings, view_.marks, std::move(regs), std::move(chains),
                    view_.change);
}

// Creates, updates or deletes .cluster/change for each queued request;
// answered after the ring read that follows (MarkDirty), like records.
std::vector<std::shared_ptr<Request>> Registry::Impl::ServeChanges() {
  std::vector<std::shared_ptr<Request>> changes = Take(Request::Kind::kChange);
  for (const auto& change : changes) {
    const Status s = ChangeNow(*change);
    std::lock_guard<std::mutex> lock(mu_);
    change->status = s;
  }
  if (!changes.empty()) {
    MarkDirty(change_path_);
    MarkDirty(marks_path_);
  }
  return changes;
}

Status Registry::Impl::ChangeNow(const Request& request) {
  int rc = ZOK;
  switch (request.change_op) {
    case Request::ChangeOp::kCreate: {
      rc = Create(change_path_, request.change.ToJson(), ZOO_PERSISTENT);
      if (rc == ZNODEEXISTS) {
        std::string data;
        Stat node{};
        const int got = GetData(change_path_, false, &data, &node);
        return Status::Busy("another ring change runs (" + change_path_ + ": " +
                            (got == ZOK ? data : std::string("unreadable")) + ")");
      }
      break;
    }
    case Request::ChangeOp::kSet:
    case Request::ChangeOp::kDelete:
    case Request::ChangeOp::kAbort: {
      // Only the node of this very change (its czxid), at the version read:
      // never one an abort removed and another change created since.
      std::string data;
      Stat node{};
      rc = GetData(change_path_, false, &data, &node);
      if (rc == ZNONODE) {
        if (request.change_op == Request::ChangeOp::kDelete) return Status::OK();
        return Status::NotFound("no ring change runs (" + change_path_ + " is gone)");
      }
      if (rc != ZOK) break;
      if (request.change_op == Request::ChangeOp::kAbort) {
        RingChange now;
        if (RingChange::FromJson(data, &now).ok() && now.state != "copy" &&
            now.state != "precopy") {
          return Status::InvalidArgument("the ring change is past its copy (state " + now.state +
                                         "): it cannot be rolled back; it finishes by itself "
                                         "once its importer runs");
        }
      } else if (node.czxid != request.change.czxid) {
        return Status::Busy("the ring change node belongs to another change now");
      }
      if (request.change_op == Request::ChangeOp::kSet) {
        const std::string json = request.change.ToJson();
        rc = zoo_set(zh_, change_path_.c_str(), json.data(), static_cast<int>(json.size()),
                     node.version);
      } else {
        rc = zoo_delete(zh_, change_path_.c_str(), node.version);
        if (rc == ZNONODE) rc = ZOK;
      }
      if (rc == ZBADVERSION) return Status::Busy("the ring change node changed meanwhile");
      break;
    }
    case Request::ChangeOp::kDeleteMark: {
      // Only while the change node is this remove's, checked in the same
      // multi: a member that was cut off past its session may come back to
      // a remove another head finished, after which the mark may have been
      // added back (a new node of the same name).
      const std::string path = marks_path_ + "/" + std::to_string(request.change.source);
      std::string data;
      Stat node{};
      rc = GetData(change_path_, false, &data, &node);
      if (rc == ZNONODE || (rc == ZOK && node.czxid != request.change.czxid)) {
        return Status::Busy("the ring change removing mark " +
                            std::to_string(request.change.source) +
                            " is over (its node is gone or another change's); mark node " + path +
                            " left alone");
      }
      if (rc != ZOK) return ZkError("get", change_path_, rc);
      zoo_op_t ops[2];
      zoo_op_result_t results[2] = {};
      zoo_check_op_init(&ops[0], change_path_.c_str(), node.version);
      zoo_delete_op_init(&ops[1], path.c_str(), -1);
      rc = ZkMulti(zh_, 2, ops, results);
      if (rc != ZOK && results[0].err != ZOK) {
        return Status::Busy("the ring change node changed while mark " +
                            std::to_string(request.change.source) + "'s node was deleted; "
                            "nothing deleted");
      }
      if (rc != ZOK && results[1].err == ZNONODE) rc = ZOK;  // gone already
      if (rc != ZOK) return ZkError("delete", path, rc);
      break;
    }
  }
  return rc == ZOK ? Status::OK() : ZkError("ring change", change_path_, rc);
}

// zoo_get/zoo_wget of a small node into "data" (at most kChainDataMax
// bytes; stat->dataLength tells if there was more).
int Registry::Impl::GetData(const std::string& path, bool watch, std::string* data, Stat* stat) {
  data->resize(kChainDataMax);
  int len = kChainDataMax;
  const int rc = watch ? zoo_wget(zh_, path.c_str(), &Impl::Watch, this, data->data(), &len, stat)
                       : zoo_get(zh_, path.c_str(), 0, data->data(), &len, stat);
  data->resize(rc == ZOK && len > 0 ? static_cast<size_t>(std::min(len, kChainDataMax)) : 0);
  return rc;
}

void Registry::Impl::WarnOnce(const std::string& child, std::string_view why) {
  if (!warned_.insert(child).second) return;
  spdlog::warn("registry: skipping {}/{}: {}", opt_.service_path, child, why);
}

// Swaps the new ring in if it differs from the current one, and serves
// every Refresh() ticket issued before this read started.
void Registry::Impl::Publish(std::shared_ptr<const Ring> ring, uint64_t ticket) {
  const std::shared_ptr<const Ring> old = LoadRing();
  const bool changed = !old || !old->SameAs(*ring);
  if (changed) {
    std::lock_guard<std::mutex> lock(ring_mu_);
    ring_ = ring;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.ring_reads;
    refresh_done_ = std::max(refresh_done_, ticket);
    if (changed) {
      stats_.ring_version = ring->version();
      stats_.members_seen = 0;
      for (const Partition& p : ring->partitions()) stats_.members_seen += p.chain.size();
    }
  }
  progress_.notify_all();
  if (!changed) return;
  // ToString() is a line per member: only when it is logged.
  if (spdlog::should_log(spdlog::level::info)) {
    spdlog::info("registry: ring version {}: {}", ring->version(), ring->ToString());
  }
  if (opt_.on_ring) opt_.on_ring(std::move(ring));
}

// ---- the public API -------------------------------------------------------

Registry::Registry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Registry::~Registry() { Close(); }

Status Registry::Start(RegistryOptions options, std::unique_ptr<Registry>* result) {
  Status s = CheckOptions(options);
  if (!s.ok()) return s;
  std::unique_ptr<Registry> registry(new Registry(std::make_unique<Impl>(std::move(options))));
  Impl* impl = registry->impl_.get();
  impl->thread_ = std::thread([impl] { impl->Run(); });
  *result = std::move(registry);
  return Status::OK();
}

void Registry::Register(bool create_mark) {
  if (impl_->opt_.observer) return;
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->want_register_ = true;
  impl_->create_mark_ = create_mark;
  impl_->register_event_ = true;
  impl_->wake_.notify_one();
}

Status Registry::WaitRegistered(int timeout_ms) {
  std::unique_lock<std::mutex> lock(impl_->mu_);
  impl_->progress_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] {
    return impl_->registered_ || impl_->fatal_set_ || impl_->stop_;
  });
  if (impl_->registered_) return Status::OK();
  if (impl_->fatal_set_) return impl_->fatal_status_;
  return Status::Unavailable("not registered in ZooKeeper (" + impl_->opt_.zookeeper +
                             ") after " + std::to_string(timeout_ms) + " ms");
}

void Registry::Deregister() {
  if (impl_->opt_.observer) return;
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->want_register_ = false;
  impl_->deregister_ = true;
  impl_->registered_ = false;
  impl_->czxid_ = 0;
  impl_->register_event_ = true;
  impl_->wake_.notify_one();
}

int64_t Registry::registration_czxid() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->registered_ ? impl_->czxid_ : 0;
}

Status Registry::RecordChain(const std::vector<std::string>& members, int64_t ring_version) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kRecord;
  request->chain = RecordedChain{ring_version, members};
  // Refuse here what the ring would read back as malformed.
  Status s = RecordedChain::FromJson(request->chain.ToJson(), &request->chain);
  if (!s.ok()) return Status::InvalidArgument("RecordChain: " + s.message());
  {
    std::lock_guard<std::mutex> lock(impl_->mu_);
    if (!impl_->registered_ && !impl_->fatal_set_ && !impl_->stop_) {
      return Status::Unavailable("cannot record the chain of mark " +
                                 std::to_string(impl_->opt_.mark) + ": not registered");
    }
  }
  return impl_->Submit(request, impl_->opt_.session_timeout_ms, "recording the chain");
}

// A ring change is no lease: its writes may wait out a short disconnection
// (a request not started by then is taken back and never takes effect).
static int ChangeTimeoutMs(const RegistryOptions& o) {
  return std::max(o.session_timeout_ms * 2, 10000);
}

Status Registry::CreateChange(const RingChange& change) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kChange;
  request->change_op = Request::ChangeOp::kCreate;
  request->change = change;
  return impl_->Submit(request, ChangeTimeoutMs(impl_->opt_), "creating the ring change");
}

Status Registry::UpdateChange(const RingChange& change) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kChange;
  request->change_op = Request::ChangeOp::kSet;
  request->change = change;
  return impl_->Submit(request, ChangeTimeoutMs(impl_->opt_), "updating the ring change");
}

Status Registry::DeleteMark(const RingChange& change) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kChange;
  request->change_op = Request::ChangeOp::kDeleteMark;
  request->change = change;
  return impl_->Submit(request, ChangeTimeoutMs(impl_->opt_), "deleting a mark");
}

Status Registry::DeleteChange(const RingChange& change) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kChange;
  request->change_op = Request::ChangeOp::kDelete;
  request->change = change;
  return impl_->Submit(request, ChangeTimeoutMs(impl_->opt_), "deleting the ring change");
}

Status Registry::AbortChange() {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kChange;
  request->change_op = Request::ChangeOp::kAbort;
  return impl_->Submit(request, ChangeTimeoutMs(impl_->opt_), "aborting the ring change");
}

void Registry::Evict(const std::string& member, int64_t czxid) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kEvict;
  request->member = member;
  request->czxid = czxid;
  std::lock_guard<std::mutex> lock(impl_->mu_);
  if (impl_->fatal_set_ || impl_->stop_ || impl_->opt_.observer) return;
  // Nobody waits for it: a few at most are worth keeping while ZooKeeper
  // is away.
  if (std::count_if(impl_->requests_.begin(), impl_->requests_.end(), [](const auto& r) {
        return r->kind == Request::Kind::kEvict;
      }) >= 16) {
    return;
  }
  impl_->requests_.push_back(std::move(request));
  impl_->request_event_ = true;
  impl_->wake_.notify_one();
}

void Registry::RemoveStale() { Evict(impl_->opt_.advertise, 0); }

Status Registry::Ping(int timeout_ms) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kPing;
  return impl_->Submit(request, timeout_ms, "ping");
}

// Queues "request" for the registry thread and waits for its answer. A
// request the thread has not started by the deadline is taken back, so it
// never takes effect; one it started may still (a write in flight).
Status Registry::Impl::Submit(const std::shared_ptr<Request>& request, int timeout_ms,
                              std::string_view what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (fatal_set_) return fatal_status_;
  if (stop_) return Status::Unavailable("the registry is closed");
  requests_.push_back(request);
  request_event_ = true;
  wake_.notify_one();
  progress_.wait_for(lock, std::chrono::milliseconds(std::max(timeout_ms, 0)),
                     [&] { return request->done || fatal_set_ || stop_; });
  if (request->done) return request->status;
  if (!request->started) {
    requests_.erase(std::find(requests_.begin(), requests_.end(), request));
  }
  if (fatal_set_) return fatal_status_;
  std::string msg = std::string(what) + ": ";
  msg += stop_ ? std::string("the registry is closed")
               : "no answer from ZooKeeper (" + opt_.zookeeper + ") within " +
                     std::to_string(timeout_ms) + " ms" +
                     (connected_ ? "" : " (not connected)");
  if (request->started && request->kind == Request::Kind::kRecord) {
    msg += "; the chain may still have been recorded";
  }
  return Status::Unavailable(msg);
}

std::shared_ptr<const Ring> Registry::ring() const { return impl_->LoadRing(); }

Status Registry::Refresh(std::shared_ptr<const Ring>* ring) {
  std::unique_lock<std::mutex> lock(impl_->mu_);
  if (impl_->fatal_set_) return impl_->fatal_status_;
  if (impl_->stop_) return Status::Unavailable("the registry is closed");
  const uint64_t ticket = ++impl_->refresh_asked_;
  // The listings (events in flight before their answers make the nodes
  // they name dirty too, read in the same refresh).
  impl_->MarkListingsLocked();
  impl_->refresh_event_ = true;
  impl_->wake_.notify_one();
  const bool done = impl_->progress_.wait_for(
      lock, std::chrono::milliseconds(impl_->opt_.session_timeout_ms),
      [&] { return impl_->refresh_done_ >= ticket || impl_->fatal_set_ || impl_->stop_; });
  if (impl_->fatal_set_) return impl_->fatal_status_;
  if (!done || impl_->refresh_done_ < ticket) {
    return Status::Unavailable("cannot read the ring from ZooKeeper (" + impl_->opt_.zookeeper +
                               "): not connected");
  }
  *ring = impl_->LoadRing();
  return Status::OK();
}

SessionLease Registry::lease() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->lease_;
}

bool Registry::connected() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->connected_;
}

int64_t Registry::disconnected_ms() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->connected_ ? 0 : NowMs() - impl_->disconnected_since_ms_;
}

RegistryStats Registry::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->stats_;
}

void Registry::Close() {
  std::lock_guard<std::mutex> close_lock(impl_->close_mu_);
  {
    std::lock_guard<std::mutex> lock(impl_->mu_);
    impl_->stop_ = true;
    impl_->wake_.notify_one();
    impl_->reads_cv_.notify_all();
  }
  impl_->progress_.notify_all();
  if (impl_->thread_.joinable()) impl_->thread_.join();
}

bool Registry::TEST_SessionId(int64_t* id, std::string* password) const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  if (impl_->session_id_ == 0) return false;
  *id = impl_->session_id_;
  *password = impl_->session_passwd_;
  return true;
}

}  // namespace flatkv::partition
