#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare-gpu.sh: GPU paths against their baselines in one run, interleaved round by round.
#
# Usage: bench/compare-gpu.sh [-C BUILD]
#   1. Per-slice overhead: `te-bench --core` over the loopback test transport (host memory) vs
#      the same batch (64-byte READs, batches of 64, one thread) over nvlink with cuda:0
#      buffers on both sides. Without CUDA_LIB (a real libcuda.so.1) nvlink loads the fake
#      driver of the tests (build/tests/gpu/fakecuda) with FAKECUDA_INLINE_COPIES=1, so the
#      driver costs next to nothing and the figure is te's own.
#   2. Staging over tcp: `te-bench --loopback` at BLOCK (1M) READs and WRITEs between two
#      processes, host memory on both sides vs cuda:0 on both sides (nvlink loaded
#      memory_only: the core stages the initiator's side, the target's tcp serves its side
#      through staging buffers), every byte verified in the last round.
#   REPEAT (5) rounds, each runs every case once for DURATION (2) seconds; then the medians,
#   the ratios (GPU path / baseline), the machine's load average before and after, and the
#   hypervisor's steal (the share of the machine's CPU time given to other guests) over the
#   run and per case (median of te-bench's steal_pct over the rounds).
set -euo pipefail

me=compare-gpu.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"
no_args
bench=$build/tools/te-bench
repeat=${REPEAT:-5}
duration=${DURATION:-2}
block=${BLOCK:-1M}


[ -x "$bench" ] || die "$bench is not built (run: ninja -C $build)"
[ -f "$build/plugins/nvlink/nvlink.so" ] || die "nvlink is not built (no cuda.h at configure time?)"
[ -f "$build/tests/plugins/loopback.so" ] || die "the loopback test transport is not built"
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
if [ -n "${CUDA_LIB:-}" ]; then
	lib=$CUDA_LIB
	driver="real driver $lib"
else
	lib=$build/tests/gpu/fakecuda/libcuda.so.1
	[ -f "$lib" ] || die "no fake driver at $lib"
	export FAKECUDA_INLINE_COPIES=1
	driver="fake driver (inline copies)"
fi
export TE_PLUGIN_PATH="$build/plugins/nvlink:$build/plugins/tcp:$build/tests/plugins"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-compare-gpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

cat >"$tmp/nv-core.yaml" <<EOF
transports: [{name: nvlink, required: true, options: {library: "$lib"}}]
EOF
cat >"$tmp/tcp.yaml" <<EOF
engine: {listen: "127.0.0.1:0"}
transports: [{name: tcp, required: true}]
EOF
cat >"$tmp/tcp-gpu.yaml" <<EOF
engine: {listen: "127.0.0.1:0"}
transports:
  - {name: nvlink, required: true, memory_only: true, options: {library: "$lib"}}
  - {name: tcp, required: true}
EOF

# case name -> te-bench arguments
declare -A runs=(
	[core-loopback]="--core"
	[core-nvlink]="--core -c $tmp/nv-core.yaml --location cuda:0 --local-location cuda:0"
	[tcp-cpu-read]="--loopback -c $tmp/tcp.yaml -o read -b $block"
	[tcp-gpu-read]="--loopback -c $tmp/tcp-gpu.yaml -o read -b $block --location cuda:0 --local-location cuda:0"
	[tcp-cpu-write]="--loopback -c $tmp/tcp.yaml -o write -b $block"
	[tcp-gpu-write]="--loopback -c $tmp/tcp-gpu.yaml -o write -b $block --location cuda:0 --local-location cuda:0"
)
order="core-loopback core-nvlink tcp-cpu-read tcp-gpu-read tcp-cpu-write tcp-gpu-write"

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run_mark=$(cpu_mark)
echo "# $driver; $repeat rounds of ${duration}s per case; load before: $load_before" >&2
for r in $(seq 1 "$repeat"); do
	for c in $order; do
		verify=
		[ "$r" = "$repeat" ] && case $c in tcp-*) verify=--verify ;; esac
		# shellcheck disable=SC2086 # word splitting of the argument list is wanted
		if ! "$bench" ${runs[$c]} $verify -d "$duration" --json -q >"$tmp/$c.$r.json" 2>"$tmp/$c.$r.err"; then
			cat "$tmp/$c.$r.err" >&2
			die "round $r: te-bench ${runs[$c]} failed"
		fi
		echo "# round $r $c done" >&2
	done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
steal=$(steal_since "$run_mark")

python3 - "$tmp" "$repeat" "$load_before" "$load_after" "$driver" "$block" "$steal" <<'EOF'
import json, statistics, sys
tmp, repeat, lb, la, driver, block, steal = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def rows(case):
    out = []
    for r in range(1, repeat + 1):
        with open(f"{tmp}/{case}.{r}.json") as f:
            lines = [json.loads(l) for l in f if l.strip().startswith("{")]
        out.append(lines[-1])
    return out
def med(case, key):
    return statistics.median(x[key] for x in rows(case))
def steal_of(case):
    st = [x["steal_pct"] for x in rows(case) if x.get("steal_pct") is not None]
    return f"{statistics.median(st):.0f}" if st else "?"
print(f"GPU paths vs baselines ({driver}); {repeat} interleaved rounds; load {lb} -> {la};"
      f" CPU time taken by the hypervisor (steal): {steal} % of the run")
print()
lo, nv = med("core-loopback", "ns_per_slice"), med("core-nvlink", "ns_per_slice")
print("| per-slice overhead (te-bench --core, 64 B READs, batch 64) | ns/slice (median) | steal % |")
print("|---|---|---|")
print(f"| loopback transport, host memory | {lo:.1f} | {steal_of('core-loopback')} |")
print(f"| nvlink, cuda:0 to cuda:0 | {nv:.1f} | {steal_of('core-nvlink')} |")
print(f"| **ratio nvlink / loopback** | **{nv / lo:.2f}** | |")
print()
print(f"| tcp at {block}, two processes | host memory GB/s | cuda:0 staged GB/s | ratio | steal % (host, cuda:0) |")
print("|---|---|---|---|---|")
for op in ("read", "write"):
    c, g = med(f"tcp-cpu-{op}", "gbps"), med(f"tcp-gpu-{op}", "gbps")
    dev = rows(f"tcp-gpu-{op}")[-1].get("device", "")
    ok = rows(f"tcp-gpu-{op}")[-1].get("verified")
    print(f"| {op} | {c:.2f} | {g:.2f} | **{g / c:.2f}** |"
          f" {steal_of(f'tcp-cpu-{op}')}, {steal_of(f'tcp-gpu-{op}')} |")
    if "(staged)" not in dev or not ok:
        sys.exit(f"compare-gpu.sh: the {op} GPU run was not staged and verified ({dev}, verified={ok})")
EOF
