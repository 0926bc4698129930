# SPDX-License-Identifier: Apache-2.0
"""Status codes of te_status.h and the exception raised for each."""

from __future__ import annotations

import builtins
import enum
from typing import Dict, Optional, Type

from . import _lib


class Status(enum.IntEnum):
    """enum te_status, without the TE_/TE_ERR_ prefix (Status.TIMEOUT is TE_ERR_TIMEOUT)."""

    OK = 0
    INPROGRESS = 1
    INVALID_ARG = -1
    INVALID_HANDLE = -2
    OVERFLOW = -3
    ADDRESS_OVERLAPPED = -4
    NOT_REGISTERED = -5
    OUT_OF_RANGE = -6
    UNKNOWN_SEGMENT = -7
    BATCH_FULL = -8
    BUSY = -9
    TOO_LARGE = -10
    EXISTS = -11
    NOT_FOUND = -12
    LINK_DOWN = -40
    CONN_RESET = -41
    TRANSIENT = -42
    AGAIN = -43
    DEVICE_FAILED = -44
    PATH_TIMEOUT = -45
    PEER_UNREACHABLE = -60
    REMOTE_ACCESS = -61
    PEER_REJECTED = -62
    PEER_RESTARTED = -63
    PROTOCOL = -64
    AUTH = -65
    NO_TRANSPORT = -66
    PEER_QUARANTINED = -67
    METADATA = -80
    METADATA_NOT_FOUND = -81
    METADATA_MALFORMED = -82
    METADATA_UNAVAILABLE = -83
    UNSUPPORTED = -100
    PLUGIN_NOT_FOUND = -101
    PLUGIN_INVALID = -102
    ABI_MISMATCH = -103
    PLUGIN_INIT = -104
    CONFIG = -105
    NO_DEVICE = -106
    MEMORY_TYPE = -107
    NOMEM = -120
    SYSTEM = -121
    TIMEOUT = -122
    CANCELED = -123
    SHUTDOWN = -124
    INTERNAL = -125


def status_str(status: int) -> str:
    """te_status_str(): the C name of any status value, e.g. "TE_ERR_TIMEOUT"."""
    return _lib.decode(_lib.lib().te_status_str(int(status)))


def _as_status(status: int):
    try:
        return Status(status)
    except ValueError:
        return int(status)


class Error(Exception):
    """Base of every te exception.

    Attributes:
        status: the te status (a Status member, or a plain int for values this binding
            does not know).
        status_name: te_status_str(status), e.g. "TE_ERR_NOT_REGISTERED".
        detail: what failed, where and why: te_last_error() read right after the failing
            call, or the failed task's detail text.
        func: the C function (or binding method) that failed.
        task: index of the failed task for errors from a batch, else None.
    """

    def __init__(self, status: int, detail: str = "", func: str = "",
                 task: Optional[int] = None) -> None:
        self.status = _as_status(status)
        try:
            self.status_name = status_str(status)
        except _lib.LibraryNotFound:
            self.status_name = getattr(self.status, "name", str(status))
        self.detail = detail
        self.func = func
        self.task = task
        super().__init__(self._message())

    def _message(self) -> str:
        # libte's details usually start with the function's name already.
        named = self.func and self.detail.startswith(self.func + ":")
        where = f"{self.func}: " if self.func and not named else ""
        task = f" (task {self.task})" if self.task is not None else ""
        name = getattr(self.status, "name", "?")
        text = f"{where}{self.status_name} ({name}, {int(self.status)}){task}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self):
        # Picklable (multiprocessing) although __init__ takes other arguments than args.
        return (_rebuild, (type(self), int(self.status), self.detail, self.func, self.task))

    @property
    def retryable(self) -> bool:
        """te_status_is_retryable(status): a path/link failure the core may retry."""
        return bool(_lib.lib().te_status_is_retryable(int(self.status)))


def _rebuild(cls, status, detail, func, task):
    return cls(status, detail, func, task)


# Groups, by te_status.h's blast radius.
class ArgumentError(Error):
    """-1..-39: the request is wrong; retrying it cannot help."""


class PathError(Error):
    """-40..-59: transient failure of one path (retryable)."""


class PeerError(Error):
    """-60..-79: the remote engine refused or is gone."""


