/* SPDX-License-Identifier: Apache-2.0 */
/* efa.c: the efa transport's ops: options, init and fini, caps, devices, memory and keys. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv */
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/uio.h>
#include <unistd.h>

#include <rdma/fi_errno.h>

#include <te/te_plugin_opts.h>

#include "efa.h"

void efa_error(struct efa_inst *ei, const char *fmt, ...)
{
	char buf[EFA_DETAIL];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (ei->host->set_error)
		ei->host->set_error(ei->ctx, "%s", buf);
	efa_log(ei, TE_PLUGIN_LOG_DEBUG, "%s", buf);
}

/* --- options ---------------------------------------------------------------------------- */

static const char *const efa_progress_modes[] = { "auto", "adaptive", "busy", "caller", NULL };
static const char *const efa_completions[] = { "auto", "delivery", "transmit", NULL };

/*
 * Declared options (te_plugin.h, ABI 1.2): the core checks types, ranges and choices before
 * init and hands every one in normal form with its default; README.md says more.
 */
static const struct te_plugin_option efa_option_decls[] = {
	TE_PLUGIN_OPTION_STRING("provider", "efa",
				"libfabric provider (efa; tcp;ofi_rxm, shm or net for tests)"),
	TE_PLUGIN_OPTION_STRING("devices", NULL, "NICs to use, comma-separated (default: all)"),
	TE_PLUGIN_OPTION_STRING(
		"node", NULL,
		"address the endpoints bind (IP providers; default 127.0.0.1, \"\": "
		"the provider's choice)"),
	TE_PLUGIN_OPTION_STRING("iface", NULL,
				"interface whose address the endpoints bind (instead of node)"),
	TE_PLUGIN_OPTION_INT("window", "0", 0, EFA_MAX_WINDOW,
			     "operations in flight per NIC; 0: from the provider's queue sizes"),
	TE_PLUGIN_OPTION_SIZE("slice_size", "4M", 4096, EFA_MAX_SLICE,
			      "slice size advertised to the core (transfer.slice_size overrides)"),
	TE_PLUGIN_OPTION_CHOICE("progress", "auto", efa_progress_modes,
				"who polls completions (auto: busy on EFA, caller over IP)"),
	TE_PLUGIN_OPTION_INT("spin_us", "20", 0, 1000000,
			     "adaptive progress: how long a poller spins before it sleeps"),
	TE_PLUGIN_OPTION_INT("poll_us", "50", 1, 1000000,
			     "adaptive progress: the sleeping poller's period"),
	TE_PLUGIN_OPTION_INT("progress_threads", "1", 1, EFA_MAX_THREADS, "polling threads"),
	TE_PLUGIN_OPTION_CHOICE(
		"write_completion", "auto", efa_completions,
		"when a WRITE completes (auto: delivery, transmit on shm with CMA)"),
	TE_PLUGIN_OPTION_BOOL("warmup", "true", "exchange a message with each peer on load"),
	TE_PLUGIN_OPTION_INT("connect_timeout_ms", "3000", 1, 600000,
			     "time to reach a peer's endpoint"),
};

static uint64_t efa_opt_int(const struct efa_inst *ei, const char *key)
{
	return (uint64_t)te_plugin_opt_int(ei->host, ei->ctx, key, 0);
}

/* Provider names whose endpoints are addressed by IP (a node address applies). */
static bool efa_prov_is_ip(const char *prov)
{
	static const char *const ip[] = { "tcp", "net", "sockets", "udp", "verbs", NULL };
	size_t len = strcspn(prov, ";");

	for (unsigned i = 0; ip[i]; i++)
		if (strlen(ip[i]) == len && strncmp(prov, ip[i], len) == 0)
			return true;
	return false;
}

/* First IPv4 (else IPv6) address of interface @name, as text. */
static enum te_status efa_iface_addr(struct efa_inst *ei, const char *name, char *buf, size_t cap)
{
	struct ifaddrs *ifa = NULL, *best = NULL;

