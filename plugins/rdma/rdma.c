/* SPDX-License-Identifier: Apache-2.0 */
/* rdma.c: the rdma transport's entry point: options, devices, GIDs, memory keys and the ops. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np */
#endif

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/mempolicy.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <te/te_plugin_opts.h>

#include "rdma_priv.h"

/*
 * The verbs table: libibverbs itself, or (unit tests) the software fabric named by
 * RDMA_VERBS_TABLE at build time.
 */
#ifdef RDMA_VERBS_TABLE
extern const struct rdma_verbs RDMA_VERBS_TABLE;
#define RDMA_VERBS (&RDMA_VERBS_TABLE)
#else
#define RDMA_VERBS (&rdma_verbs_real)
#endif

#define RDMA_SYSFS "/sys/class/infiniband"

/* --- small helpers shared by the plugin's files ------------------------------------------- */

void rdma_gid_text(const union ibv_gid *gid, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, gid->raw, buf, (socklen_t)len))
		snprintf(buf, len, "?");
}

uint32_t rdma_mtu_bytes(enum ibv_mtu mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 0;
}

void rdma_kick(int fd)
{
	uint64_t one = 1;

	if (fd >= 0 && write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		(void)0; /* the counter is saturated: the reader wakes anyway */
}

static struct rdma_inst *rdma_inst_of(struct te_plugin_inst *inst)
{
	return (struct rdma_inst *)inst;
}

void rdma_set_error(struct rdma_inst *ri, const char *fmt, ...)
{
	char text[RDMA_DETAIL * 2];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (ri->host->set_error)
		ri->host->set_error(ri->ctx, "%s", rdma_unprefixed(text));
	rdma_log(ri, TE_PLUGIN_LOG_INFO, "%s", rdma_unprefixed(text));
}

/* --- options ------------------------------------------------------------------------------ */

static const char *const rdma_progress_modes[] = { "auto", "manual", NULL };
static const char *const rdma_mtus[] = { "256", "512", "1024", "2048", "4096", NULL };
static const char *const rdma_gpu_modes[] = { "auto", "dmabuf", "peermem", "off", NULL };
static const char *const rdma_doorbells[] = { "poller", "submitter", NULL };

/*
 * Declared options (te_plugin.h, ABI 1.2): the core checks types, ranges and choices before
 * init and hands every one in normal form with its default; README.md says more. The formats
 * of devices, gid_index, topology and test_fault are checked here.
 */
static const struct te_plugin_option rdma_options[] = {
	TE_PLUGIN_OPTION_STRING("devices", NULL,
				"devices and ports to open (\"mlx5_0,mlx5_1:2\"; default: every "
				"device with an active port)"),
	TE_PLUGIN_OPTION_STRING("gid_index", NULL,
				"GID index: N for every device, or dev:N[,dev:N...] (default: "
				"automatic)"),
	TE_PLUGIN_OPTION_INT("qp_per_peer", "2", 1, RDMA_MAX_QP_PER_PEER,
			     "queue pairs per device towards each peer"),
	TE_PLUGIN_OPTION_INT("qp_depth", "128", 1, RDMA_MAX_QP_DEPTH,
			     "work requests in flight per queue pair"),
	TE_PLUGIN_OPTION_INT("cq_depth", "4096", 16, 1 << 20, "completion queue entries"),
	TE_PLUGIN_OPTION_SIZE("slice_size", "64K", 4096, RDMA_MAX_SLICE,
			      "slice size advertised to the core (transfer.slice_size overrides)"),
	TE_PLUGIN_OPTION_SIZE("max_mr_size", "0", 0, 0,
			      "largest memory region registered at once (at least 8K); 0: the "
			      "device's limit"),
	TE_PLUGIN_OPTION_CHOICE("progress", "auto", rdma_progress_modes,
				"auto: a poller thread; manual: the core's progress calls"),
	TE_PLUGIN_OPTION_INT("timeout", "14", 1, 31,
			     "local ACK timeout exponent (4.096 us * 2^timeout)"),
	TE_PLUGIN_OPTION_INT("retry_cnt", "6", 0, 7,
			     "transport retries (7 is infinite on some devices)"),
	TE_PLUGIN_OPTION_CHOICE("mtu", "4096", rdma_mtus,
				"largest path MTU (the port's active MTU caps it)"),
	TE_PLUGIN_OPTION_INT("traffic_class", "0", 0, 255, "RoCE traffic class"),
	TE_PLUGIN_OPTION_INT("sl", "0", 0, 15, "InfiniBand service level"),
	TE_PLUGIN_OPTION_STRING(
		"topology", NULL,
		"devices per memory location (\"cpu:0=mlx5_0;cuda:0=mlx5_1;*=mlx5_2\")"),
	TE_PLUGIN_OPTION_CHOICE("gpu_direct", "auto", rdma_gpu_modes,
				"how GPU memory is registered (dmabuf, peermem, off: staged)"),
	TE_PLUGIN_OPTION_INT("handshake_timeout_ms", "5000", 1, 600000,
			     "time for a peer's QP exchange"),
	TE_PLUGIN_OPTION_INT("reconnect_backoff_ms", "200", 0, 600000,
			     "pause before reconnecting to a peer after a failure"),
	TE_PLUGIN_OPTION_INT("key_refused_hold_ms", "1000", 0, 600000,
			     "after the peer refused a region's remote key (unregistered, or "
			     "registered again), requests under that key fail at once for this "
			     "long instead of breaking QPs (0: never)"),
	TE_PLUGIN_OPTION_INT("poll_spin_us", "50", 0, 10000000,
			     "the poller spins this long before it sleeps"),
	TE_PLUGIN_OPTION_INT("poll_nap_us", "1000", 0, 100000, "the sleeping poller's longest nap"),
	TE_PLUGIN_OPTION_INT("post_batch", "64", 1, RDMA_MAX_QP_DEPTH,
			     "work requests posted per doorbell"),
	TE_PLUGIN_OPTION_CHOICE("doorbell", "poller", rdma_doorbells,
				"who posts work requests (manual progress: always the submitter)"),
	TE_PLUGIN_OPTION_STRING("test_fault", NULL,
				"tests only: rkey@N or oob@N makes work request N fail"),
};

static uint64_t rdma_opt(const struct rdma_inst *ri, const char *key)
{
	return (uint64_t)te_plugin_opt_int(ri->host, ri->ctx, key, 0);
}

static enum te_status rdma_parse_fault(struct rdma_inst *ri)
{
	const char *s = ri->host->config_get(ri->ctx, "test_fault");
	const char *at;
	char *end;

	if (!s || !*s)
		return TE_OK;
	at = strchr(s, '@');
	if (at && !strncmp(s, "rkey@", 5))
		ri->fault = RDMA_FAULT_RKEY;
	else if (at && !strncmp(s, "oob@", 4))
		ri->fault = RDMA_FAULT_OOB;
	else
		goto err_invalid;
	errno = 0;
	ri->fault_nth = strtoull(at + 1, &end, 10);
	if (errno || *end || !isdigit((unsigned char)at[1]) || ri->fault_nth == 0)
		goto err_invalid;
	rdma_log(ri, TE_PLUGIN_LOG_WARN,
		 "test_fault '%s': work request %" PRIu64 " will be made to fail (tests only)", s,
		 ri->fault_nth);
	return TE_OK;

err_invalid:
	rdma_set_error(ri, "option 'test_fault': expected rkey@N or oob@N (N >= 1), got '%s'", s);
	return TE_ERR_CONFIG;
}

static enum te_status rdma_parse_options(struct rdma_inst *ri)
{
	static const enum ibv_mtu mtus[] = { IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048,
					     IBV_MTU_4096 };
	const struct te_plugin_host *h = ri->host;

	ri->qp_per_peer = (uint32_t)rdma_opt(ri, "qp_per_peer");
	ri->qp_depth = (uint32_t)rdma_opt(ri, "qp_depth");
	ri->post_batch = (uint32_t)rdma_opt(ri, "post_batch");
	ri->cq_depth = (uint32_t)rdma_opt(ri, "cq_depth");
	ri->slice_size = te_plugin_opt_size(h, ri->ctx, "slice_size", RDMA_DEF_SLICE);
	ri->max_mr_opt = te_plugin_opt_size(h, ri->ctx, "max_mr_size", 0);
	if (ri->max_mr_opt && ri->max_mr_opt < (8u << 10)) {
		rdma_set_error(ri, "option 'max_mr_size': %" PRIu64 " is below 8K", ri->max_mr_opt);
		return TE_ERR_CONFIG;
	}
	ri->ib_timeout = (uint8_t)rdma_opt(ri, "timeout");
	/* 6, not 7, by default: soft-RoCE (rxe) reads 7 as "retry forever", so a dead peer
	 * would hang its QPs instead of completing their work with a retry-exceeded error. */
	ri->retry_cnt = (uint8_t)rdma_opt(ri, "retry_cnt");
	ri->rnr_retry = 7;
	ri->traffic_class = (uint8_t)rdma_opt(ri, "traffic_class");
	ri->sl = (uint8_t)rdma_opt(ri, "sl");
	ri->mtu_cap = mtus[te_plugin_opt_choice(h, ri->ctx, "mtu", rdma_mtus, 4)];
	ri->handshake_timeout_ms = (uint32_t)rdma_opt(ri, "handshake_timeout_ms");
	ri->reconnect_backoff_ms = (uint32_t)rdma_opt(ri, "reconnect_backoff_ms");
	ri->key_refused_hold_ns = rdma_opt(ri, "key_refused_hold_ms") * 1000000ull;
	ri->spin_ns = rdma_opt(ri, "poll_spin_us") * 1000;
	ri->nap_ns = rdma_opt(ri, "poll_nap_us") * 1000;
	ri->gpu_direct = (enum rdma_gpu_direct)te_plugin_opt_choice(h, ri->ctx, "gpu_direct",
								    rdma_gpu_modes, 0);
	ri->manual = te_plugin_opt_choice(h, ri->ctx, "progress", rdma_progress_modes, 0) == 1;
	/* MANUAL: no poller thread; the submitting thread rings the doorbell. */
	ri->poller_posts =
		!ri->manual && te_plugin_opt_choice(h, ri->ctx, "doorbell", rdma_doorbells, 0) == 0;
	return rdma_parse_fault(ri);
}

/* --- devices ------------------------------------------------------------------------------ */

static bool rdma_gid_is_v4(const union ibv_gid *g)
{
	static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return !memcmp(g->raw, prefix, sizeof(prefix));
}

static bool rdma_gid_is_link_local(const union ibv_gid *g)
{
	return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

static bool rdma_gid_is_zero(const union ibv_gid *g)
{
	for (unsigned i = 0; i < 16; i++)
		if (g->raw[i])
			return false;
	return true;
}

/* 0: IPv4-mapped, 1: global IPv6, 2: link-local. */
static int rdma_gid_family(const union ibv_gid *g)
{
	return rdma_gid_is_v4(g) ? 0 : rdma_gid_is_link_local(g) ? 2 : 1;
}

/* Preference of an automatic GID: RoCE v2 first, IPv4-mapped, then global, then link-local. */
static int rdma_gid_score(const struct rdma_gid *g)
{
	static const int by_family[3] = { 3, 2, 1 };
	int base = g->type == IBV_GID_TYPE_ROCE_V2 ? 10 : g->type == IBV_GID_TYPE_ROCE_V1 ? 0 : -10;

	return base + by_family[rdma_gid_family(&g->gid)];
}

static const char *rdma_gid_type_text(uint32_t type)
{
	switch (type) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	default:
		return "unknown type";
	}
}

static uint32_t rdma_prefix_bits(const union ibv_gid *a, const union ibv_gid *b)
{
	uint32_t n = 0;

	for (unsigned i = 0; i < 16; i++) {
		uint8_t x = a->raw[i] ^ b->raw[i];

		if (!x) {
			n += 8;
			continue;
		}
		while (!(x & 0x80)) {
			x <<= 1;
			n++;
		}
		break;
	}
	return n;
}

void rdma_dev_pick_gid(struct rdma_dev *d, const union ibv_gid *peer, struct rdma_gid *out)
{
	int32_t best = -1;

	pthread_mutex_lock(&d->gid_lock);
	*out = d->gid;
	if (!d->gid_fixed && peer && !rdma_gid_is_zero(peer) &&
	    d->link_layer == IBV_LINK_LAYER_ETHERNET) {
		/* Same RoCE version as the default, same address family as the peer, then the
		 * longest common prefix: the address the route to the peer most likely uses. */
		for (uint32_t i = 0; i < d->n_gids; i++) {
			const struct rdma_gid *g = &d->gids[i];
			int32_t score;

			if (g->type != d->gid.type ||
			    rdma_gid_family(&g->gid) != rdma_gid_family(peer))
				continue;
			score = (int32_t)rdma_prefix_bits(&g->gid, peer);
			if (score > best) {
				best = score;
				*out = *g;
			}
		}
	}
	pthread_mutex_unlock(&d->gid_lock);
}

void rdma_dev_snapshot(struct rdma_dev *d, uint16_t *lid_out, enum ibv_mtu *mtu_out)
{
	pthread_mutex_lock(&d->gid_lock);
	*lid_out = d->lid;
	*mtu_out = d->active_mtu;
	pthread_mutex_unlock(&d->gid_lock);
}

/* Read the port and its GID table; choose the default GID. @explicit_index < 0: automatic. */
static enum te_status rdma_dev_refresh(struct rdma_inst *ri, struct rdma_dev *d,
				       int64_t explicit_index, bool log_choice)
{
	struct ibv_port_attr pa;
	struct ibv_gid_entry *tab;
	struct rdma_gid *gids, chosen = { 0 };
	uint32_t n = 0;
	int score = INT32_MIN;
	ssize_t got;
	char text[64];
	int rc;

	memset(&pa, 0, sizeof(pa));
	rc = ri->v->query_port(d->ctx, d->port, &pa);
	if (rc) {
		rdma_set_error(ri, "%s: ibv_query_port(%u): %s", d->name, d->port, strerror(rc));
		return TE_ERR_SYSTEM;
	}
	tab = calloc(RDMA_MAX_GIDS * 2, sizeof(*tab));
	gids = calloc(RDMA_MAX_GIDS, sizeof(*gids));
	if (!tab || !gids) {
		free(tab);
		free(gids);
		return TE_ERR_NOMEM;
	}
	got = ri->v->query_gid_table(d->ctx, tab, RDMA_MAX_GIDS * 2);
	for (ssize_t i = 0; i < got && n < RDMA_MAX_GIDS; i++) {
		if (tab[i].port_num != d->port || rdma_gid_is_zero(&tab[i].gid))
			continue;
		gids[n].gid = tab[i].gid;
		gids[n].index = tab[i].gid_index;
		gids[n].type = tab[i].gid_type;
		n++;
	}
	free(tab);
	if (got < 0)
		rdma_log(ri, TE_PLUGIN_LOG_WARN, "%s: ibv_query_gid_table: %s", d->name,
			 strerror((int)-got));

	for (uint32_t i = 0; i < n; i++) {
		int s;

		if (explicit_index >= 0) {
			if (gids[i].index == (uint64_t)explicit_index) {
				chosen = gids[i];
				score = 0;
			}
			continue;
		}
		s = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? rdma_gid_score(&gids[i])
							     : -(int)gids[i].index;
		if (s > score) {
			score = s;
			chosen = gids[i];
		}
	}
	if (score == INT32_MIN && pa.link_layer == IBV_LINK_LAYER_INFINIBAND &&
	    explicit_index < 0) {
		/* IB without a readable table: the LID routes; GID 0 is the port GID. */
		chosen.index = 0;
		chosen.type = IBV_GID_TYPE_IB;
		score = 0;
	}
	if (score == INT32_MIN) {
		free(gids);
		if (explicit_index >= 0)
			rdma_set_error(
				ri,
				"%s port %u: option 'gid_index': no valid GID at index %" PRId64
				" (%u valid entries)",
				d->name, d->port, explicit_index, n);
		else
			rdma_set_error(
				ri,
				"%s port %u: no usable GID (is an IP address configured on its "
				"netdev?)",
				d->name, d->port);
		return explicit_index >= 0 ? TE_ERR_CONFIG : TE_ERR_NO_DEVICE;
	}

	pthread_mutex_lock(&d->gid_lock);
	free(d->gids);
	d->gids = gids;
	d->n_gids = n;
	d->gid = chosen;
	d->lid = pa.lid;
	d->active_mtu = pa.active_mtu;
	d->link_layer = pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? IBV_LINK_LAYER_INFINIBAND
								   : IBV_LINK_LAYER_ETHERNET;
	d->max_msg = pa.max_msg_sz;
	pthread_mutex_unlock(&d->gid_lock);
	if (log_choice) {
		rdma_gid_text(&chosen.gid, text, sizeof(text));
		rdma_log(ri, TE_PLUGIN_LOG_INFO,
			 "%s port %u: gid[%u] %s (%s%s; %s), %s, active MTU %u, lid %u", d->name,
			 d->port, chosen.index, text, rdma_gid_type_text(chosen.type),
			 chosen.type != IBV_GID_TYPE_IB && rdma_gid_is_v4(&chosen.gid)
				 ? ", IPv4-mapped"
				 : "",
			 explicit_index >= 0 ? "from option gid_index" : "chosen automatically",
			 ibv_port_state_str(pa.state), rdma_mtu_bytes(pa.active_mtu), pa.lid);
	}
	return TE_OK;
}

/* NUMA node and PCI address from sysfs (-1 and "" when the device has none, e.g. rxe). */
static void rdma_dev_sysfs(struct rdma_dev *d)
{
	char path[PATH_MAX], real[PATH_MAX];
	const char *base;
	FILE *f;
	int node = -1;
	unsigned dom, bus, slot, fn;

	d->numa = -1;
	d->pci[0] = '\0';
	snprintf(path, sizeof(path), RDMA_SYSFS "/%s/device/numa_node", d->name);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%d", &node) == 1 && node >= 0)
			d->numa = node;
		fclose(f);
	}
	snprintf(path, sizeof(path), RDMA_SYSFS "/%s/device", d->name);
	if (!realpath(path, real))
		return;
	base = strrchr(real, '/');
	base = base ? base + 1 : real;
	if (sscanf(base, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) == 4)
		snprintf(d->pci, sizeof(d->pci), "%s", base);
}

