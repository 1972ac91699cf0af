// Implementation notes
//
// One event_base, one evhttp, one thread. Stop() must wake a loop that may
// be idle in epoll_wait without libevent's threading support (which would
// have to be enabled before any event_base exists, Thrift's included), so
// the loop also watches the read end of a pipe: Stop() writes a 0 byte, the
// callback calls event_base_loopbreak() on the loop's own thread. The defer
// thread writes a 1 byte when it has answers for the loop to send.
//
// Handler methods throw rpc::KvError (that is how the Thrift boundary
// reports errors); Handle() catches it and everything else, because no
// exception may cross libevent's C frames. Paths are matched on the raw
// (still percent-encoded) path, so "%2F" inside a string key stays part of
// the key; the key is decoded once with evhttp_uridecode(), which reports
// its length and so keeps "%00" bytes.
#include "server/http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <system_error>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include "server/console.h"
#include "server/tls.h"

namespace flatkv::server {

// The console's page (server/console.html, embedded by server/embed.cmake).
extern const unsigned char kConsolePage[];
extern const size_t kConsolePageSize;

namespace {

// Room above the value limit before evhttp refuses a body unread, so that a
// value just over the limit gets the Handler's own VALUE_TOO_LARGE reason.
constexpr size_t kBodySlack = 64 * 1024;
// Headers besides the request line (which carries a percent-encoded key).
constexpr size_t kHeaderRoom = 16 * 1024;
// An idle or stalled HTTP connection is closed after this.
constexpr int kTimeoutSeconds = 30;
// Values above this are handed to evbuffer by reference instead of copied.
constexpr size_t kCopyLimit = 64 * 1024;

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 421: return "Misdirected Request";
    case 422: return "Unprocessable Content";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

struct HttpError {
  int status;
  const char* name;  // the ErrorCode, for the X-FlatKV-Error header
};

// The one place a KvError code becomes an HTTP status (docs/application.md, "HTTP port").
HttpError StatusForError(rpc::ErrorCode::type code) {
  switch (code) {
    case rpc::ErrorCode::KEY_OUT_OF_RANGE: return {422, "KEY_OUT_OF_RANGE"};
    case rpc::ErrorCode::VALUE_TOO_LARGE: return {413, "VALUE_TOO_LARGE"};
    case rpc::ErrorCode::INVALID_ARGUMENT: return {400, "INVALID_ARGUMENT"};
    case rpc::ErrorCode::STORAGE_ERROR: return {500, "STORAGE_ERROR"};
    case rpc::ErrorCode::NOT_OWNER: return {421, "NOT_OWNER"};
    case rpc::ErrorCode::UNAUTHORIZED: return {401, "UNAUTHORIZED"};
    case rpc::ErrorCode::OVERLOADED: return {503, "OVERLOADED"};
    case rpc::ErrorCode::UNAVAILABLE: return {503, "UNAVAILABLE"};
  }
  return {500, "STORAGE_ERROR"};
}

void AddHeader(evhttp_request* req, const char* name, const char* value) {
  evhttp_add_header(evhttp_request_get_output_headers(req), name, value);
}

// Replies "text" plus a newline as text/plain, made one line and bounded.
void SendText(evhttp_request* req, int code, std::string text) {
  if (text.size() > 1000) text.resize(1000);
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  text += '\n';
  AddHeader(req, "Content-Type", "text/plain; charset=utf-8");
  evbuffer_add(evhttp_request_get_output_buffer(req), text.data(), text.size());
  evhttp_send_reply(req, code, ReasonPhrase(code), nullptr);
}

void SendEmpty(evhttp_request* req, int code) {
  evhttp_send_reply(req, code, ReasonPhrase(code), nullptr);
}

// Replies the value's bytes as they are; a large value is not copied.
void SendValue(evhttp_request* req, std::string value) {
  evbuffer* out = evhttp_request_get_output_buffer(req);
  AddHeader(req, "Content-Type", "application/octet-stream");
  if (value.size() <= kCopyLimit) {
    evbuffer_add(out, value.data(), value.size());
  } else {
    auto* held = new std::string(std::move(value));
    auto release = [](const void*, size_t, void* arg) { delete static_cast<std::string*>(arg); };
    if (evbuffer_add_reference(out, held->data(), held->size(), release, held) != 0) {
      delete held;
      SendText(req, 500, "out of memory");
      return;
    }
  }
  evhttp_send_reply(req, 200, "OK", nullptr);
}

void SendError(evhttp_request* req, const rpc::KvError& e) {
  const HttpError h = StatusForError(e.code);
  AddHeader(req, "X-FlatKV-Error", h.name);
  if (e.code == rpc::ErrorCode::OVERLOADED) AddHeader(req, "Retry-After", "1");
  if (e.code == rpc::ErrorCode::UNAUTHORIZED) AddHeader(req, "WWW-Authenticate", "Bearer");
  SendText(req, h.status, e.message);
}

void SendMethodNotAllowed(evhttp_request* req, const char* allow) {
  AddHeader(req, "Allow", allow);
  SendText(req, 405, std::string("method not allowed; use ") + allow);
}

std::string ReadBody(evhttp_request* req) {
  evbuffer* in = evhttp_request_get_input_buffer(req);
  std::string body(evbuffer_get_length(in), '\0');
  if (!body.empty()) evbuffer_remove(in, body.data(), body.size());
  return body;
}

// "Authorization: Bearer <token>", else "X-FlatKV-Token", else empty.
std::string AdminToken(evhttp_request* req) {
  const evkeyvalq* headers = evhttp_request_get_input_headers(req);
  const char* auth = evhttp_find_header(headers, "Authorization");
  if (auth != nullptr && strncasecmp(auth, "Bearer ", 7) == 0) return auth + 7;
  const char* token = evhttp_find_header(headers, "X-FlatKV-Token");
  return token != nullptr ? token : "";
}

bool ParseKey(const std::string& text, int64_t* key) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *key);
  return !text.empty() && ec == std::errc() && ptr == end;
}

