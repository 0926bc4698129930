/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_conn.c: peers, RC queue pairs and their exchange through the control-plane handshake. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "rdma_priv.h"

/* Entries of one handshake request: the QPs being connected and what goes on the wire. */
struct rdma_hs_qp {
	struct rdma_qp *q;
	struct ibv_qp *qp;
	struct rdma_gid sgid;
	uint32_t psn;
};

static uint32_t rdma_random_psn(void)
{
	uint32_t v = 0;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != sizeof(v))
		v = (uint32_t)(uintptr_t)&v;
	return v & 0xffffff;
}

static enum ibv_mtu rdma_mtu_min(enum ibv_mtu a, enum ibv_mtu b)
{
	return a < b ? a : b;
}

static bool rdma_mtu_valid(unsigned v)
{
	return v >= IBV_MTU_256 && v <= IBV_MTU_4096;
}

/* --- verbs QP state machine --------------------------------------------------------------- */

/* Create an RC QP on @d and move it to INIT. @context: our rdma_qp, or NULL (passive). */
static struct ibv_qp *rdma_qp_create(struct rdma_inst *ri, struct rdma_dev *d, uint32_t depth,
				     void *context, char *why, size_t wlen)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	struct ibv_qp *qp;
	int rc;

	memset(&ia, 0, sizeof(ia));
	ia.qp_context = context;
	ia.send_cq = d->cq;
	ia.recv_cq = d->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = depth;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qp = ri->v->create_qp(d->pd, &ia);
	if (!qp) {
		snprintf(why, wlen, RDMA_NAME ": %s: ibv_create_qp(depth %u): %s", d->name, depth,
			 strerror(errno));
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = d->port;
	a.qp_access_flags =
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	rc = ri->v->modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc) {
		snprintf(why, wlen, RDMA_NAME ": %s: ibv_modify_qp(INIT): %s", d->name,
			 strerror(rc));
		ri->v->destroy_qp(qp);
		return NULL;
	}
	return qp;
}

/* INIT -> RTR -> RTS towards the remote QP described by the arguments. */
static int rdma_qp_connect(struct rdma_inst *ri, struct rdma_dev *d, struct ibv_qp *qp,
			   const struct rdma_gid *sgid, uint32_t rqpn, uint32_t rpsn,
			   const uint8_t *rgid, uint16_t rlid, enum ibv_mtu mtu, uint32_t my_psn,
			   uint8_t max_dest_rd, uint8_t max_rd, char *why, size_t wlen)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = max_dest_rd ? max_dest_rd : 1;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = d->port;
	a.ah_attr.sl = ri->sl;
	a.ah_attr.dlid = rlid;
	if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
		/* RoCE: the GRH is mandatory; the GIDs are the addresses. */
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, rgid, 16);
		a.ah_attr.grh.sgid_index = (uint8_t)sgid->index;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.grh.traffic_class = ri->traffic_class;
	}
	rc = ri->v->modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				      IBV_QP_MIN_RNR_TIMER);
	if (rc) {
		snprintf(why, wlen, RDMA_NAME ": %s: ibv_modify_qp(RTR, remote QP 0x%x): %s",
			 d->name, rqpn, strerror(rc));
		return rc;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = ri->ib_timeout;
	a.retry_cnt = ri->retry_cnt;
	a.rnr_retry = ri->rnr_retry;
	a.sq_psn = my_psn;
	a.max_rd_atomic = max_rd ? max_rd : 1;
	rc = ri->v->modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc) {
		snprintf(why, wlen, RDMA_NAME ": %s: ibv_modify_qp(RTS): %s", d->name,
			 strerror(rc));
		return rc;
	}
	return 0;
}

static uint8_t rdma_rd_cap(uint32_t v)
{
	return v > 255 ? 255 : v ? (uint8_t)v : 1;
}

/* --- peers ---------------------------------------------------------------------------------- */

static struct rdma_path *rdma_path_at(const struct rdma_peer *peer, uint32_t l, uint32_t r)
{
	return peer->paths[l * peer->n_rdev + r];
}

static void rdma_peer_free(struct rdma_peer *peer)
{
	struct rdma_inst *ri = peer->ri;

	for (uint32_t i = 0; peer->paths && i < ri->n_devs * peer->n_rdev; i++) {
		struct rdma_path *path = peer->paths[i];

		if (!path)
			continue;
		for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
			struct rdma_qp *q = &path->qps[k];

			if (q->qp) {
				if (atomic_load(&q->credits) != (int)q->depth)
					rdma_log(ri, TE_PLUGIN_LOG_ERROR,
						 "peer %s: QP 0x%x freed with %d work requests in "
						 "flight (bug)",
						 peer->name, q->qpn,
						 (int)q->depth - atomic_load(&q->credits));
				ri->v->destroy_qp(q->qp);
			}
			free(q->slots);
			pthread_mutex_destroy(&q->lock);
		}
		pthread_mutex_destroy(&path->fail_lock);
		free(path);
	}
	free(peer->paths);
	free(peer->name);
	free(peer);
}

static bool rdma_peer_drained(const struct rdma_peer *peer)
{
	const struct rdma_inst *ri = peer->ri;

	for (uint32_t i = 0; i < ri->n_devs * peer->n_rdev; i++)
		for (uint32_t k = 0; k < ri->qp_per_peer; k++)
			if (atomic_load_explicit(&peer->paths[i]->qps[k].credits,
						 memory_order_acquire) !=
			    (int)peer->paths[i]->qps[k].depth)
				return false;
	return true;
}