/* Link speed in Mbit/s from the port's speed and width codes (0 when unknown). */
static uint64_t rdma_port_speed(const struct ibv_port_attr *pa)
{
	uint64_t lane, lanes;

	switch (pa->active_speed) {
	case 1:
		lane = 2500;
		break;
	case 2:
		lane = 5000;
		break;
	case 4:
	case 8:
		lane = 10000;
		break;
	case 16:
		lane = 14062;
		break;
	case 32:
		lane = 25781;
		break;
	case 64:
		lane = 53125;
		break;
	case 128:
		lane = 106250;
		break;
	default:
		return 0;
	}
	switch (pa->active_width) {
	case 1:
		lanes = 1;
		break;
	case 2:
		lanes = 4;
		break;
	case 4:
		lanes = 8;
		break;
	case 8:
		lanes = 12;
		break;
	case 16:
		lanes = 2;
		break;
	default:
		return 0;
	}
	return lane * lanes;
}

/* gid_index: "3" for every device, or "name:3,name:0". -1: automatic. */
static enum te_status rdma_gid_option(struct rdma_inst *ri, const char *dev, int64_t *out)
{
	const char *s = ri->host->config_get(ri->ctx, "gid_index");
	const char *p;
	char *end;
	size_t dl = strlen(dev);

