// Implementation notes
//
// Locks: mu_ guards the member and the waiters; queue_mu_ the event queue.
// The loop never holds mu_ while it touches the store, a socket or
// ZooKeeper, so reads at the tail (BeforeRead) wait only for the member's
// own bookkeeping. Client writes and held-back reads are pending_ entries
// whose WriteDone the loop calls outside mu_ (a blocking caller waits on a
// latch of its own: Wait()); peer events wait on a Waiter with mu_.
#include "server/replicator.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include <spdlog/spdlog.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "client/client.h"
#include "engine/crc32c.h"
#include "engine/string_keys.h"
#include "server/thrift_limits.h"

namespace flatkv::server {
namespace {

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;
using partition::ChainEntry;
using partition::ChainMessage;
using partition::ChainOutput;
using partition::ChainPosition;

// The member's clock: the lease's (it never jumps and counts pauses).
int64_t NowMs() { return partition::BootTimeMs(); }

// The chain log is checkpointed (a new log, the store synced) past this.
constexpr uint64_t kLogCheckpointBytes = 64ull << 20;

// A write that reached neither the log nor the store cannot be taken back
// from the member's history: stop, as etcd does when its WAL fails, rather
// than acknowledge or pass on what this member may not hold. A restart
// replays the log and catches up from the chain.
[[noreturn]] void Fatal(const char* what, const Status& st) {
  spdlog::critical("chain: {}: {}; stopping this member (restart it: it replays its log and "
                   "catches up)",
                   what, st.ToString());
  spdlog::shutdown();
  std::_Exit(3);
}

rpc::ChainFrame ToFrame(const ChainMessage& m) {
  rpc::ChainFrame f;
  f.kind = static_cast<rpc::ChainKind::type>(m.kind);
  f.chain = static_cast<int64_t>(m.chain);
  f.entries.reserve(m.entries.size());
  for (const ChainEntry& e : m.entries) {
    rpc::ChainEntry w;
    w.seq = static_cast<int64_t>(e.seq);
    w.epoch = e.epoch;
    w.keys.assign(e.keys.begin(), e.keys.end());
    w.ops = e.op;
    f.entries.push_back(std::move(w));
  }
  f.applied = static_cast<int64_t>(m.applied);
  f.committed = static_cast<int64_t>(m.committed);
  f.floor = static_cast<int64_t>(m.floor);
  f.positionEpoch = m.position.epoch;
  f.positionSeq = static_cast<int64_t>(m.position.seq);
  if (m.direct) f.__set_direct(true);
  return f;
}

}  // namespace

Status DecodeChainFrame(const rpc::ChainFrame& f, ChainMessage* m) {
  const int64_t kind = RawEnum(f.kind);
  if (kind < rpc::ChainKind::REPLICATE || kind > rpc::ChainKind::COMMIT) {
    return Status::InvalidArgument("peerChain: unknown message kind " + std::to_string(kind));
  }
  m->kind = static_cast<ChainMessage::Kind>(kind);
  m->chain = static_cast<uint64_t>(f.chain);
  m->entries.reserve(f.entries.size());
  for (const rpc::ChainEntry& w : f.entries) {
    ChainEntry e;
    e.seq = static_cast<uint64_t>(w.seq);
    e.epoch = w.epoch;
    e.keys.assign(w.keys.begin(), w.keys.end());
    e.op = w.ops;
    m->entries.push_back(std::move(e));
  }
  m->applied = static_cast<uint64_t>(f.applied);
  m->committed = static_cast<uint64_t>(f.committed);
  m->floor = static_cast<uint64_t>(f.floor);
  m->position = {f.positionEpoch, static_cast<uint64_t>(f.positionSeq)};
  m->direct = f.direct;
  return Status::OK();
}

namespace {

// A connection to the member at "address" ("host:port") and the context
// its peer calls carry.
client::ClientOptions PeerOptions(const std::string& address, int timeout_ms,
                                  const ReplicatorOptions& options) {
  client::ClientOptions o;
  std::string host;
  int port = 0;
  (void)partition::ParseHostPort(address, "member", &host, &port);
  o.host = host;
  o.port = port;
  o.connect_timeout_ms = options.peer_timeout_ms;
  o.timeout_ms = timeout_ms;
  o.tls_ca_file = options.tls_ca_file;
  o.tls_cert_file = options.tls_cert_file;
  o.tls_key_file = options.tls_key_file;
  return o;
}

rpc::PeerContext PeerContextOf(const ReplicatorOptions& options) {
  rpc::PeerContext ctx;
  ctx.token = options.peer_token;
  ctx.mark = options.mark;
  return ctx;
}

}  // namespace

Status ForEachPage(const engine::Store& store, size_t page,
                   const std::function<bool(std::vector<engine::KeyValue>*)>& ints,
                   const std::function<bool(std::vector<engine::StringKeyValue>*)>& strings) {
  const int64_t lo = store.options().key_min;
  const int64_t hi = store.options().key_max - 1;
  int64_t from = lo;
  bool done = false;
  while (!done) {
    std::vector<engine::KeyValue> out;
    int64_t next = 0;
    std::vector<int64_t> bad;  // a copy or a digest without them would be wrong
    FLATKV_RETURN_IF_ERROR(store.Scan(from, false, page, lo, hi, &out, &next, &done, &bad));
    if (!bad.empty()) {
      return Status::Corruption("key " + std::to_string(bad.front()) +
                                " fails its checksum (flatkv admin verify repairs it from the "
                                "chain)");
    }
    if (!ints(&out)) return Status::OK();
    from = next;
  }
  std::string cursor;
  done = false;
  while (!done) {
    std::vector<engine::StringKeyValue> out;
    std::string next;
    std::vector<int64_t> bad;
    FLATKV_RETURN_IF_ERROR(store.SScan(cursor, page, &out, &next, &done, &bad));
    if (!bad.empty()) {
      return Status::Corruption("string-key bucket " + std::to_string(bad.front()) +
                                " fails its checksum or lost entries to one (flatkv admin verify "
                                "repairs it from the chain)");
    }
    if (!strings(&out)) return Status::OK();
    cursor = std::move(next);
  }
  return Status::OK();
}

std::string EncodeChainOps(const std::vector<rpc::ChainOp>& ops) {
  auto buffer = std::make_shared<TMemoryBuffer>();
  TBinaryProtocol protocol(buffer);
  rpc::ChainOps wrapper;
  wrapper.ops = ops;
  wrapper.write(&protocol);
  return buffer->getBufferAsString();
}

Status DecodeChainOps(const std::string& bytes, std::vector<rpc::ChainOp>* ops) {
  try {
    auto buffer = std::make_shared<TMemoryBuffer>(
        reinterpret_cast<uint8_t*>(const_cast<char*>(bytes.data())),
        static_cast<uint32_t>(bytes.size()), TMemoryBuffer::OBSERVE);
    TBinaryProtocol protocol(buffer, static_cast<int32_t>(bytes.size()),
                             static_cast<int32_t>(bytes.size()), true, true);
    rpc::ChainOps wrapper;
    wrapper.read(&protocol);
    *ops = std::move(wrapper.ops);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("malformed replicated write: ") + e.what());
  }
  for (const rpc::ChainOp& op : *ops) {
    const int64_t kind = RawEnum(op.kind);
    if (kind < rpc::ChainOpKind::PUT || kind > rpc::ChainOpKind::SBUCKET) {
      return Status::InvalidArgument("malformed replicated write: unknown op kind " +
                                     std::to_string(kind));
    }
    const bool int_key = kind == rpc::ChainOpKind::PUT || kind == rpc::ChainOpKind::REMOVE ||
                         kind == rpc::ChainOpKind::SBUCKET;
    const bool has_value = kind == rpc::ChainOpKind::PUT || kind == rpc::ChainOpKind::SPUT ||
                           kind == rpc::ChainOpKind::SBUCKET;
    if ((int_key ? !op.__isset.key : !op.__isset.skey) || (has_value && !op.__isset.value) ||
        (kind == rpc::ChainOpKind::SBUCKET && !op.__isset.slots)) {
      return Status::InvalidArgument("malformed replicated write: op of kind " +
                                     std::to_string(kind) + " lacks its key or value");
    }
  }
  return Status::OK();
}

struct Replicator::Waiter {
  std::condition_variable cv;
  bool done = false;
  Status status;
  bool existed = false;
};