// A JSON object built field by field (admin routes).
class JsonObject {
 public:
  void Add(const std::string& key, int64_t v) { Raw(key, std::to_string(v)); }
  void Add(const std::string& key, bool v) { Raw(key, v ? "true" : "false"); }
  void Add(const std::string& key, double v) { Raw(key, std::to_string(v)); }
  void Add(const std::string& key, const std::string& v) { Raw(key, Quote(v)); }
  std::string Done() const { return "{" + out_ + "}"; }

 private:
  void Raw(const std::string& key, const std::string& value) {
    if (!out_.empty()) out_ += ',';
    out_ += Quote(key);
    out_ += ':';
    out_ += value;
  }
  static std::string Quote(const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        q += buf;
      } else {
        q += c;
      }
    }
    return q + "\"";
  }
  std::string out_;
};

void SendJson(evhttp_request* req, const JsonObject& json) {
  const std::string text = json.Done() + "\n";
  AddHeader(req, "Content-Type", "application/json");
  evbuffer_add(evhttp_request_get_output_buffer(req), text.data(), text.size());
  evhttp_send_reply(req, 200, "OK", nullptr);
}

// Methods are ints here, not evhttp_cmd_type: libevent reports a method it
// does not know with a value outside the enum's range (found by
// tests/fuzz/http_fuzz: "\x8aGET /metrics" gave 32768), and holding that
// in the enum type is undefined behaviour.
bool IsRead(int cmd) { return cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD; }

// GET, PUT (replace), POST (append) and DELETE of one integer key.
// Work that may wait on another member (up to cluster.peer_timeout_ms)
// runs off the HTTP loop in a ring (HttpServer::Defer), and at once on a
// standalone instance; what it returns sends the answer, on the loop.
using Reply = std::function<void(evhttp_request*)>;
using Deferrer = std::function<void(evhttp_request*, std::function<Reply()>)>;

// A read's answer: the value, or 404 with "missing".
Reply Found(rpc::GetResult r, std::string missing) {
  auto held = std::make_shared<rpc::GetResult>(std::move(r));
  return [held, missing = std::move(missing)](evhttp_request* req) {
    if (held->found) SendValue(req, std::move(held->value));
    else SendText(req, 404, missing);
  };
}

Reply Empty(int code) {
  return [code](evhttp_request* req) { SendEmpty(req, code); };
}

