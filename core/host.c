/* SPDX-License-Identifier: Apache-2.0 */
/* host.c: the host services table: what the core offers plugins, and where each call goes. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/control.h"
#include "core/engine.h"
#include "core/host.h"
#include "core/memkind.h"
#include "core/segment.h"
#include "core/slice.h"
#include "core/transport.h"

/* The host ctx handed to plugins is the transport itself. */
static struct transport *ctx_tp(struct te_plugin_host_ctx *ctx)
{
	return (struct transport *)ctx;
}

static void host_log(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level,
		     const char *fmt, ...) G_GNUC_PRINTF(3, 4);
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
	slice_done(ctx_tp(ctx), slice, status, bytes, detail);
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
		ENGINE_LOG(e, TE_LOG_DEBUG, "%s: reports a peer failed: %s", tp->plugin->name,
			   why ? why : "");
		/* Every open view whose peer handle this is. */
		segment_pause_peer(e, tp->index, peer, until, tp->plugin->name, why);
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
	g_autofree char *addr = NULL;

	if (!tp->engine)
		return TE_ERR_UNSUPPORTED;
	if (!peer_name)
		return TE_ERR_INVALID_ARG;
	addr = segment_resolve_address(tp->engine, peer_name);
	return control_peer_handshake(tp->engine, tp->plugin->name, peer_name, addr, req, len, resp,
				      cap, resp_len_out, timeout_ms);
}

static void host_set_error(struct te_plugin_host_ctx *ctx, const char *fmt, ...)
	G_GNUC_PRINTF(2, 3);
static void host_set_error(struct te_plugin_host_ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	(void)ctx;
	va_start(ap, fmt);
	transport_set_error_v(fmt, ap);
	va_end(ap);
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

static const char *host_control_address(struct te_plugin_host_ctx *ctx, uint32_t which)
{
	struct transport *tp = ctx_tp(ctx);

	if (!tp->engine)
		return "";
	return which == TE_PLUGIN_ADDR_BOUND ? control_bound_address(tp->engine)
					     : control_address(tp->engine);
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

const struct te_plugin_host host_services = {
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
	.control_address = host_control_address,
};
