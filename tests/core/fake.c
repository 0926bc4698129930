/* SPDX-License-Identifier: Apache-2.0 */
/* fake.c: a fake transport in the test process, to drive the core modules from below. */
#include <string.h>

#include "core/host.h"
#include "fake.h"

struct fake fake;

struct fake_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	enum te_plugin_thread_level level;
	uint32_t n_devices;
};

/* Thread level and devices of the next fake_transport_new (init reads them). */
static enum te_plugin_thread_level next_level;
static uint32_t next_devices;

static void fake_enter(void)
{
	if (atomic_fetch_add(&fake.in_call, 1) > 0)
		atomic_fetch_add(&fake.overlaps, 1);
	g_usleep(200); /* widen the window an unserialized caller would show in */
}

static void fake_leave(void)
{
	atomic_fetch_sub(&fake.in_call, 1);
}

static enum te_status fake_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				struct te_plugin_inst **inst_out)
{
	struct fake_inst *fi = g_new0(struct fake_inst, 1);

	fi->host = host;
	fi->ctx = ctx;
	fi->level = next_level;
	fi->n_devices = next_devices;
	*inst_out = (struct te_plugin_inst *)fi;
	return TE_OK;
}

static void fake_fini(struct te_plugin_inst *inst)
{
	g_free(inst);
}

static enum te_status fake_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct fake_inst *fi = (struct fake_inst *)inst;

	caps->mem_types = TE_PLUGIN_MEM_CPU;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = fi->level;
	caps->flags = fake.caps_flags;
	return TE_OK;
}

static enum te_status fake_query_devices(struct te_plugin_inst *inst, struct te_plugin_device *devs,
					 uint32_t cap, uint32_t *n_out)
{
	struct fake_inst *fi = (struct fake_inst *)inst;
	uint32_t n = MIN(cap, fi->n_devices);

	for (uint32_t i = 0; i < n; i++)
		g_snprintf(devs[i].name, sizeof(devs[i].name), "fake%u", i);
	*n_out = n;
	return TE_OK;
}

static enum te_status fake_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				   uint32_t mem_type, int32_t dev, uint32_t access,
				   struct te_plugin_mem **mem_out)
{
	struct fake_inst *fi = (struct fake_inst *)inst;

	fake_enter();
	fi->host->set_error(fi->ctx, "reg_mem of %" G_GUINT64_FORMAT " bytes refused", length);
	fake_leave();
	return TE_ERR_NOMEM;
}

static enum te_status fake_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	return TE_OK;
}

static enum te_status fake_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				    void *buf, size_t cap, size_t *len_out)
{
	*len_out = 0;
	return TE_OK;
}

static enum te_status fake_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				     const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	return TE_ERR_PEER_UNREACHABLE;
}

static void fake_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
}

static enum te_status fake_unpack_remote_key(struct te_plugin_inst *inst,
					     struct te_plugin_peer *peer, const void *blob,
					     size_t len, uint64_t addr, uint64_t length,
					     struct te_plugin_rkey **rkey_out)
{
	struct fake_inst *fi = (struct fake_inst *)inst;

	fi->host->set_error(fi->ctx, "no key of %zu bytes", len);
	return TE_ERR_PROTOCOL;
}

static enum te_status fake_submit(struct te_plugin_inst *inst, struct te_plugin_slice **ps,
				  uint32_t n, uint32_t *accepted_out)
{
	uint32_t acc = MIN(n, fake.accept_max);

	(void)inst;
	fake_enter();
	for (uint32_t m = atomic_load(&fake.max_n);
	     n > m && !atomic_compare_exchange_weak(&fake.max_n, &m, n);)
		;
	if (atomic_fetch_add(&fake.submit_calls, 1) < fake.refuse_calls ||
	    (uint64_t)g_get_monotonic_time() * 1000 < fake.refuse_until_ns)
		acc = 0;
	if (!acc && n)
		atomic_fetch_add(&fake.refused_calls, 1);
	atomic_fetch_add(&fake.submitted, acc);
	*accepted_out = acc;
	fake_leave();
	for (uint32_t i = 0; i < acc; i++) {
		struct te_plugin_slice *s = ps[i];

		/*
		 * The core zeroes priv before a slice's first attempt on a transport and keeps it
		 * across retries on the same one: count first attempts that are not zeroed and
		 * retries that lost what the fake wrote.
		 */
		if (s->priv) {
			static const uint8_t zero[FAKE_PRIV_SIZE];
			uint8_t mark[FAKE_PRIV_SIZE];

			memset(mark, 0xa5, sizeof(mark));
			if (memcmp(s->priv, s->attempt ? mark : zero, FAKE_PRIV_SIZE) != 0)
				atomic_fetch_add(&fake.dirty_priv, 1);
			memcpy(s->priv, mark, FAKE_PRIV_SIZE);
		}

		if (fake.fail_first != TE_OK && s->attempt == 0) {
			host_services.slice_done((struct te_plugin_host_ctx *)fake.tp, s,
						 fake.fail_first, 0, "fake: first attempt fails");
		} else if (fake.hold) {
			g_mutex_lock(&fake.lock);
			g_assert_cmpuint(fake.n_held, <, FAKE_MAX_HELD);
			fake.held[fake.n_held++] = s;
			g_mutex_unlock(&fake.lock);
		} else {
			host_services.slice_done((struct te_plugin_host_ctx *)fake.tp, s, TE_OK,
						 s->length, NULL);
		}
	}
	return TE_OK;
}

