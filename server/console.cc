// Implementation notes
//
// The poller thread owns the calls in flight (inflight_, touched by it
// alone); their results land in views_ under mu_, where the HTTP thread
// reads them. A round launches a call for every target that has none in
// flight, waits for them until a deadline shorter than the period, and
// leaves the slow ones running: one stopped member delays nobody's figures.
//
// Ring roles come from two places on purpose: the ring (ZooKeeper's view:
// chain order) and the member's own info().role (its replicator's view,
// which alone knows syncing and fenced). The page colours by the member's
// own role while it answers and by the ring's otherwise.
#include "server/console.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include <spdlog/spdlog.h>

#include "client/client.h"
#include "partition/ring.h"
#include "server/handler.h"

namespace flatkv::server {
namespace {

using Clock = std::chrono::steady_clock;

// How long a round waits for its calls, within the one-second period.
constexpr auto kRoundWait = std::chrono::milliseconds(800);
constexpr auto kPeriod = std::chrono::seconds(1);

// A JSON text written value by value; commas are placed by the writer.
class Json {
 public:
  Json& Begin(char bracket) {
    Comma();
    out_ += bracket;
    first_.push_back(true);
    return *this;
  }
  Json& End(char bracket) {
    out_ += bracket;
    first_.pop_back();
    return *this;
  }
  Json& Key(const std::string& key) {
    Comma();
    Quote(key);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  Json& Int(int64_t v) { return Raw(std::to_string(v)); }
  Json& Bool(bool v) { return Raw(v ? "true" : "false"); }
  Json& Null() { return Raw("null"); }
  Json& Double(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return Raw(buf);
  }
  Json& Str(const std::string& v) {
    Comma();
    Quote(v);
    return *this;
  }
  std::string Done() { return std::move(out_) + "\n"; }

 private:
  Json& Raw(const std::string& text) {
    Comma();
    out_ += text;
    return *this;
  }
  void Comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
  void Quote(const std::string& s) {
    out_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out_ += buf;
      } else {
        out_ += c;
      }
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

int64_t Get(const std::map<std::string, int64_t>& stats, const std::string& key,
            int64_t otherwise = 0) {
  const auto it = stats.find(key);
  return it == stats.end() ? otherwise : it->second;
}

// The share of [lo, hi] (inclusive) that lies in [from, to] (inclusive).
long double Overlap(int64_t lo, int64_t hi, int64_t from, int64_t to) {
  const int64_t a = std::max(lo, from);
  const int64_t b = std::min(hi, to);
  return a > b ? 0 : static_cast<long double>(b) - static_cast<long double>(a) + 1;
}

// The addresses "stats" names in keys "<prefix><address>.<suffix>".
std::vector<std::string> Named(const std::map<std::string, int64_t>& stats,
                               const std::string& prefix, const std::string& suffix) {
  std::vector<std::string> out;
  for (auto it = stats.lower_bound(prefix); it != stats.end(); ++it) {
    const std::string& key = it->first;
    if (key.compare(0, prefix.size(), prefix) != 0) break;
    if (key.size() > prefix.size() + suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(key.substr(prefix.size(), key.size() - prefix.size() - suffix.size()));
    }
  }
  return out;
}

Status StatusOf(const rpc::KvError& e) { return client::FromKvError(e); }

}  // namespace

Console::Console(Handler* handler, const Config& config)
    : handler_(handler), ring_view_(handler->ring_view()), config_(config) {}

Console::~Console() { Stop(); }

void Console::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& [address, call] : inflight_) {
    if (call.valid()) call.wait();
  }
  inflight_.clear();
}

std::string Console::Self() const {
  if (ring_view_ != nullptr) return ring_view_->advertise();
  return config_.server.host + ":" + std::to_string(config_.server.port);
}

bool Console::IsSelf(const std::string& address) const { return address == Self(); }

Console::Sample Console::SampleSelf() const {
  Sample s;
  try {
    handler_->CollectStats(&s.stats);
    handler_->info(s.info);
    s.ok = true;
  } catch (const rpc::KvError& e) {
    s.error = StatusOf(e).ToString();
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  return s;
}

Console::Sample Console::SampleRemote(const std::string& address) const {
  Sample s;
  std::unique_ptr<client::Client> c = ring_view_->Borrow(address);
  Status st = c->Stats(&s.stats);
  if (st.ok()) st = c->Info(&s.info);
  ring_view_->Return(std::move(c));
  s.ok = st.ok();
  if (!st.ok()) s.error = st.ToString();
  return s;
}

std::map<std::string, int64_t> Console::Targets() {
  std::map<std::string, int64_t> now;
  if (ring_view_ == nullptr) {
    now[Self()] = 0;
    return now;
  }
  const auto ring = ring_view_->ring();
  if (ring) {
    for (const partition::Partition& p : ring->partitions()) {
      for (const partition::Member& m : p.chain) now[m.address()] = p.mark;
    }
  }
  const Clock::time_point t = Clock::now();
  for (const auto& [address, mark] : seen_) {
    if (now.count(address) == 0 && gone_.count(address) == 0) gone_[address] = {mark, t};
  }
  for (auto it = gone_.begin(); it != gone_.end();) {
    if (now.count(it->first) != 0 || t - it->second.since > kGoneFor) it = gone_.erase(it);
    else ++it;
  }
  seen_ = now;
  std::map<std::string, int64_t> targets = now;
  for (const auto& [address, g] : gone_) targets.emplace(address, g.mark);
  // Joiners catching up from a tail, which names them: the one it streams
  // a snapshot to, or sends its log to.
  for (const auto& [address, view] : views_) {
    if (!view.last.ok || now.count(address) == 0) continue;
    const auto& stats = view.last.stats;
    for (const std::string& joiner : Named(stats, "cluster.chain.joiner.", ".lag_writes")) {
      targets.emplace(joiner, now[address]);
    }
    for (const std::string& joiner : Named(stats, "cluster.chain.snapshot_to.", ".done")) {
      if (Get(stats, "cluster.chain.snapshot_to." + joiner + ".done") == 0) {
        targets.emplace(joiner, now[address]);
      }
    }
  }
  if (ring && ring->change() != nullptr) targets.emplace(ring->change()->importer, ring->change()->into);
  // This instance, even before it is in the ring.
  targets.emplace(Self(), ring_view_->mark());
  return targets;
}

void Console::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (Clock::now() - wanted_ > kIdleAfter) {
      cv_.wait(lock, [&] { return stop_ || Clock::now() - wanted_ <= kIdleAfter; });
      continue;
    }
    const Clock::time_point start = Clock::now();
    kick_ = false;
    lock.unlock();
    Round();
    lock.lock();
    ++rounds_;
    cv_.notify_all();
    cv_.wait_until(lock, start + kPeriod, [&] { return stop_ || kick_; });
  }
}

