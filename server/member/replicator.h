// Replicator: the I/O shell around partition::ChainMember (chain.h) inside
// flatkv-server. It turns the member's actions into real effects and real
// events into the member's calls:
//
//   handler threads: Write/Append --------+
//   peerChain/peerSnapshot (peer calls) --+--> event queue --> the thread
//   ring changes (registry thread) -------+      running events (below):
//   ticks (loop thread itself) -----------+      ChainMember (under mu_)
//                                                  then, in order: apply to
//                                                  the store (one group commit
//                                                  per batch of events), save
//                                                  the position, send, answer
//   reads: BeforeRead() asks the member directly (under mu_), on the caller's
//   thread, and waits only while a catch-up holds the key back.
//
// Whoever runs events takes every queued event at once, runs them through
// the member and then applies all their writes together, so writes that
// arrive while the previous batch is being made durable share the next
// fdatasync: the batching of the paper's Sent list without a timer. One
// thread at a time runs events (running_): usually the I/O thread that read
// the writes or frames, at the end of its round (Post's run_here,
// ReplicatorOptions::defer: a thread wake-up per hop saved), else the loop
// thread. Whatever may block (Heavy(): ZooKeeper records, checkpoints,
// wipes, snapshots) is handed to the loop, which also runs the ticks, ring
// events and calls that wait.
//
// Messages to a neighbour go through a PeerLink: one connection that sends
// the frames in order as oneway peerChain calls (nothing answers a frame),
// a small one on the caller's thread while the neighbour keeps up with the
// connection, else from the link's own thread merged with what queued
// meanwhile; a frame that cannot be sent is dropped (the member resends
// what a silent neighbour has not acknowledged). A receiver reads the next
// frame once the last is checked and queued (OnFrame without waiting),
// or, while more than kMaxPendingFrames wait, once it has been handled
// and its writes applied: TCP then holds back a fast head, which cannot
// queue unbounded work at a slow successor.
//
// Snapshots (a joiner whose position the tail's log no longer covers): a
// thread per joiner streams the store (integer keys in key order, then
// string keys) as peerSnapshot pages, rate-limited by
// cluster.resync_mb_per_sec. The joiner empties its store first (every key
// removed: a store it may not keep) and loads the pages on its loop thread.
//
// Durability: every batch of writes is appended to the chain log
// (<storage.path>/CHAINLOG, server/member/chain_log.h) before it is applied, and
// under storage.sync: always synced with one fdatasync, on the syncer
// thread while later batches go on (the pipeline, below; the engine below
// then runs as sync: interval). The log names the member's position and
// whether its store is intact (holds every write it applied: false from a
// wipe until the member registered again, and for a data directory that
// never had one); a restart replays it. A write that cannot be logged or
// applied stops the process (exit 3) rather than let the member's history
// and its store part. The log is checkpointed (store synced, log restarted)
// past 64 MiB, when the member registers, after a snapshot and at a stop.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "FlatKV.h"
#include "engine/cache/write_back.h"
#include "engine/status.h"
#include "engine/store.h"
#include "partition/chain.h"
#include "partition/registry.h"
#include "partition/ring.h"
#include "server/member/chain_log.h"

