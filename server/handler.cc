#include "server/handler.h"

#include <cstring>

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>

#include "server/event_server.h"
#include "server/methods.h"

namespace flatkv::server {
namespace {

// Room a frame needs beside the value: the call's name, sequence id, fields.
constexpr uint64_t kFrameOverhead = 4096;

// Moves engine pairs into the wire's.
void ToPairs(std::vector<engine::KeyValue>* in, std::vector<rpc::KvPair>* out) {
  out->resize(in->size());
  for (size_t i = 0; i < in->size(); ++i) {
    (*out)[i].key = (*in)[i].key;
    (*out)[i].value = std::move((*in)[i].value);
  }
}

}  // namespace

// Both tokens are hashed first, so the comparison takes the same time
// whatever their lengths and wherever they first differ.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned char ha[SHA256_DIGEST_LENGTH];
  unsigned char hb[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), ha);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), hb);
  return CRYPTO_memcmp(ha, hb, sizeof(ha)) == 0;
}

rpc::KvError MakeError(rpc::ErrorCode::type code, const std::string& message) {
  rpc::KvError e;
  e.code = code;
  e.message = message;
  return e;
}

void ThrowKvError(const Status& status) { throw ToKvError(status); }

rpc::KvError ToKvError(const Status& status) {
  rpc::ErrorCode::type code = rpc::ErrorCode::STORAGE_ERROR;
  if (status.IsKeyOutOfRange()) code = rpc::ErrorCode::KEY_OUT_OF_RANGE;
  if (status.IsValueTooLarge()) code = rpc::ErrorCode::VALUE_TOO_LARGE;
  if (status.IsInvalidArgument()) code = rpc::ErrorCode::INVALID_ARGUMENT;
  if (status.IsBusy()) code = rpc::ErrorCode::OVERLOADED;
  if (status.IsNotOwner()) code = rpc::ErrorCode::NOT_OWNER;
  if (status.IsUnauthorized()) code = rpc::ErrorCode::UNAUTHORIZED;
  if (status.IsUnavailable()) code = rpc::ErrorCode::UNAVAILABLE;
  // The code travels as ErrorCode: the message is the reason alone.
  return MakeError(code, status.message());
}

Handler::Handler(engine::Store* store, engine::cache::WriteBackCache* cache, const Config& config)
    : store_(store),
      cache_(cache),
      config_(config),
      max_value_bytes_(std::min<uint64_t>(config.storage.max_value_bytes,
                                          config.server.max_frame_bytes - kFrameOverhead)),
      started_(std::chrono::steady_clock::now()),
      backup_(std::make_unique<engine::Backup>(store)) {
  // OpenSSL's one-time setup (its configuration file read; SameToken's
  // first digest needs it) happens here rather than in the first admin
  // call on an I/O thread. It also orders OpenSSL's exit handler after
  // those of whoever builds the handler and stops its threads at exit.
  OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr);
}

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

rpc::KvError Handler::Unexpected(Method method, const char* what) {
  errors_[method].fetch_add(1, std::memory_order_relaxed);
  if (what == nullptr) {
    return MakeError(rpc::ErrorCode::STORAGE_ERROR,
                     std::string(TraitsOf(method).name) + ": unexpected failure");
  }
  spdlog::error("{}: {}", TraitsOf(method).name, what);
  return MakeError(rpc::ErrorCode::STORAGE_ERROR, std::string(TraitsOf(method).name) + ": " + what);
}

Status Handler::ValueSize(size_t size) const {
  if (size <= max_value_bytes_) return Status::OK();
  return Status::ValueTooLarge("value of " + std::to_string(size) + " bytes exceeds the limit of " +
                               std::to_string(max_value_bytes_) +
                               " (storage.max_value_bytes, server.max_frame_bytes)");
}

void Handler::CheckValue(size_t size) const { ThrowIfError(ValueSize(size)); }

void Handler::CheckAdmin(const std::string& token) const {
  if (!config_.admin_token.empty() && !SameToken(token, config_.admin_token)) {
    throw MakeError(rpc::ErrorCode::UNAUTHORIZED, "wrong admin token");
  }
}