// GET, PUT, POST (append) and DELETE of one integer key. The call runs
// through "defer": in a ring it may wait on other members.
void ServeIntKey(Handler* h, const Deferrer& defer, evhttp_request* req, const std::string& text) {
  int64_t key = 0;
  if (!ParseKey(text, &key)) {
    SendText(req, 400, "key must be a 64-bit integer, not '" + text + "'");
    return;
  }
  const std::string missing = "key " + std::to_string(key) + " not found";
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  if (IsRead(cmd)) {
    defer(req, [h, key, missing] {
      rpc::GetResult r;
      h->get(r, key);
      return Found(std::move(r), missing);
    });
  } else if (cmd == EVHTTP_REQ_PUT) {
    defer(req, [h, key, body = ReadBody(req)] {
      h->put(key, body);
      return Empty(204);
    });
  } else if (cmd == EVHTTP_REQ_POST) {
    defer(req, [h, key, body = ReadBody(req)] {
      h->append(key, body);
      return Empty(204);
    });
  } else if (cmd == EVHTTP_REQ_DELETE) {
    defer(req, [h, key, missing]() -> Reply {
      if (h->remove(key)) return Empty(204);
      return [missing](evhttp_request* r) { SendText(r, 404, missing); };
    });
  } else {
    SendMethodNotAllowed(req, "GET, HEAD, PUT, POST, DELETE");
  }
}

// GET, PUT and DELETE of one string key, percent-encoded in the path.
void ServeStringKey(Handler* h, const Deferrer& defer, evhttp_request* req,
                    const std::string& encoded) {
  size_t size = 0;
  std::unique_ptr<char, decltype(&std::free)> decoded(
      evhttp_uridecode(encoded.c_str(), 0, &size), &std::free);
  if (decoded == nullptr) {
    SendText(req, 500, "out of memory");
    return;
  }
  std::string key(decoded.get(), size);
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  if (IsRead(cmd)) {
    defer(req, [h, key = std::move(key)] {
      rpc::GetResult r;
      h->sget(r, key);
      return Found(std::move(r), "string key not found");
    });
  } else if (cmd == EVHTTP_REQ_PUT) {
    defer(req, [h, key = std::move(key), body = ReadBody(req)] {
      h->sput(key, body);
      return Empty(204);
    });
  } else if (cmd == EVHTTP_REQ_DELETE) {
    defer(req, [h, key = std::move(key)]() -> Reply {
      if (h->sremove(key)) return Empty(204);
      return [](evhttp_request* r) { SendText(r, 404, "string key not found"); };
    });
  } else {
    SendMethodNotAllowed(req, "GET, HEAD, PUT, DELETE");
  }
}

void ServeInfo(Handler* h, evhttp_request* req) {
  rpc::NodeInfo i;
  h->info(i);
  JsonObject json;
  json.Add("version", i.version);
  json.Add("mark", i.mark);
  json.Add("keyMin", i.keyMin);
  json.Add("keyMax", i.keyMax);
  json.Add("role", i.role);
  json.Add("writeMode", std::string(i.writeMode == rpc::WriteMode::SAFE ? "safe" : "async"));
  json.Add("uptimeSeconds", i.uptimeSeconds);
  SendJson(req, json);
}

void ServeCompactionStatus(Handler* h, evhttp_request* req) {
  rpc::CompactionStatus s;
  h->compactionStatus(s);
  JsonObject json;
  json.Add("running", s.running);
  json.Add("percent", s.percent);
  json.Add("bytesDone", s.bytesDone);
  json.Add("bytesTotal", s.bytesTotal);
  json.Add("tablesCompacted", s.tablesCompacted);
  json.Add("bytesReclaimed", s.bytesReclaimed);
  json.Add("lastError", s.lastError);
  SendJson(req, json);
}

void ServeStats(Handler* h, evhttp_request* req) {
  std::map<std::string, int64_t> stats;
  h->stats(stats);
  JsonObject json;
  for (const auto& [name, value] : stats) json.Add(name, value);
  SendJson(req, json);
}

// GET: the mode; PUT with body safe|async (surrounding whitespace ignored).
void ServeWriteMode(Handler* h, evhttp_request* req) {
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  if (IsRead(cmd)) {
    SendText(req, 200, h->getWriteMode() == rpc::WriteMode::SAFE ? "safe" : "async");
    return;
  }
  if (cmd != EVHTTP_REQ_PUT) {
    SendMethodNotAllowed(req, "GET, HEAD, PUT");
    return;
  }
  std::string body = ReadBody(req);
  const size_t first = body.find_first_not_of(" \t\r\n");
  body = first == std::string::npos ? "" : body.substr(first, body.find_last_not_of(" \t\r\n") + 1 - first);
  if (body != "safe" && body != "async") {
    SendText(req, 400, "write mode must be safe or async, not '" + body.substr(0, 64) + "'");
    return;
  }
  h->setWriteMode(AdminToken(req), body == "safe" ? rpc::WriteMode::SAFE : rpc::WriteMode::ASYNC);
  SendEmpty(req, 204);
}

