// The replicator's peer links (Replicator::PeerLink: one connection per
// neighbour, frames sent in order as oneway peerChain calls), the peerChain
// frame and op codec, and sending the member's messages.
#include <sys/ioctl.h>
#include <linux/sockios.h>

#include <chrono>
#include <deque>

#include <spdlog/spdlog.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>

#include "client/client.h"
#include "server/member/replicator.h"
#include "server/member/replicator_internal.h"
#include "server/thrift_limits.h"

namespace flatkv::server {
namespace {

using apache::thrift::protocol::TBinaryProtocol;
using apache::thrift::transport::TMemoryBuffer;
using partition::ChainEntry;
using partition::ChainMessage;
using partition::ChainOutput;
using replicator_internal::PeerContextOf;
using replicator_internal::PeerOptions;

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

namespace replicator_internal {

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

}  // namespace replicator_internal

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

Replicator::PeerLink::PeerLink(const std::string& address, const ReplicatorOptions& options,
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

Replicator::PeerLink::~PeerLink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Replicator::PeerLink::Push(rpc::ChainFrame frame) {
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

size_t Replicator::PeerLink::FrameBytes(const rpc::ChainFrame& frame) {
  size_t n = 64;
  for (const rpc::ChainEntry& e : frame.entries) n += e.ops.size() + 8 * e.keys.size() + 32;
  return n;
}

// Bytes written to the connection that the neighbour has not taken yet
// (SIOCOUTQ); 0 without a connection. The caller has set sending_.
size_t Replicator::PeerLink::Unsent() const {
  const int fd = conn_.socket_fd();
  int n = 0;
  if (fd < 0 || ioctl(fd, SIOCOUTQ, &n) != 0 || n < 0) return 0;
  return static_cast<size_t>(n);
}

void Replicator::PeerLink::Failed(const Status& st) {
  failed_->fetch_add(1, std::memory_order_relaxed);
  if (conn_.network_failed()) {
    healthy_ = false;
    backoff_ = true;
    spdlog::debug("chain: {} did not take a message: {}", address_, st.ToString());
  }
}

void Replicator::PeerLink::Run() {
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
std::vector<rpc::ChainFrame> Replicator::PeerLink::Coalesce(
    std::deque<rpc::ChainFrame>* queued) {
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

}  // namespace flatkv::server
