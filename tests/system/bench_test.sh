#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_test.sh: te-bench end to end: --core over the loopback test transport, --loopback over tcp.
#
# Usage: bench_test.sh TE_BENCH core|loopback|target|plot|steal [PLOT_PY]
#   core:     --version; usage errors exit 2 naming the bad value; `--core --duration 0.5
#             --verify --json` exits 0 with a verified row that moved slices; --op read,write
#             gives one row per op, --warmup batches are not counted.
#   loopback: `--loopback --verify --duration 1 --block-size 64K --json`, for read and write,
#             exits 0 with verified rows over tcp; --op both with --sizes and --batches gives
#             one row per size x batch x op in that order, with samples, in the table, in
#             JSON and in the --output file; a batch of 1024 READs reports at least 100
#             slices per send (JSON and the lanes line).
#   target:   `--target` prints segment, descriptor and ready in that order and exits 0 at EOF
#             on stdin: /dev/null, a pipe its parent closes, a file; --ignore-stdin serves on.
#   plot:     bench/plot.py (PLOT_PY) turns a short --loopback run's JSON into a well-formed
#             SVG with one path per series, from a file and from stdin; bad input exits 2.
#   steal:    bench/steal.bash (next to PLOT_PY), in POSIX sh: the steal between two
#             /proc/stat fixtures, "?" where the file is unreadable or the time did not move,
#             and a percentage from the real /proc/stat.
#   loopback, target and plot skip (77) when tcp.so is not built.
# Needs TE_PLUGIN_PATH (the meson test environment sets it) and python3.
set -uo pipefail