bool ServeConsole(Console* console, const Deferrer& defer, evhttp_request* req,
                  const std::string& what);

void ServeAdmin(Handler* h, Console* console, const Deferrer& defer, evhttp_request* req,
                const std::string& what) {
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  if (ServeConsole(console, defer, req, what)) return;
  if (what == "write-mode") {
    ServeWriteMode(h, req);
  } else if (what == "compact") {
    if (cmd != EVHTTP_REQ_POST) return SendMethodNotAllowed(req, "POST");
    h->compact(AdminToken(req));
    SendText(req, 202, "compaction started");
  } else if (what == "info" || what == "stats" || what == "compaction") {
    if (!IsRead(cmd)) return SendMethodNotAllowed(req, "GET, HEAD");
    if (what == "info") ServeInfo(h, req);
    else if (what == "stats") ServeStats(h, req);
    else ServeCompactionStatus(h, req);
  } else {
    SendText(req, 404, "no such admin route: /admin/" + what);
  }
}

std::string Trimmed(std::string body) {
  const size_t first = body.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return body.substr(first, body.find_last_not_of(" \t\r\n") + 1 - first);
}

// GET /ui: the page, which may talk to this origin only.
void ServePage(evhttp_request* req) {
  if (!IsRead(evhttp_request_get_command(req))) return SendMethodNotAllowed(req, "GET, HEAD");
  AddHeader(req, "Content-Type", "text/html; charset=utf-8");
  AddHeader(req, "Cache-Control", "no-store");
  AddHeader(req, "X-Frame-Options", "DENY");
  AddHeader(req, "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data:; frame-ancestors 'none'");
  evbuffer_add_reference(evhttp_request_get_output_buffer(req), kConsolePage, kConsolePageSize,
                         nullptr, nullptr);
  evhttp_send_reply(req, 200, "OK", nullptr);
}

void SendJsonText(evhttp_request* req, int code, const std::string& text) {
  AddHeader(req, "Content-Type", "application/json");
  AddHeader(req, "Cache-Control", "no-store");
  evbuffer_add(evhttp_request_get_output_buffer(req), text.data(), text.size());
  evhttp_send_reply(req, code, ReasonPhrase(code), nullptr);
}

// A console action's answer: {"ok":true,"message":...}, or the error as
// the CLI prints it ("flatkv: Unauthorized: wrong admin token") with the
// HTTP status and headers of that error.
void SendOutcome(evhttp_request* req, const Status& st, const std::string& done) {
  JsonObject json;
  json.Add("ok", st.ok());
  if (st.ok()) {
    json.Add("message", done);
    return SendJsonText(req, 200, json.Done() + "\n");
  }
  HttpError h = StatusForError(ToKvError(st).code);
  if (st.IsNotFound()) h = {404, "NOT_FOUND"};  // no such member: not an ErrorCode
  else AddHeader(req, "X-FlatKV-Error", h.name);
  if (h.status == 401) AddHeader(req, "WWW-Authenticate", "Bearer");
  json.Add("code", std::string(h.name));
  json.Add("error", "flatkv: " + st.ToString());
  SendJsonText(req, h.status, json.Done() + "\n");
}

// An action's usage error (as the CLI's usage errors read).
void SendUsage(evhttp_request* req, const std::string& message) {
  SendOutcome(req, Status::InvalidArgument(message), "");
}

// An action's outcome, sent later.
Reply Outcome(Status st, std::string done) {
  return [st = std::move(st), done = std::move(done)](evhttp_request* req) {
    SendOutcome(req, st, done);
  };
}