	if (getifaddrs(&ifa) != 0) {
		efa_error(ei, EFA_NAME ": option 'iface': getifaddrs: %s", strerror(errno));
		return TE_ERR_CONFIG;
	}
	for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
		if (!i->ifa_addr || strcmp(i->ifa_name, name) != 0)
			continue;
		if (i->ifa_addr->sa_family == AF_INET) {
			best = i;
			break;
		}
		if (i->ifa_addr->sa_family == AF_INET6 && !best)
			best = i;
	}
	if (!best) {
		freeifaddrs(ifa);
		efa_error(ei, EFA_NAME ": option 'iface': no interface '%s' with an IP address",
			  name);
		return TE_ERR_CONFIG;
	}
	if (best->ifa_addr->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)best->ifa_addr)->sin_addr, buf,
			  (socklen_t)cap);
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)best->ifa_addr)->sin6_addr,
			  buf, (socklen_t)cap);
	freeifaddrs(ifa);
	return TE_OK;
}

/*
 * Whether processes of this user may copy each other's memory with CMA: the syscalls are
 * not filtered (a copy from ourselves works), Yama allows it between unrelated processes and
 * the shm provider was not told to avoid it.
 */
static bool efa_cma_usable(void)
{
	const char *env = getenv("FI_SHM_DISABLE_CMA");
	char src = 1, dst = 0;
	struct iovec l = { .iov_base = &dst, .iov_len = 1 }, r = { .iov_base = &src, .iov_len = 1 };
	int scope = 0;
	FILE *f;

	if (env && *env && strcmp(env, "0") != 0 && strcasecmp(env, "no") != 0 &&
	    strcasecmp(env, "false") != 0)
		return false;
	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1 || dst != 1)
		return false;
	f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = 1;
		fclose(f);
	}
	return scope == 0;
}

static enum te_status efa_options(struct efa_inst *ei)
{
	const struct te_plugin_host *h = ei->host;
	const char *s, *iface, *node;
	enum te_status st;
	int prog, comp;

	s = h->config_get(ei->ctx, "provider");
	if (!s || !*s)
		s = "efa";
	if (strlen(s) > EFA_MAX_PROV) {
		efa_error(ei, EFA_NAME ": option 'provider': longer than %u characters",
			  EFA_MAX_PROV);
		return TE_ERR_CONFIG;
	}
	snprintf(ei->provider, sizeof(ei->provider), "%s", s);
	s = h->config_get(ei->ctx, "devices");
	if (s && *s) {
		ei->devices = strdup(s);
		if (!ei->devices)
			return TE_ERR_NOMEM;
	}

	iface = h->config_get(ei->ctx, "iface");
	node = h->config_get(ei->ctx, "node");
	if (iface && *iface && node && *node) {
		efa_error(ei, EFA_NAME ": options 'iface' and 'node' are mutually exclusive");
		return TE_ERR_CONFIG;
	}
	if (iface && *iface) {
		st = efa_iface_addr(ei, iface, ei->node, sizeof(ei->node));
		if (st != TE_OK)
			return st;
	} else if (node) {
		/* An explicit empty value leaves the choice to the provider. */
		if (strlen(node) >= sizeof(ei->node)) {
			efa_error(ei, EFA_NAME ": option 'node': '%s' is not an address", node);
			return TE_ERR_CONFIG;
		}
		snprintf(ei->node, sizeof(ei->node), "%s", node);
	} else if (efa_prov_is_ip(ei->provider)) {
		/* Loopback unless told otherwise: no traffic leaves the host by accident. */
		snprintf(ei->node, sizeof(ei->node), "127.0.0.1");
	}