void Console::Round() {
  std::map<std::string, int64_t> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    targets = Targets();
    marks_ = targets;
  }
  for (const auto& [address, mark] : targets) {
    std::future<Sample>& call = inflight_[address];
    if (call.valid()) continue;  // still running from an earlier round
    if (IsSelf(address)) {
      call = std::async(std::launch::deferred, [this] { return SampleSelf(); });
    } else {
      call = std::async(std::launch::async, [this, a = address] { return SampleRemote(a); });
    }
  }
  const Clock::time_point deadline = Clock::now() + kRoundWait;
  for (auto it = inflight_.begin(); it != inflight_.end();) {
    std::future<Sample>& call = it->second;
    const bool deferred = call.wait_for(std::chrono::seconds(0)) == std::future_status::deferred;
    if (!deferred && call.wait_until(deadline) != std::future_status::ready) {
      std::lock_guard<std::mutex> lock(mu_);
      View& v = views_[it->first];
      v.answered = false;
      v.error = "no answer within " + std::to_string(kRoundWait.count()) + " ms";
      ++it;
      continue;
    }
    Sample s = call.get();
    std::lock_guard<std::mutex> lock(mu_);
    View& v = views_[it->first];
    v.answered = s.ok;
    v.error = s.error;
    if (s.ok) {
      v.last = std::move(s);
      v.at = Clock::now();
    }
    it = inflight_.erase(it);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = views_.begin(); it != views_.end();) {
    if (targets.count(it->first) == 0) it = views_.erase(it);
    else ++it;
  }
}