	*out = -1;
	if (!s || !*s)
		return TE_OK;
	if (isdigit((unsigned char)*s) && !strchr(s, ':')) {
		errno = 0;
		*out = (int64_t)strtoll(s, &end, 10);
		if (errno || *end || *out > 65535)
			goto err_invalid;
		return TE_OK;
	}
	for (p = s; *p;) {
		const char *colon = strchr(p, ':');
		long long v;

		if (!colon)
			goto err_invalid;
		errno = 0;
		v = strtoll(colon + 1, &end, 10);
		if (errno || end == colon + 1 || v < 0 || v > 65535 || (*end && *end != ','))
			goto err_invalid;
		if ((size_t)(colon - p) == dl && !strncmp(p, dev, dl))
			*out = v;
		p = *end ? end + 1 : end;
	}
	return TE_OK;

err_invalid:
	rdma_set_error(ri, "option 'gid_index': expected N or dev:N[,dev:N...], got '%s'", s);
	return TE_ERR_CONFIG;
}

static enum te_status rdma_dev_open(struct rdma_inst *ri, struct ibv_device *ibdev,
				    uint32_t want_port, bool named, bool *skipped)
{
	struct rdma_dev *d = &ri->devs[ri->n_devs];
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	const char *name = ri->v->get_device_name(ibdev);
	int64_t gid_index;
	enum te_status st;
	int rc, flags;

	*skipped = false;
	memset(d, 0, sizeof(*d));
	d->ri = ri;
	d->index = ri->n_devs;
	snprintf(d->name, sizeof(d->name), "%s", name ? name : "?");
	pthread_mutex_init(&d->gid_lock, NULL);
	pthread_mutex_init(&d->poll_lock, NULL);
	pthread_mutex_init(&d->post_lock, NULL);
	d->ctx = ri->v->open_device(ibdev);
	if (!d->ctx) {
		rdma_set_error(ri, "%s: ibv_open_device: %s", d->name, strerror(errno));
		st = TE_ERR_NO_DEVICE;
		goto err_mutex;
	}
	memset(&da, 0, sizeof(da));
	rc = ri->v->query_device(d->ctx, &da);
	if (rc) {
		rdma_set_error(ri, "%s: ibv_query_device: %s", d->name, strerror(rc));
		st = TE_ERR_NO_DEVICE;
		goto err_close;
	}
	/* The port: the one asked for, else the first active one. */
	for (uint32_t p = want_port ? want_port : 1;
	     p <= (want_port ? want_port : da.phys_port_cnt) && p <= RDMA_MAX_PORT; p++) {
		memset(&pa, 0, sizeof(pa));
		if (ri->v->query_port(d->ctx, (uint8_t)p, &pa))
			continue;
		if (pa.state == IBV_PORT_ACTIVE || (named && want_port)) {
			d->port = (uint8_t)p;
			break;
		}
	}
	if (!d->port && named && da.phys_port_cnt >= 1) {
		d->port = 1; /* named: keep it even when down; it may come up */
		memset(&pa, 0, sizeof(pa));
		ri->v->query_port(d->ctx, 1, &pa);
	}
	if (!d->port) {
		rdma_log(ri, TE_PLUGIN_LOG_INFO, "%s: no active port, not used", d->name);
		*skipped = true;
		st = TE_OK;
		goto err_close;
	}
	st = rdma_gid_option(ri, d->name, &gid_index);
	if (st != TE_OK)
		goto err_close;
	d->gid_fixed = gid_index >= 0;
	st = rdma_dev_refresh(ri, d, gid_index, true);
	if (st != TE_OK) {
		if (st == TE_ERR_NO_DEVICE && !named) {
			*skipped = true;
			st = TE_OK;
		}
		goto err_gids;
	}
	d->max_mr_size = da.max_mr_size ? da.max_mr_size : UINT64_MAX;
	d->max_qp_wr = da.max_qp_wr > 0 ? (uint32_t)da.max_qp_wr : 1;
	d->max_rd_atom = da.max_qp_rd_atom > 0 ? (uint32_t)da.max_qp_rd_atom : 1;
	d->max_init_rd_atom = da.max_qp_init_rd_atom > 0 ? (uint32_t)da.max_qp_init_rd_atom : 1;
	d->speed_mbps = rdma_port_speed(&pa);
	rdma_dev_sysfs(d);

	d->pd = ri->v->alloc_pd(d->ctx);
	if (!d->pd) {
		rdma_set_error(ri, "%s: ibv_alloc_pd: %s", d->name, strerror(errno));
		st = TE_ERR_NO_DEVICE;
		goto err_gids;
	}
	if (!ri->manual) {
		d->chan = ri->v->create_comp_channel(d->ctx);
		if (!d->chan) {
			rdma_set_error(ri, "%s: ibv_create_comp_channel: %s", d->name,
				       strerror(errno));
			st = TE_ERR_NO_DEVICE;
			goto err_pd;
		}
		flags = fcntl(d->chan->fd, F_GETFL);
		if (flags < 0 || fcntl(d->chan->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
			rdma_set_error(ri, "%s: completion channel: %s", d->name, strerror(errno));
			st = TE_ERR_SYSTEM;
			goto err_chan;
		}
	}
	d->cqe = ri->cq_depth;
	if (da.max_cqe > 0 && d->cqe > (uint32_t)da.max_cqe)
		d->cqe = (uint32_t)da.max_cqe;
	d->cq = ri->v->create_cq(d->ctx, (int)d->cqe, d, d->chan, 0);
	if (!d->cq) {
		rdma_set_error(ri, "%s: ibv_create_cq(%u): %s", d->name, d->cqe, strerror(errno));
		st = TE_ERR_NO_DEVICE;
		goto err_chan;
	}
	atomic_init(&d->cq_credits, (int)d->cqe);
	flags = fcntl(d->ctx->async_fd, F_GETFL);
	if (flags < 0 || fcntl(d->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		rdma_set_error(ri, "%s: async event fd: %s", d->name, strerror(errno));
		st = TE_ERR_SYSTEM;
		goto err_cq;
	}
	atomic_init(&d->up, pa.state == IBV_PORT_ACTIVE);
	atomic_init(&d->fatal, false);
	if (pa.state != IBV_PORT_ACTIVE)
		rdma_log(ri, TE_PLUGIN_LOG_WARN, "%s port %u is %s; used once it is active",
			 d->name, d->port, ibv_port_state_str(pa.state));
	rdma_log(ri, TE_PLUGIN_LOG_DEBUG,
		 "%s: numa %d pci '%s' %" PRIu64 " Mbit/s, max_mr %" PRIu64 ", max_qp_wr %u, "
		 "rd_atom %u/%u, max_msg %u, cqe %u",
		 d->name, d->numa, d->pci, d->speed_mbps, d->max_mr_size, d->max_qp_wr,
		 d->max_rd_atom, d->max_init_rd_atom, d->max_msg, d->cqe);
	ri->n_devs++;
	return TE_OK;

err_cq:
	ri->v->destroy_cq(d->cq);
err_chan:
	if (d->chan)
		ri->v->destroy_comp_channel(d->chan);
err_pd:
	ri->v->dealloc_pd(d->pd);
err_gids:
	free(d->gids);
	d->gids = NULL;
err_close:
	ri->v->close_device(d->ctx);
err_mutex:
	pthread_mutex_destroy(&d->gid_lock);
	pthread_mutex_destroy(&d->poll_lock);
	pthread_mutex_destroy(&d->post_lock);
	return st;
}

/* Open what the `devices` option names ("mlx5_0,mlx5_1:2"), or every device with an active port. */
static enum te_status rdma_open_devices(struct rdma_inst *ri)
{
	const char *want = ri->host->config_get(ri->ctx, "devices");
	struct ibv_device **list;
	char found[512] = "";
	enum te_status st = TE_OK;
	int n = 0;
	bool skipped;

	errno = 0;
	list = ri->v->get_device_list(&n);
	if (!list || n <= 0) {
		if (list)
			ri->v->free_device_list(list);
		int err = errno;

		rdma_set_error(ri, "no RDMA device found%s%s",
			       err == ENOSYS	      ? " (no RDMA support in this kernel)"
			       : err && err != ENOENT ? ": "
						      : "",
			       err && err != ENOENT && err != ENOSYS ? strerror(err) : "");
		return TE_ERR_NO_DEVICE;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ri->v->get_device_name(list[i]);

		snprintf(found + strlen(found), sizeof(found) - strlen(found), "%s%s",
			 i ? ", " : "", name ? name : "?");
	}
	if (want && *want) {
		char *copy = strdup(want), *save = NULL;

		if (!copy) {
			st = TE_ERR_NOMEM;
			goto out;
		}
		for (char *tok = strtok_r(copy, ", ", &save); tok;
		     tok = strtok_r(NULL, ", ", &save)) {
			char *colon = strchr(tok, ':');
			unsigned long port = 0;
			int k;

			if (colon) {
				char *end;

				*colon = '\0';
				port = strtoul(colon + 1, &end, 10);
				if (*end || port == 0 || port > RDMA_MAX_PORT) {
					rdma_set_error(ri, "option 'devices': bad port in '%s:%s'",
						       tok, colon + 1);
					st = TE_ERR_CONFIG;
					break;
				}
			}
			for (k = 0; k < n; k++) {
				const char *name = ri->v->get_device_name(list[k]);

				if (name && !strcmp(name, tok))
					break;
			}
			if (k == n) {
				rdma_set_error(ri,
					       "option 'devices': no RDMA device '%s' (found: %s)",
					       tok, found);
				st = TE_ERR_CONFIG;
				break;
			}
			for (uint32_t j = 0; j < ri->n_devs; j++) {
				if (!strcmp(ri->devs[j].name, tok)) {
					rdma_set_error(ri, "option 'devices': '%s' listed twice",
						       tok);
					st = TE_ERR_CONFIG;
					break;
				}
			}
			if (st != TE_OK)
				break;
			if (ri->n_devs == RDMA_MAX_DEVS) {
				rdma_set_error(ri, "option 'devices': more than %u devices",
					       RDMA_MAX_DEVS);
				st = TE_ERR_CONFIG;
				break;
			}
			st = rdma_dev_open(ri, list[k], (uint32_t)port, true, &skipped);
			if (st != TE_OK)
				break;
		}
		free(copy);
		goto out;
	}
	for (int i = 0; i < n && ri->n_devs < RDMA_MAX_DEVS; i++) {
		/* Never filter by vendor or name: soft-RoCE devices are rxe_*, EFA rdmap*. */
		st = rdma_dev_open(ri, list[i], 0, false, &skipped);
		if (st != TE_OK)
			rdma_log(ri, TE_PLUGIN_LOG_WARN, "%s: not used",
				 ri->v->get_device_name(list[i]));
		st = TE_OK;
	}
	if (n > (int)RDMA_MAX_DEVS)
		rdma_log(ri, TE_PLUGIN_LOG_WARN, "%d RDMA devices; only the first %u are used", n,
			 RDMA_MAX_DEVS);
	if (!ri->n_devs) {
		rdma_set_error(ri, "no RDMA device with an active port (found: %s)", found);
		st = TE_ERR_NO_DEVICE;
	}
out:
	ri->v->free_device_list(list);
	return st;
}

/* --- topology ----------------------------------------------------------------------------- */

static int rdma_dev_index(const struct rdma_inst *ri, const char *name, size_t len)
{
	for (uint32_t i = 0; i < ri->n_devs; i++)
		if (strlen(ri->devs[i].name) == len && !strncmp(ri->devs[i].name, name, len))
			return (int)i;
	return -1;
}

/* "cpu:0=mlx5_0,mlx5_1;cpu:1=mlx5_2;cuda:0=mlx5_0;*=mlx5_3" */
static enum te_status rdma_parse_topology(struct rdma_inst *ri)
{
	const char *s = ri->host->config_get(ri->ctx, "topology");
	const char *p = s;

	if (!s || !*s)
		return TE_OK;
	while (*p) {
		struct rdma_topo *t;
		const char *eq = strchr(p, '='), *end = strchr(p, ';'), *q;
		char loc[32];
		size_t ll;

		if (!end)
			end = p + strlen(p);
		if (!eq || eq > end || ri->n_topo == RDMA_MAX_TOPO)
			goto err_invalid;
		t = &ri->topo[ri->n_topo];
		memset(t, 0, sizeof(*t));
		ll = (size_t)(eq - p);
		if (ll >= sizeof(loc))
			goto err_invalid;
		memcpy(loc, p, ll);
		loc[ll] = '\0';
		if (!strcmp(loc, "*")) {
			t->mem_type = 0;
			t->dev = -1;
		} else {
			char *colon = strchr(loc, ':'), *nend;

			if (colon)
				*colon = '\0';
			if (!strcmp(loc, "cpu"))
				t->mem_type = TE_PLUGIN_MEM_CPU;
			else if (!strcmp(loc, "cuda"))
				t->mem_type = TE_PLUGIN_MEM_CUDA;
			else if (!strcmp(loc, "hip"))
				t->mem_type = TE_PLUGIN_MEM_HIP;
			else
				goto err_invalid;
			t->dev = -1;
			if (colon) {
				long v = strtol(colon + 1, &nend, 10);

				if (*nend || nend == colon + 1 || v < 0 || v > 4095)
					goto err_invalid;
				t->dev = (int32_t)v;
			}
		}
		for (q = eq + 1; q < end;) {
			const char *comma = memchr(q, ',', (size_t)(end - q));
			size_t len = (size_t)((comma ? comma : end) - q);
			int d = rdma_dev_index(ri, q, len);

			if (d < 0) {
				rdma_set_error(ri,
					       "option 'topology': '%.*s' is not an open device",
					       (int)len, q);
				return TE_ERR_CONFIG;
			}
			if (!(t->mask & rdma_dev_bit((uint32_t)d))) {
				t->mask |= rdma_dev_bit((uint32_t)d);
				t->devs[t->n++] = (uint8_t)d;
			}
			q = comma ? comma + 1 : end;
		}
		if (!t->n)
			goto err_invalid;
		ri->n_topo++;
		p = *end ? end + 1 : end;
	}
	return TE_OK;

err_invalid:
	rdma_set_error(ri,
		       "option 'topology': expected LOCATION=dev[,dev][;...] with LOCATION one of "
		       "*, cpu[:N], cuda:N, hip:N, got '%s'",
		       s);
	return TE_ERR_CONFIG;
}

/* NUMA node of the page at @addr, or -1. */
static int rdma_addr_node(void *addr)
{
	int node = -1;

	if (syscall(SYS_get_mempolicy, &node, NULL, 0, addr, MPOL_F_NODE | MPOL_F_ADDR) != 0)
		return -1;
	return node;
}

/* Preferred devices of a region at (@mem_type, @dev): topology, else NUMA, else all. */
static void rdma_mem_prefs(struct rdma_inst *ri, struct rdma_mem *m, void *addr, uint32_t mem_type,
			   int32_t dev)
{
	const struct rdma_topo *hit = NULL;
	bool any_numa = false;
	int node = -1;

	m->n_pref = 0;
	m->pref_mask = 0;
	for (uint32_t i = 0; i < ri->n_topo && !hit; i++)
		if (ri->topo[i].mem_type == mem_type && ri->topo[i].dev == dev && dev >= 0)
			hit = &ri->topo[i];
	for (uint32_t i = 0; i < ri->n_topo && !hit; i++)
		if (ri->topo[i].mem_type == mem_type && ri->topo[i].dev < 0)
			hit = &ri->topo[i];
	for (uint32_t i = 0; i < ri->n_topo && !hit; i++)
		if (ri->topo[i].mem_type == 0)
			hit = &ri->topo[i];
	if (hit) {
		memcpy(m->pref, hit->devs, hit->n);
		m->n_pref = hit->n;
		m->pref_mask = hit->mask;
		return;
	}
	for (uint32_t i = 0; i < ri->n_devs; i++)
		any_numa |= ri->devs[i].numa >= 0;
	if (mem_type == TE_PLUGIN_MEM_CPU && any_numa)
		node = dev >= 0 ? dev : rdma_addr_node(addr);
	for (uint32_t i = 0; node >= 0 && i < ri->n_devs; i++) {
		if (ri->devs[i].numa == node) {
			m->pref[m->n_pref++] = (uint8_t)i;
			m->pref_mask |= rdma_dev_bit(i);
		}
	}
	if (m->n_pref)
		return;
	for (uint32_t i = 0; i < ri->n_devs; i++) {
		m->pref[m->n_pref++] = (uint8_t)i;
		m->pref_mask |= rdma_dev_bit(i);
	}
}

/* --- published blob ------------------------------------------------------------------------ */

static void rdma_build_blob(struct rdma_inst *ri, uint8_t *b, size_t *len_out)
{
	size_t len = RDMA_BLOB_HDR + (size_t)ri->n_devs * RDMA_BLOB_DEV;

	memset(b, 0, len);
	te_plugin_put_u32(b, RDMA_BLOB_MAGIC);
	b[4] = RDMA_WIRE_VERSION;
	b[5] = (uint8_t)ri->n_devs;
	te_plugin_put_u64(b + 8, ri->nonce);
	for (uint32_t i = 0; i < ri->n_devs; i++) {
		struct rdma_dev *d = &ri->devs[i];
		uint8_t *e = b + RDMA_BLOB_HDR + (size_t)i * RDMA_BLOB_DEV;

		pthread_mutex_lock(&d->gid_lock);
		memcpy(e, d->name, strnlen(d->name, RDMA_NAME_LEN));
		memcpy(e + 32, d->gid.gid.raw, 16);
		te_plugin_put_u16(e + 48, d->lid);
		e[50] = d->port;
		e[51] = d->link_layer;
		e[52] = (uint8_t)d->active_mtu;
		e[53] = d->gid.type == IBV_GID_TYPE_ROCE_V2   ? RDMA_GID_ROCE_V2
			: d->gid.type == IBV_GID_TYPE_ROCE_V1 ? RDMA_GID_ROCE_V1
							      : RDMA_GID_IB;
		e[54] = (uint8_t)d->gid.index;
		pthread_mutex_unlock(&d->gid_lock);
		e[55] = atomic_load_explicit(&d->up, memory_order_relaxed);
		te_plugin_put_u32(e + 56, (uint32_t)d->numa);
	}
	*len_out = len;
}

static enum te_status rdma_publish(struct rdma_inst *ri)
{
	uint8_t blob[RDMA_BLOB_HDR + RDMA_MAX_DEVS * RDMA_BLOB_DEV];
	size_t len;

	rdma_build_blob(ri, blob, &len);
	return ri->host->publish(ri->ctx, blob, len);
}

/* --- async events (control thread) --------------------------------------------------------- */

static void rdma_dev_port_event(struct rdma_inst *ri, struct rdma_dev *d, bool up, const char *why)
{
	bool was = atomic_exchange(&d->up, up && !atomic_load(&d->fatal));

	/* Addresses (and with them GIDs) may have changed while the port was down. */
	if (up && !atomic_load(&d->fatal))
		(void)rdma_dev_refresh(ri, d, d->gid_fixed ? (int64_t)d->gid.index : -1, true);
	/* Descriptors built from now on tell peers which devices are up. */
	(void)rdma_publish(ri);
	/* Down: the control thread moves the device's QPs to error now (fail over at once). */
	rdma_kick(ri->conn_kick_fd);
	if (was != up && ri->host->device_event)
		ri->host->device_event(ri->ctx, d->index,
				       up ? TE_PLUGIN_EVENT_UP : TE_PLUGIN_EVENT_DOWN, why);
}

/* Read and acknowledge every pending async event of @d. Never blocks, never destroys. */
static void rdma_dev_events(struct rdma_inst *ri, struct rdma_dev *d)
{
	struct ibv_async_event ev;
	char why[RDMA_DETAIL];

	while (ri->v->get_async_event(d->ctx, &ev) == 0) {
		enum ibv_event_type type = ev.event_type;
		struct ibv_qp *qp = ev.element.qp;
		bool qp_event = type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
				type == IBV_EVENT_QP_ACCESS_ERR || type == IBV_EVENT_PATH_MIG_ERR;

		if (qp_event && qp && qp->qp_context) {
			/* Our QP (alive until this event is acked): no more work on it. */
			struct rdma_qp *q = qp->qp_context;
			int ready = RDMA_QP_READY;

			if (atomic_compare_exchange_strong(&q->state, &ready, RDMA_QP_ERROR)) {
				atomic_store(&q->err_event, (int)type + 1);
				rdma_conn_queue_path(ri, q->path);
			}
		} else if (qp_event && qp) {
			/* A passive QP a peer's request broke: the control thread drops it. */
			rdma_conn_passive_broken(ri, qp);
		}
		ri->v->ack_async_event(&ev);
		snprintf(why, sizeof(why), "%s port %u: %s", d->name, d->port,
			 ibv_event_type_str(type));
		switch (type) {
		case IBV_EVENT_PORT_ERR:
			rdma_log(ri, TE_PLUGIN_LOG_WARN, "%s", why);
			rdma_dev_port_event(ri, d, false, why);
			break;
		case IBV_EVENT_PORT_ACTIVE:
			rdma_log(ri, TE_PLUGIN_LOG_INFO, "%s", why);
			rdma_dev_port_event(ri, d, true, why);
			break;
		case IBV_EVENT_DEVICE_FATAL:
			rdma_log(ri, TE_PLUGIN_LOG_ERROR, "%s", why);
			atomic_store(&d->fatal, true);
			rdma_dev_port_event(ri, d, false, why);
			break;
		case IBV_EVENT_GID_CHANGE:
		case IBV_EVENT_LID_CHANGE:
			rdma_log(ri, TE_PLUGIN_LOG_INFO, "%s", why);
			if (rdma_dev_refresh(ri, d, d->gid_fixed ? (int64_t)d->gid.index : -1,
					     true) == TE_OK)
				(void)rdma_publish(ri);
			break;
		case IBV_EVENT_CQ_ERR:
			rdma_log(ri, TE_PLUGIN_LOG_ERROR, "%s: completion queue overrun", why);
			break;
		default:
			rdma_log(ri, qp_event ? TE_PLUGIN_LOG_INFO : TE_PLUGIN_LOG_DEBUG, "%s%s%s",
				 why, qp_event ? " on QP " : "",
				 qp_event ? "(its work fails over)" : "");
			break;
		}
	}
}

static void *rdma_event_thread(void *arg)
{
	struct rdma_inst *ri = arg;
	struct pollfd fds[RDMA_MAX_DEVS + 1];

	while (!atomic_load(&ri->ev_stopping)) {
		uint64_t junk;

		fds[0].fd = ri->ev_kick_fd;
		fds[0].events = POLLIN;
		for (uint32_t i = 0; i < ri->n_devs; i++) {
			fds[i + 1].fd = ri->devs[i].ctx->async_fd;
			fds[i + 1].events = POLLIN;
		}
		if (poll(fds, ri->n_devs + 1, 1000) < 0 && errno != EINTR)
			break;
		if (read(ri->ev_kick_fd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
			(void)0;
		for (uint32_t i = 0; i < ri->n_devs; i++)
			rdma_dev_events(ri, &ri->devs[i]);
	}
	return NULL;
}

/* --- install ------------------------------------------------------------------------------ */

static void rdma_destroy(struct rdma_inst *ri)
{
	atomic_store(&ri->stopping, true);
	rdma_kick(ri->poll_kick_fd);
	rdma_kick(ri->conn_kick_fd);
	if (ri->poller_started)
		pthread_join(ri->poller, NULL);
	if (ri->conn_started)
		pthread_join(ri->conn, NULL);
	ri->poller_started = ri->conn_started = false;

	/*
	 * Single-threaded from here but for the event thread, which keeps acknowledging async
	 * events until every QP is gone (ibv_destroy_qp waits for them). Every slice still held
	 * is reported exactly once.
	 */
	rdma_io_drain(ri, 3000000000ull);
	rdma_conn_destroy_all(ri);
	atomic_store(&ri->ev_stopping, true);
	rdma_kick(ri->ev_kick_fd);
	if (ri->events_started)
		pthread_join(ri->events, NULL);
	ri->events_started = false;
	while (ri->mems) {
		struct rdma_mem *m = ri->mems;

		ri->mems = m->next;
		for (uint32_t i = 0; i < ri->n_devs * m->n_chunks; i++)
			if (m->mrs[i])
				ri->v->dereg_mr(m->mrs[i]);
		free(m->mrs);
		free(m->lkeys);
		free(m);
	}
	while (ri->rkeys) {
		struct rdma_rkey *k = ri->rkeys;

		ri->rkeys = k->next;
		free(k);
	}
	for (uint32_t i = 0; i < ri->n_devs; i++) {
		struct rdma_dev *d = &ri->devs[i];
		struct ibv_async_event ev;
		struct ibv_cq *cq;
		void *cq_ctx;

		/* Destroying waits for every reported event: consume what is still queued. */
		while (ri->v->get_async_event(d->ctx, &ev) == 0)
			ri->v->ack_async_event(&ev);
		while (d->chan && ri->v->get_cq_event(d->chan, &cq, &cq_ctx) == 0)
			d->unacked_events++;
		if (d->unacked_events)
			ri->v->ack_cq_events(d->cq, d->unacked_events);
		ri->v->destroy_cq(d->cq);
		if (d->chan)
			ri->v->destroy_comp_channel(d->chan);
		ri->v->dealloc_pd(d->pd);
		ri->v->close_device(d->ctx);
		free(d->gids);
		pthread_mutex_destroy(&d->gid_lock);
		pthread_mutex_destroy(&d->poll_lock);
		pthread_mutex_destroy(&d->post_lock);
	}
	if (ri->poll_kick_fd >= 0)
		close(ri->poll_kick_fd);
	if (ri->conn_kick_fd >= 0)
		close(ri->conn_kick_fd);
	if (ri->ev_kick_fd >= 0)
		close(ri->ev_kick_fd);
	pthread_mutex_destroy(&ri->lock);
	pthread_mutex_destroy(&ri->defer_lock);
	pthread_mutex_destroy(&ri->broken_lock);
	te_plugin_naming_destroy(&ri->naming);
	free(ri);
}

static enum te_status rdma_start_threads(struct rdma_inst *ri)
{
	int rc;

	ri->conn_kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ri->poll_kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ri->ev_kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ri->conn_kick_fd < 0 || ri->poll_kick_fd < 0 || ri->ev_kick_fd < 0) {
		rdma_set_error(ri, "eventfd: %s", strerror(errno));
		return TE_ERR_SYSTEM;
	}
	rc = pthread_create(&ri->events, NULL, rdma_event_thread, ri);
	if (rc) {
		rdma_set_error(ri, "cannot start the event thread: %s", strerror(rc));
		return TE_ERR_SYSTEM;
	}
	ri->events_started = true;
	pthread_setname_np(ri->events, "te-rdma-ev");
	rc = pthread_create(&ri->conn, NULL, rdma_conn_thread, ri);
	if (rc) {
		rdma_set_error(ri, "cannot start the control thread: %s", strerror(rc));
		return TE_ERR_SYSTEM;
	}
	ri->conn_started = true;
	pthread_setname_np(ri->conn, "te-rdma-ctl");
	if (ri->manual)
		return TE_OK;
	rc = pthread_create(&ri->poller, NULL, rdma_io_poller, ri);
	if (rc) {
		rdma_set_error(ri, "cannot start the completion thread: %s", strerror(rc));
		return TE_ERR_SYSTEM;
	}
	ri->poller_started = true;
	pthread_setname_np(ri->poller, "te-rdma-cq");
	return TE_OK;
}

/* Whether GPU regions can be registered through a dmabuf: the verbs and the host offer it. */
static bool rdma_dmabuf_possible(const struct rdma_inst *ri)
{
	return ri->v->reg_dmabuf_mr && TE_PLUGIN_HAS(ri->host, struct te_plugin_host, mem_dmabuf) &&
	       ri->host->mem_dmabuf;
}

/* The GPU kinds reg_mem takes (caps.mem_types), from option gpu_direct and what is offered. */
static enum te_status rdma_gpu_setup(struct rdma_inst *ri)
{
	const char *how;

	switch (ri->gpu_direct) {
	case RDMA_GPU_AUTO:
	case RDMA_GPU_DMABUF:
		if (rdma_dmabuf_possible(ri)) {
			ri->gpu_types = TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP;
			how = ri->gpu_direct == RDMA_GPU_AUTO
				      ? "GPUDirect through a dmabuf where the GPU's owner exports "
					"one, else staged by the core"
				      : "GPUDirect through a dmabuf only (gpu_direct: dmabuf)";
			break;
		}
		how = ri->v->reg_dmabuf_mr
			      ? "the engine offers no dmabuf export (ABI < 1.2)"
			      : "libibverbs has no ibv_reg_dmabuf_mr (rdma-core < v34)";
		if (ri->gpu_direct == RDMA_GPU_DMABUF) {
			rdma_set_error(ri, "option 'gpu_direct: dmabuf': %s", how);
			return TE_ERR_CONFIG;
		}
		rdma_log(ri, TE_PLUGIN_LOG_INFO, "GPU memory: staged by the core: %s", how);
		return TE_OK;
	case RDMA_GPU_PEERMEM:
		ri->gpu_types = TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP;
		how = "GPUDirect through ibv_reg_mr of device pointers (peer-memory module)";
		break;
	case RDMA_GPU_OFF:
	default:
		how = "staged by the core (gpu_direct: off)";
		break;
	}
	rdma_log(ri, TE_PLUGIN_LOG_INFO, "GPU memory: %s", how);
	return TE_OK;
}

static enum te_status rdma_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				struct te_plugin_inst **inst_out)
{
	struct rdma_inst *ri;
	enum te_status st;
	uint64_t max_msg = RDMA_MAX_SLICE;

	if (!host || !inst_out || host->abi_major != TE_PLUGIN_ABI_MAJOR || !host->log ||
	    !host->slice_done || !host->config_get || !host->publish || !host->peer_handshake ||
	    !host->now_ns)
		return TE_ERR_INVALID_ARG;
	ri = calloc(1, sizeof(*ri));
	if (!ri)
		return TE_ERR_NOMEM;
	if (te_plugin_naming_init(&ri->naming)) {
		free(ri);
		return TE_ERR_NOMEM;
	}
	ri->host = host;
	ri->ctx = ctx;
	ri->v = RDMA_VERBS;
	ri->poll_kick_fd = ri->conn_kick_fd = ri->ev_kick_fd = -1;
	pthread_mutex_init(&ri->lock, NULL);
	pthread_mutex_init(&ri->defer_lock, NULL);
	pthread_mutex_init(&ri->broken_lock, NULL);
	if (getrandom(&ri->nonce, sizeof(ri->nonce), GRND_NONBLOCK) != sizeof(ri->nonce))
		ri->nonce = host->now_ns() ^ ((uint64_t)getpid() << 32);
	ri->nonce |= 1;
	ri->tag = ri->nonce * 0x9e3779b97f4a7c15ull;
	ri->next_conn_id = 1;

	st = rdma_parse_options(ri);
	if (st == TE_OK)
		st = rdma_gpu_setup(ri);
	if (st == TE_OK)
		st = rdma_open_devices(ri);
	if (st == TE_OK)
		st = rdma_parse_topology(ri);
	if (st != TE_OK)
		goto err_destroy;

	ri->max_mr = ri->max_mr_opt ? ri->max_mr_opt : UINT64_MAX;
	for (uint32_t i = 0; i < ri->n_devs; i++) {
		if (ri->devs[i].max_mr_size < ri->max_mr)
			ri->max_mr = ri->devs[i].max_mr_size;
		if (ri->devs[i].max_msg && ri->devs[i].max_msg < max_msg)
			max_msg = ri->devs[i].max_msg;
	}
	/* Slices never straddle two MR chunks: chunks overlap by the largest slice. */
	ri->overlap = max_msg;
	if (ri->overlap > ri->max_mr / 2)
		ri->overlap = (ri->max_mr / 2) & ~4095ull;
	if (ri->slice_size > ri->overlap) {
		rdma_log(ri, TE_PLUGIN_LOG_INFO,
			 "slice_size %" PRIu64 " lowered to %" PRIu64
			 " (largest message or half the largest MR)",
			 ri->slice_size, ri->overlap);
		ri->slice_size = ri->overlap;
	}
	st = rdma_publish(ri);
	if (st != TE_OK) {
		rdma_set_error(ri, "publishing the transport blob failed (status %d)", st);
		goto err_destroy;
	}
	st = rdma_start_threads(ri);
	if (st != TE_OK)
		goto err_destroy;
	rdma_log(ri, TE_PLUGIN_LOG_INFO,
		 "%u device(s); %u QP(s) per peer path, depth %u, slice %" PRIu64 ", %s progress",
		 ri->n_devs, ri->qp_per_peer, ri->qp_depth, ri->slice_size,
		 ri->manual ? "manual" : "auto");
	*inst_out = (struct te_plugin_inst *)ri;
	return TE_OK;

err_destroy:
	rdma_destroy(ri);
	return st;
}

static void rdma_fini(struct te_plugin_inst *inst)
{
	rdma_destroy(rdma_inst_of(inst));
}

static enum te_status rdma_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct rdma_inst *ri = rdma_inst_of(inst);

	if (!caps)
		return TE_ERR_INVALID_ARG;
	caps->mem_types = TE_PLUGIN_MEM_CPU | ri->gpu_types;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = ri->manual ? TE_PLUGIN_PROGRESS_MANUAL : TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	caps->flags = 0;
	caps->max_slice_size = ri->overlap;
	caps->default_slice_size = ri->slice_size;
	caps->slice_priv_size = sizeof(struct rdma_spriv);
	caps->max_devices = ri->n_devs;
	return TE_OK;
}

static enum te_status rdma_query_devices(struct te_plugin_inst *inst,
					 struct te_plugin_device *devices, uint32_t max,
					 uint32_t *n_out)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	uint32_t n;

	if (!n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	n = ri->n_devs < max ? ri->n_devs : max;
	for (uint32_t i = 0; i < n; i++) {
		const struct rdma_dev *d = &ri->devs[i];

		te_plugin_device_set(&devices[i], d->name, d->numa, d->pci, d->speed_mbps,
				     TE_PLUGIN_MEM_CPU | ri->gpu_types);
	}
	*n_out = n;
	return TE_OK;
}

/* --- memory -------------------------------------------------------------------------------- */

static enum te_status rdma_errno_status(int err)
{
	switch (err) {
	case ENOMEM:
		return TE_ERR_NOMEM;
	case EINVAL:
	case EFAULT:
		return TE_ERR_INVALID_ARG;
	case EAGAIN:
	case EBUSY:
		return TE_ERR_AGAIN;
	default:
		return TE_ERR_SYSTEM;
	}
}

static const char *rdma_kind_name(uint32_t mem_type)
{
	return mem_type == TE_PLUGIN_MEM_CUDA  ? "cuda"
	       : mem_type == TE_PLUGIN_MEM_HIP ? "hip"
					       : "cpu";
}

/*
 * errno values of ibv_reg_dmabuf_mr that say "not this dmabuf on this device" rather than a
 * failure: a provider without dmabuf support (EOPNOTSUPP = ENOTSUP, ENOSYS), or a driver that
 * cannot import or map the exporter's buffer (EINVAL, EPROTONOSUPPORT; no peer-to-peer path).
 */
static bool rdma_dmabuf_unsupported(int err)
{
	return err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT || err == EINVAL;
}

/*
 * A region that cannot be registered directly: TE_ERR_UNSUPPORTED lets the core stage it
 * (gpu_direct: auto); with gpu_direct: dmabuf the registration fails instead.
 */
static enum te_status rdma_gpu_unreachable(const struct rdma_inst *ri)
{
	return ri->gpu_direct == RDMA_GPU_DMABUF ? TE_ERR_MEMORY_TYPE : TE_ERR_UNSUPPORTED;
}

/* A dmabuf fd (*fd_out, closed by the caller) and offset for GPU region [@addr, +@length). */
static enum te_status rdma_gpu_dmabuf(struct rdma_inst *ri, void *addr, uint64_t length,
				      uint32_t mem_type, int32_t dev, int *fd_out,
				      uint64_t *offset_out)
{
	enum te_status st;
	int fd = -1;
	uint64_t off = 0;

	st = ri->host->mem_dmabuf(ri->ctx, addr, length, mem_type, dev, &fd, &off);
	if (st == TE_ERR_UNSUPPORTED) {
		rdma_set_error(ri,
			       "%s:%d [%p, +%" PRIu64 "): its owner exports no dmabuf for it, so "
			       "the NICs cannot reach it (no GPUDirect RDMA)%s",
			       rdma_kind_name(mem_type), dev, addr, length,
			       ri->gpu_direct == RDMA_GPU_DMABUF ? " and gpu_direct is 'dmabuf'"
								 : "; the core stages it");
		return rdma_gpu_unreachable(ri);
	}
	if (st != TE_OK || fd < 0) {
		rdma_set_error(ri,
			       "%s:%d [%p, +%" PRIu64 "): exporting a dmabuf failed (status %d)",
			       rdma_kind_name(mem_type), dev, addr, length, (int)st);
		if (st == TE_OK)
			return TE_ERR_INTERNAL;
		return st;
	}
	*fd_out = fd;
	*offset_out = off;
	return TE_OK;
}

static enum te_status rdma_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				   uint32_t mem_type, int32_t dev, uint32_t access,
				   struct te_plugin_mem **mem_out)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	uint64_t start = (uint64_t)(uintptr_t)addr;
	int ibv_access = IBV_ACCESS_LOCAL_WRITE;
	struct rdma_mem *m;
	enum te_status st = TE_ERR_NOMEM;
	uint64_t fd_off = 0;
	size_t n_mr;
	uint32_t i = 0;
	int fd = -1; /* dmabuf of a GPU region */

	if (!addr || !length || !mem_out ||
	    (access & ~(TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)))
		return TE_ERR_INVALID_ARG;
	if (start > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	if (mem_type != TE_PLUGIN_MEM_CPU && !(mem_type & ri->gpu_types))
		return TE_ERR_MEMORY_TYPE;
	if (access & TE_PLUGIN_ACCESS_REMOTE_READ)
		ibv_access |= IBV_ACCESS_REMOTE_READ;
	if (access & TE_PLUGIN_ACCESS_REMOTE_WRITE)
		ibv_access |= IBV_ACCESS_REMOTE_WRITE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = start;
	m->length = length;
	m->access = access;
	if (length <= ri->max_mr) {
		m->n_chunks = 1;
		m->step = length;
		m->chunk_len = length;
	} else {
		m->chunk_len = ri->max_mr & ~4095ull;
		m->step = m->chunk_len - ri->overlap;
		m->n_chunks = (uint32_t)((length - m->chunk_len + m->step - 1) / m->step + 1);
	}
	if (RDMA_KEY_HDR + (uint64_t)ri->n_devs * m->n_chunks * 4 > RDMA_BLOB_MAX) {
		rdma_set_error(ri,
			       "a region of %" PRIu64 " bytes needs %u memory regions per device "
			       "(max MR size %" PRIu64 "): too many for its key; raise max_mr_size",
			       length, m->n_chunks, ri->max_mr);
		free(m);
		return TE_ERR_TOO_LARGE;
	}
	n_mr = (size_t)ri->n_devs * m->n_chunks;
	m->mrs = calloc(n_mr, sizeof(*m->mrs));
	m->lkeys = calloc(n_mr, sizeof(*m->lkeys));
	if (!m->mrs || !m->lkeys)
		goto err_free;
	/* GPU memory: the NICs address it by its device pointer (iova) inside the dmabuf. */
	if (mem_type != TE_PLUGIN_MEM_CPU && ri->gpu_direct != RDMA_GPU_PEERMEM) {
		st = rdma_gpu_dmabuf(ri, addr, length, mem_type, dev, &fd, &fd_off);
		if (st != TE_OK)
			goto err_free;
	}
	rdma_mem_prefs(ri, m, addr, mem_type, dev);
	for (i = 0; i < n_mr; i++) {
		struct rdma_dev *d = &ri->devs[i / m->n_chunks];
		uint64_t off = (uint64_t)(i % m->n_chunks) * m->step;
		uint64_t len = length - off < m->chunk_len ? length - off : m->chunk_len;
		int err;

		if (atomic_load(&d->fatal))
			continue;
		if (fd >= 0)
			m->mrs[i] = ri->v->reg_dmabuf_mr(d->pd, fd_off + off, len, start + off, fd,
							 ibv_access);
		else
			m->mrs[i] = ri->v->reg_mr(d->pd, (char *)addr + off, len, ibv_access);
		if (m->mrs[i]) {
			m->lkeys[i] = m->mrs[i]->lkey;
			m->valid_mask |= rdma_dev_bit(i / m->n_chunks);
			continue;
		}
		err = errno;
		if (fd >= 0 && rdma_dmabuf_unsupported(err)) {
			rdma_set_error(ri,
				       "%s: ibv_reg_dmabuf_mr of %s:%d [%p, +%" PRIu64 "): %s: the "
				       "device does not take this dmabuf (no GPUDirect RDMA)%s",
				       d->name, rdma_kind_name(mem_type), dev,
				       (void *)((char *)addr + off), len, strerror(err),
				       ri->gpu_direct == RDMA_GPU_DMABUF
					       ? " and gpu_direct is 'dmabuf'"
					       : "; the core stages it");
			st = rdma_gpu_unreachable(ri);
		} else if (fd >= 0) {
			rdma_set_error(ri,
				       "%s: ibv_reg_dmabuf_mr of %s:%d [%p, +%" PRIu64
				       ") (dmabuf offset %" PRIu64 "): %s%s",
				       d->name, rdma_kind_name(mem_type), dev,
				       (void *)((char *)addr + off), len, fd_off + off,
				       strerror(err),
				       err == ENOMEM ? " (RLIMIT_MEMLOCK too low?)" : "");
			st = rdma_errno_status(err);
		} else {
			rdma_set_error(ri, "%s: ibv_reg_mr([%p, +%" PRIu64 ")): %s%s", d->name,
				       (void *)((char *)addr + off), len, strerror(err),
				       err == ENOMEM ? " (RLIMIT_MEMLOCK too low?)" : "");
			st = rdma_errno_status(err);
		}
		while (i--)
			if (m->mrs[i])
				ri->v->dereg_mr(m->mrs[i]);
		goto err_free;
	}
	/* The MRs hold the dmabuf: the fd is not needed any more. */
	if (fd >= 0)
		close(fd);
	pthread_mutex_lock(&ri->lock);
	m->next = ri->mems;
	if (ri->mems)
		ri->mems->prev = m;
	ri->mems = m;
	pthread_mutex_unlock(&ri->lock);
	if (m->n_chunks > 1)
		rdma_log(ri, TE_PLUGIN_LOG_DEBUG,
			 "[%p, +%" PRIu64 ") registered as %u chunks of %" PRIu64 " per device",
			 addr, length, m->n_chunks, m->chunk_len);
	if (mem_type != TE_PLUGIN_MEM_CPU)
		rdma_log(ri, TE_PLUGIN_LOG_DEBUG, "%s:%d [%p, +%" PRIu64 ") registered through %s",
			 rdma_kind_name(mem_type), dev, addr, length,
			 fd >= 0 ? "a dmabuf (GPUDirect)" : "ibv_reg_mr (peer memory)");
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;

err_free:
	if (fd >= 0)
		close(fd);
	free(m->mrs);
	free(m->lkeys);
	free(m);
	return st;
}

