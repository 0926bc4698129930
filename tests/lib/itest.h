/* SPDX-License-Identifier: Apache-2.0 */
/* itest.h: engines in the test process: engine pairs, guarded buffers, patterns, plugin files. */
#ifndef TE_TESTS_LIB_ITEST_H
#define TE_TESTS_LIB_ITEST_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include <te/te.h>

#include "tlib.h"

/* Upper bound for every te_batch_wait that is expected to finish: 60 s. */
#define ITEST_WAIT_NS (60ll * 1000 * 1000 * 1000)

/*
 * One transport entry of an engine configuration. @options and @path may be NULL;
 * @options is the inside of a YAML flow map ("progress: manual, queue_depth: 1").
 */
struct itest_transport {
	const char *name;
	const char *path;
	bool required;
	const char *options;
};

/*
 * YAML text (g_free) for an engine called @name with the given transports and
 * @transfer (inside of the transfer: flow map, NULL for none).
 */
char *itest_yaml(const char *name, const struct itest_transport *transports, size_t n,
		 const char *transfer);

/* Create an engine from YAML text; aborts the test with te_last_error() on failure. */
struct te_engine *itest_engine(const char *yaml);

/* Shorthand: engine @name with one required transport @plugin with @options. */
struct te_engine *itest_engine1(const char *name, const char *plugin, const char *options,
				const char *transfer);

/*
 * A pair of engines in this process: a is the initiator, b the target. b's
 * buffers must be registered before itest_pair_connect() imports b's descriptor
 * into a as segment seg.
 */
struct itest_pair {
	struct te_engine *a;
	struct te_engine *b;
	te_segment_id seg;
};

void itest_pair_new(struct itest_pair *p, const char *plugin, const char *options,
		    const char *transfer);
void itest_pair_connect(struct itest_pair *p);
void itest_pair_free(struct itest_pair *p);

/*
 * Test buffer with guard zones: data is what tests use; @guard bytes on each side
 * are filled with a pattern and checked by itest_buf_guards_ok. The whole span
 * [data - guard, data + len + guard) is registered when the test registers it.
 */
struct itest_buf {
	uint8_t *base; /* allocation: guard + len + guard */
	uint8_t *data;
	size_t len;
	size_t guard;
	uint32_t seed;
};

void itest_buf_new(struct itest_buf *b, size_t len, size_t guard, uint32_t seed);
void itest_buf_free(struct itest_buf *b);
/* Register the whole span (guards included) with @engine. */
void itest_buf_register(struct itest_buf *b, struct te_engine *engine, uint32_t access);
/* Fill the whole span (guards included) with the buffer's pattern. */
void itest_buf_fill(struct itest_buf *b);

/*
 * The fixture most cases start from: a pair (as itest_pair_new) with buffer la on a
 * (TE_MEM_LOCAL, seed 1) and rb on b (TE_MEM_REMOTE, seed 2), each @len bytes with @guard
 * bytes on each side, connected.
 */
struct itest_fx {
	struct itest_pair p;
	struct itest_buf la, rb;
};

void itest_fx_new(struct itest_fx *f, const char *plugin, const char *options, const char *transfer,
		  size_t len, size_t guard);
void itest_fx_free(struct itest_fx *f);

/* Pattern byte for absolute offset @off of a span seeded with @seed. */
static inline uint8_t itest_pattern(uint32_t seed, size_t off)
{
	uint64_t x = (uint64_t)off * 0x9e3779b97f4a7c15ull + seed;

	x ^= x >> 29;
	return (uint8_t)(x ^ (x >> 17));
}

/*
 * Check that @b->data[off, off+len) holds src's pattern from @src_off (the bytes
 * moved), reporting the first mismatch. Returns true when equal.
 */
bool itest_range_is(const struct itest_buf *b, size_t off, size_t len, const struct itest_buf *src,
		    size_t src_off);

/*
 * Check that every byte of @b's span outside the ranges [offs[i], offs[i]+lens[i])
 * (offsets relative to data) still holds @b's own pattern.
 */
bool itest_untouched_outside(const struct itest_buf *b, const size_t *offs, const size_t *lens,
			     size_t n);

/* Remote address of @b->data + @off (for requests towards the engine owning @b). */
static inline uint64_t itest_raddr(const struct itest_buf *b, size_t off)
{
	return (uint64_t)(uintptr_t)(b->data + off);
}

/*
 * Path of test plugin file "<name>.so" found along $TE_PLUGIN_PATH (then the
 * source tree's tests/plugins); NULL if absent. g_free.
 */
char *itest_plugin_file(const char *name);

/* Wait for @batch with ITEST_WAIT_NS; asserts the wait did not time out. */
enum te_status itest_wait(struct te_engine *e, te_batch_id batch);

/* te_task_status that must succeed. */
struct te_task_info itest_task(struct te_engine *e, te_batch_id batch, uint32_t task);

/* te_batch_status that must succeed. */
struct te_batch_info itest_batch(struct te_engine *e, te_batch_id batch);

struct loggate;

/*
 * @g holds a thread of @e inside a host call that names the peer of segment @seg (its log
 * line): close @seg from another thread and check that the close (its unload_peer) does not
 * return while the call is held, and does once @g lets it go (within ITEST_HELD_WAIT_MS: a
 * hang means a deadlock). A plugin must not name a peer after unload_peer returned
 * (te_plugin.h).
 */
#define ITEST_HELD_WAIT_MS 30000
void itest_close_waits_for_held_call(struct te_engine *e, te_segment_id seg, struct loggate *g);

/* The same for te_engine_free of @e (then freed). */
void itest_free_waits_for_held_call(struct te_engine *e, struct loggate *g);

#endif /* TE_TESTS_LIB_ITEST_H */