// Sends the frames queued for one neighbour, in order, on one connection.
class Replicator::PeerLink {
 public:
  // "refused" runs (on the sending thread, no lock held) after each
  // connection attempt the neighbour's host refused.
  PeerLink(const std::string& address, const ReplicatorOptions& options,
           std::atomic<int64_t>* sent, std::atomic<int64_t>* failed,
           std::function<void()> refused)
      : address_(address),
        options_(options),
        ctx_(PeerContextOf(options)),
        conn_(PeerOptions(address, options.peer_timeout_ms, options)),
        sent_(sent),
        failed_(failed),
        refused_(std::move(refused)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~PeerLink() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  // Sends "frame" after every frame pushed before it. peerChain is a
  // oneway call: nothing answers a frame (the neighbour's acks are frames
  // of their own), so a frame costs one write here and one read there. On
  // the caller's thread (the one running the member's events) while the
  // connection is up, nothing waits in the queue, the frame is small
  // (kDirectBytes) and the socket holds less than kDirectBytes not yet
  // taken by the neighbour: it then fits the socket buffers, so the send
  // cannot block on a slow or stopped peer. Otherwise the link's thread
  // sends it, merged with what queued meanwhile. So a frame on an idle
  // hop costs no thread wake-up here, and a busy hop carries batches.
  void Push(rpc::ChainFrame frame) {
    const size_t bytes = FrameBytes(frame);
    std::unique_lock<std::mutex> lk(mu_);
    if (stop_ || sending_ || !healthy_ || !queue_.empty() || bytes > kDirectBytes) {
      queue_.push_back(std::move(frame));
      lk.unlock();
      cv_.notify_one();
      return;
    }
    sending_ = true;  // conn_ is this thread's until sending_ is cleared
    lk.unlock();
    if (Unsent() > kDirectBytes) {
      // The neighbour is not keeping up: the link's thread sends (and may
      // block); what comes meanwhile joins this frame (Coalesce).
      lk.lock();
      queue_.push_back(std::move(frame));
      sending_ = false;
      lk.unlock();
      cv_.notify_one();
      return;
    }
    Status st = conn_.Call("peerChain", false, [&](rpc::FlatKVClient& c) {
      c.peerChain(ctx_, options_.self, frame);
    });
    lk.lock();
    if (st.ok()) {
      sent_->fetch_add(1, std::memory_order_relaxed);
    } else {
      Failed(st);
    }
    const bool refused = !st.ok() && conn_.refused();
    sending_ = false;
    const bool wake = !queue_.empty() || !healthy_;
    lk.unlock();
    if (wake) cv_.notify_one();
    if (refused) refused_();
  }

 private:
  // The largest frame Push() sends itself: far below an idle loopback or
  // LAN connection's buffers.
  static constexpr size_t kDirectBytes = 48 << 10;
  static size_t FrameBytes(const rpc::ChainFrame& frame) {
    size_t n = 64;
    for (const rpc::ChainEntry& e : frame.entries) n += e.ops.size() + 8 * e.keys.size() + 32;
    return n;
  }

  // Bytes written to the connection that the neighbour has not taken yet
  // (SIOCOUTQ); 0 without a connection. The caller has set sending_.
  size_t Unsent() const {
    const int fd = conn_.socket_fd();
    int n = 0;
    if (fd < 0 || ioctl(fd, SIOCOUTQ, &n) != 0 || n < 0) return 0;
    return static_cast<size_t>(n);
  }

  // mu_ held.
  void Failed(const Status& st) {
    failed_->fetch_add(1, std::memory_order_relaxed);
    if (conn_.network_failed()) {
      healthy_ = false;
      backoff_ = true;
      spdlog::debug("chain: {} did not take a message: {}", address_, st.ToString());
    }
  }

  void Run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || (!sending_ && !queue_.empty()); });
      if (stop_) return;
      sending_ = true;
      std::deque<rpc::ChainFrame> queued;
      queued.swap(queue_);
      const bool backoff = backoff_;
      backoff_ = false;
      lk.unlock();
      if (backoff) {
        // Back off a little before the next connect attempt; what queues
        // meanwhile is sent together after it.
        std::unique_lock<std::mutex> wait(mu_);
        cv_.wait_for(wait, std::chrono::milliseconds(50), [&] { return stop_; });
      }
      std::vector<rpc::ChainFrame> batch = Coalesce(&queued);
      bool broken = false;
      bool ok = true;
      bool refused = false;
      for (rpc::ChainFrame& frame : batch) {
        if (broken) {
          failed_->fetch_add(1, std::memory_order_relaxed);
          continue;  // the member resends what was not acknowledged
        }
        Status st = conn_.Call("peerChain", false, [&](rpc::FlatKVClient& c) {
          c.peerChain(ctx_, options_.self, frame);
        });
        std::lock_guard<std::mutex> lock(mu_);
        if (st.ok()) {
          sent_->fetch_add(1, std::memory_order_relaxed);
        } else {
          Failed(st);
          broken = conn_.network_failed();
          refused = refused || conn_.refused();
          ok = false;
        }
      }
      if (refused) refused_();
      lk.lock();
      if (ok && !batch.empty()) healthy_ = true;
      sending_ = false;
    }
  }

  // Frames that queued while the last one was in flight, merged: acks are
  // cumulative (the last one says all), and consecutive replicate frames
  // of one chain whose entries follow each other become one (the newest
  // commit point wins). So a slow hop costs a round trip per batch, not
  // per write.
  static std::vector<rpc::ChainFrame> Coalesce(std::deque<rpc::ChainFrame>* queued) {
    constexpr size_t kMaxEntries = 4096;
    std::vector<rpc::ChainFrame> out;
    for (rpc::ChainFrame& f : *queued) {
      if (!out.empty() && out.back().kind == f.kind && out.back().chain == f.chain) {
        rpc::ChainFrame& last = out.back();
        if (f.kind == rpc::ChainKind::ACK) {
          last = std::move(f);
          continue;
        }
        if (f.kind == rpc::ChainKind::REPLICATE &&
            last.entries.size() + f.entries.size() <= kMaxEntries &&
            (last.entries.empty() || f.entries.empty() ||
             f.entries.front().seq == last.entries.back().seq + 1)) {
          for (rpc::ChainEntry& e : f.entries) last.entries.push_back(std::move(e));
          last.applied = f.applied;
          last.committed = f.committed;
          last.floor = f.floor;
          continue;
        }
      }
      out.push_back(std::move(f));
    }
    return out;
  }

  const std::string address_;
  const ReplicatorOptions options_;
  const rpc::PeerContext ctx_;
  // Used by the thread that set sending_, only.
  client::Client conn_;
  std::atomic<int64_t>* const sent_;
  std::atomic<int64_t>* const failed_;
  const std::function<void()> refused_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rpc::ChainFrame> queue_;  // GUARDED_BY(mu_), and the fields below
  bool sending_ = false;    // a thread uses conn_
  bool healthy_ = false;    // the last send on conn_ went out
  bool backoff_ = false;    // the connection failed: wait before the next try
  bool stop_ = false;
  std::thread thread_;
};

// Streams this member's store to a joiner as peerSnapshot pages.
class Replicator::SnapshotSender {
 public:
  SnapshotSender(Replicator* owner, const std::string& to, ChainPosition at)
      : owner_(owner), to_(to), at_(at), started_ms_(NowMs()) {
    thread_ = std::thread([this] { Run(); });
  }
  ~SnapshotSender() {
    stop_.store(true);
    thread_.join();
  }
  bool done() const { return done_.load(); }
  // Still streaming: not sent whole, not failed.
  bool running() const { return !ended_.load(); }
  ChainPosition at() const { return at_; }
  int64_t started_ms() const { return started_ms_; }

 private:
  void Run() {
    struct End {
      std::atomic<bool>* ended;
      ~End() { ended->store(true); }
    } ended{&ended_};
    const ReplicatorOptions& opt = owner_->options_;
    client::Client conn(PeerOptions(to_, std::max(opt.peer_timeout_ms, 10000), opt));
    const rpc::PeerContext ctx = PeerContextOf(opt);
    const auto start = std::chrono::steady_clock::now();
    const uint64_t total = owner_->store_->LiveBytesEstimate();
    uint64_t bytes = 0;
    int64_t token = 0;
    bool first = true;
    auto send = [&](rpc::SnapshotPage* page) -> bool {
      page->token = token;
      page->first = first;
      page->atEpoch = at_.epoch;
      page->atSeq = static_cast<int64_t>(at_.seq);
      page->__set_totalBytes(static_cast<int64_t>(total));
      int64_t answer = 0;
      Status st = conn.Call("peerSnapshot", false, [&](rpc::FlatKVClient& c) {
        answer = c.peerSnapshot(ctx, opt.self, *page);
      });
      if (!st.ok()) {
        spdlog::warn("chain: snapshot to {} stopped: {}", to_, st.ToString());
        return false;
      }
      token = answer;
      first = false;
      owner_->snapshot_bytes_sent_.store(static_cast<int64_t>(bytes), std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(owner_->progress_mu_);
        owner_->sending_.bytes = bytes;
        if (page->last) owner_->sending_.end_ms = NowMs();
      }
      // Throttle: cluster.resync_mb_per_sec.
      if (opt.resync_bytes_per_sec > 0) {
        const double due =
            static_cast<double>(bytes) / static_cast<double>(opt.resync_bytes_per_sec);
        const double spent =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (due > spent) std::this_thread::sleep_for(std::chrono::duration<double>(due - spent));
      }
      return !stop_.load();
    };
    {
      std::lock_guard<std::mutex> lock(owner_->progress_mu_);
      owner_->sending_ = {to_, 0, total, NowMs(), 0};
    }
    spdlog::info("chain: streaming a snapshot of about {} MB to {} (resumes after epoch {} seq {})",
                 static_cast<double>(total) / 1e6, to_, at_.epoch, at_.seq);
    // Writes still in an async cache must be in the store it scans.
    (void)owner_->cache_->Flush();
    // The store is read a page ahead, on a second thread, while the joiner
    // loads the page before it: reading and loading overlap rather than
    // take turns (at most kAhead pages wait in memory).
    constexpr size_t kPage = 2048;
    constexpr uint64_t kPageBytes = 1u << 20;
    constexpr size_t kAhead = 2;
    struct Ready {
      rpc::SnapshotPage page;
      uint64_t bytes = 0;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Ready> ready;
    bool read_all = false;  // the reader pushed the last page (or failed)
    bool quit = false;      // the sender stopped: the reader stops too
    Status read_status;
    std::thread reader([&] {
      Ready next;
      // Hands a full page (or the last one) over; false ends the walk.
      auto push = [&](bool last) {
        if (!last && next.bytes < kPageBytes &&
            next.page.pairs.size() + next.page.spairs.size() < kPage) {
          return !stop_.load();
        }
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return quit || ready.size() < kAhead; });
        if (quit) return false;
        ready.push_back(std::move(next));
        next = Ready();
        cv.notify_all();
        return !stop_.load();
      };
      Status st = ForEachPage(
          *owner_->store_, kPage,
          [&](std::vector<engine::KeyValue>* out) {
            for (engine::KeyValue& kv : *out) {
              rpc::KvPair p;
              p.key = kv.key;
              next.bytes += kv.value.size() + 8;
              p.value = std::move(kv.value);
              next.page.pairs.push_back(std::move(p));
            }
            return push(false);
          },
          [&](std::vector<engine::StringKeyValue>* out) {
            for (engine::StringKeyValue& kv : *out) {
              rpc::StringKvPair p;
              next.bytes += kv.key.size() + kv.value.size();
              p.key = std::move(kv.key);
              p.value = std::move(kv.value);
              next.page.spairs.push_back(std::move(p));
            }
            return push(false);
          });
      bool finished = st.ok() && !stop_.load();
      if (finished) {
        std::lock_guard<std::mutex> lk(mu);
        finished = !quit;
      }
      if (finished) {
        next.page.last = true;
        // Read after the whole store: every write the copy holds was
        // applied by the member first (the loop applies to the store after).
        std::lock_guard<std::mutex> lock(owner_->mu_);
        const partition::ChainPosition end = owner_->member_->applied();
        next.page.__set_endEpoch(end.epoch);
        next.page.__set_endSeq(static_cast<int64_t>(end.seq));
      }
      if (finished) (void)push(true);
      std::lock_guard<std::mutex> lk(mu);
      read_status = st;
      read_all = true;
      cv.notify_all();
    });
    bool sent_last = false;
    for (;;) {
      Ready r;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return !ready.empty() || read_all; });
        if (ready.empty()) break;  // the reader is done and nothing waits
        r = std::move(ready.front());
        ready.pop_front();
        cv.notify_all();
      }
      bytes += r.bytes;
      if (stop_.load() || !send(&r.page)) break;
      if (r.page.last) {
        sent_last = true;
        break;
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      quit = true;
      cv.notify_all();
    }
    reader.join();
    if (!read_status.ok()) {
      spdlog::warn("chain: snapshot to {}: reading the store: {}", to_, read_status.ToString());
      return;
    }
    if (!sent_last) return;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    owner_->snapshots_sent_.fetch_add(1, std::memory_order_relaxed);
    spdlog::info("chain: snapshot to {} sent: {} MB in {:.2f} s ({:.1f} MB/s)", to_,
                 static_cast<double>(bytes) / 1e6, secs,
                 secs > 0 ? static_cast<double>(bytes) / 1e6 / secs : 0.0);
    done_.store(true);
  }

  Replicator* const owner_;
  const std::string to_;
  const ChainPosition at_;
  const int64_t started_ms_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};   // sent whole
  std::atomic<bool> ended_{false};  // sent whole, or stopped
  std::thread thread_;
};