static enum te_status rdma_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	struct rdma_mem *m = (struct rdma_mem *)mem;
	enum te_status st = TE_OK;

	if (!m)
		return TE_ERR_INVALID_ARG;
	/* ibv_dereg_mr is the fence: once it returns, no peer can reach the region. */
	for (uint32_t i = 0; i < ri->n_devs * m->n_chunks; i++) {
		int rc;

		if (!m->mrs[i])
			continue;
		rc = ri->v->dereg_mr(m->mrs[i]);
		if (rc) {
			rdma_set_error(ri, "%s: ibv_dereg_mr: %s", ri->devs[i / m->n_chunks].name,
				       strerror(rc));
			st = rc == EBUSY ? TE_ERR_BUSY : TE_ERR_SYSTEM;
			continue;
		}
		m->mrs[i] = NULL;
	}
	if (st != TE_OK)
		return st;
	pthread_mutex_lock(&ri->lock);
	if (m->prev)
		m->prev->next = m->next;
	else
		ri->mems = m->next;
	if (m->next)
		m->next->prev = m->prev;
	pthread_mutex_unlock(&ri->lock);
	free(m->mrs);
	free(m->lkeys);
	free(m);
	return TE_OK;
}

static enum te_status rdma_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				    void *buf, size_t cap, size_t *len_out)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	const struct rdma_mem *m = (const struct rdma_mem *)mem;
	size_t len;
	uint8_t *p = buf;

	if (!m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	len = RDMA_KEY_HDR + (size_t)ri->n_devs * m->n_chunks * 4;
	if (cap < len)
		return TE_ERR_TOO_LARGE;
	memset(p, 0, RDMA_KEY_HDR);
	te_plugin_put_u32(p, RDMA_KEY_MAGIC);
	p[4] = RDMA_WIRE_VERSION;
	p[5] = (uint8_t)ri->n_devs;
	te_plugin_put_u32(p + 8, m->access);
	te_plugin_put_u32(p + 12, m->n_chunks);
	te_plugin_put_u64(p + 16, m->addr);
	te_plugin_put_u64(p + 24, m->length);
	te_plugin_put_u64(p + 32, m->step);
	te_plugin_put_u64(p + 40, m->chunk_len);
	te_plugin_put_u32(p + 48, (uint32_t)m->pref_mask);
	te_plugin_put_u32(p + 52, (uint32_t)m->valid_mask);
	for (uint32_t i = 0; i < ri->n_devs * m->n_chunks; i++)
		te_plugin_put_u32(p + RDMA_KEY_HDR + 4 * (size_t)i,
				  m->mrs[i] ? m->mrs[i]->rkey : 0);
	*len_out = len;
	return TE_OK;
}

