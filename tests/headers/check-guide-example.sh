#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-guide-example.sh: build the example plugin of docs/plugin-guide.md out of tree (as the
# guide says), check its exports, and load it with te-info: the guide's code cannot rot.
# Usage: CC="cc" check-guide-example.sh GUIDE.md INCLUDE_DIR TE_INFO
set -eu
guide=$1
incdir=$2
te_info=$3
cc=${CC:-cc}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/plugins"

awk '/<!-- plugin-guide-example: begin -->/ { on = 1; next }
     /<!-- plugin-guide-example: end -->/ { on = 0 }
     on && !/^```/ { print }' "$guide" >"$tmp/example.c"
if ! [ -s "$tmp/example.c" ]; then
	echo "no example between the plugin-guide-example markers in $guide"
	exit 1
fi
printf '{\n\tglobal: te_plugin_entry_v1;\n\tlocal: *;\n};\n' >"$tmp/example.map"

# shellcheck disable=SC2086 # CC may be "ccache cc"
$cc -std=gnu17 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -Wmissing-prototypes -Wshadow \
	-fPIC -fvisibility=hidden -I"$incdir" -shared -o "$tmp/plugins/example.so" \
	"$tmp/example.c" -Wl,-z,defs -Wl,--version-script="$tmp/example.map"

syms=$(nm -D --defined-only "$tmp/plugins/example.so" | awk '$2 != "A" { print $3 }' | sed 's/@.*//')
if [ "$syms" != te_plugin_entry_v1 ]; then
	echo "example.so exports: $syms"
	exit 1
fi

"$te_info" --plugin-path "$tmp/plugins" >"$tmp/out.txt"
"$te_info" --json --plugin-path "$tmp/plugins" >"$tmp/out.json"
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
assert [d["name"] for d in p["devices"]] == ["example0"], p
print("te-info --json: example loads, caps and devices as written")
PY
