/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_io.c: the data path: path choice, posting chains of work requests, reaping completions. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdma_priv.h"

#define RDMA_BUCKETS 16u /* distinct QPs one submit call chains work requests for */
#define RDMA_REAP_BATCH 64u
#define RDMA_ACK_EVERY 256u

/* --- completion statuses --------------------------------------------------------------------- */

enum te_status rdma_io_wc_status(enum ibv_wc_status st, enum rdma_fail_class *class_out)
{
	enum rdma_fail_class c;
	enum te_status t;

	switch (st) {
	case IBV_WC_SUCCESS:
		c = RDMA_FAIL_NONE;
		t = TE_OK;
		break;
	case IBV_WC_WR_FLUSH_ERR:
		/* Never executed: its QP was already in error. Any other QP may take it. */
		c = RDMA_FAIL_FLUSH;
		t = TE_ERR_TRANSIENT;
		break;
	case IBV_WC_REM_ACCESS_ERR:
		/* The peer's MR refused the range or the key: retrying cannot help. */
		c = RDMA_FAIL_REMOTE;
		t = TE_ERR_REMOTE_ACCESS;
		break;
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
		c = RDMA_FAIL_REMOTE;
		t = TE_ERR_PEER_REJECTED;
		break;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
		/* No answer from the peer's device: another remote device may answer. */
		c = RDMA_FAIL_REMOTE;
		t = TE_ERR_PATH_TIMEOUT;
		break;
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_BAD_RESP_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		c = RDMA_FAIL_REMOTE;
		t = TE_ERR_TRANSIENT;
		break;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_LOC_QP_OP_ERR:
	case IBV_WC_LOC_EEC_OP_ERR:
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_MW_BIND_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_LOC_RDD_VIOL_ERR:
	case IBV_WC_INV_EECN_ERR:
	case IBV_WC_INV_EEC_STATE_ERR:
	case IBV_WC_FATAL_ERR:
		/* The local device (or its registration) failed: another device may work. */
		c = RDMA_FAIL_LOCAL;
		t = TE_ERR_DEVICE_FAILED;
		break;
	case IBV_WC_GENERAL_ERR:
	default:
		c = RDMA_FAIL_LOCAL;
		t = TE_ERR_TRANSIENT;
		break;
	}
	if (class_out)
		*class_out = c;
	return t;
}

/* --- deferred reports ----------------------------------------------------------------------- */

void rdma_io_defer_fail(struct rdma_inst *ri, struct te_plugin_slice *s, enum te_status st,
			const char *detail)
{
	struct rdma_spriv *p = rdma_priv(s);

	p->status = st;
	snprintf(p->detail, sizeof(p->detail), "%s", detail);
	p->next = NULL;
	atomic_store_explicit(&p->slot, NULL, memory_order_relaxed);
	pthread_mutex_lock(&ri->defer_lock);
	if (ri->defer_tail)
		rdma_priv(ri->defer_tail)->next = s;
	else
		ri->defer_head = s;
	ri->defer_tail = s;
	atomic_fetch_add(&ri->n_defer, 1);
	pthread_mutex_unlock(&ri->defer_lock);
	/* seq_cst with the poller's asleep flag: either it sees n_defer or we see it asleep */
	if (atomic_load(&ri->poller_asleep))
		rdma_kick(ri->poll_kick_fd);
}

/*
 * Report up to @max deferred failures (never from submit: the core may not expect reentry
 * there); the rest stay queued, in order, for the next call.
 */
