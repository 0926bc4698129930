#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare-cxl.sh: te-bench over the cxl plugin (1 and 2 workers) vs memcpy in one run, with ratios.
#
# Usage: bench/compare-cxl.sh [-C BUILD]
#   Creates a window file under /dev/shm; then for each block size (64K 1M 4M 16M 64M) and
#   direction, `te-bench --loopback` with the cxl plugin (threads: 1, then threads: 2; the
#   target buffer is the window file, registered as cxl:0) and memcpy of the same blocks
#   between anonymous memory and the same file (build/bench/cxl-memcpy, same layout and
#   batch) by 1 thread, and by 2 as a control of what a second core gives right now, REPEAT
#   times in turn; then a table with the median GB/s of each, te/memcpy (1 thread) and the
#   2-thread/1-thread ratios of te and of memcpy, and the hypervisor's steal during the
#   repeats (the share of the machine's CPU time given to other guests: where it is high, the
#   figures say little), with the load average before and after and the whole run's steal. Env: BUILD (build), SIZES, DURATION (2 s per
#   measurement), REPEAT (3), BATCH (64), WINDOW_DIR (/dev/shm), TE_PLUGIN_PATH (searched
#   after the cxl plugin's build directory).
set -euo pipefail

me=compare-cxl.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"
no_args
bench=$build/tools/te-bench
memcpy_bin=$build/bench/cxl-memcpy
# tests/cxl/ before issue 15
[ -x "$memcpy_bin" ] || [ ! -x "$build/tests/cxl/cxl-memcpy" ] || memcpy_bin=$build/tests/cxl/cxl-memcpy
sizes=${SIZES:-64K 1M 4M 16M 64M}
duration=${DURATION:-2}
repeat=${REPEAT:-3}
batch=${BATCH:-64}
window_dir=${WINDOW_DIR:-/dev/shm}
# te-bench's target buffer: READs use its first half, WRITEs its second half.
window_size=$((256 << 20))


