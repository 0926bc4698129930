#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# compare-rdma.sh: perftest (ib_write_bw/ib_read_bw) against te-bench over rdma, in one boot.
#
# Usage: bench/compare-rdma.sh [-C BUILD]
#   On an RDMA device (inside the soft-RoCE QEMU guest: `scripts/qemu-rxe/run-suite.sh --bench`
#   boots one and runs this script there), for each block size and direction: ib_write_bw or
#   ib_read_bw with -s SIZE -t DEPTH, and `te-bench --loopback --op write|read --block-size SIZE
#   --batch DEPTH` over rdma (default options: 64 KiB slices), alternating, ROUNDS times; then
#   the best and the median GB/s of each and the ratios te/perftest, and the hypervisor's steal
#   during the rounds (the share of the guest's CPU time given elsewhere: where it is high, the
#   rounds say little; QEMU's TCG guest always reads 0: the host's steal is invisible to it),
#   with the load average and the steal of the whole run. On a machine without RDMA
#   devices it boots the guest (QEMU, Debian's kernel, rxe) to run itself there.
#   Env: DEVICE (rxe_lo), SIZES ("64K:128 1M:16" = size:depth), DURATION (3 s), ROUNDS (3),
#   MIN_RATIO (0.9; STRICT=1 makes a lower ratio exit 1), BUILD.
# POSIX sh: the guest has busybox only.
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$top/build}
[ "${1:-}" = -C ] && build=$2
case "$build" in /*) ;; *) build=$top/$build ;; esac

if ! ls /sys/class/infiniband/ 2>/dev/null | grep -q .; then
	echo "compare-rdma.sh: no RDMA device here; running it in the soft-RoCE QEMU guest"
	exec "$top/scripts/qemu-rxe/run-suite.sh" -C "$build" --bench
fi

dev=${DEVICE:-rxe_lo}
sizes=${SIZES:-64K:128 1M:16}
dur=${DURATION:-3}
rounds=${ROUNDS:-3}
min_ratio=${MIN_RATIO:-0.9}
bench=$build/tools/te-bench
export TE_PLUGIN_PATH="$build/plugins/rdma:$build/plugins/tcp${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"
tmp=/tmp/compare-rdma.$$
mkdir -p "$tmp"
# cpu_mark, steal_since (the guest gets it next to this script: scripts/qemu-rxe/run-suite.sh)
. "$top/bench/steal.bash"

# The RoCE v2 GID perftest uses: what the plugin chooses too (IPv4-mapped if any).
gidx=0
for g in /sys/class/infiniband/$dev/ports/1/gids/*; do
	case "$(cat "$g" 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*)
		gidx=${g##*/}
		break
		;;
	esac
done

cat >"$tmp/te.yaml" <<CONF
engine: {listen: "127.0.0.1:0"}
transports:
  - name: rdma
    required: true
    options: {devices: "$dev"}
CONF

bytes() {
	case "$1" in
	*K) echo $((${1%K} * 1024)) ;;
	*M) echo $((${1%M} * 1048576)) ;;
	*) echo "$1" ;;
	esac
}

# Wait until TCP port $1 listens (perftest exchanges QP data over TCP before the run).
wait_listen() {
	hex=$(printf ':%04X' "$1")
	i=0
	while [ $i -lt 300 ]; do
		grep -q "$hex 00000000:0000 0A" /proc/net/tcp 2>/dev/null && return 0
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}

port=18600
# perftest OP SIZE DEPTH: GB/s (10^9 bytes/s) of the average bandwidth.
perftest() {
	tool=ib_$1_bw
	port=$((port + 1))
	args="-d $dev -x $gidx -F -s $(bytes "$2") -t $3 -D $dur -p $port --report_gbits"
	$tool $args >"$tmp/srv.log" 2>&1 &
	spid=$!
	wait_listen $port || { kill $spid 2>/dev/null; echo 0; return; }
	$tool $args 127.0.0.1 >"$tmp/cli.log" 2>&1
	wait $spid
	awk -v s="$(bytes "$2")" '$1 == s && NF >= 4 { printf "%.4f\n", $4 / 8; found = 1 }
		END { if (!found) print 0 }' "$tmp/cli.log" | tail -n 1
}

