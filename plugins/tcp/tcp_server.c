/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp_server.c: the serving side of the tcp transport: accepted connections, checking
 * requests against the region table, serving READ and WRITE, staging GPU memory.
 */
#include "tcp.h"

/* Whether [addr, addr+len) lies inside ONE region granting @need. Under reg_lock (read). */
static bool tcp_region_allows(const struct tcp_inst *ti, uint64_t addr, uint64_t len, uint32_t need)
{
	return te_plugin_regions_find(&ti->regions, addr, len, need) != NULL;
}

/* "cuda:0" for a staged region's kind and device. */
static void tcp_kind_text(char *buf, size_t cap, uint32_t mem_type, int32_t dev)
{
	snprintf(buf, cap, "%s:%d", mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda", dev);
}

static void tcp_region_detail(const struct tcp_inst *ti, char *buf, size_t cap, uint8_t op,
			      uint64_t addr, uint64_t len, const char *extra)
{
	const char *name = ti->host->local_name ? ti->host->local_name(ti->ctx) : "";

	snprintf(buf, cap,
		 TCP_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
			  ") is not inside a registered remote-%s buffer of %s%s",
		 addr, len, op == TCP_OP_READ ? "readable" : "writable", name && *name ? name : "?",
		 extra);
}

/* --- serving side ------------------------------------------------------------------- */

void tcp_conn_free(struct tcp_conn *c)
{
	free(c->rx.buf);
	for (uint32_t i = 0; c->ring && i < TCP_SRV_RING; i++)
		free(c->ring[i].detail);
	free(c->ring);
	free(c->rx_stage);
	free(c->tx_stage);
	free(c);
}

static void tcp_conn_close(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c,
			   enum te_plugin_log_level level, const char *why)
{
	if (why)
		tcp_log(ti, level, "closing connection from %s: %s", c->who, why);
	/* Also leaves the epoll set: the descriptor is never duplicated. */
	if (c->abort)
		tcp_sock_abort(c->fd);
	else
		close(c->fd);
	pthread_mutex_lock(&w->lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		w->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	w->n_conns--;
	pthread_mutex_unlock(&w->lock);
	/* relaxed: counters for the accept limits only */
	atomic_fetch_sub_explicit(&ti->n_conns, 1, memory_order_relaxed);
	if (c->hs != TCP_CHS_READY)
		atomic_fetch_sub_explicit(&ti->n_unauth, 1, memory_order_relaxed);
	tcp_again_remove(w, &c->ep);
	tcp_conn_free(c);
}

static struct tcp_resp *tcp_conn_reserve(struct tcp_conn *c, uint32_t *index_out)
{
	uint32_t i = (c->head + c->count) % TCP_SRV_RING;
	struct tcp_resp *e = &c->ring[i];

	c->count++;
	e->payload = NULL;
	e->len = 0;
	e->ready = true;
	e->memory = false;
	e->staged = false;
	if (index_out)
		*index_out = i;
	return e;
}

/* The answer @e at the head of @c's ring was sent: free its entry (and its detail, if any). */
static inline void tcp_conn_retire(struct tcp_conn *c, struct tcp_resp *e)
{
	if (e->detail) {
		free(e->detail);
		e->detail = NULL;
	}
	c->head = (c->head + 1) % TCP_SRV_RING;
	c->count--;
}

/* Sent in place of a detail the server had no memory to keep. */
static const char tcp_detail_nomem[] = TCP_NAME ": (detail dropped: server out of memory)";

static void tcp_resp_error(struct tcp_resp *e, uint8_t op, uint32_t req_id, enum te_status st,
			   const char *detail)
{
	size_t n = strnlen(detail, TCP_DETAIL_WIRE);

	if (!e->detail)
		e->detail = malloc(TCP_DETAIL_WIRE);
	if (e->detail) {
		memcpy(e->detail, detail, n);
		e->payload = (const uint8_t *)e->detail;
	} else {
		n = sizeof(tcp_detail_nomem) - 1;
		e->payload = (const uint8_t *)tcp_detail_nomem;
	}
	tcp_encode(e->hdr, op, req_id, st, 0, n);
	e->len = n;
	e->memory = false;
	e->staged = false;
}

/*
 * Under reg_lock (read), before any byte of the current WRITE reaches registered memory:
 * stop receiving into memory when the connection was fenced (a newer connection of its lane
 * took over), when the request's deadline passed (its client reports it from then on), or
 * when its destination was deregistered; the rest is discarded and the answer is an error.
 * The fence and deregistration take the write lock, so no receive straddles them.
 */
static void tcp_conn_recheck_locked(struct tcp_inst *ti, struct tcp_conn *c)
{
	uint64_t ver = atomic_load_explicit(&ti->reg_ver, memory_order_relaxed);
	struct tcp_resp *e = &c->ring[c->cur];
	char detail[TCP_DETAIL_WIRE];

	if (!c->rx.dst)
		return;
	/* relaxed: set under the write lock this thread's read lock is ordered after */
	if (atomic_load_explicit(&c->fenced, memory_order_relaxed)) {
		c->rx.dst = NULL;
		tcp_resp_error(e, TCP_OP_WRITE, te_plugin_get_u32(e->hdr + 8), TE_ERR_CONN_RESET,
			       TCP_NAME ": connection replaced by a newer one of its lane");
		return;
	}
	if (c->cur_deadline != UINT64_MAX && tcp_now_ns() >= c->cur_deadline) {
		snprintf(detail, sizeof(detail),
			 TCP_NAME ": WRITE [0x%" PRIx64 ", +%" PRIu64
				  ") passed its deadline after %" PRIu64
				  " bytes; the rest was discarded",
			 c->cur_addr, c->cur_len, c->cur_len - c->rx.left);
		c->rx.dst = NULL;
		tcp_resp_error(e, TCP_OP_WRITE, te_plugin_get_u32(e->hdr + 8), TE_ERR_TIMEOUT,
			       detail);
		return;
	}
	if (ver == c->cur_ver)
		return;
	/* Staged: what is still to land starts at stage_dev, not in the staging buffer. */
	if (tcp_region_allows(ti, c->cur_staged ? c->stage_dev : (uint64_t)(uintptr_t)c->rx.dst,
			      c->cur_staged ? c->rx_fill + c->rx.left : c->rx.left,
			      TE_PLUGIN_ACCESS_REMOTE_WRITE)) {
		c->cur_ver = ver;
		return;
	}
	c->rx.dst = NULL;
	tcp_region_detail(ti, detail, sizeof(detail), TCP_OP_WRITE, c->cur_addr, c->cur_len,
			  " (deregistered during the transfer)");
	tcp_resp_error(e, TCP_OP_WRITE, te_plugin_get_u32(e->hdr + 8), TE_ERR_REMOTE_ACCESS,
		       detail);
}

/*
 * A staged WRITE: the bytes in the staging buffer land in GPU memory now, through the host's
 * mem_copy (the plugin that owns the kind), under the same checks as a receive into host
 * memory (fence, deadline, region still there). A failed copy answers the WRITE with the
 * driver's reason and discards the rest.
 */
static void tcp_conn_stage_flush(struct tcp_inst *ti, struct tcp_conn *c)
{
	struct tcp_resp *e = &c->ring[c->cur];

	if (!c->rx_fill || !c->rx.dst) {
		c->rx_fill = 0;
		return;
	}
	pthread_rwlock_rdlock(&ti->reg_lock);
	tcp_conn_recheck_locked(ti, c);
	if (c->rx.dst) {
		enum te_status st = ti->host->mem_copy(ti->ctx, (void *)(uintptr_t)c->stage_dev,
						       c->rx_stage, c->rx_fill, c->cur_type,
						       c->cur_dev, TE_PLUGIN_COPY_FROM_HOST);

		if (st == TE_OK) {
			c->stage_dev += c->rx_fill;
		} else {
			char detail[TCP_DETAIL_WIRE], kind[24];

			tcp_kind_text(kind, sizeof(kind), c->cur_type, c->cur_dev);
			snprintf(detail, sizeof(detail),
				 TCP_NAME ": WRITE [0x%" PRIx64 ", +%" PRIu64
					  ") into %s: the staging copy failed (status %d)",
				 c->cur_addr, c->cur_len, kind, (int)st);
			c->rx.dst = NULL;
			tcp_resp_error(e, TCP_OP_WRITE, te_plugin_get_u32(e->hdr + 8), st, detail);
		}
	}
	pthread_rwlock_unlock(&ti->reg_lock);
	c->rx_fill = 0;
	if (c->rx.dst) {
		c->rx.dst = c->rx_stage;
		c->rx.room = TCP_STAGE;
	}
}

/* After a read into the staging buffer: flush it when full or when the payload is all in. */
static void tcp_conn_staged_read(struct tcp_inst *ti, struct tcp_conn *c, const uint8_t *before)
{
	if (!c->rx.dst)
		return;
	c->rx_fill += (uint64_t)(c->rx.dst - before);
	if (c->rx.room == 0 || c->rx.left == 0)
		tcp_conn_stage_flush(ti, c);
}

static void tcp_conn_payload_done(struct tcp_inst *ti, struct tcp_conn *c)
{
	if (c->cur_staged)
		tcp_conn_stage_flush(ti, c);
	c->rx.payload = false;
	c->rx.dst = NULL;
	c->rx.room = 0;
	c->cur_staged = false;
	c->ring[c->cur].ready = true;
	c->frames++;
}

/* Copy buffered bytes of the WRITE just announced; registered memory only under the lock. */
static void tcp_conn_prefix(struct tcp_inst *ti, struct tcp_conn *c)
{
	if (c->rx.end == c->rx.pos)
		return;
	if (!c->rx.dst) {
		tcp_rx_prefix(&c->rx);
		return;
	}
	if (c->cur_staged) {
		/* Into the staging buffer, which is flushed whenever it fills. */
		while (c->rx.dst && c->rx.end > c->rx.pos && c->rx.left) {
			uint64_t n = TCP_MIN(TCP_MIN((uint64_t)(c->rx.end - c->rx.pos), c->rx.left),
					     c->rx.room);

			memcpy(c->rx.dst, c->rx.buf + c->rx.pos, n);
			c->rx.dst += n;
			c->rx.pos += (uint32_t)n;
			c->rx.left -= n;
			c->rx.room -= n;
			c->rx_fill += n;
			if (!c->rx.room || !c->rx.left)
				tcp_conn_stage_flush(ti, c);
		}
		if (!c->rx.dst)
			tcp_rx_prefix(&c->rx); /* discarded: drop the rest of what is buffered */
		return;
	}
	pthread_rwlock_rdlock(&ti->reg_lock);
	tcp_conn_recheck_locked(ti, c);
	tcp_rx_prefix(&c->rx);
	pthread_rwlock_unlock(&ti->reg_lock);
}

enum tcp_srv {
	TCP_SRV_MORE,	 /* need more bytes */
	TCP_SRV_PAYLOAD, /* a WRITE payload is being received */
	TCP_SRV_FULL,	 /* the response ring is full */
	TCP_SRV_CLOSE,	 /* malformed input: close the connection */
	TCP_SRV_NEXT,	 /* a handshake frame was handled: go on */
};

/* Queue a handshake answer: one header and @len body bytes, sent before any response. */
static void tcp_conn_ctl(struct tcp_conn *c, uint8_t op, int32_t status, uint64_t addr,
			 const void *body, uint32_t len)
{
	uint8_t *p = c->ctl + c->ctl_len;

	/* Callers queue at most one HELLO answer (104 bytes) and one refusal (232). */
	if (c->ctl_len + TCP_HDR_LEN + len > TCP_CTL)
		return;
	tcp_encode(p, op, 0, status, addr, len);
	if (len)
		memcpy(p + TCP_HDR_LEN, body, len);
	c->ctl_len += TCP_HDR_LEN + len;
}

/* Refuse @c with one error frame and close it once that is sent; nothing else is read. */
static void tcp_conn_refuse(struct tcp_conn *c, uint8_t op, enum te_status st, uint64_t addr,
			    const char *text)
{
	tcp_conn_ctl(c, op, st, addr, text, (uint32_t)strnlen(text, TCP_DETAIL_WIRE));
	c->closing = true;
}

/*
 * A frame that has no place before the connection is authenticated. With a secret every such
 * frame gets the same generic refusal, whatever it asked (no range check, no oracle); without
 * one it is a protocol error that closes the connection.
 */
static enum tcp_srv tcp_conn_unauth(struct tcp_inst *ti, struct tcp_conn *c,
				    const struct tcp_hdr *h, char *why, size_t why_len,
				    const char *what)
{
	if (!ti->auth) {
		snprintf(why, why_len, "%s (op %u, %" PRIu64 " bytes)", what, h->op, h->length);
		return TCP_SRV_CLOSE;
	}
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s: %s (op %u): refused", c->who, what,
		h->op);
	tcp_conn_refuse(c, h->op <= TCP_OP_AUTH ? h->op : TCP_OP_HELLO, TE_ERR_AUTH, 0,
			TCP_NOT_AUTHED);
	return TCP_SRV_NEXT;
}

/* The fence record of @c's client lane, or NULL. Under ti->fence_lock. */
static struct tcp_fence *tcp_fence_find_locked(struct tcp_inst *ti, const struct tcp_conn *c)
{
	for (uint32_t i = 0; i < ti->n_fences; i++)
		if (ti->fences[i].cid == c->cid && ti->fences[i].lane == c->lane)
			return &ti->fences[i];
	return NULL;
}

/*
 * Connections from @host other than @skip, all workers together; *@sibling (when not NULL):
 * whether one of them is a READY lane of client @cid. Takes each worker's lock in turn.
 */
static uint32_t tcp_host_conns(struct tcp_inst *ti, const uint8_t host[16],
			       const struct tcp_conn *skip, uint64_t cid, bool *sibling)
{
	uint32_t same = 0;

	for (uint32_t k = 0; k < ti->n_workers; k++) {
		struct tcp_worker *w = &ti->workers[k];

		pthread_mutex_lock(&w->lock);
		for (const struct tcp_conn *o = w->conns; o; o = o->next) {
			if (o == skip || memcmp(o->host, host, 16) != 0)
				continue;
			same++;
			/* cid is written before hs turns READY under this lock */
			if (sibling && o->hs == TCP_CHS_READY && o->cid == cid)
				*sibling = true;
		}
		pthread_mutex_unlock(&w->lock);
	}
	return same;
}

/*
 * Lane fencing. Record @c's (client id, lane, epoch) as the lane's newest, mark @c READY, and
 * stop every older READY connection of that lane from applying anything more: their flag is
 * set, then the region write lock waits for the serving syscall in progress, and every later
 * one re-checks (reg_ver) and finds the flag. false (nothing changed): a newer epoch of the
 * lane was seen already (*newest_out), so @c is a stale reconnect. Worker of @c.
 */
bool tcp_fence(struct tcp_inst *ti, struct tcp_conn *c, uint64_t *newest_out)
{
	uint64_t now = tcp_now_ns();
	struct tcp_fence *f = NULL;
	uint32_t n_fenced = 0;

	pthread_mutex_lock(&ti->fence_lock);
	f = tcp_fence_find_locked(ti, c);
	if (f && f->epoch >= c->epoch) {
		*newest_out = f->epoch;
		pthread_mutex_unlock(&ti->fence_lock);
		return false;
	}
	if (!f && ti->n_fences < TCP_FENCES) {
		f = &ti->fences[ti->n_fences++];
	} else if (!f) {
		/* Full: forget the lane used longest ago (its deadlines still protect it). */
		f = &ti->fences[0];
		for (uint32_t i = 1; i < ti->n_fences; i++)
			if (ti->fences[i].used_ns < f->used_ns)
				f = &ti->fences[i];
	}
	*f = (struct tcp_fence){
		.cid = c->cid, .epoch = c->epoch, .used_ns = now, .lane = c->lane
	};
	pthread_mutex_lock(&c->w->lock);
	c->hs = TCP_CHS_READY;
	pthread_mutex_unlock(&c->w->lock);
	atomic_fetch_sub_explicit(&ti->n_unauth, 1, memory_order_relaxed);
	for (uint32_t k = 0; k < ti->n_workers; k++) {
		struct tcp_worker *w = &ti->workers[k];

		pthread_mutex_lock(&w->lock);
		for (struct tcp_conn *o = w->conns; o; o = o->next) {
			if (o != c && o->hs == TCP_CHS_READY && o->cid == c->cid &&
			    o->lane == c->lane && o->epoch < c->epoch) {
				atomic_store_explicit(&o->fenced, true, memory_order_relaxed);
				n_fenced++;
			}
		}
		pthread_mutex_unlock(&w->lock);
	}
	if (n_fenced) {
		pthread_rwlock_wrlock(&ti->reg_lock);
		/* relaxed: readers load it under the read lock, which orders it */
		atomic_fetch_add_explicit(&ti->reg_ver, 1, memory_order_relaxed);
		pthread_rwlock_unlock(&ti->reg_lock);
		/* Their workers close them at the next tick; nothing of theirs lands meanwhile. */
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
			"connection from %s (lane %u, epoch %" PRIu64 ") fenced %u older one(s)",
			c->who, c->lane, c->epoch, n_fenced);
	}
	pthread_mutex_unlock(&ti->fence_lock);
	return true;
}

