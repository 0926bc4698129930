# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the Python binding tests: YAML, byte patterns, the peer process."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
SOURCE_ROOT = Path(os.environ.get("TE_SOURCE_ROOT", HERE.parents[1]))

# Run from the source tree without meson: find the package and a build's libte.
if str(SOURCE_ROOT / "python") not in sys.path:
    sys.path.insert(0, str(SOURCE_ROOT / "python"))

# Two processes over tcp on loopback, p2p metadata: the embedded default, spelled out.
TCP_YAML = """\
engine:
  listen: "127.0.0.1:0"
metadata:
  type: p2p
transfer:
  timeout_ms: 30000
transports:
  - name: tcp
    required: true
"""


def loopback_yaml(name: str, plugin: str = "loopback", transfer: str = "",
                  extra: str = "") -> str:
    """One engine of an in-process pair on a test plugin of tests/plugins."""
    y = f"engine: {{name: {name}}}\ntransports:\n  - name: {plugin}\n    required: true\n"
    y += extra
    if transfer:
        y += f"transfer: {{{transfer}}}\n"
    return y


def pattern(seed: int, n: int) -> bytes:
    """n deterministic pseudo-random bytes (the same in every process); pattern(s, n) is a
    prefix of pattern(s, m) for m > n (randbytes draws whole 32-bit words)."""
    return random.Random(seed).randbytes((n + 3) // 4 * 4)[:n]


def digest(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def env() -> Dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(
        [str(SOURCE_ROOT / "python")] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    return e


class Peer:
    """tests/python/peer.py in a child process: the target side of a transfer."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer.py"), *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env())
        hello = self._read()
        self.segment: str = hello["segment"]
        self.addr: int = hello["addr"]
        self.length: int = hello["length"]

    def _read(self) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait(10)
            raise RuntimeError(f"peer exited ({rc}) without answering")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"peer: {reply['error']}")
        return reply

    def ask(self, **cmd: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def digest(self, offset: int, length: int) -> str:
        return self.ask(cmd="digest", offset=offset, length=length)["sha256"]

    def fill(self, seed: int) -> None:
        self.ask(cmd="fill", seed=seed)

    def notifications(self, timeout: float = 10.0) -> List[List[str]]:
        return self.ask(cmd="notify", timeout=timeout)["messages"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(cmd="quit")
            except (OSError, RuntimeError, ValueError):
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


def numpy_or_none() -> Optional[Any]:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