	ei->window_opt = (uint32_t)efa_opt_int(ei, "window");
	ei->slice_size = te_plugin_opt_size(h, ei->ctx, "slice_size", EFA_DEF_SLICE);
	prog = te_plugin_opt_choice(h, ei->ctx, "progress", efa_progress_modes, 0);
	/*
	 * auto: a real EFA device wants a dedicated polling core. Providers over IP move data
	 * in software only while polled: the waiting application thread polls best (no
	 * hand-off per completion). shm completes in the post call (CMA), so polling only
	 * reaps, and with several submitting threads a poller takes a CPU from a copier.
	 */
	if (prog == 2 || (prog == 0 && strcmp(ei->provider, "efa") == 0))
		ei->progress = EFA_PROGRESS_BUSY;
	else if (prog == 3 || (prog == 0 && efa_prov_is_ip(ei->provider)))
		ei->progress = EFA_PROGRESS_CALLER;
	else
		ei->progress = EFA_PROGRESS_ADAPTIVE;
	ei->spin_ns = efa_opt_int(ei, "spin_us") * 1000;
	ei->poll_ns = efa_opt_int(ei, "poll_us") * 1000;
	ei->n_threads_opt = (uint32_t)efa_opt_int(ei, "progress_threads");
	comp = te_plugin_opt_choice(h, ei->ctx, "write_completion", efa_completions, 0);
	/*
	 * auto: delivery, except on shm with CMA, where the initiator itself copies with
	 * process_vm_writev, so a WRITE that completes is already in the target's memory, while
	 * asking for delivery completion would make every WRITE wait for the target to poll
	 * (and hang on a dead target: shm never fails them).
	 */
	if (comp == 0)
		comp = strcmp(ei->provider, "shm") == 0 && efa_cma_usable() ? 2 : 1;
	ei->write_flags = comp == 1 ? FI_DELIVERY_COMPLETE : 0;
	ei->warmup = te_plugin_opt_bool(h, ei->ctx, "warmup", true);
	ei->connect_timeout_ms = efa_opt_int(ei, "connect_timeout_ms");
	return TE_OK;
}

/* --- install ------------------------------------------------------------------------------ */

/* Teardown shared by fini and a failing init; @ei may be partly built. */
static void efa_destroy(struct efa_inst *ei)
{
	uint32_t reported, peers = 0, mems = 0, rkeys = 0;

	reported = efa_quiesce(ei);
	while (ei->peers) {
		peers++;
		efa_peer_free_locked(ei, ei->peers);
	}
	while (ei->rkeys) {
		struct efa_rkey *k = ei->rkeys;

		ei->rkeys = k->next;
		rkeys++;
		free(k);
	}
	while (ei->mems) {
		struct efa_mem *m = ei->mems;

		ei->mems = m->next;
		for (uint32_t i = 0; i < ei->n_nics; i++)
			if (m->mr && m->mr[i])
				fi_close(&m->mr[i]->fid);
		free(m->mr);
		free(m->desc);
		free(m->key);
		free(m);
		mems++;
	}
	for (uint32_t i = 0; ei->nics && i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];

		for (uint32_t k = 0; k < nic->n_av; k++)
			free(nic->av_entries[k]);
		free(nic->av_entries);
		/*
		 * An endpoint efa_quiesce left open (a READ response half received) keeps what it
		 * is bound to, and its receive buffers.
		 */
		if (!nic->ep_kept) {
			if (nic->msg_mr)
				fi_close(&nic->msg_mr->fid);
			if (nic->av)
				fi_close(&nic->av->fid);
			if (nic->cq)
				fi_close(&nic->cq->fid);
			if (nic->domain)
				fi_close(&nic->domain->fid);
			if (nic->fabric)
				fi_close(&nic->fabric->fid);
			free(nic->msg);
		}
		if (nic->info)
			fi_freeinfo(nic->info);
		free(nic->bits);
		free(nic->slots);
		pthread_mutex_destroy(&nic->lock);
	}
	if (reported || peers || rkeys || mems)
		efa_log(ei, TE_PLUGIN_LOG_DEBUG,
			"fini reported %u completions and released %u peers, %u remote keys, "
			"%u regions",
			reported, peers, rkeys, mems);
	for (uint32_t t = 0; ei->progs && t < ei->n_progs; t++) {
		if (ei->progs[t].kick_fd >= 0)
			close(ei->progs[t].kick_fd);
		free(ei->progs[t].nics);
		free(ei->progs[t].pfds);
	}
	free(ei->progs);
	free(ei->nics);
	free(ei->devices);
	pthread_mutex_destroy(&ei->lock);
	pthread_mutex_destroy(&ei->defer_lock);
	free(ei);
}

