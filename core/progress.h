/* SPDX-License-Identifier: Apache-2.0 */
/* progress.h: the worker threads, manual progress, and te_batch_wait driving it. */
#ifndef TE_CORE_PROGRESS_H
#define TE_CORE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include <te/te.h>

struct engine;

/* Start the worker (and transfer.worker_threads - 1 helpers); false if it cannot. */
bool progress_start(struct engine *e);
/* Stop and join the workers (engine teardown); no-op if none started. */
void progress_stop(struct engine *e);

/*
 * Drive every MANUAL transport (and, from a waiting thread, every hybrid one) and drain
 * backlogs once; returns work done. The worker (@from_worker) leaves manual progress to
 * threads waiting in te_batch_wait, and never polls hybrid transports (their threads do).
 */
unsigned progress_once(struct engine *e, bool from_worker);

/* te_batch_wait (engine.c validates the engine pointer). */
enum te_status progress_wait(struct engine *e, te_batch_id id, int64_t timeout_ns);

#endif /* TE_CORE_PROGRESS_H */
