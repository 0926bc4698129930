#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make-initrd.sh: a busybox initramfs that boots Debian's stock kernel into a soft-RoCE test guest.
#
# Environment:
#   KROOT, KVER   the unpacked kernel (fetch-kernel.sh)
#   OUT           output file (gzip'ed newc cpio)
#   GUEST_SCRIPT  run inside the guest as /test.sh; its exit status is the guest's
#   ELFS          space-separated executables and libraries copied with their ldd closure, at
#                 the same path in the guest (binaries linked with $ORIGIN rpaths keep working);
#                 plugins are dlopen()ed, so ldd of the programs never lists them: name them here
#   FILES         space-separated plain files copied to the same path
#   MODULES       kernel modules (with their dependencies, in load order)
# The guest's /init mounts the pseudo filesystems, loads the modules, runs /test.sh, prints
# "@@GUEST-EXIT=<rc>" on the serial console and powers off. Nothing here needs root.
set -euo pipefail

: "${KROOT:?}" "${KVER:?}" "${OUT:?}" "${GUEST_SCRIPT:?}"
ELFS=${ELFS:-}
FILES=${FILES:-}
# crc32_generic: rxe computes the RoCE v2 ICRC through crypto "crc32", a module on Debian that
# nothing autoloads in the guest (without it `rdma link add` fails with ENOENT).
MODULES=${MODULES:-crc32_generic rdma_rxe veth}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

st=$(mktemp -d "${TMPDIR:-/tmp}/te-rxe-initrd.XXXXXX")
trap 'rm -rf "$st"' EXIT

# merged-usr layout like the host: /lib and /lib64 are links into /usr
mkdir -p "$st"/{bin,sbin,usr/bin,usr/sbin,usr/lib64,etc,proc,sys,dev,tmp,run,root} \
	"$st/usr/lib/$multiarch"
ln -s usr/lib "$st/lib"
ln -s usr/lib64 "$st/lib64"

# busybox (static) with its applets. Debian's build prefers applets over PATH: inside busybox
# sh, `ip` is always the applet, so guest scripts call iproute2 as /usr/sbin/ip.
cp /bin/busybox "$st/bin/busybox"
for a in $("$st/bin/busybox" --list); do
	[ "$a" = busybox ] || ln -sf busybox "$st/bin/$a"
done

put() { # put HOSTPATH: same path in the guest (symlinks resolved)
	local dst=$1
	case "$dst" in /lib/* | /lib64/*) dst=/usr$dst ;; esac
	[ -e "$st$dst" ] && return 0
	mkdir -p "$st$(dirname "$dst")"
	cp -L "$1" "$st$dst"
}

put_elf() { # put_elf HOSTPATH: the file and its shared-library closure
	local lib
	[ -e "$1" ] || {
		echo "make-initrd.sh: missing $1" >&2
		return 1
	}
	put "$1"
	for lib in $(ldd "$1" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }'); do
		put "$lib"
	done
}

# Verbs userspace: the tools, the rxe provider (dlopen()ed by libibverbs, found through its
# .driver file) and iproute2's rdma/ip.
for f in /usr/bin/rdma /usr/sbin/ip /usr/bin/ibv_devices /usr/bin/ibv_devinfo \
	/usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/lib/"$multiarch"/libibverbs/librxe-rdmav*.so; do
	if [ -e "$f" ]; then put_elf "$f"; else echo "make-initrd.sh: skip $f (not installed)" >&2; fi
done
mkdir -p "$st/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$st/etc/libibverbs.d/"
for f in $ELFS; do put_elf "$f"; done
for f in $FILES; do put "$f"; done
put /lib64/ld-linux-x86-64.so.2
# glibc dlopen()s libgcc_s for pthread_exit/pthread_cancel unwinding; ldd never lists it.
put /usr/lib/"$multiarch"/libgcc_s.so.1
printf '/usr/lib/%s\n/usr/lib/%s/libibverbs\n' "$multiarch" "$multiarch" >"$st/etc/ld.so.conf"
ldconfig -r "$st"
echo 'root:x:0:0:root:/root:/bin/sh' >"$st/etc/passwd"
echo 'root:x:0:' >"$st/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$st/etc/hosts"

# Kernel modules in dependency order (modprobe resolves them from the unpacked tree).
: >"$st/etc/insmod.list"
for m in $MODULES; do
	modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" |
		awk '$1 == "insmod" { $1 = ""; sub(/^ /, ""); print }'
done | awk '!seen[$1]++' | while read -r ko opts; do
	gko=${ko#"$KROOT"}
	mkdir -p "$st$(dirname "$gko")"
	cp "$ko" "$st$gko"
	echo "$gko $opts" >>"$st/etc/insmod.list"
done
[ -s "$st/etc/insmod.list" ] || {
	echo "make-initrd.sh: no modules resolved for $KVER" >&2
	exit 1
}

cat >"$st/init" <<'INIT'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# /tmp stays on the initramfs root: the build tree (and its binaries) may live under /tmp.
mkdir -p /tmp
echo "@@T init $(cut -d' ' -f1 /proc/uptime)"
while read -r ko opts; do
	insmod "$ko" $opts || echo "@@WARN insmod $ko failed"
done </etc/insmod.list
/usr/sbin/ip link set lo up
ulimit -l unlimited
echo "@@T modules $(cut -d' ' -f1 /proc/uptime)"
sh /test.sh
rc=$?
echo "@@T done $(cut -d' ' -f1 /proc/uptime)"
echo "@@GUEST-EXIT=$rc"
sync
poweroff -f
INIT
chmod +x "$st/init"
cp "$GUEST_SCRIPT" "$st/test.sh"

(cd "$st" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "make-initrd.sh: $OUT ($(du -h "$OUT" | cut -f1)) for $KVER" >&2