template <typename Read>
void Handler::GatedRead(const int64_t* hashes, size_t n, const Read& read) {
  for (size_t i = 0; i < n; ++i) CheckRead(hashes[i]);
  read();
  // Each round waits (CheckRead) until the keys' newest writes are
  // committed; only a key written again within every round fails it.
  constexpr int kRounds = 64;
  for (int round = 0; round < kRounds; ++round) {
    if (ReadCommitted(hashes, n)) return;
    for (size_t i = 0; i < n; ++i) CheckRead(hashes[i]);
    read();
  }
  ThrowKvError(Status::Unavailable("the key was written again during each of " +
                                   std::to_string(kRounds) +
                                   " reads before the chain committed it; read again"));
}

void Handler::LocalGet(rpc::GetResult& result, int64_t key) {
  GatedRead(&key, 1, [&] {
    result = rpc::GetResult();
    Status st = cache_->Get(key, &result.value);
    result.found = st.ok();
    if (st.IsCorruption()) st = RepairRead(key, st, &result);
    if (!st.ok() && !st.IsNotFound()) ThrowKvError(st);
  });
}

void Handler::LocalPut(int64_t key, const std::string& value) {
  CheckValue(value.size());
  if (ChainWrite(kPut, key, {}, value, nullptr)) return;
  Status st = cache_->Put(key, value);
  if (!st.ok()) ThrowKvError(st);
}

bool Handler::LocalRemove(int64_t key) {
  bool existed = false;
  if (ChainWrite(kRemove, key, {}, {}, &existed)) return existed;
  Status st = cache_->Remove(key, &existed);
  if (!st.ok()) ThrowKvError(st);
  return existed;
}

void Handler::LocalAppend(int64_t key, const std::string& value) {
  CheckValue(value.size());
  if (ChainWrite(kAppend, key, {}, value, nullptr)) return;
  Status st = cache_->Append(key, value);
  if (!st.ok()) ThrowKvError(st);
}

void Handler::LocalMultiGet(std::vector<rpc::GetResult>& result,
                            const std::vector<int64_t>& keys) {
  GatedRead(keys.data(), keys.size(), [&] {
    for (int64_t key : keys) ThrowIfError(CheckMoving(key, false));
    // One pass through the cache: each shard locked once, misses read from
    // the Store.
    std::vector<std::string> values;
    std::vector<bool> found;
    Status st = cache_->GetBatch(keys, &values, &found);
    result.clear();
    result.resize(keys.size());
    if (st.IsCorruption()) {
      // A bad record fails only its own key: each key read alone, a bad one
      // repaired from the chain or answered with its error.
      for (size_t i = 0; i < keys.size(); ++i) {
        rpc::GetResult& r = result[i];
        Status one = cache_->Get(keys[i], &r.value);
        r.found = one.ok();
        if (one.IsCorruption()) one = RepairRead(keys[i], one, &r);
        if (!one.ok() && !one.IsNotFound()) {
          if (redo_) ThrowKvError(one);  // run again on a worker (RepairRead)
          const rpc::KvError e = ToKvError(one);
          r.found = false;
          r.value.clear();
          r.__set_errorCode(e.code);
          r.__set_errorMessage(e.message);
        }
      }
      return;
    }
    if (!st.ok()) ThrowKvError(st);
    for (size_t i = 0; i < keys.size(); ++i) {
      result[i].found = found[i];
      result[i].value = std::move(values[i]);
    }
  });
}

void Handler::LocalMultiPut(const std::vector<rpc::KvPair>& pairs) {
  // One pass: every pair is checked first (all or nothing), then the
  // cache writes them as one batch (one engine write per data file).
  std::vector<engine::KeyValueRef> batch(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    CheckValue(pairs[i].value.size());
    batch[i] = {pairs[i].key, pairs[i].value};
    ThrowIfError(CheckMoving(pairs[i].key, true));
  }
  if (ChainWriteBatch(pairs)) return;
  Status st = cache_->PutBatch(batch);
  if (!st.ok()) ThrowKvError(st);
}

