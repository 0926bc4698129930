/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp_client.c: the initiator side of the tcp transport: lanes, slots, sending, receiving
 * responses, submit and cancel.
 */
#include "tcp.h"

/* --- initiator side: slots and completion ------------------------------------------- */

static void tcp_report(struct tcp_inst *ti, struct te_plugin_slice *s, enum te_status st,
		       const char *detail)
{
	ti->host->slice_done(ti->ctx, s, st, st == TE_OK ? s->length : 0,
			     st == TE_OK ? NULL : detail);
}

/*
 * Slot frees whose counts of slots in use and of the lane's own thread's requests
 * (owner_home) are added in one go (tcp_free_acc_apply_locked), before the lane lock goes.
 */
struct tcp_free_acc {
	uint32_t home; /* the owner value of requests counted in owner_home: 1 + lane index */
	uint32_t used, homes;
};

/* Free slot @id, its counts now or (@acc) accumulated. Under lane lock. */
static inline void tcp_slot_release_locked(struct tcp_lane *l, uint32_t id,
					   struct tcp_free_acc *acc)
{
	struct tcp_slot *slot = &l->slots[id];
	uint32_t tail;

	if (slot->flags & TCP_SLOT_CANCELED)
		l->n_canceled--;
	if (slot->flags & TCP_SLOT_ORPHAN)
		l->n_orphan--;
	if (slot->length >= TCP_DRV_MAX_SLICE)
		l->n_big--;
	if (acc && slot->owner == acc->home)
		acc->homes++;
	else if (slot->owner)
		tcp_owner_add(l, slot->owner - 1u, -1);
	slot->owner = 0;
	slot->slice = NULL;
	slot->flags = 0;
	tail = l->free_head + l->n_free;
	l->free_ids[tail >= l->free_cap ? tail - l->free_cap : tail] = id;
	l->n_free++;
	if (acc)
		acc->used++;
	else
		tcp_used_add(l, -1);
}

static void tcp_slot_free_locked(struct tcp_lane *l, uint32_t id)
{
	tcp_slot_release_locked(l, id, NULL);
}

static inline void tcp_free_acc_apply_locked(struct tcp_lane *l, struct tcp_free_acc *acc)
{
	if (acc->used)
		tcp_used_add(l, -(int)acc->used);
	if (acc->homes)
		tcp_count_add(&l->owner_home, -(int)acc->homes);
	acc->used = acc->homes = 0;
}

/*
 * Slot @id has both SENT and ANSWERED: free it (its counts accumulated in @acc, or now
 * without) and return the slice to report (NULL when it was orphaned by cancel). The status
 * to report is left in priv->status. Under lane lock.
 */
static inline struct te_plugin_slice *tcp_slot_finish_acc_locked(struct tcp_lane *l, uint32_t id,
								 struct tcp_free_acc *acc)
{
	struct tcp_slot *slot = &l->slots[id];
	struct te_plugin_slice *s = slot->slice;

	if (s && (slot->flags & TCP_SLOT_CANCELED)) {
		tcp_priv(s)->status = TE_ERR_CANCELED;
		tcp_priv_detail(s, TCP_NAME ": canceled");
	}
	tcp_slot_release_locked(l, id, acc);
	return s;
}

static struct te_plugin_slice *tcp_slot_finish_locked(struct tcp_lane *l, uint32_t id)
{
	return tcp_slot_finish_acc_locked(l, id, NULL);
}

/*
 * Slot @id was canceled and is now fully sent but unanswered: report it now and let its
 * response be discarded when it comes. Under lane lock; returns the slice to report.
 */
static struct te_plugin_slice *tcp_slot_orphan_locked(struct tcp_lane *l, uint32_t id)
{
	struct tcp_slot *slot = &l->slots[id];
	struct te_plugin_slice *s = slot->slice;

	slot->flags = (uint16_t)((slot->flags & ~TCP_SLOT_CANCELED) | TCP_SLOT_ORPHAN);
	l->n_canceled--;
	l->n_orphan++;
	slot->slice = NULL;
	tcp_priv(s)->status = TE_ERR_CANCELED;
	tcp_priv_detail(s, TCP_NAME ": canceled while in flight");
	return s;
}

/*
 * Report @s with the status and text its priv holds. The text is taken out before the report
 * (the core copies it during the call; the slice is not ours after it) and freed after.
 */
void tcp_report_priv(struct tcp_inst *ti, struct te_plugin_slice *s)
{
	struct tcp_spriv *p = tcp_priv(s);
	char *detail = p->detail;

	p->detail = NULL;
	tcp_report(ti, s, (enum te_status)p->status, detail);
	free(detail);
}

/*
 * Record why @l failed and mark it BROKEN; the caller then gets its worker to run
 * tcp_lane_break (directly, or with tcp_kick_lane). Under lane lock. The socket stays open
 * until the worker aborts it: only the worker closes a lane's socket, and another thread
 * may be inside a (non-blocking) syscall on it.
 */
void tcp_lane_fail_locked(struct tcp_lane *l, enum te_status st, const char *fmt, ...)
{
	va_list ap;

	if (l->state == TCP_LANE_DOWN)
		return;
	if (l->err_status == TE_OK) {
		l->err_status = st;
		va_start(ap, fmt);
		vsnprintf(l->err_detail, sizeof(l->err_detail), fmt, ap);
		va_end(ap);
	}
	l->state = TCP_LANE_BROKEN;
}

static void tcp_rlist_add(struct tcp_rlist *r, struct te_plugin_slice *s)
{
	r->n++;
	tcp_priv(s)->next = NULL;
	if (r->tail)
		tcp_priv(r->tail)->next = s;
	else
		r->head = s;
	r->tail = s;
}

uint32_t tcp_rlist_report(struct tcp_inst *ti, struct tcp_rlist *r)
{
	struct te_plugin_slice *s = r->head;
	uint32_t n = 0;

	r->head = r->tail = NULL;
	r->n = 0;
	while (s) {
		/* Read first: once reported, the core may hand the slice out again at once. */
		struct te_plugin_slice *next = tcp_priv(s)->next;

		tcp_report_priv(ti, s);
		s = next;
		n++;
	}
	return n;
}

static void tcp_fence_add_locked(struct tcp_lane *l, struct te_plugin_slice *s)
{
	struct tcp_spriv *p = tcp_priv(s);

	p->fencing = true;
	p->next = NULL;
	if (l->fence_tail)
		tcp_priv(l->fence_tail)->next = s;
	else
		l->fence_head = s;
	l->fence_tail = s;
	l->n_fence++;
}

static void tcp_fence_unlink_locked(struct tcp_lane *l, struct te_plugin_slice *prev,
				    struct te_plugin_slice *s)
{
	struct te_plugin_slice *next = tcp_priv(s)->next;

	if (prev)
		tcp_priv(prev)->next = next;
	else
		l->fence_head = next;
	if (l->fence_tail == s)
		l->fence_tail = prev;
	l->n_fence--;
	tcp_priv(s)->fencing = false;
	if (!l->n_fence)
		l->fence_unclosed = false;
}

/*
 * Move the slices waiting for a fence to @out: all of them (the server fenced their
 * connections, or cannot apply them any more), or those whose deadline passed by @now (the
 * server drops request bytes that arrive after the deadline stamped in them). Under lane lock.
 */
void tcp_fence_take_locked(struct tcp_lane *l, bool all, uint64_t now, struct tcp_rlist *out)
{
	struct te_plugin_slice *s = l->fence_head, *prev = NULL;

	while (s) {
		struct te_plugin_slice *next = tcp_priv(s)->next;

		if (all || now >= s->deadline_ns) {
			tcp_fence_unlink_locked(l, prev, s);
			tcp_rlist_add(out, s);
		} else {
			prev = s;
		}
		s = next;
	}
}

static void tcp_lane_move(struct tcp_inst *ti, struct tcp_lane *from, struct tcp_rlist *list,
			  struct tcp_rlist *rest, const char *why, bool full);

/*
 * Abort @l's connection (a reset: the kernel drops what it has not sent) and end what it
 * held; the lane is DOWN afterwards and reconnects on demand. Its worker only (or fini).
 * When a sender is still in its loop the lane stays BROKEN: the sender kicks the worker when
 * it leaves.
 *
 * No WRITE lands after it was reported: one whose bytes reached the socket and got no answer
 * may still be in the network or in the server's socket buffer, so it is reported only once
 * that cannot land any more: when a newer connection of this lane was accepted (the server
 * fenced the older ones first), when the server is gone (nobody listens where the old
 * connection was closed by the server, or another instance answers there), or when its
 * deadline passed (the server discards request bytes past the deadline stamped in them).
 * Such a lane reconnects at once to get the fence. Everything else is reported now.
 */
void tcp_lane_break(struct tcp_inst *ti, struct tcp_lane *l, enum te_status st, const char *detail)
{
	struct tcp_rlist now_list = { 0 }, move_list = { 0 };
	char why[TCP_DETAIL_MAX];
	uint32_t n = 0, fenced = 0;
	uint64_t now = tcp_now_ns();
	struct te_plugin_slice *partial;
	enum te_status rst;
	bool gone, closed_by_peer, reconnect = false, unsent, full;

	pthread_mutex_lock(&l->lock);
	if (l->state == TCP_LANE_DOWN) {
		pthread_mutex_unlock(&l->lock);
		return;
	}
	if (l->err_status == TE_OK) {
		l->err_status = st;
		snprintf(l->err_detail, sizeof(l->err_detail), "%s", detail);
	}
	if (l->sending || l->rx_driver) {
		/* The sender, or the driver reading it, kicks us again when it leaves. */
		l->state = TCP_LANE_BROKEN;
		pthread_mutex_unlock(&l->lock);
		return;
	}
	rst = l->err_status;
	snprintf(why, sizeof(why), "%s", l->err_detail);
	closed_by_peer = l->peer_closed;
	gone = rst == TE_ERR_PEER_RESTARTED || (l->refused && !l->fence_unclosed) || l->closing ||
	       atomic_load_explicit(&ti->stopping, memory_order_relaxed);
	partial = l->sq_off ? l->sq_head : NULL;
	/*
	 * No request leaves before the HELLO's answer: none of this connection's reached it.
	 * Nor was any served when the server refused the connection for want of room (its
	 * answer to the HELLO or, with a secret, the AUTH, behind which requests may have gone).
	 */
	full = l->full_refused;
	if (full) {
		l->room_streak++;
		tcp_stat_add(&l->st_room_refused, 1);
	}
	unsent = !gone && ((l->hs == TCP_HS_HELLO &&
			    (rst == TE_ERR_CONN_RESET || rst == TE_ERR_PEER_UNREACHABLE)) ||
			   full);
	if (l->fd >= 0) {
		epoll_ctl(l->w->epfd, EPOLL_CTL_DEL, l->fd, NULL);
		tcp_sock_abort(l->fd);
	}
	l->fd = -1;
	l->state = TCP_LANE_DOWN;
	l->err_status = TE_OK;
	l->err_detail[0] = '\0';
	l->out_kick = false;
	l->peer_closed = false;
	l->send_err = 0;
	l->refused = false;
	l->full_refused = false;
	l->ctl_len = l->ctl_off = 0;
	l->hs = TCP_HS_HELLO;
	l->sq_head = l->sq_tail = NULL;
	l->sq_off = 0;
	for (uint32_t id = 0; id < l->free_cap; id++) {
		struct tcp_slot *slot = &l->slots[id];
		struct te_plugin_slice *s = slot->slice;
		bool on_wire, canceled;

		if (!(slot->flags & TCP_SLOT_USED))
			continue;
		on_wire = slot->op == TCP_OP_WRITE && !(slot->flags & TCP_SLOT_ANSWERED) &&
			  ((slot->flags & TCP_SLOT_SENT) || (s && s == partial));
		canceled = (slot->flags & TCP_SLOT_CANCELED) != 0;
		tcp_slot_free_locked(l, id);
		if (!s)
			continue; /* orphan: already reported */
		n++;
		tcp_priv(s)->status = canceled ? TE_ERR_CANCELED : rst;
		tcp_priv_detail(s, "%s", canceled ? TCP_NAME ": canceled while in flight" : why);
		if (on_wire && !gone && !full && now < s->deadline_ns) {
			tcp_fence_add_locked(l, s);
			fenced++;
		} else if (unsent && !canceled && now < s->deadline_ns) {
			tcp_rlist_add(&move_list, s);
		} else {
			tcp_rlist_add(&now_list, s);
		}
	}
	if (fenced && !closed_by_peer)
		l->fence_unclosed = true;
	tcp_fence_take_locked(l, gone, now, &now_list);
	l->rx.pos = l->rx.end = 0;
	tcp_rx_restore(&l->rx);
	l->wired_ok = false;
	l->expect_st = TCP_EXPECT_FIRST;
	l->rx.payload = false;
	l->rx.left = 0;
	l->rx.dst = NULL;
	l->rx.bulk = false;
	l->rx_missed = l->rx_want = l->rx_quiet = false;
	atomic_store_explicit(&l->rx.hup, false, memory_order_relaxed);
	l->stall_ticks = 0;
	if (l->n_fence && now - l->fence_connect_ns >= TCP_TICK_MS * 1000000ull) {
		l->fence_connect_ns = now;
		tcp_lane_connect_locked(ti, l);
		reconnect = l->state == TCP_LANE_BROKEN;
	}
	pthread_mutex_unlock(&l->lock);

	if (n || rst != TE_ERR_CANCELED)
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
			"lane %u to %s closed, %u request(s) failed (%u wait for the server's "
			"fence): %s",
			l->index, l->peer->name, n, fenced, why);
	if (move_list.n)
		tcp_lane_move(ti, l, &move_list, &now_list, why, full);
	tcp_rlist_report(ti, &now_list);
	if (reconnect)
		tcp_kick_lane(l); /* the connect failed at once: break again (no fence yet) */
}

/* --- initiator side: sending ---------------------------------------------------------- */

/* Bytes of @s's request frame on the wire. */
static uint64_t tcp_frame_len(const struct te_plugin_slice *s)
{
	return TCP_HDR_LEN + (s->opcode == TE_PLUGIN_OP_WRITE ? s->length : 0);
}

/*
 * Slot @id's request goes on the wire (gathered for a sendmsg the first time): it is
 * answered after the one before it (a server answers a connection's requests in order),
 * which scatter reads foresee. Linked here, not once sent: the answers to the first
 * requests of a batch often arrive before the sender is back from sendmsg. Under lane lock.
 */