/*
 * rxm closes its connection to an address removed from the AV, returning the operations queued
 * on it, only with FI_AV_REMOVE_CLEANUP, which libfabric reads once, at its first use in the
 * process: without it a canceled operation to a stopped peer could end only when that peer ran
 * again. There is no other way to set it; an explicit setting is kept and said. shm needs none.
 */
static void efa_env_init(struct efa_inst *ei)
{
	const char *v = getenv("FI_AV_REMOVE_CLEANUP");

	if (strcmp(ei->provider, "shm") == 0)
		return;
	if (!v) {
		if (setenv("FI_AV_REMOVE_CLEANUP", "1", 0) != 0)
			efa_log(ei, TE_PLUGIN_LOG_WARN, "setenv(FI_AV_REMOVE_CLEANUP): %s",
				strerror(errno));
		return;
	}
	if (strcmp(v, "1") != 0 && strcasecmp(v, "yes") != 0 && strcasecmp(v, "true") != 0 &&
	    strcasecmp(v, "on") != 0)
		efa_log(ei, TE_PLUGIN_LOG_WARN,
			"FI_AV_REMOVE_CLEANUP=%s: a canceled or timed-out operation ends only when "
			"the provider completes it, not when its connection is closed",
			v);
}

static enum te_status efa_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out)
{
	uint8_t *blob = NULL;
	struct efa_inst *ei;
	enum te_status st;
	size_t len = 0;

	if (!host || !inst_out || !host->log || !host->slice_done || !host->config_get ||
	    !host->publish)
		return TE_ERR_INVALID_ARG;
	if (host->abi_major != TE_PLUGIN_ABI_MAJOR)
		return TE_ERR_ABI_MISMATCH;
	ei = calloc(1, sizeof(*ei));
	if (!ei)
		return TE_ERR_NOMEM;
	ei->host = host;
	ei->ctx = ctx;
	pthread_mutex_init(&ei->lock, NULL);
	pthread_mutex_init(&ei->defer_lock, NULL);

	st = efa_options(ei);
	if (st != TE_OK)
		goto err_destroy;
	efa_env_init(ei);
	st = efa_nics_open(ei);
	if (st != TE_OK)
		goto err_destroy;
	if (ei->gpu_types)
		efa_log(ei, TE_PLUGIN_LOG_INFO,
			"GPU memory: moved by provider %s through FI_HMEM (%s%s%s)", ei->prov_name,
			(ei->gpu_types & TE_PLUGIN_MEM_CUDA) ? "cuda" : "",
			ei->gpu_types == (TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP) ? ", " : "",
			(ei->gpu_types & TE_PLUGIN_MEM_HIP) ? "hip" : "");
	else
		efa_log(ei, TE_PLUGIN_LOG_INFO,
			"GPU memory: staged by the core here; peers cannot reach GPU regions over "
			"efa (provider %s has no usable FI_HMEM interface)",
			ei->prov_name);
	blob = malloc(EFA_BLOB_MAX);
	if (!blob) {
		st = TE_ERR_NOMEM;
		goto err_destroy;
	}
	st = efa_blob(ei, blob, &len);
	if (st != TE_OK)
		goto err_destroy;
	st = host->publish(ctx, blob, len);
	if (st != TE_OK) {
		efa_error(ei, EFA_NAME ": publish failed: %d", st);
		goto err_destroy;
	}
	st = efa_progs_start(ei);
	if (st != TE_OK)
		goto err_destroy;
	free(blob);
	efa_log(ei, TE_PLUGIN_LOG_INFO,
		"provider %s, %u NIC(s) (first: %s, mr_mode 0x%" PRIx64
		", %s), window %u, slice %" PRIu64 ", progress %s, %s completion of WRITEs",
		ei->prov_name, ei->n_nics, ei->nics[0].name, ei->nics[0].mr_mode,
		ei->nics[0].wait_fd >= 0 ? "wait fd" : "polled", ei->nics[0].window, ei->slice_size,
		ei->progress == EFA_PROGRESS_BUSY     ? "busy"
		: ei->progress == EFA_PROGRESS_CALLER ? "caller"
						      : "adaptive",
		ei->write_flags ? "delivery" : "transmit");
	*inst_out = (struct te_plugin_inst *)ei;
	return TE_OK;

err_destroy:
	free(blob);
	efa_destroy(ei);
	return st;
}