void Handler::LocalScan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse,
                        int64_t lo, int64_t hi) {
  if (limit <= 0) throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "scan limit must be positive");
  CheckRead(from);
  // Async writes still in the cache must be visible to scans too.
  Status st = cache_->Flush();
  if (!st.ok()) ThrowKvError(st);
  std::vector<engine::KeyValue> out;
  int64_t next = 0;
  bool done = false;
  st = store_->Scan(from, reverse, static_cast<size_t>(limit), lo, hi, &out, &next, &done);
  if (!st.ok()) ThrowKvError(st);
  ToPairs(&out, &result.pairs);
  result.done = done;
  result.nextKey = next;
}

void Handler::LocalScanLog(rpc::LogScanResult& result, const std::string& cursor,
                           int32_t limit) {
  if (limit <= 0) throw MakeError(rpc::ErrorCode::INVALID_ARGUMENT, "scan limit must be positive");
  CheckRead(0);
  Status st = cache_->Flush();
  if (!st.ok()) ThrowKvError(st);
  std::vector<engine::KeyValue> out;
  bool done = false;
  st = store_->ScanLog(cursor, static_cast<size_t>(limit), &out, &result.cursor, &done);
  if (!st.ok()) ThrowKvError(st);
  ToPairs(&out, &result.pairs);
  result.done = done;
}

// String keys go through the cache too, in the same write mode.
void Handler::LocalSGet(rpc::GetResult& result, const std::string& key) {
  const int64_t hash = StringHash(key);
  GatedRead(&hash, 1, [&] {
    result = rpc::GetResult();
    Status st = cache_->SGet(key, &result.value);
    result.found = st.ok();
    if (st.IsCorruption()) st = RepairStringRead(key, st, &result);
    if (!st.ok() && !st.IsNotFound()) ThrowKvError(st);
  });
}

void Handler::LocalSPut(const std::string& key, const std::string& value) {
  CheckValue(value.size());
  if (ChainWrite(kSPut, 0, key, value, nullptr)) return;
  Status st = cache_->SPut(key, value);
  if (!st.ok()) ThrowKvError(st);
}

bool Handler::LocalSRemove(const std::string& key) {
  bool existed = false;
  if (ChainWrite(kSRemove, 0, key, {}, &existed)) return existed;
  Status st = cache_->SRemove(key, &existed);
  if (!st.ok()) ThrowKvError(st);
  return existed;
}

// The client methods: served here standalone, routed in a ring
// (MemberHandler's Routed() and its batch and scan methods).
void Handler::get(rpc::GetResult& result, int64_t key) {
  Run(kGet, [&] {
    Routed(
        key, false, "peerGet", true, [&] { LocalGet(result, key); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) { c.peerGet(result, ctx, key); });
  });
}

void Handler::put(int64_t key, const std::string& value) {
  Run(kPut, [&] {
    CheckValue(value.size());
    Routed(
        key, true, "peerPut", true, [&] { LocalPut(key, value); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) { c.peerPut(ctx, key, value); });
  });
}

bool Handler::remove(int64_t key) {
  bool existed = false;
  Run(kRemove, [&] {
    Routed(
        key, true, "peerRemove", true, [&] { existed = LocalRemove(key); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) {
          existed = c.peerRemove(ctx, key);
        });
  });
  return existed;
}

void Handler::append(int64_t key, const std::string& value) {
  Run(kAppend, [&] {
    CheckValue(value.size());
    // Never retried on a fresh connection: it is not idempotent.
    Routed(
        key, true, "peerAppend", false, [&] { LocalAppend(key, value); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) { c.peerAppend(ctx, key, value); });
  });
}

void Handler::multiGet(std::vector<rpc::GetResult>& result, const std::vector<int64_t>& keys) {
  Run(kMultiGet, [&] { LocalMultiGet(result, keys); });
}

void Handler::multiPut(const std::vector<rpc::KvPair>& pairs) {
  Run(kMultiPut, [&] { LocalMultiPut(pairs); });
}

void Handler::scan(rpc::ScanResult& result, int64_t from, int32_t limit, bool reverse) {
  Run(kScan, [&] { LocalScan(result, from, limit, reverse, INT64_MIN, INT64_MAX); });
}