namespace flatkv::server {

// What the replicator needs of ZooKeeper (the Cluster's registry).
class ChainCoordinator {
 public:
  virtual ~ChainCoordinator() = default;
  // Register this member's node (asynchronously); the coordinator calls
  // Replicator::OnRegistered with its creation zxid once it exists.
  virtual void Register() = 0;
  // Remove this member's node and do not register again by itself.
  virtual void Deregister() = 0;
  // Record "members" as this mark's chain (partition/chain.h, the recorded
  // chain) unless a chain of a later ring version is recorded. Blocking.
  virtual Status RecordChain(const std::vector<std::string>& members, int64_t ring_version) = 0;
  // The session's lease evidence (partition/registry.h, SessionLease).
  virtual partition::SessionLease lease() const = 0;
  // Remove the member node of "member" (this mark) if its creation zxid is
  // still "czxid" (ChainOutput::evict). Returns at once.
  virtual void Evict(const std::string& member, int64_t czxid) = 0;
  // Whether a write to "hash" may be sequenced now (a ring change may be
  // moving it: Cluster::CheckWritable). Asked on the loop thread as the
  // write is sequenced, so a fence (an empty write) that a ring change
  // sequences after reading its node orders every later check after it.
  virtual Status CheckWritable(int64_t /*hash*/) const { return Status::OK(); }
};

struct ReplicatorOptions {
  std::string self;        // cluster.advertise
  int64_t mark = 0;        // cluster.mark
  std::string data_dir;    // storage.path (the CHAINLOG file)
  bool sync = true;        // cluster.replication == sync
  bool sync_always = false;  // storage.sync == always
  int session_timeout_ms = 6000;
  int peer_timeout_ms = 2000;
  std::string peer_token;
  // cluster.peer_tls: the CA peers are verified against and the
  // certificate presented to them; empty = plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  uint64_t resync_bytes_per_sec = 0;  // cluster.resync_mb_per_sec; 0 = unlimited
  uint64_t track_max_keys = 1000000;  // cluster.track_max_keys
  int tick_ms = 50;
  partition::ChainOptions chain;
  // Runs a function on the caller's thread after the calls it serves in its
  // current round, returning true, or returns false (EventServer::AtRoundEnd
  // in flatkv-server; null: none). Writes and frames a thread may run itself
  // (Post's run_here) then wait for the end of the round, so the calls of
  // one round share one run: one log write, one apply batch, one frame.
  std::function<bool(std::function<void()>)> defer;
};

class Replicator {
 public:
  // Opens the chain log (a missing one: position (0, 0), not intact),
  // replays it into the store and starts the loop thread. Nothing is sent
  // before the first OnRing().
  static Status Start(ReplicatorOptions options, engine::Store* store,
                      engine::cache::WriteBackCache* cache, ChainCoordinator* coordinator,
                      std::unique_ptr<Replicator>* result);
  ~Replicator();  // Stop()
  // Fails what waits, stops every thread. Idempotent.
  void Stop();

  // The server serves: catch up and register.
  void Join();
  // A new ring (registry thread).
  void OnRing(std::shared_ptr<const partition::Ring> ring);
  // This member's node was created with "czxid" by ZooKeeper session
  // "session" (registry thread).
  void OnRegistered(int64_t czxid, uint64_t session);

  // How a write is answered: its status (OK once acknowledged: sync, the
  // tail applied it; async, this member did) and, for remove and sremove,
  // whether the first op's key existed here before. Called exactly once, on
  // the loop thread (or on the caller's, for a write refused at once, or
  // Stop()'s); it must not block or call back into the replicator.
  using WriteDone = std::function<void(const Status& status, bool existed)>;

