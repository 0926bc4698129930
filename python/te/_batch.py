# SPDX-License-Identifier: Apache-2.0
"""Batches: submit READ/WRITE requests, wait, query task and batch states, cancel, free."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence, Union

from . import _errors
from . import _lib
from ._errors import Status
from ._types import BatchStatus, Op, Request, State, TaskStatus

if TYPE_CHECKING:
    from ._engine import Engine

RequestLike = Union[Request, Sequence[Any]]


def _timeout_ns(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise _errors.make_error(Status.INVALID_ARG,
                                 f"timeout must be >= 0 seconds or None, got {timeout}", "te")
    return int(timeout * 1e9)


def _bad_request(reqs: List[Any]) -> _errors.Error:
    for i, r in enumerate(reqs):
        try:
            if len(r) != 5:
                raise TypeError(f"{len(r)} fields")
            _lib.Request(*r)
        except (TypeError, ValueError, RuntimeError) as e:
            return _errors.make_error(
                Status.INVALID_ARG, f"request {i}: {r!r} is not (op, segment, local address, "
                f"remote address, length) of ints: {e}", "Batch.submit", i)
    return _errors.make_error(Status.INVALID_ARG, "malformed requests", "Batch.submit")


class Batch:
    """A batch of transfer requests (te_batch_*); make one with ``Engine.batch(capacity)``.

    Each submitted request becomes a task, numbered from 0 in submission order. Use it as a
    context manager: on exit a batch still in flight is canceled and waited for, then freed.
    Submitting is serialized per batch (one batch per thread); queries are thread-safe.
    """

    def __init__(self, engine: "Engine", capacity: int) -> None:
        out = _lib.c_batch_id()
        engine._call(_lib.lib().te_batch_new, int(capacity), ctypes.byref(out))
        self._engine = engine
        self.id: int = out.value  #: the te_batch_id handle
        self.capacity = int(capacity)
        self._ntasks = 0
        self._freed = False
        engine._batch_opened(self)

    def __repr__(self) -> str:
        return f"<te.Batch id=0x{self.id:x} capacity={self.capacity} tasks={self._ntasks}>"

    # -- submitting ------------------------------------------------------------------------

    def submit(self, requests: Iterable[RequestLike], *,
               notify: Optional[bytes] = None) -> None:
        """Append ``requests`` as tasks and start them (te_batch_submit).

        A request is a ``te.Request`` or a tuple ``(op, segment, local, remote, length)``
        with ``local`` the address of registered memory. Requests are validated at once: a
        rejected one becomes an INVALID task and the others proceed; the first rejection is
        raised (``.task`` is its index, ``.detail`` says why). If the batch cannot hold them
        all, nothing is appended (BatchFullError).

        ``notify``: bytes delivered to the target engine once every task of the batch has
        COMPLETED (te_batch_submit_notify); all requests must go to one remote segment.
        """
        reqs = requests if isinstance(requests, list) else list(requests)
        n = len(reqs)
        engine = self._engine
        try:
            # ctypes converts each 5-tuple (Segment objects through __index__).
            arr = (_lib.Request * n)(*reqs)
        except (TypeError, ValueError, RuntimeError):
            raise _bad_request(reqs) from None
        if engine._readonly:
            for r in reqs:
                if r[0] == Op.READ:
                    engine._check_writable(r[2], r[4])
        before = self._ntasks
        try:
            if notify is None:
                engine._call(_lib.lib().te_batch_submit, self.id, arr, n)
            else:
                msg = bytes(notify)
                engine._call(_lib.lib().te_batch_submit_notify, self.id, arr, n, msg,
                             len(msg))
        except _errors.Error as e:
            self._after_rejection(e, before)
            raise
        self._ntasks = before + n

    def read(self, segment: Any, local: Any, remote: int, length: Optional[int] = None) -> int:
        """Submit one READ of ``remote`` on ``segment`` into ``local``; returns its task
        index. ``local``: a Registration, Allocation, int address or registered buffer."""
        return self._one(Op.READ, segment, local, remote, length)

    def write(self, segment: Any, local: Any, remote: int, length: Optional[int] = None) -> int:
        """Submit one WRITE of ``local`` to ``remote`` on ``segment``; returns its task
        index. ``local``: a Registration, Allocation, int address or registered buffer."""
        return self._one(Op.WRITE, segment, local, remote, length)

    def _one(self, op: Op, segment: Any, local: Any, remote: int,
             length: Optional[int]) -> int:
        addr, length, hold = self._engine._local(local, length, op == Op.READ)
        try:
            index = self._ntasks
            self.submit([(op, segment, addr, remote, length)])
            return index
        finally:
            if hold is not None:
                hold.release()

    def _after_rejection(self, e: _errors.Error, before: int) -> None:
        """Learn how many tasks exist now and which new one was rejected first."""
        try:
            info = self.status()
        except _errors.Error:
            return
        self._ntasks = info.tasks
        for i in range(before, info.tasks):
            t = self.task(i)
            if t.state == State.INVALID:
                e.task = i
                e.args = (e._message(),)
                return

    # -- waiting and state -----------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None, *, check: bool = True) -> bool:
        """Wait until every task is terminal or ``timeout`` seconds passed (None: no limit;
        0: check once). Returns True when terminal, False on timeout.

        With ``check`` (the default) a batch that ended with failures raises the first
        failed task's error (TimeoutError, CanceledError, RemoteAccessError...) carrying its
        status, detail text and ``.task`` index; ``check=False`` only waits.
        The calling thread drives manual-progress transports while it waits.
        """
        st = self._engine._call(_lib.lib().te_batch_wait, self.id, _timeout_ns(timeout),
                                raise_errors=False)
        if st == Status.INPROGRESS:
            return False
        if st < 0:
            self._raise_failure(st, check)
        return True

    def _raise_failure(self, st: int, check: bool) -> None:
        detail = _lib.decode(_lib.lib().te_last_error())
        try:
            info = self.status()
        except _errors.Error:
            raise _errors.make_error(st, detail, "te_batch_wait") from None
        if not info.state.terminal:  # not a task failure: the call itself failed
            raise _errors.make_error(st, detail, "te_batch_wait")
        if not check:
            return
        first = None
        for i in range(info.tasks):
            t = self.task(i)
            if t.status == st:
                raise _errors.make_error(st, t.detail, "te_batch_wait", i)
            if first is None and t.status < 0:
                first = t
        if first is not None:
            raise _errors.make_error(first.status, first.detail, "te_batch_wait", first.index)
        raise _errors.make_error(st, detail, "te_batch_wait")

    def status(self) -> BatchStatus:
        """Aggregate state, task counts per state and bytes moved (te_batch_status)."""
        bi = _lib.BatchInfo()
        self._engine._call(_lib.lib().te_batch_status, self.id, ctypes.byref(bi))
        return BatchStatus._from_c(bi)

    def task(self, index: int) -> TaskStatus:
        """State, status, bytes, transport, device and detail text of one task."""
        ti = _lib.TaskInfo()
        self._engine._call(_lib.lib().te_task_status, self.id, int(index), ctypes.byref(ti))
        return TaskStatus._from_c(int(index), ti)

    def tasks(self) -> List[TaskStatus]:
        """TaskStatus of every task submitted so far."""
        return [self.task(i) for i in range(self.status().tasks)]

    @property
    def done(self) -> bool:
        """Every task is terminal."""
        return self.status().state.terminal

    # -- ending ----------------------------------------------------------------------------

    def cancel(self) -> None:
        """Best effort cancel; the batch always becomes terminal (te_batch_cancel)."""
        self._engine._call(_lib.lib().te_batch_cancel, self.id)

    def free(self) -> None:
        """Release a terminal batch (te_batch_free); its handle becomes invalid.

        BusyError if a task is still in flight (nothing is freed); InvalidHandleError when
        called again on a freed batch. ``close()`` is the forgiving variant.
        """
        self._engine._call(_lib.lib().te_batch_free, self.id)
        self._freed = True
        self._engine._batch_closed(self)

    def close(self) -> None:
        """Cancel and wait for what is in flight, then free; a no-op when already freed or
        when the engine is closed. Used by the context manager."""
        if self._freed or self._engine.closed:
            self._freed = True
            self._engine._batch_closed(self)
            return
        if not self.status().state.terminal:
            self.cancel()
            self.wait(None, check=False)
        self.free()

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.close()
        except _errors.Error:
            if exc_type is None:
                raise
