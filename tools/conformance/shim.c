/* SPDX-License-Identifier: Apache-2.0 */
/* shim.c: te-conformance's interposing plugin: contract checks and fault injection. */

/*
 * See shim.h. Every op of the wrapped plugin and every host service it calls passes through
 * here. The ctx the real plugin gets is the shim's instance, so host wrappers find their
 * instance without a lookup. Slices are tracked in one table (slice pointer -> struct owned)
 * from the moment they are offered to submit until the plugin reports them:
 *
 *   offered --(submit accepts it)--> owned --(slice_done)--> gone (forwarded to the core)
 *   offered --(slice_done during submit)--> done early --(accepted)--> forwarded after submit
 *
 * A report for a slice not in the table (a second report, or one never accepted) is a
 * violation and is not forwarded: the core would be corrupted by it. Nothing here blocks
 * while holding the table lock, and no call into the plugin or the core is made under it.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <glib.h>

#include <te/te_plugin.h>

#include "shim.h"

/*
 * The shim must wrap every host service and op: an unwrapped service would reach the core
 * with the shim's ctx, an unwrapped op would silently fall back to the core's stub. These
 * fail the build when the ABI grows, so that the shim grows with it.
 */
_Static_assert(sizeof(struct te_plugin_host) ==
		       offsetof(struct te_plugin_host, control_address) + sizeof(void *),
	       "te-conformance shim: a host service was added to te_plugin.h; wrap it in shim.c");
_Static_assert(sizeof(struct te_plugin_ops) ==
		       offsetof(struct te_plugin_ops, stats) + sizeof(void *),
	       "te-conformance shim: an op was added to te_plugin.h; wrap it in shim.c");

enum owned_state {
	OWNED_OFFERED = 0, /* inside submit, not known to be accepted yet */
	OWNED_HELD,	   /* accepted, not reported */
	OWNED_EARLY,	   /* reported during the submit that offered it */
};

struct shim_inst {
	struct te_plugin_inst *real;
	const struct te_plugin_host *core;
	struct te_plugin_host_ctx *ctx;
	struct te_plugin_host host; /* what the real plugin gets; ctx is this struct */
	uint32_t n_devices;
	bool in_fini;
};

struct owned {
	struct shim_inst *si;
	enum owned_state state;
	struct te_plugin_slice snap; /* the fields as the core handed them */
	bool forged;
	uint64_t orig_remote;
	/* A report that came during submit, forwarded once submit returned. */
	enum te_status early_status;
	uint64_t early_bytes;
	char early_detail[CONF_SHIM_TEXT];
	bool early_has_detail;
};

static struct {
	pthread_mutex_t lock;
	void *dl;
	char *path;
	const struct te_plugin_desc *real;
	struct te_plugin_desc *desc; /* the copy the core loads */
	struct te_plugin_ops ops;
	GHashTable *slices; /* struct te_plugin_slice * -> struct owned * */
	GHashTable *peers;  /* struct te_plugin_peer * (the real plugin's) -> struct shim_inst * */
	/*
	 * Peers inside the real unload_peer: the plugin may still name them (a host call it
	 * began before unload_peer returned); after it returns, it may not.
	 */
	GHashTable *unloading; /* struct te_plugin_peer * -> struct shim_inst * */
	struct conf_shim_modes modes;
	bool forge_armed;
	uint64_t ok_seen; /* successful completions, for inject_every */
	struct conf_shim_stats st;
} shim = { .lock = PTHREAD_MUTEX_INITIALIZER };

#define SI(p) ((struct shim_inst *)(void *)(p))
#define REAL_OPS (shim.real->ops)