/*
 * The last quarter of max_conns_per_host (at least one connection, when the limit allows two)
 * is kept for engines that have no connection from that host yet: a client's extra lanes
 * stop short of it, so one engine's 4 lanes cannot shut another engine out of the server
 * entirely. Whether @c, a lane that has never been served before (no fence record: a lane
 * that was reconnects whatever the count, its fence needs it), of a client with another lane
 * served here, arrives when its host holds that many: the refusal text in @text. Worker of @c.
 */
static bool tcp_extra_lane_over(struct tcp_inst *ti, const struct tcp_conn *c, char *text,
				size_t cap)
{
	uint64_t limit = ti->max_conns_per_host;
	uint64_t reserve = limit >= 2 ? (limit / 4 ? limit / 4 : 1) : 0;
	uint32_t same;
	bool sibling = false, known;

	if (!reserve)
		return false;
	pthread_mutex_lock(&ti->fence_lock);
	known = tcp_fence_find_locked(ti, c) != NULL;
	pthread_mutex_unlock(&ti->fence_lock);
	if (known)
		return false;
	same = tcp_host_conns(ti, c->host, c, c->cid, &sibling);
	if (!sibling || same < limit - reserve)
		return false;
	snprintf(text, cap,
		 TCP_NAME ": lane %u refused: %" PRIu32
			  " connections from this host, the last %" PRIu64
			  " of max_conns_per_host (%" PRIu64 ") kept for other engines",
		 c->lane, same, reserve, limit);
	return true;
}

