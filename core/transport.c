/* SPDX-License-Identifier: Apache-2.0 */
/* transport.c: plugin instances in an engine, and the only caller of their ops. */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/engine.h"
#include "core/transport.h"

/* Values the core passes between the public API and plugins as they are. */
_Static_assert(TE_MEM_REMOTE_READ == TE_PLUGIN_ACCESS_REMOTE_READ &&
		       TE_MEM_REMOTE_WRITE == TE_PLUGIN_ACCESS_REMOTE_WRITE,
	       "te_mem_register access bits are passed to reg_mem as they are");
_Static_assert((int)TE_LOG_ERROR == (int)TE_PLUGIN_LOG_ERROR &&
		       (int)TE_LOG_WARN == (int)TE_PLUGIN_LOG_WARN &&
		       (int)TE_LOG_INFO == (int)TE_PLUGIN_LOG_INFO &&
		       (int)TE_LOG_DEBUG == (int)TE_PLUGIN_LOG_DEBUG &&
		       (int)TE_LOG_TRACE == (int)TE_PLUGIN_LOG_TRACE,
	       "plugin log levels are cast to enum te_log_level");
_Static_assert((int)TE_OP_READ == (int)TE_PLUGIN_OP_READ &&
		       (int)TE_OP_WRITE == (int)TE_PLUGIN_OP_WRITE,
	       "request opcodes become slice opcodes as they are");


static _Thread_local char op_error[256];

void transport_set_error_v(const char *fmt, va_list ap)
{
	vsnprintf(op_error, sizeof(op_error), fmt, ap);
}

void transport_clear_error(void)
{
	op_error[0] = '\0';
}

const char *transport_op_error(void)
{
	return op_error;
}

const char *transport_error(struct transport *tp)
{
	/* The op's own words if it gave them, else its last warning (best effort). */
	return op_error[0] ? op_error : tp->last_log;
}


/*
 * --- plugin ops ----------------------------------------------------------------
 * Every call into a plugin goes through here. A SERIALIZED plugin (caps.thread_level)
 * gets these under its call_lock, one at a time: submit, progress (transport.h), cancel,
 * retry_prepare, handshake, load_peer, unload_peer, unpack_remote_key,
 * release_remote_key, reg_mem, dereg_mem, pack_key. Not serialized: init, query_caps,
 * query_devices and fini (no other call runs then), wait (never called for a serialized
 * plugin: it would hold the lock while blocking) and the memory-kind owner ops (a
 * plugin's reg_mem may reach them, its own included, through the host table).
 */

enum te_status transport_cancel(struct transport *tp, struct te_plugin_slice *ps)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.cancel(tp->inst, ps);
	transport_unlock(tp);
	return st;
}

enum te_status transport_retry_prepare(struct transport *tp, struct te_plugin_slice *ps)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.retry_prepare(tp->inst, ps);
	transport_unlock(tp);
	return st;
}

enum te_status transport_wait(struct transport *tp, uint64_t timeout_ns)
{
	if (tp->serialized)
		return TE_ERR_UNSUPPORTED;
	transport_clear_error();
	return tp->plugin->ops.wait(tp->inst, timeout_ns);
}

void transport_drive(struct transport *tp, uint32_t driving)
{
	/* Optional and without a stub (since ABI 1.2): absent means nothing to tell. */
	if (tp->plugin->ops.drive)
		tp->plugin->ops.drive(tp->inst, driving);
}

enum te_status transport_handshake(struct transport *tp, const char *peer_name, const void *req,
				   size_t len, void *resp, size_t cap, size_t *resp_len_out)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.handshake(tp->inst, peer_name, req, len, resp, cap, resp_len_out);
	transport_unlock(tp);
	return st;
}

enum te_status transport_load_peer(struct transport *tp, const struct te_plugin_peer_info *info,
				   const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	if (tp->plugin->ops.load_peer_ex)
		st = tp->plugin->ops.load_peer_ex(tp->inst, info, blob, len, peer_out);
	else
		st = tp->plugin->ops.load_peer(tp->inst, info->name, blob, len, peer_out);
	transport_unlock(tp);
	return st;
}

void transport_unload_peer(struct transport *tp, struct te_plugin_peer *peer)
{
	transport_lock(tp);
	tp->plugin->ops.unload_peer(tp->inst, peer);
	transport_unlock(tp);
}