// /admin/members/<host:port>/write-mode | compact.
void ServeMemberAction(Console* console, const Deferrer& defer, evhttp_request* req,
                       const std::string& rest) {
  const size_t slash = rest.rfind('/');
  if (slash == std::string::npos || slash == 0) {
    return SendText(req, 404, "no such admin route: /admin/members/" + rest);
  }
  std::unique_ptr<char, decltype(&std::free)> decoded(
      evhttp_uridecode(rest.substr(0, slash).c_str(), 0, nullptr), &std::free);
  if (decoded == nullptr) return SendText(req, 500, "out of memory");
  const std::string member = decoded.get();
  const std::string action = rest.substr(slash + 1);
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  if (action == "write-mode") {
    if (cmd != EVHTTP_REQ_PUT) return SendMethodNotAllowed(req, "PUT");
    const std::string mode = Trimmed(ReadBody(req));
    if (mode != "safe" && mode != "async") {
      return SendUsage(req, "write mode must be safe or async, not '" + mode.substr(0, 64) + "'");
    }
    defer(req, [console, member, mode, token = AdminToken(req)] {
      const Status st = console->SetWriteMode(
          member, token, mode == "safe" ? rpc::WriteMode::SAFE : rpc::WriteMode::ASYNC);
      return Outcome(st, "write mode of " + member + " is now " + mode);
    });
  } else if (action == "compact") {
    if (cmd != EVHTTP_REQ_POST) return SendMethodNotAllowed(req, "POST");
    defer(req, [console, member, token = AdminToken(req)] {
      return Outcome(console->Compact(member, token), "compaction started on " + member);
    });
  } else {
    SendText(req, 404, "no such member action: " + action + " (write-mode, compact)");
  }
}

// The console's routes under /admin/; false if "what" is none of them.
bool ServeConsole(Console* console, const Deferrer& defer, evhttp_request* req,
                  const std::string& what) {
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  std::string rest;
  if (what == "ring" || what == "members") {
    if (!IsRead(cmd)) {
      SendMethodNotAllowed(req, "GET, HEAD");
    } else if (what == "ring") {
      SendJsonText(req, 200, console->RingJson());
    } else {
      // The first request after an idle spell waits for a round.
      defer(req, [console] {
        return [json = console->MembersJson()](evhttp_request* r) { SendJsonText(r, 200, json); };
      });
    }
  } else if (what.compare(0, 8, "members/") == 0) {
    ServeMemberAction(console, defer, req, what.substr(8));
  } else if (what == "ring/remove-mark") {
    if (cmd != EVHTTP_REQ_POST) {
      SendMethodNotAllowed(req, "POST");
      return true;
    }
    const std::string text = Trimmed(ReadBody(req));
    int64_t mark = 0;
    if (!ParseKey(text, &mark)) {
      SendUsage(req, "remove-mark wants an integer mark, not '" + text.substr(0, 64) + "'");
    } else {
      defer(req, [console, mark, token = AdminToken(req)] {
        return Outcome(console->RemoveMark(token, mark),
                       "removal of mark " + std::to_string(mark) + " started");
      });
    }
  } else if (what == "ring/abort-change") {
    if (cmd != EVHTTP_REQ_POST) {
      SendMethodNotAllowed(req, "POST");
    } else {
      defer(req, [console, token = AdminToken(req)] {
        return Outcome(console->AbortChange(token), "ring change rolled back");
      });
    }
  } else {
    return false;
  }
  return true;
}

// libevent's diagnostics (a bind failure, a malformed request) go to the
// log at debug level: the caller reports what matters in its own words.
void LibeventLog(int severity, const char* message) {
  const int saved = errno;  // the caller may still read errno afterwards
  if (severity == EVENT_LOG_ERR) spdlog::error("libevent: {}", message);
  else spdlog::debug("libevent: {}", message);
  errno = saved;
}

// Sizes, timeouts and methods of the evhttp: a body is refused before it
// is buffered, a long string key still fits the request line.
void SetLimits(evhttp* http, uint64_t max_value_bytes, uint32_t max_key_bytes) {
  evhttp_set_max_body_size(http, static_cast<ev_ssize_t>(max_value_bytes + kBodySlack));
  evhttp_set_max_headers_size(http, static_cast<ev_ssize_t>(3 * size_t{max_key_bytes} + kHeaderRoom));
  evhttp_set_timeout(http, kTimeoutSeconds);
  // An oversized body is read and dropped before the 413, as nginx does:
  // closing at once would make most clients see a reset instead of it.
  evhttp_set_flags(http, EVHTTP_SERVER_LINGERING_CLOSE);
  evhttp_set_allowed_methods(http, 0xffff);  // we answer 405 ourselves
  evhttp_set_default_content_type(http, "text/plain; charset=utf-8");
}

