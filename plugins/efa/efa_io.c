/* SPDX-License-Identifier: Apache-2.0 */
/* efa_io.c: the efa data path: submit, completions, cancel fences and progress threads. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np, ppoll */
#endif

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "efa.h"


/* libfabric error values are positive in CQ entries, but some providers store -err. */
static int efa_errnum(int err)
{
	return err < 0 ? -err : err;
}

/* te status of a libfabric error (CQ entry or failed post), by what a retry can change. */
static enum te_status efa_status_of(int err)
{
	switch (efa_errnum(err)) {
	case FI_EAGAIN:
	case FI_ENOMEM:
	case FI_ENOSPC:
		return TE_ERR_AGAIN;
	case FI_ECONNRESET:
	case FI_ECONNABORTED:
	case FI_ENOTCONN:
	case FI_ESHUTDOWN:
	case FI_ECANCELED:
	case EPIPE:
		return TE_ERR_CONN_RESET;
	case FI_ECONNREFUSED:
	case FI_EHOSTUNREACH:
	case FI_ENETUNREACH:
	case FI_EADDRNOTAVAIL:
		return TE_ERR_PEER_UNREACHABLE;
	case FI_ENETDOWN:
		return TE_ERR_LINK_DOWN;
	case FI_ETIMEDOUT:
		return TE_ERR_PATH_TIMEOUT;
	case FI_EACCES:
	case FI_EPERM:
	case FI_EKEYREJECTED:
	case FI_EFAULT:
		return TE_ERR_REMOTE_ACCESS;
	default:
		return TE_ERR_TRANSIENT;
	}
}

/*
 * progress 'caller': whether the core drove efa_progress within EFA_CALLER_NS. Then it keeps
 * doing so while it has slices in flight (te_batch_wait, or its worker), and the progress
 * threads keep away from the CQs. Relaxed: a stale view costs one wake-up or one poll.
 */
static bool efa_caller_driving(struct efa_inst *ei, uint64_t now)
{
	return ei->progress == EFA_PROGRESS_CALLER &&
	       now - atomic_load_explicit(&ei->caller_ns, memory_order_relaxed) < EFA_CALLER_NS;
}