enum te_status transport_unpack_remote_key(struct transport *tp, struct te_plugin_peer *peer,
					   const void *blob, size_t len, uint64_t addr,
					   uint64_t length, struct te_plugin_rkey **rkey_out)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.unpack_remote_key(tp->inst, peer, blob, len, addr, length, rkey_out);
	transport_unlock(tp);
	return st;
}

void transport_release_remote_key(struct transport *tp, struct te_plugin_rkey *rkey)
{
	transport_lock(tp);
	tp->plugin->ops.release_remote_key(tp->inst, rkey);
	transport_unlock(tp);
}

enum te_status transport_reg_mem(struct transport *tp, void *addr, uint64_t length,
				 uint32_t mem_type, int32_t dev, uint32_t access,
				 struct te_plugin_mem **mem_out)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.reg_mem(tp->inst, addr, length, mem_type, dev, access, mem_out);
	transport_unlock(tp);
	return st;
}

enum te_status transport_dereg_mem(struct transport *tp, struct te_plugin_mem *mem)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.dereg_mem(tp->inst, mem);
	transport_unlock(tp);
	return st;
}

enum te_status transport_pack_key(struct transport *tp, struct te_plugin_mem *mem, void *buf,
				  size_t cap, size_t *len_out)
{
	enum te_status st;

	transport_clear_error();
	transport_lock(tp);
	st = tp->plugin->ops.pack_key(tp->inst, mem, buf, cap, len_out);
	transport_unlock(tp);
	return st;
}

enum te_status transport_mem_query(struct transport *tp, const void *addr, uint64_t len,
				   uint32_t *mem_type_out, int32_t *dev_out)
{
	transport_clear_error();
	return tp->plugin->ops.mem_query(tp->inst, addr, len, mem_type_out, dev_out);
}

enum te_status transport_mem_copy(struct transport *tp, void *dst, const void *src, uint64_t len,
				  uint32_t mem_type, int32_t dev, enum te_plugin_copy_dir dir)
{
	transport_clear_error();
	return tp->plugin->ops.mem_copy(tp->inst, dst, src, len, mem_type, dev, dir);
}

enum te_status transport_mem_dmabuf(struct transport *tp, const void *addr, uint64_t len,
				    int *fd_out, uint64_t *offset_out)
{
	transport_clear_error();
	return tp->plugin->ops.mem_dmabuf(tp->inst, addr, len, fd_out, offset_out);
}

enum te_status transport_mem_alloc(struct transport *tp, uint32_t mem_type, int32_t dev,
				   uint64_t length, void **ptr_out)
{
	transport_clear_error();
	return tp->plugin->ops.mem_alloc(tp->inst, mem_type, dev, length, ptr_out);
}

enum te_status transport_mem_free(struct transport *tp, void *ptr)
{
	transport_clear_error();
	return tp->plugin->ops.mem_free(tp->inst, ptr);
}

void transport_pause_device(struct transport *tp, uint32_t dev, uint64_t until_ns)
{
	uint64_t cur;

	if (dev >= TRANSPORT_MAX_DEVICES)
		return;
	atomic_store_explicit(&tp->dev_paused_until[dev], until_ns, memory_order_relaxed);
	cur = atomic_load_explicit(&tp->any_paused_until, memory_order_relaxed);
	while (cur < until_ns &&
	       !atomic_compare_exchange_weak_explicit(&tp->any_paused_until, &cur, until_ns,
						      memory_order_relaxed, memory_order_relaxed))
		;
}


uint64_t transport_paused_devices(struct transport *tp, uint64_t now)
{
	uint64_t mask = 0, all;
	uint32_t n = tp->n_devices;

	/* Fast path: nothing was quarantined recently, or devices are not interchangeable. */
	if (atomic_load_explicit(&tp->any_paused_until, memory_order_relaxed) <= now ||
	    (tp->caps.flags & TE_PLUGIN_CAP_FIXED_DEVICES))
		return 0;
	for (uint32_t d = 0; d < n; d++)
		if (atomic_load_explicit(&tp->dev_paused_until[d], memory_order_relaxed) > now)
			mask |= 1ull << d;
	all = n >= 64 ? UINT64_MAX : (1ull << n) - 1;
	return n && (mask & all) == all ? 0 : mask;
}

