#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run-tests.sh: run meson test for the given suites and print `N passed, N failed`
# counted from meson's JSON test log (one meson test = one count; skips are neither).
#
# Usage: scripts/run-tests.sh [-C BUILDDIR] SUITE... [-- EXTRA MESON TEST ARGS]
#   BUILDDIR defaults to $BUILD or build. The last line of output is always the count;
#   the exit status is non-zero when anything failed (or meson test itself failed).
set -uo pipefail

builddir=${BUILD:-build}
suites=()
extra=()
while [ $# -gt 0 ]; do
	case "$1" in
	-C)
		builddir=$2
		shift 2
		;;
	--)
		shift
		extra=("$@")
		break
		;;
	-h | --help)
		sed -n '3,9p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		suites+=("$1")
		shift
		;;
	esac
done
if [ ${#suites[@]} -eq 0 ]; then
	echo "run-tests.sh: name at least one suite" >&2
	exit 2
fi

if ! command -v python3 >/dev/null 2>&1; then
	echo "run-tests.sh: python3 is needed to read the test log (scripts/install-deps.sh)" >&2
	echo "0 passed, 1 failed"
	exit 1
fi

# A log name of its own, removed first: a stale log must never be counted.
logbase="run-tests-$(IFS=-; printf '%s' "${suites[*]}" | tr -c 'A-Za-z0-9_-' '_')"
logjson="$builddir/meson-logs/$logbase.json"
rm -f "$logjson"

args=(test -C "$builddir" --print-errorlogs --logbase "$logbase")
for s in "${suites[@]}"; do
	args+=(--suite "$s")
done

echo "== meson ${args[*]} ${extra[*]}"
meson "${args[@]}" "${extra[@]}"
rc=$?

counts=$(python3 - "$logjson" <<'PY'
import json, os, sys
path = sys.argv[1]
passed = failed = skipped = 0
bad = []
if os.path.exists(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                t = json.loads(line)
            except ValueError:
                continue
            r = t.get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:
                failed += 1
                bad.append("%s (%s)" % (t.get("name", "?"), r))
for b in bad:
    print("FAILED: " + b, file=sys.stderr)
print(passed, failed, skipped)
PY
)
read -r passed failed skipped <<<"${counts:-0 0 0}"

if [ "$rc" -ne 0 ] && [ "${failed:-0}" -eq 0 ]; then
	# meson test failed without a failing test: build error, bad option, crash.
	echo "run-tests.sh: meson test exited $rc with no failing test recorded" >&2
	failed=1
fi
if [ "${passed:-0}" -eq 0 ] && [ "${failed:-0}" -eq 0 ]; then
	echo "run-tests.sh: no tests ran in suites: ${suites[*]}" >&2
fi
[ "${skipped:-0}" -gt 0 ] && echo "$skipped skipped (suites: ${suites[*]})"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