  // A client write at this member (it must be the head): the assignments in
  // "ops" touching the keys whose hashes are "keys". Never blocks: "done"
  // gets the answer (UNAVAILABLE if the chain has not acknowledged it
  // within 2 × session timeout + 2 s: it may still be applied). "import":
  // a ring change's own write (a remove's copy into the range this mark
  // takes over, a source dropping what moved): not checked with
  // ChainCoordinator::CheckWritable.
  // "run_here": the caller's thread (an I/O thread or a worker, never the
  // registry's) may carry the write through itself, as the loop would
  // (sequence, log, apply, send; RunHere()), saving a thread wake-up.
  void WriteAsync(std::vector<rpc::ChainOp> ops, std::vector<uint64_t> keys, WriteDone done,
                  bool import = false, bool run_here = false);
  // Append: the put of (current value + "suffix"), read and sequenced on the
  // loop thread after every earlier write was applied.
  void AppendAsync(int64_t key, std::string suffix, uint64_t max_value_bytes, WriteDone done);
  // WriteAsync, blocking until answered (*existed if not null).
  Status Write(std::vector<rpc::ChainOp> ops, std::vector<uint64_t> keys, bool* existed,
               bool import = false, bool run_here = false);
  // Runs "start" with a WriteDone and waits for its answer (*existed if not
  // null), at most the write timeout and a second.
  Status Wait(const std::function<void(WriteDone)>& start, bool* existed);
  // Read repair at the head (peerRepair): this or another member's record
  // of integer key "key" failed its checksum. Rewrites the key through the
  // chain with its newest value and sets *result to that value once the
  // chain has acknowledged the rewrite. The newest value is this member's
  // copy; if that is bad too, the newest write of it the chain has not
  // committed; failing that, "fetch" (on the caller's thread) gets another
  // member's copy, which then holds every write of the key (all committed,
  // and none since, or this member's record would be new). Blocks.
  Status Repair(int64_t key, const std::function<Status(rpc::GetResult*)>& fetch,
                rpc::GetResult* result);
  // The same for string keys, by bucket: the keys whose hash mod "slots" is
  // "slot" (this member's storage.string_slots must be "slots":
  // InvalidArgument otherwise). Rewrites the bucket through the chain
  // (ChainOpKind SBUCKET) with this member's copy; if that is bad, with
  // another member's ("fetch": a bucket of puts) and every write to the
  // bucket the chain has not committed on top. *bucket gets what was
  // written (a bucket of puts, engine/string_keys.h). Blocks.
  Status RepairBucket(int64_t slots, int64_t slot, const std::function<Status(std::string*)>& fetch,
                      std::string* bucket);
  // This member's store now holds a range imported from another mark
  // (a ring change's import, before it registers): its position becomes (epoch, 0),
  // intact, made durable with the store (a checkpoint). InvalidArgument if
  // it is in a chain or applied writes already.
  Status AdoptImport(int64_t epoch);
  // A ring change's pre-copy (peerTrack), at the head: from the
  // moment this write is sequenced, every write sequenced here to a key in
  // change.ranges (integer keys by key, string keys by hash with
  // "hash_bound") is recorded; answers (*token) once every write sequenced
  // before is committed, as an empty write. Replaces an earlier record.
  // NotOwner if this member is not the head. The record holds at most
  // track_max_keys keys (string keys also at most 64 MiB of key bytes):
  // past that it overflows (counted and logged) and Tracked() says so.
  Status StartTracking(const partition::RingChange& change, int64_t hash_bound,
                       rpc::TrackToken* token);
  // The recorded keys after "cursor" (empty: from the start), at most
  // "limit": integer keys in order, then string keys. *reason is set (and
  // nothing else) if there is no continuous record for "token": another
  // head's, another process's or another change's token, a head term that
  // changed since (this member stopped heading the chain meanwhile), or an
  // overflow. Read it after peerFence: then nothing is recorded any more.
  void Tracked(const rpc::TrackToken& token, const std::string& cursor, size_t limit,
               std::vector<int64_t>* keys, std::vector<std::string>* skeys, bool* done,
               std::string* next, int64_t* recorded, std::string* reason) const;
  // Forgets the record (the change is past its copy: peerDrop).
  void StopTracking();
  // Tracked()'s cursor resuming after an integer key or a string key.
  static std::string TrackedCursorAfter(int64_t key);
  static std::string TrackedCursorAfter(const std::string& skey);
  // Head of the chain: this member's address; else the head's ("" if none).
  std::string head() const;
  // Before a read of the key with hash "hash" from this member: OK to serve
  // it now (maybe after waiting: for a catch-up, or under storage.sync:
  // always for the head's commit point to cover the key's newest write),
  // else Unavailable. With "held" (a caller that must not wait: an I/O
  // thread) it returns at once, *held = true, where it would wait.
  Status BeforeRead(uint64_t hash, bool* held = nullptr);
  // After the store read that BeforeRead let through: true if what was read
  // may be answered, false to read again from BeforeRead
  // (ChainMember::ConfirmRead: the loop may have applied a newer write of
  // the key that is not committed yet).
  bool ConfirmRead(uint64_t hash);

