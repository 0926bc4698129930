#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare_scripts_test.sh: bench/compare-cxl.sh and bench/compare-efa.sh end to end, short.
#
# Usage: compare_scripts_test.sh cxl|efa   (meson sets TE_SOURCE_ROOT and TE_BUILD_ROOT)
#   cxl: SIZES=64K DURATION=0.3 REPEAT=1 compare-cxl.sh; exit 0 and a table with a 64K read
#        and a 64K write row whose GB/s and ratios are figures above 0, over the cxl plugin.
#   efa: PROVIDERS=shm SIZES=64K DURATION=0.3 ROUNDS=1 compare-efa.sh (no --check: never a
#        speed assertion); the same for its table (raw GB/s, te GB/s, te/raw).
#   Both: a build without te-bench is refused with a message naming it (exit 1). These
#   scripts are not otherwise run by the suite: compare-cxl.sh once failed at its own check of
#   te-bench's options (grep -q and pipefail) and nothing noticed. Skips (77) without the
#   plugin.
set -uo pipefail

part=${1:?usage: compare_scripts_test.sh cxl|efa}
src=${TE_SOURCE_ROOT:?}
build=${TE_BUILD_ROOT:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-compare-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

# run SCRIPT ENV...: the script with ENV and -C $build; stdout in $tmp/out, stderr shown.
run() {
	local script=$1
	shift
	echo "+ $* bench/$script -C $build"
	env "$@" timeout 240 "$src/bench/$script" -C "$build" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	sed 's/^/  stderr: /' "$tmp/err"
	cat "$tmp/out"
}

# check_table KIND: the rows of $tmp/out for 64K read and write have figures above 0.
check_table() {
	python3 - "$1" "$tmp/out" <<'PY' || fail "table: see above"
import re, sys
kind, path = sys.argv[1], sys.argv[2]
num = re.compile(r"\d+\.\d+")
seen = set()
for line in open(path):
    c = line.split()
    if kind == "cxl" and len(c) >= 13 and c[0] == "64K":
        # block op batch memcpy te1 te/memcpy te2 te2/1 memcpy2 memcpy2/1 steal... transport
        op, figures = c[1], c[3:10]
        if c[-1] != "cxl":
            sys.exit(f"transport is not cxl: {line}")
    elif kind == "efa" and len(c) >= 8 and c[0] == "shm" and c[1] == "64K":
        # provider block op raw te te/raw min..max best steal
        op, figures = c[2], [c[3], c[4], c[5], c[7]]
    else:
        continue
    for f in figures:
        if not num.fullmatch(f) or float(f) <= 0:
            sys.exit(f"not a figure above 0 ({f!r}): {line}")
    seen.add(op)
if seen != {"read", "write"}:
    sys.exit(f"rows for 64K read and write: got {sorted(seen)}")
print(f"{kind}: table ok")
PY
}

case "$part" in
cxl)
	[ -n "$(find "$build/plugins" -name cxl.so -print -quit 2>/dev/null)" ] || {
		echo "SKIP: the cxl plugin is not built"
		exit 77
	}
	script=compare-cxl.sh
	run "$script" SIZES=64K DURATION=0.3 REPEAT=1
	[ "$rc" = 0 ] || fail "$script exited $rc"
	check_table cxl
	;;
efa)
	[ -n "$(find "$build/plugins" -name efa.so -print -quit 2>/dev/null)" ] || {
		echo "SKIP: the efa plugin is not built"
		exit 77
	}
	script=compare-efa.sh
	run "$script" PROVIDERS=shm SIZES=64K DURATION=0.3 ROUNDS=1
	[ "$rc" = 0 ] || fail "$script exited $rc"
	check_table efa
	;;
*)
	echo "compare_scripts_test.sh: unknown part '$part'"
	exit 2
	;;
esac

echo "+ bench/$script -C $tmp/nobuild"
"$src/bench/$script" -C "$tmp/nobuild" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ "$rc" = 1 ] || fail "$script -C (no build) exited $rc, want 1"
grep -qF "$tmp/nobuild/tools/te-bench is not built" "$tmp/out" ||
	fail "$script -C (no build): the error does not name te-bench"
echo "PASS"
