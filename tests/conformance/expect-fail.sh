#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# expect-fail.sh CHECK COMMAND...: run COMMAND (te-conformance against a broken plugin); it must
# exit 1, print "FAIL - CHECK: <why>" and end with its summary line.
set -u
check=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 1 ]; then
	echo "expect-fail: exit status $rc, want 1"
	exit 1
fi
if ! printf '%s\n' "$out" | grep -q "^FAIL - $check: "; then
	echo "expect-fail: no line 'FAIL - $check: ...'"
	exit 1
fi
if ! printf '%s\n' "$out" | tail -n 1 | grep -Eq '^[0-9]+ passed, [1-9][0-9]* failed$'; then
	echo "expect-fail: the last line is not the summary 'N passed, N failed'"
	exit 1
fi
echo "expect-fail: $check failed, as it must"
