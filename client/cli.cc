// flatkv: the command-line client of one FlatKV server (shared/DESIGN.md,
// "Tools"), a thin layer over flatkv::client::Client. `flatkv --help` is the
// reference; client/README.md and the top README show a session.
//
// Implementation notes
//
// Exit codes are the CLI's contract with scripts: 0 success, 1 not found
// (get/sget/rm/srm), 2 usage or local error, 3 an error the server answered
// (its Status printed as "flatkv: <Code>: <message>"), 4 no answer from the
// server (cannot connect, connection lost, timed out). The client maps the
// server's STORAGE_ERROR onto IOError, the same code as a network failure,
// so 3 and 4 are told apart by Client::network_failed(), not by the code.
//
// --hex works in both directions, so `flatkv --hex get 1 | flatkv --hex put
// 2` copies any value: values and string keys are printed as lowercase hex,
// and VALUE and SKEY operands (and a VALUE read from stdin, surrounding
// whitespace ignored) are parsed as hex.
//
// `admin compact --wait` polls compactionStatus. The wire has no round
// number and the server picks a request up asynchronously, so the end of the
// round this command started is inferred (RoundOver below).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <thrift/TOutput.h>

#include <spdlog/spdlog.h>

#include "client/client.h"
#include "client/ring_client.h"
#include "partition/zk_auth.h"