/* Move every QP of @peer to the error state: its work requests complete as flushed. */
static void rdma_peer_flush(struct rdma_peer *peer)
{
	struct rdma_inst *ri = peer->ri;

	for (uint32_t i = 0; i < ri->n_devs * peer->n_rdev; i++) {
		for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
			struct rdma_qp *q = &peer->paths[i]->qps[k];
			struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
			int ready = RDMA_QP_READY;

			if (atomic_compare_exchange_strong(&q->state, &ready, RDMA_QP_ERROR))
				atomic_store(&q->err_event, (int)IBV_EVENT_QP_FATAL + 1);
			pthread_mutex_lock(&q->lock);
			if (q->qp)
				ri->v->modify_qp(q->qp, &a, IBV_QP_STATE);
			pthread_mutex_unlock(&q->lock);
		}
	}
}

void rdma_peer_unref(struct rdma_peer *peer)
{
	struct rdma_inst *ri = peer->ri;

	if (atomic_fetch_sub(&peer->refs, 1) != 1)
		return;
	if (rdma_peer_drained(peer)) {
		rdma_peer_free(peer);
		return;
	}
	/*
	 * Unloaded while work requests are in flight: only at shutdown, when the core stops
	 * waiting for slices. Flush them; the peer is freed once they are reaped.
	 */
	rdma_peer_flush(peer);
	pthread_mutex_lock(&ri->lock);
	peer->next = ri->zombies;
	peer->prev = NULL;
	if (ri->zombies)
		ri->zombies->prev = peer;
	ri->zombies = peer;
	pthread_mutex_unlock(&ri->lock);
	rdma_kick(ri->conn_kick_fd);
}

/* Parse @blob (the peer's published devices) into a new peer with every path allocated. */
static enum te_status rdma_peer_new(struct rdma_inst *ri, const char *name, const uint8_t *b,
				    size_t len, struct rdma_peer **peer_out)
{
	struct rdma_peer *peer;
	uint32_t n;

	if (len < RDMA_BLOB_HDR || te_plugin_get_u32(b) != RDMA_BLOB_MAGIC ||
	    b[4] != RDMA_WIRE_VERSION || b[5] == 0 || b[5] > RDMA_MAX_DEVS ||
	    len != RDMA_BLOB_HDR + (size_t)b[5] * RDMA_BLOB_DEV) {
		ri->host->log(ri->ctx, TE_PLUGIN_LOG_INFO,
			      "peer %s: malformed transport blob (%zu bytes)", name, len);
		return TE_ERR_METADATA_MALFORMED;
	}
	n = b[5];
	peer = calloc(1, sizeof(*peer));
	if (!peer)
		return TE_ERR_NOMEM;
	peer->ri = ri;
	peer->name = strdup(name);
	peer->nonce = te_plugin_get_u64(b + 8);
	peer->n_rdev = n;
	atomic_init(&peer->refs, 1);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = b + RDMA_BLOB_HDR + (size_t)i * RDMA_BLOB_DEV;
		struct rdma_rdev *rd = &peer->rdev[i];

		for (uint32_t c = 0; c < RDMA_NAME_LEN && e[c]; c++)
			rd->name[c] = e[c] >= 0x20 && e[c] < 0x7f ? (char)e[c] : '?';
		memcpy(rd->gid.raw, e + 32, 16);
		rd->lid = te_plugin_get_u16(e + 48);
		rd->port = e[50];
		rd->link_layer = e[51];
		rd->mtu = rdma_mtu_valid(e[52]) ? e[52] : IBV_MTU_1024;
		rd->gid_kind = e[53];
		rd->up = e[55];
	}
	peer->paths = calloc((size_t)ri->n_devs * n, sizeof(*peer->paths));
	if (!peer->name || !peer->paths)
		goto err_nomem;
	for (uint32_t i = 0; i < ri->n_devs * n; i++) {
		struct rdma_path *path;

		path = calloc(1, sizeof(*path) + ri->qp_per_peer * sizeof(path->qps[0]));
		if (!path)
			goto err_nomem;
		peer->paths[i] = path;
		path->peer = peer;
		path->l = i / n;
		path->r = i % n;
		pthread_mutex_init(&path->fail_lock, NULL);
		for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
			struct rdma_qp *q = &path->qps[k];

			q->path = path;
			q->qidx = k;
			q->depth = ri->qp_depth < ri->devs[path->l].max_qp_wr
					   ? ri->qp_depth
					   : ri->devs[path->l].max_qp_wr;
			atomic_init(&q->state, RDMA_QP_IDLE);
			atomic_init(&q->credits, (int)q->depth);
			pthread_mutex_init(&q->lock, NULL);
		}
	}
	pthread_mutex_lock(&ri->lock);
	peer->conn_id = ri->next_conn_id++;
	pthread_mutex_unlock(&ri->lock);
	*peer_out = peer;
	return TE_OK;

err_nomem:
	rdma_peer_free(peer);
	return TE_ERR_NOMEM;
}

/* --- initiator side of the handshake --------------------------------------------------------- */

static void rdma_path_set_fail(struct rdma_path *path, enum te_status st, const char *why,
			       uint64_t now)
{
	pthread_mutex_lock(&path->fail_lock);
	path->fail_status = st;
	path->fail_ns = now;
	snprintf(path->fail_detail, sizeof(path->fail_detail), "%s", why);
	atomic_store(&path->failed, st != TE_OK);
	pthread_mutex_unlock(&path->fail_lock);
}

