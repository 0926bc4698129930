# SPDX-License-Identifier: Apache-2.0
"""Every error path of the Python binding raises the right exception with status and detail."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import unittest

import tehelp
from tehelp import loopback_yaml

import te


class ErrorCase(unittest.TestCase):
    def assertTeError(self, cm: "unittest.case._AssertRaisesContext", cls: type,
                      status: te.Status) -> te.Error:
        """The exception is exactly @cls with @status, te_status_str and a detail."""
        e = cm.exception
        self.assertIs(type(e), cls, repr(e))
        self.assertIsInstance(e.status, int)
        self.assertEqual(e.status, status)
        self.assertEqual(e.status_name, te.status_str(status))
        self.assertNotEqual(e.detail, "", repr(e))
        self.assertIn(e.detail, str(e))
        return e


class Pair(ErrorCase):
    """Two engines in this process on a test transport, A opening B's segment."""

    plugin = "loopback"
    transfer = ""

    def setUp(self) -> None:
        self.a = te.Engine.from_string(loopback_yaml("A", self.plugin, self.transfer))
        self.b = te.Engine.from_string(loopback_yaml("B", self.plugin, self.transfer))
        self.rbuf = bytearray(1 << 16)
        self.rreg = self.b.register(self.rbuf)
        self.seg = self.a.import_segment(self.b.export_segment())
        self.lbuf = bytearray(1 << 16)
        self.lreg = self.a.register(self.lbuf, access=te.Access.LOCAL)

    def tearDown(self) -> None:
        self.a.close()
        self.b.close()

    def reimport(self) -> te.Segment:
        """B's descriptor again, after B registered more (an import of the same generation
        does not replace an open segment's descriptor: close it first)."""
        self.seg.close()
        self.seg = self.a.import_segment(self.b.export_segment())
        return self.seg


