#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare-tcp.sh: te-bench over tcp against tcp-raw-loop and iperf3 on loopback, interleaved, one table.
#
# Usage: bench/compare-tcp.sh [-C BUILD] [--sizes 4K,64K,1M,8M,64M] [--working-sets 8M,256M]
#            [--threads 1,2,4] [--ops read,write] [--rounds 5] [--duration 5] [--quick]
#            [--no-iperf3] [--no-latency] [--te-config FILE | --te-lanes N|threads]
#            [--congestion NAME] [--rerun-below RATIO [--rerun-rounds 8]] [--md FILE]
#   Cells: op x block size x working set x threads. A cell's working set is spread over its
#   threads as te-bench lays it out: batch = working set / (threads x block) (at least 1, at
#   most 65536), depth 1, so each batch in flight has its own areas; the table shows the
#   working set actually used (a block larger than its share makes it bigger; cells that end
#   up identical are run once). Both warm up with te-bench's 8 untimed batches (fewer, at
#   least 1, where that would exceed 256M).
#   Per cell and round: `te-bench --loopback` (tcp plugin), `tcp-raw-loop --loopback` (same
#   op, block, batch, depth, threads/connections and buffer size) and iperf3 on 127.0.0.1
#   (-l block, at most 1M, -P threads; write = client sends, read = -R; a fresh one-off server
#   on a free port per measurement, stopped by PID; one measurement per op, block and threads,
#   shared by the working sets). Rounds are interleaved (every cell once per round; the
#   order of te, raw, iperf3 rotates by round), so load from elsewhere lands on all alike.
#   Then a latency row: one 4K READ at a time (te-bench --batch 1 --depth 1 against
#   tcp-raw-loop --pingpong), p50/p99/p99.9.
#   Table (Markdown, stdout and --md FILE): GB/s as median (min-max) over rounds; te/raw and
#   te/iperf3 as the median (min-max) of the per-round ratios; CPU-s/GB of initiator + target
#   (te-bench's --loopback child; tcp-raw-loop's forked server) from utime+stime in
#   /proc/<pid>/stat, sampled at the first and last progress line of a run (steady state,
#   setup excluded: needs --duration >= 4); shorter runs count the whole processes from
#   their rusage, setup included, marked '*'. Context switches per request of initiator +
#   target likewise (/proc/<pid>/task/*/status; rusage): a raw loop that runs at two speeds
#   on the same machine shows why in this column (its receiving thread sleeps or not).
#   Load average before and after; other work: the CPU time the machine was busy outside
#   this script and the runs it waited for, per second of the whole run, in CPUs (/proc/stat
#   and rusage; the load average also counts the runs' own threads and what ran before);
#   and steal: the share of the machine's CPU time the hypervisor gave to other guests
#   (/proc/stat), over the whole run and per cell.
#   te runs with its default configuration (tcp: 4 lanes, an epoll worker per CPU up to 4, 1M
#   slices), whatever the thread count; tcp-raw-loop opens one connection per thread.
#   --te-config FILE passes a configuration to te-bench; --te-lanes N (or `threads`: as many
#   as the cell's threads) writes one with that many tcp lanes.
#   --congestion NAME: every connection of all three uses that TCP congestion control (te's
#   tcp option 'congestion', tcp-raw-loop --congestion, iperf3 -C); default: the host's
#   (net.ipv4.tcp_congestion_control, named in the table's first line). With BBR as the host's
#   default and no fq qdisc, every connection paces itself with a timer: on this loopback
#   that halved te's and the raw loop's rates for small blocks and made the raw loop's
#   swing 2-4x from run to run (bench/README.md); compare under both.
#   --rerun-below RATIO: after the rounds, every cell whose te/raw median is under RATIO
#   (e.g. 0.9, a target) runs --rerun-rounds more rounds (default 8) of te and the raw loop
#   only, interleaved among those cells as above; its figures then pool all its rounds, the
#   table gains a column with each cell's count of rounds, and a note gives each such cell's
#   te/raw over the first rounds and over all of them. A few rounds of a noisy machine put
#   cells on the wrong side of a target both ways; this spends the extra time where it decides.
#   --quick: 4K and 1M, working set 8M, threads 1 and 2, read and write, 1 s per run (about a
#   minute with --rounds 1). The default matrix (60 cells, 5 rounds of 5 s) takes hours: cut
#   it down with the flags above.
#   Env (old interface): BUILD, SIZES, THREADS, DURATION (space- or comma-separated);
#   BATCH is ignored (the batch follows from the working set). TE_PLUGIN_PATH is searched
#   after the tcp plugin's build directory. Exit 1 when a run failed.
set -euo pipefail