/*
 * Connect @n QPs (state CONNECTING, no verbs QP) of @peer with one handshake. On success each
 * is READY; on failure each is back to IDLE and @why says what failed.
 */
static enum te_status rdma_connect(struct rdma_inst *ri, struct rdma_peer *peer,
				   struct rdma_qp **qs, uint32_t n, char *why, size_t wlen)
{
	size_t req_len = RDMA_HS_HDR + (size_t)n * RDMA_HS_ENTRY;
	size_t cap = RDMA_HR_HDR + (size_t)n * RDMA_HR_ENTRY, resp_len = 0;
	struct rdma_hs_qp *hq;
	uint8_t *req, *resp;
	enum te_status st = TE_OK;
	uint32_t made = 0;

	hq = calloc(n, sizeof(*hq));
	req = calloc(1, req_len);
	resp = calloc(1, cap);
	if (!hq || !req || !resp) {
		snprintf(why, wlen, RDMA_NAME ": out of memory connecting to %s", peer->name);
		st = TE_ERR_NOMEM;
		goto out;
	}
	te_plugin_put_u32(req, RDMA_HS_MAGIC);
	req[4] = RDMA_WIRE_VERSION;
	req[5] = RDMA_HS_CONNECT;
	te_plugin_put_u16(req + 6, (uint16_t)n);
	te_plugin_put_u64(req + 8, ri->nonce);
	te_plugin_put_u64(req + 16, peer->nonce);
	te_plugin_put_u32(req + 24, peer->conn_id);
	for (made = 0; made < n; made++) {
		struct rdma_qp *q = qs[made];
		struct rdma_path *path = q->path;
		struct rdma_dev *d = &ri->devs[path->l];
		uint8_t *e = req + RDMA_HS_HDR + (size_t)made * RDMA_HS_ENTRY;
		enum ibv_mtu mtu;
		uint16_t lid;

		hq[made].q = q;
		hq[made].qp = rdma_qp_create(ri, d, q->depth, q, why, wlen);
		if (!hq[made].qp) {
			st = TE_ERR_DEVICE_FAILED;
			goto out;
		}
		hq[made].psn = rdma_random_psn();
		rdma_dev_pick_gid(d, &peer->rdev[path->r].gid, &hq[made].sgid);
		rdma_dev_snapshot(d, &lid, &mtu);
		e[0] = (uint8_t)path->l;
		e[1] = (uint8_t)path->r;
		e[2] = (uint8_t)q->qidx;
		e[3] = (uint8_t)rdma_mtu_min(mtu, ri->mtu_cap);
		te_plugin_put_u32(e + 4, hq[made].qp->qp_num);
		te_plugin_put_u32(e + 8, hq[made].psn);
		te_plugin_put_u16(e + 12, lid);
		e[14] = rdma_rd_cap(d->max_init_rd_atom);
		e[15] = d->link_layer;
		memcpy(e + 16, hq[made].sgid.gid.raw, 16);
	}
	st = ri->host->peer_handshake(ri->ctx, peer->name, req, req_len, resp, cap, &resp_len,
				      ri->handshake_timeout_ms);
	if (st != TE_OK) {
		snprintf(why, wlen, RDMA_NAME ": QP handshake with %s failed (status %d%s)",
			 peer->name, st,
			 st == TE_ERR_PEER_UNREACHABLE ? ": peer unreachable"
			 : st == TE_ERR_TIMEOUT	       ? ": timed out"
			 : st == TE_ERR_PEER_RESTARTED ? ": the peer restarted"
			 : st == TE_ERR_NO_DEVICE      ? ": the peer's device is not usable"
			 : st == TE_ERR_UNSUPPORTED    ? ": the peer has no rdma transport"
						       : "");
		goto out;
	}
	if (resp_len != cap || te_plugin_get_u32(resp) != RDMA_HR_MAGIC ||
	    resp[4] != RDMA_WIRE_VERSION || te_plugin_get_u16(resp + 6) != n) {
		snprintf(why, wlen, RDMA_NAME ": malformed QP handshake reply from %s (%zu bytes)",
			 peer->name, resp_len);
		st = TE_ERR_PROTOCOL;
		goto out;
	}
	if (te_plugin_get_u64(resp + 8) != peer->nonce) {
		snprintf(why, wlen, RDMA_NAME ": %s answered as another instance (restarted)",
			 peer->name);
		st = TE_ERR_PEER_RESTARTED;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = resp + RDMA_HR_HDR + (size_t)i * RDMA_HR_ENTRY;
		struct rdma_qp *q = hq[i].q;
		struct rdma_path *path = q->path;
		struct rdma_dev *d = &ri->devs[path->l];
		enum ibv_mtu mine, mtu;
		uint16_t lid;

		rdma_dev_snapshot(d, &lid, &mine);
		mtu = rdma_mtu_min(rdma_mtu_min(mine, ri->mtu_cap),
				   rdma_mtu_valid(e[14]) ? (enum ibv_mtu)e[14] : IBV_MTU_256);
		if (rdma_qp_connect(ri, d, hq[i].qp, &hq[i].sgid, te_plugin_get_u32(e),
				    te_plugin_get_u32(e + 4), e + 16, te_plugin_get_u16(e + 12),
				    mtu, hq[i].psn, rdma_rd_cap(d->max_rd_atom), e[15] ? e[15] : 1,
				    why, wlen)) {
			st = TE_ERR_DEVICE_FAILED;
			goto out;
		}
		path->mtu = mtu;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct rdma_qp *q = hq[i].q;
		const uint8_t *e = resp + RDMA_HR_HDR + (size_t)i * RDMA_HR_ENTRY;
		char sg[64], dg[64];

		if (!q->slots) {
			q->slots = calloc(q->depth, sizeof(*q->slots));
			if (!q->slots) {
				snprintf(why, wlen, RDMA_NAME ": out of memory for QP slots");
				st = TE_ERR_NOMEM;
				goto out;
			}
			for (uint32_t k = 0; k < q->depth; k++) {
				struct rdma_slot *slot = &q->slots[k];

				slot->qp = q;
				slot->wr.wr_id = (uint64_t)(uintptr_t)slot;
				slot->wr.sg_list = &slot->sge;
				slot->wr.num_sge = 1;
				slot->wr.send_flags = IBV_SEND_SIGNALED;
			}
		}
		if (i == 0 || q->path != hq[i - 1].q->path) {
			union ibv_gid rg;

			memcpy(rg.raw, e + 16, 16);
			rdma_gid_text(&hq[i].sgid.gid, sg, sizeof(sg));
			rdma_gid_text(&rg, dg, sizeof(dg));
			rdma_log(ri, q->generation ? TE_PLUGIN_LOG_DEBUG : TE_PLUGIN_LOG_INFO,
				 "path %s -> %s/%s: QP 0x%x -> 0x%x, MTU %u, gid[%u] %s -> %s%s",
				 ri->devs[q->path->l].name, peer->name, peer->rdev[q->path->r].name,
				 hq[i].qp->qp_num, te_plugin_get_u32(e),
				 rdma_mtu_bytes(q->path->mtu), hq[i].sgid.index, sg, dg,
				 q->generation ? " (reconnected)" : "");
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		struct rdma_qp *q = hq[i].q;
		const uint8_t *e = resp + RDMA_HR_HDR + (size_t)i * RDMA_HR_ENTRY;

		pthread_mutex_lock(&q->lock);
		q->qp = hq[i].qp;
		q->qpn = hq[i].qp->qp_num;
		q->rqpn = te_plugin_get_u32(e);
		q->generation++;
		q->err[0] = '\0';
		atomic_store(&q->err_event, 0);
		pthread_mutex_unlock(&q->lock);
		hq[i].qp = NULL;
		atomic_store_explicit(&q->state, RDMA_QP_READY, memory_order_release);
	}
out:
	for (uint32_t i = 0; st != TE_OK && i < n; i++) {
		if (hq && hq[i].qp)
			ri->v->destroy_qp(hq[i].qp);
		atomic_store(&qs[i]->state, RDMA_QP_IDLE);
	}
	free(hq);
	free(req);
	free(resp);
	return st;
}

/* Paths load_peer connects: local device l to the peer's device l % n (rail pairing). */
enum te_status rdma_conn_load_peer(struct rdma_inst *ri, const char *name, const void *blob,
				   size_t len, struct rdma_peer **peer_out)
{
	struct rdma_qp **qs;
	struct rdma_peer *peer;
	enum te_status st;
	char why[RDMA_DETAIL];
	uint32_t n = 0;

	st = rdma_peer_new(ri, name, blob, len, &peer);
	if (st != TE_OK)
		return st;
	qs = calloc((size_t)ri->n_devs * ri->qp_per_peer, sizeof(*qs));
	if (!qs) {
		rdma_peer_free(peer);
		return TE_ERR_NOMEM;
	}
	for (uint32_t l = 0; l < ri->n_devs; l++) {
		struct rdma_path *path;
		uint32_t r = l % peer->n_rdev;

		/* The rail pair, or the next device of the peer that was up. */
		for (uint32_t i = 0; i < peer->n_rdev && !peer->rdev[r].up; i++)
			r = (l + i + 1) % peer->n_rdev;
		if (!peer->rdev[r].up)
			r = l % peer->n_rdev;
		path = rdma_path_at(peer, l, r);

		if (!atomic_load(&ri->devs[l].up))
			continue; /* connected on demand once the port is up */
		for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
			atomic_store(&path->qps[k].state, RDMA_QP_CONNECTING);
			qs[n++] = &path->qps[k];
		}
	}
	if (!n) {
		free(qs);
		rdma_peer_free(peer);
		rdma_set_error(ri, RDMA_NAME ": no local device is up");
		return TE_ERR_NO_DEVICE;
	}
	st = rdma_connect(ri, peer, qs, n, why, sizeof(why));
	free(qs);
	if (st != TE_OK) {
		rdma_set_error(ri, "%s", why);
		rdma_peer_free(peer);
		return st;
	}
	pthread_mutex_lock(&ri->lock);
	peer->next = ri->peers;
	if (ri->peers)
		ri->peers->prev = peer;
	ri->peers = peer;
	pthread_mutex_unlock(&ri->lock);
	*peer_out = peer;
	return TE_OK;
}