/*
 * A lane refused for want of room (tcp_extra_lane_over): counted, and warned of at most once
 * per TCP_ROOM_WARN_NS per engine with the count since, the rest at debug. Not one per
 * worker and second: a host of 32 engines, all opening 4 lanes to each other, logged 390
 * such warnings in 8 s, each engine's clients again as many (tcp_lane_move). Any worker.
 */
static void tcp_warn_room(struct tcp_inst *ti, const char *who, const char *text)
{
	uint64_t now = tcp_now_ns();
	uint64_t last = atomic_load_explicit(&ti->room_warn_ns, memory_order_relaxed);
	unsigned quiet;

	tcp_stat_add(&ti->st_room_refused, 1);
	if ((last && now - last < TCP_ROOM_WARN_NS) ||
	    !atomic_compare_exchange_strong(&ti->room_warn_ns, &last, now)) {
		atomic_fetch_add_explicit(&ti->room_quiet, 1, memory_order_relaxed);
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s: %s", who, text);
		return;
	}
	quiet = atomic_exchange_explicit(&ti->room_quiet, 0, memory_order_relaxed);
	if (quiet)
		tcp_log(ti, TE_PLUGIN_LOG_WARN,
			"connection from %s: %s (and %u more refused for want of room in the last "
			"%llu s; tcp statistics: refused_for_room)",
			who, text, quiet, (unsigned long long)((now - last) / 1000000000u));
	else
		tcp_log(ti, TE_PLUGIN_LOG_WARN,
			"connection from %s: %s (further ones: at most one warning a minute; tcp "
			"statistics: refused_for_room)",
			who, text);
}

