#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mesh_test.sh: bench/mesh.sh end to end with a small mesh: 4 te-mesh engines, 2 s, raw baseline.
#
# Usage: mesh_test.sh TE_MESH TCP_RAW_LOOP
#   Usage errors of te-mesh and mesh.sh exit 2 naming the bad value; a member handed a list
#   that names another process as itself exits 1 saying so; one handed a list with two peers
#   swapped reports the bytes it reads from them as differing (the checks can fail) and exits
#   1. `mesh.sh --engines 4 --duration 2`
#   exits 0 and its JSON shows: every member opened and used its 3 peers, moved and checked
#   bytes, no failed task and no verification failure, exit status 0; its data descriptors
#   (tcp lanes) back to the count before any peer was opened once all closed, none left
#   after te_engine_free, no thread per peer; one raw pair per stream class, all verified.
#   Never asserts on speed. Needs python3 and TE_SOURCE_ROOT (meson sets it).
set -uo pipefail

mesh=${1:?usage: mesh_test.sh TE_MESH TCP_RAW_LOOP}
raw=${2:?usage: mesh_test.sh TE_MESH TCP_RAW_LOOP}
build=$(cd "$(dirname "$mesh")/.." && pwd)
script=${TE_SOURCE_ROOT:?TE_SOURCE_ROOT is not set}/bench/mesh.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-mesh-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

command -v python3 >/dev/null || {
	echo "SKIP: python3 is needed to run mesh.sh and read its JSON"
	exit 77
}
[ -x "$raw" ] || fail "$raw is not built"

# expect_usage WORD ARGS...: te-mesh exits 2 and its message contains WORD.
expect_usage() {
	local word=$1 rc
	shift
	"$mesh" "$@" </dev/null >"$tmp/u.out" 2>"$tmp/u.err"
	rc=$?
	[ "$rc" -eq 2 ] || fail "te-mesh $*: exit $rc, expected 2 ($(cat "$tmp/u.err"))"
	grep -q -- "$word" "$tmp/u.err" || fail "te-mesh $*: message does not name '$word': $(cat "$tmp/u.err")"
	echo "ok: te-mesh $* -> 2 ($(head -n 1 "$tmp/u.err"))"
}
expect_usage "--id and --engines" --engines 4
expect_usage "--id 4 is not below" --id 4 --engines 4
expect_usage "--depth" --id 0 --engines 4 --depth 1
expect_usage "--sizes" --id 0 --engines 4 --sizes 4K,3
expect_usage "write slots" --id 0 --engines 2 --depth 4
expect_usage "--read-area" --id 0 --engines 4 --read-area 64K
expect_usage "unknown option" --id 0 --engines 4 --bogus

"$script" -C "$build" --engines 1 >"$tmp/u.out" 2>"$tmp/u.err"
rc=$?
if [ "$rc" -ne 2 ] || ! grep -q -- "--engines" "$tmp/u.err"; then
	fail "mesh.sh --engines 1: exit $rc ($(cat "$tmp/u.err"))"
fi
echo "ok: mesh.sh --engines 1 -> 2"

# A member told that another process is itself refuses the list.
{
	sleep 0.1
	printf 'member 0 127.0.0.1:1\nmember 1 127.0.0.1:2\nopen\n'
} | timeout 60 "$mesh" --id 0 --engines 2 --depth 2 >"$tmp/w.out" 2>"$tmp/w.err"
rc=$?
if [ "$rc" -ne 1 ] || ! grep -q "but this member" "$tmp/w.err"; then
	fail "te-mesh with a wrong own name: exit $rc ($(cat "$tmp/w.err"))"
fi
if ! grep -q '^segment: ' "$tmp/w.out" || ! grep -qx ready "$tmp/w.out"; then
	fail "te-mesh did not print segment and ready: $(cat "$tmp/w.out")"
fi
echo "ok: a list naming another process as this member -> 1 ($(head -n 1 "$tmp/w.err"))"