class MetadataError(Error):
    """-80..-99: descriptor store or descriptor content."""


class PluginError(Error):
    """-100..-119: plugin, ABI and configuration."""


class SysError(Error):
    """-120..-139: memory, OS calls, deadlines, cancellation, shutdown."""


# The statuses applications handle most often.
class InvalidArgumentError(ArgumentError):
    """TE_ERR_INVALID_ARG: NULL, zero or malformed argument."""


class InvalidHandleError(ArgumentError):
    """TE_ERR_INVALID_HANDLE: freed, stale or forged batch handle."""


class EngineClosedError(InvalidHandleError):
    """The engine (or the object's engine) was closed; raised by the binding itself."""


class NotRegisteredError(ArgumentError):
    """TE_ERR_NOT_REGISTERED: local memory not registered with the engine."""


class OutOfRangeError(ArgumentError):
    """TE_ERR_OUT_OF_RANGE: range exceeds the registered region."""


class UnknownSegmentError(ArgumentError):
    """TE_ERR_UNKNOWN_SEGMENT: no such segment id or name."""


class BatchFullError(ArgumentError):
    """TE_ERR_BATCH_FULL: more requests than the batch capacity."""


class BusyError(ArgumentError):
    """TE_ERR_BUSY: object still in use (in-flight transfers)."""


class PeerUnreachableError(PeerError):
    """TE_ERR_PEER_UNREACHABLE: cannot connect to the peer."""


class RemoteAccessError(PeerError):
    """TE_ERR_REMOTE_ACCESS: remote range outside the peer's remote-accessible buffers."""


class NoTransportError(PeerError):
    """TE_ERR_NO_TRANSPORT: no installed transport reaches the peer."""


class UnsupportedError(PluginError):
    """TE_ERR_UNSUPPORTED: not supported (by a plugin, or by this libte build)."""


class ConfigError(PluginError):
    """TE_ERR_CONFIG: configuration error; detail starts with file:line:column."""


class MemoryTypeError(PluginError):
    """TE_ERR_MEMORY_TYPE: no transport supports that memory location."""


class TimeoutError(SysError, builtins.TimeoutError):
    """TE_ERR_TIMEOUT (also a builtin TimeoutError): a deadline passed."""

    def __init__(self, status: int = Status.TIMEOUT, detail: str = "", func: str = "",
                 task: Optional[int] = None) -> None:
        SysError.__init__(self, status, detail, func, task)


class CanceledError(SysError):
    """TE_ERR_CANCELED: canceled by the caller."""


_BY_STATUS: Dict[int, Type[Error]] = {
    Status.INVALID_ARG: InvalidArgumentError,
    Status.INVALID_HANDLE: InvalidHandleError,
    Status.NOT_REGISTERED: NotRegisteredError,
    Status.OUT_OF_RANGE: OutOfRangeError,
    Status.UNKNOWN_SEGMENT: UnknownSegmentError,
    Status.BATCH_FULL: BatchFullError,
    Status.BUSY: BusyError,
    Status.PEER_UNREACHABLE: PeerUnreachableError,
    Status.REMOTE_ACCESS: RemoteAccessError,
    Status.NO_TRANSPORT: NoTransportError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.CONFIG: ConfigError,
    Status.MEMORY_TYPE: MemoryTypeError,
    Status.TIMEOUT: TimeoutError,
    Status.CANCELED: CanceledError,
}

_GROUPS = (
    (-39, -1, ArgumentError),
    (-59, -40, PathError),
    (-79, -60, PeerError),
    (-99, -80, MetadataError),
    (-119, -100, PluginError),
    (-139, -120, SysError),
)


def error_class(status: int) -> Type[Error]:
    """The exception class raised for @status."""
    cls = _BY_STATUS.get(int(status))
    if cls is not None:
        return cls
    for lo, hi, group in _GROUPS:
        if lo <= status <= hi:
            return group
    return Error


def make_error(status: int, detail: str = "", func: str = "",
               task: Optional[int] = None) -> Error:
    """An instance of the right exception class for @status."""
    return error_class(status)(status, detail, func, task)


def last_error(status: int, func: str) -> Error:
    """The exception for a failed C call; call it before any other te_* call on this thread."""
    detail = _lib.decode(_lib.lib().te_last_error())
    return make_error(status, detail, func)
