/* SPDX-License-Identifier: Apache-2.0 */
/* conffake.c: a same-host transport over process_vm_readv/writev for te-conformance's tests. */

/*
 * Built plainly it is "conffake": a correct SERIALIZED, MANUAL-progress transport between
 * processes of one host, copying with process_vm_readv/process_vm_writev (cross-memory attach)
 * from progress(), with a bounded queue (option depth, default 64: back-pressure) and 1 to 4
 * interchangeable "devices" (option devices, default 2) that only label the copies, so that
 * retries with excluded devices can be checked. te-conformance must pass against it.
 *
 * Built with one of these, it breaks one rule, and te-conformance must say which:
 *   CONFFAKE_DOUBLE_DONE       the 5th completion is reported twice (slice_done twice)
 *   CONFFAKE_FINI_SHUTDOWN     fini hands slices back with TE_ERR_SHUTDOWN, not CANCELED
 *   CONFFAKE_IGNORE_EXCLUDED   devices are chosen round robin, excluded or not
 *   CONFFAKE_NO_BOUNDS         progress trusts the slice: no check against the remote key
 *   CONFFAKE_EXTRA_EXPORT      exports a symbol besides the entry point
 *   CONFFAKE_DESC_NAME="x"     descriptor name other than the file stem
 *   CONFFAKE_LATE_PEER         names an unloaded peer to the host (mark_failed) afterwards
 * CONFFAKE_NAME="x" is the descriptor name (default "conffake").
 *
 * Plainly built, unload_peer announces the peer (peer_event UP) before it forgets it: a
 * host call naming a peer is allowed until unload_peer returns.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv */
#endif

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>
#include <te/te_plugin_util.h>

#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif
#ifndef CONFFAKE_NAME
#define CONFFAKE_NAME "conffake"
#endif
#ifndef CONFFAKE_DESC_NAME
#define CONFFAKE_DESC_NAME CONFFAKE_NAME
#endif

#define CONFFAKE_MAGIC 0x4b464343u /* "CCFK" */
#define CONFFAKE_BLOB_LEN 4u	   /* magic */
#define CONFFAKE_KEY_LEN 24u	   /* magic, access, addr, length */
#define CONFFAKE_MAX_DEPTH 4096u
#define CONFFAKE_MAX_DEVICES 4u

/*
 * Every handle the core holds is on the instance's list: fini frees what the core did not
 * release (an engine freed with transfers in flight releases nothing).
 */
struct conffake_handle {
	struct conffake_handle *prev, *next;
};

struct te_plugin_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	uint32_t depth;
	uint32_t n_devices;
	uint32_t rr;	/* next device, round robin */
	uint64_t dones; /* completions reported */
	/* Accepted slices not yet reported, in order; SERIALIZED: the core serializes calls. */
	struct te_plugin_slice **ring;
	bool *canceled;
	uint32_t head, count;
	struct conffake_handle handles; /* list head: mems, peers, rkeys */
#ifdef CONFFAKE_LATE_PEER
	struct te_plugin_peer *late; /* unloaded, kept (never reused), named at the next call */
#endif
};

/* SERIALIZED: the core calls one op at a time, so the list needs no lock. */
static void *conffake_handle_new(struct te_plugin_inst *fi, size_t size)
{
	struct conffake_handle *h = calloc(1, size);

	if (!h)
		return NULL;
	h->next = fi->handles.next;
	h->prev = &fi->handles;
	fi->handles.next->prev = h;
	fi->handles.next = h;
	return h;
}

static void conffake_handle_free(void *p)
{
	struct conffake_handle *h = p;

	h->prev->next = h->next;
	h->next->prev = h->prev;
	free(h);
}

struct te_plugin_mem {
	struct conffake_handle h;
	uint64_t addr, length;
	uint32_t access;
};

struct te_plugin_peer {
	struct conffake_handle h;
	uint32_t pid;
};

