#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# raw_loop_test.sh: bench/tcp-raw-loop end to end, bench/compare-tcp.sh's quick table and
# bench/compare-builds.sh, bench/insn-tcp.sh, bench/sched-trace.sh.
#
# Usage: raw_loop_test.sh TCP_RAW_LOOP loop|compare|rerun|builds|insn|sched
#   loop:    usage errors exit 2; `--loopback --verify --json` for read and write, 4K and 1M,
#            (JSON keys: te-bench's, checked against a te-bench row when te-bench and tcp.so exist)
#            1 and 2 connections, exits 0 with verified rows whose counts add up; the text row;
#            --pingpong (batch 1, depth 1, 4K, ordered percentiles); --server / --client with a
#            buffer too small for the layout (exit 2) and one that fits (verified).
#   compare: `compare-tcp.sh --quick --rounds 1` exits 0 with every expected row of the table
#            (te and raw figures in each; iperf3 too when it is installed) and the latency rows.
#   rerun:   compare-tcp.sh --rerun-below: usage errors exit 2 naming the option; two short
#            cells (4K READ and WRITE, 1 round of 0.3 s): under a ratio no cell reaches (100)
#            both run 2 more rounds (a rounds column of 3, te/raw marked ² and listed first ->
#            all, 3 te and raw runs each on stderr); under one every cell clears (0.001) none
#            does (rounds 1, "none rerun").
#   builds:  compare-builds.sh: usage errors exit 2 naming the problem; two variants (the build,
#            and the build with a configuration) and the raw loop, 2 rounds: exit 0, a row each
#            with figures, ratios against the first variant and the raw loop, none failed,
#            --md FILE equal to stdout; a batch too large for te-bench's default 256 MiB loopback
#            target: te-bench gets the --buffer-size it needs and runs the batch asked; with a
#            --buffer-size given too small: a note under the table and on stderr that it ran a
#            smaller one (none otherwise); a variant whose configuration is malformed: exit 1,
#            its runs counted failed and the reason (te-bench's error) on stderr.
#   insn:    insn-tcp.sh: usage errors exit 2 naming the problem; two variants and the raw loop
#            (callgrind, 40 and 20 batches of 32): exit 0, a row each with instruction counts, the first
#            variant's ratio 1.000, each variant's top functions (te's and the raw loop's own);
#            a variant whose te-bench fails: exit 1 with its log. Skipped without valgrind,
#            and in a sanitizer build (insn-tcp.sh refuses those: exit 1, saying why).
#   sched:   sched-trace.sh: usage errors exit 2 naming the problem; WRITE 64K x8 from 2 threads
#            traced 0.5 s each: exit 0, --md FILE equal to stdout, te's section with its 2
#            bench-* threads and the target's te-tcp-* workers (CPU and switch figures), wake-ups
#            into the target's workers, the raw loop's section with both processes; a malformed
#            --config: exit 1 with te-bench's error; no tracing instance left behind. Skipped without a writable tracefs (not root).
# Never asserts on speed. Needs python3, and TE_SOURCE_ROOT / TE_BUILD_ROOT (meson sets them).
set -uo pipefail