me=compare-tcp.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"

[ -x "$build/tools/te-bench" ] || die "$build/tools/te-bench is not built (run: ninja -C $build)"
tcp_so=$(find "$build/plugins" -name tcp.so -print -quit 2>/dev/null || true)
[ -n "$tcp_so" ] || die "the tcp plugin is not built (no tcp.so under $build/plugins); it is what this script measures"
[ -x "$build/bench/tcp-raw-loop" ] || die "$build/bench/tcp-raw-loop is not built (run: ninja -C $build)"
command -v python3 >/dev/null || die "python3 is needed to run the measurements and read their JSON"
[ -n "${BATCH:-}" ] && echo "compare-tcp.sh: BATCH is ignored: the batch follows from the working set" >&2
tcp_dir=$(dirname "$tcp_so")
export TE_PLUGIN_PATH="$tcp_dir${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"

prog=$(
	cat <<'PY'
import argparse, json, os, re, resource, socket, statistics, subprocess, sys, threading, time

build, top = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(top, "bench"))
from benchlib import (OtherLoad, children, congestion_name_ok, emit, host_cc, last_json,
                      loadavg, med, size_of, write_tcp_config)
TE = os.path.join(build, "tools", "te-bench")
RAW = os.path.join(build, "bench", "tcp-raw-loop")
IPERF3_MAX_LEN = 1 << 20
MAX_BATCH = 65536
CLK = os.sysconf("SC_CLK_TCK")


def size_str(v):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if v and v % (1 << shift) == 0:
            return f"{v >> shift}{unit}"
    return str(v)


def split(s):
    return [x for x in re.split(r"[,\s]+", s.strip()) if x]


def env_or(name, default):
    v = os.environ.get(name)
    return ",".join(split(v)) if v and v.strip() else default


ap = argparse.ArgumentParser(prog="compare-tcp.sh", add_help=False)
ap.add_argument("--sizes", default=None)
ap.add_argument("--working-sets", default=None)
ap.add_argument("--threads", default=None)
ap.add_argument("--ops", default=None)
ap.add_argument("--rounds", type=int, default=None)
ap.add_argument("--duration", type=float, default=None)
ap.add_argument("--quick", action="store_true")
ap.add_argument("--no-iperf3", action="store_true")
ap.add_argument("--no-latency", action="store_true")
ap.add_argument("--md", default=None)
ap.add_argument("--te-config", default=None)
ap.add_argument("--te-lanes", default=None)
ap.add_argument("--congestion", default=None)
ap.add_argument("--rerun-below", type=float, default=None)
ap.add_argument("--rerun-rounds", type=int, default=None)
try:
    a = ap.parse_args(sys.argv[3:])
except SystemExit:
    sys.exit(2)


def usage(msg):
    print(f"compare-tcp.sh: {msg} (try --help)", file=sys.stderr)
    sys.exit(2)


if a.quick:
    dflt = dict(sizes="4K,1M", ws="8M", threads="1,2", ops="read,write", duration=1.0)
else:
    dflt = dict(sizes=env_or("SIZES", "4K,64K,1M,8M,64M"), ws="8M,256M",
                threads=env_or("THREADS", "1,2,4"), ops="read,write",
                duration=float(os.environ.get("DURATION") or 5))
try:
    sizes = [size_of(x) for x in split(a.sizes or dflt["sizes"])]
    wss = [size_of(x) for x in split(a.working_sets or dflt["ws"])]
    threads = [int(x) for x in split(a.threads or dflt["threads"])]
except ValueError as e:
    usage(str(e))