struct te_plugin_rkey {
	struct conffake_handle h;
	uint64_t addr, length;
	uint32_t access;
};

static const char *const conffake_options[] = { "depth", "devices" };

static enum te_status conffake_opt(struct te_plugin_inst *fi, const char *key, uint64_t min,
				   uint64_t max, uint64_t def, uint32_t *out)
{
	const char *s = fi->host->config_get(fi->ctx, key);
	uint64_t v = def;

	if (s && !te_plugin_parse_u64(s, false, min, max, &v)) {
		fi->host->set_error(fi->ctx,
				    CONFFAKE_NAME ": option '%s': '%s' is not in %llu..%llu", key,
				    s, (unsigned long long)min, (unsigned long long)max);
		return TE_ERR_CONFIG;
	}
	*out = (uint32_t)v;
	return TE_OK;
}

static enum te_status conffake_init(const struct te_plugin_host *host,
				    struct te_plugin_host_ctx *ctx,
				    struct te_plugin_inst **inst_out)
{
	struct te_plugin_inst *fi = calloc(1, sizeof(*fi));
	uint8_t blob[CONFFAKE_BLOB_LEN];
	char bad[64], known[64];
	enum te_status st;

	if (!fi)
		return TE_ERR_NOMEM;
	fi->host = host;
	fi->ctx = ctx;
	fi->handles.next = fi->handles.prev = &fi->handles;
	if (te_plugin_unknown_option(host, ctx, conffake_options, 2, bad, sizeof(bad))) {
		host->set_error(ctx, CONFFAKE_NAME ": unknown option '%s' (known: %s)", bad,
				te_plugin_join(conffake_options, 2, known, sizeof(known)));
		st = TE_ERR_CONFIG;
		goto err_free;
	}
	st = conffake_opt(fi, "depth", 1, CONFFAKE_MAX_DEPTH, 64, &fi->depth);
	if (st == TE_OK)
		st = conffake_opt(fi, "devices", 1, CONFFAKE_MAX_DEVICES, 2, &fi->n_devices);
	if (st != TE_OK)
		goto err_free;
	fi->ring = calloc(fi->depth, sizeof(*fi->ring));
	fi->canceled = calloc(fi->depth, sizeof(*fi->canceled));
	if (!fi->ring || !fi->canceled) {
		st = TE_ERR_NOMEM;
		goto err_free;
	}
	te_plugin_put_u32(blob, CONFFAKE_MAGIC);
	st = host->publish(ctx, blob, sizeof(blob));
	if (st != TE_OK)
		goto err_free;
	*inst_out = fi;
	return TE_OK;

err_free:
	free(fi->ring);
	free(fi->canceled);
	free(fi);
	return st;
}

/* Take the oldest queued slice. */
static struct te_plugin_slice *conffake_pop(struct te_plugin_inst *fi, bool *canceled)
{
	struct te_plugin_slice *s = fi->ring[fi->head];

	*canceled = fi->canceled[fi->head];
	fi->canceled[fi->head] = false;
	fi->head = (fi->head + 1) % fi->depth;
	fi->count--;
	return s;
}

#ifdef CONFFAKE_LATE_PEER
/* The broken twin: a peer named after its unload_peer returned (then freed). */
static void conffake_name_late(struct te_plugin_inst *fi)
{
	if (!fi->late)
		return;
	fi->host->mark_failed(fi->ctx, TE_PLUGIN_FAIL_PEER, 0, fi->late,
			      CONFFAKE_NAME ": a peer unloaded before");
	free(fi->late);
	fi->late = NULL;
}
#endif