static uint64_t shim_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Record a violation of @rule (the lock held). */
static void violation(enum conf_rule rule, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static void violation(enum conf_rule rule, const char *fmt, ...)
{
	va_list ap;

	if (shim.st.rule_count[rule]++ == 0) {
		va_start(ap, fmt);
		vsnprintf(shim.st.rule_first[rule], sizeof(shim.st.rule_first[rule]), fmt, ap);
		va_end(ap);
	}
}

/* A status's name for a violation's text (the shim links no libte: no te_status_str). */
static const char *st_name(enum te_status st)
{
	static _Thread_local char other[32];

	switch (st) {
	case TE_OK:
		return "TE_OK";
	case TE_ERR_CANCELED:
		return "TE_ERR_CANCELED";
	case TE_ERR_SHUTDOWN:
		return "TE_ERR_SHUTDOWN";
	case TE_ERR_TIMEOUT:
		return "TE_ERR_TIMEOUT";
	case TE_ERR_REMOTE_ACCESS:
		return "TE_ERR_REMOTE_ACCESS";
	case TE_ERR_TRANSIENT:
		return "TE_ERR_TRANSIENT";
	case TE_ERR_CONN_RESET:
		return "TE_ERR_CONN_RESET";
	case TE_ERR_PEER_UNREACHABLE:
		return "TE_ERR_PEER_UNREACHABLE";
	case TE_ERR_INTERNAL:
		return "TE_ERR_INTERNAL";
	default:
		snprintf(other, sizeof(other), "status %d", (int)st);
		return other;
	}
}

static const char *op_name(uint32_t opcode)
{
	return opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE";
}

/* --- host services the real plugin calls ------------------------------------------------- */

static void h_log(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level, const char *fmt,
		  ...) G_GNUC_PRINTF(3, 4);
static void h_log(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level, const char *fmt,
		  ...)
{
	struct shim_inst *si = SI(ctx);
	char line[900];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	si->core->log(si->ctx, level, "%s", line);
}

static void h_set_error(struct te_plugin_host_ctx *ctx, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static void h_set_error(struct te_plugin_host_ctx *ctx, const char *fmt, ...)
{
	struct shim_inst *si = SI(ctx);
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	si->core->set_error(si->ctx, "%s", line);
}

/*
 * Checks, restores and forwards the report of an attempt the plugin held; @o was taken out of
 * the table by the caller (lock not held).
 */
static void complete(struct shim_inst *si, struct te_plugin_slice *s, struct owned *o,
		     enum te_status status, uint64_t bytes, const char *detail)
{
	bool inject = false, mark = false, down = false;
	char changed[96] = "";

	pthread_mutex_lock(&shim.lock);
	shim.st.owned_now--;
	if (o->forged) {
		shim.st.forged_done = true;
		shim.st.forged_status = status;
		snprintf(shim.st.forged_detail, sizeof(shim.st.forged_detail), "%s",
			 detail ? detail : "");
		s->remote = o->orig_remote;
	}
	/* Fields the plugin must not write: say which changed, and put them back. */
#define FIELD(f)                                                                                   \
	do {                                                                                       \
		if (memcmp(&s->f, &o->snap.f, sizeof(s->f)) != 0) {                                \
			if (!changed[0])                                                           \
				snprintf(changed, sizeof(changed), "%s", #f);                      \
			memcpy(&s->f, &o->snap.f, sizeof(s->f));                                   \
		}                                                                                  \
	} while (0)
	FIELD(size);
	FIELD(opcode);
	FIELD(local);
	FIELD(remote);
	FIELD(length);
	FIELD(local_mem);
	FIELD(peer);
	FIELD(rkey);
	FIELD(remote_base);
	FIELD(deadline_ns);
	FIELD(excluded_devices);
	FIELD(attempt);
	FIELD(priv);
#undef FIELD
	if (changed[0])
		violation(CONF_RULE_FIELDS,
			  "the plugin changed slice->%s of a %s slice (only device "
			  "and the priv bytes are its own)",
			  changed, op_name(s->opcode));
	shim.st.completions++;
	if (status == TE_OK) {
		uint64_t ex = o->snap.excluded_devices, all;

		shim.st.ok_completions++;
		if (bytes != s->length)
			violation(CONF_RULE_OK_BYTES,
				  "TE_OK with %" PRIu64 " bytes for a slice of %" PRIu64 " bytes",
				  bytes, s->length);
		all = si->n_devices >= 64 ? UINT64_MAX : (1ull << si->n_devices) - 1;
		if (si->n_devices > 1 && (ex & all) && (ex & all) != all) {
			shim.st.excluded_completions++;
			if (s->device < 64 && (ex >> s->device) & 1)
				violation(CONF_RULE_EXCLUDED,
					  "attempt %u of a %s slice completed on device %u, which "
					  "excluded_devices 0x%" PRIx64 " told it to avoid",
					  s->attempt, op_name(s->opcode), s->device, ex);
		}
	}
	if (si->in_fini) {
		shim.st.fini_reported++;
		if (status == TE_ERR_CANCELED)
			shim.st.fini_canceled++;
		else if (status == TE_OK)
			shim.st.fini_ok++;
		else
			violation(CONF_RULE_FINI_CANCELED,
				  "fini handed a slice back with %s, not TE_ERR_CANCELED",
				  st_name(status));
	} else if (status == TE_OK && !o->forged) {
		shim.ok_seen++;
		/*
		 * Only a slice's first attempts are hit: in a pipeline whose depth is a
		 * multiple of inject_every, one slice can come round as every Nth completion
		 * attempt after attempt and use up its retries, which tests the counter, not
		 * the plugin (CI on 2377af2: rdma, a READ failed after 7 attempts).
		 */
		if (shim.modes.inject_every && s->attempt < CONF_SHIM_INJECT_ATTEMPTS &&
		    shim.ok_seen % shim.modes.inject_every == 0) {
			inject = true;
			shim.st.injected++;
		}
		if (shim.modes.mark_device_next) {
			shim.modes.mark_device_next = false;
			mark = true;
			shim.st.marks++;
		}
		if (shim.modes.peer_down_next) {
			shim.modes.peer_down_next = false;
			down = true;
			shim.st.peer_downs++;
		}
	}
	pthread_mutex_unlock(&shim.lock);
	g_free(o);

	if (mark)
		si->core->mark_failed(si->ctx, TE_PLUGIN_FAIL_DEVICE, s->device, NULL,
				      "te-conformance: injected mark_failed");
	if (down)
		si->core->peer_event(si->ctx, s->peer, TE_PLUGIN_EVENT_DOWN,
				     "te-conformance: injected peer_event(DOWN)");
	if (inject)
		si->core->slice_done(si->ctx, s, TE_ERR_TRANSIENT, 0,
				     "te-conformance: injected retryable failure");
	else
		si->core->slice_done(si->ctx, s, status, bytes, detail);
}

static void h_slice_done(struct te_plugin_host_ctx *ctx, struct te_plugin_slice *s,
			 enum te_status status, uint64_t bytes, const char *detail)
{
	struct shim_inst *si = SI(ctx);
	struct owned *o;

	pthread_mutex_lock(&shim.lock);
	o = s ? g_hash_table_lookup(shim.slices, s) : NULL;
	if (!o || o->si != si) {
		/* Not forwarded: the core would count the slice twice or free it early. */
		violation(CONF_RULE_DONE_ONCE,
			  "slice_done(%s, %s) for a slice the plugin does not hold: reported "
			  "already, or never accepted",
			  s ? op_name(s->opcode) : "NULL", st_name(status));
		pthread_mutex_unlock(&shim.lock);
		return;
	}
	if (o->state == OWNED_EARLY) {
		violation(CONF_RULE_DONE_ONCE,
			  "slice_done(%s) twice for one attempt, both during submit",
			  st_name(status));
		pthread_mutex_unlock(&shim.lock);
		return;
	}
	if (o->state == OWNED_OFFERED) {
		/* Inside submit: accepted or not is known when it returns. */
		o->state = OWNED_EARLY;
		o->early_status = status;
		o->early_bytes = bytes;
		o->early_has_detail = detail != NULL;
		snprintf(o->early_detail, sizeof(o->early_detail), "%s", detail ? detail : "");
		pthread_mutex_unlock(&shim.lock);
		return;
	}
	g_hash_table_steal(shim.slices, s);
	pthread_mutex_unlock(&shim.lock);
	complete(si, s, o, status, bytes, detail);
}

/* mark_failed and the events name this instance's devices and live peers only. */
static void check_device(struct shim_inst *si, const char *what, uint32_t device)
{
	if (device >= si->n_devices)
		violation(CONF_RULE_HOST_ARGS, "%s names device %u; the plugin reported %u", what,
			  device, si->n_devices);
}

static void check_peer(struct shim_inst *si, const char *what, struct te_plugin_peer *peer)
{
	if (!peer || (g_hash_table_lookup(shim.peers, peer) != si &&
		      g_hash_table_lookup(shim.unloading, peer) != si))
		violation(CONF_RULE_HOST_ARGS,
			  "%s names a peer handle this instance did not "
			  "return from load_peer (or already unloaded)",
			  what);
}

static void h_mark_failed(struct te_plugin_host_ctx *ctx, enum te_plugin_fail_scope scope,
			  uint32_t device, struct te_plugin_peer *peer, const char *why)
{
	struct shim_inst *si = SI(ctx);

	pthread_mutex_lock(&shim.lock);
	if (scope > TE_PLUGIN_FAIL_PATH)
		violation(CONF_RULE_HOST_ARGS, "mark_failed with scope %d", (int)scope);
	if (scope == TE_PLUGIN_FAIL_DEVICE || scope == TE_PLUGIN_FAIL_PATH)
		check_device(si, "mark_failed", device);
	if (scope == TE_PLUGIN_FAIL_PEER || scope == TE_PLUGIN_FAIL_PATH)
		check_peer(si, "mark_failed", peer);
	pthread_mutex_unlock(&shim.lock);
	si->core->mark_failed(si->ctx, scope, device, peer, why);
}

static void h_device_event(struct te_plugin_host_ctx *ctx, uint32_t device,
			   enum te_plugin_event event, const char *why)
{
	struct shim_inst *si = SI(ctx);

	pthread_mutex_lock(&shim.lock);
	check_device(si, "device_event", device);
	pthread_mutex_unlock(&shim.lock);
	si->core->device_event(si->ctx, device, event, why);
}

static void h_peer_event(struct te_plugin_host_ctx *ctx, struct te_plugin_peer *peer,
			 enum te_plugin_event event, const char *why)
{
	struct shim_inst *si = SI(ctx);

	pthread_mutex_lock(&shim.lock);
	check_peer(si, "peer_event", peer);
	pthread_mutex_unlock(&shim.lock);
	si->core->peer_event(si->ctx, peer, event, why);
}

static const char *h_config_get(struct te_plugin_host_ctx *ctx, const char *key)
{
	return SI(ctx)->core->config_get(SI(ctx)->ctx, key);
}

static void h_config_foreach(struct te_plugin_host_ctx *ctx, te_plugin_option_fn fn, void *user)
{
	SI(ctx)->core->config_foreach(SI(ctx)->ctx, fn, user);
}

static enum te_status h_publish(struct te_plugin_host_ctx *ctx, const void *blob, size_t len)
{
	return SI(ctx)->core->publish(SI(ctx)->ctx, blob, len);
}

static const char *h_local_name(struct te_plugin_host_ctx *ctx)
{
	return SI(ctx)->core->local_name(SI(ctx)->ctx);
}

static enum te_status h_peer_handshake(struct te_plugin_host_ctx *ctx, const char *peer_name,
				       const void *req, size_t len, void *resp, size_t cap,
				       size_t *resp_len_out, uint32_t timeout_ms)
{
	return SI(ctx)->core->peer_handshake(SI(ctx)->ctx, peer_name, req, len, resp, cap,
					     resp_len_out, timeout_ms);
}

static enum te_status h_auth_mac(struct te_plugin_host_ctx *ctx, const void *msg, size_t len,
				 uint8_t mac_out[TE_PLUGIN_MAC_SIZE])
{
	return SI(ctx)->core->auth_mac(SI(ctx)->ctx, msg, len, mac_out);
}

static enum te_status h_auth_check(struct te_plugin_host_ctx *ctx, const void *msg, size_t len,
				   const uint8_t mac[TE_PLUGIN_MAC_SIZE])
{
	return SI(ctx)->core->auth_check(SI(ctx)->ctx, msg, len, mac);
}

static enum te_status h_mem_query(struct te_plugin_host_ctx *ctx, const void *addr, uint64_t len,
				  uint32_t *mem_type_out, int32_t *dev_out)
{
	return SI(ctx)->core->mem_query(SI(ctx)->ctx, addr, len, mem_type_out, dev_out);
}

static enum te_status h_mem_copy(struct te_plugin_host_ctx *ctx, void *dst, const void *src,
				 uint64_t len, uint32_t mem_type, int32_t dev,
				 enum te_plugin_copy_dir dir)
{
	return SI(ctx)->core->mem_copy(SI(ctx)->ctx, dst, src, len, mem_type, dev, dir);
}

static enum te_status h_mem_dmabuf(struct te_plugin_host_ctx *ctx, const void *addr, uint64_t len,
				   uint32_t mem_type, int32_t dev, int *fd_out,
				   uint64_t *offset_out)
{
	return SI(ctx)->core->mem_dmabuf(SI(ctx)->ctx, addr, len, mem_type, dev, fd_out,
					 offset_out);
}

static const char *h_control_address(struct te_plugin_host_ctx *ctx, uint32_t which)
{
	const struct te_plugin_host *core = SI(ctx)->core;

	return TE_PLUGIN_HAS(core, struct te_plugin_host, control_address)
		       ? core->control_address(SI(ctx)->ctx, which)
		       : "";
}

/* --- ops the core calls ----------------------------------------------------------------- */

static enum te_status w_init(const struct te_plugin_host *core, struct te_plugin_host_ctx *ctx,
			     struct te_plugin_inst **inst_out)
{
	struct shim_inst *si = g_new0(struct shim_inst, 1);
	struct te_plugin_inst *real = NULL;
	enum te_status st;

	si->core = core;
	si->ctx = ctx;
	memcpy(&si->host, core, MIN((size_t)core->size, sizeof(si->host)));
	si->host.size = (uint32_t)MIN((size_t)core->size, sizeof(si->host));
	si->host.log = h_log;
	si->host.slice_done = h_slice_done;
	si->host.mark_failed = h_mark_failed;
	si->host.device_event = h_device_event;
	si->host.peer_event = h_peer_event;
	si->host.config_get = h_config_get;
	si->host.config_foreach = h_config_foreach;
	si->host.publish = h_publish;
	si->host.local_name = h_local_name;
	si->host.peer_handshake = h_peer_handshake;
	si->host.set_error = h_set_error;
	si->host.auth_mac = h_auth_mac;
	si->host.auth_check = h_auth_check;
	si->host.mem_query = h_mem_query;
	si->host.mem_copy = h_mem_copy;
	si->host.mem_dmabuf = h_mem_dmabuf;
	si->host.control_address = h_control_address;
	st = REAL_OPS->init(&si->host, (struct te_plugin_host_ctx *)si, &real);
	if (st != TE_OK || !real) {
		/* TE_OK without an instance: let the core refuse it as it would the plugin. */
		g_free(si);
		if (st == TE_OK)
			*inst_out = NULL;
		return st;
	}
	si->real = real;
	pthread_mutex_lock(&shim.lock);
	shim.st.inits++;
	pthread_mutex_unlock(&shim.lock);
	*inst_out = (struct te_plugin_inst *)si;
	return TE_OK;
}

static void w_fini(struct te_plugin_inst *inst)
{
	struct shim_inst *si = SI(inst);
	GHashTableIter it;
	gpointer key, value;
	uint64_t held = 0, left = 0;

	pthread_mutex_lock(&shim.lock);
	g_hash_table_iter_init(&it, shim.slices);
	while (g_hash_table_iter_next(&it, &key, &value))
		if (((struct owned *)value)->si == si)
			held++;
	shim.st.fini_owned += held;
	si->in_fini = true;
	pthread_mutex_unlock(&shim.lock);

	REAL_OPS->fini(si->real);

	pthread_mutex_lock(&shim.lock);
	g_hash_table_iter_init(&it, shim.slices);
	while (g_hash_table_iter_next(&it, &key, &value)) {
		if (((struct owned *)value)->si != si)
			continue;
		left++;
		shim.st.owned_now--;
		g_free(value);
		g_hash_table_iter_steal(&it);
	}
	if (left)
		violation(CONF_RULE_FINI_CANCELED,
			  "%" PRIu64 " of the %" PRIu64
			  " slices the plugin held at fini never came "
			  "back (fini must report each with TE_ERR_CANCELED)",
			  left, held);
	g_hash_table_iter_init(&it, shim.peers);
	while (g_hash_table_iter_next(&it, &key, &value))
		if (value == si)
			g_hash_table_iter_remove(&it);
	shim.st.finis++;
	pthread_mutex_unlock(&shim.lock);
	g_free(si);
}

static enum te_status w_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	return REAL_OPS->query_caps(SI(inst)->real, caps);
}

static enum te_status w_query_devices(struct te_plugin_inst *inst, struct te_plugin_device *devices,
				      uint32_t max, uint32_t *n_out)
{
	uint32_t n = 0;
	enum te_status st = REAL_OPS->query_devices(SI(inst)->real, devices, max, &n);

	if (st == TE_OK) {
		SI(inst)->n_devices = MIN(n, max);
		pthread_mutex_lock(&shim.lock);
		shim.st.n_devices = SI(inst)->n_devices;
		pthread_mutex_unlock(&shim.lock);
		*n_out = n;
	}
	return st;
}

static enum te_status w_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				uint32_t mem_type, int32_t dev, uint32_t access,
				struct te_plugin_mem **mem_out)
{
	return REAL_OPS->reg_mem(SI(inst)->real, addr, length, mem_type, dev, access, mem_out);
}

static enum te_status w_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	return REAL_OPS->dereg_mem(SI(inst)->real, mem);
}

