#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare-builds.sh: te builds (or configurations) against each other and the raw loop, one cell, interleaved.
#
# Usage: bench/compare-builds.sh [-C BUILD] [--te NAME=DIR[@CONFIG] ...] [--rounds 8] [--no-raw]
#            [--congestion NAME] [--md FILE] [-- TE-BENCH-ARGS...]
#   The before/after of a change: one te-bench cell (TE-BENCH-ARGS: --op, --block-size,
#   --batch, --threads, --depth, --duration ...; default duration 1 s) run by every variant
#   and by tcp-raw-loop (BUILD's, same op, block, batch, depth and --connections = threads),
#   round by round; each round runs them all in an order that rotates by round, so load
#   from elsewhere lands on all alike.
#   A variant is a build directory with tools/te-bench and plugins/ (e.g. a `git worktree`
#   of the commit before, built with `meson setup build && ninja -C build tools/te-bench
#   plugins/tcp/tcp.so`), optionally with a te configuration file (@CONFIG: the same build
#   under two configurations is two variants). Its plugins are found in its own tree first
#   (TE_PLUGIN_PATH is set to them). Without --te: one variant, te = BUILD (te against the
#   raw loop alone); without TE-BENCH-ARGS: te-bench's defaults (READ, 64K, batch 128).
#   Table (Markdown, stdout and --md FILE): per variant the median (min-max) requests/s and
#   GB/s over rounds; the median (min-max) of the per-round ratios against the first variant
#   and against the raw loop; CPU microseconds per request of initiator + target over the
#   timed loops (both tools' cpu_s_initiator + cpu_s_target; '-' for a te-bench too old to
#   report them); the median steal (the hypervisor's share of the machine's CPU time during
#   the run, te-bench's steal_pct). Per-round lines go to stderr as they come.
#   Load average before and after, other work on the machine meanwhile (CPUs' worth of busy
#   CPU time outside this script and its runs, per second: /proc/stat and rusage), and the
#   host's TCP congestion control. --congestion NAME:
#   the raw loop's connections use NAME (tcp-raw-loop --congestion), and so do those of a te
#   variant without @CONFIG (it runs the default configuration with the tcp option
#   congestion: NAME); a variant with @CONFIG gets what its file says (a file that names no
#   congestion is said on stderr: its te runs on the host's). te-bench --loopback's target buffer
#   holds at most 256 MiB unless told (--buffer-size); a cell that needs more (threads x depth
#   x batch x block, twice) gets a --buffer-size that fits it when none is given and it fits
#   in a third of MemAvailable (said on stderr), so te and the raw loop run the same batch. A
#   variant whose te-bench still ran a smaller batch than asked gets a note under the table
#   and on stderr: its working set is not the raw loop's. Exit 1 when a run failed (its round
#   counts for none of the ratios), 2 on a usage error.
set -euo pipefail

me=compare-builds.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"

command -v python3 >/dev/null || die "python3 is needed to run the measurements and read their JSON"

prog=$(
	cat <<'PY'
import argparse, os, re, subprocess, sys, tempfile

build, top = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(top, "bench"))
from benchlib import (OtherLoad, congestion_name_ok, emit, host_cc, last_json, loadavg, med,
                      raw_loop_args, size_of, te_bench_opt, write_tcp_config)
argv = sys.argv[3:]
bench_args = []
if "--" in argv:
    k = argv.index("--")
    argv, bench_args = argv[:k], argv[k + 1:]


def usage(msg):
    print(f"compare-builds.sh: {msg} (try --help)", file=sys.stderr)
    sys.exit(2)


ap = argparse.ArgumentParser(prog="compare-builds.sh", add_help=False)
ap.add_argument("--te", action="append", default=[])
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--no-raw", action="store_true")
ap.add_argument("--md", default=None)
ap.add_argument("--congestion", default=None)
try:
    a = ap.parse_args(argv)
except SystemExit:
    sys.exit(2)

if not a.te:
    a.te = [f"te={build}"]
if not 1 <= a.rounds <= 1000:
    usage("--rounds: 1 to 1000")
variants, names = [], set()
for spec in a.te:
    name, eq, rest = spec.partition("=")
    if not eq or not name or not rest:
        usage(f"--te '{spec}': want NAME=DIR[@CONFIG]")
    if name in names or name == "raw":
        usage(f"--te '{spec}': the name '{name}' is taken")
    names.add(name)
    d, at, cfg = rest.partition("@")
    d = os.path.abspath(d)
    exe = os.path.join(d, "tools", "te-bench")
    if not os.access(exe, os.X_OK):
        usage(f"--te '{spec}': {exe} is not built")
    if at and not os.path.isfile(cfg):
        usage(f"--te '{spec}': no configuration file '{cfg}'")
    plugdirs = sorted(r for r, _, fs in os.walk(os.path.join(d, "plugins"))
                      if any(f.endswith(".so") for f in fs))
    variants.append(dict(name=name, exe=exe, cfg=os.path.abspath(cfg) if at else None,
                         plug=plugdirs, ops=[], gbps=[], steal=[], cpu=[], fails=0,
                         reduced=None))
