#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install-deps.sh: install, with apt, only the Debian packages whose pkg-config module,
# command or dpkg entry is missing. Idempotent; silent when everything is present.
#
# Usage: scripts/install-deps.sh [GROUP...]   (groups: build test bench; default: all)
#        `make demo` asks for build, `make test` for build and test, `make bench` for build
#        and bench. apt waits for a dpkg lock another apt holds (up to TE_DEPS_LOCK_WAIT_S,
#        default 600 s) and its progress is shown.
#        TE_SKIP_DEPS=1 skips everything (machines without apt or root).
#        TE_DEPS_DRY_RUN=1 only prints what would be installed.
set -euo pipefail

# One line per Debian package: GROUP PACKAGE CHECK
#   CHECK is pc:<pkg-config module>, bin:<command> or deb:<dpkg package name>.
#   GROUP ending in '?' (build?) marks an optional package: installed when apt has it, else
#   skipped with a note (what needs it is a meson feature that turns itself off without it).
# Extend here (later transports add rdma/libfabric/qemu lines); keep one package a line.
DEPS='
build meson                 bin:meson
build ninja-build           bin:ninja
build pkg-config            bin:pkg-config
build gcc                   bin:gcc
build g++                   bin:g++
build libc6-dev             deb:libc6-dev
build binutils              bin:nm
build git                   bin:git
build make                  bin:make
build libglib2.0-dev        pc:glib-2.0
build libyaml-dev           pc:yaml-0.1
build libjson-glib-dev      pc:json-glib-1.0
build libcurl4-openssl-dev  pc:libcurl
build libhiredis-dev        pc:hiredis
build libsoup-3.0-dev       pc:libsoup-3.0
test  iproute2              bin:ip
test  clang-format          bin:clang-format
test  python3               bin:python3
build libibverbs-dev        pc:libibverbs
build libfabric-dev         pc:libfabric
build? libamdhip64-dev      deb:libamdhip64-dev
test  ibverbs-providers     deb:ibverbs-providers
test  ibverbs-utils         bin:ibv_devices
test  perftest              bin:ib_write_bw
test  qemu-system-x86       bin:qemu-system-x86_64
test  busybox-static        deb:busybox-static
test  cpio                  bin:cpio
test  kmod                  bin:modprobe
test  nftables              bin:nft
bench iperf3                bin:iperf3
bench valgrind              bin:valgrind
test  etcd-server           bin:etcd
test  etcd-client           bin:etcdctl
test  redis-server          bin:redis-server
test  redis-tools           bin:redis-cli
'

# --- what each test or bench package is for ----------------------------------------------
# iproute2: network namespaces and veth pairs of the system tests. clang-format: the format
# check. python3: te-info, header and Python binding tests.
# ibverbs-providers, ibverbs-utils, perftest, qemu-system-x86, busybox-static, cpio, kmod:
# the soft-RoCE QEMU guest (scripts/qemu-rxe/), which runs ib_write_bw next to te.
# nftables: packet loss and partitions in tests/system/fault_test.sh.
# etcd-server, etcd-client, redis-server, redis-tools: the metadata stores the suite runs for
# real (scripts/test-services.sh, tests/metadata/mdserver.c).
# iperf3 (bench/compare-tcp.sh), valgrind (scripts/bench-core.sh: callgrind).
# -------------------------------------------------------------------------------------------

[ "${TE_SKIP_DEPS:-0}" = 1 ] && exit 0

want_groups=("$@")
[ ${#want_groups[@]} -eq 0 ] && want_groups=(build test bench)
for g in "${want_groups[@]}"; do
	case "$g" in
	build | test | bench) ;;
	*)
		echo "install-deps.sh: unknown group '$g' (groups: build test bench)" >&2
		exit 2
		;;
	esac
done

in_groups() {
	local g
	for g in "${want_groups[@]}"; do
		[ "$g" = "${1%\?}" ] && return 0
	done
	return 1
}

deb_installed() {
	command -v dpkg-query >/dev/null 2>&1 || return 1
	dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

present() { # PACKAGE CHECK
	local pkg=$1 kind=${2%%:*} what=${2#*:}
	case "$kind" in
	bin) command -v "$what" >/dev/null 2>&1 ;;
	pc)
		if command -v pkg-config >/dev/null 2>&1; then
			pkg-config --exists "$what"
		else
			deb_installed "$pkg"
		fi
		;;
	deb) deb_installed "$what" ;;
	*)
		echo "install-deps.sh: bad check '$2' for $pkg" >&2
		return 2
		;;
	esac
}

missing=()
optional=()
while read -r group pkg check; do
	[ -n "${group:-}" ] || continue
	in_groups "$group" || continue
	if ! present "$pkg" "$check"; then
		case "$group" in
		*\?) optional+=("$pkg") ;;
		*) missing+=("$pkg") ;;
		esac
	fi
done <<<"$DEPS"

[ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0

echo "install-deps.sh: installing ${missing[*]}${optional[*]:+ (optional: ${optional[*]})}" >&2
if [ "${TE_DEPS_DRY_RUN:-0}" = 1 ]; then
	exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=(sudo -n)
	else
		echo "install-deps.sh: missing ${missing[*]}; run as root (or set TE_SKIP_DEPS=1)" >&2
		exit 1
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-deps.sh: no apt-get; install by hand: ${missing[*]}" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Another apt or unattended-upgrades holding the dpkg lock is waited for, not a failure.
lock_wait=${TE_DEPS_LOCK_WAIT_S:-600}
apt_opts=(-o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout="$lock_wait")
apt_get() { # retry once: mirrors flake
	"${SUDO[@]}" apt-get "${apt_opts[@]}" "$@" </dev/null ||
		{ sleep 5; "${SUDO[@]}" apt-get "${apt_opts[@]}" "$@" </dev/null; }
}
# Progress goes to stderr (one line per step, no terminal tricks): a fresh machine takes
# minutes here, and silence would look like a hang.
echo "install-deps.sh: apt-get update" >&2
apt_get -q update >&2
if [ ${#missing[@]} -ne 0 ]; then
	echo "install-deps.sh: apt-get install ${missing[*]}" >&2
	apt_get -q install -y --no-install-recommends "${missing[@]}" >&2
fi
# Optional packages one by one: one this apt does not have must not stop the others.
for pkg in "${optional[@]}"; do
	"${SUDO[@]}" apt-get -q "${apt_opts[@]}" install -y --no-install-recommends "$pkg" \
		</dev/null >&2 ||
		echo "install-deps.sh: optional $pkg not installed (apt has none?); skipped" >&2
done

# Verify: a package that installed but still fails its check is a wrong list entry.
still=()
while read -r group pkg check; do
	[ -n "${group:-}" ] || continue
	in_groups "$group" || continue
	case "$group" in *\?) continue ;; esac
	present "$pkg" "$check" || still+=("$pkg ($check)")
done <<<"$DEPS"
if [ ${#still[@]} -ne 0 ]; then
	echo "install-deps.sh: still missing after install: ${still[*]}" >&2
	exit 1
fi
