#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# insn-tcp.sh: user-space instructions per request of te over tcp, initiator and target, by callgrind.
#
# Usage: bench/insn-tcp.sh [-C BUILD] [--te NAME=DIR ...] [--iterations N] [--top K] [--no-raw]
#            [-- TE-BENCH-ARGS...]
#   A figure for changes too small for a throughput comparison to resolve (one in a hundred
#   of the CPU a request costs; compare-builds.sh rounds swing by more). It counts user-space
#   instructions only: at 4 KiB on loopback they are about an eighth of a request's CPU, the
#   kernel's copies, switches and wake-ups the rest (bench/README.md, 2026-12-06 19:13), so a
#   cut here may move no throughput figure at all (13 % fewer moved none). Every variant (a
#   build directory with tools/te-bench and plugins/tcp/tcp.so; default: BUILD as 'te') runs
#   `te-bench --loopback` under valgrind's callgrind, its target process too
#   (--trace-children), twice: with --iterations N (default 200) and N/2. Setup, warm-up and
#   teardown are the same in both runs, so the difference in instructions executed (Ir) over
#   the difference in requests moved is what one request costs each process in user space
#   (te, the tcp plugin, libc; the kernel is not counted).
#   TE-BENCH-ARGS: the cell (--op, --block-size, --batch, --threads, --depth, --config ...);
#   default READ 4K, batch 128, 2 threads. --iterations and the mode are set here.
#   The baseline: BUILD's tcp-raw-loop --loopback on the same cell (op, block size, batch,
#   depth, one connection per thread; its client and forked server counted alike), unless
#   --no-raw.
#   Output: per variant, instructions per request of the initiator and of the target and
#   their ratios against the first variant; then, per variant, the --top K (default 12)
#   functions of the initiator by their own instructions per request (0: none).
#   Waiting threads spin a while before they sleep, and under valgrind, which runs one thread
#   at a time, how long varies: the spin's share (progress_wait, batch_wait_spin,
#   batch_is_terminal) is shown apart and left out of the totals. Repeated runs of one build
#   agree to about 1 %. Exit 1 when a run fails, 2 on a usage error.
set -euo pipefail
me=insn-tcp.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"
command -v valgrind >/dev/null || die "valgrind is needed (apt install valgrind)"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate is needed (valgrind's)"
command -v python3 >/dev/null || die "python3 is needed"

usage() {
	echo "$me: $* (try --help)" >&2
	exit 2
}

iterations=200
top_k=12
raw=1
specs=()
bench_args=()
while [ ${#args[@]} -gt 0 ]; do
	case "${args[0]}" in
	--te | --iterations | --top)
		[ ${#args[@]} -ge 2 ] || usage "${args[0]} needs a value"
		case "${args[0]}" in
		--te) specs+=("${args[1]}") ;;
		--iterations) iterations=${args[1]} ;;
		--top) top_k=${args[1]} ;;
		esac
		args=("${args[@]:2}")
		continue
		;;
	--no-raw) raw=0 ;;
	--)
		bench_args=("${args[@]:1}")
		break
		;;
	*) bad_arg "${args[0]}" ;;
	esac
	args=("${args[@]:1}")
done
[[ "$iterations" =~ ^[0-9]+$ ]] && [ "$iterations" -ge 2 ] && [ "$iterations" -le 100000 ] ||
	usage "--iterations: 2 to 100000"
[[ "$top_k" =~ ^[0-9]+$ ]] && [ "$top_k" -le 1000 ] || usage "--top: 0 to 1000"
for x in ${bench_args[@]+"${bench_args[@]}"}; do
	case "$x" in
	--json | -j | --loopback | --initiator | --target | --core | --iterations | -n | --duration | -d | --iterations=* | --duration=*)
		usage "'$x' is set by this script"
		;;
	esac