for x in ("--json", "-j", "--loopback", "--initiator", "--target", "--core", "--config", "-c"):
    if x in bench_args:
        usage(f"'{x}' is set by this script; give a configuration as --te NAME=DIR@CONFIG")


def opt(names, default):
    """The value of a te-bench option in bench_args (last one wins), as given."""
    return te_bench_opt(bench_args, names, default)


iters = opt(["-n", "--iterations"], None)
if opt(["-d", "--duration"], None) is None and iters is None:
    bench_args += ["--duration", "1"]
raw_exe = os.path.join(build, "bench", "tcp-raw-loop")
raw = not a.no_raw
if raw and not os.access(raw_exe, os.X_OK):
    usage(f"{raw_exe} is not built (or give --no-raw)")
raw_args = []
if raw:
    try:
        raw_args = raw_loop_args(bench_args,
                                 ((["-d", "--duration"], "--duration", None if iters else "1"),
                                  (["-n", "--iterations"], "--iterations", None),
                                  (["-w", "--warmup"], "--warmup", None)))
    except ValueError as e:
        usage(str(e))
    if a.congestion:
        raw_args += ["--congestion", a.congestion]
if a.congestion is not None and not congestion_name_ok(a.congestion):
    usage(f"--congestion: '{a.congestion}' is not an algorithm name")
tmpdir = None
for v in variants if a.congestion else []:
    if v["cfg"]:
        with open(v["cfg"]) as f:
            if not re.search(r"^\s*congestion\s*:", f.read(), re.M):
                print(f"compare-builds.sh: variant {v['name']}: {v['cfg']} sets no congestion: its te "
                      f"connections use the host's ({host_cc()}), the raw loop's "
                      f"{a.congestion}", file=sys.stderr)
        continue
    # The default configuration, with the raw loop's congestion control (as compare-tcp.sh).
    if tmpdir is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="te-compare-builds.")
    v["cfg"] = write_tcp_config(os.path.join(tmpdir.name, f"congestion-{a.congestion}.yaml"),
                                [f"congestion: {a.congestion}"])
    v["cfg_said"] = f"the default configuration with congestion: {a.congestion}"


def run(cmd, env):
    """The last JSON row of a run, or None (and why) when it failed."""
    p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    row = last_json(p.stdout)
    if p.returncode != 0 or not row or row.get("failed") or not row.get("ops_per_s"):
        why = "; ".join(l for l in p.stderr.splitlines()[-3:] if l.strip())
        return None, f"exit {p.returncode}: {why}"
    return row, None


def cpu_per_request(row):
    """Microseconds of CPU per request, initiator + target, over the timed loops (te-bench's
    and tcp-raw-loop's cpu_s_initiator and cpu_s_target); None when a row lacks either (a
    te-bench from before they were reported)."""
    ci, ct, n = row.get("cpu_s_initiator"), row.get("cpu_s_target"), row.get("requests")
    if ci is None or ct is None or not n:
        return None
    return (ci + ct) / n * 1e6


