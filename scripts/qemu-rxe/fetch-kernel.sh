#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# fetch-kernel.sh: Debian's stock kernel (image + modules) unpacked under a cache, not installed.
#
# Usage: fetch-kernel.sh DEST
#   Resolves the current kernel package from linux-image-amd64's Depends (its name changes with
#   every security update, so it is never pinned), downloads it with `apt-get download` (no
#   root, no postinst, ~70 MB) and unpacks it into DEST/<version>/ with a modules.dep built
#   by depmod. Prints KROOT=... KVER=... KERNEL=... (eval-able). Without apt or network, an
#   already unpacked kernel in DEST is used. Exit 1 when there is none.
set -euo pipefail

dest=${1:?usage: fetch-kernel.sh DEST}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

pkg=""
if command -v apt-cache >/dev/null 2>&1; then
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/ { print $2; exit }') || pkg=""
fi
if [ -n "$pkg" ]; then
	kver=${pkg#linux-image-}
	root=$dest/$kver
	if [ ! -e "$root/boot/vmlinuz-$kver" ]; then
		tmp=$(mktemp -d "$dest/.dl.XXXXXX")
		if (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) &&
			dpkg-deb -x "$tmp"/"$pkg"_*.deb "$root.partial"; then
			rm -rf "$root"
			mv "$root.partial" "$root"
		else
			rm -rf "$root.partial"
			echo "fetch-kernel.sh: cannot download $pkg" >&2
		fi
		rm -rf "$tmp"
	fi
fi
# Newest unpacked kernel (the one just fetched, or a cached one when offline).
kver=$(find "$dest" -mindepth 3 -maxdepth 3 -path '*/boot/vmlinuz-*' -printf '%f\n' 2>/dev/null |
	sed 's/^vmlinuz-//' | sort -V | tail -n 1)
if [ -z "$kver" ]; then
	echo "fetch-kernel.sh: no kernel in $dest and none could be downloaded" >&2
	exit 1
fi
root=$dest/$kver
# The package ships no modules.dep (its postinst runs depmod): build it here.
[ -e "$root/lib/modules/$kver/modules.dep" ] || depmod -b "$root" "$kver"
echo "KROOT=$root KVER=$kver KERNEL=$root/boot/vmlinuz-$kver"