static enum te_status rdma_unpack_remote_key(struct te_plugin_inst *inst,
					     struct te_plugin_peer *peer_h, const void *blob,
					     size_t len, uint64_t addr, uint64_t length,
					     struct te_plugin_rkey **rkey_out)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	const struct rdma_peer *peer = (const struct rdma_peer *)peer_h;
	const uint8_t *p = blob;
	struct rdma_rkey *k;
	uint32_t n_dev, n_chunks, mask;
	uint64_t step, chunk_len, kaddr, klen;

	if (!peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len < RDMA_KEY_HDR || te_plugin_get_u32(p) != RDMA_KEY_MAGIC ||
	    p[4] != RDMA_WIRE_VERSION)
		goto err_malformed;
	n_dev = p[5];
	n_chunks = te_plugin_get_u32(p + 12);
	kaddr = te_plugin_get_u64(p + 16);
	klen = te_plugin_get_u64(p + 24);
	step = te_plugin_get_u64(p + 32);
	chunk_len = te_plugin_get_u64(p + 40);
	mask = te_plugin_get_u32(p + 48);
	/* Geometry must cover exactly [addr, addr + length): chunk c at c * step. */
	if (n_dev != peer->n_rdev || n_dev == 0 || n_chunks == 0 || n_chunks > RDMA_BLOB_MAX / 4 ||
	    len != RDMA_KEY_HDR + (size_t)n_dev * n_chunks * 4 || kaddr != addr || klen != length ||
	    klen == 0 || kaddr > UINT64_MAX - klen || chunk_len == 0 || chunk_len > klen ||
	    step == 0 || step > chunk_len ||
	    (te_plugin_get_u32(p + 8) &
	     ~(uint32_t)(TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)) ||
	    (n_chunks == 1 && chunk_len != klen) ||
	    (n_chunks > 1 && ((uint64_t)(n_chunks - 1) > (klen - 1) / step ||
			      (uint64_t)(n_chunks - 1) * step + chunk_len < klen)))
		goto err_malformed;
	k = calloc(1, sizeof(*k) + (size_t)n_dev * n_chunks * sizeof(k->keys[0]));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = kaddr;
	k->length = klen;
	k->access = te_plugin_get_u32(p + 8);
	k->step = step;
	k->chunk_len = chunk_len;
	k->n_chunks = n_chunks;
	k->n_rdev = n_dev;
	for (uint32_t r = 0; r < n_dev; r++)
		if (mask & (1u << r))
			k->pref[k->n_pref++] = (uint8_t)r;
	if (!k->n_pref)
		for (uint32_t r = 0; r < n_dev; r++)
			k->pref[k->n_pref++] = (uint8_t)r;
	k->valid_mask = te_plugin_get_u32(p + 52) & (uint32_t)(rdma_dev_bit(n_dev) - 1);
	for (uint32_t i = 0; i < n_dev * n_chunks; i++)
		k->keys[i] = te_plugin_get_u32(p + RDMA_KEY_HDR + 4 * (size_t)i);
	pthread_mutex_lock(&ri->lock);
	k->next = ri->rkeys;
	if (ri->rkeys)
		ri->rkeys->prev = k;
	ri->rkeys = k;
	pthread_mutex_unlock(&ri->lock);
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;