usage="usage: bench_test.sh TE_BENCH core|loopback|target|plot|steal [PLOT_PY]"
bench=${1:?$usage}
part=${2:?$usage}
plot_py=${3:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-bench-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

command -v python3 >/dev/null || {
	echo "SKIP: python3 is needed to parse te-bench --json"
	exit 77
}

# run NAME ARGS...: te-bench with a hard time limit; output in $tmp/NAME.{out,err}, status in $rc.
run() {
	local name=$1
	shift
	echo "+ te-bench $*"
	timeout 120 "$bench" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
	rc=$?
	sed 's/^/  stdout: /' "$tmp/$name.out"
	sed 's/^/  stderr: /' "$tmp/$name.err"
}

# check_rows FILE MIN_ROWS CHECK: every line of FILE is a JSON object with the required keys,
# verified true, and the python expression CHECK (over row r) true.
check_rows() {
	python3 - "$@" <<'PY'
import json, os, sys
path, min_rows, check = sys.argv[1], int(sys.argv[2]), sys.argv[3]
required = ["op", "block_size", "batch", "threads", "transport", "bytes", "seconds", "gbps",
            "ops_per_s", "verified"]
rows = []
for n, line in enumerate(open(path), 1):
    try:
        rows.append(json.loads(line))
    except ValueError as e:
        sys.exit(f"line {n} is not JSON ({e}): {line!r}")
if len(rows) < min_rows:
    sys.exit(f"{len(rows)} rows, expected at least {min_rows}")
for r in rows:
    missing = [k for k in required if k not in r]
    if missing:
        sys.exit(f"row lacks {missing}: {r}")
    if r["verified"] is not True:
        sys.exit(f"row not verified: {r}")
    if not eval(check, {"os": os}, {"r": r}):
        sys.exit(f"row fails {check}: {r}")
PY
}

# need_tcp: skip (77) unless tcp.so is in TE_PLUGIN_PATH.
need_tcp() {
	local found="" d
	IFS=: read -r -a dirs <<<"${TE_PLUGIN_PATH:-}"
	for d in "${dirs[@]}"; do
		[ -n "$d" ] && [ -e "$d/tcp.so" ] && found=$d/tcp.so && break
	done
	if [ -z "$found" ]; then
		echo "SKIP: tcp.so is not built (not found in TE_PLUGIN_PATH=${TE_PLUGIN_PATH:-})"
		exit 77
	fi
}

# wait_line FILE LINE: until FILE has the line LINE (60 s at most).
wait_line() {
	local i
	for ((i = 0; i < 600; i++)); do
		grep -qx "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# check_target_out FILE: segment, descriptor and (when $2 is "ready") ready, in that order.
check_target_out() {
	python3 - "$1" "${2:-}" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
want = ["segment: ", "descriptor: "] + (["ready"] if sys.argv[2] == "ready" else [])
if len(lines) < len(want):
    sys.exit(f"stdout has {len(lines)} lines, expected {want}: {lines}")
for got, w in zip(lines, want):
    if not (got == w if w == "ready" else got.startswith(w) and len(got) > len(w)):
        sys.exit(f"expected a line {w!r}, got {got!r} (stdout: {lines})")
PY
}

case "$part" in
core)
	run version --version
	[ "$rc" = 0 ] || fail "--version: status $rc"
	grep -Eqx 'te-bench [0-9]+\.[0-9]+\.[0-9]+.* \(plugin ABI [0-9]+\.[0-9]+\)' "$tmp/version.out" ||
		fail "--version does not print 'te-bench X.Y.Z (plugin ABI M.N)'"
	# Usage errors: status 2 and a message naming the bad value.
	run usage-block --core --block-size 12Q
	[ "$rc" = 2 ] || fail "--block-size 12Q: status $rc, expected 2"
	grep -q "12Q" "$tmp/usage-block.err" || fail "--block-size error does not name '12Q'"
	run usage-mode --core --loopback
	[ "$rc" = 2 ] || fail "two modes: status $rc, expected 2"
	run usage-op --core --op sideways
	[ "$rc" = 2 ] || fail "--op sideways: status $rc, expected 2"
	run usage-depth --loopback --depth 17
	[ "$rc" = 2 ] || fail "--depth 17: status $rc, expected 2"
	grep -q -- "--depth: 17 is not in \[1, 16\]" "$tmp/usage-depth.err" || fail "--depth 17: no range error"
	run usage-depth-verify --loopback --depth 2 --verify
	[ "$rc" = 2 ] || fail "--depth 2 --verify: status $rc, expected 2"
	grep -q -- "--verify" "$tmp/usage-depth-verify.err" || fail "--depth 2 --verify: error does not name --verify"
	# usage_error NAME NEEDLE ARGS...: status 2 and one message naming NEEDLE.
	usage_error() {
		local name=$1 needle=$2
		shift 2
		run "usage-$name" "$@"
		[ "$rc" = 2 ] || fail "$*: status $rc, expected 2"
		grep -qF -- "$needle" "$tmp/usage-$name.err" || fail "$*: error does not name '$needle'"
		[ "$(grep -c '^te-bench: ' "$tmp/usage-$name.err")" = 2 ] ||
			fail "$*: expected one message and 'try --help'"
	}
	usage_error op-list sideways --loopback --op read,sideways
	usage_error op-twice "listed twice" --loopback --op read,both
	usage_error sizes-item zz --loopback --sizes 4K,zz
	usage_error sizes-range 64K-4K --loopback --sizes 64K-4K
	usage_error sizes-big 8G --loopback --sizes 4K-8G
	usage_error sizes-sweep --sweep --loopback --sweep --sizes 4K
	usage_error sizes-block --block-size --loopback --sizes 4K --block-size 8K
	usage_error batches-zero "'0'" --loopback --batches 1,0
	usage_error batches-batch --batches --loopback --batch 4 --batches 1,2
	usage_error sizes-core --sizes --core --sizes 4K
	usage_error warmup "--warmup: -1" --loopback --warmup -1
	usage_error output "$tmp/no/such/dir/rows" --loopback --output "$tmp/no/such/dir/rows"
	usage_error output-target --output --target --output "$tmp/rows"
	usage_error ignore-stdin --ignore-stdin --loopback --ignore-stdin

	for op in write read; do
		run core-$op --core --op $op --duration 0.5 --verify --json
		[ "$rc" = 0 ] || fail "--core --op $op: status $rc"
		check_rows "$tmp/core-$op.out" 1 \
			"r['slices'] > 0 and r['slices_per_s'] > 0 and r['transport'] == 'loopback' and r['op'] == '$op' and isinstance(r.get('steal_pct'), (int, float)) and 0 <= r['steal_pct'] <= 100" ||
			fail "--core --op $op: bad JSON row"
	done
	# --iterations is exact: the callgrind baseline depends on it.
	run core-iter --core --iterations 10 --batch 8 --json
	[ "$rc" = 0 ] || fail "--core --iterations 10: status $rc"
	python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(r["iterations"] != 10 or r["slices"] != 80)' \
		"$tmp/core-iter.out" || fail "--core --iterations 10 --batch 8 did not run 80 slices"
	# --op list: one run per op, in order; warm-up batches are not counted.
	run core-ops --core --op read,write --iterations 5 --warmup 3 --batch 8 --verify --json \
		--output "$tmp/core-ops.json"
	[ "$rc" = 0 ] || fail "--core --op read,write: status $rc"
	check_rows "$tmp/core-ops.out" 2 "r['iterations'] == 5 and r['samples'] == 5 and r['slices'] == 40 and r['warmup'] == 3" ||
		fail "--core --op read,write: bad JSON rows"
	[ "$(python3 -c 'import json, sys; print(",".join(json.loads(l)["op"] for l in open(sys.argv[1])))' "$tmp/core-ops.out")" = read,write ] ||
		fail "--core --op read,write: rows are not read then write"
	cmp -s "$tmp/core-ops.out" "$tmp/core-ops.json" || fail "--core --output: the file differs from stdout"
	;;
loopback)
	need_tcp
	for op in write read; do
		run loop-$op --loopback --op $op --verify --duration 1 --block-size 64K --json
		[ "$rc" = 0 ] || fail "--loopback --op $op: status $rc"
		check_rows "$tmp/loop-$op.out" 1 \
			"r['bytes'] > 0 and r['block_size'] == 65536 and r['transport'] != '' and r['op'] == '$op' and isinstance(r.get('steal_pct'), (int, float)) and 0 <= r['steal_pct'] <= 100" ||
			fail "--loopback --op $op: bad JSON row"
		# CPU of both processes over the timed loops: both worked, and together they used no
		# more than the machine's CPUs had in that time
		check_rows "$tmp/loop-$op.out" 1 \
			"r['cpu_s_initiator'] > 0 and r['cpu_s_target'] > 0 and r['cpu_s_initiator'] + r['cpu_s_target'] <= r['seconds'] * os.cpu_count() * 1.1 + 0.05" ||
			fail "--loopback --op $op: cpu_s_initiator/cpu_s_target"

	done
	# --depth keeps batches in flight and still runs exactly --iterations of them.
	run loop-depth --loopback --op mix --depth 3 --iterations 7 --batch 4 --block-size 4K --json
	[ "$rc" = 0 ] || fail "--loopback --depth 3: status $rc"
	python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