void Handler::scanLog(rpc::LogScanResult& result, const std::string& cursor, int32_t limit) {
  Run(kScanLog, [&] { LocalScanLog(result, cursor, limit); });
}

void Handler::sget(rpc::GetResult& result, const std::string& key) {
  Run(kSGet, [&] {
    Routed(
        StringHash(key), false, "peerSGet", true, [&] { LocalSGet(result, key); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) { c.peerSGet(result, ctx, key); });
  });
}

void Handler::sput(const std::string& key, const std::string& value) {
  Run(kSPut, [&] {
    CheckValue(value.size());
    Routed(
        StringHash(key), true, "peerSPut", true, [&] { LocalSPut(key, value); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) { c.peerSPut(ctx, key, value); });
  });
}

bool Handler::sremove(const std::string& key) {
  bool existed = false;
  Run(kSRemove, [&] {
    Routed(
        StringHash(key), true, "peerSRemove", true, [&] { existed = LocalSRemove(key); },
        [&](rpc::FlatKVClient& c, const rpc::PeerContext& ctx) {
          existed = c.peerSRemove(ctx, key);
        });
  });
  return existed;
}

void Handler::ring(rpc::RingInfo& result) {
  Run(kRing, [&] {
    result.version = 0;
    result.hashBound = config_.cluster.hash_bound;
    result.replication = config_.cluster.replication;
    rpc::Member self;
    self.host = config_.server.host;
    self.port = config_.server.port;
    rpc::Partition p;
    p.mark = 0;
    p.chain.push_back(self);
    result.partitions = {p};
  });
}

// A standalone instance is not a member of a ring: the calls only a ring
// member answers are refused.
namespace {

[[noreturn]] void NotAMember(const char* method) {
  ThrowKvError(Status::NotOwner(std::string(method) +
                                ": this instance is standalone, not a member of a ring"));
}

}  // namespace

void Handler::peerGet(rpc::GetResult&, const rpc::PeerContext&, int64_t) {
  Run(kPeerGet, [] { NotAMember("peerGet"); });
}
void Handler::peerPut(const rpc::PeerContext&, int64_t, const std::string&) {
  Run(kPeerPut, [] { NotAMember("peerPut"); });
}
bool Handler::peerRemove(const rpc::PeerContext&, int64_t) {
  Run(kPeerRemove, [] { NotAMember("peerRemove"); });
  return false;
}
void Handler::peerAppend(const rpc::PeerContext&, int64_t, const std::string&) {
  Run(kPeerAppend, [] { NotAMember("peerAppend"); });
}
void Handler::peerMultiGet(std::vector<rpc::GetResult>&, const rpc::PeerContext&,
                           const std::vector<int64_t>&) {
  Run(kPeerMultiGet, [] { NotAMember("peerMultiGet"); });
}
void Handler::peerMultiPut(const rpc::PeerContext&, const std::vector<rpc::KvPair>&) {
  Run(kPeerMultiPut, [] { NotAMember("peerMultiPut"); });
}
void Handler::peerScan(rpc::ScanResult&, const rpc::PeerContext&, int64_t, int32_t, bool, int64_t,
                       int64_t) {
  Run(kPeerScan, [] { NotAMember("peerScan"); });
}
void Handler::peerScanLog(rpc::LogScanResult&, const rpc::PeerContext&, const std::string&,
                          int32_t) {
  Run(kPeerScanLog, [] { NotAMember("peerScanLog"); });
}
void Handler::peerSGet(rpc::GetResult&, const rpc::PeerContext&, const std::string&) {
  Run(kPeerSGet, [] { NotAMember("peerSGet"); });
}
void Handler::peerSPut(const rpc::PeerContext&, const std::string&, const std::string&) {
  Run(kPeerSPut, [] { NotAMember("peerSPut"); });
}
bool Handler::peerSRemove(const rpc::PeerContext&, const std::string&) {
  Run(kPeerSRemove, [] { NotAMember("peerSRemove"); });
  return false;
}
void Handler::peerChain(const rpc::PeerContext&, const std::string& from,
                        const rpc::ChainFrame&) {
  try {
    Run(kPeerChain, [] { NotAMember("peerChain"); });
  } catch (const rpc::KvError& e) {  // a oneway call: only the log hears of it
    WarnRateLimited("chain: refused a message from " + from + ": " + e.message);
  }
}
int64_t Handler::peerSnapshot(const rpc::PeerContext&, const std::string&,
                              const rpc::SnapshotPage&) {
  Run(kPeerSnapshot, [] { NotAMember("peerSnapshot"); });
  return 0;
}
void Handler::peerRepair(rpc::GetResult&, const rpc::PeerContext&, int64_t) {
  Run(kPeerRepair, [] { NotAMember("peerRepair"); });
}
void Handler::peerBucket(std::string&, const rpc::PeerContext&, int64_t, int64_t, bool) {
  Run(kPeerBucket, [] { NotAMember("peerBucket"); });
}
void Handler::peerExport(rpc::ExportPage&, const rpc::PeerContext&, int64_t, int64_t,
                         const std::string&, int32_t) {
  Run(kPeerExport, [] { NotAMember("peerExport"); });
}
void Handler::peerFence(const rpc::PeerContext&) {
  Run(kPeerFence, [] { NotAMember("peerFence"); });
}
void Handler::peerTrack(rpc::TrackToken&, const rpc::PeerContext&, int64_t) {
  Run(kPeerTrack, [] { NotAMember("peerTrack"); });
}
void Handler::peerDelta(rpc::DeltaPage&, const rpc::PeerContext&, const rpc::TrackToken&,
                        const std::string&, int32_t) {
  Run(kPeerDelta, [] { NotAMember("peerDelta"); });
}
int64_t Handler::peerDrop(const rpc::PeerContext&, int64_t, int64_t, int32_t) {
  Run(kPeerDrop, [] { NotAMember("peerDrop"); });
  return 0;
}

