# SPDX-License-Identifier: Apache-2.0
"""benchlib.py: what the bench scripts' Python parts share (compare-tcp.sh, compare-builds.sh,
insn-tcp.sh, sched-trace.sh): a run's JSON row, sizes as te-bench writes them, te-bench's
options mapped onto tcp-raw-loop's, the load average and the CPU time others took meanwhile,
a process's children, a median (min-max) cell, and writing a table to stdout and --md FILE."""
import json
import os
import re
import resource
import statistics
import sys
import time


def last_json(text):
    """The last line of @text that is a JSON value (a te-bench or tcp-raw-loop row), or None."""
    for line in text.splitlines()[::-1]:
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def size_of(s):
    """A size as te-bench takes it (4096, 4K, 1M, 2GiB: powers of 2) in bytes; ValueError if
    it is not one."""
    m = re.fullmatch(r"(\d+)([KMG]?)(?:i?B)?", s.strip(), re.I)
    if not m:
        raise ValueError(f"not a size: '{s.strip()}' (e.g. 4K, 1M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def te_bench_opt(bench_args, names, default):
    """The value of a te-bench option (any of @names) in @bench_args, as given (last one
    wins), or @default."""
    v = default
    for i, x in enumerate(bench_args):
        for n in names:
            if x == n and i + 1 < len(bench_args):
                v = bench_args[i + 1]
            elif n.startswith("--") and x.startswith(n + "="):
                v = x[len(n) + 1:]
    return v


# te-bench's options of a cell, the tcp-raw-loop flag each maps onto, and the default.
RAW_CELL = ((["-o", "--op"], "--op", "read"),
            (["-b", "--block-size"], "--block-size", "64K"),
            (["-B", "--batch"], "--batch", "128"),
            (["-D", "--depth"], "--depth", "1"),
            (["-t", "--threads"], "--connections", "1"))


def raw_loop_args(bench_args, extra=()):
    """tcp-raw-loop's arguments for the cell that te-bench's @bench_args describe: op, block
    size, batch, depth and threads (one connection each), then @extra's ((te-bench names,
    raw flag, default or None: left out), ...). ValueError unless the op is read or write."""
    if te_bench_opt(bench_args, ["-o", "--op"], "read") not in ("read", "write"):
        raise ValueError("the raw loop runs --op read or write (or give --no-raw)")
    out = []
    for names, flag, default in RAW_CELL + tuple(extra):
        v = te_bench_opt(bench_args, names, default)
        if v is not None:
            out += [flag, v]
    return out


def task_files(pid, name):
    """/proc/<pid>/task/*/<name> of every thread (those that exit meanwhile left out);
    None once the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out = []
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/{name}") as f:
                out.append(f.read())
        except OSError:
            pass
    return out


def children(pid):
    """The PIDs of @pid's child processes (te-bench --loopback's target, tcp-raw-loop's
    server); [] once it is gone."""
    return [int(x) for text in task_files(pid, "children") or [] for x in text.split()]


def loadavg():
    """The 1, 5 and 15 minute load averages as one string ('?' when unknown)."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


class OtherLoad:
    """The machine's load that is not this script's: CPU time the machine was busy (user,
    nice, system, irq, softirq in /proc/stat; not idle, iowait or steal) minus the CPU time of
    this process and the children it waited for (the runs, with the targets they reaped), per
    second of wall time between start and figure(). Unlike the load average it counts nothing
    from before the start, and none of the runs' own threads."""

    def __init__(self):
        self.t0, self.busy0, self.own0 = time.monotonic(), self._busy(), self._own()

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:8]]
            return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _own():
        return sum(r.ru_utime + r.ru_stime
                   for r in (resource.getrusage(resource.RUSAGE_SELF),
                             resource.getrusage(resource.RUSAGE_CHILDREN)))

    def figure(self):
        """CPUs' worth of other work, as text ('?' when /proc/stat cannot be read)."""
        busy, wall = self._busy(), time.monotonic() - self.t0
        if busy is None or self.busy0 is None or wall <= 0:
            return "?"
        return f"{max(0.0, (busy - self.busy0) - (self._own() - self.own0)) / wall:.2f}"


def host_cc():
    """The host's default TCP congestion control (net.ipv4.tcp_congestion_control), or '?'."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def congestion_name_ok(name):
    """Whether @name can be a TCP congestion control algorithm's name (--congestion)."""
    return re.fullmatch(r"[a-z0-9_]{1,15}", name) is not None


def write_tcp_config(path, opts):
    """Write te's default configuration (p2p metadata, tcp on loopback) with the tcp options
    @opts (a list of 'key: value') to @path; returns @path."""
    with open(path, "w") as f:
        f.write('engine:\n  listen: "127.0.0.1:0"\nmetadata:\n  type: p2p\n'
                "transports:\n  - name: tcp\n    required: true\n"
                f"    options: {{{', '.join(opts)}}}\n")
    return path


def med(v, digits=3):
    """'median (min-max)' of @v with @digits decimals; the median alone for one value, '-' for
    none."""
    if not v:
        return "-"
    m = statistics.median(v)
    if len(v) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


def emit(lines, md=None):
    """The table: @lines joined, to stdout and, with @md, to that file (replaced)."""
    text = "\n".join(lines).rstrip() + "\n"
    sys.stdout.write(text)
    if md:
        with open(md, "w") as f:
            f.write(text)


if __name__ == "__main__" and sys.argv[1:2] == ["raw-loop-args"]:
    # For shell scripts: `python3 benchlib.py raw-loop-args TE-BENCH-ARGS...`, one per line.
    try:
        print("\n".join(raw_loop_args(sys.argv[2:])))
    except ValueError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
