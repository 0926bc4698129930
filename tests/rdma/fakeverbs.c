/* SPDX-License-Identifier: Apache-2.0 */
/* fakeverbs.c: a software RDMA fabric behind the rdma plugin's verbs table, for unit tests. */
#include "fakeverbs.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rdma_verbs.h"

#define FV_MAX_DEVS 16
#define FV_EVQ 64
#define FV_MAX_FAIL 16

struct fv_dev {
	struct ibv_device ibdev;
	char name[64];
	uint32_t index;
	struct fakeverbs_dev_opts o;
	bool up, fatal;
	uint64_t fail_nth[FV_MAX_FAIL];
	enum ibv_wc_status fail_st[FV_MAX_FAIL];
	uint32_t n_fail;
	uint64_t posted, executed, posts;
	uint64_t flushed_queued; /* requests a modify_qp(ERR) flushed before they ran */
	uint32_t qps_created, qps_live, mrs_live;
	uint32_t dmabuf_mrs, dmabuf_mrs_live;
	uint32_t qps_errored; /* modify_qp(ERR) calls on a QP not yet in error */
	int last_mtu, last_sgid;
};

struct fv_ctx {
	struct ibv_context ctx;
	struct fv_dev *dev;
	struct ibv_async_event evq[FV_EVQ];
	uint32_t ev_head, ev_n;
	struct fv_ctx *next;
};

struct fv_chan {
	struct ibv_comp_channel ch;
	struct ibv_cq *pending[64];
	uint32_t n_pending;
};

struct fv_cq {
	struct ibv_cq cq;
	struct ibv_wc *ring;
	uint32_t cap, head, n;
	bool armed;
	struct fv_chan *chan;
};

struct fv_mr {
	struct ibv_mr mr; /* mr.addr: the iova work requests use */
	int access;
	uint8_t *bytes; /* where the bytes at mr.addr are: mr.addr itself, or in map */
	void *map;	/* dmabuf MR: the mapping of its fd, until dereg_mr */
	size_t map_len;
	struct fv_mr *next;
};

struct fv_qp {
	struct ibv_qp qp;
	struct fv_dev *dev;
	struct fv_ctx *fc;
	enum ibv_qp_state st;
	uint32_t rqpn;
	int access;
	uint32_t max_wr, queued;
	struct fv_qp *next;
};

struct fv_wr {
	struct fv_qp *qp;
	uint64_t wr_id;
	enum ibv_wr_opcode op;
	uint64_t laddr, raddr;
	uint32_t len, lkey, rkey;
	bool forced;
	enum ibv_wc_status forced_st;
	struct fv_wr *next;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond; /* work queued or hold released */
	pthread_cond_t idle; /* queue empty */
	bool started, hold;
	struct fv_dev devs[FV_MAX_DEVS];
	uint32_t n_devs;
	struct fv_ctx *ctxs;
	struct fv_mr *mrs;
	struct fv_qp *qps;
	struct fv_wr *head, *tail;
	uint32_t next_qpn, next_key;
	int call_err[FAKEVERBS_N_CALLS];
	uint32_t call_count[FAKEVERBS_N_CALLS];
	uint32_t call_skip[FAKEVERBS_N_CALLS];
} fv = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
	.idle = PTHREAD_COND_INITIALIZER,
	.next_qpn = 0x100,
	.next_key = 0x1000,
};

#define FV_OF(type, ptr, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static void fv_die(const char *what)
{
	fprintf(stderr, "fakeverbs: %s\n", what);
	abort();
}

static struct fv_dev *fv_find(const char *name)
{
	for (uint32_t i = 0; i < fv.n_devs; i++)
		if (!strcmp(fv.devs[i].name, name))
			return &fv.devs[i];
	fv_die("no such device");
	return NULL;
}