static enum te_status w_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem, void *buf,
				 size_t cap, size_t *len_out)
{
	return REAL_OPS->pack_key(SI(inst)->real, mem, buf, cap, len_out);
}

static enum te_status w_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				  const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	struct te_plugin_peer *peer = NULL;
	enum te_status st = REAL_OPS->load_peer(SI(inst)->real, peer_name, blob, len, &peer);

	if (st == TE_OK) {
		pthread_mutex_lock(&shim.lock);
		g_hash_table_insert(shim.peers, peer, SI(inst));
		pthread_mutex_unlock(&shim.lock);
		*peer_out = peer;
	}
	return st;
}

static enum te_status w_load_peer_ex(struct te_plugin_inst *inst,
				     const struct te_plugin_peer_info *info, const void *blob,
				     size_t len, struct te_plugin_peer **peer_out)
{
	struct te_plugin_peer *peer = NULL;
	enum te_status st = REAL_OPS->load_peer_ex(SI(inst)->real, info, blob, len, &peer);

	if (st == TE_OK) {
		pthread_mutex_lock(&shim.lock);
		g_hash_table_insert(shim.peers, peer, SI(inst));
		pthread_mutex_unlock(&shim.lock);
		*peer_out = peer;
	}
	return st;
}

static void w_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
	pthread_mutex_lock(&shim.lock);
	if (g_hash_table_steal(shim.peers, peer))
		g_hash_table_insert(shim.unloading, peer, SI(inst));
	pthread_mutex_unlock(&shim.lock);
	REAL_OPS->unload_peer(SI(inst)->real, peer);
	pthread_mutex_lock(&shim.lock);
	g_hash_table_remove(shim.unloading, peer);
	pthread_mutex_unlock(&shim.lock);
}

