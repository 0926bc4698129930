# SPDX-License-Identifier: Apache-2.0
# common.bash: sourced by bench scripts (not named *.sh: `make bench` runs those): `-C BUILD`
# and --help parsing, the build directory made absolute, die. Set `me` (the script's name for
# messages) before sourcing; the usage text is the script's header comment from line 3 to
# `set -euo pipefail`.
# Leaves: build (absolute), top (the source tree), args (the arguments not consumed; from
# `--` on, all of them as given, `--` included). no_args: refuse any of them. cpu_mark and
# steal_since: bench/steal.bash.

: "${me:?set me to the script name before sourcing common.bash}"
build=${BUILD:-build}
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	-C)
		[ $# -ge 2 ] || {
			echo "$me: -C needs a build directory" >&2
			exit 2
		}
		build=$2
		shift
		;;
	-h | --help)
		sed -n '3,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	--)
		args+=("$@")
		break
		;;
	*) args+=("$1") ;;
	esac
	shift
done

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/steal.bash
. "$top/bench/steal.bash"
case "$build" in
/*) ;;
*) build=$top/$build ;;
esac

die() {
	echo "$me: $*" >&2
	exit 1
}

# An argument the script does not take: exit 2, naming it.
bad_arg() {
	echo "$me: unknown argument '$1' (try --help)" >&2
	exit 2
}

no_args() {
	[ ${#args[@]} = 0 ] || bad_arg "${args[0]}"
}