ops = split(a.ops or dflt["ops"])
rounds = a.rounds if a.rounds is not None else 5
duration = a.duration if a.duration is not None else dflt["duration"]
if not sizes or any(s < 1 or s > (1 << 30) for s in sizes):
    usage("--sizes: 1 byte to 1G each")
if not wss or any(w < 1 or w > (64 << 30) for w in wss):
    usage("--working-sets: 1 byte to 64G each")
if not threads or any(t < 1 or t > 64 for t in threads):
    usage("--threads: 1 to 64 each")
if not ops or any(o not in ("read", "write") for o in ops):
    usage("--ops: read and/or write")
if not 1 <= rounds <= 100:
    usage("--rounds: 1 to 100")
if not 0.1 <= duration <= 3600:
    usage("--duration: 0.1 to 3600 seconds")
if a.rerun_below is not None and not 0 < a.rerun_below <= 100:
    usage("--rerun-below: a te/raw ratio above 0, at most 100")
if a.rerun_rounds is not None and a.rerun_below is None:
    usage("--rerun-rounds needs --rerun-below")
rerun_rounds = a.rerun_rounds if a.rerun_rounds is not None else 8
if not 1 <= rerun_rounds <= 100:
    usage("--rerun-rounds: 1 to 100")
if a.te_config and a.te_lanes:
    usage("--te-config and --te-lanes exclude each other")
if a.te_config and not os.path.isfile(a.te_config):
    usage(f"--te-config: no file '{a.te_config}'")
if a.te_lanes and a.te_lanes != "threads" and not (a.te_lanes.isdigit() and 1 <= int(a.te_lanes) <= 64):
    usage("--te-lanes: 1 to 64, or 'threads'")
if a.congestion is not None and not congestion_name_ok(a.congestion):
    usage(f"--congestion: '{a.congestion}' is not an algorithm name")
if a.congestion and a.te_config:
    usage("--congestion and --te-config exclude each other (put congestion: NAME in the "
          "file's tcp options)")
iperf3 = None if a.no_iperf3 else next(
    (os.path.join(d, "iperf3") for d in os.environ.get("PATH", "").split(":")
     if os.access(os.path.join(d, "iperf3"), os.X_OK)), None)
notes = []
if not a.no_iperf3 and not iperf3:
    notes.append("iperf3 is not installed: its column is empty (scripts/install-deps.sh bench installs it).")