Status Replicator::Start(ReplicatorOptions options, engine::Store* store,
                         engine::cache::WriteBackCache* cache, ChainCoordinator* coordinator,
                         std::unique_ptr<Replicator>* result) {
  const std::string path = options.data_dir + "/CHAINLOG";
  ChainLog::State state;
  std::vector<ChainEntry> entries;
  std::unique_ptr<ChainLog> log;
  FLATKV_RETURN_IF_ERROR(ChainLog::Open(path, &state, &entries, &log));
  // Writes logged but perhaps not in the store when the process stopped:
  // replayed before the loop runs.
  const ChainPosition position =
      entries.empty() ? state.position : ChainPosition{entries.back().epoch, entries.back().seq};
  std::unique_ptr<Replicator> r(new Replicator(std::move(options), store, cache, coordinator,
                                               std::move(log), position, state.intact));
  if (!entries.empty()) {
    Status st = r->ApplyEntries(entries);
    if (!st.ok()) return Status::IOError("replaying " + path + ": " + st.ToString());
    spdlog::info("chain: replayed {} logged writes", entries.size());
    r->existed_.clear();
  }
  r->StartLoop();
  *result = std::move(r);
  spdlog::info("chain: position epoch {} seq {}, store {}", position.epoch, position.seq,
               state.intact ? "intact" : "not known intact (new, or wiped for a snapshot)");
  return Status::OK();
}

Replicator::Replicator(ReplicatorOptions options, engine::Store* store,
                       engine::cache::WriteBackCache* cache, ChainCoordinator* coordinator,
                       std::unique_ptr<ChainLog> log, ChainPosition durable, bool intact)
    : options_(std::move(options)),
      store_(store),
      cache_(cache),
      coordinator_(coordinator),
      member_(std::make_unique<partition::ChainMember>(options_.self, options_.chain,
                                                       durable, intact)),
      log_(std::move(log)),
      logged_intact_(intact),
      intact_(intact) {}

void Replicator::StartLoop() {
  if (pipelined_) syncer_ = std::thread([this] { SyncLoop(); });
  loop_ = std::thread([this] { Loop(); });
}

Replicator::~Replicator() { Stop(); }

void Replicator::Stop() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (loop_.joinable()) loop_.join();  // drains the pipeline
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    sync_stop_ = true;
  }
  sync_cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
  // Events the loop did not take: their callers are still waiting.
  std::deque<Event> left;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    left.swap(queue_);
  }
  for (Event& ev : left) {
    if (ev.done != nullptr) SignalDone(ev.done, Status::Unavailable("the server is stopping"));
  }
  senders_.clear();
  links_.clear();
  std::map<uint64_t, Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  for (auto& [request, p] : pending) p.done(Status::Unavailable("the server is stopping"), false);
}

void Replicator::Post(Event event, bool run_here) {
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (!stopping_) {
      run_here = run_here && event.done == nullptr && !event.serial;
      if (!run_here) ++queued_for_loop_;
      queue_.push_back(std::move(event));
      if (run_here && options_.defer) {
        // At the end of the caller's round, once for all of it.
        thread_local bool scheduled = false;
        lock.unlock();
        if (scheduled) return;
        scheduled = options_.defer([this] {
          scheduled = false;
          RunQueuedHere();
        });
        if (scheduled) return;
        lock.lock();  // not an I/O thread after all: run it now
      }
      if (run_here && !running_ && !loop_wants_ && queued_for_loop_ == 0) {
        running_ = true;
        lock.unlock();
        RunHere();
        return;
      }
      // Else the loop runs it, or the thread running events now does.
      if (!running_) queue_cv_.notify_one();
      return;
    }
  }
  // Stopped: nothing will run it. Whoever waits for it is told so.
  if (event.done != nullptr) SignalDone(event.done, Status::Unavailable("the server is stopping"));
  if (event.request != 0) Finish(event.request, Status::Unavailable("the server is stopping"));
}

void Replicator::RunQueuedHere() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (running_ || stopping_ || queue_.empty()) return;  // whoever runs takes it
    if (loop_wants_ || queued_for_loop_ > 0) {
      queue_cv_.notify_one();
      return;
    }
    running_ = true;
  }
  RunHere();
}

// The caller's thread runs what is queued, as the loop would, while only
// events it may run are queued, for a few rounds; then it hands the rest
// to the loop. An output that needs more than the store and the sockets
// (Heavy()) is handed to the loop as it stands.
void Replicator::RunHere() {
  constexpr int kRounds = 4;
  for (int round = 0;; ++round) {
    std::deque<Event> events;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (queue_.empty() || round == kRounds || loop_wants_ || queued_for_loop_ > 0 ||
          stopping_) {
        running_ = false;
        if (!queue_.empty() || loop_wants_ || stopping_) queue_cv_.notify_one();
        return;
      }
      events.swap(queue_);
    }
    if (!RunEvents(&events, NowMs(), /*here=*/true)) return;  // the loop took over
  }
}

// What only the loop thread does: it may wait on ZooKeeper (a record, a
// deregistration, a registration), on a whole store (a wipe, a checkpoint)
// or on the disk (the pipeline's Drain), or start a snapshot stream. A
// batch of writes is not heavy: under storage.sync: always it is logged and
// sent, and its fdatasync is the syncer's.
bool Replicator::Heavy(const ChainOutput& out) const {
  return out.wipe || !out.record.empty() || !out.snapshots.empty() || out.deregister ||
         out.register_now || disk_full_.load() || CheckpointWanted();
}

void Replicator::PostRun(std::function<void(int64_t now, ChainOutput* out)> run) {
  Event ev;
  ev.run = std::move(run);
  Post(std::move(ev));
}

void Replicator::Join() {
  PostRun([this](int64_t now, ChainOutput* out) {
    joined_ = true;
    member_->StartJoin(now, out);
  });
}

void Replicator::OnRing(std::shared_ptr<const partition::Ring> ring) {
  PostRun([this, ring](int64_t now, ChainOutput* out) {
    ring_ = ring;
    member_->OnConfig(ConfigOf(*ring), now, out);
  });
}

void Replicator::OnRegistered(int64_t czxid, uint64_t session) {
  PostRun([this, czxid, session](int64_t now, ChainOutput* out) {
    if (!member_->wants_registration()) {
      // Registered too late (the tail changed meanwhile): withdraw it.
      out->deregister = true;
      return;
    }
    member_->OnRegistered(czxid, session, now);
    intact_ = true;
    if (ring_) member_->OnConfig(ConfigOf(*ring_), now, out);
  });
}

partition::ChainConfig Replicator::ConfigOf(const partition::Ring& ring) const {
  partition::ChainConfig c;
  c.version = ring.version();
  c.sync = options_.sync;
  const partition::RingChange* change = ring.change();
  if (change != nullptr && change->kind == "add" && change->mark == options_.mark) {
    c.importer = change->importer;
  }
  const partition::Partition* p = ring.Find(options_.mark);
  if (p == nullptr) return c;
  uint64_t id = 0xcbf29ce484222325ull;  // FNV-1a over members and czxids
  auto mix = [&id](const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) id = (id ^ b[i]) * 0x100000001b3ull;
  };
  for (const partition::Member& m : p->chain) {
    const std::string a = m.address();
    c.members.push_back(a);
    c.epochs.push_back(m.czxid);
    mix(a.data(), a.size());
    mix(&m.czxid, sizeof(m.czxid));
  }
  c.id = id;
  c.recorded = p->recorded;
  c.recorded_version = p->recorded_ring_version;
  c.recorded_zxid = p->recorded_zxid;
  return c;
}

void Replicator::Sequence(bool serial, const char* what, SequenceFn run, WriteDone done,
                          bool run_here) {
  uint64_t request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request = next_request_++;
    pending_[request] = {std::move(done), NowMs() + WriteTimeoutMs(), what};
  }
  Event ev;
  ev.request = request;
  ev.serial = serial;
  ev.run = [this, request, run = std::move(run)](int64_t now, ChainOutput* out) {
    const size_t before = out->apply.size();
    run(request, now, out);
    if (out->apply.size() > before) seq_of_request_[request] = out->apply.back().seq;
  };
  Post(std::move(ev), run_here);
}

// A latch for one answer, shared with the callback: a caller that stopped
// waiting leaves it to the callback.
Status Replicator::Wait(const std::function<void(WriteDone)>& start, bool* existed) {
  return WaitFor(start, WriteTimeoutMs(), existed);
}

Status Replicator::WaitFor(const std::function<void(WriteDone)>& start, int64_t timeout_ms,
                           bool* existed) {
  struct Latch {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    bool existed = false;
  };
  auto latch = std::make_shared<Latch>();
  start([latch](const Status& status, bool had) {
    std::lock_guard<std::mutex> lock(latch->mu);
    latch->done = true;
    latch->status = status;
    latch->existed = had;
    latch->cv.notify_all();
  });
  // Every pending request is answered: by the chain, by its deadline
  // (Expire(), on a tick) or by Stop(). A second later than the deadline
  // the loop itself must be stuck (a disk that does not answer).
  std::unique_lock<std::mutex> lk(latch->mu);
  if (!latch->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms + 1000),
                          [&] { return latch->done; })) {
    return Status::Unavailable("the chain of mark " + std::to_string(options_.mark) +
                               " did not answer in time (its replication loop is stuck)");
  }
  if (existed != nullptr) *existed = latch->existed;
  return latch->status;
}