static enum te_status w_unpack_remote_key(struct te_plugin_inst *inst, struct te_plugin_peer *peer,
					  const void *blob, size_t len, uint64_t addr,
					  uint64_t length, struct te_plugin_rkey **rkey_out)
{
	return REAL_OPS->unpack_remote_key(SI(inst)->real, peer, blob, len, addr, length, rkey_out);
}

static void w_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	REAL_OPS->release_remote_key(SI(inst)->real, rkey);
}

static enum te_status w_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
			       uint32_t n, uint32_t *accepted_out)
{
	struct shim_inst *si = SI(inst);
	struct te_plugin_slice **early = NULL;
	uint32_t acc = 0, eff, n_early = 0;
	enum te_status st;

	pthread_mutex_lock(&shim.lock);
	shim.st.submits++;
	shim.st.offered += n;
	for (uint32_t i = 0; i < n; i++) {
		struct owned *o = g_new0(struct owned, 1);

		o->si = si;
		o->state = OWNED_OFFERED;
		memcpy(&o->snap, slices[i], MIN((size_t)slices[i]->size, sizeof(o->snap)));
		if (shim.forge_armed && slices[i]->opcode == shim.modes.forge_opcode) {
			shim.forge_armed = false;
			o->forged = true;
			o->orig_remote = slices[i]->remote;
			slices[i]->remote += (uint64_t)shim.modes.forge_delta;
			shim.st.forged++;
			shim.st.forged_done = false;
			shim.st.forged_detail[0] = '\0';
		}
		g_free(g_hash_table_lookup(shim.slices, slices[i]));
		g_hash_table_insert(shim.slices, slices[i], o);
	}
	pthread_mutex_unlock(&shim.lock);

	st = REAL_OPS->submit(si->real, slices, n, &acc);

	pthread_mutex_lock(&shim.lock);
	eff = acc;
	if (acc > n) {
		violation(CONF_RULE_ACCEPTED, "submit accepted %u of %u slices", acc, n);
		eff = n;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct owned *o = g_hash_table_lookup(shim.slices, slices[i]);

		if (i < eff) {
			shim.st.owned_now++;
			if (o->state == OWNED_EARLY) {
				if (!early)
					early = g_new(struct te_plugin_slice *, n);
				early[n_early++] = slices[i];
			} else {
				o->state = OWNED_HELD;
			}
			continue;
		}
		if (o->state == OWNED_EARLY)
			violation(CONF_RULE_ACCEPTED,
				  "slice_done(%s) for slice %u of a submit that accepted %u of %u "
				  "(a slice not accepted is not the plugin's)",
				  st_name(o->early_status), i, acc, n);
		if (o->forged) {
			slices[i]->remote = o->orig_remote;
			shim.forge_armed = true;
			shim.st.forged--;
		}
		g_hash_table_steal(shim.slices, slices[i]);
		g_free(o);
	}
	shim.st.accepted += eff;
	shim.st.owned_max = MAX(shim.st.owned_max, shim.st.owned_now);
	if (acc == 0 && st == TE_OK)
		shim.st.zero_accepts++;
	pthread_mutex_unlock(&shim.lock);

	/* Reports that came during submit, in order, now that they are known to be accepted. */
	for (uint32_t k = 0; k < n_early; k++) {
		struct owned *o;
		enum te_status es;
		uint64_t eb;
		char detail[CONF_SHIM_TEXT];
		bool has;

		pthread_mutex_lock(&shim.lock);
		o = g_hash_table_lookup(shim.slices, early[k]);
		g_hash_table_steal(shim.slices, early[k]);
		o->state = OWNED_HELD;
		es = o->early_status;
		eb = o->early_bytes;
		has = o->early_has_detail;
		memcpy(detail, o->early_detail, sizeof(detail));
		pthread_mutex_unlock(&shim.lock);
		complete(si, early[k], o, es, eb, has ? detail : NULL);
	}
	g_free(early);
	*accepted_out = acc;
	return st;
}