  // peerChain / peerSnapshot. OnFrame checks the frame and queues it for
  // the loop; with "wait" it returns once the loop has handled it (its
  // writes applied, what it passes on queued), else at once. The
  // predecessor's link sends its next frame on the answer, so answering at
  // once saves a hop through the loop per frame; FramesBacklogged() is the
  // back-pressure: while true the frame should be handled with "wait"
  // (Handler::MayBlock() puts such a call on a worker).
  Status OnFrame(const std::string& from, const rpc::ChainFrame& frame, bool wait = true);
  bool FramesBacklogged() const {
    return frames_pending_.load(std::memory_order_relaxed) >= kMaxPendingFrames;
  }
  Status OnSnapshotPage(const std::string& from, const rpc::SnapshotPage& page, int64_t* token);

  // "single", "head", "middle", "tail", "syncing", "fenced" or "none".
  std::string role() const;
  // The same as a value the shell decides by.
  partition::ChainRole chain_role() const;
  // False while the lease is out: every client call is refused.
  bool lease_held() const;
  partition::ChainPosition applied() const;
  // cluster.chain.* counters for stats() and /metrics.
  void AddStats(std::map<std::string, int64_t>* out) const;
  // Empty unless this member left its chain for a full disk (it rejoins by
  // itself once the disk has room): then what failed, for /health.
  std::string DiskFull() const;

  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

 private:
  class PeerLink;
  class SnapshotSender;
  struct Waiter;
  // One event for the loop: runs under mu_ with the member; "append" ones
  // first apply what earlier events produced.
  struct Event {
    std::function<void(int64_t now, partition::ChainOutput* out)> run;
    // Serial events run after every earlier event's output was processed,
    // and their own output is processed before anything later runs; then
    // "after" runs without mu_ (it may take it) on the loop thread.
    bool serial = false;
    std::function<void(int64_t now, partition::ChainOutput* out)> after;
    Waiter* done = nullptr;  // signalled once the event's output was processed
    uint64_t request = 0;    // a write's request: answered Unavailable if never run
  };

