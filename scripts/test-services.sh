#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test-services.sh: the metadata servers the test suite shares (etcd, redis-server,
# te-metadata-server), on free loopback ports, with their data under one folder.
#
#   eval "$(scripts/test-services.sh start DIR [TE_METADATA_SERVER])"   # exports TE_TEST_*
#   scripts/test-services.sh stop DIR
#
# start prints `export TE_TEST_ETCD=http://127.0.0.1:P` (and TE_TEST_REDIS,
# TE_TEST_HTTP_METADATA) for each server it started; a server whose program is missing is
# left out (its tests start their own or skip) and said so on stderr. Every process is
# recorded in DIR/pids and stopped by that PID (SIGTERM, SIGKILL after 5 s); stop removes DIR.
# Tests that stop or restart a server never use these: they start their own
# (tests/metadata/mdserver.c).
set -uo pipefail

say() { echo "test-services: $*" >&2; }

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ask PORT REQUEST: the first bytes the server answers on a fresh connection.
ask() {
	local out
	out=$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf '$2' >&3 && head -c 512 <&3" 2>/dev/null)
	printf '%s' "$out"
}

# wait_ready NAME PID PORT REQUEST EXPECT LOG
wait_ready() {
	local i=0
	while [ $i -lt 200 ]; do
		if ! kill -0 "$2" 2>/dev/null; then
			say "$1 exited at start; its log ends:"
			tail -n 20 "$6" >&2
			return 1
		fi
		# Not grep -q: under pipefail an early match could fail the pipeline (SIGPIPE).
		if ask "$3" "$4" | grep -- "$5" >/dev/null; then
			return 0
		fi
		sleep 0.1
		i=$((i + 1))
	done
	say "$1 not ready on port $3 after 20 s; its log ends:"
	tail -n 20 "$6" >&2
	return 1
}

start() {
	local dir=${1:?usage: test-services.sh start DIR [TE_METADATA_SERVER]} mds=${2:-}
	local port peer pid
	mkdir -p "$dir" || return 1
	: >"$dir/pids"

	if command -v etcd >/dev/null; then
		port=$(free_port)
		peer=$(free_port)
		etcd --name te-ci --data-dir "$dir/etcd" --log-level warn \
			--listen-client-urls "http://127.0.0.1:$port" \
			--advertise-client-urls "http://127.0.0.1:$port" \
			--listen-peer-urls "http://127.0.0.1:$peer" \
			--initial-advertise-peer-urls "http://127.0.0.1:$peer" \
			--initial-cluster "te-ci=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
		pid=$!
		echo "$pid etcd" >>"$dir/pids"
		if wait_ready etcd "$pid" "$port" 'GET /health HTTP/1.0\r\n\r\n' '"health":"true"' \
			"$dir/etcd.log"; then
			echo "export TE_TEST_ETCD=http://127.0.0.1:$port"
			say "etcd on 127.0.0.1:$port (pid $pid)"
		fi
	else
		say "etcd is not installed: etcd tests start their own or skip"
	fi

	if command -v redis-server >/dev/null; then
		port=$(free_port)
		redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save '' \
			--appendonly no --daemonize no >"$dir/redis.log" 2>&1 &
		pid=$!
		echo "$pid redis-server" >>"$dir/pids"
		if wait_ready redis-server "$pid" "$port" 'PING\r\nQUIT\r\n' PONG "$dir/redis.log"; then
			echo "export TE_TEST_REDIS=redis://127.0.0.1:$port"
			say "redis-server on 127.0.0.1:$port (pid $pid)"
		fi
	else
		say "redis-server is not installed: redis tests start their own or skip"
	fi

	if [ -n "$mds" ] && [ -x "$mds" ]; then
		port=$(free_port)
		"$mds" --listen "127.0.0.1:$port" --ttl-s 60 >"$dir/te-metadata-server.log" 2>&1 &
		pid=$!
		echo "$pid te-metadata-server" >>"$dir/pids"
		if wait_ready te-metadata-server "$pid" "$port" \
			'GET /metadata?key=probe HTTP/1.0\r\n\r\n' 'HTTP/' "$dir/te-metadata-server.log"; then
			echo "export TE_TEST_HTTP_METADATA=http://127.0.0.1:$port/metadata"
			say "te-metadata-server on 127.0.0.1:$port (pid $pid)"
		fi
	else
		say "te-metadata-server is not built: http tests start their own or skip"
	fi
}

stop() {
	local dir=${1:?usage: test-services.sh stop DIR} pid name i
	[ -f "$dir/pids" ] || { rm -rf "$dir"; return 0; }
	while read -r pid name; do
		kill -TERM "$pid" 2>/dev/null || continue
		i=0
		while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -KILL "$pid" 2>/dev/null && say "$name (pid $pid) killed after 5 s"
	done <"$dir/pids"
	rm -rf "$dir"
}

case "${1:-}" in
start) shift; start "$@" ;;
stop) shift; stop "$@" ;;
*) echo "usage: test-services.sh start DIR [TE_METADATA_SERVER] | stop DIR" >&2; exit 2 ;;
esac