sys.exit(not (r["depth"] == 3 and r["batches"] == 7 and r["requests"] == 28 and r["bytes"] == 28 * 4096))' \
		"$tmp/loop-depth.out" || fail "--depth 3 --iterations 7 --batch 4 did not move 7 batches of 4 x 4K"

	# The tcp lanes' sends: a batch of 1024 READs from one thread leaves in a few sendmsg
	# calls (one once the lane's header room grew), not one per request.
	run loop-sends --loopback --op read --block-size 4K --batch 1024 --iterations 4 --warmup 2 --verify --json
	[ "$rc" = 0 ] || fail "--loopback --batch 1024: status $rc"
	check_rows "$tmp/loop-sends.out" 1 "isinstance(r.get('slices_per_send'), (int, float)) and r['slices_per_send'] >= 100" ||
		fail "--loopback --batch 1024 x 4K READ: slices_per_send missing or under 100"
	run loop-sends-line --loopback --op read --block-size 4K --batch 1024 --iterations 2 --warmup 1
	[ "$rc" = 0 ] || fail "--loopback --batch 1024 (table): status $rc"
	grep -Eq '^te-bench: lanes: 1 of [0-9]+ used \(slices per lane 100\.0%.*; [0-9]+\.[0-9] per send\)$' "$tmp/loop-sends-line.err" ||
		fail "--loopback --batch 1024 (table): no lanes line with slices per send"

	# A run needing more than 256 MiB of target: it gets it (a third of MemAvailable allows),
	# said in a note, and runs the batch asked; else the note says why the batch is smaller.
	run loop-big --loopback --op read --block-size 1M --batch 300 --iterations 2 --warmup 1 --verify --json
	[ "$rc" = 0 ] || fail "--loopback --batch 300 --block-size 1M: status $rc"
	avail_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
	if [ "$((avail_mib / 3))" -ge 601 ]; then
		grep -q "note: target buffer 601M for the largest run (more than the usual 256M" "$tmp/loop-big.err" ||
			fail "--batch 300 x 1M: no note of the 601M target buffer"
		check_rows "$tmp/loop-big.out" 1 "r['batch'] == 300 and r['batch_requested'] == 300 and r['requests'] == 600" ||
			fail "--batch 300 x 1M: not run at batch 300"
	else
		grep -q "where the largest run needs 601M: such runs get a smaller batch" "$tmp/loop-big.err" ||
			fail "--batch 300 x 1M with ${avail_mib} MiB available: no note of the capped buffer"
		check_rows "$tmp/loop-big.out" 1 "r['batch'] < 300 and r['batch_requested'] == 300" ||
			fail "--batch 300 x 1M with ${avail_mib} MiB available: batch not reduced"
	fi

	# READ and WRITE in one sweep over custom sizes and batches: rows per size, then batch,
	# ops innermost; each timed exactly --iterations batches after its warm-up.
	run loop-both --loopback --op both --sizes 4K-16K,64K --batches 1,4 --iterations 3 \
		--warmup 2 --verify --json --output "$tmp/loop-both.json"
	[ "$rc" = 0 ] || fail "--loopback --op both --sizes --batches: status $rc"
	check_rows "$tmp/loop-both.out" 16 "r['samples'] == 3 and r['batches'] == 3 and r['warmup'] == 2 and r['requests'] == 3 * r['batch'] and r['bytes'] == r['requests'] * r['block_size']" ||
		fail "--op both --sizes --batches: bad JSON rows"
	python3 - "$tmp/loop-both.out" <<'PY' || fail "--op both --sizes 4K-16K,64K --batches 1,4: rows out of order"
