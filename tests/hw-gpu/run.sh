#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run.sh: the nvlink plugin on a real NVIDIA GPU: its tests against the real driver, and te-bench
# GPU to GPU (two processes, one GPU, CUDA IPC) next to cuMemcpyDtoD bandwidth in the same run.
#
# Usage: tests/hw-gpu/run.sh [BUILD_DIR]        (default: $TE_BUILD_DIR, else <tree>/build)
#
# Needs the NVIDIA driver (libcuda.so.1) and a meson build of this tree with nvlink (a cuda.h
# of CUDA >= 12.0 when it was configured): an existing build folder travels with the tree, or
# one is made here with the installed meson, ninja and compiler; nothing comes from a registry.
# Exits 77 (skip) without a driver or GPU, or without an nvlink build; 0 when every nvlink case
# passed (cases that need the fake driver's faults skip) and both bandwidth figures were taken;
# 1 otherwise. Every step has a time limit: the whole run stays under 5 minutes.
#
# On a GPU machine without te's build dependencies, carry a bundle (tests/hw-gpu/bundle.sh
# BUILD OUT) and run: LD_LIBRARY_PATH=OUT/lib TE_HW_GPU_NO_BUILD=1 tests/hw-gpu/run.sh OUT/build
#
# Environment: TE_CUDA_LIBRARY  the driver to load [libcuda.so.1] (a fake's path smoke-tests
#                               this script on a machine without a GPU)
#              TE_HW_GPU_SECONDS seconds per bandwidth run [3]
#              TE_HW_GPU_BLOCK   bytes per request of the bandwidth runs [64M]
#              TE_HW_GPU_NO_BUILD=1  use the build folder as it is (meson test sets it)
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${TE_BUILD_DIR:-$root/build}}
lib=${TE_CUDA_LIBRARY:-libcuda.so.1}
secs=${TE_HW_GPU_SECONDS:-3}
block=${TE_HW_GPU_BLOCK:-64M}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-hw-gpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

skip() {
	echo "SKIP: $*"
	exit 77
}

fail() {
	echo "FAIL: $*"
	exit 1
}

# Seconds a step may take: at most @1, and what is left of the run's 290 s.
limit() {
	local left=$((290 - SECONDS))
	[ "$left" -gt 5 ] || fail "out of time (the run must end within 5 minutes)"
	echo $(($1 < left ? $1 : left))
}

bytes() { # 64M -> 67108864
	numfmt --from=iec "$1" 2>/dev/null || echo "$1"
}

# --- the build ------------------------------------------------------------------------------
if [ ! -f "$build/build.ninja" ]; then
	command -v meson >/dev/null && command -v ninja >/dev/null ||
		skip "no build in $build, and no meson/ninja here to make one"
	echo "+ meson setup $build (no build folder yet)"
	timeout "$(limit 120)" meson setup "$build" "$root" >"$tmp/setup.log" 2>&1 ||
		{ tail -20 "$tmp/setup.log"; fail "meson setup"; }
fi
if [ -z "${TE_HW_GPU_NO_BUILD:-}" ] && command -v ninja >/dev/null; then
	echo "+ ninja -C $build"
	timeout "$(limit 150)" ninja -C "$build" >"$tmp/ninja.log" 2>&1 || { tail -20 "$tmp/ninja.log"; fail "ninja"; }
fi
nvlink_so=$build/plugins/nvlink/nvlink.so
dtod=$build/tests/hw-gpu/dtod_bw
tests=$build/tests/gpu/gpu_test
bench=$build/tools/te-bench
for f in "$nvlink_so" "$dtod" "$tests" "$bench" "$build/tests/system/te-node"; do
	[ -e "$f" ] || skip "$f is not built (nvlink needs cuda.h at configure time: -Dcuda-include=DIR)"
done

# --- the driver -----------------------------------------------------------------------------
probe=$("$dtod" --probe --library "$lib" 2>&1)
case $? in
0) ;;
77) skip "no usable NVIDIA driver or GPU: $probe" ;;
*) fail "probing the driver: $probe" ;;
esac
gpus=${probe#gpus: }
echo "driver $lib: $gpus GPU(s)"

status=0

# --- the nvlink tests against the real driver -----------------------------------------------
echo "+ gpu_test (nvlink, real driver, $gpus GPU(s))"
FAKECUDA_LIB=$lib TE_NVLINK_REAL=1 TE_NVLINK_GPUS=$gpus TE_GPU_WATCHDOG_S=150 \
	TE_PLUGIN_PATH="$build/plugins/nvlink:$build/plugins/tcp" TE_BUILD_ROOT="$build" \
	timeout "$(limit 170)" "$tests" --tap >"$tmp/tests.tap" 2>"$tmp/tests.err"
rc=$?
grep -E '^(ok|not ok)' "$tmp/tests.tap"
if [ $rc -ne 0 ] || grep -q '^not ok' "$tmp/tests.tap"; then
	# The failing case's steps and messages (TAP comments), then its error.
	grep '^#' "$tmp/tests.tap" | tail -30
	tail -40 "$tmp/tests.err"
	echo "nvlink tests: FAILED (exit $rc)"
	status=1
else
	echo "nvlink tests: $(grep -c '^ok' "$tmp/tests.tap") ok ($(grep -c '# SKIP' "$tmp/tests.tap") skipped: they need the fake driver)"
fi

# --- te-bench GPU to GPU next to cuMemcpyDtoD -------------------------------------------------
cat >"$tmp/nvlink.yaml" <<YAML
transports:
  - name: nvlink
    required: true
    options: {library: "$lib"}
log:
  level: warn
YAML
echo "+ dtod_bw --size $block --seconds $secs"
timeout "$(limit 60)" "$dtod" --library "$lib" --size "$(bytes "$block")" --seconds "$secs" | tee "$tmp/dtod.out" ||
	{ echo "dtod_bw failed"; status=1; }
base=$(sed -n 's/.*: \([0-9.]*\) GB\/s$/\1/p' "$tmp/dtod.out")
for op in write read; do
	echo "+ te-bench --loopback --op $op --block-size $block (target cuda:0 in a child process, initiator cuda:0)"
	TE_PLUGIN_PATH="$build/plugins/nvlink" timeout "$(limit 90)" "$bench" --loopback --config "$tmp/nvlink.yaml" \
		--location cuda:0 --local-location cuda:0 --op "$op" --block-size "$block" --batch 4 \
		--duration "$secs" --json >"$tmp/bench-$op.json" 2>"$tmp/bench-$op.err"
	rc=$?
	if [ $rc -ne 0 ]; then
		cat "$tmp/bench-$op.err"
		echo "te-bench $op failed (exit $rc)"
		status=1
		continue
	fi
	gbps=$(sed -n 's/.*"gbps" *: *\([0-9.e+-]*\).*/\1/p' "$tmp/bench-$op.json" | head -1)
	echo "te-bench nvlink $op: $gbps GB/s; cuMemcpyDtoD: ${base:-?} GB/s; ratio $(awk -v a="$gbps" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }')"
done
echo "+ te-bench --loopback --verify (correctness of the same path, short)"
TE_PLUGIN_PATH="$build/plugins/nvlink" timeout "$(limit 60)" "$bench" --loopback --config "$tmp/nvlink.yaml" \
	--location cuda:0 --local-location cuda:0 --op mix --block-size 1M --batch 8 --duration 1 \
	--verify --quiet >"$tmp/verify.out" 2>&1 || { cat "$tmp/verify.out"; echo "te-bench --verify failed"; status=1; }
exit $status
