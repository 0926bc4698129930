# SPDX-License-Identifier: Apache-2.0
"""Addresses of Python buffers: writable ones through ctypes from_buffer, read-only ones
through the buffer protocol's C API, both holding the export (the buffer cannot be resized
or freed) until released."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from . import _errors
from ._errors import Status


class _PyBuffer(ctypes.Structure):
    """Py_buffer (Include/pybuffer.h, stable since Python 3.3)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_PyBUF_SIMPLE = 0

# Private function objects: setting argtypes on ctypes.pythonapi's shared ones would change
# them for every other user in the process.
_get_buffer = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_PyBuffer),
                                ctypes.c_int)(("PyObject_GetBuffer", ctypes.pythonapi))
_release_buffer = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_PyBuffer))(
    ("PyBuffer_Release", ctypes.pythonapi))


def is_buffer(obj: Any) -> bool:
    """Whether @obj supports the buffer protocol."""
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


class BufferRef:
    """A held export of a contiguous buffer: ``addr``, ``nbytes``, ``readonly``.

    While held, the exporter keeps its memory in place (a bytearray cannot be resized, an
    mmap cannot be closed). ``release()`` ends the hold; it is idempotent.
    """

    __slots__ = ("obj", "addr", "nbytes", "readonly", "_array", "_view")

    def __init__(self, obj: Any, *, need_writable: bool = False, what: str = "buffer") -> None:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise _errors.make_error(
                Status.INVALID_ARG,
                f"{what}: {type(obj).__name__} supports neither the buffer protocol nor "
                "__cuda_array_interface__; pass an int address and a length instead",
                "te") from None
        with mv:
            nbytes, readonly, contiguous = mv.nbytes, mv.readonly, mv.c_contiguous
        if not contiguous:
            raise _errors.make_error(
                Status.INVALID_ARG, f"{what}: the buffer is not C-contiguous "
                "(numpy: np.ascontiguousarray)", "te")
        if readonly and need_writable:
            raise _errors.make_error(
                Status.INVALID_ARG, f"{what}: the buffer is read-only ({type(obj).__name__}) "
                "and would be written to", "te")
        self.obj = obj
        self.nbytes = nbytes
        self.readonly = readonly
        self._array: Optional[ctypes.Array] = None
        self._view: Optional[_PyBuffer] = None
        if not readonly:
            self._array = (ctypes.c_char * nbytes).from_buffer(obj)
            self.addr = ctypes.addressof(self._array)
        else:
            view = _PyBuffer()
            _get_buffer(obj, ctypes.byref(view), _PyBUF_SIMPLE)
            self._view = view
            self.addr = view.buf or 0

    def release(self) -> None:
        """End the hold on the exporter's memory."""
        self._array = None
        if self._view is not None:
            view, self._view = self._view, None
            _release_buffer(ctypes.byref(view))
        self.obj = None

    def __enter__(self) -> "BufferRef":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


def cuda_array(obj: Any):
    """(addr, nbytes, readonly) of an object with __cuda_array_interface__, else None."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = cai.get("shape", ())
    typestr = cai.get("typestr", "|u1")
    itemsize = int(typestr[2:]) if len(typestr) > 2 else 1
    n = itemsize
    for d in shape:
        n *= int(d)
    strides = cai.get("strides")
    if strides is not None:
        expect = itemsize
        for d, s in zip(reversed(shape), reversed(strides)):
            if d > 1 and s != expect:
                raise _errors.make_error(
                    Status.INVALID_ARG, "__cuda_array_interface__: not C-contiguous", "te")
            expect *= d
    ptr, readonly = cai["data"]
    return int(ptr), n, bool(readonly)