[ -x "$bench" ] || die "$bench is not built (run: ninja -C $build)"
[ -x "$memcpy_bin" ] || die "$memcpy_bin is not built (run: ninja -C $build)"
cxl_so=$(find "$build/plugins" -name cxl.so -print -quit 2>/dev/null || true)
[ -n "$cxl_so" ] || die "the cxl plugin is not built (no cxl.so under $build/plugins); it is what this script measures"
# The whole help first: grep -q stops reading at the match, and under pipefail a te-bench
# still writing its help (more than one stdio buffer) then fails the pipeline on SIGPIPE.
bench_help=$("$bench" --help 2>&1 || true)
grep -q -- --target-file <<<"$bench_help" ||
	die "$bench has no --target-file/--location options: it cannot put its target buffer in a window (see 'te-bench and the window' in plugins/cxl/README.md)"
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
export TE_PLUGIN_PATH="$(dirname "$cxl_so")${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-compare-cxl.XXXXXX")
window=$(mktemp "$window_dir/te-compare-cxl.XXXXXX")
cleanup() {
	rm -f "$window"
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
truncate -s "$window_size" "$window"

for t in 1 2; do
	cat >"$tmp/cxl-$t.yaml" <<EOF
engine: {listen: "127.0.0.1:0"}
transports:
  - name: cxl
    required: true
    options: {device: "$window", threads: $t}
EOF
done

# te_row SIZE read|write THREADS OUT: te-bench --loopback over cxl, its JSON row in OUT.
te_row() {
	"$bench" --loopback --config "$tmp/cxl-$3.yaml" --target-file "$window" --location cxl:0 \
		--buffer-size "$window_size" --op "$2" --block-size "$1" --batch "$batch" \
		--threads 1 --duration "$duration" --json --quiet >"$4" ||
		die "te-bench --loopback (cxl, threads: $3) --op $2 --block-size $1 failed (rc $?)"
}

json_key() {
	python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"
}

median() {
	python3 -c 'import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"
}

echo "te-bench --loopback over cxl ($cxl_so) vs memcpy, window $window ($((window_size >> 20)) MiB): ${duration} s each, median of $repeat, batch $batch"
rows=()
load0=$(cut -d' ' -f1-3 /proc/loadavg)
run_mark=$(cpu_mark)
for s in $sizes; do
	for op in read write; do
		mgs=() m2s=() t1s=() t2s=() steals=()
		# Interleaved, so that load from elsewhere hits all three alike.
		for r in $(seq "$repeat"); do
			mark=$(cpu_mark)
			te_row "$s" "$op" 1 "$tmp/te1.json"
			t1s+=("$(json_key "$tmp/te1.json" gbps)")
			# The batch te-bench used (it shrinks it to fit the buffer): memcpy copies
			# the same blocks.
			b=$(json_key "$tmp/te1.json" batch)
			tp=$(json_key "$tmp/te1.json" transport)
			"$memcpy_bin" --window "$window" --op "$op" --block "$s" --batch "$b" \
				--duration "$duration" >"$tmp/memcpy.json" ||
				die "cxl-memcpy --op $op --block $s failed"
			mgs+=("$(json_key "$tmp/memcpy.json" gbps)")
			te_row "$s" "$op" 2 "$tmp/te2.json"
			t2s+=("$(json_key "$tmp/te2.json" gbps)")
			"$memcpy_bin" --window "$window" --op "$op" --block "$s" --batch "$b" \
				--threads 2 --duration "$duration" >"$tmp/memcpy2.json" ||
				die "cxl-memcpy --threads 2 --op $op --block $s failed"
			m2s+=("$(json_key "$tmp/memcpy2.json" gbps)")
			steals+=("$(steal_since "$mark")")
		done
		rows+=("$s $op $b $(median "${mgs[@]}") $(median "${t1s[@]}") $(median "${t2s[@]}") $(median "${m2s[@]}") $tp $(IFS=,; echo "${steals[*]}")")
		echo "  measured $s $op: memcpy ${mgs[*]}; te 1 thread ${t1s[*]}; te 2 threads ${t2s[*]}; memcpy 2 threads ${m2s[*]}; steal ${steals[*]} %" >&2
	done
done

echo "load average $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after;" \
	"CPU time taken by the hypervisor (steal): $(steal_since "$run_mark") % of the run"
python3 - "${rows[@]}" <<'PY'
import statistics, sys
def ratio(a, b, w):
    return f"{a / b:{w}.2f}" if b > 0 else f"{'-':>{w}}"

print(f"{'block':>6} {'op':<5} {'batch':>5} {'memcpy':>7} {'te 1thr':>8} {'te/memcpy':>9}"
      f" {'te 2thr':>8} {'te 2/1':>7} {'memcpy 2thr':>11} {'memcpy 2/1':>10}  {'steal %':>12}"
      f"  transport")
for row in sys.argv[1:]:
    size, op, batch, mg, t1, t2, m2, tp, st = row.split()
    mg, t1, t2, m2 = float(mg), float(t1), float(t2), float(m2)
    st = [float(x) for x in st.split(",") if x != "?"]
    st = f"{statistics.median(st):.0f} ({min(st):.0f}-{max(st):.0f})" if st else "?"
    print(f"{size:>6} {op:<5} {batch:>5} {mg:7.3f} {t1:8.3f} {ratio(t1, mg, 9)}"
          f" {t2:8.3f} {ratio(t2, t1, 7)} {m2:11.3f} {ratio(m2, mg, 10)}  {st:>12}  {tp}")
print("GB/s = 10^9 bytes/s, medians; te/memcpy: 1 thread each; 2/1: 2 threads over 1;"
      " steal %: CPU time the hypervisor took from this machine during each repeat (all four"
      " runs), median (min-max)")
PY
