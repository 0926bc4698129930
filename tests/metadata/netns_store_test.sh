#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# netns_store_test.sh: engines in two network namespaces and the host find each other by name in a store.
#
# Usage: netns_store_test.sh etcd|redis|http [TE_NODE [TE_METADATA_SERVER]]
# (defaults: $TE_BUILD_ROOT/tests/system/te-node and $TE_BUILD_ROOT/tools/te-metadata-server;
# meson test runs it as md-netns-etcd, md-netns-redis, md-netns-http).
#
# Builds a bridge temb<pid> in the host namespace with 10.<x>.<y>.1/24 and namespaces
# tems<pid>a, tems<pid>b joined to it by veth pairs (10.<x>.<y>.2, .3). The store server
# (etcd, redis-server or te-metadata-server) runs in the host namespace bound to
# 10.<x>.<y>.1 only, with its data under a temporary folder. Targets: node-a in namespace a,
# node-c in the host namespace; both publish their descriptors to the store. Initiators
# open them BY NAME through the store (te-node --initiator NAME --verify): from namespace b
# node-a then node-c, from the host namespace node-a; every one must print "verify ok".
# Every control plane authenticates (shared secret); redis, off loopback, requires a
# password (protected mode), which the engines read from metadata.password_file. At the end
# node-a stops and its key must be gone from the store (withdrawn at shutdown). Servers and
# targets are stopped by PID; namespaces, links and the folder are removed on exit.
#
# Exit 0: pass; 1: failure (says what); 77: namespaces cannot be created, or the server
# program or the tcp plugin is missing.
set -u

backend=${1:?usage: netns_store_test.sh etcd|redis|http [TE_NODE [TE_METADATA_SERVER]]}
node=${2:-${TE_BUILD_ROOT:-build}/tests/system/te-node}
mdsrv=${3:-}
tag=$$
nsa=tems${tag}a
nsb=tems${tag}b
br=temb${tag}
work=$(mktemp -d /tmp/te-netns-store.XXXXXX) || exit 1
server_pid=
target_pids=
pid_a=
fds=
made_ns=
made_br=

log() { echo "netns_store_test($backend): $*" >&2; }