/* The client proved itself (or no secret is configured): fence, then serve. */
static enum tcp_srv tcp_conn_ready(struct tcp_inst *ti, struct tcp_conn *c, uint8_t op, char *why,
				   size_t why_len)
{
	uint8_t body[TCP_HELLO_ANS] = { 0 };
	char text[TCP_DETAIL_WIRE];
	uint64_t newest = 0;

	c->ring = calloc(TCP_SRV_RING, sizeof(*c->ring));
	if (!c->ring) {
		snprintf(why, why_len, "no memory for its response ring");
		return TCP_SRV_CLOSE;
	}
	/* Ready to serve: a buffer that takes many small WRITEs per read (what it holds stays). */
	if (c->rx.cap < TCP_RBUF_BIG) {
		uint8_t *big = realloc(c->rx.buf, TCP_RBUF_BIG);

		if (!big) {
			snprintf(why, why_len, "no memory for its receive buffer");
			return TCP_SRV_CLOSE;
		}
		c->rx.buf = big;
		c->rx.cap = TCP_RBUF_BIG;
		c->rx.gulp = TCP_GULP;
	}
	if (tcp_extra_lane_over(ti, c, text, sizeof(text))) {
		tcp_warn_room(ti, c->who, text);
		tcp_conn_refuse(c, op, TE_ERR_AGAIN, 0, text);
		return TCP_SRV_NEXT;
	}
	if (!tcp_fence(ti, c, &newest)) {
		snprintf(text, sizeof(text),
			 TCP_NAME ": lane %u epoch %" PRIu64
				  " is older than the lane's newest (%" PRIu64 "): refused",
			 c->lane, c->epoch, newest);
		tcp_log(ti, TE_PLUGIN_LOG_INFO, "connection from %s: %s", c->who, text);
		tcp_conn_refuse(c, op, TE_ERR_CONN_RESET, 0, text);
		return TCP_SRV_NEXT;
	}
	c->active_ns = tcp_now_ns();
	c->rx.bulk = true;
	if (op == TCP_OP_HELLO)
		tcp_conn_ctl(c, TCP_OP_HELLO, TE_OK, ti->nonce, body, sizeof(body));
	else
		tcp_conn_ctl(c, TCP_OP_AUTH, TE_OK, 0, NULL, 0);
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s ready (lane %u, epoch %" PRIu64 ")%s",
		c->who, c->lane, c->epoch, ti->auth ? ", authenticated" : "");
	return TCP_SRV_NEXT;
}

/*
 * The client's HELLO, then (with a secret) its AUTH. Nothing is served before; frames are read
 * one at a time, exactly (no read-ahead), so an unauthenticated client costs the 8 KiB header
 * buffer at most.
 */
static enum tcp_srv tcp_conn_handshake(struct tcp_inst *ti, struct tcp_conn *c,
				       const struct tcp_hdr *h, uint32_t avail, size_t *need,
				       char *why, size_t why_len)
{
	struct tcp_rx *rx = &c->rx;
	uint8_t want = c->hs == TCP_CHS_HELLO ? TCP_OP_HELLO : TCP_OP_AUTH;
	uint64_t body_len = want == TCP_OP_HELLO ? TCP_HELLO_REQ : TE_PLUGIN_MAC_SIZE;
	uint8_t tr[TCP_TRANSCRIPT];
	const uint8_t *b;

	if (h->magic != TCP_WIRE_MAGIC || h->version != TCP_WIRE_VERSION || h->flags || h->status ||
	    h->req_id || h->op != want || h->length != body_len)
		return tcp_conn_unauth(ti, c, h, why, why_len,
				       want == TCP_OP_HELLO ? "first frame is not a valid HELLO"
							    : "expected AUTH");
	if (avail < TCP_HDR_LEN + body_len) {
		*need = TCP_HDR_LEN + (size_t)body_len - avail;
		return TCP_SRV_MORE;
	}
	b = rx->buf + rx->pos + TCP_HDR_LEN;
	rx->pos += TCP_HDR_LEN + (uint32_t)body_len;
	c->frames++;
	if (want == TCP_OP_AUTH) {
		tcp_transcript(tr, false, ti->nonce, c->cid, c->epoch, c->lane, c->nonce_c,
			       c->nonce_s);
		if (ti->host->auth_check(ti->ctx, tr, sizeof(tr), b) != TE_OK) {
			tcp_warn_limited(ti, c->w,
					 "connection from %s: wrong proof of the shared secret: "
					 "refused",
					 c->who);
			tcp_conn_refuse(c, TCP_OP_AUTH, TE_ERR_AUTH, 0, TCP_AUTH_FAILED);
			return TCP_SRV_NEXT;
		}
		return tcp_conn_ready(ti, c, TCP_OP_AUTH, why, why_len);
	}
	if (h->addr != ti->nonce) {
		/* Meant for an earlier instance at this address: run nothing. */
		tcp_log(ti, TE_PLUGIN_LOG_INFO,
			"connection from %s expects instance %016" PRIx64 ", this is %016" PRIx64
			": refused",
			c->who, h->addr, ti->nonce);
		tcp_conn_refuse(c, TCP_OP_HELLO, TE_ERR_PEER_RESTARTED, ti->auth ? 0 : ti->nonce,
				TCP_NAME ": another instance serves this address now (restarted)");
		return TCP_SRV_NEXT;
	}
	c->cid = te_plugin_get_u64(b);
	c->epoch = te_plugin_get_u64(b + 8);
	c->lane = te_plugin_get_u32(b + 16);
	memcpy(c->nonce_c, b + 24, TCP_NONCE);
	if (!c->cid || !c->epoch)
		return tcp_conn_unauth(ti, c, h, why, why_len,
				       "HELLO without a client id or epoch");
	c->base_ns = tcp_now_ns();
	c->base_at_send = true;
	if (ti->auth) {
		uint8_t body[TCP_HELLO_ANS] = { 0 };

		if (!tcp_random(c->nonce_s, TCP_NONCE)) {
			snprintf(why, why_len, "no random bytes for a nonce: %s", strerror(errno));
			return TCP_SRV_CLOSE;
		}
		tcp_transcript(tr, true, ti->nonce, c->cid, c->epoch, c->lane, c->nonce_c,
			       c->nonce_s);
		te_plugin_put_u32(body, TCP_HELLO_SECRET);
		memcpy(body + 8, c->nonce_s, TCP_NONCE);
		if (ti->host->auth_mac(ti->ctx, tr, sizeof(tr), body + 8 + TCP_NONCE) != TE_OK) {
			snprintf(why, why_len, "cannot compute the proof of the secret");
			return TCP_SRV_CLOSE;
		}
		tcp_conn_ctl(c, TCP_OP_HELLO, TE_OK, ti->nonce, body, sizeof(body));
		pthread_mutex_lock(&c->w->lock);
		c->hs = TCP_CHS_AUTH;
		pthread_mutex_unlock(&c->w->lock);
		return TCP_SRV_NEXT;
	}
	return tcp_conn_ready(ti, c, TCP_OP_HELLO, why, why_len);
}

