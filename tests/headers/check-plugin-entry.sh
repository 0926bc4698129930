#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-plugin-entry.sh: a module built with TE_PLUGIN_DEFINE exports exactly the
# unmangled entry point (catches C++ name mangling and visibility mistakes).
# Usage: check-plugin-entry.sh MODULE [ENTRY_NAME]
set -u
mod=$1
entry=${2:-te_plugin_entry_v1}
syms=$(nm -D --defined-only "$mod" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)
if [ "$syms" = "$entry" ]; then
	echo "$mod exports $entry only"
	exit 0
fi
echo "$mod: expected exactly '$entry' exported, found:"
printf '%s\n' "${syms:-(nothing)}" | sed 's/^/  /'
exit 1