/* End @p's sleep, or its next one. Any thread. */
void efa_prog_wake(struct efa_prog *p)
{
	uint64_t one = 1;

	if (write(p->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		efa_log(p->ei, TE_PLUGIN_LOG_ERROR, "progress thread %u: cannot wake: %s", p->index,
			strerror(errno));
}

/* Wake @p if it sleeps (or is about to) and the core does not poll for it. Any thread. */
void efa_prog_kick(struct efa_prog *p)
{
	/* seq_cst: pairs with the thread's store of sleeping before its last CQ check. */
	if (!atomic_load(&p->sleeping))
		return;
	/* Parked: the core polls what was posted (progress 'caller'). */
	if (atomic_load_explicit(&p->parked, memory_order_relaxed) ||
	    efa_caller_driving(p->ei, efa_now_ns()))
		return;
	efa_prog_wake(p);
}


/* --- in-flight window ----------------------------------------------------------------- */

/* Claim a free slot of @nic's window; -1 when the window is full. */
static int64_t efa_slot_claim(struct efa_nic *nic)
{
	/* relaxed: a hint only; the CAS below orders the claim */
	uint32_t start = atomic_load_explicit(&nic->hint, memory_order_relaxed);

	for (uint32_t k = 0; k < nic->n_words; k++) {
		uint32_t w = (start + k) % nic->n_words;
		uint64_t v = atomic_load_explicit(&nic->bits[w], memory_order_relaxed);

		while (~v) {
			uint64_t bit = ~v & (v + 1); /* lowest zero bit */

			if (atomic_compare_exchange_weak_explicit(&nic->bits[w], &v, v | bit,
								  memory_order_acquire,
								  memory_order_relaxed)) {
				if (w != start)
					atomic_store_explicit(&nic->hint, w, memory_order_relaxed);
				return (int64_t)w * 64 + __builtin_ctzll(bit);
			}
		}
	}
	return -1;
}

static void efa_slot_release(struct efa_nic *nic, uint32_t slot)
{
	/* relaxed: only fini reads slots, after joining every thread */
	atomic_store_explicit(&nic->slots[slot], NULL, memory_order_relaxed);
	atomic_fetch_and_explicit(&nic->bits[slot / 64], ~(1ull << (slot % 64)),
				  memory_order_release);
}

/* The AV entry (over connections: the connection) @p was posted to; NULL before its post. */
static struct efa_av_entry *efa_slice_entry(const struct efa_spriv *p)
{
	if (p->rnic == EFA_RNIC_NONE)
		return NULL;
	return p->peer->entries[p->nic->index * p->peer->n_rnics + p->rnic];
}

/* --- completion ------------------------------------------------------------------------ */

/* Report a slice attempt whose slot is given back: its other references go, then the report. */
static void efa_slice_report(struct efa_inst *ei, struct efa_spriv *p, enum te_status st,
			     uint64_t bytes, const char *detail)
{
	struct te_plugin_slice *s = p->slice;
	struct efa_nic *nic = p->nic;
	struct efa_peer *peer = p->peer; /* the slice (and its priv) may be gone after slice_done */

	atomic_fetch_sub_explicit(&peer->paths[nic->index].inflight, 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&p->mem->inflight, 1, memory_order_release);
	ei->host->slice_done(ei->ctx, s, st, bytes, detail);
	efa_peer_unref(ei, peer);
}

/* Ask @nic's progress thread to run the fence (efa_nic_fence). Any thread. */
static void efa_fence_ask(struct efa_nic *nic)
{
	atomic_fetch_add(&nic->fence_req, 1);
	efa_prog_wake(nic->prog);
}

/*
 * Report the slices held for @nic's closed connections (nic->held) whose peer has closed its
 * end since (closed_ns cleared), or all of them (@all: fini). Returns how many. Any thread,
 * no lock held.
 */
static uint32_t efa_release_held(struct efa_nic *nic, bool all)
{
	struct efa_inst *ei = nic->ei;
	struct te_plugin_slice *s, *out = NULL, **pp;
	uint32_t n = 0;

	if (!atomic_load_explicit(&nic->n_held, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&ei->defer_lock);
	for (pp = &nic->held; (s = *pp);) {
		struct efa_spriv *p = efa_priv(s);

		if (all || !atomic_load(&efa_slice_entry(p)->closed_ns)) {
			*pp = p->next;
			p->next = out;
			out = s;
			atomic_fetch_sub_explicit(&nic->n_held, 1, memory_order_relaxed);
		} else {
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&ei->defer_lock);
	while (out) {
		struct efa_spriv *p = efa_priv(out);
		enum te_status st = (enum te_status)p->status;

		out = p->next;
		/* fini hands back every slice it holds canceled (te_plugin.h). */
		if (atomic_load_explicit(&ei->stopping, memory_order_relaxed))
			st = TE_ERR_CANCELED;
		efa_slice_report(ei, p, st, 0, p->detail);
		n++;
	}
	return n;
}

/*
 * End one slice attempt: give back its slot, then report. @err is 0 or a libfabric error;
 * @prov is the provider's text for it (may be NULL). A failure on a connection a fence closed
 * waits in nic->held while that connection's bytes may still land (closed_ns).
 */
static void efa_slice_finish(struct efa_inst *ei, struct efa_spriv *p, int err, int prov_errno,
			     const char *prov)
{
	struct te_plugin_slice *s = p->slice;
	struct efa_nic *nic = p->nic;
	struct efa_peer *peer = p->peer;
	enum te_status st = TE_OK;
	char detail[EFA_DETAIL];
	uint64_t len = s->length;
	struct efa_av_entry *e = efa_slice_entry(p);
	/* fini hands back every slice it holds canceled: closing the endpoint failed it. */
	bool fini = atomic_load_explicit(&ei->stopping, memory_order_relaxed);

	if (err) {
		bool canceled = atomic_load_explicit(&p->canceled, memory_order_relaxed);

		st = efa_status_of(err);
		if (fini ||
		    (canceled && (st == TE_ERR_CONN_RESET || efa_errnum(err) == FI_ECANCELED)))
			st = TE_ERR_CANCELED;
		snprintf(detail, sizeof(detail),
			 EFA_NAME "[%s] %s: %s of %" PRIu64 " bytes %s %s at 0x%" PRIx64
				  " failed: %s (%d)%s%s%s",
			 ei->prov_name, nic->name,
			 s->opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE", len,
			 s->opcode == TE_PLUGIN_OP_READ ? "from" : "to", peer->name, s->remote,
			 fi_strerror(efa_errnum(err)), efa_errnum(err), prov ? "; provider: " : "",
			 prov ? prov : "",
			 fini	    ? " (instance shut down)"
			 : canceled ? " (canceled)"
				    : "");
		if (prov_errno && strlen(detail) + 24 < sizeof(detail))
			snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
				 " [provider errno %d]", prov_errno);
	}
	efa_slot_release(nic, p->slot);
	atomic_fetch_sub_explicit(&nic->inflight, 1, memory_order_relaxed);
	/*
	 * A fence waits on this connection (its oldest operation out was a READ, or a canceled
	 * slice of it was): look again now. The peer reference keeps @e alive until the unref.
	 */
	if (e && atomic_load_explicit(&e->draining, memory_order_relaxed))
		efa_fence_ask(nic);
	/*
	 * Failed on a connection a fence closed, whose bytes already in the sockets may still
	 * land at the peer: reported when the peer has closed its end (efa_nic_fence), so that
	 * neither its task ends nor a retry leaves before they did. Its region and peer stay held.
	 */
	if (st != TE_OK && e && !fini && atomic_load(&e->closed_ns)) {
		p->status = st;
		snprintf(p->detail, sizeof(p->detail), "%s", detail);
		pthread_mutex_lock(&ei->defer_lock);
		p->next = nic->held;
		nic->held = s;
		atomic_fetch_add_explicit(&nic->n_held, 1, memory_order_relaxed);
		pthread_mutex_unlock(&ei->defer_lock);
		efa_fence_ask(nic); /* the fence may have looked at nic->held already */
		return;
	}
	efa_slice_report(ei, p, st, st == TE_OK ? len : 0, st == TE_OK ? NULL : detail);
}

/* One CQ entry (or error entry) of @nic. */
static void efa_complete(struct efa_nic *nic, void *context, int err, int prov_errno,
			 const char *prov)
{
	struct efa_inst *ei = nic->ei;
	struct efa_op *op = context;

	if (!op) {
		/*
		 * An operation's outcome is lost: shm (1.17) reports failed CMA copies without
		 * their context. That slice stays with the plugin until fini; the core ends its
		 * task at the deadline. Said once per NIC, then at debug level.
		 */
		uint32_t lost = atomic_fetch_add_explicit(&nic->lost, 1, memory_order_relaxed);

		efa_log(ei, lost ? TE_PLUGIN_LOG_DEBUG : TE_PLUGIN_LOG_WARN,
			"%s: %s completion without context (%u so far): %s%s%s; its slice "
			"ends when the core gives up on it and its peer's process is gone",
			nic->name, err ? "error" : "a", lost + 1,
			err ? fi_strerror(efa_errnum(err)) : "", prov ? "; provider: " : "",
			prov ? prov : "");
		return;
	}
	switch (op->kind) {
	case EFA_OP_SLICE:
		efa_slice_finish(ei, (struct efa_spriv *)(void *)op, err, prov_errno, prov);
		break;
	case EFA_OP_RECV:
		/* Content does not matter: the message only warmed the path. */
		if (!atomic_load_explicit(&ei->stopping, memory_order_relaxed))
			efa_rx_post(nic, (struct efa_rxbuf *)(void *)op);
		break;
	case EFA_OP_HELLO: {
		struct efa_hello *h = (struct efa_hello *)(void *)op;

		if (err)
			efa_log(ei, TE_PLUGIN_LOG_INFO,
				"%s: warm-up message to %s (remote NIC %u) failed: %s%s%s",
				nic->name, h->peer->name, h->rnic, fi_strerror(efa_errnum(err)),
				prov ? "; provider: " : "", prov ? prov : "");
		efa_peer_unref(ei, h->peer);
		break;
	}
	default:
		efa_log(ei, TE_PLUGIN_LOG_ERROR, "%s: completion of unknown kind %u", nic->name,
			op->kind);
		break;
	}
}

/*
 * One read of up to @max entries of @nic's CQ, whose lock the caller holds, handed to
 * efa_complete. Returns how many. The lock is released, except when the CQ was empty
 * (*empty_out): the caller then still holds it. *more_out: the CQ may hold more. Entries read
 * and not yet delivered count in nic->reaping, so that a fence under the lock knows when no
 * outcome is on its way.
 */
static uint32_t efa_nic_reap_locked(struct efa_nic *nic, uint32_t max, bool *empty_out,
				    bool *more_out)
{
	struct fi_cq_entry ent[EFA_CQ_BATCH];
	struct fi_cq_err_entry e;
	const char *prov = NULL;
	char text[128];
	ssize_t n;

	*empty_out = *more_out = false;
	n = fi_cq_read(nic->cq, ent, EFA_MIN(EFA_CQ_BATCH, max));
	if (n > 0) {
		/* relaxed: the NIC lock orders it before the fence's read */
		atomic_fetch_add_explicit(&nic->reaping, 1, memory_order_relaxed);
		efa_nic_unlock(nic);
		for (ssize_t i = 0; i < n; i++)
			efa_complete(nic, ent[i].op_context, 0, 0, NULL);
		atomic_fetch_sub_explicit(&nic->reaping, 1, memory_order_release);
		*more_out = (size_t)n == EFA_CQ_BATCH;
		return (uint32_t)n;
	}
	if (n != -FI_EAVAIL) {
		if (n == -FI_EAGAIN) {
			*empty_out = true;
			return 0;
		}
		efa_nic_unlock(nic);
		efa_log(nic->ei, TE_PLUGIN_LOG_ERROR, "%s: fi_cq_read: %s", nic->name,
			fi_strerror((int)-n));
		return 0;
	}
	memset(&e, 0, sizeof(e));
	n = fi_cq_readerr(nic->cq, &e, 0);
	if (n != 1) {
		efa_nic_unlock(nic);
		return 0;
	}
	/* Without a provider errno its text says "Success": nothing to add. */
	if (!nic->closed && e.prov_errno)
		prov = fi_cq_strerror(nic->cq, e.prov_errno, e.err_data, text, sizeof(text));
	atomic_fetch_add_explicit(&nic->reaping, 1, memory_order_relaxed);
	efa_nic_unlock(nic);
	if (prov && !*prov)
		prov = NULL;
	efa_complete(nic, e.op_context, e.err ? e.err : FI_EOTHER, e.prov_errno, prov);
	atomic_fetch_sub_explicit(&nic->reaping, 1, memory_order_release);
	*more_out = true;
	return 1;
}

/*
 * Read @nic's CQ: up to @budget completions; returns how many were handled. With @busy_out
 * the CQ is only read if the NIC's lock is free (*busy_out says it was not): a submit posting
 * there kicks the progress thread afterwards.
 */
static uint32_t efa_nic_poll(struct efa_nic *nic, uint32_t budget, bool *busy_out)
{
	uint32_t done = 0;

	while (done < budget) {
		bool empty, more;

		if (busy_out) {
			if (pthread_mutex_trylock(&nic->lock) != 0) {
				*busy_out = true;
				break;
			}
		} else {
			efa_nic_lock(nic);
		}
		done += efa_nic_reap_locked(nic, budget - done, &empty, &more);
		if (empty)
			efa_nic_unlock(nic);
		if (!more)
			break;
	}
	return done;
}

/* Report the slices submit could not post (never from inside submit). */
static uint32_t efa_flush_deferred(struct efa_inst *ei)
{
	struct te_plugin_slice *s;
	uint32_t n = 0;

	/* relaxed peek: a miss is caught on the next round (submit kicks after deferring) */
	if (!atomic_load_explicit(&ei->n_defer, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&ei->defer_lock);
	s = ei->defer_head;
	ei->defer_head = ei->defer_tail = NULL;
	atomic_store_explicit(&ei->n_defer, 0, memory_order_relaxed);
	pthread_mutex_unlock(&ei->defer_lock);
	while (s) {
		struct efa_spriv *p = efa_priv(s);
		struct te_plugin_slice *next = p->next;

		/* fini hands back every slice it holds canceled (te_plugin.h), these too. */
		if (atomic_load_explicit(&ei->stopping, memory_order_relaxed))
			p->status = TE_ERR_CANCELED;
		ei->host->slice_done(ei->ctx, s, (enum te_status)p->status, 0, p->detail);
		s = next;
		n++;
	}
	return n;
}

static void efa_defer_fail(struct efa_inst *ei, struct te_plugin_slice *s, enum te_status st,
			   const char *fmt, ...) TE_PLUGIN_PRINTF(4, 5);
static void efa_defer_fail(struct efa_inst *ei, struct te_plugin_slice *s, enum te_status st,
			   const char *fmt, ...)
{
	struct efa_spriv *p = efa_priv(s);
	va_list ap;

	p->status = st;
	va_start(ap, fmt);
	vsnprintf(p->detail, sizeof(p->detail), fmt, ap);
	va_end(ap);
	p->next = NULL;
	p->nic = NULL;
	pthread_mutex_lock(&ei->defer_lock);
	if (ei->defer_tail)
		efa_priv(ei->defer_tail)->next = s;
	else
		ei->defer_head = s;
	ei->defer_tail = s;
	atomic_fetch_add_explicit(&ei->n_defer, 1, memory_order_relaxed);
	pthread_mutex_unlock(&ei->defer_lock);
}

/* --- fence: what cancel asks for ---------------------------------------------------------- */

enum efa_fence {
	EFA_FENCE_IDLE, /* nothing to do */
	EFA_FENCE_DONE, /* closed connections or reported slices: outcomes may be on their way */
	EFA_FENCE_BUSY, /* the NIC was busy, or outcomes were on their way: look again */
};

/*
 * Remove @e from @nic's AV and insert it again (the NIC lock held: posts read e->fi_addr under
 * it). With FI_AV_REMOVE_CLEANUP, rxm closes its connection to the address on removal and
 * returns every operation queued on it as canceled; the next post connects again. Whether it
 * was removed.
 */
static bool efa_av_refresh_locked(struct efa_nic *nic, struct efa_av_entry *e,
				  const struct efa_peer *peer)
{
	fi_addr_t fa = FI_ADDR_NOTAVAIL;
	int rc = efa_av_remove_locked(nic, e);

	if (rc) {
		efa_log(nic->ei, TE_PLUGIN_LOG_WARN,
			"%s: fi_av_remove of %s: %s; its canceled operations end when the provider "
			"completes them",
			nic->name, peer->name, fi_strerror(-rc));
		return false;
	}
	rc = fi_av_insert(nic->av, e->addr, 1, &fa, 0, NULL);
	if (rc != 1 || fa == FI_ADDR_NOTAVAIL) {
		efa_log(nic->ei, TE_PLUGIN_LOG_ERROR,
			"%s: fi_av_insert of %s after a cancel: %s; transfers to it fail",
			nic->name, peer->name, rc < 0 ? fi_strerror(-rc) : "address not inserted");
		fa = FI_ADDR_NOTAVAIL;
	}
	e->fi_addr = fa;
	return true;
}

/*
 * Whether closing @e's connection may meet a READ response half received, which libfabric's
 * tcp provider before 1.18 (ei->read_close_unsafe) completes twice, the second time without a
 * context: rxm dereferences that inside fi_av_remove or fi_close (ofiwg/libfabric#8660). The
 * peer answers a connection's requests in the order they came (READ responses and the acks of
 * delivery-complete WRITEs leave from one queue, one at a time), so a READ's response can have
 * begun only once every earlier operation on the connection has had its answer: only when
 * the oldest operation still waiting for an answer is a READ. @nic's CQ was read empty with
 * nothing undelivered, and its lock is held or fini runs alone: what is in its window is what
 * waits for an answer (or for its post).
 */
static bool efa_read_exposed(const struct efa_nic *nic, const struct efa_av_entry *e)
{
	bool acked = nic->ei->write_flags & FI_DELIVERY_COMPLETE;
	bool any = false, read = false;
	uint32_t oldest = 0;

	for (uint32_t k = 0; k < nic->window; k++) {
		/* acquire: pairs with submit's release of the slot (rnic set before it) */
		struct te_plugin_slice *s =
			atomic_load_explicit(&nic->slots[k], memory_order_acquire);
		const struct efa_spriv *p;

		if (!s)
			continue;
		p = efa_priv(s);
		if (efa_slice_entry(p) != e)
			continue;
		/* A WRITE without delivery completion waits for no answer on the connection. */
		if (s->opcode == TE_PLUGIN_OP_WRITE && !acked)
			continue;
		if (!any || (int32_t)(p->seq - oldest) < 0) {
			any = true;
			oldest = p->seq;
			read = s->opcode == TE_PLUGIN_OP_READ;
		}
	}
	return read;
}

/*
 * The connections of @nic a fence keeps watching (nic->drain), from this pass's @want[i] (those
 * with canceled slices) and whether it @closed[i] them: one whose close waits for READ
 * responses holds back posts (draining); with ei->orphan_wait one closed holds the reports of
 * the slices that failed on it (closed_ns, efa_slice_finish) until the peer has closed its end
 * of the old connection too (efa_tcp_orphan), at most EFA_ORPHAN_MAX_NS. Every other one
 * watched so far is let go. @nic's lock held. Whether one is still watched.
 */
static bool efa_drain_set_locked(struct efa_nic *nic, struct efa_av_entry *const *want,
				 const bool *closed, uint32_t n)
{
	uint64_t now = efa_now_ns();
	uint32_t kept = 0;
	bool waits = false;

	for (uint32_t i = 0; i < n; i++)
		if (closed[i] && nic->ei->orphan_wait)
			atomic_store(&want[i]->closed_ns, now);
	for (uint32_t d = 0; d < nic->n_drain; d++) {
		struct efa_av_entry *e = nic->drain[d];
		uint64_t c = atomic_load(&e->closed_ns);
		bool hold = false, orphan = false;

		for (uint32_t i = 0; i < n && !hold; i++)
			hold = want[i] == e && !closed[i];
		if (c) {
			orphan = now - c < EFA_ORPHAN_MAX_NS && efa_tcp_orphan(e) == 1;
			if (!orphan)
				atomic_store(&e->closed_ns, 0);
		}
		atomic_store_explicit(&e->draining, hold, memory_order_relaxed);
		if (hold || orphan) {
			nic->drain[kept++] = e;
			waits = true;
		}
	}
	nic->n_drain = kept;
	for (uint32_t i = 0; i < n; i++) {
		struct efa_av_entry *e = want[i];
		bool listed = false;

		for (uint32_t d = 0; d < nic->n_drain && !listed; d++)
			listed = nic->drain[d] == e;
		if (listed || (closed[i] && !atomic_load(&e->closed_ns)))
			continue;
		if (nic->n_drain == EFA_FENCE_PEERS) {
			atomic_store(&e->closed_ns, 0); /* untracked: nothing waits for it */
			continue;
		}
		nic->drain[nic->n_drain++] = e;
		waits = true;
		if (closed[i])
			continue;
		atomic_store_explicit(&e->draining, true, memory_order_relaxed);
		efa_log(nic->ei, TE_PLUGIN_LOG_DEBUG,
			"%s: a connection with canceled operations closes once its READ responses "
			"are in (libfabric < 1.18); posts to it hold back",
			nic->name);
	}
	return waits;
}

/*
 * Take back the canceled slices of @nic, from the progress thread (it may wait for the NIC
 * lock, cancel may not). Over connections: close each one that carries a canceled slice
 * (efa_av_refresh_locked); what was queued on it comes back canceled through the CQ, and what
 * else ran on it is retried by the core. With ei->read_close_unsafe a connection whose READ
 * response may be half received is not closed: posts to it hold back until its READs are
 * answered (efa_read_exposed), which the slices' completions say (efa_slice_finish). shm: a
 * posted operation ran inside its post call (CMA), so a canceled slice still held either waits
 * for its peer (delivery completion, or no CMA: nothing fences that) or was lost by the
 * provider, which reports failed copies without their context; it ends here once the peer's
 * process is gone, whose memory cannot change.
 */
static enum efa_fence efa_nic_fence(struct efa_nic *nic)
{
	struct efa_inst *ei = nic->ei;
	struct efa_spriv *gone[EFA_CQ_BATCH];
	struct efa_av_entry *conn[EFA_FENCE_PEERS];
	const struct efa_peer *conn_peer[EFA_FENCE_PEERS];
	bool closed[EFA_FENCE_PEERS];
	uint32_t n_gone = 0, n_conn = 0, n_closed = 0, released;
	uint_fast64_t again = atomic_load_explicit(&nic->fence_again_ns, memory_order_relaxed);
	bool empty, more, waiting = false;

	if (!atomic_load(&nic->fence_req) && (!again || efa_now_ns() < again))
		return EFA_FENCE_IDLE;
	if (pthread_mutex_trylock(&nic->lock) != 0)
		return EFA_FENCE_BUSY;
	/*
	 * Only with no entry read and undelivered, and none left in the CQ, is a slice still in
	 * its slot one whose outcome is not on its way: peers and AV entries of the slices in
	 * the window stay alive while this thread holds the lock.
	 */
	if (atomic_load_explicit(&nic->reaping, memory_order_acquire)) {
		efa_nic_unlock(nic);
		return EFA_FENCE_BUSY;
	}
	if (efa_nic_reap_locked(nic, EFA_CQ_BATCH, &empty, &more) || !empty)
		return EFA_FENCE_BUSY; /* delivered what it read (and let go of the lock) */
	/* A cancel after this store asks again: its mark is set before its request. */
	atomic_store(&nic->fence_req, 0);
	atomic_store_explicit(&nic->fence_again_ns, 0, memory_order_relaxed);
	for (uint32_t k = 0; k < nic->window; k++) {
		struct te_plugin_slice *s =
			atomic_load_explicit(&nic->slots[k], memory_order_acquire);
		struct efa_av_entry *e;
		struct efa_spriv *p;
		uint32_t i;

		if (!s)
			continue;
		p = efa_priv(s);
		if (atomic_load(&p->canceled) != EFA_CANCEL_ASKED)
			continue;
		/* Receives only, on these providers; costs nothing to ask. */
		(void)fi_cancel(&nic->ep->fid, &p->op.ctx);
		if (ei->shm) {
			if (!efa_peer_dead(p->peer) || n_gone == EFA_CQ_BATCH) {
				waiting = true;
				continue;
			}
			atomic_store(&p->canceled, EFA_CANCEL_FENCED);
			gone[n_gone++] = p;
			continue;
		}
		e = efa_slice_entry(p);
		if (!e) {
			waiting = true; /* not posted yet: its submit waits for this lock */
			continue;
		}
		for (i = 0; i < n_conn && conn[i] != e; i++)
			;
		if (i == n_conn) {
			if (n_conn == EFA_FENCE_PEERS) {
				waiting = true;
				continue;
			}
			conn_peer[n_conn] = p->peer;
			conn[n_conn++] = e;
		}
	}
	for (uint32_t i = 0; i < n_conn; i++) {
		closed[i] = (!ei->read_close_unsafe || !efa_read_exposed(nic, conn[i])) &&
			    efa_av_refresh_locked(nic, conn[i], conn_peer[i]);
		if (closed[i])
			n_closed++;
		else
			waiting = true;
	}
	if (efa_drain_set_locked(nic, conn, closed, n_conn))
		waiting = true;
	/* The canceled slices on the closed connections: their outcomes are on their way. */
	for (uint32_t k = 0; n_closed && k < nic->window; k++) {
		struct te_plugin_slice *s =
			atomic_load_explicit(&nic->slots[k], memory_order_acquire);
		struct efa_av_entry *e;
		unsigned asked = EFA_CANCEL_ASKED;
		uint32_t i;

		if (!s || !(e = efa_slice_entry(efa_priv(s))))
			continue;
		for (i = 0; i < n_conn && (conn[i] != e || !closed[i]); i++)
			;
		if (i < n_conn)
			atomic_compare_exchange_strong(&efa_priv(s)->canceled, &asked,
						       EFA_CANCEL_FENCED);
	}
	efa_nic_unlock(nic);
	released = efa_release_held(nic, false);
	for (uint32_t i = 0; i < n_gone; i++) {
		char why[96];

		snprintf(why, sizeof(why), "peer process %d exited", gone[i]->peer->pid);
		efa_slice_finish(ei, gone[i], FI_ECANCELED, 0, why);
	}
	if (waiting)
		atomic_store_explicit(&nic->fence_again_ns, efa_now_ns() + EFA_SAFETY_NS,
				      memory_order_relaxed);
	if (n_closed)
		efa_log(ei, TE_PLUGIN_LOG_DEBUG,
			"%s: closed %u connection(s) to take back canceled operations", nic->name,
			n_closed);
	return n_gone || n_closed || released ? EFA_FENCE_DONE
	       : waiting		      ? EFA_FENCE_BUSY
					      : EFA_FENCE_IDLE;
}

/* --- progress threads ------------------------------------------------------------------ */

static bool efa_prog_busy_nics(const struct efa_prog *p)
{
	for (uint32_t i = 0; i < p->n_nics; i++)
		if (atomic_load_explicit(&p->nics[i]->inflight, memory_order_relaxed))
			return true;
	return false;
}

/*
 * Sleep until a CQ wait fd fires, a kick comes or the timeout passes. @yielded: a submit was
 * posting on one of our NICs (we left its CQ alone): wait for its kick only, briefly.
 */
static struct timespec efa_timespec(uint64_t ns)
{
	return (struct timespec){ .tv_sec = (time_t)(ns / 1000000000ull),
				  .tv_nsec = (long)(ns % 1000000000ull) };
}

/* ppoll the first @n of @p's fds (the kick fd, then CQ wait fds) for @ns; take a kick. */
static void efa_prog_ppoll(struct efa_prog *p, nfds_t n, uint64_t ns)
{
	struct timespec ts = efa_timespec(ns);

	if (ppoll(p->pfds, n, &ts, NULL) > 0 && (p->pfds[0].revents & POLLIN)) {
		uint64_t v;

		if (read(p->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
			efa_log(p->ei, TE_PLUGIN_LOG_ERROR, "progress thread %u: kick read: %s",
				p->index, strerror(errno));
	}
}

static void efa_prog_sleep(struct efa_prog *p, bool yielded)
{
	struct efa_inst *ei = p->ei;
	uint64_t timeout_ns;
	nfds_t n = 1;

	/* seq_cst: pairs with efa_prog_kick's load after posting. */
	atomic_store(&p->sleeping, 1);
	if (p->index == 0 && atomic_load_explicit(&ei->n_defer, memory_order_relaxed))
		goto out_awake;
	if (yielded) {
		timeout_ns = ei->poll_ns;
	} else if (p->all_fd) {
		for (uint32_t i = 0; i < p->n_nics; i++) {
			struct efa_nic *nic = p->nics[i];
			int rc;

			efa_nic_lock(nic);
			rc = fi_trywait(nic->fabric, &nic->cq_fid, 1);
			efa_nic_unlock(nic);
			if (rc != FI_SUCCESS)
				goto out_awake;
		}
		n = 1 + p->n_nics;
		timeout_ns = efa_prog_busy_nics(p) ? EFA_SAFETY_NS : EFA_TICK_NS;
	} else {
		/*
		 * An operation of ours posted before sleeping was published may have completed
		 * unseen: poll once more. Only with operations in flight: on the passive side a
		 * second fi_cq_read per round only spins on the provider's lock while a peer
		 * copies (shm holds it for a whole CMA copy), taking a core from that peer.
		 * The fence pairs with the full barrier of submit's inflight increment.
		 */
		atomic_thread_fence(memory_order_seq_cst);
		if (efa_prog_busy_nics(p))
			for (uint32_t i = 0; i < p->n_nics; i++)
				if (efa_nic_poll(p->nics[i], EFA_POLL_BUDGET, NULL))
					goto out_awake;
		/*
		 * Without a wait object the passive side must still poll now and then (the
		 * provider moves peers' data only inside fi_cq_read); with operations of ours
		 * in flight, poll_us bounds their completion latency.
		 */
		timeout_ns = ei->poll_ns;
	}
	efa_prog_ppoll(p, n, timeout_ns);
out_awake:
	atomic_store_explicit(&p->sleeping, 0, memory_order_relaxed);
}

/* Sleep on the kick fd alone, at most @ns. */
static void efa_prog_nap(struct efa_prog *p, uint64_t ns)
{
	atomic_store(&p->sleeping, 1);
	efa_prog_ppoll(p, 1, ns);
	atomic_store_explicit(&p->sleeping, 0, memory_order_relaxed);
}

/*
 * progress 'caller' (hybrid): while an application thread in te_batch_wait polls us (between
 * efa_drive 1 and 0) and operations of ours are in flight, its polls reap them and serve the
 * passive side too: sleep until efa_progress has reaped the last of them (efa_progs_unpark)
 * or the waiter stops (efa_drive 0) rather than wake up to check. Whether parked.
 */
/*
 * Whether a fence of @p's NICs is asked for or still watches a connection (canceled slices
 * wait for it). The waiting thread's polls take the NIC lock the fence needs (trylock): a
 * thread parked for EFA_SAFETY_NS at a time would rarely get it, and the core would give
 * up on those slices after its 2 s.
 */
static bool efa_prog_fence_pending(const struct efa_prog *p)
{
	for (uint32_t i = 0; i < p->n_nics; i++) {
		struct efa_nic *nic = p->nics[i];

		if (atomic_load(&nic->fence_req) ||
		    atomic_load_explicit(&nic->fence_again_ns, memory_order_relaxed) ||
		    atomic_load_explicit(&nic->n_held, memory_order_relaxed))
			return true;
	}
	return false;
}

static bool efa_prog_park(struct efa_prog *p)
{
	bool park;

	atomic_store_explicit(&p->parked, 1, memory_order_relaxed);
	/* Pairs with the fences in efa_progs_unpark and efa_drive: one sees the other. */
	atomic_thread_fence(memory_order_seq_cst);
	park = atomic_load_explicit(&p->ei->driven, memory_order_relaxed) &&
	       efa_prog_busy_nics(p) && !efa_prog_fence_pending(p);
	if (park)
		efa_prog_nap(p, EFA_SAFETY_NS);
	atomic_store_explicit(&p->parked, 0, memory_order_relaxed);
	return park;
}

/*
 * After completions from the core's poll: wake parked threads with nothing left in flight.
 * The fence only where a thread's NICs drained: the poll that drained them saw its own
 * decrement, and a later one sees every earlier one.
 */
static void efa_progs_unpark(struct efa_inst *ei)
{
	for (uint32_t t = 0; t < ei->n_progs; t++) {
		struct efa_prog *p = &ei->progs[t];

		if (efa_prog_busy_nics(p))
			continue;
		atomic_thread_fence(memory_order_seq_cst);
		if (atomic_exchange_explicit(&p->parked, 0, memory_order_relaxed))
			efa_prog_wake(p);
	}
}

/* The fences cancel asked for on @p's NICs, and the outcomes they returned. Whether any acted. */
static bool efa_prog_fence(struct efa_prog *p)
{
	bool acted = false;

	for (uint32_t i = 0; i < p->n_nics; i++) {
		if (efa_nic_fence(p->nics[i]) == EFA_FENCE_DONE) {
			bool busy = false;

			/* Report what the closed connections returned now, in every mode. */
			(void)efa_nic_poll(p->nics[i], EFA_POLL_BUDGET, &busy);
			acted = true;
		}
	}
	return acted;
}

static void *efa_prog_main(void *arg)
{
	struct efa_prog *p = arg;
	struct efa_inst *ei = p->ei;
	uint64_t last_work = efa_now_ns();

	while (!atomic_load_explicit(&ei->stopping, memory_order_acquire)) {
		bool yielded = false;
		uint32_t work = 0;
		uint64_t now = efa_now_ns();

		/* Before parking: the core waits on the slices cancel gave this thread. */
		if (efa_prog_fence(p)) {
			last_work = efa_now_ns();
			continue;
		}
		if (ei->progress == EFA_PROGRESS_CALLER && efa_prog_park(p)) {
			last_work = efa_now_ns();
			continue;
		}
		if (efa_caller_driving(ei, now) && !efa_prog_busy_nics(p)) {
			/* Nothing of ours in flight: check back when the core may have stopped. */
			efa_prog_nap(p, EFA_CALLER_NS -
						(now - atomic_load_explicit(&ei->caller_ns,
									    memory_order_relaxed)));
			last_work = efa_now_ns();
			continue;
		}
		/*
		 * A NIC whose lock a submit holds is skipped, not waited for (shm copies inside
		 * the post call): the submit kicks this thread when it is done.
		 */
		for (uint32_t i = 0; i < p->n_nics; i++)
			work += efa_nic_poll(p->nics[i], EFA_POLL_BUDGET, &yielded);
		if (p->index == 0)
			work += efa_flush_deferred(ei);
		if (work) {
			last_work = efa_now_ns();
			continue;
		}
		if (ei->progress == EFA_PROGRESS_BUSY)
			continue;
		if (yielded) {
			efa_prog_sleep(p, true);
			continue;
		}
		/*
		 * Keep polling for spin_us after the last completion (a burst usually has more),
		 * yielding the core, then sleep: on the wait fd, or for poll_us without one.
		 * Providers without a wait fd that complete asynchronously want 'busy' (the
		 * default for efa); shm completes inside the post call, and submit kicks.
		 */
		if (efa_now_ns() - last_work < ei->spin_ns) {
			sched_yield();
			continue;
		}
		efa_prog_sleep(p, false);
	}
	return NULL;
}

enum te_status efa_progs_start(struct efa_inst *ei)
{
	uint32_t n = ei->n_threads_opt ? EFA_MIN(ei->n_threads_opt, ei->n_nics) : 1;

	ei->progs = calloc(n, sizeof(*ei->progs));
	if (!ei->progs)
		return TE_ERR_NOMEM;
	ei->n_progs = n;
	for (uint32_t t = 0; t < n; t++) {
		struct efa_prog *p = &ei->progs[t];

		p->ei = ei;
		p->index = t;
		p->kick_fd = -1;
		p->all_fd = true;
		p->nics = calloc(ei->n_nics, sizeof(*p->nics));
		p->pfds = calloc(ei->n_nics + 1, sizeof(*p->pfds));
		if (!p->nics || !p->pfds)
			return TE_ERR_NOMEM;
		p->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (p->kick_fd < 0) {
			efa_error(ei, EFA_NAME ": eventfd: %s", strerror(errno));
			return TE_ERR_SYSTEM;
		}
		p->pfds[0] = (struct pollfd){ .fd = p->kick_fd, .events = POLLIN };
	}
	ei->all_fd = ei->n_nics > 0;
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		struct efa_prog *p = &ei->progs[i % n];
		struct efa_nic *nic = &ei->nics[i];

		nic->prog = p;
		p->nics[p->n_nics] = nic;
		p->pfds[1 + p->n_nics] = (struct pollfd){ .fd = nic->wait_fd, .events = POLLIN };
		if (nic->wait_fd < 0) {
			p->all_fd = false;
			ei->all_fd = false;
		}
		p->n_nics++;
	}
	for (uint32_t t = 0; t < n; t++) {
		struct efa_prog *p = &ei->progs[t];
		sigset_t all, old;
		char name[16];
		int rc;

		/* Progress threads take no signals: the application's handlers run elsewhere. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = pthread_create(&p->thread, NULL, efa_prog_main, p);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (rc != 0) {
			efa_error(ei, EFA_NAME ": cannot start progress thread %u: %s", t,
				  strerror(rc));
			return TE_ERR_SYSTEM;
		}
		p->started = true;
		snprintf(name, sizeof(name), "te-efa-%u", t);
		pthread_setname_np(p->thread, name);
	}
	return TE_OK;
}

/* Whether closing @nic's endpoint may meet a READ response half received (efa_read_exposed). */
static bool efa_nic_read_exposed(const struct efa_nic *nic)
{
	const struct efa_av_entry *seen[EFA_FENCE_PEERS];
	uint32_t n_seen = 0;

	for (uint32_t k = 0; k < nic->window; k++) {
		struct te_plugin_slice *s =
			atomic_load_explicit(&nic->slots[k], memory_order_acquire);
		const struct efa_av_entry *e;
		uint32_t i;

		if (!s || s->opcode != TE_PLUGIN_OP_READ || !(e = efa_slice_entry(efa_priv(s))))
			continue;
		for (i = 0; i < n_seen && seen[i] != e; i++)
			;
		if (i < n_seen)
			continue;
		if (efa_read_exposed(nic, e))
			return true;
		if (n_seen < EFA_FENCE_PEERS)
			seen[n_seen++] = e;
	}
	return false;
}

/*
 * fini with ei->read_close_unsafe: closing the endpoint closes its connections, and one whose
 * READ response is half received would crash libfabric (efa_read_exposed). Reap for up to
 * EFA_FINI_READ_NS while that may be; past it (a stopped peer in the middle of a response)
 * leave the endpoint open, with everything it uses: nothing polls it again, so nothing it
 * still holds lands, and its slices are reported canceled. Returns the slices reported.
 */
static uint32_t efa_fini_drain(struct efa_nic *nic)
{
	uint64_t until = efa_now_ns() + EFA_FINI_READ_NS;
	uint32_t reported = 0;

	for (;;) {
		reported += efa_nic_poll(nic, UINT32_MAX, NULL);
		if (!efa_nic_read_exposed(nic))
			return reported;
		if (efa_now_ns() >= until)
			break;
		usleep(1000);
	}
	nic->ep_kept = true;
	efa_log(nic->ei, TE_PLUGIN_LOG_WARN,
		"%s: a READ response may be half received: libfabric %u.%u would crash closing "
		"its connection (fixed in 1.18); the endpoint stays open until the process exits",
		nic->name, FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
	return reported;
}

/*
 * Stop the progress threads and end every operation, for fini (or a failing init): each slice
 * still held is reported exactly once. Returns how many were.
 */
uint32_t efa_quiesce(struct efa_inst *ei)
{
	uint32_t reported = 0;

	atomic_store_explicit(&ei->stopping, true, memory_order_release);
	for (uint32_t t = 0; ei->progs && t < ei->n_progs; t++) {
		struct efa_prog *p = &ei->progs[t];

		if (p->started) {
			efa_prog_wake(p);
			pthread_join(p->thread, NULL);
			p->started = false;
		}
	}
	/* Single-threaded from here. Every slice still held is reported exactly once. */
	reported += efa_flush_deferred(ei);
	for (uint32_t i = 0; ei->nics && i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];

		if (nic->ep && ei->read_close_unsafe)
			reported += efa_fini_drain(nic);
		if (nic->ep && !nic->ep_kept) {
			/* Closing the endpoint ends every operation still posted on it. */
			fi_close(&nic->ep->fid);
			nic->ep = NULL;
			nic->closed = true;
		}
		if (nic->cq)
			reported += efa_nic_poll(nic, UINT32_MAX, NULL);
		reported += efa_release_held(nic, true);
		for (uint32_t k = 0; nic->slots && k < nic->window; k++) {
			struct te_plugin_slice *s =
				atomic_load_explicit(&nic->slots[k], memory_order_relaxed);
			struct efa_peer *peer;
			struct efa_spriv *p;

			if (!s)
				continue;
			p = efa_priv(s);
			peer = p->peer; /* the slice (and its priv) may be gone after slice_done */
			efa_slot_release(nic, k);
			atomic_fetch_sub(&p->mem->inflight, 1);
			atomic_fetch_sub(&nic->inflight, 1);
			atomic_fetch_sub(&peer->paths[nic->index].inflight, 1);
			ei->host->slice_done(ei->ctx, s, TE_ERR_CANCELED, 0,
					     EFA_NAME ": instance shut down");
			atomic_fetch_sub(&peer->refs, 1);
			reported++;
		}
	}
	return reported;
}

/* --- submit and cancel --------------------------------------------------------------------- */

/* The NIC for @s: round-robin over those near its local region, avoiding excluded ones. */
static struct efa_nic *efa_pick_nic(struct efa_inst *ei, struct efa_mem *m, uint64_t excluded)
{
	uint32_t start;

	if (ei->n_nics == 1)
		return &ei->nics[0];
	/* relaxed: a striping counter; any interleaving is fine */
	start = atomic_fetch_add_explicit(&m->rr, 1, memory_order_relaxed);
	for (uint32_t k = 0; k < m->n_pref; k++) {
		uint32_t i = m->pref[(start + k) % m->n_pref];

		if (!(excluded & (1ull << i)))
			return &ei->nics[i];
	}
	for (uint32_t k = 0; k < ei->n_nics; k++) {
		uint32_t i = (start + k) % ei->n_nics;

		if (!(excluded & (1ull << i)))
			return &ei->nics[i];
	}
	return &ei->nics[m->pref[start % m->n_pref]];
}

/* Initiator-side checks the core already made: defence in depth, no syscall. */
static enum te_status efa_check_slice(const struct te_plugin_slice *s, char *why, size_t len)
{
	const struct efa_rkey *k = (const struct efa_rkey *)s->rkey;
	const struct efa_mem *m = (const struct efa_mem *)s->local_mem;
	uint64_t local = (uint64_t)(uintptr_t)s->local;
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;

	if (local < m->addr || s->length > m->length || local - m->addr > m->length - s->length) {
		snprintf(why, len, EFA_NAME ": local range [%p, +%" PRIu64 ") outside its region",
			 s->local, s->length);
		return TE_ERR_OUT_OF_RANGE;
	}
	if (s->remote < k->addr || s->length > k->length ||
	    s->remote - k->addr > k->length - s->length || !(k->access & need)) {
		snprintf(why, len,
			 EFA_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
				  ") outside the remote-%s buffer [0x%" PRIx64 ", +%" PRIu64 ")",
			 s->remote, s->length,
			 s->opcode == TE_PLUGIN_OP_READ ? "readable" : "writable", k->addr,
			 k->length);
		return TE_ERR_REMOTE_ACCESS;
	}
	return TE_OK;
}

/* efa_post_locked: a fence holds back posts to that connection (back-pressure). */
#define EFA_POST_HELD 1

/*
 * Post @s on @nic (slot and references taken), whose lock the caller holds. 0, EFA_POST_HELD
 * or a negative libfabric error.
 */
static ssize_t efa_post_locked(struct efa_inst *ei, struct efa_nic *nic, struct te_plugin_slice *s)
{
	struct efa_spriv *p = efa_priv(s);
	const struct efa_rkey *k = (const struct efa_rkey *)s->rkey;
	const struct efa_peer *peer = p->peer;
	uint32_t j = k->pref[nic->index % k->n_pref];
	struct efa_av_entry *e = peer->entries[nic->index * peer->n_rnics + j];
	fi_addr_t fa = e->fi_addr;
	/* Without FI_MR_VIRT_ADDR at the target, remote addresses are offsets in the region. */
	uint64_t raddr = k->offset ? s->remote - k->addr : s->remote;
	void *desc = p->mem->desc[nic->index];
	ssize_t ret;

	/* A fence could not insert the address again (efa_nic_fence logged why). */
	if (fa == FI_ADDR_NOTAVAIL)
		return -FI_EADDRNOTAVAIL;
	/* A fence waits for this connection's READ responses before it closes it. */
	if (atomic_load_explicit(&e->draining, memory_order_relaxed))
		return EFA_POST_HELD;
	if (s->opcode == TE_PLUGIN_OP_READ) {
		ret = fi_read(nic->ep, s->local, s->length, desc, fa, raddr, k->keys[j],
			      &p->op.ctx);
	} else {
		struct iovec iov = { .iov_base = s->local, .iov_len = s->length };
		struct fi_rma_iov rma = { .addr = raddr, .len = s->length, .key = k->keys[j] };
		struct fi_msg_rma msg = {
			.msg_iov = &iov,
			.desc = &desc,
			.iov_count = 1,
			.addr = fa,
			.rma_iov = &rma,
			.rma_iov_count = 1,
			.context = &p->op.ctx,
		};

		/* Delivery complete: a WRITE is done when the bytes are in the target's memory. */
		ret = fi_writemsg(nic->ep, &msg, FI_COMPLETION | ei->write_flags);
	}
	if (ret == 0) {
		p->rnic = j;
		p->seq = e->posts++;
	}
	return ret;
}

/*
 * A post to @path answered -FI_EAGAIN. With nothing of ours in flight there, that is not a
 * full queue but a connection that does not come up (rxm retries a refused connect forever):
 * after connect_timeout_ms of it the peer counts as unreachable.
 */
static bool efa_path_unreachable(struct efa_inst *ei, struct efa_path *path)
{
	uint_fast64_t since, now;

	if (atomic_load_explicit(&path->inflight, memory_order_relaxed))
		return false;
	now = efa_now_ns();
	since = atomic_load_explicit(&path->eagain_since, memory_order_relaxed);
	if (!since) {
		atomic_compare_exchange_strong_explicit(&path->eagain_since, &since, now,
							memory_order_relaxed, memory_order_relaxed);
		return false;
	}
	return now - since > ei->connect_timeout_ms * 1000000ull;
}

enum te_status efa_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices, uint32_t n,
			  uint32_t *accepted_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t kick = 0; /* progress threads to wake, by index */
	bool deferred = false;
	enum te_status ret = TE_OK;
	struct efa_nic *held = NULL; /* the NIC whose lock this call holds */
	uint64_t held_since = 0;
	uint32_t i, run = 0;

	if (!accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	if (atomic_load_explicit(&ei->stopping, memory_order_relaxed))
		return TE_ERR_SHUTDOWN;
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		struct efa_spriv *p;
		struct efa_path *path;
		struct efa_nic *nic;
		char why[EFA_PRIV_DETAIL];
		enum te_status bad;
		int64_t slot;
		ssize_t rc;

		if (!s || !s->priv || !s->peer || !s->rkey || !s->local_mem || !s->local ||
		    s->length == 0 || s->length > EFA_MAX_SLICE ||
		    (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)) {
			efa_log(ei, TE_PLUGIN_LOG_ERROR, "submit: malformed slice %u of %u", i, n);
			ret = TE_ERR_INVALID_ARG;
			break;
		}
		p = efa_priv(s);
		atomic_store_explicit(&p->canceled, 0, memory_order_relaxed);
		bad = efa_check_slice(s, why, sizeof(why));
		if (bad != TE_OK) {
			efa_defer_fail(ei, s, bad, "%s", why);
			deferred = true;
			continue;
		}
		/*
		 * A dead shm peer may have left its region's lock held: a post to it would spin
		 * in the provider forever. One poll of its pidfd per slice rules that out, except
		 * for a peer that dies while this post waits for its lock.
		 */
		if (ei->shm && efa_peer_dead((struct efa_peer *)s->peer)) {
			efa_defer_fail(ei, s, TE_ERR_PEER_UNREACHABLE,
				       EFA_NAME "[%s]: peer %s (process %d) exited", ei->prov_name,
				       ((struct efa_peer *)s->peer)->name,
				       ((struct efa_peer *)s->peer)->pid);
			deferred = true;
			continue;
		}
		nic = efa_pick_nic(ei, (struct efa_mem *)s->local_mem, s->excluded_devices);
		slot = efa_slot_claim(nic);
		if (slot < 0)
			break; /* window full: back-pressure */
		p->op.kind = EFA_OP_SLICE;
		p->slice = s;
		p->nic = nic;
		p->mem = (struct efa_mem *)s->local_mem;
		p->peer = (struct efa_peer *)s->peer;
		p->slot = (uint32_t)slot;
		p->rnic = EFA_RNIC_NONE;
		s->device = nic->index;
		path = &p->peer->paths[nic->index];
		/* release: a fence that finds the slice in its slot sees it not posted yet */
		atomic_store_explicit(&nic->slots[slot], s, memory_order_release);
		atomic_fetch_add_explicit(&p->mem->inflight, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->peer->refs, 1, memory_order_relaxed);
		/* relaxed: counters read to choose between polling and sleeping, or for EAGAIN */
		atomic_fetch_add_explicit(&nic->inflight, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&path->inflight, 1, memory_order_relaxed);
		/*
		 * Consecutive cheap posts to one NIC share one lock hold: with several submitting
		 * threads, a lock handed over at every slice costs a futex wake per operation.
		 * A hold ends after EFA_POST_RUN posts or EFA_POST_HOLD_NS, so posts that copy
		 * (shm's CMA) still take the lock one at a time and the progress thread gets in
		 * between them to reap completions.
		 */
		if (held && (held != nic || run == EFA_POST_RUN ||
			     efa_now_ns() - held_since > EFA_POST_HOLD_NS)) {
			efa_nic_unlock(held);
			held = NULL;
		}
		if (!held) {
			efa_nic_lock(nic);
			held = nic;
			held_since = efa_now_ns();
			run = 0;
		}
		run++;
		rc = efa_post_locked(ei, nic, s);
		if (rc == 0) {
			if (atomic_load_explicit(&path->eagain_since, memory_order_relaxed))
				atomic_store_explicit(&path->eagain_since, 0, memory_order_relaxed);
			kick |= 1ull << nic->prog->index;
			continue;
		}
		atomic_fetch_sub_explicit(&path->inflight, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&nic->inflight, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&p->peer->refs, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&p->mem->inflight, 1, memory_order_relaxed);
		efa_slot_release(nic, (uint32_t)slot);
		if (rc == EFA_POST_HELD) {
			/* The fence closes the connection once its READs are answered. */
			kick |= 1ull << nic->prog->index;
			break;
		}
		if (rc == -FI_EAGAIN && efa_path_unreachable(ei, path)) {
			efa_defer_fail(ei, s, TE_ERR_PEER_UNREACHABLE,
				       EFA_NAME "[%s] %s: no connection to %s in %" PRIu64
						" ms (posts keep answering EAGAIN)",
				       ei->prov_name, nic->name, p->peer->name,
				       ei->connect_timeout_ms);
			deferred = true;
			continue;
		}
		if (rc == -FI_EAGAIN) {
			/* Provider queue full: the progress thread drains it, the core resubmits. */
			kick |= 1ull << nic->prog->index;
			break;
		}
		efa_defer_fail(ei, s, efa_status_of((int)-rc),
			       EFA_NAME "[%s] %s: posting %s of %" PRIu64 " bytes failed: %s",
			       ei->prov_name, nic->name,
			       s->opcode == TE_PLUGIN_OP_READ ? "READ" : "WRITE", s->length,
			       fi_strerror((int)-rc));
		deferred = true;
	}
	if (held)
		efa_nic_unlock(held);
	if (deferred)
		kick |= 1;
	for (uint32_t t = 0; kick && t < ei->n_progs; t++)
		if (kick & (1ull << t))
			efa_prog_kick(&ei->progs[t]);
	*accepted_out = i;
	return ret;
}

enum te_status efa_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_spriv *p;
	struct efa_nic *nic;

	if (!s || !s->priv)
		return TE_ERR_INVALID_ARG;
	p = efa_priv(s);
	nic = p->nic;
	/*
	 * The slice memory is valid during the call, but priv may be stale (an earlier attempt,
	 * or a recycled slice not accepted yet): trust nothing before it checks out.
	 */
	if (!nic || nic < ei->nics || nic >= ei->nics + ei->n_nics || p->slot >= nic->window ||
	    atomic_load_explicit(&nic->slots[p->slot], memory_order_relaxed) != s)
		return TE_ERR_NOT_FOUND;
	/*
	 * What takes a posted RMA operation back (closing its connection; fi_cancel takes back
	 * receives only) needs the NIC lock, which a post may hold for long (shm copies inside
	 * the post call, and spins there on a stopped peer's region), and cancel must not block:
	 * the progress thread fences the slice (efa_nic_fence) and reports it when the provider
	 * returns it, canceled if it failed, with its real outcome otherwise.
	 */
	{
		unsigned none = EFA_CANCEL_NONE;

		/* seq_cst, before the request: efa_nic_fence clears requests, then looks. */
		if (!atomic_compare_exchange_strong(&p->canceled, &none, EFA_CANCEL_ASKED))
			return TE_OK;
	}
	atomic_fetch_add(&nic->fence_req, 1);
	efa_prog_wake(nic->prog);
	return TE_OK;
}

enum te_status efa_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint64_t all;

	if (!s)
		return TE_ERR_INVALID_ARG;
	/* submit picks the NIC avoiding excluded ones; here only check that one is left. */
	all = ei->n_nics >= 64 ? UINT64_MAX : (1ull << ei->n_nics) - 1;
	if ((s->excluded_devices & all) == all)
		return TE_ERR_NO_DEVICE;
	return TE_OK;
}

/*
 * progress 'caller' (hybrid to the core): the thread waiting in te_batch_wait reaps
 * completions here, so a completion reaches its batch without a hand-off between threads.
 * NICs whose lock a submit holds are skipped; the next call gets them.
 */
uint32_t efa_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	struct efa_inst *ei = efa_inst_of(inst);
	uint32_t done = 0;
	bool busy = false;

	if (atomic_load_explicit(&ei->stopping, memory_order_relaxed))
		return 0;
	atomic_store_explicit(&ei->caller_ns, efa_now_ns(), memory_order_relaxed);
	for (uint32_t i = 0; i < ei->n_nics && done < budget; i++)
		done += efa_nic_poll(&ei->nics[i], budget - done, &busy);
	done += efa_flush_deferred(ei);
	if (done)
		efa_progs_unpark(ei);
	return done;
}

/*
 * progress 'caller', ABI 1.1: the core's polling waiter found nothing; sleep on the CQ wait
 * fds (fi_trywait first: completions already queued end the wait at once), as the raw
 * libfabric loop does, rather than spinning against the peers for the CPUs. Not with a
 * provider without wait fds (shm), nor while a submit holds a NIC (it may be posting).
 */
enum te_status efa_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct pollfd pfd[EFA_MAX_NICS];
	struct timespec ts = efa_timespec(timeout_ns);

	if (ei->progress != EFA_PROGRESS_CALLER || !ei->all_fd)
		return TE_ERR_UNSUPPORTED;
	atomic_store_explicit(&ei->caller_ns, efa_now_ns(), memory_order_relaxed);
	if (atomic_load_explicit(&ei->n_defer, memory_order_relaxed))
		return TE_OK; /* failures to report: progress() flushes them */
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];
		int rc;

		if (pthread_mutex_trylock(&nic->lock) != 0)
			return TE_OK;
		rc = fi_trywait(nic->fabric, &nic->cq_fid, 1);
		efa_nic_unlock(nic);
		if (rc != FI_SUCCESS)
			return TE_OK;
		pfd[i] = (struct pollfd){ .fd = nic->wait_fd, .events = POLLIN };
	}
	if (ppoll(pfd, ei->n_nics, &ts, NULL) < 0 && errno != EINTR)
		return TE_ERR_UNSUPPORTED;
	return TE_OK;
}