namespace flatkv::client {
namespace {

enum ExitCode : int {
  kExitOk = 0,
  kExitNotFound = 1,
  kExitUsage = 2,
  kExitServer = 3,
  kExitNetwork = 4,
  kExitCorrupt = 5,
};

constexpr int32_t kScanPage = 1000;  // pairs asked for per scan call
constexpr auto kPollInterval = std::chrono::milliseconds(100);
// A compaction round that never showed as running and changed no counter
// within this long is taken as over (a round with nothing to compact).
constexpr auto kCompactGrace = std::chrono::seconds(1);
constexpr int kBarWidth = 20;

constexpr const char* kUsage =
    "usage: flatkv [options] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  get KEY                     print the value of integer KEY\n"
    "  put KEY [VALUE]             store VALUE (absent or '-': all of stdin)\n"
    "  rm KEY                      remove KEY\n"
    "  append KEY [VALUE]          add VALUE's bytes to KEY's value (creates it)\n"
    "  scan [FROM] [--limit N] [--reverse]\n"
    "                              print 'KEY<TAB>VALUE' lines in key order from\n"
    "                              FROM (default: the first key, or the last\n"
    "                              with --reverse), at most N of them\n"
    "  sget SKEY | sput SKEY [VALUE] | srm SKEY\n"
    "                              the same for string keys\n"
    "  admin write-mode [safe|async]  set the write mode, or print it\n"
    "  admin compact [--wait]      start a compaction; --wait draws progress on\n"
    "                              stderr and prints what it reclaimed\n"
    "  admin stats                 print 'name value' counter lines, sorted\n"
    "  admin info                  print the server's identity, 'name value'\n"
    "  admin digest                print what the instance holds: key counts, an\n"
    "                              order-independent digest of keys and values,\n"
    "                              and its chain position (equal on every member\n"
    "                              of a chain once writes stop)\n"
    "  admin remove-mark M [--wait]  remove mark M from the ring: its keys move\n"
    "                              to the next mark up, then its members exit;\n"
    "                              --wait returns once M has left the ring\n"
    "  admin backup DIR [--wait] [--mb-per-sec N]\n"
    "                              copy the instance's store into DIR (an absolute\n"
    "                              path on the server's machine, not existing yet)\n"
    "                              while it serves, at most N MB/s (default 0:\n"
    "                              unlimited); --wait draws progress on stderr;\n"
    "                              flatkv-server --set storage.path=DIR opens it\n"
    "  admin abort-change          roll back the ring change in progress while it\n"
    "                              still copies (stop its importer first)\n"
    "  admin secure-ring --zk-auth-file F [--transitional]\n"
    "                              (with --zk) give every node under the ring's\n"
    "                              service path, ephemeral members included, the\n"
    "                              ACL of cluster.zookeeper_auth_file F (that\n"
    "                              identity: all; anyone: read); safe to repeat;\n"
    "                              --transitional: anyone keeps all too, so\n"
    "                              instances without F keep writing while the\n"
    "                              others restart with it (then run it again)\n"
    "  admin verify [--no-repair]  read back every record of the instance and\n"
    "                              check it; in a ring each bad integer key is\n"
    "                              rewritten from its chain (unless --no-repair);\n"
    "                              prints counts and each problem; exit 5 if a\n"
    "                              bad record remains (big stores: --timeout-ms 0)\n"
    "  ring                        print the ring: each mark, the hash ranges it\n"
    "                              owns and their share of the hash space, its\n"
    "                              chain with roles, and members catching up\n"
    "                              (snapshot %, MB/s, writes behind the tail;\n"
    "                              from the tail's stats) (--zk, or any instance)\n"
    "  ring suggest-mark           a mark that halves the fullest mark's keys (by\n"
    "                              the digest key counts; integer keys: their\n"
    "                              median, found by a key-order scan)\n"
    "\n"
    "Options (anywhere on the line; '--' ends them):\n"
    "  --host H          server address (default 127.0.0.1)\n"
    "  --port P          server port (default 9901)\n"
    "  --timeout-ms N    connect and per-call I/O timeout (default 2000 to\n"
    "                    connect, 30000 per call; 0 = none)\n"
    "  --token T         admin token (default: $FLATKV_ADMIN_TOKEN)\n"
    "  --tls-ca F        connect over TLS; the server's certificate must verify\n"
    "                    against the CA certificates in F (PEM) and name --host\n"
    "  --tls-cert F      with --tls-ca: present this client certificate (PEM),\n"
    "                    for a server with server.tls_client_auth\n"
    "  --tls-key F       the private key of --tls-cert (PEM)\n"
    "  --hex             values and string keys are hex, on output and input\n"
    "                    (VALUE, SKEY and a VALUE read from stdin)\n"
    "  --raw             get/sget: print the value's bytes exactly, with no\n"
    "                    newline (default: the value, then a newline)\n"
    "  --zk Z            ZooKeeper hosts (host:port,...) of a ring: each call goes\n"
    "                    straight to the instance that owns its key; admin\n"
    "                    remove-mark and abort-change to a live instance of the\n"
    "                    ring (not of the mark removed); other admin commands\n"
    "                    act on the instance --host/--port name\n"
    "  --path P          the ring's ZooKeeper service path (default /flatkv)\n"
    "  --zk-auth-file F  admin secure-ring: the file of user:password\n"
    "  --help            this text\n"
    "\n"
    "Exit status: 0 success; 1 key not found (get, sget, rm, srm); 2 usage or\n"
    "local error; 3 error answered by the server (e.g. KeyOutOfRange,\n"
    "Unauthorized); 4 cannot reach the server or the connection was lost;\n"
    "5 admin verify found a bad record it did not repair.\n";

// Everything the command line says.
struct Flags {
  ClientOptions client;
  std::optional<std::string> token;
  std::optional<int64_t> limit;
  bool hex = false;
  bool raw = false;
  bool reverse = false;
  bool wait = false;
  bool no_repair = false;
  bool transitional = false;  // admin secure-ring --transitional
  std::optional<int> mb_per_sec;
  std::string zookeeper;                 // --zk: route through the ring
  bool instance_given = false;           // --host or --port named one instance
  std::string service_path = "/flatkv";  // --path
  std::string zk_auth_file;              // --zk-auth-file (admin secure-ring)
  bool help = false;
  std::vector<std::string> operands;  // the command and its arguments
};

// Parses all of "text" as a T; false on anything else (no exceptions).
template <typename T>
bool ParseInt(std::string_view text, T* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

Status BadUsage(const std::string& message) { return Status::InvalidArgument(message); }

// Parses an integer option into [lo, hi].
template <typename T>
Status ParseBounded(const std::string& name, const std::string& text, T lo, T hi, T* out) {
  if (!ParseInt(text, out) || *out < lo || *out > hi) {
    return BadUsage("--" + name + " wants an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], not '" + text + "'");
  }
  return Status::OK();
}

bool TakesValue(const std::string& name) {
  static const char* const kWithValue[] = {"host", "port", "timeout-ms", "token",
                                           "limit", "zk", "path", "mb-per-sec",
                                           "zk-auth-file", "tls-ca", "tls-cert", "tls-key"};
  return std::any_of(std::begin(kWithValue), std::end(kWithValue),
                     [&](const char* n) { return name == n; });
}

Status ApplyValueOption(const std::string& name, const std::string& value, Flags* f) {
  constexpr int kIntMax = std::numeric_limits<int>::max();
  if (name == "host") {
    f->client.host = value;
    f->instance_given = true;
  } else if (name == "port") {
    f->instance_given = true;
    return ParseBounded(name, value, 1, 65535, &f->client.port);
  } else if (name == "timeout-ms") {
    int ms = 0;
    FLATKV_RETURN_IF_ERROR(ParseBounded(name, value, 0, kIntMax, &ms));
    f->client.connect_timeout_ms = ms;
    f->client.timeout_ms = ms;
  } else if (name == "token") {
    f->token = value;
  } else if (name == "limit") {
    int64_t n = 0;
    FLATKV_RETURN_IF_ERROR(
        ParseBounded<int64_t>(name, value, 1, std::numeric_limits<int64_t>::max(), &n));
    f->limit = n;
  } else if (name == "zk") {
    f->zookeeper = value;
  } else if (name == "zk-auth-file") {
    f->zk_auth_file = value;
  } else if (name == "tls-ca") {
    f->client.tls_ca_file = value;
  } else if (name == "tls-cert") {
    f->client.tls_cert_file = value;
  } else if (name == "tls-key") {
    f->client.tls_key_file = value;
  } else if (name == "mb-per-sec") {
    int n = 0;
    FLATKV_RETURN_IF_ERROR(ParseBounded(name, value, 0, kIntMax, &n));
    f->mb_per_sec = n;
  } else {  // path
    f->service_path = value;
  }
  return Status::OK();
}

Status ApplyFlag(const std::string& name, Flags* f) {
  if (name == "hex") {
    f->hex = true;
  } else if (name == "raw") {
    f->raw = true;
  } else if (name == "reverse") {
    f->reverse = true;
  } else if (name == "wait") {
    f->wait = true;
  } else if (name == "no-repair") {
    f->no_repair = true;
  } else if (name == "transitional") {
    f->transitional = true;
  } else if (name == "help") {
    f->help = true;
  } else {
    return BadUsage("unknown option --" + name);
  }
  return Status::OK();
}

// Options are "--name value", "--name=value" or "-h"; anything else,
// including "-" and negative numbers, is an operand.
Status ParseArgs(int argc, char** argv, Flags* f) {
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (options_done || arg.size() < 2 || arg[0] != '-' || (arg[1] != '-' && arg != "-h")) {
      f->operands.push_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h") {
      f->help = true;
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (!TakesValue(name)) {
      FLATKV_RETURN_IF_ERROR(ApplyFlag(name, f));  // refuses unknown names
      if (value) return BadUsage("--" + name + " takes no value");
      continue;
    }
    if (!value) {
      if (i + 1 >= argc) return BadUsage("--" + name + " needs a value");
      value = argv[++i];
    }
    FLATKV_RETURN_IF_ERROR(ApplyValueOption(name, *value, f));
  }
  const ClientOptions& c = f->client;
  if ((!c.tls_cert_file.empty() || !c.tls_key_file.empty()) && c.tls_ca_file.empty()) {
    return BadUsage("--tls-cert and --tls-key need --tls-ca (the CA the server's certificate "
                    "must verify against)");
  }
  if (c.tls_cert_file.empty() != c.tls_key_file.empty()) {
    return BadUsage("--tls-cert and --tls-key go together");
  }
  return Status::OK();
}

std::string ToHex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes hex, ignoring surrounding whitespace (a trailing newline from
// `flatkv --hex get` or echo).
Status FromHex(std::string_view text, std::string* out) {
  const char* kSpace = " \t\r\n";
  const size_t first = text.find_first_not_of(kSpace);
  text = first == std::string_view::npos ? std::string_view()
                                         : text.substr(first, text.find_last_not_of(kSpace) - first + 1);
  if (text.size() % 2 != 0) return BadUsage("odd number of hex digits");
  out->clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = HexDigit(text[i]), lo = HexDigit(text[i + 1]);
    if (hi < 0 || lo < 0) return BadUsage("not hex: '" + std::string(text.substr(i, 2)) + "'");
    out->push_back(static_cast<char>(hi << 4 | lo));
  }
  return Status::OK();
}

// Reads all of stdin, binary safe.
Status ReadStdin(std::string* out) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0) return Status::OK();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("reading stdin", errno);
    out->append(buf, static_cast<size_t>(n));
  }
}