/* Under lock: does the next call of @c fail? Sets errno and returns it. */
static int fv_fault(enum fakeverbs_call c)
{
	if (!fv.call_count[c])
		return 0;
	if (fv.call_skip[c]) {
		fv.call_skip[c]--;
		return 0;
	}
	fv.call_count[c]--;
	errno = fv.call_err[c];
	return fv.call_err[c];
}

static void fv_signal(int fd)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) < 0)
		(void)0;
}

static void fv_drain_fd(int fd)
{
	uint64_t v;

	if (read(fd, &v, sizeof(v)) < 0)
		(void)0;
}

/* Under lock: queue an async event on every context of @d (QP events: on its context). */
static void fv_event(struct fv_ctx *only, struct fv_dev *d, enum ibv_event_type type,
		     struct ibv_qp *qp)
{
	for (struct fv_ctx *c = fv.ctxs; c; c = c->next) {
		struct ibv_async_event *e;

		if ((only && c != only) || (!only && c->dev != d) || c->ev_n == FV_EVQ)
			continue;
		e = &c->evq[(c->ev_head + c->ev_n++) % FV_EVQ];
		memset(e, 0, sizeof(*e));
		e->event_type = type;
		if (qp)
			e->element.qp = qp;
		else
			e->element.port_num = 1;
		fv_signal(c->ctx.async_fd);
	}
}

/* Under lock. */
static void fv_push_wc(struct fv_qp *q, uint64_t wr_id, enum ibv_wc_status st,
		       enum ibv_wr_opcode op, uint32_t len)
{
	struct fv_cq *cq = FV_OF(struct fv_cq, q->qp.send_cq, cq);
	struct ibv_wc *wc;

	if (cq->n == cq->cap)
		fv_die("completion queue overrun (the plugin posted more than its CQ holds)");
	wc = &cq->ring[(cq->head + cq->n++) % cq->cap];
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = st;
	wc->opcode = op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	wc->qp_num = q->qp.qp_num;
	wc->byte_len = st == IBV_WC_SUCCESS ? len : 0;
	wc->vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x42;
	if (cq->armed && cq->chan) {
		cq->armed = false;
		if (cq->chan->n_pending < 64)
			cq->chan->pending[cq->chan->n_pending++] = &cq->cq;
		fv_signal(cq->chan->ch.fd);
	}
}

static struct fv_mr *fv_mr_find(uint32_t key, struct ibv_pd *pd, uint64_t addr, uint32_t len)
{
	for (struct fv_mr *m = fv.mrs; m; m = m->next) {
		uint64_t start = (uint64_t)(uintptr_t)m->mr.addr;

		if (m->mr.lkey != key || m->mr.pd != pd)
			continue;
		if (addr < start || len > m->mr.length || addr - start > m->mr.length - len)
			return NULL;
		return m;
	}
	return NULL;
}

/* Where the byte at iova @addr of @m is. */
static void *fv_mr_bytes(const struct fv_mr *m, uint64_t addr)
{
	return m->bytes + (addr - (uint64_t)(uintptr_t)m->mr.addr);
}

static struct fv_qp *fv_qp_find(uint32_t qpn)
{
	for (struct fv_qp *q = fv.qps; q; q = q->next)
		if (q->qp.qp_num == qpn)
			return q;
	return NULL;
}

