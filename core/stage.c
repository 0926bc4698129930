/* SPDX-License-Identifier: Apache-2.0 */
/* stage.c: per-transport pools of host bounce buffers for memory a transport cannot reach. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/batch.h"
#include "core/engine.h"
#include "core/mem.h"
#include "core/memkind.h"
#include "core/stage.h"
#include "core/transport.h"
#include "core/wake.h"

/* Bounce buffers per transport: at most this many bytes, and between these counts. */
#define STAGE_POOL_BYTES (64ull << 20)
#define STAGE_MIN_BUFS 4u
#define STAGE_MAX_BUFS 64u

struct stage_pool {
	GMutex lock;
	uint8_t *base; /* n * buf_size bytes of host memory, registered with the transport */
	uint64_t buf_size;
	uint32_t n;
	uint32_t *free_ids;
	uint32_t n_free;
	struct te_plugin_mem *handle;
	enum te_status setup; /* TE_OK once ready; a setup failure sticks */
	char why[200];
};

bool stage_possible(struct engine *e, struct transport *tp, uint32_t mem_type)
{
	return (tp->caps.mem_types & TE_PLUGIN_MEM_CPU) && memkind_owner(e, mem_type);
}

/*
 * Make @tp's pool (once). Plain host memory: it lives until after the plugins' fini (a plugin
 * may touch it until then), which memory of another plugin (pinned by a GPU's owner) would not.
 */
static struct stage_pool *stage_pool_get(struct engine *e, struct transport *tp)
{
	struct stage_pool *p;
	uint64_t total;
	void *base = NULL;
	enum te_status st;

	g_mutex_lock(&tp->stage_lock);
	p = tp->stage;
	if (p) {
		g_mutex_unlock(&tp->stage_lock);
		return p;
	}
	p = g_new0(struct stage_pool, 1);
	g_mutex_init(&p->lock);
	p->buf_size = MAX(e->slice_size[tp->index], (uint64_t)4096);
	p->n = (uint32_t)CLAMP(STAGE_POOL_BYTES / p->buf_size, (uint64_t)STAGE_MIN_BUFS,
			       (uint64_t)STAGE_MAX_BUFS);
	total = p->buf_size * p->n;
	if (posix_memalign(&base, 4096, total) != 0)
		base = NULL;
	if (!base) {
		p->setup = TE_ERR_NOMEM;
		g_snprintf(p->why, sizeof(p->why), "no %" PRIu64 " bytes of staging memory for %s",
			   total, tp->plugin->name);
	} else {
		p->base = base;
		st = transport_reg_mem(tp, base, total, TE_PLUGIN_MEM_CPU, -1, 0, &p->handle);
		p->setup = st;
		if (st != TE_OK)
			g_snprintf(p->why, sizeof(p->why),
				   "%s: registering %" PRIu64 " bytes of staging memory: %s%s%s",
				   tp->plugin->name, total, te_status_str(st),
				   *transport_error(tp) ? ": " : "", transport_error(tp));
	}
	p->free_ids = g_new(uint32_t, p->n);
	for (uint32_t i = 0; i < p->n; i++)
		p->free_ids[i] = p->n - 1 - i;
	p->n_free = p->setup == TE_OK ? p->n : 0;
	tp->stage = p;
	g_mutex_unlock(&tp->stage_lock);
	ENGINE_LOG(e, p->setup == TE_OK ? TE_LOG_INFO : TE_LOG_WARN,
		   "%s: %s%u staging buffers of %" PRIu64 " bytes%s%s", tp->plugin->name,
		   p->setup == TE_OK ? "" : "no ", p->n, p->buf_size, p->setup == TE_OK ? "" : ": ",
		   p->setup == TE_OK ? "" : p->why);
	return p;
}

enum te_status stage_attach(struct engine *e, struct slice *s, char *why, size_t why_len)
{
	const struct mem_region *r = s->task->region;
	struct stage_pool *p = stage_pool_get(e, s->tp);
	enum te_status st;
	uint32_t id;

	if (p->setup != TE_OK) {
		g_snprintf(why, why_len, "%s", p->why);
		return p->setup;
	}
	if (s->ps.length > p->buf_size) {
		g_snprintf(why, why_len,
			   "%s: a slice of %" PRIu64
			   " bytes is larger than its staging buffers (%" PRIu64 ")",
			   s->tp->plugin->name, s->ps.length, p->buf_size);
		return TE_ERR_TOO_LARGE;
	}
	g_mutex_lock(&p->lock);
	if (!p->n_free) {
		g_mutex_unlock(&p->lock);
		return TE_ERR_AGAIN;
	}
	id = p->free_ids[--p->n_free];
	g_mutex_unlock(&p->lock);
	s->bounce = id;
	s->ps.local = p->base + (uint64_t)id * p->buf_size;
	s->ps.local_mem = p->handle;
	if (s->ps.opcode != TE_PLUGIN_OP_WRITE)
		return TE_OK;
	st = memkind_copy(e, s->ps.local, s->stage_local, s->ps.length, r->mem_type, r->dev,
			  TE_PLUGIN_COPY_TO_HOST);
	if (st == TE_OK)
		return TE_OK;
	g_snprintf(why, why_len,
		   "staging: copying %" PRIu64 " bytes out of %s at %p failed: %s%s%s",
		   s->ps.length, r->location, s->stage_local, te_status_str(st),
		   *transport_op_error() ? ": " : "", transport_op_error());
	stage_release(e, s);
	return st;
}

void stage_release(struct engine *e, struct slice *s)
{
	struct stage_pool *p = s->tp->stage;
	bool was_empty;

	if (s->bounce == UINT32_MAX || !p)
		return;
	g_mutex_lock(&p->lock);
	was_empty = p->n_free == 0;
	p->free_ids[p->n_free++] = s->bounce;
	g_mutex_unlock(&p->lock);
	s->bounce = UINT32_MAX;
	s->ps.local = s->stage_local;
	s->ps.local_mem = NULL;
	/* Slices waiting for a buffer sit in the backlog: let the worker post them. */
	if (was_empty)
		wake_kick(e);
}

void stage_detach(struct engine *e, struct slice *s, enum te_status *status, char *why,
		  size_t why_len)
{
	const struct mem_region *r = s->task->region;

	if (s->bounce == UINT32_MAX)
		return;
	if (*status == TE_OK && s->ps.opcode == TE_PLUGIN_OP_READ) {
		enum te_status st = memkind_copy(e, s->stage_local, s->ps.local, s->ps.length,
						 r->mem_type, r->dev, TE_PLUGIN_COPY_FROM_HOST);

		if (st != TE_OK) {
			g_snprintf(why, why_len,
				   "staging: copying %" PRIu64
				   " bytes into %s at %p failed: %s%s%s",
				   s->ps.length, r->location, s->stage_local, te_status_str(st),
				   *transport_op_error() ? ": " : "", transport_op_error());
			*status = st;
		}
	}
	stage_release(e, s);
}

void stage_pool_free(struct transport *tp)
{
	struct stage_pool *p = tp->stage;

	if (!p)
		return;
	/* After the plugin's fini, which released its registration of the pool. */
	free(p->base);
	g_free(p->free_ids);
	g_mutex_clear(&p->lock);
	g_free(p);
	tp->stage = NULL;
}
