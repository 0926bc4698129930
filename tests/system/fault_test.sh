#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# fault_test.sh: one fault or attack case between te engines in three network namespaces.
#
# Usage: fault_test.sh FAULT_TEST TE_NODE CASE
#
# Creates namespaces tef<pid>a (target), tef<pid>b (honest initiator) and tef<pid>c
# (attacker); a bridge in a joins the veth pairs a-b and a-c, with the addresses
# 10.<x>.<y>.1 (a), .2 (b) and .3 (c) that exist only inside the namespaces. Runs
# "FAULT_TEST CASE" inside b (it starts te-node in a and attacks from c itself), and
# removes everything on exit, whatever happened. Exit 77 where namespaces cannot be created
# (no privileges), the tcp plugin is not built, or a case needs nft and it is missing
# (scripts/install-deps.sh installs nftables). The C program prints one "figure:" line and
# one "FAIL: ..." line per failed assertion.
set -u

prog=${1:?usage: fault_test.sh FAULT_TEST TE_NODE CASE}
node=${2:?usage: fault_test.sh FAULT_TEST TE_NODE CASE}
case=${3:?usage: fault_test.sh FAULT_TEST TE_NODE CASE}
tag=$$
nsa=tef${tag}a
nsb=tef${tag}b
nsc=tef${tag}c
br=tefbr${tag}
work=$(mktemp -d /tmp/te-fault.XXXXXX) || exit 1
created=

log() { echo "fault_test[$case]: $*" >&2; }

cleanup() {
	# The C program's te-node children die with it (PR_SET_PDEATHSIG); the namespaces go.
	for ns in $created; do
		ip netns del "$ns" 2>/dev/null
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

found=
for d in $(echo "${TE_PLUGIN_PATH:-}" | tr ':' ' '); do
	[ -f "$d/tcp.so" ] && found=$d/tcp.so
done
if [ -z "$found" ]; then
	log "SKIP: tcp.so is not found along TE_PLUGIN_PATH (the tcp plugin is not built)"
	exit 77
fi
PATH=$PATH:/usr/sbin:/sbin
export PATH
if ! command -v ip >/dev/null 2>&1; then
	log "SKIP: no ip command (iproute2)"
	exit 77
fi
case $case in
loss | partition-heal)
	if ! command -v nft >/dev/null 2>&1; then
		log "SKIP: this case drops packets with nft and nft is not installed" \
			"(scripts/install-deps.sh test installs nftables)"
		exit 77
	fi
	;;
esac

for ns in $nsa $nsb $nsc; do
	if ! ip netns add "$ns" 2>"$work/err"; then
		log "SKIP: cannot create a network namespace: $(cat "$work/err")"
		exit 77
	fi
	created="$created $ns"
	ip -n "$ns" link set lo up || exit 1
done

# Addresses only ever exist inside the namespaces: nothing leaves them.
x=$(((tag >> 8) % 200 + 20))
y=$((tag % 250 + 1))
addra=10.$x.$y.1
addrb=10.$x.$y.2
addrc=10.$x.$y.3
set -e
ip -n "$nsa" link add "$br" type bridge
ip -n "$nsa" link add tefa${tag}b type veth peer name tefb${tag} netns "$nsb"
ip -n "$nsa" link add tefa${tag}c type veth peer name tefc${tag} netns "$nsc"
ip -n "$nsa" link set tefa${tag}b master "$br"
ip -n "$nsa" link set tefa${tag}c master "$br"
ip -n "$nsa" addr add "$addra/24" dev "$br"
ip -n "$nsb" addr add "$addrb/24" dev tefb${tag}
ip -n "$nsc" addr add "$addrc/24" dev tefc${tag}
for l in "$br" tefa${tag}b tefa${tag}c; do
	ip -n "$nsa" link set "$l" up
done
ip -n "$nsb" link set tefb${tag} up
ip -n "$nsc" link set tefc${tag} up
set +e
if ip route get "$addra" 2>/dev/null | grep -q "dev tef"; then
	log "FAIL: $addra is routed in the host namespace"
	exit 1
fi
# Without STP the bridge forwards at once; wait until every port says so and links are up.
i=0
while ! bridge -n "$nsa" link show dev tefa${tag}b 2>/dev/null | grep -q "state forwarding" ||
	! bridge -n "$nsa" link show dev tefa${tag}c 2>/dev/null | grep -q "state forwarding" ||
	! ip -n "$nsb" link show dev tefb${tag} | grep -q "state UP" ||
	! ip -n "$nsc" link show dev tefc${tag} | grep -q "state UP"; do
	i=$((i + 1))
	if [ $i -ge 50 ]; then
		log "FAIL: the bridge in $nsa does not forward"
		bridge -n "$nsa" link show >&2
		exit 1
	fi
	sleep 0.1
done

FAULT_NS_A=$nsa FAULT_NS_B=$nsb FAULT_NS_C=$nsc
FAULT_ADDR_A=$addra FAULT_ADDR_B=$addrb FAULT_ADDR_C=$addrc
FAULT_DEV_B=tefb${tag} FAULT_DEV_C=tefc${tag}
FAULT_PORT=$((17000 + tag % 900 + 50))
FAULT_SECRET="fault-test-$tag-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
export FAULT_NS_A FAULT_NS_B FAULT_NS_C FAULT_ADDR_A FAULT_ADDR_B FAULT_ADDR_C
export FAULT_DEV_B FAULT_DEV_C FAULT_PORT FAULT_SECRET
TE_NODE=$node
export TE_NODE

# The program has its own watchdog (FAULT_CASE_LIMIT_S); timeout is the last resort.
rc=0
timeout -k 5 "${FAULT_TIMEOUT_S:-170}" ip netns exec "$nsb" "$prog" "$case" || rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
	log "FAIL: the case did not end within ${FAULT_TIMEOUT_S:-170} s (killed)"
	rc=1
fi
exit $rc
