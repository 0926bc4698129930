#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# boot.sh: boot a kernel and initramfs under QEMU TCG; exit with the guest's /test.sh status.
#
# Usage: boot.sh KERNEL INITRD LOG [KERNEL_ARGS]
#   Environment: SMP (2), MEM (2048 MiB), TIMEOUT (seconds, 720), TE_RXE_KVM=1 to use KVM
#   when /dev/kvm works. Exit: the guest's /test.sh status; 124 on timeout; 125 when the
#   guest never reported one.
#   Notes: -cpu max minus ERMS/FSRM (with ERMS the guest kernel copies with `rep movsb`, which
#   TCG emulates byte by byte: rxe bandwidth halves); -smp 2 (with one vCPU two busy-polling
#   processes starve each other); -nic none (rxe runs on lo and veth pairs inside the guest,
#   no packet leaves it); panic=-1 with -no-reboot ends QEMU on a guest panic; tsc=reliable:
#   under TCG the kernel finds the vCPUs' TSCs "unsynchronized" and falls back to the HPET,
#   whose every read (each clock_gettime) is an emulated MMIO access under QEMU's global lock,
#   which serializes the vCPUs; the TSC is what real hosts use (and what perftest reads).
set -uo pipefail

kernel=${1:?kernel}
initrd=${2:?initrd}
log=${3:?log}
kargs=${4:-}
smp=${SMP:-2}
mem=${MEM:-2048}
limit=${TIMEOUT:-720}
accel="tcg,thread=multi,tb-size=256"
cpu="max,-erms,-fsrm"
if [ "${TE_RXE_KVM:-0}" = 1 ] && [ -w /dev/kvm ]; then
	accel=kvm
	cpu=host
fi

start=$(date +%s.%N)
timeout -k 10 "$limit" qemu-system-x86_64 \
	-accel "$accel" -cpu "$cpu" -m "$mem" -smp "$smp" \
	-display none -serial stdio -monitor none -no-reboot \
	-kernel "$kernel" -initrd "$initrd" \
	-append "console=ttyS0 quiet panic=-1 loglevel=4 tsc=reliable clocksource=tsc $kargs" \
	-nic none </dev/null 2>&1 | tr -d '\r' >"$log"
qrc=${PIPESTATUS[0]}
end=$(date +%s.%N)
printf '@@HOST wall=%s qemu_rc=%s smp=%s accel=%s\n' \
	"$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')" "$qrc" "$smp" "$accel" >>"$log"
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
	echo "boot.sh: the guest ran past ${limit}s" >&2
	exit 124
fi
rc=$(sed -n 's/^@@GUEST-EXIT=\([0-9]*\).*/\1/p' "$log" | tail -n 1)
if [ -z "$rc" ]; then
	echo "boot.sh: the guest reported no exit status (see $log)" >&2
	exit 125
fi
exit "$rc"
