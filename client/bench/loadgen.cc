// flatkv-loadgen: the load generator the server is measured against Redis
// with, written the way an application team writes a client, not the
// way flatkv-bench drives the server: one thread per connection, each making
// blocking calls one after another, FlatKV through the Thrift-generated C++
// client (TSocket + TFramedTransport + TBinaryProtocol, FlatKVClient) and
// Redis through hiredis (redisCommand). The same threads, keys, values and
// latency histogram serve both targets, so their figures compare.
//
//   flatkv-loadgen --target flatkv|redis [--host H] [--port P] [--threads T]
//                  [--workload fill,put,get,mput,mget] [--ops N] [--num K]
//                  [--value-size B] [--batch M] [--seed S]
//
// Workloads, each timed on its own (all threads connect first, then start
// together; the time runs until the last thread finishes):
//   fill  every key of [0, K) once, the threads taking contiguous shares
//   put   N writes of uniform keys in [0, K)
//   get   N reads of uniform keys in [0, K): each value found is checked
//         against what fill and put write for its key (its 8-byte key and a
//         filler derived from it), so a wrong value counts as an error
//   mput  N batch writes of M uniform keys each: FlatKV multiPut, Redis MSET
//   mget  N batch reads of M uniform keys each: FlatKV multiGet, Redis MGET,
//         every value checked as for get
// FlatKV keys are the integers; Redis keys are their decimal strings.
//
// Prints one JSON line per workload: target, workload, threads, ops (calls),
// keys (ops times the batch size for mput and mget), seconds, ops_per_sec
// (calls a second), p50_us, p99_us, p999_us, max_us, mean_us (per call),
// errors, found (keys read that were found), value_size, num, batch, and
// client_cpu_us (this process's user + system CPU time for the workload,
// from getrusage: with the generator pinned to its own cores, it tells
// whether the generator or the server was the limit). Exit status 0; 1 if
// any call failed (an error reply, a lost connection, a wrong value: the
// first few are printed); 2 for a bad command line.
#include <hiredis/hiredis.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/transport/TBufferTransports.h>
#include <thrift/transport/TSocket.h>

#include "FlatKV.h"
#include "client/bench/bench_histogram.h"