class Config(ErrorCase):
    def test_bad_yaml_string(self) -> None:
        with self.assertRaises(te.ConfigError) as cm:
            te.Engine.from_string("engine:\n  listen: [\n")
        e = self.assertTeError(cm, te.ConfigError, te.Status.CONFIG)
        self.assertRegex(e.detail, r"^<string>:\d+:\d+: ")
        self.assertEqual(e.func, "te_engine_new_from_string")

    def test_bad_yaml_named(self) -> None:
        with self.assertRaises(te.ConfigError) as cm:
            te.Engine(yaml="engine:\n  lisen: x\n", name="node.yaml")
        e = self.assertTeError(cm, te.ConfigError, te.Status.CONFIG)
        self.assertRegex(e.detail, r"^node\.yaml:2:3: .*lisen")

    def test_bad_yaml_file(self) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("engine:\n  listen: \"127.0.0.1:0\"\ntransports: 12\n")
        try:
            with self.assertRaises(te.ConfigError) as cm:
                te.Engine.from_file(f.name)
            e = self.assertTeError(cm, te.ConfigError, te.Status.CONFIG)
            self.assertTrue(re.match(re.escape(f.name) + r":3:\d+: ", e.detail), e.detail)
            self.assertEqual(e.func, "te_engine_new_from_file")
        finally:
            os.unlink(f.name)

    def test_missing_file(self) -> None:
        with self.assertRaises(te.Error) as cm:
            te.Engine("/nonexistent/te-node.yaml")
        self.assertIn("/nonexistent/te-node.yaml", cm.exception.detail)

    def test_config_and_yaml(self) -> None:
        with self.assertRaises(te.InvalidArgumentError) as cm:
            te.Engine("x.yaml", yaml="engine: {}")
        self.assertTeError(cm, te.InvalidArgumentError, te.Status.INVALID_ARG)

    def test_missing_plugin(self) -> None:
        with self.assertRaises(te.PluginError) as cm:
            te.Engine.from_string(loopback_yaml("A", "no_such_transport"))
        self.assertIn("no_such_transport", cm.exception.detail)

    def test_library_not_found(self) -> None:
        env = tehelp.env()
        env["TE_LIBRARY"] = "/nonexistent/libte.so.0"
        code = ("import te\ntry:\n    te.Engine()\nexcept te.LibraryNotFound as e:\n"
                "    print(e)\n    raise SystemExit(3)\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("$TE_LIBRARY: /nonexistent/libte.so.0: no such file", r.stdout)
        self.assertIn("TE_LIBRARY", r.stdout.splitlines()[-1])


class Submit(Pair):
    def test_unregistered_local(self) -> None:
        other = bytearray(4096)
        with self.assertRaises(te.NotRegisteredError) as cm:
            self.a.write(self.seg, other, self.rreg.addr)
        e = self.assertTeError(cm, te.NotRegisteredError, te.Status.NOT_REGISTERED)
        self.assertEqual(e.task, 0)
        self.assertIn("request 0", e.detail)
        self.assertEqual(self.a._batches, {})  # the helper's batch was freed

    def test_rejected_task_state(self) -> None:
        with self.a.batch(3) as b:
            good = te.Request.write(self.seg, self.lreg.addr, self.rreg.addr, 100)
            bad = te.Request.write(self.seg, self.lreg.addr + (1 << 16), self.rreg.addr, 100)
            with self.assertRaises(te.Error) as cm:
                b.submit([good, good, bad])
            self.assertEqual(cm.exception.task, 2)
            b.wait(30, check=False)
            t = b.task(2)
            self.assertEqual(t.state, te.State.INVALID)
            self.assertEqual(t.status, cm.exception.status)
            self.assertNotEqual(t.detail, "")
            self.assertIsInstance(t.error(), type(cm.exception))
            self.assertEqual([b.task(i).state for i in (0, 1)], [te.State.COMPLETED] * 2)
            st = b.status()
            self.assertEqual((st.state, st.failed, st.completed),
                             (te.State.FAILED, 1, 2))
            with self.assertRaises(te.Error) as cm2:
                b.wait(30)
            self.assertEqual(cm2.exception.task, 2)

    def test_local_out_of_range(self) -> None:
        with self.assertRaises(te.OutOfRangeError) as cm:
            self.a.write(self.seg, self.lreg.addr + (1 << 16) - 10, self.rreg.addr, 100)
        self.assertTeError(cm, te.OutOfRangeError, te.Status.OUT_OF_RANGE)

    def test_remote_out_of_range(self) -> None:
        with self.assertRaises(te.RemoteAccessError) as cm:
            self.a.read(self.seg, self.lreg, self.rreg.addr + 100, 1 << 16)
        e = self.assertTeError(cm, te.RemoteAccessError, te.Status.REMOTE_ACCESS)
        self.assertIsInstance(e, te.PeerError)
        with self.assertRaises(te.RemoteAccessError):
            self.a.write(self.seg, self.lreg, 0x1000, 16)

    def test_remote_not_writable(self) -> None:
        ro = self.b.register(bytearray(4096), access=te.Access.REMOTE_READ)
        seg = self.reimport()
        self.a.read(seg, self.lreg, ro.addr, 4096)
        with self.assertRaises(te.RemoteAccessError) as cm:
            self.a.write(seg, self.lreg, ro.addr, 4096)
        self.assertTeError(cm, te.RemoteAccessError, te.Status.REMOTE_ACCESS)

    def test_unknown_segment(self) -> None:
        with self.assertRaises(te.UnknownSegmentError) as cm:
            self.a.write(999, self.lreg, self.rreg.addr, 10)
        self.assertTeError(cm, te.UnknownSegmentError, te.Status.UNKNOWN_SEGMENT)
        with self.assertRaises(te.UnknownSegmentError) as cm:
            self.a.buffers(999)
        self.assertTeError(cm, te.UnknownSegmentError, te.Status.UNKNOWN_SEGMENT)

    def test_unknown_segment_name(self) -> None:
        # Nothing listens on port 1: the descriptor cannot be fetched.
        with self.assertRaises(te.Error) as cm:
            self.a.open_segment("127.0.0.1:1")
        self.assertIsInstance(cm.exception, (te.UnknownSegmentError, te.PeerError,
                                             te.MetadataError))
        self.assertIn("127.0.0.1:1", cm.exception.detail)
        with self.assertRaises((te.PeerUnreachableError, te.TimeoutError)) as cm2:
            self.a.probe("127.0.0.1:1", timeout=2)
        self.assertIn("127.0.0.1:1", cm2.exception.detail)

    def test_bad_descriptor(self) -> None:
        with self.assertRaises(te.MetadataError) as cm:
            self.a.import_segment('{"name": 12}')
        self.assertNotEqual(cm.exception.detail, "")

    def test_batch_full(self) -> None:
        with self.a.batch(2) as b:
            r = te.Request.write(self.seg, self.lreg.addr, self.rreg.addr, 8)
            with self.assertRaises(te.BatchFullError) as cm:
                b.submit([r, r, r])
            self.assertTeError(cm, te.BatchFullError, te.Status.BATCH_FULL)
            self.assertEqual(b.status().tasks, 0)  # nothing appended

    def test_malformed_request(self) -> None:
        with self.a.batch(2) as b:
            good = te.Request.write(self.seg, self.lreg.addr, self.rreg.addr, 8)
            with self.assertRaises(te.InvalidArgumentError) as cm:
                b.submit([good, (te.Op.WRITE, self.seg, "not an address", 0, 8)])
            self.assertEqual(cm.exception.task, 1)
            self.assertIn("request 1", cm.exception.detail)
            self.assertEqual(b.status().tasks, 0)  # nothing was submitted

    def test_batch_capacity_zero(self) -> None:
        with self.assertRaises(te.InvalidArgumentError) as cm:
            self.a.batch(0)
        self.assertTeError(cm, te.InvalidArgumentError, te.Status.INVALID_ARG)

    def test_free_twice(self) -> None:
        b = self.a.batch(1)
        b.submit([te.Request.write(self.seg, self.lreg.addr, self.rreg.addr, 8)])
        b.wait(30)
        b.free()
        with self.assertRaises(te.InvalidHandleError) as cm:
            b.free()
        self.assertTeError(cm, te.InvalidHandleError, te.Status.INVALID_HANDLE)
        with self.assertRaises(te.InvalidHandleError):
            b.status()
        b.close()  # the forgiving variant stays quiet

    def test_notify_rules(self) -> None:
        with self.a.batch(1) as b:
            with self.assertRaises(te.InvalidArgumentError) as cm:
                b.submit([te.Request.write(self.seg, self.lreg.addr, self.rreg.addr, 8)],
                         notify=b"x" * (te.NOTIFY_MAX + 1))
            self.assertTeError(cm, te.InvalidArgumentError, te.Status.INVALID_ARG)

    def test_timeout_must_be_positive(self) -> None:
        with self.assertRaises(te.InvalidArgumentError):
            self.a.write(self.seg, self.lreg, self.rreg.addr, 8, timeout=-1)


class Memory(Pair):
    def test_unregister_twice(self) -> None:
        reg = self.a.register(bytearray(100))
        reg.unregister()
        with self.assertRaises(te.NotRegisteredError) as cm:
            reg.unregister()
        self.assertTeError(cm, te.NotRegisteredError, te.Status.NOT_REGISTERED)
        reg.close()

    def test_overlap(self) -> None:
        with self.assertRaises(te.ArgumentError) as cm:
            self.a.register(memoryview(self.lbuf)[100:200])
        self.assertEqual(cm.exception.status, te.Status.ADDRESS_OVERLAPPED)
        self.assertNotEqual(cm.exception.detail, "")

    def test_readonly_buffers(self) -> None:
        data = bytes(range(256)) * 16
        with self.assertRaises(te.InvalidArgumentError) as cm:
            self.b.register(data)  # default access REMOTE includes REMOTE_WRITE
        self.assertTeError(cm, te.InvalidArgumentError, te.Status.INVALID_ARG)
        with self.b.register(data, access=te.Access.REMOTE_READ) as ro:
            self.assertTrue(ro.readonly)
            seg = self.reimport()
            out = memoryview(self.lbuf)[:len(data)]
            self.a.read(seg, out, ro.addr)
            self.assertEqual(bytes(out), data)
        # Registered locally, it can be written from, never read into.
        with self.a.register(data, access=te.Access.LOCAL) as lro:
            self.a.write(self.seg, data, self.rreg.addr)
            self.assertEqual(bytes(self.rbuf[:len(data)]), data)
            with self.assertRaises(te.InvalidArgumentError):
                self.a.read(self.seg, data, self.rreg.addr)
            with self.assertRaises(te.InvalidArgumentError):
                self.a.read(self.seg, lro.addr + 10, self.rreg.addr, 10)
            with self.a.batch(1) as b, self.assertRaises(te.InvalidArgumentError):
                b.submit([te.Request.read(self.seg, lro.addr, self.rreg.addr, 1)])
        self.assertEqual(data, bytes(range(256)) * 16)

    def test_registered_bytearray_cannot_move(self) -> None:
        buf = bytearray(100)
        with self.a.register(buf):
            with self.assertRaises(BufferError):
                buf.extend(b"x")
        buf.extend(b"x")  # released with the registration

    def test_not_a_buffer(self) -> None:
        for bad in (object(), "text", 3.5, True):
            with self.subTest(obj=bad), self.assertRaises(te.InvalidArgumentError):
                self.a.register(bad)
        with self.assertRaises(te.InvalidArgumentError):
            self.a.register(0x1000)  # an int address needs a length
        with self.assertRaises(te.InvalidArgumentError):
            self.a.register(memoryview(bytearray(100))[::2])  # not contiguous

    def test_zero_length(self) -> None:
        with self.assertRaises(te.InvalidArgumentError) as cm:
            self.a.register(bytearray(0))
        self.assertTeError(cm, te.InvalidArgumentError, te.Status.INVALID_ARG)

    def test_bad_location(self) -> None:
        with self.assertRaises(te.Error) as cm:
            self.a.register(bytearray(100), location="floppy:0")
        self.assertIn(cm.exception.status, (te.Status.INVALID_ARG, te.Status.MEMORY_TYPE))
        self.assertIn("floppy", cm.exception.detail)

    def test_alloc_errors(self) -> None:
        with self.assertRaises(te.Error) as cm:
            self.a.alloc(4096, "cuda:0")  # no transport owns cuda here
        self.assertEqual(cm.exception.status, te.Status.MEMORY_TYPE)
        self.assertIn("cuda:0", cm.exception.detail)
        a = self.a.alloc(4096)
        a.free()
        with self.assertRaises(te.ArgumentError) as cm:
            a.free()
        self.assertEqual(cm.exception.status, te.Status.NOT_FOUND)
        with self.assertRaises(te.ArgumentError):
            a.read()
        a.close()

    def test_error_object(self) -> None:
        with self.assertRaises(te.NotRegisteredError) as cm:
            self.a.write(self.seg, bytearray(8), self.rreg.addr)
        e = cm.exception
        e2 = pickle.loads(pickle.dumps(e))
        self.assertIs(type(e2), te.NotRegisteredError)
        self.assertEqual((e2.status, e2.detail, e2.task, str(e2)),
                         (e.status, e.detail, e.task, str(e)))
        self.assertFalse(e.retryable)
        self.assertIs(te.error_class(-41), te.PathError)
        self.assertTrue(te.error_class(-41)(-41).retryable)
        self.assertIs(te.error_class(-122), te.TimeoutError)
        self.assertIs(te.error_class(-999), te.Error)
        self.assertTrue(issubclass(te.TimeoutError, TimeoutError))
        self.assertTrue(issubclass(te.EngineClosedError, te.InvalidHandleError))


class Deadlines(Pair):
    """never_complete keeps every slice until cancel or the deadline."""

    plugin = "never_complete"
    transfer = "timeout_ms: 300"

    def test_timeout_state(self) -> None:
        with self.assertRaises(te.TimeoutError) as cm:
            self.a.read(self.seg, self.lreg, self.rreg.addr, 4096)
        e = self.assertTeError(cm, te.TimeoutError, te.Status.TIMEOUT)
        self.assertEqual(e.task, 0)
        self.assertIsInstance(e, TimeoutError)  # the builtin too
        with self.a.batch(2) as b:
            b.submit([te.Request.read(self.seg, self.lreg.addr, self.rreg.addr, 10),
                      te.Request.write(self.seg, self.lreg.addr, self.rreg.addr, 10)])
            self.assertTrue(b.wait(None, check=False))
            for t in b.tasks():
                self.assertEqual((t.state, t.status), (te.State.TIMEOUT, te.Status.TIMEOUT))
                self.assertNotEqual(t.detail, "")
                self.assertIsInstance(t.error(), te.TimeoutError)
            st = b.status()
            self.assertEqual((st.state, st.timed_out), (te.State.TIMEOUT, 2))


class Cancel(Pair):
    plugin = "never_complete"
    transfer = "timeout_ms: 60000"

    def test_cancel_state(self) -> None:
        with self.a.batch(4) as b:
            b.submit([te.Request.write(self.seg, self.lreg.addr + i * 100,
                                       self.rreg.addr + i * 100, 100) for i in range(4)])
            self.assertFalse(b.wait(0))
            self.assertFalse(b.status().state.terminal)
            with self.assertRaises(te.BusyError) as cm:
                b.free()  # not terminal
            self.assertTeError(cm, te.BusyError, te.Status.BUSY)
            with self.assertRaises(te.BusyError):
                self.lreg.unregister()  # a live batch uses it
            b.cancel()
            with self.assertRaises(te.CanceledError) as cm2:
                b.wait(30)
            e = self.assertTeError(cm2, te.CanceledError, te.Status.CANCELED)
            self.assertEqual(e.task, 0)
            for t in b.tasks():
                self.assertEqual(t.state, te.State.CANCELED)
            self.assertEqual(b.status().canceled, 4)
        self.assertEqual(self.a._batches, {})

    def test_user_timeout_cancels(self) -> None:
        with self.assertRaises(te.TimeoutError) as cm:
            self.a.write(self.seg, self.lreg, self.rreg.addr, 100, timeout=0.05)
        self.assertEqual(cm.exception.status, te.Status.TIMEOUT)
        self.assertEqual(self.a._batches, {})
        self.lreg.unregister()  # nothing uses it any more

    def test_context_exit_cancels(self) -> None:
        with self.a.batch(1) as b:
            b.submit([te.Request.read(self.seg, self.lreg.addr, self.rreg.addr, 100)])
        with self.assertRaises(te.InvalidHandleError):
            b.status()

    def test_close_wakes_waiter(self) -> None:
        b = self.a.batch(1)
        b.submit([te.Request.read(self.seg, self.lreg.addr, self.rreg.addr, 100)])
        got = []

        def waiter() -> None:
            try:
                b.wait(None)
                got.append(None)
            except te.Error as e:
                got.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        self.assertFalse(b.wait(0.05))  # the waiter is most likely blocked by now
        self.a.close()  # cancels the batch, waits for the waiter's call, frees
        t.join(60)
        self.assertFalse(t.is_alive())
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], (te.CanceledError, te.EngineClosedError))


