// The EventServer's TLS connections (SetTls()): an OpenSSL session on
// the connection's socket, its handshake, SSL_read into the input and
// SSL_write of the output (event_server.cc's notes, "TLS").
#include <climits>
#include <cstring>
#include <string>

#include <openssl/err.h>

#include "server/event_server.h"
#include "server/event_server_internal.h"
#include "server/tls.h"

namespace flatkv::server {

using event_io::kFrameHeader;
using event_io::kHandshakeSeconds;

// The session reads ahead (one read() takes whatever the client sent, not
// a record header and then its body) and writes record by record
// (SSL_MODE_ENABLE_PARTIAL_WRITE: the output is drained as records go out).
bool EventServer::IoThread::StartTls(Connection* conn, evutil_socket_t fd) {
  conn->ssl = server_->tls_->NewSsl();
  conn->write_event = event_new(base_, fd, EV_WRITE, &IoThread::OnTlsWritable, conn);
  if (conn->ssl == nullptr || conn->write_event == nullptr || SSL_set_fd(conn->ssl, fd) != 1) {
    return false;
  }
  SSL_set_accept_state(conn->ssl);
  SSL_set_mode(conn->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_set_read_ahead(conn->ssl, 1);
  return true;
}

void EventServer::IoThread::OnTlsWritable(evutil_socket_t, short, void* arg) {
  auto* conn = static_cast<Connection*>(arg);
  IoThread* io = conn->io;
  if (!conn->handshaken) {
    if (io->Handshake(conn, false)) io->TlsRead(conn);
    return;
  }
  if (conn->read_wants_write) {  // read again in this round
    conn->read_wants_write = false;
    event_active(conn->read_event, EV_READ, 1);
  }
  if (!io->TlsFlush(conn)) return;
  if (evbuffer_get_length(bufferevent_get_output(conn->bev)) == 0) OnWrite(conn->bev, conn);
}

void EventServer::IoThread::TlsReadable(Connection* conn, bool timed_out) {
  if (!conn->handshaken && !Handshake(conn, timed_out)) return;
  if (conn->write_wants_read) {
    conn->write_wants_read = false;
    event_active(conn->write_event, EV_WRITE, 1);
  }
  if (!conn->paused) TlsRead(conn);
}

bool EventServer::IoThread::Handshake(Connection* conn, bool timed_out) {
  std::string reason = "not finished within " + std::to_string(kHandshakeSeconds) + " s";
  bool count = true;
  if (!timed_out) {
    ERR_clear_error();
    const int rc = SSL_do_handshake(conn->ssl);
    if (rc == 1) {
      conn->handshaken = true;
      // No timeout from now on: an idle client stays connected.
      event_del(conn->read_event);
      if (event_add(conn->read_event, nullptr) != 0) {
        Close(conn);
        return false;
      }
      return true;
    }
    const int err = SSL_get_error(conn->ssl, rc);
    if (err == SSL_ERROR_WANT_READ) return false;  // the read event is added
    if (err == SSL_ERROR_WANT_WRITE) {
      if (event_add(conn->write_event, nullptr) != 0) Close(conn);
      return false;
    }
    const int sys = errno;
    const unsigned long code = ERR_peek_error();
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    reason = code != 0 ? buf : sys != 0 ? std::strerror(sys) : "connection closed";
    // A client that closes before finishing its hello (a port probe that
    // connects and closes) is not counted.
    count = !(err == SSL_ERROR_ZERO_RETURN || (code == 0 && sys == 0) ||
              ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING);
    ERR_clear_error();
  }
  if (count) {
    server_->tls_handshake_errors_.fetch_add(1, std::memory_order_relaxed);
    WarnRateLimited("TLS handshake failed; connection closed: " + reason);
  }
  Close(conn);
  return false;
}

// SSL_read straight into the input's own memory, record after record while
// the session holds more (read ahead), up to one largest frame plus its
// header; then the frames are served. End of stream or an error closes
// the connection.
void EventServer::IoThread::TlsRead(Connection* conn) {
  evbuffer* input = bufferevent_get_input(conn->bev);
  const size_t limit = max_frame_ + kFrameHeader;
  if (evbuffer_get_length(input) >= limit) {  // as in Read(): waiting, input full
    conn->stalled = true;
    event_del(conn->read_event);
    return;
  }
  evbuffer_unfreeze(input, 0);
  bool got = false;
  bool failed = false;
  for (size_t have = evbuffer_get_length(input); have < limit; have = evbuffer_get_length(input)) {
    evbuffer_iovec space;
    const size_t want = std::min(limit - have, ReadSize(input, have));
    if (evbuffer_reserve_space(input, static_cast<ev_ssize_t>(want), &space, 1) != 1) {
      failed = true;
      break;
    }
    ERR_clear_error();
    const int n = SSL_read(conn->ssl, space.iov_base,
                           static_cast<int>(std::min({want, space.iov_len, size_t{INT_MAX}})));
    if (n > 0) {
      space.iov_len = static_cast<size_t>(n);
      if (evbuffer_commit_space(input, &space, 1) != 0) {
        failed = true;
        break;
      }
      got = true;
      if (SSL_has_pending(conn->ssl) == 0) break;
      continue;
    }
    const int err = SSL_get_error(conn->ssl, n);
    if (err == SSL_ERROR_WANT_WRITE) {
      conn->read_wants_write = true;
      failed = event_add(conn->write_event, nullptr) != 0;
    } else if (err != SSL_ERROR_WANT_READ) {
      failed = true;  // close_notify, end of stream, a reset, a bad record
    }
    ERR_clear_error();
    break;
  }
  evbuffer_freeze(input, 0);
  if (failed) {
    Close(conn);
    return;
  }
  // Stopped with a full input while the session holds more: read on once
  // the frames are served (or at ResumeReading()).
  if (SSL_has_pending(conn->ssl) != 0) event_active(conn->read_event, EV_READ, 1);
  if (got) ServeFrames(conn);
}

// SSL_write of the output, a record (at most 16 KiB) at a time; what the
// socket does not take waits for the write event. False if the connection
// failed (it is closed then).
bool EventServer::IoThread::TlsFlush(Connection* conn) {
  constexpr size_t kRecord = 16 << 10;
  evbuffer* output = bufferevent_get_output(conn->bev);
  evbuffer_unfreeze(output, 1);
  bool failed = false;
  for (size_t len = evbuffer_get_length(output); len > 0; len = evbuffer_get_length(output)) {
    const size_t n = std::min(len, kRecord);
    uint8_t* data = evbuffer_pullup(output, static_cast<ev_ssize_t>(n));
    if (data == nullptr) {
      failed = true;
      break;
    }
    ERR_clear_error();
    const int written = SSL_write(conn->ssl, data, static_cast<int>(n));
    if (written > 0) {
      evbuffer_drain(output, static_cast<size_t>(written));
      continue;
    }
    const int err = SSL_get_error(conn->ssl, written);
    if (err == SSL_ERROR_WANT_WRITE) {
      failed = event_add(conn->write_event, nullptr) != 0;
    } else if (err == SSL_ERROR_WANT_READ) {
      conn->write_wants_read = true;
      failed = event_add(conn->read_event, nullptr) != 0;
    } else {
      failed = true;
    }
    ERR_clear_error();
    break;
  }
  evbuffer_freeze(output, 1);
  if (failed) Close(conn);
  return !failed;
}

}  // namespace flatkv::server