namespace {

using flatkv::client::LatencyHistogram;

struct Flags {
  std::string target;
  std::string host = "127.0.0.1";
  int port = 0;  // 0: 9901 for flatkv, 6379 for redis
  int threads = 50;
  std::vector<std::string> workloads = {"fill", "put", "get"};
  uint64_t ops = 200000;
  uint64_t num = 100000;
  size_t value_size = 100;
  uint64_t batch = 10;  // keys per mput / mget call
  uint64_t seed = 301;
};

// The value written for "key": its 8 bytes (little-endian), then a filler
// that depends on the key, so a value read back under another key fails.
// Byte i >= 8 is 'a' + (key + i) % 26: a slice of a repeating alphabet,
// copied rather than computed byte by byte (a 4 KiB value computed that way
// cost the generator several microseconds a call).
std::string ValueFor(uint64_t key, size_t size) {
  static const std::string kAlphabets = [] {
    std::string a;
    for (int i = 0; i < 26 * 2 + 64; ++i) a.push_back(static_cast<char>('a' + i % 26));
    return a;
  }();
  std::string v(size, '\0');
  for (size_t i = 0; i < size && i < 8; ++i) v[i] = static_cast<char>(key >> (8 * i));
  for (size_t i = 8; i < size;) {
    const size_t from = (key + i) % 26;
    const size_t n = std::min(size - i, kAlphabets.size() - from) / 26 * 26;
    const size_t take = n > 0 ? n : size - i;
    std::memcpy(&v[i], kAlphabets.data() + from, take);
    i += take;
  }
  return v;
}

// One connection and the two calls the workloads make. Errors are thrown
// as std::exception (Thrift's own, or runtime_error for Redis).
class Conn {
 public:
  virtual ~Conn() = default;
  virtual void Put(uint64_t key, const std::string& value) = 0;
  // Returns whether the key was found, its value in *value.
  virtual bool Get(uint64_t key, std::string* value) = 0;
  // One call writing every pair (keys[i], values[i]).
  virtual void MultiPut(const std::vector<uint64_t>& keys,
                        const std::vector<std::string>& values) = 0;
  // One call reading every key: (*found)[i] and (*values)[i] for keys[i].
  virtual void MultiGet(const std::vector<uint64_t>& keys, std::vector<std::string>* values,
                        std::vector<bool>* found) = 0;
};

class FlatKVConn : public Conn {
 public:
  FlatKVConn(const std::string& host, int port) {
    using namespace apache::thrift;
    auto socket = std::make_shared<transport::TSocket>(host, port);
    socket->setConnTimeout(5000);
    socket->setRecvTimeout(30000);
    socket->setSendTimeout(30000);
    transport_ = std::make_shared<transport::TFramedTransport>(socket);
    client_ = std::make_unique<flatkv::rpc::FlatKVClient>(
        std::make_shared<protocol::TBinaryProtocol>(transport_));
    transport_->open();
  }
  ~FlatKVConn() override {
    try {
      transport_->close();
    } catch (const std::exception&) {
    }
  }
  void Put(uint64_t key, const std::string& value) override {
    client_->put(static_cast<int64_t>(key), value);
  }
  bool Get(uint64_t key, std::string* value) override {
    client_->get(result_, static_cast<int64_t>(key));
    if (result_.found) value->swap(result_.value);
    return result_.found;
  }
  void MultiPut(const std::vector<uint64_t>& keys,
                const std::vector<std::string>& values) override {
    pairs_.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      pairs_[i].key = static_cast<int64_t>(keys[i]);
      pairs_[i].value = values[i];
    }
    client_->multiPut(pairs_);
  }
  void MultiGet(const std::vector<uint64_t>& keys, std::vector<std::string>* values,
                std::vector<bool>* found) override {
    ikeys_.assign(keys.begin(), keys.end());
    client_->multiGet(results_, ikeys_);
    if (results_.size() != keys.size()) {
      throw std::runtime_error("multiGet: " + std::to_string(results_.size()) + " results for " +
                               std::to_string(keys.size()) + " keys");
    }
    values->resize(keys.size());
    found->assign(keys.size(), false);
    for (size_t i = 0; i < keys.size(); ++i) {
      (*found)[i] = results_[i].found;
      (*values)[i].swap(results_[i].value);
    }
  }

 private:
  std::shared_ptr<apache::thrift::transport::TTransport> transport_;
  std::unique_ptr<flatkv::rpc::FlatKVClient> client_;
  flatkv::rpc::GetResult result_;
  std::vector<flatkv::rpc::KvPair> pairs_;
  std::vector<int64_t> ikeys_;
  std::vector<flatkv::rpc::GetResult> results_;
};