static void tcp_lane_wired_locked(struct tcp_lane *l, uint32_t id)
{
	uint32_t rid = tcp_slot_rid(&l->slots[id], id);

	l->slots[id].flags |= TCP_SLOT_WIRED;

	if (l->wired_ok) {
		struct tcp_slot *prev = &l->slots[l->wired_last & 0xffffu];

		if ((prev->flags & TCP_SLOT_USED) && prev->gen == (uint16_t)(l->wired_last >> 16)) {
			prev->next = rid;
			prev->flags |= TCP_SLOT_NEXT;
		}
	}
	if (l->expect_st == TCP_EXPECT_FIRST ||
	    (l->expect_st == TCP_EXPECT_AFTER && l->wired_ok && l->wired_last == l->expect)) {
		l->expect = rid;
		l->expect_st = TCP_EXPECT_ID;
	}
	l->wired_last = rid;
	l->wired_ok = true;
}

/*
 * The answer to slot @id arrived (foreseen or not): the next one expected is that to the
 * request sent after it. Under lane lock, before the slot is freed.
 */
static void tcp_lane_expect_locked(struct tcp_lane *l, uint32_t id)
{
	const struct tcp_slot *slot = &l->slots[id];

	if (slot->flags & TCP_SLOT_NEXT) {
		l->expect = slot->next;
		l->expect_st = TCP_EXPECT_ID;
	} else {
		l->expect = tcp_slot_rid(slot, id);
		l->expect_st = TCP_EXPECT_AFTER;
	}
}

/*
 * Account @sent bytes of the gathered queue prefix. Slots whose request is now complete
 * become SENT; those that can finish are collected into @rep. Under lane lock.
 */
static uint32_t tcp_lane_advance_locked(struct tcp_lane *l, uint64_t sent,
					struct te_plugin_slice **rep)
{
	uint32_t n = 0;

	if (l->ctl_off < l->ctl_len) {
		uint64_t take = TCP_MIN(sent, (uint64_t)(l->ctl_len - l->ctl_off));

		l->ctl_off += (uint32_t)take;
		sent -= take;
		if (l->ctl_off == l->ctl_len)
			l->ctl_off = l->ctl_len = 0;
	}
	while (sent && l->sq_head) {
		struct te_plugin_slice *s = l->sq_head;
		struct tcp_spriv *p = tcp_priv(s);
		uint64_t rem = tcp_frame_len(s) - l->sq_off;
		uint32_t id = atomic_load_explicit(&p->slot, memory_order_relaxed);
		struct tcp_slot *slot = &l->slots[id];

		if (sent < rem) {
			l->sq_off += sent;
			break;
		}
		sent -= rem;
		l->sq_off = 0;
		l->sq_head = p->next;
		if (!l->sq_head)
			l->sq_tail = NULL;
		slot->flags = (uint16_t)((slot->flags & ~TCP_SLOT_IN_IOV) | TCP_SLOT_SENT);
		if (slot->flags & TCP_SLOT_ANSWERED)
			rep[n++] = tcp_slot_finish_locked(l, id);
		else if ((slot->flags & TCP_SLOT_CANCELED) && !(slot->flags & TCP_SLOT_RECV) &&
			 slot->op == TCP_OP_READ)
			rep[n++] = tcp_slot_orphan_locked(l, id); /* a WRITE waits for its fence */
	}
	/* Gathered but not (completely) sent: cancel may unqueue them again. */
	for (struct te_plugin_slice *s = l->sq_head; s; s = tcp_priv(s)->next) {
		struct tcp_slot *slot =
			&l->slots[atomic_load_explicit(&tcp_priv(s)->slot, memory_order_relaxed)];

		if (!(slot->flags & TCP_SLOT_IN_IOV))
			break;
		slot->flags &= (uint16_t)~TCP_SLOT_IN_IOV;
	}
	return n;
}

/* Whether @l has bytes to send: handshake frames, or requests once the HELLO was answered. */
static bool tcp_lane_has_output_locked(const struct tcp_lane *l)
{
	return l->ctl_off < l->ctl_len || (l->hs != TCP_HS_HELLO && l->sq_head);
}

/*
 * The request deadline field of @s on @l: milliseconds from the connection's base (when its
 * HELLO answer arrived here), rounded down. The server counts them from right before it sent
 * that answer, which is earlier in real time, so the server's deadline falls at or before the
 * slice's: a WRITE byte it takes in before its deadline was taken in before the slice's.
 */
static uint32_t tcp_deadline_field(const struct tcp_lane *l, const struct te_plugin_slice *s)
{
	uint64_t ms;

	if (!s->deadline_ns || s->deadline_ns == UINT64_MAX)
		return TCP_NO_DEADLINE;
	if (s->deadline_ns <= l->base_ns)
		return 0;
	ms = (s->deadline_ns - l->base_ns) / 1000000u;
	return ms >= TCP_NO_DEADLINE ? TCP_NO_DEADLINE - 1 : (uint32_t)ms;
}

/*
 * What @l's worker hears of: everything (@on) or, while a driver reads and sends for it
 * (quiet), only hang-ups and errors. EPOLLIN always when on; EPOLLOUT only when output waits
 * (armed again by the sender that finds the socket full): re-armed, an edge-triggered socket
 * reports what is ready at once, and room to write nearly always is. Under lock, lane UP.
 */
static void tcp_lane_listen_locked(struct tcp_lane *l, bool on)
{
	bool out = on && tcp_lane_has_output_locked(l);
	struct epoll_event ev = { .events = (on ? EPOLLIN : 0u) | (out ? EPOLLOUT : 0u) |
					    EPOLLRDHUP | EPOLLET,
				  .data.ptr = &l->ep };

	if (epoll_ctl(l->w->epfd, EPOLL_CTL_MOD, l->fd, &ev) == 0) {
		l->rx_quiet = !on;
		l->out_armed = out;
	} else if (on) {
		tcp_lane_fail_locked(l, TE_ERR_SYSTEM, TCP_NAME ": epoll_ctl for %s: %s",
				     l->peer->name, strerror(errno));
	}
}

void tcp_lane_send_failed_locked(struct tcp_lane *l, int err)
{
	tcp_lane_fail_locked(l, TE_ERR_CONN_RESET, TCP_NAME ": send to %s (%s) lane %u failed: %s",
			     l->peer->name, l->peer->addr_text, l->index, strerror(err));
}

/*
 * @l's last sendmsg had more header-only frames than its txh holds: room for TCP_TXH_FRAMES
 * (without memory, it goes on with what it has). Under lane lock, by the sender before it
 * gathers: no copy in txh is in use then.
 */
static void tcp_lane_txh_grow_locked(struct tcp_lane *l)
{
	uint8_t *t = malloc(TCP_TXH_FRAMES * TCP_HDR_LEN);

	l->txh_short = false;
	if (!t)
		return;
	free(l->txh);
	l->txh = t;
	l->txh_cap = TCP_TXH_FRAMES;
}

/*
 * Send what is queued on @l until the queue is empty or the socket is full. Any thread; one
 * sender at a time (l->sending), others leave their requests to it. The socket stays open
 * while l->sending is set because only the worker closes it, and only when nobody sends.
 */
static void tcp_lane_flush(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct iovec iov[TCP_LANE_IOV];
	/* A sendmsg ends at most the frames it gathered: TCP_LANE_FRAMES. */
	struct te_plugin_slice *rep[TCP_LANE_FRAMES];
	bool kick, read_answer = false;

	pthread_mutex_lock(&l->lock);
	if (l->sending) {
		/* The active sender goes around once more. */
		l->out_kick = true;
		pthread_mutex_unlock(&l->lock);
		return;
	}
	if (l->state != TCP_LANE_UP || l->send_err || !tcp_lane_has_output_locked(l)) {
		pthread_mutex_unlock(&l->lock);
		return;
	}
	l->sending = true;
	while (l->state == TCP_LANE_UP && !l->send_err && tcp_lane_has_output_locked(l)) {
		struct msghdr msg = { .msg_iov = iov };
		uint64_t off = l->sq_off;
		/* The deadline field of the last deadline seen (a submit's slices share one). */
		uint64_t dl_ns = 0;
		uint32_t dl_field = TCP_NO_DEADLINE;
		uint32_t n_iov = 0, n_rep, n_txh = 0, n_frames = 0;
		uint8_t *txe; /* end of the header copies so far */
		int fd = l->fd, err;
		ssize_t r;

		l->out_kick = false;
		if (l->txh_short)
			tcp_lane_txh_grow_locked(l);
		txe = l->txh;
		if (l->ctl_off < l->ctl_len)
			iov[n_iov++] =
				(struct iovec){ l->ctl + l->ctl_off, l->ctl_len - l->ctl_off };
		for (struct te_plugin_slice *s = l->hs != TCP_HS_HELLO ? l->sq_head : NULL;
		     s && n_iov + 2 <= TCP_LANE_IOV && n_frames < TCP_LANE_FRAMES;
		     s = tcp_priv(s)->next, n_frames++) {
			struct tcp_spriv *p = tcp_priv(s);
			uint32_t id = atomic_load_explicit(&p->slot, memory_order_relaxed);

			if (!(l->slots[id].flags & TCP_SLOT_WIRED))
				tcp_lane_wired_locked(l, id);
			l->slots[id].flags |= TCP_SLOT_IN_IOV;
			/* Stamped while no byte of the frame left (again, to the same value). */
			if (off == 0) {
				if (s->deadline_ns != dl_ns) {
					dl_ns = s->deadline_ns;
					dl_field = tcp_deadline_field(l, s);
				}
				te_plugin_put_u32(p->hdr + 12, dl_field);
			}
			if (off < TCP_HDR_LEN && n_txh++ < l->txh_cap) {
				/* A copy beside the previous one: one iovec for a run of them. */
				struct iovec *last = n_iov ? &iov[n_iov - 1] : NULL;

				if (off == 0) /* a fixed size: two moves, no call */
					memcpy(txe, p->hdr, TCP_HDR_LEN);
				else
					memcpy(txe, p->hdr + off, TCP_HDR_LEN - off);
				if (last && (uint8_t *)last->iov_base + last->iov_len == txe)
					last->iov_len += TCP_HDR_LEN - off;
				else
					iov[n_iov++] = (struct iovec){ txe, TCP_HDR_LEN - off };
				txe += TCP_HDR_LEN - off;
			} else if (off < TCP_HDR_LEN) {
				iov[n_iov++] = (struct iovec){ p->hdr + off, TCP_HDR_LEN - off };
			}
			if (s->opcode == TE_PLUGIN_OP_WRITE) {
				uint64_t skip = off > TCP_HDR_LEN ? off - TCP_HDR_LEN : 0;

				iov[n_iov++] = (struct iovec){ (uint8_t *)s->local + skip,
							       s->length - skip };
			}
			off = 0;
		}
		msg.msg_iovlen = n_iov;
		l->txh_short = n_txh > l->txh_cap && l->txh_cap < TCP_TXH_FRAMES;
		pthread_mutex_unlock(&l->lock);
		r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		err = errno;
		pthread_mutex_lock(&l->lock);
		if (r > 0) {
			atomic_fetch_add_explicit(&l->progress, (uint64_t)r, memory_order_relaxed);
			tcp_stat_add(&l->st_sends, 1);
		}
		n_rep = tcp_lane_advance_locked(l, r > 0 ? (uint64_t)r : 0, rep);
		if (n_rep) {
			pthread_mutex_unlock(&l->lock);
			for (uint32_t i = 0; i < n_rep; i++)
				tcp_report_priv(ti, rep[i]);
			pthread_mutex_lock(&l->lock);
		}
		if (r >= 0 || err == EINTR)
			continue;
		if (err == EAGAIN || err == EWOULDBLOCK) {
			/* Writable again meanwhile? Then the edge is gone: try once more. */
			if (l->out_kick)
				continue;
			/*
			 * The worker must hear when there is room (a quiet lane's driver
			 * sends itself). Armed now, EPOLLOUT reports room that came meanwhile.
			 */
			if (!l->out_armed && !l->rx_quiet)
				tcp_lane_listen_locked(l, true);
			break;
		}
		if (err == EPIPE || err == ECONNRESET)
			l->peer_closed = true;
		if ((err == EPIPE || err == ECONNRESET) && l->hs != TCP_HS_READY) {
			/* Its answer first: a refusal queued before the reset says why. */
			l->send_err = err;
			l->send_err_ns = tcp_now_ns();
			l->rx_want = true;
			read_answer = true;
			break;
		}
		tcp_lane_send_failed_locked(l, err);
	}
	l->sending = false;
	kick = l->state == TCP_LANE_BROKEN || read_answer;
	pthread_mutex_unlock(&l->lock);
	if (kick)
		tcp_kick_lane(l);
}

/*
 * Open @l's socket and start connecting, with a HELLO queued: the next epoch of this lane, a
 * fresh client nonce. Under lane lock; the lane is DOWN.
 */
