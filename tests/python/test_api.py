# SPDX-License-Identifier: Apache-2.0
"""The rest of the binding's API in one process: logging, allocations, copies, GPU pointers
as integers (the fakegpu test plugin), __cuda_array_interface__, segments, notify, threads."""

from __future__ import annotations

import ctypes
import threading
import unittest

import tehelp
from tehelp import loopback_yaml, pattern

import te

KiB = 1024


class FakeCudaArray:
    """What CuPy or a PyTorch CUDA tensor exposes, over a te allocation."""

    def __init__(self, alloc: te.Allocation, n: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (n // 4,), "typestr": "<f4", "data": (alloc.addr, False),
            "strides": None, "version": 3}


class Basics(unittest.TestCase):
    def setUp(self) -> None:
        self.a = te.Engine.from_string(loopback_yaml("A"))
        self.b = te.Engine.from_string(loopback_yaml("B"))
        self.rbuf = bytearray(256 * KiB)
        self.rreg = self.b.register(self.rbuf)
        self.seg = self.a.import_segment(self.b.export_segment())

    def tearDown(self) -> None:
        self.a.close()
        self.b.close()

    def test_module(self) -> None:
        self.assertTrue(te.library_path())
        v = te.version()
        self.assertIsInstance(v, str)  # libte has te_version since 0.1.0
        # The binding's own version names the libte it was written for: same MAJOR.MINOR.
        self.assertEqual(v.split(".")[:2], te.__version__.split(".")[:2], v)
        self.assertEqual(te.state_str(te.State.COMPLETED), "COMPLETED")
        self.assertTrue(te.State.CANCELED.terminal)
        self.assertFalse(te.State.PENDING.terminal)
        self.assertEqual(self.a.name, "A")
        self.assertIn("A", repr(self.a))
        self.assertIsInstance(self.a.handle, int)

    def test_default_engine(self) -> None:
        # The embedded default (tcp on loopback); its name is the listener's host:port.
        with te.Engine() as e:
            self.assertRegex(e.name, r"^127\.0\.0\.1:\d+$")

    def test_log_callback(self) -> None:
        lines = []
        with te.Engine(yaml=loopback_yaml("L"), log=lambda lvl, msg: lines.append((lvl, msg)),
                       log_level=te.LogLevel.DEBUG) as e:
            e.set_log_level(te.LogLevel.INFO)
        self.assertTrue(lines)
        self.assertTrue(all(isinstance(lvl, te.LogLevel) and isinstance(m, str)
                            for lvl, m in lines))
        self.assertTrue(any("L" in m for _, m in lines))

        def bad(level: te.LogLevel, msg: str) -> None:
            raise RuntimeError("must not reach C")

        with te.Engine(yaml=loopback_yaml("M"), log=bad, log_level=te.LogLevel.DEBUG):
            pass

    def test_buffers(self) -> None:
        local = self.b.buffers()
        self.assertEqual(local, [te.BufferInfo(self.rreg.addr, len(self.rbuf), te.Access.REMOTE,
                                               "cpu")])
        self.assertEqual(self.seg.buffers(), local)
        regs = [self.b.register(bytearray(100), access=te.Access.REMOTE_READ)
                for _ in range(40)]  # more than the first guess of 16
        self.assertEqual(len(self.b.buffers()), 41)
        self.assertEqual(len(self.b.buffers(te.SEGMENT_LOCAL)), 41)
        for r in regs:
            r.unregister()
        self.assertEqual(len(self.b.buffers()), 1)

    def test_register_prefix_and_address(self) -> None:
        buf = bytearray(8 * KiB)
        with self.a.register(buf, 4 * KiB, access=te.Access.LOCAL) as reg:
            self.assertEqual(reg.length, 4 * KiB)
            self.assertEqual(reg.address(100), reg.addr + 100)
            with self.assertRaises(te.OutOfRangeError):
                reg.address(4 * KiB + 1)
            with self.assertRaises(te.OutOfRangeError):
                self.a.register(bytearray(10), 11)
            buf[:4 * KiB] = pattern(1, 4 * KiB)
            self.a.write(self.seg, reg, self.rreg.addr)
            self.assertEqual(self.rbuf[:4 * KiB], buf[:4 * KiB])
        self.assertFalse(reg.registered)

    def test_memoryview_and_mmap(self) -> None:
        import array
        import mmap
        arr = array.array("I", range(1000))
        m = mmap.mmap(-1, 16 * KiB)
        with self.a.register(arr, access=te.Access.LOCAL), \
                self.a.register(m, access=te.Access.LOCAL):
            self.a.write(self.seg, arr, self.rreg.addr)
            self.a.read(self.seg, memoryview(m)[:4000], self.rreg.addr)
            self.assertEqual(m[:4000], arr.tobytes())
        m.close()

    def test_alloc_host(self) -> None:
        with self.a.alloc(64 * KiB) as al:
            self.assertTrue(al.is_host)
            mv = al.memoryview()
            mv[:5] = b"hello"
            self.assertEqual(al.read(0, 5), b"hello")
            al.write(b"world", 5)
            self.assertEqual(bytes(mv[:10]), b"helloworld")
            with self.assertRaises(te.OutOfRangeError):
                al.write(b"x", 64 * KiB)
            with self.a.register(al, access=te.Access.LOCAL) as reg:
                self.a.write(self.seg, reg, self.rreg.addr, 10)
            self.assertEqual(self.rbuf[:10], b"helloworld")
            del mv
        with self.b.alloc(4 * KiB, access=te.Access.REMOTE) as al2:
            self.assertEqual(al2.access, te.Access.REMOTE)
            self.assertIn(al2.addr, [x.addr for x in self.b.buffers()])
            seg = self.a.import_segment(self.b.export_segment())
            src = bytearray(pattern(2, 4 * KiB))
            with self.a.register(src, access=te.Access.LOCAL):
                # The segment was already open: close it so the import takes B's new buffer.
                self.seg.close()
                seg.close()
                seg = self.a.import_segment(self.b.export_segment())
                self.a.write(seg, src, al2.addr)
            self.assertEqual(al2.read(), bytes(src))

    def test_copy(self) -> None:
        src = bytes(pattern(3, 1000))
        dst = bytearray(1000)
        self.a.copy(dst, src)
        self.assertEqual(dst, src)
        with self.assertRaises(te.InvalidArgumentError):
            self.a.copy(src, dst)  # read-only destination

    def test_requests_and_batches(self) -> None:
        src = bytearray(pattern(4, 64 * KiB))
        with self.a.register(src, access=te.Access.LOCAL) as reg:
            reqs = [te.Request(te.Op.WRITE, self.seg, reg.addr + i * 640, self.rreg.addr + i * 640,
                               640) for i in range(100)]
            self.a.transfer(reqs, timeout=30)
            self.assertEqual(self.rbuf[:64000], src[:64000])
            with self.a.batch(100) as b:
                self.assertIn("capacity=100", repr(b))
                b.submit(iter(reqs))  # any iterable
                self.assertTrue(b.wait(30))
                self.assertTrue(b.done)
                ts = b.tasks()
                self.assertEqual(len(ts), 100)
                self.assertTrue(all(t.ok and t.error() is None for t in ts))
                self.assertEqual(ts[5].transport, "loopback")
                self.assertEqual(b.status().bytes, 64000)
        self.a.transfer([])  # nothing to do

    def test_segment_refcount(self) -> None:
        s2 = self.a.import_segment(self.b.export_segment())
        self.assertEqual(s2.id, self.seg.id)
        self.assertEqual(int(s2), s2.id)
        self.assertEqual(s2.name, "B")
        s2.close()
        s2.close()  # idempotent
        self.assertEqual(self.seg.buffers()[0].addr, self.rreg.addr)  # still open

    def test_notify(self) -> None:
        src = bytearray(100)
        with self.a.register(src, access=te.Access.LOCAL):
            self.a.write(self.seg, src, self.rreg.addr, notify=b"one")
            with self.a.batch(2) as b:
                b.submit([te.Request.write(self.seg, b_addr(src), self.rreg.addr, 10)] * 2,
                         notify=b"two")
                b.wait(30)
        got = []
        while len(got) < 2:
            msgs = self.b.recv_notify(timeout=10)
            self.assertTrue(msgs)
            got += msgs
        self.assertEqual(got, [te.Notification("A", b"one"), te.Notification("A", b"two")])
        self.assertEqual(self.b.recv_notify(), [])

    def test_threads(self) -> None:
        # Engine-wide calls from several threads, one batch per thread.
        errors = []
        bufs = [bytearray(pattern(10 + i, 8 * KiB)) for i in range(8)]
        regs = [self.a.register(b, access=te.Access.LOCAL) for b in bufs]

        def run(i: int) -> None:
            try:
                for _ in range(20):
                    self.a.write(self.seg, regs[i], self.rreg.addr + i * 8 * KiB)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for i in range(8):
            self.assertEqual(self.rbuf[i * 8 * KiB:(i + 1) * 8 * KiB], bufs[i])


def b_addr(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class GpuPointers(unittest.TestCase):
    """Device memory of the fakegpu plugin (no GPU needed): CPU access to it faults, so
    every byte must go through te (staging, te_mem_copy)."""

    def setUp(self) -> None:
        extra = "  - name: fakegpu\n    required: true\n"
        self.a = te.Engine.from_string(loopback_yaml("A", extra=extra))
        self.b = te.Engine.from_string(loopback_yaml("B"))
        self.rbuf = bytearray(256 * KiB)
        self.rreg = self.b.register(self.rbuf)
        self.seg = self.a.import_segment(self.b.export_segment())

    def tearDown(self) -> None:
        self.a.close()
        self.b.close()

    def test_int_pointer_with_location(self) -> None:
        n = 128 * KiB
        data = pattern(5, n)
        with self.a.alloc(n, "cuda:0") as dev:
            self.assertFalse(dev.is_host)
            with self.assertRaises(te.MemoryTypeError):
                dev.memoryview()
            dev.write(data)
            with self.a.register(dev.addr, n, location="cuda:0",
                                 access=te.Access.LOCAL) as reg:
                self.assertEqual(reg.location, "cuda:0")
                self.a.write(self.seg, reg.addr, self.rreg.addr, n)
                self.assertEqual(bytes(self.rbuf[:n]), data)
                self.rbuf[:n] = bytes(n)
                self.rbuf[:100] = b"\x42" * 100
                self.a.read(self.seg, reg, self.rreg.addr)
            self.assertEqual(dev.read(0, 100), b"\x42" * 100)
            self.assertEqual(dev.read(100, 10), bytes(10))
            host = bytearray(100)
            self.a.copy(host, dev, 100)
            self.assertEqual(host, b"\x42" * 100)

    def test_detected_location(self) -> None:
        with self.a.alloc(4 * KiB, "cuda:1") as dev:
            with self.a.register(dev.addr, 4 * KiB) as reg:  # location "*": detected
                self.assertIsNone(reg.location)
            with self.assertRaises(te.Error) as cm:
                self.a.register(dev.addr, 4 * KiB, location="cuda:0")  # wrong device
            self.assertIn("cuda", cm.exception.detail)

    def test_cuda_array_interface(self) -> None:
        n = 16 * KiB
        with self.a.alloc(n, "cuda:0") as dev:
            dev.write(pattern(6, n))
            arr = FakeCudaArray(dev, n)
            with self.a.register(arr, access=te.Access.LOCAL) as reg:
                self.assertEqual((reg.addr, reg.length), (dev.addr, n))
                self.assertIs(reg.obj, arr)
                self.a.write(self.seg, arr, self.rreg.addr)
            self.assertEqual(bytes(self.rbuf[:n]), pattern(6, n))


if __name__ == "__main__":
    assert tehelp.SOURCE_ROOT
    unittest.main(verbosity=2)