namespace {

// A ring change, with the importer's progress if its "stats" are known.
void AddChange(const partition::RingChange& change, const std::map<std::string, int64_t>* stats,
               Json* json) {
  Json& j = *json;
  j.Begin('{');
  j.Key("kind").Str(change.kind);
  j.Key("mark").Int(change.mark);
  j.Key("into").Int(change.into);
  j.Key("source").Int(change.source);
  j.Key("importer").Str(change.importer);
  j.Key("state").Str(change.state);
  j.Key("ranges").Begin('[');
  for (const auto& [lo, hi] : change.ranges) j.Begin('[').Int(lo).Int(hi).End(']');
  j.End(']');
  const bool known = stats != nullptr && stats->count("cluster.import.percent") != 0;
  j.Key("progressKnown").Bool(known);
  if (!known) {
    j.Key("percent").Null();
  } else {
    j.Key("percent").Int(Get(*stats, "cluster.import.percent"));
    j.Key("copied").Bool(Get(*stats, "cluster.import.copied") != 0);
    j.Key("keys").Int(Get(*stats, "cluster.import.keys"));
    j.Key("bytes").Int(Get(*stats, "cluster.import.bytes"));
    j.Key("totalBytes").Int(Get(*stats, "cluster.import.total_bytes"));
    j.Key("bytesPerSec").Int(Get(*stats, "cluster.import.bytes_per_sec"));
  }
  j.End('}');
}

}  // namespace

std::string Console::RingJson() const {
  std::shared_ptr<const partition::Ring> ring =
      ring_view_ != nullptr ? ring_view_->ring()
                          : partition::Ring::Standalone(config_.server.host, config_.server.port);
  Json j;
  j.Begin('{');
  j.Key("self").Str(Self());
  j.Key("standalone").Bool(ring_view_ == nullptr);
  j.Key("selfMark").Int(ring_view_ != nullptr ? ring_view_->mark() : 0);
  j.Key("keyMin").Int(config_.storage.key_min);
  j.Key("keyMax").Int(config_.storage.key_max);
  if (!ring) {
    j.Key("ready").Bool(false);
    j.Key("reason").Str(handler_->NotReady());
    j.End('}');
    return j.Done();
  }
  j.Key("ready").Bool(true);
  j.Key("version").Int(ring->version());
  j.Key("hashBound").Int(ring->settings().hash_bound);
  j.Key("replication").Str(ring->settings().replication);
  // Each mark's ranges, and its shares of the integer keys
  // [key_min, key_max) and of the string hashes [0, hash_bound).
  const std::vector<partition::HashRange> order = ring->KeyOrder();
  const int64_t kmin = config_.storage.key_min;
  const int64_t kmax = config_.storage.key_max - 1;
  const int64_t hmax = ring->settings().hash_bound - 1;
  const long double keys = Overlap(kmin, kmax, kmin, kmax);
  const long double hashes = Overlap(0, hmax, 0, hmax);
  j.Key("marks").Begin('[');
  for (size_t i = 0; i < ring->partitions().size(); ++i) {
    const partition::Partition& p = ring->partitions()[i];
    long double own_keys = 0;
    long double own_hashes = 0;
    j.Begin('{');
    j.Key("mark").Int(p.mark);
    j.Key("markText").Str(std::to_string(p.mark));
    // The ranges as numbers, and as text for JavaScript, whose numbers
    // are doubles (exact only up to 2^53).
    std::vector<std::string> text;
    j.Key("ranges").Begin('[');
    for (const partition::HashRange& r : order) {
      if (r.partition != i) continue;
      j.Begin('[').Int(r.lo).Int(r.hi).End(']');
      text.push_back("[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]");
      own_keys += Overlap(r.lo, r.hi, kmin, kmax);
      own_hashes += Overlap(r.lo, r.hi, 0, hmax);
    }
    j.End(']');
    j.Key("rangesText").Begin('[');
    for (const std::string& t : text) j.Str(t);
    j.End(']');
    j.Key("keyShare").Double(keys > 0 ? static_cast<double>(own_keys / keys) : 0);
    j.Key("stringShare").Double(hashes > 0 ? static_cast<double>(own_hashes / hashes) : 0);
    j.Key("chain").Begin('[');
    for (const partition::Member& m : p.chain) j.Str(m.address());
    j.End(']');
    j.Key("inMarks").Bool(p.in_marks || ring_view_ == nullptr);
    j.End('}');
  }
  j.End(']');
  j.Key("change");
  const partition::RingChange* change = ring->change();
  if (change == nullptr) {
    j.Null();
  } else {
    // The importer's copy, as its stats report it (cluster.import.*).
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = views_.find(change->importer);
    AddChange(*change, it != views_.end() && it->second.last.ok ? &it->second.last.stats : nullptr,
              &j);
  }
  j.End('}');
  return j.Done();
}

