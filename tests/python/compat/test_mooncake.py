# SPDX-License-Identifier: Apache-2.0
"""te's Mooncake compatibility layer (python/compat/mooncake): mooncake_app.py, written only
against Mooncake's documented API, in two processes over tcp (4 KiB to 16 MiB, sync, batch and
async calls, verified on both sides); the error cases (unregistered address, unknown segment,
peer killed mid-transfer, out-of-range lengths, bad arguments) returning Mooncake's failure
codes with te's detail; managed buffers; the configuration mapping (checked by te-info
--config for every protocol whose plugin is built)."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any, Dict

HERE = Path(__file__).resolve().parent
SOURCE_ROOT = Path(os.environ.get("TE_SOURCE_ROOT", HERE.parents[2]))
BUILD_ROOT = Path(os.environ.get("TE_BUILD_ROOT", SOURCE_ROOT / "build"))
COMPAT = SOURCE_ROOT / "python" / "compat"
for p in (SOURCE_ROOT / "python", COMPAT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import te  # noqa: E402
from mooncake import engine as mc  # noqa: E402
from mooncake.engine import (TransferEngine, TransferNotify, TransferOpcode,  # noqa: E402
                             UnsupportedError)

APP = HERE / "mooncake_app.py"
LOGGER = "te.compat.mooncake"


def child_env() -> Dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(COMPAT), str(SOURCE_ROOT / "python")] +
                                      ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    return e


class Target:
    """mooncake_app.py target SIZE in a child process."""

    def __init__(self, size: int) -> None:
        self.proc = subprocess.Popen([sys.executable, str(APP), "target", str(size)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=child_env())
        hello = self.read()
        self.segment: str = hello["segment"]
        self.addr: int = hello["addr"]
        self.size: int = hello["size"]
        self.first: int = hello["first"]

    def read(self) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"target exited with {self.proc.wait(10)}")
        return json.loads(line)

    def digest(self, off: int, n: int) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"digest {off} {n}\n")
        self.proc.stdin.flush()
        return self.read()["digest"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                f.close()


def cbuf(n: int, data: bytes = b"") -> ctypes.Array:
    return ctypes.create_string_buffer(data, n) if data else ctypes.create_string_buffer(n)


def addr(b: ctypes.Array) -> int:
    return ctypes.addressof(b)


class TestTwoProcesses(unittest.TestCase):
    """The documented-API program as initiator against the documented-API program as
    target: every call family, 4 KiB to 16 MiB, verified by the initiator (read back) and
    by the target (digest of its own memory)."""

    def test_app(self) -> None:
        target = Target(32 << 20)
        try:
            self.assertEqual(target.first, target.addr)
            r = subprocess.run([sys.executable, str(APP), "initiator", target.segment,
                                str(target.addr), str(target.size)],
                               capture_output=True, text=True, env=child_env(), timeout=240)
            lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
            bad = [x for x in lines if x.get("ok") is False]
            self.assertEqual(bad, [], r.stderr[-4000:])
            self.assertEqual(r.returncode, 0, r.stderr[-4000:])
            cases = {(x["case"], x["size"]) for x in lines if "case" in x}
            for case in ("sync", "batch", "submit_write", "batch_async",
                         "batch_async_opcode", "managed"):
                for n in (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20):
                    self.assertIn((case, n), cases)
            final = lines[-1]
            self.assertEqual(final["failures"], 0)
            self.assertEqual(target.digest(0, target.size), final["final_digest"])
        finally:
            target.close()


class EngineCase(unittest.TestCase):
    """One initialized compat engine and a registered 1 MiB local buffer per test."""

    def setUp(self) -> None:
        self.engine = TransferEngine()
        self.assertEqual(self.engine.initialize("localhost", "P2PHANDSHAKE", "tcp", ""), 0)
        self.local = cbuf(1 << 20, b"L" * 4096)
        self.laddr = addr(self.local)
        self.assertEqual(self.engine.register_memory(self.laddr, 1 << 20), 0)

    def tearDown(self) -> None:
        self.engine.close()

    def failed(self, ret: int, status: int, *words: str, code: int = -1) -> None:
        """ret is Mooncake's failure code, last_error() carries te's status and detail."""
        self.assertEqual(ret, code)
        info = self.engine.last_error_info()
        self.assertIsNotNone(info)
        assert info is not None
        self.assertEqual(info.status, int(status), str(info))
        self.assertEqual(info.code, code)
        text = self.engine.last_error()
        self.assertIn(info.status_name, text)
        for w in words:
            self.assertIn(w, text)


class TestErrors(EngineCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.target = Target(4 << 20)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.target.close()

    def test_unregistered_local(self) -> None:
        other = cbuf(8192)
        with self.assertLogs(LOGGER, "WARNING") as logs:
            ret = self.engine.transfer_sync_write(self.target.segment, addr(other),
                                                  self.target.addr, 4096)
        self.failed(ret, te.Status.NOT_REGISTERED, "transfer_sync_write",
                    "not in a registered region")
        self.assertIn("not in a registered region", "\n".join(logs.output))
        ret = self.engine.batch_transfer_sync_read(
            self.target.segment, [self.laddr, addr(other)], [self.target.addr] * 2, [4096] * 2)
        self.failed(ret, te.Status.NOT_REGISTERED, "task 1")
        self.assertEqual(self.engine.transfer_submit_write(self.target.segment, addr(other),
                                                           self.target.addr, 4096), 0)
        self.failed(0, te.Status.NOT_REGISTERED, code=0)
        self.assertEqual(self.engine.unregister_memory(addr(other)), -1)
        self.failed(-1, te.Status.NOT_REGISTERED, "0x")

    def test_unknown_segment(self) -> None:
        ret = self.engine.transfer_sync_read("localhost:1", self.laddr, 4096, 4096)
        self.failed(ret, te.Status.UNKNOWN_SEGMENT, "localhost:1")
        ret = self.engine.transfer_sync_write("no-such-engine", self.laddr, 4096, 4096)
        self.failed(ret, te.Status.UNKNOWN_SEGMENT, "no-such-engine", "host:port")
        self.assertEqual(self.engine.get_first_buffer_address("localhost:1"), 0)
        self.failed(0, te.Status.UNKNOWN_SEGMENT, code=0)
        self.assertEqual(self.engine.batch_transfer_async_write("localhost:1", [self.laddr],
                                                                [4096], [4096]), 0)
        self.assertEqual(self.engine.send_probe("localhost:1"), -1)
        self.assertIn("localhost:1", self.engine.last_error())

    def test_out_of_range(self) -> None:
        t = self.target
        # remote range past the peer's buffer
        ret = self.engine.transfer_sync_write(t.segment, self.laddr, t.addr + t.size - 100,
                                              4096)
        self.failed(ret, te.Status.REMOTE_ACCESS, "outside the registered buffers")
        # local range past the registration
        ret = self.engine.transfer_sync_read(t.segment, self.laddr + (1 << 20) - 100, t.addr,
                                             4096)
        self.failed(ret, te.Status.OUT_OF_RANGE, "runs past the end")
        # lengths Mooncake's API cannot take
        for bad in (-1, 1 << 64):
            ret = self.engine.transfer_sync_write(t.segment, self.laddr, t.addr, bad)
            self.failed(ret, te.Status.OUT_OF_RANGE, "length")
        ret = self.engine.batch_transfer_sync_write(t.segment, [self.laddr], [t.addr], [-5])
        self.failed(ret, te.Status.OUT_OF_RANGE, "lengths[0]")
        # async: the failure shows at submit (0) for a rejected request
        bid = self.engine.batch_transfer_async_read(t.segment, [self.laddr],
                                                    [t.addr + t.size], [4096])
        self.failed(bid, te.Status.REMOTE_ACCESS, code=0)

    def test_peer_killed_mid_transfer(self) -> None:
        victim = Target(16 << 20)
        try:
            e = self.engine
            big = cbuf(16 << 20)
            self.assertEqual(e.register_memory(addr(big), 16 << 20), 0)
            # 1 GiB of WRITEs in one batch: far from done when the peer is killed
            n = 1024
            bid = e.batch_transfer_async_write(victim.segment, [addr(big)] * n,
                                               [victim.addr] * n, [1 << 20] * n)
            self.assertNotEqual(bid, 0, e.last_error())
            victim.kill()
            t0 = time.monotonic()
            ret = e.get_batch_transfer_status([bid])
            self.assertLess(time.monotonic() - t0, 60)
            if ret == 0:  # it all landed before the kill: then the next one must fail
                ret = e.transfer_sync_write(victim.segment, addr(big), victim.addr, 1 << 20)
            self.assertEqual(ret, -1)
            info = e.last_error_info()
            assert info is not None
            self.assertLess(info.status, 0)
            self.assertTrue(info.detail, info)
            self.assertNotEqual(info.status, te.Status.INVALID_ARG, str(info))
            # the engine goes on serving other peers
            self.assertEqual(e.transfer_sync_write(self.target.segment, self.laddr,
                                                   self.target.addr, 4096), 0)
            self.assertEqual(e.transfer_sync_write(victim.segment, self.laddr, victim.addr,
                                                   4096), -1)
            self.assertIn(victim.segment.split(":")[1], e.last_error())
        finally:
            victim.close()

    def test_async_status(self) -> None:
        t = self.target
        bid = self.engine.transfer_submit_write(t.segment, self.laddr, t.addr, 4096)
        self.assertNotEqual(bid, 0)
        deadline = time.monotonic() + 30
        st = 0
        while st == 0 and time.monotonic() < deadline:
            st = self.engine.transfer_check_status(bid)
        self.assertEqual(st, 1)
        # reported once: the id is released
        self.failed(self.engine.transfer_check_status(bid), te.Status.INVALID_HANDLE,
                    "unknown")
        self.failed(self.engine.transfer_check_status(12345), te.Status.INVALID_HANDLE)
        self.failed(self.engine.transfer_check_status(0), te.Status.INVALID_HANDLE)
        self.failed(self.engine.get_batch_transfer_status([12345]), te.Status.INVALID_HANDLE)
        self.failed(self.engine.transfer_check_status("x"), te.Status.INVALID_ARG)

    def test_bad_arguments(self) -> None:
        e, t = self.engine, self.target
        cases = [
            (lambda: e.transfer_sync_write(t.segment, "0x10", t.addr, 10), "buffers[0]"),
            (lambda: e.transfer_sync_write(t.segment, self.laddr, None, 10),
             "peer_buffer_addresses[0]"),
            (lambda: e.transfer_sync_write(t.segment, 1.5, t.addr, 10), "float"),
            (lambda: e.transfer_sync_write(t.segment, True, t.addr, 10), "bool"),
            (lambda: e.transfer_sync_write(None, self.laddr, t.addr, 10), "target_hostname"),
            (lambda: e.transfer_sync_write(b"x", self.laddr, t.addr, 10), "target_hostname"),
            (lambda: e.batch_transfer_sync_write(t.segment, [self.laddr], [t.addr, t.addr],
                                                 [1]), "as long"),
            (lambda: e.batch_transfer_sync_read(t.segment, [], [], []), "empty"),
            (lambda: e.batch_transfer_sync_read(t.segment, None, [], []), "list"),
            (lambda: e.batch_transfer_sync_read(t.segment, "abc", [], []), "list"),
            (lambda: e.transfer_sync(t.segment, self.laddr, t.addr, 10, 7), "opcode"),
            (lambda: e.transfer_sync(t.segment, self.laddr, t.addr, 10, TransferOpcode.WRITE,
                                     "not a notify"), "TransferNotify"),
            (lambda: e.register_memory(0, 10), "nonzero"),
            (lambda: e.register_memory(self.laddr, -1), "capacities[0]"),
            (lambda: e.register_memory(self.laddr, 4096), "overlap"),
            (lambda: e.batch_register_memory([1, 2], [3]), "capacities"),
            (lambda: e.unregister_memory("x"), "buffer_addresses[0]"),
            (lambda: e.initialize("localhost", "P2PHANDSHAKE", "tcp", ""), "already"),
            (lambda: e.free_managed_buffer(self.laddr, 10), "allocate_managed_buffer"),
            (lambda: e.write_bytes_to_buffer(16, b"abc", 3), "not inside"),
            (lambda: e.write_bytes_to_buffer(self.laddr, b"abc", 4), "over the 3 bytes"),
            (lambda: e.write_bytes_to_buffer(self.laddr, 42, 4), "bytes-like"),
        ]
        for fn, word in cases:
            with self.subTest(word=word):
                with self.assertLogs(LOGGER, "WARNING"):
                    ret = fn()
                self.assertEqual(ret, -1, word)
                self.assertIn(word, self.engine.last_error())
        for fn, word in [(lambda: e.allocate_managed_buffer(0), "length"),
                         (lambda: e.allocate_managed_buffer("1"), "length"),
                         (lambda: e.batch_transfer_async(t.segment, [self.laddr], [t.addr],
                                                         [10], "READ"), "opcode"),
                         (lambda: e.get_first_buffer_address(5), "segment_name")]:
            with self.subTest(word=word):
                self.assertEqual(fn(), 0)
                self.assertIn(word, self.engine.last_error())
        with self.assertRaises(RuntimeError) as cm:
            e.read_bytes_from_buffer(16, 8)
        self.assertIn("not inside", str(cm.exception))
        # wrong arity is a TypeError, as from Mooncake's binding
        with self.assertRaises(TypeError):
            e.transfer_sync_write(t.segment, self.laddr)  # type: ignore[call-arg]

    def test_unsupported(self) -> None:
        e, t = self.engine, self.target
        for fn, name in [
            (lambda: e.transfer_write_on_cuda(t.segment, self.laddr, t.addr, 10, 0),
             "transfer_write_on_cuda"),
            (lambda: e.transfer_read_on_cuda(t.segment, self.laddr, t.addr, 10),
             "transfer_read_on_cuda"),
            (lambda: e.batch_transfer_write_on_cuda(t.segment, [], [], []),
             "batch_transfer_write_on_cuda"),
            (lambda: e.batch_transfer_read_on_cuda(t.segment, [], [], []),
             "batch_transfer_read_on_cuda"),
            (lambda: e.get_engine(), "get_engine"),
            (lambda: e.get_local_topology(), "get_local_topology"),
            (lambda: e.transfer_sync_write(t.segment, self.laddr, t.addr, 10, "rdma"),
             "transfer_sync_write"),
            (lambda: TransferEngine().initialize("localhost", "P2PHANDSHAKE", "shm", ""),
             "initialize"),
        ]:
            with self.subTest(name=name):
                with self.assertRaises(UnsupportedError) as cm:
                    fn()
                self.assertEqual(cm.exception.method, name)
                self.assertIn(name, str(cm.exception))
                self.assertIsInstance(cm.exception, NotImplementedError)
        # the hint naming the engine's own transport is honoured
        self.assertEqual(e.transfer_sync_write(t.segment, self.laddr, t.addr, 10, "tcp"), 0)

    def test_notify(self) -> None:
        peer = TransferEngine()
        self.assertEqual(peer.initialize("localhost", "P2PHANDSHAKE", "tcp", ""), 0)
        try:
            buf = cbuf(1 << 16)
            self.assertEqual(peer.register_memory(addr(buf), 1 << 16), 0)
            seg = f"localhost:{peer.get_rpc_port()}"
            n1 = TransferNotify("kv", "layer-0 done")
            self.assertEqual(self.engine.transfer_sync(seg, self.laddr, addr(buf), 4096,
                                                       TransferOpcode.WRITE, n1), 0)
            self.assertEqual(self.engine.batch_transfer_sync(
                seg, [self.laddr], [addr(buf)], [16], TransferOpcode.READ,
                TransferNotify("kv", "read 16")), 0)
            self.assertEqual(buf.raw[:4096], self.local.raw[:4096])
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got += peer.get_notifies()
                time.sleep(0.01)
            self.assertEqual(got, [n1, TransferNotify("kv", "read 16")])
            self.assertEqual(peer.get_notifies(), [])
            self.assertEqual(TransferNotify().name, "")
        finally:
            peer.close()

    def test_uninitialized(self) -> None:
        e = TransferEngine()
        self.assertEqual(e.get_rpc_port(), -1)
        self.assertIn("not initialized", e.last_error())
        self.assertEqual(e.register_memory(self.laddr, 10), -1)
        self.assertEqual(e.transfer_sync_write("localhost:1", 1, 2, 3), -1)
        self.assertEqual(e.allocate_managed_buffer(4096), 0)
        self.assertEqual(e.get_notifies(), [])
        self.assertIn("not initialized", e.last_error())
        self.assertIsNone(e.te_engine)


class TestManaged(EngineCase):
    def test_managed_buffers(self) -> None:
        e = self.engine
        seg = f"localhost:{e.get_rpc_port()}"
        self.assertEqual(e.get_first_buffer_address(seg), self.laddr)
        ptrs = [e.allocate_managed_buffer(n) for n in (4096, 1 << 20, 3)]
        self.assertTrue(all(ptrs), e.last_error())
        self.assertEqual(len(set(ptrs)), 3)
        for p in ptrs:
            self.assertEqual(p % 4096, 0)
        data = random.Random(1).randbytes(1 << 20)
        self.assertEqual(e.write_bytes_to_buffer(ptrs[1], data, len(data)), 0)
        self.assertEqual(e.read_bytes_from_buffer(ptrs[1], len(data)), data)
        self.assertEqual(e.read_bytes_from_buffer(ptrs[1] + 10, 5), data[10:15])
        # a managed buffer is registered: it can be a transfer's local side (to itself here)
        self.assertEqual(e.transfer_sync_write(seg, ptrs[1], self.laddr, 4096), 0)
        self.assertEqual(self.local.raw[:4096], data[:4096])
        self.assertEqual(e.get_first_buffer_address(seg), min([self.laddr] + ptrs))
        # freeing: the length must match; twice fails
        self.assertEqual(e.free_managed_buffer(ptrs[1], 4096), -1)
        self.assertIn("1048576", e.last_error())
        for p, n in zip(ptrs, (4096, 1 << 20, 3)):
            self.assertEqual(e.free_managed_buffer(p, n), 0)
        self.assertEqual(e.free_managed_buffer(ptrs[0], 4096), -1)
        self.assertEqual(e.read_bytes_from_buffer(self.laddr, 0), b"")
        self.assertEqual(e.unregister_memory(self.laddr), 0)
        self.assertEqual(e.get_first_buffer_address(seg), 0)
        self.assertIn("no registered buffers", e.last_error())

    def test_peer_registers_later(self) -> None:
        """A buffer the peer registers after this engine opened its segment is reachable
        (the cached descriptor is fetched again when a request falls outside it)."""
        peer = TransferEngine()
        self.assertEqual(peer.initialize("localhost", "P2PHANDSHAKE", "tcp", ""), 0)
        try:
            seg = f"localhost:{peer.get_rpc_port()}"
            b1, b2, b3 = cbuf(4096), cbuf(4096), cbuf(4096)
            self.assertEqual(peer.register_memory(addr(b1), 4096), 0)
            e = self.engine
            self.assertEqual(e.transfer_sync_write(seg, self.laddr, addr(b1), 4096), 0)
            self.assertEqual(peer.register_memory(addr(b2), 4096), 0)
            self.assertEqual(e.transfer_sync_write(seg, self.laddr, addr(b2), 4096), 0,
                             e.last_error())
            self.assertEqual(b2.raw, self.local.raw[:4096])
            self.assertEqual(peer.register_memory(addr(b3), 4096), 0)
            bid = e.batch_transfer_async_write(seg, [self.laddr], [addr(b3)], [4096])
            self.assertNotEqual(bid, 0, e.last_error())
            self.assertEqual(e.get_batch_transfer_status([bid]), 0)
            self.assertEqual(b3.raw, self.local.raw[:4096])
        finally:
            peer.close()

    def test_batch_registration_all_or_none(self) -> None:
        e = self.engine
        a, b = cbuf(8192), cbuf(8192)
        # the second region overlaps the registered one: the first is undone
        self.assertEqual(e.batch_register_memory([addr(a), self.laddr], [8192, 8192]), -1)
        self.assertEqual(e.register_memory(addr(a), 8192), 0)
        self.assertEqual(e.batch_register_memory([addr(b)], [8192]), 0)
        self.assertEqual(e.batch_unregister_memory([addr(a), addr(b)]), 0)
        self.assertEqual(e.batch_unregister_memory([addr(a)]), -1)


class TestConfig(unittest.TestCase):
    """initialize()'s arguments and Mooncake's environment mapped to te's YAML."""

    def cfg(self, *args: str, env: Any = None, mtype: Any = None) -> mc.CompatConfig:
        return mc.build_config(*args, metadata_type=mtype, env=env or {})

    def test_metadata(self) -> None:
        c = self.cfg("localhost", "P2PHANDSHAKE", "tcp", "")
        self.assertTrue(c.p2p)
        self.assertIn("type: p2p", c.template)
        self.assertNotIn("engine:\n  name:", c.template)
        self.assertIn('listen: "localhost:0"', c.yaml(0))
        c = self.cfg("10.0.0.1:12345", "etcd://10.0.0.1:2379,10.0.0.2:2379", "tcp", "")
        self.assertFalse(c.p2p)
        self.assertIn('name: "10.0.0.1:12345"', c.template)
        self.assertIn('endpoints: ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]',
                      c.template)
        self.assertEqual(c.ports, [12345])
        c = self.cfg("node1", "10.0.0.1:2379", "tcp", "")
        self.assertIn("type: etcd", c.template)
        self.assertIn('"http://10.0.0.1:2379"', c.template)
        c = self.cfg("node1", "redis://10.0.0.1:6379", "tcp", "",
                     env={"MC_REDIS_PASSWORD": "p@ss", "MC_REDIS_DB_INDEX": "3"})
        self.assertIn('"redis://:p%40ss@10.0.0.1:6379/3"', c.template)
        c = self.cfg("node1", "http://10.0.0.1:8080/metadata", "tcp", "")
        self.assertIn('type: http', c.template)
        self.assertIn('"http://10.0.0.1:8080/metadata"', c.template)
        c = self.cfg("node1", "", "tcp", "", env={"MC_METADATA_SERVER": "P2PHANDSHAKE"})
        self.assertTrue(c.p2p)
        c = self.cfg("node1", "10.0.0.1:2379", "tcp", "", mtype="redis")
        self.assertIn('"redis://10.0.0.1:2379"', c.template)
        for bad in ("", "zk://1.2.3.4:1"):
            with self.assertRaises(mc._Invalid):
                self.cfg("node1", bad, "tcp", "")

    def test_hostnames(self) -> None:
        self.assertIn('"[::1]:0"', self.cfg("[::1]", "P2PHANDSHAKE", "tcp", "").yaml(0))
        self.assertIn('"[::1]:7"', self.cfg("[::1]:7", "P2PHANDSHAKE", "tcp", "").yaml(7))
        self.assertIn('"[fe80::1]:0"', self.cfg("fe80::1", "P2PHANDSHAKE", "tcp", "").yaml(0))
        for bad in ("", "host:port", "host:70000", "[::1", "a b"):
            with self.subTest(bad=bad), self.assertRaises(mc._Invalid):
                self.cfg(bad, "P2PHANDSHAKE", "tcp", "")
        c = self.cfg("localhost", "P2PHANDSHAKE", "tcp", "",
                     env={"MC_MIN_PRC_PORT": "20000", "MC_MAX_PRC_PORT": "20003"})
        self.assertEqual(sorted(c.ports), [20000, 20001, 20002, 20003])

    def test_protocols(self) -> None:
        c = self.cfg("h", "P2PHANDSHAKE", "rdma", "mlx5_0, mlx5_1",
                     env={"MC_IB_PORT": "2", "MC_GID_INDEX": "3", "MC_MTU": "1024",
                          "MC_NUM_QP_PER_EP": "4", "MC_MAX_WR": "512",
                          "MC_MAX_CQE_PER_CTX": "8192", "MC_IB_TC": "-1"})
        self.assertIn("- name: rdma", c.template)
        self.assertIn('devices: "mlx5_0:2,mlx5_1:2"', c.template)
        for kv in ('gid_index: "3"', "mtu: 1024", "qp_per_peer: 4", "qp_depth: 512",
                   "cq_depth: 8192"):
            self.assertIn(kv, c.template)
        self.assertNotIn("traffic_class", c.template)
        c = self.cfg("h", "P2PHANDSHAKE", "rdma", "", env={"MC_TE_FILTERS": "mlx5_2"})
        self.assertIn('devices: "mlx5_2"', c.template)
        self.assertIn('devices: "rdmap0s6"',
                      self.cfg("h", "P2PHANDSHAKE", "efa", "rdmap0s6").template)
        self.assertIn('device: "/dev/dax0.0"',
                      self.cfg("h", "P2PHANDSHAKE", "cxl", "/dev/dax0.0").template)
        with self.assertRaises(mc._Invalid):
            self.cfg("h", "P2PHANDSHAKE", "cxl", "")
        for proto, plugin in (("nvlink", "nvlink"), ("nvlink_intra", "nvlink"),
                              ("hip", "hip"), ("TCP", "tcp")):
            self.assertEqual(self.cfg("h", "P2PHANDSHAKE", proto, "").transport, plugin)
        c = self.cfg("h", "P2PHANDSHAKE", "tcp", "mlx5_0", env={"MC_TCP_BIND_ADDRESS": "0.0.0.0"})
        self.assertIn('bind: "0.0.0.0"', c.template)
        self.assertTrue(any("device_name" in n for n in c.notes))
        for proto in ("shm", "nvmeof", "ascend"):
            with self.assertRaises(UnsupportedError):
                self.cfg("h", "P2PHANDSHAKE", proto, "")
        with self.assertRaises(mc._Invalid):
            self.cfg("h", "P2PHANDSHAKE", "carrier-pigeon", "")
        c = self.cfg("h", "P2PHANDSHAKE", "tcp", "",
                     env={"TE_MOONCAKE_TRANSPORT_OPTIONS": "lanes=4, bind=127.0.0.2"})
        self.assertIn('bind: "127.0.0.2"', c.template)
        self.assertIn('lanes: "4"', c.template)

    def test_env(self) -> None:
        c = self.cfg("h", "P2PHANDSHAKE", "tcp", "",
                     env={"MC_TRANSFER_TIMEOUT": "7", "MC_RETRY_CNT": "5",
                          "MC_SLICE_SIZE": "65536", "MC_LOG_LEVEL": "WARNING",
                          "MC_HANDSHAKE_MAX_LENGTH": "10485760",
                          "TE_MOONCAKE_SECRET_FILE": "/etc/te/secret",
                          "MC_LOG_DIR": "/tmp", "MC_FORCE_TCP": "1"})
        for kv in ("timeout_ms: 7000", "retries: 5", "slice_size: 65536", "level: warn",
                   "max_frame: 10485760", 'secret_file: "/etc/te/secret"'):
            self.assertIn(kv, c.template)
        ignored = " ".join(c.notes)
        self.assertIn("MC_LOG_DIR", ignored)
        self.assertIn("MC_FORCE_TCP", ignored)
        for bad in ({"MC_TRANSFER_TIMEOUT": "soon"}, {"MC_LOG_LEVEL": "LOUD"},
                    {"MC_TRANSFER_TIMEOUT": "0"}, {"MC_RETRY_CNT": "500"},
                    {"MC_HANDSHAKE_MAX_LENGTH": "1"}):
            with self.subTest(bad=bad), self.assertRaises(mc._Invalid):
                self.cfg("h", "P2PHANDSHAKE", "tcp", "", env=bad)

    def test_te_info_accepts_every_protocol(self) -> None:
        """te-info --config checks each YAML against the plugins' declared options."""
        info = BUILD_ROOT / "tools" / "te-info"
        if not info.exists():
            self.skipTest(f"{info} is not built")
        with tempfile.TemporaryDirectory() as d:
            dax = Path(d) / "window"
            dax.write_bytes(bytes(1 << 16))
            for proto, dev in (("tcp", ""), ("rdma", "mlx5_0"), ("efa", "rdmap0"),
                               ("nvlink", ""), ("hip", ""), ("cxl", str(dax))):
                for server in ("P2PHANDSHAKE", "etcd://127.0.0.1:2379", "redis://127.0.0.1",
                               "http://127.0.0.1:8080/metadata"):
                    c = mc.build_config("127.0.0.1", server, proto, dev,
                                        env={"MC_TRANSFER_TIMEOUT": "5", "MC_RETRY_CNT": "2",
                                             "MC_SLICE_SIZE": "65536", "MC_GID_INDEX": "3",
                                             "MC_MTU": "1024", "MC_NUM_QP_PER_EP": "4",
                                             "MC_MAX_WR": "256", "MC_IB_TC": "3",
                                             "MC_MAX_CQE_PER_CTX": "8192",
                                             "MC_HANDSHAKE_MAX_LENGTH": "1048576"})
                    path = Path(d) / "node.yaml"
                    path.write_text(c.yaml(0))
                    r = subprocess.run([str(info), "--config", str(path)], capture_output=True,
                                       text=True, timeout=60)
                    with self.subTest(proto=proto, server=server):
                        self.assertEqual(r.returncode, 0, c.yaml(0) + r.stdout + r.stderr)
                        self.assertIn("timeout_ms: 5000", r.stdout)


