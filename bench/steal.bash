# SPDX-License-Identifier: Apache-2.0
# steal.bash: the hypervisor's steal for the compare scripts, POSIX sh (compare-rdma.sh
# sources it in the soft-RoCE guest's busybox sh; common.bash sources it for the others).
# Not named *.sh: `make bench` runs those.
#
#   mark=$(cpu_mark)       the machine's CPU time so far, "ALL STEAL" in clock ticks (the cpu
#                          line of /proc/stat; "- -" where it cannot be read)
#   steal_since "$mark"    the percentage of the CPU time since $mark that the hypervisor
#                          gave to other guests, one decimal; "?" where unknown
#
# TE_PROC_STAT names another file to read instead of /proc/stat (the tests use it).

cpu_mark() {
	awk '$1 == "cpu" && NF >= 9 {
		a = 0
		for (i = 2; i <= 9; i++)
			a += $i
		printf "%.0f %.0f\n", a, $9
		found = 1
		exit
	}
	END { if (!found) print "- -" }' "${TE_PROC_STAT:-/proc/stat}" 2>/dev/null || echo "- -"
}

steal_since() {
	awk -v m="$1" -v n="$(cpu_mark)" 'BEGIN {
		split(m, a, " ")
		split(n, b, " ")
		if (a[1] == "-" || b[1] == "-" || a[1] == "" || b[1] + 0 <= a[1] + 0)
			print "?"
		else
			printf "%.1f\n", 100 * (b[2] - a[2]) / (b[1] - a[1])
	}'
}
