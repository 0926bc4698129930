#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-plugin-entry.sh: TAP test that every plugin module exports exactly its one entry point
# (catches C++ name mangling, visibility and version-script mistakes).
#
# Usage: check-plugin-entry.sh [ENTRY_NAME] MODULE... | MODULE ENTRY_NAME
# ENTRY_NAME (te_plugin_entry_v<major>, default te_plugin_entry_v1) may come first or last; any
# other argument is a module. A module exports ENTRY_NAME and nothing else; the ABI test modules
# wrong_major* may export the next major's entry instead, no_entry* must export no entry point,
# and not_a_plugin* is expected not to be an ELF object at all.
set -u

entry=te_plugin_entry_v1
mods=
for arg in "$@"; do
	case $arg in
	te_plugin_entry_v[0-9]*) entry=$arg ;;
	*) mods="$mods $arg" ;;
	esac
done
major=${entry#te_plugin_entry_v}
next=te_plugin_entry_v$((major + 1))

if ! command -v nm >/dev/null 2>&1; then
	echo "1..0 # SKIP nm not found"
	exit 0
fi

set -- $mods
echo "1..$#"
n=0
failed=0
for mod in "$@"; do
	n=$((n + 1))
	stem=$(basename "$mod" .so)
	# Defined dynamic symbols, names only; a version script may add its node name (ABS).
	if ! syms=$(LC_ALL=C nm -D --defined-only "$mod" 2>&1); then
		case $stem in
		not_a_plugin*)
			echo "ok $n - $stem: not an ELF object (expected)"
			;;
		*)
			echo "not ok $n - $stem: nm failed: $(echo "$syms" | head -n 1)"
			failed=1
			;;
		esac
		continue
	fi
	syms=$(echo "$syms" |
	       awk 'NF >= 3 && $2 != "A" { print $3 } NF == 2 && $1 != "A" { print $2 }' |
	       sed 's/@.*//' | sort -u)
	got=$(echo "$syms" | tr '\n' ' ' | sed 's/ *$//')
	case $stem in
	no_entry*)
		if echo "$syms" | grep -q '^te_plugin_entry'; then
			echo "not ok $n - $stem: exports an entry point: $got"
			failed=1
		else
			echo "ok $n - $stem: no te_plugin_entry symbol (exports: ${got:-nothing})"
		fi
		continue
		;;
	not_a_plugin*)
		echo "not ok $n - $stem: is an ELF object, expected plain text"
		failed=1
		continue
		;;
	wrong_major*)
		want="$entry $next"
		;;
	*)
		want=$entry
		;;
	esac
	ok=0
	for w in $want; do
		[ "$got" = "$w" ] && ok=1
	done
	if [ $ok = 1 ]; then
		echo "ok $n - $stem exports exactly $got"
	else
		echo "not ok $n - $stem: expected exactly one of [$want], got [${got:-nothing}]"
		failed=1
	fi
done
exit $failed
