#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bundle.sh: copy what tests/hw-gpu/run.sh and bench/compare-gpu.sh need from a build into a
# folder that runs on a GPU machine without te's build dependencies (a CUDA image with no
# glib, libyaml, json-glib, libcurl or hiredis): the programs and plugins keep their places
# under OUT/build (their run paths are relative, $ORIGIN), and every shared library they need
# apart from the C library's own goes into OUT/lib.
#
# Usage: tests/hw-gpu/bundle.sh BUILD_DIR OUT_DIR
# Then, on the GPU machine:  LD_LIBRARY_PATH=OUT/lib tests/hw-gpu/run.sh OUT/build
#                            (with TE_HW_GPU_NO_BUILD=1: the bundle has no sources to build)
#                            LD_LIBRARY_PATH=OUT/lib CUDA_LIB=libcuda.so.1 bench/compare-gpu.sh -C OUT/build
# The machine's C library must be at least as new as the one the build linked against.
set -euo pipefail

[ $# -eq 2 ] || {
	echo "usage: $0 BUILD_DIR OUT_DIR" >&2
	exit 2
}
build=$1
out=$2
files=(core/libte.so.0 plugins/nvlink/nvlink.so plugins/tcp/tcp.so tools/te-bench
	tests/system/te-node tests/gpu/gpu_test tests/hw-gpu/dtod_bw tests/plugins/loopback.so)
for f in "${files[@]}"; do
	[ -e "$build/$f" ] || {
		echo "bundle.sh: $build/$f is not built (ninja -C $build; nvlink needs cuda.h)" >&2
		exit 1
	}
done
rm -rf "$out"
mkdir -p "$out/build" "$out/lib"
# run.sh takes a folder with build.ninja for a configured build; the bundle never rebuilds.
echo "# bundle of $(cd "$build" && pwd) made $(date -u +%FT%TZ); not a build" >"$out/build/build.ninja"
for f in "${files[@]}"; do
	mkdir -p "$out/build/$(dirname "$f")"
	cp -L "$build/$f" "$out/build/$f"
	strip --strip-debug "$out/build/$f" 2>/dev/null || true
done
# The libraries: what ldd resolves outside the build, less the C library's own (the machine's
# loader must match them).
for f in "${files[@]}"; do
	ldd "$build/$f"
done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
	case $(basename "$lib") in
	libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux*) continue ;;
	esac
	case $lib in "$(cd "$build" && pwd)"/*) continue ;; esac
	cp -L "$lib" "$out/lib/$(basename "$lib")"
done
du -sh "$out" | awk -v o="$out" '{ print "bundle.sh: " o ": " $1 }'