void rdma_conn_unload_peer(struct rdma_inst *ri, struct rdma_peer *peer)
{
	struct rdma_bye *bye = calloc(1, sizeof(*bye));

	/*
	 * May run inside slice_done on the poller: waits for nothing but a mark_failed of
	 * the control thread that names this peer (the core holds none of its locks here);
	 * the control thread says bye.
	 */
	atomic_store(&peer->closing, true);
	te_plugin_naming_unload(&ri->naming, &peer->np);
	if (bye) {
		bye->to = strdup(peer->name);
		bye->to_nonce = peer->nonce;
		bye->conn_id = peer->conn_id;
		/*
		 * Not at once: at engine shutdown the core unloads peers just before fini, and
		 * a close message then would race with the core tearing its segments down.
		 */
		bye->due_ns = ri->host->now_ns() + 100000000ull;
	}
	pthread_mutex_lock(&ri->lock);
	if (peer->prev)
		peer->prev->next = peer->next;
	else if (ri->peers == peer)
		ri->peers = peer->next;
	if (peer->next)
		peer->next->prev = peer->prev;
	peer->prev = peer->next = NULL;
	if (bye && bye->to && !atomic_load(&ri->stopping)) {
		bye->next = ri->byes;
		ri->byes = bye;
		bye = NULL;
	}
	pthread_mutex_unlock(&ri->lock);
	if (bye) {
		free(bye->to);
		free(bye);
	} else {
		rdma_kick(ri->conn_kick_fd);
	}
	rdma_peer_unref(peer);
}