/*
 * Whether [@addr, +@len) lies in one registered region that allows @need; *@ver: the region
 * table version it was checked at (the answer re-checks under the lock if it changed before
 * the bytes move). The region found is kept in @c (hot_*): a request that falls in it while
 * the version holds is answered without the region lock, which both serving workers would
 * otherwise take and release per request (a cache line that moves between CPUs twice per
 * request). A deregistration bumps the version under the write lock; one that runs while a
 * request is checked against the kept region is seen by the re-check before the bytes move
 * (READ answers and WRITE payloads take the read lock and compare versions), as when the
 * region was found under the lock and deregistered right after.
 */
static bool tcp_conn_lookup(struct tcp_inst *ti, struct tcp_conn *c, uint64_t addr, uint64_t len,
			    uint32_t need, uint64_t *ver)
{
	const struct te_plugin_region *reg;
	const struct tcp_mem *m;
	uint64_t now = atomic_load_explicit(&ti->reg_ver, memory_order_acquire);

	if (now == c->hot_ver && addr >= c->hot_start && addr < c->hot_end &&
	    len <= c->hot_end - addr && (c->hot_access & need) == need) {
		*ver = now;
		return true;
	}
	pthread_rwlock_rdlock(&ti->reg_lock);
	reg = te_plugin_regions_find(&ti->regions, addr, len, need);
	*ver = atomic_load_explicit(&ti->reg_ver, memory_order_relaxed);
	if (reg) {
		m = (const struct tcp_mem *)reg->mem;
		c->hot_ver = *ver;
		c->hot_start = reg->start;
		c->hot_end = reg->end;
		c->hot_access = reg->access;
		c->hot_type = m->mem_type;
		c->hot_dev = m->dev;
	}
	pthread_rwlock_unlock(&ti->reg_lock);
	return reg != NULL;
}

/*
 * Handle every complete request in @c's buffer. Every header field is checked; anything
 * malformed closes this connection only. Requests for memory outside the registered,
 * remote-accessible regions are answered with TE_ERR_REMOTE_ACCESS (a WRITE's payload is
 * discarded).
 */
static enum tcp_srv tcp_conn_parse(struct tcp_inst *ti, struct tcp_conn *c, size_t *need, char *why,
				   size_t why_len)
{
	struct tcp_rx *rx = &c->rx;

	while (!c->closing) {
		uint32_t avail = rx->end - rx->pos, idx;
		char detail[TCP_DETAIL_WIRE];
		struct tcp_resp *e;
		struct tcp_hdr h;
		uint64_t ver;
		uint32_t need_access, stype = TE_PLUGIN_MEM_CPU;
		int32_t sdev = -1;
		bool found, ok, staged;

		if (avail < TCP_HDR_LEN) {
			*need = TCP_HDR_LEN - avail;
			return TCP_SRV_MORE;
		}
		tcp_hdr_decode(rx->buf + rx->pos, &h);
		if (c->hs != TCP_CHS_READY) {
			enum tcp_srv r = tcp_conn_handshake(ti, c, &h, avail, need, why, why_len);

			if (r != TCP_SRV_NEXT)
				return r;
			continue;
		}
		if (c->count == TCP_SRV_RING)
			return TCP_SRV_FULL;
		if (h.magic != TCP_WIRE_MAGIC || h.version != TCP_WIRE_VERSION || h.flags) {
			snprintf(why, why_len,
				 "bad frame header (magic 0x%08" PRIx32 ", version %u, flags 0x%x)",
				 h.magic, h.version, h.flags);
			return TCP_SRV_CLOSE;
		}
		if (h.op != TCP_OP_READ && h.op != TCP_OP_WRITE) {
			snprintf(why, why_len, "unexpected op %u", h.op);
			return TCP_SRV_CLOSE;
		}
		if (h.length == 0 || h.length > TCP_MAX_FRAME) {
			snprintf(why, why_len, "request length %" PRIu64 " outside [1, %llu]",
				 h.length, TCP_MAX_FRAME);
			return TCP_SRV_CLOSE;
		}
		need_access = h.op == TCP_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						  : TE_PLUGIN_ACCESS_REMOTE_WRITE;
		found = tcp_conn_lookup(ti, c, h.addr, h.length, need_access, &ver);
		ok = found;
		staged = ok && c->hot_type != TE_PLUGIN_MEM_CPU;
		if (staged) {
			stype = c->hot_type;
			sdev = c->hot_dev;
		}
		e = tcp_conn_reserve(c, &idx);
		e->addr = h.addr;
		/* GPU memory is reached through a staging buffer of this connection. */
		if (staged && !(h.op == TCP_OP_READ ? c->tx_stage : c->rx_stage)) {
			uint8_t *buf = malloc(TCP_STAGE);

			if (h.op == TCP_OP_READ)
				c->tx_stage = buf;
			else
				c->rx_stage = buf;
			if (!buf) {
				ok = false;
				snprintf(detail, sizeof(detail),
					 TCP_NAME ": no memory for a staging buffer");
				tcp_resp_error(e, h.op, h.req_id, TE_ERR_NOMEM, detail);
			}
		}
		if (!found) {
			tcp_region_detail(ti, detail, sizeof(detail), h.op, h.addr, h.length, "");
			tcp_resp_error(e, h.op, h.req_id, TE_ERR_REMOTE_ACCESS, detail);
			tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "request from %s rejected: %s", c->who,
				detail);
		}
		rx->pos += TCP_HDR_LEN;
		if (h.op == TCP_OP_READ) {
			if (ok) {
				tcp_encode(e->hdr, TCP_OP_READ, h.req_id, TE_OK, 0, h.length);
				e->payload = (const uint8_t *)(uintptr_t)h.addr;
				e->len = h.length;
				e->memory = true;
				e->ver = ver;
				e->staged = staged;
				e->mem_type = stype;
				e->dev = sdev;
			}
			rx->bulk = true;
			c->frames++;
			continue;
		}
		if (ok)
			tcp_encode(e->hdr, TCP_OP_WRITE, h.req_id, TE_OK, 0, 0);
		e->ready = false;
		c->cur = idx;
		c->cur_ver = ver;
		c->cur_addr = h.addr;
		c->cur_len = h.length;
		/* Deadlines count from this side's clock when the HELLO answer was built. */
		c->cur_deadline = (uint32_t)h.status == TCP_NO_DEADLINE
					  ? UINT64_MAX
					  : c->base_ns + (uint64_t)(uint32_t)h.status * 1000000ull;
		rx->payload = true;
		c->cur_staged = ok && staged;
		c->cur_type = stype;
		c->cur_dev = sdev;
		c->rx_fill = 0;
		c->stage_dev = h.addr;
		rx->dst = !ok ? NULL : staged ? c->rx_stage : (uint8_t *)(uintptr_t)h.addr;
		rx->room = ok && staged ? TCP_STAGE : 0;
		rx->left = h.length;
		/* After a small payload, the next requests are probably small too. */
		rx->small = h.length <= rx->gulp;
		rx->bulk = rx->small;
		tcp_conn_prefix(ti, c);
		if (rx->left)
			return TCP_SRV_PAYLOAD;
		tcp_conn_payload_done(ti, c);
	}
	return TCP_SRV_MORE;
}

