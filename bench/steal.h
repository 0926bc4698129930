/* SPDX-License-Identifier: Apache-2.0 */
/*
 * steal.h: the share of the machine's CPU time the hypervisor gave to other guests over an
 * interval (the steal column of /proc/stat), for te-bench and tcp-raw-loop.
 */
#ifndef TE_BENCH_STEAL_H
#define TE_BENCH_STEAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct steal_mark {
	bool known;
	uint64_t all, steal; /* clock ticks */
};

/* The machine's CPU time now, all and stolen (known false where /proc/stat says nothing). */
static inline struct steal_mark steal_mark_now(void)
{
	unsigned long long v[8] = { 0 };
	struct steal_mark m = { 0 };
	FILE *f = fopen("/proc/stat", "r");

	if (!f)
		return m;
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		   &v[4], &v[5], &v[6], &v[7]) == 8) {
		for (int i = 0; i < 8; i++)
			m.all += v[i];
		m.steal = v[7];
		m.known = true;
	}
	fclose(f);
	return m;
}

/* Percent of the CPU time between @a and a mark taken now that was stolen; < 0: unknown. */
static inline double steal_pct_since(struct steal_mark a)
{
	struct steal_mark b = steal_mark_now();

	if (!a.known || !b.known || b.all <= a.all)
		return -1.0;
	return 100.0 * (double)(b.steal - a.steal) / (double)(b.all - a.all);
}

#endif /* TE_BENCH_STEAL_H */