void rdma_conn_queue_path(struct rdma_inst *ri, struct rdma_path *path)
{
	/* A closing peer needs no more connections; its drained QPs go with it. */
	if (atomic_load(&path->peer->closing) || atomic_exchange(&path->queued, true))
		return;
	atomic_fetch_add(&path->peer->refs, 1);
	pthread_mutex_lock(&ri->lock);
	path->job_next = ri->path_jobs;
	ri->path_jobs = path;
	pthread_mutex_unlock(&ri->lock);
	rdma_kick(ri->conn_kick_fd);
}

void rdma_conn_passive_broken(struct rdma_inst *ri, struct ibv_qp *qp)
{
	pthread_mutex_lock(&ri->broken_lock);
	if (ri->n_broken < sizeof(ri->broken) / sizeof(ri->broken[0])) {
		ri->broken[ri->n_broken].qp = qp;
		ri->broken[ri->n_broken].qpn = qp->qp_num;
		ri->n_broken++;
	}
	pthread_mutex_unlock(&ri->broken_lock);
	rdma_kick(ri->conn_kick_fd);
}

/* --- passive side: the handshake op ----------------------------------------------------------- */

/* Remove matching passive entries from the table into @out (destroyed by the caller, unlocked). */
static uint32_t rdma_passive_take(struct rdma_inst *ri, const char *from, uint64_t nonce,
				  bool other_nonce, int64_t conn_id, const uint8_t *key,
				  struct ibv_qp **out, uint32_t max)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < ri->n_passive && n < max;) {
		struct rdma_passive *p = &ri->passive[i];
		bool hit =
			!strcmp(p->from, from) &&
			(other_nonce ? p->nonce != nonce
				     : p->nonce == nonce &&
					       (conn_id < 0 || p->conn_id == (uint32_t)conn_id) &&
					       (!key || (p->l == key[0] && p->r == key[1] &&
							 p->qidx == key[2])));

		if (!hit) {
			i++;
			continue;
		}
		out[n++] = p->qp;
		free(p->from);
		*p = ri->passive[--ri->n_passive];
	}
	return n;
}

static void rdma_destroy_qps(struct rdma_inst *ri, struct ibv_qp **qps, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (qps[i])
			ri->v->destroy_qp(qps[i]);
}

static enum te_status rdma_handshake_close(struct rdma_inst *ri, const char *from,
					   const uint8_t *req, size_t *resp_len_out)
{
	struct ibv_qp **old = calloc(RDMA_MAX_PASSIVE, sizeof(*old));
	uint32_t n;

	if (!old)
		return TE_ERR_NOMEM;
	pthread_mutex_lock(&ri->lock);
	n = rdma_passive_take(ri, from, te_plugin_get_u64(req + 8), false,
			      te_plugin_get_u32(req + 24), NULL, old, RDMA_MAX_PASSIVE);
	pthread_mutex_unlock(&ri->lock);
	rdma_destroy_qps(ri, old, n);
	free(old);
	if (n)
		rdma_log(ri, TE_PLUGIN_LOG_DEBUG, "peer %s closed %u QP(s)", from, n);
	*resp_len_out = 0;
	return TE_OK;
}