bool WriteAll(std::string_view bytes) {
  return std::fwrite(bytes.data(), 1, bytes.size(), stdout) == bytes.size();
}

// stdout failed (a full disk, a closed pipe with SIGPIPE ignored): a local
// error.
int WriteError() {
  std::fprintf(stderr, "flatkv: writing stdout: %s\n", std::strerror(errno));
  return kExitUsage;
}

std::string HumanBytes(double bytes, double unit_of) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && unit_of >= 1024) {
    unit_of /= 1024;
    bytes /= 1024;
    ++u;
  }
  char text[64];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f" : "%.1f", bytes);
  return std::string(text) + " " + kUnits[u];
}

// The percentage as shown, to 0.1: the bar, the figure and the 10% steps
// agree (99.96 is 100.0 everywhere).
template <typename Progress>  // rpc::CompactionStatus or rpc::BackupStatus
double ShownPercent(const Progress& s) {
  return std::round(std::clamp(s.percent, 0.0, 100.0) * 10) / 10;
}

// "[#########           ] 45.0%  1.2/2.9 GiB"
template <typename Progress>
std::string ProgressLine(const Progress& s) {
  const double pct = ShownPercent(s);
  const int filled = static_cast<int>(pct / 100 * kBarWidth);
  const double total = static_cast<double>(std::max<int64_t>(s.bytesTotal, 0));
  const std::string whole = HumanBytes(total, total);
  std::string done = HumanBytes(static_cast<double>(std::max<int64_t>(s.bytesDone, 0)), total);
  done.resize(done.rfind(' '));  // the unit is said once, after the total
  char line[128];
  std::snprintf(line, sizeof(line), "[%s%s] %.1f%%  %s/%s", std::string(filled, '#').c_str(),
                std::string(kBarWidth - filled, ' ').c_str(), pct, done.c_str(), whole.c_str());
  return line;
}

// Draws a compaction's or a backup's progress on stderr: redrawn in place on a
// terminal, otherwise one line each time another 10% is reached.
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(STDERR_FILENO) == 1) {}

  template <typename Progress>
  void Draw(const Progress& s) {
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", ProgressLine(s).c_str());
      drawn_ = true;
      return;
    }
    const int decile = static_cast<int>(ShownPercent(s) / 10);
    if (decile <= decile_) return;
    decile_ = decile;
    std::fprintf(stderr, "%s\n", ProgressLine(s).c_str());
  }

  void Finish() {
    if (tty_ && drawn_) std::fputc('\n', stderr);
  }

 private:
  const bool tty_;
  bool drawn_ = false;
  int decile_ = -1;  // last 10% step printed (not a tty)
};

// Is the round this command asked for over? Without a round number on the
// wire: over once not running and either it was seen running, or a counter
// moved, or kCompactGrace passed with neither (nothing to do, done between
// two polls). A round started before ours and still running at our first
// poll can be mistaken for ours if ours starts between two polls.
bool RoundOver(const rpc::CompactionStatus& before, const rpc::CompactionStatus& now,
               bool saw_running, std::chrono::steady_clock::duration waited) {
  if (now.running) return false;
  const bool moved = now.tablesCompacted != before.tablesCompacted ||
                     now.bytesReclaimed != before.bytesReclaimed ||
                     now.lastError != before.lastError;
  return saw_running || moved || waited >= kCompactGrace;
}

class Cli {
 public:
  explicit Cli(Flags flags) : flags_(std::move(flags)), client_(flags_.client) {}

  int Run();

 private:
  using Operands = std::vector<std::string>;
  struct Command {
    const char* name;
    size_t min_operands, max_operands;  // after the command's name
    int (Cli::*run)(const Operands&);
  };
  static const Command kCommands[];

  Status CheckOptions(const std::string& command) const;
  int Fail(const Status& st);
  int Usage(const std::string& message);
  Status Key(const std::string& text, int64_t* key);
  Status StringKey(const std::string& text, std::string* key);
  Status Value(const Operands& ops, size_t index, std::string* value);
  int PrintValue(const std::string& value);
  std::string Token() const;

  int Get(const Operands& ops);
  int Put(const Operands& ops);
  int Remove(const Operands& ops);
  int Append(const Operands& ops);
  int Scan(const Operands& ops);
  int SGet(const Operands& ops);
  int SPut(const Operands& ops);
  int SRemove(const Operands& ops);
  int WriteMode(const Operands& ops);
  int Compact(const Operands& ops);
  int WaitForCompaction(const rpc::CompactionStatus& before);
  int Backup(const Operands& ops);
  int Stats(const Operands& ops);
  int Digest(const Operands& ops);
  int Verify(const Operands& ops);
  int RemoveMark(const Operands& ops);
  int AbortChange(const Operands& ops);
  int SecureRing(const Operands& ops);
  int Info(const Operands& ops);
  int PrintRing(const Operands& ops);
  void PrintJoiners(const partition::Partition& p) const;
  // The importer's progress (its stats), under the ring change line.
  void PrintImport(const partition::RingChange& c) const;
  int SuggestMark(const Operands& ops);
  std::shared_ptr<const partition::Ring> LoadRing(Status* st);
  // A ring-wide admin call ("call" on a client): on the one instance named
  // (no --zk, or --host/--port), else on each live instance of the ring in
  // turn, skipping mark "avoid" (0: none), until one answers (not a
  // network failure). *used is the client that answered.
  Status RingAdmin(int64_t avoid, const std::function<Status(Client&)>& call, Client** used);

  // Runs a data call on the ring client (--zk) or on the one instance.
  template <typename Call>
  Status Data(Call&& call) {
    if (flags_.zookeeper.empty()) return call(client_);
    if (!ring_) {
      RingClientOptions o;
      o.zookeeper = flags_.zookeeper;
      o.service_path = flags_.service_path;
      o.client = flags_.client;
      if (flags_.client.connect_timeout_ms > 0) o.open_timeout_ms = flags_.client.connect_timeout_ms;
      FLATKV_RETURN_IF_ERROR(RingClient::Open(std::move(o), &ring_));
    }
    return call(*ring_);
  }