  Replicator(ReplicatorOptions options, engine::Store* store,
             engine::cache::WriteBackCache* cache, ChainCoordinator* coordinator,
             std::unique_ptr<ChainLog> log, partition::ChainPosition durable, bool intact);
  void StartLoop();
  // Queues "event" for the loop; with "run_here" (an event without a waiter,
  // not serial) the caller runs it itself if nothing else runs events and
  // only such events are queued (RunHere).
  void Post(Event event, bool run_here = false);
  void RunHere();
  // A deferred run_here (options_.defer): runs what is queued if nothing
  // else runs events, else leaves it to whoever does.
  void RunQueuedHere();
  bool Heavy(const partition::ChainOutput& out) const;
  void PostRun(std::function<void(int64_t now, partition::ChainOutput* out)> run);
  // A client write: "run" (under mu_, on the loop) hands it to the member
  // as "request"; "done" gets its answer. Serial: see Event.
  using SequenceFn =
      std::function<void(uint64_t request, int64_t now, partition::ChainOutput* out)>;
  void Sequence(bool serial, const char* what, SequenceFn run, WriteDone done,
                bool run_here = false);
  Status WaitFor(const std::function<void(WriteDone)>& start, int64_t timeout_ms, bool* existed);
  // The two rounds both repairs share: "rewrite" runs in a serial event
  // (the store holds every write sequenced before it) and either
  // sequences the rewrite as write "request" or answers "request" itself
  // (an error, or OK and true: this member's copy is bad and no write the
  // chain has not committed covers it). Then "fetch" gets another
  // member's copy on the caller's thread and "rewrite" runs again with
  // "fetched". Corruption if the copy is needed twice.
  using RewriteFn =
      std::function<bool(bool fetched, uint64_t request, int64_t now, partition::ChainOutput* out)>;
  Status RepairRounds(const std::function<Status()>& fetch, const RewriteFn& rewrite);
  int64_t WriteTimeoutMs() const { return 2 * int64_t{options_.session_timeout_ms} + 2000; }
  void Loop();
  void Tick(int64_t now, partition::ChainOutput* out);
  // Carries out "out" (outside mu_), in ChainOutput's order, then signals
  // "done" (the waiters of the events that made it; may be null). Under
  // storage.sync: always the batch is logged and passed down now, and the
  // rest waits in held_ for the syncer (below).
  void Process(partition::ChainOutput* out, std::vector<Waiter*>* done = nullptr);
  // Process's work once the output's writes are logged ("logged": and
  // synced and sent down, by the pipeline) or not yet.
  void Carry(partition::ChainOutput* out, bool logged);
  // Would Carry checkpoint the log now (the store synced, the log restarted)?
  bool CheckpointWanted() const;
  // Applies "entries" in order (consecutive puts as one batch: one group
  // commit); records remove's "existed" for the head's own writes.
  Status ApplyEntries(const std::vector<partition::ChainEntry>& entries);
  void SignalDone(Waiter* w, const Status& status);
  Status Wipe();
  // Makes the store durable (cache flushed, files synced) and restarts the
  // log from the member's position (loop thread).
  void Checkpoint();
  void Send(const std::string& to, const partition::ChainMessage& msg);
  // Sends out's writes passed down the chain before the batch is synced
  // and applied here (Process), and takes them out of out->sends: each
  // one unless a message to the same member waits before it (in out or
  // in held_), so each link keeps its order.
  void SendDownFirst(partition::ChainOutput* out);
  // The pipeline (storage.sync: always). Process logs a batch, passes it
  // down and asks the syncer thread for an fdatasync, then goes on with the
  // next events while it runs: the next batch is logged and passed down
  // meanwhile and shares the next fdatasync. What each output does besides
  // (apply to the store, ack up, answer clients, signal waiters) waits in
  // held_, in order, until the sync that covers its batch is done. So
  // nothing leaves this member that says "applied" before the disk holds
  // it, as without the pipeline; the member's state runs ahead of the
  // store (reads gate on the commit point, which only acks after the
  // apply move). Whatever reads the store as the member's state says it
  // is (serial events, a wipe, a snapshot, a checkpoint, ZooKeeper
  // records) drains the pipeline first.
  struct Held {
    partition::ChainOutput out;
    std::vector<Waiter*> done;
    uint64_t batch = 0;  // the last batch logged before it: released once synced
  };
  // Carries out the held outputs whose batches are synced (any thread
  // running events).
  void ReleaseSynced();
  // Waits for the sync of every logged batch and carries out everything
  // held.
  void Drain();
  void SyncLoop();  // the syncer thread
  void StartSnapshot(const std::string& to, partition::ChainPosition at);
  void Finish(uint64_t request, const Status& status);
  // Answers the writes and reads waiting past their deadline (loop thread).
  void Expire(int64_t now);
  partition::ChainConfig ConfigOf(const partition::Ring& ring) const;
  Status LoadPage(const rpc::SnapshotPage& page);
  // Runs "events" and carries out their output; "here": on a thread other
  // than the loop's, which hands a Heavy() output to the loop instead and
  // returns false (the loop runs events from then on).
  bool RunEvents(std::deque<Event>* events, int64_t now, bool here);
  // A write could not be logged or applied for a full disk: fence the
  // member, answer what "out" would have answered with the error, leave the
  // chain (deregister) and stay up, out of it (loop thread).
  void LeaveForFullDisk(const char* what, const Status& st, partition::ChainOutput* out);
  // Answers the replies and reads of "out" with "why" and drops the rest.
  void DropOutput(partition::ChainOutput* out, const Status& why);
  // Once a second while out for a full disk: if the file system has
  // RejoinFreeBytes() free, rebuilds the member from the chain log (as a
  // restart does) and lets it join again; true then (loop thread).
  bool RejoinAfterFullDisk(int64_t now, partition::ChainOutput* out);
  // min(64 MiB, a tenth of the file system).
  uint64_t RejoinFreeBytes() const;
  static constexpr uint64_t kRejoinFreeBytes = 64ull << 20;