static uint32_t rdma_drain_defer(struct rdma_inst *ri, uint32_t max, enum te_status override,
				 const char *why)
{
	struct te_plugin_slice *s, *last = NULL;
	uint32_t n = 0;

	if (!max || !atomic_load_explicit(&ri->n_defer, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&ri->defer_lock);
	s = ri->defer_head;
	for (struct te_plugin_slice *t = s; t && n < max; t = rdma_priv(t)->next) {
		last = t;
		n++;
	}
	if (last) {
		ri->defer_head = rdma_priv(last)->next;
		rdma_priv(last)->next = NULL;
		if (!ri->defer_head)
			ri->defer_tail = NULL;
		atomic_fetch_sub(&ri->n_defer, n);
	}
	pthread_mutex_unlock(&ri->defer_lock);
	while (s) {
		struct rdma_spriv *p = rdma_priv(s);
		struct te_plugin_slice *next = p->next;

		ri->host->slice_done(ri->ctx, s, override ? override : (enum te_status)p->status, 0,
				     override ? why : p->detail);
		s = next;
	}
	return n;
}

/* --- path choice ------------------------------------------------------------------------------ */

static bool rdma_dev_usable(struct rdma_inst *ri, uint32_t l)
{
	return atomic_load_explicit(&ri->devs[l].up, memory_order_relaxed);
}

/* Reserve one send slot of @q and one CQ entry of its device. */
static bool rdma_reserve(struct rdma_inst *ri, struct rdma_qp *q)
{
	struct rdma_dev *d = &ri->devs[q->path->l];

	if (atomic_load_explicit(&q->state, memory_order_acquire) != RDMA_QP_READY)
		return false;
	if (atomic_fetch_sub_explicit(&q->credits, 1, memory_order_acq_rel) <= 0) {
		atomic_fetch_add_explicit(&q->credits, 1, memory_order_relaxed);
		return false;
	}
	/* Re-check after reserving: the control thread destroys a QP only with every credit back. */
	if (atomic_load_explicit(&q->state, memory_order_acquire) != RDMA_QP_READY) {
		/* Giving back the last credit of a QP in error hands it to the control thread. */
		if (atomic_fetch_add_explicit(&q->credits, 1, memory_order_acq_rel) + 1 ==
			    (int)q->depth &&
		    atomic_load(&q->state) == RDMA_QP_ERROR)
			rdma_conn_queue_path(ri, q->path);
		return false;
	}
	if (atomic_fetch_sub_explicit(&d->cq_credits, 1, memory_order_acq_rel) <= 0) {
		atomic_fetch_add_explicit(&d->cq_credits, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&q->credits, 1, memory_order_release);
		return false;
	}
	return true;
}

static void rdma_unreserve(struct rdma_inst *ri, struct rdma_qp *q, int n)
{
	atomic_fetch_add_explicit(&ri->devs[q->path->l].cq_credits, n, memory_order_relaxed);
	atomic_fetch_add_explicit(&q->credits, n, memory_order_release);
}

/* What a path can do for a new slice. */
enum rdma_path_try {
	RDMA_TRY_OK,	  /* reserved a slot: *q_out */
	RDMA_TRY_FULL,	  /* connected, every slot busy */
	RDMA_TRY_PENDING, /* being connected */
	RDMA_TRY_DOWN,	  /* not connected */
};

static enum rdma_path_try rdma_path_try(struct rdma_inst *ri, struct rdma_path *path,
					struct rdma_qp **q_out)
{
	uint32_t start = atomic_fetch_add_explicit(&path->rr, 1, memory_order_relaxed);
	enum rdma_path_try res = RDMA_TRY_DOWN;

	for (uint32_t i = 0; i < ri->qp_per_peer; i++) {
		struct rdma_qp *q = &path->qps[(start + i) % ri->qp_per_peer];
		int state = atomic_load_explicit(&q->state, memory_order_acquire);

		if (state == RDMA_QP_READY) {
			if (rdma_reserve(ri, q)) {
				*q_out = q;
				return RDMA_TRY_OK;
			}
			res = RDMA_TRY_FULL;
		} else if (state == RDMA_QP_CONNECTING && res == RDMA_TRY_DOWN) {
			res = RDMA_TRY_PENDING;
		}
	}
	return res;
}

/* Does the path have a QP the control thread could bring up (idle, or in error)? */
static bool rdma_path_has_idle(struct rdma_inst *ri, const struct rdma_path *path)
{
	for (uint32_t i = 0; i < ri->qp_per_peer; i++) {
		int state = atomic_load_explicit(&path->qps[i].state, memory_order_relaxed);

		if (state == RDMA_QP_IDLE || state == RDMA_QP_ERROR)
			return true;
	}
	return false;
}

/* Chunk of [off, off + len) in a region of @n chunks; false when it straddles two. */
static bool rdma_chunk(uint64_t off, uint64_t len, uint64_t total, uint64_t step,
		       uint64_t chunk_len, uint32_t n, uint32_t *c_out)
{
	uint64_t c = n > 1 ? off / step : 0, start, clen;

	if (c >= n)
		c = n - 1;
	start = c * step;
	clen = total - start < chunk_len ? total - start : chunk_len;
	*c_out = (uint32_t)c;
	return off >= start && len <= clen && off - start <= clen - len;
}

/*
 * Remote device for local device @l: the rail pair among the region's preferred devices,
 * else any device not excluded by @rexcl.
 */
static uint32_t rdma_remote_for(const struct rdma_rkey *k, uint32_t l, uint64_t rexcl)
{
	uint32_t n = k->n_pref;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t r = k->pref[(l + i) % n];

		if (!(rexcl & rdma_dev_bit(r)))
			return r;
	}
	for (uint32_t i = 0; i < k->n_rdev; i++) {
		uint32_t r = (l + i) % k->n_rdev;

		if (!(rexcl & rdma_dev_bit(r)))
			return r;
	}
	return k->pref[l % n];
}

/* Did a connect of @path fail within the backoff? Then its status and detail. */
static bool rdma_path_failed(struct rdma_inst *ri, struct rdma_path *path, enum te_status *st,
			     char *why, size_t wlen)
{
	bool failed = false;

	/* relaxed peek: most paths never failed */
	if (!atomic_load_explicit(&path->failed, memory_order_relaxed))
		return false;
	pthread_mutex_lock(&path->fail_lock);
	if (path->fail_status &&
	    ri->host->now_ns() - path->fail_ns < (uint64_t)ri->reconnect_backoff_ms * 1000000ull) {
		failed = true;
		if (*st == TE_OK) {
			*st = path->fail_status;
			snprintf(why, wlen, "%s", path->fail_detail);
		}
	}
	pthread_mutex_unlock(&path->fail_lock);
	return failed;
}

/* Ask the control thread to connect the idle QPs of @path. */
static void rdma_want_path(struct rdma_path *path)
{
	if (atomic_load_explicit(&path->want, memory_order_relaxed))
		return;
	atomic_store(&path->want, true);
	rdma_conn_queue_path(path->peer->ri, path);
}

/* The peer refused @k's key less than key_refused_hold_ms ago (rdma_rkey.refused_ns). */
static inline bool rdma_key_refused(struct rdma_inst *ri, const struct rdma_rkey *k)
{
	uint64_t at = atomic_load_explicit(&k->refused_ns, memory_order_relaxed);

	return at != 0 && ri->host->now_ns() - at < ri->key_refused_hold_ns;
}

/*
 * Choose a QP for @s and reserve a slot on it. TE_OK: *q_out; TE_ERR_AGAIN: back-pressure
 * (nothing reserved); another status: the slice fails with it (@why says why).
 */