/* Send queued handshake bytes. Returns false when @c was closed; *blocked when the socket is full. */
static bool tcp_conn_tx_ctl(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c,
			    bool *blocked)
{
	*blocked = false;
	if (c->base_at_send && c->ctl_off < c->ctl_len) {
		/* Before the HELLO answer's first byte can reach the client (see base_ns). */
		c->base_ns = tcp_now_ns();
		c->base_at_send = false;
	}
	while (c->ctl_off < c->ctl_len) {
		ssize_t r = send(c->fd, c->ctl + c->ctl_off, c->ctl_len - c->ctl_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			*blocked = true;
			return true;
		}
		if (r < 0) {
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, strerror(errno));
			return false;
		}
		c->ctl_off += (uint32_t)r;
	}
	c->ctl_off = c->ctl_len = 0;
	return true;
}

/*
 * The response at the ring's head is a READ of GPU memory: send its header and payload from
 * the connection's staging buffer, refilled (through host->mem_copy, under the region read
 * lock, after the same re-check as host memory gets) a chunk at a time. Returns -1 when @c
 * was closed, 0 when the socket is full, 1 after progress.
 */
static int tcp_conn_tx_staged(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c)
{
	struct tcp_resp *e = &c->ring[c->head];
	uint64_t sent = c->tx_off > TCP_HDR_LEN ? c->tx_off - TCP_HDR_LEN : 0, skip;
	struct iovec iov[2];
	struct msghdr msg = { .msg_iov = iov };
	char detail[TCP_DETAIL_WIRE];
	ssize_t r;

	if (sent == c->txs_base + c->txs_len && sent < e->len) {
		uint64_t n = TCP_MIN((uint64_t)TCP_STAGE, e->len - sent);
		enum te_status st = TE_OK;
		bool there;

		pthread_rwlock_rdlock(&ti->reg_lock);
		there = tcp_region_allows(ti, e->addr + sent, e->len - sent,
					  TE_PLUGIN_ACCESS_REMOTE_READ);
		if (there)
			st = ti->host->mem_copy(ti->ctx, c->tx_stage,
						(const void *)(uintptr_t)(e->addr + sent), n,
						e->mem_type, e->dev, TE_PLUGIN_COPY_TO_HOST);
		pthread_rwlock_unlock(&ti->reg_lock);
		if (!there || st != TE_OK) {
			if (c->tx_off) {
				/* Half sent: the stream cannot be repaired. */
				tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_INFO,
					       there ? "staging copy failed while being read"
						     : "buffer deregistered while being read");
				return -1;
			}
			if (!there) {
				tcp_region_detail(ti, detail, sizeof(detail), TCP_OP_READ, e->addr,
						  e->len, " (deregistered before it was sent)");
				st = TE_ERR_REMOTE_ACCESS;
			} else {
				char kind[24];

				tcp_kind_text(kind, sizeof(kind), e->mem_type, e->dev);
				snprintf(detail, sizeof(detail),
					 TCP_NAME ": READ [0x%" PRIx64 ", +%" PRIu64
						  ") of %s: the staging copy failed (status %d)",
					 e->addr, e->len, kind, (int)st);
			}
			tcp_resp_error(e, TCP_OP_READ, te_plugin_get_u32(e->hdr + 8), st, detail);
			return 1;
		}
		c->txs_base = sent;
		c->txs_len = n;
	}
	skip = sent - c->txs_base;
	msg.msg_iovlen = 0;
	if (c->tx_off < TCP_HDR_LEN)
		iov[msg.msg_iovlen++] =
			(struct iovec){ e->hdr + c->tx_off, TCP_HDR_LEN - c->tx_off };
	iov[msg.msg_iovlen++] = (struct iovec){ c->tx_stage + skip, c->txs_len - skip };
	do
		r = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (r < 0) {
		tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, strerror(errno));
		return -1;
	}
	c->tx_off += (uint64_t)r;
	if (c->tx_off == TCP_HDR_LEN + e->len) {
		c->tx_off = 0;
		c->txs_base = c->txs_len = 0;
		tcp_conn_retire(c, e);
	}
	return 1;
}

/*
 * READ answer @e (the @k-th to go, registrations changed since it was checked) under the
 * registration lock at version @ver: still inside a registered, remote-readable buffer, it is
 * marked checked; no longer, it becomes an error answer, or, when its first bytes already
 * left (the stream cannot be repaired), @c is closed and the lock let go (false).
 */
static bool tcp_conn_tx_recheck(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c,
				struct tcp_resp *e, uint32_t k, uint64_t ver)
{
	char detail[TCP_DETAIL_WIRE];

	if (tcp_region_allows(ti, e->addr, e->len, TE_PLUGIN_ACCESS_REMOTE_READ)) {
		e->ver = ver;
		return true;
	}
	if (k == 0 && c->tx_off) {
		pthread_rwlock_unlock(&ti->reg_lock);
		tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_INFO,
			       "buffer deregistered while being read");
		return false;
	}
	tcp_region_detail(ti, detail, sizeof(detail), TCP_OP_READ, e->addr, e->len,
			  " (deregistered before it was sent)");
	tcp_resp_error(e, TCP_OP_READ, te_plugin_get_u32(e->hdr + 8), TE_ERR_REMOTE_ACCESS, detail);
	return true;
}

/*
 * Send ready responses until the ring is empty or the socket is full. READ payloads go
 * from registered memory, re-checked and sent under the region read lock. Returns false
 * when @c was closed.
 */