  const ReplicatorOptions options_;
  engine::Store* const store_;
  engine::cache::WriteBackCache* const cache_;
  ChainCoordinator* const coordinator_;

  // A request waiting for its answer: a client write, or a read held back
  // by a catch-up.
  struct Pending {
    WriteDone done;
    int64_t deadline = 0;  // ms (NowMs()); then answered UNAVAILABLE
    const char* what = "";
  };

  mutable std::mutex mu_;  // the member, pending_, next_request_
  std::unique_ptr<partition::ChainMember> member_;  // replaced by RejoinAfterFullDisk
  // By request number, so in the order they started (and their deadlines).
  std::map<uint64_t, Pending> pending_;
  uint64_t next_request_ = 1;
  // Head: the seq each unanswered write got, and whether its first key
  // existed here when it was applied (for remove's answer).
  std::map<uint64_t, uint64_t> seq_of_request_;
  std::map<uint64_t, bool> existed_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Event> queue_;
  bool stopping_ = false;  // GUARDED_BY(queue_mu_), and the fields below
  // One thread at a time runs events and carries out their output: the
  // loop, or a thread that posted an event it may run (Post's run_here).
  // The fields marked "loop thread only" below belong to that thread.
  bool running_ = false;
  bool handoff_ = false;     // running_ passes to the loop (a Heavy() output)
  bool loop_wants_ = false;  // the loop waits for running_ (a tick is due)
  int queued_for_loop_ = 0;  // queued events only the loop may run
  std::thread loop_;

  // Loop thread only (the thread running events: running_).
  std::map<std::string, std::unique_ptr<PeerLink>> links_;
  std::map<std::string, std::unique_ptr<SnapshotSender>> senders_;
  std::shared_ptr<const partition::Ring> ring_;
  int64_t lease_sent_ms_ = 0;  // the last SessionLease::sent_ms given to the member
  bool leased_ = true;         // the member held its lease at the last tick (for the log)
  bool joined_ = false;  // Join() called
  std::unique_ptr<ChainLog> log_;
  bool logged_intact_ = false;   // what the log's state record says
  bool intact_ = false;
  bool checkpoint_due_ = false;  // a snapshot was loaded: make it durable

  // The pre-copy's record (StartTracking), GUARDED_BY(mu_): written on the
  // loop thread as writes are sequenced (Track), read by peerDelta.
  struct Tracker {
    bool on = false;
    int64_t czxid = 0;
    int64_t epoch = 0;  // the head term it started in
    partition::RingChange change;
    int64_t hash_bound = 0;
    std::set<int64_t> keys;
    std::set<std::string> skeys;
    uint64_t skey_bytes = 0;
    std::string overflow;  // why the record is incomplete; empty if it is not
  };
  Tracker tracker_;
  static int64_t DrawNonce();
  const int64_t nonce_ = DrawNonce();  // names this process in a TrackToken
  // Records the keys of a write being sequenced (mu_ held) if tracking.
  void Track(const std::vector<uint64_t>& hashes, const std::string& op);

