"""Connections to one member and their pool.

A Connection is one framed, binary-protocol Thrift connection (TLS when the
options carry a CA file), opened by the client itself so that a failure to
connect (nothing was sent) is told apart from a failure after the call was
sent. A ConnectionPool keeps the idle connections of one member, newest
first, and bounds how many exist at once; threads wait for a free one up to
pool_timeout.
"""

import select
import socket
import ssl
import threading
import time

from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport

from . import FlatKV
from .errors import ConnectionError, PoolTimeout, TimeoutError

try:  # the C codec of python3-thrift; the pure-Python one otherwise
    from thrift.protocol import fastbinary  # noqa: F401
    _Protocol = TBinaryProtocol.TBinaryProtocolAccelerated
except ImportError:  # pragma: no cover (Debian's python3-thrift has it)
    _Protocol = TBinaryProtocol.TBinaryProtocol


class Options:
    """How connections are made (Client's arguments of the same names)."""

    def __init__(self, connect_timeout=2.0, timeout=30.0, tls_ca_file=None, tls_cert_file=None,
                 tls_key_file=None, tls_check_hostname=True, max_connections=32,
                 pool_timeout=5.0):
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_connections = max_connections
        self.pool_timeout = pool_timeout
        self.ssl_context = None
        if tls_ca_file:
            ctx = ssl.create_default_context(cafile=tls_ca_file)  # CERT_REQUIRED
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = bool(tls_check_hostname)
            if tls_cert_file:
                ctx.load_cert_chain(tls_cert_file, tls_key_file)
            self.ssl_context = ctx
        elif tls_cert_file:
            raise ValueError("tls_cert_file needs tls_ca_file (the server is verified)")


def split_address(address):
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class Connection:
    """One open connection to "address"; client is the generated
    FlatKV.Client. Not thread-safe: a pool lends it to one thread at a
    time."""

    def __init__(self, address, options, method=None):
        self.address = address
        self.host, self.port = split_address(address)
        try:
            sock = socket.create_connection((self.host, self.port),
                                            timeout=options.connect_timeout)
        except socket.timeout as e:
            raise TimeoutError("connect timed out after %.3g s: %s" % (options.connect_timeout, e),
                               method, address) from e
        except OSError as e:
            raise ConnectionError("cannot connect: %s" % (e.strerror or e), method, address) from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if options.ssl_context is not None:
                # The handshake under the connect timeout.
                sock = options.ssl_context.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(options.timeout)
        except socket.timeout as e:
            sock.close()
            raise TimeoutError("TLS handshake timed out: %s" % e, method, address) from e
        except (OSError, ssl.SSLError, ValueError) as e:
            sock.close()
            raise ConnectionError("TLS handshake failed: %s" % e, method, address) from e
        self.sock = sock
        tsock = TSocket.TSocket(self.host, self.port)
        tsock.setHandle(sock)
        self.transport = TTransport.TFramedTransport(tsock)
        self.client = FlatKV.Client(_Protocol(self.transport))
        self.calls = 0  # calls it has answered

    def idle_ok(self):
        """False if the server closed this idle connection (or sent
        something unasked): it is not worth a call."""
        try:
            p = select.poll()
            p.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            return not p.poll(0)
        except (OSError, ValueError):
            return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class ConnectionPool:
    """The connections to one member: at most options.max_connections at
    once (None: no bound), idle ones reused newest first. Thread-safe."""

    def __init__(self, address, options):
        self.address = address
        self.options = options
        self._idle = []
        self._count = 0  # open connections, idle or lent
        self._cond = threading.Condition()

    def acquire(self, method=None):
        """An open connection (an idle one, else a new one). Raises
        ConnectionError/TimeoutError if the member cannot be reached,
        PoolTimeout if none is free within pool_timeout."""
        limit = self.options.max_connections
        deadline = None
        with self._cond:
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if conn.idle_ok():
                        return conn
                    conn.close()
                    self._count -= 1
                if limit is None or self._count < limit:
                    self._count += 1
                    break
                if deadline is None:
                    deadline = time.monotonic() + self.options.pool_timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolTimeout("all %d connections in use for %.3g s" %
                                      (limit, self.options.pool_timeout), method, self.address)
                self._cond.wait(left)
        try:
            return Connection(self.address, self.options, method)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def release(self, conn, broken=False):
        """Gives "conn" back; a broken one is closed, and so is every idle
        one (a member that broke one connection has likely restarted or
        gone: its other connections are stale too)."""
        with self._cond:
            if broken:
                conn.close()
                self._count -= 1
                stale, self._idle = self._idle, []
                self._count -= len(stale)
                for c in stale:
                    c.close()
            else:
                self._idle.append(conn)
            self._cond.notify()

    def close(self):
        """Closes the idle connections (lent ones are closed when given
        back broken, or stay usable)."""
        with self._cond:
            for c in self._idle:
                c.close()
            self._count -= len(self._idle)
            self._idle = []
            self._cond.notify_all()

    def size(self):
        """(open connections, idle ones)."""
        with self._cond:
            return self._count, len(self._idle)
