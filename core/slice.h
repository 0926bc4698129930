/* SPDX-License-Identifier: Apache-2.0 */
/* slice.h: requests split into slices and posted to transports, back-pressure, completion. */
#ifndef TE_CORE_SLICE_H
#define TE_CORE_SLICE_H

#include <stddef.h>
#include <stdint.h>

#include <te/te.h>
#include <te/te_plugin.h>

struct engine;
struct transport;
struct slice;

/* te_batch_submit / te_batch_submit_notify (engine.c validates the engine pointer). */
enum te_status slice_submit(struct engine *e, te_batch_id id, const struct te_request *reqs,
			    size_t n);
enum te_status slice_submit_notify(struct engine *e, te_batch_id id, const struct te_request *reqs,
				   size_t n, const void *msg, size_t len);

/* Post @n slices of one transport (back-pressure goes to its backlog). */
void slice_post(struct engine *e, struct transport *tp, struct slice **slices, uint32_t n);

/* Worker/waiter: resubmit what back-pressure left behind; returns slices consumed. */
unsigned slice_drain_backlog(struct engine *e, struct transport *tp);

/* Teardown: release every slice left in @tp's backlog. */
void slice_drop_backlog(struct transport *tp);

/* Worker: the retry of @s is due (retry_take_due). */
void slice_retry(struct engine *e, struct slice *s);

/*
 * Around a progress() call on this thread: completions it reports settle their in_flight
 * decrements and batch references at slice_progress_end, in bulk.
 */
void slice_progress_begin(struct transport *tp);
void slice_progress_end(void);

/* Host service: a plugin finished one slice attempt. */
void slice_done(struct transport *tp, struct te_plugin_slice *ps, enum te_status status,
		uint64_t bytes, const char *detail);

#endif /* TE_CORE_SLICE_H */