static enum te_status rdma_route(struct rdma_inst *ri, struct te_plugin_slice *s,
				 struct rdma_spriv *p, struct rdma_qp **q_out, char *why,
				 size_t wlen)
{
	const struct rdma_mem *m = (const struct rdma_mem *)s->local_mem;
	const struct rdma_rkey *k = (const struct rdma_rkey *)s->rkey;
	struct rdma_peer *peer = (struct rdma_peer *)s->peer;
	uint64_t local = (uint64_t)(uintptr_t)s->local;
	uint64_t all = ri->n_devs >= 64 ? UINT64_MAX : rdma_dev_bit(ri->n_devs) - 1;
	uint64_t excl = s->excluded_devices & all, rexcl = p->rexcl;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;
	uint32_t order[RDMA_MAX_DEVS], n_order = 0, lc, rc, start;
	uint64_t seen = 0;
	bool pending = false;
	struct rdma_path *want = NULL;
	enum te_status fst = TE_OK;

	if (local < m->addr || s->length > m->length || local - m->addr > m->length - s->length ||
	    !rdma_chunk(local - m->addr, s->length, m->length, m->step, m->chunk_len, m->n_chunks,
			&lc)) {
		snprintf(why, wlen,
			 RDMA_NAME ": local range [%p, +%" PRIu64 ") is outside its registration",
			 s->local, s->length);
		return TE_ERR_OUT_OF_RANGE;
	}
	if (rdma_key_refused(ri, k)) {
		snprintf(why, wlen,
			 RDMA_NAME
			 ": the peer refused the remote key of [0x%" PRIx64 ", +%" PRIu64
			 ") for an earlier request: it unregistered the buffer, or "
			 "registered it again under new keys (the next submit fetches its "
			 "descriptor again)",
			 k->addr, k->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	if (s->remote < k->addr || s->length > k->length ||
	    s->remote - k->addr > k->length - s->length || !(k->access & need)) {
		snprintf(why, wlen,
			 RDMA_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
				   ") is not inside the remote-%s buffer [0x%" PRIx64 ", +%" PRIu64
				   ")",
			 s->remote, s->length,
			 need == TE_PLUGIN_ACCESS_REMOTE_READ ? "readable" : "writable", k->addr,
			 k->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	if (!rdma_chunk(s->remote - k->addr, s->length, k->length, k->step, k->chunk_len,
			k->n_chunks, &rc)) {
		snprintf(why, wlen,
			 RDMA_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
				   ") straddles two of the peer's memory regions (its max MR size "
				   "is below this slice size)",
			 s->remote, s->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	if ((rexcl & (rdma_dev_bit(peer->n_rdev) - 1)) == rdma_dev_bit(peer->n_rdev) - 1)
		rexcl = 0;
	/* Devices a side could not register the region on (fatal at the time) are out. */
	rexcl |= ~k->valid_mask;
	if (!(k->valid_mask & ~rexcl)) {
		snprintf(why, wlen,
			 RDMA_NAME ": no device of %s holds a key for [0x%" PRIx64 ", +%" PRIu64
				   ")",
			 peer->name, k->addr, k->length);
		return TE_ERR_REMOTE_ACCESS;
	}

	/* Local devices to try: the chosen one, the region's preferred ones, then the rest. */
	if (p->chosen && p->l < ri->n_devs) {
		order[n_order++] = p->l;
		seen |= rdma_dev_bit(p->l);
	}
	start = atomic_fetch_add_explicit(&((struct rdma_mem *)m)->rr, 1, memory_order_relaxed);
	for (uint32_t i = 0; i < m->n_pref; i++) {
		uint32_t l = m->pref[(start + i) % m->n_pref];

		if (!(seen & rdma_dev_bit(l))) {
			order[n_order++] = l;
			seen |= rdma_dev_bit(l);
		}
	}
	for (uint32_t l = 0; l < ri->n_devs; l++) {
		if (!(seen & rdma_dev_bit(l))) {
			order[n_order++] = l;
			seen |= rdma_dev_bit(l);
		}
	}
	for (int pass = 0; pass < 2; pass++) {
		/* Pass 0 honours the core's exclusions; pass 1 ignores them (all else failed). */
		for (uint32_t i = 0; i < n_order; i++) {
			uint32_t l = order[i], r0;

			if (!rdma_dev_usable(ri, l) || !(m->valid_mask & rdma_dev_bit(l)) ||
			    (!pass && (excl & rdma_dev_bit(l))))
				continue;
			/*
			 * The rail pair first, then the peer's other devices: connected ones take
			 * the overflow; one is connected only when none before it is usable.
			 */
			bool has_path = false;

			r0 = rdma_remote_for(k, l, rexcl);
			for (uint32_t j = 0; j < peer->n_rdev; j++) {
				uint32_t r = (r0 + j) % peer->n_rdev;
				struct rdma_path *path = peer->paths[l * peer->n_rdev + r];
				enum rdma_path_try t;

				if (j && (rexcl & rdma_dev_bit(r)))
					continue;
				if (rdma_path_failed(ri, path, &fst, why, wlen))
					continue; /* a recent connect failed: another path may do */
				t = rdma_path_try(ri, path, q_out);
				if (t == RDMA_TRY_OK)
					goto chosen;
				if (t == RDMA_TRY_FULL || t == RDMA_TRY_PENDING) {
					pending = has_path = true;
				} else if (!has_path && !want && rdma_path_has_idle(ri, path)) {
					want = path;
					has_path = true;
				}
			}
		}
		if (pending || want)
			break;
	}
	if (want) {
		/* Connect it from the control thread; the core resubmits meanwhile. */
		rdma_want_path(want);
		return TE_ERR_AGAIN;
	}
	if (pending)
		return TE_ERR_AGAIN;
	if (fst != TE_OK)
		return fst; /* every path to the peer failed to connect just now */
	snprintf(why, wlen, RDMA_NAME ": no local device is up (%u devices)", ri->n_devs);
	return TE_ERR_LINK_DOWN;

chosen:
	/* Bring a preferred path that broke back (striping resumes once it is up). */
	if (want)
		rdma_want_path(want);
	p->l = (uint8_t)(*q_out)->path->l;
	p->r = (uint8_t)(*q_out)->path->r;
	p->lkey = m->lkeys[p->l * m->n_chunks + lc];
	p->rkey = k->keys[p->r * k->n_chunks + rc];
	return TE_OK;
}

/* --- posting ------------------------------------------------------------------------------ */

struct rdma_bucket {
	struct rdma_qp *q;
	struct te_plugin_slice *head, *tail;
	uint32_t n;
};

static void rdma_fault_apply(struct rdma_inst *ri, struct ibv_send_wr *wr, uint64_t remote_end)
{
	uint64_t n = atomic_fetch_add_explicit(&ri->wr_count, 1, memory_order_relaxed) + 1;

	if (n != ri->fault_nth)
		return;
	if (ri->fault == RDMA_FAULT_RKEY) {
		wr->wr.rdma.rkey ^= 0x5a5a5a5au;
	} else {
		/* Just past the end of the remote registration: a remote access error. */
		wr->wr.rdma.remote_addr = (remote_end + 4095) & ~4095ull;
		wr->wr.rdma.remote_addr += 4096;
	}
	rdma_log(ri, TE_PLUGIN_LOG_WARN, "test_fault: work request %" PRIu64 " corrupted (%s)", n,
		 ri->fault == RDMA_FAULT_RKEY ? "rkey" : "remote address outside the MR");
}

/*
 * Ring the doorbell for the filled slots [base, base + n) of @q (under q->lock): chains of at
 * most post_batch work requests per ibv_post_send. What could not be posted is rolled back
 * (it is the tail of the ring) and its slices fail with a retryable status.
 */
static void rdma_doorbell_locked(struct rdma_inst *ri, struct rdma_qp *q, uint64_t base, uint32_t n)
{
	struct ibv_send_wr *bad = NULL;
	uint32_t posted;
	int rc = q->qp ? 0 : ENOTCONN;

	for (posted = 0; !rc && posted < n;) {
		uint32_t k = n - posted < ri->post_batch ? n - posted : ri->post_batch;
		struct rdma_slot *last = &q->slots[(base + posted + k - 1) % q->depth];
		struct ibv_send_wr *next = last->wr.next;

		last->wr.next = NULL;
		rc = ri->v->post_send(q->qp, &q->slots[(base + posted) % q->depth].wr, &bad);
		last->wr.next = next;
		if (!rc) {
			posted += k;
			continue;
		}
		for (struct ibv_send_wr *w = &q->slots[(base + posted) % q->depth].wr;
		     bad && w && w != bad; w = w->next)
			posted++;
	}
	if (!rc)
		return;
	q->head = base + posted;
	for (uint32_t i = posted; i < n; i++) {
		struct rdma_slot *slot = &q->slots[(base + i) % q->depth];
		struct te_plugin_slice *f = slot->slice;
		char why[RDMA_DETAIL];

		slot->slice = NULL;
		snprintf(why, sizeof(why), RDMA_NAME ": ibv_post_send on %s (QP 0x%x): %s",
			 ri->devs[q->path->l].name, q->qpn, strerror(rc));
		rdma_io_defer_fail(ri, f, rc == ENOMEM ? TE_ERR_AGAIN : TE_ERR_DEVICE_FAILED, why);
	}
	rdma_unreserve(ri, q, (int)(n - posted));
	atomic_fetch_sub_explicit(&ri->inflight, n - posted, memory_order_relaxed);
	rdma_log(ri, TE_PLUGIN_LOG_WARN, "ibv_post_send on %s: %s (%u of %u posted)",
		 ri->devs[q->path->l].name, strerror(rc), posted, n);
}

/*
 * Fill a bucket's slots as one chain, then ring the doorbell now (doorbell: submitter) or
 * leave it to the poller (doorbell: poller), which posts everything queued on a QP at once.
 */
static void rdma_post(struct rdma_inst *ri, struct rdma_bucket *b)
{
	struct rdma_qp *q = b->q;
	struct te_plugin_slice *s = b->head;
	struct rdma_slot *prev;
	bool queue = false;
	uint64_t base;

	atomic_fetch_add_explicit(&ri->inflight, b->n, memory_order_relaxed);
	pthread_mutex_lock(&q->lock);
	base = q->head;
	/* Chain behind what is already waiting for the poller. */
	prev = q->pend_n ? &q->slots[(base - 1) % q->depth] : NULL;
	for (uint32_t i = 0; i < b->n; i++) {
		struct rdma_spriv *p = rdma_priv(s);
		struct rdma_slot *slot = &q->slots[q->head++ % q->depth];
		struct ibv_send_wr *wr = &slot->wr;

		slot->slice = s;
		wr->next = NULL;
		wr->opcode = s->opcode == TE_PLUGIN_OP_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		wr->wr.rdma.remote_addr = s->remote;
		wr->wr.rdma.rkey = p->rkey;
		/*
		 * Never IBV_SEND_INLINE (the CPU would read the source): s->local may be GPU
		 * memory registered through a dmabuf, which only the NIC may touch.
		 */
		slot->sge.addr = (uint64_t)(uintptr_t)s->local;
		slot->sge.length = (uint32_t)s->length;
		slot->sge.lkey = p->lkey;
		if (ri->fault)
			rdma_fault_apply(ri, wr,
					 ((const struct rdma_rkey *)s->rkey)->addr +
						 ((const struct rdma_rkey *)s->rkey)->length);
		s->device = p->l;
		atomic_store_explicit(&p->slot, slot, memory_order_release);
		if (prev)
			prev->wr.next = wr;
		prev = slot;
		s = p->next;
	}
	if (!ri->poller_posts) {
		/* From here a posted slice may complete on another thread: only slots are read. */
		rdma_doorbell_locked(ri, q, base, b->n);
	} else {
		if (!q->pend_n)
			q->pend_base = base;
		q->pend_n += b->n;
		queue = !atomic_exchange(&q->post_queued, true);
	}
	pthread_mutex_unlock(&q->lock);
	if (queue) {
		struct rdma_dev *d = &ri->devs[q->path->l];

		pthread_mutex_lock(&d->post_lock);
		q->post_next = atomic_load_explicit(&d->post_head, memory_order_relaxed);
		atomic_store_explicit(&d->post_head, q, memory_order_release);
		pthread_mutex_unlock(&d->post_lock);
		/* seq_cst with the poller's asleep flag (rdma_poller_sleep) */
		if (atomic_load(&ri->poller_asleep))
			rdma_kick(ri->poll_kick_fd);
	}
}

uint32_t rdma_io_post_queued(struct rdma_inst *ri)
{
	uint32_t total = 0;

	for (uint32_t i = 0; i < ri->n_devs; i++) {
		struct rdma_dev *d = &ri->devs[i];
		struct rdma_qp *q;

		/* relaxed peek: a miss is caught on the next round (or by the kick) */
		if (!atomic_load_explicit(&d->post_head, memory_order_relaxed))
			continue;
		pthread_mutex_lock(&d->post_lock);
		q = atomic_exchange_explicit(&d->post_head, NULL, memory_order_acquire);
		pthread_mutex_unlock(&d->post_lock);
		while (q) {
			struct rdma_qp *next = q->post_next;

			pthread_mutex_lock(&q->lock);
			atomic_store(&q->post_queued, false);
			if (q->pend_n) {
				total += q->pend_n;
				rdma_doorbell_locked(ri, q, q->pend_base, q->pend_n);
				q->pend_n = 0;
			}
			pthread_mutex_unlock(&q->lock);
			q = next;
		}
	}
	return total;
}

static void rdma_flush_buckets(struct rdma_inst *ri, struct rdma_bucket *b, uint32_t *nb)
{
	for (uint32_t i = 0; i < *nb; i++)
		rdma_post(ri, &b[i]);
	*nb = 0;
}

static void rdma_priv_init(struct rdma_inst *ri, struct te_plugin_slice *s)
{
	struct rdma_spriv *p = rdma_priv(s);

	p->tag = ri->tag ^ (uint64_t)(uintptr_t)s;
	p->attempt = s->attempt;
	p->rexcl = 0;
	p->chosen = 0;
	p->fail_class = RDMA_FAIL_NONE;
	p->l = p->r = 0;
	atomic_store_explicit(&p->slot, NULL, memory_order_relaxed);
}

static bool rdma_priv_ours(struct rdma_inst *ri, const struct te_plugin_slice *s)
{
	return rdma_priv(s)->tag == (ri->tag ^ (uint64_t)(uintptr_t)s);
}

enum te_status rdma_io_submit(struct rdma_inst *ri, struct te_plugin_slice **slices, uint32_t n,
			      uint32_t *accepted_out)
{
	struct rdma_bucket b[RDMA_BUCKETS];
	uint32_t nb = 0, i;
	enum te_status ret = TE_OK;

	if (atomic_load_explicit(&ri->stopping, memory_order_relaxed))
		return TE_ERR_SHUTDOWN;
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		struct rdma_spriv *p;
		struct rdma_qp *q = NULL;
		char why[RDMA_DETAIL];
		enum te_status st;
		uint32_t k;

		if (!s || !s->priv || !s->peer || !s->local_mem || !s->rkey || !s->local ||
		    !s->length || s->length > ri->overlap ||
		    (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)) {
			rdma_log(ri, TE_PLUGIN_LOG_ERROR, "submit: malformed slice %u of %u", i, n);
			ret = TE_ERR_INVALID_ARG;
			break;
		}
		p = rdma_priv(s);
		/* Scratch carried over from retry_prepare, else (first attempt, fallback) fresh. */
		if (s->attempt == 0 || !rdma_priv_ours(ri, s) || p->attempt != s->attempt)
			rdma_priv_init(ri, s);
		st = rdma_route(ri, s, p, &q, why, sizeof(why));
		if (st == TE_ERR_AGAIN)
			break; /* back-pressure: the core resubmits the rest after progress */
		if (st != TE_OK) {
			rdma_io_defer_fail(ri, s, st, why);
			continue;
		}
		for (k = 0; k < nb && b[k].q != q; k++)
			;
		if (k == nb) {
			if (nb == RDMA_BUCKETS)
				rdma_flush_buckets(ri, b, &nb);
			k = nb++;
			b[k].q = q;
			b[k].head = b[k].tail = NULL;
			b[k].n = 0;
		}
		p->next = NULL;
		if (b[k].tail)
			rdma_priv(b[k].tail)->next = s;
		else
			b[k].head = s;
		b[k].tail = s;
		b[k].n++;
	}
	rdma_flush_buckets(ri, b, &nb);
	*accepted_out = i;
	return ret;
}

/* --- completions ------------------------------------------------------------------------------ */

static const char *rdma_op_text(const struct ibv_wc *wc, const struct te_plugin_slice *s)
{
	(void)wc;
	return s->opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE";
}

/*
 * Account for one completion and leave its outcome in the slice's priv. Returns the slice to
 * report (NULL for a completion nobody owns, which is a bug and is logged).
 */
static struct te_plugin_slice *rdma_complete(struct rdma_inst *ri, const struct ibv_wc *wc)
{
	struct rdma_slot *slot = (struct rdma_slot *)(uintptr_t)wc->wr_id;
	struct rdma_qp *q = slot ? slot->qp : NULL;
	struct te_plugin_slice *s = slot ? slot->slice : NULL;
	struct rdma_path *path;
	struct rdma_peer *peer;
	struct rdma_spriv *p;
	int old;

	if (!s || !q) {
		rdma_log(ri, TE_PLUGIN_LOG_ERROR, "completion (%s) for no work request (bug)",
			 ibv_wc_status_str(wc->status));
		return NULL;
	}
	if (slot != &q->slots[q->tail % q->depth])
		rdma_log(ri, TE_PLUGIN_LOG_ERROR, "QP 0x%x completed out of order (bug)", q->qpn);
	path = q->path;
	peer = path->peer;
	p = rdma_priv(s);
	slot->slice = NULL;
	q->tail++;
	atomic_store_explicit(&p->slot, NULL, memory_order_relaxed);
	if (wc->status == IBV_WC_SUCCESS) {
		p->status = TE_OK;
	} else {
		enum rdma_fail_class cls;
		enum te_status st = rdma_io_wc_status(wc->status, &cls);
		int ready = RDMA_QP_READY;
		bool first = atomic_compare_exchange_strong(&q->state, &ready, RDMA_QP_ERROR);

		/* As posted (not altered by test_fault), the request was inside its key's region. */
		if (wc->status == IBV_WC_REM_ACCESS_ERR && ri->key_refused_hold_ns &&
		    slot->wr.wr.rdma.rkey == p->rkey && slot->wr.wr.rdma.remote_addr == s->remote) {
			uint64_t now = ri->host->now_ns();

			atomic_store_explicit(&((struct rdma_rkey *)s->rkey)->refused_ns,
					      now ? now : 1, memory_order_relaxed);
		}
		if (first) {
			snprintf(q->err, sizeof(q->err), "%s (vendor error 0x%x)",
				 ibv_wc_status_str(wc->status), wc->vendor_err);
			rdma_log(ri, TE_PLUGIN_LOG_INFO,
				 "path %s -> %s/%s: QP 0x%x in error after %s %" PRIu64 " B: %s",
				 ri->devs[path->l].name, peer->name, peer->rdev[path->r].name,
				 q->qpn, rdma_op_text(wc, s), s->length, q->err);
		}
		if (wc->status == IBV_WC_WR_FLUSH_ERR &&
		    rdma_key_refused(ri, (const struct rdma_rkey *)s->rkey)) {
			/* Not executed, and it would be refused: retrying it only breaks a QP. */
			st = TE_ERR_REMOTE_ACCESS;
			cls = RDMA_FAIL_REMOTE;
			snprintf(p->detail, sizeof(p->detail),
				 RDMA_NAME
				 ": %s %" PRIu64 " B %s -> %s/%s (QP 0x%x): not executed; "
				 "the peer refused this region's remote key 0x%x for another "
				 "request (unregistered, or registered again)",
				 rdma_op_text(wc, s), s->length, ri->devs[path->l].name, peer->name,
				 peer->rdev[path->r].name, q->qpn, p->rkey);
		} else if (wc->status == IBV_WC_WR_FLUSH_ERR && !first) {
			int ev = atomic_load(&q->err_event);

			snprintf(p->detail, sizeof(p->detail),
				 RDMA_NAME ": %s %" PRIu64 " B %s -> %s/%s (QP 0x%x): %s after %s",
				 rdma_op_text(wc, s), s->length, ri->devs[path->l].name, peer->name,
				 peer->rdev[path->r].name, q->qpn, ibv_wc_status_str(wc->status),
				 ev == RDMA_ERR_CANCELED ? "a cancel stopped the QP"
				 : ev > 0 ? ibv_event_type_str((enum ibv_event_type)(ev - 1))
					  : q->err);
		} else {
			snprintf(p->detail, sizeof(p->detail),
				 RDMA_NAME ": %s %" PRIu64 " B %s -> %s/%s (QP 0x%x): %s "
					   "(status %d, vendor error 0x%x)",
				 rdma_op_text(wc, s), s->length, ri->devs[path->l].name, peer->name,
				 peer->rdev[path->r].name, q->qpn, ibv_wc_status_str(wc->status),
				 (int)wc->status, wc->vendor_err);
		}
		p->status = st;
		p->fail_class = (uint8_t)cls;
	}
	/*
	 * The last reaped request of a QP in error hands the QP to the control thread; after the
	 * credit below, nothing of the peer may be touched (it may be freed).
	 */
	old = atomic_load_explicit(&q->credits, memory_order_relaxed);
	if (atomic_load(&q->state) == RDMA_QP_ERROR && old == (int)q->depth - 1)
		rdma_conn_queue_path(ri, path);
	atomic_fetch_sub_explicit(&ri->inflight, 1, memory_order_relaxed);
	rdma_unreserve(ri, q, 1);
	return s;
}

/* Reap up to @budget completions of @d; report them after releasing the poll lock. */
static uint32_t rdma_reap(struct rdma_inst *ri, struct rdma_dev *d, uint32_t budget)
{
	struct te_plugin_slice *done[RDMA_REAP_BATCH];
	struct ibv_wc wc[RDMA_REAP_BATCH];
	uint32_t n_done = 0;
	int n;

	if (budget > RDMA_REAP_BATCH)
		budget = RDMA_REAP_BATCH;
	if (pthread_mutex_trylock(&d->poll_lock))
		return 0;
	n = ri->v->poll_cq(d->cq, (int)budget, wc);
	for (int i = 0; i < n; i++) {
		struct te_plugin_slice *s = rdma_complete(ri, &wc[i]);

		if (s)
			done[n_done++] = s;
	}
	pthread_mutex_unlock(&d->poll_lock);
	if (n < 0)
		rdma_log(ri, TE_PLUGIN_LOG_ERROR, "%s: ibv_poll_cq: %s", d->name, strerror(-n));
	for (uint32_t i = 0; i < n_done; i++) {
		struct te_plugin_slice *s = done[i];
		struct rdma_spriv *p = rdma_priv(s);

		if (p->status == TE_OK)
			ri->host->slice_done(ri->ctx, s, TE_OK, s->length, NULL);
		else
			ri->host->slice_done(ri->ctx, s, (enum te_status)p->status, 0, p->detail);
	}
	return n > 0 ? (uint32_t)n : 0;
}

static uint32_t rdma_reap_all(struct rdma_inst *ri, uint32_t budget)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < ri->n_devs && n < budget; i++)
		n += rdma_reap(ri, &ri->devs[i], budget - n);
	return n;
}

/* MANUAL: at most @budget reports in all, completions first, then deferred failures. */
uint32_t rdma_io_progress(struct rdma_inst *ri, uint32_t budget)
{
	uint32_t n = rdma_reap_all(ri, budget);

	return n + rdma_drain_defer(ri, budget - n, TE_OK, NULL);
}

/* Arm every CQ, then wait in poll() for a completion event or a kick. */
static void rdma_poller_sleep(struct rdma_inst *ri)
{
	struct pollfd fds[RDMA_MAX_DEVS + 1];
	uint32_t n = 0;
	uint64_t junk;

	for (uint32_t i = 0; i < ri->n_devs; i++)
		ri->v->req_notify_cq(ri->devs[i].cq, 0);
	atomic_store(&ri->poller_asleep, true);
	/* Work queued, or a completion, between the last poll and arming: do not sleep. */
	if (rdma_io_post_queued(ri) || rdma_reap_all(ri, RDMA_REAP_BATCH) ||
	    rdma_drain_defer(ri, UINT32_MAX, TE_OK, NULL) || atomic_load(&ri->stopping)) {
		atomic_store(&ri->poller_asleep, false);
		return;
	}
	fds[n].fd = ri->poll_kick_fd;
	fds[n++].events = POLLIN;
	for (uint32_t i = 0; i < ri->n_devs; i++) {
		fds[n].fd = ri->devs[i].chan->fd;
		fds[n++].events = POLLIN;
	}
	(void)poll(fds, n, 1000);
	atomic_store(&ri->poller_asleep, false);
	if (read(ri->poll_kick_fd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
		(void)0;
	for (uint32_t i = 0; i < ri->n_devs; i++) {
		struct rdma_dev *d = &ri->devs[i];
		struct ibv_cq *cq;
		void *ctx;

		while (ri->v->get_cq_event(d->chan, &cq, &ctx) == 0)
			d->unacked_events++;
		if (d->unacked_events >= RDMA_ACK_EVERY) {
			ri->v->ack_cq_events(d->cq, d->unacked_events);
			d->unacked_events = 0;
		}
	}
}

void *rdma_io_poller(void *arg)
{
	struct rdma_inst *ri = arg;
	uint64_t last = ri->host->now_ns(), nap_ns = 0;
	uint32_t idle = 0;
	bool worked = false;

	while (!atomic_load_explicit(&ri->stopping, memory_order_relaxed)) {
		uint64_t now;

		if (rdma_io_post_queued(ri) + rdma_reap_all(ri, RDMA_REAP_BATCH) +
		    rdma_drain_defer(ri, UINT32_MAX, TE_OK, NULL)) {
			worked = true;
			idle = 0;
			nap_ns = 0;
			continue;
		}
		if (++idle % 32)
			continue;
		now = ri->host->now_ns();
		if (worked) {
			last = now;
			worked = false;
			continue;
		}
		/* Busy-poll for poll_spin_us after the last completion (lowest latency). */
		if (now - last < ri->spin_ns)
			continue;
		if (atomic_load_explicit(&ri->inflight, memory_order_relaxed) > 0) {
			/*
			 * Work in flight but quiet: naps growing to poll_nap_us instead of
			 * spinning (or arming the CQ, which costs a wake-up per event). A host
			 * CPU is left to the transport; soft-RoCE moves the bytes on the CPUs
			 * of the posting threads.
			 */
			struct pollfd pfd = { .fd = ri->poll_kick_fd, .events = POLLIN };
			struct timespec ts;
			uint64_t junk;

			nap_ns = nap_ns ? nap_ns * 2 : 16000;
			if (nap_ns > ri->nap_ns)
				nap_ns = ri->nap_ns;
			if (!nap_ns)
				continue;
			ts.tv_sec = 0;
			ts.tv_nsec = (long)nap_ns;
			/* A submitter that queues work for the poller cuts the nap short. */
			atomic_store(&ri->poller_asleep, true);
			if (!rdma_io_post_queued(ri) && ppoll(&pfd, 1, &ts, NULL) > 0 &&
			    read(ri->poll_kick_fd, &junk, sizeof(junk)) < 0)
				(void)0;
			atomic_store(&ri->poller_asleep, false);
			continue;
		}
		/* Nothing in flight: sleep until a completion event or a kick. */
		rdma_poller_sleep(ri);
		last = ri->host->now_ns();
		idle = 0;
		nap_ns = 0;
	}
	return NULL;
}

/* --- cancel, retry -------------------------------------------------------------------------- */

enum te_status rdma_io_cancel(struct rdma_inst *ri, struct te_plugin_slice *s)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	struct rdma_spriv *p;
	struct rdma_slot *slot;
	struct rdma_qp *q;
	int ready = RDMA_QP_READY;
	bool first;

	/* Deferred failures (no slot) are about to be reported: nothing to take back. */
	if (!s->priv || !rdma_priv_ours(ri, s))
		return TE_ERR_NOT_FOUND;
	p = rdma_priv(s);
	slot = atomic_load_explicit(&p->slot, memory_order_acquire);
	if (!slot)
		return TE_ERR_NOT_FOUND;
	/*
	 * A posted work request cannot be recalled, but its QP can be stopped: in the error
	 * state it sends no further packet and flushes every request it holds, this one
	 * included, and the slice is reported from that flush completion, after the transition.
	 * The QP's other requests fail as flushed and the core retries them on another QP;
	 * once drained, the control thread destroys it and the next demand connects a fresh one.
	 * A slot and its QP live as long as their peer, which the core holds while it cancels.
	 */
	q = slot->qp;
	pthread_mutex_lock(&q->lock);
	/* Still posted there (a request is reaped without this lock; a late cancel is harmless) */
	if (atomic_load_explicit(&p->slot, memory_order_acquire) != slot) {
		pthread_mutex_unlock(&q->lock);
		return TE_ERR_NOT_FOUND;
	}
	first = atomic_compare_exchange_strong(&q->state, &ready, RDMA_QP_ERROR);
	/*
	 * Logged before the transition: its flush completion may be reaped and the task
	 * reported at once, and whoever then reads the log must find the line.
	 */
	if (first) {
		atomic_store(&q->err_event, RDMA_ERR_CANCELED);
		rdma_log(ri, TE_PLUGIN_LOG_INFO,
			 "path %s -> %s/%s: QP 0x%x moved to error to take back a canceled %s of "
			 "%" PRIu64 " B (its other requests are retried)",
			 ri->devs[q->path->l].name, q->path->peer->name,
			 q->path->peer->rdev[q->path->r].name, q->qpn,
			 s->opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE", s->length);
	}
	if (q->qp)
		ri->v->modify_qp(q->qp, &a, IBV_QP_STATE);
	pthread_mutex_unlock(&q->lock);
	return TE_OK;
}

enum te_status rdma_io_retry_prepare(struct rdma_inst *ri, struct te_plugin_slice *s)
{
	struct rdma_spriv *p = rdma_priv(s);
	const struct rdma_mem *m = (const struct rdma_mem *)s->local_mem;
	uint64_t all = ri->n_devs >= 64 ? UINT64_MAX : rdma_dev_bit(ri->n_devs) - 1;
	uint64_t excl = s->excluded_devices & all;
	int best = -1, score = -1;

	if (!rdma_priv_ours(ri, s) || p->attempt + 1 != s->attempt) {
		rdma_priv_init(ri, s); /* first attempt on this transport (fallback) */
	} else if (p->fail_class == RDMA_FAIL_REMOTE) {
		p->rexcl |= rdma_dev_bit(p->r);
	}
	p->attempt = s->attempt;
	p->fail_class = RDMA_FAIL_NONE;
	/* Usable and not excluded, preferring the region's devices; else any usable one. */
	for (uint32_t l = 0; l < ri->n_devs; l++) {
		int sc;

		if (!rdma_dev_usable(ri, l))
			continue;
		sc = (excl & rdma_dev_bit(l) ? 0 : 4) +
		     (m && (m->pref_mask & rdma_dev_bit(l)) ? 2 : 0) + (l != p->l ? 1 : 0);
		if (sc > score) {
			score = sc;
			best = (int)l;
		}
	}
	if (best < 0)
		return TE_ERR_NO_DEVICE;
	p->l = (uint8_t)best;
	p->chosen = 1;
	s->device = (uint32_t)best;
	return TE_OK;
}

/* --- shutdown ------------------------------------------------------------------------------- */

void rdma_io_drain(struct rdma_inst *ri, uint64_t wait_ns)
{
	uint64_t end = ri->host->now_ns() + wait_ns;
	struct ibv_wc wc[RDMA_REAP_BATCH];

	/* Post what the stopped poller left queued: the flush below completes it. */
	rdma_io_post_queued(ri);
	/* Flush what is posted: every QP to the error state. */
	for (int list = 0; list < 2; list++) {
		for (struct rdma_peer *peer = list ? ri->zombies : ri->peers; peer;
		     peer = peer->next) {
			for (uint32_t i = 0; i < ri->n_devs * peer->n_rdev; i++) {
				for (uint32_t k = 0; k < ri->qp_per_peer; k++) {
					struct rdma_qp *q = &peer->paths[i]->qps[k];
					struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

					if (q->qp)
						ri->v->modify_qp(q->qp, &a, IBV_QP_STATE);
					atomic_store(&q->state,
						     q->qp ? RDMA_QP_ERROR : RDMA_QP_IDLE);
				}
			}
		}
	}
	while (atomic_load(&ri->inflight) > 0 && ri->host->now_ns() < end) {
		bool any = false;

		for (uint32_t d = 0; d < ri->n_devs; d++) {
			int n = ri->v->poll_cq(ri->devs[d].cq, RDMA_REAP_BATCH, wc);

			for (int i = 0; i < n; i++) {
				struct te_plugin_slice *s = rdma_complete(ri, &wc[i]);

				if (s)
					ri->host->slice_done(ri->ctx, s, TE_ERR_CANCELED, 0,
							     RDMA_NAME ": instance shut down");
			}
			any |= n > 0;
		}
		if (!any)
			usleep(1000);
	}
	if (atomic_load(&ri->inflight) > 0)
		rdma_log(ri, TE_PLUGIN_LOG_ERROR,
			 "%lld work request(s) never completed at shutdown; their slices are lost",
			 (long long)atomic_load(&ri->inflight));
	rdma_drain_defer(ri, UINT32_MAX, TE_ERR_CANCELED, RDMA_NAME ": instance shut down");
}