static bool tcp_conn_tx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c)
{
	struct iovec iov[TCP_SRV_IOV];
	bool blocked;

	if (!tcp_conn_tx_ctl(ti, w, c, &blocked))
		return false;
	if (blocked)
		return true;
	while (c->count && c->ring[c->head].ready) {
		struct msghdr msg = { .msg_iov = iov };
		uint32_t n_iov = 0, k;
		uint64_t off = c->tx_off, ver = 0;
		bool locked = false;
		ssize_t r;
		int err;

		if (c->ring[c->head].staged) {
			int p = tcp_conn_tx_staged(ti, w, c);

			if (p < 0)
				return false;
			if (p == 0)
				break;
			continue;
		}
		/*
		 * One pass over the answers ready to go: each READ answer's memory is checked
		 * again if the registrations changed since it was (under the registration lock,
		 * taken at the first one and held over the sendmsg), then gathered.
		 */
		for (k = 0; k < c->count && 2 * (k + 1) <= TCP_SRV_IOV; k++) {
			struct tcp_resp *e = &c->ring[(c->head + k) % TCP_SRV_RING];

			/* A staged READ goes alone, from the staging buffer. */
			if (!e->ready || e->staged)
				break;
			if (e->memory) {
				if (!locked) {
					pthread_rwlock_rdlock(&ti->reg_lock);
					ver = atomic_load_explicit(&ti->reg_ver,
								   memory_order_relaxed);
					locked = true;
				}
				if (e->ver != ver && !tcp_conn_tx_recheck(ti, w, c, e, k, ver))
					return false; /* closed, the lock let go */
			}
			if (off < TCP_HDR_LEN)
				iov[n_iov++] =
					(struct iovec){ (void *)(e->hdr + off), TCP_HDR_LEN - off };
			if (e->len) {
				uint64_t skip = off > TCP_HDR_LEN ? off - TCP_HDR_LEN : 0;

				iov[n_iov++] = (struct iovec){ (void *)(e->payload + skip),
							       e->len - skip };
			}
			off = 0;
		}
		msg.msg_iovlen = n_iov;
		r = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		err = errno;
		if (locked)
			pthread_rwlock_unlock(&ti->reg_lock);
		if (r < 0) {
			if (err == EINTR)
				continue;
			if (err == EAGAIN || err == EWOULDBLOCK)
				break;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, strerror(err));
			return false;
		}
		for (uint64_t sent = (uint64_t)r; sent && c->count;) {
			struct tcp_resp *e = &c->ring[c->head];
			uint64_t rem = TCP_HDR_LEN + e->len - c->tx_off;

			if (sent < rem) {
				c->tx_off += sent;
				break;
			}
			sent -= rem;
			c->tx_off = 0;
			tcp_conn_retire(c, e);
		}
	}
	if (c->closing && c->count == 0) {
		tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, NULL);
		return false;
	}
	if (c->rx_paused && c->count < TCP_SRV_RING) {
		c->rx_paused = false;
		tcp_again_add(w, &c->ep);
	}
	return true;
}

/*
 * After a read: a frame still incomplete started when the last complete one ended (or in
 * this wake-up); frame_timeout_ms counts from there, however slowly its bytes trickle in.
 */
static void tcp_conn_frame_clock(struct tcp_conn *c, uint64_t frames_before)
{
	bool partial = c->rx.payload || c->rx.end != c->rx.pos;
	uint64_t now;

	if (!partial && c->frames == frames_before) {
		c->frame_start_ns = 0;
		return;
	}
	now = tcp_now_ns();
	if (c->frames != frames_before)
		c->active_ns = now;
	if (!partial)
		c->frame_start_ns = 0;
	else if (!c->frame_start_ns || c->frames != frames_before)
		c->frame_start_ns = now;
}

/*
 * Read and serve requests on @c until its socket is drained (a short read or EAGAIN). Returns
 * false when closed.
 */
bool tcp_conn_rx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c)
{
	uint64_t budget = TCP_RX_BUDGET, frames_before = c->frames;
	bool drained = false;
	char why[160];

	while (!c->closing && !c->rx_paused) {
		size_t need = TCP_HDR_LEN;
		ssize_t r;

		if (!c->rx.payload) {
			enum tcp_srv pr = tcp_conn_parse(ti, c, &need, why, sizeof(why));

			if (pr == TCP_SRV_CLOSE) {
				c->abort = true;
				tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_INFO, why);
				return false;
			}
			if (pr == TCP_SRV_FULL) {
				c->rx_paused = true;
				break;
			}
			if (c->closing)
				break;
		}
		if (atomic_load_explicit(&c->fenced, memory_order_relaxed)) {
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG,
				       "replaced by a newer connection of its lane (fenced)");
			return false;
		}
		/* The last read took all the socket had, now parsed: the next arrival wakes us. */
		if (tcp_rx_may_stop(&c->rx, drained))
			break;
		if (budget == 0) {
			tcp_again_add(w, &c->ep);
			break;
		}
		if (c->rx.payload && c->rx.dst && c->cur_staged) {
			/* Into this connection's staging buffer: checked when it is flushed. */
			const uint8_t *before = c->rx.dst;

			r = tcp_rx_read(c->fd, &c->rx, w->scratch, TCP_SCRATCH, need, &drained);
			if (r > 0)
				tcp_conn_staged_read(ti, c, before);
		} else if (c->rx.payload && c->rx.dst && !tcp_rx_through(&c->rx)) {
			pthread_rwlock_rdlock(&ti->reg_lock);
			tcp_conn_recheck_locked(ti, c);
			r = tcp_rx_read(c->fd, &c->rx, w->scratch, TCP_SCRATCH, need, &drained);
			pthread_rwlock_unlock(&ti->reg_lock);
		} else {
			r = tcp_rx_read(c->fd, &c->rx, w->scratch, TCP_SCRATCH, need, &drained);
			/* A small payload read through the buffer: copied out under the lock. */
			if (r > 0 && c->rx.payload)
				tcp_conn_prefix(ti, c);
		}
		if (r == -EAGAIN || r == -EWOULDBLOCK)
			break;
		if (r <= 0) {
			bool mid = c->rx.payload || c->rx.end != c->rx.pos;

			snprintf(why, sizeof(why), "%s%s",
				 r == 0 ? "closed by the peer" : "receive: ",
				 r == 0 ? (mid ? " in the middle of a frame" : "")
					: strerror((int)-r));
			tcp_conn_close(ti, w, c, mid ? TE_PLUGIN_LOG_INFO : TE_PLUGIN_LOG_DEBUG,
				       why);
			return false;
		}
		budget -= TCP_MIN(budget, (uint64_t)r);
		if (c->rx.payload && c->rx.left == 0)
			tcp_conn_payload_done(ti, c);
	}
	tcp_conn_frame_clock(c, frames_before);
	return tcp_conn_tx(ti, w, c);
}

void tcp_conn_event(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_conn *c, uint32_t events)
{
	if ((events & EPOLLOUT) && !tcp_conn_tx(ti, w, c))
		return;
	if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		atomic_store_explicit(&c->rx.hup, true, memory_order_relaxed);
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		tcp_conn_rx(ti, w, c);
}