static void efa_fini(struct te_plugin_inst *inst)
{
	efa_destroy(efa_inst_of(inst));
}

static enum te_status efa_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t max_slice;

	if (!caps)
		return TE_ERR_INVALID_ARG;
	max_slice = EFA_MIN(ei->max_msg ? ei->max_msg : EFA_MAX_SLICE, EFA_MAX_SLICE);
	caps->mem_types = TE_PLUGIN_MEM_CPU | ei->gpu_types;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	/* 'caller': hybrid, the waiting application thread polls while our threads stand by. */
	caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	caps->flags = (ei->same_host ? TE_PLUGIN_CAP_SAME_HOST_ONLY : 0) |
		      (ei->progress == EFA_PROGRESS_CALLER ? TE_PLUGIN_CAP_HYBRID_PROGRESS : 0);
	caps->max_slice_size = max_slice;
	caps->default_slice_size = EFA_MIN(ei->slice_size, max_slice);
	caps->slice_priv_size = sizeof(struct efa_spriv);
	caps->max_devices = ei->n_nics;
	return TE_OK;
}

static enum te_status efa_query_devices(struct te_plugin_inst *inst,
					struct te_plugin_device *devices, uint32_t max,
					uint32_t *n_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint32_t n;

	if (!n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	n = EFA_MIN(max, ei->n_nics);
	for (uint32_t i = 0; i < n; i++) {
		const struct efa_nic *nic = &ei->nics[i];

		te_plugin_device_set(&devices[i], nic->name, nic->numa, nic->pci, nic->speed_mbps,
				     TE_PLUGIN_MEM_CPU | ei->gpu_types);
	}
	*n_out = n;
	return TE_OK;
}

/* --- memory ---------------------------------------------------------------------------- */

static enum te_status efa_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				  uint32_t mem_type, int32_t dev, uint32_t access,
				  struct te_plugin_mem **mem_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t fi_access = FI_READ | FI_WRITE;
	struct efa_mem *m;
	uint32_t i;

	if (!addr || length == 0 || !mem_out || (access & ~EFA_ACCESS_ALL))
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CPU && !(mem_type & ei->gpu_types)) {
		efa_error(ei, EFA_NAME ": provider %s moves no %s memory itself (no FI_HMEM)",
			  ei->prov_name, mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda");
		return TE_ERR_MEMORY_TYPE;
	}
	if ((uint64_t)(uintptr_t)addr > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	if (access & TE_PLUGIN_ACCESS_REMOTE_READ)
		fi_access |= FI_REMOTE_READ;
	if (access & TE_PLUGIN_ACCESS_REMOTE_WRITE)
		fi_access |= FI_REMOTE_WRITE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = (uint64_t)(uintptr_t)addr;
	m->length = length;
	m->access = access;
	m->mr = calloc(ei->n_nics, sizeof(*m->mr));
	m->desc = calloc(ei->n_nics, sizeof(*m->desc));
	m->key = calloc(ei->n_nics, sizeof(*m->key));
	if (!m->mr || !m->desc || !m->key)
		goto err_nomem;
	/* Topology: the NICs on the region's NUMA node carry its slices; else all NICs. */
	for (i = 0; i < ei->n_nics; i++) {
		if (mem_type == TE_PLUGIN_MEM_CPU && dev >= 0 && ei->nics[i].numa == dev) {
			m->pref[m->n_pref++] = (uint8_t)i;
			m->nic_mask |= 1ull << i;
		}
	}
	if (!m->n_pref) {
		for (i = 0; i < ei->n_nics; i++)
			m->pref[m->n_pref++] = (uint8_t)i;
		m->nic_mask = 0;
	}
	for (i = 0; i < ei->n_nics; i++) {
		int ret = efa_nic_reg(&ei->nics[i], addr, length, fi_access, mem_type, dev,
				      &m->mr[i], &m->desc[i], &m->key[i]);
		/* GPU memory the provider's FI_HMEM interface cannot take: the core stages it. */
		bool gpu_refused = mem_type != TE_PLUGIN_MEM_CPU &&
				   (ret == -FI_ENOSYS || ret == -FI_EOPNOTSUPP ||
				    ret == -FI_EINVAL || ret == -FI_EACCES);

		if (ret) {
			if (gpu_refused)
				efa_error(ei,
					  EFA_NAME ": %s: fi_mr_regattr of %s:%d [%p, +%" PRIu64
						   ") through FI_HMEM: %s; the core stages it",
					  ei->nics[i].name,
					  mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda", dev, addr,
					  length, fi_strerror(-ret));
			else
				efa_error(ei,
					  EFA_NAME ": %s: fi_mr_regattr of [%p, +%" PRIu64 "): %s",
					  ei->nics[i].name, addr, length, fi_strerror(-ret));
			while (i--) {
				efa_nic_lock(&ei->nics[i]);
				fi_close(&m->mr[i]->fid);
				efa_nic_unlock(&ei->nics[i]);
			}
			free(m->mr);
			free(m->desc);
			free(m->key);
			free(m);
			if (gpu_refused)
				return TE_ERR_UNSUPPORTED;
			return ret == -FI_ENOMEM ? TE_ERR_NOMEM : TE_ERR_SYSTEM;
		}
	}
	pthread_mutex_lock(&ei->lock);
	m->next = ei->mems;
	if (ei->mems)
		ei->mems->prev = m;
	ei->mems = m;
	pthread_mutex_unlock(&ei->lock);
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;

err_nomem:
	free(m->mr);
	free(m->desc);
	free(m->key);
	free(m);
	return TE_ERR_NOMEM;
}

static enum te_status efa_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_mem *m = (struct efa_mem *)mem;
	uint32_t busy;

	if (!m)
		return TE_ERR_INVALID_ARG;
	/* Our own operations still use it: the provider may yet read or write it. */
	busy = atomic_load_explicit(&m->inflight, memory_order_acquire);
	if (busy) {
		efa_error(ei,
			  EFA_NAME ": region [0x%" PRIx64 ", +%" PRIu64 ") has %u operation(s) "
				   "in flight",
			  m->addr, m->length, busy);
		return TE_ERR_BUSY;
	}
	pthread_mutex_lock(&ei->lock);
	if (m->prev)
		m->prev->next = m->next;
	else
		ei->mems = m->next;
	if (m->next)
		m->next->prev = m->prev;
	pthread_mutex_unlock(&ei->lock);
	/* Closing the MR revokes its key: peers' later operations on it fail at the target. */
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		efa_nic_lock(&ei->nics[i]);
		fi_close(&m->mr[i]->fid);
		efa_nic_unlock(&ei->nics[i]);
	}
	free(m->mr);
	free(m->desc);
	free(m->key);
	free(m);
	return TE_OK;
}

