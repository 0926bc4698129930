# SPDX-License-Identifier: Apache-2.0
"""Two processes over tcp with numpy arrays on both sides (skipped, exit 77, without numpy)."""

from __future__ import annotations

import sys
import unittest

import tehelp
from tehelp import Peer, digest, pattern

import te

np = tehelp.numpy_or_none()

MiB = 1 << 20
PEER_SEED = 5


class NumpyTwoProcesses(unittest.TestCase):
    peer: Peer
    engine: te.Engine

    @classmethod
    def setUpClass(cls) -> None:
        cls.peer = Peer("--numpy", "--size", str(17 * MiB), "--seed", str(PEER_SEED))
        cls.peer_pattern = np.frombuffer(pattern(PEER_SEED, cls.peer.length), dtype=np.uint8)
        cls.engine = te.Engine.from_string(tehelp.TCP_YAML)
        cls.src = np.frombuffer(pattern(3, 16 * MiB), dtype=np.uint8).copy()
        cls.dst = np.zeros(16 * MiB, dtype=np.uint8)
        cls.src_reg = cls.engine.register(cls.src, access=te.Access.LOCAL)
        cls.dst_reg = cls.engine.register(cls.dst, access=te.Access.LOCAL)
        cls.seg = cls.engine.open_segment(cls.peer.segment)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.engine.close()
        cls.peer.close()

    def setUp(self) -> None:
        self.peer.fill(PEER_SEED)
        self.dst[:] = 0

    def test_registration_address(self) -> None:
        self.assertEqual(self.src_reg.addr, self.src.ctypes.data)
        self.assertEqual(self.src_reg.length, self.src.nbytes)
        self.assertIs(self.src_reg.obj, self.src)

    def test_sizes(self) -> None:
        for size in [1, 3, 4096, 65537, MiB, 16 * MiB]:
            with self.subTest(size=size):
                self.peer.fill(PEER_SEED)
                off = (size * 13) % (self.peer.length - size)
                self.engine.read(self.seg, self.dst[:size], self.peer.addr + off)
                self.assertTrue(np.array_equal(self.dst[:size],
                                               self.peer_pattern[off:off + size]))
                self.engine.write(self.seg, self.src[:size], self.peer.addr + off)
                self.assertEqual(self.peer.digest(off, size), digest(self.src[:size]))
                self.dst[:size] = 0
                self.engine.read(self.seg, self.dst[:size], self.peer.addr + off)
                self.assertTrue(np.array_equal(self.dst[:size], self.src[:size]))

    def test_typed_arrays(self) -> None:
        for dtype in (np.float32, np.int64, np.complex128):
            with self.subTest(dtype=dtype.__name__):
                a = np.arange(64 * 1024, dtype=dtype).reshape(256, -1) * 3
                back = np.zeros_like(a)
                with self.engine.register(a, access=te.Access.LOCAL), \
                        self.engine.register(back, access=te.Access.LOCAL):
                    self.engine.write(self.seg, a, self.peer.addr + 100)
                    self.engine.read(self.seg, back, self.peer.addr + 100)
                self.assertTrue(np.array_equal(a, back))

    def test_batch_of_100(self) -> None:
        n, blk = 100, 40 * 1024 + 3
        base = self.src_reg.addr
        with self.engine.batch(n) as b:
            b.submit([te.Request.write(self.seg, base + i * blk, self.peer.addr + i * blk, blk)
                      for i in range(n)])
            b.wait(60)
        self.assertEqual(self.peer.digest(0, n * blk), digest(self.src[:n * blk]))
        with self.engine.batch(n) as b:
            b.submit([te.Request.read(self.seg, self.dst_reg.addr + i * blk,
                                      self.peer.addr + i * blk, blk) for i in range(n)])
            b.wait(60)
        self.assertTrue(np.array_equal(self.dst[:n * blk], self.src[:n * blk]))

    def test_layouts(self) -> None:
        f = np.zeros((64, 64), dtype=np.float64, order="F")
        with self.assertRaises(te.InvalidArgumentError):
            self.engine.register(f)
        with self.assertRaises(te.InvalidArgumentError):
            self.engine.write(self.seg, self.src[::2], self.peer.addr)
        ro = np.arange(1000, dtype=np.uint8)
        ro.flags.writeable = False
        with self.assertRaises(te.InvalidArgumentError):
            self.engine.register(ro)  # access REMOTE includes REMOTE_WRITE
        with self.engine.register(ro, access=te.Access.LOCAL) as reg:
            self.assertTrue(reg.readonly)
            self.engine.write(self.seg, ro, self.peer.addr)
            self.assertEqual(self.peer.digest(0, 1000), digest(ro))
            with self.assertRaises(te.InvalidArgumentError):
                self.engine.read(self.seg, ro, self.peer.addr)


if __name__ == "__main__":
    if np is None:
        print("numpy is not installed: skipped")
        sys.exit(77)
    unittest.main(verbosity=2)