class RedisConn : public Conn {
 public:
  RedisConn(const std::string& host, int port) {
    timeval timeout{5, 0};
    ctx_ = redisConnectWithTimeout(host.c_str(), port, timeout);
    if (ctx_ == nullptr || ctx_->err != 0) {
      std::string why = ctx_ == nullptr ? "out of memory" : ctx_->errstr;
      if (ctx_ != nullptr) redisFree(ctx_);
      throw std::runtime_error("connect " + host + ":" + std::to_string(port) + ": " + why);
    }
    timeval io{30, 0};
    redisSetTimeout(ctx_, io);
  }
  ~RedisConn() override { redisFree(ctx_); }
  void Put(uint64_t key, const std::string& value) override {
    const std::string k = std::to_string(key);
    Reply r(Call("SET %b %b", k.data(), k.size(), value.data(), value.size()));
    if (r->type != REDIS_REPLY_STATUS) throw std::runtime_error("SET: " + Describe(r.get()));
  }
  bool Get(uint64_t key, std::string* value) override {
    const std::string k = std::to_string(key);
    Reply r(Call("GET %b", k.data(), k.size()));
    if (r->type == REDIS_REPLY_NIL) return false;
    if (r->type != REDIS_REPLY_STRING) throw std::runtime_error("GET: " + Describe(r.get()));
    value->assign(r->str, r->len);
    return true;
  }
  void MultiPut(const std::vector<uint64_t>& keys,
                const std::vector<std::string>& values) override {
    Args("MSET");
    for (size_t i = 0; i < keys.size(); ++i) {
      AddKey(keys[i]);
      Add(values[i]);
    }
    Reply r(CallArgs());
    if (r->type != REDIS_REPLY_STATUS) throw std::runtime_error("MSET: " + Describe(r.get()));
  }
  void MultiGet(const std::vector<uint64_t>& keys, std::vector<std::string>* values,
                std::vector<bool>* found) override {
    Args("MGET");
    for (uint64_t key : keys) AddKey(key);
    Reply r(CallArgs());
    if (r->type != REDIS_REPLY_ARRAY || r->elements != keys.size()) {
      throw std::runtime_error("MGET: " + Describe(r.get()));
    }
    values->resize(keys.size());
    found->assign(keys.size(), false);
    for (size_t i = 0; i < keys.size(); ++i) {
      const redisReply* e = r->element[i];
      if (e->type == REDIS_REPLY_NIL) continue;
      if (e->type != REDIS_REPLY_STRING) throw std::runtime_error("MGET: " + Describe(e));
      (*found)[i] = true;
      (*values)[i].assign(e->str, e->len);
    }
  }

 private:
  struct FreeReply {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using Reply = std::unique_ptr<redisReply, FreeReply>;

  template <typename... Args>
  redisReply* Call(const char* format, Args... args) {
    void* reply = redisCommand(ctx_, format, args...);
    if (reply == nullptr) throw std::runtime_error(std::string("connection: ") + ctx_->errstr);
    return static_cast<redisReply*>(reply);
  }
  static std::string Describe(const redisReply* r) {
    if (r->type == REDIS_REPLY_ERROR) return std::string(r->str, r->len);
    return "unexpected reply type " + std::to_string(r->type);
  }
  // An argument vector for redisCommandArgv, kept between calls: the
  // command name, then keys (decimal, as Put and Get send them) and values.
  void Args(const char* command) {
    strings_.clear();
    strings_.emplace_back(command);
  }
  void AddKey(uint64_t key) { strings_.push_back(std::to_string(key)); }
  void Add(const std::string& value) { strings_.push_back(value); }
  redisReply* CallArgs() {
    argv_.clear();
    lens_.clear();
    for (const std::string& a : strings_) {
      argv_.push_back(a.data());
      lens_.push_back(a.size());
    }
    void* reply = redisCommandArgv(ctx_, static_cast<int>(argv_.size()), argv_.data(),
                                   lens_.data());
    if (reply == nullptr) throw std::runtime_error(std::string("connection: ") + ctx_->errstr);
    return static_cast<redisReply*>(reply);
  }

  redisContext* ctx_ = nullptr;
  std::vector<std::string> strings_;
  std::vector<const char*> argv_;
  std::vector<size_t> lens_;
};

// This process's user + system CPU time so far, in seconds.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Starts the threads together: each calls Arrive() once connected, and
// the last one in records the start time and lets them all go.
class StartLine {
 public:
  explicit StartLine(int n) : waiting_(n) {}
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--waiting_ == 0) {
      start_ = std::chrono::steady_clock::now();
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return waiting_ == 0; });
    }
  }
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_;
  std::chrono::steady_clock::time_point start_;
};

struct ThreadResult {
  LatencyHistogram hist;
  uint64_t ops = 0;
  uint64_t keys = 0;
  uint64_t errors = 0;
  uint64_t found = 0;
  std::vector<std::string> messages;  // the first errors, to print
  std::chrono::steady_clock::time_point end;
};

void NoteError(ThreadResult* r, const std::string& what) {
  ++r->errors;
  if (r->messages.size() < 3) r->messages.push_back(what);
}