err_malformed:
	rdma_set_error(
		ri, "peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64 ", +%" PRIu64 ")",
		peer->name, len, addr, length);
	return TE_ERR_METADATA_MALFORMED;
}

static void rdma_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	struct rdma_rkey *k = (struct rdma_rkey *)rkey;

	if (!k)
		return;
	pthread_mutex_lock(&ri->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		ri->rkeys = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&ri->lock);
	free(k);
}

/* --- peers, data path, control plane: thin glue ------------------------------------------- */

static enum te_status rdma_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				     const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	struct rdma_inst *ri = rdma_inst_of(inst);
	struct rdma_peer *peer;
	enum te_status st;

	if (!peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	st = rdma_conn_load_peer(ri, peer_name, blob, len, &peer);
	if (st == TE_OK)
		*peer_out = (struct te_plugin_peer *)peer;
	return st;
}

static void rdma_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
	if (inst && peer)
		rdma_conn_unload_peer(rdma_inst_of(inst), (struct rdma_peer *)peer);
}

static enum te_status rdma_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				  uint32_t n, uint32_t *accepted_out)
{
	if (!accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	return rdma_io_submit(rdma_inst_of(inst), slices, n, accepted_out);
}

static uint32_t rdma_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	return inst ? rdma_io_progress(rdma_inst_of(inst), budget) : 0;
}

