#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bundle_test.sh: tests/hw-gpu/bundle.sh makes a folder that runs without te's build tree: every
# program and plugin in it finds its shared libraries in the bundle (apart from the C
# library's own) and libte beside it, and te-bench runs from it; a build without a file the
# bundle needs is refused with its name.
#
# Usage: bundle_test.sh BUILD_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-bundle-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

"$here/bundle.sh" "$build" "$tmp/b" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "bundle.sh exited $?"; exit 1; }
grep -q "^bundle.sh: $tmp/b: " "$tmp/out" || fail "no size line: $(cat "$tmp/out")"
[ -f "$tmp/b/build/build.ninja" ] || fail "no build.ninja marker (run.sh takes it for a configured build)"
for f in core/libte.so.0 plugins/nvlink/nvlink.so plugins/tcp/tcp.so tools/te-bench \
	tests/system/te-node tests/gpu/gpu_test tests/hw-gpu/dtod_bw tests/plugins/loopback.so; do
	[ -f "$tmp/b/build/$f" ] || { fail "$f missing from the bundle"; continue; }
	# Every library resolves into the bundle (lib/ or its own libte), or is the C library's.
	LD_LIBRARY_PATH=$tmp/b/lib ldd "$tmp/b/build/$f" | awk '$2 == "=>" { print $1, $3 }' |
		while read -r name path; do
			case $name in libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.*) continue ;; esac
			case $path in "$tmp/b/"*) ;; *) echo "$f: $name -> $path" ;; esac
		done >"$tmp/leak"
	[ -s "$tmp/leak" ] && fail "libraries from outside the bundle: $(tr '\n' ';' <"$tmp/leak")"
done
out=$(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$tmp/b/lib" "$tmp/b/build/tools/te-bench" --version 2>&1) ||
	fail "te-bench --version from the bundle: $out"
case $out in *te-bench*) ;; *) fail "te-bench --version printed: $out" ;; esac

# A build without one of the files: refused, naming it; nothing half made is left as a bundle.
mkdir -p "$tmp/partial/core"
cp -L "$build/core/libte.so.0" "$tmp/partial/core/"
if "$here/bundle.sh" "$tmp/partial" "$tmp/p" >"$tmp/out" 2>&1; then
	fail "bundle.sh of a build without nvlink succeeded"
fi
grep -q "plugins/nvlink/nvlink.so is not built" "$tmp/out" || fail "refusal does not name the file: $(cat "$tmp/out")"
[ ! -e "$tmp/p" ] || fail "a refused bundle left $tmp/p"
if [ "$fails" -ne 0 ]; then
	echo "$fails check(s) failed"
	exit 1
fi
echo "ok: bundle of $build runs on its own libraries"
