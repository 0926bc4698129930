#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install-deps.sh: install, with apt, only the Debian packages whose pkg-config module,
# command or dpkg entry is missing. Idempotent; silent when everything is present.
#
# Usage: scripts/install-deps.sh [GROUP...]   (groups: build test; default: all)
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
test  iperf3                bin:iperf3
test  valgrind              bin:valgrind
test  clang-format          bin:clang-format
test  python3               bin:python3
build libibverbs-dev        pc:libibverbs
build libfabric-dev         pc:libfabric
build? libamdhip64-dev      deb:libamdhip64-dev
test  libfabric-bin         bin:fi_info
test  ibverbs-providers     deb:ibverbs-providers
test  ibverbs-utils         bin:ibv_devices
test  perftest              bin:ib_write_bw
test  librdmacm1            deb:librdmacm1
test  qemu-system-x86       bin:qemu-system-x86_64
test  busybox-static        deb:busybox-static
test  cpio                  bin:cpio
test  kmod                  bin:modprobe
test  nftables              bin:nft
test  iptables              bin:iptables
test  etcd-server           bin:etcd
test  etcd-client           bin:etcdctl
test  redis-server          bin:redis-server
test  redis-tools           bin:redis-cli
'

# --- service and hardware rigs: later issues add their packages here ---------------------
# etcd-server, redis-server: the metadata stores the suite runs for real
# (scripts/test-services.sh, tests/metadata/mdserver.c).
# nftables and iptables: packet loss and partitions in tests/system/fault_test.sh.
# -------------------------------------------------------------------------------------------

[ "${TE_SKIP_DEPS:-0}" = 1 ] && exit 0

want_groups=("$@")
[ ${#want_groups[@]} -eq 0 ] && want_groups=(build test)

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
apt_get() { # retry once: mirrors flake
	"${SUDO[@]}" apt-get -q -o Dpkg::Use-Pty=0 "$@" </dev/null ||
		{ sleep 5; "${SUDO[@]}" apt-get -q -o Dpkg::Use-Pty=0 "$@" </dev/null; }
}
apt_get update >/dev/null
if [ ${#missing[@]} -ne 0 ]; then
	apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
# Optional packages one by one: one this apt does not have must not stop the others.
for pkg in "${optional[@]}"; do
	"${SUDO[@]}" apt-get -q -o Dpkg::Use-Pty=0 install -y --no-install-recommends "$pkg" \
		</dev/null >/dev/null 2>&1 ||
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