std::vector<Console::Entry> Console::Entries(const partition::Ring* ring,
                                             std::map<std::string, std::string>* upstream) const {
  std::vector<Entry> entries;
  std::set<std::string> listed;
  if (ring != nullptr) {
    for (const partition::Partition& p : ring->partitions()) {
      for (size_t i = 0; i < p.chain.size(); ++i) {
        const std::string a = p.chain[i].address();
        entries.push_back({a, p.mark, static_cast<int>(i), ring->RoleOf(p.mark, a), "serving"});
        listed.insert(a);
        if (i > 0) (*upstream)[a] = p.chain[i - 1].address();
      }
    }
  }
  for (const auto& [address, mark] : marks_) {
    if (listed.count(address) != 0) continue;
    std::string state = "joining";
    if (gone_.count(address) != 0) state = "gone";
    else if (ring != nullptr && ring->change() != nullptr && ring->change()->importer == address)
      state = "importing";
    else if (IsSelf(address)) state = "starting";
    entries.push_back({address, mark, -1, "", state});
    listed.insert(address);
  }
  return entries;
}

namespace {

// A member's own figures, from its stats() (docs/application.md, "Operator console").
void AddFigures(const std::map<std::string, int64_t>& s, Json* json) {
  Json& j = *json;
  j.Key("opsPerSec").Int(Get(s, "recent.ops_per_sec"));
  j.Key("p99Micros").Int(Get(s, "recent.p99_us"));
  j.Key("windowMs").Int(Get(s, "recent.window_ms"));
  j.Key("appliedSeq").Int(Get(s, "cluster.chain.applied_seq"));
  j.Key("diskTotalBytes").Int(Get(s, "disk.total_bytes"));
  j.Key("diskFreeBytes").Int(Get(s, "disk.free_bytes"));
  j.Key("liveBytes").Int(Get(s, "engine.live_bytes"));
  j.Key("diskFull").Bool(Get(s, "engine.disk_full") != 0);
  j.Key("compaction").Begin('{');
  j.Key("running").Bool(Get(s, "compaction.running") != 0);
  j.Key("percent").Double(static_cast<double>(Get(s, "compaction.percent_x100")) / 100.0);
  j.Key("bytesReclaimed").Int(Get(s, "compaction.bytes_reclaimed"));
  j.End('}');
  j.Key("snapshot");
  const std::vector<std::string> from = Named(s, "cluster.chain.snapshot_from.", ".percent");
  if (from.empty()) {
    j.Null();
    return;
  }
  const std::string p = "cluster.chain.snapshot_from." + from.front() + ".";
  j.Begin('{');
  j.Key("from").Str(from.front());
  j.Key("percent").Int(Get(s, p + "percent"));
  j.Key("done").Bool(Get(s, p + "done") != 0);
  j.Key("bytesPerSec").Int(Get(s, p + "bytes_per_sec"));
  j.End('}');
}

}  // namespace