void tcp_lane_connect_locked(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct tcp_peer *peer = l->peer;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
				  .data.ptr = &l->ep };
	uint8_t *b = l->ctl + TCP_HDR_LEN;
	int fd;

	l->err_status = TE_OK;
	l->err_detail[0] = '\0';
	l->connect_start_ns = tcp_now_ns();
	l->refused = false;
	l->peer_closed = false;
	l->send_err = 0;
	l->hs = TCP_HS_HELLO;
	l->epoch++;
	tcp_stat_add(&l->st_connects, 1);
	if (!tcp_random(l->nonce_c, TCP_NONCE)) {
		l->state = TCP_LANE_CONNECTING; /* so that fail records the reason */
		tcp_lane_fail_locked(l, TE_ERR_SYSTEM, TCP_NAME ": no random bytes for a nonce: %s",
				     strerror(errno));
		return;
	}
	tcp_encode(l->ctl, TCP_OP_HELLO, 0, 0, peer->nonce, TCP_HELLO_REQ);
	te_plugin_put_u64(b, peer->cid);
	te_plugin_put_u64(b + 8, l->epoch);
	te_plugin_put_u32(b + 16, l->index);
	te_plugin_put_u32(b + 20, ti->auth ? TCP_HELLO_SECRET : 0);
	memcpy(b + 24, l->nonce_c, TCP_NONCE);
	l->ctl_len = TCP_HDR_LEN + TCP_HELLO_REQ;
	l->ctl_off = 0;
	fd = socket(peer->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		l->state = TCP_LANE_CONNECTING; /* so that fail records the reason */
		tcp_lane_fail_locked(l, TE_ERR_PEER_UNREACHABLE,
				     TCP_NAME ": cannot create a socket for %s: %s", peer->name,
				     strerror(errno));
		return;
	}
	tcp_sock_tune(ti, fd);
	l->fd = fd;
	if (connect(fd, (const struct sockaddr *)&peer->sa, peer->salen) == 0) {
		l->state = TCP_LANE_UP;
	} else if (errno == EINPROGRESS) {
		l->state = TCP_LANE_CONNECTING;
	} else {
		l->state = TCP_LANE_CONNECTING;
		l->refused = errno == ECONNREFUSED;
		tcp_lane_fail_locked(l, TE_ERR_PEER_UNREACHABLE,
				     TCP_NAME ": connect to %s (%s) failed: %s", peer->name,
				     peer->addr_text, strerror(errno));
		return;
	}
	if (epoll_ctl(l->w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
		tcp_lane_fail_locked(l, TE_ERR_SYSTEM, TCP_NAME ": epoll_ctl for %s: %s",
				     peer->name, strerror(errno));
	else
		l->out_armed = true;
}

/*
 * Buffered bytes of the READ payload in progress, unless its slice was canceled. Under lane
 * lock: cancel orphans a slot (and sets rx_redirect) under it, so no byte is copied into the
 * destination of a READ once its cancel returned.
 */
static void tcp_lane_prefix_locked(struct tcp_lane *l)
{
	if (l->rx.end == l->rx.pos)
		return;
	if (atomic_load_explicit(&l->rx_redirect, memory_order_relaxed))
		l->rx.dst = NULL;
	tcp_rx_prefix(&l->rx);
}

/* The READ payload of slot l->rx_slot arrived completely. Worker only, under lane lock. */
static void tcp_lane_payload_done_locked(struct tcp_lane *l, struct tcp_rlist *done)
{
	struct tcp_slot *slot = &l->slots[l->rx_slot];
	struct te_plugin_slice *s = NULL;

	l->rx.payload = false;
	l->rx.dst = NULL;
	slot->flags = (uint16_t)((slot->flags & ~TCP_SLOT_RECV) | TCP_SLOT_ANSWERED);
	if (slot->flags & TCP_SLOT_SENT)
		s = tcp_slot_finish_locked(l, l->rx_slot);
	if (s)
		tcp_rlist_add(done, s);
}

enum tcp_parse {
	TCP_PARSE_MORE,	   /* need more bytes (*need says how many for exact reads) */
	TCP_PARSE_PAYLOAD, /* a payload is being received */
	TCP_PARSE_FAIL,	   /* the lane must break: *st and why say how */
	TCP_PARSE_NEXT,	   /* a frame was handled: go on */
	TCP_PARSE_LIMIT,   /* @limit slices completed: the rest waits in the buffer */
};

/*
 * The answer to this connection's HELLO or AUTH. Worker only. The server proves the secret
 * in its HELLO answer before this side proves it (and before any request leaves); a READY
 * connection means the server fenced every older connection of this lane, so the WRITEs
 * waiting for that are reported here.
 */
static enum tcp_parse tcp_lane_handshake(struct tcp_inst *ti, struct tcp_lane *l,
					 const struct tcp_hdr *h, uint32_t avail, size_t *need,
					 enum te_status *st, char *why, size_t why_len)
{
	struct tcp_rx *rx = &l->rx;
	struct tcp_peer *peer = l->peer;
	uint8_t want = l->hs == TCP_HS_HELLO ? TCP_OP_HELLO : TCP_OP_AUTH;
	uint64_t ok_len = want == TCP_OP_HELLO ? TCP_HELLO_ANS : 0;
	struct tcp_rlist fenced = { 0 };
	const uint8_t *b;

	*st = TE_ERR_CONN_RESET;
	if (h->op != want || h->req_id != 0 || (h->status == TE_OK && h->length != ok_len) ||
	    (h->status != TE_OK &&
	     (h->status > -1 || h->status < -139 || h->length > TCP_DETAIL_WIRE))) {
		snprintf(why, why_len,
			 TCP_NAME ": protocol error from %s (%s): bad answer to %s (op %u, status "
				  "%" PRId32 ", %" PRIu64 " bytes)",
			 peer->name, peer->addr_text, want == TCP_OP_HELLO ? "HELLO" : "AUTH",
			 h->op, h->status, h->length);
		return TCP_PARSE_FAIL;
	}
	if (avail < TCP_HDR_LEN + h->length) {
		*need = TCP_HDR_LEN + (size_t)h->length - avail;
		return TCP_PARSE_MORE;
	}
	b = rx->buf + rx->pos + TCP_HDR_LEN;
	if (h->status != TE_OK || (want == TCP_OP_HELLO && h->addr != peer->nonce)) {
		char text[TCP_DETAIL_WIRE + 1];

		*st = h->status == TE_OK ? TE_ERR_PEER_RESTARTED : (enum te_status)h->status;
		tcp_copy_detail(text, sizeof(text), b, h->status == TE_OK ? 0 : (size_t)h->length);
		if (*st == TE_ERR_AGAIN) {
			/* No room for this lane: the server served nothing of this connection. */
			pthread_mutex_lock(&l->lock);
			l->full_refused = true;
			pthread_mutex_unlock(&l->lock);
		}
		if (*st == TE_ERR_PEER_RESTARTED) {
			snprintf(why, why_len,
				 TCP_NAME ": %s (%s) is another instance now (restarted; expected "
					  "instance %016" PRIx64 ")",
				 peer->name, peer->addr_text, peer->nonce);
		} else {
			/* The server's text starts with our name too: once is enough. */
			static const char own[] = TCP_NAME ": ";
			const char *reason = text;

			if (!strncmp(reason, own, sizeof(own) - 1))
				reason += sizeof(own) - 1;
			snprintf(why, why_len, TCP_NAME ": %s (%s) refused the connection: %s",
				 peer->name, peer->addr_text, reason);
		}
		return TCP_PARSE_FAIL;
	}
	if (want == TCP_OP_HELLO && (te_plugin_get_u32(b) & TCP_HELLO_SECRET)) {
		uint8_t tr[TCP_TRANSCRIPT], mac[TE_PLUGIN_MAC_SIZE];

		*st = TE_ERR_AUTH;
		if (!ti->auth) {
			snprintf(why, why_len,
				 TCP_NAME
				 ": %s (%s) requires authentication on its data port; this "
				 "engine has no secret (auth.secret)",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		tcp_transcript(tr, true, peer->nonce, peer->cid, l->epoch, l->index, l->nonce_c,
			       b + 8);
		if (ti->host->auth_check(ti->ctx, tr, sizeof(tr), b + 8 + TCP_NONCE) != TE_OK) {
			snprintf(why, why_len,
				 TCP_NAME ": %s (%s) did not prove the shared secret on its data "
					  "port: refused",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		tcp_transcript(tr, false, peer->nonce, peer->cid, l->epoch, l->index, l->nonce_c,
			       b + 8);
		if (ti->host->auth_mac(ti->ctx, tr, sizeof(tr), mac) != TE_OK) {
			snprintf(why, why_len, TCP_NAME ": cannot compute the proof for %s (%s)",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		pthread_mutex_lock(&l->lock);
		/* Behind what is left of the HELLO (the answer may overtake the bookkeeping). */
		tcp_encode(l->ctl + l->ctl_len, TCP_OP_AUTH, 0, 0, 0, TE_PLUGIN_MAC_SIZE);
		memcpy(l->ctl + l->ctl_len + TCP_HDR_LEN, mac, sizeof(mac));
		l->ctl_len += TCP_HDR_LEN + TE_PLUGIN_MAC_SIZE;
		l->hs = TCP_HS_AUTH;
		l->base_ns = tcp_now_ns();
		pthread_mutex_unlock(&l->lock);
	} else {
		if (want == TCP_OP_HELLO && ti->auth) {
			*st = TE_ERR_AUTH;
			snprintf(why, why_len,
				 TCP_NAME ": %s (%s) serves its data port without authentication, "
					  "but this engine has a secret: refused",
				 peer->name, peer->addr_text);
			return TCP_PARSE_FAIL;
		}
		pthread_mutex_lock(&l->lock);
		if (want == TCP_OP_HELLO)
			l->base_ns = tcp_now_ns();
		l->hs = TCP_HS_READY;
		l->full_noted = false; /* served: a later refusal is news again */
		l->room_streak = l->room_wait_ms = 0;
		tcp_fence_take_locked(l, true, 0, &fenced);
		/* Its own instance answers again: a later restart is news again. */
		atomic_store_explicit(&peer->restarted, false, memory_order_relaxed);
		pthread_mutex_unlock(&l->lock);
	}
	rx->pos += TCP_HDR_LEN + (uint32_t)h->length;
	rx->bulk = true;
	l->rx_flush = true;
	tcp_rlist_report(ti, &fenced);
	return TCP_PARSE_NEXT;
}

/*
 * Handle every complete response in @l's buffer (finishing the READ payload in progress
 * first when it is all here). Worker only. Validates each header against the slot it names:
 * a server cannot complete a request it was not sent, nor deliver more bytes than were asked
 * for. One lane lock hold covers every answer in the buffer; the slices they complete are
 * collected in @done, for the caller to report without locks.
 */
static enum tcp_parse tcp_lane_parse(struct tcp_inst *ti, struct tcp_lane *l, size_t *need,
				     enum te_status *st, char *why, size_t why_len,
				     struct tcp_rlist *done, uint32_t limit)
{
	struct tcp_rx *rx = &l->rx;
	struct tcp_peer *peer = l->peer;
	enum tcp_parse ret = TCP_PARSE_MORE;
	bool locked = false;
	struct tcp_hdr h;

	if (rx->payload) {
		if (rx->left && rx->end == rx->pos)
			return TCP_PARSE_PAYLOAD;
		pthread_mutex_lock(&l->lock);
		locked = true;
		tcp_lane_prefix_locked(l);
		if (rx->left) {
			ret = TCP_PARSE_PAYLOAD;
			goto out;
		}
		tcp_lane_payload_done_locked(l, done);
	}
	for (;;) {
		uint32_t avail = rx->end - rx->pos;
		struct te_plugin_slice *fin = NULL;
		struct tcp_slot *slot;
		uint32_t id;

		if (done->n >= limit) {
			ret = TCP_PARSE_LIMIT;
			goto out;
		}
		if (avail < TCP_HDR_LEN) {
			*need = TCP_HDR_LEN - avail;
			ret = TCP_PARSE_MORE;
			goto out;
		}
		tcp_hdr_decode(rx->buf + rx->pos, &h);
		*st = TE_ERR_CONN_RESET;
		if (h.magic != TCP_WIRE_MAGIC || h.version != TCP_WIRE_VERSION || h.flags) {
			snprintf(why, why_len,
				 TCP_NAME ": protocol error from %s (%s): bad frame header (magic "
					  "0x%08" PRIx32 ", version %u)",
				 peer->name, peer->addr_text, h.magic, h.version);
			ret = TCP_PARSE_FAIL;
			goto out;
		}
		/* hs changes only on this thread while the lane is UP. */
		if (l->hs != TCP_HS_READY) {
			if (locked) {
				pthread_mutex_unlock(&l->lock);
				locked = false;
			}
			ret = tcp_lane_handshake(ti, l, &h, avail, need, st, why, why_len);
			if (ret != TCP_PARSE_NEXT)
				goto out;
			continue;
		}
		id = h.req_id & 0xffffu;
		if (h.op != TCP_OP_READ && h.op != TCP_OP_WRITE)
			goto bad_id;
		if (h.status != TE_OK) {
			/* Errors carry a short detail; wait until it is all here. */
			if (h.status > -1 || h.status < -139 || h.length > TCP_DETAIL_WIRE) {
				snprintf(why, why_len,
					 TCP_NAME ": protocol error from %s (%s): bad error frame "
						  "(status %" PRId32 ", %" PRIu64 " bytes)",
					 peer->name, peer->addr_text, h.status, h.length);
				ret = TCP_PARSE_FAIL;
				goto out;
			}
			if (avail < TCP_HDR_LEN + h.length) {
				*need = TCP_HDR_LEN + (size_t)h.length - avail;
				ret = TCP_PARSE_MORE;
				goto out;
			}
		}
		if (!locked) {
			pthread_mutex_lock(&l->lock);
			locked = true;
		}
		if (id >= l->free_cap) /* never handed out (the table grows under the lock) */
			goto bad_id;
		slot = &l->slots[id];
		/* An answer may overtake the sender's bookkeeping (IN_IOV), not the request. */
		if (!(slot->flags & TCP_SLOT_USED) || slot->gen != (uint16_t)(h.req_id >> 16) ||
		    slot->op != h.op || !(slot->flags & (TCP_SLOT_SENT | TCP_SLOT_IN_IOV)) ||
		    (slot->flags & (TCP_SLOT_ANSWERED | TCP_SLOT_RECV)) ||
		    (h.status == TE_OK && h.length != (h.op == TCP_OP_READ ? slot->length : 0)))
			goto bad_id;
		if (h.status == TE_OK && h.op == TCP_OP_READ) {
			/* Orphans (canceled and reported) are drained, never written to. */
			tcp_lane_expect_locked(l, id);
			slot->flags |= TCP_SLOT_RECV;
			rx->dst = slot->slice ? (uint8_t *)slot->slice->local : NULL;
			/* relaxed: written and read under l->lock or l->rx_lock */
			atomic_store_explicit(&l->rx_redirect, false, memory_order_relaxed);
			rx->pos += TCP_HDR_LEN;
			rx->payload = true;
			rx->left = h.length;
			/* After a small payload, the next answers are probably small too. */
			rx->small = h.length <= rx->gulp;
			rx->bulk = rx->small;
			l->rx_slot = id;
			tcp_lane_prefix_locked(l);
			if (rx->left) {
				ret = TCP_PARSE_PAYLOAD;
				goto out;
			}
			tcp_lane_payload_done_locked(l, done);
			continue;
		}
		if (h.status != TE_OK && slot->slice) {
			tcp_priv(slot->slice)->status = h.status;
			tcp_priv_detail_peer(slot->slice, rx->buf + rx->pos + TCP_HDR_LEN,
					     (size_t)h.length);
		}
		tcp_lane_expect_locked(l, id);
		slot->flags |= TCP_SLOT_ANSWERED;
		if (slot->flags & TCP_SLOT_SENT)
			fin = tcp_slot_finish_locked(l, id);
		if (fin)
			tcp_rlist_add(done, fin);
		rx->pos += TCP_HDR_LEN + (uint32_t)(h.status != TE_OK ? h.length : 0);
		rx->bulk = true;
	}

bad_id:
	snprintf(why, why_len,
		 TCP_NAME
		 ": protocol error from %s (%s): unexpected response (op %u, id 0x%08" PRIx32
		 ", status %" PRId32 ", %" PRIu64 " bytes)",
		 peer->name, peer->addr_text, h.op, h.req_id, h.status, h.length);
	ret = TCP_PARSE_FAIL;
out:
	if (locked)
		pthread_mutex_unlock(&l->lock);
	return ret;
}

/* One answer a scatter read foresees (tcp_lane_rx_scatter). */
struct tcp_chain {
	uint32_t rid;  /* its request id */
	uint8_t op;    /* TCP_OP_READ or TCP_OP_WRITE */
	uint64_t len;  /* payload bytes the answer carries */
	uint64_t take; /* ... of which this read asks for (the last one may be cut short) */
	uint8_t *dst;
};

/*
 * The answer at buf + pos did not match what a scatter read foresaw in @ch[@k], and the
 * @left bytes read behind its header went to the places foreseen for what followed: put
 * them behind that header in a buffer of their own, for the parser (the lane's own waits in
 * rx->spare until it is read). Returns false when there is no memory for it.
 */
static bool tcp_lane_rx_replay(struct tcp_lane *l, const struct tcp_chain *ch, uint32_t n,
			       uint32_t k, uint64_t left)
{
	struct tcp_rx *rx = &l->rx;
	uint32_t cap = (uint32_t)TCP_MAX((uint64_t)rx->cap,
					 TCP_HDR_LEN + left + TCP_HDR_LEN + TCP_DETAIL_WIRE);
	uint8_t *nb = malloc(cap), *p;

	if (!nb)
		return false;
	memcpy(nb, rx->buf + rx->pos, TCP_HDR_LEN);
	p = nb + TCP_HDR_LEN;
	for (uint32_t j = k; j < n && left; j++) {
		uint64_t c;

		if (j > k) {
			c = TCP_MIN(left, (uint64_t)TCP_HDR_LEN);
			memcpy(p, rx->buf + rx->pos + (j - k) * TCP_HDR_LEN, c);
			p += c;
			left -= c;
		}
		c = TCP_MIN(left, ch[j].take);
		memcpy(p, ch[j].dst, c);
		p += c;
		left -= c;
	}
	/* The header read ahead behind the last one foreseen. */
	memcpy(p, rx->buf + rx->pos + (n - k) * TCP_HDR_LEN, left);
	p += left;
	rx->spare = rx->buf;
	rx->spare_cap = rx->cap;
	rx->buf = nb;
	rx->cap = cap;
	rx->pos = 0;
	rx->end = (uint32_t)(p - nb);
	rx->bulk = true;
	tcp_stat_add(&l->st_replayed, 1);
	return true;
}

/*
 * Read the answers @l expects next with one readv, the way the raw loop does: each header
 * into the buffer and each READ payload straight into its destination, since the server
 * answers a connection's requests in the order they were sent (tcp_lane_wired_locked). At
 * most TCP_RX_CHAIN answers, @limit slices (reported into @done) and min(@budget,
 * scatter_max) bytes (the first answer may take up to @budget), behind the rest of the
 * payload in progress if there is one.
 * Returns false when it does not apply (the caller reads into the buffer); else *@r is what
 * readv returned and *@drained as for tcp_rx_read. An answer not foreseen (an error, one
 * out of order) goes to the parser with all read behind it (tcp_lane_rx_replay); the READ
 * destinations those bytes passed through belong to READs still in flight, whose own
 * answers overwrite them (one that fails may find its destination written). Held
 * throughout: rx_lock, so a READ's cancel returns only once no read can reach its
 * destination. Owner of the receive side only.
 */
static bool tcp_lane_rx_scatter(struct tcp_inst *ti, struct tcp_lane *l, int fd, uint64_t budget,
				uint32_t limit, struct tcp_rlist *done, ssize_t *r, bool *drained)
{
	struct tcp_rx *rx = &l->rx;
	struct tcp_chain ch[TCP_RX_CHAIN];
	struct iovec iov[2 * TCP_RX_CHAIN + 2];
	uint64_t cap = TCP_MIN(budget, (uint64_t)ti->scatter_max), total = 0, left;
	uint32_t n = 0, nv = 0, placed = 0, have, hp, rid;
	bool lead = rx->payload; /* the rest of the payload in progress comes first */
	/* The answers' slots are freed with one count update per read (this lane's owner's). */
	struct tcp_free_acc acc = { .home = (uint32_t)(l - l->peer->lanes) + 1u };

	if (!cap || l->hs != TCP_HS_READY || rx->spare || limit <= (uint32_t)lead)
		return false;
	if (lead ? rx->pos != rx->end || !rx->dst || rx->left >= cap
		 : rx->end - rx->pos >= TCP_HDR_LEN)
		return false;
	pthread_mutex_lock(&l->rx_lock);
	if (lead && atomic_load_explicit(&l->rx_redirect, memory_order_relaxed)) {
		rx->dst = NULL; /* canceled: the rest is discarded */
		pthread_mutex_unlock(&l->rx_lock);
		return false;
	}
	if (lead) {
		rx->pos = rx->end = 0;
		total = rx->left;
		iov[nv++] = (struct iovec){ rx->dst, rx->left };
	}
	pthread_mutex_lock(&l->lock);
	rid = l->expect;
	while (l->expect_st == TCP_EXPECT_ID && n < TCP_RX_CHAIN && n < limit - lead &&
	       total + TCP_HDR_LEN <= cap) {
		uint32_t id = rid & 0xffffu;
		struct tcp_slot *slot;

		if (id >= l->free_cap)
			break;
		slot = &l->slots[id];
		if (!(slot->flags & TCP_SLOT_USED) || slot->gen != (uint16_t)(rid >> 16) ||
		    !(slot->flags & TCP_SLOT_WIRED) ||
		    (slot->flags & (TCP_SLOT_ANSWERED | TCP_SLOT_RECV | TCP_SLOT_CANCELED)) ||
		    !slot->slice)
			break;
		ch[n].len = slot->op == TCP_OP_READ ? slot->length : 0;
		/* Whole answers within the cap, except the first: up to the budget. */
		if (n && total + TCP_HDR_LEN + ch[n].len > cap)
			break;
		ch[n].rid = rid;
		ch[n].op = slot->op;
		ch[n].take = TCP_MIN(ch[n].len, budget - total - TCP_HDR_LEN);
		ch[n].dst = slot->slice->local;
		total += TCP_HDR_LEN + ch[n].take;
		if (ch[n].take < ch[n].len) {
			n++;
			break; /* the rest comes in the next read */
		}
		n++;
		if (!(slot->flags & TCP_SLOT_NEXT))
			break;
		rid = slot->next;
	}
	pthread_mutex_unlock(&l->lock);
	if (!n) {
		pthread_mutex_unlock(&l->rx_lock);
		return false;
	}
	/*
	 * The headers land one after the other in the buffer, the first behind what it holds,
	 * and one more header is read ahead: a read that fills everything foreseen does not
	 * need a second one to learn that the socket is drained.
	 */
	if (rx->cap - rx->pos < (n + 1) * TCP_HDR_LEN) {
		memmove(rx->buf, rx->buf + rx->pos, rx->end - rx->pos);
		rx->end -= rx->pos;
		rx->pos = 0;
	}
	hp = rx->pos;
	have = rx->end - rx->pos;
	for (uint32_t k = 0; k < n; k++) {
		iov[nv++] = (struct iovec){ rx->buf + hp + k * TCP_HDR_LEN + (k ? 0 : have),
					    TCP_HDR_LEN - (k ? 0 : have) };
		if (ch[k].take)
			iov[nv++] = (struct iovec){ ch[k].dst, ch[k].take };
	}
	/* Not behind a payload cut short: the rest of it would come there. */
	if (ch[n - 1].take == ch[n - 1].len) {
		iov[nv++] = (struct iovec){ rx->buf + hp + n * TCP_HDR_LEN, TCP_HDR_LEN };
		total += TCP_HDR_LEN;
	}
	total -= have;
	do
		*r = readv(fd, iov, (int)nv);
	while (*r < 0 && errno == EINTR);
	if (*r <= 0) {
		*r = *r < 0 ? -errno : 0;
		pthread_mutex_unlock(&l->rx_lock);
		return true;
	}
	*drained = (uint64_t)*r < total;
	left = (uint64_t)*r;
	pthread_mutex_lock(&l->lock);
	if (lead) {
		uint64_t got = TCP_MIN(left, rx->left);

		rx->dst += got;
		rx->left -= got;
		left -= got;
		if (!rx->left)
			tcp_lane_payload_done_locked(l, done);
	}
	for (uint32_t k = 0; k < n && !rx->payload; k++) {
		uint32_t id = ch[k].rid & 0xffffu, want = TCP_HDR_LEN - (k ? 0 : have);
		struct tcp_slot *slot = &l->slots[id];
		struct te_plugin_slice *fin = NULL;
		struct tcp_hdr h;
		uint64_t got = TCP_MIN(left, (uint64_t)want);

		rx->pos = hp + k * TCP_HDR_LEN;
		rx->end = rx->pos + TCP_HDR_LEN - want + (uint32_t)got;
		left -= got;
		if (got < want)
			break; /* the parser waits for the rest of this header */
		tcp_hdr_decode(rx->buf + rx->pos, &h);
		if (h.magic != TCP_WIRE_MAGIC || h.version != TCP_WIRE_VERSION || h.flags ||
		    h.op != ch[k].op || h.req_id != ch[k].rid || h.status != TE_OK ||
		    h.length != ch[k].len || !(slot->flags & TCP_SLOT_USED) ||
		    slot->gen != (uint16_t)(ch[k].rid >> 16) ||
		    !(slot->flags & (TCP_SLOT_SENT | TCP_SLOT_IN_IOV)) ||
		    (slot->flags & (TCP_SLOT_ANSWERED | TCP_SLOT_RECV))) {
			if (!tcp_lane_rx_replay(l, ch, n, k, left))
				*r = -ENOMEM;
			break;
		}
		tcp_lane_expect_locked(l, id);
		got = TCP_MIN(left, ch[k].take);
		left -= got;
		rx->pos = rx->end = rx->pos + TCP_HDR_LEN;
		placed++;
		if (got < ch[k].len) {
			/* The rest follows (canceled meanwhile: discarded). */
			slot->flags |= TCP_SLOT_RECV;
			rx->payload = true;
			rx->dst = slot->slice ? ch[k].dst + got : NULL;
			rx->left = ch[k].len - got;
			rx->small = ch[k].len <= rx->gulp;
			rx->bulk = rx->small;
			l->rx_slot = id;
			atomic_store_explicit(&l->rx_redirect, false, memory_order_relaxed);
			break;
		}
		slot->flags |= TCP_SLOT_ANSWERED;
		if (slot->flags & TCP_SLOT_SENT)
			fin = tcp_slot_finish_acc_locked(l, id, &acc);
		if (fin)
			tcp_rlist_add(done, fin);
		rx->bulk = true;
		if (k == n - 1)
			rx->end += (uint32_t)left; /* all foreseen came: what was read ahead */
	}
	tcp_free_acc_apply_locked(l, &acc);
	tcp_stat_add(&l->st_scattered, placed);
	pthread_mutex_unlock(&l->lock);
	pthread_mutex_unlock(&l->rx_lock);
	return true;
}

enum tcp_rx_end {
	TCP_RXE_DRAINED, /* the socket has nothing more for now */
	TCP_RXE_BUDGET,	 /* the budget was read: more may be waiting */
	TCP_RXE_FAILED,	 /* the lane must break: *st and why say how */
};

/*
 * Read and handle responses on @l (socket @fd) until its socket is drained or @budget bytes
 * were read, or *@n_done reached @limit slices reported. By the owner of its receive side
 * (rx_busy) only; payloads of canceled READs are discarded into @scratch (TCP_SCRATCH bytes).
 */
static enum tcp_rx_end tcp_lane_rx_run(struct tcp_inst *ti, struct tcp_lane *l, int fd,
				       uint8_t *scratch, size_t scratch_len, uint64_t budget,
				       uint32_t limit, uint32_t *n_done, enum te_status *st,
				       char *why, size_t why_len)
{
	struct tcp_peer *peer = l->peer;
	bool drained = false;

	for (;;) {
		struct tcp_rlist done = { 0 };
		size_t need = TCP_HDR_LEN;
		enum tcp_parse pr;
		ssize_t r;

		if (*n_done >= limit)
			return TCP_RXE_BUDGET;
		pr = tcp_lane_parse(ti, l, &need, st, why, why_len, &done, limit - *n_done);
		*n_done += tcp_rlist_report(ti, &done);
		if (pr == TCP_PARSE_FAIL)
			return TCP_RXE_FAILED;
		if (pr == TCP_PARSE_LIMIT)
			return TCP_RXE_BUDGET;
		if (l->rx_flush) {
			/* The handshake advanced: its AUTH, or requests that waited for it. */
			l->rx_flush = false;
			tcp_lane_flush(ti, l);
		}
		/* The last read took all the socket had, now parsed: no readv for EAGAIN. */
		if (tcp_rx_may_stop(&l->rx, drained))
			return TCP_RXE_DRAINED;
		if (budget == 0)
			return TCP_RXE_BUDGET;
		if (tcp_lane_rx_scatter(ti, l, fd, budget, limit - *n_done, &done, &r, &drained)) {
			*n_done += tcp_rlist_report(ti, &done);
		} else if (l->rx.payload && l->rx.dst && !tcp_rx_through(&l->rx)) {
			pthread_mutex_lock(&l->rx_lock);
			if (atomic_load_explicit(&l->rx_redirect, memory_order_relaxed))
				l->rx.dst = NULL;
			r = tcp_rx_read(fd, &l->rx, scratch, scratch_len, need, &drained);
			pthread_mutex_unlock(&l->rx_lock);
		} else {
			r = tcp_rx_read(fd, &l->rx, scratch, scratch_len, need, &drained);
		}
		if (r == -EAGAIN || r == -EWOULDBLOCK)
			return TCP_RXE_DRAINED;
		if (r <= 0) {
			*st = TE_ERR_CONN_RESET;
			if (r == 0 || r == -ECONNRESET) {
				/* The server's side ended: it applies nothing more from it. */
				pthread_mutex_lock(&l->lock);
				l->peer_closed = true;
				pthread_mutex_unlock(&l->lock);
			}
			if (r == 0)
				snprintf(why, why_len,
					 TCP_NAME
					 ": connection to %s (%s) lane %u closed by the peer",
					 peer->name, peer->addr_text, l->index);
			else
				snprintf(why, why_len,
					 TCP_NAME ": receive from %s (%s) lane %u failed: %s",
					 peer->name, peer->addr_text, l->index, strerror((int)-r));
			return TCP_RXE_FAILED;
		}
		atomic_fetch_add_explicit(&l->progress, (uint64_t)r, memory_order_relaxed);
		budget -= TCP_MIN(budget, (uint64_t)r);
	}
}

/*
 * Let go of @l's receive side after tcp_lane_rx_run ended with @end (under lock): marks the
 * lane broken when it failed. Returns whether the owner must run again instead (someone
 * wanted to read meanwhile and the socket may have more since it was drained).
 */
static bool tcp_lane_rx_release_locked(struct tcp_lane *l, enum tcp_rx_end end, enum te_status st,
				       const char *why)
{
	bool again = end == TCP_RXE_DRAINED && l->rx_missed && l->state == TCP_LANE_UP;

	l->rx_missed = false;
	/* Read to the end: nothing left for the worker (tcp_lane_service). */
	if (end == TCP_RXE_DRAINED && !again)
		l->rx_want = false;
	if (end == TCP_RXE_FAILED)
		tcp_lane_fail_locked(l, st, "%s", why);
	if (!again)
		l->rx_busy = l->rx_driver = false;
	return again;
}

/* After a failed receive: a peer that restarted is announced to the core, once. */
static void tcp_lane_rx_failed(struct tcp_inst *ti, struct tcp_lane *l, enum te_status st,
			       const char *why)
{
	struct tcp_peer *peer = l->peer;

	if (st == TE_ERR_PEER_RESTARTED &&
	    (atomic_store_explicit(&peer->restarted_until_ns,
				   tcp_now_ns() + TCP_RESTART_HOLD_MS * 1000000ull,
				   memory_order_relaxed),
	     !atomic_exchange_explicit(&peer->restarted, true, memory_order_relaxed))) {
		tcp_log(ti, TE_PLUGIN_LOG_WARN, "%s", why + strlen(TCP_NAME ": "));
		if (!ti->host->peer_event)
			return;
		/* Not once unload_peer has returned: it waits for this call. */
		if (!te_plugin_naming_enter(&ti->naming, &peer->np))
			return;
		ti->host->peer_event(ti->ctx, (struct te_plugin_peer *)peer, TE_PLUGIN_EVENT_DOWN,
				     why);
		te_plugin_naming_leave(&ti->naming, &peer->np);
	}
}

/*
 * Read and handle responses on @l until its socket is drained, from its worker; unless a
 * driver owns the receive side now: then it runs again for us before it lets go.
 */
void tcp_lane_rx(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_lane *l)
{
	enum te_status st = TE_ERR_CONN_RESET;
	char why[TCP_DETAIL_MAX];
	enum tcp_rx_end end;
	uint32_t n = 0;
	bool again;
	int fd;

	pthread_mutex_lock(&l->lock);
	if (l->state != TCP_LANE_UP || l->rx_busy) {
		l->rx_missed = l->rx_busy;
		pthread_mutex_unlock(&l->lock);
		return;
	}
	l->rx_busy = true;
	fd = l->fd; /* only this thread closes the socket: valid for the whole loop */
	pthread_mutex_unlock(&l->lock);
	do {
		end = tcp_lane_rx_run(ti, l, fd, w->scratch, TCP_SCRATCH, TCP_RX_BUDGET, UINT32_MAX,
				      &n, &st, why, sizeof(why));
		pthread_mutex_lock(&l->lock);
		again = tcp_lane_rx_release_locked(l, end, st, why);
		pthread_mutex_unlock(&l->lock);
	} while (again);
	if (end == TCP_RXE_BUDGET) {
		tcp_again_add(w, &l->ep);
	} else if (end == TCP_RXE_FAILED) {
		tcp_lane_rx_failed(ti, l, st, why);
		tcp_lane_break(ti, l, st, why);
	}
}

/*
 * Lanes tcp_drive 0 left quiet whose driver did not come back within wait_hold_ns: their
 * events are re-armed (which reports what waits), so the worker reads them. On @w's thread.
 */
void tcp_worker_linger_due(struct tcp_inst *ti, struct tcp_worker *w)
{
	uint64_t due = atomic_load_explicit(&w->linger_due_ns, memory_order_relaxed), now, next = 0;
	struct tcp_lane *broken[16];
	uint32_t n_broken = 0;

	if (!due || (now = tcp_now_ns()) < due)
		return;
	/* tcp_worker_linger sets the due time under w->lock too: it cannot change meanwhile. */
	pthread_mutex_lock(&w->lock);
	for (struct tcp_lane *l = w->lanes; l; l = l->wnext) {
		pthread_mutex_lock(&l->lock);
		if (l->rx_quiet && !l->n_drivers && l->state == TCP_LANE_UP) {
			uint64_t end = l->drive_end_ns + ti->wait_hold_ns;

			if (now < end) {
				next = next && next < end ? next : end;
			} else {
				tcp_lane_listen_locked(l, true);
				if (l->state == TCP_LANE_BROKEN && n_broken < 16)
					broken[n_broken++] = l; /* else the next tick sees it */
			}
		}
		pthread_mutex_unlock(&l->lock);
	}
	atomic_store_explicit(&w->linger_due_ns, next, memory_order_relaxed);
	pthread_mutex_unlock(&w->lock);
	for (uint32_t i = 0; i < n_broken; i++)
		tcp_lane_break(ti, broken[i], TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
}

void tcp_lane_event(struct tcp_inst *ti, struct tcp_worker *w, struct tcp_lane *l, uint32_t events)
{
	enum tcp_lane_state state;

	pthread_mutex_lock(&l->lock);
	if (l->state == TCP_LANE_CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		struct sockaddr_storage sa;
		socklen_t salen = sizeof(sa), len = sizeof(int);
		int err = 0;

		if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
			err = errno;
		if (err) {
			l->refused = err == ECONNREFUSED;
			tcp_lane_fail_locked(l, TE_ERR_PEER_UNREACHABLE,
					     TCP_NAME ": connect to %s (%s) failed: %s",
					     l->peer->name, l->peer->addr_text, strerror(err));
		} else if (getpeername(l->fd, (struct sockaddr *)&sa, &salen) == 0)
			l->state = TCP_LANE_UP;
		/* else: an event of an earlier socket of this lane; still connecting */
	}
	state = l->state;
	pthread_mutex_unlock(&l->lock);

	if (state == TCP_LANE_BROKEN) {
		tcp_lane_break(ti, l, TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
		return;
	}
	if (state != TCP_LANE_UP)
		return;
	if (events & EPOLLOUT)
		tcp_lane_flush(ti, l);
	if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		atomic_store_explicit(&l->rx.hup, true, memory_order_relaxed);
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		tcp_lane_rx(ti, w, l);
}

/* --- peers ------------------------------------------------------------------------- */

void tcp_peer_free(struct tcp_inst *ti, struct tcp_peer *peer)
{
	pthread_mutex_lock(&ti->lock);
	if (peer->prev)
		peer->prev->next = peer->next;
	else
		ti->peers = peer->next;
	if (peer->next)
		peer->next->prev = peer->prev;
	pthread_mutex_unlock(&ti->lock);
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		pthread_mutex_destroy(&l->lock);
		pthread_mutex_destroy(&l->rx_lock);
		free(l->slots);
		free(l->free_ids);
		tcp_rx_restore(&l->rx);
		free(l->rx.buf);
		free(l->txh);
	}
	free(peer->name);
	free(peer);
}

/* Unlink a closed lane from its worker; the last lane of an unloaded peer frees it. */
static void tcp_lane_release(struct tcp_inst *ti, struct tcp_lane *l)
{
	struct tcp_worker *w = l->w;
	struct tcp_peer *peer = l->peer;

	pthread_mutex_lock(&w->lock);
	if (l->wprev)
		l->wprev->wnext = l->wnext;
	else
		w->lanes = l->wnext;
	if (l->wnext)
		l->wnext->wprev = l->wprev;
	pthread_mutex_unlock(&w->lock);
	tcp_again_remove(w, &l->ep);
	/* acq_rel: the last one must see every other worker's final writes to its lanes */
	if (atomic_fetch_sub_explicit(&peer->lanes_open, 1, memory_order_acq_rel) == 1)
		tcp_peer_free(ti, peer);
}

/* --- workers ------------------------------------------------------------------------- */

/*
 * A lane handed to its worker: stream bulk data queued by submit, finish a failure, or
 * close it for an unloaded peer. A kick may be stale (the lane failed and reconnected
 * since): only the state found now counts.
 */
void tcp_lane_service(struct tcp_inst *ti, struct tcp_lane *l)
{
	enum tcp_lane_state state;
	uint32_t drivers;
	bool closing, rx;

	pthread_mutex_lock(&l->lock);
	closing = l->closing;
	state = l->state;
	rx = l->rx_want;
	l->rx_want = false;
	pthread_mutex_unlock(&l->lock);
	if (!closing) {
		if (state == TCP_LANE_UP) {
			tcp_lane_flush(ti, l);
			if (rx)
				tcp_lane_rx(ti, l->w, l);
		} else if (state == TCP_LANE_BROKEN)
			tcp_lane_break(ti, l, TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
		return;
	}
	tcp_lane_break(ti, l, TE_ERR_CANCELED, TCP_NAME ": peer unloaded");
	pthread_mutex_lock(&l->lock);
	state = l->state;
	drivers = l->n_drivers;
	pthread_mutex_unlock(&l->lock);
	/*
	 * Not down: a sender is still in its loop and kicks us again when it leaves; still
	 * driven: the last driver's tcp_drive 0 kicks us again.
	 */
	if (state == TCP_LANE_DOWN && !drivers)
		tcp_lane_release(ti, l);
}

/* --- submit and cancel ----------------------------------------------------------------- */

/* Initiator-side checks the core should already have made: defence in depth, no syscall. */
static enum te_status tcp_check_slice(const struct te_plugin_slice *s, char *why, size_t len)
{
	const struct tcp_rkey *k = (const struct tcp_rkey *)s->rkey;
	const struct tcp_mem *m = (const struct tcp_mem *)s->local_mem;
	uint64_t local = (uint64_t)(uintptr_t)s->local;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;

	if (m &&
	    (local < m->addr || s->length > m->length || local - m->addr > m->length - s->length)) {
		snprintf(why, len,
			 TCP_NAME ": local range [%p, +%" PRIu64 ") outside its registered region",
			 s->local, s->length);
		return TE_ERR_OUT_OF_RANGE;
	}
	if (k && (s->remote < k->addr || s->length > k->length ||
		  s->remote - k->addr > k->length - s->length || !(k->access & need))) {
		snprintf(why, len,
			 TCP_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
				  ") is not inside the remote-%s buffer [0x%" PRIx64 ", +%" PRIu64
				  ") it was submitted for",
			 s->remote, s->length,
			 s->opcode == TE_PLUGIN_OP_READ ? "readable" : "writable", k->addr,
			 k->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	return TE_OK;
}

/*
 * More slot ids for @l, whose ring is empty (all its ids are out): twice as many, at most
 * max_inflight. The slot table grows with it (it may move: every slot access holds the lane
 * lock, as here), and the new ids fill the ring from the start. False when the ring is at
 * max_inflight or memory is short (back-pressure, as when full). Under lane lock.
 */
static bool tcp_lane_grow_locked(const struct tcp_inst *ti, struct tcp_lane *l)
{
	struct tcp_slot *slots;
	uint32_t cap, *ids;

	if (l->free_cap >= ti->max_inflight)
		return false;
	cap = TCP_MIN(2 * l->free_cap, ti->max_inflight);
	slots = realloc(l->slots, cap * sizeof(*slots));
	if (!slots)
		return false;
	memset(slots + l->free_cap, 0, (cap - l->free_cap) * sizeof(*slots));
	l->slots = slots;
	ids = realloc(l->free_ids, cap * sizeof(*ids));
	if (!ids)
		return false; /* the table stays larger than the ring: harmless */
	for (uint32_t k = 0; k < cap - l->free_cap; k++)
		ids[k] = l->free_cap + k;
	l->free_ids = ids;
	l->free_head = 0;
	l->n_free = cap - l->free_cap;
	l->free_cap = cap;
	return true;
}

/*
 * Give back what @l's slot table grew to (tcp_lane_grow_locked): back to the size a lane
 * starts with, its ids in order again. Only with every slot free, so no answer is due on
 * the connection and no id above the new size can come back; the slots kept keep their
 * generations. The order of requests on the wire forgets its last id (it may be above the
 * new size): the next request gathered is the next answer expected, as on a new
 * connection, which with nothing in flight it is. realloc to a smaller size may keep the
 * block where it is (or fail, leaving it): either way the lane then uses the first slots
 * only. Under lane lock.
 */
static void tcp_lane_shrink_locked(const struct tcp_inst *ti, struct tcp_lane *l)
{
	uint32_t cap = tcp_slots_first(ti);
	struct tcp_slot *slots = realloc(l->slots, cap * sizeof(*slots));
	uint32_t *ids = realloc(l->free_ids, cap * sizeof(*ids));

	if (slots)
		l->slots = slots;
	if (ids)
		l->free_ids = ids;
	tcp_lane_ids_reset(l, cap);
	l->wired_ok = false;
	l->expect_st = TCP_EXPECT_FIRST;
}

/*
 * The worker's tick for @l's slot table: one grown past its first size that has had no
 * request in flight and none submitted for TCP_SLOTS_IDLE_TICKS ticks in a row shrinks
 * back. Not while anyone sends or reads on the lane, nor on one that is closing or holds
 * WRITEs waiting for a fence. Under lane lock.
 */
void tcp_lane_shrink_tick_locked(const struct tcp_inst *ti, struct tcp_lane *l)
{
	/* relaxed: a statistic, only compared with itself one tick later */
	uint64_t slices = atomic_load_explicit(&l->st_slices, memory_order_relaxed);

	if (l->free_cap <= tcp_slots_first(ti) || l->n_free != l->free_cap ||
	    slices != l->idle_slices || l->sending || l->rx_busy || l->closing || l->n_fence) {
		l->idle_slices = slices;
		l->idle_ticks = 0;
		return;
	}
	if (++l->idle_ticks < TCP_SLOTS_IDLE_TICKS)
		return;
	l->idle_ticks = 0;
	tcp_lane_shrink_locked(ti, l);
}

/* Room for one more request on @l: a free slot id, or (@grow) more of them. Under lane lock. */
static inline bool tcp_lane_room_locked(const struct tcp_inst *ti, struct tcp_lane *l, bool grow)
{
	return l->n_free || (grow && tcp_lane_grow_locked(ti, l));
}

/*
 * Take a slot for @s and queue its request, leaving the lane's counts of slots in use, of
 * the owner's requests and of slices and bytes to the caller (tcp_lane_count_locked); @owner:
 * 1 + the index of the submitting thread's own lane (0: none, a moved request). Under lane
 * lock; l->n_free > 0.
 */
static inline void tcp_lane_enqueue_uncounted_locked(struct tcp_lane *l, struct te_plugin_slice *s,
						     uint32_t owner)
{
	struct tcp_spriv *p = tcp_priv(s);
	uint32_t id = l->free_ids[l->free_head];
	struct tcp_slot *slot = &l->slots[id];

	l->free_head = l->free_head + 1 == l->free_cap ? 0 : l->free_head + 1;
	l->n_free--;
	if (s->length >= TCP_DRV_MAX_SLICE)
		l->n_big++;
	slot->slice = s;
	slot->gen++;
	slot->flags = TCP_SLOT_USED;
	slot->owner = (uint8_t)owner;
	slot->op = s->opcode == TE_PLUGIN_OP_READ ? TCP_OP_READ : TCP_OP_WRITE;
	slot->length = s->length;
	p->next = NULL;
	p->fencing = false;
	p->req_id = (uint32_t)slot->gen << 16 | id;
	p->status = TE_OK;
	if (p->detail) { /* zeroed for a first attempt, taken by a report; set by a lane's break */
		free(p->detail);
		p->detail = NULL;
	}
	/* relaxed: cancel reads these under the lane lock, which it takes before trusting them */
	atomic_store_explicit(&p->slot, id, memory_order_relaxed);
	atomic_store_explicit(&p->lane, l, memory_order_relaxed);
	tcp_encode(p->hdr, slot->op, p->req_id, 0, s->remote, s->length);
	if (l->sq_tail)
		tcp_priv(l->sq_tail)->next = s;
	else
		l->sq_head = s;
	l->sq_tail = s;
}

/* Count @n slices of @bytes queued on @l for @owner (tcp_lane_enqueue_uncounted_locked). */
static inline void tcp_lane_count_locked(struct tcp_lane *l, uint32_t owner, uint32_t n,
					 uint64_t bytes)
{
	tcp_used_add(l, (int)n);
	if (owner)
		tcp_owner_add(l, owner - 1, (int)n);
	tcp_stat_add(&l->st_slices, n);
	tcp_stat_add(&l->st_bytes, bytes);
}

/* Take a slot for @s and queue its request, counted (as above). Under lane lock. */
static void tcp_lane_enqueue_locked(struct tcp_lane *l, struct te_plugin_slice *s, uint32_t owner)
{
	tcp_lane_enqueue_uncounted_locked(l, s, owner);
	tcp_lane_count_locked(l, owner, 1, s->length);
}

/*
 * Start sending what was queued on @l (or let its worker report a failed connect). Little
 * data is sent right here: no wake-up, lowest latency. Bulk data (@bulk) is left to the
 * lane's worker, so that one thread streams it instead of the submitter and the worker
 * taking turns (measured: faster for 1 MiB WRITEs, see README.md).
 */
static void tcp_lane_push(struct tcp_inst *ti, struct tcp_lane *l, bool bulk)
{
	enum tcp_lane_state state;

	pthread_mutex_lock(&l->lock);
	state = l->state;
	pthread_mutex_unlock(&l->lock);
	if (state == TCP_LANE_BROKEN)
		tcp_kick_lane(l);
	else if (state == TCP_LANE_UP && bulk)
		tcp_kick_lane(l);
	else if (state == TCP_LANE_UP)
		tcp_lane_flush(ti, l);
}

/*
 * How long a lane stays left alone after the @streak-th refusal in a row for want of room:
 * option room_retry_ms, doubled each time, at most TCP_ROOM_BACKOFF_MAX times as long. Each
 * try costs both ends a connection and a handshake, and the room rarely comes back soon
 * (it is held by other engines' lanes, kept open).
 */
static uint64_t tcp_room_wait_ns(const struct tcp_inst *ti, uint32_t streak)
{
	uint64_t mult = 1;

	for (uint32_t k = 1; k < streak && mult < TCP_ROOM_BACKOFF_MAX; k++)
		mult *= 2;
	return ti->room_retry_ns * mult;
}

/*
 * The requests of @from's connection that failed before the server accepted it (none was
 * sent): queue them on the peer's lanes that are up or connecting (requests wait there for
 * the server's answer to the HELLO, and move on again if that fails), and keep submit off
 * @from for TCP_SHUN_NS, or when the server kept its host's last connections for other
 * engines (@full: TE_ERR_AGAIN) for tcp_room_wait_ns; those that find no room go to @rest,
 * to be reported with the status and detail the break gave them (@why is its reason, for the
 * log). Not under a lock.
 */
static void tcp_lane_move(struct tcp_inst *ti, struct tcp_lane *from, struct tcp_rlist *list,
			  struct tcp_rlist *rest, const char *why, bool full)
{
	uint64_t shun_ns = TCP_SHUN_NS;
	struct tcp_peer *peer = from->peer;
	struct te_plugin_slice *s = list->head;
	bool touched[TCP_MAX_LANES] = { false };
	uint32_t moved = 0, at = 0;

	while (s) {
		struct te_plugin_slice *next = tcp_priv(s)->next;
		bool done = false;

		/* From the lane that took the last one: consecutive requests stay together. */
		for (uint32_t k = 0; k < peer->n_lanes && !done; k++) {
			uint32_t i = (at + k) % peer->n_lanes;
			struct tcp_lane *c = &peer->lanes[i];

			if (c == from)
				continue;
			pthread_mutex_lock(&c->lock);
			if ((c->state == TCP_LANE_UP || c->state == TCP_LANE_CONNECTING) &&
			    !c->closing && tcp_lane_room_locked(ti, c, true)) {
				tcp_lane_enqueue_locked(c, s, 0);
				touched[i] = done = true;
				at = i;
			}
			pthread_mutex_unlock(&c->lock);
		}
		if (done)
			moved++;
		else
			tcp_rlist_add(rest, s);
		s = next;
	}
	if (moved) {
		enum te_plugin_log_level level = TE_PLUGIN_LOG_WARN;
		const char *hint = "";
		bool quiet;

		pthread_mutex_lock(&from->lock);
		if (full) {
			shun_ns = tcp_room_wait_ns(ti, from->room_streak);
			from->room_wait_ms = (uint32_t)TCP_MIN(shun_ns / 1000000u, UINT32_MAX);
		}
		quiet = full && from->full_noted;
		from->full_noted |= full;
		pthread_mutex_unlock(&from->lock);
		atomic_store_explicit(&from->shun_until_ns, tcp_now_ns() + shun_ns,
				      memory_order_relaxed);
		/*
		 * For want of room: one warning per engine says what to change; each lane's
		 * first refusal since it was served goes to info, its repeats to debug (a host
		 * of 32 engines logged over 850 warnings in 8 s, one per lane).
		 */
		if (quiet)
			level = TE_PLUGIN_LOG_DEBUG;
		else if (full && atomic_exchange(&ti->room_warned, true))
			level = TE_PLUGIN_LOG_INFO;
		else if (full)
			hint = "; raise the peer's max_conns_per_host, or lower lanes, to give "
			       "every lane room (further refusals for want of room: at info; "
			       "tcp statistics: room_refused per lane)";
		tcp_log(ti, level,
			"lane %u to %s failed before the server accepted it (%s); its %u "
			"request(s) moved to the peer's other lanes, and it is left alone for "
			"%llu ms%s",
			from->index, peer->name, why, moved,
			(unsigned long long)(shun_ns / 1000000), hint);
	}
	for (uint32_t i = 0; i < peer->n_lanes; i++)
		if (touched[i])
			tcp_lane_push(ti, &peer->lanes[i], true);
}

#define TCP_TOUCHED 16
/*
 * Payload bytes one submit may queue on a lane and still send them itself. Measured: a
 * batch of 128 x 4 KiB WRITEs (256 KiB per lane) costs less CPU sent inline, 16 x 1 MiB
 * less sent by the worker. Of the lanes over it, the submitting thread still sends the last
 * one it touched (measured: 1.1-1.5x GB/s for 64 KiB and 1 MiB WRITEs, 1 and 2 threads).
 */
#define TCP_INLINE_BYTES (1u << 20)

/*
 * One submit's WRITE payload to one peer from which its slices spread over idle lanes, and
 * how long a lane stays another thread's after it last queued there (tcp_submit). Measured
 * at 1, 2 and 4 MiB: 4 MiB gives each of two lanes more than TCP_INLINE_BYTES, so a worker
 * sends one half while the submitter sends the other; at 1 and 2 MiB some batches gained
 * and others lost (256K x 8: 0.71x), so the threshold stays at 4 MiB (bench/README.md).
 */
#define TCP_SPREAD_BYTES (4ull << 20)
#define TCP_HOME_RECENT_NS 100000000ull
#define TCP_OWNER_RECENT_NS 20000000ull

/*
 * Whether another thread moves data to @peer: one whose own lane is not @own and who has
 * requests in flight to @peer (tcp_owner_busy), or submitted to it within TCP_OWNER_RECENT_NS.
 */
static bool tcp_peer_others_active(const struct tcp_peer *peer, uint32_t own, uint64_t now)
{
	for (uint32_t k = 0; k < peer->n_lanes; k++) {
		const struct tcp_lane *c = &peer->lanes[k];

		if (k != own && (tcp_owner_busy(c) ||
				 now - atomic_load_explicit(&c->owner_ns, memory_order_relaxed) <
					 TCP_OWNER_RECENT_NS))
			return true;
	}
	return false;
}

/*
 * Thread numbers: each thread that submits takes the lowest number no live thread holds and
 * gives it back when it exits, so the threads alive at a time (a pool whose threads come
 * and go, say) have numbers 0..n-1 and spread evenly over the lanes. Past TCP_THREAD_NOS
 * live threads, numbers are not given back.
 */
#define TCP_THREAD_NOS 4096u
static pthread_mutex_t tcp_no_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t tcp_no_used[TCP_THREAD_NOS / 64]; /* under tcp_no_lock */
static atomic_uint tcp_no_next = TCP_THREAD_NOS;  /* numbers past the bitmap */
static pthread_once_t tcp_no_once = PTHREAD_ONCE_INIT;
static pthread_key_t tcp_no_key;
static bool tcp_no_keyed;

/* Thread exit: give the number (stored + 1) back. */
static void tcp_thread_no_free(void *p)
{
	uint32_t no = (uint32_t)(uintptr_t)p - 1;

	if (no >= TCP_THREAD_NOS)
		return;
	pthread_mutex_lock(&tcp_no_lock);
	tcp_no_used[no / 64] &= ~(1ull << (no % 64));
	pthread_mutex_unlock(&tcp_no_lock);
}

static void tcp_thread_no_init(void)
{
	tcp_no_keyed = pthread_key_create(&tcp_no_key, tcp_thread_no_free) == 0;
}

/* The plugin is being unloaded: no thread exit may call into it any more. */
__attribute__((destructor)) static void tcp_thread_no_fini(void)
{
	if (tcp_no_keyed)
		pthread_key_delete(tcp_no_key);
}

/* tcp_submit's lane choice for one slice (tcp_lane_try, tcp_lane_deeper). */
struct tcp_pick {
	struct tcp_peer *peer;
	struct tcp_lane *held; /* the lane whose lock the submit holds, if any */
	uint64_t now;
	uint64_t run_writes; /* WRITE payload of the slice's run to the peer (tcp_submit) */
	uint32_t own;	     /* the submitting thread's own lane of the peer */
	uint32_t start;	     /* the lane the round starts at */
	uint32_t cap_min;    /* the fewest slot ids of a full lane seen in pass 0 */
	bool stripe, spread; /* round-robin over the lanes (tcp_submit) */
	bool keep;	     /* others at the peer: a small slice keeps to the own lane */
};

/*
 * Queue @s on lane k of @pk's round in pass @pass, if that lane takes it: returns the lane
 * (its lock held, as @pk->held), else NULL. Pass 0 takes the slot ids the lane has; pass 1
 * grows its slot table (alone at the peer, only a lane with the fewest ids); pass 2 (with
 * others at the peer) spills onto the lanes other than the own one. With others, passes 0
 * and 1 try the own lane only.
 */
static inline __attribute__((always_inline)) struct tcp_lane *
tcp_lane_try(struct tcp_inst *ti, struct tcp_pick *pk, struct te_plugin_slice *s, uint32_t k,
	     uint32_t pass)
{
	uint32_t idx = (pk->start + k) % pk->peer->n_lanes;
	struct tcp_lane *c = &pk->peer->lanes[idx];

	/* A lane whose requests just moved away (tcp_lane_move): not for now. */
	if (pk->now < atomic_load_explicit(&c->shun_until_ns, memory_order_relaxed))
		return NULL;
	if (pk->keep && (pass < 2) != (idx == pk->own))
		return NULL;
	if (pk->stripe && k < pk->peer->n_lanes && idx != pk->own &&
	    (tcp_owner_busy(c) ||
	     (pk->spread && pk->now - atomic_load_explicit(&c->home_ns, memory_order_relaxed) <
				    TCP_HOME_RECENT_NS)))
		return NULL; /* first round: not onto another thread's busy lane */
	/* Consecutive slices for one lane take its lock once. */
	if (c != pk->held) {
		if (pk->held)
			pthread_mutex_unlock(&pk->held->lock);
		pthread_mutex_lock(&c->lock);
		pk->held = c;
	}
	if (!tcp_lane_room_locked(ti, c, pass == 1 && (pk->keep || c->free_cap == pk->cap_min))) {
		if (pass == 0)
			pk->cap_min = TCP_MIN(pk->cap_min, c->free_cap);
		return NULL;
	}
	if (c->state == TCP_LANE_DOWN)
		tcp_lane_connect_locked(ti, c);
	tcp_lane_enqueue_locked(c, s, pk->own + 1);
	if (idx == pk->own) {
		atomic_store_explicit(&c->home_ns, pk->now, memory_order_relaxed);
		c->bulk_writes = pk->run_writes > TCP_INLINE_BYTES;
	}
	return c;
}

/*
 * Every lane @s may take was full in pass 0: pass 1, a lane's slot table grows, and with
 * others at the peer pass 2. With others, a small slice stays on this thread's own lane
 * while its table can grow, and spills over the other lanes only then: one connection per
 * thread, as the raw loop's, also for batches deeper than a lane's first slots (READ 4K
 * x32768 from 2 threads: 1.25-1.28x, x16384 from 4: 1.15-1.20x against spilling at 2048
 * and leaving the rest to the core's backlog; bench/README.md). Alone, a thread spreads
 * over the lanes first (pass 0), then grows the lanes with the fewest slots (one thread's
 * 65536 READs of 4K all on its own lane ran 0.88x of 2048 on each lane and the rest
 * backlogged; grown evenly, 1.08-1.11x).
 */
static struct tcp_lane *tcp_lane_deeper(struct tcp_inst *ti, struct tcp_pick *pk,
					struct te_plugin_slice *s)
{
	struct tcp_lane *l = NULL;

	for (uint32_t pass = 1; pass < (pk->keep ? 3u : 2u) && !l; pass++)
		for (uint32_t k = 0; k < (pk->stripe ? 2 : 1) * pk->peer->n_lanes && !l; k++)
			l = tcp_lane_try(ti, pk, s, k, pass);
	return l;
}

/* This thread's number (see above): picks its own lane of a peer. */
static uint32_t tcp_thread_no(void)
{
	static _Thread_local uint32_t no; /* number + 1; 0: none yet */

	if (!no) {
		uint32_t n = TCP_THREAD_NOS;

		pthread_once(&tcp_no_once, tcp_thread_no_init);
		pthread_mutex_lock(&tcp_no_lock);
		for (uint32_t w = 0; tcp_no_keyed && w < TCP_THREAD_NOS / 64; w++) {
			if (tcp_no_used[w] == UINT64_MAX)
				continue;
			n = w * 64 + (uint32_t)__builtin_ctzll(~tcp_no_used[w]);
			tcp_no_used[w] |= 1ull << (n % 64);
			break;
		}
		pthread_mutex_unlock(&tcp_no_lock);
		if (n == TCP_THREAD_NOS)
			n = atomic_fetch_add_explicit(&tcp_no_next, 1, memory_order_relaxed);
		no = n + 1;
		if (n < TCP_THREAD_NOS && pthread_setspecific(tcp_no_key, (void *)(uintptr_t)no))
			tcp_thread_no_free((void *)(uintptr_t)no); /* cannot hear of its exit */
	}
	return no - 1;
}

enum te_status tcp_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices, uint32_t n,
			  uint32_t *accepted_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_lane *touched[TCP_TOUCHED];
	struct tcp_pick pk = { .now = tcp_now_ns() };
	uint64_t bytes[TCP_TOUCHED];
	uint32_t n_touched = 0, i, me;
	uint64_t run_writes = 0, now = pk.now;
	const struct tcp_peer *last_peer = NULL;
	/*
	 * The own lane the slice before went onto, not striped, and its index in touched[]; the
	 * slices queued on it since without their counts, and their bytes (counted at once before
	 * its lock goes).
	 */
	struct tcp_lane *own_lane = NULL;
	uint32_t own_t = 0, own_n = 0;
	uint64_t own_bytes = 0;
	bool others = false;
	uint32_t run_end = 0;
	enum te_status ret = TE_OK;

	if (!accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	if (atomic_load_explicit(&ti->stopping, memory_order_relaxed))
		return TE_ERR_SHUTDOWN;
	me = tcp_thread_no();
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		struct tcp_peer *peer = s ? (struct tcp_peer *)s->peer : NULL;
		struct tcp_lane *l = NULL;
		char why[TCP_DETAIL_MAX];
		enum te_status bad;
		uint32_t own, t;
		bool stripe, spread;

		if (!s || !peer || !s->priv || !s->local || s->length == 0 ||
		    s->length > TCP_MAX_FRAME ||
		    (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)) {
			tcp_log(ti, TE_PLUGIN_LOG_ERROR, "submit: malformed slice %u of %u", i, n);
			ret = TE_ERR_INVALID_ARG;
			break;
		}
		s->device = 0;
		if (i >= run_end) {
			/* WRITE payload of this run of consecutive slices to one peer */
			run_writes = 0;
			for (run_end = i;
			     run_end < n && slices[run_end] && slices[run_end]->peer == s->peer;
			     run_end++)
				if (slices[run_end]->opcode == TE_PLUGIN_OP_WRITE)
					run_writes += slices[run_end]->length;
		}
		bad = tcp_check_slice(s, why, sizeof(why));
		if (bad == TE_OK && atomic_load_explicit(&peer->restarted, memory_order_relaxed) &&
		    tcp_now_ns() <
			    atomic_load_explicit(&peer->restarted_until_ns, memory_order_relaxed)) {
			bad = TE_ERR_PEER_RESTARTED;
			snprintf(why, sizeof(why),
				 TCP_NAME ": %s (%s) was restarted; its descriptor is stale",
				 peer->name, peer->addr_text);
		}
		if (bad != TE_OK) {
			if (own_n) {
				tcp_lane_count_locked(own_lane, pk.own + 1, own_n, own_bytes);
				own_n = 0;
				own_bytes = 0;
			}
			/* No lane lock while taking a worker's (the tick takes them the other way). */
			if (pk.held)
				pthread_mutex_unlock(&pk.held->lock);
			pk.held = NULL;
			tcp_defer_fail(peer->lanes[0].w, s, bad, why);
			own_lane = NULL;
			continue;
		}
		/*
		 * The slice before, to the same peer (the same run: run_writes, others and own
		 * hold), went onto its own lane unstriped, whose lock is still held: this one does
		 * too when it is not striped or spread either and the lane has a free slot id and
		 * is not shunned, as the first pass below would decide (with its first try).
		 */
		if (own_lane && peer == last_peer && pk.held == own_lane && own_lane->n_free &&
		    own_lane->state != TCP_LANE_DOWN && !(s->length >= ti->stripe_min && !others) &&
		    !(!others && s->opcode == TE_PLUGIN_OP_WRITE &&
		      run_writes >= TCP_SPREAD_BYTES) &&
		    now >= atomic_load_explicit(&own_lane->shun_until_ns, memory_order_relaxed)) {
			tcp_lane_enqueue_uncounted_locked(own_lane, s, pk.own + 1);
			own_n++;
			own_bytes += s->length;
			if (s->opcode == TE_PLUGIN_OP_WRITE)
				bytes[own_t] += s->length;
			continue;
		}
		if (own_n) {
			tcp_lane_count_locked(own_lane, pk.own + 1, own_n, own_bytes);
			own_n = 0;
			own_bytes = 0;
		}
		own_lane = NULL;
		/*
		 * Slices of at least stripe_min bytes go round-robin over the lanes, so one
		 * large transfer is not capped by one connection; but only while no other thread
		 * moves data to this peer (has requests in flight to it on any lane, or submitted
		 * to it within TCP_OWNER_RECENT_NS). With others at it, every thread keeps its slices
		 * on its own lane, as raw loops with a connection each do (2 and 4 threads,
		 * 1 and 8 MiB, READ and WRITE, under cubic: 1.34-2.2x of striping over the lanes
		 * the others did not hold; README.md).
		 * Smaller ones stay on this thread's own lane (spilling over when it is full):
		 * per thread, one connection and one serving worker, as a raw loop has
		 * (measured: README.md). Spilling ignores other threads' lanes' use.
		 * But a thread alone that WRITEs at least TCP_SPREAD_BYTES to a peer in one
		 * submit spreads those slices too, over its own lane and the lanes no thread has
		 * used as its own lately: a lane's worker then sends part of the payload while
		 * this thread sends the rest (measured: README.md).
		 */
		own = me % peer->n_lanes;
		pk.peer = peer;
		pk.own = own;
		pk.run_writes = run_writes;
		if (peer != last_peer) {
			atomic_store_explicit(&peer->lanes[own].owner_ns, now,
					      memory_order_relaxed);
			others = tcp_peer_others_active(peer, own, now);
			last_peer = peer;
		}
		/* Another thread moves data to this peer too: one connection each. */
		stripe = s->length >= ti->stripe_min && !others;
		spread = !stripe && !others && s->opcode == TE_PLUGIN_OP_WRITE &&
			 run_writes >= TCP_SPREAD_BYTES;
		stripe |= spread;
		/*
		 * Pass 0: the slot ids the lanes have (tcp_lane_try); then tcp_lane_deeper.
		 * Large slices go around twice: the second round spills onto busy lanes.
		 */
		pk.stripe = stripe;
		pk.spread = spread;
		pk.keep = others && !stripe;
		pk.start =
			stripe ? atomic_fetch_add_explicit(&peer->rr, 1, memory_order_relaxed) : me;
		pk.cap_min = UINT32_MAX;
		for (uint32_t k = 0; k < (stripe ? 2 : 1) * peer->n_lanes && !l; k++)
			l = tcp_lane_try(ti, &pk, s, k, 0);
		if (!l)
			l = tcp_lane_deeper(ti, &pk, s);
		if (!l)
			break; /* every lane is full: back-pressure */
		for (t = 0; t < n_touched && touched[t] != l; t++)
			;
		if (t == n_touched) {
			if (n_touched == TCP_TOUCHED) {
				pthread_mutex_unlock(&pk.held->lock);
				pk.held = NULL;
				for (t = 0; t < n_touched; t++)
					tcp_lane_push(ti, touched[t], bytes[t] > TCP_INLINE_BYTES);
				n_touched = 0;
			}
			t = n_touched++;
			touched[t] = l;
			bytes[t] = 0;
		}
		if (s->opcode == TE_PLUGIN_OP_WRITE)
			bytes[t] += s->length;
		if (!stripe && l == &peer->lanes[own]) {
			own_lane = l;
			own_t = t;
		}
	}
	if (own_n)
		tcp_lane_count_locked(own_lane, pk.own + 1, own_n, own_bytes);
	if (pk.held)
		pthread_mutex_unlock(&pk.held->lock);
	/*
	 * Bulk lanes go to their workers, except the last one touched: this thread sends that
	 * one itself while the workers stream the others.
	 */
	for (uint32_t t = 0; t < n_touched; t++)
		tcp_lane_push(ti, touched[t], t + 1 < n_touched && bytes[t] > TCP_INLINE_BYTES);
	*accepted_out = i;
	return ret;
}

/*
 * Cancel: a request not on the wire is removed and reported at once. A READ in flight is
 * reported at once too: its answer is drained when it comes, and once cancel returns no byte
 * of it reaches the destination. A WRITE whose bytes reached the socket cannot be recalled:
 * its lane is aborted and the WRITE is reported once it cannot land any more (see
 * tcp_lane_break): at once when its deadline passed, else when the server fenced the old
 * connection (one round trip to a live server) or, at the latest, at its deadline.
 */
enum te_status tcp_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct te_plugin_slice *report = NULL;
	bool wait_rx = false, abort = false;
	struct tcp_spriv *p;
	struct tcp_slot *slot;
	struct tcp_lane *l;
	uint32_t id;

	if (!s || !s->priv)
		return TE_ERR_INVALID_ARG;
	p = tcp_priv(s);
	/* The slice memory is valid during the call even if it already completed. */
	l = atomic_load_explicit(&p->lane, memory_order_relaxed);
	id = atomic_load_explicit(&p->slot, memory_order_relaxed);
	if (!l || id >= ti->max_inflight)
		return TE_ERR_NOT_FOUND; /* never queued, or a deferred failure on its way */
	pthread_mutex_lock(&l->lock);
	if (p->fencing) {
		/* Waiting for the fence of a torn-down connection: its deadline also ends it. */
		if (tcp_now_ns() >= s->deadline_ns) {
			struct te_plugin_slice *prev = NULL;

			for (struct te_plugin_slice *q = l->fence_head; q && q != s;
			     q = tcp_priv(q)->next)
				prev = q;
			tcp_fence_unlink_locked(l, prev, s);
			p->status = TE_ERR_CANCELED;
			tcp_priv_detail(s, TCP_NAME ": canceled; its deadline passed before the "
						    "server could be reached to fence it");
			report = s;
		}
		pthread_mutex_unlock(&l->lock);
		if (report)
			tcp_report_priv(ti, report);
		return TE_OK;
	}
	/*
	 * A lane and slot read while the slice moved to another lane (tcp_lane_move) may not
	 * belong together, and lanes' tables differ in size: checked against this one's.
	 */
	slot = id < l->free_cap ? &l->slots[id] : NULL;
	if (!slot || !(slot->flags & TCP_SLOT_USED) || slot->slice != s) {
		pthread_mutex_unlock(&l->lock);
		return TE_ERR_NOT_FOUND; /* already reported */
	}
	if (slot->flags & TCP_SLOT_CANCELED) {
		pthread_mutex_unlock(&l->lock);
		return TE_OK;
	}
	/*
	 * A READ on the wire may be foreseen by a scatter read in progress (which ignores it
	 * from now on): it ends before this returns, and no byte reaches the destination later.
	 */
	wait_rx = slot->op == TCP_OP_READ && (slot->flags & TCP_SLOT_WIRED);
	if (!(slot->flags & (TCP_SLOT_IN_IOV | TCP_SLOT_SENT)) && !(s == l->sq_head && l->sq_off)) {
		/* Not a byte on the wire yet: take it out of the queue. */
		struct te_plugin_slice *prev = NULL;

		for (struct te_plugin_slice *q = l->sq_head; q && q != s; q = tcp_priv(q)->next)
			prev = q;
		if (prev)
			tcp_priv(prev)->next = p->next;
		else
			l->sq_head = p->next;
		if (l->sq_tail == s)
			l->sq_tail = prev;
		tcp_slot_free_locked(l, id);
		p->status = TE_ERR_CANCELED;
		tcp_priv_detail(s, TCP_NAME ": canceled before it was sent");
		report = s;
	} else if (slot->op == TCP_OP_WRITE) {
		/*
		 * Its bytes may be anywhere between here and the server's memory: abort the
		 * connection (its worker resets it and reports the WRITE once fenced).
		 */
		slot->flags |= TCP_SLOT_CANCELED;
		l->n_canceled++;
		/* The others on this connection are collateral: retryable, not a path fault. */
		tcp_lane_fail_locked(l, TE_ERR_AGAIN,
				     TCP_NAME ": lane %u to %s (%s) reset to cancel a WRITE in "
					      "flight on it",
				     l->index, l->peer->name, l->peer->addr_text);
		abort = true;
	} else if ((slot->flags & TCP_SLOT_SENT) && !(slot->flags & TCP_SLOT_ANSWERED)) {
		/*
		 * A READ waiting for (or receiving) its answer: report now, drain the answer
		 * later. A payload being received stops reaching the destination below.
		 */
		if (slot->flags & TCP_SLOT_RECV)
			atomic_store_explicit(&l->rx_redirect, true, memory_order_relaxed);
		slot->flags |= TCP_SLOT_CANCELED;
		l->n_canceled++;
		report = tcp_slot_orphan_locked(l, id);
	} else {
		/* A READ request partly sent: reported (orphaned) as soon as it is all out. */
		slot->flags |= TCP_SLOT_CANCELED;
		l->n_canceled++;
	}
	pthread_mutex_unlock(&l->lock);
	if (wait_rx) {
		/* The read in progress (non-blocking, short) ends; later ones see the redirect. */
		pthread_mutex_lock(&l->rx_lock);
		pthread_mutex_unlock(&l->rx_lock);
	}
	if (abort)
		tcp_kick_lane(l);
	if (report)
		tcp_report_priv(ti, report);
	return TE_OK;
}

enum te_status tcp_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	if (!s)
		return TE_ERR_INVALID_ARG;
	/* One device; a retry takes whichever lane is free then (a broken one reconnects). */
	s->device = 0;
	return TE_OK;
}

/* --- hybrid progress: the waiting application thread reads answers ------------------- */

/*
 * progress 'caller', per thread (TE_PLUGIN_CAP_HYBRID_PER_THREAD): every thread waiting in
 * te_batch_wait reads its own lane of each peer (the lane its small slices go to), while
 * the other lanes stay with their workers; so several waiting threads poll at once, each
 * its own connection. tcp_drive 1 makes those lanes quiet and counts the thread in
 * n_drivers (which also keeps a closing lane from being freed); tcp_drive 0 undoes it.
 */
struct tcp_drv {
	uint32_t n;
	struct tcp_lane *lanes[TCP_DRV_LANES]; /* this thread counted in their n_drivers */
};
static _Thread_local struct tcp_drv tcp_drv;

/* Discarded payload bytes of the driver (canceled READs: rare), on its stack. */
#define TCP_DRV_SCRATCH (16u << 10)

/*
 * This thread's (@me) next lane with requests in flight, of *@peer or a later peer, with its
 * lock held; *@peer moves past it. NULL: none left. Under ti->lock.
 */
static struct tcp_lane *tcp_home_lane_next(struct tcp_peer **peer, uint32_t me)
{
	for (struct tcp_peer *p = *peer; p; p = p->next) {
		struct tcp_lane *l = &p->lanes[me % p->n_lanes];

		if (!atomic_load_explicit(&l->used, memory_order_relaxed))
			continue;
		*peer = p->next;
		pthread_mutex_lock(&l->lock);
		return l;
	}
	*peer = NULL;
	return NULL;
}

/*
 * This thread's lanes with requests in flight whose receive side is free, claimed for it
 * (rx_busy, rx_driver; their sockets stay open until released), at most TCP_DRV_LANES.
 * Handshakes stay with the worker (they may report fenced WRITEs).
 */
static uint32_t tcp_drv_claim(struct tcp_inst *ti, struct tcp_lane **out, int *fds)
{
	uint32_t n = 0, me = tcp_thread_no();
	struct tcp_peer *peer;
	struct tcp_lane *l;

	pthread_mutex_lock(&ti->lock);
	for (peer = ti->peers; n < TCP_DRV_LANES && (l = tcp_home_lane_next(&peer, me));) {
		if (l->state == TCP_LANE_UP && l->hs == TCP_HS_READY && !l->rx_busy &&
		    !l->closing && !l->n_big) {
			l->rx_busy = l->rx_driver = true;
			fds[n] = l->fd;
			out[n++] = l;
		}
		pthread_mutex_unlock(&l->lock);
	}
	pthread_mutex_unlock(&ti->lock);
	return n;
}

/*
 * Read what @l (claimed by tcp_drv_claim, socket @fd) has, reporting at most @limit slices,
 * then let it go. Returns how many it reported.
 */
static uint32_t tcp_drv_lane(struct tcp_inst *ti, struct tcp_lane *l, int fd, uint8_t *scratch,
			     uint32_t limit)
{
	enum te_status st = TE_ERR_CONN_RESET;
	char why[TCP_DETAIL_MAX];
	enum tcp_rx_end end;
	uint32_t n = 0, counted = 0;
	bool again, kick, out;

	do {
		end = tcp_lane_rx_run(ti, l, fd, scratch, TCP_DRV_SCRATCH, TCP_DRV_BUDGET, limit,
				      &n, &st, why, sizeof(why));
		pthread_mutex_lock(&l->lock);
		tcp_stat_add(&l->st_driven, n - counted);
		counted = n;
		again = tcp_lane_rx_release_locked(l, end, st, why);
		/*
		 * Stopped at the budget: what is left (answers already in the receive buffer,
		 * which no socket event announces, or more in the socket) is the worker's to
		 * read: at once on a loud lane, at the last driver's tcp_drive 0 on a quiet one
		 * (until then its drivers read on).
		 */
		if (!again && end == TCP_RXE_BUDGET)
			l->rx_want = true;
		/* Broken meanwhile (its worker's tcp_lane_break waited for us), or by us. */
		kick = !again && (l->state == TCP_LANE_BROKEN || (l->rx_want && !l->rx_quiet));
		/* A quiet lane's worker does not hear that a full socket has room again. */
		out = !again && l->rx_quiet && !l->sending && tcp_lane_has_output_locked(l);
		pthread_mutex_unlock(&l->lock);
	} while (again);
	if (end == TCP_RXE_FAILED)
		tcp_lane_rx_failed(ti, l, st, why);
	if (out)
		tcp_lane_flush(ti, l);
	if (kick)
		tcp_kick_lane(l);
	return n;
}

/*
 * progress 'caller': the thread waiting in te_batch_wait reads the answers on its own lanes,
 * so that a completion reaches its batch without a hand-off between threads. At most
 * @budget slices reported, and at most TCP_DRV_BUDGET bytes read per lane and call.
 */
uint32_t tcp_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	struct tcp_inst *ti = (struct tcp_inst *)inst;
	struct tcp_lane *lanes[TCP_DRV_LANES];
	uint8_t scratch[TCP_DRV_SCRATCH];
	int fds[TCP_DRV_LANES];
	uint32_t n, done = 0;

	if (!ti->hybrid || !budget)
		return 0;
	n = tcp_drv_claim(ti, lanes, fds);
	for (uint32_t i = 0; i < n; i++) {
		if (done < budget) {
			done += tcp_drv_lane(ti, lanes[i], fds[i], scratch, budget - done);
			continue;
		}
		/* The budget is spent: let the others go unread (their worker may want them). */
		pthread_mutex_lock(&lanes[i]->lock);
		tcp_lane_rx_release_locked(lanes[i], TCP_RXE_BUDGET, TE_OK, "");
		pthread_mutex_unlock(&lanes[i]->lock);
	}
	return done;
}

/*
 * Whether the driver of @l must also send what its full socket held back: a quiet lane's
 * worker does not hear that the socket has room again (tcp_drv_lane flushes it, as below).
 * Under lane lock.
 */
static bool tcp_drv_must_send_locked(const struct tcp_lane *l)
{
	return l->rx_quiet && l->hs == TCP_HS_READY && !l->closing && !l->sending && !l->send_err &&
	       tcp_lane_has_output_locked(l);
}

/*
 * Count, per lane (st_room_woken), the sleeps of tcp_wait that room in the lane's full socket
 * ended (@pfd, @n: the poll it made). The lanes are looked up again: unlocked, one may have
 * gone with its peer meanwhile. A lane whose socket was replaced since is not counted.
 */
static void tcp_wait_count_room(struct tcp_inst *ti, uint32_t me, const struct pollfd *pfd,
				nfds_t n)
{
	struct tcp_peer *peer;
	struct tcp_lane *l;
	nfds_t k = 0;

	pthread_mutex_lock(&ti->lock);
	for (peer = ti->peers; k < n && (l = tcp_home_lane_next(&peer, me));) {
		for (nfds_t j = k; j < n; j++)
			if (pfd[j].fd == l->fd) {
				if (pfd[j].revents & pfd[j].events & POLLOUT)
					tcp_stat_add(&l->st_room_woken, 1);
				k = j + 1;
				break;
			}
		pthread_mutex_unlock(&l->lock);
	}
	pthread_mutex_unlock(&ti->lock);
}

/*
 * Sleep until one of this thread's lanes with requests in flight has bytes to read, or room
 * for the requests it holds back when this thread sends for it (tcp_drv_must_send_locked;
 * before, a full socket waited for an answer or for the end of this sleep: WRITE 256 KiB x4
 * from one thread through a 64 KiB socket buffer ran some rounds at a quarter of the rate),
 * at most @timeout_ns (between empty polls). A socket closed after its descriptor was taken
 * only ends the sleep early (POLLNVAL) or leaves it to its timeout. None (only large slices,
 * left to the workers, or nothing of this thread's): TE_ERR_NOT_FOUND, the core stops
 * polling.
 */
enum te_status tcp_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	struct tcp_inst *ti = (struct tcp_inst *)inst;
	struct pollfd pfd[TCP_DRV_LANES];
	struct timespec ts = { .tv_sec = (time_t)(timeout_ns / 1000000000ull),
			       .tv_nsec = (long)(timeout_ns % 1000000000ull) };
	uint32_t me = tcp_thread_no();
	struct tcp_peer *peer;
	struct tcp_lane *l;
	nfds_t n = 0;

	pthread_mutex_lock(&ti->lock);
	for (peer = ti->peers; n < TCP_DRV_LANES && (l = tcp_home_lane_next(&peer, me));) {
		if (l->state == TCP_LANE_UP && !l->rx_busy && !l->n_big)
			pfd[n++] = (struct pollfd){ .fd = l->fd,
						    .events = (short)(tcp_drv_must_send_locked(l)
									      ? POLLIN | POLLOUT
									      : POLLIN) };
		pthread_mutex_unlock(&l->lock);
	}
	pthread_mutex_unlock(&ti->lock);
	if (!n)
		return TE_ERR_NOT_FOUND; /* nothing of this thread's: the core stops polling */
	if (ppoll(pfd, n, &ts, NULL) < 0) {
		if (errno != EINTR)
			return TE_ERR_UNSUPPORTED;
		return TE_OK;
	}
	for (nfds_t k = 0; k < n; k++)
		if (pfd[k].revents & pfd[k].events & POLLOUT) {
			tcp_wait_count_room(ti, me, pfd, n);
			break;
		}
	return TE_OK;
}

/*
 * A thread in te_batch_wait starts (1) or stops (0) polling its lanes. While at least one
 * thread drives a lane (n_drivers), the lane is quiet: its worker sleeps rather than wake up
 * for every answer to race the driver for it, and the driver also sends what a full socket
 * held back. When the last one stops, the worker takes over at once (the re-armed events
 * report what waits). Lanes that get requests meanwhile stay loud: both read them.
 */
void tcp_drive(struct te_plugin_inst *inst, uint32_t driving)
{
	struct tcp_inst *ti = (struct tcp_inst *)inst;
	struct tcp_drv *d = &tcp_drv;

	if (!ti->hybrid)
		return;
	if (driving) {
		uint32_t me = tcp_thread_no();

		struct tcp_lane *broken[TCP_DRV_LANES], *l;
		struct tcp_peer *peer;
		uint32_t n_broken = 0;

		pthread_mutex_lock(&ti->lock);
		for (peer = ti->peers;
		     d->n < TCP_DRV_LANES && (l = tcp_home_lane_next(&peer, me));) {
			if (!l->closing) {
				int arm = -1; /* listen: 0 quiet, 1 events on, -1 as it is */

				l->n_drivers++;
				d->lanes[d->n++] = l;
				/*
				 * Quiet it for this driver; or, left quiet by tcp_drive 0 and
				 * now with slices for its worker, give it back to the worker.
				 */
				if (l->state == TCP_LANE_UP && l->hs == TCP_HS_READY &&
				    !l->rx_quiet && !l->n_big)
					arm = 0;
				else if (l->state == TCP_LANE_UP && l->rx_quiet && l->n_big &&
					 l->n_drivers == 1)
					arm = 1;
				if (arm >= 0) {
					tcp_lane_listen_locked(l, arm);
					if (l->state == TCP_LANE_BROKEN)
						broken[n_broken++] = l;
				}
			}
			pthread_mutex_unlock(&l->lock);
		}
		pthread_mutex_unlock(&ti->lock);
		/* Pinned by n_drivers; kicked without the instance lock (the worker's is taken). */
		for (uint32_t i = 0; i < n_broken; i++)
			tcp_kick_lane(broken[i]);
		return;
	}
	/* Our lanes are pinned by n_drivers: no instance lock needed to reach them. */
	for (uint32_t i = 0; i < d->n;) {
		struct tcp_lane *l = d->lanes[i];
		bool kick = false, linger = false;
		uint64_t due = 0;

		if (l->peer->ti != ti) {
			i++; /* another instance's (one thread drives one engine at a time) */
			continue;
		}
		pthread_mutex_lock(&l->lock);
		if (--l->n_drivers == 0) {
			/*
			 * Nothing in flight, and the last submit here as someone's own lane
			 * sent more WRITE payload than a submit sends inline: stay quiet for
			 * wait_hold_ns, the thread likely submits such a batch again and waits
			 * (no epoll_ctl either way). Smaller batches gain from the worker's
			 * help (4 KiB READs at batch 128: 0.93x held).
			 */
			linger = ti->wait_hold_ns && l->bulk_writes && l->rx_quiet &&
				 l->state == TCP_LANE_UP && !l->rx_want && !l->closing &&
				 !atomic_load_explicit(&l->used, memory_order_relaxed);
			if (linger) {
				l->drive_end_ns = tcp_now_ns();
				due = l->drive_end_ns + ti->wait_hold_ns;
			} else if (l->rx_quiet && l->state == TCP_LANE_UP) {
				tcp_lane_listen_locked(l, true);
			}
			/*
			 * Broken by that, or closing and waiting for us to be freed; or a driver
			 * stopped at its budget with answers left in the receive buffer: the
			 * re-armed events report only what waits in the socket.
			 */
			kick = l->state == TCP_LANE_BROKEN || l->closing || l->rx_want;
		}
		pthread_mutex_unlock(&l->lock);
		d->lanes[i] = d->lanes[--d->n];
		if (linger)
			tcp_worker_linger(l->w, due);
		if (kick)
			tcp_kick_lane(l);
	}
}
