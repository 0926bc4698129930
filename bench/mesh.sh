#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mesh.sh: N te engines on one host (one process each, p2p, tcp on loopback) all open each other and run a verified all-to-all load; te against the same streams as raw loops.
#
# Usage: bench/mesh.sh [-C BUILD] [--engines 32] [--duration 20] [--depth 4] [--sizes 4K,64K,1M]
#            [--rounds 1] [--raw | --no-raw] [--config FILE] [--json FILE] [--keep]
#   te round: N `te-mesh` processes (BUILD/bench/te-mesh, one engine each). Each prints its
#   segment name and fills its buffer; the script hands every member the list of all names,
#   each opens the N-1 others (te_segment_open by name: a descriptor fetch from the peer's
#   listener), then all start together: `--depth` slots per member, one thread and one batch
#   in flight each, a random peer per batch; even slots READ (every byte checked against the
#   owner's pattern), odd slots WRITE into the writer's own area of the peer and read it back
#   (checked). Slot k of member i moves blocks of sizes[(i x ceil(depth/2) + k/2) mod n],
#   min(128, 1M / block) of them per batch (4K x 128, 64K x 16, 1M x 1 by default). After
#   --duration seconds all close their segments, and descriptors are counted again once the
#   lanes are gone.
#   raw round (default; --no-raw skips it): the same streams without te: for every stream
#   class of the mesh (op, block, requests per batch) one `tcp-raw-loop --loopback --verify`
#   pair (a client and its forked server, bench/tcp_raw_loop.c) with one connection per te
#   slot of that class, depth 1, all classes at once for the same duration. The raw
#   aggregate is the sum of those connections' GB/s: what this host moves for the same
#   streams (same ops, sizes, requests per batch, requests in flight, byte checks) over
#   plain pipelined TCP. te pays for what the raw loop does not have: N-1 peers per member
#   (a random one per batch, 4 lanes each), an engine per process, N processes instead of
#   one client/server pair per class, and a larger memory footprint: a te stream's READs
#   range over the N-1 peers' read areas and its WRITEs over N-1 write areas, where a raw
#   connection with --verify reuses one batch area (a te-mesh member's buffer is 36 MiB at
#   32 engines).
#   --rounds R: R te rounds and R raw rounds, interleaved (te first in odd rounds, raw first
#   in even ones); GB/s and te/raw are the median over rounds (min-max when R > 1).
#   Table: startup (member: main() to engine up and buffer registered, plus opening all N-1
#   peers; wall: first spawn to the last 'opened'), descriptors, RSS and threads per engine
#   (after the load, segments still open) and per peer ((loaded - before opening) / (N-1)),
#   what stays after every member closed its segments (must be 0), CPU-seconds per GB (all
#   processes, timed window), aggregate GB/s, te/raw, errors (failed tasks by status and
#   verification failures: must be 0). Load average (uptime) before and after.
#   With N-1 peers x 4 lanes over the tcp plugin's max_conns_per_host (128: N > 33), or more
#   than control.max_connections_per_host (128) peers, the script writes a configuration
#   that raises those limits (loopback peers all share the address 127.0.0.1) and says so.
#   Below that the defaults hold, and each server admits extra lanes only up to 3/4 of the
#   limit (96: the rest is kept for first lanes), so from N = 26 some peers use fewer lanes;
#   --config FILE is passed to every member instead (the script does not check it).
#   --json FILE: every member's and raw pair's JSON line plus the summary. --keep keeps the
#   members' stderr logs (their folder is printed). Exit 1 on any error, verification
#   failure or process that failed; 2 for usage errors.
#   Needs python3; TE_PLUGIN_PATH is searched after BUILD's tcp plugin folder.
set -euo pipefail

me=mesh.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"

[ -x "$build/bench/te-mesh" ] || die "$build/bench/te-mesh is not built (run: ninja -C $build)"
tcp_so=$(find "$build/plugins" -name tcp.so -print -quit 2>/dev/null || true)
[ -n "$tcp_so" ] || die "the tcp plugin is not built (no tcp.so under $build/plugins): the mesh runs over it"
command -v python3 >/dev/null || die "python3 is needed to drive the members and read their JSON"
tcp_dir=$(dirname "$tcp_so")
export TE_PLUGIN_PATH="$tcp_dir${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"