/* Under lock: run one work request the way an RC requester and responder would. */
static void fv_execute(struct fv_wr *w)
{
	struct fv_qp *q = w->qp, *rq;
	struct fv_mr *lm, *rm;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	bool read = w->op == IBV_WR_RDMA_READ;

	if (q->st == IBV_QPS_ERR) {
		st = IBV_WC_WR_FLUSH_ERR;
		goto out;
	}
	q->dev->executed++;
	if (w->forced) {
		st = w->forced_st;
		goto out;
	}
	if (q->dev->fatal) {
		st = IBV_WC_FATAL_ERR;
		goto out;
	}
	rq = fv_qp_find(q->rqpn);
	if (!q->dev->up || !rq || rq->st == IBV_QPS_ERR || rq->st < IBV_QPS_RTR || !rq->dev->up ||
	    rq->dev->fatal || rq->rqpn != q->qp.qp_num) {
		st = IBV_WC_RETRY_EXC_ERR;
		goto out;
	}
	lm = fv_mr_find(w->lkey, q->qp.pd, w->laddr, w->len);
	if (!lm || (read && !(lm->access & IBV_ACCESS_LOCAL_WRITE))) {
		st = IBV_WC_LOC_PROT_ERR;
		goto out;
	}
	rm = fv_mr_find(w->rkey, rq->qp.pd, w->raddr, w->len);
	if (!rm || !(rm->access & (read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE)) ||
	    !(rq->access & (read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE))) {
		st = IBV_WC_REM_ACCESS_ERR;
		/* The responder's QP breaks too, and says so. */
		rq->st = IBV_QPS_ERR;
		fv_event(rq->fc, rq->dev, IBV_EVENT_QP_ACCESS_ERR, &rq->qp);
		goto out;
	}
	if (read)
		memcpy(fv_mr_bytes(lm, w->laddr), fv_mr_bytes(rm, w->raddr), w->len);
	else
		memcpy(fv_mr_bytes(rm, w->raddr), fv_mr_bytes(lm, w->laddr), w->len);
out:
	if (st != IBV_WC_SUCCESS)
		q->st = IBV_QPS_ERR;
	q->queued--;
	fv_push_wc(q, w->wr_id, st, w->op, w->len);
}

/* Under lock: a QP moved to the error state flushes its queue at once, held or not. */
static void fv_flush_now(struct fv_qp *q)
{
	struct fv_wr **pp = &fv.head, *prev = NULL;

	while (*pp) {
		struct fv_wr *w = *pp;

		if (w->qp != q) {
			prev = w;
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		if (fv.tail == w)
			fv.tail = prev;
		q->dev->flushed_queued++;
		fv_execute(w);
		free(w);
	}
}

static void *fv_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&fv.lock);
	for (;;) {
		struct fv_wr *w;

		while (!fv.head || fv.hold) {
			if (!fv.head)
				pthread_cond_broadcast(&fv.idle);
			pthread_cond_wait(&fv.cond, &fv.lock);
		}
		w = fv.head;
		fv.head = w->next;
		if (!fv.head)
			fv.tail = NULL;
		fv_execute(w);
		free(w);
	}
	return NULL;
}

/* --- test controls ------------------------------------------------------------------------- */

