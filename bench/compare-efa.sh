#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare-efa.sh: te-bench over efa against a raw libfabric RMA loop, in one run, with ratios.
#
# Usage: bench/compare-efa.sh [-C BUILD] [--check]
#   For each libfabric provider, block size and direction: ROUNDS measurements of fi-rma-loop
#   (raw fi_read/fi_writemsg from one thread, WINDOW operations kept in flight) and of
#   `te-bench --loopback --threads THREADS --depth DEPTH --batch WINDOW/(THREADS x DEPTH)`
#   over the efa plugin on the same provider: the same bound on operations in flight, and by
#   default one submitting thread like the raw loop, keeping 8 batches of 16 in flight so that
#   the pipe does not drain at a batch boundary (the raw loop never drains it). The two
#   alternate which runs first; then a table with the median GB/s of both and the median of
#   the per-round ratios te/raw (robust to load drifting between rounds), and the ratio of
#   the best rounds (load from other sessions only slows a run down, so the best round is
#   the nearest to what the code can do), and the hypervisor's steal during the rounds (the
#   share of the machine's CPU time given to other guests: where it is high, the rounds say
#   little), with the load average before and after and the steal of the whole run.
#   --check exits 1 when a median ratio is below MIN_RATIO.
#   Env: BUILD (build), PROVIDERS ("tcp;ofi_rxm shm"), SIZES ("64K 1M"), OPS ("read write"),
#   WINDOW (128), THREADS (1), DEPTH (8), DURATION (2 s per measurement), ROUNDS (7: on two
#   shared vCPUs single rounds ranged 0.68-1.26 at one setting, and a median of 3 moved by
#   0.1 between runs),
#   MIN_RATIO (0.9), EFA_OPTIONS (extra efa options for te, YAML flow-mapping entries, e.g.
#   "spin_us: 0").
set -euo pipefail

me=compare-efa.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"
check=0
for arg in ${args[@]+"${args[@]}"}; do
	case "$arg" in
	--check) check=1 ;;
	*) bad_arg "$arg" ;;
	esac
done
bench=$build/tools/te-bench
providers=${PROVIDERS:-"tcp;ofi_rxm shm"}
sizes=${SIZES:-64K 1M}
ops=${OPS:-read write}
window=${WINDOW:-128}
threads=${THREADS:-1}
depth=${DEPTH:-8}
duration=${DURATION:-2}
rounds=${ROUNDS:-7}
min_ratio=${MIN_RATIO:-0.9}
efa_options=${EFA_OPTIONS:-}


[ -x "$bench" ] || die "$bench is not built (run: ninja -C $build)"
[ $((window % (threads * depth))) = 0 ] ||
	die "WINDOW ($window) must be a multiple of THREADS x DEPTH ($threads x $depth)"
batch=$((window / (threads * depth)))
efa_so=$(find "$build/plugins" -name efa.so -print -quit 2>/dev/null || true)
[ -n "$efa_so" ] ||
	die "the efa plugin is not built (no efa.so under $build/plugins: libfabric-dev missing?)"
# bench/ since issue 15; next to the plugin before.
loop=$build/bench/fi-rma-loop
[ -x "$loop" ] || [ ! -x "$(dirname "$efa_so")/fi-rma-loop" ] || loop=$(dirname "$efa_so")/fi-rma-loop
[ -x "$loop" ] || die "$loop is not built"
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
export TE_PLUGIN_PATH="$(dirname "$efa_so")${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-compare-efa.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# json_key FILE KEY: KEY of the last JSON line of FILE.
json_key() {
	python3 -c 'import json, sys
print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"
}

# te_config PROVIDER FILE: engine YAML with the efa transport on PROVIDER.
te_config() {
	local extra=""
	[ -n "$efa_options" ] && extra=", $efa_options"
	cat >"$2" <<EOF
transports:
  - name: efa
    required: true
    options: {provider: "$1"$extra}
EOF
}

# run_raw PROVIDER SIZE OP: one fi-rma-loop measurement into $raw (GB/s).
run_raw() {
	"$loop" --provider "$1" --op "$3" --block-size "$2" --window "$window" \
		--duration "$duration" --json >"$tmp/raw.json" ||
		die "fi-rma-loop --provider '$1' --op $3 --block-size $2 failed"
	raw=$(json_key "$tmp/raw.json" gbps)
}