static void conffake_fini(struct te_plugin_inst *fi)
{
#ifdef CONFFAKE_FINI_SHUTDOWN
	const enum te_status at_fini = TE_ERR_SHUTDOWN;
#else
	const enum te_status at_fini = TE_ERR_CANCELED;
#endif

#ifdef CONFFAKE_LATE_PEER
	conffake_name_late(fi);
#endif
	while (fi->count) {
		bool canceled;
		struct te_plugin_slice *s = conffake_pop(fi, &canceled);

		fi->host->slice_done(fi->ctx, s, at_fini, 0,
				     CONFFAKE_NAME ": engine shutting down");
	}
	while (fi->handles.next != &fi->handles)
		conffake_handle_free(fi->handles.next);
	free(fi->ring);
	free(fi->canceled);
	free(fi);
}

static enum te_status conffake_query_caps(struct te_plugin_inst *fi, struct te_plugin_caps *caps)
{
	caps->mem_types = TE_PLUGIN_MEM_CPU;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_MANUAL;
	caps->thread_level = TE_PLUGIN_THREAD_SERIALIZED;
	caps->flags = TE_PLUGIN_CAP_SAME_HOST_ONLY;
	caps->max_slice_size = 0;
	caps->default_slice_size = 256u << 10;
	caps->slice_priv_size = 0;
	caps->max_devices = fi->n_devices;
	return TE_OK;
}

static enum te_status conffake_query_devices(struct te_plugin_inst *fi,
					     struct te_plugin_device *devices, uint32_t max,
					     uint32_t *n_out)
{
	uint32_t n = fi->n_devices < max ? fi->n_devices : max;

	for (uint32_t i = 0; i < n; i++) {
		char name[16];

		snprintf(name, sizeof(name), "cma%u", i);
		te_plugin_device_set(&devices[i], name, -1, "", 0, TE_PLUGIN_MEM_CPU);
	}
	*n_out = n;
	return TE_OK;
}

static enum te_status conffake_reg_mem(struct te_plugin_inst *fi, void *addr, uint64_t length,
				       uint32_t mem_type, int32_t dev, uint32_t access,
				       struct te_plugin_mem **mem_out)
{
	struct te_plugin_mem *m;

	if (mem_type != TE_PLUGIN_MEM_CPU)
		return TE_ERR_MEMORY_TYPE;
	m = conffake_handle_new(fi, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = (uint64_t)(uintptr_t)addr;
	m->length = length;
	m->access = access;
	*mem_out = m;
	return TE_OK;
}

static enum te_status conffake_dereg_mem(struct te_plugin_inst *fi, struct te_plugin_mem *m)
{
	conffake_handle_free(m);
	return TE_OK;
}

static enum te_status conffake_pack_key(struct te_plugin_inst *fi, struct te_plugin_mem *m,
					void *buf, size_t cap, size_t *len_out)
{
	uint8_t *p = buf;

	if (cap < CONFFAKE_KEY_LEN)
		return TE_ERR_TOO_LARGE;
	te_plugin_put_u32(p, CONFFAKE_MAGIC);
	te_plugin_put_u32(p + 4, m->access);
	te_plugin_put_u64(p + 8, m->addr);
	te_plugin_put_u64(p + 16, m->length);
	*len_out = CONFFAKE_KEY_LEN;
	return TE_OK;
}

/* The core says whether the peer shares this pid namespace: its pid is usable then. */
static enum te_status conffake_load_peer_ex(struct te_plugin_inst *fi,
					    const struct te_plugin_peer_info *info,
					    const void *blob, size_t len,
					    struct te_plugin_peer **peer_out)
{
	struct te_plugin_peer *p;