void fakeverbs_reset(void)
{
	pthread_mutex_lock(&fv.lock);
	if (fv.ctxs)
		fv_die("reset with devices still open");
	memset(fv.devs, 0, sizeof(fv.devs));
	fv.n_devs = 0;
	fv.hold = false;
	memset(fv.call_count, 0, sizeof(fv.call_count));
	memset(fv.call_skip, 0, sizeof(fv.call_skip));
	pthread_cond_broadcast(&fv.cond);
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_add_device(const char *name, const struct fakeverbs_dev_opts *o)
{
	struct fv_dev *d;

	pthread_mutex_lock(&fv.lock);
	if (fv.n_devs == FV_MAX_DEVS)
		fv_die("too many devices");
	d = &fv.devs[fv.n_devs];
	memset(d, 0, sizeof(*d));
	d->index = fv.n_devs++;
	snprintf(d->name, sizeof(d->name), "%s", name);
	snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
	d->ibdev.node_type = IBV_NODE_CA;
	d->ibdev.transport_type = IBV_TRANSPORT_IB;
	if (o)
		d->o = *o;
	if (!d->o.mtu)
		d->o.mtu = IBV_MTU_4096;
	if (!d->o.max_mr_size)
		d->o.max_mr_size = 1ull << 40;
	if (!d->o.max_msg)
		d->o.max_msg = 1u << 30;
	if (!d->o.n_gids) {
		/* What a RoCE NIC with an IPv4 address shows: v1 and v2 of each address. */
		static const enum ibv_gid_type types[4] = { IBV_GID_TYPE_ROCE_V1,
							    IBV_GID_TYPE_ROCE_V2,
							    IBV_GID_TYPE_ROCE_V1,
							    IBV_GID_TYPE_ROCE_V2 };

		d->o.n_gids = 4;
		for (int i = 0; i < 4; i++) {
			union ibv_gid *g = &d->o.gids[i];

			memset(g, 0, sizeof(*g));
			if (i < 2) {
				g->raw[0] = 0xfe;
				g->raw[1] = 0x80;
				g->raw[15] = (uint8_t)(d->index + 1);
			} else {
				g->raw[10] = g->raw[11] = 0xff;
				g->raw[12] = 10;
				g->raw[15] = (uint8_t)(d->index + 1);
			}
			d->o.gid_types[i] = types[i];
		}
	}
	d->up = !d->o.down;
	d->last_mtu = d->last_sgid = -1;
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_fail_wr(const char *dev, uint64_t nth, enum ibv_wc_status st)
{
	struct fv_dev *d;

	pthread_mutex_lock(&fv.lock);
	d = fv_find(dev);
	if (d->n_fail == FV_MAX_FAIL)
		fv_die("too many injected failures");
	d->fail_nth[d->n_fail] = d->posted + nth;
	d->fail_st[d->n_fail++] = st;
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_set_port(const char *dev, bool up)
{
	struct fv_dev *d;

	pthread_mutex_lock(&fv.lock);
	d = fv_find(dev);
	if (d->up != up) {
		d->up = up;
		fv_event(NULL, d, up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, NULL);
	}
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_device_fatal(const char *dev)
{
	struct fv_dev *d;

	pthread_mutex_lock(&fv.lock);
	d = fv_find(dev);
	d->fatal = true;
	fv_event(NULL, d, IBV_EVENT_DEVICE_FATAL, NULL);
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_fail_call(enum fakeverbs_call call, int err, uint32_t count)
{
	fakeverbs_fail_call_after(call, err, 0, count);
}

void fakeverbs_fail_call_after(enum fakeverbs_call call, int err, uint32_t skip, uint32_t count)
{
	pthread_mutex_lock(&fv.lock);
	fv.call_err[call] = err;
	fv.call_skip[call] = skip;
	fv.call_count[call] = count;
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_hold(bool hold)
{
	pthread_mutex_lock(&fv.lock);
	fv.hold = hold;
	pthread_cond_broadcast(&fv.cond);
	pthread_mutex_unlock(&fv.lock);
}

void fakeverbs_settle(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&fv.lock);
	while (fv.head && !fv.hold)
		if (pthread_cond_timedwait(&fv.idle, &fv.lock, &ts))
			break;
	pthread_mutex_unlock(&fv.lock);
}

#define FV_COUNTER(fn, type, field)                                                                \
	type fn(const char *dev)                                                                   \
	{                                                                                          \
		type v;                                                                            \
		pthread_mutex_lock(&fv.lock);                                                      \
		v = fv_find(dev)->field;                                                           \
		pthread_mutex_unlock(&fv.lock);                                                    \
		return v;                                                                          \
	}

FV_COUNTER(fakeverbs_wrs, uint64_t, executed)
FV_COUNTER(fakeverbs_posts, uint64_t, posts)
FV_COUNTER(fakeverbs_qps_created, uint32_t, qps_created)
FV_COUNTER(fakeverbs_qps_live, uint32_t, qps_live)
FV_COUNTER(fakeverbs_mrs_live, uint32_t, mrs_live)
FV_COUNTER(fakeverbs_dmabuf_mrs, uint32_t, dmabuf_mrs)
FV_COUNTER(fakeverbs_dmabuf_mrs_live, uint32_t, dmabuf_mrs_live)
FV_COUNTER(fakeverbs_qps_errored, uint32_t, qps_errored)
FV_COUNTER(fakeverbs_flushed_queued, uint64_t, flushed_queued)
FV_COUNTER(fakeverbs_last_mtu, int, last_mtu)
FV_COUNTER(fakeverbs_last_sgid_index, int, last_sgid)

/* --- the verbs ---------------------------------------------------------------------------- */

static struct ibv_device **fv_get_device_list(int *num)
{
	struct ibv_device **list;

	pthread_mutex_lock(&fv.lock);
	if (!fv.started) {
		pthread_t t;

		if (pthread_create(&t, NULL, fv_thread, NULL))
			fv_die("cannot start the fabric thread");
		pthread_detach(t);
		fv.started = true;
	}
	if (!fv.n_devs) {
		pthread_mutex_unlock(&fv.lock);
		errno = ENOSYS; /* what libibverbs says without /sys/class/infiniband */
		return NULL;
	}
	list = calloc(fv.n_devs + 1, sizeof(*list));
	for (uint32_t i = 0; list && i < fv.n_devs; i++)
		list[i] = &fv.devs[i].ibdev;
	if (num)
		*num = (int)fv.n_devs;
	pthread_mutex_unlock(&fv.lock);
	return list;
}

static void fv_free_device_list(struct ibv_device **list)
{
	free(list);
}

static const char *fv_get_device_name(struct ibv_device *device)
{
	return FV_OF(struct fv_dev, device, ibdev)->name;
}

static struct ibv_context *fv_open_device(struct ibv_device *device)
{
	struct fv_ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->dev = FV_OF(struct fv_dev, device, ibdev);
	c->ctx.device = device;
	c->ctx.num_comp_vectors = 1;
	c->ctx.async_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->ctx.cmd_fd = -1;
	pthread_mutex_lock(&fv.lock);
	c->next = fv.ctxs;
	fv.ctxs = c;
	pthread_mutex_unlock(&fv.lock);
	return &c->ctx;
}

static int fv_close_device(struct ibv_context *ctx)
{
	struct fv_ctx *c = FV_OF(struct fv_ctx, ctx, ctx);

	pthread_mutex_lock(&fv.lock);
	for (struct fv_ctx **pp = &fv.ctxs; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&fv.lock);
	close(ctx->async_fd);
	free(c);
	return 0;
}

static int fv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	struct fv_dev *d = FV_OF(struct fv_ctx, ctx, ctx)->dev;

	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "fake");
	a->max_mr_size = d->o.max_mr_size;
	a->max_qp = 65536;
	a->max_qp_wr = 16384;
	a->max_sge = 4;
	a->max_cq = 1024;
	a->max_cqe = 65536;
	a->max_mr = 65536;
	a->max_pd = 1024;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->phys_port_cnt = 1;
	return 0;
}

static int fv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
	struct fv_dev *d = FV_OF(struct fv_ctx, ctx, ctx)->dev;

	if (port != 1)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	pthread_mutex_lock(&fv.lock);
	a->state = d->up && !d->fatal ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
	pthread_mutex_unlock(&fv.lock);
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = d->o.mtu;
	a->gid_tbl_len = (int)d->o.n_gids;
	a->max_msg_sz = d->o.max_msg;
	a->lid = (uint16_t)(d->index + 1);
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	a->active_speed = 32;
	a->active_width = 2;
	return 0;
}

static ssize_t fv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t max)
{
	struct fv_dev *d = FV_OF(struct fv_ctx, ctx, ctx)->dev;
	size_t n = 0;

	for (uint32_t i = 0; i < d->o.n_gids && n < max; i++, n++) {
		e[n].gid = d->o.gids[i];
		e[n].gid_index = i;
		e[n].port_num = 1;
		e[n].gid_type = d->o.gid_types[i];
		e[n].ndev_ifindex = 1;
	}
	return (ssize_t)n;
}

static struct ibv_pd *fv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (pd)
		pd->context = ctx;
	return pd;
}