# run_te PROVIDER SIZE OP CONFIG: one te-bench measurement over efa into $te (GB/s).
run_te() {
	local tp
	"$bench" --loopback --config "$4" --op "$3" --block-size "$2" --batch "$batch" \
		--threads "$threads" --depth "$depth" --duration "$duration" --json --quiet >"$tmp/te.json" ||
		die "te-bench over efa ($1) --op $3 --block-size $2 failed"
	te=$(json_key "$tmp/te.json" gbps)
	tp=$(json_key "$tmp/te.json" transport)
	[ "$tp" = efa ] || die "te-bench used transport '$tp', not efa"
}

echo "fi-rma-loop (raw libfabric, window $window) vs te-bench --loopback over efa ($threads" \
	"thread(s) x depth $depth x batch $batch: at most $window in flight)," \
	"${duration} s per measurement, $rounds round(s); medians, and the median of the" \
	"per-round ratios (each round runs both back to back)"
case "$providers" in
*tcp* | *net* | *sockets*)
	# BBR paces loopback TCP: the raw loop's 64K WRITE ran 2.0-2.9 GB/s under bbr here and
	# 2.8-4.0 under cubic, with rounds falling to 1.3 GB/s in either program under bbr.
	cc=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown)
	echo "TCP congestion control: $cc (net.ipv4.tcp_congestion_control; it shapes loopback runs)"
	;;
esac
results=$tmp/results
: >"$results"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
run_mark=$(cpu_mark)
for prov in $providers; do
	cfg=$tmp/efa-$(echo "$prov" | tr -c 'a-z0-9\n' '_').yaml
	te_config "$prov" "$cfg"
	for s in $sizes; do
		for op in $ops; do
			for r in $(seq "$rounds"); do
				mark=$(cpu_mark)
				# Alternate which one runs first: load from other sessions drifts.
				if [ $((r % 2)) = 1 ]; then
					run_raw "$prov" "$s" "$op"
					run_te "$prov" "$s" "$op" "$cfg"
				else
					run_te "$prov" "$s" "$op" "$cfg"
					run_raw "$prov" "$s" "$op"
				fi
				steal=$(steal_since "$mark")
				echo "$prov|$s|$op|$raw|$te|$steal" >>"$results"
				echo "  $prov $s $op round $r: raw $raw GB/s, te $te GB/s; steal $steal %" >&2
			done
		done
	done
done

echo "load average $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after;" \
	"CPU time taken by the hypervisor (steal): $(steal_since "$run_mark") % of the run"
python3 - "$results" "$min_ratio" "$check" <<'PY'
import statistics, sys
rows, order, steal = {}, [], {}
for line in open(sys.argv[1]):
    prov, size, op, raw, te, st = line.strip().split("|")
    key = (prov, size, op)
    if key not in rows:
        rows[key] = ([], [])
        steal[key] = []
        order.append(key)
    rows[key][0].append(float(raw))
    rows[key][1].append(float(te))
    if st != "?":
        steal[key].append(float(st))
min_ratio, check = float(sys.argv[2]), sys.argv[3] == "1"
low = []
print(f"{'provider':<12} {'block':>6} {'op':<5} {'raw GB/s':>9} {'te GB/s':>9} {'te/raw':>7}"
      f"  {'min..max ratio':>15}  {'best te/best raw':>16}  {'steal %':>12}")
for key in order:
    raw, te = statistics.median(rows[key][0]), statistics.median(rows[key][1])
    ratios = [t / r for r, t in zip(*rows[key]) if r > 0]
    ratio = statistics.median(ratios) if ratios else float("nan")
    spread = f"{min(ratios):.2f}..{max(ratios):.2f}" if ratios else "-"
    # Load from other sessions only slows a run down: the best rounds tell capacity.
    best = max(rows[key][1]) / max(rows[key][0]) if max(rows[key][0]) > 0 else float("nan")
    flag = "" if ratio >= min_ratio else f"  < {min_ratio}"
    if ratio < min_ratio:
        low.append(key)
    st = steal[key]
    st = f"{statistics.median(st):.0f} ({min(st):.0f}-{max(st):.0f})" if st else "?"
    print(f"{key[0]:<12} {key[1]:>6} {key[2]:<5} {raw:9.3f} {te:9.3f} {ratio:7.2f}"
          f"  {spread:>15}  {best:16.2f}  {st:>12}{flag}")
print("steal %: CPU time the hypervisor took from this machine during each round (both runs),"
      " median (min-max) over the rounds")
if check and low:
    sys.exit(1)
PY
