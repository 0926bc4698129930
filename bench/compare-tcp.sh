#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare-tcp.sh: te-bench --loopback over tcp against iperf3 on loopback, in one run, with ratios.
#
# Usage: bench/compare-tcp.sh [-C BUILD]
#   For each block size (4K, 64K, 1M) and direction, one iperf3 measurement on 127.0.0.1
#   (-l block size, -P threads streams; write = client sends, read = -R, server sends) and
#   one `te-bench --loopback --op read|write` with the same block size and threads; then a
#   table with GB/s of both and the ratio te/iperf3, and the 4 KiB batch-128 request rate.
#   Env: BUILD (build), SIZES ("4K 64K 1M"), THREADS (1), DURATION (3 s per measurement),
#   BATCH (128), TE_PLUGIN_PATH (searched after the tcp plugin's build directory).
set -euo pipefail

build=${BUILD:-build}
while [ $# -gt 0 ]; do
	case "$1" in
	-C)
		build=$2
		shift
		;;
	-h | --help)
		sed -n '3,10p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "compare-tcp.sh: unknown argument '$1' (try --help)" >&2
		exit 2
		;;
	esac
	shift
done

top=$(cd "$(dirname "$0")/.." && pwd)
case "$build" in
/*) ;;
*) build=$top/$build ;;
esac
bench=$build/tools/te-bench
sizes=${SIZES:-4K 64K 1M}
threads=${THREADS:-1}
duration=${DURATION:-3}
batch=${BATCH:-128}

die() {
	echo "compare-tcp.sh: $*" >&2
	exit 1
}

[ -x "$bench" ] || die "$bench is not built (run: ninja -C $build)"
tcp_so=$(find "$build/plugins" -name tcp.so -print -quit 2>/dev/null || true)
[ -n "$tcp_so" ] || die "the tcp plugin is not built (no tcp.so under $build/plugins); it is what this script measures"
command -v iperf3 >/dev/null || die "iperf3 is not installed (scripts/install-deps.sh installs it)"
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
tcp_dir=$(dirname "$tcp_so")
export TE_PLUGIN_PATH="$tcp_dir${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-compare-tcp.XXXXXX")
server_pid=""
cleanup() {
	# Only the iperf3 server this script started, by its pid.
	if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

bytes_of() {
	python3 -c '
import sys
s = sys.argv[1]
m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
print(int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$1"
}

# iperf3_run SIZE read|write OUT: one measurement against a fresh one-off server; sets
# $gbps to the GB/s (10^9 bytes/s) received. Not run in a subshell: cleanup must see the pid.
iperf3_run() {
	local len port
	local rev=()
	len=$(bytes_of "$1")
	port=$(free_port)
	[ "$2" = read ] && rev=(-R)
	iperf3 -s -1 -B 127.0.0.1 -p "$port" >"$tmp/iperf3-server.log" 2>&1 &
	server_pid=$!
	for _ in $(seq 100); do
		ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN && break
		kill -0 "$server_pid" 2>/dev/null || die "iperf3 server did not start: $(cat "$tmp/iperf3-server.log")"
		sleep 0.05
	done
	iperf3 -c 127.0.0.1 -p "$port" -t "$duration" -l "$len" -P "$threads" "${rev[@]}" -J \
		>"$3" 2>"$tmp/iperf3-client.err" || die "iperf3 client failed: $(cat "$tmp/iperf3-client.err" "$3" | tail -5)"
	wait "$server_pid" 2>/dev/null || true
	server_pid=""
	gbps=$(python3 - "$3" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d:
    sys.exit("iperf3: " + d["error"])
print(d["end"]["sum_received"]["bits_per_second"] / 8 / 1e9)
PY
	) || die "cannot read iperf3's result $3"
}

# te_row SIZE read|write BATCH OUT: runs te-bench --loopback, leaves its JSON row in OUT.
te_row() {
	"$bench" --loopback --op "$2" --block-size "$1" --batch "$3" --threads "$threads" \
		--duration "$duration" --json --quiet >"$4" ||
		die "te-bench --loopback --op $2 --block-size $1 failed (rc $?)"
}

json_key() {
	python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"
}

# iperf3 cycles one cache-hot buffer of -l bytes; te-bench moves batch x block bytes per
# side. Cap te's batch so its working set stays within 8 MiB (cache-sized, like
# iperf3's buffer plus socket buffers): 4K and 64K keep the batch, 1M runs batch 8.
batch_for() { # SIZE -> batch
	local bytes
	bytes=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1")
	local cap=$(((8 << 20) / bytes))
	[ "$cap" -lt 1 ] && cap=1
	if [ "$batch" -lt "$cap" ]; then echo "$batch"; else echo "$cap"; fi
}

echo "te-bench --loopback (tcp: $tcp_so) vs iperf3 on 127.0.0.1: ${duration} s each, $threads thread(s)/stream(s), batch $batch (capped at 8 MiB per batch)"
rows=()
for s in $sizes; do
	for op in read write; do
		iperf3_run "$s" "$op" "$tmp/iperf3-$s-$op.json"
		ig=$gbps
		te_row "$s" "$op" "$(batch_for "$s")" "$tmp/te-$s-$op.json"
		tg=$(json_key "$tmp/te-$s-$op.json" gbps)
		tp=$(json_key "$tmp/te-$s-$op.json" transport)
		rows+=("$s $op $ig $tg $tp")
		echo "  measured $s $op" >&2
	done
done

# The request rate at 4 KiB, batch 128: what small KV-cache blocks see.
if [ "$batch" = 128 ] && [ -e "$tmp/te-4K-read.json" ]; then
	te_ops=$(json_key "$tmp/te-4K-read.json" ops_per_s)
else
	te_row 4K read 128 "$tmp/te-4k-ops.json"
	te_ops=$(json_key "$tmp/te-4k-ops.json" ops_per_s)
fi
if [ -e "$tmp/iperf3-4K-read.json" ]; then
	ig4=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8 / 1e9)' "$tmp/iperf3-4K-read.json")
else
	iperf3_run 4K read "$tmp/iperf3-4k-ops.json"
	ig4=$gbps
fi

python3 - "$te_ops" "$ig4" "${rows[@]}" <<'PY'
import sys
te_ops, ig4 = float(sys.argv[1]), float(sys.argv[2])
print(f"{'block':>6} {'op':<5} {'iperf3 GB/s':>12} {'te GB/s':>10} {'te/iperf3':>10}  transport")
for row in sys.argv[3:]:
    size, op, ig, tg, tp = row.split()
    ig, tg = float(ig), float(tg)
    ratio = f"{tg / ig:10.2f}" if ig > 0 else f"{'-':>10}"
    print(f"{size:>6} {op:<5} {ig:12.3f} {tg:10.3f} {ratio}  {tp}")
ig4_ops = ig4 * 1e9 / 4096
ratio = f"{te_ops / ig4_ops:.2f}" if ig4_ops > 0 else "-"
print(f"4K batch 128 read: te {te_ops:,.0f} ops/s; iperf3 {ig4_ops:,.0f} 4 KiB messages/s; ratio {ratio}")
PY