static enum te_status efa_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				   void *buf, size_t cap, size_t *len_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	const struct efa_mem *m = (const struct efa_mem *)mem;
	size_t len;
	uint8_t *p = buf;

	if (!m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	len = EFA_KEY_HDR + 8u * ei->n_nics;
	if (cap < len)
		return TE_ERR_TOO_LARGE;
	te_plugin_put_u32(p, EFA_KEY_MAGIC);
	p[4] = 1;
	p[5] = (uint8_t)ei->n_nics;
	/* The target's mr_mode decides how its provider reads remote addresses. */
	te_plugin_put_u16(p + 6, (ei->nics[0].mr_mode & FI_MR_VIRT_ADDR) ? 0 : EFA_KEY_OFFSET);
	te_plugin_put_u32(p + 8, m->access);
	te_plugin_put_u32(p + 12, 0);
	te_plugin_put_u64(p + 16, m->addr);
	te_plugin_put_u64(p + 24, m->length);
	te_plugin_put_u64(p + 32, m->nic_mask);
	for (uint32_t i = 0; i < ei->n_nics; i++)
		te_plugin_put_u64(p + EFA_KEY_HDR + 8u * i, m->key[i]);
	*len_out = len;
	return TE_OK;
}

/* --- remote keys ---------------------------------------------------------------------- */