void Replicator::WriteAsync(std::vector<rpc::ChainOp> ops, std::vector<uint64_t> keys,
                            WriteDone done, bool import, bool run_here) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    const std::string role = member_->role();
    if (role == "middle" || role == "tail") {
      lock.unlock();
      return done(Status::NotOwner("this member is the " + role + " of mark " +
                                   std::to_string(options_.mark) + "'s chain, not its head"),
                  false);
    }
  }
  Sequence(
      false, "write",
      [this, keys = std::move(keys), op = EncodeChainOps(ops), import](
          uint64_t request, int64_t now, ChainOutput* out) mutable {
        for (size_t i = 0; i < keys.size() && !import; ++i) {
          Status st = coordinator_->CheckWritable(static_cast<int64_t>(keys[i]));
          if (!st.ok()) {
            out->replies.push_back({request, st});
            return;
          }
        }
        // (A ring change's own writes are not recorded: at a source they
        // are the drop, after the record was read.)
        if (!import) Track(keys, op);
        member_->OnWrite(request, std::move(keys), std::move(op), now, out);
      },
      std::move(done), run_here);
}

Status Replicator::Write(std::vector<rpc::ChainOp> ops, std::vector<uint64_t> keys,
                         bool* existed, bool import, bool run_here) {
  return Wait(
      [&](WriteDone done) {
        WriteAsync(std::move(ops), std::move(keys), std::move(done), import, run_here);
      },
      existed);
}

void Replicator::AppendAsync(int64_t key, std::string suffix, uint64_t max_value_bytes,
                             WriteDone done) {
  // Serial: it reads the value every earlier write left (the loop applied them first).
  Sequence(
      true, "append",
      [this, key, suffix = std::move(suffix), max_value_bytes](uint64_t request, int64_t now,
                                                               ChainOutput* out) {
        if (Status st = coordinator_->CheckWritable(key); !st.ok()) {
          out->replies.push_back({request, st});
          return;
        }
        std::string value;
        Status st = cache_->Get(key, &value);
        if (!st.ok() && !st.IsNotFound()) {
          out->replies.push_back({request, st});
          return;
        }
        if (value.size() + suffix.size() > max_value_bytes) {
          out->replies.push_back(
              {request, Status::ValueTooLarge("append would make key " + std::to_string(key) +
                                              " " + std::to_string(value.size() + suffix.size()) +
                                              " bytes, over storage.max_value_bytes (" +
                                              std::to_string(max_value_bytes) + ")")});
          return;
        }
        value += suffix;
        rpc::ChainOp op;
        op.kind = rpc::ChainOpKind::PUT;
        op.__set_key(key);
        op.__set_value(std::move(value));
        std::string encoded = EncodeChainOps({op});
        Track({static_cast<uint64_t>(key)}, encoded);
        member_->OnWrite(request, {static_cast<uint64_t>(key)}, std::move(encoded), now, out);
      },
      std::move(done));
}

Status Replicator::AdoptImport(int64_t epoch) {
  Waiter w;
  Event ev;
  ev.done = &w;
  ev.serial = true;
  ev.run = [](int64_t, ChainOutput*) {};
  ev.after = [this, epoch, &w](int64_t, ChainOutput*) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!member_->Rebase({epoch, 0})) {
        w.status = Status::InvalidArgument("cannot adopt an import: member " + options_.self +
                                           " is " + member_->role() + " and applied seq " +
                                           std::to_string(member_->applied().seq));
        return;
      }
    }
    intact_ = true;
    Checkpoint();
    if (!logged_intact_) w.status = Status::IOError("the chain log was not rewritten");
  };
  Post(std::move(ev));
  std::unique_lock<std::mutex> lk(mu_);
  w.cv.wait(lk, [&] { return w.done; });
  return w.status;
}

