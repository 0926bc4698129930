/* SPDX-License-Identifier: Apache-2.0 */
/* retry.h: the core's retry policy: backoff, the retry queue, quarantine, fallback, deadlines. */
#ifndef TE_CORE_RETRY_H
#define TE_CORE_RETRY_H

#include <stdbool.h>
#include <stdint.h>

#include <te/te.h>

struct engine;
struct transport;
struct slice;

/*
 * retry_plan - @s failed with the retryable @status: count the failure against its device
 * and, while attempts and deadline allow, queue it for a retry after backoff (true; the
 * slice keeps its batch reference). False: the slice ends (or retry_fallback moves it).
 */
bool retry_plan(struct engine *e, struct slice *s, enum te_status status, const char *detail);

/*
 * retry_fallback - transfer.fallback: @s's transport gave up on the peer (@status): move
 * it to the next transport, in priority order, that reaches the same segment with this
 * memory. True when requeued (it keeps its batch reference).
 */
bool retry_fallback(struct engine *e, struct slice *s, enum te_status status, const char *detail);

/* Queue @s for a retry at s->retry_at_ns (the engine->retry_head list is this module's). */
void retry_queue(struct engine *e, struct slice *s);

/* Retries due at @now, unlinked (->next chained); *next_out: when the next one is due. */
struct slice *retry_take_due(struct engine *e, uint64_t now, uint64_t *next_out);

/* Whether a queued retry is due at @now (caller holds engine->work_lock). */
bool retry_due_locked(struct engine *e, uint64_t now);

/* Teardown: release every queued retry. */
void retry_drop_all(struct engine *e);

/* A slice deadline of @deadline_ns exists (engine->next_deadline_ns is this module's). */
void retry_note_deadline(struct engine *e, uint64_t deadline_ns);
uint64_t retry_next_deadline(struct engine *e);

/* Worker: time out slices past their deadline; returns batches that had some. */
unsigned retry_check_deadlines(struct engine *e, uint64_t now_ns);

/* te_batch_cancel, and engine teardown for every live batch. */
enum te_status retry_cancel(struct engine *e, te_batch_id id);
void retry_cancel_all(struct engine *e);

#endif /* TE_CORE_RETRY_H */