static enum te_status efa_unpack_remote_key(struct te_plugin_inst *inst,
					    struct te_plugin_peer *handle, const void *blob,
					    size_t len, uint64_t addr, uint64_t length,
					    struct te_plugin_rkey **rkey_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_peer *peer = (struct efa_peer *)handle;
	const uint8_t *p = blob;
	struct efa_rkey *k;
	uint64_t kaddr, klen, mask;
	uint32_t n, access;
	uint16_t flags;

	if (!peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len < EFA_KEY_HDR || te_plugin_get_u32(p) != EFA_KEY_MAGIC || p[4] != 1)
		goto err_malformed;
	n = p[5];
	flags = te_plugin_get_u16(p + 6);
	access = te_plugin_get_u32(p + 8);
	kaddr = te_plugin_get_u64(p + 16);
	klen = te_plugin_get_u64(p + 24);
	mask = te_plugin_get_u64(p + 32);
	/* The key must describe exactly the buffer the descriptor lists it under. */
	if (n != peer->n_rnics || len != EFA_KEY_HDR + 8u * n || (flags & ~EFA_KEY_OFFSET) ||
	    (access & ~EFA_ACCESS_ALL) || te_plugin_get_u32(p + 12) != 0 || klen == 0 ||
	    kaddr > UINT64_MAX - klen || kaddr != addr || klen != length || (n < 64 && (mask >> n)))
		goto err_malformed;
	k = calloc(1, sizeof(*k) + n * sizeof(k->keys[0]));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = kaddr;
	k->length = klen;
	k->access = access;
	k->offset = flags & EFA_KEY_OFFSET;
	k->n_keys = n;
	for (uint32_t j = 0; j < n; j++) {
		k->keys[j] = te_plugin_get_u64(p + EFA_KEY_HDR + 8u * j);
		if (!mask || (mask & (1ull << j)))
			k->pref[k->n_pref++] = (uint8_t)j;
	}
	pthread_mutex_lock(&ei->lock);
	k->next = ei->rkeys;
	if (ei->rkeys)
		ei->rkeys->prev = k;
	ei->rkeys = k;
	pthread_mutex_unlock(&ei->lock);
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;

err_malformed:
	efa_error(ei,
		  EFA_NAME ": peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64
			   ", +%" PRIu64 ")",
		  peer->name, len, addr, length);
	return TE_ERR_METADATA_MALFORMED;
}

static void efa_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_rkey *k = (struct efa_rkey *)rkey;

	if (!k)
		return;
	/* Posted operations carry copies of the key: nothing in flight refers to it. */
	pthread_mutex_lock(&ei->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		ei->rkeys = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&ei->lock);
	free(k);
}

static const struct te_plugin_ops efa_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = efa_init,
	.fini = efa_fini,
	.query_caps = efa_query_caps,
	.query_devices = efa_query_devices,
	.reg_mem = efa_reg_mem,
	.dereg_mem = efa_dereg_mem,
	.pack_key = efa_pack_key,
	.load_peer = efa_load_peer,
	.unload_peer = efa_unload_peer,
	.unpack_remote_key = efa_unpack_remote_key,
	.release_remote_key = efa_release_remote_key,
	.submit = efa_submit,
	.progress = efa_progress,
	.cancel = efa_cancel,
	.retry_prepare = efa_retry_prepare,
	.wait = efa_wait,
	.drive = efa_drive,
};

static const struct te_plugin_desc efa_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = EFA_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "libfabric RDM transport (AWS EFA; tcp;ofi_rxm, shm, net for tests): "
		       "one-sided READ/WRITE",
	.ops = &efa_ops,
	TE_PLUGIN_OPTIONS(efa_option_decls),
};

TE_PLUGIN_DEFINE(&efa_desc)