static int fv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

static struct ibv_comp_channel *fv_create_comp_channel(struct ibv_context *ctx)
{
	struct fv_chan *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->ch.context = ctx;
	c->ch.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	return &c->ch;
}

static int fv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	close(ch->fd);
	free(FV_OF(struct fv_chan, ch, ch));
	return 0;
}

static struct ibv_cq *fv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				   struct ibv_comp_channel *ch, int vector)
{
	struct fv_cq *c = calloc(1, sizeof(*c));

	(void)vector;
	if (!c)
		return NULL;
	c->cap = (uint32_t)cqe;
	c->ring = calloc(c->cap, sizeof(*c->ring));
	c->cq.context = ctx;
	c->cq.channel = ch;
	c->cq.cq_context = cq_context;
	c->cq.cqe = cqe;
	c->chan = ch ? FV_OF(struct fv_chan, ch, ch) : NULL;
	return &c->cq;
}

static int fv_destroy_cq(struct ibv_cq *cq)
{
	struct fv_cq *c = FV_OF(struct fv_cq, cq, cq);

	free(c->ring);
	free(c);
	return 0;
}

static int fv_req_notify_cq(struct ibv_cq *cq, int solicited)
{
	(void)solicited;
	pthread_mutex_lock(&fv.lock);
	FV_OF(struct fv_cq, cq, cq)->armed = true;
	pthread_mutex_unlock(&fv.lock);
	return 0;
}

