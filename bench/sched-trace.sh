#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# sched-trace.sh: who wakes and who preempts whom, thread by thread, in te and in the raw loop, one cell.
#
# Usage: bench/sched-trace.sh [-C BUILD] [--seconds 2] [--settle 2] [--config FILE |
#            --congestion NAME] [--no-raw] [--md FILE] [-- TE-BENCH-ARGS...]
#   One te-bench cell (TE-BENCH-ARGS: --op, --block-size, --batch, --threads, --depth,
#   --buffer-size; default te-bench's, READ 64K x128), then tcp-raw-loop on the same cell
#   (BUILD's; same op, block, batch, depth, buffer size, --connections = threads). Each runs
#   --settle seconds of its timed loop untraced (counted from its first progress line, one
#   second in, so setup and warm-up are never traced), then the kernel's sched_switch and
#   sched_waking events are
#   recorded for --seconds in a tracing instance of this script's own
#   (/sys/kernel/tracing/instances/te-sched-PID, removed after; the global trace is left
#   alone), and the run goes on to its end.
#   Threads are grouped by process (initiator; target: te-bench --loopback's child,
#   tcp-raw-loop's forked server) and name, a number at the end of the name folded
#   (bench-0 .. bench-3 -> bench-*). Per request (the run's mean rate times the traced time):
#   - per group: threads, CPU microseconds (utime + stime from /proc over the traced time),
#     switches out per 1000 requests: voluntary (the thread slept), yielded (still runnable,
#     in sched_yield: traced where the kernel has the syscalls:sys_enter_sched_yield event,
#     else counted as preempted) and preempted (still runnable, not yielding); threads that
#     neither ran nor switched are left out (their count is said);
#   - wake-ups per 1000 requests, waker -> woken (the waker is the thread on the CPU when the
#     wake-up was issued: an interrupt's wake-up counts for the thread it interrupted; none
#     running: "idle");
#   - preemptions per 1000 requests: the group switched out <- the group that got the CPU
#     (and the group whose wake-up made that one runnable last).
#   Other processes' threads are "other". Events the tracing buffer dropped are counted (a
#   nonzero count is said under the table: give fewer --seconds).
#   --config FILE: te-bench's configuration; --congestion NAME: both te (the default
#   configuration with the tcp option congestion: NAME) and the raw loop use NAME.
#   Needs root (or a writable tracefs) with the sched events; exit 1 when a run fails or
#   tracing cannot be set up (saying why), 2 on a usage error. Not a benchmark: the tracing
#   costs each switch a little, so rates here run lower than untraced.
set -euo pipefail

me=sched-trace.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"

command -v python3 >/dev/null || die "python3 is needed to run the measurements and read the trace"

prog=$(
	cat <<'PY'
import argparse, os, re, signal, subprocess, sys, tempfile, threading, time
from collections import Counter

build, top = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(top, "bench"))
from benchlib import (children, congestion_name_ok, emit, host_cc, last_json, loadavg,
                      raw_loop_args, write_tcp_config)
argv = sys.argv[3:]
bench_args = []
if "--" in argv:
    k = argv.index("--")
    argv, bench_args = argv[:k], argv[k + 1:]


def usage(msg):
    print(f"sched-trace.sh: {msg} (try --help)", file=sys.stderr)
    sys.exit(2)


def die(msg):
    print(f"sched-trace.sh: {msg}", file=sys.stderr)
    sys.exit(1)


ap = argparse.ArgumentParser(prog="sched-trace.sh", add_help=False)
ap.add_argument("--seconds", type=float, default=2.0)
ap.add_argument("--settle", type=float, default=2.0)
ap.add_argument("--config", default=None)
ap.add_argument("--congestion", default=None)
ap.add_argument("--no-raw", action="store_true")
ap.add_argument("--md", default=None)
try:
    a, extra = ap.parse_known_args(argv)
except SystemExit:
    sys.exit(2)
if extra:
    usage(f"unknown argument '{extra[0]}' (te-bench's options go after --)")
if not 0.1 <= a.seconds <= 60:
    usage("--seconds: 0.1 to 60")
if not 1 <= a.settle <= 600:
    usage("--settle: 1 to 600")
if a.config and a.congestion:
    usage("--config and --congestion exclude each other (put congestion: NAME in the file's "
          "tcp options)")
if a.config and not os.path.isfile(a.config):
    usage(f"--config: no file '{a.config}'")
if a.congestion is not None and not congestion_name_ok(a.congestion):
    usage(f"--congestion: '{a.congestion}' is not an algorithm name")
