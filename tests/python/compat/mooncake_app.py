# SPDX-License-Identifier: Apache-2.0
"""A program written only against Mooncake Transfer Engine's documented Python API (as a
vLLM or SGLang connector uses it), plus the standard library. test_mooncake.py runs it with
python/compat on the path, so ``mooncake.engine`` is te's compatibility layer.

    mooncake_app.py target SIZE
        initializes (P2PHANDSHAKE, tcp), registers a SIZE-byte buffer, prints one JSON line
        {"segment", "addr", "size", "first"}, then answers stdin commands:
        "digest OFF LEN" -> {"digest": sha256 hex of those bytes}; "quit" (or EOF) ends it.
    mooncake_app.py initiator SEGMENT ADDR SIZE
        writes and reads back through the sync, batch and async calls, 4 KiB to 16 MiB,
        verifying every byte; prints one JSON line per case and a last line
        {"final_digest": ...} of what it left in the target's buffer. Exit 0 if all passed.
"""

import ctypes
import hashlib
import json
import random
import sys
import time

from mooncake.engine import TransferEngine, TransferOpcode

HOSTNAME = "localhost"
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]


def pattern(seed, n):
    return random.Random(seed).randbytes(n)


def say(**kw):
    print(json.dumps(kw), flush=True)


def start():
    engine = TransferEngine()
    ret = engine.initialize(HOSTNAME, "P2PHANDSHAKE", "tcp", "")
    if ret != 0:
        raise SystemExit(f"initialize failed: {ret}")
    return engine


def target(size):
    engine = start()
    buf = ctypes.create_string_buffer(size)
    addr = ctypes.addressof(buf)
    if engine.register_memory(addr, size) != 0:
        raise SystemExit("register_memory failed")
    segment = f"{HOSTNAME}:{engine.get_rpc_port()}"
    say(segment=segment, addr=addr, size=size, first=engine.get_first_buffer_address(segment))
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "digest":
            off, n = int(words[1]), int(words[2])
            say(digest=hashlib.sha256(ctypes.string_at(addr + off, n)).hexdigest())
    engine.unregister_memory(addr)


def initiator(segment, raddr, rsize):
    engine = start()
    cap = max(SIZES)
    src = ctypes.create_string_buffer(cap)
    dst = ctypes.create_string_buffer(cap)
    s, d = ctypes.addressof(src), ctypes.addressof(dst)
    if engine.batch_register_memory([s, d], [cap, cap]) != 0:
        raise SystemExit("batch_register_memory failed")
    if engine.get_first_buffer_address(segment) != raddr:
        raise SystemExit("get_first_buffer_address does not name the target's buffer")
    failures = 0

    def check(case, n, ok, ret):
        nonlocal failures
        failures += not ok
        say(case=case, size=n, ok=bool(ok), ret=ret)

    def fill(seed, n):
        data = pattern(seed, n)
        ctypes.memmove(s, data, n)
        ctypes.memset(d, 0, n)
        return data

    def got(n):
        return ctypes.string_at(d, n)

    for n in SIZES:
        assert 2 * n <= rsize
        chunk = max(4 << 10, n // 16)
        k = n // chunk
        locs = [s + i * chunk for i in range(k)]
        dsts = [d + i * chunk for i in range(k)]
        rems = [raddr + n + i * chunk for i in range(k)]
        lens = [chunk] * k

        # sync: one WRITE, one READ back
        data = fill(n, n)
        r1 = engine.transfer_sync_write(segment, s, raddr, n)
        r2 = engine.transfer_sync_read(segment, d, raddr, n)
        check("sync", n, r1 == 0 and r2 == 0 and got(n) == data, [r1, r2])

        # batch: chunks scattered in reverse order, gathered back in order
        data = fill(n + 1, n)
        r1 = engine.batch_transfer_sync_write(segment, locs, rems[::-1], lens)
        r2 = engine.batch_transfer_sync_read(segment, dsts, rems, lens)
        want = b"".join(data[i * chunk:(i + 1) * chunk] for i in reversed(range(k)))
        check("batch", n, r1 == 0 and r2 == 0 and got(n) == want, [r1, r2])

        # async: one submitted WRITE polled with transfer_check_status
        data = fill(n + 2, n)
        bid = engine.transfer_submit_write(segment, s, raddr, n)
        status = 0
        deadline = time.monotonic() + 60
        while bid != 0 and status == 0 and time.monotonic() < deadline:
            status = engine.transfer_check_status(bid)
            if status == 0:
                time.sleep(0.0005)
        r2 = engine.transfer_sync_read(segment, d, raddr, n)
        check("submit_write", n, bid != 0 and status == 1 and r2 == 0 and got(n) == data,
              [bid != 0, status, r2])

        # async batches: WRITE and READ batches waited with get_batch_transfer_status
        data = fill(n + 3, n)
        b1 = engine.batch_transfer_async_write(segment, locs, rems, lens)
        r1 = engine.get_batch_transfer_status([b1])
        b2 = engine.batch_transfer_async_read(segment, dsts, rems, lens)
        r2 = engine.get_batch_transfer_status([b2])
        check("batch_async", n, b1 and b2 and r1 == 0 and r2 == 0 and got(n) == data,
              [b1 != 0, b2 != 0, r1, r2])

        # batch_transfer_async with opcodes, two batches in flight at once
        data = fill(n + 4, n)
        b1 = engine.batch_transfer_async(segment, locs, rems, lens, TransferOpcode.WRITE)
        r1 = engine.get_batch_transfer_status([b1])
        half = max(1, k // 2)
        b2 = engine.batch_transfer_async(segment, dsts[:half], rems[:half], lens[:half],
                                         TransferOpcode.READ)
        b3 = engine.batch_transfer_async(segment, dsts[half:] or dsts[:1],
                                         rems[half:] or rems[:1], lens[half:] or lens[:1],
                                         TransferOpcode.READ)
        r2 = engine.get_batch_transfer_status([b2, b3])
        check("batch_async_opcode", n, r1 == 0 and r2 == 0 and got(n) == data, [r1, r2])

        # managed buffers as the local side
        m = engine.allocate_managed_buffer(n)
        data = pattern(n + 5, n)
        r1 = engine.write_bytes_to_buffer(m, data, n) if m else -1
        r2 = engine.transfer_sync_write(segment, m, raddr, n)
        r3 = engine.write_bytes_to_buffer(m, bytes(n), n) if m else -1
        r4 = engine.transfer_sync_read(segment, m, raddr, n)
        back = engine.read_bytes_from_buffer(m, n) if m else b""
        r5 = engine.free_managed_buffer(m, n)
        check("managed", n, m != 0 and [r1, r2, r3, r4, r5] == [0] * 5 and back == data,
              [m != 0, r1, r2, r3, r4, r5])

    # leave a known pattern in the target's whole buffer for the driver to check there
    final = pattern(7, rsize)
    off = 0
    while off < rsize:
        n = min(cap, rsize - off)
        ctypes.memmove(s, final[off:off + n], n)
        if engine.transfer_sync_write(segment, s, raddr + off, n) != 0:
            failures += 1
        off += n
    engine.batch_unregister_memory([s, d])
    say(final_digest=hashlib.sha256(final).hexdigest(), failures=failures)
    return 1 if failures else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "target":
        target(int(sys.argv[2]))
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "initiator":
        return initiator(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