class Closed(Pair):
    def test_everything_raises(self) -> None:
        a, seg = self.a, self.seg
        b = a.batch(1)
        alloc = a.alloc(4096)
        a.close()
        a.close()  # idempotent
        self.assertTrue(a.closed)
        calls = {
            "register": lambda: a.register(bytearray(10)),
            "register int": lambda: a.register(0x1000, 10),
            "alloc": lambda: a.alloc(10),
            "copy": lambda: a.copy(bytearray(4), b"abcd"),
            "open_segment": lambda: a.open_segment("127.0.0.1:1"),
            "import_segment": lambda: a.import_segment("{}"),
            "export_segment": a.export_segment,
            "buffers": a.buffers,
            "probe": lambda: a.probe("x"),
            "batch": lambda: a.batch(1),
            "write": lambda: a.write(seg, self.lbuf, self.rreg.addr),
            "read": lambda: a.read(seg, self.lbuf, self.rreg.addr),
            "transfer": lambda: a.transfer([(te.Op.READ, seg, self.lreg.addr, 0, 1)]),
            "recv_notify": a.recv_notify,
            "set_log_level": lambda: a.set_log_level(te.LogLevel.DEBUG),
            "handle": lambda: a.handle,
            "batch.submit": lambda: b.submit([(te.Op.READ, seg, self.lreg.addr, 0, 1)]),
            "batch.wait": b.wait,
            "batch.status": b.status,
            "batch.task": lambda: b.task(0),
            "batch.cancel": b.cancel,
            "batch.free": b.free,
            "registration.unregister": self.lreg.unregister,
            "allocation.free": alloc.free,
        }
        for name, fn in calls.items():
            with self.subTest(call=name), self.assertRaises(te.Error) as cm:
                fn()
            if name not in ("allocation.free", "registration.unregister"):
                self.assertIsInstance(cm.exception, te.EngineClosedError, name)
                self.assertEqual(cm.exception.status, te.Status.INVALID_HANDLE)
                self.assertIn("closed", cm.exception.detail)
        # Closing what the engine owned is a no-op, and the buffers are released.
        b.close()
        seg.close()
        self.lreg.close()
        alloc.close()
        self.assertFalse(self.lreg.registered)
        self.lbuf.extend(b"x")
        with te.Engine.from_string(loopback_yaml("C")) as c:
            pass
        with self.assertRaises(te.EngineClosedError):
            c.batch(1)

    def test_forked_child(self) -> None:
        if not hasattr(os, "fork"):
            self.skipTest("no fork")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.a.batch(1)
            except te.EngineClosedError:
                self.a.close()  # lets go of it without touching the parent's engine
                code = 0
            except BaseException:
                pass
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.a.batch(1).close()  # the parent's engine is untouched


if __name__ == "__main__":
    unittest.main(verbosity=2)