// The port a socket is bound to (the real one when 0 was asked for).
int BoundPort(evhttp_bound_socket* bound) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(evhttp_bound_socket_get_fd(bound), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 0;
  }
  return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

bool HasPrefix(const std::string& s, const char* prefix, std::string* rest) {
  const size_t n = std::char_traits<char>::length(prefix);
  if (s.compare(0, n, prefix) != 0) return false;
  *rest = s.substr(n);
  return true;
}

}  // namespace

HttpServer::HttpServer(Handler* handler, const Config& config)
    : handler_(handler), config_(config) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  event_set_log_callback(LibeventLog);
  console_ = std::make_unique<Console>(handler_, config_);
  const std::string address =
      config_.server.host + ":" + std::to_string(config_.server.http_port);
  base_ = event_base_new();
  http_ = base_ != nullptr ? evhttp_new(base_) : nullptr;
  if (http_ == nullptr || pipe2(wake_fds_, O_NONBLOCK | O_CLOEXEC) != 0) {
    Free();
    return Status::IOError("HTTP " + address + ": cannot create the event loop");
  }
  wakeup_ = event_new(base_, wake_fds_[0], EV_READ | EV_PERSIST, &HttpServer::OnWakeup, this);
  if (wakeup_ == nullptr || event_add(wakeup_, nullptr) != 0) {
    Free();
    return Status::IOError("HTTP " + address + ": cannot create the event loop");
  }
  SetLimits(http_, handler_->max_value_bytes(), config_.storage.max_key_bytes);
  evhttp_set_gencb(http_, &HttpServer::OnRequest, this);
  if (tls_) evhttp_set_bevcb(http_, &HttpServer::NewTlsBufferevent, this);
  evhttp_bound_socket* bound = evhttp_bind_socket_with_handle(
      http_, config_.server.host.c_str(), static_cast<uint16_t>(config_.server.http_port));
  if (bound == nullptr) {
    const int err = errno;
    Free();
    return Status::FromErrno("HTTP " + address, err);
  }
  port_ = BoundPort(bound);
  try {
    defer_thread_ = std::thread([this] { DeferLoop(); });
    thread_ = std::thread([this] { event_base_dispatch(base_); });
  } catch (const std::system_error& e) {
    StopDeferring();
    Free();
    return Status::IOError("HTTP " + address + ": cannot start its thread: " + e.what());
  }
  spdlog::info("serving HTTP on port {}", port_);
  return Status::OK();
}

// evhttp's connection of an accepted socket (evhttp sets the socket and
// its callbacks later): an accepting OpenSSL bufferevent on the current
// certificate.
bufferevent* HttpServer::NewTlsBufferevent(event_base* base, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  SSL* ssl = self->tls_->NewCountedSsl();  // evhttp owns the callbacks: counted on free
  if (ssl == nullptr) return nullptr;
  bufferevent* bev =
      bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
  return bev;
}