	if (len != CONFFAKE_BLOB_LEN || te_plugin_get_u32(blob) != CONFFAKE_MAGIC) {
		fi->host->set_error(fi->ctx, CONFFAKE_NAME ": peer %s: malformed blob", info->name);
		return TE_ERR_PROTOCOL;
	}
	if (!(info->flags & TE_PLUGIN_PEER_SAME_PID_NS)) {
		fi->host->set_error(fi->ctx, CONFFAKE_NAME ": peer %s is not in this pid namespace",
				    info->name);
		return TE_ERR_PEER_UNREACHABLE;
	}
	p = conffake_handle_new(fi, sizeof(*p));
	if (!p)
		return TE_ERR_NOMEM;
	p->pid = info->pid;
	*peer_out = p;
	return TE_OK;
}

static void conffake_unload_peer(struct te_plugin_inst *fi, struct te_plugin_peer *p)
{
	if (fi->host->peer_event)
		fi->host->peer_event(fi->ctx, p, TE_PLUGIN_EVENT_UP, CONFFAKE_NAME ": unloading");
#ifdef CONFFAKE_LATE_PEER
	conffake_name_late(fi);
	/* Off the list but not freed: its address is not reused before it is named. */
	p->h.prev->next = p->h.next;
	p->h.next->prev = p->h.prev;
	fi->late = p;
#else
	conffake_handle_free(p);
#endif
}

static enum te_status conffake_unpack_remote_key(struct te_plugin_inst *fi,
						 struct te_plugin_peer *peer, const void *blob,
						 size_t len, uint64_t addr, uint64_t length,
						 struct te_plugin_rkey **rkey_out)
{
	const uint8_t *p = blob;
	struct te_plugin_rkey *rk;

	if (len != CONFFAKE_KEY_LEN || te_plugin_get_u32(p) != CONFFAKE_MAGIC ||
	    te_plugin_get_u64(p + 8) != addr || te_plugin_get_u64(p + 16) != length)
		return TE_ERR_METADATA_MALFORMED;
	rk = conffake_handle_new(fi, sizeof(*rk));
	if (!rk)
		return TE_ERR_NOMEM;
	rk->access = te_plugin_get_u32(p + 4);
	rk->addr = addr;
	rk->length = length;
	*rkey_out = rk;
	return TE_OK;
}

static void conffake_release_remote_key(struct te_plugin_inst *fi, struct te_plugin_rkey *rk)
{
	conffake_handle_free(rk);
}

/* The device for @s: the next one round robin that is not excluded. */
static uint32_t conffake_pick(struct te_plugin_inst *fi, const struct te_plugin_slice *s)
{
	uint32_t d = fi->rr++ % fi->n_devices;

#ifndef CONFFAKE_IGNORE_EXCLUDED
	for (uint32_t k = 0; k < fi->n_devices; k++, d = (d + 1) % fi->n_devices)
		if (!(s->excluded_devices & (1ull << d)))
			break;
#endif
	return d;
}

static enum te_status conffake_submit(struct te_plugin_inst *fi, struct te_plugin_slice **slices,
				      uint32_t n, uint32_t *accepted_out)
{
	uint32_t i;

	for (i = 0; i < n && fi->count < fi->depth; i++) {
		uint32_t at = (fi->head + fi->count) % fi->depth;

		slices[i]->device = conffake_pick(fi, slices[i]);
		fi->ring[at] = slices[i];
		fi->canceled[at] = false;
		fi->count++;
	}
	*accepted_out = i;
	return TE_OK;
}

/* Copy one slice; TE_OK or why not (in @why). */
static enum te_status conffake_copy(struct te_plugin_inst *fi, struct te_plugin_slice *s, char *why,
				    size_t cap)
{
	const struct te_plugin_rkey *rk = s->rkey;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;
	uint64_t done = 0;

#ifndef CONFFAKE_NO_BOUNDS
	if (s->remote < rk->addr || s->length > rk->length ||
	    s->remote - rk->addr > rk->length - s->length || !(rk->access & need)) {
		snprintf(why, cap,
			 CONFFAKE_NAME ": remote range [0x%llx, +%llu) is outside the key's "
				       "[0x%llx, +%llu)",
			 (unsigned long long)s->remote, (unsigned long long)s->length,
			 (unsigned long long)rk->addr, (unsigned long long)rk->length);
		return TE_ERR_REMOTE_ACCESS;
	}
#else
	(void)rk;
	(void)need;
#endif
	while (done < s->length) {
		struct iovec l = { (char *)s->local + done, s->length - done };
		struct iovec r = { (void *)(uintptr_t)(s->remote + done), s->length - done };
		ssize_t k = s->opcode == TE_PLUGIN_OP_READ
				    ? process_vm_readv((pid_t)s->peer->pid, &l, 1, &r, 1, 0)
				    : process_vm_writev((pid_t)s->peer->pid, &l, 1, &r, 1, 0);

		if (k <= 0) {
			int err = k < 0 ? errno : EIO;

			snprintf(why, cap, CONFFAKE_NAME ": %s of pid %u: %s",
				 s->opcode == TE_PLUGIN_OP_READ ? "process_vm_readv"
								: "process_vm_writev",
				 s->peer->pid, strerror(err));
			if (err == ESRCH)
				return TE_ERR_PEER_UNREACHABLE;
			if (err == EPERM)
				return TE_ERR_PEER_REJECTED;
			return TE_ERR_REMOTE_ACCESS;
		}
		done += (uint64_t)k;
	}
	return TE_OK;
}

static uint32_t conffake_progress(struct te_plugin_inst *fi, uint32_t budget)
{
	uint32_t done = 0;

#ifdef CONFFAKE_LATE_PEER
	conffake_name_late(fi);
#endif
	while (fi->count && done < budget) {
		char why[256] = "";
		bool canceled;
		struct te_plugin_slice *s = conffake_pop(fi, &canceled);
		enum te_status st =
			canceled ? TE_ERR_CANCELED : conffake_copy(fi, s, why, sizeof(why));

		done++;
		fi->dones++;
		fi->host->slice_done(fi->ctx, s, st, st == TE_OK ? s->length : 0,
				     canceled ? CONFFAKE_NAME ": canceled" : why);
#ifdef CONFFAKE_DOUBLE_DONE
		if (fi->dones == 5)
			fi->host->slice_done(fi->ctx, s, st, st == TE_OK ? s->length : 0, why);
#endif
	}
	return done;
}

/* The slice ends with the next progress (which the core calls while slices are in flight). */
static enum te_status conffake_cancel(struct te_plugin_inst *fi, struct te_plugin_slice *s)
{
	for (uint32_t k = 0; k < fi->count; k++) {
		uint32_t at = (fi->head + k) % fi->depth;

		if (fi->ring[at] == s) {
			fi->canceled[at] = true;
			return TE_OK;
		}
	}
	return TE_ERR_NOT_FOUND;
}

static enum te_status conffake_retry_prepare(struct te_plugin_inst *fi, struct te_plugin_slice *s)
{
	uint64_t all = (1ull << fi->n_devices) - 1;