import json, sys
got = [(r["block_size"], r["batch_requested"], r["op"]) for r in map(json.loads, open(sys.argv[1]))]
want = [(s * 1024, b, op) for s in (4, 8, 16, 64) for b in (1, 4) for op in ("read", "write")]
sys.exit(None if got == want else f"rows {got}, expected {want}")
PY
	cmp -s "$tmp/loop-both.out" "$tmp/loop-both.json" || fail "--output: the file differs from stdout"

	# The table: a samples column, one row per run, verified yes; --output gets the same.
	run loop-table --loopback --op read,write --sizes 4K,8K --iterations 2 --verify --quiet \
		--output "$tmp/loop-table.txt"
	[ "$rc" = 0 ] || fail "--loopback table: status $rc"
	python3 - "$tmp/loop-table.out" <<'PY' || fail "--loopback table: bad rows"
import sys
lines = open(sys.argv[1]).read().splitlines()
head = lines[0].split()
if head[:5] != ["op", "block", "batch", "thr", "samples"] or head[-1] != "verified":
    sys.exit(f"header {head}")
rows = [dict(zip(head, l.split())) for l in lines[1:]]
got = [(r["op"], r["block"], r["samples"], r["verified"]) for r in rows]
want = [("read", "4K", "2", "yes"), ("write", "4K", "2", "yes"),
        ("read", "8K", "2", "yes"), ("write", "8K", "2", "yes")]
sys.exit(None if got == want else f"rows {got}, expected {want}")
PY
	cmp -s "$tmp/loop-table.out" "$tmp/loop-table.txt" || fail "--output (table): the file differs from stdout"
	;;
