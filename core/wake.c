/* SPDX-License-Identifier: Apache-2.0 */
/* wake.c: the worker's doorbell, and whether application threads drive manual progress now. */
#include "core/engine.h"
#include "core/wake.h"


void wake_kick(struct engine *e)
{
	/*
	 * seq_cst load pairs with the worker's store of sleeping before its re-check.
	 * A worker in a short (polling) sleep wakes by itself within 50 us: only a
	 * long sleep needs a signal, which keeps futex calls off the submit path.
	 */
	if (atomic_load(&e->sleeping) == 2) {
		g_mutex_lock(&e->work_lock);
		g_cond_signal(&e->work_cond);
		g_mutex_unlock(&e->work_lock);
	}
}

void wake_kick_hard(struct engine *e)
{
	g_mutex_lock(&e->work_lock);
	g_cond_signal(&e->work_cond);
	g_mutex_unlock(&e->work_lock);
}

/*
 * Whether application threads drive manual progress (in te_batch_wait now, or
 * within the last millisecond). Then the worker keeps away from those plugins: two
 * threads polling one queue only bounce cache lines. Relaxed: a stale view costs
 * one redundant or one skipped poll.
 */
bool wake_user_driving(struct engine *e, uint64_t now)
{
	return atomic_load_explicit(&e->drivers, memory_order_relaxed) ||
	       now - atomic_load_explicit(&e->last_drive_ns, memory_order_relaxed) < WAKE_DRIVE_NS;
}