  // Counters.
  std::atomic<int64_t> tracked_writes_{0};
  std::atomic<int64_t> track_overflows_{0};
  std::atomic<int64_t> applied_entries_{0};
  std::atomic<int64_t> apply_batches_{0};
  std::atomic<int64_t> frames_sent_{0};
  std::atomic<int64_t> frames_failed_{0};
  std::atomic<int64_t> frames_received_{0};
  // Frames queued by OnFrame that the loop has not run yet.
  static constexpr int kMaxPendingFrames = 4;
  std::atomic<int> frames_pending_{0};
  std::atomic<int64_t> snapshots_sent_{0};
  std::atomic<int64_t> snapshot_bytes_sent_{0};
  std::atomic<int64_t> snapshot_bytes_loaded_{0};
  std::atomic<int64_t> wipes_{0};
  std::atomic<int64_t> records_{0};
  std::atomic<int64_t> evictions_{0};  // members removed: their host refused connections
  std::atomic<int64_t> checkpoints_{0};
  std::atomic<int64_t> repairs_{0};
  std::atomic<int64_t> reads_held_{0};  // reads that waited (BeforeRead)
  std::atomic<int64_t> reads_again_{0};  // reads not confirmed (ConfirmRead), read again
  // A snapshot stream's progress, for stats() and `flatkv ring`: the one
  // this member loads (joiner) and the last one it sent (tail).
  struct Progress {
    std::string peer;  // the other end; "" before the first stream
    uint64_t bytes = 0;
    uint64_t total = 0;  // the sender's estimate
    int64_t start_ms = 0;
    int64_t end_ms = 0;  // 0 while it runs
    void Report(const std::string& prefix, std::map<std::string, int64_t>* out) const;
  };
  mutable std::mutex progress_mu_;
  Progress loading_;  // GUARDED_BY(progress_mu_)
  Progress sending_;  // GUARDED_BY(progress_mu_)
  std::atomic<uint64_t> log_bytes_{0};
  // Out of the chain for a full disk (LeaveForFullDisk), and why.
  std::atomic<bool> disk_full_{false};
  std::atomic<int64_t> disk_full_leaves_{0};
  mutable std::mutex disk_mu_;
  std::string disk_full_reason_;  // GUARDED_BY(disk_mu_)
  int64_t last_space_check_ = 0;  // loop thread only
  // The batch whose apply failed for a full disk (it is in the log), applied
  // again at rejoin; loop thread only.
  std::vector<partition::ChainEntry> unapplied_;

  // The pipeline (SendDownFirst's comment), storage.sync: always only.
  const bool pipelined_ = options_.sync_always;
  std::deque<Held> held_;      // loop thread only (the thread running events)
  uint64_t logged_batch_ = 0;  // loop thread only: batches logged so far
  std::mutex sync_mu_;         // the syncer's fields below, and log_'s replacement
  std::condition_variable sync_cv_;
  uint64_t sync_want_ = 0;     // GUARDED_BY(sync_mu_): sync through this batch
  uint64_t sync_done_ = 0;     // GUARDED_BY(sync_mu_): synced through this batch
  Status sync_error_;          // GUARDED_BY(sync_mu_): the syncer stopped on it
  bool sync_stop_ = false;     // GUARDED_BY(sync_mu_)
  std::thread syncer_;
  std::atomic<int64_t> pipeline_syncs_{0};
};

// Encodes / decodes ChainEntry::op (a serialized rpc::ChainOps). Decoding
// untrusted bytes: InvalidArgument for anything malformed.
std::string EncodeChainOps(const std::vector<rpc::ChainOp>& ops);
Status DecodeChainOps(const std::string& bytes, std::vector<rpc::ChainOp>* ops);
// A string-key bucket of puts (engine/string_keys.h) and back (SBUCKET, peerBucket).
std::string EncodeBucket(const std::vector<engine::StringKeyValue>& live);
std::vector<engine::StringKeyValue> DecodeBucket(std::string_view bucket);
// A peerChain frame as the chain state machine takes it: InvalidArgument
// for an unknown message kind (any i32 arrives from the wire).
Status DecodeChainFrame(const rpc::ChainFrame& frame, partition::ChainMessage* msg);
// Applies replicated writes to the store through the cache, in order
// (DecodeChainOps checks each; a bad one is skipped and its error
// returned). Adds (seq, whether the key existed) for each entry whose first
// op is a remove. Replicator::ApplyEntries, and tests/fuzz/chain_fuzz.
Status ApplyChainEntries(engine::cache::WriteBackCache* cache,
                         const std::vector<partition::ChainEntry>& entries,
                         std::vector<std::pair<uint64_t, bool>>* existed);

}  // namespace flatkv::server