static uint32_t w_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	uint32_t done;
	bool frozen;

	pthread_mutex_lock(&shim.lock);
	frozen = shim.modes.freeze_progress;
	pthread_mutex_unlock(&shim.lock);
	if (frozen)
		return 0;
	done = REAL_OPS->progress(SI(inst)->real, budget);
	if (done > budget) {
		pthread_mutex_lock(&shim.lock);
		violation(CONF_RULE_PROGRESS, "progress(budget %u) returned %u", budget, done);
		pthread_mutex_unlock(&shim.lock);
	}
	return done;
}

static enum te_status w_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct owned *o;
	bool held, ignore, gone;
	uint32_t delay_us;
	enum te_status st;

	pthread_mutex_lock(&shim.lock);
	shim.st.cancels++;
	o = g_hash_table_lookup(shim.slices, s);
	held = o && o->state == OWNED_HELD;
	ignore = shim.modes.ignore_cancel;
	delay_us = shim.modes.cancel_delay_us;
	pthread_mutex_unlock(&shim.lock);
	if (held && ignore)
		return TE_OK; /* the plugin keeps it: fini must hand it back */
	if (held && delay_us) {
		/* Give the slice a chance to finish first: then cancel must answer NOT_FOUND. */
		uint64_t until = shim_now_ns() + delay_us * 1000ull;

		while (shim_now_ns() < until) {
			pthread_mutex_lock(&shim.lock);
			held = g_hash_table_lookup(shim.slices, s) != NULL;
			pthread_mutex_unlock(&shim.lock);
			if (!held)
				break;
			sched_yield();
		}
	}
	pthread_mutex_lock(&shim.lock);
	gone = g_hash_table_lookup(shim.slices, s) == NULL;
	pthread_mutex_unlock(&shim.lock);

	st = REAL_OPS->cancel(SI(inst)->real, s);

	if (gone) {
		pthread_mutex_lock(&shim.lock);
		shim.st.cancels_after_done++;
		if (st == TE_OK)
			violation(
				CONF_RULE_CANCEL_NOT_FOUND,
				"cancel of a %s slice the plugin did not hold (handed back already, "
				"or never accepted) answered TE_OK (want TE_ERR_NOT_FOUND, and "
				"nothing done)",
				op_name(s->opcode));
		pthread_mutex_unlock(&shim.lock);
	}
	return st;
}

