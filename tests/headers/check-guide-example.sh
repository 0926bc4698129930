#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-guide-example.sh: the example plugin of docs/plugin-guide.md, as a vendor builds it:
# te is installed (meson install into a scratch folder), the example is cut out of the guide
# and compiled against the *installed* te-plugin.pc, its exports checked, te-info loads it,
# and the installed te-conformance runs the whole suite on it (two processes). The guide's
# code cannot rot.
# Usage: CC="cc" check-guide-example.sh GUIDE.md BUILD_ROOT
set -eu
guide=$1
build=$2
cc=${CC:-cc}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest
mkdir "$tmp/plugins"

# 1. Install te as a package would, into $dest.
meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/install.log" 2>&1 || {
	cat "$tmp/install.log"
	echo "meson install failed"
	exit 1
}
pc=$(find "$dest" -name te-plugin.pc | head -n 1)
if [ -z "$pc" ]; then
	echo "no te-plugin.pc installed under $dest"
	exit 1
fi
export PKG_CONFIG_PATH="$(dirname "$pc")"
export PKG_CONFIG_SYSROOT_DIR="$dest"
bindir=$(dirname "$(find "$dest" -name te-info -type f | head -n 1)")

# What the install carries besides the library: documentation, example configurations and
# programs, the Python package; and te-bench finds the installed libte.so.0 by itself
# (RUNPATH relative to the binary: no LD_LIBRARY_PATH in a private prefix).
for f in doc/te/LICENSE doc/te/CHANGELOG.md doc/te/conf/default.yaml \
	doc/te/examples/c/write_read.c doc/te/plugin-guide.md; do
	if [ -z "$(find "$dest" -path "*/share/$f" | head -n 1)" ]; then
		echo "meson install did not install share/$f"
		exit 1
	fi
done
if command -v python3 >/dev/null && [ -z "$(find "$dest" -path '*/te/_engine.py' | head -n 1)" ]; then
	echo "meson install did not install the Python package te"
	exit 1
fi
bench_version=$(env -u LD_LIBRARY_PATH "$bindir/te-bench" --version) || {
	echo "the installed te-bench does not start without LD_LIBRARY_PATH"
	exit 1
}
case "$bench_version" in
"te-bench "*) echo "installed: $bench_version (libte found through its RUNPATH)" ;;
*)
	echo "te-bench --version said: $bench_version"
	exit 1
	;;
esac

# 2. The guide's code, built the way the guide says.
awk '/<!-- plugin-guide-example: begin -->/ { on = 1; next }
     /<!-- plugin-guide-example: end -->/ { on = 0 }
     on && !/^```/ { print }' "$guide" >"$tmp/example.c"
if ! [ -s "$tmp/example.c" ]; then
	echo "no example between the plugin-guide-example markers in $guide"
	exit 1
fi
printf '{\n\tglobal: te_plugin_entry_v1;\n\tlocal: *;\n};\n' >"$tmp/example.map"
cflags=$(pkg-config --cflags te-plugin)
case "$cflags" in
*"$dest"*) ;;
*)
	echo "pkg-config --cflags te-plugin gave '$cflags', not the installed headers"
	exit 1
	;;
esac
echo "building against the installed te-plugin.pc: $cflags"
# shellcheck disable=SC2086 # CC may be "ccache cc"; cflags is a word list
$cc -std=gnu17 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -Wmissing-prototypes -Wshadow \
	-fPIC -fvisibility=hidden $cflags -shared -o "$tmp/plugins/example.so" \
	"$tmp/example.c" -Wl,-z,defs -Wl,--version-script="$tmp/example.map"

syms=$(nm -D --defined-only "$tmp/plugins/example.so" | awk '$2 != "A" { print $3 }' | sed 's/@.*//')
if [ "$syms" != te_plugin_entry_v1 ]; then
	echo "example.so exports: $syms"
	exit 1
fi

# 3. The installed te-info loads it.
"$bindir/te-info" --plugin-path "$tmp/plugins" >"$tmp/out.txt"
"$bindir/te-info" --json --plugin-path "$tmp/plugins" >"$tmp/out.json"
cat "$tmp/out.txt"
python3 - "$tmp/out.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
ps = doc["plugins"]
assert len(ps) == 1, ps
p = ps[0]
assert "error" not in p, p
assert p["name"] == "example" and p["abi"]["major"] == 1, p
assert p["caps"]["progress"] == "manual" and p["caps"]["ops"] == ["read", "write"], p
assert [d["name"] for d in p["devices"]] == ["cma0"], p
assert [o["name"] for o in p["options"]] == ["queue_depth"], p
print("te-info --json: example loads, caps, devices and options as written")
PY

# 4. The installed te-conformance passes it.
conf="$bindir/te-conformance"
if ! [ -x "$conf" ]; then
	echo "te-conformance was not installed"
	exit 1
fi
shim=$(find "$dest" -name 'te-conformance-shim.so' | head -n 1)
TE_CONFORMANCE_SHIM="$shim" "$conf" "$tmp/plugins/example.so"
