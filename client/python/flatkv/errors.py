"""The errors of the FlatKV client: one class per ErrorCode of the IDL, and
the failures no server answered (the network, a full pool).

Every error says what the caller may do next:

* ``in_doubt``: the call was a write and may have been applied (it may take
  effect later, or never). True for a write whose connection broke or timed
  out after it was sent, for ``STORAGE_ERROR``, and for ``UNAVAILABLE``
  whose message says the write "may or may not have been applied". Every
  other error means the call was not applied; a read is never in doubt.
* ``retryable``: calling again may succeed and is safe. The cause is
  transient (``NOT_OWNER``, ``OVERLOADED``, ``UNAVAILABLE``, the network,
  a full pool) and the call was not applied, or is idempotent (every call
  but ``append``: retrying a ``put`` or ``remove`` writes the same thing).
  An ``append`` in doubt is not retryable: it may append twice.

This is the server's contract (docs/application.md, "Errors and what each means
for a retry"); the client retries by itself only what is
retryable (see Client).
"""

from .ttypes import ErrorCode

# The words of an UNAVAILABLE whose write may have been applied.
_IN_DOUBT_PHRASE = "may or may not have been applied"

# Calls that change data (a failure of one may leave it in doubt), and of
# those the ones that are not idempotent.
WRITES = frozenset(("put", "remove", "append", "multiPut", "sput", "sremove"))
NOT_IDEMPOTENT = frozenset(("append",))


class FlatKVError(Exception):
    """Base of every error of this package.

    code: the server's ErrorCode (an int; ErrorCode._VALUES_TO_NAMES names
      it), None when no server answered.
    message: the server's message, or the client's.
    method: the Thrift method called ("put", "multiGet", ...).
    address: "host:port" of the member called, when one was.
    in_doubt, retryable: see the module's comment.
    """

    code = None
    transient = False  # a later call may succeed

    def __init__(self, message, method=None, address=None, in_doubt=False):
        super().__init__(message)
        self.message = message
        self.method = method
        self.address = address
        self.in_doubt = bool(in_doubt)

    @property
    def retryable(self):
        if not self.transient:
            return False
        return not self.in_doubt or self.method not in NOT_IDEMPOTENT

    @property
    def code_name(self):
        return ErrorCode._VALUES_TO_NAMES.get(self.code) if self.code is not None else None

    def __str__(self):
        where = []
        if self.method:
            where.append(self.method)
        if self.address:
            where.append(self.address)
        prefix = (self.code_name + ": ") if self.code is not None else ""
        return "%s%s%s" % (prefix, self.message, (" (%s)" % " at ".join(where)) if where else "")


class ServerError(FlatKVError):
    """A KvError the server answered; the subclass names its code."""


class KeyOutOfRange(ServerError):
    """The key is outside [storage.key_min, storage.key_max). Not applied."""
    code = ErrorCode.KEY_OUT_OF_RANGE


class ValueTooLarge(ServerError):
    """Over storage.max_value_bytes or the frame limit. Not applied."""
    code = ErrorCode.VALUE_TOO_LARGE


class InvalidArgument(ServerError):
    """A string key over storage.max_key_bytes, a bad cursor... Not applied."""
    code = ErrorCode.INVALID_ARGUMENT


class StorageError(ServerError):
    """The engine failed (I/O error, full disk, corruption). A write is in
    doubt; not retried by the client (an operator has to look)."""
    code = ErrorCode.STORAGE_ERROR


class NotOwner(ServerError):
    """The key belongs to another partition. Not applied; the client reads
    the ring again and retries."""
    code = ErrorCode.NOT_OWNER
    transient = True


class Unauthorized(ServerError):
    """An admin call without the right admin.token. Not applied."""
    code = ErrorCode.UNAUTHORIZED


class Overloaded(ServerError):
    """The server's worker queue is full. Not applied: retry later."""
    code = ErrorCode.OVERLOADED
    transient = True


class Unavailable(ServerError):
    """Shutting down, or the partition has no serving member. Not applied,
    unless the message says the write may or may not have been applied
    (then in_doubt)."""
    code = ErrorCode.UNAVAILABLE
    transient = True


class ProtocolError(FlatKVError):
    """The server refused the call as malformed (a TApplicationException:
    a missing argument, an unknown method). Not applied."""


class ConnectionError(FlatKVError):  # noqa: A001 (redis-py's name)
    """No answer: the member could not be reached, or the connection broke
    or answered garbage. ``sent`` says whether the call may have reached the
    server; a write that was sent is in doubt."""
    transient = True

    def __init__(self, message, method=None, address=None, in_doubt=False, sent=False):
        super().__init__(message, method, address, in_doubt)
        self.sent = sent


class TimeoutError(ConnectionError):  # noqa: A001 (redis-py's name)
    """Connecting, or waiting for the answer, took longer than the client's
    timeout (a paused or overloaded member, a cut link)."""


class PoolTimeout(FlatKVError):
    """Every connection to a member was in use for pool_timeout seconds.
    Nothing was sent."""
    transient = True


_BY_CODE = {c.code: c for c in (KeyOutOfRange, ValueTooLarge, InvalidArgument, StorageError,
                                NotOwner, Unauthorized, Overloaded, Unavailable)}


def from_kv_error(err, method, address):
    """The typed error of a server's KvError answer to "method"."""
    cls = _BY_CODE.get(err.code, ServerError)
    message = err.message or ""
    write = method in WRITES
    in_doubt = write and (cls is StorageError or
                          (cls is Unavailable and _IN_DOUBT_PHRASE in message))
    e = cls(message, method, address, in_doubt)
    if cls is ServerError:
        e.code = err.code  # a code this client does not know yet
    return e
