#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""compare-mooncake-api.py: the cost of Mooncake's Python API on te (python/compat).

The same transfer loop -- synchronous batches of BATCH requests of BLOCK bytes (default
128 x 64 KiB), WRITE and READ, one batch in flight -- through three front ends, against one
target process (`te-bench --target`, tcp on loopback, p2p metadata):

  compat    mooncake.engine.TransferEngine.batch_transfer_sync_write/read (python/compat)
  te-py     te's own binding: Engine.transfer(requests), the requests built once
  te-bench  the C tool: te-bench --initiator, same block, batch, depth 1, 1 thread

Rounds are interleaved (every front end and op once per round, the order rotating by round),
so load from elsewhere lands on all alike. Printed: GB/s (10^9 B/s) and per-batch latency as
the median over rounds, and per op the medians of the per-round ratios compat/te-py and
te-py/te-bench. The overhead of the layer is 1 - compat/te-py (target: <= 10 %).

Usage: bench/compare-mooncake-api.py [-C BUILD] [--rounds 5] [--seconds 2] [--block 64K]
                                     [--batch 128] [--ops write,read] [--md FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

TOP = Path(__file__).resolve().parents[1]


def size(text: str) -> int:
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if t[-1:] in "KMG" else t) * mult


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-C", "--build", default=os.environ.get("BUILD", "build"),
                    help="meson build directory (default: build)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per front end, op and round")
    ap.add_argument("--block", type=size, default=64 << 10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--ops", default="write,read")
    ap.add_argument("--warmup", type=int, default=8, help="untimed batches before each run")
    ap.add_argument("--md", help="also write the table to this file")
    return ap.parse_args()


def setup_env(build: Path) -> None:
    lib = build / "core" / "libte.so.0"
    tcp = build / "plugins" / "tcp"
    if not lib.exists() or not (build / "tools" / "te-bench").exists():
        sys.exit(f"compare-mooncake-api.py: {build} has no libte or te-bench "
                 f"(run: ninja -C {build})")
    os.environ.setdefault("TE_LIBRARY", str(lib))
    os.environ["TE_PLUGIN_PATH"] = str(tcp) + (
        ":" + os.environ["TE_PLUGIN_PATH"] if os.environ.get("TE_PLUGIN_PATH") else "")
    os.environ.pop("TE_CONFIG", None)
    for p in (TOP / "python", TOP / "python" / "compat"):
        sys.path.insert(0, str(p))


class Target:
    """te-bench --target serving a buffer until its stdin closes."""

    def __init__(self, build: Path, nbytes: int) -> None:
        self.proc = subprocess.Popen(
            [str(build / "tools" / "te-bench"), "--target", "--buffer-size", str(nbytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.segment = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("segment:"):
                self.segment = line.split(":", 1)[1].strip()
            if line.strip() == "ready":
                break
        if not self.segment:
            sys.exit(f"te-bench --target did not start (exit {self.proc.wait()})")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def timed(run_batch: Callable[[], None], seconds: float, warmup: int,
          nbytes: int) -> Dict[str, float]:
    for _ in range(warmup):
        run_batch()
    lat: List[float] = []
    t0 = time.perf_counter()
    end = t0 + seconds
    now = t0
    while now < end:
        a = time.perf_counter()
        run_batch()
        now = time.perf_counter()
        lat.append(now - a)
    total = now - t0
    return {"gbps": len(lat) * nbytes / total / 1e9, "lat_us": statistics.median(lat) * 1e6,
            "batches": len(lat)}


def main() -> int:
    args = parse()
    build = Path(args.build)
    if not build.is_absolute():
        build = TOP / build
    setup_env(build)
    import te
    from mooncake.engine import TransferEngine

    blk, n = args.block, args.batch
    nbytes = blk * n
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    target = Target(build, max(nbytes, 64 << 20))
    try:
        seg = target.segment
        # compat initiator
        mc = TransferEngine()
        if mc.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            sys.exit(f"compat initialize failed: {mc.last_error()}")
        mc_buf = ctypes.create_string_buffer(nbytes)
        mc_addr = ctypes.addressof(mc_buf)
        if mc.register_memory(mc_addr, nbytes) != 0:
            sys.exit(f"register_memory failed: {mc.last_error()}")
        remote = mc.get_first_buffer_address(seg)
        if not remote:
            sys.exit(f"get_first_buffer_address failed: {mc.last_error()}")
        bufs = [mc_addr + i * blk for i in range(n)]
        peers = [remote + i * blk for i in range(n)]
        lens = [blk] * n
        # te binding initiator
        tp = te.Engine(yaml='engine:\n  listen: "127.0.0.1:0"\n')
        tp_buf = bytearray(nbytes)
        tp_reg = tp.register(tp_buf, access=te.Access.LOCAL)
        tseg = tp.open_segment(seg)
        reqs = {op: [(te.Op.WRITE if op == "write" else te.Op.READ, tseg.id,
                      tp_reg.addr + i * blk, remote + i * blk, blk) for i in range(n)]
                for op in ops}

        def compat(op: str) -> Dict[str, float]:
            fn = mc.batch_transfer_sync_write if op == "write" else mc.batch_transfer_sync_read

            def one() -> None:
                if fn(seg, bufs, peers, lens) != 0:
                    raise RuntimeError(mc.last_error())
            return timed(one, args.seconds, args.warmup, nbytes)

        def tepy(op: str) -> Dict[str, float]:
            r = reqs[op]
            return timed(lambda: tp.transfer(r), args.seconds, args.warmup, nbytes)

        def tebench(op: str) -> Dict[str, float]:
            out = subprocess.run(
                [str(build / "tools" / "te-bench"), "--initiator", seg, "--op", op,
                 "--block-size", str(blk), "--batch", str(n), "--duration", str(args.seconds),
                 "--warmup", str(args.warmup), "--json", "-q"],
                capture_output=True, text=True, timeout=args.seconds * 10 + 60)
            rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
            if out.returncode != 0 or not rows or rows[-1].get("failed"):
                raise RuntimeError(f"te-bench failed ({out.returncode}): {out.stderr[-2000:]}")
            return {"gbps": rows[-1]["gbps"], "lat_us": rows[-1]["lat_us_p50"],
                    "batches": rows[-1]["samples"]}

        # The layer's own Python work per batch (argument checks, request list), timed
        # alone: a noise-resistant view of its overhead.
        k = 2000
        t0 = time.perf_counter()
        for _ in range(k):
            mc._requests(1, seg, bufs, peers, lens, "", "bench")
        layer_us = (time.perf_counter() - t0) / k * 1e6

        fronts = {"compat": compat, "te-py": tepy, "te-bench": tebench}
        names = list(fronts)
        res: Dict[str, Dict[str, List[Dict[str, float]]]] = {
            op: {f: [] for f in names} for op in ops}
        load0 = os.getloadavg()
        for r in range(args.rounds):
            order = names[r % 3:] + names[:r % 3]
            for op in ops:
                for f in order:
                    res[op][f].append(fronts[f](op))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{op} " + " ".join(f"{f} {res[op][f][-1]['gbps']:.2f}" for f in names)
                for op in ops), file=sys.stderr, flush=True)
        load1 = os.getloadavg()
    finally:
        target.close()

    med = statistics.median
    lines = [f"Mooncake API on te vs te's binding vs te-bench: {args.batch} x {blk >> 10} KiB "
             f"sync batches, tcp loopback, {args.rounds} rounds x {args.seconds:g} s, "
             "medians over rounds",
             "",
             "| op | compat GB/s | te-py GB/s | te-bench GB/s | compat us/batch | "
             "te-py us/batch | te-bench us/batch (p50) | compat/te-py | te-py/te-bench |",
             "|---|---|---|---|---|---|---|---|---|"]
    for op in ops:
        g = {f: med([x["gbps"] for x in res[op][f]]) for f in names}
        lat = {f: med([x["lat_us"] for x in res[op][f]]) for f in names}
        r1 = [a["gbps"] / b["gbps"] for a, b in zip(res[op]["compat"], res[op]["te-py"])]
        r2 = [a["gbps"] / b["gbps"] for a, b in zip(res[op]["te-py"], res[op]["te-bench"])]
        lines.append(f"| {op} | {g['compat']:.3f} | {g['te-py']:.3f} | {g['te-bench']:.3f} | "
                     f"{lat['compat']:.0f} | {lat['te-py']:.0f} | {lat['te-bench']:.0f} | "
                     f"{med(r1):.3f} ({min(r1):.2f}-{max(r1):.2f}) | "
                     f"{med(r2):.3f} ({min(r2):.2f}-{max(r2):.2f}) |")
    te_lat = med([x["lat_us"] for op in ops for x in res[op]["te-py"]])
    lines += ["", f"compat layer's own Python work per batch (checks, request list): "
              f"{layer_us:.1f} us = {100 * layer_us / te_lat:.2f} % of a te-py batch "
              f"({te_lat:.0f} us)"]
    lines += ["", f"load average {load0[0]:.2f} before, {load1[0]:.2f} after; ratios: median "
              "(min-max) of per-round ratios; compat overhead = 1 - compat/te-py"]
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
