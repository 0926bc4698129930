# SPDX-License-Identifier: Apache-2.0
"""Finds and loads libte.so.0 and declares the C API of include/te/te.h for ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path
from typing import Any, List, Optional, Tuple

# Constants mirrored from include/te/te.h (tests/python/test_layout.py checks them).
DETAIL_MAX = 256
NOTIFY_MAX = 4096
SEGMENT_LOCAL = 0

c_status = ctypes.c_int
c_batch_id = ctypes.c_uint64
c_segment_id = ctypes.c_uint32

# void (*te_log_fn)(void *user, enum te_log_level level, const char *msg)
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class EngineOpts(ctypes.Structure):
    """struct te_engine_opts"""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("config_path", ctypes.c_char_p),
        ("config_yaml", ctypes.c_char_p),
        ("config_yaml_len", ctypes.c_size_t),
        ("config_name", ctypes.c_char_p),
        ("log_fn", LOG_FN),
        ("log_user", ctypes.c_void_p),
        ("log_level", ctypes.c_int),
    ]


class BufferInfo(ctypes.Structure):
    """struct te_buffer_info"""

    _fields_ = [
        ("addr", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("access", ctypes.c_uint32),
        ("location", ctypes.c_char * 32),
    ]


class Request(ctypes.Structure):
    """struct te_request"""

    _fields_ = [
        ("opcode", ctypes.c_int),
        ("segment", c_segment_id),
        ("local", ctypes.c_void_p),
        ("remote", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
    ]


class TaskInfo(ctypes.Structure):
    """struct te_task_info"""

    _fields_ = [
        ("state", ctypes.c_int),
        ("status", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("slices", ctypes.c_uint32),
        ("retries", ctypes.c_uint32),
        ("transport", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("detail", ctypes.c_char * DETAIL_MAX),
    ]


class BatchInfo(ctypes.Structure):
    """struct te_batch_info"""

    _fields_ = [
        ("state", ctypes.c_int),
        ("tasks", ctypes.c_uint32),
        ("completed", ctypes.c_uint32),
        ("failed", ctypes.c_uint32),
        ("timed_out", ctypes.c_uint32),
        ("canceled", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
    ]


class Notify(ctypes.Structure):
    """struct te_notify"""

    _fields_ = [
        ("sender", ctypes.c_char * 256),
        ("len", ctypes.c_size_t),
        ("msg", ctypes.c_uint8 * NOTIFY_MAX),
    ]


_P = ctypes.POINTER
_vp = ctypes.c_void_p
_cp = ctypes.c_char_p
_sz = ctypes.c_size_t

# name: (restype, argtypes). Every te_* function the binding calls.
_PROTOTYPES = {
    "te_last_error": (_cp, []),
    "te_status_str": (_cp, [ctypes.c_int]),
    "te_status_is_retryable": (ctypes.c_bool, [ctypes.c_int]),
    "te_state_str": (_cp, [ctypes.c_int]),
    "te_engine_new": (c_status, [_P(EngineOpts), _P(_vp)]),
    "te_engine_new_from_file": (c_status, [_cp, _P(_vp)]),
    "te_engine_new_from_string": (c_status, [_cp, _sz, _P(_vp)]),
    "te_engine_free": (None, [_vp]),
    "te_engine_name": (_cp, [_vp]),
    "te_engine_set_log_level": (None, [_vp, ctypes.c_int]),
    "te_mem_register": (c_status, [_vp, _vp, _sz, _cp, ctypes.c_uint32]),
    "te_mem_unregister": (c_status, [_vp, _vp]),
    "te_mem_alloc": (c_status, [_vp, _cp, _sz, _P(_vp)]),
    "te_mem_free": (c_status, [_vp, _vp]),
    "te_mem_copy": (c_status, [_vp, _vp, _vp, _sz]),
    "te_segment_open": (c_status, [_vp, _cp, _P(c_segment_id)]),
    "te_segment_close": (c_status, [_vp, c_segment_id]),
    "te_segment_export": (c_status, [_vp, _P(_vp), _P(_sz)]),
    "te_segment_import": (c_status, [_vp, _cp, _sz, _P(c_segment_id)]),
    "te_segment_buffers": (c_status, [_vp, c_segment_id, _P(BufferInfo), _sz, _P(_sz)]),
    "te_peer_probe": (c_status, [_vp, _cp, ctypes.c_uint32]),
    "te_free": (None, [_vp]),
    "te_batch_new": (c_status, [_vp, ctypes.c_uint32, _P(c_batch_id)]),
    "te_batch_submit": (c_status, [_vp, c_batch_id, _P(Request), _sz]),
    "te_batch_submit_notify": (c_status, [_vp, c_batch_id, _P(Request), _sz, _vp, _sz]),
    "te_notify_recv": (c_status, [_vp, _P(Notify), _sz, _P(_sz)]),
    "te_task_status": (c_status, [_vp, c_batch_id, ctypes.c_uint32, _P(TaskInfo)]),
    "te_batch_status": (c_status, [_vp, c_batch_id, _P(BatchInfo)]),
    "te_batch_wait": (c_status, [_vp, c_batch_id, ctypes.c_int64]),
    "te_batch_cancel": (c_status, [_vp, c_batch_id]),
    "te_batch_free": (c_status, [_vp, c_batch_id]),
}

# Present in newer libte builds only; the binding raises UnsupportedError without them.
_OPTIONAL = {
    "te_mem_alloc_registered": (c_status, [_vp, _cp, _sz, ctypes.c_uint32, _P(_vp)]),
    "te_version": (_cp, []),
}


class LibraryNotFound(OSError):
    """libte.so.0 could not be loaded; the message lists every place tried and why."""


def _checkout_build_lib() -> Path:
    # python/te/_lib.py -> <repo>/build/core/libte.so.0 (meson's layout, default build dir)
    return Path(__file__).resolve().parents[2] / "build" / "core" / "libte.so.0"


def _candidates() -> List[Tuple[str, str]]:
    """(how it was found, what to dlopen), in search order."""
    out = []
    env = os.environ.get("TE_LIBRARY")
    if env:
        out.append(("$TE_LIBRARY", env))
        return out  # an explicit choice is never second-guessed
    build = _checkout_build_lib()
    out.append(("checkout build tree", str(build)))
    found = ctypes.util.find_library("te")
    if found:
        out.append(("ctypes.util.find_library('te')", found))
    out.append(("dynamic linker search (LD_LIBRARY_PATH, ld.so.cache)", "libte.so.0"))
    return out


def _plugin_dirs_of_build(lib_path: str) -> Optional[str]:
    """TE_PLUGIN_PATH for a libte that sits in a meson build tree (<build>/core/), else None."""
    core = Path(lib_path).resolve().parent
    build = core.parent
    plugins = build / "plugins"
    if core.name != "core" or not (build / "build.ninja").exists() or not plugins.is_dir():
        return None
    dirs = sorted({str(p.parent) for p in plugins.glob("*/*.so")})
    return ":".join(dirs) or None


class _Lib:
    """The loaded library: attribute access gives the declared C functions."""

    def __init__(self, cdll: ctypes.CDLL, path: str, how: str) -> None:
        self.cdll = cdll
        self.path = path
        self.how = how
        for name, (res, args) in _PROTOTYPES.items():
            fn = getattr(cdll, name)
            fn.restype = res
            fn.argtypes = args
            setattr(self, name, fn)
        for name, (res, args) in _OPTIONAL.items():
            fn = getattr(cdll, name, None)
            if fn is not None:
                fn.restype = res
                fn.argtypes = args
            setattr(self, name, fn)


_lock = threading.Lock()
_loaded: Optional[_Lib] = None


def lib() -> _Lib:
    """Load libte on first use (thread-safe) and return it."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
    return _loaded


def _load() -> _Lib:
    tried = []
    for how, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"  {how}: {path}: no such file")
            continue
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"  {how}: {path}: {e}")
            continue
        try:
            loaded = _Lib(cdll, path, how)
        except AttributeError as e:
            tried.append(f"  {how}: {path}: not a usable libte ({e})")
            continue
        if "TE_PLUGIN_PATH" not in os.environ:
            # libte of a build tree: use that build's transports, as its tools do.
            plugin_path = _plugin_dirs_of_build(path)
            if plugin_path:
                os.environ["TE_PLUGIN_PATH"] = plugin_path
        return loaded
    raise LibraryNotFound(
        "te: cannot load libte.so.0; tried, in order:\n" + "\n".join(tried) +
        "\nSet TE_LIBRARY to the full path of libte.so.0, build the checkout "
        "(meson setup build && ninja -C build), or install te (meson install).")


def decode(b: Any) -> str:
    """C string (bytes or None) to str; never fails."""
    if not b:
        return ""
    return bytes(b).decode("utf-8", "replace")