# --- cells ---------------------------------------------------------------------------------
cells, seen = [], set()
for op in ops:
    for size in sizes:
        for ws in wss:
            for thr in threads:
                batch = max(1, min(MAX_BATCH, ws // (thr * size)))
                eff = batch * thr * size
                key = (op, size, eff, thr)
                if key in seen:
                    continue
                seen.add(key)
                cells.append(dict(op=op, size=size, ws=eff, ws_asked=ws, thr=thr, batch=batch,
                                  te=[], raw=[], ratio_raw=[], ratio_ip=[], cs_te=[], cs_raw=[], cpu_te=[],
                                  cpu_raw=[], steal=[], star_te=False, star_raw=False, fail=[],
                                  first=None))
ipkeys = sorted({(c["op"], c["size"], c["thr"]) for c in cells}, key=lambda k: (ops.index(k[0]), k[1], k[2]))
ipres = {k: [] for k in ipkeys}

# --- measuring -----------------------------------------------------------------------------
def proc_cpu(pid):
    """utime + stime of a whole process (all threads), seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK


def proc_switches(pid):
    """Context switches (voluntary and not) of each live thread of a process, as
    {(pid, tid): n}; None once the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out = {}
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                text = f.read()
        except OSError:
            continue  # exited meanwhile
        n = 0
        for line in text.splitlines():
            key, _, val = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                n += int(val)
        out[(pid, t)] = n
    return out


def switches_between(first, last):
    """Context switches between two samples of proc_switches (merged over processes):
    per thread, so a thread that exits in between cannot make the sum go down (its own
    switches after the first sample are lost); a thread started in between counts from 0."""
    return sum(n - first.get(k, 0) for k, n in last.items())


PROGRESS = re.compile(r"^(te-bench|tcp-raw-loop): .* GB/s\s*$")
failed_any = False


def cpu_stat():
    """(all, stolen) CPU time of the machine in clock ticks, from /proc/stat (None: unknown).
    For the whole run; each run's own share is in its JSON row (steal_pct)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[7]
    except (OSError, ValueError, IndexError):
        return None


def steal_pct(s0, s1):
    """Percent of the CPU time between two cpu_stat() samples that the hypervisor took."""
    if not s0 or not s1 or s1[0] <= s0[0]:
        return None
    return 100.0 * (s1[1] - s0[1]) / (s1[0] - s0[0])



def run_json(cmd, what):
    """Run an initiator that forks its target; its JSON row plus CPU-s/GB of both."""
    global failed_any
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    samples, other, kids = [], [], []

    def reader():
        for line in p.stderr:
            if PROGRESS.match(line):
                if not kids:
                    kids.extend(children(p.pid))
                t = time.monotonic()
                cpu = [proc_cpu(p.pid)] + [proc_cpu(k) for k in kids]
                cs = [proc_switches(p.pid)] + [proc_switches(k) for k in kids]
                # Both processes in every sample, or the differences mean nothing.
                if kids and None not in cpu and None not in cs:
                    samples.append((t, sum(cpu), {k: n for d in cs for k, n in d.items()}))
            else:
                other.append(line.rstrip("\n"))

    outs = []
    # Not communicate(): it would read stderr too, taking progress lines from reader().
    th = threading.Thread(target=reader, daemon=True)
    tho = threading.Thread(target=lambda: outs.append(p.stdout.read()), daemon=True)
    th.start()
    tho.start()
    try:
        p.wait(timeout=duration * 4 + 600)
    except subprocess.TimeoutExpired:
        # Only what this script started: the initiator and the target it forked, by PID.
        for k in children(p.pid):
            try:
                os.kill(k, 9)
            except OSError:
                pass
        p.kill()
        p.wait()
    th.join(5)
    tho.join(5)
    out = "".join(outs)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = last_json(out)
    if p.returncode != 0 or not row or row.get("failed") or not row.get("gbps"):
        failed_any = True
        msg = "; ".join(other[-4:])
        print(f"  {what} failed (rc {p.returncode}): {msg}", file=sys.stderr)
        return None, None, False, None
    if len(samples) >= 2 and samples[-1][0] > samples[0][0] and row.get("ops_per_s"):
        dt = samples[-1][0] - samples[0][0]
        cpu = samples[-1][1] - samples[0][1]
        cs = switches_between(samples[0][2], samples[-1][2])
        return row, cpu / (row["gbps"] * dt), False, cs / (row["ops_per_s"] * dt)
    # Short run: the whole processes (the initiator reaps its target), setup included.
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    cs = (ru1.ru_nvcsw - ru0.ru_nvcsw) + (ru1.ru_nivcsw - ru0.ru_nivcsw)
    gb = row["bytes"] / 1e9
    reqs = row.get("requests") or 0
    return row, (cpu / gb if gb > 0 else None), True, (cs / reqs if reqs > 0 else None)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def listening(port):
    want = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            return any(l.split()[1] == want and l.split()[3] == "0A" for l in f.readlines()[1:])
    except OSError:
        return False


def run_iperf3(op, size, thr):
    global failed_any
    port = free_port()
    srv = subprocess.Popen([iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", str(port)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            if listening(port) or srv.poll() is not None:
                break
            time.sleep(0.025)
        cmd = [iperf3, "-c", "127.0.0.1", "-p", str(port), "-t", str(max(1, round(duration))),
               "-l", str(min(size, IPERF3_MAX_LEN)), "-P", str(thr), "-J"] + (
                   ["-C", a.congestion] if a.congestion else [])
        if op == "read":
            cmd.append("-R")
        c = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=duration * 4 + 120)
        d = json.loads(c.stdout) if c.stdout.strip() else {}
        if c.returncode != 0 or "error" in d:
            raise RuntimeError(d.get("error") or c.stderr.strip()[-200:])
        return d["end"]["sum_received"]["bits_per_second"] / 8 / 1e9
    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        failed_any = True
        print(f"  iperf3 {op} {size_str(size)} -P {thr} failed: {e}", file=sys.stderr)
        return None
    finally:
        # The one-off server exits after its test; stop it by PID if it did not.
        try:
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.terminate()
            try:
                srv.wait(timeout=5)
            except subprocess.TimeoutExpired:
                srv.kill()
                srv.wait()


def common(c):
    # Both halves of the target hold every thread's share of the working set.
    buf = 2 * c["ws"] + (2 << 20)
    # te-bench's warm-up (8 batches), at most 256M of it: the 256M working sets warm up once.
    warm = max(1, min(8, (256 << 20) // c["ws"]))
    return ["--op", c["op"], "--block-size", str(c["size"]), "--batch", str(c["batch"]),
            "--warmup", str(warm),
            "--duration", f"{duration:g}", "--buffer-size", str(buf), "--json"]


tmpdir = None


def te_config(thr):
    """The --config te-bench gets for @thr threads, or None for its default."""
    global tmpdir
    if a.te_config:
        return os.path.abspath(a.te_config)
    if not a.te_lanes and not a.congestion:
        return None
    opts = []
    if a.te_lanes:
        opts.append(f"lanes: {thr if a.te_lanes == 'threads' else int(a.te_lanes)}")
    if a.congestion:
        opts.append(f"congestion: {a.congestion}")
    if tmpdir is None:
        import tempfile
        tmpdir = tempfile.TemporaryDirectory(prefix="te-compare-tcp.")
    path = os.path.join(tmpdir.name, re.sub(r"[^a-z0-9]+", "-", "-".join(opts)) + ".yaml")
    if not os.path.exists(path):
        write_tcp_config(path, opts)
    return path


CC_RAW = ["--congestion", a.congestion] if a.congestion else []


def te_cmd(c):
    cfg = te_config(c["thr"])
    return [TE, "--loopback", "--threads", str(c["thr"])] + (["--config", cfg] if cfg else []) + common(c)


def raw_cmd(c):
    return [RAW, "--loopback", "--connections", str(c["thr"])] + CC_RAW + common(c)


lat = dict(te=[], raw=[])
load0 = loadavg()
other = OtherLoad()
stat0 = cpu_stat()
t_begin = time.time()
print(f"compare-tcp: {len(cells)} cells, {rounds} round(s), {duration:g} s per run; "
      f"load average {load0}", file=sys.stderr)


def run_cell(c, tools, ip_round, label):
    """One round of cell @c: each of @tools in that order; iperf3 once per op, block and
    threads in @ip_round (a round's measurements, shared by the cells)."""
    name = f"{c['op']} {size_str(c['size'])} ws {size_str(c['ws'])} thr {c['thr']}"
    got, steals = {}, []
    for tool in tools:
        if tool in ("te", "raw"):
            cmd = te_cmd(c) if tool == "te" else raw_cmd(c)
            row, cpu, star, cs = run_json(cmd, f"{'te-bench' if tool == 'te' else 'tcp-raw-loop'} {name}")
            got[tool] = row["gbps"] if row else None
            steals.append(row.get("steal_pct") if row else None)
            if row:
                c[tool].append(row["gbps"])
                if cpu is not None:
                    c["cpu_" + tool].append(cpu)
                if cs is not None:
                    c["cs_" + tool].append(cs)
                c["star_" + tool] |= star
            else:
                c["fail"].append(tool)
        elif iperf3:
            k = (c["op"], c["size"], c["thr"])
            if k not in ip_round:
                ip_round[k] = run_iperf3(*k)
                if ip_round[k]:
                    ipres[k].append(ip_round[k])
            got["iperf3"] = ip_round[k]
    if got.get("te") and got.get("raw"):
        c["ratio_raw"].append(got["te"] / got["raw"])
    if got.get("te") and got.get("iperf3"):
        c["ratio_ip"].append(got["te"] / got["iperf3"])
    fmt = lambda v: f"{v:.3f}" if v else "-"
    # Each run's steal, from its own row (te-bench and tcp-raw-loop report it alike).
    stolen = [x for x in steals if x is not None]
    c["steal"].extend(stolen)
    print(f"{label} {name} batch {c['batch']}: "
          f"te {fmt(got.get('te'))} raw {fmt(got.get('raw'))} iperf3 "
          f"{fmt(got.get('iperf3'))} GB/s; steal "
          f"{'/'.join(f'{x:.0f}' for x in stolen) or '?'} %", file=sys.stderr)


for r in range(rounds):
    ip_round = {}
    tools = ["te", "raw", "iperf3"]
    tools = tools[r % 3:] + tools[:r % 3]
    for i, c in enumerate(cells):
        run_cell(c, tools, ip_round, f"round {r + 1}/{rounds} cell {i + 1}/{len(cells)}")
    if not a.no_latency:
        for tool in tools:
            if tool == "te":
                cfg = te_config(1)
                row, _, _, _ = run_json([TE, "--loopback"] + (["--config", cfg] if cfg else []) +
                                     ["--op", "read", "--block-size", "4K",
                                      "--batch", "1", "--depth", "1", "--threads", "1",
                                      "--duration", f"{duration:g}", "--json"], "te-bench latency")
            elif tool == "raw":
                row, _, _, _ = run_json([RAW, "--loopback", "--pingpong"] + CC_RAW + ["--duration",
                                      f"{duration:g}", "--json"], "tcp-raw-loop --pingpong")
            else:
                continue
            if row:
                lat[tool].append((row["lat_us_p50"], row["lat_us_p99"], row["lat_us_p999"]))
        print(f"round {r + 1}/{rounds}: latency done", file=sys.stderr)
# Cells under --rerun-below: more rounds of te and the raw loop, interleaved among them.
rerun = []
if a.rerun_below is not None:
    for c in cells:
        if c["ratio_raw"] and statistics.median(c["ratio_raw"]) < a.rerun_below:
            c["first"] = list(c["ratio_raw"])
            rerun.append(c)
    if rerun:
        print(f"compare-tcp: {len(rerun)} cell(s) under te/raw {a.rerun_below:g}: "
              f"{rerun_rounds} more round(s) of te and the raw loop", file=sys.stderr)
    for r in range(rerun_rounds):
        tools = ["te", "raw"] if r % 2 == 0 else ["raw", "te"]
        for i, c in enumerate(rerun):
            run_cell(c, tools, {}, f"rerun {r + 1}/{rerun_rounds} cell {i + 1}/{len(rerun)}")
load1 = loadavg()
other_cpus = other.figure()
steal_all = steal_pct(stat0, cpu_stat())

# --- table ---------------------------------------------------------------------------------
def rev():
    try:
        return subprocess.run(["git", "-C", top, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


lines = []
lines.append(f"te-bench --loopback (tcp) vs tcp-raw-loop --loopback vs iperf3 on 127.0.0.1; "
             f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs, "
             f"{os.uname().release}, te {rev()} "
             f"({'config ' + a.te_config if a.te_config else 'tcp lanes: ' + a.te_lanes if a.te_lanes else 'default config: 4 tcp lanes'}); "
             f"TCP congestion control {a.congestion + ' (--congestion; the host default is ' + host_cc() + ')' if a.congestion else host_cc() + ' (the host default)'}; "
             f"{rounds} round(s) of {duration:g} s per run"
             f"{f', {len(rerun)} cell(s) {rerun_rounds} more (--rerun-below {a.rerun_below:g})' if rerun else ''}; "
             f"load average {load0} before, {load1} after "
             f"({(time.time() - t_begin) / 60:.1f} min); other work on the machine meanwhile: "
             f"{other_cpus} CPUs (busy CPU time outside the runs, per second); CPU time taken "
             f"by the hypervisor "
             f"(steal): {'?' if steal_all is None else f'{steal_all:.1f} %'} of the run.")
lines.append("")
lines.append("GB/s = 10^9 bytes/s, median (min-max) over rounds; ratios: median (min-max) of "
             "the per-round ratios; CPU-s/GB: initiator + target; cs/req: context switches "
             "per request, initiator + target (all threads); steal %: CPU time the hypervisor took "
             "from this machine during the cell's te and raw runs (their steal_pct), median "
             "(min-max): where it is high, the rounds say little.")
lines.append("")
rr = a.rerun_below is not None
lines.append("| op | block | ws | thr | batch | te GB/s | raw GB/s | iperf3 GB/s | te/raw | "
             + ("rounds | " if rr else "") +
             "te/iperf3 | te CPU-s/GB | raw CPU-s/GB | te cs/req | raw cs/req | steal % |")
lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if rr else "") +
             "---:|---:|---:|---:|---:|---:|")
ip_capped = False
for c in cells:
    ip = ipres.get((c["op"], c["size"], c["thr"]), [])
    ipcell = med(ip) if iperf3 else "-"
    if iperf3 and c["size"] > IPERF3_MAX_LEN:
        ipcell += " ¹"
        ip_capped = True
    fail = f" (failed: {', '.join(sorted(set(c['fail'])))})" if c["fail"] else ""
    lines.append(f"| {c['op']} | {size_str(c['size'])} | {size_str(c['ws'])} | {c['thr']} | "
                 f"{c['batch']} | {med(c['te'])}{fail} | {med(c['raw'])} | {ipcell} | "
                 f"{med(c['ratio_raw'], 2)}{' ²' if c['first'] else ''} | "
                 + (f"{len(c['ratio_raw'])} | " if rr else "") +
                 f"{med(c['ratio_ip'], 2)} | "
                 f"{med(c['cpu_te'], 2)}{'*' if c['star_te'] else ''} | "
                 f"{med(c['cpu_raw'], 2)}{'*' if c['star_raw'] else ''} | "
                 f"{med(c['cs_te'], 2)}{'*' if c['star_te'] else ''} | "
                 f"{med(c['cs_raw'], 2)}{'*' if c['star_raw'] else ''} | "
                 f"{med(c['steal'], 0)} |")
lines.append("")
if not a.no_latency:
    lines.append("One 4K READ at a time (te-bench --batch 1 --depth 1; tcp-raw-loop --pingpong), "
                 "us, median (min-max) over rounds:")
    lines.append("")
    lines.append("| | p50 | p99 | p99.9 |")
    lines.append("|---|---:|---:|---:|")
    for tool, label in (("te", "te"), ("raw", "raw")):
        v = lat[tool]
        lines.append(f"| {label} | {med([x[0] for x in v], 1)} | {med([x[1] for x in v], 1)} | "
                     f"{med([x[2] for x in v], 1)} |")
    if lat["te"] and lat["raw"]:
        r50 = statistics.median([x[0] for x in lat["te"]]) / statistics.median([x[0] for x in lat["raw"]])
        lines.append(f"| te/raw | {r50:.2f} | | |")
    lines.append("")
if rr:
    if rerun:
        lines.append(f"² te/raw under {a.rerun_below:g} (--rerun-below) over the first {rounds} "
                     f"round(s): {rerun_rounds} more of te and the raw loop (not iperf3), "
                     f"interleaved among these cells; every column pools all rounds. te/raw "
                     f"over the first rounds -> over all:")
        for c in rerun:
            lines.append(f"- {c['op']} {size_str(c['size'])} ws {size_str(c['ws'])} thr "
                         f"{c['thr']}: {med(c['first'], 3)} -> {med(c['ratio_raw'], 3)}")
    else:
        lines.append(f"No cell under te/raw {a.rerun_below:g} (--rerun-below): none rerun.")
if ip_capped:
    lines.append("¹ iperf3 takes at most 1M per write (-l): blocks above that run with -l 1M.")
if any(c["star_te"] or c["star_raw"] for c in cells):
    lines.append("\\* in at least one round, fewer than two progress lines (runs shorter than 4 s): "
                 "CPU and context switches of the whole processes, setup included.")
if any(c["ws"] != c["ws_asked"] for c in cells):
    lines.append("ws: the working set used; a block larger than its share of the asked working "
                 "set makes it bigger.")
for n in notes:
    lines.append(n)
emit(lines, a.md)
sys.exit(1 if failed_any else 0)
PY
)
exec python3 -c "$prog" "$build" "$top" ${args[@]+"${args[@]}"}
