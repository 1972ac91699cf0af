"""FlatKV's Python client.

    import flatkv
    kv = flatkv.Client("127.0.0.1", 9901)   # or Client(seeds=["kv1:9901", "kv2:9901"])
    kv.put(1, b"hello")
    kv.get(1)        # b"hello"; None when absent
    kv.sput("user:42", '{"name":"ada"}')

Client is ring-aware and thread-safe (client.py); every error is a
FlatKVError saying whether the call is in doubt and may be retried
(errors.py). The Thrift code of thrift/flatkv.thrift (FlatKV, ttypes,
constants) is generated into this package when it is built.
"""

from . import FlatKV, constants, ttypes  # noqa: F401 (generated)
from .client import Client
from .errors import (ConnectionError, FlatKVError, InvalidArgument, KeyOutOfRange,  # noqa: A004
                     NotOwner, Overloaded, PoolTimeout, ProtocolError, ServerError, StorageError,
                     TimeoutError, Unauthorized, Unavailable, ValueTooLarge)
from .ring import Ring
from .ttypes import ErrorCode, GetResult, KvPair, RingInfo, ScanResult, WriteMode  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "Client", "Ring", "FlatKV", "ttypes", "constants", "ErrorCode", "WriteMode", "KvPair",
    "FlatKVError", "ServerError", "KeyOutOfRange", "ValueTooLarge", "InvalidArgument",
    "StorageError", "NotOwner", "Unauthorized", "Overloaded", "Unavailable", "ProtocolError",
    "ConnectionError", "TimeoutError", "PoolTimeout",
]
