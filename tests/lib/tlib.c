/* SPDX-License-Identifier: Apache-2.0 */
/* tlib.c: what every test of tests/ shares: the clock and sleeping. */
#include "tlib.h"

int64_t now_ns(void)
{
	return g_get_monotonic_time() * 1000;
}

void sleep_ms(unsigned ms)
{
	g_usleep((gulong)ms * 1000);
}
