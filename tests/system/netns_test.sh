#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# netns_test.sh: two te engines in two network namespaces joined by a veth pair move 1 MiB.
#
# Usage: netns_test.sh TE_NODE. Creates namespaces tens<pid>a/b and the pair tev<pid>a/b
# with addresses of 10.<x>.<y>.1/2 that exist only inside them, runs te-node as the target in
# a and "te-node --initiator --verify" in b, and removes everything on exit. Exit 77 where
# namespaces cannot be created (no privileges) or the tcp plugin is not built.
set -u

node=${1:?usage: netns_test.sh TE_NODE}
tag=$$
nsa=tens${tag}a
nsb=tens${tag}b
va=tev${tag}a
vb=tev${tag}b
work=$(mktemp -d /tmp/te-netns.XXXXXX) || exit 1
target_pid=
fd_open=

log() { echo "netns_test: $*" >&2; }

cleanup() {
	# Closing the target's stdin stops it; SIGKILL after 5 s. Only our own PIDs.
	if [ -n "$fd_open" ]; then
		exec 3>&-
		fd_open=
	fi
	if [ -n "$target_pid" ]; then
		i=0
		while kill -0 "$target_pid" 2>/dev/null && [ $i -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -KILL "$target_pid" 2>/dev/null
		wait "$target_pid" 2>/dev/null
		target_pid=
	fi
	ip netns del "$nsa" 2>/dev/null
	ip netns del "$nsb" 2>/dev/null
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

if ! ip netns add "$nsa" 2>"$work/err"; then
	log "SKIP: cannot create a network namespace: $(cat "$work/err")"
	exit 77
fi
if ! ip netns add "$nsb"; then
	log "SKIP: cannot create a second network namespace"
	exit 77
fi

# Addresses only ever exist inside the two namespaces: nothing leaves them.
x=$(( (tag >> 8) % 200 + 20 ))
y=$(( tag % 250 + 1 ))
addra=10.$x.$y.1
addrb=10.$x.$y.2
set -e
ip link add "$va" netns "$nsa" type veth peer name "$vb" netns "$nsb"
ip -n "$nsa" link set lo up
ip -n "$nsb" link set lo up
ip -n "$nsa" addr add "$addra/30" dev "$va"
ip -n "$nsb" addr add "$addrb/30" dev "$vb"
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up
set +e
# The host's namespace has no route to these addresses (the veth ends are not in it).
if ip route get "$addra" 2>/dev/null | grep -q "dev $va"; then
	log "FAIL: $addra is routed in the host namespace"
	exit 1
fi

# Off loopback, the control plane authenticates (shared secret).
secret="netns-test-$tag-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
port=17$(( tag % 900 + 100 ))
cat >"$work/a.yaml" <<EOT
engine: {listen: "$addra:$port"}
transfer: {timeout_ms: 10000}
transports:
  - name: tcp
    required: true
    options: {bind: "$addra"}
auth: {secret: "$secret"}
EOT
cat >"$work/b.yaml" <<EOT
engine: {listen: "$addrb:0"}
transfer: {timeout_ms: 10000}
transports:
  - name: tcp
    required: true
    options: {bind: "$addrb"}
auth: {secret: "$secret"}
EOT

mkfifo "$work/in"
ip netns exec "$nsa" "$node" --config "$work/a.yaml" --size 4M <"$work/in" \
	>"$work/a.out" 2>"$work/a.err" &
target_pid=$!
exec 3>"$work/in"
fd_open=1

i=0
while ! grep -q '^ready$' "$work/a.out" 2>/dev/null; do
	if ! kill -0 "$target_pid" 2>/dev/null || [ $i -ge 300 ]; then
		log "FAIL: the target did not become ready within 30 s"
		cat "$work/a.out" "$work/a.err" >&2
		exit 1
	fi
	sleep 0.1
	i=$((i + 1))
done
segment=$(sed -n 's/^segment: //p' "$work/a.out")
log "target $segment ready in $nsa"

rc=0
timeout 60 ip netns exec "$nsb" "$node" --config "$work/b.yaml" --initiator "$segment" \
	--verify >"$work/b.out" 2>"$work/b.err" || rc=$?
cat "$work/b.out" >&2
if [ $rc -ne 0 ] || ! grep -q '^verify ok$' "$work/b.out"; then
	log "FAIL: initiator in $nsb exited $rc"
	cat "$work/b.err" "$work/a.err" >&2
	exit 1
fi

# The bytes really crossed the veth pair (1 MiB each way at least).
rx=$(ip -n "$nsa" -s -j link show "$va" 2>/dev/null | sed -n 's/.*"rx":{"bytes":\([0-9]*\).*/\1/p')
if [ -n "$rx" ] && [ "$rx" -lt 1048576 ]; then
	log "FAIL: only $rx bytes arrived on $va"
	exit 1
fi
log "$va received ${rx:-?} bytes"

# The target keeps serving and its bytes outside the written range are untouched.
echo "checksum 0 65536" >&3
sleep 0.5
if ! grep -q '^sum ' "$work/a.out"; then
	log "FAIL: the target stopped answering"
	exit 1
fi
log "PASS: 1 MiB written and read back across $va/$vb ($addrb -> $addra:$port)"
exit 0
