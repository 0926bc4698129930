# SPDX-License-Identifier: Apache-2.0
# guest-suite.sh: runs inside the QEMU guest (busybox sh, as /test.sh): te over soft-RoCE.
#
# run-suite.sh prepends BUILD= and SRC= (the host paths the binaries keep in the guest).
# Devices: rxe_lo on lo (GID ::ffff:127.0.0.1), and four on two veth pairs: rxe_v0 (veth0)
# faces rxe_v1 (veth1), rxe_v2 (veth2) faces rxe_v3 (veth3), IPv6 link-local GIDs; RoCE v2
# packets really cross the veth pairs. Every check is two te processes (rdma-guest spawns its
# target). Prints @@PASS/@@FAIL per check and @@SUMMARY; exit status = failed checks.
# Kernel argument te.mode=bench runs bench/compare-rdma.sh instead.

IP=/usr/sbin/ip # busybox sh runs its own `ip` applet for a bare `ip`
export TE_PLUGIN_PATH=$BUILD/plugins/rdma:$BUILD/plugins/tcp
GUEST=$BUILD/tests/rdma/rdma-guest
BENCH=$BUILD/tools/te-bench
passes=0
fails=0

t() { echo "@@T $1 $(cut -d' ' -f1 /proc/uptime)"; }

only=$(sed -n 's/.*te\.only=\([^ ]*\).*/\1/p' /proc/cmdline)
grep -q 'te.verbose=1' /proc/cmdline && export RDMA_GUEST_VERBOSE=1

# check NAME SECONDS CMD...: PASS iff CMD exits 0 within SECONDS.
check() {
	name=$1
	limit=$2
	shift 2
	case ",$only," in ",,"|*",$name,"*) ;; *) return 0 ;; esac
	t "$name-start"
	timeout "$limit" "$@" >/tmp/"$name".log 2>&1
	rc=$?
	t "$name-end"
	echo "---- $name (rc=$rc) ----"
	cat /tmp/"$name".log
	if [ $rc -eq 0 ]; then
		echo "@@PASS $name"
		passes=$((passes + 1))
	else
		echo "@@FAIL $name"
		fails=$((fails + 1))
	fi
}

# conf FILE DEVICES [EXTRA_OPTIONS] [TRANSFER]: an engine with the rdma transport only.
conf() {
	cat >"$1" <<CONF
engine: {listen: "127.0.0.1:0"}
transfer: {timeout_ms: ${4:-30000}, quarantine_ms: 2000}
transports:
  - name: rdma
    required: true
    options: {devices: "$2"${3:+, $3}}
log: {level: info}
CONF
}

t rxe-setup
$IP link add veth0 type veth peer name veth1
$IP link add veth2 type veth peer name veth3
for i in 0 1 2 3; do $IP link set "veth$i" up; done
# IPv6 link-local addresses (the GIDs) appear once DAD is over.
for i in $(seq 1 100); do
	$IP -6 addr show | grep -q tentative || break
	sleep 0.1
done
rdma link add rxe_lo type rxe netdev lo || {
	echo "@@FAIL rdma link add rxe_lo"
	exit 99
}
for i in 0 1 2 3; do rdma link add "rxe_v$i" type rxe netdev "veth$i"; done
t rxe-ready
rdma link show
for d in rxe_lo rxe_v0; do
	ibv_devinfo -d $d | grep -E 'hca_id|state|active_mtu|link_layer'
	for g in 0 1 2; do
		p=/sys/class/infiniband/$d/ports/1
		[ -e $p/gids/$g ] &&
			echo "$d gid[$g] $(cat $p/gids/$g) $(cat $p/gid_attrs/types/$g 2>/dev/null)"
	done
done

if [ -n "${GUEST_CMD:-}" ]; then
	eval "$GUEST_CMD"
	exit $?
fi
if grep -q 'te.mode=bench' /proc/cmdline; then
	sh "$SRC/bench/compare-rdma.sh"
	exit $?
fi

conf /tmp/lo.yaml rxe_lo
conf /tmp/lo-kill.yaml rxe_lo "" 10000
conf /tmp/lo-fault.yaml rxe_lo 'test_fault: "oob@50"'
conf /tmp/lo-manual.yaml rxe_lo 'progress: manual, qp_per_peer: 1'
conf /tmp/veth-a.yaml rxe_v0
conf /tmp/veth-b.yaml rxe_v1
conf /tmp/fo-a.yaml rxe_v0,rxe_v2 "" 30000
conf /tmp/fo-b.yaml rxe_v1,rxe_v3