static enum te_status w_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct shim_inst *si = SI(inst);
	uint64_t all = si->n_devices >= 64 ? UINT64_MAX : (1ull << si->n_devices) - 1;
	enum te_status st = REAL_OPS->retry_prepare(si->real, s);

	pthread_mutex_lock(&shim.lock);
	shim.st.retry_prepares++;
	if (s->excluded_devices & all)
		shim.st.retry_prepares_excluding++;
	if (st == TE_ERR_NO_DEVICE)
		shim.st.retry_no_device++;
	pthread_mutex_unlock(&shim.lock);
	return st;
}

static enum te_status w_handshake(struct te_plugin_inst *inst, const char *peer_name,
				  const void *req, size_t req_len, void *resp, size_t cap,
				  size_t *resp_len_out)
{
	return REAL_OPS->handshake(SI(inst)->real, peer_name, req, req_len, resp, cap,
				   resp_len_out);
}

static enum te_status w_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	return REAL_OPS->wait(SI(inst)->real, timeout_ns);
}

static enum te_status w_mem_query(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				  uint32_t *mem_type_out, int32_t *dev_out)
{
	return REAL_OPS->mem_query(SI(inst)->real, addr, len, mem_type_out, dev_out);
}

static enum te_status w_mem_copy(struct te_plugin_inst *inst, void *dst, const void *src,
				 uint64_t len, uint32_t mem_type, int32_t dev,
				 enum te_plugin_copy_dir dir)
{
	return REAL_OPS->mem_copy(SI(inst)->real, dst, src, len, mem_type, dev, dir);
}

