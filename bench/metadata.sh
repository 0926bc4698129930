#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# metadata.sh: segment open, fetch at 1000 segments and restart propagation for p2p, etcd, redis and http in one run.
#
# Usage: bench/metadata.sh [-C BUILD] [-- METADATA_BENCH_ARGS...]
#
# Starts etcd, redis-server and te-metadata-server on free loopback ports (data under a
# temporary folder; stopped by PID and removed at exit; a program that is missing is left
# out and said so), runs BUILD/bench/metadata_bench against them (see the comment at the
# top of bench/metadata_bench.c for what each part measures) and prints the load average
# (uptime) before and after. Environment: OPENS (200), FETCHES (1000), SEGMENTS (1000),
# SMALL (10), WATCHERS (50), RESTARTS (20), STARTS (100). Exit status: metadata_bench's.
set -u

build=build
while [ $# -gt 0 ]; do
	case $1 in
	-C) build=${2:?-C needs a build folder}; shift 2 ;;
	--) shift; break ;;
	-h|--help) sed -n '3,12p' "$0"; exit 0 ;;
	*) echo "metadata.sh: unknown argument $1 (arguments for metadata_bench go after --)" >&2; exit 2 ;;
	esac
done
bench=$build/bench/metadata_bench
if [ ! -x "$bench" ]; then
	echo "metadata.sh: $bench is not built (ninja -C $build bench/metadata_bench)" >&2
	exit 1
fi
if [ ! -f "$build/plugins/tcp/tcp.so" ]; then
	echo "metadata.sh: $build/plugins/tcp/tcp.so is not built" >&2
	exit 1
fi
TE_PLUGIN_PATH=$(cd "$build/plugins/tcp" && pwd)${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}
export TE_PLUGIN_PATH

work=$(mktemp -d /tmp/te-md-bench.XXXXXX) || exit 1
pids=
cleanup() {
	for p in $pids; do
		kill -TERM "$p" 2>/dev/null
		i=0
		while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -KILL "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE

# A port below the ephemeral range (an outgoing connection cannot hold it) that no socket
# uses now.
pick_port() {
	lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	[ "$lo" -gt 12000 ] 2>/dev/null || lo=32768
	while :; do
		p=$(( $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % (lo - 11000) + 10000 ))
		ss -Htan 2>/dev/null | awk '{print $4}' | grep -q ":$p\$" || break
	done
	echo "$p"
}

# up NAME PID CMD...: wait (20 s) until CMD succeeds; 1 when PID exits first (a port
# taken between pick_port and bind: the caller starts it again on other ports).
up() {
	name=$1
	pid=$2
	shift 2
	pids="$pids $pid"
	i=0
	until "$@" >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid" 2>/dev/null
			return 1
		fi
		i=$((i + 1))
		if [ $i -ge 200 ]; then
			echo "metadata.sh: $name does not answer after 20 s; its log ends:" >&2
			tail -n 20 "$work/$name.log" >&2
			exit 1
		fi
		sleep 0.1
	done
}

# start NAME: start that server on fresh ports, up to 5 tries; sets $url.
start() {
	for try in 1 2 3 4 5; do
		p=$(pick_port)
		case $1 in
		etcd)
			peer=$(pick_port)
			rm -rf "$work/etcd"
			etcd --name te-bench --data-dir "$work/etcd" \
				--listen-client-urls "http://127.0.0.1:$p" \
				--advertise-client-urls "http://127.0.0.1:$p" \
				--listen-peer-urls "http://127.0.0.1:$peer" \
				--initial-advertise-peer-urls "http://127.0.0.1:$peer" \
				--initial-cluster "te-bench=http://127.0.0.1:$peer" \
				--log-level warn >"$work/etcd.log" 2>&1 &
			url=http://127.0.0.1:$p
			up etcd $! env ETCDCTL_API=3 etcdctl --endpoints="$url" --dial-timeout=1s \
				--command-timeout=2s endpoint health && return 0
			;;
		redis)
			mkdir -p "$work/redis"
			redis-server --bind 127.0.0.1 --port "$p" --dir "$work/redis" --save '' \
				--appendonly no --daemonize no >"$work/redis.log" 2>&1 &
			url=redis://127.0.0.1:$p
			up redis $! sh -c "[ \"\$(redis-cli -h 127.0.0.1 -p $p PING)\" = PONG ]" &&
				return 0
			;;
		http)
			"$mds" --listen "127.0.0.1:$p" >"$work/http.log" 2>&1 &
			url=http://127.0.0.1:$p/metadata
			up http $! sh -c "c=\$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 \
				'$url?key=/probe'); [ \"\$c\" = 404 ]" && return 0
			;;
		esac
		echo "metadata.sh: $1 exited at start (try $try): $(tail -n 1 "$work/$1.log")" >&2
	done
	echo "metadata.sh: $1 did not start in 5 tries" >&2
	exit 1
}

args=
if command -v etcd >/dev/null; then
	start etcd
	args="$args --etcd $url"
	echo "metadata.sh: etcd $(etcd --version | sed -n 's/^etcd Version: //p') at $url"
else
	echo "metadata.sh: etcd is not installed: left out"
fi
if command -v redis-server >/dev/null; then
	start redis
	args="$args --redis $url"
	echo "metadata.sh: $(redis-server --version | cut -d' ' -f1-3) at $url"
else
	echo "metadata.sh: redis-server is not installed: left out"
fi
mds=$build/tools/te-metadata-server
if [ -x "$mds" ]; then
	start http
	args="$args --http $url"
	echo "metadata.sh: te-metadata-server at $url"
else
	echo "metadata.sh: $mds is not built (libsoup-3.0): http left out"
fi

echo "metadata.sh: load at start: $(uptime)"
echo "metadata.sh: $(nproc) CPUs; $(git -C "$(dirname "$0")" describe --always --dirty 2>/dev/null || echo '?')"
# shellcheck disable=SC2086 # $args holds separate words on purpose
"$bench" --opens "${OPENS:-200}" --fetches "${FETCHES:-1000}" --segments "${SEGMENTS:-1000}" \
	--small "${SMALL:-10}" --watchers "${WATCHERS:-50}" --restarts "${RESTARTS:-20}" --starts "${STARTS:-100}" $args "$@"
rc=$?
echo "metadata.sh: load at end: $(uptime)"
exit $rc