int64_t Replicator::DrawNonce() {
  std::random_device rd;
  return static_cast<int64_t>((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

Status Replicator::StartTracking(const partition::RingChange& change, int64_t hash_bound,
                                 rpc::TrackToken* token) {
  token->head = options_.self;
  token->nonce = nonce_;
  token->czxid = change.czxid;
  return Wait(
      [&](WriteDone done) {
        Sequence(
            false, "track",
            [this, change, hash_bound](uint64_t request, int64_t now, ChainOutput* out) {
              const std::string role = member_->role();
              if (role != "head" && role != "single") {
                out->replies.push_back({request, Status::NotOwner(
                                                     "peerTrack: member " + options_.self +
                                                     " is " + role + ", not the head")});
                return;
              }
              tracker_ = Tracker();
              tracker_.on = true;
              tracker_.czxid = change.czxid;
              tracker_.epoch = member_->head_epoch();
              tracker_.change = change;
              tracker_.hash_bound = hash_bound;
              // The barrier: an empty write, committed after everything before it.
              member_->OnWrite(request, {}, EncodeChainOps({}), now, out);
            },
            std::move(done));
      },
      nullptr);
}

void Replicator::Track(const std::vector<uint64_t>& hashes, const std::string& op) {
  Tracker& t = tracker_;
  if (!t.on || !t.overflow.empty()) return;
  if (std::none_of(hashes.begin(), hashes.end(),
                   [&](uint64_t h) { return t.change.Covers(static_cast<int64_t>(h)); })) {
    return;
  }
  tracked_writes_.fetch_add(1, std::memory_order_relaxed);
  // Decoded only for a write into the ranges while tracking (string keys
  // are known by their hash alone in "hashes").
  std::vector<rpc::ChainOp> ops;
  if (Status st = DecodeChainOps(op, &ops); !st.ok()) {
    t.overflow = "a write could not be read back: " + st.ToString();
  }
  auto track_skey = [&t](const std::string& skey) {
    if (!t.change.Covers(partition::Ring::HashString(skey, t.hash_bound))) return;
    if (t.skeys.insert(skey).second) t.skey_bytes += skey.size();
  };
  for (const rpc::ChainOp& o : ops) {
    if (o.kind == rpc::ChainOpKind::SPUT || o.kind == rpc::ChainOpKind::SREMOVE) {
      track_skey(o.skey);
    } else if (o.kind == rpc::ChainOpKind::SBUCKET) {  // a repair: key is a slot
      for (const engine::StringKeyValue& kv : DecodeBucket(o.value)) track_skey(kv.key);
    } else if (t.change.Covers(o.key)) {
      t.keys.insert(o.key);
    }
  }
  constexpr uint64_t kMaxSkeyBytes = 64 << 20;
  if (t.keys.size() + t.skeys.size() > options_.track_max_keys || t.skey_bytes > kMaxSkeyBytes) {
    t.overflow = "the record overflowed at " + std::to_string(t.keys.size() + t.skeys.size()) +
                 " keys (cluster.track_max_keys " + std::to_string(options_.track_max_keys) + ")";
  }
  if (!t.overflow.empty()) {
    track_overflows_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("ring change {}: {}; the import copies everything again, fenced", t.czxid,
                 t.overflow);
    t.keys.clear();
    t.skeys.clear();
    t.skey_bytes = 0;
  }
}

void Replicator::Tracked(const rpc::TrackToken& token, const std::string& cursor, size_t limit,
                         std::vector<int64_t>* keys, std::vector<std::string>* skeys, bool* done,
                         std::string* next, int64_t* recorded, std::string* reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Tracker& t = tracker_;
  const std::string role = member_->role();
  if (token.head != options_.self || token.nonce != nonce_) {
    *reason = "no record here for " + token.head + " (another member or process recorded it)";
  } else if (!t.on || t.czxid != token.czxid) {
    *reason = "no record here for ring change " + std::to_string(token.czxid);
  } else if ((role != "head" && role != "single") || member_->head_epoch() != t.epoch) {
    *reason = "member " + options_.self + " stopped heading the chain since the record began";
  } else if (!t.overflow.empty()) {
    *reason = t.overflow;
  }
  if (!reason->empty()) return;
  *recorded = static_cast<int64_t>(t.keys.size() + t.skeys.size());
  // Cursor: empty, 'i' + the last integer key (8 bytes), or 's' + the last string key.
  auto ki = t.keys.begin();
  auto si = t.skeys.begin();
  if (!cursor.empty() && cursor[0] == 'i' && cursor.size() == 1 + sizeof(int64_t)) {
    int64_t last = 0;
    std::memcpy(&last, cursor.data() + 1, sizeof(last));
    ki = t.keys.upper_bound(last);
  } else if (!cursor.empty() && cursor[0] == 's') {
    ki = t.keys.end();
    si = t.skeys.upper_bound(cursor.substr(1));
  }
  for (; ki != t.keys.end() && keys->size() < limit; ++ki) keys->push_back(*ki);
  if (ki != t.keys.end()) {
    *done = false;
    *next = TrackedCursorAfter(keys->back());
    return;
  }
  for (; si != t.skeys.end() && keys->size() + skeys->size() < limit; ++si) skeys->push_back(*si);
  *done = si == t.skeys.end();
  if (*done) return;
  // (No string key fits: the page filled with the last integer keys.)
  *next = skeys->empty() ? TrackedCursorAfter(keys->back()) : TrackedCursorAfter(skeys->back());
}

void Replicator::StopTracking() {
  std::lock_guard<std::mutex> lock(mu_);
  tracker_ = Tracker();
}

std::string Replicator::TrackedCursorAfter(int64_t key) {
  std::string c(1 + sizeof(key), 'i');
  std::memcpy(c.data() + 1, &key, sizeof(key));
  return c;
}

std::string Replicator::TrackedCursorAfter(const std::string& skey) { return "s" + skey; }

std::string Replicator::head() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<std::string>& members = member_->members();
  return members.empty() ? "" : members.front();
}

Status Replicator::RepairRounds(const std::function<Status()>& fetch, const RewriteFn& rewrite) {
  for (int round = 0; round < 2; ++round) {
    const bool fetched = round == 1;
    if (fetched) FLATKV_RETURN_IF_ERROR(fetch());
    // Shared with the loop's event: a caller that stopped waiting leaves it.
    auto need_copy = std::make_shared<bool>(false);
    // Serial, as an append: the store holds every write sequenced before it.
    Status st = Wait(
        [&](WriteDone done) {
          Sequence(
              true, "repair",
              [rewrite, fetched, need_copy](uint64_t request, int64_t now, ChainOutput* out) {
                *need_copy = rewrite(fetched, request, now, out);
              },
              std::move(done));
        },
        nullptr);
    FLATKV_RETURN_IF_ERROR(st);
    if (!*need_copy) {
      repairs_.fetch_add(1, std::memory_order_relaxed);
      return Status::OK();
    }
  }
  return Status::Corruption("no good copy to repair from");
}

Status Replicator::Repair(int64_t key, const std::function<Status(rpc::GetResult*)>& fetch,
                          rpc::GetResult* result) {
  struct State {
    rpc::GetResult copy;   // another member's, once fetched
    rpc::GetResult value;  // what the rewrite writes
  };
  auto state = std::make_shared<State>();
  Status st = RepairRounds(
      [&] { return fetch(&state->copy); },
      [this, key, state](bool fetched, uint64_t request, int64_t now, ChainOutput* out) {
        state->value = rpc::GetResult();
        std::string value;
        Status got = cache_->Get(key, &value);
        if (got.ok()) {
          state->value.found = true;
          state->value.value = std::move(value);
        } else if (got.IsCorruption()) {
          // Bad here too: a write not yet committed, else a copy.
          bool have = false;
          if (const partition::ChainEntry* e =
                  member_->NewestUncommitted(static_cast<uint64_t>(key))) {
            std::vector<rpc::ChainOp> ops;
            if (DecodeChainOps(e->op, &ops).ok()) {
              for (const rpc::ChainOp& op : ops) {
                if (op.kind == rpc::ChainOpKind::PUT && op.key == key) {
                  state->value.found = true;
                  state->value.value = op.value;
                  have = true;
                } else if (op.kind == rpc::ChainOpKind::REMOVE && op.key == key) {
                  state->value.found = false;
                  state->value.value.clear();
                  have = true;
                }
              }
            }
          }
          if (!have && !fetched) {
            out->replies.push_back({request, Status::OK()});
            return true;
          }
          if (!have) state->value = state->copy;
        } else if (!got.IsNotFound()) {
          out->replies.push_back({request, got});
          return false;
        }
        rpc::ChainOp op;
        op.kind = state->value.found ? rpc::ChainOpKind::PUT : rpc::ChainOpKind::REMOVE;
        op.__set_key(key);
        if (state->value.found) op.__set_value(state->value.value);
        std::string encoded = EncodeChainOps({op});
        Track({static_cast<uint64_t>(key)}, encoded);
        member_->OnWrite(request, {static_cast<uint64_t>(key)}, std::move(encoded), now, out);
        return false;
      });
  if (st.IsCorruption()) return Status::Corruption("key " + std::to_string(key) + ": " + st.message());
  FLATKV_RETURN_IF_ERROR(st);
  result->found = state->value.found;
  result->value = state->value.value;
  return Status::OK();
}

std::string EncodeBucket(const std::vector<engine::StringKeyValue>& live) {
  std::string bucket;
  for (const engine::StringKeyValue& kv : live) engine::AppendBucketPut(&bucket, kv.key, kv.value);
  return bucket;
}

std::vector<engine::StringKeyValue> DecodeBucket(std::string_view bucket) {
  std::vector<engine::StringKeyValue> live;
  for (auto& [k, v] : engine::LiveBucketEntries(bucket)) {
    live.push_back({std::move(k), std::move(v)});
  }
  return live;
}


Status Replicator::RepairBucket(int64_t slots, int64_t slot,
                                const std::function<Status(std::string*)>& fetch,
                                std::string* bucket) {
  struct State {
    std::string copy;    // another member's bucket, once fetched
    std::string bucket;  // what the rewrite writes
  };
  const engine::Store* store = cache_->store();
  if (slots <= 0 || slot < 0 || slot >= slots) {
    return Status::InvalidArgument("string-key slot " + std::to_string(slot) + " of " +
                                   std::to_string(slots));
  }
  if (static_cast<uint64_t>(slots) != store->options().string_slots) {
    return Status::InvalidArgument(
        "storage.string_slots differs: " + std::to_string(slots) + " on the member asking, " +
        std::to_string(store->options().string_slots) + " on the head " + options_.self +
        " (string keys are repaired by bucket: give the members of a mark the same value)");
  }
  // The event reads the bucket under mu_, after flushing the cache's dirty
  // entries (async write mode): most of them go here, first, each round.
  FLATKV_RETURN_IF_ERROR(cache_->Flush());
  auto state = std::make_shared<State>();
  Status st = RepairRounds(
      [&] {
        FLATKV_RETURN_IF_ERROR(fetch(&state->copy));
        return cache_->Flush();
      },
      [this, store, slots, slot, state](bool fetched, uint64_t request, int64_t now,
                                        ChainOutput* out) {
        std::vector<engine::StringKeyValue> live;
        Status got = cache_->SReadBucket(slot, &live);
        if (got.IsCorruption()) {
          if (!fetched) {
            out->replies.push_back({request, Status::OK()});
            return true;
          }
          // Another member's copy holds every committed write; the ones
          // not committed yet go on top, oldest first (each sets its key:
          // applying one it holds changes nothing).
          std::map<std::string, std::string> pairs;
          for (auto& kv : DecodeBucket(state->copy)) pairs[kv.key] = std::move(kv.value);
          for (const partition::ChainEntry* e : member_->Uncommitted()) {
            std::vector<rpc::ChainOp> ops;
            if (!DecodeChainOps(e->op, &ops).ok()) continue;
            for (const rpc::ChainOp& op : ops) {
              if (op.kind == rpc::ChainOpKind::SBUCKET && op.key == slot && op.slots == slots) {
                pairs.clear();
                for (auto& kv : DecodeBucket(op.value)) pairs[kv.key] = std::move(kv.value);
              } else if ((op.kind == rpc::ChainOpKind::SPUT ||
                          op.kind == rpc::ChainOpKind::SREMOVE) &&
                         store->StringSlot(op.skey) == slot) {
                if (op.kind == rpc::ChainOpKind::SPUT) {
                  pairs[op.skey] = op.value;
                } else {
                  pairs.erase(op.skey);
                }
              }
            }
          }
          live.clear();
          for (auto& [k, v] : pairs) live.push_back({k, std::move(v)});
        } else if (!got.ok()) {
          out->replies.push_back({request, got});
          return false;
        }
        rpc::ChainOp op;
        op.kind = rpc::ChainOpKind::SBUCKET;
        op.__set_key(slot);
        op.__set_slots(slots);
        op.__set_value(EncodeBucket(live));
        state->bucket = op.value;
        // Tagged like each key's own writes (the ring's hash), so a read
        // gate that waits for a key's newest write waits for this one too,
        // and a ring change's record (Track) names its keys.
        std::vector<uint64_t> hashes;
        if (ring_ != nullptr) {
          for (const engine::StringKeyValue& kv : live) {
            hashes.push_back(static_cast<uint64_t>(
                partition::Ring::HashString(kv.key, ring_->settings().hash_bound)));
          }
        }
        std::string encoded = EncodeChainOps({op});
        Track(hashes, encoded);
        member_->OnWrite(request, std::move(hashes), std::move(encoded), now, out);
        return false;
      });
  if (st.IsCorruption()) {
    return Status::Corruption("string-key bucket " + std::to_string(slot) + ": " + st.message());
  }
  FLATKV_RETURN_IF_ERROR(st);
  *bucket = std::move(state->bucket);
  return Status::OK();
}

Status Replicator::BeforeRead(uint64_t hash, bool* held) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t request = next_request_++;
  ChainOutput out;
  switch (member_->OnRead(request, hash, NowMs(), &out)) {
    case partition::ChainMember::Read::kServe:
      return Status::OK();
    case partition::ChainMember::Read::kRefuse: {
      const std::string role = member_->role();
      if (role == "head" || role == "middle") {
        return Status::NotOwner("this member is the " + role + " of mark " +
                                std::to_string(options_.mark) +
                                "'s chain: under sync the tail serves reads");
      }
      return Status::Unavailable("member " + options_.self + " of mark " +
                                 std::to_string(options_.mark) + " cannot serve reads now (" +
                                 role + ")");
    }
    case partition::ChainMember::Read::kWait:
      break;
  }
  reads_held_.fetch_add(1, std::memory_order_relaxed);
  if (held != nullptr) {
    *held = true;  // the member releases the parked read later: ignored (Finish)
    return Status::Unavailable("read held back");
  }
  // A catch-up holds this key back until the joiner applied its writes, or
  // under always the head's commit point its newest write (or the peer
  // timeout passed: Expire()).
  return WaitFor(
      [&](WriteDone done) {
        pending_[request] = {std::move(done), NowMs() + options_.peer_timeout_ms, nullptr};
        lk.unlock();
      },
      options_.peer_timeout_ms, nullptr);
}

bool Replicator::ConfirmRead(uint64_t hash) {
  std::lock_guard<std::mutex> lk(mu_);
  if (member_->ConfirmRead(hash, NowMs())) return true;
  reads_again_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Status Replicator::OnFrame(const std::string& from, const rpc::ChainFrame& frame, bool wait) {
  ChainMessage msg;
  FLATKV_RETURN_IF_ERROR(DecodeChainFrame(frame, &msg));
  for (const ChainEntry& e : msg.entries) {
    std::vector<rpc::ChainOp> ops;
    FLATKV_RETURN_IF_ERROR(DecodeChainOps(e.op, &ops));
  }
  frames_received_.fetch_add(1, std::memory_order_relaxed);
  spdlog::trace("chain: from {}: kind {} chain {:x} entries {} applied {} committed {}", from,
               static_cast<int>(msg.kind), msg.chain, msg.entries.size(), msg.applied,
               msg.committed);
  Waiter w;
  Event ev;
  if (wait) ev.done = &w;
  frames_pending_.fetch_add(1, std::memory_order_relaxed);
  ev.run = [this, from, msg = std::move(msg)](int64_t now, ChainOutput* out) {
    frames_pending_.fetch_sub(1, std::memory_order_relaxed);
    member_->OnMessage(from, msg, now, out);
  };
  Post(std::move(ev), /*run_here=*/!wait);
  if (!wait) return Status::OK();
  std::unique_lock<std::mutex> lk(mu_);
  w.cv.wait(lk, [&] { return w.done; });
  return w.status;
}

Status Replicator::OnSnapshotPage(const std::string& from, const rpc::SnapshotPage& page,
                                  int64_t* token) {
  // Runs on the loop: the first page empties the store (its output's wipe),
  // then every page is loaded while its stream is the current one.
  Waiter w;
  uint64_t t = 0;
  Event ev;
  ev.done = &w;
  ev.serial = true;
  ev.run = [this, from, &page, &t](int64_t now, ChainOutput* out) {
    t = static_cast<uint64_t>(page.token);
    if (page.first) {
      t = member_->OnSnapshotBegin(from, {page.atEpoch, static_cast<uint64_t>(page.atSeq)}, now,
                                  out);
    }
    if (t == 0 || !member_->snapshot_current(t)) {
      t = 0;
      return;
    }
    member_->OnSnapshotProgress(t, now);
  };
  ev.after = [this, from, &page, &t, &w](int64_t now, ChainOutput* out) {
    if (t == 0) {
      w.status = Status::NotOwner("member " + options_.self +
                                  " does not expect this snapshot stream (a later one replaced "
                                  "it, or it is no longer joining)");
      return;
    }
    const int64_t before = snapshot_bytes_loaded_.load(std::memory_order_relaxed);
    Status st = LoadPage(page);
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      if (page.first) loading_ = {from, 0, 0, NowMs(), 0};
      loading_.total = static_cast<uint64_t>(page.totalBytes);
      loading_.bytes += static_cast<uint64_t>(
          snapshot_bytes_loaded_.load(std::memory_order_relaxed) - before);
      if (page.last && st.ok()) loading_.end_ms = NowMs();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok()) {
      spdlog::warn("chain: loading a snapshot page: {}", st.ToString());
      member_->OnSnapshotFailed(t, now, out);
      w.status = st;
      return;
    }
    if (page.last && member_->snapshot_current(t)) {
      spdlog::info("chain: snapshot loaded; catching up from epoch {} seq {}", page.atEpoch,
                   page.atSeq);
      const partition::ChainPosition end =
          page.__isset.endSeq
              ? partition::ChainPosition{page.endEpoch, static_cast<uint64_t>(page.endSeq)}
              : partition::ChainPosition{page.atEpoch, static_cast<uint64_t>(page.atSeq)};
      member_->OnSnapshotLoaded(t, end, now, out);
      checkpoint_due_ = true;  // the pages were written without a sync
    }
  };
  Post(std::move(ev));
  {
    std::unique_lock<std::mutex> lk(mu_);
    w.cv.wait(lk, [&] { return w.done; });
  }
  if (!w.status.ok()) return w.status;
  *token = static_cast<int64_t>(t);
  return Status::OK();
}

Status Replicator::LoadPage(const rpc::SnapshotPage& page) {
  std::vector<engine::KeyValueRef> batch;
  batch.reserve(page.pairs.size());
  uint64_t bytes = 0;
  for (const rpc::KvPair& p : page.pairs) {
    batch.push_back({p.key, p.value});
    bytes += p.value.size() + 8;
  }
  if (!batch.empty()) FLATKV_RETURN_IF_ERROR(cache_->PutBatch(batch));
  for (const rpc::StringKvPair& p : page.spairs) {
    FLATKV_RETURN_IF_ERROR(cache_->SPut(p.key, p.value));
    bytes += p.key.size() + p.value.size();
  }
  snapshot_bytes_loaded_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return Status::OK();
}

void Replicator::Progress::Report(const std::string& prefix,
                                  std::map<std::string, int64_t>* out) const {
  if (peer.empty()) return;
  const int64_t ms = std::max<int64_t>(1, (end_ms != 0 ? end_ms : NowMs()) - start_ms);
  // The total is an estimate (record headers, dead bytes not yet known as
  // such): 100 only once the stream ended.
  int64_t percent = total > 0 ? static_cast<int64_t>(std::min<uint64_t>(99, bytes * 100 / total))
                              : 0;
  if (end_ms != 0) percent = 100;
  (*out)[prefix + "percent"] = percent;
  (*out)[prefix + "bytes"] = static_cast<int64_t>(bytes);
  (*out)[prefix + "total_bytes"] = static_cast<int64_t>(total);
  (*out)[prefix + "bytes_per_sec"] = static_cast<int64_t>(bytes * 1000 / static_cast<uint64_t>(ms));
  (*out)[prefix + "done"] = end_ms != 0 ? 1 : 0;
}

void Replicator::SignalDone(Waiter* w, const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (w->status.ok()) w->status = status;
  w->done = true;
  w->cv.notify_all();
}

void Replicator::Loop() {
  int64_t next_tick = NowMs();
  while (true) {
    std::deque<Event> events;
    {
      std::unique_lock<std::mutex> lk(queue_mu_);
      while (true) {
        if (handoff_) {  // running_ is ours already
          handoff_ = false;
          break;
        }
        const bool due = NowMs() >= next_tick;
        if (!running_ && (stopping_ || due || !queue_.empty())) {
          running_ = true;
          break;
        }
        // A thread running events releases them to us (RunHere).
        loop_wants_ = due || stopping_;
        if (loop_wants_) {
          queue_cv_.wait(lk);
        } else {
          queue_cv_.wait_for(lk, std::chrono::milliseconds(std::max<int64_t>(1, next_tick - NowMs())));
        }
      }
      loop_wants_ = false;
      if (stopping_) break;  // running_ stays ours: nothing runs events any more
      events.swap(queue_);
      queued_for_loop_ = 0;
    }
    const int64_t now = NowMs();
    RunEvents(&events, now, /*here=*/false);
    if (now >= next_tick) {
      ChainOutput out;
      Tick(now, &out);
      Process(&out);
      next_tick = now + options_.tick_ms;
    }
    std::lock_guard<std::mutex> lock(queue_mu_);
    running_ = false;
  }
  // Shutting down: what is held carried out, the store made durable, the
  // log emptied.
  Drain();
  Checkpoint();
}

bool Replicator::RunEvents(std::deque<Event>* events, int64_t now, bool here) {
  ChainOutput out;
  std::vector<Waiter*> done;
  auto flush = [&] {
    Process(&out, &done);
    out = ChainOutput();
  };
  for (Event& ev : *events) {
    if (ev.serial) {
      // Runs on the store as the member's state says it is: everything
      // before carried out, the pipeline's held writes too.
      flush();
      Drain();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ev.run(now, &out);
    }
    if (ev.serial) {
      Process(&out);
      Drain();
      out = ChainOutput();
      if (ev.after) {
        ev.after(now, &out);
        Process(&out);
        Drain();
        out = ChainOutput();
      }
    }
    if (ev.done != nullptr) done.push_back(ev.done);
  }
  if (here && Heavy(out)) {
    // The loop carries out this output first, then whatever queued meanwhile
    // (events here have no waiter: RunHere takes none).
    auto held = std::make_shared<ChainOutput>(std::move(out));
    Event ev;
    ev.run = [held](int64_t, ChainOutput* o) { *o = std::move(*held); };
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.push_front(std::move(ev));
      handoff_ = true;
    }
    queue_cv_.notify_one();
    return false;
  }
  flush();
  return true;
}

