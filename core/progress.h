/* SPDX-License-Identifier: Apache-2.0 */
/* progress.h: the worker threads, manual progress, and te_batch_wait driving it. */
#ifndef TE_CORE_PROGRESS_H
#define TE_CORE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include <te/te.h>

struct engine;

/*
 * More threads waited in te_batch_wait than may poll (transfer.max_pollers): none polls for
 * this long after, however long its batch. 2 threads on 2 CPUs, interleaved A/B
 * (bench/README.md, issue 18): 1.07-1.22x in four of eight cells against one thread polling
 * while the other slept, the rest within the noise; 200 us lapsed between batches often
 * enough to give back half of that. (Until 2026-12-06 a waiter with 256 tasks or more left
 * polled in a crowd: 4K READs at batch 1024 from 2 threads had run 1.13x with that poller.
 * Since a batch of 512 goes out and comes back in one sendmsg each way, that cell runs alike
 * without it, and READ 4K at batch 512 from 4 threads 1.26x, WRITE 1.11x.)
 */
#define PROGRESS_CROWDED_HOLD_NS (10ull * 1000 * 1000)

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
