# SPDX-License-Identifier: Apache-2.0
"""The engine and what it owns: registrations, allocations, segments; sync helpers."""

from __future__ import annotations

import atexit
import bisect
import ctypes
import json
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from . import _errors
from . import _lib
from ._batch import Batch, RequestLike, _timeout_ns
from ._buffers import BufferRef, cuda_array
from ._errors import Status
from ._types import Access, BufferInfo, LogLevel, Notification, Op

PathLike = Union[str, "os.PathLike[str]"]
LogCallback = Callable[[LogLevel, str], None]

_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _forked_child() -> None:
    # The engines' threads did not survive the fork: the child must not touch them, nor
    # free them (te_engine_free would join threads that do not exist here).
    for e in list(_engines):
        e._foreign = True
        # A thread of the parent may have held the lock or been inside a call at the fork.
        e._lock = threading.Lock()
        e._idle = threading.Condition(e._lock)
        e._active = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


@atexit.register
def _close_engines() -> None:
    # Engine threads must be gone before the interpreter is: a log callback or a late
    # completion must never run into a finalized interpreter.
    for e in list(_engines):
        try:
            e.close()
        except Exception:
            pass


def _py_error(status: int, detail: str, func: str = "te") -> _errors.Error:
    return _errors.make_error(status, detail, func)


def _location(loc: Optional[str]) -> Optional[bytes]:
    return None if loc is None else str(loc).encode()


class Registration:
    """A region registered with ``Engine.register`` (te_mem_register).

    Holds the registered object (and its buffer export, so a bytearray cannot be resized
    under the engine) until ``unregister()``, the end of its ``with`` block, or
    ``Engine.close()``. Dropping the last Python reference does not unregister.
    """

    def __init__(self, engine: "Engine", addr: int, length: int, location: Optional[str],
                 access: Access, obj: Any, hold: Optional[BufferRef], readonly: bool) -> None:
        self.engine = engine
        self.addr = addr  #: start address
        self.length = length  #: bytes
        self.location = location  #: as given ("cpu", "cuda:0"...), None for "*"
        self.access = access
        self.obj = obj  #: the registered object (None for an int address)
        self.readonly = readonly  #: the buffer is read-only: it may not be READ into
        self._hold = hold
        self._active = True

    def __repr__(self) -> str:
        state = "" if self._active else " unregistered"
        return (f"<te.Registration 0x{self.addr:x}+{self.length} {self.location or '*'} "
                f"{self.access!r}{state}>")

    @property
    def registered(self) -> bool:
        """Still registered."""
        return self._active and not self.engine.closed

    def address(self, offset: int = 0) -> int:
        """``addr + offset``, checked to lie inside the region."""
        if not 0 <= offset <= self.length:
            raise _py_error(Status.OUT_OF_RANGE,
                            f"offset {offset} outside the registered {self.length} bytes")
        return self.addr + offset

    def unregister(self) -> None:
        """te_mem_unregister. BusyError while a live batch uses it (it stays registered);
        NotRegisteredError when already unregistered."""
        if not self._active:
            raise _py_error(Status.NOT_REGISTERED,
                            f"region 0x{self.addr:x} is already unregistered",
                            "Registration.unregister")
        self.engine._call(_lib.lib().te_mem_unregister, self.addr)
        self.engine._registration_closed(self)
        self._release()

    def close(self) -> None:
        """Unregister if still registered (no-op otherwise, or after Engine.close())."""
        if self._active and not self.engine.closed:
            self.unregister()
        else:
            self._release()

    def _release(self) -> None:
        self._active = False
        if self._hold is not None:
            self._hold.release()
            self._hold = None
        self.obj = None

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.close()
        except _errors.Error:
            if exc_type is None:
                raise