# Stop a process we started: SIGTERM, then SIGKILL after 5 s.
stop_pid() {
	kill -TERM "$1" 2>/dev/null
	i=0
	while kill -0 "$1" 2>/dev/null && [ $i -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	kill -KILL "$1" 2>/dev/null
	wait "$1" 2>/dev/null
}

cleanup() {
	# Closing a target's stdin stops it; SIGKILL after 5 s. Only our own PIDs.
	for fd in $fds; do
		eval "exec $fd>&-"
	done
	fds=
	for p in $target_pids; do
		i=0
		while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -KILL "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	target_pids=
	[ -n "$server_pid" ] && stop_pid "$server_pid"
	server_pid=
	if [ -n "$made_ns" ]; then
		ip netns del "$nsa" 2>/dev/null
		ip netns del "$nsb" 2>/dev/null
	fi
	# Deleting a namespace deletes its veth ends and so their peers on the bridge; a pair
	# not moved yet (a failure half-way) goes with its host end.
	ip link del "temh${tag}a" 2>/dev/null
	ip link del "temh${tag}b" 2>/dev/null
	[ -n "$made_br" ] && ip link del "$br" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE

fail() {
	log "FAIL: $*"
	for f in "$work"/*.out "$work"/*.err "$work"/server.log; do
		[ -s "$f" ] || continue
		echo "--- $(basename "$f") (last 30 lines)" >&2
		tail -n 30 "$f" >&2
	done
	exit 1
}

case $backend in
etcd)
	prog=$(command -v etcd) || { log "SKIP: etcd is not installed"; exit 77; }
	;;
redis)
	prog=$(command -v redis-server) || { log "SKIP: redis-server is not installed"; exit 77; }
	;;
http)
	prog=$mdsrv
	if [ -z "$prog" ] && [ -n "${TE_BUILD_ROOT:-}" ]; then
		prog=$TE_BUILD_ROOT/tools/te-metadata-server
	fi
	if [ -z "$prog" ] || [ ! -x "$prog" ]; then
		log "SKIP: te-metadata-server is not built (needs libsoup-3.0)"
		exit 77
	fi
	;;
*)
	log "usage: netns_store_test.sh etcd|redis|http [TE_NODE [TE_METADATA_SERVER]]"
	exit 2
	;;
esac
[ -x "$node" ] || fail "$node is not an executable"
case $node in /*) ;; *) node=$(pwd)/$node ;; esac
case $prog in /*) ;; *) prog=$(pwd)/$prog ;; esac

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
made_ns=1
if ! ip netns add "$nsb" 2>"$work/err"; then
	log "SKIP: cannot create a second network namespace: $(cat "$work/err")"
	exit 77
fi
if ! ip link add "$br" type bridge 2>"$work/err"; then
	log "SKIP: cannot create a bridge: $(cat "$work/err")"
	exit 77
fi
made_br=1

# A /24 of 10/8 that nothing in the host namespace uses yet (from the PID, then the next).
x=$(( (tag >> 8) % 200 + 20 ))
y=$(( tag % 250 + 1 ))
n=0
while ip -4 route show | grep -q "^10\.$x\.$y\." || ip -4 addr show | grep -q " 10\.$x\.$y\."; do
	y=$(( y % 250 + 1 ))
	n=$((n + 1))
	[ $n -lt 250 ] || fail "no free 10.$x.0.0/16 subnet in the host namespace"
done
net=10.$x.$y
addrc=$net.1
addra=$net.2
addrb=$net.3

ip link add "tema${tag}a" type veth peer name "temh${tag}a" 2>"$work/err" ||
	fail "cannot create a veth pair: $(cat "$work/err")"
ip link add "tema${tag}b" type veth peer name "temh${tag}b" 2>"$work/err" ||
	fail "cannot create a veth pair: $(cat "$work/err")"
set -e
ip link set "tema${tag}a" netns "$nsa"
ip link set "tema${tag}b" netns "$nsb"
ip link set "temh${tag}a" master "$br"
ip link set "temh${tag}b" master "$br"
ip addr add "$addrc/24" dev "$br"
ip link set "$br" up
ip link set "temh${tag}a" up
ip link set "temh${tag}b" up
ip -n "$nsa" link set lo up
ip -n "$nsb" link set lo up
ip -n "$nsa" addr add "$addra/24" dev "tema${tag}a"
ip -n "$nsb" addr add "$addrb/24" dev "tema${tag}b"
ip -n "$nsa" link set "tema${tag}a" up
ip -n "$nsb" link set "tema${tag}b" up
set +e

# A port below the ephemeral range that no socket uses now.
pick_port() {
	lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	[ "$lo" -gt 12000 ] 2>/dev/null || lo=32768
	while :; do
		p=$(( $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % (lo - 11000) + 10000 ))
		ss -Htan 2>/dev/null | awk '{print $4}' | grep -q ":$p\$" || break
	done
	echo "$p"
}

port=$(pick_port)
mkdir -p "$work/data"
case $backend in
etcd)
	peer=$(pick_port)
	url=http://$addrc:$port
	"$prog" --name "te-netns-$tag" --data-dir "$work/data/etcd" \
		--listen-client-urls "$url" --advertise-client-urls "$url" \
		--listen-peer-urls "http://$addrc:$peer" \
		--initial-advertise-peer-urls "http://$addrc:$peer" \
		--initial-cluster "te-netns-$tag=http://$addrc:$peer" \
		--log-level warn >"$work/server.log" 2>&1 &
	server_pid=$!
	;;
redis)
	# Off loopback redis wants a password (protected mode): the engines read it from
	# metadata.password_file, redis-cli from REDISCLI_AUTH.
	url=redis://$addrc:$port
	REDISCLI_AUTH="redis-$tag-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
	export REDISCLI_AUTH
	(umask 077 && printf '%s\n' "$REDISCLI_AUTH" >"$work/redis.pw")
	printf 'requirepass %s\n' "$REDISCLI_AUTH" >"$work/redis.conf"
	"$prog" "$work/redis.conf" --bind "$addrc" --port "$port" --dir "$work/data" --save '' \
		--appendonly no --daemonize no >"$work/server.log" 2>&1 &
	server_pid=$!
	;;
http)
	url=http://$addrc:$port/metadata
	"$prog" --listen "$addrc:$port" >"$work/server.log" 2>&1 &
	server_pid=$!
	;;
esac

ns=/te-netns-$tag
# The value under "<ns>/segments/NAME" on stdout (nothing when absent).
store_get() {
	case $backend in
	etcd) ETCDCTL_API=3 etcdctl --endpoints="$url" --dial-timeout=2s get --print-value-only "$ns/segments/$1" 2>/dev/null ;;
	redis) redis-cli -h "$addrc" -p "$port" --raw GET "$ns/segments/$1" 2>/dev/null ;;
	http) curl -sf --max-time 2 "$url?key=$ns/segments/$1" 2>/dev/null ;;
	esac
}
# server_up [NETNS]: the server answers (from NETNS: across the bridge).
server_up() {
	in=
	[ -n "${1:-}" ] && in="ip netns exec $1"
	case $backend in
	etcd) $in env ETCDCTL_API=3 etcdctl --endpoints="$url" --dial-timeout=1s endpoint health >/dev/null 2>&1 ;;
	redis) [ "$($in redis-cli -h "$addrc" -p "$port" PING 2>/dev/null)" = PONG ] ;;
	http)
		c=$($in curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$url?key=$ns/probe" 2>/dev/null)
		[ "$c" = 404 ] || [ "$c" = 200 ]
		;;
	esac
}
i=0
while ! server_up; do
	kill -0 "$server_pid" 2>/dev/null || { server_pid=; fail "$prog exited at start"; }
	i=$((i + 1))
	[ $i -lt 200 ] || fail "$prog does not answer at $url after 20 s"
	sleep 0.1
done
for n in "$nsa" "$nsb"; do
	i=0
	while ! server_up "$n"; do
		i=$((i + 1))
		[ $i -lt 10 ] || fail "$url does not answer from $n across $br"
		sleep 0.5
	done
done
log "$backend serves $url (pid $server_pid), reachable from $nsa and $nsb"

# Off loopback, the control plane authenticates (shared secret).
secret="netns-store-$tag-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
# config FILE NAME ADDR: an engine named NAME listening on ADDR, descriptors in the store.
config() {
	pwline=
	[ "$backend" = redis ] && pwline="  password_file: \"$work/redis.pw\""
	cat >"$work/$1.yaml" <<EOT
engine: {name: "$2", listen: "$3:0"}
metadata:
  type: $backend
  endpoints: ["$url"]
  namespace: "$ns"
  ttl_s: 5
$pwline
transfer: {timeout_ms: 10000}
transports:
  - name: tcp
    required: true
    options: {bind: "$3"}
auth: {secret: "$secret"}
EOT
}
config a node-a "$addra"
config c node-c "$addrc"
config ib init-b "$addrb"
config ib2 init-b2 "$addrb"
config ic init-c "$addrc"

# start_target L NETNS FD: te-node target node-L (config L.yaml) reading a fifo held open
# on FD; its PID in pid_L.
start_target() {
	mkfifo "$work/$1.in"
	# 3>&- 4>&-: a child holding another target's fifo open would keep that one alive.
	if [ -n "$2" ]; then
		ip netns exec "$2" "$node" --config "$work/$1.yaml" --size 4M <"$work/$1.in" \
			>"$work/node-$1.out" 2>"$work/node-$1.err" 3>&- 4>&- &
	else
		"$node" --config "$work/$1.yaml" --size 4M <"$work/$1.in" \
			>"$work/node-$1.out" 2>"$work/node-$1.err" 3>&- 4>&- &
	fi
	eval "pid_$1=\$!"
	target_pids="$target_pids $!"
	eval "exec $3>\"\$work/\$1.in\""
	fds="$fds $3"
}
wait_ready() {
	eval "p=\$pid_$1"
	i=0
	while ! grep -q '^ready$' "$work/node-$1.out" 2>/dev/null; do
		kill -0 "$p" 2>/dev/null || fail "target node-$1 exited before it was ready"
		i=$((i + 1))
		[ $i -lt 300 ] || fail "target node-$1 not ready within 30 s"
		sleep 0.1
	done
	s=$(sed -n 's/^segment: //p' "$work/node-$1.out")
	[ "$s" = "node-$1" ] || fail "target node-$1 calls itself '$s'"
}
start_target a "$nsa" 3
start_target c "" 4
wait_ready a
wait_ready c
log "targets ready: node-a in $nsa ($addra), node-c in the host namespace ($addrc)"

# Both descriptors are in the store, advertising their own addresses (not loopback).
for t in node-a:$addra node-c:$addrc; do
	name=${t%%:*}
	addr=${t#*:}
	v=$(store_get "$name")
	[ -n "$v" ] || fail "no value under $ns/segments/$name in $backend"
	echo "$v" | grep -q "\"rpc\" *: *\"$addr:" ||
		fail "$name's descriptor does not advertise $addr: $(echo "$v" | head -c 300)"
done
log "both descriptors are in $backend under $ns/segments/"

# initiator LABEL YAML NETNS SEGMENT
initiator() {
	rc=0
	if [ -n "$3" ]; then
		timeout 60 ip netns exec "$3" "$node" --config "$work/$2.yaml" --initiator "$4" \
			--verify >"$work/$1.out" 2>"$work/$1.err" 3>&- 4>&- || rc=$?
	else
		timeout 60 "$node" --config "$work/$2.yaml" --initiator "$4" --verify \
			>"$work/$1.out" 2>"$work/$1.err" 3>&- 4>&- || rc=$?
	fi
	if [ $rc -ne 0 ] || ! grep -q '^verify ok$' "$work/$1.out"; then
		fail "initiator $1 ($4 by name) exited $rc without 'verify ok'"
	fi
	log "$1: $(grep '^initiator:' "$work/$1.out")"
}
initiator b-to-a ib "$nsb" node-a
initiator b-to-c ib2 "$nsb" node-c
initiator c-to-a ic "" node-a

# node-a stops (stdin closed): it withdraws its key.
exec 3>&-
fds=$(echo "$fds" | sed 's/ 3//')
i=0
while kill -0 "$pid_a" 2>/dev/null; do
	i=$((i + 1))
	[ $i -lt 100 ] || fail "node-a did not stop within 10 s of the end of its stdin"
	sleep 0.1
done
wait "$pid_a"
rc=$?
[ $rc -eq 0 ] || fail "node-a exited $rc"
v=$(store_get node-a)
[ -z "$v" ] || fail "node-a's key is still in $backend after it stopped: $(echo "$v" | head -c 200)"
log "node-a stopped and its key left $backend"
log "PASS: 3 initiators opened node-a/node-c by name through $backend across $br"
exit 0