target)
	need_tcp
	# /dev/null: EOF at once; the target announces itself and exits 0 (timeout(1): 124).
	echo "+ te-bench --target < /dev/null"
	timeout 60 "$bench" --target --quiet </dev/null >"$tmp/null.out" 2>"$tmp/null.err"
	rc=$?
	cat "$tmp/null.err"
	[ "$rc" = 0 ] || fail "--target < /dev/null: status $rc, expected 0"
	check_target_out "$tmp/null.out" || fail "--target < /dev/null: bad announcement"

	# A regular file: read to its end, then EOF.
	printf 'some input\n' >"$tmp/input"
	echo "+ te-bench --target --buffer-size 8M < FILE"
	timeout 60 "$bench" --target --buffer-size 8M --quiet <"$tmp/input" >"$tmp/file.out" 2>"$tmp/file.err"
	rc=$?
	cat "$tmp/file.err"
	[ "$rc" = 0 ] || fail "--target < FILE: status $rc, expected 0"
	check_target_out "$tmp/file.out" || fail "--target < FILE: bad announcement"

	# A pipe held by this shell: ready after segment and descriptor, then EOF when it closes.
	echo "+ te-bench --target --buffer-size 8M < PIPE, closed after 'ready'"
	mkfifo "$tmp/pipe"
	timeout 60 "$bench" --target --buffer-size 8M --quiet <"$tmp/pipe" >"$tmp/pipe.out" 2>"$tmp/pipe.err" &
	pid=$!
	exec 3>"$tmp/pipe"
	wait_line "$tmp/pipe.out" ready || {
		exec 3>&-
		wait "$pid"
		cat "$tmp/pipe.err"
		fail "--target < PIPE: no 'ready' line"
	}
	check_target_out "$tmp/pipe.out" ready || fail "--target < PIPE: bad announcement"
	kill -0 "$pid" 2>/dev/null || fail "--target < PIPE: exited before its stdin closed"
	exec 3>&-
	wait "$pid"
	rc=$?
	cat "$tmp/pipe.err"
	[ "$rc" = 0 ] || fail "--target < PIPE: status $rc after the pipe closed, expected 0"

	# --ignore-stdin: /dev/null does not end it; SIGTERM does, with status 0.
	echo "+ te-bench --target --buffer-size 8M --ignore-stdin < /dev/null, then SIGTERM"
	timeout 60 "$bench" --target --buffer-size 8M --ignore-stdin --quiet </dev/null \
		>"$tmp/ign.out" 2>"$tmp/ign.err" &
	pid=$!
	wait_line "$tmp/ign.out" ready || {
		kill "$pid"
		fail "--target --ignore-stdin: no 'ready' line"
	}
	kill -0 "$pid" 2>/dev/null || fail "--target --ignore-stdin < /dev/null: exited at EOF"
	kill -TERM "$pid"
	wait "$pid"
	rc=$?
	cat "$tmp/ign.err"
	[ "$rc" = 0 ] || fail "--target --ignore-stdin: status $rc after SIGTERM, expected 0"
	;;
plot)
	need_tcp
	[ -n "$plot_py" ] && [ -f "$plot_py" ] || fail "plot: no plot.py given (3rd argument)"
	run plot-rows --loopback --op read,write --sizes 4K,16K --batches 1,4 --iterations 2 \
		--warmup 1 --json --quiet --output "$tmp/rows.json"
	[ "$rc" = 0 ] || fail "--loopback for the plot sample: status $rc"
	# check_svg FILE SERIES: well-formed SVG; per series one bandwidth, one p50 and one p99 path.
	check_svg() {
		python3 - "$@" <<'PY'
import sys
import xml.etree.ElementTree as ET
path, series = sys.argv[1], int(sys.argv[2])
root = ET.parse(path).getroot()
if root.tag != "{http://www.w3.org/2000/svg}svg":
    sys.exit(f"root element is {root.tag}, not svg")
paths = root.findall(".//{http://www.w3.org/2000/svg}path")
for cls in ("bandwidth", "p50", "p99"):
    got = [p for p in paths if p.get("class") == "series " + cls]
    if len(got) != series:
        sys.exit(f"{len(got)} {cls} paths, expected {series}")
    labels = {p.get("data-series") for p in got}
    if len(labels) != series:
        sys.exit(f"{cls} paths share labels: {sorted(labels)}")
    for p in got:
        if p.get("d", "").count("L") != 1:  # two sizes: one segment each
            sys.exit(f"{cls} path of {p.get('data-series')} is not 2 points: {p.get('d')}")
texts = "".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
for want in ("read thr 1 batch 1", "write thr 1 batch 4", "4K", "16K", "GB/s"):
    if want not in texts:
        sys.exit(f"no text {want!r} in the SVG")
PY
	}
	echo "+ plot.py --backend builtin rows.json --out plot.svg"
	python3 "$plot_py" --backend builtin "$tmp/rows.json" --out "$tmp/plot.svg" || fail "plot.py: status $?"
	check_svg "$tmp/plot.svg" 4 || fail "plot.py: bad SVG"
	echo "+ plot.py --backend builtin --out stdin.svg < rows.json"
	python3 "$plot_py" --backend builtin --out "$tmp/stdin.svg" <"$tmp/rows.json" || fail "plot.py < rows: status $?"
	check_svg "$tmp/stdin.svg" 4 || fail "plot.py < rows: bad SVG"
	# Whatever the default backend (matplotlib when installed), the SVG is well-formed XML.
	python3 "$plot_py" "$tmp/rows.json" --out "$tmp/auto.svg" || fail "plot.py (auto): status $?"
	python3 -c 'import sys, xml.etree.ElementTree as ET; ET.parse(sys.argv[1])' "$tmp/auto.svg" ||
		fail "plot.py (auto): not well-formed XML"
	# Bad input: status 2, the message names the file and line.
	{ head -n 1 "$tmp/rows.json"; echo "op block batch"; } >"$tmp/bad.json"
	python3 "$plot_py" "$tmp/bad.json" --out "$tmp/bad.svg" 2>"$tmp/bad.err"
	rc=$?
	cat "$tmp/bad.err"
	[ "$rc" = 2 ] || fail "plot.py on a non-JSON line: status $rc, expected 2"
	grep -qF "bad.json:2:" "$tmp/bad.err" || fail "plot.py: the error does not name bad.json:2"
	python3 "$plot_py" --out "$tmp/empty.svg" </dev/null 2>"$tmp/empty.err"
	[ "$?" = 2 ] || fail "plot.py on empty input: status is not 2"
	;;