# The byte checks can fail: member 0 is handed a list with members 1 and 2 swapped, so it
# checks what it reads from each against the other's pattern. It must report bytes that
# differ, count them in its JSON and exit 1; the two others, given the true list, pass.
echo "+ 3 te-mesh members, member 0 told that 1 is 2 and 2 is 1"
python3 - "$mesh" "$tmp" <<'PY' || exit 1
import json, os, select, subprocess, sys, time
mesh, tmp = sys.argv[1], sys.argv[2]
procs, bufs = [], {}
for i in range(3):
    procs.append(subprocess.Popen(
        [mesh, "--id", str(i), "--engines", "3", "--depth", "2", "--sizes", "64K",
         "--duration", "1", "--warmup", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=open(os.path.join(tmp, f"swap-{i}.err"), "w"), bufsize=0))
def wait_for(p, word):
    """stdout lines of p up to the first that starts with word (120 s at most)."""
    deadline, got = time.monotonic() + 120, []
    fd = p.stdout.fileno()
    while time.monotonic() < deadline:
        while b"\n" in bufs.get(fd, b""):
            line, bufs[fd] = bufs[fd].split(b"\n", 1)
            got.append(line.decode(errors="replace"))
            if got[-1].startswith(word):
                return got
        r, _, _ = select.select([fd], [], [], 1.0)
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            bufs[fd] = bufs.get(fd, b"") + chunk
    for q in procs:
        q.kill()
    sys.exit(f"FAIL: a member did not print '{word}' (exit {p.poll()}): {got}")
def send(p, text):
    p.stdin.write(text.encode())
names = []
for p in procs:
    lines = wait_for(p, "ready")
    names.append([l for l in lines if l.startswith("segment: ")][0][len("segment: "):])
true = "".join(f"member {k} {names[k]}\n" for k in range(3))
swapped = f"member 0 {names[0]}\nmember 1 {names[2]}\nmember 2 {names[1]}\n"
for i, p in enumerate(procs):
    send(p, (swapped if i == 0 else true) + "open\n")
for word, cmd in (("opened", "go"), ("loaded", "close"), ("closed", "end"), ("result", None)):
    res = [wait_for(p, word) for p in procs]
    if cmd:
        for p in procs:
            send(p, cmd + "\n")
rows = [json.loads(r[-1][len("result: "):]) for r in res]
for p in procs:
    p.stdin.close()
    p.wait(timeout=60)
errs = [open(os.path.join(tmp, f"swap-{i}.err")).read() for i in range(3)]
bad = []
def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        bad.append(what)
check(procs[0].returncode == 1, f"member 0 exits 1 ({procs[0].returncode})")
check(rows[0]["verify_failures"] > 0, f"member 0 counts verification failures ({rows[0]['verify_failures']})")
check("bytes differ at its buffer offset" in errs[0] and "READ from" in errs[0],
      "member 0 says which READ differed and where: "
      + next((l for l in errs[0].splitlines() if "bytes differ" in l), "(no such line)"))
check(rows[0]["failed_tasks"] == 0, "member 0: the transfers themselves completed")
for i in (1, 2):
    check(procs[i].returncode == 0 and rows[i]["verify_failures"] == 0
          and rows[i]["verified_bytes"] > 0, f"member {i} (true list) exits 0, all bytes match")
sys.exit(1 if bad else 0)
PY

echo "+ mesh.sh -C $build --engines 4 --duration 2 --json mesh.json"
timeout 200 "$script" -C "$build" --engines 4 --duration 2 --json "$tmp/mesh.json" >"$tmp/mesh.out" 2>&1
rc=$?
sed 's/^/  /' "$tmp/mesh.out"
[ "$rc" -eq 0 ] || fail "mesh.sh exited $rc"

python3 - "$tmp/mesh.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
bad = []
def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        bad.append(what)
check(d["ok"] is True, "summary ok")
members = d["te"][0]["members"]
check(len(members) == 4 and sorted(m["id"] for m in members) == [0, 1, 2, 3], "4 members reported")
for m in members:
    i = m["id"]
    check(m["exit_status"] == 0, f"member {i}: exit status 0")
    check(m["peers_opened"] == 3 and m["peers_used"] == 3, f"member {i}: opened and used its 3 peers")
    check(m["failed_tasks"] == 0 and m["errors"] == {}, f"member {i}: no failed task ({m['errors']})")
    check(m["verify_failures"] == 0, f"member {i}: no verification failure")
    check(m["bytes"] > 0 and m["verified_bytes"] >= m["bytes"], f"member {i}: bytes moved and all checked")
    check(all(s["batches"] > 0 for s in m["streams"]) and len(m["streams"]) == 4,
          f"member {i}: every slot ran")
    check(m["readback_bytes"] > 0, f"member {i}: WRITEs were read back")
    fd = m["fds_data"]
    # Lanes connect on first use: at least one out per peer used, at most 4 out and 4 in.
    check(3 <= fd["loaded"] - fd["engine"] <= 3 * 4 * 2,
          f"member {i}: 3..24 lane descriptors for 3 peers ({fd['loaded'] - fd['engine']})")
    check(fd["closed"] == fd["engine"], f"member {i}: data fds back to {fd['engine']} after close ({fd['closed']})")
    check(m["fds"]["freed"] == m["fds"]["start"], f"member {i}: no fd left after te_engine_free")
    check(m["threads"]["loaded"] == m["threads"]["engine"], f"member {i}: no thread per peer")
pairs = d["raw"][0]["pairs"]
check(len(pairs) == 6 and all(p.get("verified") for p in pairs), "raw: 6 verified pairs")
check(sum(p["class"]["conns"] for p in pairs) == 16, "raw: one connection per te slot (16)")
sys.exit(1 if bad else 0)
PY
echo "PASS"