void HttpServer::Stop() {
  SetStopping();
  // The action running, if any, ends first (within cluster.peer_timeout_ms);
  // answers not sent by then go with their connections in Free().
  StopDeferring();
  if (thread_.joinable()) {
    const char byte = 0;
    while (write(wake_fds_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  Free();
  if (console_) console_->Stop();  // after the HTTP thread: nothing asks it any more
}

void HttpServer::Free() {
  if (http_ != nullptr) evhttp_free(http_);  // closes every connection
  if (wakeup_ != nullptr) event_free(wakeup_);
  if (base_ != nullptr) event_base_free(base_);
  for (int& fd : wake_fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  http_ = nullptr;
  wakeup_ = nullptr;
  base_ = nullptr;
}

void HttpServer::OnWakeup(int fd, short /*what*/, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  char bytes[64];
  bool stop = false;
  ssize_t n;
  while ((n = read(fd, bytes, sizeof(bytes))) > 0 || (n < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < n; ++i) stop = stop || bytes[i] == 0;
  }
  if (stop) {
    event_base_loopbreak(self->base_);
    return;
  }
  self->SendDeferred();
}

void HttpServer::Defer(evhttp_request* req, std::function<Answer()> work) {
  std::lock_guard<std::mutex> lock(defer_mu_);
  jobs_.emplace_back(req, std::move(work));
  defer_cv_.notify_one();
}

void HttpServer::DeferLoop() {
  std::unique_lock<std::mutex> lock(defer_mu_);
  for (;;) {
    defer_cv_.wait(lock, [this] { return defer_stop_ || !jobs_.empty(); });
    if (defer_stop_) return;
    auto [req, work] = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    Answer answer;
    try {
      answer = work();
    } catch (const rpc::KvError& e) {
      answer = [e](evhttp_request* r) { SendError(r, e); };
    } catch (const std::exception& e) {
      // (The request is the loop's: its URI is logged when answered.)
      answer = [what = std::string(e.what())](evhttp_request* r) {
        spdlog::error("HTTP {}: {}", evhttp_request_get_uri(r), what);
        SendText(r, 500, "internal error: " + what);
      };
    }
    lock.lock();
    answers_.emplace_back(req, std::move(answer));
    const char byte = 1;
    while (write(wake_fds_[1], &byte, 1) < 0 && errno == EINTR) {
    }
  }
}

void HttpServer::SendDeferred() {
  std::vector<std::pair<evhttp_request*, Answer>> answers;
  {
    std::lock_guard<std::mutex> lock(defer_mu_);
    answers.swap(answers_);
  }
  for (auto& [req, answer] : answers) answer(req);
}

void HttpServer::StopDeferring() {
  {
    std::lock_guard<std::mutex> lock(defer_mu_);
    defer_stop_ = true;
  }
  defer_cv_.notify_all();
  if (defer_thread_.joinable()) defer_thread_.join();
}

void HttpServer::OnRequest(evhttp_request* req, void* arg) {
  static_cast<HttpServer*>(arg)->Handle(req);
}

void HttpServer::Handle(evhttp_request* req) {
  try {
    const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
    const char* path = uri != nullptr ? evhttp_uri_get_path(uri) : nullptr;
    if (path == nullptr) return SendText(req, 400, "malformed request URI");
    Route(req, path);
  } catch (const rpc::KvError& e) {
    SendError(req, e);
  } catch (const std::exception& e) {
    spdlog::error("HTTP {}: {}", evhttp_request_get_uri(req), e.what());
    SendText(req, 500, std::string("internal error: ") + e.what());
  } catch (...) {
    SendText(req, 500, "internal error");
  }
}

void HttpServer::Route(evhttp_request* req, const std::string& path) {
  const int cmd = evhttp_request_get_command(req);  // int: see IsRead
  std::string rest;
  const auto off_loop = [this](evhttp_request* r, std::function<Reply()> work) {
    Defer(r, std::move(work));
  };
  if (path == "/health") {
    if (!IsRead(cmd)) return SendMethodNotAllowed(req, "GET, HEAD");
    const std::string unready = handler_->NotReady();
    if (stopping_.load(std::memory_order_relaxed)) SendText(req, 503, "stopping");
    else if (!unready.empty()) SendText(req, 503, unready);
    else if (const std::string degraded = handler_->Degraded(); !degraded.empty())
      SendText(req, 200, "degraded: " + degraded);
    else SendText(req, 200, "ok");
  } else if (path == "/metrics") {
    if (!IsRead(cmd)) return SendMethodNotAllowed(req, "GET, HEAD");
    std::map<std::string, int64_t> stats;
    handler_->CollectStats(&stats);
    const std::string text = PrometheusText(stats, handler_->latencies());
    AddHeader(req, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    evbuffer_add(evhttp_request_get_output_buffer(req), text.data(), text.size());
    evhttp_send_reply(req, 200, "OK", nullptr);
  } else if (HasPrefix(path, "/kv/", &rest) || HasPrefix(path, "/skv/", &rest)) {
    // Standalone, a call never waits on another instance: answered here.
    const Deferrer defer =
        handler_->ring_view() == nullptr
            ? Deferrer([](evhttp_request* r, std::function<Reply()> work) { work()(r); })
            : Deferrer(off_loop);
    if (path[1] == 'k') ServeIntKey(handler_, defer, req, rest);
    else ServeStringKey(handler_, defer, req, rest);
  } else if (HasPrefix(path, "/admin/", &rest)) {
    ServeAdmin(handler_, console_.get(), off_loop, req, rest);
  } else if (path == "/ui") {
    ServePage(req);
  } else {
    SendText(req, 404, "no such path: " + path);
  }
}

}  // namespace flatkv::server
