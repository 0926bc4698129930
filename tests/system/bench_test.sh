#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_test.sh: te-bench end to end: --core over the loopback test transport, --loopback over tcp.
#
# Usage: bench_test.sh TE_BENCH core|loopback
#   core:     usage errors exit 2 naming the bad value; `--core --duration 0.5 --verify --json`
#             exits 0 with a verified row that moved slices.
#   loopback: `--loopback --verify --duration 1 --block-size 64K --json`, for read and write,
#             exits 0 with verified rows over tcp; skipped (77) when tcp.so is not built.
# Needs TE_PLUGIN_PATH (the meson test environment sets it) and python3.
set -uo pipefail

bench=${1:?usage: bench_test.sh TE_BENCH core|loopback}
part=${2:?usage: bench_test.sh TE_BENCH core|loopback}
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
import json, sys
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
    if not eval(check, {}, {"r": r}):
        sys.exit(f"row fails {check}: {r}")
PY
}

case "$part" in
core)
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

	for op in write read; do
		run core-$op --core --op $op --duration 0.5 --verify --json
		[ "$rc" = 0 ] || fail "--core --op $op: status $rc"
		check_rows "$tmp/core-$op.out" 1 \
			"r['slices'] > 0 and r['slices_per_s'] > 0 and r['transport'] == 'loopback' and r['op'] == '$op'" ||
			fail "--core --op $op: bad JSON row"
	done
	# --iterations is exact: the callgrind baseline depends on it.
	run core-iter --core --iterations 10 --batch 8 --json
	[ "$rc" = 0 ] || fail "--core --iterations 10: status $rc"
	python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(r["iterations"] != 10 or r["slices"] != 80)' \
		"$tmp/core-iter.out" || fail "--core --iterations 10 --batch 8 did not run 80 slices"
	;;
loopback)
	found=""
	IFS=: read -r -a dirs <<<"${TE_PLUGIN_PATH:-}"
	for d in "${dirs[@]}"; do
		[ -n "$d" ] && [ -e "$d/tcp.so" ] && found=$d/tcp.so && break
	done
	if [ -z "$found" ]; then
		echo "SKIP: tcp.so is not built (not found in TE_PLUGIN_PATH=${TE_PLUGIN_PATH:-})"
		exit 77
	fi
	for op in write read; do
		run loop-$op --loopback --op $op --verify --duration 1 --block-size 64K --json
		[ "$rc" = 0 ] || fail "--loopback --op $op: status $rc"
		check_rows "$tmp/loop-$op.out" 1 \
			"r['bytes'] > 0 and r['block_size'] == 65536 and r['transport'] != '' and r['op'] == '$op'" ||
			fail "--loopback --op $op: bad JSON row"
	done
	# --depth keeps batches in flight and still runs exactly --iterations of them.
	run loop-depth --loopback --op mix --depth 3 --iterations 7 --batch 4 --block-size 4K --json
	[ "$rc" = 0 ] || fail "--loopback --depth 3: status $rc"
	python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
sys.exit(not (r["depth"] == 3 and r["batches"] == 7 and r["requests"] == 28 and r["bytes"] == 28 * 4096))' \
		"$tmp/loop-depth.out" || fail "--depth 3 --iterations 7 --batch 4 did not move 7 batches of 4 x 4K"
	;;
*)
	echo "usage: bench_test.sh TE_BENCH core|loopback" >&2
	exit 2
	;;
esac
echo "PASS"