  const Flags flags_;
  Client client_;
  std::unique_ptr<RingClient> ring_;  // with --zk
  std::unique_ptr<Client> admin_;     // RingAdmin's instance of the ring
};

const Cli::Command Cli::kCommands[] = {
    {"get", 1, 1, &Cli::Get},
    {"put", 1, 2, &Cli::Put},
    {"rm", 1, 1, &Cli::Remove},
    {"append", 1, 2, &Cli::Append},
    {"scan", 0, 1, &Cli::Scan},
    {"sget", 1, 1, &Cli::SGet},
    {"sput", 1, 2, &Cli::SPut},
    {"srm", 1, 1, &Cli::SRemove},
    {"admin write-mode", 0, 1, &Cli::WriteMode},
    {"admin compact", 0, 0, &Cli::Compact},
    {"admin stats", 0, 0, &Cli::Stats},
    {"admin info", 0, 0, &Cli::Info},
    {"admin digest", 0, 0, &Cli::Digest},
    {"admin verify", 0, 0, &Cli::Verify},
    {"admin remove-mark", 1, 1, &Cli::RemoveMark},
    {"admin abort-change", 0, 0, &Cli::AbortChange},
    {"admin secure-ring", 0, 0, &Cli::SecureRing},
    {"admin backup", 1, 1, &Cli::Backup},
    {"ring", 0, 0, &Cli::PrintRing},
    {"ring suggest-mark", 0, 0, &Cli::SuggestMark},
};

int Cli::Run() {
  if (flags_.operands.empty()) return Usage("no command");
  Operands ops = flags_.operands;
  std::string name = ops[0];
  ops.erase(ops.begin());
  if (name == "admin") {
    if (ops.empty()) {
      return Usage("admin needs a subcommand: write-mode, compact, stats, info, digest, verify, "
                   "remove-mark, abort-change, backup, secure-ring");
    }
    name += " " + ops[0];
    ops.erase(ops.begin());
  } else if (name == "ring" && !ops.empty() && ops[0] == "suggest-mark") {
    name += " " + ops[0];
    ops.erase(ops.begin());
  }
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    if (ops.size() < c.min_operands || ops.size() > c.max_operands) {
      return Usage("wrong number of arguments for " + name);
    }
    Status st = CheckOptions(name);
    if (!st.ok()) return Usage(st.message());
    return (this->*c.run)(ops);
  }
  return Usage("unknown command '" + name + "'");
}

// Options that only make sense for some commands are refused elsewhere, so
// a typo such as `flatkv get 1 --limit 3` is not silently ignored.
Status Cli::CheckOptions(const std::string& command) const {
  if ((flags_.limit || flags_.reverse) && command != "scan") {
    return Status::InvalidArgument("--limit and --reverse apply to scan only");
  }
  if (flags_.wait && command != "admin compact" && command != "admin remove-mark" &&
      command != "admin backup") {
    return Status::InvalidArgument(
        "--wait applies to admin compact, admin remove-mark and admin backup only");
  }
  if (flags_.mb_per_sec && command != "admin backup") {
    return Status::InvalidArgument("--mb-per-sec applies to admin backup only");
  }
  if (flags_.no_repair && command != "admin verify") {
    return Status::InvalidArgument("--no-repair applies to admin verify only");
  }
  if (flags_.raw && command != "get" && command != "sget") {
    return Status::InvalidArgument("--raw applies to get and sget only");
  }
  if (flags_.raw && flags_.hex) return Status::InvalidArgument("--raw and --hex exclude each other");
  if ((!flags_.zk_auth_file.empty() || flags_.transitional) && command != "admin secure-ring") {
    return Status::InvalidArgument("--zk-auth-file and --transitional apply to admin secure-ring only");
  }
  if (command == "admin secure-ring" && (flags_.zookeeper.empty() || flags_.zk_auth_file.empty())) {
    return Status::InvalidArgument("admin secure-ring needs --zk and --zk-auth-file");
  }
  // With --zk, data calls and the ring-wide admin commands find their
  // instance in the ring; the rest act on one instance, which must be named
  // rather than taken to be the default address.
  static const char* const kRingWide[] = {"admin remove-mark", "admin abort-change",
                                          "admin secure-ring"};
  const bool ring_wide = std::any_of(std::begin(kRingWide), std::end(kRingWide),
                                     [&](const char* c) { return command == c; });
  if (!flags_.zookeeper.empty() && !flags_.instance_given && command.rfind("admin ", 0) == 0 &&
      !ring_wide) {
    return Status::InvalidArgument(command + " acts on one instance: name it with --host and "
                                   "--port (--zk finds the instance only for data calls, ring, "
                                   "admin remove-mark and admin abort-change)");
  }
  return Status::OK();
}

int Cli::Fail(const Status& st) {
  std::fprintf(stderr, "flatkv: %s\n", st.ToString().c_str());
  // Through the ring client, an instance that cannot be reached is
  // Unavailable or IOError; one instance tells by its connection.
  const bool network = flags_.zookeeper.empty()
                           ? client_.network_failed()
                           : st.IsUnavailable() || st.IsIOError() || !ring_;
  return network ? kExitNetwork : kExitServer;
}

int Cli::Usage(const std::string& message) {
  std::fprintf(stderr, "flatkv: %s (flatkv --help for usage)\n", message.c_str());
  return kExitUsage;
}

Status Cli::Key(const std::string& text, int64_t* key) {
  if (!ParseInt(text, key)) return Status::InvalidArgument("bad key '" + text + "': not a 64-bit integer");
  return Status::OK();
}

Status Cli::StringKey(const std::string& text, std::string* key) {
  if (!flags_.hex) {
    *key = text;
    return Status::OK();
  }
  return FromHex(text, key).WithContext("SKEY");
}

// The VALUE operand at "index": the operand itself, or stdin when it is
// absent or "-"; hex-decoded with --hex.
Status Cli::Value(const Operands& ops, size_t index, std::string* value) {
  std::string text;
  if (index < ops.size() && ops[index] != "-") {
    text = ops[index];
  } else {
    FLATKV_RETURN_IF_ERROR(ReadStdin(&text));
  }
  if (!flags_.hex) {
    *value = std::move(text);
    return Status::OK();
  }
  return FromHex(text, value).WithContext("VALUE");
}