enum te_status rdma_conn_handshake(struct rdma_inst *ri, const char *from, const void *reqv,
				   size_t req_len, void *respv, size_t cap, size_t *resp_len_out)
{
	const uint8_t *req = reqv;
	uint8_t *resp = respv;
	struct rdma_passive *made = NULL;
	struct ibv_qp **old = NULL;
	uint32_t n, n_old = 0, done = 0;
	uint64_t from_nonce;
	enum te_status st = TE_OK;
	char why[RDMA_DETAIL];

	if (atomic_load(&ri->stopping))
		return TE_ERR_SHUTDOWN;
	if (req_len < RDMA_HS_HDR || te_plugin_get_u32(req) != RDMA_HS_MAGIC ||
	    req[4] != RDMA_WIRE_VERSION)
		return TE_ERR_PROTOCOL;
	if (req[5] == RDMA_HS_CLOSE)
		return rdma_handshake_close(ri, from, req, resp_len_out);
	n = te_plugin_get_u16(req + 6);
	if (req[5] != RDMA_HS_CONNECT || n == 0 || n > RDMA_HS_MAX_ENTRIES ||
	    req_len != RDMA_HS_HDR + (size_t)n * RDMA_HS_ENTRY)
		return TE_ERR_PROTOCOL;
	if (cap < RDMA_HR_HDR + (size_t)n * RDMA_HR_ENTRY)
		return TE_ERR_TOO_LARGE;
	from_nonce = te_plugin_get_u64(req + 8);
	if (te_plugin_get_u64(req + 16) != ri->nonce) {
		rdma_log(ri, TE_PLUGIN_LOG_INFO,
			 "peer %s asked for instance %016" PRIx64 ", this is %016" PRIx64
			 " (stale descriptor)",
			 from, te_plugin_get_u64(req + 16), ri->nonce);
		return TE_ERR_PEER_RESTARTED;
	}
	made = calloc(n, sizeof(*made));
	old = calloc(RDMA_MAX_PASSIVE, sizeof(*old));
	if (!made || !old) {
		st = TE_ERR_NOMEM;
		goto out;
	}
	/* Replace what this peer had: QPs of a previous instance, and the same QPs of this one. */
	pthread_mutex_lock(&ri->lock);
	n_old = rdma_passive_take(ri, from, from_nonce, true, -1, NULL, old, RDMA_MAX_PASSIVE);
	for (uint32_t i = 0; i < n && n_old < RDMA_MAX_PASSIVE; i++)
		n_old += rdma_passive_take(ri, from, from_nonce, false, te_plugin_get_u32(req + 24),
					   req + RDMA_HS_HDR + (size_t)i * RDMA_HS_ENTRY,
					   old + n_old, RDMA_MAX_PASSIVE - n_old);
	if (ri->n_passive + n > RDMA_MAX_PASSIVE)
		st = TE_ERR_AGAIN;
	pthread_mutex_unlock(&ri->lock);
	rdma_destroy_qps(ri, old, n_old);
	if (st != TE_OK) {
		rdma_log(ri, TE_PLUGIN_LOG_WARN, "peer %s: over %u passive QPs; refused", from,
			 RDMA_MAX_PASSIVE);
		goto out;
	}

	memset(resp, 0, RDMA_HR_HDR + (size_t)n * RDMA_HR_ENTRY);
	te_plugin_put_u32(resp, RDMA_HR_MAGIC);
	resp[4] = RDMA_WIRE_VERSION;
	te_plugin_put_u16(resp + 6, (uint16_t)n);
	te_plugin_put_u64(resp + 8, ri->nonce);
	for (done = 0; done < n; done++) {
		const uint8_t *e = req + RDMA_HS_HDR + (size_t)done * RDMA_HS_ENTRY;
		uint8_t *o = resp + RDMA_HR_HDR + (size_t)done * RDMA_HR_ENTRY;
		struct rdma_passive *p = &made[done];
		struct rdma_gid sgid;
		struct rdma_dev *d;
		union ibv_gid rgid;
		enum ibv_mtu mine, mtu;
		uint16_t lid;
		uint8_t rd;

		if (e[1] >= ri->n_devs || e[2] >= RDMA_MAX_QP_PER_PEER) {
			st = TE_ERR_PROTOCOL;
			goto out;
		}
		d = &ri->devs[e[1]];
		if (atomic_load(&d->fatal) || !atomic_load(&d->up)) {
			rdma_log(ri, TE_PLUGIN_LOG_INFO, "peer %s asked for %s, which is down",
				 from, d->name);
			st = TE_ERR_NO_DEVICE;
			goto out;
		}
		p->qp = rdma_qp_create(ri, d, 1, NULL, why, sizeof(why));
		if (!p->qp) {
			rdma_log(ri, TE_PLUGIN_LOG_WARN, "peer %s: %s", from, rdma_unprefixed(why));
			st = TE_ERR_DEVICE_FAILED;
			goto out;
		}
		memcpy(rgid.raw, e + 16, 16);
		rdma_dev_pick_gid(d, &rgid, &sgid);
		rdma_dev_snapshot(d, &lid, &mine);
		mtu = rdma_mtu_min(rdma_mtu_min(mine, ri->mtu_cap),
				   rdma_mtu_valid(e[3]) ? (enum ibv_mtu)e[3] : IBV_MTU_256);
		rd = rdma_rd_cap(d->max_rd_atom);
		if (e[14] && e[14] < rd)
			rd = e[14];
		p->l = e[0];
		p->r = e[1];
		p->qidx = e[2];
		p->nonce = from_nonce;
		p->conn_id = te_plugin_get_u32(req + 24);
		te_plugin_put_u32(o, p->qp->qp_num);
		te_plugin_put_u32(o + 4, rdma_random_psn());
		te_plugin_put_u16(o + 12, lid);
		o[14] = (uint8_t)mtu;
		o[15] = rd;
		memcpy(o + 16, sgid.gid.raw, 16);
		if (rdma_qp_connect(ri, d, p->qp, &sgid, te_plugin_get_u32(e + 4),
				    te_plugin_get_u32(e + 8), e + 16, te_plugin_get_u16(e + 12),
				    mtu, te_plugin_get_u32(o + 4), rd, 1, why, sizeof(why))) {
			rdma_log(ri, TE_PLUGIN_LOG_WARN, "peer %s: %s", from, rdma_unprefixed(why));
			ri->v->destroy_qp(p->qp);
			p->qp = NULL;
			st = TE_ERR_DEVICE_FAILED;
			goto out;
		}
	}
	pthread_mutex_lock(&ri->lock);
	if (ri->n_passive + n > ri->cap_passive) {
		uint32_t ncap = ri->cap_passive ? ri->cap_passive : 64;
		struct rdma_passive *np;

		while (ncap < ri->n_passive + n)
			ncap *= 2;
		np = realloc(ri->passive, ncap * sizeof(*np));
		if (!np) {
			pthread_mutex_unlock(&ri->lock);
			st = TE_ERR_NOMEM;
			goto out;
		}
		ri->passive = np;
		ri->cap_passive = ncap;
	}
	for (uint32_t i = 0; i < n; i++) {
		made[i].from = strdup(from);
		ri->passive[ri->n_passive++] = made[i];
		made[i].qp = NULL;
	}
	pthread_mutex_unlock(&ri->lock);
	rdma_log(ri, TE_PLUGIN_LOG_DEBUG, "peer %s: %u passive QP(s) connected", from, n);
	*resp_len_out = RDMA_HR_HDR + (size_t)n * RDMA_HR_ENTRY;
out:
	for (uint32_t i = 0; made && i < n && st != TE_OK; i++)
		if (made[i].qp)
			ri->v->destroy_qp(made[i].qp);
	free(made);
	free(old);
	return st;
}

