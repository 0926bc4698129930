# SPDX-License-Identifier: Apache-2.0
"""Two engines in two processes over tcp: WRITE and READ back, 1 B to 16 MiB and batches of
100, verified byte for byte on both sides."""

from __future__ import annotations

import unittest

import tehelp
from tehelp import Peer, digest, pattern

import te

MiB = 1 << 20
SIZES = [1, 2, 3, 255, 4095, 4096, 4097, 65536 + 7, MiB - 1, MiB, 4 * MiB + 1, 16 * MiB]
PEER_SEED = 7


class TwoProcesses(unittest.TestCase):
    peer: Peer
    engine: te.Engine

    @classmethod
    def setUpClass(cls) -> None:
        cls.peer = Peer("--size", str(17 * MiB), "--seed", str(PEER_SEED))
        cls.engine = te.Engine.from_string(tehelp.TCP_YAML)
        # Local side: what is written, and a separate region that is read into.
        cls.src = bytearray(pattern(11, 16 * MiB))
        cls.dst = bytearray(16 * MiB)
        cls.src_reg = cls.engine.register(cls.src, access=te.Access.LOCAL)
        cls.dst_reg = cls.engine.register(cls.dst, access=te.Access.LOCAL)
        cls.seg = cls.engine.open_segment(cls.peer.segment)
        cls.peer_pattern = pattern(PEER_SEED, cls.peer.length)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.engine.close()
        cls.peer.close()

    def setUp(self) -> None:
        self.peer.fill(PEER_SEED)
        self.dst[:] = bytes(len(self.dst))

    def test_read_pattern(self) -> None:
        want = self.peer_pattern
        for size in SIZES:
            with self.subTest(size=size):
                off = (size * 31) % (self.peer.length - size)
                view = memoryview(self.dst)[:size]
                self.engine.read(self.seg, view, self.peer.addr + off)
                self.assertEqual(bytes(view), want[off:off + size])

    def test_write_read_back(self) -> None:
        for size in SIZES:
            with self.subTest(size=size):
                self.peer.fill(PEER_SEED)
                off = (size * 17) % (self.peer.length - size)
                src = memoryview(self.src)[:size]
                self.engine.write(self.seg, src, self.peer.addr + off)
                self.assertEqual(self.peer.digest(off, size), digest(src))
                dst = memoryview(self.dst)[:size]
                self.engine.read(self.seg, dst, self.peer.addr + off)
                self.assertEqual(bytes(dst), bytes(src))
                # The bytes around the range are the peer's pattern still.
                want = self.peer_pattern
                self.assertEqual(self.peer.digest(off - 1, 1), digest(want[off - 1:off]))
                self.assertEqual(self.peer.digest(off + size, 1),
                                 digest(want[off + size:off + size + 1]))

    def test_batches_of_100(self) -> None:
        n = 100
        sizes = [1 + (i * 7919) % (160 * 1024) for i in range(n)]
        offs = [sum(sizes[:i]) for i in range(n)]
        remote = [self.peer.addr + 3 + o for o in offs]  # unaligned on purpose
        total = sum(sizes)
        for rnd in range(3):
            src_base = rnd * 4096 + 1
            writes = [te.Request.write(self.seg, self.src_reg.addr + src_base + offs[i],
                                       remote[i], sizes[i]) for i in range(n)]
            with self.engine.batch(n) as b:
                b.submit(writes)
                self.assertTrue(b.wait(60))
                st = b.status()
                self.assertEqual((st.state, st.tasks, st.completed, st.bytes),
                                 (te.State.COMPLETED, n, n, total))
                for t in b.tasks():
                    self.assertEqual(t.state, te.State.COMPLETED, t)
                    self.assertEqual(t.bytes, t.length)
                    self.assertEqual(t.transport, "tcp")
            want = bytes(self.src[src_base:src_base + total])
            self.assertEqual(self.peer.digest(3, total), digest(want))
            # Read back as plain tuples, into the other region, in reverse order.
            reads = [(te.Op.READ, self.seg.id, self.dst_reg.addr + offs[i], remote[i],
                      sizes[i]) for i in reversed(range(n))]
            self.engine.transfer(reads, timeout=60)
            self.assertEqual(bytes(self.dst[:total]), want)

    def test_batch_many_submits(self) -> None:
        # Several submits append to one batch; task indices continue.
        with self.engine.batch(300) as b:
            for k in range(3):
                reqs = [te.Request.write(self.seg, self.src_reg.addr + k * 100 + i,
                                         self.peer.addr + k * 100 + i, 1) for i in range(100)]
                b.submit(reqs)
            self.assertTrue(b.wait(60))
            self.assertEqual(b.status().completed, 300)
            self.assertEqual(len(b.tasks()), 300)
        self.assertEqual(self.peer.digest(0, 300), digest(self.src[:300]))

    def test_helpers_on_registrations(self) -> None:
        self.engine.write(self.seg, self.src_reg, self.peer.addr, 1000)
        self.engine.read(self.seg, self.dst_reg, self.peer.addr, 1000)
        self.assertEqual(self.dst[:1000], self.src[:1000])
        # Tasks of one batch run in any order: the two touch different remote ranges.
        with self.engine.batch(2) as b:
            i = b.write(self.seg, self.src_reg.address(5000), self.peer.addr + 5000, 10)
            j = b.read(self.seg, memoryview(self.dst)[20:30], self.peer.addr + 9000)
            self.assertEqual((i, j), (0, 1))
            b.wait(30)
        self.assertEqual(self.dst[20:30], self.peer_pattern[9000:9010])
        self.assertEqual(self.peer.digest(5000, 10), digest(self.src[5000:5010]))

    def test_segment_buffers_and_probe(self) -> None:
        bufs = self.seg.buffers()
        self.assertIn(te.BufferInfo(self.peer.addr, self.peer.length, te.Access.REMOTE, "cpu"),
                      bufs)
        self.engine.probe(self.peer.segment, timeout=5)
        # Opening the same name again gives the same id (reference counted).
        with self.engine.open_segment(self.peer.segment) as again:
            self.assertEqual(again.id, self.seg.id)

    def test_import_descriptor(self) -> None:
        desc = self.peer.ask(cmd="export")["descriptor"]
        seg = self.engine.import_segment(desc)
        self.assertEqual(seg.name, self.peer.segment)
        self.engine.write(seg, memoryview(self.src)[:4096], self.peer.addr + 8192)
        self.assertEqual(self.peer.digest(8192, 4096), digest(self.src[:4096]))
        seg.close()

    def test_notify(self) -> None:
        self.engine.write(self.seg, memoryview(self.src)[:64], self.peer.addr,
                          notify=b"blocks for request 1234")
        msgs = self.peer.notifications()
        self.assertEqual(msgs, [[self.engine.name, b"blocks for request 1234".hex()]])
        self.assertEqual(self.peer.digest(0, 64), digest(self.src[:64]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
