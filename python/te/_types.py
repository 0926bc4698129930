# SPDX-License-Identifier: Apache-2.0
"""Enumerations, requests and the status records the binding returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Optional

from . import _errors
from . import _lib


class Op(enum.IntEnum):
    """enum te_opcode."""

    READ = 0  #: remote -> local
    WRITE = 1  #: local -> remote


class State(enum.IntEnum):
    """enum te_state: WAITING -> PENDING -> COMPLETED | FAILED | TIMEOUT | CANCELED; INVALID."""

    WAITING = 0
    PENDING = 1
    COMPLETED = 2
    FAILED = 3
    TIMEOUT = 4
    CANCELED = 5
    INVALID = 6

    @property
    def terminal(self) -> bool:
        """True for COMPLETED, FAILED, TIMEOUT, CANCELED and INVALID."""
        return self >= State.COMPLETED


class Access(enum.IntFlag):
    """te_mem_register access flags (TE_MEM_*)."""

    LOCAL = 0  #: only usable as the local side of this engine's requests
    REMOTE_READ = 1  #: peers may READ from it
    REMOTE_WRITE = 2  #: peers may WRITE into it
    REMOTE = 3  #: both


class LogLevel(enum.IntEnum):
    """enum te_log_level."""

    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3
    TRACE = 4


class Request(NamedTuple):
    """One transfer request (struct te_request); becomes one task of a batch.

    ``segment`` is a Segment or its id, ``local`` the address of memory registered with
    this engine (``Registration.addr + offset``), ``remote`` the peer's virtual address.
    Plain 5-tuples in this order are accepted wherever a Request is.
    """

    op: Op
    segment: int
    local: int
    remote: int
    length: int

    @classmethod
    def read(cls, segment, local: int, remote: int, length: int) -> "Request":
        """READ ``length`` bytes at ``remote`` of ``segment`` into ``local``."""
        return cls(Op.READ, segment, local, remote, length)

    @classmethod
    def write(cls, segment, local: int, remote: int, length: int) -> "Request":
        """WRITE ``length`` bytes at ``local`` to ``remote`` of ``segment``."""
        return cls(Op.WRITE, segment, local, remote, length)


@dataclass(frozen=True)
class TaskStatus:
    """What te_task_status reports for one task."""

    index: int
    state: State
    status: int  #: Status.OK, or why it failed
    status_name: str  #: te_status_str(status)
    bytes: int  #: bytes moved so far
    length: int  #: bytes requested
    slices: int
    retries: int  #: slice attempts beyond the first
    transport: str  #: chosen transport ("" if none)
    device: str  #: device of the last slice posted ("" if unknown)
    detail: str  #: why it failed ("" if it did not)

    @property
    def ok(self) -> bool:
        """The task COMPLETED."""
        return self.state == State.COMPLETED

    def error(self) -> Optional[_errors.Error]:
        """The exception this task's failure maps to, or None if it did not fail."""
        if self.status >= 0:
            return None
        return _errors.make_error(self.status, self.detail, "task", self.index)

    @classmethod
    def _from_c(cls, index: int, ti: _lib.TaskInfo) -> "TaskStatus":
        return cls(index=index, state=_state(ti.state), status=_errors._as_status(ti.status),
                   status_name=_errors.status_str(ti.status), bytes=ti.bytes,
                   length=ti.length, slices=ti.slices, retries=ti.retries,
                   transport=_lib.decode(ti.transport), device=_lib.decode(ti.device),
                   detail=_lib.decode(ti.detail))


@dataclass(frozen=True)
class BatchStatus:
    """What te_batch_status reports: the aggregate state and counts of tasks."""

    state: State
    tasks: int
    completed: int
    failed: int  #: FAILED + INVALID
    timed_out: int
    canceled: int
    bytes: int

    @classmethod
    def _from_c(cls, bi: _lib.BatchInfo) -> "BatchStatus":
        return cls(state=_state(bi.state), tasks=bi.tasks, completed=bi.completed,
                   failed=bi.failed, timed_out=bi.timed_out, canceled=bi.canceled,
                   bytes=bi.bytes)


@dataclass(frozen=True)
class BufferInfo:
    """One remote-accessible buffer of a segment (struct te_buffer_info)."""

    addr: int  #: the peer's virtual address
    length: int
    access: Access
    location: str


@dataclass(frozen=True)
class Notification:
    """A notify message received by this engine."""

    sender: str  #: segment name of the sender
    message: bytes


def _state(v: int):
    try:
        return State(v)
    except ValueError:
        return v
