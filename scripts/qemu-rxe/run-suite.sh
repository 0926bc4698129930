#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run-suite.sh: the hw-rxe suite: te's rdma tests on real verbs (soft-RoCE) in a QEMU guest.
#
# Usage: scripts/qemu-rxe/run-suite.sh [-C BUILD] [--bench] [--only CHECK[,CHECK]] [--verbose]
#   Fetches Debian's stock kernel (cached in BUILD/qemu-rxe/kernel), builds an initramfs with
#   busybox, the verbs userspace, the rxe provider, te's test binaries and the dlopen()ed
#   plugins (cached in BUILD/qemu-rxe/initrd.gz while its inputs are unchanged), boots it under
#   QEMU TCG and prints the guest's checks. The last line is `N passed, N failed`.
#   --bench runs bench/compare-rdma.sh in the guest instead of the checks; --only runs the named
#   checks; --verbose logs the te engines at debug level; --guest-cmd CMD runs CMD (sh) in the
#   guest once the rxe devices are up, instead of the checks (for experiments).
#   Exit: 0 all passed; 1 a check failed or the guest broke; 77 when QEMU, busybox or a kernel
#   cannot be had (the suite is skipped). Environment: SMP, MEM, TIMEOUT (boot.sh), TE_RXE_KVM.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$top/build
mode=suite
only=""
verbose=0
guest_cmd=
while [ $# -gt 0 ]; do
	case "$1" in
	-C)
		build=$2
		shift
		;;
	--bench) mode=bench ;;
	--only)
		only=$2
		shift
		;;
	--verbose) verbose=1 ;;
	--guest-cmd)
		guest_cmd=$2
		mode=cmd
		shift
		;;
	-h | --help)
		sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "run-suite.sh: unknown argument '$1'" >&2
		exit 2
		;;
	esac
	shift
done
build=$(cd "$build" 2>/dev/null && pwd) || {
	echo "run-suite.sh: no build directory $build" >&2
	exit 2
}
cache=$build/qemu-rxe
mkdir -p "$cache"

skip() {
	echo "run-suite.sh: SKIP: $*"
	echo "0 passed, 0 failed"
	exit 77
}

for tool in qemu-system-x86_64 cpio modprobe depmod gzip ldd; do
	command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed (scripts/install-deps.sh)"
done
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 || skip "busybox-static is not installed"
[ -e /etc/libibverbs.d/rxe.driver ] || skip "ibverbs-providers (the rxe provider) is not installed"

libte=$(find "$build/core" -maxdepth 1 -name 'libte.so.*.*' -print -quit)
# The plugins are dlopen()ed: ldd of the programs never lists them.
elfs="$build/plugins/rdma/rdma.so $build/plugins/tcp/tcp.so $build/tests/rdma/rdma-guest"
# te-conformance finds its shim next to its executable and starts its targets from
# /proc/self/exe: both at their build paths.
elfs="$elfs $build/tools/te-bench $build/tools/te-conformance $build/tools/te-conformance-shim.so"
elfs="$elfs $libte ${TE_RXE_EXTRA_ELFS:-}"
for f in $elfs; do
	[ -e "$f" ] || {
		echo "run-suite.sh: $f is not built (ninja -C $build)" >&2
		echo "0 passed, 1 failed"
		exit 1
	}
done
files="$top/bench/compare-rdma.sh $top/bench/steal.bash ${TE_RXE_EXTRA_FILES:-}"

t0=$(date +%s.%N)
kernel_env=$("$here/fetch-kernel.sh" "$cache/kernel") ||
	skip "no kernel (apt-get download of linux-image-amd64 failed)"
eval "$kernel_env"
t1=$(date +%s.%N)

# The guest script: paths first, then the suite.
{
	echo "export BUILD=$build"
	echo "export SRC=$top"
	[ -n "$guest_cmd" ] && printf 'GUEST_CMD=%q\n' "$guest_cmd"
	# bench/compare-rdma.sh knobs travel into the guest.
	for v in SIZES DURATION ROUNDS MIN_RATIO STRICT DEVICE; do
		eval "[ -n \"\${$v:-}\" ] && printf 'export %s=%q\n' $v \"\${$v}\""
	done
	cat "$here/guest-suite.sh"
} >"$cache/test.sh"

# Rebuild the initramfs only when an input changed.
stamp=$({
	echo "$KVER"
	sha256sum "$here"/make-initrd.sh "$cache/test.sh" $elfs $files
} | sha256sum | cut -d' ' -f1)
if [ ! -e "$cache/initrd.gz" ] || [ "$(cat "$cache/initrd.stamp" 2>/dev/null)" != "$stamp" ]; then
	KROOT=$KROOT KVER=$KVER OUT=$cache/initrd.gz GUEST_SCRIPT=$cache/test.sh ELFS="$elfs" \
		FILES="$files" "$here/make-initrd.sh" || {
		echo "run-suite.sh: cannot build the initramfs" >&2
		echo "0 passed, 1 failed"
		exit 1
	}
	echo "$stamp" >"$cache/initrd.stamp"
fi
t2=$(date +%s.%N)

log=$cache/console-$mode.log
kargs=""
[ "$mode" = bench ] && kargs="te.mode=bench"
[ -n "$only" ] && kargs="$kargs te.only=$only"
[ "$verbose" = 1 ] && kargs="$kargs te.verbose=1"
"$here/boot.sh" "$KERNEL" "$cache/initrd.gz" "$log" "$kargs"
rc=$?
t3=$(date +%s.%N)

# The guest's output, then the timing and the counts.
grep -v '^@@T ' "$log" | sed -n '/^@@GUEST-EXIT/!p'
passed=$(grep -c '^@@PASS ' "$log")
failed=$(grep -c '^@@FAIL ' "$log")
init=$(sed -n 's/^@@T init \([0-9.]*\)/\1/p' "$log" | head -n 1)
ready=$(sed -n 's/^@@T rxe-ready \([0-9.]*\)/\1/p' "$log" | head -n 1)
done_t=$(sed -n 's/^@@T done \([0-9.]*\)/\1/p' "$log" | head -n 1)
wall=$(sed -n 's/^@@HOST wall=\([0-9.]*\).*/\1/p' "$log" | tail -n 1)
echo
echo "hw-rxe ($mode): kernel $KVER; guest /init at ${init:-?} s," \
	"rxe devices ready at ${ready:-?} s," \
	"checks done at ${done_t:-?} s (guest uptime); QEMU wall ${wall:-?} s"
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN {
	printf "hw-rxe: kernel fetch %.1f s, initramfs %.1f s, boot+suite %.1f s, total %.1f s\n",
		b - a, c - b, d - c, d - a }'
if [ "$mode" = suite ]; then
	for n in $(sed -n 's/^@@FAIL //p' "$log"); do
		echo "FAILED: $n"
	done
	if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
		echo "run-suite.sh: the guest ended with status $rc (see $log)" >&2
		failed=1
	fi
	echo "$passed passed, $failed failed"
	[ "$failed" = 0 ] && [ "$rc" = 0 ]
	exit $?
fi
exit "$rc"