static int fv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	struct fv_chan *c = FV_OF(struct fv_chan, ch, ch);

	pthread_mutex_lock(&fv.lock);
	if (!c->n_pending) {
		fv_drain_fd(ch->fd);
		pthread_mutex_unlock(&fv.lock);
		errno = EAGAIN;
		return -1;
	}
	*cq = c->pending[--c->n_pending];
	*cq_context = (*cq)->cq_context;
	pthread_mutex_unlock(&fv.lock);
	return 0;
}

static void fv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	(void)cq;
	(void)n;
}

static struct ibv_mr *fv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct fv_dev *d = FV_OF(struct fv_ctx, pd->context, ctx)->dev;
	struct fv_mr *m;

	pthread_mutex_lock(&fv.lock);
	if (fv_fault(FAKEVERBS_REG_MR)) {
		pthread_mutex_unlock(&fv.lock);
		return NULL;
	}
	if (length > d->o.max_mr_size) {
		pthread_mutex_unlock(&fv.lock);
		errno = EINVAL;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		pthread_mutex_unlock(&fv.lock);
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.lkey = m->mr.rkey = fv.next_key++;
	m->access = access;
	m->bytes = addr;
	m->next = fv.mrs;
	fv.mrs = m;
	d->mrs_live++;
	pthread_mutex_unlock(&fv.lock);
	return &m->mr;
}

static struct ibv_mr *fv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				       uint64_t iova, int fd, int access)
{
	struct fv_dev *d = FV_OF(struct fv_ctx, pd->context, ctx)->dev;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), head = offset % page;
	struct fv_mr *m;
	void *map;
	int err;

	pthread_mutex_lock(&fv.lock);
	err = fv_fault(FAKEVERBS_REG_DMABUF_MR);
	if (!err && (length > d->o.max_mr_size || !length))
		err = EINVAL;
	pthread_mutex_unlock(&fv.lock);
	if (err) {
		errno = err;
		return NULL;
	}
	/* What the NIC's DMA would reach: the exporter's pages, shared with its owner. */
	map = mmap(NULL, head + length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		   (off_t)(offset - head));
	if (map == MAP_FAILED)
		return NULL;
	m = calloc(1, sizeof(*m));
	if (!m) {
		munmap(map, head + length);
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = (void *)(uintptr_t)iova;
	m->mr.length = length;
	m->access = access;
	m->map = map;
	m->map_len = head + length;
	m->bytes = (uint8_t *)map + head;
	pthread_mutex_lock(&fv.lock);
	m->mr.lkey = m->mr.rkey = fv.next_key++;
	m->next = fv.mrs;
	fv.mrs = m;
	d->mrs_live++;
	d->dmabuf_mrs++;
	d->dmabuf_mrs_live++;
	pthread_mutex_unlock(&fv.lock);
	return &m->mr;
}