class TestHttpMetadata(unittest.TestCase):
    """metadata_server http://...: segments named by local_hostname, as in Mooncake's
    non-P2P mode, through te-metadata-server."""

    def test_named_segments(self) -> None:
        server = BUILD_ROOT / "tools" / "te-metadata-server"
        if not server.exists():
            self.skipTest(f"{server} is not built")
        proc = subprocess.Popen([str(server), "--listen", "127.0.0.1:0"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        a, b = TransferEngine(), TransferEngine()
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            self.assertIn("listening on ", line)
            url = line.split("listening on ", 1)[1].strip()
            ret = a.initialize("127.0.0.1", url, "tcp", "")
            if ret != 0 and "not built" in a.last_error():
                self.skipTest(a.last_error())
            self.assertEqual(ret, 0, a.last_error())
            # local_hostname is the segment name; a port in it is the listener's
            self.assertEqual(b.initialize("127.0.0.1", url, "tcp", ""), -1)  # a holds it
            self.assertEqual(b.last_error_info().status, te.Status.EXISTS,  # type: ignore
                             b.last_error())
            self.assertEqual(b.initialize("no-such-host.invalid", url, "tcp", ""), -1)
            self.assertIn("no-such-host.invalid", b.last_error())
            self.assertEqual(b.initialize_ext("localhost", url.split("://", 1)[1], "tcp", "",
                                              "http"), 0, b.last_error())
            buf = cbuf(1 << 16)
            self.assertEqual(a.register_memory(addr(buf), 1 << 16), 0)
            src = cbuf(4096, b"named" * 800)
            self.assertEqual(b.register_memory(addr(src), 4096), 0)
            self.assertEqual(b.get_first_buffer_address("127.0.0.1"), addr(buf))
            self.assertEqual(b.transfer_sync_write("127.0.0.1", addr(src), addr(buf), 4096), 0)
            self.assertEqual(buf.raw[:4000], b"named" * 800)
            self.assertEqual(b.transfer_sync_write("nobody", addr(src), addr(buf), 4096), -1)
            self.assertIn("nobody", b.last_error())
        finally:
            a.close()
            b.close()
            proc.terminate()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


class TestInitialize(unittest.TestCase):
    def test_failures_and_ext(self) -> None:
        e = TransferEngine()
        with self.assertLogs(LOGGER, "WARNING"):
            self.assertEqual(e.initialize("localhost", "P2PHANDSHAKE", "pigeon", ""), -1)
        self.assertIn("pigeon", e.last_error())
        self.assertEqual(e.initialize(None, "P2PHANDSHAKE", "tcp", ""), -1)
        self.assertIn("local_hostname", e.last_error())
        # a metadata store nobody serves: te's detail names it
        self.assertEqual(e.initialize("localhost", "etcd://127.0.0.1:1", "tcp", ""), -1)
        self.assertLess(e.last_error_info().status, 0)  # type: ignore[union-attr]
        self.assertIn("127.0.0.1:1", e.last_error())
        os.environ["MC_TRANSFER_TIMEOUT"] = "bad"
        try:
            self.assertEqual(e.initialize("localhost", "P2PHANDSHAKE", "tcp", ""), -1)
            self.assertIn("MC_TRANSFER_TIMEOUT", e.last_error())
        finally:
            del os.environ["MC_TRANSFER_TIMEOUT"]
        # a failed initialize leaves it usable
        self.assertEqual(e.initialize_ext("localhost", "P2PHANDSHAKE", "tcp", "", "p2p"), 0)
        try:
            self.assertGreater(e.get_rpc_port(), 0)
            self.assertIn("type: p2p", e.te_config or "")
        finally:
            e.close()

    def test_port_and_env(self) -> None:
        os.environ["MC_TRANSFER_TIMEOUT"] = "9"
        e = TransferEngine()
        try:
            self.assertEqual(e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
            self.assertIn("timeout_ms: 9000", e.te_config or "")
            port = e.get_rpc_port()
            # a second engine on the same port: te's detail says why
            f = TransferEngine()
            self.assertEqual(f.initialize(f"127.0.0.1:{port}", "P2PHANDSHAKE", "tcp", ""), -1)
            self.assertIn("in use", f.last_error())
        finally:
            del os.environ["MC_TRANSFER_TIMEOUT"]
            e.close()

    def test_features(self) -> None:
        for name in ("SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL",
                     "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"):
            self.assertIsInstance(getattr(mc, name), bool)
        self.assertFalse(mc.SUPPORT_MUSA)
        with self.assertRaises(AttributeError):
            mc.SUPPORT_NOTHING  # noqa: B018
        with self.assertRaises(ImportError) as cm:
            importlib.import_module("mooncake.store")
        self.assertIn("not provided", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