prog=$(
	cat <<'PY'
import argparse, json, os, re, select, signal, statistics, subprocess, sys, tempfile, time

build = sys.argv[1]
MESH = os.path.join(build, "bench", "te-mesh")
RAW = os.path.join(build, "bench", "tcp-raw-loop")
CLK = os.sysconf("SC_CLK_TCK")
TCP_LANES = 4               # the tcp plugin's default lanes per peer
TCP_PER_HOST = 128          # its default max_conns_per_host
RPC_PER_HOST = 128          # control.max_connections_per_host's default
RAW_MAX_CONNS = 256         # tcp-raw-loop --connections at most
WARMUP = 4                  # untimed batches per slot (te) and per connection (raw)


def usage(msg):
    print(f"mesh.sh: {msg} (try --help)", file=sys.stderr)
    sys.exit(2)


def size_of(s):
    m = re.fullmatch(r"(\d+)([KMG]?)(?:i?B)?", s.strip(), re.I)
    if not m:
        usage(f"--sizes: '{s}' is not a size (e.g. 4K, 1M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def size_str(v):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if v and v % (1 << shift) == 0:
            return f"{v >> shift}{unit}"
    return str(v)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        usage(message)


ap = Parser(prog="mesh.sh", add_help=False)
ap.add_argument("--engines", type=int, default=32)
ap.add_argument("--duration", type=float, default=20.0)
ap.add_argument("--depth", type=int, default=4)
ap.add_argument("--sizes", default="4K,64K,1M")
ap.add_argument("--rounds", type=int, default=1)
ap.add_argument("--raw", dest="raw", action="store_true", default=True)
ap.add_argument("--no-raw", dest="raw", action="store_false")
ap.add_argument("--config", default=None)
ap.add_argument("--json", default=None)
ap.add_argument("--keep", action="store_true")
a = ap.parse_args(sys.argv[2:])
N, D = a.engines, a.depth
if not 2 <= N <= 512:
    usage("--engines: 2 to 512")
if not 2 <= D <= 16:
    usage("--depth: 2 to 16")
if not 0.5 <= a.duration <= 3600:
    usage("--duration: 0.5 to 3600 seconds")
if not 1 <= a.rounds <= 20:
    usage("--rounds: 1 to 20")
sizes = [size_of(x) for x in a.sizes.split(",") if x.strip()]
if not sizes or len(sizes) > 16 or any(s < 8 or s > (64 << 20) or s % 8 for s in sizes):
    usage("--sizes: 1 to 16 sizes, multiples of 8 from 8 bytes to 64M")
if a.config and not os.path.isfile(a.config):
    usage(f"--config: no file '{a.config}'")
if a.raw and not os.access(RAW, os.X_OK):
    print(f"mesh.sh: {RAW} is not built (run: ninja -C {build}; or --no-raw)", file=sys.stderr)
    sys.exit(1)

tmp = tempfile.mkdtemp(prefix="te-mesh.")
notes = []
config = a.config
if not config and ((N - 1) * TCP_LANES > TCP_PER_HOST or N - 1 > RPC_PER_HOST):
    # Every member connects from 127.0.0.1: the per-address limits count the whole mesh.
    tcp_lim = (N - 1) * TCP_LANES + 16
    rpc_lim = max(RPC_PER_HOST, N + 16)
    config = os.path.join(tmp, "mesh.yaml")
    with open(config, "w") as f:
        f.write(f"""# written by bench/mesh.sh for {N} engines on one host
engine:
  listen: "127.0.0.1:0"
metadata:
  type: p2p
control:
  max_connections_per_host: {rpc_lim}
transports:
  - name: tcp
    required: true
    options: {{max_conns_per_host: {tcp_lim}, max_conns: {max(1024, tcp_lim)}}}
""")
    notes.append(f"{N} engines: tcp max_conns_per_host raised to {tcp_lim} and "
                 f"control.max_connections_per_host to {rpc_lim} (config {config})")

# The streams: te-mesh's slot shapes (mesh_slot_shape in bench/te_mesh.c), checked against
# what the members report.
def batch_of(block):
    return max(1, min(128, (1 << 20) // block))


def streams_of(i):
    per = (D + 1) // 2
    out = []
    for k in range(D):
        block = sizes[(i * per + k // 2) % len(sizes)]
        out.append(("write" if k % 2 else "read", block, batch_of(block)))
    return out


classes = {}
for i in range(N):
    for s in streams_of(i):
        classes[s] = classes.get(s, 0) + 1

procs = []   # every process this script started and has not reaped: killed by PID at exit


def kill_all():
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except OSError:
                pass
    t = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, t - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    procs.clear()


def loadavg():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        with open("/proc/loadavg") as f:
            return "load average " + " ".join(f.read().split()[:3])


class Fail(Exception):
    pass


# --- te round ------------------------------------------------------------------------------
class Member:
    def __init__(self, i, rnd):
        self.i = i
        self.log = os.path.join(tmp, f"member-{rnd}-{i}.err")
        cmd = [MESH, "--id", str(i), "--engines", str(N), "--depth", str(D),
               "--sizes", ",".join(str(s) for s in sizes), "--duration", str(a.duration),
               "--warmup", str(WARMUP)]
        if config:
            cmd += ["--config", config]
        self.t_spawn = time.monotonic()
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(self.log, "w"), bufsize=0)
        procs.append(self.p)
        self.buf = b""
        self.lines = []
        self.at = {}
        self.name = None
        self.result = None

    def send(self, text):
        try:
            self.p.stdin.write(text.encode())
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            raise Fail(f"member {self.i} is gone ({self.tail()})")

    def tail(self):
        try:
            with open(self.log) as f:
                lines = [l.rstrip() for l in f if l.strip()]
        except OSError:
            lines = []
        rc = self.p.poll()
        why = f"exit status {rc}" if rc is not None else "still running"
        return why + ("; stderr: " + " | ".join(lines[-4:]) if lines else "")


def wait_all(members, word, timeout):
    """Read stdout lines until every member printed a line starting with word."""
    deadline = time.monotonic() + timeout
    waiting = {m.p.stdout.fileno(): m for m in members if word not in m.at}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            m = next(iter(waiting.values()))
            raise Fail(f"{len(waiting)} member(s) did not print '{word}' within {timeout:.0f} s, "
                       f"e.g. member {m.i} ({m.tail()})")
        r, _, _ = select.select(list(waiting), [], [], min(left, 1.0))
        for fd in r:
            m = waiting[fd]
            chunk = os.read(fd, 65536)
            if not chunk:
                raise Fail(f"member {m.i} ended before '{word}' ({m.tail()})")
            m.buf += chunk
            while b"\n" in m.buf:
                line, m.buf = m.buf.split(b"\n", 1)
                line = line.decode(errors="replace")
                now = time.monotonic()
                key = line.split(":", 1)[0] if ":" in line else line
                m.at.setdefault(key, now)
                if line.startswith("segment: "):
                    m.name = line[len("segment: "):]
                elif line.startswith("result: "):
                    m.result = json.loads(line[len("result: "):])
            if word in m.at:
                del waiting[fd]


def te_round(rnd):
    members = []
    try:
        for i in range(N):
            members.append(Member(i, rnd))
        t0 = members[0].t_spawn
        wait_all(members, "ready", 120 + N)
        t_ready = max(m.at["ready"] for m in members)
        listing = "".join(f"member {m.i} {m.name}\n" for m in members)
        t_open = time.monotonic()
        for m in members:
            m.send(listing + "open\n")
        wait_all(members, "opened", 120 + N)
        t_opened = max(m.at["opened"] for m in members)
        t_go = time.monotonic()
        for m in members:
            m.send("go\n")
        wait_all(members, "loaded", a.duration + 180)
        for m in members:
            m.send("close\n")
        wait_all(members, "closed", 60)
        for m in members:
            m.send("end\n")
        wait_all(members, "result", 60)
        for m in members:
            m.p.stdin.close()
            m.p.wait(timeout=30)
            procs.remove(m.p)
    except Fail:
        kill_all()
        raise
    rows = [m.result for m in members]
    for m, r in zip(members, rows):
        r["exit_status"] = m.p.returncode
        r["loaded_at"] = m.at["loaded"] - t_go
        got = [(s["op"], s["block"], s["batch"]) for s in r["streams"]]
        if got != list(streams_of(m.i)):
            raise Fail(f"member {m.i} reports streams {got}, mesh.sh expected {streams_of(m.i)}")
    return dict(rows=rows, wall_ready_s=t_ready - t0, wall_open_s=t_opened - t_open,
                wall_spawn_to_opened_s=t_opened - t0 - (t_open - t_ready),
                logs=[m.log for m in members])


# --- raw round -----------------------------------------------------------------------------
def raw_round(rnd):
    pairs = []
    for (op, block, batch), n in sorted(classes.items()):
        while n > 0:
            c = min(n, RAW_MAX_CONNS)
            n -= c
            cmd = [RAW, "--loopback", "--op", op, "--block-size", str(block), "--batch", str(batch),
                   "--depth", "1", "--connections", str(c), "--verify", "--duration",
                   str(a.duration), "--warmup", str(WARMUP), "--json", "--quiet"]
            log = os.path.join(tmp, f"raw-{rnd}-{len(pairs)}.err")
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=open(log, "w"), text=True)
            procs.append(p)
            pairs.append(dict(p=p, cmd=cmd, log=log, op=op, block=block, batch=batch, conns=c,
                              t0=time.monotonic()))
    rows = []
    for q in pairs:
        try:
            out, _ = q["p"].communicate(timeout=a.duration + 300)
        except subprocess.TimeoutExpired:
            kill_all()
            raise Fail(f"tcp-raw-loop did not finish: {' '.join(q['cmd'])}")
        procs.remove(q["p"])
        q["t1"] = time.monotonic()
        line = [l for l in out.splitlines() if l.strip().startswith("{")]
        row = json.loads(line[-1]) if line else {}
        row["exit_status"] = q["p"].returncode
        row["class"] = dict(op=q["op"], block=q["block"], batch=q["batch"], conns=q["conns"])
        if q["p"].returncode != 0 or not row.get("verified"):
            with open(q["log"]) as f:
                err = " | ".join(l.strip() for l in f if l.strip())
            row["error"] = f"exit status {q['p'].returncode}: {err}"
        rows.append(row)
    return dict(rows=rows)


# --- summary -------------------------------------------------------------------------------
def med(v):
    return statistics.median(v) if v else float("nan")


def te_summary(r):
    rows = r["rows"]
    per = N - 1

    def col(f):
        return [f(x) for x in rows]

    errors = {}
    for x in rows:
        for k, v in x["errors"].items():
            errors[k] = errors.get(k, 0) + v
    secs = col(lambda x: x["seconds"])
    ends = col(lambda x: x["loaded_at"])
    starts = [e - s for e, s in zip(ends, secs)]
    total_bytes = sum(col(lambda x: x["bytes"]))
    cpu = sum(col(lambda x: x["cpu_s"]))
    return dict(
        gbps=sum(col(lambda x: x["gbps"])),
        bytes=total_bytes,
        cpu_s_per_gb=cpu / (total_bytes / 1e9) if total_bytes else float("nan"),
        overlap=(min(ends) - max(starts)) / med(secs) if secs and med(secs) > 0 else 0.0,
        startup=col(lambda x: x["ms"]["startup"]),
        engine=col(lambda x: x["ms"]["engine"] + x["ms"]["register"]),
        open=col(lambda x: x["ms"]["open"]),
        open_per_peer=col(lambda x: x["ms"]["open_per_peer"]),
        fds=col(lambda x: x["fds"]["loaded"]),
        fds_engine=col(lambda x: x["fds"]["engine"]),
        fds_per_peer=col(lambda x: (x["fds"]["loaded"] - x["fds"]["engine"]) / per),
        fds_opened_per_peer=col(lambda x: (x["fds"]["opened"] - x["fds"]["engine"]) / per),
        fds_data_per_peer=col(lambda x: (x["fds_data"]["loaded"] - x["fds_data"]["engine"]) / per),
        fds_control_loaded=col(lambda x: x["fds_control"]["loaded"] - x["fds_control"]["engine"]),
        fds_left=col(lambda x: x["fds_data"]["closed"] - x["fds_data"]["engine"]),
        fds_control_left=col(lambda x: x["fds_control"]["closed"] - x["fds_control"]["engine"]),
        fds_freed=col(lambda x: x["fds"]["freed"] - x["fds"]["start"]),
        rss=col(lambda x: x["rss_kib"]["loaded"] / 1024),
        rss_engine=col(lambda x: x["rss_kib"]["engine"] / 1024),
        rss_per_peer=col(lambda x: (x["rss_kib"]["loaded"] - x["rss_kib"]["engine"]) / per),
        rss_opened_per_peer=col(lambda x: (x["rss_kib"]["opened"] - x["rss_kib"]["engine"]) / per),
        threads=col(lambda x: x["threads"]["loaded"]),
        threads_engine=col(lambda x: x["threads"]["engine"]),
        threads_per_peer=col(lambda x: (x["threads"]["loaded"] - x["threads"]["engine"]) / per),
        peers_opened=col(lambda x: x["peers_opened"]),
        peers_used=col(lambda x: x["peers_used"]),
        failed_tasks=sum(col(lambda x: x["failed_tasks"])),
        verify_failures=sum(col(lambda x: x["verify_failures"])),
        verified_bytes=sum(col(lambda x: x["verified_bytes"])),
        warnings=sum(col(lambda x: x["log_warnings"])),
        bad_exit=sum(1 for x in rows if x["exit_status"] != 0),
        errors=errors,
        wall_ready_s=r["wall_ready_s"], wall_open_s=r["wall_open_s"],
    )


def raw_summary(r):
    rows = r["rows"]
    total_bytes = sum(x.get("bytes", 0) for x in rows)
    cpu = sum(max(0.0, x.get("cpu_s_initiator", 0) or 0) + max(0.0, x.get("cpu_s_target", 0) or 0)
              for x in rows)
    return dict(gbps=sum(x.get("gbps", 0.0) for x in rows), bytes=total_bytes,
                cpu_s_per_gb=cpu / (total_bytes / 1e9) if total_bytes else float("nan"),
                failed=sum(1 for x in rows if "error" in x),
                errors=[x["error"] for x in rows if "error" in x])


def mm(v, fmt="{:.1f}"):
    return f"{fmt.format(med(v))} / {fmt.format(max(v))}" if v else "-"


# --- run -----------------------------------------------------------------------------------
load0 = loadavg()
print(f"mesh.sh: {N} engines (one te-mesh process each: p2p metadata, tcp on loopback), "
      f"depth {D}, sizes {','.join(size_str(s) for s in sizes)}, {a.duration:g} s per round, "
      f"{a.rounds} round(s){', raw baseline' if a.raw else ''}", flush=True)
print(f"mesh.sh: streams: " + ", ".join(f"{n} x {op} {size_str(b)} x{bt}"
                                         for (op, b, bt), n in sorted(classes.items())), flush=True)
print(f"mesh.sh: before: {load0}", flush=True)
te_res, raw_res, failures = [], [], []
rc = 0
try:
    for rnd in range(1, a.rounds + 1):
        order = ["te", "raw"] if rnd % 2 else ["raw", "te"]
        for what in order:
            if what == "te":
                try:
                    r = te_round(rnd)
                except Fail as e:
                    failures.append(f"te round {rnd}: {e}")
                    print(f"mesh.sh: te round {rnd} FAILED: {e}", file=sys.stderr, flush=True)
                    continue
                te_res.append(r)
                s = te_summary(r)
                print(f"mesh.sh: round {rnd} te: {s['gbps']:.3f} GB/s, errors "
                      f"{s['failed_tasks'] + s['verify_failures']}", flush=True)
            elif a.raw:
                try:
                    r = raw_round(rnd)
                except Fail as e:
                    failures.append(f"raw round {rnd}: {e}")
                    print(f"mesh.sh: raw round {rnd} FAILED: {e}", file=sys.stderr, flush=True)
                    continue
                raw_res.append(r)
                s = raw_summary(r)
                print(f"mesh.sh: round {rnd} raw: {s['gbps']:.3f} GB/s, failed pairs "
                      f"{s['failed']}", flush=True)
finally:
    kill_all()
load1 = loadavg()

te_s = [te_summary(r) for r in te_res]
raw_s = [raw_summary(r) for r in raw_res]
print()
print(f"te mesh: {N} engines, {N - 1} peers each; median / max over engines"
      + (f" (round 1 of {len(te_s)})" if len(te_s) > 1 else ""))
if te_s:
    s = te_s[0]
    rows = [
        ("startup ms: engine up + open all peers", mm(s["startup"])),
        ("  engine up and buffer registered, ms", mm(s["engine"])),
        ("  open all N-1 peers, ms", mm(s["open"])),
        ("  open, ms per peer", mm(s["open_per_peer"], "{:.2f}")),
        ("  wall: first spawn to all ready, s", f"{s['wall_ready_s']:.2f}"),
        ("  wall: list sent to all opened, s", f"{s['wall_open_s']:.2f}"),
        ("peers opened / used per engine", f"{mm(s['peers_opened'], '{:.0f}')} ; {mm(s['peers_used'], '{:.0f}')}"),
        ("fds per engine (after load)", mm(s["fds"], "{:.0f}")),
        ("  before opening peers", mm(s["fds_engine"], "{:.0f}")),
        ("fds per peer (after load)", mm(s["fds_per_peer"], "{:.2f}")),
        ("  right after open (lanes not yet used)", mm(s["fds_opened_per_peer"], "{:.2f}")),
        ("  of them data (tcp lanes, both ends)", mm(s["fds_data_per_peer"], "{:.2f}")),
        ("control-plane fds per engine (after load)", mm(s["fds_control_loaded"], "{:.0f}")),
        ("data fds left after close (must be 0)", mm(s["fds_left"], "{:.0f}")),
        ("control fds left after close (idle cache)", mm(s["fds_control_left"], "{:.0f}")),
        ("fds left after te_engine_free", mm(s["fds_freed"], "{:.0f}")),
        ("RSS MiB per engine (after load)", mm(s["rss"])),
        ("  before opening peers (buffers touched)", mm(s["rss_engine"])),
        ("RSS KiB per peer (after load)", mm(s["rss_per_peer"])),
        ("  right after open", mm(s["rss_opened_per_peer"])),
        ("threads per engine (after load)", mm(s["threads"], "{:.0f}")),
        ("  before opening peers", mm(s["threads_engine"], "{:.0f}")),
        ("threads per peer", mm(s["threads_per_peer"], "{:.2f}")),
        ("engine warnings logged (all engines)", str(s["warnings"])),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")


def rng(v, fmt="{:.3f}"):
    if not v:
        return "-"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(med(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


print()
te_g = [s["gbps"] for s in te_s]
raw_g = [s["gbps"] for s in raw_s]
ratios = [t / r for t, r in zip(te_g, raw_g) if r > 0]
print(f"aggregate GB/s (sum over streams; 10^9 B/s; WRITE read-backs not counted)")
print(f"  te   {rng(te_g):>22}   {N} engines x {D} slots = {N * D} streams"
      + (f", CPU-s/GB {rng([s['cpu_s_per_gb'] for s in te_s], '{:.2f}')}" if te_s else "")
      + (f", window overlap {min(s['overlap'] for s in te_s):.2f}" if te_s else ""))
if a.raw:
    npairs = len(raw_res[0]["rows"]) if raw_res else 0
    print(f"  raw  {rng(raw_g):>22}   {npairs} tcp-raw-loop pairs, {N * D} connections"
          + (f", CPU-s/GB {rng([s['cpu_s_per_gb'] for s in raw_s], '{:.2f}')}" if raw_s else ""))
    print(f"  te/raw {rng(ratios, '{:.2f}'):>20}")
tasks = sum(s["failed_tasks"] for s in te_s)
vfail = sum(s["verify_failures"] for s in te_s)
bad = sum(s["bad_exit"] for s in te_s)
errs = {}
for s in te_s:
    for k, v in s["errors"].items():
        errs[k] = errs.get(k, 0) + v
print()
print(f"errors (te, all rounds): {tasks + vfail} (failed tasks {tasks}"
      + (" by status: " + ", ".join(f"{k} {v}" for k, v in sorted(errs.items())) if errs else "")
      + f"; verification failures {vfail}; members exiting non-zero {bad}); "
      f"{sum(s['verified_bytes'] for s in te_s) / 1e9:.1f} GB checked byte for byte")
if a.raw:
    rf = sum(s["failed"] for s in raw_s)
    print(f"errors (raw): {rf} failed pair(s)")
    for s in raw_s:
        for e in s["errors"]:
            print(f"  raw: {e}")
for n in notes:
    print(f"note: {n}")
for f in failures:
    print(f"FAILED: {f}")
print(f"load: before: {load0}")
print(f"load: after:  {load1}")

ok = (not failures and te_s and tasks == 0 and vfail == 0 and bad == 0
      and all(s["peers_opened"] and min(s["peers_opened"]) == N - 1 for s in te_s)
      and all(max(s["fds_left"]) <= 0 for s in te_s)
      and (not a.raw or (raw_s and all(s["failed"] == 0 for s in raw_s))))
if a.json:
    with open(a.json, "w") as f:
        json.dump(dict(engines=N, depth=D, sizes=sizes, duration=a.duration, rounds=a.rounds,
                       config=config, load_before=load0, load_after=load1,
                       te=[dict(summary=te_summary(r), members=r["rows"]) for r in te_res],
                       raw=[dict(summary=raw_summary(r), pairs=r["rows"]) for r in raw_res],
                       te_over_raw=ratios, failures=failures, ok=bool(ok)), f, indent=1)
        f.write("\n")
if a.keep or not ok:
    print(f"logs: {tmp}")
else:
    for r in te_res:
        for log in r["logs"]:
            os.unlink(log)
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
print("result: " + ("pass" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
)

exec python3 -c "$prog" "$build" "${args[@]}"
