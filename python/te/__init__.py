# SPDX-License-Identifier: Apache-2.0
"""te: Python binding of the te transfer engine (ctypes over libte.so.0, stdlib only).

    import te
    with te.Engine.from_file("node.yaml") as engine:
        buf = bytearray(1 << 20)
        with engine.register(buf, access=te.Access.LOCAL):
            seg = engine.open_segment("10.0.0.2:7000")
            engine.write(seg, buf, remote_addr)

libte is found through $TE_LIBRARY, then the checkout's build/core/, then the dynamic
linker's search path. Reference: docs/python.md.
"""

from __future__ import annotations

from typing import Optional

from . import _errors, _lib
from ._batch import Batch
from ._engine import Allocation, Engine, Registration, Segment
from ._errors import (ArgumentError, BatchFullError, BusyError, CanceledError, ConfigError,
                      EngineClosedError, Error, InvalidArgumentError, InvalidHandleError,
                      MemoryTypeError, MetadataError, NoTransportError, NotRegisteredError,
                      OutOfRangeError, PathError, PeerError, PeerUnreachableError, PluginError,
                      RemoteAccessError, Status, SysError, UnknownSegmentError,
                      UnsupportedError, error_class, status_str)
from ._lib import DETAIL_MAX, NOTIFY_MAX, SEGMENT_LOCAL, LibraryNotFound
from ._types import (Access, BatchStatus, BufferInfo, LogLevel, Notification, Op, Request,
                     State, TaskStatus)

__version__ = "0.1.0"

TimeoutError = _errors.TimeoutError

# TimeoutError is left out: a star import would shadow the builtin (te.TimeoutError is a
# subclass of it, so `except TimeoutError` catches te's as well).
__all__ = [
    "Access", "Allocation", "ArgumentError", "Batch", "BatchFullError", "BatchStatus",
    "BufferInfo", "BusyError", "CanceledError", "ConfigError", "DETAIL_MAX", "Engine",
    "EngineClosedError", "Error", "InvalidArgumentError", "InvalidHandleError",
    "LibraryNotFound", "LogLevel", "MemoryTypeError", "MetadataError", "NOTIFY_MAX",
    "NoTransportError", "NotRegisteredError", "Notification", "Op", "OutOfRangeError",
    "PathError", "PeerError", "PeerUnreachableError", "PluginError", "Registration",
    "RemoteAccessError", "Request", "SEGMENT_LOCAL", "Segment", "State", "Status", "SysError",
    "TaskStatus", "UnknownSegmentError", "UnsupportedError", "error_class", "library_path",
    "state_str", "status_str", "version",
]


def library_path() -> str:
    """Path of the libte loaded (loading it if needed)."""
    return _lib.lib().path


def version() -> Optional[str]:
    """libte's version string (te_version), or None for a libte without te_version."""
    fn = _lib.lib().te_version
    return _lib.decode(fn()) if fn is not None else None


def state_str(state: int) -> str:
    """te_state_str(): "COMPLETED", ..."""
    return _lib.decode(_lib.lib().te_state_str(int(state)))
