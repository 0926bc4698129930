/* SPDX-License-Identifier: Apache-2.0 */
/* transport.c: initialise plugin instances and implement the host services table. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/batch.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/memkind.h"
#include "core/segment.h"
#include "core/stage.h"
#include "core/transport.h"

/* The host ctx handed to plugins is the transport itself. */
static struct transport *ctx_tp(struct te_plugin_host_ctx *ctx)
{
	return (struct transport *)ctx;
}

static void host_log(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level,
		     const char *fmt, ...)
{
	struct transport *tp = ctx_tp(ctx);
	const struct log_sink *sink = tp->engine ? &tp->engine->log : NULL;
	char line[900];
	va_list ap;

	if (level > TE_PLUGIN_LOG_TRACE)
		level = TE_PLUGIN_LOG_TRACE;
	if (level > TE_PLUGIN_LOG_WARN && !log_enabled(sink, (enum te_log_level)level))
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (level <= TE_PLUGIN_LOG_WARN)
		g_strlcpy(tp->last_log, line, sizeof(tp->last_log));
	if (!log_enabled(sink, (enum te_log_level)level))
		return;
	log_msg(sink, (enum te_log_level)level, "%s: %s", tp->plugin->name, line);
}

static void host_slice_done(struct te_plugin_host_ctx *ctx, struct te_plugin_slice *slice,
			    enum te_status status, uint64_t bytes, const char *detail)
{
	batch_slice_done(ctx_tp(ctx), slice, status, bytes, detail);
}

static void host_mark_failed(struct te_plugin_host_ctx *ctx, enum te_plugin_fail_scope scope,
			     uint32_t device, struct te_plugin_peer *peer, const char *why)
{
	struct transport *tp = ctx_tp(ctx);
	struct engine *e = tp->engine;
	uint64_t pause_ns, until;

	if (!e)
		return;
	pause_ns = e->cfg->quarantine_ms * 1000000ull;
	until = engine_now_ns() + pause_ns;
	if (scope == TE_PLUGIN_FAIL_DEVICE || scope == TE_PLUGIN_FAIL_PATH) {
		if (device < TRANSPORT_MAX_DEVICES) {
			transport_pause_device(tp, device, until);
			ENGINE_LOG(e, TE_LOG_WARN, "%s: device %u quarantined for %llu ms: %s",
				   tp->plugin->name, device,
				   (unsigned long long)e->cfg->quarantine_ms, why ? why : "");
		}
	}
	if (scope == TE_PLUGIN_FAIL_PEER && peer) {
		/* Find every open view whose peer handle this is. */
		g_rw_lock_reader_lock(&e->seg_lock);
		for (guint i = 1; i < e->segments->len; i++) {
			struct segment *s = g_ptr_array_index(e->segments, i);

			if (!s || !s->view)
				continue;
			if (s->view->tps[tp->index].peer == peer) {
				atomic_store_explicit(&s->view->tps[tp->index].paused_until_ns,
						      until, memory_order_relaxed);
				ENGINE_LOG(
					e, TE_LOG_WARN, "%s: peer %s quarantined for %llu ms: %s",
					tp->plugin->name, s->name,
					(unsigned long long)e->cfg->quarantine_ms, why ? why : "");
			}
		}
		g_rw_lock_reader_unlock(&e->seg_lock);
	}
}

static void host_device_event(struct te_plugin_host_ctx *ctx, uint32_t device,
			      enum te_plugin_event event, const char *why)
{
	struct transport *tp = ctx_tp(ctx);

	if (device >= TRANSPORT_MAX_DEVICES)
		return;
	if (event == TE_PLUGIN_EVENT_DOWN) {
		/* Down until an UP event says otherwise. */
		transport_pause_device(tp, device, UINT64_MAX);
	} else {
		atomic_store_explicit(&tp->dev_paused_until[device], 0, memory_order_relaxed);
		atomic_store_explicit(&tp->dev_failures[device], 0, memory_order_relaxed);
	}
	ENGINE_LOG(tp->engine, TE_LOG_WARN, "%s: device %u %s: %s", tp->plugin->name, device,
		   event == TE_PLUGIN_EVENT_DOWN ? "down" : "up", why ? why : "");
}

static void host_peer_event(struct te_plugin_host_ctx *ctx, struct te_plugin_peer *peer,
			    enum te_plugin_event event, const char *why)
{
	struct transport *tp = ctx_tp(ctx);