void Replicator::Tick(int64_t now, ChainOutput* out) {
  Expire(now);
  // Out of the chain for a full disk: no lease, no join, until there is room.
  if (disk_full_.load() && !RejoinAfterFullDisk(now, out)) return;
  // The member decides on its lease (ChainMember::OnSessionAnswer); the
  // shell only passes on what the session answered. Not fenced for being
  // disconnected: a member learns that its session expired from the ring
  // (its registration gone) once ZooKeeper answers; until then a chain of
  // one keeps serving (DESIGN.md, "ZooKeeper unreachable").
  const partition::SessionLease lease = coordinator_->lease();
  std::lock_guard<std::mutex> lock(mu_);
  if (lease.sent_ms != 0 && lease.sent_ms != lease_sent_ms_) {
    lease_sent_ms_ = lease.sent_ms;
    member_->OnSessionAnswer(lease.sent_ms, lease.timeout_ms, now, out, lease.session);
  }
  const bool leased = member_->leased(now);
  if (leased != leased_) {
    spdlog::warn("chain: ZooKeeper lease {}",
                 leased ? "renewed" : "lost (writes and sync reads refused)");
    leased_ = leased;
  }
  const std::string role = member_->role();
  if (joined_ && (role == "fenced" || role == "none") && ring_ != nullptr) {
    spdlog::info("chain: not in mark {}'s chain: catching up to join it", options_.mark);
    member_->StartJoin(now, out);
  }
  member_->OnTick(now, out);
}

bool Replicator::CheckpointWanted() const {
  return checkpoint_due_ || intact_ != logged_intact_ || log_->bytes() > kLogCheckpointBytes;
}

void Replicator::Process(ChainOutput* out, std::vector<Waiter*>* done) {
  auto signal = [&] {
    if (done == nullptr) return;
    for (Waiter* w : *done) SignalDone(w, Status::OK());
    done->clear();
  };
  if (!pipelined_) {
    Carry(out, /*logged=*/false);
    return signal();
  }
  ReleaseSynced();
  // What reads or resets the store as the member's state names it, or
  // waits on ZooKeeper, runs once everything before it is carried out; so
  // does a checkpoint, which restarts the log from the member's position.
  // (All Heavy(): on the loop thread.)
  const bool drain = out->wipe || !out->record.empty() || !out->snapshots.empty() ||
                     out->deregister || out->register_now || disk_full_.load() ||
                     CheckpointWanted();
  if (drain) Drain();
  if (held_.empty() && (out->apply.empty() || drain)) {
    Carry(out, /*logged=*/false);
    return signal();
  }
  if (!out->apply.empty()) {
    Status st = log_->Append(out->apply);
    if (!st.ok()) {
      // Nothing of this batch is logged: what was before it is carried out,
      // then this one as without the pipeline (its Append fails again).
      Drain();
      Carry(out, /*logged=*/false);
      return signal();
    }
    SendDownFirst(out);
    ++logged_batch_;
    {
      std::lock_guard<std::mutex> lock(sync_mu_);
      sync_want_ = logged_batch_;
    }
    sync_cv_.notify_all();
  }
  if (out->empty() && (done == nullptr || done->empty())) return;
  Held h;
  h.out = std::move(*out);
  *out = ChainOutput();
  if (done != nullptr) h.done.swap(*done);
  h.batch = logged_batch_;
  held_.push_back(std::move(h));
}

void Replicator::ReleaseSynced() {
  if (held_.empty()) return;
  uint64_t synced;
  Status error;
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    synced = sync_done_;
    error = sync_error_;
  }
  while (!held_.empty() && held_.front().batch <= synced) {
    Held h = std::move(held_.front());
    held_.pop_front();
    Carry(&h.out, /*logged=*/true);
    for (Waiter* w : h.done) SignalDone(w, Status::OK());
  }
  if (held_.empty() || error.ok()) return;
  if (!error.IsNoSpace()) Fatal("syncing the chain log", error);
  // The batches past the last good sync are logged (maybe not durably)
  // and not applied: applied again at rejoin, like a batch whose apply
  // failed, once the member rebuilt itself from the log.
  // Nothing else held is carried out: its acks and answers may stand on
  // those batches.
  const Status why = Status::NoSpace("member " + options_.self + " left its chain: " +
                                     error.message());
  while (!held_.empty()) {
    Held h = std::move(held_.front());
    held_.pop_front();
    unapplied_.insert(unapplied_.end(), h.out.apply.begin(), h.out.apply.end());
    DropOutput(&h.out, why);
    for (Waiter* w : h.done) SignalDone(w, why);
  }
  ChainOutput none;
  LeaveForFullDisk("syncing replicated writes", error, &none);
}