# tebench OP SIZE DEPTH: GB/s.
tebench() {
	"$bench" --loopback --config "$tmp/te.yaml" --op "$1" --block-size "$2" --batch "$3" \
		--duration "$dur" --json --quiet >"$tmp/te.json" 2>"$tmp/te.err" ||
		{ cat "$tmp/te.err" >&2; echo 0; return; }
	sed -n 's/.*"gbps": *\([0-9.eE+-]*\).*/\1/p' "$tmp/te.json" | tail -n 1
}

echo "compare-rdma.sh: $dev (gid $gidx), ${dur} s per run, $rounds rounds alternating," \
	"te-bench over rdma with default options"
results=""
load0=$(cut -d' ' -f1-3 /proc/loadavg)
run_mark=$(cpu_mark)
for sd in $sizes; do
	size=${sd%:*}
	depth=${sd#*:}
	for op in write read; do
		pv_all=""
		tv_all=""
		st_all=""
		r=0
		while [ $r -lt "$rounds" ]; do
			mark=$(cpu_mark)
			pv=$(perftest $op "$size" "$depth")
			tv=$(tebench $op "$size" "$depth")
			st=$(steal_since "$mark")
			echo "  $op $size depth $depth round $r: ib_${op}_bw $pv GB/s, te-bench $tv GB/s;" \
				"steal $st %"
			pv_all="$pv_all $pv"
			tv_all="$tv_all $tv"
			st_all="$st_all $st"
			r=$((r + 1))
		done
		results="$results $op:$size:$depth:$(echo $pv_all | tr ' ' ,):$(echo $tv_all | tr ' ' ,)"
		results="$results:$(echo $st_all | tr ' ' ,)"
	done
done

# best (largest), least or median of a comma-separated list
pick() {
	echo "$1" | tr , '\n' | sort -n | awk -v what="$2" '{ v[NR] = $1 } END {
		if (what == "best") print v[NR];
		else if (what == "least") print v[1];
		else if (NR % 2) print v[(NR + 1) / 2];
		else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

status=0
echo
echo "load average $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; CPU time taken by" \
	"the hypervisor (steal): $(steal_since "$run_mark") % of the run"
echo "GB/s = 10^9 bytes/s; ratio = te / perftest of the best round (median rounds alongside);" \
	"steal %: during each round (both runs), median (min-max)"
printf '%-6s %6s %6s %10s %10s %6s   %10s %10s %6s  %s\n' op block depth "ib best" "te best" \
	ratio "ib median" "te median" ratio "steal %"
for row in $results; do
	IFS=: read -r op size depth pl tl sl <<ROW
$row
ROW
	pb=$(pick "$pl" best)
	tb=$(pick "$tl" best)
	pm=$(pick "$pl" median)
	tm=$(pick "$tl" median)
	rb=$(awk -v p="$pb" -v t="$tb" 'BEGIN { if (p > 0) printf "%.2f", t / p; else print "-" }')
	rm_=$(awk -v p="$pm" -v t="$tm" 'BEGIN { if (p > 0) printf "%.2f", t / p; else print "-" }')
	# "?" rounds (no /proc/stat) left out
	sk=$(echo "$sl" | tr , '\n' | grep -v '?' | tr '\n' , | sed 's/,$//')
	if [ -n "$sk" ]; then
		st="$(pick "$sk" median | awk '{ printf "%.0f", $1 }')"
		st="$st ($(pick "$sk" least | awk '{ printf "%.0f", $1 }')-$(pick "$sk" best |
			awk '{ printf "%.0f", $1 }'))"
	else
		st="?"
	fi
	printf '%-6s %6s %6s %10.3f %10.3f %6s   %10.3f %10.3f %6s  %s\n' "$op" "$size" "$depth" \
		"$pb" "$tb" "$rb" "$pm" "$tm" "$rm_" "$st"
	if [ "$rb" = - ] || awk -v r="$rb" -v m="$min_ratio" 'BEGIN { exit !(r < m) }'; then
		echo "  below $min_ratio: $op $size"
		[ "${STRICT:-0}" = 1 ] && status=1
	fi
done
rm -rf "$tmp"
exit $status