given = {x.split("=", 1)[0] for x in bench_args}
for names in (["-d", "--duration"], ["-n", "--iterations"], ["--json"], ["-q", "--quiet"],
              ["--config"], ["--loopback"], ["--initiator"], ["--target"]):
    if given.intersection(names):
        usage(f"{names[-1]} is set by this script (TE-BENCH-ARGS describe the cell)")

TE = os.path.join(build, "tools", "te-bench")
RAW = os.path.join(build, "bench", "tcp-raw-loop")
if not os.access(TE, os.X_OK):
    usage(f"{TE} is not built (run: ninja -C {build})")
raw = not a.no_raw
raw_args = []
if raw:
    if not os.access(RAW, os.X_OK):
        usage(f"{RAW} is not built (or give --no-raw)")
    try:
        raw_args = raw_loop_args(bench_args, ((["--buffer-size"], "--buffer-size", None),))
    except ValueError as e:
        usage(str(e))
    if a.congestion:
        raw_args += ["--congestion", a.congestion]

TRACEFS = next((d for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
                if os.path.isdir(os.path.join(d, "instances"))), None)
if not TRACEFS:
    die("no tracefs with instances (/sys/kernel/tracing): mount it (mount -t tracefs nodev "
        "/sys/kernel/tracing) or run where the kernel has one")
EVENTS = ["sched/sched_switch", "sched/sched_waking"]
for ev in EVENTS:
    if not os.path.isdir(os.path.join(TRACEFS, "events", ev)):
        die(f"the kernel has no {ev.replace('/', ':')} event ({TRACEFS}/events/{ev})")
YIELDS = all(os.path.isdir(os.path.join(TRACEFS, "events", "syscalls", f"sys_{x}_sched_yield"))
             for x in ("enter", "exit"))
if YIELDS:
    EVENTS += ["syscalls/sys_enter_sched_yield", "syscalls/sys_exit_sched_yield"]
tmpdir = tempfile.TemporaryDirectory(prefix="te-sched-trace.")
cfg = a.config and os.path.abspath(a.config)
if a.congestion:
    cfg = write_tcp_config(os.path.join(tmpdir.name, "congestion.yaml"),
                           [f"congestion: {a.congestion}"])
run_s = a.settle + a.seconds + 1.5  # the timed loop: settle, trace, then a margin
env = dict(os.environ)
plug = os.path.join(build, "plugins", "tcp")
env["TE_PLUGIN_PATH"] = plug + (":" + env["TE_PLUGIN_PATH"] if env.get("TE_PLUGIN_PATH") else "")


class Instance:
    """A tracing instance of this script's own, recording sched_switch and sched_waking."""

    def __init__(self):
        self.dir = os.path.join(TRACEFS, "instances", f"te-sched-{os.getpid()}")
        try:
            os.mkdir(self.dir)
        except OSError as e:
            die(f"cannot create the tracing instance {self.dir}: {e.strerror} (needs root)")
        try:
            self.put("tracing_on", "0")
            self.put("buffer_size_kb", "32768")
            for ev in EVENTS:
                self.put(f"events/{ev}/enable", "1")
        except OSError as e:
            self.close()
            die(f"cannot set up {self.dir}: {e.strerror}")

    def put(self, name, value):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(value)

    def lost(self):
        n = 0
        for cpu in os.listdir(os.path.join(self.dir, "per_cpu")):
            with open(os.path.join(self.dir, "per_cpu", cpu, "stats")) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k.strip() in ("overrun", "dropped events"):
                        n += int(v.split()[0])
        return n

    def clear(self):
        """Empties the buffer (slow: up to a second and more with a hypervisor)."""
        self.put("trace", "")
        self.lost0 = self.lost()

    def start(self):
        self.put("tracing_on", "1")
        self.t0 = time.monotonic()

    def stop(self):
        self.put("tracing_on", "0")
        return time.monotonic() - self.t0

    def read(self):
        with open(os.path.join(self.dir, "trace")) as f:
            return f.read(), self.lost() - self.lost0

    def close(self):
        try:
            self.put("tracing_on", "0")
            for ev in EVENTS:
                self.put(f"events/{ev}/enable", "0")
        except OSError:
            pass
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)
        print(f"sched-trace.sh: could not remove {self.dir}", file=sys.stderr)


def threads(pid, side, into):
    """@into[tid] = (side, name) for each thread of @pid; returns {tid: cpu ticks}."""
    cpu = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return cpu
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                rest = f.read()
            rest = rest[rest.rindex(")") + 2:].split()
        except (OSError, ValueError):
            continue
        into[t] = (side, re.sub(r"-\d+$", "-*", name))
        cpu[t] = int(rest[11]) + int(rest[12])
    return cpu