	if (event == TE_PLUGIN_EVENT_DOWN)
		host_mark_failed(ctx, TE_PLUGIN_FAIL_PEER, 0, peer, why);
	else
		ENGINE_LOG(tp->engine, TE_LOG_INFO, "%s: peer up: %s", tp->plugin->name,
			   why ? why : "");
}

static const char *host_config_get(struct te_plugin_host_ctx *ctx, const char *key)
{
	struct transport *tp = ctx_tp(ctx);

	if (!tp->cfg || !key)
		return NULL;
	return config_transport_option(tp->cfg, key);
}

static void host_config_foreach(struct te_plugin_host_ctx *ctx, te_plugin_option_fn fn, void *user)
{
	struct transport *tp = ctx_tp(ctx);

	if (!tp->cfg || !fn)
		return;
	for (size_t i = 0; i < tp->cfg->n_options; i++)
		fn(user, tp->cfg->options[i].key, tp->cfg->options[i].value);
}

static enum te_status host_publish(struct te_plugin_host_ctx *ctx, const void *blob, size_t len)
{
	struct transport *tp = ctx_tp(ctx);

	if (len > 4096 || (len && !blob))
		return TE_ERR_TOO_LARGE;
	g_mutex_lock(&tp->blob_lock);
	if (tp->blob)
		g_bytes_unref(tp->blob);
	tp->blob = g_bytes_new(blob, len);
	g_mutex_unlock(&tp->blob_lock);
	return TE_OK;
}

static enum te_status host_peer_handshake(struct te_plugin_host_ctx *ctx, const char *peer_name,
					  const void *req, size_t len, void *resp, size_t cap,
					  size_t *resp_len_out, uint32_t timeout_ms)
{
	struct transport *tp = ctx_tp(ctx);

	if (!tp->engine)
		return TE_ERR_UNSUPPORTED;
	return control_peer_handshake(tp->engine, tp->plugin->name, peer_name, req, len, resp, cap,
				      resp_len_out, timeout_ms);
}

static _Thread_local char op_error[256];

