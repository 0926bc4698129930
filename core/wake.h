/* SPDX-License-Identifier: Apache-2.0 */
/* wake.h: the worker's doorbell, and whether application threads drive manual progress now. */
#ifndef TE_CORE_WAKE_H
#define TE_CORE_WAKE_H

#include <stdbool.h>
#include <stdint.h>

struct engine;

/* Wake the worker (backlog, retry or manual progress needed). */
void wake_kick(struct engine *e);

/* Wake the worker even from a short sleep (notifies to send, a retry queued). */
void wake_kick_hard(struct engine *e);

/*
 * Whether application threads drive manual progress (te_batch_wait now, or within
 * WAKE_DRIVE_NS; the worker takes over when that lapses).
 */
#define WAKE_DRIVE_NS 1000000ull
bool wake_user_driving(struct engine *e, uint64_t now);

#endif /* TE_CORE_WAKE_H */