LINE = re.compile(r"^\s*(.+?)-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?[\d.]+:\s+"
                  r"(sched_switch|sched_waking|sys_sched_yield|sys_sched_yield -> \S+|"
                  r"sys_enter_sched_yield|sys_exit_sched_yield)(?::\s+(.*)|\(\).*)?$")
SWITCH = re.compile(r"prev_pid=(\d+) prev_prio=\S+ prev_state=(\S+) ==> next_comm=.* next_pid=(\d+)")
WAKING = re.compile(r"\spid=(\d+) prio=")
PROGRESS = re.compile(r"^(te-bench|tcp-raw-loop): .* GB/s\s*$")


def run(inst, tool, cmd, cwd_env):
    """Run one tool, trace it; its row, the traced events by group, the groups' CPU."""
    inst.clear()  # while nothing runs: it takes a while
    p = subprocess.Popen(cmd, env=cwd_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    roles, errs, outs, timed = {}, [], [], threading.Event()

    def reader():
        for line in p.stderr:
            if PROGRESS.match(line):
                timed.set()
            else:
                errs.append(line.rstrip("\n"))

    # Not communicate(): it would read stderr too, taking the progress lines from reader().
    ths = [threading.Thread(target=reader, daemon=True),
           threading.Thread(target=lambda: outs.append(p.stdout.read()), daemon=True)]
    for th in ths:
        th.start()
    try:
        # The first progress line comes one second into the timed loop.
        deadline = time.monotonic() + 300
        while not timed.wait(0.05) and p.poll() is None and time.monotonic() < deadline:
            pass
        if timed.is_set():
            time.sleep(a.settle - 1)
        kids = children(p.pid)
        if p.poll() is not None or not kids or not timed.is_set():
            if p.poll() is None:
                raise RuntimeError("no progress")
            for th in ths:
                th.join(5)
            why = "no target process" if not kids else "it ended before its timed loop"
            die(f"{tool} did not run ({why}; exit {p.returncode}): {'; '.join(errs[-4:])}")
        c0 = threads(p.pid, "initiator", roles)
        for k in kids:
            c0.update(threads(k, "target", roles))
        inst.start()
        time.sleep(a.seconds)
        dt = inst.stop()
        c1 = threads(p.pid, "initiator", roles)
        for k in kids:
            c1.update(threads(k, "target", roles))
        text, lost = inst.read()
        p.wait(timeout=run_s * 4 + 120)
        for th in ths:
            th.join(5)
        out, err = "".join(outs), "\n".join(errs)
    except BaseException as e:
        # Only what this script started: the initiator and the target it forked, by PID.
        if p.poll() is None:
            for k in children(p.pid):
                try:
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
            p.kill()
            p.wait()
        if isinstance(e, (RuntimeError, subprocess.TimeoutExpired)):
            die(f"{tool} hung (no timed loop within 300 s, or no end): {'; '.join(errs[-4:])}")
        raise
    row = last_json(out)
    if p.returncode != 0 or not row or row.get("failed") or not row.get("ops_per_s"):
        die(f"{tool} failed (exit {p.returncode}): {err.strip()[-400:]}")
    req = row["ops_per_s"] * dt
    k = 1000.0 / req

    def group(tid):
        if tid == "0":
            return "idle"
        r = roles.get(tid)
        return f"{r[0]} {r[1]}" if r else "other"

    members = Counter(group(t) for t in roles)
    cpu = Counter()
    tick = os.sysconf("SC_CLK_TCK")
    for t, v in c1.items():
        cpu[group(t)] += (v - c0.get(t, v)) / tick
    vol, inv, yld, wake, pre = Counter(), Counter(), Counter(), Counter(), Counter()
    last_waker, in_yield = {}, set()
    n_ev = 0
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        n_ev += 1
        cur, ev, rest = m.group(2), m.group(3), m.group(4) or ""
        if "yield" in ev:
            # sys_enter: "sys_sched_yield()", sys_exit: "sys_sched_yield -> 0x0".
            if "->" in ev or "exit" in ev:
                in_yield.discard(cur)
            else:
                in_yield.add(cur)
            continue
        if ev == "sched_waking":
            w = WAKING.search(rest)
            if w:
                wake[(group(cur), group(w.group(1)))] += 1
                last_waker[w.group(1)] = group(cur)
            continue
        s = SWITCH.search(rest)
        if not s:
            continue
        prev, state, nxt = s.groups()
        if prev == "0":
            continue
        if state.startswith("R") and prev in in_yield:
            yld[group(prev)] += 1
        elif state.startswith("R"):
            inv[group(prev)] += 1
            pre[(group(prev), group(nxt), last_waker.get(nxt, "-"))] += 1
        else:
            vol[group(prev)] += 1
    if n_ev == 0:
        die(f"{tool}: the trace holds no sched events ({TRACEFS})")
    return dict(tool=tool, row=row, dt=dt, req=req, k=k, lost=lost, members=members, cpu=cpu,
                vol=vol, inv=inv, yld=yld, wake=wake, pre=pre)


te_cmd = [TE, "--loopback", "--json", "--duration", f"{run_s:g}"] + \
    (["--config", cfg] if cfg else []) + bench_args
# The tracing instance goes away however this ends.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
# Set up once, before the runs: allocating the buffers takes a while (a second and more with
# a hypervisor), which would otherwise push the traced window past a run's end.
inst = Instance()
try:
    runs = [run(inst, "te-bench", te_cmd, env)]
    if raw:
        runs.append(run(inst, "tcp-raw-loop", [RAW, "--loopback", "--json", "--duration",
                                              f"{run_s:g}"] + raw_args, env))
finally:
    inst.close()

def top(lines, title, counts, k, label):
    """A table of the 12 largest of @counts (per 1000 requests: times @k), at least 0.5 each."""
    lines.append(f"| {title} | /1000 req |")
    lines.append("|---|---:|")
    shown = 0
    for key, n in counts.most_common(12):
        if n * k < 0.5:
            break
        lines.append(f"| {label(*key)} | {n * k:.1f} |")
        shown += 1
    if not shown:
        lines.append("| (none above 0.5) | |")
    lines.append("")


lines = [f"Scheduler events (sched_switch, sched_waking), {a.seconds:g} s per run after "
         f"{a.settle:g} s untraced; {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs, "
         f"{os.uname().release}; TCP congestion control "
         f"{a.congestion if a.congestion else host_cc() + ' (the host default)'}; load "
         f"average {loadavg()} at the end.", ""]
for r in runs:
    row, k = r["row"], r["k"]
    cmd = " ".join(bench_args) if r["tool"] == "te-bench" else " ".join(raw_args)
    lines.append(f"**{r['tool']}** `{cmd or '(defaults)'}`: {row['ops_per_s']:.0f} requests/s, "
                 f"{row['gbps']:.3f} GB/s over the run; {r['req']:.0f} requests in the "
                 f"{r['dt']:.2f} s traced; all its threads: "
                 f"{sum(v for g, v in r['cpu'].items() if g[:1] in 'it') * 1e6 / r['req']:.2f} "
                 f"CPU us per request.")
    lines.append("")
    lines.append("| threads | n | CPU us/req | slept /1000 req | yielded /1000 req | "
                 "preempted /1000 req |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    groups = sorted(set(r["members"]) | set(r["vol"]) | set(r["inv"]) | set(r["yld"]),
                    key=lambda g: (g in ("other", "idle"), g))
    quiet = 0
    for g in groups:
        sw = (r["vol"][g] + r["inv"][g] + r["yld"][g]) * k
        if sw < 0.5 and r["cpu"][g] * 1e6 / r["req"] < 0.005:
            quiet += r["members"].get(g, 0)
            continue
        cpu = f"{r['cpu'][g] * 1e6 / r['req']:.2f}" if g in r["members"] else "-"
        lines.append(f"| {g} | {r['members'].get(g, '-')} | {cpu} | {r['vol'][g] * k:.1f} | "
                     f"{r['yld'][g] * k:.1f}{'' if YIELDS else ' ¹'} | {r['inv'][g] * k:.1f} |")
    lines.append("")
    if quiet:
        lines.append(f"{quiet} more thread(s) of its own neither ran nor switched while traced.")
        lines.append("")
    top(lines, "wake-ups: waker -> woken", r["wake"], k, lambda w, t: f"{w} -> {t}")
    top(lines, "preempted: switched out <- ran next (woken last by)", r["pre"], k,
        lambda g, nxt, w: f"{g} <- {nxt} ({w})")
    if r["lost"]:
        lines.append(f"The tracing buffer lost {r['lost']} events of this run: its counts are "
                     f"low (give fewer --seconds).")
        lines.append("")
if not YIELDS:
    lines.append("¹ the kernel has no syscalls:sys_enter_sched_yield event: yields are counted "
                 "as preemptions.")
emit(lines, a.md)
PY
)
exec python3 -c "$prog" "$build" "$top" ${args[@]+"${args[@]}"}