static int fv_dereg_mr(struct ibv_mr *mr)
{
	struct fv_mr *m = FV_OF(struct fv_mr, mr, mr);

	pthread_mutex_lock(&fv.lock);
	for (struct fv_mr **pp = &fv.mrs; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	FV_OF(struct fv_ctx, mr->context, ctx)->dev->mrs_live--;
	if (m->map)
		FV_OF(struct fv_ctx, mr->context, ctx)->dev->dmabuf_mrs_live--;
	pthread_mutex_unlock(&fv.lock);
	if (m->map)
		munmap(m->map, m->map_len);
	free(m);
	return 0;
}

static struct ibv_qp *fv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	struct fv_ctx *c = FV_OF(struct fv_ctx, pd->context, ctx);
	struct fv_qp *q;

	pthread_mutex_lock(&fv.lock);
	if (fv_fault(FAKEVERBS_CREATE_QP)) {
		pthread_mutex_unlock(&fv.lock);
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		pthread_mutex_unlock(&fv.lock);
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.qp_context = ia->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = ia->send_cq;
	q->qp.recv_cq = ia->recv_cq;
	q->qp.qp_num = fv.next_qpn++;
	q->qp.qp_type = ia->qp_type;
	q->qp.state = IBV_QPS_RESET;
	q->st = IBV_QPS_RESET;
	q->dev = c->dev;
	q->fc = c;
	q->max_wr = ia->cap.max_send_wr;
	q->next = fv.qps;
	fv.qps = q;
	c->dev->qps_created++;
	c->dev->qps_live++;
	pthread_mutex_unlock(&fv.lock);
	return &q->qp;
}

static int fv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct fv_qp *q = FV_OF(struct fv_qp, qp, qp);
	int err;

	pthread_mutex_lock(&fv.lock);
	err = fv_fault(FAKEVERBS_MODIFY_QP);
	if (!err && (mask & IBV_QP_STATE)) {
		if (mask & IBV_QP_ACCESS_FLAGS)
			q->access = a->qp_access_flags;
		if (a->qp_state == IBV_QPS_RTR) {
			q->rqpn = a->dest_qp_num;
			q->dev->last_mtu = (int)a->path_mtu;
			q->dev->last_sgid = a->ah_attr.grh.sgid_index;
		}
		if ((a->qp_state == IBV_QPS_RTR && q->st != IBV_QPS_INIT) ||
		    (a->qp_state == IBV_QPS_RTS && q->st != IBV_QPS_RTR))
			err = EINVAL;
		else if (a->qp_state == IBV_QPS_ERR && q->st != IBV_QPS_ERR)
			q->dev->qps_errored++;
		if (!err)
			q->st = a->qp_state;
		if (!err && a->qp_state == IBV_QPS_ERR)
			fv_flush_now(q);
	}
	pthread_mutex_unlock(&fv.lock);
	return err;
}

static int fv_destroy_qp(struct ibv_qp *qp)
{
	struct fv_qp *q = FV_OF(struct fv_qp, qp, qp);

	pthread_mutex_lock(&fv.lock);
	if (q->queued)
		fv_die("QP destroyed with work requests queued");
	for (struct fv_qp **pp = &fv.qps; *pp; pp = &(*pp)->next) {
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	}
	q->dev->qps_live--;
	pthread_mutex_unlock(&fv.lock);
	free(q);
	return 0;
}