check lo-transfer 240 "$GUEST" --scenario transfer --config /tmp/lo.yaml \
	--target-config /tmp/lo.yaml
check lo-manual-progress 240 "$GUEST" --scenario transfer --config /tmp/lo-manual.yaml \
	--target-config /tmp/lo.yaml
check lo-qp-error 180 "$GUEST" --scenario qp-error --config /tmp/lo-fault.yaml \
	--target-config /tmp/lo.yaml
check lo-kill-peer 120 "$GUEST" --scenario kill --config /tmp/lo-kill.yaml \
	--target-config /tmp/lo.yaml --deadline-ms 10000
check lo-cancel 180 "$GUEST" --scenario cancel --config /tmp/lo.yaml \
	--target-config /tmp/lo.yaml
check lo-unregister-write 180 "$GUEST" --scenario unregister-write --config /tmp/lo.yaml \
	--target-config /tmp/lo.yaml
check lo-unregister-read 180 "$GUEST" --scenario unregister-read --config /tmp/lo.yaml \
	--target-config /tmp/lo.yaml
check veth-transfer 300 "$GUEST" --scenario transfer --config /tmp/veth-a.yaml \
	--target-config /tmp/veth-b.yaml
check te-bench-verify 120 "$BENCH" --loopback --config /tmp/lo.yaml --op mix --block-size 256K \
	--batch 16 --iterations 8 --verify
# te-conformance (docs/man/te-conformance.1) on the rdma plugin: two engines in two processes,
# the initiator's through its shim; its per-check lines go to the log. A run passes only when
# it exits 0 and its last line says "0 failed". Before veth-failover, which leaves veth0
# (rxe_v0's link) down.
cat >/tmp/conformance.sh <<'SH'
out=/tmp/conformance.$$
"$BUILD/tools/te-conformance" "$BUILD/plugins/rdma/rdma.so" "$@" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 0 ] && tail -n 1 "$out" | grep -q '^[0-9]* passed, 0 failed$'
SH
# Two devices, so that retry-excluded-device and contract-excluded-devices apply: rxe_lo, and
# rxe_v0 whose QPs both end on rxe_v0 (initiator and target run here, and the plugin pairs
# device i with the peer's device i): rxe loops a packet back inside the device when its
# destination GID is the device's own. AUTO progress. fini-in-flight skips itself here: a
# stopped target does not stop one-sided verbs (rxe in the guest's kernel serves them), and
# what the plugin holds (its QPs' slots) is done well within the core's 2 s drain.
printf 'devices: "rxe_lo,rxe_v0"\n' >/tmp/conf-rdma.yaml
# MANUAL progress: the shim freezes progress, so the plugin holds slices at fini
# (fini-in-flight, contract-fini-canceled) and every progress call is held to its budget
# (contract-progress-budget). batch-1000-* and the bad-input checks do nothing the run above
# did not (the core's side, or the same posts): left out to save 30 s under TCG.
printf 'devices: "rxe_lo"\nprogress: manual\n' >/tmp/conf-rdma-manual.yaml
check conformance-rdma 300 sh /tmp/conformance.sh --config /tmp/conf-rdma.yaml
check conformance-rdma-manual 300 sh /tmp/conformance.sh --config /tmp/conf-rdma-manual.yaml \
	--only 'abi-*' --only engine-start --only segment-open --only 'write-*' --only 'read-*' \
	--only back-pressure --only cancel-race --only retry --only retry-repeated \
	--only mark-failed --only deadline \
	--only 'peer-*' --only fini-in-flight --only reload --only 'contract-*' \
	--only core-log-plugin-bugs
check veth-failover 300 "$GUEST" --scenario failover --config /tmp/fo-a.yaml \
	--target-config /tmp/fo-b.yaml --down-if veth0
$IP -s link show veth0 | sed -n '1p;3,4p'
$IP -s link show veth2 | sed -n '1p;3,4p'

dmesg | grep -iE 'rxe|rdma' | grep -v 'speed is unknown' | tail -n 5
echo "@@SUMMARY passes=$passes fails=$fails"
exit $fails