static void host_set_error(struct te_plugin_host_ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(op_error, sizeof(op_error), fmt, ap);
	va_end(ap);
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

static uint64_t host_now_ns(void)
{
	return engine_now_ns();
}

static const char *host_local_name(struct te_plugin_host_ctx *ctx)
{
	struct transport *tp = ctx_tp(ctx);

	return tp->engine && tp->engine->name ? tp->engine->name : "";
}

/* HMAC-SHA256(secret, "te-plugin-auth-v1" NUL plugin NUL msg). */
static enum te_status host_auth_compute(struct transport *tp, const void *msg, size_t len,
					uint8_t mac[TE_PLUGIN_MAC_SIZE])
{
	static const char label[] = "te-plugin-auth-v1";
	struct engine *e = tp->engine;
	const char *name = tp->plugin->name;
	gsize n = TE_PLUGIN_MAC_SIZE;
	GHmac *h;

	if (!e || !e->secret || !e->secret_len)
		return TE_ERR_UNSUPPORTED;
	if ((!msg && len) || len > G_MAXSSIZE)
		return TE_ERR_INVALID_ARG;
	h = g_hmac_new(G_CHECKSUM_SHA256, (const guchar *)e->secret, e->secret_len);
	g_hmac_update(h, (const guchar *)label, sizeof(label)); /* with its NUL */
	g_hmac_update(h, (const guchar *)name, (gssize)strlen(name) + 1);
	if (len)
		g_hmac_update(h, msg, (gssize)len);
	g_hmac_get_digest(h, mac, &n);
	g_hmac_unref(h);
	return n == TE_PLUGIN_MAC_SIZE ? TE_OK : TE_ERR_INTERNAL;
}

static enum te_status host_auth_mac(struct te_plugin_host_ctx *ctx, const void *msg, size_t len,
				    uint8_t mac_out[TE_PLUGIN_MAC_SIZE])
{
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
	enum te_status st;

	if (!mac_out)
		return TE_ERR_INVALID_ARG;
	st = host_auth_compute(ctx_tp(ctx), msg, len, mac);
	if (st == TE_OK)
		memcpy(mac_out, mac, sizeof(mac));
	explicit_bzero(mac, sizeof(mac));
	return st;
}

static enum te_status host_auth_check(struct te_plugin_host_ctx *ctx, const void *msg, size_t len,
				      const uint8_t mac[TE_PLUGIN_MAC_SIZE])
{
	uint8_t want[TE_PLUGIN_MAC_SIZE], diff = 0;
	enum te_status st;

	if (!mac)
		return TE_ERR_INVALID_ARG;
	st = host_auth_compute(ctx_tp(ctx), msg, len, want);
	if (st != TE_OK)
		return st;
	/* Constant time: a mismatch position must not show in the timing. */
	for (size_t i = 0; i < TE_PLUGIN_MAC_SIZE; i++)
		diff |= (uint8_t)(want[i] ^ mac[i]);
	explicit_bzero(want, sizeof(want));
	return diff ? TE_ERR_AUTH : TE_OK;
}

static enum te_status host_mem_query(struct te_plugin_host_ctx *ctx, const void *addr, uint64_t len,
				     uint32_t *mem_type_out, int32_t *dev_out)
{
	g_autofree char *why = NULL;
	uint32_t type;
	int32_t dev;
	enum te_status st;

	if (!mem_type_out || !dev_out)
		return TE_ERR_INVALID_ARG;
	st = memkind_query(ctx_tp(ctx)->engine, addr, len, &type, &dev, &why);
	if (st != TE_OK)
		return st;
	*mem_type_out = type;
	*dev_out = dev;
	return TE_OK;
}

static enum te_status host_mem_copy(struct te_plugin_host_ctx *ctx, void *dst, const void *src,
				    uint64_t len, uint32_t mem_type, int32_t dev,
				    enum te_plugin_copy_dir dir)
{
	if ((!dst || !src) && len)
		return TE_ERR_INVALID_ARG;
	return memkind_copy(ctx_tp(ctx)->engine, dst, src, len, mem_type, dev, dir);
}

static enum te_status host_mem_dmabuf(struct te_plugin_host_ctx *ctx, const void *addr,
				      uint64_t len, uint32_t mem_type, int32_t dev, int *fd_out,
				      uint64_t *offset_out)
{
	if (!fd_out || !offset_out)
		return TE_ERR_INVALID_ARG;
	return memkind_dmabuf(ctx_tp(ctx)->engine, addr, len, mem_type, dev, fd_out, offset_out);
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

const struct te_plugin_host transport_host = {
	.size = sizeof(struct te_plugin_host),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.log = host_log,
	.slice_done = host_slice_done,
	.mark_failed = host_mark_failed,
	.device_event = host_device_event,
	.peer_event = host_peer_event,
	.config_get = host_config_get,
	.config_foreach = host_config_foreach,
	.publish = host_publish,
	.now_ns = host_now_ns,
	.local_name = host_local_name,
	.peer_handshake = host_peer_handshake,
	.set_error = host_set_error,
	.auth_mac = host_auth_mac,
	.auth_check = host_auth_check,
	.mem_query = host_mem_query,
	.mem_copy = host_mem_copy,
	.mem_dmabuf = host_mem_dmabuf,
};

enum te_status transport_start(struct engine *engine, struct plugin *plugin,
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
	st = plugin->ops.init(&transport_host, (struct te_plugin_host_ctx *)tp, &tp->inst);
	if (st != TE_OK) {
		*err_out = g_strdup_printf("%s: init failed: %s (%d)%s%s", plugin->path,
					   te_status_str(st), st, *transport_error(tp) ? ": " : "",
					   transport_error(tp));
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
	if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL && !plugin->desc->ops->progress) {
		*err_out = g_strdup_printf("%s: required op 'progress' is missing (manual "
					   "progress plugin)",
					   plugin->path);
		st = TE_ERR_PLUGIN_INVALID;
		goto err_fini;
	}
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
	/* The plugin's own status is in the message; the caller learns "init failed". */
	return st == TE_ERR_PLUGIN_INVALID ? st : TE_ERR_PLUGIN_INIT;
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

void transport_stop(struct transport *tp)
{
	if (!tp)
		return;
	atomic_store(&tp->stopped, true);
	tp->plugin->ops.fini(tp->inst);
	transport_free(tp);
}

void transport_free(struct transport *tp)
{
	if (!tp)
		return;
	if (tp->blob)
		g_bytes_unref(tp->blob);
	stage_pool_free(tp);
	g_mutex_clear(&tp->blob_lock);
	g_mutex_clear(&tp->call_lock);
	g_mutex_clear(&tp->backlog_lock);
	g_mutex_clear(&tp->stage_lock);
	g_free(tp);
}