// One thread's share of "workload" over its own connection.
void RunThread(const Flags& f, const std::string& workload, int index, StartLine* line,
               ThreadResult* r) {
  std::unique_ptr<Conn> conn;
  try {
    if (f.target == "flatkv") conn = std::make_unique<FlatKVConn>(f.host, f.port);
    else conn = std::make_unique<RedisConn>(f.host, f.port);
  } catch (const std::exception& e) {
    NoteError(r, std::string("connect: ") + e.what());
  }
  line->Arrive();
  if (conn == nullptr) return;

  const uint64_t n = static_cast<uint64_t>(f.threads);
  const uint64_t i = static_cast<uint64_t>(index);
  // fill: keys [first, last); the others: a share of --ops, keys drawn.
  const uint64_t total = workload == "fill" ? f.num : f.ops;
  const uint64_t first = total * i / n;
  const uint64_t last = total * (i + 1) / n;
  // Each workload draws its own keys.
  const uint64_t stream = workload == "put"    ? 1
                          : workload == "get"  ? 2
                          : workload == "mput" ? 3
                                               : 4;
  std::mt19937_64 rng(f.seed * 1000003 + stream * 104729 + i * 7919);
  std::uniform_int_distribution<uint64_t> pick(0, f.num - 1);
  const bool batch = workload == "mput" || workload == "mget";
  std::string got;
  std::vector<uint64_t> keys;
  std::vector<std::string> values;
  std::vector<bool> found;
  for (uint64_t op = first; op < last; ++op) {
    keys.clear();
    if (workload == "fill") keys.push_back(op);
    else for (uint64_t k = 0; k < (batch ? f.batch : 1); ++k) keys.push_back(pick(rng));
    if (workload == "put" || workload == "fill") got = ValueFor(keys[0], f.value_size);
    if (workload == "mput") {
      values.resize(keys.size());
      for (size_t k = 0; k < keys.size(); ++k) values[k] = ValueFor(keys[k], f.value_size);
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (workload == "get") {
        found.assign(1, conn->Get(keys[0], &got));
      } else if (workload == "mget") {
        conn->MultiGet(keys, &values, &found);
      } else if (workload == "mput") {
        conn->MultiPut(keys, values);
      } else {
        conn->Put(keys[0], got);
      }
    } catch (const std::exception& e) {
      NoteError(r, workload + " " + std::to_string(keys[0]) + ": " + e.what());
      if (r->errors >= 100) break;  // the connection is likely gone
      found.clear();
    }
    const auto t1 = std::chrono::steady_clock::now();
    r->hist.Record(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    ++r->ops;
    r->keys += keys.size();
    if (workload != "get" && workload != "mget") continue;
    // Checked after the clock stopped: the check is the generator's work.
    for (size_t k = 0; k < found.size(); ++k) {
      if (!found[k]) continue;
      ++r->found;
      const std::string& v = workload == "get" ? got : values[k];
      if (v != ValueFor(keys[k], f.value_size)) {
        NoteError(r, workload + " " + std::to_string(keys[k]) + ": a wrong value of " +
                         std::to_string(v.size()) + " bytes");
      }
    }
  }
  r->end = std::chrono::steady_clock::now();
}

// Runs one workload on every thread; prints its JSON line. Returns the
// number of errors.
uint64_t RunWorkload(const Flags& f, const std::string& workload) {
  const double cpu_before = CpuSeconds();
  StartLine line(f.threads);
  std::vector<ThreadResult> results(static_cast<size_t>(f.threads));
  std::vector<std::thread> threads;
  threads.reserve(results.size());
  for (int t = 0; t < f.threads; ++t) {
    threads.emplace_back(RunThread, std::cref(f), std::cref(workload), t, &line, &results[t]);
  }
  for (auto& t : threads) t.join();
  const double cpu = CpuSeconds() - cpu_before;

  LatencyHistogram hist;
  uint64_t ops = 0, keys = 0, errors = 0, found = 0;
  auto end = line.start();
  for (const auto& r : results) {
    hist.Merge(r.hist);
    ops += r.ops;
    keys += r.keys;
    errors += r.errors;
    found += r.found;
    if (r.end > end) end = r.end;
    for (const auto& m : r.messages) std::fprintf(stderr, "flatkv-loadgen: %s\n", m.c_str());
  }
  const double seconds = std::chrono::duration<double>(end - line.start()).count();
  auto us = [](uint64_t ns) { return static_cast<double>(ns) / 1000.0; };
  std::printf(
      "{\"tool\": \"flatkv-loadgen\", \"target\": \"%s\", \"workload\": \"%s\", "
      "\"threads\": %d, \"ops\": %" PRIu64 ", \"seconds\": %.3f, \"ops_per_sec\": %.0f, "
      "\"p50_us\": %.1f, \"p99_us\": %.1f, \"p999_us\": %.1f, \"max_us\": %.1f, "
      "\"mean_us\": %.1f, \"errors\": %" PRIu64 ", \"found\": %" PRIu64
      ", \"value_size\": %zu, \"num\": %" PRIu64 ", \"keys\": %" PRIu64
      ", \"batch\": %" PRIu64 ", \"client_cpu_us\": %.0f}\n",
      f.target.c_str(), workload.c_str(), f.threads, ops, seconds,
      seconds > 0 ? static_cast<double>(ops) / seconds : 0.0, us(hist.Percentile(0.5)),
      us(hist.Percentile(0.99)), us(hist.Percentile(0.999)), us(hist.max()), hist.Mean() / 1000.0,
      errors, found, f.value_size, f.num, keys,
      workload == "mput" || workload == "mget" ? f.batch : uint64_t{1}, cpu * 1e6);
  std::fflush(stdout);
  return errors;
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "flatkv-loadgen: %s\nusage: flatkv-loadgen --target flatkv|redis [--host H] "
               "[--port P] [--threads T] [--workload fill,put,get,mput,mget] [--ops N] "
               "[--num K] [--value-size B] [--batch M] [--seed S]\n",
               why.c_str());
  return 2;
}