enum te_status transport_start(struct engine *engine, struct plugin *plugin,
			       const struct te_plugin_host *host,
			       const struct config_transport *cfg, unsigned index,
			       struct transport **transport_out, char **err_out)
{
	struct transport *tp = g_new0(struct transport, 1);
	struct te_plugin_device devs[TRANSPORT_MAX_DEVICES];
	uint32_t n = 0;
	enum te_status st;

	tp->engine = engine;
	tp->plugin = plugin;
	tp->cfg = cfg;
	tp->index = index;
	g_mutex_init(&tp->blob_lock);
	g_mutex_init(&tp->call_lock);
	g_mutex_init(&tp->backlog_lock);
	g_mutex_init(&tp->stage_lock);

	transport_clear_error();
	st = plugin->ops.init(host, (struct te_plugin_host_ctx *)tp, &tp->inst);
	if (st != TE_OK) {
		*err_out = g_strdup_printf("%s: init failed: %s (%d)%s%s", plugin->path,
					   te_status_str(st), st, *transport_error(tp) ? ": " : "",
					   transport_error(tp));
		goto err_free;
	}
	/* Nothing to fini: calling fini(NULL) is what crashed engines and te-info. */
	if (!tp->inst) {
		*err_out = g_strdup_printf("%s: init returned TE_OK but no instance (plugin bug)",
					   plugin->path);
		st = TE_ERR_PLUGIN_INVALID;
		goto err_free;
	}
	tp->caps.size = sizeof(tp->caps);
	st = plugin->ops.query_caps(tp->inst, &tp->caps);
	if (st != TE_OK) {
		*err_out = g_strdup_printf("%s: query_caps failed: %s", plugin->path,
					   te_status_str(st));
		st = TE_ERR_PLUGIN_INIT;
		goto err_fini;
	}
	if (tp->caps.slice_priv_size > TRANSPORT_MAX_PRIV ||
	    tp->caps.progress > TE_PLUGIN_PROGRESS_MANUAL ||
	    tp->caps.thread_level > TE_PLUGIN_THREAD_MULTI || !tp->caps.ops) {
		*err_out = g_strdup_printf("%s: invalid caps (priv %u, progress %u, thread level "
					   "%u, ops 0x%x)",
					   plugin->path, tp->caps.slice_priv_size,
					   tp->caps.progress, tp->caps.thread_level, tp->caps.ops);
		st = TE_ERR_PLUGIN_INVALID;
		goto err_fini;
	}
	/* An owner of a memory kind answers for it: the ops others reach it through. */
	if (tp->caps.owned_mem_types) {
		static const struct {
			const char *name;
			size_t offset;
		} owner_ops[] = {
			{ "mem_query", offsetof(struct te_plugin_ops, mem_query) },
			{ "mem_copy", offsetof(struct te_plugin_ops, mem_copy) },
			{ "mem_alloc", offsetof(struct te_plugin_ops, mem_alloc) },
			{ "mem_free", offsetof(struct te_plugin_ops, mem_free) },
		};
		const struct te_plugin_ops *d = plugin->desc->ops;

		for (size_t i = 0; i < G_N_ELEMENTS(owner_ops); i++) {
			void *fn = NULL;

			if (d->size >= owner_ops[i].offset + sizeof(void *))
				memcpy(&fn, (const char *)d + owner_ops[i].offset, sizeof(fn));
			if (!fn) {
				*err_out = g_strdup_printf(
					"%s: owns memory kinds 0x%x but lacks the "
					"required op '%s'",
					plugin->path, tp->caps.owned_mem_types, owner_ops[i].name);
				st = TE_ERR_PLUGIN_INVALID;
				goto err_fini;
			}
		}
	}
	/* A plugin handing out memory of a kind registers it itself and offers both ops. */
	if (tp->caps.alloc_mem_types) {
		const struct te_plugin_ops *d = plugin->desc->ops;
		bool has_ops =
			d->size >= offsetof(struct te_plugin_ops, mem_free) + sizeof(void *) &&
			d->mem_alloc && d->mem_free;

		if (!has_ops || (tp->caps.alloc_mem_types & ~tp->caps.mem_types)) {
			*err_out = g_strdup_printf(
				"%s: caps.alloc_mem_types 0x%x %s", plugin->path,
				tp->caps.alloc_mem_types,
				has_ops ? "has kinds missing from caps.mem_types"
					: "needs the ops 'mem_alloc' and 'mem_free'");
			st = TE_ERR_PLUGIN_INVALID;
			goto err_fini;
		}
	}
	if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL && !plugin->desc->ops->progress) {
		*err_out = g_strdup_printf("%s: required op 'progress' is missing (manual "
					   "progress plugin)",
					   plugin->path);
		st = TE_ERR_PLUGIN_INVALID;
		goto err_fini;
	}
	tp->hybrid = tp->caps.progress == TE_PLUGIN_PROGRESS_AUTO &&
		     (tp->caps.flags & TE_PLUGIN_CAP_HYBRID_PROGRESS) &&
		     tp->caps.thread_level == TE_PLUGIN_THREAD_MULTI;
	if (tp->hybrid && !plugin->desc->ops->progress) {
		*err_out = g_strdup_printf("%s: required op 'progress' is missing (caps.flags has "
					   "TE_PLUGIN_CAP_HYBRID_PROGRESS)",
					   plugin->path);
		st = TE_ERR_PLUGIN_INVALID;
		goto err_fini;
	}
	tp->polled = tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL || tp->hybrid;
	tp->per_thread = tp->hybrid && (tp->caps.flags & TE_PLUGIN_CAP_HYBRID_PER_THREAD);
	memset(devs, 0, sizeof(devs));
	for (unsigned i = 0; i < TRANSPORT_MAX_DEVICES; i++)
		devs[i].size = sizeof(devs[i]);
	st = plugin->ops.query_devices(tp->inst, devs, TRANSPORT_MAX_DEVICES, &n);
	if (st != TE_OK && st != TE_ERR_UNSUPPORTED) {
		*err_out = g_strdup_printf("%s: query_devices failed: %s", plugin->path,
					   te_status_str(st));
		st = TE_ERR_PLUGIN_INIT;
		goto err_fini;
	}
	tp->n_devices = MIN(n, (uint32_t)TRANSPORT_MAX_DEVICES);
	memcpy(tp->devices, devs, sizeof(devs[0]) * tp->n_devices);
	for (uint32_t i = 0; i < tp->n_devices; i++) {
		tp->devices[i].name[sizeof(tp->devices[i].name) - 1] = '\0';
		g_snprintf(tp->staged_names[i], sizeof(tp->staged_names[i]), "%s (staged)",
			   tp->devices[i].name);
	}
	tp->serialized = tp->caps.thread_level == TE_PLUGIN_THREAD_SERIALIZED;
	*transport_out = tp;
	return TE_OK;

