#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# soak.sh: mixed READ/WRITE with random sizes, cancels and a target restart every minute.
#
# Usage: bench/soak.sh [-C BUILD] [--minutes N] [--restart-every S] [other soak_driver options]
#   Runs tests/system/soak_driver (built with the tree) against a te-node on loopback over
#   tcp for N minutes (10): batches of 1-8 READs/WRITEs of 1 B .. 4 MiB, 20% of them
#   canceled, the target killed mid-batch and restarted at the same address every S seconds
#   (60). Every completed byte is verified; RSS and descriptors of both processes are
#   sampled every minute. Ends with "soak: summary ... result=pass|FAIL" and exits 1 on an
#   unexpected status, a verification failure, or growth beyond the bounds.
#   Other options: --report-every S, --window S, --cancel-pct P, --timeout-ms MS, --port P,
#   --seed N (soak_driver --help). Env: BUILD (build).
set -euo pipefail

me=soak.sh
# shellcheck source=bench/common.bash
. "$(dirname "$0")/common.bash"
driver=$build/tests/system/soak_driver
node=$build/tests/system/te-node
if [ ! -x "$driver" ] || [ ! -x "$node" ]; then
	echo "soak.sh: $driver or $node is missing: build first (ninja -C $build)" >&2
	exit 2
fi
export TE_PLUGIN_PATH=$build/plugins/tcp${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}
if [ ! -f "$build/plugins/tcp/tcp.so" ]; then
	echo "soak.sh: $build/plugins/tcp/tcp.so is missing (the tcp plugin is not built)" >&2
	exit 2
fi
echo "soak.sh: $(nproc) CPUs, $(uname -r), build $build" >&2
exec "$driver" --te-node "$node" "${args[@]}"