/*
 * progress 'caller', hybrid (ABI 1.2): a thread in te_batch_wait starts (1) or stops (0)
 * polling us. While it does, the progress threads park once operations of theirs are in
 * flight (efa_prog_park). When it stops, a thread that is parked or asleep with operations
 * still in flight is woken to take them over: nobody else polls them now.
 */
void efa_drive(struct te_plugin_inst *inst, uint32_t driving)
{
	struct efa_inst *ei = efa_inst_of(inst);

	if (ei->progress != EFA_PROGRESS_CALLER)
		return;
	if (driving) {
		atomic_store_explicit(&ei->caller_ns, efa_now_ns(), memory_order_relaxed);
		atomic_store_explicit(&ei->driven, 1, memory_order_relaxed);
		return;
	}
	atomic_store_explicit(&ei->driven, 0, memory_order_relaxed);
	/* Pairs with the fence in efa_prog_park: it sees driven 0, or this sees parked. */
	atomic_thread_fence(memory_order_seq_cst);
	for (uint32_t t = 0; t < ei->n_progs; t++) {
		struct efa_prog *p = &ei->progs[t];

		if (!efa_prog_busy_nics(p))
			continue;
		if (atomic_exchange_explicit(&p->parked, 0, memory_order_relaxed) ||
		    atomic_load_explicit(&p->sleeping, memory_order_relaxed))
			efa_prog_wake(p);
	}
}
