# SPDX-License-Identifier: Apache-2.0
"""The target process of the Python binding tests: registers a buffer with a known pattern,
announces its segment name and address as a JSON line, then answers commands on stdin
(digest, fill, export, notify, quit) until quit or EOF."""

from __future__ import annotations

import argparse
import json
import sys

import tehelp

import te


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=32 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--numpy", action="store_true", help="register a numpy array")
    args = ap.parse_args()

    with te.Engine.from_string(tehelp.TCP_YAML) as engine:
        if args.numpy:
            import numpy as np
            buf = np.zeros(args.size, dtype=np.uint8)
            view = memoryview(buf)
        else:
            buf = bytearray(args.size)
            view = memoryview(buf)
        patterns = {args.seed: tehelp.pattern(args.seed, args.size)}
        view[:] = patterns[args.seed]
        reg = engine.register(buf, access=te.Access.REMOTE)
        say(segment=engine.name, addr=reg.addr, length=reg.length)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["cmd"]
            if op == "quit":
                say(ok=True)
                break
            if op == "digest":
                off, n = cmd["offset"], cmd["length"]
                say(sha256=tehelp.digest(view[off:off + n]))
            elif op == "fill":
                if cmd["seed"] not in patterns:
                    patterns[cmd["seed"]] = tehelp.pattern(cmd["seed"], args.size)
                view[:] = patterns[cmd["seed"]]
                say(ok=True)
            elif op == "export":
                say(descriptor=engine.export_segment())
            elif op == "notify":
                msgs = engine.recv_notify(timeout=cmd.get("timeout", 10.0))
                say(messages=[[m.sender, m.message.hex()] for m in msgs])
            else:
                say(error=f"unknown command {op!r}")
        reg.unregister()
    return 0


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except te.Error as e:
        say(error=str(e))
        sys.exit(1)