std::string Console::MembersJson() {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  const bool idle = now - wanted_ > kIdleAfter || !thread_.joinable();
  wanted_ = now;
  if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { Loop(); });
  cv_.notify_all();
  if (idle) {  // a first look: wait for a round rather than answer blanks
    const uint64_t before = rounds_;
    cv_.wait_until(lock, now + kRoundWait + std::chrono::milliseconds(400),
                   [&] { return stop_ || rounds_ > before; });
  }
  std::shared_ptr<const partition::Ring> ring =
      ring_view_ != nullptr ? ring_view_->ring()
                          : partition::Ring::Standalone(config_.server.host, config_.server.port);
  std::map<std::string, std::string> upstream;  // member -> the member whose lag it is
  const std::vector<Entry> entries = Entries(ring.get(), &upstream);
  // Lag: what a member lacks of its predecessor's log, as the predecessor
  // reports it; a joiner's, as its tail reports it.
  std::map<std::string, int64_t> lag_writes;
  std::map<std::string, int64_t> lag_bytes;
  for (const auto& [address, view] : views_) {
    if (!view.last.ok) continue;
    for (const std::string& j : Named(view.last.stats, "cluster.chain.joiner.", ".lag_writes")) {
      lag_writes[j] = Get(view.last.stats, "cluster.chain.joiner." + j + ".lag_writes");
    }
  }
  for (const auto& [member, up] : upstream) {
    const auto it = views_.find(up);
    if (it == views_.end() || !it->second.last.ok) continue;
    lag_writes[member] = Get(it->second.last.stats, "cluster.chain.lag_writes");
    lag_bytes[member] = Get(it->second.last.stats, "cluster.chain.lag_bytes");
  }
  Json j;
  j.Begin('{');
  j.Key("self").Str(Self());
  j.Key("rounds").Int(static_cast<int64_t>(rounds_));
  j.Key("members").Begin('[');
  for (const Entry& e : entries) {
    const auto it = views_.find(e.address);
    const View* v = it != views_.end() ? &it->second : nullptr;
    const bool answered = v != nullptr && v->answered;
    std::string role = e.state == "gone" ? "gone" : e.ring_role.empty() ? "unknown" : e.ring_role;
    if (answered) role = v->last.info.role;  // its own view: syncing and fenced too
    // A chain member without a ZooKeeper lease refuses every client call:
    // to an operator it is fenced, whatever its place in the chain.
    bool leased = true;
    if (answered && v->last.ok) {
      const auto l = v->last.stats.find("cluster.chain.leased");
      leased = l == v->last.stats.end() || l->second != 0;
    }
    if (!leased && role != "syncing" && role != "gone") role = "fenced";
    j.Begin('{');
    j.Key("address").Str(e.address);
    j.Key("mark").Int(e.mark);
    j.Key("position").Int(e.position);
    j.Key("state").Str(e.state);
    j.Key("ringRole").Str(e.ring_role);
    j.Key("role").Str(role);
    j.Key("reachable").Bool(answered);
    j.Key("leased").Bool(leased);
    j.Key("error").Str(v != nullptr ? v->error : "");
    j.Key("self").Bool(IsSelf(e.address));
    if (v == nullptr || !v->last.ok) {
      j.Key("ageMs").Null();
      j.End('}');
      continue;
    }
    j.Key("ageMs").Int(std::chrono::duration_cast<std::chrono::milliseconds>(now - v->at).count());
    j.Key("writeMode").Str(v->last.info.writeMode == rpc::WriteMode::SAFE ? "safe" : "async");
    j.Key("uptimeSeconds").Int(v->last.info.uptimeSeconds);
    const bool first = e.position == 0;  // a head lacks nothing
    j.Key("lagWrites");
    if (const auto l = lag_writes.find(e.address); l != lag_writes.end()) j.Int(l->second);
    else if (first) j.Int(0);
    else j.Null();
    j.Key("lagBytes");
    if (const auto l = lag_bytes.find(e.address); l != lag_bytes.end()) j.Int(l->second);
    else if (first) j.Int(0);
    else j.Null();
    AddFigures(v->last.stats, &j);
    j.End('}');
  }
  j.End(']');
  j.End('}');
  return j.Done();
}

bool Console::Known(const std::string& address) {
  if (IsSelf(address)) return true;
  if (ring_view_ == nullptr) return false;
  if (const auto ring = ring_view_->ring()) {
    for (const partition::Partition& p : ring->partitions()) {
      for (const partition::Member& m : p.chain) {
        if (m.address() == address) return true;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  return marks_.count(address) != 0;
}

Status Console::OnMember(const std::string& member, const std::function<void()>& local,
                         const std::function<Status(client::Client&)>& remote) {
  if (!Known(member)) {
    return Status::NotFound("member " + member + " is not in the ring this instance sees");
  }
  Status st;
  if (IsSelf(member)) {
    try {
      local();
    } catch (const rpc::KvError& e) {
      st = StatusOf(e);
    } catch (const std::exception& e) {
      st = Status::IOError(e.what());
    }
  } else {
    std::unique_ptr<client::Client> c = ring_view_->Borrow(member);
    st = remote(*c);
    ring_view_->Return(std::move(c));
  }
  Kick();  // the member's new state shows at the page's next refresh
  return st;
}

void Console::Kick() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kick_ = true;
  }
  cv_.notify_all();
}

Status Console::SetWriteMode(const std::string& member, const std::string& token,
                             rpc::WriteMode::type mode) {
  return OnMember(
      member, [&] { handler_->setWriteMode(token, mode); },
      [&](client::Client& c) { return c.SetWriteMode(token, mode); });
}

Status Console::Compact(const std::string& member, const std::string& token) {
  return OnMember(
      member, [&] { handler_->compact(token); },
      [&](client::Client& c) { return c.Compact(token); });
}

Status Console::RemoveMark(const std::string& token, int64_t mark) {
  try {
    handler_->removeMark(token, mark);
    return Status::OK();
  } catch (const rpc::KvError& e) {
    return StatusOf(e);
  }
}

Status Console::AbortChange(const std::string& token) {
  try {
    handler_->abortChange(token);
    return Status::OK();
  } catch (const rpc::KvError& e) {
    return StatusOf(e);
  }
}

}  // namespace flatkv::server
