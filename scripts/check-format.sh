#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# check-format.sh: check every tracked *.c and *.h against .clang-format; --fix rewrites them.
#
# Usage: scripts/check-format.sh [--fix] [FILE...]
#   Without FILEs: all tracked (and untracked, not ignored) C files of the repository.
#   Exit 0 when all are formatted; 1 listing the offenders; 2 when clang-format is missing.
#   CLANG_FORMAT overrides the binary (default: clang-format, then clang-format-14).
set -uo pipefail

fix=0
files=()
for a in "$@"; do
	case "$a" in
	--fix) fix=1 ;;
	-h | --help)
		sed -n '3,8p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) files+=("$a") ;;
	esac
done

top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null) || top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
	for c in clang-format clang-format-14; do
		if command -v "$c" >/dev/null 2>&1; then
			cf=$c
			break
		fi
	done
fi
if [ -z "$cf" ]; then
	echo "check-format.sh: clang-format not found (scripts/install-deps.sh installs it)" >&2
	exit 2
fi

if [ ${#files[@]} -eq 0 ]; then
	if git rev-parse --git-dir >/dev/null 2>&1; then
		# Tracked files plus new ones not yet added (but not ignored ones).
		mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' | sort -u)
	else
		mapfile -t files < <(find . -path ./build\* -prune -o \( -name '*.c' -o -name '*.h' \) -print | sed 's|^\./||' | sort)
	fi
fi

bad=()
n=0
for f in "${files[@]}"; do
	[ -f "$f" ] || continue # deleted in the working tree
	n=$((n + 1))
	if [ "$fix" = 1 ]; then
		"$cf" -i --style=file "$f" || bad+=("$f")
	elif ! "$cf" --dry-run --Werror --style=file "$f" >/dev/null 2>&1; then
		bad+=("$f")
	fi
done

if [ ${#bad[@]} -ne 0 ]; then
	if [ "$fix" = 1 ]; then
		echo "check-format.sh: clang-format failed on:" >&2
	else
		echo "check-format.sh: ${#bad[@]} of $n files are not formatted (fix: scripts/check-format.sh --fix):" >&2
	fi
	printf '  %s\n' "${bad[@]}" >&2
	exit 1
fi
[ "$fix" = 1 ] && echo "check-format.sh: formatted $n files"
[ "$fix" = 1 ] || echo "check-format.sh: $n files formatted correctly"
exit 0