class Allocation:
    """Memory from ``Engine.alloc`` (te_mem_alloc / te_mem_alloc_registered): host memory
    ("cpu"), GPU memory ("cuda:0", "hip:0") or a transport's own memory ("cxl:0"), owned by
    the engine. Free it with ``free()`` or a ``with`` block; the engine frees what is left
    when it closes."""

    def __init__(self, engine: "Engine", addr: int, length: int, location: str,
                 access: Optional[Access]) -> None:
        self.engine = engine
        self.addr = addr  #: start address (a device pointer for GPU memory)
        self.length = length
        self.location = location
        self.access = access  #: registered with this access, or None if not registered
        self._active = True

    def __repr__(self) -> str:
        return f"<te.Allocation 0x{self.addr:x}+{self.length} {self.location}>"

    def address(self, offset: int = 0) -> int:
        """``addr + offset``, checked to lie inside the allocation."""
        if not 0 <= offset <= self.length:
            raise _py_error(Status.OUT_OF_RANGE,
                            f"offset {offset} outside the allocated {self.length} bytes")
        return self.addr + offset

    @property
    def is_host(self) -> bool:
        """Host memory (location cpu or cpu:N), which memoryview() may map."""
        return self.location == "cpu" or self.location.startswith("cpu:")

    def memoryview(self) -> memoryview:
        """A writable memoryview of host memory, valid until free() (using it later
        crashes the process). For device memory use read() and write()."""
        self._check()
        if not self.is_host:
            raise _py_error(Status.MEMORY_TYPE,
                            f"{self.location} memory cannot be mapped; use read()/write()")
        return memoryview((ctypes.c_char * self.length).from_address(self.addr)).cast("B")

    def read(self, offset: int = 0, length: Optional[int] = None) -> bytes:
        """Copy bytes out (te_mem_copy: works for device memory too)."""
        self._check()
        if length is None:
            length = self.length - offset
        self._range(offset, length)
        out = bytearray(length)
        if length:
            with BufferRef(out) as dst:
                self.engine._call(_lib.lib().te_mem_copy, dst.addr, self.addr + offset, length)
        return bytes(out)

    def write(self, data: Any, offset: int = 0) -> None:
        """Copy a bytes-like object in at ``offset`` (te_mem_copy)."""
        self._check()
        with BufferRef(data, what="data") as src:
            self._range(offset, src.nbytes)
            if src.nbytes:
                self.engine._call(_lib.lib().te_mem_copy, self.addr + offset, src.addr,
                                  src.nbytes)

    def free(self) -> None:
        """te_mem_free. BusyError while used by a live batch or a registration inside it;
        NotFoundError when already freed."""
        if not self._active:
            raise _py_error(Status.NOT_FOUND, f"allocation 0x{self.addr:x} is already freed",
                            "Allocation.free")
        self.engine._call(_lib.lib().te_mem_free, self.addr)
        self._active = False
        self.engine._allocation_closed(self)

    def close(self) -> None:
        """Free if not freed yet (no-op otherwise, or after Engine.close())."""
        if self._active and not self.engine.closed:
            self.free()
        self._active = False

    def _check(self) -> None:
        if not self._active or self.engine.closed:
            raise _py_error(Status.NOT_FOUND, f"allocation 0x{self.addr:x} was freed")

    def _range(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.length:
            raise _py_error(Status.OUT_OF_RANGE, f"[{offset}, +{length}) outside the "
                            f"allocation of {self.length} bytes")

    def __enter__(self) -> "Allocation":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.close()
        except _errors.Error:
            if exc_type is None:
                raise


class Segment:
    """An open remote segment (te_segment_open / te_segment_import); usable wherever a
    segment id is. Each Segment object holds one reference; ``close()`` drops it."""

    def __init__(self, engine: "Engine", seg_id: int, name: str) -> None:
        self.engine = engine
        self.id = seg_id  #: te_segment_id
        self.name = name
        self._open = True

    def __repr__(self) -> str:
        return f"<te.Segment {self.id} {self.name!r}>"

    def __index__(self) -> int:
        return self.id

    __int__ = __index__

    def buffers(self) -> List[BufferInfo]:
        """The segment's remote-accessible buffers, sorted by address."""
        return self.engine.buffers(self.id)

    def close(self) -> None:
        """te_segment_close: drop this object's reference (BusyError while live batches use
        the segment). A no-op when already closed or after Engine.close()."""
        if self._open and not self.engine.closed:
            self.engine._call(_lib.lib().te_segment_close, self.id)
        self._open = False

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.close()
        except _errors.Error:
            if exc_type is None:
                raise


class Engine:
    """A te engine (te_engine_new): configuration, transports, the local segment.

    ``Engine()`` uses $TE_CONFIG, else the embedded default (p2p metadata, tcp on
    loopback); ``Engine(path)`` or ``Engine.from_file(path)`` a YAML file;
    ``Engine(yaml=text)`` or ``Engine.from_string(text)`` YAML text. A bad configuration
    raises ConfigError whose detail starts with ``file:line:column``.

    Options: ``name`` names the YAML text in error messages; ``log`` is a callable
    ``(LogLevel, str)`` receiving the engine's log lines (from engine threads; exceptions it
    raises are ignored; it must not call this engine's methods, as some lines are logged
    while the engine or a transport holds a lock; default: warnings and errors to stderr);
    ``log_level`` a LogLevel threshold (default: $TE_LOG_LEVEL, else the config's
    log.level).

    Thread-safe, as libte is. ``close()`` (or the end of a ``with`` block) cancels live
    batches, waits for calls in progress on other threads and frees the engine; every later
    call raises EngineClosedError. An engine belongs to the process that created it: a
    forked child must create its own.
    """

    def __init__(self, config: Optional[PathLike] = None, *,
                 yaml: Union[str, bytes, None] = None, name: Optional[str] = None,
                 log: Optional[LogCallback] = None,
                 log_level: Optional[Union[LogLevel, int]] = None) -> None:
        self._h: Optional[int] = None
        self.name = ""  #: local segment name (te_engine_name)
        self._closing = False
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._pid = os.getpid()
        self._foreign = False  # set in a forked child
        self._batches: Dict[int, Batch] = {}
        self._regs: Dict[int, Registration] = {}
        self._allocs: Dict[int, Allocation] = {}
        self._readonly: List[Tuple[int, int]] = []  # sorted (addr, end) of read-only regions
        self._log_cb = None
        if config is not None and yaml is not None:
            raise _py_error(Status.INVALID_ARG, "give a config file or yaml text, not both",
                            "Engine")
        lib = _lib.lib()
        out = ctypes.c_void_p()
        path = os.fsencode(config) if config is not None else None
        text = yaml.encode() if isinstance(yaml, str) else (bytes(yaml) if yaml is not None
                                                             else None)
        if log is None and log_level is None and name is None and (
                path is not None or text is not None):
            if path is not None:
                st = lib.te_engine_new_from_file(path, ctypes.byref(out))
                func = "te_engine_new_from_file"
            else:
                st = lib.te_engine_new_from_string(text, len(text), ctypes.byref(out))
                func = "te_engine_new_from_string"
        else:
            opts = _lib.EngineOpts()
            opts.size = ctypes.sizeof(opts)
            opts.config_path = path
            opts.config_yaml = text
            opts.config_yaml_len = len(text) if text is not None else 0
            opts.config_name = name.encode() if name is not None else None
            opts.log_level = -1 if log_level is None else int(log_level)
            if log is not None:
                self._log_cb = _lib.LOG_FN(_log_trampoline(log))
                opts.log_fn = self._log_cb
            st = lib.te_engine_new(ctypes.byref(opts), ctypes.byref(out))
            func = "te_engine_new"
        if st < 0:
            raise _errors.last_error(st, func)
        self._h = out.value
        self.name = _lib.decode(lib.te_engine_name(self._h))
        _engines.add(self)

    @classmethod
    def from_file(cls, path: PathLike, **kw: Any) -> "Engine":
        """An engine configured by the YAML file at ``path``."""
        return cls(path, **kw)

    @classmethod
    def from_string(cls, yaml: Union[str, bytes], **kw: Any) -> "Engine":
        """An engine configured by YAML text."""
        return cls(yaml=yaml, **kw)

    def __repr__(self) -> str:
        return f"<te.Engine {self.name!r}{' closed' if self.closed else ''}>"

    # -- lifetime --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """close() was called (or has begun)."""
        return self._h is None or self._closing

    @property
    def handle(self) -> int:
        """The struct te_engine pointer, for C extensions (EngineClosedError if closed)."""
        self._check_open("Engine.handle")
        assert self._h is not None
        return self._h

    def close(self) -> None:
        """Cancel live batches, wait for calls in progress on other threads, free the
        engine (te_engine_free). Registrations and allocations end with it. Idempotent."""
        with self._lock:
            if self._h is None or self._closing:
                return
            self._closing = True
            h = self._h
            batches = list(self._batches.values())
        lib = _lib.lib()
        mine = not self._foreign
        if mine:
            for b in batches:  # wakes other threads blocked in Batch.wait
                _ = lib.te_batch_cancel(h, b.id)
        with self._lock:
            while self._active:
                self._idle.wait()
            self._h = None
        if mine:
            lib.te_engine_free(h)
        for r in list(self._regs.values()):
            r._release()
        for a in list(self._allocs.values()):
            a._active = False
        for b in batches:
            b._freed = True
        self._regs.clear()
        self._allocs.clear()
        self._batches.clear()
        self._readonly = []
        self._log_cb = None
        _engines.discard(self)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def set_log_level(self, level: Union[LogLevel, int]) -> None:
        """Change the log threshold at run time."""
        self._check_open("Engine.set_log_level")
        _lib.lib().te_engine_set_log_level(self._h, int(level))

    # -- calling libte ---------------------------------------------------------------------

    def _check_open(self, func: str) -> None:
        if self._h is None or self._closing:
            raise _errors.EngineClosedError(Status.INVALID_HANDLE, "the engine is closed", func)
        if self._foreign:
            raise _errors.EngineClosedError(
                Status.INVALID_HANDLE, f"the engine belongs to process {self._pid} "
                "(forked); create an engine in this process", func)

    def _call(self, fn: Any, *args: Any, raise_errors: bool = True) -> int:
        """Call ``fn(engine, *args)``; a negative status raises the matching Error with
        te_last_error() read at once, on this thread."""
        with self._lock:
            self._check_open(fn.__name__)
            self._active += 1
        try:
            st = fn(self._h, *args)
            if st < 0 and raise_errors:
                raise _errors.last_error(st, fn.__name__)
            return st
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0 and self._closing:
                    self._idle.notify_all()

    # -- memory ----------------------------------------------------------------------------

    def register(self, obj: Any, length: Optional[int] = None, *,
                 location: Optional[str] = None,
                 access: Union[Access, int] = Access.REMOTE) -> Registration:
        """Register memory with every installed transport (te_mem_register).

        ``obj`` is one of:

        - a writable buffer (bytearray, memoryview, mmap, array.array, numpy array, any
          C-contiguous object with the writable buffer protocol): registered from its
          start; ``length`` may register a prefix. Default location "cpu".
        - a read-only buffer (bytes, read-only memoryview or numpy array): only with
          access LOCAL or REMOTE_READ; the binding refuses READ requests into it.
        - an object with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors).
        - an int address with ``length`` (GPU memory: location "cuda:0", "hip:0"; None
          lets the memory-kind plugins detect it, as "*").
        - an Allocation (its address, length and location).

        The object is referenced until unregistered. Returns a Registration (a context
        manager that unregisters).
        """
        self._check_open("Engine.register")
        access = Access(int(access))
        hold: Optional[BufferRef] = None
        readonly = False
        ref = obj
        if isinstance(obj, bool):
            raise _py_error(Status.INVALID_ARG, "register: a bool is not an address",
                            "Engine.register")
        if isinstance(obj, int):
            if length is None:
                raise _py_error(Status.INVALID_ARG,
                                "register: an int address needs a length", "Engine.register")
            addr, size, ref = obj, int(length), None
        elif isinstance(obj, Allocation):
            obj._check()
            addr, size = obj.addr, obj.length if length is None else int(length)
            location = obj.location if location is None else location
        else:
            cai = cuda_array(obj)
            if cai is not None:
                addr, size, readonly = cai
            else:
                hold = BufferRef(obj, what="register")
                addr, size, readonly = hold.addr, hold.nbytes, hold.readonly
                location = "cpu" if location is None else location
            if length is not None:
                if not 0 <= length <= size:
                    if hold is not None:
                        hold.release()
                    raise _py_error(Status.OUT_OF_RANGE, f"register: length {length} over "
                                    f"the object's {size} bytes", "Engine.register")
                size = int(length)
        if readonly and access & Access.REMOTE_WRITE:
            if hold is not None:
                hold.release()
            raise _py_error(Status.INVALID_ARG,
                            f"register: {type(obj).__name__} is read-only; register it with "
                            "access LOCAL or REMOTE_READ", "Engine.register")
        try:
            self._call(_lib.lib().te_mem_register, addr, size, _location(location),
                       int(access))
        except BaseException:
            if hold is not None:
                hold.release()
            raise
        reg = Registration(self, addr, size, location, access, ref, hold, readonly)
        with self._lock:
            self._regs[addr] = reg
            if readonly:
                bisect.insort(self._readonly, (addr, addr + size))
        return reg

    def _registration_closed(self, reg: Registration) -> None:
        with self._lock:
            if self._regs.get(reg.addr) is reg:
                del self._regs[reg.addr]
            if reg.readonly:
                try:
                    self._readonly.remove((reg.addr, reg.addr + reg.length))
                except ValueError:
                    pass

    def _check_writable(self, addr: int, length: int) -> None:
        """Refuse a READ into a registered read-only buffer (bytes must stay immutable)."""
        ro = self._readonly
        # The last region starting before the range ends overlaps it if it ends after addr.
        i = bisect.bisect_left(ro, (addr + max(length, 1),)) - 1
        if i >= 0 and ro[i][1] > addr:
            raise _py_error(Status.INVALID_ARG, f"READ into [0x{addr:x}, +{length}): the "
                            "region is a read-only buffer", "te_batch_submit")

    def alloc(self, length: int, location: str = "cpu", *,
              access: Optional[Union[Access, int]] = None) -> Allocation:
        """Allocate ``length`` bytes at ``location`` (te_mem_alloc): "cpu"/"cpu:N"
        (page-aligned host memory), "cuda:N"/"hip:N" (GPU, through the plugin owning the
        kind), "cxl:N" (the cxl window). With ``access`` it is also registered with that
        access in the same step (te_mem_alloc_registered). Returns an Allocation."""
        lib = _lib.lib()
        out = ctypes.c_void_p()
        loc = str(location)
        if access is not None and lib.te_mem_alloc_registered is not None:
            self._call(lib.te_mem_alloc_registered, loc.encode(), int(length), int(access),
                       ctypes.byref(out))
        else:
            self._call(lib.te_mem_alloc, loc.encode(), int(length), ctypes.byref(out))
            if access is not None:  # a libte without te_mem_alloc_registered
                try:
                    self._call(lib.te_mem_register, out.value, int(length), loc.encode(),
                               int(access))
                except BaseException:
                    _ = lib.te_mem_free(self._h, out.value)
                    raise
        a = Allocation(self, out.value or 0, int(length), loc,
                       None if access is None else Access(int(access)))
        with self._lock:
            self._allocs[a.addr] = a
        return a

    def _allocation_closed(self, a: Allocation) -> None:
        with self._lock:
            if self._allocs.get(a.addr) is a:
                del self._allocs[a.addr]

    def copy(self, dst: Any, src: Any, length: Optional[int] = None) -> None:
        """Copy between host and device memory of this process (te_mem_copy). ``dst`` and
        ``src``: int addresses, Allocations, Registrations or buffers."""
        d, dlen, dh = self._local(dst, length, True)
        try:
            s, slen, sh = self._local(src, length if length is not None else dlen, False)
            try:
                n = length if length is not None else min(dlen, slen)
                self._call(_lib.lib().te_mem_copy, d, s, n)
            finally:
                if sh is not None:
                    sh.release()
        finally:
            if dh is not None:
                dh.release()

    def _local(self, obj: Any, length: Optional[int],
               written: bool) -> Tuple[int, int, Optional[BufferRef]]:
        """(address, length, held export or None) of a local-side argument."""
        if isinstance(obj, int) and not isinstance(obj, bool):
            if length is None:
                raise _py_error(Status.INVALID_ARG, "an int address needs a length")
            if written and self._readonly:
                self._check_writable(obj, length)
            return obj, int(length), None
        if isinstance(obj, (Registration, Allocation)):
            if written and isinstance(obj, Registration) and obj.readonly:
                raise _py_error(Status.INVALID_ARG, "the registered buffer is read-only")
            n = obj.length if length is None else int(length)
            if not 0 <= n <= obj.length:
                raise _py_error(Status.OUT_OF_RANGE, f"length {n} over the region's "
                                f"{obj.length} bytes")
            return obj.addr, n, None
        cai = cuda_array(obj)
        if cai is not None:
            addr, size, ro = cai
            hold = None
            if ro and written:
                raise _py_error(Status.INVALID_ARG, "the CUDA array is read-only")
        else:
            hold = BufferRef(obj, need_writable=written, what="local buffer")
            addr, size = hold.addr, hold.nbytes
        n = size if length is None else int(length)
        if not 0 <= n <= size:
            if hold is not None:
                hold.release()
            raise _py_error(Status.OUT_OF_RANGE, f"length {n} over the buffer's {size} bytes")
        return addr, n, hold

    # -- segments --------------------------------------------------------------------------

    def open_segment(self, name: str) -> Segment:
        """Open the remote segment ``name`` (te_segment_open); with p2p metadata the name
        is the peer's ``host:port`` (its ``Engine.name``)."""
        out = _lib.c_segment_id()
        self._call(_lib.lib().te_segment_open, str(name).encode(), ctypes.byref(out))
        return Segment(self, out.value, str(name))

    def import_segment(self, descriptor: Union[str, bytes]) -> Segment:
        """Open a segment from a descriptor obtained out of band (te_segment_import)."""
        data = descriptor.encode() if isinstance(descriptor, str) else bytes(descriptor)
        out = _lib.c_segment_id()
        self._call(_lib.lib().te_segment_import, data, len(data), ctypes.byref(out))
        try:
            name = str(json.loads(data).get("name", ""))
        except (ValueError, AttributeError):
            name = ""
        return Segment(self, out.value, name)

    def export_segment(self) -> str:
        """The local segment descriptor as JSON (te_segment_export), for import_segment."""
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        self._call(_lib.lib().te_segment_export, ctypes.byref(out), ctypes.byref(n))
        try:
            return ctypes.string_at(out.value, n.value).decode()
        finally:
            _lib.lib().te_free(out)

    def buffers(self, segment: Union[Segment, int] = _lib.SEGMENT_LOCAL) -> List[BufferInfo]:
        """Remote-accessible buffers of ``segment`` (0: this engine's), sorted by address
        (te_segment_buffers)."""
        lib = _lib.lib()
        n = ctypes.c_size_t()
        cap = 16
        while True:
            arr = (_lib.BufferInfo * cap)()
            self._call(lib.te_segment_buffers, int(segment), arr, cap, ctypes.byref(n))
            if n.value <= cap:
                break
            cap = n.value
        return [BufferInfo(b.addr, b.length, Access(b.access), _lib.decode(b.location))
                for b in arr[:n.value]]

    def probe(self, name: str, timeout: float = 1.0) -> None:
        """Return if the engine serving segment ``name`` answers within ``timeout``
        seconds (te_peer_probe); else raise PeerUnreachableError or TimeoutError."""
        ms = max(0, min(int(timeout * 1000), 0xFFFFFFFF))
        self._call(_lib.lib().te_peer_probe, str(name).encode(), ms)

    # -- transfers -------------------------------------------------------------------------

    def batch(self, capacity: int) -> Batch:
        """A new batch able to hold ``capacity`` requests in total (te_batch_new)."""
        return Batch(self, capacity)

    def _batch_opened(self, b: Batch) -> None:
        with self._lock:
            self._batches[b.id] = b

    def _batch_closed(self, b: Batch) -> None:
        with self._lock:
            if self._batches.get(b.id) is b:
                del self._batches[b.id]

    def transfer(self, requests: Iterable[RequestLike], *, timeout: Optional[float] = None,
                 notify: Optional[bytes] = None) -> None:
        """Run ``requests`` as one batch and wait; raises the first failure (a rejected
        request, a failed task) or TimeoutError when ``timeout`` seconds pass (the batch is
        then canceled). ``notify`` as in Batch.submit."""
        reqs = requests if isinstance(requests, list) else list(requests)
        if not reqs:
            return
        _timeout_ns(timeout)  # validates it before anything starts
        with Batch(self, len(reqs)) as b:
            b.submit(reqs, notify=notify)
            if not b.wait(timeout):
                b.cancel()
                b.wait(None, check=False)
                raise _errors.TimeoutError(
                    Status.TIMEOUT, f"{len(reqs)} requests not done within {timeout} s; "
                    "canceled", "Engine.transfer")

    def write(self, segment: Union[Segment, int], local: Any, remote: int,
              length: Optional[int] = None, *, timeout: Optional[float] = None,
              notify: Optional[bytes] = None) -> None:
        """WRITE ``local`` (registered: a buffer, Registration, Allocation, or an int
        address with ``length``) to address ``remote`` of ``segment`` and wait.
        ``length`` defaults to the whole of ``local``."""
        addr, n, hold = self._local(local, length, False)
        try:
            self.transfer([(Op.WRITE, segment, addr, remote, n)], timeout=timeout,
                          notify=notify)
        finally:
            if hold is not None:
                hold.release()

    def read(self, segment: Union[Segment, int], local: Any, remote: int,
             length: Optional[int] = None, *, timeout: Optional[float] = None) -> None:
        """READ ``length`` bytes (default: the size of ``local``) at address ``remote`` of
        ``segment`` into ``local`` (registered, writable) and wait."""
        addr, n, hold = self._local(local, length, True)
        try:
            self.transfer([(Op.READ, segment, addr, remote, n)], timeout=timeout)
        finally:
            if hold is not None:
                hold.release()

    # -- notify ----------------------------------------------------------------------------

    def recv_notify(self, limit: int = 64, *, timeout: float = 0.0) -> List[Notification]:
        """Take up to ``limit`` received notify messages, oldest first (te_notify_recv).
        With ``timeout`` > 0, poll until one arrives or the time passes; [] if none."""
        lib = _lib.lib()
        arr = (_lib.Notify * limit)()
        n = ctypes.c_size_t()
        deadline = time.monotonic() + timeout
        while True:
            self._call(lib.te_notify_recv, arr, limit, ctypes.byref(n))
            if n.value or time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        return [Notification(_lib.decode(m.sender), bytes(m.msg[:m.len]))
                for m in arr[:n.value]]


def _log_trampoline(fn: LogCallback):
    def call(user: Any, level: int, msg: bytes) -> None:
        try:
            fn(LogLevel(level) if 0 <= level <= 4 else level, _lib.decode(msg))
        except BaseException:
            pass  # an exception must not cross into C
    return call