/* --- control thread --------------------------------------------------------------------------- */

/*
 * Quarantine @peer with the host, unless the core unloaded it (its segment closed, maybe
 * while the handshake ran): a handle must not be named after its unload_peer returned,
 * which waits for this call (te_plugin_naming_unload).
 */
static void rdma_name_failed_peer(struct rdma_inst *ri, struct rdma_peer *peer, uint32_t l,
				  const char *why)
{
	if (!te_plugin_naming_enter(&ri->naming, &peer->np))
		return;
	ri->host->mark_failed(ri->ctx, TE_PLUGIN_FAIL_PEER, l, (struct te_plugin_peer *)peer, why);
	te_plugin_naming_leave(&ri->naming, &peer->np);
}

/* Destroy drained QPs in error; connect the IDLE QPs of a path a submit asked for. */
static void rdma_path_work(struct rdma_inst *ri, struct rdma_path *path)
{
	struct rdma_peer *peer = path->peer;
	struct rdma_qp *qs[RDMA_MAX_QP_PER_PEER];
	char why[RDMA_DETAIL];
	enum te_status st;
	uint32_t n = 0;

	for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
		struct rdma_qp *q = &path->qps[k];

		if (atomic_load(&q->state) != RDMA_QP_ERROR ||
		    atomic_load_explicit(&q->credits, memory_order_acquire) != (int)q->depth)
			continue;
		/* Every work request was reaped: nothing refers to the verbs QP any more. */
		pthread_mutex_lock(&q->lock);
		ri->v->destroy_qp(q->qp);
		q->qp = NULL;
		pthread_mutex_unlock(&q->lock);
		rdma_log(ri, TE_PLUGIN_LOG_DEBUG,
			 "path %s -> %s/%s: QP %u destroyed after an error", ri->devs[path->l].name,
			 peer->name, peer->rdev[path->r].name, k);
		atomic_store(&q->state, RDMA_QP_IDLE);
	}
	if (atomic_load(&peer->closing) || atomic_load(&ri->stopping) ||
	    !atomic_exchange(&path->want, false))
		return;
	for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
		int idle = RDMA_QP_IDLE;

		if (atomic_compare_exchange_strong(&path->qps[k].state, &idle, RDMA_QP_CONNECTING))
			qs[n++] = &path->qps[k];
	}
	if (!n)
		return;
	st = rdma_connect(ri, peer, qs, n, why, sizeof(why));
	if (st == TE_OK) {
		rdma_path_set_fail(path, TE_OK, "", 0);
		return;
	}
	rdma_path_set_fail(path, st, why, ri->host->now_ns());
	rdma_log(ri, TE_PLUGIN_LOG_WARN, "%s", rdma_unprefixed(why));
	if (st == TE_ERR_PEER_UNREACHABLE || st == TE_ERR_TIMEOUT || st == TE_ERR_PEER_RESTARTED)
		rdma_name_failed_peer(ri, peer, path->l, why);
}

/* A port went down: move the device's QPs to error so their work fails over now. */
static void rdma_flush_device(struct rdma_inst *ri, uint32_t l)
{
	pthread_mutex_lock(&ri->lock);
	for (struct rdma_peer *peer = ri->peers; peer; peer = peer->next) {
		for (uint32_t r = 0; r < peer->n_rdev; r++) {
			struct rdma_path *path = rdma_path_at(peer, l, r);

			for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
				struct rdma_qp *q = &path->qps[k];
				struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
				int ready = RDMA_QP_READY;

				if (!atomic_compare_exchange_strong(&q->state, &ready,
								    RDMA_QP_ERROR))
					continue;
				atomic_store(&q->err_event, (int)IBV_EVENT_PORT_ERR + 1);
				pthread_mutex_lock(&q->lock);
				if (q->qp)
					ri->v->modify_qp(q->qp, &a, IBV_QP_STATE);
				pthread_mutex_unlock(&q->lock);
				if (!atomic_exchange(&path->queued, true)) {
					atomic_fetch_add(&peer->refs, 1);
					path->job_next = ri->path_jobs;
					ri->path_jobs = path;
				}
			}
		}
	}
	pthread_mutex_unlock(&ri->lock);
}