bool ParseU64(const char* s, uint64_t* v) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || s[0] == '-') return false;
  *v = x;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      Usage("one blocking connection per thread, against flatkv-server or Redis");
      return 0;
    }
    if (i + 1 >= argc) return Usage("missing value for " + a);
    const std::string v = argv[++i];
    uint64_t x = 0;
    if (a == "--target") {
      if (v != "flatkv" && v != "redis") return Usage("--target: flatkv or redis, not " + v);
      f.target = v;
      continue;
    }
    if (a == "--host") {
      f.host = v;
      continue;
    }
    if (a == "--workload") {
      f.workloads.clear();
      size_t start = 0;
      while (start <= v.size()) {
        size_t comma = v.find(',', start);
        if (comma == std::string::npos) comma = v.size();
        const std::string w = v.substr(start, comma - start);
        if (w != "fill" && w != "put" && w != "get" && w != "mput" && w != "mget") {
          return Usage("unknown workload '" + w + "'");
        }
        f.workloads.push_back(w);
        start = comma + 1;
      }
      continue;
    }
    if (!ParseU64(v.c_str(), &x)) return Usage("not a number: " + a + " " + v);
    if (a == "--port" && x > 0 && x < 65536) f.port = static_cast<int>(x);
    else if (a == "--threads" && x > 0 && x <= 4096) f.threads = static_cast<int>(x);
    else if (a == "--ops" && x > 0) f.ops = x;
    else if (a == "--num" && x > 0) f.num = x;
    else if (a == "--value-size" && x >= 8 && x <= (64u << 20)) f.value_size = x;
    else if (a == "--batch" && x > 0 && x <= 100000) f.batch = x;
    else if (a == "--seed") f.seed = x;
    else return Usage("bad option or value: " + a + " " + v);
  }
  if (f.target.empty()) return Usage("--target is required");
  if (f.port == 0) f.port = f.target == "flatkv" ? 9901 : 6379;

  uint64_t errors = 0;
  for (const auto& w : f.workloads) errors += RunWorkload(f, w);
  return errors == 0 ? 0 : 1;
}
