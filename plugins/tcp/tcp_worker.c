/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp_worker.c: the tcp transport's epoll threads: kicks, deferred completions, the again
 * list, housekeeping ticks and the event loop.
 */
#include "tcp.h"

/* --- workers: kicks, deferred completions, again list --------------------------------- */

void tcp_worker_wake_locked(struct tcp_worker *w)
{
	uint64_t one = 1;

	if (w->kicked)
		return;
	w->kicked = true;
	/* A full counter (impossible in practice) still leaves the eventfd readable. */
	if (write(w->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		tcp_log(w->ti, TE_PLUGIN_LOG_ERROR, "worker %u: cannot wake: %s", w->index,
			strerror(errno));
}

/*
 * A lane tcp_drive 0 left quiet must be looked at by @due (tcp_worker_linger_due): @w is
 * woken when that is earlier than what it sleeps for. Any thread.
 */
void tcp_worker_linger(struct tcp_worker *w, uint64_t due)
{
	uint64_t cur;

	pthread_mutex_lock(&w->lock);
	cur = atomic_load_explicit(&w->linger_due_ns, memory_order_relaxed);
	if (!cur || due < cur) {
		atomic_store_explicit(&w->linger_due_ns, due, memory_order_relaxed);
		tcp_worker_wake_locked(w);
	}
	pthread_mutex_unlock(&w->lock);
}

/* Ask @l's worker to look at it (finish a failure, close it). Any thread. */
void tcp_kick_lane(struct tcp_lane *l)
{
	struct tcp_worker *w = l->w;

	pthread_mutex_lock(&w->lock);
	if (!l->in_todo) {
		l->in_todo = true;
		l->todo_next = w->todo;
		w->todo = l;
	}
	tcp_worker_wake_locked(w);
	pthread_mutex_unlock(&w->lock);
}

/*
 * Fail @s from @w's thread: submit must not report synchronously (the core still touches
 * the slices it hands over after submit returns).
 */
void tcp_defer_fail(struct tcp_worker *w, struct te_plugin_slice *s, enum te_status st,
		    const char *detail)
{
	struct tcp_spriv *p = tcp_priv(s);

	p->status = st;
	tcp_priv_detail(s, "%s", detail);
	p->next = NULL;
	atomic_store_explicit(&p->lane, NULL, memory_order_relaxed);
	pthread_mutex_lock(&w->lock);
	if (w->defer_tail)
		tcp_priv(w->defer_tail)->next = s;
	else
		w->defer_head = s;
	w->defer_tail = s;
	tcp_worker_wake_locked(w);
	pthread_mutex_unlock(&w->lock);
}

void tcp_again_add(struct tcp_worker *w, struct tcp_ep *ep)
{
	if (ep->again)
		return;
	if (w->n_again == w->cap_again) {
		uint32_t ncap = w->cap_again ? w->cap_again * 2 : 16;
		struct tcp_ep **na = realloc(w->again, ncap * sizeof(*na));

		/* Without room the object simply waits for its next epoll edge. */
		if (!na)
			return;
		w->again = na;
		w->cap_again = ncap;
	}
	ep->again = true;
	w->again[w->n_again++] = ep;
}

void tcp_again_remove(struct tcp_worker *w, struct tcp_ep *ep)
{
	if (!ep->again)
		return;
	for (uint32_t i = 0; i < w->n_again; i++) {
		if (w->again[i] == ep) {
			w->again[i] = w->again[--w->n_again];
			break;
		}
	}
	ep->again = false;
}

/* A warning that floods can repeat: at most one a second per worker, with a count. */
void tcp_warn_limited(struct tcp_inst *ti, struct tcp_worker *w, const char *fmt, ...)
{
	uint64_t now = tcp_now_ns();
	char line[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (now - w->warn_ns < 1000000000ull) {
		w->warn_quiet++;
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "%s", line);
		return;
	}
	if (w->warn_quiet)
		tcp_log(ti, TE_PLUGIN_LOG_WARN, "%s (and %u more like it in the last second)", line,
			w->warn_quiet);
	else
		tcp_log(ti, TE_PLUGIN_LOG_WARN, "%s", line);
	w->warn_ns = now;
	w->warn_quiet = 0;
}

static void tcp_worker_todo(struct tcp_inst *ti, struct tcp_worker *w)
{
	struct te_plugin_slice *defer;

	for (;;) {
		struct tcp_lane *l;

		pthread_mutex_lock(&w->lock);
		l = w->todo;
		if (l) {
			w->todo = l->todo_next;
			l->in_todo = false;
			pthread_mutex_unlock(&w->lock);
			tcp_lane_service(ti, l);
			continue;
		}
		defer = w->defer_head;
		w->defer_head = w->defer_tail = NULL;
		w->kicked = false;
		pthread_mutex_unlock(&w->lock);
		break;
	}
	while (defer) {
		struct te_plugin_slice *s = defer;

		defer = tcp_priv(s)->next;
		tcp_report_priv(ti, s);
	}
}

/*
 * Periodic checks: connect timeouts, lanes stuck with canceled requests, WRITEs waiting for a
 * fence (reported when their deadline passed; their lane reconnects to get the fence), slot
 * tables that sat idle (tcp_lane_shrink_tick_locked), and the serving side's time limits.
 */
static void tcp_worker_tick(struct tcp_inst *ti, struct tcp_worker *w)
{
	struct tcp_lane *hit[64], *up[64];
	struct tcp_rlist expired = { 0 };
	uint64_t now = tcp_now_ns();
	uint32_t n = 0, n_up = 0;

	pthread_mutex_lock(&w->lock);
	for (struct tcp_lane *l = w->lanes; l && n < 64 && n_up < 64; l = l->wnext) {
		bool bad = false;

		pthread_mutex_lock(&l->lock);
		if (l->state == TCP_LANE_CONNECTING &&
		    now - l->connect_start_ns > ti->connect_timeout_ms * 1000000ull &&
		    tcp_sock_connected(l->fd)) {
			/*
			 * The kernel connected it; this worker has not seen the event yet (a
			 * starved thread, or more events than one epoll_wait returns): up now.
			 */
			up[n_up++] = l;
		} else if (l->state == TCP_LANE_CONNECTING &&
			   now - l->connect_start_ns > ti->connect_timeout_ms * 1000000ull) {
			tcp_lane_fail_locked(
				l, TE_ERR_PEER_UNREACHABLE,
				TCP_NAME ": connect to %s (%s) timed out after %" PRIu64 " ms",
				l->peer->name, l->peer->addr_text, ti->connect_timeout_ms);
			bad = true;
		} else if (l->state == TCP_LANE_UP && (l->n_orphan || l->n_canceled)) {
			/* relaxed: only compared with itself one tick later */
			uint64_t prog = atomic_load_explicit(&l->progress, memory_order_relaxed);

			if (prog != l->seen_progress) {
				l->seen_progress = prog;
				l->stall_ticks = 0;
			} else if (++l->stall_ticks >= TCP_STALL_TICKS) {
				tcp_lane_fail_locked(l, TE_ERR_PATH_TIMEOUT,
						     TCP_NAME
						     ": lane %u to %s (%s) made no progress "
						     "for %u ms with canceled requests",
						     l->index, l->peer->name, l->peer->addr_text,
						     TCP_STALL_TICKS * TCP_TICK_MS);
				bad = true;
			}
		} else if (l->state == TCP_LANE_UP && l->send_err &&
			   now - l->send_err_ns > TCP_TICK_MS * 1000000ull) {
			/* The receive side found no answer to read (tcp_lane_flush). */
			tcp_lane_send_failed_locked(l, l->send_err);
			bad = true;
		} else if (l->state == TCP_LANE_BROKEN && !l->sending) {
			bad = true; /* normally handled by a kick already */
		}
		tcp_lane_shrink_tick_locked(ti, l);
		if (l->n_fence) {
			tcp_fence_take_locked(l, false, now, &expired);
			if (l->n_fence && l->state == TCP_LANE_DOWN && !l->closing &&
			    now - l->fence_connect_ns >= TCP_TICK_MS * 1000000ull) {
				l->fence_connect_ns = now;
				tcp_lane_connect_locked(ti, l);
				bad = bad || l->state == TCP_LANE_BROKEN;
			}
		}
		pthread_mutex_unlock(&l->lock);
		if (bad)
			hit[n++] = l;
	}
	pthread_mutex_unlock(&w->lock);
	/* Reported without the worker lock: slice_done may call unload_peer, which takes it. */
	tcp_rlist_report(ti, &expired);
	for (uint32_t i = 0; i < n; i++)
		tcp_lane_break(ti, hit[i], TE_ERR_CONN_RESET, TCP_NAME ": connection broken");
	for (uint32_t i = 0; i < n_up; i++)
		tcp_lane_event(ti, w, up[i], EPOLLOUT);
	tcp_conns_tick(ti, w, now);
}

static void tcp_run_again(struct tcp_inst *ti, struct tcp_worker *w)
{
	for (uint32_t rounds = w->n_again; rounds && w->n_again; rounds--) {
		struct tcp_ep *ep = w->again[0];

		w->again[0] = w->again[--w->n_again];
		ep->again = false;
		if (ep->kind == TCP_EP_LANE)
			tcp_lane_rx(ti, w, (struct tcp_lane *)ep);
		else if (ep->kind == TCP_EP_CONN)
			tcp_conn_rx(ti, w, (struct tcp_conn *)ep);
	}
}

void *tcp_worker_main(void *arg)
{
	struct tcp_worker *w = arg;
	struct tcp_inst *ti = w->ti;
	struct epoll_event evs[TCP_EVENTS];
	uint64_t next_tick = tcp_now_ns() + TCP_TICK_MS * 1000000ull;

	while (!atomic_load_explicit(&ti->stopping, memory_order_acquire)) {
		uint64_t now, due;
		int n, timeout;

		tcp_worker_todo(ti, w);
		now = tcp_now_ns();
		due = atomic_load_explicit(&w->linger_due_ns, memory_order_relaxed);
		due = due && due < next_tick ? due : next_tick;
		timeout = w->n_again || now >= due ? 0 : (int)((due - now) / 1000000) + 1;
		n = epoll_wait(w->epfd, evs, TCP_EVENTS, timeout);
		if (n < 0) {
			if (errno != EINTR) {
				tcp_log(ti, TE_PLUGIN_LOG_ERROR, "worker %u: epoll_wait: %s",
					w->index, strerror(errno));
				usleep(10000); /* do not spin on a persistent error */
			}
			continue;
		}
		for (int i = 0; i < n; i++) {
			struct tcp_ep *ep = evs[i].data.ptr;
			uint64_t cnt;

			switch (ep->kind) {
			case TCP_EP_KICK:
				/* The work itself is picked up by tcp_worker_todo. */
				if (read(w->kick_fd, &cnt, sizeof(cnt)) < 0 && errno != EAGAIN)
					tcp_log(ti, TE_PLUGIN_LOG_ERROR, "worker %u: eventfd: %s",
						w->index, strerror(errno));
				break;
			case TCP_EP_LISTEN:
				tcp_accept(ti, w);
				break;
			case TCP_EP_LANE:
				tcp_lane_event(ti, w, (struct tcp_lane *)ep, evs[i].events);
				break;
			case TCP_EP_CONN:
				tcp_conn_event(ti, w, (struct tcp_conn *)ep, evs[i].events);
				break;
			}
		}
		tcp_run_again(ti, w);
		tcp_worker_linger_due(ti, w);
		/*
		 * Time limits after the events: a worker that was not scheduled for a while
		 * first handles what arrived meanwhile (a connect that completed, a HELLO),
		 * then judges what is really late.
		 */
		now = tcp_now_ns();
		if (now >= next_tick) {
			tcp_worker_tick(ti, w);
			next_tick = now + TCP_TICK_MS * 1000000ull;
		}
	}
	return NULL;
}