static enum te_status rdma_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	if (!slice)
		return TE_ERR_INVALID_ARG;
	return rdma_io_cancel(rdma_inst_of(inst), slice);
}

static enum te_status rdma_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	if (!slice || !slice->priv)
		return TE_ERR_INVALID_ARG;
	return rdma_io_retry_prepare(rdma_inst_of(inst), slice);
}

static enum te_status rdma_handshake(struct te_plugin_inst *inst, const char *peer_name,
				     const void *req, size_t req_len, void *resp, size_t cap,
				     size_t *resp_len_out)
{
	if (!peer_name || (req_len && !req) || !resp_len_out || (cap && !resp))
		return TE_ERR_INVALID_ARG;
	return rdma_conn_handshake(rdma_inst_of(inst), peer_name, req, req_len, resp, cap,
				   resp_len_out);
}

static const struct te_plugin_ops rdma_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = rdma_init,
	.fini = rdma_fini,
	.query_caps = rdma_query_caps,
	.query_devices = rdma_query_devices,
	.reg_mem = rdma_reg_mem,
	.dereg_mem = rdma_dereg_mem,
	.pack_key = rdma_pack_key,
	.load_peer = rdma_load_peer,
	.unload_peer = rdma_unload_peer,
	.unpack_remote_key = rdma_unpack_remote_key,
	.release_remote_key = rdma_release_remote_key,
	.submit = rdma_submit,
	.progress = rdma_progress,
	.cancel = rdma_cancel,
	.retry_prepare = rdma_retry_prepare,
	.handshake = rdma_handshake,
};

static const struct te_plugin_desc rdma_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = RDMA_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "RDMA verbs (rdma-core): RC READ/WRITE, multi-device striping, QP exchange "
		       "through the control plane",
	.ops = &rdma_ops,
	TE_PLUGIN_OPTIONS(rdma_options),
};

TE_PLUGIN_DEFINE(&rdma_desc)
