# SPDX-License-Identifier: Apache-2.0
"""The binding's ctypes structs and constants match include/te/te.h (as compiled by the C
compiler: layout.c prints them), and its Status enum matches te_status_str()."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import unittest

import tehelp

import te
from te import _lib

assert tehelp.SOURCE_ROOT  # imported first: it puts the package on sys.path

STRUCTS = {
    "te_engine_opts": _lib.EngineOpts,
    "te_buffer_info": _lib.BufferInfo,
    "te_request": _lib.Request,
    "te_task_info": _lib.TaskInfo,
    "te_batch_info": _lib.BatchInfo,
    "te_notify": _lib.Notify,
}


class Layout(unittest.TestCase):
    layout: dict

    @classmethod
    def setUpClass(cls) -> None:
        out = subprocess.run([LAYOUT_EXE], check=True, capture_output=True, text=True).stdout
        cls.layout = json.loads(out)

    def test_structs(self) -> None:
        for cname, cls in STRUCTS.items():
            with self.subTest(struct=cname):
                c = self.layout["structs"][cname]
                self.assertEqual(ctypes.sizeof(cls), c["size"])
                fields = {name: (getattr(cls, name).offset, getattr(cls, name).size)
                          for name, _ in cls._fields_}
                self.assertEqual(fields, {k: tuple(v) for k, v in c["fields"].items()})

    def test_constants(self) -> None:
        c = self.layout["constants"]
        self.assertEqual(te.DETAIL_MAX, c["TE_DETAIL_MAX"])
        self.assertEqual(te.NOTIFY_MAX, c["TE_NOTIFY_MAX"])
        self.assertEqual(te.Access.REMOTE_READ, c["TE_MEM_REMOTE_READ"])
        self.assertEqual(te.Access.REMOTE_WRITE, c["TE_MEM_REMOTE_WRITE"])
        self.assertEqual(te.Op.WRITE, c["TE_OP_WRITE"])
        self.assertEqual(te.State.INVALID, c["TE_STATE_INVALID"])
        self.assertEqual(te.LogLevel.TRACE, c["TE_LOG_TRACE"])

    def test_status_names(self) -> None:
        # Every Status member is a value libte knows; te_status_str names unknown ones so.
        unknown = te.status_str(-9999)
        for s in te.Status:
            with self.subTest(status=s.name):
                self.assertNotEqual(te.status_str(s), unknown)
        for v in range(-139, 2):
            if te.status_str(v) != unknown:
                self.assertIn(v, set(te.Status), f"libte knows status {v} "
                              f"({te.status_str(v)}), te.Status does not")

    def test_states(self) -> None:
        for s in te.State:
            self.assertEqual(te.state_str(s), s.name)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_layout.py LAYOUT_EXE [unittest args]")
    LAYOUT_EXE = sys.argv.pop(1)
    unittest.main(verbosity=2)