void Replicator::Drain() {
  if (held_.empty()) return;
  if (std::this_thread::get_id() == syncer_.get_id()) {
    // The syncer runs events itself (its wake-up's run_here) and met an
    // output that drains (not expected: those are Heavy(), the loop's):
    // it syncs here rather than wait for itself.
    const uint64_t target = logged_batch_;
    Status st = log_->SyncAppended();
    std::lock_guard<std::mutex> lock(sync_mu_);
    if (st.ok()) sync_done_ = std::max(sync_done_, target);
    if (!st.ok() && sync_error_.ok()) sync_error_ = st;
  } else {
    std::unique_lock<std::mutex> lock(sync_mu_);
    sync_cv_.wait(lock, [&] { return sync_done_ >= logged_batch_ || !sync_error_.ok(); });
  }
  ReleaseSynced();
}

void Replicator::SyncLoop() {
  std::unique_lock<std::mutex> lock(sync_mu_);
  while (true) {
    // After an error, nothing until RejoinAfterFullDisk clears it.
    sync_cv_.wait(lock, [&] {
      return sync_stop_ || (sync_error_.ok() && sync_want_ > sync_done_);
    });
    if (sync_stop_ && (sync_want_ <= sync_done_ || !sync_error_.ok())) return;
    const uint64_t target = sync_want_;
    lock.unlock();
    // Covers every batch logged before this call: at least "target".
    Status st = log_->SyncAppended();
    pipeline_syncs_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
    if (st.ok()) {
      sync_done_ = target;
    } else {
      // Never again: after a failed fdatasync a later one may succeed
      // without the lost pages (Linux), so the loop stops on this one.
      sync_error_ = st;
    }
    sync_cv_.notify_all();
    lock.unlock();
    // The held outputs of these batches go now: this thread carries them
    // out itself if nothing else runs events (saving the loop's wake-up),
    // else whoever runs them does.
    Event wake;
    wake.run = [](int64_t, ChainOutput*) {};
    Post(std::move(wake), /*run_here=*/true);
    lock.lock();
  }
}

void Replicator::Carry(ChainOutput* out, bool logged) {
  if (out->wipe) {
    Status st = Wipe();
    if (st.IsNoSpace()) return LeaveForFullDisk("emptying the store for a snapshot", st, out);
    if (!st.ok()) spdlog::error("chain: emptying the store for a snapshot: {}", st.ToString());
  }
  if (disk_full_.load() && !out->apply.empty()) {
    // Out of the chain for a full disk (LeaveForFullDisk): nothing applied,
    // passed on or acknowledged until it rejoins. A batch the pipeline
    // logged already is applied then.
    if (logged) unapplied_.insert(unapplied_.end(), out->apply.begin(), out->apply.end());
    return DropOutput(out, Status::NoSpace("member " + options_.self +
                                           " left its chain: its disk is full"));
  }
  if (!out->apply.empty()) {
    // Logged before anything of the batch is applied, passed on or
    // acknowledged. The writes go down the chain before this member's
    // fdatasync and store apply, so the members sync in parallel rather
    // than one after another: safe because nothing that answers a client
    // leaves before it. Acks (and replies) are sent below, once the batch
    // is durable and applied here; an ack from downstream is an event run
    // after this one (or held behind this batch by the pipeline). So the
    // commit point a member reports up, and the answer the head gives,
    // still follow every member's sync.
    Status st;
    if (!logged) {
      st = log_->Append(out->apply);
      if (st.ok()) SendDownFirst(out);
      if (st.ok() && options_.sync_always) st = log_->Sync();
      if (st.IsNoSpace()) return LeaveForFullDisk("logging replicated writes", st, out);
      if (!st.ok()) Fatal("logging replicated writes", st);
    }
    st = ApplyEntries(out->apply);
    if (st.IsNoSpace()) {
      unapplied_ = out->apply;  // logged, maybe partly applied: again at rejoin
      return LeaveForFullDisk("applying replicated writes", st, out);
    }
    if (!st.ok()) Fatal("applying replicated writes", st);
  }
  if (held_.empty() && CheckpointWanted()) Checkpoint();
  log_bytes_.store(log_->bytes(), std::memory_order_relaxed);
  if (!out->record.empty()) {
    Status st = coordinator_->RecordChain(out->record, out->record_version);
    if (st.ok()) {
      records_.fetch_add(1, std::memory_order_relaxed);
    } else {
      spdlog::warn("chain: recording the chain in ZooKeeper: {}", st.ToString());
    }
  }
  for (const ChainOutput::Send& s : out->sends) Send(s.to, s.msg);
  for (const ChainOutput::Reply& r : out->replies) Finish(r.request, r.status);
  for (uint64_t r : out->reads) Finish(r, Status::OK());
  for (const ChainOutput::Snapshot& s : out->snapshots) StartSnapshot(s.to, s.at);
  for (const ChainOutput::Evict& e : out->evict) {
    spdlog::warn("chain: {} refused a connection: its process is gone; removing its member node",
                 e.member);
    evictions_.fetch_add(1, std::memory_order_relaxed);
    coordinator_->Evict(e.member, e.epoch);
  }
  if (out->deregister) coordinator_->Deregister();
  if (out->register_now) {
    spdlog::info("chain: caught up; registering in mark {}", options_.mark);
    coordinator_->Register();
  }
}

// A full disk: rather than stop the process (as for other I/O errors), the
// member leaves the chain at once and stays up, saying why (stats, /health,
// the log), so the chain goes on without it after a ring change (about a
// second) instead of a session timeout. Its member state may claim the
// batch that failed, so it is fenced now and rebuilt from the chain log
// before it rejoins (RejoinAfterFullDisk), as a restart would.
void Replicator::LeaveForFullDisk(const char* what, const Status& st, ChainOutput* out) {
  {
    std::lock_guard<std::mutex> lock(disk_mu_);
    disk_full_reason_ = std::string(what) + ": " + st.message();
  }
  const bool first = !disk_full_.exchange(true);
  if (first) disk_full_leaves_.fetch_add(1, std::memory_order_relaxed);
  spdlog::error("chain: {}: {}; leaving mark {}'s chain (this member stays up, out of the "
                "chain, and rejoins once its disk has {} bytes free)",
                what, st.ToString(), options_.mark, RejoinFreeBytes());
  DropOutput(out, Status::NoSpace("member " + options_.self + " left its chain: " +
                                  st.message()));
  ChainOutput fenced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    member_->SetFenced(true, &fenced);
  }
  DropOutput(&fenced, Status::NoSpace("member " + options_.self + " left its chain: " +
                                      st.message()));
  coordinator_->Deregister();
}

void Replicator::DropOutput(ChainOutput* out, const Status& why) {
  for (const ChainOutput::Reply& r : out->replies) Finish(r.request, why);
  for (uint64_t r : out->reads) Finish(r, Status::Unavailable(why.message()));
  *out = ChainOutput();
}

uint64_t Replicator::RejoinFreeBytes() const {
  struct statvfs vfs;
  if (statvfs(options_.data_dir.c_str(), &vfs) != 0) return kRejoinFreeBytes;
  const uint64_t total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  return std::min<uint64_t>(kRejoinFreeBytes, total / 10);
}

bool Replicator::RejoinAfterFullDisk(int64_t now, ChainOutput* out) {
  if (now - last_space_check_ < 1000) return false;
  last_space_check_ = now;
  struct statvfs vfs;
  if (statvfs(options_.data_dir.c_str(), &vfs) != 0) return false;
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (avail < RejoinFreeBytes()) return false;
  // Start over from the position the log holds, as a restart does. Unlike
  // a restart, only the batch that failed to apply is applied again: the
  // store holds every earlier logged write already, and replaying the whole
  // log would append all of it to the store once more (on a disk that was
  // just full, enough to fill it again).
  const std::string path = options_.data_dir + "/CHAINLOG";
  ChainLog::State state;
  std::vector<ChainEntry> entries;
  std::unique_ptr<ChainLog> log;
  Status st = ChainLog::Open(path, &state, &entries, &log);
  if (st.ok() && !unapplied_.empty()) st = ApplyEntries(unapplied_);
  if (!st.ok()) {
    spdlog::warn("chain: {} bytes free, but rejoining failed: {}; trying again", avail,
                 st.ToString());
    return false;
  }
  const ChainPosition position =
      entries.empty() ? state.position : ChainPosition{entries.back().epoch, entries.back().seq};
  {
    std::lock_guard<std::mutex> lock(mu_);
    member_ = std::make_unique<partition::ChainMember>(options_.self, options_.chain, position,
                                                       state.intact);
    existed_.clear();
    seq_of_request_.clear();
    if (ring_ != nullptr) member_->OnConfig(ConfigOf(*ring_), now, out);
  }
  {
    std::lock_guard<std::mutex> lock(sync_mu_);  // the syncer is idle: nothing is held
    log_ = std::move(log);
    sync_error_ = Status::OK();
    sync_want_ = sync_done_ = logged_batch_;
  }
  logged_intact_ = intact_ = state.intact;
  unapplied_.clear();
  disk_full_.store(false);
  spdlog::info("chain: the disk has room again ({} bytes free): rejoining mark {} from epoch {} "
               "seq {}",
               avail, options_.mark, position.epoch, position.seq);
  return true;
}

std::string Replicator::DiskFull() const {
  if (!disk_full_.load()) return "";
  std::lock_guard<std::mutex> lock(disk_mu_);
  return disk_full_reason_;
}

Status ApplyChainEntries(engine::cache::WriteBackCache* cache, const std::vector<ChainEntry>& entries,
                         std::vector<std::pair<uint64_t, bool>>* existed_out) {
  std::vector<std::vector<rpc::ChainOp>> decoded(entries.size());
  std::vector<engine::KeyValueRef> puts;
  std::vector<std::pair<uint64_t, bool>>& existed = *existed_out;  // seq, existed: first op a remove
  Status result;
  auto flush = [&]() {
    if (puts.empty()) return;
    Status st = cache->PutBatch(puts);
    if (!st.ok() && result.ok()) result = st;
    puts.clear();
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    Status st = DecodeChainOps(entries[i].op, &decoded[i]);
    if (!st.ok()) {
      if (result.ok()) result = st;
      continue;
    }
    bool first = true;
    for (const rpc::ChainOp& op : decoded[i]) {
      if (op.kind == rpc::ChainOpKind::PUT) {
        puts.push_back({op.key, op.value});
        first = false;
        continue;
      }
      flush();
      bool had = false;
      switch (op.kind) {
        case rpc::ChainOpKind::REMOVE:
          st = cache->Remove(op.key, &had);
          break;
        case rpc::ChainOpKind::SPUT:
          st = cache->SPut(op.skey, op.value);
          break;
        case rpc::ChainOpKind::SREMOVE:
          st = cache->SRemove(op.skey, &had);
          break;
        case rpc::ChainOpKind::SBUCKET:
          // With other slots this member's buckets differ, and it holds
          // these pairs already: only a damaged bucket needs the rewrite.
          if (static_cast<uint64_t>(op.slots) == cache->store()->options().string_slots) {
            st = cache->SWriteBucket(op.key, DecodeBucket(op.value));
          }
          break;
        default:
          break;
      }
      if (!st.ok() && result.ok()) result = st;
      if (first) existed.push_back({entries[i].seq, had});
      first = false;
    }
  }
  flush();
  return result;
}