void Handler::removeMark(const std::string& token, int64_t) {
  Run(kRemoveMark, [&] {
    CheckAdmin(token);
    ThrowKvError(Status::InvalidArgument("removeMark: this instance is not a ring member"));
  });
}

void Handler::abortChange(const std::string& token) {
  Run(kAbortChange, [&] {
    CheckAdmin(token);
    ThrowKvError(Status::InvalidArgument("abortChange: this instance is not a ring member"));
  });
}

thread_local Handler::Retry Handler::retry_;
thread_local bool Handler::redo_ = false;

void Handler::RunAsRetry(std::chrono::steady_clock::time_point start,
                         const std::function<void()>& run) {
  retry_.active = true;
  retry_.refresh = true;
  retry_.start = start;
  run();
  retry_ = Retry();  // whatever the call did not consume
}

void Handler::Finish(Method method, std::chrono::steady_clock::time_point start, bool error) {
  latency_[method].Record(std::chrono::steady_clock::now() - start);
  if (error) errors_[method].fetch_add(1, std::memory_order_relaxed);
}

// Standalone: every call is this store's, none blocks on another instance.
bool Handler::MayBlock(const uint8_t*, uint32_t) const { return false; }

int64_t Handler::StringHash(const std::string&) const { return 0; }

std::string Handler::NotReady() const { return ""; }

void Handler::Routed(int64_t, bool, const char*, bool, const std::function<void()>& local,
                     const RemoteCall&) {
  local();
}

Status Handler::RepairBucket(int64_t slot, std::string*) {
  return Status::Corruption("string-key bucket " + std::to_string(slot) +
                            ": no other member holds a copy");
}

std::string Handler::Degraded() const {
  std::string full = store_->DiskFull();
  if (!full.empty()) return "disk full: writes fail (" + full + "); reads are served";
  if (cache_->stats().flush_failing) {
    return "the cache cannot write its dirty entries (see the log); writes are written through";
  }
  return "";
}

std::vector<NamedLatency> Handler::latencies() const {
  std::vector<NamedLatency> out;
  for (int m = 0; m < kMethods; ++m) {
    out.emplace_back(TraitsOf(static_cast<Method>(m)).name, &latency_[m]);
  }
  return out;
}

}  // namespace flatkv::server
