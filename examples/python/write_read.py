#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""write_read.py: two processes on loopback; the initiator WRITEs a buffer into the target's
registered memory, READs it back and both sides check every byte.

    TE_LIBRARY=build/core/libte.so.0 PYTHONPATH=python python3 examples/python/write_read.py

The target runs in a child process (multiprocessing, spawn) and sends its segment name and
buffer address through a pipe, the way a serving system would publish them. Both engines
use te's embedded default configuration: p2p metadata and tcp on 127.0.0.1.
"""

import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python"))
import te  # noqa: E402  (after the path tweak, for a run from a checkout)

SIZE = 4 << 20  # 4 MiB


def target(conn) -> None:
    """Expose a zeroed buffer, wait for the initiator, check what it wrote."""
    with te.Engine() as engine:
        buf = bytearray(SIZE)
        with engine.register(buf, access=te.Access.REMOTE):  # peers may READ and WRITE
            conn.send((engine.name, engine.buffers()[0].addr))
            message = engine.recv_notify(timeout=30)  # sent once the WRITE completed
            expected = pattern()
            conn.send(bytes(buf) == expected and message[0].message == b"written")
            conn.recv()  # keep serving until the initiator has read back


def main() -> int:
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=target, args=(theirs,))
    child.start()
    name, remote_addr = ours.recv()
    print(f"target segment {name}, buffer at 0x{remote_addr:x}")

    with te.Engine() as engine:
        data = bytearray(pattern())
        back = bytearray(SIZE)
        with engine.register(data, access=te.Access.LOCAL), \
                engine.register(back, access=te.Access.LOCAL) as back_reg:
            with engine.open_segment(name) as seg:
                engine.write(seg, data, remote_addr, notify=b"written", timeout=30)
                target_ok = ours.recv()
                engine.read(seg, back, remote_addr, timeout=30)

                # The batch API: 64 READs of 64 KiB each, in one batch.
                block = 64 << 10
                with engine.batch(64) as batch:
                    batch.submit(te.Request.read(seg, back_reg.addr + i * block,
                                                 remote_addr + i * block, block)
                                 for i in range(64))
                    batch.wait(timeout=30)
                    print("batch:", batch.status())
        ours.send("done")
    child.join(30)

    ok = target_ok and back == data and child.exitcode == 0
    print(f"wrote and read back {SIZE} bytes: {'verified' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def pattern() -> bytes:
    """SIZE bytes that differ from their neighbours and from zero-filled memory."""
    return (bytes(range(1, 252)) * (SIZE // 251 + 1))[:SIZE]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except te.Error as e:
        print(f"te: {e}", file=sys.stderr)
        sys.exit(1)