Status Replicator::ApplyEntries(const std::vector<ChainEntry>& entries) {
  std::vector<std::pair<uint64_t, bool>> existed;  // seq, existed: first op a remove
  Status result = ApplyChainEntries(cache_, entries, &existed);
  applied_entries_.fetch_add(static_cast<int64_t>(entries.size()), std::memory_order_relaxed);
  apply_batches_.fetch_add(1, std::memory_order_relaxed);
  if (!existed.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [seq, had] : existed) existed_[seq] = had;
  }
  return result;
}

Status Replicator::Wipe() {
  wipes_.fetch_add(1, std::memory_order_relaxed);
  // Snapshot streams this member sends read the store being emptied: a
  // joiner would load a partial copy and take it for whole. Stopped here
  // (each ends after the page in flight, without its last page), so their
  // joiners ask again, elsewhere.
  if (!senders_.empty()) {
    spdlog::warn("chain: stopping {} snapshot stream(s): this member empties its store",
                 senders_.size());
    senders_.clear();
  }
  intact_ = false;
  // Not intact from here until registered again (the writes logged before
  // are void: the store is being replaced).
  if (Status st = log_->Reset({{}, false}); !st.ok()) {
    if (!st.IsNoSpace()) Fatal("resetting the log for a wipe", st);
    return st;  // Process() sees NoSpace: out of the chain until there is room
  }
  logged_intact_ = false;
  FLATKV_RETURN_IF_ERROR(cache_->Flush());
  uint64_t removed = 0;
  Status st;
  std::vector<std::string> skeys;  // removed after the walk: SScan's cursor stays valid
  FLATKV_RETURN_IF_ERROR(ForEachPage(
      *store_, 1024,
      [&](std::vector<engine::KeyValue>* out) {
        for (const engine::KeyValue& kv : *out) {
          if (st = cache_->Remove(kv.key); !st.ok()) return false;
        }
        removed += out->size();
        return true;
      },
      [&](std::vector<engine::StringKeyValue>* out) {
        for (engine::StringKeyValue& kv : *out) skeys.push_back(std::move(kv.key));
        return true;
      }));
  FLATKV_RETURN_IF_ERROR(st);
  for (const std::string& k : skeys) FLATKV_RETURN_IF_ERROR(cache_->SRemove(k));
  removed += skeys.size();
  spdlog::info("chain: emptied the store for a snapshot ({} keys removed)", removed);
  return Status::OK();
}

void Replicator::Checkpoint() {
  // Everything applied reaches the store's files and the disk, then the
  // log restarts from the position it names.
  Status st = cache_->Flush();
  if (st.ok()) st = store_->Sync();
  ChainLog::State state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state.position = member_->applied();
  }
  state.intact = intact_;
  if (st.ok()) st = log_->Reset(state);
  if (!st.ok()) {
    // The old log stays whole and keeps every write: only longer.
    spdlog::error("chain: checkpoint of the log: {}", st.ToString());
    return;
  }
  checkpoints_.fetch_add(1, std::memory_order_relaxed);
  logged_intact_ = state.intact;
  checkpoint_due_ = false;
}

void Replicator::SendDownFirst(ChainOutput* out) {
  // Writes passed down (kReplicate) go now; everything else (acks up, sync
  // requests) stays in out->sends for after the batch is durable. A message
  // goes early only if none before it to the same member waits: each link
  // keeps its order.
  std::vector<ChainOutput::Send> later;
  auto waits = [](const std::vector<ChainOutput::Send>& sends, const std::string& to) {
    return std::any_of(sends.begin(), sends.end(),
                       [&](const ChainOutput::Send& w) { return w.to == to; });
  };
  for (ChainOutput::Send& s : out->sends) {
    const bool blocked =
        waits(later, s.to) ||
        std::any_of(held_.begin(), held_.end(), [&](const Held& h) { return waits(h.out.sends, s.to); });
    if (s.msg.kind == ChainMessage::Kind::kReplicate && !blocked) {
      Send(s.to, s.msg);
    } else {
      later.push_back(std::move(s));
    }
  }
  out->sends = std::move(later);
}

void Replicator::Send(const std::string& to, const ChainMessage& msg) {
  auto it = links_.find(to);
  if (it == links_.end()) {
    it = links_.emplace(to, std::make_unique<PeerLink>(to, options_, &frames_sent_,
                                                       &frames_failed_, [this, to] {
      PostRun([this, to](int64_t now, ChainOutput* out) {
        member_->OnPeerRefused(to, now, out);
      });
    })).first;
  }
  spdlog::trace("chain: to {}: kind {} chain {:x} entries {} applied {} committed {}", to,
               static_cast<int>(msg.kind), msg.chain, msg.entries.size(), msg.applied,
               msg.committed);
  it->second->Push(ToFrame(msg));
}

void Replicator::StartSnapshot(const std::string& to, ChainPosition at) {
  if (auto it = senders_.find(to);
      it != senders_.end() && it->second->running() && it->second->at() == at &&
      NowMs() - it->second->started_ms() < options_.chain.joiner_timeout_ms) {
    // The joiner asked again before the stream's first page reached it
    // (it asks every resend_ms until then): the stream under way serves it.
    // Replacing it would start the copy over each time a first page is
    // slower than resend_ms. A joiner that cannot take the stream (it
    // restarted, or emptied its store) refuses its next page, which ends it.
    return;
  }
  senders_.erase(to);  // a new stream to the same joiner replaces the old one
  for (auto it = senders_.begin(); it != senders_.end();) {
    it = it->second->done() ? senders_.erase(it) : std::next(it);
  }
  senders_[to] = std::make_unique<SnapshotSender>(this, to, at);
}

void Replicator::Finish(uint64_t request, const Status& status) {
  WriteDone done;
  bool existed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = seq_of_request_.find(request);
    if (s != seq_of_request_.end()) {
      auto e = existed_.find(s->second);
      if (e != existed_.end()) {
        existed = e->second;
        existed_.erase(e);
      }
      seq_of_request_.erase(s);
    }
    auto it = pending_.find(request);
    if (it == pending_.end()) return;  // expired meanwhile
    done = std::move(it->second.done);
    pending_.erase(it);
  }
  done(status, existed);
}

void Replicator::Expire(int64_t now) {
  std::vector<Pending> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Reads wait less than writes: every entry is looked at.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      late.push_back(std::move(it->second));
      it = pending_.erase(it);
    }
  }
  for (Pending& p : late) {
    if (p.what == nullptr) {
      p.done(Status::Unavailable("a read of mark " + std::to_string(options_.mark) +
                                 " waited too long for a joining member"),
             false);
    } else {
      p.done(Status::Unavailable("the chain of mark " + std::to_string(options_.mark) +
                                 " did not acknowledge the " + p.what +
                                 " in time (it may still be applied)"),
             false);
    }
  }
}

std::string Replicator::role() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->role();
}

bool Replicator::lease_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->lease_held();
}

ChainPosition Replicator::applied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return member_->applied();
}

void Replicator::AddStats(std::map<std::string, int64_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ChainPosition p = member_->applied();
    (*out)["cluster.chain.applied_epoch"] = p.epoch;
    if (tracker_.on) {
      (*out)["cluster.track.keys"] =
          static_cast<int64_t>(tracker_.keys.size() + tracker_.skeys.size());
      (*out)["cluster.track.overflowed"] = tracker_.overflow.empty() ? 0 : 1;
    }
    (*out)["cluster.track.writes"] = tracked_writes_.load(std::memory_order_relaxed);
    (*out)["cluster.track.overflows"] = track_overflows_.load(std::memory_order_relaxed);
    (*out)["cluster.chain.applied_seq"] = static_cast<int64_t>(p.seq);
    (*out)["cluster.chain.committed_seq"] = static_cast<int64_t>(member_->committed());
    (*out)["cluster.chain.pending_writes"] = static_cast<int64_t>(member_->pending_writes());
    (*out)["cluster.chain.lag_writes"] = static_cast<int64_t>(member_->lag_writes());
    (*out)["cluster.chain.lag_bytes"] = static_cast<int64_t>(member_->lag_bytes());
    (*out)["cluster.chain.log_bytes"] = static_cast<int64_t>(member_->log_bytes());
    (*out)["cluster.chain.refused_messages"] = static_cast<int64_t>(member_->refused_messages());
    (*out)["cluster.chain.leased"] = member_->lease_held() ? 1 : 0;
    const std::string role = member_->role();
    if ((role == "tail" || role == "single") && !member_->downstream().empty()) {
      // A joiner catching up from this tail: what it still lacks.
      (*out)["cluster.chain.joiner." + member_->downstream() + ".lag_writes"] =
          static_cast<int64_t>(member_->lag_writes());
    }
  }
  {
    std::lock_guard<std::mutex> lock(progress_mu_);
    loading_.Report("cluster.chain.snapshot_from." + loading_.peer + ".", out);
    sending_.Report("cluster.chain.snapshot_to." + sending_.peer + ".", out);
  }
  (*out)["cluster.chain.disk_full"] = disk_full_.load() ? 1 : 0;
  (*out)["cluster.chain.disk_full_leaves"] = disk_full_leaves_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.applied_entries"] = applied_entries_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.apply_batches"] = apply_batches_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.checkpoints"] = checkpoints_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.repairs"] = repairs_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.reads_held"] = reads_held_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.reads_again"] = reads_again_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.log_syncs"] = pipeline_syncs_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.log_file_bytes"] =
      static_cast<int64_t>(log_bytes_.load(std::memory_order_relaxed));
  (*out)["cluster.chain.frames_sent"] = frames_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.frames_failed"] = frames_failed_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.frames_received"] = frames_received_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.snapshots_sent"] = snapshots_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.snapshot_bytes_sent"] =
      snapshot_bytes_sent_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.snapshot_bytes_loaded"] =
      snapshot_bytes_loaded_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.wipes"] = wipes_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.records"] = records_.load(std::memory_order_relaxed);
  (*out)["cluster.chain.evictions"] = evictions_.load(std::memory_order_relaxed);
}

}  // namespace flatkv::server
