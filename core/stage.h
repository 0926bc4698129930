/* SPDX-License-Identifier: Apache-2.0 */
/* stage.h: host bounce buffers for local memory a transport cannot reach itself (GPU memory). */
#ifndef TE_CORE_STAGE_H
#define TE_CORE_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

struct engine;
struct transport;
struct slice;

/*
 * Staging. When a request's local memory is of a kind its transport does not move itself
 * (not in caps.mem_types, or reg_mem answered TE_ERR_UNSUPPORTED for the region: no handle)
 * but another loaded plugin owns (a GPU's), the transport is handed host
 * memory instead: a bounce buffer of the transport's own pool, registered with it. A WRITE's
 * bytes are copied into the bounce buffer (through the owner) before the slice is posted; a
 * READ's are copied out of it when the slice completes. A slice holds its buffer from posting
 * until the plugin hands it back; when the pool is empty, slices wait (back-pressure).
 */

/*
 * Whether transport @tp can carry requests whose local memory is of kind @mem_type through
 * staging: it moves host memory and a loaded plugin owns the kind. The caller decides that the
 * region is not moved directly (kind not in caps.mem_types, or no reg_mem handle for it).
 */
bool stage_possible(struct engine *e, struct transport *tp, uint32_t mem_type);

/*
 * Before posting staged slice @s to its transport: take a bounce buffer (point s->ps.local and
 * local_mem at it) and, for a WRITE, copy the slice's bytes into it.
 * TE_OK; TE_ERR_AGAIN when the pool is empty (nothing changed: post later); another error
 * with *why (a copy or the pool's setup failed): the slice has no buffer and must fail.
 */
enum te_status stage_attach(struct engine *e, struct slice *s, char *why, size_t why_len);

/*
 * When the plugin handed staged slice @s back with @status: for a successful READ copy the
 * bytes out of the bounce buffer into the slice's memory (a failed copy turns *status into an
 * error with *why); then give the buffer back. No-op for a slice without a buffer.
 */
void stage_detach(struct engine *e, struct slice *s, enum te_status *status, char *why,
		  size_t why_len);

/* Give back the buffer of a slice that was not posted after all (back-pressure). */
void stage_release(struct engine *e, struct slice *s);

/* Engine teardown, after the plugin's fini (which released its registration): free the pool. */
void stage_pool_free(struct transport *tp);

#endif /* TE_CORE_STAGE_H */
