// `flatkv-bench server`: drives a running flatkv-server over many connections
// and reports throughput and per-call latency, like redis-benchmark does for
// Redis (see client/bench/README.md, "Server mode").
//
//   flatkv-bench server --host 127.0.0.1 --port 9901 --clients 50 --ops 100000
//       --value-size 100 --workload fill,get,readheavy [--keys zipf] [--batch 100]
//
// The driver is event-driven so that it costs the machine little CPU when it
// shares it with the server: --threads T threads (default 1), each running
// an epoll loop over its share of the --clients nonblocking TCP connections.
// Every connection keeps exactly one call in flight (a closed loop, like
// redis-benchmark without -P): when an answer arrives, the next call goes out
// on that connection. Calls are encoded with the generated Thrift client's
// send_<method>() into a reused memory buffer (framed, binary protocol) and
// answers decoded with recv_<method>() from another, so an op allocates
// nothing beyond what Thrift itself does.
//
// Workloads (each does --ops ops, except fill; with --batch K > 1 a call
// carries K keys: gets become multiGet and puts multiPut, and ops count keys):
//
//   fill        put keys 0..num-1 ascending, each once (num ops); thread t
//               takes the t-th slice, its connections the next K keys each
//   put         write-only: 100% puts of keys drawn from [0, num)
//   get         100% gets of keys drawn from [0, num)
//   readheavy   90% gets / 10% puts (YCSB B-like), per call
//   writeheavy  10% gets / 90% puts, per call
//
// Keys are drawn uniformly (--keys uniform, the default) or from Zipf(0.99)
// over [0, num) (--keys zipf; ZipfTable of bench_workload.h). --num defaults
// to --ops. Gets should read keys that exist: run fill first, in the same
// list (`--workload fill,get`) or in an earlier run against the same server.
//
// Answers are checked. A get of a key this run has seen acknowledged as
// written (by fill or put, before the get was sent) must be found with
// --value-size bytes; a KvError answer (or a TApplicationException) counts
// the keys of its call as errors. Either makes the exit status 1, and the
// first such message goes to stderr. A transport failure (refused, reset,
// closed, timed out, a malformed answer) stops the run at once: exit 1 with
// a message naming the connection and host:port.
//
// With --zk HOSTS (and --path, default /flatkv) it drives a ring instead:
// it reads the ring once from ZooKeeper and routes every key straight to the
// member that serves it (partition::Router, as RingClient does), each
// connection holding one socket per member it calls; a batch is split by
// owner and its parts sent together. --host/--port are then unused.
//
// Thread safety: RunServerBench starts and joins its own threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "client/bench/bench_workload.h"

namespace flatkv::client {

enum class ServerWorkload { kFill, kPut, kGet, kReadHeavy, kWriteHeavy };

// Parses a workload name as spelled on the command line; false if unknown.
bool ParseServerWorkload(std::string_view name, ServerWorkload* workload);
const char* ServerWorkloadName(ServerWorkload workload);
// "fill|put|get|readheavy|writeheavy", for usage and error messages.
const char* ServerWorkloadNameList();
// Share of calls that are gets, in percent (fill and put 0, get 100).
int ServerWorkloadGetPercent(ServerWorkload workload);

enum class KeyDistribution { kUniform, kZipf };

// Parses "uniform" | "zipf"; false on anything else.
bool ParseKeyDistribution(std::string_view name, KeyDistribution* distribution);
const char* KeyDistributionName(KeyDistribution distribution);

// Everything `flatkv-bench server` takes from the command line (parsed by
// ParseBenchFlags, client/bench/bench_flags.h), with its defaults.
struct ServerBenchFlags {
  std::string host = "127.0.0.1";                 // --host (name or address)
  int port = 9901;                                // --port
  std::string zk;                                 // --zk: a ring's ZooKeeper hosts
  std::string zk_path = "/flatkv";                // --path: its service path
  int clients = 50;                               // --clients: connections
  int threads = 1;                                // --threads: epoll loops, <= clients
  uint64_t ops = 100000;                          // --ops per workload (keys, not calls)
  uint64_t num = 0;                               // --num: key space [0, num); 0 = ops
  uint32_t value_size = 100;                      // --value-size in bytes
  uint32_t batch = 1;                             // --batch: keys per call
  KeyDistribution keys = KeyDistribution::kUniform;  // --keys uniform|zipf
  // --key-dist dense|random|snowflake, --key-min, --key-max,
  // --snowflake-rate: the integer key each index of [0, num) is sent as
  // (KeySpace in bench_workload.h; its seed is --seed).
  KeySpace space;
  std::vector<ServerWorkload> workloads;          // --workload, run in order
  uint64_t seed = 301;                            // --seed for keys and values
  bool json = false;                              // --json: one JSON object per line
  int timeout_ms = 30000;                         // --timeout-ms: connect, and the
                                                  // longest wait for any answer
  // --tls-ca: connect over TLS, verifying the server against these CAs;
  // --tls-cert/--tls-key: a client certificate.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

// The key space of a run: flags.num, or flags.ops when num is 0.
uint64_t ServerKeySpace(const ServerBenchFlags& flags);

// Connects flags.clients connections to the server, runs the workloads in
// order over them and prints one line per workload to stdout (text, or JSON
// with flags.json); notes and errors go to stderr. Returns the exit status:
// 0 if every call succeeded and every check passed, 1 if some op failed (the
// run goes on to the next workload) or on a transport failure (the run
// stops).
int RunServerBench(const ServerBenchFlags& flags);

}  // namespace flatkv::client