err_fini:
	plugin->ops.fini(tp->inst);
err_free:
	g_mutex_clear(&tp->blob_lock);
	g_mutex_clear(&tp->call_lock);
	g_mutex_clear(&tp->backlog_lock);
	g_mutex_clear(&tp->stage_lock);
	g_free(tp);
	/*
	 * The plugin's own status is in the message; the caller learns "init failed", or that
	 * the configuration is wrong (TE_ERR_CONFIG from init: fatal even for an optional one).
	 */
	return st == TE_ERR_PLUGIN_INVALID || st == TE_ERR_CONFIG ? st : TE_ERR_PLUGIN_INIT;
}

GBytes *transport_blob(struct transport *t)
{
	GBytes *b = NULL;

	g_mutex_lock(&t->blob_lock);
	if (t->blob)
		b = g_bytes_ref(t->blob);
	g_mutex_unlock(&t->blob_lock);
	return b;
}

void transport_fini(struct transport *tp)
{
	atomic_store(&tp->stopped, true);
	tp->plugin->ops.fini(tp->inst);
}

void transport_stop(struct transport *tp)
{
	if (!tp)
		return;
	transport_fini(tp);
	transport_free(tp);
}

void transport_free(struct transport *tp)
{
	if (!tp)
		return;
	/* Its staging pool (core/stage.c) is gone already: stage_pool_free. */
	assert(!tp->stage);
	if (tp->blob)
		g_bytes_unref(tp->blob);
	g_mutex_clear(&tp->blob_lock);
	g_mutex_clear(&tp->call_lock);
	g_mutex_clear(&tp->backlog_lock);
	g_mutex_clear(&tp->stage_lock);
	g_free(tp);
}