int Cli::PrintValue(const std::string& value) {
  bool ok = false;
  if (flags_.raw) {
    ok = WriteAll(value);
  } else {
    ok = WriteAll(flags_.hex ? ToHex(value) : value) && WriteAll("\n");
  }
  return ok && std::fflush(stdout) == 0 ? kExitOk : WriteError();
}

std::string Cli::Token() const {
  if (flags_.token) return *flags_.token;
  const char* env = std::getenv("FLATKV_ADMIN_TOKEN");
  return env != nullptr ? env : "";
}

int Cli::Get(const Operands& ops) {
  int64_t key = 0;
  std::string value;
  if (Status st = Key(ops[0], &key); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.Get(key, &value); });
  if (st.IsNotFound()) {
    std::fprintf(stderr, "flatkv: key %s not found\n", ops[0].c_str());
    return kExitNotFound;
  }
  return st.ok() ? PrintValue(value) : Fail(st);
}

int Cli::Put(const Operands& ops) {
  int64_t key = 0;
  std::string value;
  if (Status st = Key(ops[0], &key); !st.ok()) return Usage(st.message());
  if (Status st = Value(ops, 1, &value); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.Put(key, value); });
  return st.ok() ? kExitOk : Fail(st);
}

int Cli::Remove(const Operands& ops) {
  int64_t key = 0;
  bool existed = false;
  if (Status st = Key(ops[0], &key); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.Remove(key, &existed); });
  if (!st.ok()) return Fail(st);
  if (existed) return kExitOk;
  std::fprintf(stderr, "flatkv: key %s not found\n", ops[0].c_str());
  return kExitNotFound;
}

int Cli::Append(const Operands& ops) {
  int64_t key = 0;
  std::string value;
  if (Status st = Key(ops[0], &key); !st.ok()) return Usage(st.message());
  if (Status st = Value(ops, 1, &value); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.Append(key, value); });
  return st.ok() ? kExitOk : Fail(st);
}

// Follows nextKey until the server says done or --limit pairs are printed.
int Cli::Scan(const Operands& ops) {
  int64_t from = flags_.reverse ? std::numeric_limits<int64_t>::max()
                                : std::numeric_limits<int64_t>::min();
  if (!ops.empty()) {
    if (Status st = Key(ops[0], &from); !st.ok()) return Usage(st.message());
  }
  int64_t left = flags_.limit.value_or(std::numeric_limits<int64_t>::max());
  while (left > 0) {
    rpc::ScanResult page;
    const auto n = static_cast<int32_t>(std::min<int64_t>(left, kScanPage));
    Status st = Data([&](auto& c) { return c.Scan(from, n, flags_.reverse, &page); });
    if (!st.ok()) return Fail(st);
    for (const rpc::KvPair& p : page.pairs) {
      const std::string line = std::to_string(p.key) + "\t" +
                               (flags_.hex ? ToHex(p.value) : p.value) + "\n";
      if (!WriteAll(line)) return WriteError();
    }
    left -= static_cast<int64_t>(page.pairs.size());
    if (page.done) break;
    from = page.nextKey;
  }
  return std::fflush(stdout) == 0 ? kExitOk : WriteError();
}

int Cli::SGet(const Operands& ops) {
  std::string key, value;
  if (Status st = StringKey(ops[0], &key); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.SGet(key, &value); });
  if (st.IsNotFound()) {
    std::fprintf(stderr, "flatkv: string key not found\n");
    return kExitNotFound;
  }
  return st.ok() ? PrintValue(value) : Fail(st);
}

int Cli::SPut(const Operands& ops) {
  std::string key, value;
  if (Status st = StringKey(ops[0], &key); !st.ok()) return Usage(st.message());
  if (Status st = Value(ops, 1, &value); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.SPut(key, value); });
  return st.ok() ? kExitOk : Fail(st);
}

int Cli::SRemove(const Operands& ops) {
  std::string key;
  bool existed = false;
  if (Status st = StringKey(ops[0], &key); !st.ok()) return Usage(st.message());
  Status st = Data([&](auto& c) { return c.SRemove(key, &existed); });
  if (!st.ok()) return Fail(st);
  if (existed) return kExitOk;
  std::fprintf(stderr, "flatkv: string key not found\n");
  return kExitNotFound;
}

int Cli::WriteMode(const Operands& ops) {
  if (ops.empty()) {
    rpc::WriteMode::type mode = rpc::WriteMode::SAFE;
    Status st = client_.GetWriteMode(&mode);
    if (!st.ok()) return Fail(st);
    std::printf("%s\n", mode == rpc::WriteMode::ASYNC ? "async" : "safe");
    return kExitOk;
  }
  if (ops[0] != "safe" && ops[0] != "async") {
    return Usage("write mode must be safe or async, not '" + ops[0] + "'");
  }
  Status st = client_.SetWriteMode(
      Token(), ops[0] == "safe" ? rpc::WriteMode::SAFE : rpc::WriteMode::ASYNC);
  return st.ok() ? kExitOk : Fail(st);
}

int Cli::Compact(const Operands&) {
  rpc::CompactionStatus before;
  if (flags_.wait) {
    if (Status st = client_.GetCompactionStatus(&before); !st.ok()) return Fail(st);
  }
  if (Status st = client_.Compact(Token()); !st.ok()) return Fail(st);
  if (!flags_.wait) {
    std::printf("compaction started (flatkv admin stats or admin compact --wait to follow)\n");
    return kExitOk;
  }
  return WaitForCompaction(before);
}