static int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fv_qp *q = FV_OF(struct fv_qp, qp, qp);
	int err;

	pthread_mutex_lock(&fv.lock);
	err = fv_fault(FAKEVERBS_POST_SEND);
	if (!err && q->st != IBV_QPS_RTS && q->st != IBV_QPS_ERR)
		err = EINVAL;
	if (err) {
		*bad = wr;
		pthread_mutex_unlock(&fv.lock);
		return err;
	}
	q->dev->posts++;
	for (; wr; wr = wr->next) {
		struct fv_wr *w;

		if (q->queued >= q->max_wr || wr->num_sge != 1 ||
		    (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE) ||
		    !(w = calloc(1, sizeof(*w)))) {
			*bad = wr;
			err = q->queued >= q->max_wr ? ENOMEM : EINVAL;
			break;
		}
		w->qp = q;
		w->wr_id = wr->wr_id;
		w->op = wr->opcode;
		w->laddr = wr->sg_list[0].addr;
		w->len = wr->sg_list[0].length;
		w->lkey = wr->sg_list[0].lkey;
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		q->dev->posted++;
		for (uint32_t i = 0; i < q->dev->n_fail; i++) {
			if (q->dev->fail_nth[i] == q->dev->posted) {
				w->forced = true;
				w->forced_st = q->dev->fail_st[i];
			}
		}
		q->queued++;
		if (fv.tail)
			fv.tail->next = w;
		else
			fv.head = w;
		fv.tail = w;
	}
	pthread_cond_signal(&fv.cond);
	pthread_mutex_unlock(&fv.lock);
	return err;
}

static int fv_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct fv_cq *c = FV_OF(struct fv_cq, cq, cq);
	int n = 0;

	pthread_mutex_lock(&fv.lock);
	while (n < num && c->n) {
		wc[n++] = c->ring[c->head];
		c->head = (c->head + 1) % c->cap;
		c->n--;
	}
	pthread_mutex_unlock(&fv.lock);
	return n;
}

static int fv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	struct fv_ctx *c = FV_OF(struct fv_ctx, ctx, ctx);

	pthread_mutex_lock(&fv.lock);
	if (!c->ev_n) {
		fv_drain_fd(ctx->async_fd);
		pthread_mutex_unlock(&fv.lock);
		errno = EAGAIN;
		return -1;
	}
	*ev = c->evq[c->ev_head];
	c->ev_head = (c->ev_head + 1) % FV_EVQ;
	c->ev_n--;
	pthread_mutex_unlock(&fv.lock);
	return 0;
}

static void fv_ack_async_event(struct ibv_async_event *ev)
{
	(void)ev;
}

const struct rdma_verbs fakeverbs_table = {
	.get_device_list = fv_get_device_list,
	.free_device_list = fv_free_device_list,
	.get_device_name = fv_get_device_name,
	.open_device = fv_open_device,
	.close_device = fv_close_device,
	.query_device = fv_query_device,
	.query_port = fv_query_port,
	.query_gid_table = fv_query_gid_table,
	.alloc_pd = fv_alloc_pd,
	.dealloc_pd = fv_dealloc_pd,
	.create_comp_channel = fv_create_comp_channel,
	.destroy_comp_channel = fv_destroy_comp_channel,
	.create_cq = fv_create_cq,
	.destroy_cq = fv_destroy_cq,
	.req_notify_cq = fv_req_notify_cq,
	.get_cq_event = fv_get_cq_event,
	.ack_cq_events = fv_ack_cq_events,
	.reg_mr = fv_reg_mr,
	.reg_dmabuf_mr = fv_reg_dmabuf_mr,
	.dereg_mr = fv_dereg_mr,
	.create_qp = fv_create_qp,
	.modify_qp = fv_modify_qp,
	.destroy_qp = fv_destroy_qp,
	.post_send = fv_post_send,
	.poll_cq = fv_poll_cq,
	.get_async_event = fv_get_async_event,
	.ack_async_event = fv_ack_async_event,
};