void *rdma_conn_thread(void *arg)
{
	struct rdma_inst *ri = arg;
	bool was_up[RDMA_MAX_DEVS];

	for (uint32_t i = 0; i < ri->n_devs; i++)
		was_up[i] = atomic_load(&ri->devs[i].up);
	while (!atomic_load(&ri->stopping)) {
		struct pollfd pfd = { .fd = ri->conn_kick_fd, .events = POLLIN };
		struct rdma_path *jobs;
		struct rdma_bye *byes;
		struct ibv_qp *broken[64];
		struct rdma_peer *dead = NULL;
		uint32_t n_broken = 0;
		uint64_t junk;

		if (poll(&pfd, 1, 250) < 0 && errno != EINTR)
			break;
		if (read(ri->conn_kick_fd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
			(void)0;
		for (uint32_t i = 0; i < ri->n_devs; i++) {
			bool up = atomic_load(&ri->devs[i].up);

			if (was_up[i] && !up)
				rdma_flush_device(ri, i);
			was_up[i] = up;
		}

		/* Passive QPs broken by a peer's bad request (matched by address and number). */
		pthread_mutex_lock(&ri->broken_lock);
		pthread_mutex_lock(&ri->lock);
		for (uint32_t b = 0; b < ri->n_broken; b++) {
			for (uint32_t i = 0; i < ri->n_passive; i++) {
				struct rdma_passive *p = &ri->passive[i];

				if (p->qp != ri->broken[b].qp || p->qp->qp_num != ri->broken[b].qpn)
					continue;
				rdma_log(ri, TE_PLUGIN_LOG_INFO,
					 "QP 0x%x of peer %s broke; dropped until it reconnects",
					 p->qp->qp_num, p->from);
				broken[n_broken++] = p->qp;
				free(p->from);
				*p = ri->passive[--ri->n_passive];
				break;
			}
		}
		ri->n_broken = 0;
		jobs = ri->path_jobs;
		ri->path_jobs = NULL;
		byes = ri->byes;
		ri->byes = NULL;
		for (struct rdma_peer *z = ri->zombies, *next; z; z = next) {
			next = z->next;
			if (!rdma_peer_drained(z))
				continue;
			if (z->prev)
				z->prev->next = z->next;
			else
				ri->zombies = z->next;
			if (z->next)
				z->next->prev = z->prev;
			z->next = dead;
			dead = z;
		}
		pthread_mutex_unlock(&ri->lock);
		while (dead) {
			struct rdma_peer *z = dead;

			dead = z->next;
			rdma_peer_free(z);
		}
		pthread_mutex_unlock(&ri->broken_lock);
		rdma_destroy_qps(ri, broken, n_broken);

		while (jobs) {
			struct rdma_path *path = jobs;

			jobs = path->job_next;
			atomic_store(&path->queued, false);
			rdma_path_work(ri, path);
			rdma_peer_unref(path->peer);
		}
		while (byes) {
			struct rdma_bye *bye = byes;
			uint8_t req[RDMA_HS_HDR] = { 0 };
			size_t rlen = 0;
			uint8_t resp[16];

			byes = bye->next;
			if (ri->host->now_ns() < bye->due_ns && !atomic_load(&ri->stopping)) {
				/* Not yet: back on the list, looked at again within 250 ms. */
				pthread_mutex_lock(&ri->lock);
				bye->next = ri->byes;
				ri->byes = bye;
				pthread_mutex_unlock(&ri->lock);
				continue;
			}
			te_plugin_put_u32(req, RDMA_HS_MAGIC);
			req[4] = RDMA_WIRE_VERSION;
			req[5] = RDMA_HS_CLOSE;
			te_plugin_put_u64(req + 8, ri->nonce);
			te_plugin_put_u64(req + 16, bye->to_nonce);
			te_plugin_put_u32(req + 24, bye->conn_id);
			if (!atomic_load(&ri->stopping))
				(void)ri->host->peer_handshake(ri->ctx, bye->to, req, sizeof(req),
							       resp, sizeof(resp), &rlen, 1000);
			free(bye->to);
			free(bye);
		}
	}
	return NULL;
}

void rdma_conn_destroy_all(struct rdma_inst *ri)
{
	uint32_t peers = 0, passive = ri->n_passive;

	while (ri->path_jobs) {
		struct rdma_path *path = ri->path_jobs;

		ri->path_jobs = path->job_next;
		atomic_store(&path->queued, false);
		rdma_peer_unref(path->peer);
	}
	while (ri->byes) {
		struct rdma_bye *bye = ri->byes;

		ri->byes = bye->next;
		free(bye->to);
		free(bye);
	}
	while (ri->peers) {
		struct rdma_peer *peer = ri->peers;

		ri->peers = peer->next;
		peers++;
		rdma_peer_free(peer);
	}
	while (ri->zombies) {
		struct rdma_peer *peer = ri->zombies;

		ri->zombies = peer->next;
		rdma_peer_free(peer);
	}
	for (uint32_t i = 0; i < ri->n_passive; i++) {
		ri->v->destroy_qp(ri->passive[i].qp);
		free(ri->passive[i].from);
	}
	free(ri->passive);
	ri->passive = NULL;
	ri->n_passive = ri->cap_passive = 0;
	if (peers || passive)
		rdma_log(ri, TE_PLUGIN_LOG_DEBUG, "fini released %u peer(s) and %u passive QP(s)",
			 peers, passive);
}