static enum te_status w_mem_dmabuf(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				   int *fd_out, uint64_t *offset_out)
{
	return REAL_OPS->mem_dmabuf(SI(inst)->real, addr, len, fd_out, offset_out);
}

static enum te_status w_mem_alloc(struct te_plugin_inst *inst, uint32_t mem_type, int32_t dev,
				  uint64_t len, void **ptr_out)
{
	return REAL_OPS->mem_alloc(SI(inst)->real, mem_type, dev, len, ptr_out);
}

static enum te_status w_mem_free(struct te_plugin_inst *inst, void *ptr)
{
	return REAL_OPS->mem_free(SI(inst)->real, ptr);
}

static enum te_status w_stats(struct te_plugin_inst *inst, char *buf, size_t len,
			      size_t *needed_out)
{
	return REAL_OPS->stats(SI(inst)->real, buf, len, needed_out);
}

static void w_drive(struct te_plugin_inst *inst, uint32_t driving)
{
	REAL_OPS->drive(SI(inst)->real, driving);
}

/* Every wrapper; the table the core gets keeps those whose op the real plugin has. */
static const struct te_plugin_ops all_wrappers = {
	.size = sizeof(struct te_plugin_ops),
	.init = w_init,
	.fini = w_fini,
	.query_caps = w_query_caps,
	.query_devices = w_query_devices,
	.reg_mem = w_reg_mem,
	.dereg_mem = w_dereg_mem,
	.pack_key = w_pack_key,
	.load_peer = w_load_peer,
	.unload_peer = w_unload_peer,
	.unpack_remote_key = w_unpack_remote_key,
	.release_remote_key = w_release_remote_key,
	.submit = w_submit,
	.progress = w_progress,
	.cancel = w_cancel,
	.retry_prepare = w_retry_prepare,
	.handshake = w_handshake,
	.wait = w_wait,
	.drive = w_drive,
	.mem_query = w_mem_query,
	.mem_copy = w_mem_copy,
	.mem_dmabuf = w_mem_dmabuf,
	.mem_alloc = w_mem_alloc,
	.mem_free = w_mem_free,
	.load_peer_ex = w_load_peer_ex,
	.stats = w_stats,
};