steal)
	steal_bash=$(dirname "$plot_py")/steal.bash
	[ -f "$steal_bash" ] || fail "steal: no $steal_bash"
	# cpu line: user nice system idle iowait irq softirq steal guest guest_nice
	printf 'cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 50 0 25 400 5 0 0 20 0 0\n' >"$tmp/stat1"
	printf 'cpu  150 0 70 900 10 0 0 70 0 0\n' >"$tmp/stat2"
	# steal_sh FILE1 FILE2: cpu_mark on FILE1, then steal_since on FILE2, in POSIX sh.
	steal_sh() {
		sh -c '. "$1"; m=$(TE_PROC_STAT=$2 cpu_mark); echo "$m"; TE_PROC_STAT=$3 steal_since "$m"' \
			sh "$steal_bash" "$1" "$2"
	}
	got=$(steal_sh "$tmp/stat1" "$tmp/stat2" | tr '\n' '|')
	# 200 ticks passed, 30 of them stolen
	[ "$got" = "1000 40|15.0|" ] || fail "steal between the fixtures: got '$got', want '1000 40|15.0|'"
	got=$(steal_sh "$tmp/none" "$tmp/stat2" | tr '\n' '|')
	[ "$got" = "- -|?|" ] || fail "steal from an unreadable file: got '$got', want '- -|?|'"
	got=$(steal_sh "$tmp/stat2" "$tmp/none" | tr '\n' '|')
	[ "$got" = "1200 70|?|" ] || fail "steal to an unreadable file: got '$got', want '1200 70|?|'"
	got=$(steal_sh "$tmp/stat2" "$tmp/stat2" | tr '\n' '|')
	[ "$got" = "1200 70|?|" ] || fail "steal over no time: got '$got', want '1200 70|?|'"
	printf 'intr 5\n' >"$tmp/nocpu"
	got=$(steal_sh "$tmp/nocpu" "$tmp/stat2" | tr '\n' '|')
	[ "$got" = "- -|?|" ] || fail "steal from a file without a cpu line: got '$got'"
	if [ -r /proc/stat ]; then
		got=$(sh -c '. "$1"; m=$(cpu_mark); sleep 0.2; echo "$m"; steal_since "$m"' sh \
			"$steal_bash" | tr '\n' '|')
		echo "$got" | grep -Eq '^[0-9]+ [0-9]+\|[0-9]+\.[0-9]\|$' ||
			fail "steal from /proc/stat: got '$got'"
		awk -v v="$(echo "$got" | cut -d'|' -f2)" 'BEGIN { exit !(v >= 0 && v <= 100) }' ||
			fail "steal from /proc/stat is not a percentage: '$got'"
	fi
	;;
*)
	echo "$usage" >&2
	exit 2
	;;
esac
echo "PASS"