	return (s->excluded_devices & all) == all ? TE_ERR_NO_DEVICE : TE_OK;
}

static const struct te_plugin_ops conffake_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = conffake_init,
	.fini = conffake_fini,
	.query_caps = conffake_query_caps,
	.query_devices = conffake_query_devices,
	.reg_mem = conffake_reg_mem,
	.dereg_mem = conffake_dereg_mem,
	.pack_key = conffake_pack_key,
	.load_peer_ex = conffake_load_peer_ex,
	.unload_peer = conffake_unload_peer,
	.unpack_remote_key = conffake_unpack_remote_key,
	.release_remote_key = conffake_release_remote_key,
	.submit = conffake_submit,
	.progress = conffake_progress,
	.cancel = conffake_cancel,
	.retry_prepare = conffake_retry_prepare,
};

static const struct te_plugin_desc conffake_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = CONFFAKE_DESC_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "same-host process_vm_readv/writev transport (te-conformance's test fake)",
	.ops = &conffake_ops,
};

TE_PLUGIN_DEFINE(&conffake_desc)

#ifdef CONFFAKE_EXTRA_EXPORT
/* A helper left visible by mistake: te-conformance must flag it. */
TE_PLUGIN_EXPORT int conffake_debug_level(void);
TE_PLUGIN_EXPORT int conffake_debug_level(void)
{
	return 0;
}
#endif