def mem_available():
    """MemAvailable in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for l in f:
                if l.startswith("MemAvailable:"):
                    return int(l.split()[1]) * 1024
    except OSError:
        pass
    return 0


# te-bench --loopback sizes its target buffer for the batch asked, but at most 256 MiB; the raw
# loop's has no such cap. Beyond it, give te-bench the buffer the cell needs (both halves,
# threads x depth x batch x block each, as te-bench computes it), so that both run the batch
# asked, while that fits in a third of the memory available (the initiator holds as much).
LOOPBACK_MAX = 256 << 20
own = any(x in bench_args or any(y.startswith(x + "=") for y in bench_args)
            for x in ("--buffer-size", "-S", "--sizes", "-s", "--sweep", "--batches"))
try:
    block = size_of(opt(["-b", "--block-size"], "64K"))
    batch, depth, thr = (int(opt(n, d)) for n, d in ((["-B", "--batch"], "128"),
                                                      (["-D", "--depth"], "1"),
                                                      (["-t", "--threads"], "1")))
except ValueError:
    own = True  # te-bench itself says what is wrong with them
if not own:  # neither a buffer given nor several cells
    need = (2 * thr * depth * batch * block + 2 * 4096 + (1 << 20) - 1) & ~((1 << 20) - 1)
    if LOOPBACK_MAX < need <= mem_available() // 3:
        bench_args += ["--buffer-size", str(need)]
        print(f"compare-builds.sh: te-bench gets --buffer-size {need} (the batch asked needs "
              f"more than the {LOOPBACK_MAX >> 20} MiB its --loopback target holds by "
              "default; the raw loop sizes its own)", file=sys.stderr)

load0 = loadavg()
other = OtherLoad()
entries = [dict(name="raw", ops=[], gbps=[], steal=[], cpu=[], fails=0)] if raw else []
allv = variants + entries
per_round = []  # {name: ops/s or None}
failed_any = False
for r in range(a.rounds):
    order = allv[r % len(allv):] + allv[:r % len(allv)]
    got, line = {}, []
    for v in order:
        env = dict(os.environ)
        if v["name"] == "raw":
            cmd = [raw_exe, "--loopback", "--json"] + raw_args
        else:
            cmd = [v["exe"], "--loopback", "--json", "--quiet"] + bench_args
            if v["cfg"]:
                cmd += ["--config", v["cfg"]]
            env["TE_PLUGIN_PATH"] = ":".join(v["plug"] + [p for p in [env.get("TE_PLUGIN_PATH")] if p])
        row, why = run(cmd, env)
        if not row:
            failed_any = True
            v["fails"] += 1
            got[v["name"]] = None
            print(f"compare-builds.sh: round {r + 1}: {v['name']} failed ({why})", file=sys.stderr)
            line.append(f"{v['name']} FAILED")
            continue
        ran, asked = row.get("batch"), row.get("batch_requested")
        if v["name"] != "raw" and ran and asked and ran < asked and not v["reduced"]:
            v["reduced"] = (asked, ran)
            print(f"compare-builds.sh: {v['name']} ran batch {ran}, not {asked} (its target "
                  "buffer is full): the working sets differ", file=sys.stderr)
        got[v["name"]] = row["ops_per_s"]
        v["ops"].append(row["ops_per_s"])
        v["gbps"].append(row.get("gbps") or 0.0)
        if row.get("steal_pct") is not None:
            v["steal"].append(row["steal_pct"])
        cpu = cpu_per_request(row)
        if cpu is not None:
            v["cpu"].append(cpu)
        line.append(f"{v['name']} {row['ops_per_s'] / 1000:.1f}k")
    per_round.append(got)
    print(f"round {r + 1}/{a.rounds}: " + "  ".join(line), file=sys.stderr, flush=True)
load1 = loadavg()
other_cpus = other.figure()


def ratios(name, base):
    return [g[name] / g[base] for g in per_round if g.get(name) and g.get(base)]


first = variants[0]["name"]
lines = [f"te-bench --loopback {' '.join(bench_args)}"
         + (f" against tcp-raw-loop --loopback {' '.join(raw_args)}" if raw else "")
         + f"; {a.rounds} round(s), interleaved; load average {load0} before, {load1} after; "
         f"other work on the machine meanwhile {other_cpus} CPUs (busy CPU time outside the "
         "runs, per second); "
         f"host TCP congestion control {host_cc()}.", "",
         "Requests/s and GB/s: median (min-max) over rounds; ratios: median (min-max) of the "
         "per-round ratios (rounds where both ran); CPU us/req: CPU time of initiator + target "
         "per request over the timed loops (user + system, all threads), median (min-max); "
         "steal %: median of the runs' steal_pct.", "",
         f"| variant | requests/s | GB/s | vs {first} | vs raw | CPU us/req | steal % | failed |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
for v in allv:
    vs_first = med(ratios(v["name"], first), 3) if v["name"] != first else "1"
    vs_raw = (med(ratios(v["name"], "raw"), 3) if v["name"] != "raw" else "1") if raw else "-"
    lines.append(f"| {v['name']} | {med(v['ops'], 0)} | {med(v['gbps'], 3)} | {vs_first} | "
                 f"{vs_raw} | {med(v['cpu'], 3)} | {med(v['steal'], 0)} | {v['fails']} |")
lines.append("")
for v in variants:
    if v["reduced"]:
        asked, ran = v["reduced"]
        differ = f"; the raw loop ran {asked}, so the working sets differ" if raw else ""
        lines.append(f"Note: {v['name']} ran batch {ran}, not the {asked} asked: te-bench "
                     "--loopback's target buffer (--buffer-size, by default at most 256 MiB) "
                     f"must hold threads x depth x batch x block twice{differ}. Give --batch "
                     f"{ran} or a larger --buffer-size (or fewer threads, a smaller block) to "
                     "compare like with like.")
for v in variants:
    lines.append(f"{v['name']}: {v['exe']}" + (f" with {v.get('cfg_said') or v['cfg']}" if v["cfg"] else "")
                 + f"; plugins from {', '.join(v['plug']) or '(none found in its tree)'}")
emit(lines, a.md)
sys.exit(1 if failed_any else 0)
PY
)
exec python3 -c "$prog" "$build" "$top" ${args[@]+"${args[@]}"}
