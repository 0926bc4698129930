#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-libte-exports.sh: libte.so has a SONAME and exports only te_* symbols.
# Usage: check-libte-exports.sh LIBTE_SO   (TAP output)
set -u
lib=$1
echo "1..3"

soname=$(objdump -p "$lib" 2>/dev/null | awk '$1 == "SONAME" { print $2 }')
case "$soname" in
libte.so.*) echo "ok 1 - SONAME $soname" ;;
*) echo "not ok 1 - SONAME is '$soname', expected libte.so.<N>" ;;
esac

# Defined dynamic symbols; 'A' entries are the version nodes of libte.map (TE_0).
syms=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)
bad=$(printf '%s\n' "$syms" | grep -v '^te_' | grep -v '^$')
if [ -z "$bad" ]; then
	echo "ok 2 - only te_* symbols exported ($(printf '%s\n' "$syms" | grep -c '^te_'))"
else
	echo "not ok 2 - symbols outside te_* exported:"
	printf '%s\n' "$bad" | sed 's/^/#   /'
fi

if printf '%s\n' "$syms" | grep -qx 'te_status_str'; then
	echo "ok 3 - te_status_str is exported"
else
	echo "not ok 3 - te_status_str is not exported (version script or TE_API broken?)"
fi