done
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--op read --block-size 4K --batch 128 --threads 2)
[ ${#specs[@]} -gt 0 ] || specs=("te=$build")

# The raw loop's arguments: the cell's op, block size, batch, depth and threads (benchlib.py).
raw_args=()
if [ "$raw" = 1 ]; then
	[ -x "$build/bench/tcp-raw-loop" ] || usage "$build/bench/tcp-raw-loop is not built (or give --no-raw)"
	mapped=$(python3 "$top/bench/benchlib.py" raw-loop-args "${bench_args[@]}" 2>&1) ||
		usage "$mapped"
	mapfile -t raw_args <<<"$mapped"
fi

names=()
dirs=()
for spec in "${specs[@]}"; do
	name=${spec%%=*}
	dir=${spec#*=}
	[ "$name" != "$spec" ] && [ -n "$name" ] && [ -n "$dir" ] || usage "--te '$spec': want NAME=DIR"
	for n in raw ${names[@]+"${names[@]}"}; do
		[ "$n" != "$name" ] || usage "--te '$spec': the name '$name' is taken"
	done
	case "$dir" in
	/*) ;;
	*) dir=$PWD/$dir ;;
	esac
	[ -x "$dir/tools/te-bench" ] || usage "--te '$spec': $dir/tools/te-bench is not built"
	[ -e "$dir/plugins/tcp/tcp.so" ] || usage "--te '$spec': $dir/plugins/tcp/tcp.so is not built"
	names+=("$name")
	dirs+=("$dir")
done

# sanitized EXE: whether EXE is built with a sanitizer's runtime, which valgrind cannot run.
# ldd's output is taken whole, then matched: under pipefail, `ldd | grep -q` fails when grep
# quits at an early match and ldd dies of SIGPIPE.
sanitized() {
	local libs

	libs=$(ldd "$1" 2>/dev/null) || true
	[[ $libs =~ lib(a|t|ub)san ]]
}
for exe in ${dirs[@]+"${dirs[@]/%//tools/te-bench}"} ${raw_args[@]+"$build/bench/tcp-raw-loop"}; do
	! sanitized "$exe" || die "$exe is built with a sanitizer, which valgrind cannot run: use a plain build"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-insn-tcp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

half=$((iterations / 2))
[ "$raw" = 0 ] || names+=(raw)
for i in "${!names[@]}"; do
	name=${names[$i]}
	for n in "$half" "$iterations"; do
		out=$tmp/$i.$n
		if [ "$name" = raw ]; then
			cmd=("$build/bench/tcp-raw-loop" --loopback --json --iterations "$n" "${raw_args[@]}")
		else
			cmd=("${dirs[$i]}/tools/te-bench" --loopback --json --quiet --iterations "$n"
				"${bench_args[@]}")
		fi
		echo "$me: $name: callgrind ${cmd[*]}" >&2
		# The initiator is valgrind's own process ($!); the target, its child (te-bench's
		# spawned --target, the raw loop's forked server), writes the other file.
		TE_PLUGIN_PATH=${dirs[$i]:-$build}/plugins/tcp valgrind --tool=callgrind \
			--trace-children=yes --callgrind-out-file="$out.cg.%p" "${cmd[@]}" \
			>"$out.json" 2>"$out.log" &
		pid=$!
		if ! wait "$pid"; then
			grep -v '^==[0-9]*==' "$out.log" | tail -5 >&2
			die "$name: --iterations $n failed under callgrind (log above)"
		fi
		[ -s "$out.cg.$pid" ] || die "$name: no callgrind output for the initiator"
		mv "$out.cg.$pid" "$out.init"
		target=$(find "$tmp" -maxdepth 1 -name "$i.$n.cg.*" | head -1)
		[ -n "$target" ] || die "$name: no callgrind output for the target process"
		mv "$target" "$out.target"
		for side in init target; do
			callgrind_annotate --inclusive=no --auto=no --threshold=100 --show-percs=no \
				"$out.$side" >"$out.$side.txt" 2>/dev/null ||
				die "$name: callgrind_annotate failed on $out.$side"
		done
	done
done

python3 - "$tmp" "$half" "$iterations" "$top_k" "${bench_args[*]}" "${names[@]}" <<'PY'
import json, re, sys

tmp, half, full, top_k, cell = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
names = sys.argv[6:]
SPIN = ("progress_wait", "batch_wait_spin", "batch_is_terminal", "progress_cpu_relax")


def functions(path):
    """{function: Ir} of a callgrind_annotate listing (self cost), file names dropped."""
    out = {}
    for line in open(path):
        m = re.match(r"\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        fn = re.sub(r"\s*\[[^]]*\]$", "", m.group(2).strip())
        fn = fn.split(":", 1)[1] if ":" in fn else fn
        out[fn] = out.get(fn, 0) + int(m.group(1).replace(",", ""))
    return out


def total(path):
    """Ir of a whole callgrind output file (its summary or totals line)."""
    ir = None
    for line in open(path):
        if line.startswith(("summary:", "totals:")):
            ir = int(line.split()[1])
    if ir is None:
        sys.exit(f"insn-tcp.sh: no total in {path}")
    return ir


def requests(path):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    if not rows or rows[-1].get("failed"):
        sys.exit(f"insn-tcp.sh: {path}: no successful row")
    return rows[-1]["requests"]


res = []
for i, name in enumerate(names):
    a, b = f"{tmp}/{i}.{half}", f"{tmp}/{i}.{full}"
    reqs = requests(b + ".json") - requests(a + ".json")
    if reqs <= 0:
        sys.exit(f"insn-tcp.sh: {name}: no more requests with --iterations {full} than {half}")
    r = {"name": name, "reqs": reqs}
    for side in ("init", "target"):
        fa, fb = functions(f"{a}.{side}.txt"), functions(f"{b}.{side}.txt")
        per = {f: (fb.get(f, 0) - fa.get(f, 0)) / reqs for f in set(fa) | set(fb)}
        spin = sum(v for f, v in per.items() if f.split(".")[0] in SPIN)
        all_ = (total(f"{b}.{side}") - total(f"{a}.{side}")) / reqs
        r[side] = all_ - spin
        r[side + "_spin"] = spin
        r[side + "_fn"] = per
    res.append(r)

first = res[0]
print(f"te-bench --loopback {cell}: user-space instructions per request (callgrind; "
      f"--iterations {full} minus {half}; spinning waiters left out)")
print()
print(f"| variant | requests | initiator | target | both | vs {first['name']} | "
      "spin (initiator, target) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for r in res:
    both = r["init"] + r["target"]
    vs = both / (first["init"] + first["target"])
    print(f"| {r['name']} | {r['reqs']} | {r['init']:.0f} | {r['target']:.0f} | {both:.0f} | "
          f"{vs:.3f} | {r['init_spin']:.0f}, {r['target_spin']:.0f} |")
few = [r["name"] for r in res if r["init"] <= 0 or r["target"] <= 0]
if few:
    print()
    print(f"Note: {', '.join(few)}: a count at or below 0: the threads' own work (timers, "
          "polls) outweighs too few requests; raise --iterations or --batch.")
for r in res:
    if not top_k:
        break
    print()
    print(f"{r['name']}: the initiator's functions by their own instructions per request")
    print()
    print("| function | Ir/request |")
    print("|---|---:|")
    rows = sorted(r["init_fn"].items(), key=lambda kv: -kv[1])[:top_k]
    for f, v in rows:
        print(f"| {f} | {v:.1f} |")
PY
