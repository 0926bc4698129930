#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# cxl-window.sh TE_CONFORMANCE CXL_SO [ARGS...]: te-conformance against the cxl plugin on a fresh
# 128 MiB window file (under /dev/shm when there is one), with options that name it and let
# te_mem_alloc("cxl:0") hand out the whole window; both files are removed afterwards.
set -u
conf=$1
so=$2
shift 2
dir=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && dir=/dev/shm
win=$(mktemp "$dir/te-conformance-cxl.XXXXXX") || exit 1
cfg=$(mktemp "${TMPDIR:-/tmp}/te-conformance-cxl.XXXXXX") || exit 1
trap 'rm -f "$win" "$cfg"' EXIT
trap 'exit 1' INT TERM
truncate -s 128M "$win" || exit 1
printf 'device: "%s"\nalloc_offset: 0\nalloc_size: 128M\n' "$win" >"$cfg"
"$conf" "$so" --config "$cfg" --location cxl:0 "$@"