/* --- the API te-conformance calls -------------------------------------------------------- */

static int api_set_plugin(const char *path, char *err, size_t cap)
{
	const struct te_plugin_desc *d;
	te_plugin_entry_fn entry;
	size_t ops_size;
	void *dl;
	int ret = -1;

	pthread_mutex_lock(&shim.lock);
	if (shim.path) {
		ret = strcmp(shim.path, path) == 0 ? 0 : -1;
		if (ret)
			snprintf(err, cap, "the shim already wraps %s", shim.path);
		goto out;
	}
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!dl) {
		snprintf(err, cap, "cannot load %s: %s", path, dlerror());
		goto out;
	}
	*(void **)&entry = dlsym(dl, TE_PLUGIN_ENTRY_NAME);
	d = entry ? entry() : NULL;
	if (!d || d->size < offsetof(struct te_plugin_desc, ops) + sizeof(void *) || !d->ops ||
	    d->ops->size < offsetof(struct te_plugin_ops, submit) + sizeof(void *)) {
		snprintf(err, cap, "%s: no usable descriptor behind %s", path,
			 TE_PLUGIN_ENTRY_NAME);
		goto out;
	}
	/* The whole descriptor, members newer than this build included; only ops is ours. */
	shim.desc = g_malloc0(MAX((size_t)d->size, sizeof(struct te_plugin_desc)));
	memcpy(shim.desc, d, d->size);
	ops_size = MIN((size_t)d->ops->size, sizeof(struct te_plugin_ops));
	shim.ops.size = (uint32_t)ops_size;
	for (size_t off = offsetof(struct te_plugin_ops, init); off + sizeof(void *) <= ops_size;
	     off += sizeof(void *)) {
		void *fn;

		memcpy(&fn, (const char *)d->ops + off, sizeof(fn));
		if (fn)
			memcpy((char *)&shim.ops + off, (const char *)&all_wrappers + off,
			       sizeof(fn));
	}
	shim.desc->ops = &shim.ops;
	shim.dl = dl;
	shim.real = d;
	shim.path = g_strdup(path);
	shim.slices = g_hash_table_new(g_direct_hash, g_direct_equal);
	shim.peers = g_hash_table_new(g_direct_hash, g_direct_equal);
	shim.unloading = g_hash_table_new(g_direct_hash, g_direct_equal);
	ret = 0;
out:
	pthread_mutex_unlock(&shim.lock);
	return ret;
}

static void api_set_modes(const struct conf_shim_modes *modes)
{
	pthread_mutex_lock(&shim.lock);
	shim.modes = *modes;
	shim.forge_armed = modes->forge_delta != 0;
	pthread_mutex_unlock(&shim.lock);
}

static void api_stats(struct conf_shim_stats *out)
{
	pthread_mutex_lock(&shim.lock);
	*out = shim.st;
	pthread_mutex_unlock(&shim.lock);
}

static const struct conf_shim_api shim_api = {
	.size = sizeof(struct conf_shim_api),
	.version = CONF_SHIM_API_VERSION,
	.set_plugin = api_set_plugin,
	.set_modes = api_set_modes,
	.stats = api_stats,
};

TE_PLUGIN_EXPORT const struct conf_shim_api *te_conformance_shim_api(void);
TE_PLUGIN_EXPORT const struct conf_shim_api *te_conformance_shim_api(void)
{
	return &shim_api;
}

/* NULL until te-conformance named the plugin to wrap: the core then refuses the module. */
TE_PLUGIN_EXPORT const struct te_plugin_desc *TE_PLUGIN_ENTRY(void);
TE_PLUGIN_EXPORT const struct te_plugin_desc *TE_PLUGIN_ENTRY(void)
{
	return shim.desc;
}