/* A client address as 16 bytes (IPv4 as v4-mapped IPv6), for the per-host limit. */
static void tcp_host_of(const struct sockaddr_storage *sa, uint8_t host[16])
{
	memset(host, 0, 16);
	if (sa->ss_family == AF_INET6) {
		memcpy(host, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	} else {
		host[10] = host[11] = 0xff;
		memcpy(host + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	}
}

/* Why a connection from @host would go over a limit, or NULL. Accepting worker. */
static const char *tcp_accept_limit(struct tcp_inst *ti, const uint8_t host[16], char *text,
				    size_t cap)
{
	uint32_t same;

	/* relaxed: counters; a slot freed a moment ago is simply counted next time */
	if (atomic_load_explicit(&ti->n_conns, memory_order_relaxed) >= ti->max_conns) {
		snprintf(text, cap, "%" PRIu64 " connections open (max_conns)", ti->max_conns);
		return text;
	}
	if (atomic_load_explicit(&ti->n_unauth, memory_order_relaxed) >= ti->max_unauth) {
		snprintf(text, cap, "%" PRIu64 " connections not yet past their %s (max_unauth)",
			 ti->max_unauth, ti->auth ? "HELLO and AUTH" : "HELLO");
		return text;
	}
	same = tcp_host_conns(ti, host, NULL, 0, NULL);
	if (same >= ti->max_conns_per_host) {
		snprintf(text, cap, "%" PRIu32 " connections from this host (max_conns_per_host)",
			 same);
		return text;
	}
	return NULL;
}

void tcp_accept(struct tcp_inst *ti, struct tcp_worker *w0)
{
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t len = sizeof(sa);
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET };
		struct tcp_worker *w;
		struct tcp_conn *c;
		char who[72], text[128];
		uint8_t host[16];
		int fd;

		fd = accept4(ti->listen_fd, (struct sockaddr *)&sa, &len,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				tcp_log(ti, TE_PLUGIN_LOG_WARN, "accept: %s", strerror(errno));
			return;
		}
		tcp_sa_text(&sa, who, sizeof(who));
		tcp_host_of(&sa, host);
		if (tcp_accept_limit(ti, host, text, sizeof(text))) {
			tcp_warn_limited(ti, w0, "connection from %s refused: %s", who, text);
			tcp_sock_abort(fd);
			continue;
		}
		tcp_sock_tune(ti, fd);
		c = calloc(1, sizeof(*c));
		if (c)
			c->rx.buf = malloc(TCP_RBUF);
		if (c)
			c->rx.cap = TCP_RBUF;
		if (!c || !c->rx.buf) {
			tcp_log(ti, TE_PLUGIN_LOG_WARN, "no memory for a connection");
			if (c)
				tcp_conn_free(c);
			close(fd);
			continue;
		}
		c->ep.kind = TCP_EP_CONN;
		c->fd = fd;
		memcpy(c->who, who, sizeof(c->who));
		memcpy(c->host, host, sizeof(c->host));
		c->hs = TCP_CHS_HELLO;
		c->accept_ns = tcp_now_ns();
		atomic_init(&c->fenced, false);
		/* relaxed: a round-robin counter */
		w = &ti->workers[atomic_fetch_add_explicit(&ti->next_conn_worker, 1,
							   memory_order_relaxed) %
				 ti->n_workers];
		c->w = w;
		/* relaxed: counters for the accept limits only */
		atomic_fetch_add_explicit(&ti->n_conns, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&ti->n_unauth, 1, memory_order_relaxed);
		pthread_mutex_lock(&w->lock);
		c->next = w->conns;
		if (w->conns)
			w->conns->prev = c;
		w->conns = c;
		w->n_conns++;
		pthread_mutex_unlock(&w->lock);
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "connection from %s", c->who);
		/* From here the connection belongs to w's thread: do not touch it. */
		ev.data.ptr = &c->ep;
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			/* w's thread owns it now: its next tick closes it (handshake deadline). */
			tcp_log(ti, TE_PLUGIN_LOG_WARN, "epoll_ctl for %s: %s", who,
				strerror(errno));
			pthread_mutex_lock(&w->lock);
			c->accept_ns = 0;
			pthread_mutex_unlock(&w->lock);
		}
	}
}

/*
 * The serving side's time limits: HELLO/AUTH within hello_timeout_ms of accept, each request
 * frame within frame_timeout_ms of its first byte (whatever trickles in), idle connections
 * after idle_timeout_ms; fenced connections go at once. Worker only (it owns its conns).
 */
void tcp_conns_tick(struct tcp_inst *ti, struct tcp_worker *w, uint64_t now)
{
	enum {
		WHY_FENCED,
		WHY_HELLO,
		WHY_FRAME,
		WHY_IDLE
	};
	struct tcp_conn *hit[256];
	uint8_t why[256];
	uint32_t n = 0;

	pthread_mutex_lock(&w->lock);
	for (struct tcp_conn *c = w->conns; c && n < 256; c = c->next) {
		if (atomic_load_explicit(&c->fenced, memory_order_relaxed))
			why[n] = WHY_FENCED;
		else if (c->hs != TCP_CHS_READY &&
			 now - c->accept_ns > ti->hello_timeout_ms * 1000000ull)
			why[n] = WHY_HELLO;
		else if (c->frame_start_ns &&
			 now - c->frame_start_ns > ti->frame_timeout_ms * 1000000ull)
			why[n] = WHY_FRAME;
		else if (ti->idle_timeout_ms && c->hs == TCP_CHS_READY && !c->frame_start_ns &&
			 !c->count && !c->rx.payload &&
			 now - c->active_ns > ti->idle_timeout_ms * 1000000ull)
			why[n] = WHY_IDLE;
		else
			continue;
		hit[n++] = c;
	}
	pthread_mutex_unlock(&w->lock);
	for (uint32_t i = 0; i < n; i++) {
		struct tcp_conn *c = hit[i];
		char text[160];

		switch (why[i]) {
		case WHY_FENCED:
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG,
				       "replaced by a newer connection of its lane (fenced)");
			break;
		case WHY_HELLO:
			snprintf(text, sizeof(text),
				 "connection from %s did not complete its %s within %" PRIu64
				 " ms (hello_timeout_ms): closed",
				 c->who, ti->auth ? "HELLO and AUTH" : "HELLO",
				 ti->hello_timeout_ms);
			tcp_warn_limited(ti, w, "%s", text);
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, "handshake timeout");
			break;
		case WHY_FRAME:
			snprintf(text, sizeof(text),
				 "connection from %s: a request frame was not complete %" PRIu64
				 " ms after its first byte (frame_timeout_ms): closed",
				 c->who, ti->frame_timeout_ms);
			tcp_warn_limited(ti, w, "%s", text);
			c->abort = true;
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, "frame timeout");
			break;
		default:
			tcp_conn_close(ti, w, c, TE_PLUGIN_LOG_DEBUG, "idle (idle_timeout_ms)");
			break;
		}
	}
}