static enum te_status fake_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	bool found = false;

	(void)inst;
	fake_enter();
	atomic_fetch_add(&fake.cancels, 1);
	fake_leave();
	if (!fake.cancel_hands_back)
		return TE_OK;
	g_mutex_lock(&fake.lock);
	for (uint32_t i = 0; i < fake.n_held; i++) {
		if (fake.held[i] == slice) {
			fake.held[i] = fake.held[--fake.n_held];
			found = true;
			break;
		}
	}
	g_mutex_unlock(&fake.lock);
	if (found)
		host_services.slice_done((struct te_plugin_host_ctx *)fake.tp, slice,
					 TE_ERR_CANCELED, 0, "fake: canceled");
	return TE_OK;
}

static enum te_status fake_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	(void)inst;
	(void)slice;
	fake_enter();
	atomic_fetch_add(&fake.retry_prepares, 1);
	fake_leave();
	return TE_OK;
}

static const struct te_plugin_ops fake_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = fake_init,
	.fini = fake_fini,
	.query_caps = fake_query_caps,
	.query_devices = fake_query_devices,
	.reg_mem = fake_reg_mem,
	.dereg_mem = fake_dereg_mem,
	.pack_key = fake_pack_key,
	.load_peer = fake_load_peer,
	.unload_peer = fake_unload_peer,
	.unpack_remote_key = fake_unpack_remote_key,
	.submit = fake_submit,
	.cancel = fake_cancel,
	.retry_prepare = fake_retry_prepare,
};

static const struct te_plugin_desc fake_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = "fake",
	.version = "1",
	.description = "fake transport of tests/core",
	.ops = &fake_ops,
};

void fake_reset(void)
{
	g_mutex_lock(&fake.lock);
	fake.n_held = 0;
	g_mutex_unlock(&fake.lock);
	fake.accept_max = UINT32_MAX;
	fake.refuse_calls = 0;
	fake.refuse_until_ns = 0;
	fake.fail_first = TE_OK;
	fake.hold = false;
	fake.cancel_hands_back = true;
	fake.caps_flags = 0;
	atomic_store(&fake.submit_calls, 0);
	atomic_store(&fake.max_n, 0);
	atomic_store(&fake.submitted, 0);
	atomic_store(&fake.refused_calls, 0);
	atomic_store(&fake.dirty_priv, 0);
	atomic_store(&fake.cancels, 0);
	atomic_store(&fake.retry_prepares, 0);
	atomic_store(&fake.overlaps, 0);
	atomic_store(&fake.in_call, 0);
}

void fake_take_over(struct transport *tp)
{
	fake.tp = tp;
	tp->plugin->ops.submit = fake_submit;
	tp->plugin->ops.cancel = fake_cancel;
	tp->plugin->ops.retry_prepare = fake_retry_prepare;
}

enum te_status fake_transport_try(enum te_plugin_thread_level level, uint32_t n_devices,
				  struct transport **tp_out, char **err_out)
{
	struct plugin *p = g_new0(struct plugin, 1);
	struct transport *tp = NULL;
	enum te_status st;

	p->name = g_strdup("fake");
	p->path = g_strdup("<tests/core/fake.c>");
	p->desc = &fake_desc;
	st = plugin_validate(&fake_desc, p->path, &p->ops, err_out);
	g_assert_cmpint(st, ==, TE_OK);
	next_level = level;
	next_devices = n_devices;
	st = transport_start(NULL, p, &host_services, NULL, 0, &tp, err_out);
	if (st != TE_OK) {
		g_free(p->name);
		g_free(p->path);
		g_free(p);
		*tp_out = NULL;
		return st;
	}
	fake.tp = tp;
	*tp_out = tp;
	return TE_OK;
}

struct transport *fake_transport_new(enum te_plugin_thread_level level, uint32_t n_devices)
{
	g_autofree char *err = NULL;
	struct transport *tp = NULL;

	if (fake_transport_try(level, n_devices, &tp, &err) != TE_OK)
		g_error("transport_start: %s", err);
	return tp;
}

void fake_complete_held(enum te_status status)
{
	for (;;) {
		struct te_plugin_slice *s = NULL;

		g_mutex_lock(&fake.lock);
		if (fake.n_held)
			s = fake.held[--fake.n_held];
		g_mutex_unlock(&fake.lock);
		if (!s)
			return;
		host_services.slice_done((struct te_plugin_host_ctx *)fake.tp, s, status,
					 status == TE_OK ? s->length : 0, NULL);
	}
}

void fake_transport_free(struct transport *tp)
{
	struct plugin *p = tp->plugin;

	transport_stop(tp);
	g_free(p->name);
	g_free(p->path);
	g_free(p);
}