raw=${1:?usage: raw_loop_test.sh TCP_RAW_LOOP loop|compare|rerun|builds|insn|sched}
part=${2:?usage: raw_loop_test.sh TCP_RAW_LOOP loop|compare|rerun|builds|insn|sched}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-raw-loop-test.XXXXXX")
server_pid=""
cleanup() {
	# Only the server this test started, by its PID.
	if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
		kill "$server_pid" 2>/dev/null
		wait "$server_pid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

command -v python3 >/dev/null || {
	echo "SKIP: python3 is needed to parse the JSON rows"
	exit 77
}

# run NAME ARGS...: tcp-raw-loop with a hard time limit; output in $tmp/NAME.{out,err}, $rc.
run() {
	local name=$1
	shift
	echo "+ tcp-raw-loop $*"
	timeout 120 "$raw" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
	rc=$?
	sed 's/^/  stdout: /' "$tmp/$name.out"
	sed 's/^/  stderr: /' "$tmp/$name.err"
}

# check_json FILE CHECK LABEL: queue a check, run by check_all: FILE is one JSON row with
# te-bench's keys (and ours) that passes the python expression CHECK over row r.
checks=()
check_json() {
	cp "$1" "$tmp/row.${#checks[@]}"
	checks+=("$tmp/row.${#checks[@]}" "$2" "$3")
}

# One python run for all rows (its start is slow on a loaded machine).
check_all() {
	python3 - "$te_row" "${checks[@]}" <<'PY'
import json, sys
keys = ["mode", "segment", "opened", "op", "block_size", "batch", "batch_requested", "threads",
        "depth", "warmup", "transport", "device", "bytes", "requests", "batches", "samples",
        "seconds", "gbps", "ops_per_s", "lat_us_avg", "lat_us_p50", "lat_us_p99", "lat_us_p999",
        "lat_us_max", "lanes", "lanes_used", "slices_per_send", "verify", "verified", "failed", "interrupted", "version", "connections",
        "working_set", "pingpong", "cpu_s_initiator", "cpu_s_target", "steal_pct"]
bad = 0
args = sys.argv[2:]
# te-bench's own row, when there is one: every key it has, ours has too.
if sys.argv[1]:
    te = json.loads(open(sys.argv[1]).read().splitlines()[-1])
    extra = sorted(set(te) - set(keys))
    print(f"{'ok' if not extra else 'FAIL'}: te-bench's JSON keys{': not mirrored: ' + str(extra) if extra else ''}")
    bad += bool(extra)
for i in range(0, len(args), 3):
    path, check, label = args[i:i + 3]
    lines = [l for l in open(path).read().splitlines() if l.strip()]
    why = None
    if len(lines) != 1:
        why = f"want one JSON row, got {len(lines)} lines"
    else:
        r = json.loads(lines[0])
        missing = [k for k in keys if k not in r]
        if missing:
            why = f"missing keys: {missing}"
        elif r["transport"] != "raw-tcp" or r["failed"] or r["interrupted"]:
            why = "failed, interrupted or not raw-tcp"
        elif r["requests"] != r["batches"] * r["batch"] or r["samples"] != r["batches"] or \
                r["bytes"] != r["requests"] * r["block_size"]:
            why = "counts do not add up"
        elif r["batches"] < 1 or not r["seconds"] > 0 or not r["gbps"] > 0:
            why = "nothing moved"
        elif not (0 < r["lat_us_p50"] <= r["lat_us_p99"] <= r["lat_us_p999"] <= r["lat_us_max"]):
            why = "percentiles out of order"
        elif r["steal_pct"] is not None and not 0 <= r["steal_pct"] <= 100:
            why = f"steal_pct {r['steal_pct']} is not a percentage"
        elif r["slices_per_send"] is not None and \
                not 1 <= r["slices_per_send"] <= r["batch"] * r["depth"]:
            why = f"slices_per_send {r['slices_per_send']} outside [1, batch x depth]"
        elif not eval(check):
            why = f"check failed: {check}"
    print(f"{'ok' if not why else 'FAIL'}: {label}{': ' + why if why else ''}")
    if why:
        bad += 1
        print(f"  row: {lines}")
sys.exit(1 if bad else 0)
PY
}

loop_part() {
	local op size conns batch

	for bad in "--loopback --depth 2 --verify" "--loopback --batch 0" "--loopback --op mix" \
		"--loopback --warmup -1" "--loopback --working-set 1K --block-size 4K" \
		"--loopback --block-size 2G" "--loopback --pingpong --batch 4" "" \
		"--loopback --client 127.0.0.1:1" "--client nohost" "--loopback --connections 300" \
		"--loopback --congestion nosuchcc"; do
		# shellcheck disable=SC2086 # word splitting intended
		run usage $bad
		[ "$rc" = 2 ] || fail "'$bad' exited $rc, want 2"
		grep -q "try --help" "$tmp/usage.err" || fail "'$bad' did not explain itself"
	done

	for op in read write; do
		for size in 4K 1M; do
			for conns in 1 2; do
				batch=128
				[ "$size" = 1M ] && batch=8
				run v --loopback --verify --json --quiet --duration 0.3 --op "$op" \
					--block-size "$size" --batch "$batch" --connections "$conns"
				[ "$rc" = 0 ] || fail "$op $size x$conns exited $rc"
				check_json "$tmp/v.out" "r['verify'] and r['verified'] and r['op'] == '$op' \
and r['threads'] == $conns == r['connections'] and r['batch'] == $batch and r['depth'] == 1 \
and r['block_size'] == (4096 if '$size' == '4K' else 1 << 20) \
and r['working_set'] == r['batch'] * r['block_size'] and r['mode'] == 'loopback'" \
					"$op $size x$conns"
			done
		done
	done

	# --congestion: reno is built into every Linux kernel.
	run cc --loopback --verify --json --quiet --duration 0.3 --congestion reno
	[ "$rc" = 0 ] || fail "--congestion reno exited $rc"
	check_json "$tmp/cc.out" "r['congestion'] == 'reno' and r['verified']" "--congestion reno"

	# Pipelined, without --verify: depth 4, and a working set of its own.
	run d --loopback --json --quiet --duration 0.3 --op write --block-size 64K --batch 16 \
		--depth 4 --working-set 2M
	[ "$rc" = 0 ] || fail "depth 4 exited $rc"
	check_json "$tmp/d.out" "r['depth'] == 4 and r['working_set'] == 2 << 20 and \
not r['verify'] and not r['verified']" "depth 4"

	# The text row: te-bench's header and a verified row.
	run text --loopback --verify --quiet --duration 0.2 --block-size 4K
	[ "$rc" = 0 ] || fail "text row exited $rc"
	head -1 "$tmp/text.out" | grep -Eq '^op +block +batch +thr +samples +GB/s +ops/s +avg_us +p50_us +p99_us +p999_us +transport +device +verified$' ||
		fail "text header differs from te-bench's"
	sed -n 2p "$tmp/text.out" | grep -Eq '^read +4K +128 +1 +[0-9]+ +[0-9.]+ +[0-9]+ .* raw-tcp +lo +yes$' ||
		fail "text row: unexpected shape"

	run pp --loopback --pingpong --json --quiet --duration 0.3
	[ "$rc" = 0 ] || fail "--pingpong exited $rc"
	check_json "$tmp/pp.out" "r['pingpong'] and r['batch'] == 1 and r['depth'] == 1 and \
r['block_size'] == 4096 and r['op'] == 'read' and r['batches'] == r['requests']" \
		"--pingpong"

	# --server and --client: a 64K buffer cannot hold 128 x 64K per half; 16M can.
	for buf in 64K 16M; do
		coproc srv { exec "$raw" --server 0 --buffer-size "$buf"; }
		# shellcheck disable=SC2154 # srv_PID is set by coproc
		server_pid=$srv_PID
		local line="" port=""
		read -r -t 60 line <&"${srv[0]}" || fail "--server printed nothing"
		port=${line#port: }
		[[ $port =~ ^[0-9]+$ ]] || fail "--server printed '$line', want 'port: N'"
		if [ "$buf" = 64K ]; then
			run small --client "127.0.0.1:$port" --duration 0.2
			[ "$rc" = 2 ] || fail "a working set larger than the server's buffer exited $rc, want 2"
			grep -q "do not fit" "$tmp/small.err" || fail "no 'do not fit' message"
		else
			run client --client "127.0.0.1:$port" --verify --json --quiet --duration 0.3 \
				--op write --block-size 16K
			[ "$rc" = 0 ] || fail "--client exited $rc"
			check_json "$tmp/client.out" "r['mode'] == 'client' and r['verified'] and \
r['segment'] == '127.0.0.1:$port' and r['cpu_s_target'] is not None and r['cpu_s_target'] >= 0" "--client"
		fi
		# EOF on its stdin ends the server.
		eval "exec ${srv[1]}>&-"
		wait "$server_pid"
		rc=$?
		server_pid=""
		[ "$rc" = 0 ] || fail "--server exited $rc after EOF on stdin"
	done
	# te-bench's JSON row, for its keys (needs the tcp plugin).
	te_row=""
	if [ -x "${TE_BUILD_ROOT:-}/tools/te-bench" ] && [ -e "$TE_BUILD_ROOT/plugins/tcp/tcp.so" ]; then
		echo "+ te-bench --loopback --json"
		timeout 120 "$TE_BUILD_ROOT/tools/te-bench" --loopback --json --quiet --duration 0.2 \
			--block-size 4K >"$tmp/te.out" 2>"$tmp/te.err" && te_row=$tmp/te.out
		[ -n "$te_row" ] || sed 's/^/  te-bench: /' "$tmp/te.err"
	fi
	check_all || fail "rows: see above"
	echo "PASS: tcp-raw-loop"
}

# run_table LIMIT MD OUT ERR CMD...: a compare script within LIMIT seconds, its stdout (the
# table) in OUT and shown, its stderr in ERR and shown indented; fails unless it exits 0 and
# its --md file MD holds what it printed.
run_table() {
	local limit=$1 md=$2 out=$3 err=$4
	shift 4
	timeout "$limit" "$@" >"$out" 2>"$err"
	rc=$?
	sed 's/^/  stderr: /' "$err"
	cat "$out"
	[ "$rc" = 0 ] || fail "$(basename "$1") exited $rc"
	cmp -s "$md" "$out" || fail "--md FILE differs from stdout"
}

compare_part() {
	local src=${TE_SOURCE_ROOT:?} build=${TE_BUILD_ROOT:?} table=$tmp/table.md

	[ -e "$build/plugins/tcp/tcp.so" ] || {
		echo "SKIP: the tcp plugin is not built"
		exit 77
	}
	echo "+ compare-tcp.sh --ops mix"
	"$src/bench/compare-tcp.sh" -C "$build" --ops mix >"$tmp/bad.out" 2>&1
	rc=$?
	[ "$rc" = 2 ] || fail "compare-tcp.sh --ops mix exited $rc, want 2"
	for args in "--congestion Bad!" "--congestion cubic --te-config $tmp/bad.out"; do
		# shellcheck disable=SC2086 # word splitting intended
		"$src/bench/compare-tcp.sh" -C "$build" $args >"$tmp/bad.out" 2>&1
		rc=$?
		[ "$rc" = 2 ] && grep -q -- "--congestion" "$tmp/bad.out" ||
			fail "compare-tcp.sh $args exited $rc, want 2 naming --congestion: $(cat "$tmp/bad.out")"
	done
	echo "+ compare-tcp.sh --quick --rounds 1"
	run_table 400 "$table" "$tmp/stdout.md" "$tmp/err" \
		"$src/bench/compare-tcp.sh" -C "$build" --quick --rounds 1 --md "$table"
	python3 - "$table" "$(command -v iperf3 || true)" <<'PY' || fail "table: see above"
import re, sys
text = open(sys.argv[1]).read()
iperf3 = bool(sys.argv[2])
rows = [l for l in text.splitlines() if l.startswith("| read") or l.startswith("| write")]
want = {(op, size, thr) for op in ("read", "write") for size in ("4K", "1M") for thr in ("1", "2")}
got = set()
num = r"\d+\.\d+"
for l in rows:
    c = [x.strip() for x in l.strip("|").split("|")]
    if len(c) != 15:
        sys.exit(f"row with {len(c)} columns: {l}")
    op, size, ws, thr, batch, te, raw, ip, r_raw, r_ip, cpu_te, cpu_raw, cs_te, cs_raw, steal = c
    # The hypervisor's share of the machine's CPU time: a median, or "median (min-max)".
    if not re.fullmatch(r"\d+( \(\d+-\d+\))?", steal):
        sys.exit(f"steal % is not a figure: {l}")
    if ws != "8M" or int(batch) * int(thr) * {"4K": 4096, "1M": 1 << 20}[size] != 8 << 20:
        sys.exit(f"working set or batch wrong: {l}")
    for name, v in (("te", te), ("raw", raw), ("te/raw", r_raw)):
        if not re.fullmatch(num, v):
            sys.exit(f"{name} is not a figure: {l}")
    for name, v in (("te CPU", cpu_te), ("raw CPU", cpu_raw), ("te cs/req", cs_te),
                    ("raw cs/req", cs_raw)):
        if not re.fullmatch(num + r"\*?", v):
            sys.exit(f"{name} is not a figure: {l}")
    if iperf3 and not (re.fullmatch(num, ip) and re.fullmatch(num, r_ip)):
        sys.exit(f"iperf3 is installed but its cells are empty: {l}")
    got.add((op, size, thr))
if got != want or len(rows) != len(want):
    sys.exit(f"rows {sorted(got)}, want {sorted(want)}")
for who in ("te", "raw"):
    if not re.search(rf"^\| {who} \| {num} \| {num} \| {num} \|$", text, re.M):
        sys.exit(f"no latency row for {who}")
if not re.search(r"load average [\d.]+ [\d.]+ [\d.]+ before, [\d.]+ [\d.]+ [\d.]+ after", text):
    sys.exit("no load averages")
if not re.search(r"other work on the machine meanwhile: \d+\.\d\d CPUs", text):
    sys.exit("no figure for the other work on the machine")
if not re.search(r"TCP congestion control [\w?]+ \(the host default\)", text):
    sys.exit("the host's TCP congestion control is not named")
print(f"table: {len(rows)} rows and the latency rows")
PY
	echo "PASS: compare-tcp.sh --quick"
}

# usage_errors SCRIPT: for each line WANT|ARGS on stdin, `SCRIPT -C $build ARGS` (the
# caller's build) must exit 2 with WANT in what it says on stderr.
usage_errors() {
	local script=$1 name want args rc

	name=$(basename "$script")
	while IFS='|' read -r want args; do
		# shellcheck disable=SC2086 # word splitting intended
		"$script" -C "$build" $args >"$tmp/u.out" 2>"$tmp/u.err"
		rc=$?
		[ "$rc" = 2 ] || fail "$name $args exited $rc, want 2"
		grep -q -- "$want" "$tmp/u.err" ||
			fail "$name $args: no '$want' in: $(cat "$tmp/u.err")"
		echo "ok: $args -> $(head -1 "$tmp/u.err")"
	done
}

rerun_part() {
	local src=${TE_SOURCE_ROOT:?} build=${TE_BUILD_ROOT:?} ct below
	ct=$src/bench/compare-tcp.sh

	[ -e "$build/plugins/tcp/tcp.so" ] || {
		echo "SKIP: the tcp plugin is not built"
		exit 77
	}
	usage_errors "$ct" <<USAGE
--rerun-rounds needs --rerun-below|--rerun-rounds 4
--rerun-below: a te/raw ratio|--rerun-below 0
--rerun-below: a te/raw ratio|--rerun-below 101
--rerun-rounds: 1 to 100|--rerun-below 0.9 --rerun-rounds 0
USAGE
	for below in 100 0.001; do
		echo "+ compare-tcp.sh 4K READ and WRITE, --rerun-below $below --rerun-rounds 2"
		run_table 300 "$tmp/r.md" "$tmp/r.out" "$tmp/r.err" \
			"$ct" -C "$build" --sizes 4K --working-sets 1M --threads 1 --ops read,write \
			--rounds 1 --duration 0.3 --no-iperf3 --no-latency --rerun-below "$below" \
			--rerun-rounds 2 --md "$tmp/r.md"
		python3 - "$tmp/r.md" "$tmp/r.err" "$below" <<'PY' || fail "--rerun-below $below: see above"
import re, sys
text, err, below = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
rerun = below == "100"
rows = [l for l in text.splitlines() if l.startswith("| read") or l.startswith("| write")]
if len(rows) != 2:
    sys.exit(f"{len(rows)} rows, want 2")
head = next((l for l in text.splitlines() if l.startswith("| op ")), "")
if "| te/raw | rounds |" not in head:
    sys.exit(f"no rounds column after te/raw: {head}")
for l in rows:
    c = [x.strip() for x in l.strip("|").split("|")]
    if len(c) != 16:
        sys.exit(f"row with {len(c)} columns: {l}")
    want = "3" if rerun else "1"
    if c[9] != want:
        sys.exit(f"rounds {c[9]}, want {want}: {l}")
    if rerun != c[8].endswith(" ²"):
        sys.exit(f"te/raw {'not ' if rerun else ''}marked ²: {l}")
    if rerun and not re.fullmatch(r"\d+\.\d+ \(\d+\.\d+-\d+\.\d+\) ²", c[8]):
        sys.exit(f"te/raw is not a median (min-max) of 3 rounds: {l}")
for op in ("read", "write"):
    runs = len(re.findall(rf"^(round|rerun) \S+ cell \S+ {op} 4K .*: te \d+\.\d+ raw \d+\.\d+", err, re.M))
    if runs != (3 if rerun else 1):
        sys.exit(f"{op}: {runs} rounds with te and raw figures on stderr, want {3 if rerun else 1}")
    listed = re.search(rf"^- {op} 4K ws 1M thr 1: \d+\.\d+ -> \d+\.\d+ \(", text, re.M)
    if rerun != bool(listed):
        sys.exit(f"{op}: {'not ' if rerun else ''}listed under the note")
if rerun and "² te/raw under 100 (--rerun-below) over the first 1 round(s): 2 more" not in text:
    sys.exit("no note on the rerun")
if rerun and "2 cell(s) 2 more (--rerun-below 100)" not in text:
    sys.exit("the first line does not say what was rerun")
if not rerun and "No cell under te/raw 0.001 (--rerun-below): none rerun." not in text:
    sys.exit("no note that none was rerun")
print(f"--rerun-below {below}: rows, rounds and notes as expected")
PY
	done
	echo "PASS: compare-tcp.sh --rerun-below"
}

sched_part() {
	local src=${TE_SOURCE_ROOT:?} build=${TE_BUILD_ROOT:?} st inst
	st=$src/bench/sched-trace.sh

	if [ ! -e "$build/plugins/tcp/tcp.so" ] || [ ! -x "$build/tools/te-bench" ]; then
		echo "SKIP: the tcp plugin or te-bench is not built"
		exit 77
	fi
	inst=/sys/kernel/tracing/instances/te-sched-probe-$$
	if ! mkdir "$inst" 2>/dev/null; then
		echo "SKIP: no writable tracefs with instances (/sys/kernel/tracing; needs root)"
		exit 77
	fi
	rmdir "$inst"
	usage_errors "$st" <<USAGE
--seconds: 0.1 to 60|--seconds 0
--settle: 1 to 600|--settle 0.5
is set by this script|-- --duration 3
exclude each other|--config $tmp/x.yaml --congestion cubic
the raw loop runs --op read or write|-- --op mix
unknown argument|--bogus
USAGE
	echo "+ sched-trace.sh --seconds 0.5 --settle 1 -- --op write --block-size 64K --batch 8 --threads 2"
	run_table 300 "$tmp/s.md" "$tmp/s.out" "$tmp/s.err" \
		"$st" -C "$build" --seconds 0.5 --settle 1 --md "$tmp/s.md" -- \
		--op write --block-size 64K --batch 8 --threads 2
	python3 - "$tmp/s.md" <<'PY' || fail "sched-trace table: see above"
import re, sys
text = open(sys.argv[1]).read()
parts = re.split(r"^\*\*(te-bench|tcp-raw-loop)\*\* ", text, flags=re.M)
sec = dict(zip(parts[1::2], parts[2::2]))
if set(sec) != {"te-bench", "tcp-raw-loop"}:
    sys.exit(f"sections {sorted(sec)}, want te-bench and tcp-raw-loop")
num = r"\d+\.\d+"
def row(s, name):
    m = re.search(rf"^\| {re.escape(name)} \| (\d+) \| ({num}) \| ({num}) \| ({num}) ?¹? \| ({num}) \|$", s, re.M)
    if not m:
        sys.exit(f"no row for '{name}' in: {s[:1500]}")
    return int(m.group(1)), [float(x) for x in m.groups()[1:]]
te = sec["te-bench"]
if not re.match(rf"`--op write --block-size 64K --batch 8 --threads 2`: \d+ requests/s, {num} GB/s", te):
    sys.exit(f"te's first line: {te.splitlines()[0]}")
n, v = row(te, "initiator bench-*")
if n != 2:
    sys.exit(f"initiator bench-*: {n} threads, want 2")
n, v = row(te, "target te-tcp-*")
if v[0] <= 0 or v[1] <= 0:
    sys.exit(f"target te-tcp-*: no CPU or no sleeps: {v}")
if not re.search(rf"^\| initiator \S+ -> target te-tcp-\* \| {num} \|$", te, re.M):
    sys.exit("no wake-ups of the target's tcp workers by the initiator")
if not re.search(r"^\| preempted: switched out <- ran next \(woken last by\) \| /1000 req \|$", te, re.M):
    sys.exit("no preemption table")
raw = sec["tcp-raw-loop"]
for side in ("initiator", "target"):
    n, v = row(raw, f"{side} tcp-raw-loop")
    if n < 2 or v[0] <= 0:
        sys.exit(f"raw loop {side}: {n} threads, CPU {v[0]}")
print("sched-trace: both sections, their threads, wake-ups and preemptions")
PY
	printf 'transports: [\n' >"$tmp/bad.yaml"
	timeout 120 "$st" -C "$build" --config "$tmp/bad.yaml" --seconds 0.5 -- --op write \
		>"$tmp/f.out" 2>"$tmp/f.err"
	rc=$?
	[ "$rc" = 1 ] || fail "a failing te-bench: exit $rc, want 1"
	grep -q "te-bench did not run" "$tmp/f.err" && grep -q "bad.yaml:2:1" "$tmp/f.err" ||
		fail "no reason for the failed run: $(cat "$tmp/f.err")"
	echo "ok: a malformed --config -> $(head -1 "$tmp/f.err")"
	for left in /sys/kernel/tracing/instances/te-sched-*; do
		[ -e "$left" ] && fail "a tracing instance was left behind: $left"
	done
	echo "PASS: sched-trace.sh"
}

builds_part() {
	local src=${TE_SOURCE_ROOT:?} build=${TE_BUILD_ROOT:?} cb rc
	cb=$src/bench/compare-builds.sh

	if [ ! -e "$build/plugins/tcp/tcp.so" ] || [ ! -x "$build/tools/te-bench" ]; then
		echo "SKIP: the tcp plugin or te-bench is not built"
		exit 77
	fi
	usage_errors "$cb" <<USAGE
want NAME=DIR|--te nothing
is not built|--te a=$tmp/nowhere
is taken|--te raw=$build
is taken|--te a=$build --te a=$build
no configuration file|--te a=$build@$tmp/none.yaml
--rounds: 1 to 1000|--rounds 0
is set by this script|-- --json
is set by this script|-- --config x.yaml
is not an algorithm name|--congestion Bad!
USAGE
	printf 'transports:\n  - name: tcp\n    required: true\n    options: {lanes: 1}\n' >"$tmp/one.yaml"
	echo "+ compare-builds.sh --te a=BUILD --te b=BUILD@one.yaml --rounds 2"
	run_table 300 "$tmp/t.md" "$tmp/t.out" "$tmp/t.err" \
		"$cb" -C "$build" --te "a=$build" --te "b=$build@$tmp/one.yaml" --rounds 2 \
		--md "$tmp/t.md" -- --op write --block-size 64K --batch 4 --threads 2 --iterations 30
	[ "$(grep -c '^round [12]/2: ' "$tmp/t.err")" = 2 ] || fail "want 2 round lines on stderr"
	python3 - "$tmp/t.out" <<'PY' || fail "table: see above"
import re, sys
text = open(sys.argv[1]).read()
num = r"\d+(\.\d+)?( \(\d+(\.\d+)?-\d+(\.\d+)?\))?"
rows = {}
for l in text.splitlines():
    c = [x.strip() for x in l.strip("|").split("|")] if l.startswith("| ") else []
    if c and c[0] in ("a", "b", "raw"):
        rows[c[0]] = c
if sorted(rows) != ["a", "b", "raw"]:
    sys.exit(f"rows {sorted(rows)}, want a, b, raw")
for name, c in rows.items():
    if len(c) != 8:
        sys.exit(f"{name}: {len(c)} columns")
    ops, gbps, vs_a, vs_raw, cpu, steal, failed = c[1:]
    for what, v in (("requests/s", ops), ("GB/s", gbps), ("vs a", vs_a), ("vs raw", vs_raw),
                    ("CPU us/req", cpu), ("steal", steal)):
        if not re.fullmatch(num, v):
            sys.exit(f"{name}: {what} is not a figure: '{v}'")
    # initiator + target CPU of the timed loops, per request: something, and not absurd
    # (30 batches of 4 x 64K on loopback take well under a CPU-millisecond per request)
    if not 0 < float(cpu.split()[0]) < 1000:
        sys.exit(f"{name}: CPU us/req {cpu}")
    if failed != "0":
        sys.exit(f"{name}: {failed} runs failed")
if rows["a"][3] != "1" or rows["raw"][4] != "1":
    sys.exit("a against itself and raw against itself must read 1")
if "--op write --block-size 64K --batch 4 --depth 1 --connections 2 --iterations 30" not in text:
    sys.exit("the raw loop did not get the cell's op, block, batch, depth, threads and iterations")
if not re.search(r"load average [\d.]+ [\d.]+ [\d.]+ before, [\d.]+ [\d.]+ [\d.]+ after", text):
    sys.exit("no load averages")
if not re.search(r"other work on the machine meanwhile \d+\.\d\d CPUs", text):
    sys.exit("no figure for the other work on the machine")
if not re.search(r"host TCP congestion control [\w?]+\.", text):
    sys.exit("the host's TCP congestion control is not named")
print("table: a, b and raw with figures")
PY
	# A batch that needs more than te-bench --loopback's default 256 MiB target: te-bench gets
	# the --buffer-size it needs (both halves: 2 x 129 MiB, 2 pages, rounded up to a MiB),
	# so it runs the batch asked, as the raw loop does; said on stderr and in the table's
	# first line (when a third of MemAvailable holds it; else the note below comes instead).
	timeout 120 "$cb" -C "$build" --te "a=$build" --rounds 1 --no-raw -- --op write \
		--block-size 1M --batch 129 --iterations 2 >"$tmp/g.out" 2>"$tmp/g.err" ||
		fail "a batch beyond 256 MiB: exit $?: $(cat "$tmp/g.err")"
	if [ "$(awk '/^MemAvailable:/ {print int($2 / 1024 / 3)}' /proc/meminfo)" -ge 259 ]; then
		grep -q "te-bench gets --buffer-size 271581184 (the batch asked needs more" \
			"$tmp/g.err" || fail "no --buffer-size for batch 129 of 1M: $(cat "$tmp/g.err")"
		grep -q "^te-bench --loopback .*--batch 129 .*--buffer-size 271581184;" "$tmp/g.out" ||
			fail "the table does not name the --buffer-size given: $(cat "$tmp/g.out")"
		grep -q "ran batch" "$tmp/g.err" "$tmp/g.out" &&
			fail "te-bench ran a smaller batch despite its --buffer-size: $(cat "$tmp/g.err")"
		echo "ok: a batch beyond 256 MiB runs with the --buffer-size it needs"
	else
		echo "note: less than 3 x 259 MiB available: no --buffer-size given; the note is checked"
	fi
	# te-bench runs a smaller batch than asked when its target buffer is too small (here a
	# --buffer-size given too small; none is added then): said on stderr and under the table
	# (the raw loop would run the batch asked)
	timeout 120 "$cb" -C "$build" --te "a=$build" --rounds 1 --no-raw -- --op write \
		--block-size 1M --batch 129 --iterations 2 --buffer-size 64M >"$tmp/r.out" \
		2>"$tmp/r.err" || fail "a reduced batch: exit $?: $(cat "$tmp/r.err")"
	grep -q "gets --buffer-size" "$tmp/r.err" &&
		fail "a --buffer-size added to one given: $(cat "$tmp/r.err")"
	grep -q "a ran batch [0-9]*, not 129 (its target buffer is full)" "$tmp/r.err" ||
		fail "no reduced-batch warning on stderr: $(cat "$tmp/r.err")"
	grep -q "^Note: a ran batch [0-9]*, not the 129 asked: .*Give --batch [0-9]* or a larger --buffer-size" "$tmp/r.out" ||
		fail "no reduced-batch note under the table: $(cat "$tmp/r.out")"
	grep -q "^Note:" "$tmp/t.out" && fail "a note where te ran the batch asked: $(cat "$tmp/t.out")"
	echo "ok: a reduced batch is noted"
	# --congestion reaches a variant without a configuration (the default one with the
	# option); one whose own configuration names none is said on stderr
	timeout 120 "$cb" -C "$build" --te "a=$build" --te "b=$build@$tmp/one.yaml" --rounds 1 \
		--no-raw --congestion reno -- --iterations 5 >"$tmp/c.out" 2>"$tmp/c.err" ||
		fail "--congestion reno: exit $?: $(cat "$tmp/c.err")"
	grep -q "^a: .* with the default configuration with congestion: reno; plugins from" \
		"$tmp/c.out" || fail "a did not get congestion reno: $(cat "$tmp/c.out")"
	grep -q "^b: .* with $tmp/one.yaml; plugins from" "$tmp/c.out" ||
		fail "b's configuration was replaced: $(cat "$tmp/c.out")"
	grep -q "variant b: $tmp/one.yaml sets no congestion: its te connections use the host's" \
		"$tmp/c.err" || fail "no word on b's congestion: $(cat "$tmp/c.err")"
	grep -q "variant a:" "$tmp/c.err" && fail "a warned about: $(cat "$tmp/c.err")"
	echo "ok: --congestion reaches te variants"
	# a variant whose runs fail: exit 1, counted, the reason on stderr
	printf 'transports: [\n' >"$tmp/bad.yaml"
	timeout 120 "$cb" -C "$build" --te "a=$build" --te "bad=$build@$tmp/bad.yaml" --rounds 1 \
		--no-raw -- --iterations 5 >"$tmp/f.out" 2>"$tmp/f.err"
	rc=$?
	cat "$tmp/f.err"
	[ "$rc" = 1 ] || fail "a failing variant: exit $rc, want 1"
	grep -q "round 1: bad failed (exit [1-9][0-9]*: .*bad.yaml:2:1: .*syntax error" "$tmp/f.err" ||
		fail "no reason for the failed run: $(cat "$tmp/f.err")"
	grep -q '^| bad | - | - | - | - | - | - | 1 |$' "$tmp/f.out" || fail "bad's row: $(cat "$tmp/f.out")"
	grep -q '^| a | [0-9]' "$tmp/f.out" || fail "a's row: $(cat "$tmp/f.out")"
	echo "PASS: compare-builds.sh"
}

insn_part() {
	local src=${TE_SOURCE_ROOT:?} build=${TE_BUILD_ROOT:?} it rc libs
	it=$src/bench/insn-tcp.sh

	if [ ! -e "$build/plugins/tcp/tcp.so" ] || [ ! -x "$build/tools/te-bench" ]; then
		echo "SKIP: the tcp plugin or te-bench is not built"
		exit 77
	fi
	if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
		echo "SKIP: valgrind is not installed"
		exit 77
	fi
	# ldd's output taken whole, then matched: under pipefail `ldd | grep -q` failed when grep
	# quit at the early match and ldd died of SIGPIPE, and a sanitizer build then ran
	# insn-tcp.sh, which refused it (once in CI).
	libs=$(ldd "$build/tools/te-bench" 2>/dev/null) || true
	if [[ $libs =~ lib(a|t|ub)san ]]; then
		echo "SKIP: a sanitizer build (valgrind cannot run it)"
		exit 77
	fi
	usage_errors "$it" <<USAGE
want NAME=DIR|--te nothing
is not built|--te a=$tmp/nowhere
is taken|--te raw=$build
is taken|--te a=$build --te a=$build
--iterations: 2 to 100000|--iterations 1
--iterations: 2 to 100000|--iterations x
--top: 0 to 1000|--top -1
is set by this script|-- --json
is set by this script|-- --duration 1
raw loop runs --op read or write|-- --op mix
unknown argument 'what'|what
USAGE
	echo "+ insn-tcp.sh --te a=BUILD --te b=BUILD --iterations 40 --top 3 -- --batch 32 --block-size 4K"
	timeout 600 "$it" -C "$build" --te "a=$build" --te "b=$build" --iterations 40 --top 3 -- \
		--op read --batch 32 --block-size 4K >"$tmp/i.out" 2>"$tmp/i.err"
	rc=$?
	cat "$tmp/i.out"
	[ "$rc" = 0 ] || fail "insn-tcp.sh exited $rc: $(tail -5 "$tmp/i.err")"
	python3 - "$tmp/i.out" <<'PY' || fail "insn-tcp.sh's table: see above"
import re, sys
text = open(sys.argv[1]).read()
rows, tops, cur = {}, {}, None
for l in text.splitlines():
    m = re.match(r"(\w+): the initiator's functions", l)
    if m:
        cur = m.group(1)
        tops[cur] = []
        continue
    c = [x.strip() for x in l.strip("|").split("|")] if l.startswith("| ") else []
    if not c or c[0] in ("variant", "function"):
        continue
    if cur:
        tops[cur].append(c)
    else:
        rows[c[0]] = c
if sorted(rows) != ["a", "b", "raw"]:
    sys.exit(f"rows {sorted(rows)}, want a, b, raw")
for name, c in rows.items():
    if len(c) != 7:
        sys.exit(f"{name}: {len(c)} columns")
    # requests: 20 more batches of 32 in the longer run; instructions: positive counts
    if c[1] != "640":
        sys.exit(f"{name}: {c[1]} requests counted, want 640 (20 batches of 32)")
    for what, v in zip(("initiator", "target", "both"), c[2:5]):
        if not re.fullmatch(r"\d+", v) or int(v) <= 0:
            sys.exit(f"{name}: {what} is not a positive count: '{v}'")
    if int(c[4]) != int(c[2]) + int(c[3]) and abs(int(c[4]) - int(c[2]) - int(c[3])) > 1:
        sys.exit(f"{name}: both {c[4]} is not initiator + target")
if rows["a"][5] != "1.000":
    sys.exit(f"a against itself: {rows['a'][5]}")
if sorted(tops) != ["a", "b", "raw"] or any(len(v) != 3 for v in tops.values()):
    sys.exit(f"top functions: {tops}")
te_fns = {f[0].split(".")[0] for f in tops["a"]}
if not te_fns & {"slice_submit_requests", "tcp_submit", "tcp_lane_rx_scatter", "tcp_lane_flush",
                 "slice_done", "tcp_lane_enqueue_locked"}:
    sys.exit(f"te's top functions are not te's: {te_fns}")
if not any(f[0].startswith("rl_") for f in tops["raw"]):
    sys.exit(f"the raw loop's top functions are not its own: {tops['raw']}")
print("table: a, b and raw with counts, each with its own top functions")
PY
	# a variant whose te-bench fails (a malformed configuration): exit 1, its log shown
	printf 'transports: [\n' >"$tmp/bad.yaml"
	timeout 300 "$it" -C "$build" --no-raw --iterations 2 -- --config "$tmp/bad.yaml" \
		>"$tmp/f.out" 2>"$tmp/f.err"
	rc=$?
	[ "$rc" = 1 ] || fail "a failing te-bench: exit $rc, want 1"
	grep -q "failed under callgrind" "$tmp/f.err" && grep -q "bad.yaml:2:1" "$tmp/f.err" ||
		fail "no reason for the failed run: $(cat "$tmp/f.err")"
	echo "PASS: insn-tcp.sh"
}

case "$part" in
loop) loop_part ;;
compare) compare_part ;;
rerun) rerun_part ;;
builds) builds_part ;;
insn) insn_part ;;
sched) sched_part ;;
*)
	echo "raw_loop_test.sh: unknown part '$part'"
	exit 2
	;;
esac
