#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run-libfuzzer.sh: build one fuzz target with clang's libFuzzer + ASan/UBSan and run it.
#
# usage: fuzz/run-libfuzzer.sh [TARGET] [SECONDS] [extra libFuzzer flags...]
#   TARGET   fuzz/<TARGET>_fuzz.c with seeds in fuzz/corpus/<TARGET>/ (default: config)
#   SECONDS  run time (default: 120)
# New inputs go to $TE_FUZZ_WORK/<TARGET> (default /tmp/te-fuzz), never into the seed
# corpus; crashes land in the current directory as crash-*: add them to the corpus.
set -eu

target=${1:-config}
seconds=${2:-120}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] && shift

root=$(cd "$(dirname "$0")/.." && pwd)
work=${TE_FUZZ_WORK:-/tmp/te-fuzz}/$target
cc=${CLANG:-clang}

# Core sources each target needs besides its own file. Add a line per new target.
case $target in
config) srcs="core/config.c"; pkgs="glib-2.0 yaml-0.1" ;;
descriptor) srcs="core/metadata/descriptor.c"; pkgs="glib-2.0 json-glib-1.0" ;;
rpc) srcs="core/rpc_codec.c"; pkgs="glib-2.0" ;;
*) echo "run-libfuzzer.sh: unknown target '$target' (add it to the case table)" >&2; exit 2 ;;
esac

mkdir -p "$work/corpus"
bin="$work/${target}_fuzz"
# shellcheck disable=SC2046,SC2086 # word splitting of flags is intended
(cd "$root" && "$cc" -std=gnu17 -g -O1 -fno-omit-frame-pointer \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-I include -I . fuzz/"${target}"_fuzz.c $srcs \
	$(pkg-config --cflags --libs $pkgs) -o "$bin")

# fuzz/<TARGET>.dict, when present, seeds the mutator with the grammar's words.
dict=
[ -f "$root/fuzz/$target.dict" ] && dict="-dict=$root/fuzz/$target.dict"

# New units go to the first directory; the seed corpus is only read.
# shellcheck disable=SC2086 # $dict is empty or one word
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
	-print_final_stats=1 $dict "$@" "$work/corpus" "$root/fuzz/corpus/$target"