// Polls until the round is over, then prints what this round did (the
// server's counters are totals since it started).
int Cli::WaitForCompaction(const rpc::CompactionStatus& before) {
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar;
  bool saw_running = false;
  rpc::CompactionStatus now;
  for (;;) {
    if (Status st = client_.GetCompactionStatus(&now); !st.ok()) {
      bar.Finish();
      return Fail(st);
    }
    saw_running = saw_running || now.running;
    if (now.running) bar.Draw(now);
    if (RoundOver(before, now, saw_running, std::chrono::steady_clock::now() - start)) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  bar.Draw(now);
  bar.Finish();
  std::printf("tables_compacted %lld\nbytes_reclaimed %lld\n",
              static_cast<long long>(now.tablesCompacted - before.tablesCompacted),
              static_cast<long long>(now.bytesReclaimed - before.bytesReclaimed));
  if (now.lastError.empty()) return kExitOk;
  std::fprintf(stderr, "flatkv: compaction failed: %s\n", now.lastError.c_str());
  return kExitServer;
}

// Starts the backup; with --wait polls backupStatus until it is over and
// prints what it copied. Exit 3 if the server reports it failed.
int Cli::Backup(const Operands& ops) {
  Status st = client_.Call("backup", false, [&](rpc::FlatKVClient& c) {
    c.backup(Token(), ops[0], flags_.mb_per_sec.value_or(0));
  });
  if (!st.ok()) return Fail(st);
  if (!flags_.wait) {
    std::printf("backup to %s started (flatkv admin backup ... --wait, or backupStatus, to follow)\n",
                ops[0].c_str());
    return kExitOk;
  }
  ProgressBar bar;
  rpc::BackupStatus now;
  for (;;) {
    st = client_.Call("backupStatus", true, [&](rpc::FlatKVClient& c) { c.backupStatus(now); });
    if (!st.ok()) {
      bar.Finish();
      return Fail(st);
    }
    bar.Draw(now);
    if (!now.running) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  bar.Finish();
  if (!now.complete) {
    std::fprintf(stderr, "flatkv: backup failed: %s\n", now.lastError.c_str());
    return kExitServer;
  }
  std::printf("path %s\nkeys %lld\nbytes %lld\ncorrupt_skipped %lld\n", now.path.c_str(),
              static_cast<long long>(now.keysDone), static_cast<long long>(now.bytesDone),
              static_cast<long long>(now.corruptSkipped));
  return kExitOk;
}

int Cli::Stats(const Operands&) {
  std::map<std::string, int64_t> stats;
  if (Status st = client_.Stats(&stats); !st.ok()) return Fail(st);
  for (const auto& [name, value] : stats) {
    std::printf("%s %lld\n", name.c_str(), static_cast<long long>(value));
  }
  return kExitOk;
}

int Cli::Digest(const Operands&) {
  rpc::Digest d;
  const std::string token = Token();
  Status st = client_.Call("digest", true, [&](rpc::FlatKVClient& c) { c.digest(d, token); });
  if (!st.ok()) return Fail(st);
  std::printf("keys %lld\nstring_keys %lld\ndigest %s\napplied_epoch %lld\napplied_seq %lld\n",
              static_cast<long long>(d.keys), static_cast<long long>(d.stringKeys),
              d.digest.c_str(), static_cast<long long>(d.appliedEpoch),
              static_cast<long long>(d.appliedSeq));
  return kExitOk;
}

int Cli::Verify(const Operands&) {
  rpc::VerifyResult v;
  const std::string token = Token();
  const bool repair = !flags_.no_repair;
  Status st = client_.Call("verify", true, [&](rpc::FlatKVClient& c) { c.verify(v, token, repair); });
  if (!st.ok()) return Fail(st);
  std::printf("records %lld\nbytes %lld\ncorrupt %lld\nrepaired %lld\n",
              static_cast<long long>(v.records), static_cast<long long>(v.bytes),
              static_cast<long long>(v.corrupt), static_cast<long long>(v.repaired));
  for (const std::string& p : v.problems) std::printf("problem %s\n", p.c_str());
  return v.corrupt > v.repaired ? kExitCorrupt : kExitOk;
}

Status Cli::RingAdmin(int64_t avoid, const std::function<Status(Client&)>& call, Client** used) {
  *used = &client_;
  if (flags_.zookeeper.empty() || flags_.instance_given) return call(client_);
  Status st;
  std::shared_ptr<const partition::Ring> ring = LoadRing(&st);
  if (!st.ok()) return st;
  st = Status::Unavailable("the ring has no serving instance" +
                           (avoid != 0 ? " outside mark " + std::to_string(avoid) : ""));
  for (const partition::Partition& p : ring->partitions()) {
    if (p.mark == avoid) continue;
    for (const partition::Member& m : p.chain) {
      ClientOptions o = flags_.client;
      const std::string address = m.address();
      const size_t colon = address.rfind(':');
      if (colon == std::string::npos || !ParseInt(address.substr(colon + 1), &o.port)) continue;
      o.host = address.substr(0, colon);
      admin_ = std::make_unique<Client>(std::move(o));
      st = call(*admin_);
      if (!admin_->network_failed()) {
        *used = admin_.get();
        return st;
      }
    }
  }
  return st;
}

int Cli::RemoveMark(const Operands& ops) {
  int64_t mark = 0;
  if (!ParseInt(ops[0], &mark)) return Usage("remove-mark wants an integer mark, not '" + ops[0] + "'");
  const std::string token = Token();
  Client* target = nullptr;
  Status st = RingAdmin(
      mark,
      [&](Client& client) {
        return client.Call("removeMark", false,
                           [&](rpc::FlatKVClient& c) { c.removeMark(token, mark); });
      },
      &target);
  if (!st.ok()) return Fail(st);
  if (!flags_.wait) {
    std::printf("removal of mark %lld started (flatkv ring, or --wait, to follow)\n",
                static_cast<long long>(mark));
    return kExitOk;
  }
  for (;;) {
    rpc::RingInfo info;
    if (st = target->Ring(&info); !st.ok()) return Fail(st);
    const bool present = std::any_of(info.partitions.begin(), info.partitions.end(),
                                     [&](const rpc::Partition& p) { return p.mark == mark; });
    if (!present) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::printf("mark %lld removed\n", static_cast<long long>(mark));
  return kExitOk;
}

int Cli::AbortChange(const Operands&) {
  const std::string token = Token();
  Client* target = nullptr;
  Status st = RingAdmin(
      0,
      [&](Client& client) {
        return client.Call("abortChange", false,
                           [&](rpc::FlatKVClient& c) { c.abortChange(token); });
      },
      &target);
  if (!st.ok()) return Fail(st);
  std::printf("ring change rolled back\n");
  return kExitOk;
}

// Talks to ZooKeeper itself, not to an instance: it must work on a ring
// whose instances cannot start (they refuse a ring the world may write).
int Cli::SecureRing(const Operands&) {
  partition::ZkCredentials credentials;
  bool open_to_others = false;
  Status st = partition::ReadZkCredentials("--zk-auth-file", flags_.zk_auth_file, &credentials,
                                           &open_to_others);
  if (!st.ok()) return Usage(st.message());
  if (open_to_others) {
    std::fprintf(stderr, "flatkv: warning: %s may be read by group or others (chmod 600 it)\n",
                 flags_.zk_auth_file.c_str());
  }
  // A large tree takes one round trip per node; the timeout is the connect's.
  const int timeout_ms = std::max(flags_.client.connect_timeout_ms, 10000);
  int nodes = 0;
  st = partition::SecureRing(flags_.zookeeper, flags_.service_path, credentials,
                             flags_.transitional, timeout_ms, &nodes);
  if (!st.ok()) {
    std::fprintf(stderr, "flatkv: secure-ring: %s (%d nodes secured before)\n",
                 st.ToString().c_str(), nodes);
    return st.IsUnavailable() ? kExitNetwork : kExitServer;
  }
  std::printf("secured %d nodes under %s: digest %s all, anyone %s\n", nodes,
              flags_.service_path.c_str(), credentials.user.c_str(),
              flags_.transitional ? "all (transitional: run it again without --transitional)"
                                  : "read");
  return kExitOk;
}

int Cli::Info(const Operands&) {
  rpc::NodeInfo info;
  if (Status st = client_.Info(&info); !st.ok()) return Fail(st);
  std::printf("version %s\nrole %s\nmark %lld\nkey_min %lld\nkey_max %lld\n"
              "write_mode %s\nuptime_seconds %lld\n",
              info.version.c_str(), info.role.c_str(), static_cast<long long>(info.mark),
              static_cast<long long>(info.keyMin), static_cast<long long>(info.keyMax),
              info.writeMode == rpc::WriteMode::ASYNC ? "async" : "safe",
              static_cast<long long>(info.uptimeSeconds));
  return kExitOk;
}

int Main(int argc, char** argv) {
  // Thrift prints its own lines for a refused connection; the Status says it.
  apache::thrift::GlobalOutput.setOutputFunction([](const char*) {});
  // The ring client's ZooKeeper session logs (and the ZooKeeper client
  // complains every few ms while it cannot connect); the CLI prints only
  // its own one-line error.
  spdlog::set_level(spdlog::level::off);
  Flags flags;
  if (Status st = ParseArgs(argc, argv, &flags); !st.ok()) {
    std::fprintf(stderr, "flatkv: %s (flatkv --help for usage)\n", st.message().c_str());
    return kExitUsage;
  }
  if (flags.help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  return Cli(std::move(flags)).Run();
}

// One line per mark: its hash ranges and their share of the i64 hash
// space, then its chain, head first, with each member's role.
std::shared_ptr<const partition::Ring> Cli::LoadRing(Status* st) {
  if (flags_.zookeeper.empty()) {
    rpc::RingInfo info;
    *st = client_.Ring(&info);
    return st->ok() ? RingFromInfo(info) : nullptr;
  }
  *st = Data([](auto&) { return Status::OK(); });
  return st->ok() ? ring_->ring() : nullptr;
}

int Cli::PrintRing(const Operands&) {
  Status st;
  std::shared_ptr<const partition::Ring> ring = LoadRing(&st);
  if (!st.ok()) return Fail(st);
  std::printf("ring version %lld, replication %s, string hash bound %lld, %zu marks\n",
              static_cast<long long>(ring->version()), ring->settings().replication.c_str(),
              static_cast<long long>(ring->settings().hash_bound), ring->partitions().size());
  const auto ranges = ring->KeyOrder();
  for (size_t i = 0; i < ring->partitions().size(); ++i) {
    const partition::Partition& p = ring->partitions()[i];
    std::string owned;
    long double share = 0;
    for (const partition::HashRange& r : ranges) {
      if (r.partition != i) continue;
      if (!owned.empty()) owned += ' ';
      owned += '[';
      owned += std::to_string(r.lo);
      owned += ", ";
      owned += std::to_string(r.hi);
      owned += ']';
      share += (static_cast<long double>(r.hi) - static_cast<long double>(r.lo) + 1) /
               18446744073709551616.0L;
    }
    std::printf("mark %lld  owns %s  (%.2Lf%% of the hash space)\n",
                static_cast<long long>(p.mark), owned.c_str(), share * 100);
    if (p.chain.empty()) std::printf("    (no serving member: its keys are UNAVAILABLE)\n");
    for (const partition::Member& m : p.chain) {
      std::printf("    %-8s %s\n", ring->RoleOf(p.mark, m.address()).c_str(),
                  m.address().c_str());
    }
    PrintJoiners(p);
  }
  if (const partition::RingChange* c = ring->change()) {
    std::string moving;
    for (const auto& [lo, hi] : c->ranges) {
      moving += (moving.empty() ? "[" : " [") + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    }
    if (c->kind == "add") {
      std::printf("ring change: adding mark %lld, importing %s from mark %lld (importer %s, state %s)\n",
                  static_cast<long long>(c->mark), moving.c_str(), static_cast<long long>(c->source),
                  c->importer.c_str(), c->state.c_str());
    } else {
      std::printf("ring change: removing mark %lld, mark %lld takes %s (importer %s, state %s)\n",
                  static_cast<long long>(c->mark), static_cast<long long>(c->into), moving.c_str(),
                  c->importer.c_str(), c->state.c_str());
    }
    PrintImport(*c);
  }
  return kExitOk;
}

// The fullest mark by key count (each mark's digest, from its last member:
// the tail, which serves reads), and a mark that halves it: for integer
// keys their median (a key-order scan of its ranges), for string keys the
// middle of its largest hash range (their hashes are uniform).
int Cli::SuggestMark(const Operands&) {
  Status st;
  std::shared_ptr<const partition::Ring> ring = LoadRing(&st);
  if (!st.ok()) return Fail(st);
  const std::string token = Token();
  size_t fullest = ring->partitions().size();
  rpc::Digest best;
  for (size_t i = 0; i < ring->partitions().size(); ++i) {
    const partition::Partition& p = ring->partitions()[i];
    if (p.chain.empty()) continue;
    ClientOptions o = flags_.client;
    o.host = p.chain.back().host;
    o.port = p.chain.back().port;
    Client c(o);
    rpc::Digest d;
    if (st = c.Call("digest", true, [&](rpc::FlatKVClient& x) { x.digest(d, token); }); !st.ok()) {
      return Fail(st);
    }
    std::printf("mark %lld: %lld integer keys, %lld string keys\n", static_cast<long long>(p.mark),
                static_cast<long long>(d.keys), static_cast<long long>(d.stringKeys));
    if (fullest == ring->partitions().size() ||
        d.keys + d.stringKeys > best.keys + best.stringKeys) {
      fullest = i;
      best = d;
    }
  }
  if (fullest == ring->partitions().size() || best.keys + best.stringKeys < 2) {
    std::fprintf(stderr, "flatkv: no mark holds two keys or more: nothing to halve\n");
    return kExitNotFound;
  }
  const int64_t mark = ring->partitions()[fullest].mark;
  std::vector<partition::HashRange> ranges;
  for (const partition::HashRange& r : ring->KeyOrder()) {
    if (r.partition == fullest) ranges.push_back(r);
  }
  int64_t suggestion = 0;
  std::string why;
  if (best.keys >= best.stringKeys) {
    // The median integer key: scan the ranges in key order (through the
    // instance called: the scan walks the ring) to the middle key.
    const int64_t half = best.keys / 2;
    int64_t seen = 0;
    bool found = false;
    for (const partition::HashRange& r : ranges) {
      int64_t from = r.lo;
      while (!found) {
        rpc::ScanResult page;
        st = Data([&](auto& c) { return c.Scan(from, 1000, false, &page); });
        if (!st.ok()) return Fail(st);
        for (const rpc::KvPair& kv : page.pairs) {
          if (kv.key > r.hi) break;
          if (++seen > half) {
            suggestion = kv.key;
            found = true;
            break;
          }
        }
        if (found || page.done || page.pairs.empty() || page.pairs.back().key >= r.hi) break;
        from = page.nextKey;
      }
      if (found) break;
    }
    if (!found) return Fail(Status::Unavailable("the keys changed during the scan: try again"));
    why = "the new mark would take its " + std::to_string(half) + " integer keys below " +
          std::to_string(suggestion) + ", about half";
  } else {
    const partition::HashRange* widest = &ranges.front();
    for (const partition::HashRange& r : ranges) {
      if (static_cast<long double>(r.hi) - r.lo > static_cast<long double>(widest->hi) - widest->lo) {
        widest = &r;
      }
    }
    suggestion = widest->lo + (widest->hi - widest->lo) / 2;
    why = "mostly string keys, whose hashes are uniform: the middle of its hash range [" +
          std::to_string(widest->lo) + ", " + std::to_string(widest->hi) + "]";
  }
  std::printf("suggested mark %lld: halves mark %lld (%s)\n", static_cast<long long>(suggestion),
              static_cast<long long>(mark), why.c_str());
  return kExitOk;
}

// A member catching up from the tail of "p" is not in the ring yet: the
// tail's stats name it, with its snapshot's progress and its lag.
void Cli::PrintImport(const partition::RingChange& c) const {
  std::string host;
  int port = 0;
  if (!partition::ParseHostPort(c.importer, "importer", &host, &port).ok()) return;
  ClientOptions o = flags_.client;
  o.host = host;
  o.port = port;
  Client client(o);
  std::map<std::string, int64_t> stats;
  if (!client.Stats(&stats).ok() || stats.count("cluster.import.bytes") == 0) return;
  const double mb = static_cast<double>(stats["cluster.import.bytes"]) / 1e6;
  const double total = static_cast<double>(stats["cluster.import.total_bytes"]) / 1e6;
  const char* what = c.state == "precopy" ? "pre-copy (writes flow, the source records them)"
                     : stats["cluster.import.full_copy_fenced"] != 0 ? "full copy (fenced)"
                                                                     : "copy";
  std::printf("    import %s: %lld%% (%.1f of ~%.1f MB, %lld keys, %.1f MB/s)",
              what, static_cast<long long>(stats["cluster.import.percent"]), mb, total,
              static_cast<long long>(stats["cluster.import.keys"]),
              static_cast<double>(stats["cluster.import.bytes_per_sec"]) / 1e6);
  if (stats["cluster.import.delta_keys"] > 0) {
    std::printf(", then %lld keys written meanwhile",
                static_cast<long long>(stats["cluster.import.delta_keys"]));
  }
  std::printf("\n");
}

void Cli::PrintJoiners(const partition::Partition& p) const {
  const partition::Member* tail = p.tail();
  if (tail == nullptr) return;
  ClientOptions o = flags_.client;
  o.host = tail->host;
  o.port = tail->port;
  Client c(o);
  std::map<std::string, int64_t> stats;
  if (!c.Stats(&stats).ok()) return;  // the roles above are what is known
  struct Joiner {
    int64_t lag = -1;
    std::map<std::string, int64_t> snapshot;
  };
  std::map<std::string, Joiner> joiners;
  const std::string lag_prefix = "cluster.chain.joiner.", snap_prefix = "cluster.chain.snapshot_to.";
  for (const auto& [name, value] : stats) {
    const bool lag = name.rfind(lag_prefix, 0) == 0;
    if (!lag && name.rfind(snap_prefix, 0) != 0) continue;
    const std::string rest = name.substr(lag ? lag_prefix.size() : snap_prefix.size());
    const size_t dot = rest.rfind('.');
    if (dot == std::string::npos) continue;
    Joiner& j = joiners[rest.substr(0, dot)];
    if (lag) {
      j.lag = value;
    } else {
      j.snapshot[rest.substr(dot + 1)] = value;
    }
  }
  for (const auto& [address, j] : joiners) {
    const bool streaming = !j.snapshot.empty() && j.snapshot.at("done") == 0;
    if (j.lag < 0 && !streaming) continue;  // a finished stream to a member now in the chain
    std::string line = "    joining  " + address + "  ";
    if (streaming) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "snapshot %lld%% (%.1f of %.1f MB, %.1f MB/s)",
                    static_cast<long long>(j.snapshot.at("percent")),
                    static_cast<double>(j.snapshot.at("bytes")) / 1e6,
                    static_cast<double>(j.snapshot.at("total_bytes")) / 1e6,
                    static_cast<double>(j.snapshot.at("bytes_per_sec")) / 1e6);
      line += buf;
    } else {
      line += "catching up from the log";
    }
    if (j.lag >= 0) line += ", " + std::to_string(j.lag) + " writes behind the tail";
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace
}  // namespace flatkv::client

int main(int argc, char** argv) { return flatkv::client::Main(argc, argv); }
