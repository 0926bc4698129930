/* SPDX-License-Identifier: Apache-2.0 */
/* slice.c: requests split into slices and posted to transports, back-pressure, completion. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/batch.h"
#include "core/engine.h"
#include "core/mem.h"
#include "core/memkind.h"
#include "core/retry.h"
#include "core/segment.h"
#include "core/slice.h"
#include "core/stage.h"
#include "core/transport.h"
#include "core/wake.h"

/*
 * Slices handed to a plugin's submit at once. 1024: a batch of 1024 READs goes out in one tcp
 * submit and one sendmsg (the lane copies up to 1024 request headers side by side), as the
 * raw loop sends it, and comes back in two sendmsgs of the server's (its ring of answers and
 * its iovecs hold 512). With 512, 4 KiB READs at batch 1024 from 2 threads ran about 3 %
 * slower, with 3 % more CPU per request (12 rounds; five runs 0.99-1.10: bench/README.md,
 * 2026-12-06 10:43); with 256, at batch 512 from 4 threads and 1024 from 2 7-11 % slower than
 * with 512 (2026-12-06 04:10). Deeper batches (16384 from 4 threads) ran alike with 512 and
 * 1024.
 */
#define POST_CHUNK 1024
/* Back-pressure: first wait after a submit that accepted nothing, doubled up to the cap. */
#define STALL_FIRST_NS (100ull * 1000)
#define STALL_MAX_NS (1000ull * 1000)


/*
 * Completions a plugin reports inside a progress() call the core made on this thread
 * (slice_progress_begin/end around it): their in_flight decrements, and the batch references
 * of the slices that succeeded (in runs of one batch), are settled when the call returns,
 * with one atomic each instead of one per slice. Only counts wait: every outcome is accounted
 * at once, and a batch outlives the run by that much.
 */
struct reap {
	struct transport *tp; /* whose progress() runs on this thread; NULL: none */
	int64_t done;
	struct batch *batch;
	int64_t refs;
};

static _Thread_local struct reap reap;

/*
 * Code in a shared library reaches a thread-local through __tls_get_addr, and the compiler
 * would call it again at each use rather than keep the address: hide where it came from
 * (the empty asm), so that one call per function serves them all.
 */
static inline struct reap *reap_get(void)
{
	struct reap *rp = &reap;

	__asm__("" : "+r"(rp));
	return rp;
}

static void reap_flush_batch(struct reap *rp)
{
	struct batch *b = rp->batch;
	int64_t n = rp->refs;

	if (!b)
		return;
	rp->batch = NULL;
	rp->refs = 0;
	/* All but the last reference: the batch cannot end meanwhile. */
	if (n > 1)
		atomic_fetch_sub_explicit(&b->refs, n - 1, memory_order_release);
	batch_unref(b);
}

void slice_progress_begin(struct transport *tp)
{
	struct reap *rp = reap_get();

	rp->tp = tp;
	rp->done = 0;
}

void slice_progress_end(void)
{
	struct reap *rp = reap_get();

	if (rp->done)
		atomic_fetch_sub_explicit(&rp->tp->in_flight, rp->done, memory_order_relaxed);
	rp->done = 0;
	reap_flush_batch(rp);
	rp->tp = NULL;
}

/* --- posting to plugins ----------------------------------------------------- */

static void backlog_push(struct transport *tp, struct te_plugin_slice **ps, uint32_t n,
			 bool at_head)
{
	struct slice *head = NULL, *tail = NULL;

	if (!n)
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct slice *s = SLICE_OF(ps[i]);

		s->next = NULL;
		if (tail)
			tail->next = s;
		else
			head = s;
		tail = s;
	}
	g_mutex_lock(&tp->backlog_lock);
	if (at_head) {
		tail->next = tp->backlog_head;
		tp->backlog_head = head;
		if (!tp->backlog_tail)
			tp->backlog_tail = tail;
	} else {
		if (tp->backlog_tail)
			tp->backlog_tail->next = head;
		else
			tp->backlog_head = head;
		tp->backlog_tail = tail;
	}
	atomic_fetch_add(&tp->backlog_len, n);
	g_mutex_unlock(&tp->backlog_lock);
}

/*
 * Submit accepted nothing: offer the backlog again after a wait (100 us doubling to 1 ms),
 * or as soon as one of the transport's slices completes (slice_done), not in a tight loop.
 * Relaxed: a stale value only moves one resubmission by at most one step.
 */
static void stall_begin(struct transport *tp)
{
	uint64_t step = atomic_load_explicit(&tp->stall_step_ns, memory_order_relaxed);

	step = step ? MIN(2 * step, STALL_MAX_NS) : STALL_FIRST_NS;
	atomic_store_explicit(&tp->stall_step_ns, step, memory_order_relaxed);
	atomic_store_explicit(&tp->stall_until_ns, engine_now_ns() + step, memory_order_relaxed);
}

/*
 * Hand the *@n_io slices of @ps to the plugin. Slices already settled are dropped
 * first (order kept; *@n_io shrinks). Returns how many of the rest were consumed
 * (accepted, or failed because submit returned an error): ps[0..ret) are gone,
 * ps[ret..*n_io) are back-pressure for the caller to queue.
 */
static uint32_t post(struct engine *e, struct transport *tp, struct te_plugin_slice **ps,
		     uint32_t *n_io)
{
	bool manual = tp->polled; /* MANUAL or hybrid: in_flight counted */
	bool staged = false;
	uint32_t acc = 0, n = 0;
	enum te_status st;

	/*
	 * Store in_plugin, full fence, then load term and abort_status: pairs with batch_free's
	 * scan of in_plugin and with abort_slices (retry.c: abort_status, then in_plugin), so
	 * that a slice whose outcome is already settled (timed out, canceled) is never handed
	 * to a plugin once its batch may have released its memory. One fence for the run
	 * instead of a locked store per slice.
	 */
	for (uint32_t i = 0; i < *n_io; i++)
		atomic_store_explicit(&SLICE_OF(ps[i])->in_plugin, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	for (uint32_t i = 0; i < *n_io; i++) {
		struct slice *s = SLICE_OF(ps[i]);
		int32_t abort;

		abort = atomic_load(&s->abort_status);
		if (atomic_load(&s->term) || abort) {
			atomic_store(&s->in_plugin, 0);
			if (abort) {
				char why[TE_DETAIL_MAX];

				slice_abort_why(s, abort, why, sizeof(why));
				slice_fail(s, abort, why);
			}
			batch_release_slice(s);
			continue;
		}
		staged |= s->staged;
		ps[n++] = ps[i];
	}
	*n_io = n;
	if (!n)
		return 0;
	/*
	 * Staged slices get their bounce buffers now (a WRITE's bytes are copied in); the first
	 * that finds the pool empty stops this post: it and those after it are back-pressure.
	 */
	for (uint32_t i = 0; staged && i < n; i++) {
		struct slice *s = SLICE_OF(ps[i]);
		char why[TE_DETAIL_MAX];
		int32_t ab;

		if (!s->staged)
			continue;
		/*
		 * Device copies take time: the slice's deadline or a cancel may have come while
		 * an earlier slice's copy (or its own) ran. Such a slice ends here, unposted.
		 */
		ab = atomic_load(&s->abort_status);
		st = ab ? TE_OK : stage_attach(e, s, why, sizeof(why));
		if (st == TE_OK && !ab)
			ab = atomic_load(&s->abort_status);
		if (ab) {
			stage_release(e, s);
			atomic_store(&s->in_plugin, 0);
			slice_abort_why(s, ab, why, sizeof(why));
			slice_fail(s, ab, why);
			batch_release_slice(s);
			memmove(&ps[i], &ps[i + 1], (n - i - 1) * sizeof(ps[0]));
			n--;
			(*n_io)--;
			i--;
			continue;
		}
		if (st == TE_OK)
			continue;
		if (st == TE_ERR_AGAIN) {
			for (uint32_t k = i; k < n; k++)
				atomic_store_explicit(&SLICE_OF(ps[k])->in_plugin, 0,
						      memory_order_relaxed);
			n = i;
			break;
		}
		/* The copy or the pool failed: this slice ends here; the others go on. */
		atomic_store(&s->in_plugin, 0);
		slice_fail(s, st, why);
		batch_release_slice(s);
		memmove(&ps[i], &ps[i + 1], (n - i - 1) * sizeof(ps[0]));
		n--;
		(*n_io)--;
		i--;
	}
	if (!n)
		return 0;
	if (manual) /* seq_cst: pairs with the worker's sleeping store (wake_kick) */
		atomic_fetch_add(&tp->in_flight, n);
	st = transport_submit(tp, ps, n, &acc);
	if (acc > n) {
		ENGINE_LOG(e, TE_LOG_ERROR, "%s: submit accepted %u of %u slices (plugin bug)",
			   tp->plugin->name, acc, n);
		acc = n;
	}
	for (uint32_t i = 0; i < acc; i++) {
		struct task *t = SLICE_OF(ps[i])->task;

		if (!atomic_load_explicit(&t->posted, memory_order_relaxed))
			atomic_store_explicit(&t->posted, 1, memory_order_relaxed);
	}
	for (uint32_t i = acc; i < n; i++) {
		atomic_store_explicit(&SLICE_OF(ps[i])->in_plugin, 0, memory_order_relaxed);
		stage_release(e, SLICE_OF(ps[i])); /* taken again when posted again */
	}
	if (manual && acc < n)
		atomic_fetch_sub_explicit(&tp->in_flight, n - acc, memory_order_relaxed);
	if (!acc && st == TE_OK)
		stall_begin(tp);
	if (st != TE_OK && acc < n) {
		char detail[TE_DETAIL_MAX];

		snprintf(detail, sizeof(detail), "%s: submit failed: %s%s%s", tp->plugin->name,
			 te_status_str(st), *transport_error(tp) ? ": " : "", transport_error(tp));
		for (uint32_t i = acc; i < n; i++) {
			slice_fail(SLICE_OF(ps[i]), st, detail);
			batch_release_slice(SLICE_OF(ps[i]));
		}
		return n;
	}
	return acc;
}

/* Post @k (<= POST_CHUNK) slices of one transport; @ps is scratch (post() compacts it). */
static void post_run(struct engine *e, struct transport *tp, struct te_plugin_slice **ps,
		     uint32_t k)
{
	uint32_t acc;

	/* Keep order behind an existing backlog: the worker drains it first. */
	if (atomic_load_explicit(&tp->backlog_len, memory_order_acquire)) {
		backlog_push(tp, ps, k, false);
		wake_kick(e);
		return;
	}
	acc = post(e, tp, ps, &k);
	if (acc < k) {
		backlog_push(tp, ps + acc, k - acc, false);
		wake_kick(e);
	} else if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL &&
		   !wake_user_driving(e, engine_now_ns())) {
		wake_kick(e);
	}
}

void slice_post(struct engine *e, struct transport *tp, struct slice **slices, uint32_t n)
{
	struct te_plugin_slice *ps[POST_CHUNK];

	while (n) {
		uint32_t k = MIN(n, (uint32_t)POST_CHUNK);

		for (uint32_t i = 0; i < k; i++)
			ps[i] = &slices[i]->ps;
		post_run(e, tp, ps, k);
		slices += k;
		n -= k;
	}
}

unsigned slice_drain_backlog(struct engine *e, struct transport *tp)
{
	struct te_plugin_slice *ps[POST_CHUNK];
	uint32_t k = 0, acc;
	unsigned done = 0;

	if (!atomic_load_explicit(&tp->backlog_len, memory_order_acquire))
		return 0;
	/* Stalled (stall_begin): no submit until a slice completes or the wait is over. */
	{
		uint64_t until = atomic_load_explicit(&tp->stall_until_ns, memory_order_relaxed);

		if (until && engine_now_ns() < until)
			return 0;
	}
	g_mutex_lock(&tp->backlog_lock);
	while (tp->backlog_head && k < POST_CHUNK) {
		struct slice *s = tp->backlog_head;

		tp->backlog_head = s->next;
		if (!tp->backlog_head)
			tp->backlog_tail = NULL;
		atomic_fetch_sub(&tp->backlog_len, 1);
		s->next = NULL;
		if (atomic_load_explicit(&s->term, memory_order_acquire)) {
			/* Timed out or canceled while waiting: never reaches the plugin. */
			g_mutex_unlock(&tp->backlog_lock);
			batch_release_slice(s);
			done++;
			g_mutex_lock(&tp->backlog_lock);
			continue;
		}
		ps[k++] = &s->ps;
	}
	g_mutex_unlock(&tp->backlog_lock);
	if (!k)
		return done;
	/*
	 * Nobody else holds these batches: an accepted slice may complete and free its
	 * batch while post() still looks at it. Hold each batch across the call.
	 */
	for (uint32_t i = 0; i < k; i++)
		atomic_fetch_add_explicit(&SLICE_OF(ps[i])->task->batch->refs, 1,
					  memory_order_relaxed);
	{
		struct batch *held[POST_CHUNK];

		uint32_t held_n = k;

		for (uint32_t i = 0; i < k; i++)
			held[i] = SLICE_OF(ps[i])->task->batch;
		acc = post(e, tp, ps, &k);
		if (acc < k)
			backlog_push(tp, ps + acc, k - acc, true);
		/* Accepting again: the next stall starts with the shortest wait. */
		if (acc && atomic_load_explicit(&tp->stall_step_ns, memory_order_relaxed))
			atomic_store_explicit(&tp->stall_step_ns, 0, memory_order_relaxed);
		for (uint32_t i = 0; i < held_n; i++)
			batch_unref(held[i]);
	}
	return done + acc;
}

/* Why transport @t cannot carry this request (NULL: it can). */
static const char *slice_unfit(struct engine *e, struct segview *v, unsigned t, size_t buf_index,
			       const struct mem_region *region, uint32_t opcode, uint64_t now,
			       bool staging, enum te_status *st_out)
{
	struct transport *tp = e->tps[t];
	struct segview_tp *vt = &v->tps[t];
	uint32_t opbit = opcode == TE_OP_READ ? TE_PLUGIN_CAN_READ : TE_PLUGIN_CAN_WRITE;

	if (!vt->peer)
		return vt->why;
	if ((!(tp->caps.mem_types & region->mem_type) || !region->handles[t]) &&
	    !(staging && stage_possible(e, tp, region->mem_type))) {
		*st_out = TE_ERR_MEMORY_TYPE;
		return staging ? "memory type not supported, and no loaded transport owns it to "
				 "stage it"
			       : "memory type not supported";
	}
	if (!(tp->caps.ops & opbit))
		return opcode == TE_OP_READ ? "READ not supported" : "WRITE not supported";
	if (!v->rkeys[buf_index * e->n_tps + t])
		return "remote buffer has no key for it";
	if (atomic_load_explicit(&vt->paused_until_ns, memory_order_relaxed) > now) {
		*st_out = TE_ERR_PEER_QUARANTINED;
		return "peer quarantined after failures";
	}
	return NULL;
}

/*
 * The device kinds (GPU memory) a request touches: the local region's and the remote
 * buffer's, as TE_PLUGIN_MEM_* bits; 0 for host memory on both sides.
 */
static uint32_t choice_device_kinds(const struct segview *v, size_t buf_index,
				    const struct mem_region *region)
{
	const char *rloc = v->desc->buffers[buf_index].location;
	uint32_t kinds = region->mem_type != TE_PLUGIN_MEM_CPU ? region->mem_type : 0;
	uint32_t rtype;
	int32_t rdev;

	if (rloc && *rloc && strncmp(rloc, "cpu", 3) != 0 &&
	    memkind_parse_location(rloc, &rtype, &rdev) == TE_OK && rtype != TE_PLUGIN_MEM_CPU)
		kinds |= rtype;
	return kinds;
}

/*
 * Round @round of the choice for device kinds @kinds: 0 takes same-host transports that move
 * every kind themselves, 1 any transport that does (a GPU plugin with cross-host handles,
 * rdma or efa with GPUDirect), 2 any (the peer's tcp serving its GPU memory through its own
 * staging, say). Host memory on both sides starts at round 2: the YAML order alone.
 */
static bool choice_round_takes(const struct transport *tp, int round, uint32_t kinds)
{
	if (round >= 2)
		return true;
	if ((tp->caps.mem_types & kinds) != kinds)
		return false;
	return round == 1 ||
	       (tp->caps.flags & (TE_PLUGIN_CAP_SAME_HOST_ONLY | TE_PLUGIN_CAP_SAME_PROCESS_ONLY));
}

/*
 * Pick the transport for one request: the first in priority order that fits.
 * A quarantined peer stops the search unless transfer.fallback allows a lower
 * priority transport. On failure writes every candidate's reason into @why.
 */
static int select_transport(struct engine *e, struct segview *v, size_t buf_index,
			    const struct mem_region *region, uint32_t opcode, uint64_t now,
			    bool *staged_out, enum te_status *st_out, char *why, size_t why_len)
{
	enum te_status st = TE_ERR_NO_TRANSPORT;
	size_t used = 0;

	/*
	 * Memory a transport moves itself beats memory it would get through host staging; for
	 * device memory (a GPU's) on either side, a transport that moves that memory itself on
	 * both sides comes first, one made for this host (nvlink, hip) before the others, and
	 * only then one the peer serves through its own staging. Within each round the YAML
	 * order decides. Host memory on both sides: the YAML order alone.
	 */
	uint32_t kinds = choice_device_kinds(v, buf_index, region);

	for (int round = kinds ? 0 : 2; round < 3; round++) {
		for (unsigned t = 0; t < e->n_tps; t++) {
			enum te_status tst = TE_ERR_NO_TRANSPORT;

			if (!choice_round_takes(e->tps[t], round, kinds))
				continue;
			if (!slice_unfit(e, v, t, buf_index, region, opcode, now, false, &tst)) {
				*staged_out = false;
				return (int)t;
			}
			if (tst == TE_ERR_PEER_QUARANTINED && !e->cfg->fallback)
				break;
		}
	}
	for (unsigned t = 0; t < e->n_tps; t++) {
		enum te_status tst = TE_ERR_NO_TRANSPORT;
		const char *r = slice_unfit(e, v, t, buf_index, region, opcode, now, true, &tst);

		if (!r) {
			*staged_out = true;
			return (int)t;
		}
		if (tst != TE_ERR_NO_TRANSPORT && st == TE_ERR_NO_TRANSPORT)
			st = tst;
		if (used < why_len) {
			/* vt->why already names the transport. */
			bool named = r == v->tps[t].why;

			used += (size_t)g_snprintf(
				why + used, why_len - used, "%s%s%s%s", used ? "; " : "",
				named ? "" : e->tps[t]->plugin->name, named ? "" : ": ", r);
		}
		if (tst == TE_ERR_PEER_QUARANTINED && !e->cfg->fallback)
			break;
	}
	if (!e->n_tps)
		g_snprintf(why, why_len, "no transports installed");
	*st_out = st;
	return -1;
}

/* Debug: one line per task saying which transport carries it and why the ones before did not. */
static void log_choice(struct engine *e, struct segview *v, size_t buf_index,
		       const struct mem_region *region, const struct te_request *r, int tpi,
		       bool staged, uint64_t now, te_batch_id id, size_t task)
{
	g_autoptr(GString) why = g_string_new(NULL);
	uint32_t kinds = choice_device_kinds(v, buf_index, region);

	for (int t = 0; t < tpi; t++) {
		enum te_status tst = TE_ERR_NO_TRANSPORT;
		const char *u = slice_unfit(e, v, (unsigned)t, buf_index, region, r->opcode, now,
					    staged, &tst);

		g_string_append_printf(
			why, "; %s: %s", e->tps[t]->plugin->name,
			u ? u : "fits, but one that moves the device memory itself comes first");
	}
	/* Later in the YAML but tried first (the choice does not): it moves the device memory. */
	for (unsigned t = (unsigned)tpi + 1;
	     kinds && !choice_round_takes(e->tps[tpi], 1, kinds) && t < e->n_tps; t++) {
		enum te_status tst = TE_ERR_NO_TRANSPORT;
		const char *u;

		if (!choice_round_takes(e->tps[t], 1, kinds))
			continue;
		u = slice_unfit(e, v, t, buf_index, region, r->opcode, now, false, &tst);
		g_string_append_printf(why, "; %s (moves %s memory itself, tried first): %s",
				       e->tps[t]->plugin->name, memkind_name(kinds & -kinds),
				       u ? u : "fits");
	}
	ENGINE_LOG(e, TE_LOG_DEBUG,
		   "batch 0x%" PRIx64 " task %zu: %s %" PRIu64 " B to '%s' at 0x%" PRIx64
		   ": transport %s%s%s",
		   (uint64_t)id, task, r->opcode == TE_OP_READ ? "READ" : "WRITE", r->length,
		   v->desc->name, r->remote, e->tps[tpi]->plugin->name, staged ? " (staged)" : "",
		   why->str);
}

/*
 * Slice size on transport @t for a submit of @total bytes: the transport's (caps or YAML),
 * doubled while the submit still makes SLICE_GROW_MIN_SLICES slices of it, up to
 * SLICE_GROW_MAX (and 8 times the transport's, and its max_slice_size). Many large requests at
 * once keep every lane busy with fewer, larger frames; a few keep their slices small enough
 * to spread over the lanes. Not when the YAML sets transfer.slice_size, nor for staged slices
 * (their bounce buffers are the transport's slice size).
 */
#define SLICE_GROW_MIN_SLICES 8
#define SLICE_GROW_MAX (8ull << 20)
static uint64_t slice_size_for(const struct engine *e, unsigned t, uint64_t total, bool staged)
{
	uint64_t ss = e->slice_size[t], cap = MIN(SLICE_GROW_MAX, ss * 8);
	uint64_t max = e->tps[t]->caps.max_slice_size;

	if (e->cfg->slice_size || staged)
		return ss;
	if (max && cap > max)
		cap = max;
	while (ss * 2 <= cap && total / (ss * 2) >= SLICE_GROW_MIN_SLICES)
		ss *= 2;
	return ss;
}

/*
 * Bytes @reqs ask for, saturating: the submit's size for slice_size_for (rejected requests
 * count too; a hint). Summed only when a request is larger than its transport's slice size.
 */
static uint64_t requests_bytes(const struct te_request *reqs, size_t n)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++)
		sum = reqs[i].length > UINT64_MAX - sum ? UINT64_MAX : sum + reqs[i].length;
	return sum;
}

/* Slice size for a task of @length in slices of at most @ss (max slices per task). */
static uint64_t task_slice_size(struct engine *e, uint64_t ss, uint64_t length, uint32_t *n_out)
{
	uint64_t n = (length + ss - 1) / ss;

	if (n > e->cfg->max_slices_per_task) {
		n = e->cfg->max_slices_per_task;
		ss = (length + n - 1) / n;
		n = (length + ss - 1) / ss;
	}
	*n_out = (uint32_t)n;
	return ss;
}

static void task_reject(struct task *t, enum te_status st, const char *fmt, ...)
	G_GNUC_PRINTF(3, 4);
static void task_reject(struct task *t, enum te_status st, const char *fmt, ...)
{
	va_list ap;

	t->invalid = true;
	va_start(ap, fmt);
	t->detail = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	atomic_store_explicit(&t->claimed, 1, memory_order_relaxed);
	atomic_store_explicit(&t->status, st, memory_order_release);
}

/* Undo what pass 1 took for tasks [base, base + n) of @b; nothing was published yet. */
static void tasks_undo(struct batch *b, uint32_t base, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct task *t = &b->tasks[base + i];

		if (t->region)
			atomic_fetch_sub(&t->region->refs, 1);
		if (t->seg)
			atomic_fetch_sub(&t->seg->busy, 1);
		segview_unref(t->view);
		g_free(t->detail);
		memset(t, 0, sizeof(*t));
	}
}

/*
 * References a submit takes per task (its local region, its segment, its view), counted in
 * runs of consecutive tasks on the same ones and taken with one atomic add per run. Flushed
 * before pass 1 lets go of the locks that keep them alive.
 */
struct ref_run {
	struct mem_region *region;
	struct segment *seg; /* NULL: the local segment (no busy count) */
	struct segview *view;
	int32_t n; /* tasks in the run, each on all three */
};

/* Relaxed, as the per-task adds were: the submit's locks order them against release. */
static void ref_run_flush(struct ref_run *run)
{
	if (run->n) {
		atomic_fetch_add_explicit(&run->region->refs, run->n, memory_order_relaxed);
		if (run->seg)
			atomic_fetch_add_explicit(&run->seg->busy, run->n, memory_order_relaxed);
		atomic_fetch_add_explicit(&run->view->refs, run->n, memory_order_relaxed);
	}
	run->n = 0;
}

static inline void ref_run_add(struct ref_run *run, struct mem_region *region, struct segment *seg,
			       struct segview *view)
{
	if (G_UNLIKELY(region != run->region || seg != run->seg || view != run->view)) {
		ref_run_flush(run);
		run->region = region;
		run->seg = seg;
		run->view = view;
	}
	run->n++;
}

/* Pass 1 to pass 2 (in task.last_device): same target as the task accepted before it. */
#define TASK_SAME_TARGET (UINT32_MAX - 1)

/* Internal: a request missed its segment's descriptor; nothing was appended (try again). */
#define SUBMIT_REFRESH 1

/*
 * Append @n requests to batch @id. With @may_refresh, a request whose remote range is not in
 * its segment's descriptor appends nothing and returns SUBMIT_REFRESH (*missed set): the caller
 * fetches the descriptor again and retries once without @may_refresh.
 */
static enum te_status slice_submit_requests(struct engine *e, te_batch_id id,
					    const struct te_request *reqs, size_t n,
					    bool may_refresh, bool *missed)
{
	enum te_status first_err = TE_OK;
	struct slice_chunk *chunk = NULL;
	uint32_t base, si = 0, n_rejected = 0;
	uint64_t total_slices = 0, submit_bytes = 0, now, deadline;
	struct segview *local_view = NULL, *last_view = NULL;
	const struct descriptor_buffer *last_db = NULL;
	struct mem_region *last_region = NULL;
	struct segment *last_seg = NULL;
	te_segment_id last_seg_id = 0;
	/* Runs of requests alike (see ref_run): one atomic per run for the references taken. */
	struct ref_run held = { 0 };
	/* The last transport choice, and what it depended on (select_transport is pure in them). */
	struct mem_region *sel_region = NULL;
	struct segment *sel_seg = NULL;
	te_segment_id sel_segment = 0;
	struct segview *sel_view = NULL;
	const struct descriptor_buffer *sel_db = NULL;
	uint32_t sel_opcode = UINT32_MAX; /* no request's (validated before): none chosen yet */
	int sel_tpi = -1;
	bool sel_staged = false;
	/* Pass 2: the paused devices of the last transport (now does not change). */
	struct transport *ex_tp = NULL;
	uint64_t ex_mask = 0;
	/* Pass 2: what slices of the current target share. */
	struct transport *cur_tp = NULL;
	struct te_plugin_rkey *rkey = NULL;
	struct te_plugin_peer *peer = NULL;
	struct te_plugin_mem *local_mem = NULL;
	uint64_t remote_base = 0;
	uint32_t cur_tpi = 0, priv_size = 0, opcode = 0;
	bool staged = false;
	struct batch *b;
	enum te_status st;
	size_t i;

	/* Relaxed peek: segment_refresh_stale reads it again (acquire) before acting. */
	if (atomic_load_explicit(&e->refresh_pending, memory_order_relaxed))
		segment_refresh_stale(e);
	st = batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	if (n && !reqs) {
		batch_unref(b);
		return log_error(TE_ERR_INVALID_ARG, "te_batch_submit: requests is NULL");
	}
	if (atomic_load(&b->canceled)) {
		batch_unref(b);
		return log_error(TE_ERR_CANCELED, "te_batch_submit: batch was canceled");
	}
	base = atomic_load_explicit(&b->n_tasks, memory_order_relaxed);
	if (n > b->capacity - base) {
		batch_unref(b);
		return log_error(TE_ERR_BATCH_FULL,
				 "te_batch_submit: %zu requests do not fit (capacity %u, %u used)",
				 n, b->capacity, base);
	}
	if (!n) {
		batch_unref(b);
		return TE_OK;
	}
	now = engine_now_ns();
	deadline = now + e->cfg->timeout_ms * 1000000ull;
	/* Pass 1: validate, choose transports, count slices. */
	g_rw_lock_reader_lock(&e->mem.lock);
	segment_read_lock(e);
	for (i = 0; i < n; i++) {
		const struct te_request *r = &reqs[i];
		struct task *t = &b->tasks[base + i];
		const struct descriptor_buffer *db;
		struct mem_region *region = NULL;
		struct segview *v = NULL;
		struct segment *seg = NULL;
		const char *gone;
		char why[TE_DETAIL_MAX - 64];
		enum te_status sst;
		uint32_t bi, ns;
		int tpi;

		/*
		 * Every field set here or, for region, view, seg, tp, n_slices, staged and
		 * last_device, where the task is accepted or rejected: recycled task arrays are
		 * not zeroed.
		 */
		t->batch = b;
		t->opcode = r->opcode;
		t->length = r->length;
		t->detail = NULL;
		t->invalid = false;
		atomic_init(&t->done, 0);
		atomic_init(&t->bad, 0);
		atomic_init(&t->posted, 0);
		atomic_init(&t->retries, 0);
		atomic_init(&t->bytes, 0);
		atomic_init(&t->status, 0);
		atomic_init(&t->claimed, 0);
		if (r->opcode != TE_OP_READ && r->opcode != TE_OP_WRITE) {
			task_reject(t, TE_ERR_INVALID_ARG,
				    "request %zu: opcode %d is neither READ (0) nor WRITE (1)", i,
				    (int)r->opcode);
			goto rejected;
		}
		if (r->length == 0 || !r->local) {
			task_reject(t, TE_ERR_INVALID_ARG, "request %zu: %s", i,
				    r->length == 0 ? "length is 0" : "local address is NULL");
			goto rejected;
		}
		if ((uintptr_t)r->local + r->length < (uintptr_t)r->local ||
		    r->remote + r->length < r->remote) {
			task_reject(t, TE_ERR_OVERFLOW,
				    "request %zu: %s range of %" PRIu64 " bytes wraps around", i,
				    (uintptr_t)r->local + r->length < (uintptr_t)r->local
					    ? "local"
					    : "remote",
				    r->length);
			goto rejected;
		}
		/*
		 * The opcode, segment, local region and remote buffer of the request accepted
		 * last: its checks, transport and references hold for this one (only the ranges
		 * differ, checked here).
		 */
		if (r->opcode == sel_opcode && r->segment == sel_segment &&
		    (uintptr_t)r->local >= sel_region->addr &&
		    (uintptr_t)r->local + r->length - sel_region->addr <= sel_region->length &&
		    r->remote >= sel_db->addr &&
		    r->remote + r->length - sel_db->addr <= sel_db->length) {
			region = sel_region;
			seg = sel_seg;
			v = sel_view;
			db = sel_db;
			tpi = sel_tpi;
			t->staged = sel_staged;
			held.n++; /* its run is sel_*'s, the last one added */
			bi = TASK_SAME_TARGET;
		} else {
			/* Consecutive requests usually hit the same region: try it first. */
			if (last_region && (uintptr_t)r->local >= last_region->addr &&
			    (uintptr_t)r->local + r->length - last_region->addr <=
				    last_region->length) {
				region = last_region;
				sst = TE_OK;
			} else {
				sst = mem_lookup(e->mem.regions, (uintptr_t)r->local, r->length,
						 &region);
			}
			if (sst != TE_OK) {
				task_reject(
					t, sst,
					sst == TE_ERR_NOT_REGISTERED
						? "request %zu: local address %p is not in a registered "
						  "region (+%" PRIu64 " bytes)"
						: "request %zu: local range [%p, +%" PRIu64
						  ") runs past the end of its registered region",
					i, r->local, r->length);
				goto rejected;
			}
			if (r->segment == TE_SEGMENT_LOCAL) {
				if (!local_view) {
					g_autofree char *err = NULL;

					sst = segment_local_view(e, &local_view, &err);
					if (sst != TE_OK) {
						task_reject(t, sst,
							    "request %zu: local segment: %s", i,
							    err);
						goto rejected;
					}
				}
				v = local_view;
			} else if (last_seg && r->segment == last_seg_id) {
				seg = last_seg;
				v = seg->view;
			} else {
				seg = segment_get_locked(e, r->segment);
				if (!seg) {
					task_reject(t, TE_ERR_UNKNOWN_SEGMENT,
						    "request %zu: segment id %u is not open", i,
						    r->segment);
					goto rejected;
				}
				gone = segment_gone_locked(seg);
				if (gone) {
					task_reject(t, TE_ERR_PEER_UNREACHABLE,
						    "request %zu: segment '%s' is gone: %s", i,
						    seg->name, gone);
					goto rejected;
				}
				v = seg->view;
				/* Under the read lock neither departed nor view changes (absence
				 * may expire: the next batch sees it): checked once. */
				last_seg = seg;
				last_seg_id = r->segment;
			}
			if (last_db && v == last_view && r->remote >= last_db->addr &&
			    r->remote + r->length - last_db->addr <= last_db->length)
				db = last_db;
			else
				db = descriptor_find_buffer(v->desc, r->remote, r->length);
			if (!db) {
				uint64_t ago_ms = 0;

				/*
				 * The peer may have registered it since its descriptor was fetched (or
				 * restarted elsewhere): fetch a fresh one and try again (the caller),
				 * unless a fetch found it unchanged a moment ago (segment_refetch).
				 */
				if (seg && may_refresh) {
					if (segment_refetch(e, seg, &ago_ms)) {
						*missed = true;
					} else {
						task_reject(
							t, TE_ERR_REMOTE_ACCESS,
							"request %zu: remote range [0x%" PRIx64
							", +%" PRIu64 ") is outside the registered "
							"buffers of segment '%s' (unchanged when "
							"fetched %" PRIu64 " ms ago; fetched again "
							"%llu ms after that at the earliest)",
							i, r->remote, r->length, v->desc->name,
							ago_ms,
							(unsigned long long)(SEGMENT_REFETCH_NS /
									     1000000u));
						goto rejected;
					}
				}
				task_reject(t, TE_ERR_REMOTE_ACCESS,
					    "request %zu: remote range [0x%" PRIx64 ", +%" PRIu64
					    ") is outside the registered buffers of segment '%s'",
					    i, r->remote, r->length, v->desc->name);
				goto rejected;
			}
			if (!(db->access & (r->opcode == TE_OP_READ ? TE_MEM_REMOTE_READ
								    : TE_MEM_REMOTE_WRITE))) {
				task_reject(t, TE_ERR_REMOTE_ACCESS,
					    "request %zu: remote buffer [0x%" PRIx64 ", +%" PRIu64
					    ") of segment '%s' is not registered for remote %s",
					    i, db->addr, db->length, v->desc->name,
					    r->opcode == TE_OP_READ ? "read" : "write");
				goto rejected;
			}
			last_region = region;
			last_db = db;
			last_view = v;
			if (sel_tpi >= 0 && region == sel_region && v == sel_view && db == sel_db &&
			    r->opcode == sel_opcode) {
				tpi = sel_tpi;
				t->staged = sel_staged;
			} else {
				tpi = select_transport(e, v, (size_t)(db - v->desc->buffers),
						       region, r->opcode, now, &t->staged, &sst,
						       why, sizeof(why));
			}
			if (tpi < 0) {
				task_reject(t, sst,
					    "request %zu: no transport for segment '%s': %s", i,
					    v->desc->name, why);
				goto rejected;
			}
			sel_region = region;
			sel_seg = seg;
			sel_segment = r->segment;
			sel_view = v;
			sel_db = db;
			sel_opcode = r->opcode;
			sel_tpi = tpi;
			sel_staged = t->staged;
			ref_run_add(&held, region, seg, v);
			bi = (uint32_t)(db - v->desc->buffers);
		}
		t->tp = e->tps[tpi];
		if (log_enabled(&e->log, TE_LOG_DEBUG))
			log_choice(e, v, (size_t)(db - v->desc->buffers), region, r, tpi, t->staged,
				   now, id, base + i);
		t->region = region;
		t->view = v;
		t->seg = seg;
		if (r->length <= e->slice_size[tpi]) {
			ns = 1; /* growth only makes slices larger */
		} else {
			if (!submit_bytes)
				submit_bytes = requests_bytes(reqs, n);
			task_slice_size(e,
					slice_size_for(e, (unsigned)tpi, submit_bytes, t->staged),
					r->length, &ns);
		}
		t->n_slices = ns;
		/* Remember which buffer: reuse last_device as scratch until posting. */
		atomic_store_explicit(&t->last_device, bi, memory_order_relaxed);
		total_slices += ns;
		continue;
rejected:
		t->region = NULL;
		t->view = NULL;
		t->seg = NULL;
		t->tp = NULL;
		t->n_slices = 0;
		t->staged = false;
		atomic_store_explicit(&t->last_device, 0, memory_order_relaxed);
		n_rejected++;
		if (first_err == TE_OK) {
			first_err = atomic_load(&t->status);
			log_error(first_err, "te_batch_submit: %s", t->detail);
		}
	}
	ref_run_flush(&held); /* before the locks go: what they guard must stay */
	segment_read_unlock(e);
	g_rw_lock_reader_unlock(&e->mem.lock);

	if (*missed && may_refresh) {
		tasks_undo(b, base, n);
		segview_unref(local_view);
		batch_unref(b);
		log_clear_error();
		return (enum te_status)SUBMIT_REFRESH;
	}
	if (total_slices) {
		size_t bytes = sizeof(struct slice_chunk) + total_slices * e->slice_stride;

		if (b->spare && b->spare->cap >= bytes) {
			chunk = b->spare; /* recycled with the batch */
			b->spare = NULL;
		} else {
			chunk = total_slices <= UINT32_MAX ? g_try_malloc(bytes) : NULL;
			if (chunk)
				chunk->cap = bytes;
		}
		if (!chunk) {
			tasks_undo(b, base, n);
			segview_unref(local_view);
			batch_unref(b);
			return log_error(TE_ERR_NOMEM,
					 "te_batch_submit: no memory for %" PRIu64 " slices",
					 total_slices);
		}
		chunk->n = (uint32_t)total_slices;
		chunk->stride = e->slice_stride;
		/* Linked into b->chunks once built (below), not before: cancel walks it. */
	}

	/* Pass 2: build slices (the values of the task before while bi is TASK_SAME_TARGET). */
	for (i = 0; i < n; i++) {
		struct task *t = &b->tasks[base + i];
		const struct te_request *r = &reqs[i];
		uint64_t ss, off = 0, length = r->length;
		uint32_t ns, bi;

		if (t->invalid)
			continue;
		bi = atomic_load_explicit(&t->last_device, memory_order_relaxed);
		atomic_store_explicit(&t->last_device, UINT32_MAX, memory_order_relaxed);
		/* The same target as the task accepted before it: what follows is as computed. */
		if (bi != TASK_SAME_TARGET) {
			cur_tp = t->tp;
			cur_tpi = cur_tp->index;
			staged = t->staged;
			remote_base = t->view->desc->buffers[bi].addr;
			peer = t->view->tps[cur_tpi].peer;
			rkey = t->view->rkeys[bi * e->n_tps + cur_tpi];
			local_mem = staged ? NULL : t->region->handles[cur_tpi];
			priv_size = cur_tp->caps.slice_priv_size;
			opcode = r->opcode == TE_OP_READ ? TE_PLUGIN_OP_READ : TE_PLUGIN_OP_WRITE;
			if (cur_tp != ex_tp) {
				ex_tp = cur_tp;
				ex_mask = transport_paused_devices(cur_tp, now);
			}
		}
		if (t->n_slices == 1) {
			ss = length;
			ns = 1;
		} else {
			/* Larger than the slice size: pass 1 summed submit_bytes. */
			ss = task_slice_size(e, slice_size_for(e, cur_tpi, submit_bytes, staged),
					     length, &ns);
		}
		for (uint32_t k = 0; k < ns; k++, si++) {
			struct slice *s = SLICE_AT(chunk, si);
			uint64_t len = MIN(ss, length - off);

			s->ps.size = sizeof(s->ps);
			s->ps.opcode = opcode;
			s->ps.local = (char *)r->local + off;
			s->ps.remote = r->remote + off;
			s->ps.length = len;
			s->ps.local_mem = local_mem;
			s->staged = staged;
			s->bounce = UINT32_MAX;
			s->stage_local = s->ps.local;
			s->ps.peer = peer;
			s->ps.rkey = rkey;
			s->ps.remote_base = remote_base;
			s->ps.deadline_ns = deadline;
			s->ps.excluded_devices = ex_mask;
			s->ps.attempt = 0;
			s->ps.device = 0;
			s->ps.priv = priv_size ? (char *)s + sizeof(*s) : NULL;
			batch_slice_clear_priv(s, priv_size);
			s->task = t;
			s->tp = cur_tp;
			s->next = NULL;
			s->retry_at_ns = 0;
			atomic_init(&s->term, 0);
			atomic_init(&s->in_plugin, 0);
			atomic_init(&s->abort_status, 0);
			atomic_init(&s->abort_ns, 0);
			atomic_init(&s->cancel_sent, 0);
			s->seg_tp = cur_tpi;
			off += len;
		}
	}

	/*
	 * Publish: from here completions may race with the rest of this function. The tasks
	 * are counted (n_tasks) before the chunk is linked where te_batch_cancel and the
	 * deadline check find its slices: a slice they end is then counted against all of
	 * the batch's tasks, and never ends the batch early.
	 */
	atomic_fetch_add_explicit(&b->refs, (int64_t)total_slices, memory_order_relaxed);
	atomic_min_u64(&b->min_deadline_ns, deadline);
	retry_note_deadline(e, deadline);
	atomic_store_explicit(&b->n_tasks, base + (uint32_t)n, memory_order_release);
	if (chunk) {
		chunk->next = atomic_load_explicit(&b->chunks, memory_order_relaxed);
		/*
		 * seq_cst, then the load of canceled: with te_batch_cancel's store of canceled,
		 * then its load of chunks, one of the two sees the other. A cancel that walked
		 * the chunks before this one was linked is repeated for it here.
		 */
		atomic_store(&b->chunks, chunk);
		if (atomic_load(&b->canceled))
			(void)retry_cancel(e, id);
	}
	for (i = 0; n_rejected && i < n; i++)
		if (b->tasks[base + i].invalid)
			task_terminal(&b->tasks[base + i]);

	/* Pass 3: hand runs of slices with the same transport to their plugin. */
	for (uint32_t start = 0; start < si;) {
		struct slice *s = SLICE_AT(chunk, start);
		struct transport *tp = s->tp;
		struct te_plugin_slice *run[POST_CHUNK];
		uint32_t k = 0, max = MIN(si - start, (uint32_t)POST_CHUNK);

		do {
			run[k++] = &s->ps;
			s = (struct slice *)(void *)((char *)s + chunk->stride);
		} while (k < max && s->tp == tp);
		post_run(e, tp, run, k);
		start += k;
	}
	segview_unref(local_view);
	batch_unref(b);
	return first_err;
}

enum te_status slice_submit(struct engine *e, te_batch_id id, const struct te_request *reqs,
			    size_t n)
{
	bool missed = false;
	enum te_status st = slice_submit_requests(e, id, reqs, n, true, &missed);

	/*
	 * A remote range outside the segment's descriptor: the peer may have registered it (or
	 * restarted) since its descriptor was fetched. Fetch it now and validate the requests
	 * against it once more: a buffer a peer registers after it was opened is reachable at
	 * once (what is still outside is refused then, the others proceed). Not again within
	 * SEGMENT_REFETCH_NS of a fetch that found nothing new (segment_refetch): a client
	 * hammering a range the peer never registered must not hammer its control plane too.
	 */
	if (st == (enum te_status)SUBMIT_REFRESH) {
		segment_refresh_stale(e);
		missed = false;
		st = slice_submit_requests(e, id, reqs, n, false, &missed);
	}
	return st;
}

/* A slice attempt moved all its bytes and the core did not give up on it: it succeeded. */
static inline void slice_done_ok(struct transport *tp, struct slice *s, uint64_t bytes,
				 struct reap *rp)
{
	struct task *t = s->task;
	struct batch *b = t->batch;
	uint32_t d = s->ps.device;

	if (d < TRANSPORT_MAX_DEVICES &&
	    atomic_load_explicit(&tp->dev_failures[d], memory_order_relaxed))
		atomic_store_explicit(&tp->dev_failures[d], 0, memory_order_relaxed);
	if (slice_claim(s)) {
		/* One slice: its claim makes this the task's only writer of bytes. */
		if (t->n_slices == 1)
			atomic_store_explicit(&t->bytes, bytes, memory_order_relaxed);
		else
			atomic_fetch_add_explicit(&t->bytes, bytes, memory_order_relaxed);
		slice_count_done(s);
	}
	if (rp->tp == tp) {
		if (rp->batch != b) {
			reap_flush_batch(rp);
			rp->batch = b;
		}
		rp->refs++;
	} else {
		batch_release_slice(s);
	}
}

/*
 * slice_done past its common part: a staged slice, a failure, a short transfer or an abort.
 * Out of line: its detail buffers stay off the stack of the success path.
 */
static G_GNUC_NO_INLINE void slice_done_slow(struct transport *tp, struct slice *s,
					     enum te_status status, uint64_t bytes,
					     const char *detail)
{
	struct te_plugin_slice *ps = &s->ps;
	struct task *t = s->task;
	struct batch *b = t->batch;
	struct engine *e = b->engine;
	char stage_why[TE_DETAIL_MAX];
	int32_t abort;

	if (s->bounce != UINT32_MAX) {
		/* A staged READ's bytes go from the bounce buffer to its memory; then it is free. */
		enum te_status before = status;

		stage_detach(e, s, &status, stage_why, sizeof(stage_why));
		if (status != before) {
			detail = stage_why;
			bytes = 0;
		}
	}
	if (ps->device < TRANSPORT_MAX_DEVICES)
		atomic_store_explicit(&t->last_device, ps->device, memory_order_relaxed);
	abort = atomic_load_explicit(&s->abort_status, memory_order_acquire);
	/*
	 * A failure reported while te_batch_cancel runs (a transport may fail the other slices
	 * of a connection it aborts to cancel one) is a cancel too, not a FAILED task.
	 */
	if (!abort && status != TE_OK && atomic_load_explicit(&b->canceled, memory_order_acquire))
		abort = TE_ERR_CANCELED;
	if (abort) {
		/*
		 * The core gave up on it (deadline, te_batch_cancel) and waited for the plugin
		 * to let go: the outcome is the core's, whatever the report says (a WRITE
		 * reported TIMEOUT may have landed in part or in full, never later).
		 */
		char why[TE_DETAIL_MAX], core[TE_DETAIL_MAX];

		slice_abort_why(s, abort, core, sizeof(core));
		if (status != TE_OK && detail && *detail)
			snprintf(why, sizeof(why), "%s; %s", core, detail);
		else
			snprintf(why, sizeof(why), "%s", core);
		slice_fail(s, abort, why);
		batch_release_slice(s);
		return;
	}

	if (status == TE_OK && bytes == ps->length) {
		slice_done_ok(tp, s, bytes, reap_get());
		return;
	}
	if (status == TE_OK) {
		/* A short transfer is a plugin bug; never report it as success. */
		char why[TE_DETAIL_MAX];

		snprintf(why, sizeof(why),
			 "%s: slice reported %" PRIu64 " of %" PRIu64 " bytes (plugin bug)",
			 tp->plugin->name, bytes, ps->length);
		slice_fail(s, TE_ERR_INTERNAL, why);
		batch_release_slice(s);
		return;
	}
	if (status == TE_ERR_CONN_RESET || status == TE_ERR_PEER_UNREACHABLE ||
	    status == TE_ERR_PEER_RESTARTED || status == TE_ERR_LINK_DOWN)
		segment_mark_stale(e, t->seg); /* the peer may have restarted elsewhere */
	else if (status == TE_ERR_REMOTE_ACCESS)
		(void)segment_refetch(e, t->seg, NULL); /* the buffer registered again? */
	if (te_status_is_retryable(status) && retry_plan(e, s, status, detail))
		return;
	if (!atomic_load_explicit(&s->term, memory_order_acquire) &&
	    !atomic_load_explicit(&b->canceled, memory_order_acquire) &&
	    retry_fallback(e, s, status, detail))
		return;
	{
		char why[TE_DETAIL_MAX];

		if (ps->attempt)
			snprintf(why, sizeof(why), "%s (after %u attempts)",
				 detail ? detail : te_status_str(status), ps->attempt + 1);
		else
			snprintf(why, sizeof(why), "%s", detail ? detail : te_status_str(status));
		slice_fail(s, status, why);
	}
	batch_release_slice(s);
}

void slice_done(struct transport *tp, struct te_plugin_slice *ps, enum te_status status,
		uint64_t bytes, const char *detail)
{
	struct slice *s = SLICE_OF(ps);
	struct reap *rp = reap_get();

	/*
	 * release only: if batch_abort_slices reads in_plugin before this store and this
	 * thread reads abort_status before its store, the slice ends with the plugin's own
	 * outcome (a report and a give-up at the same moment; never a retry: the deadline
	 * passed or the batch is canceled). Nothing waits on the slice either way.
	 */
	atomic_store_explicit(&s->in_plugin, 0, memory_order_release);
	if (tp->polled) {
		if (rp->tp == tp)
			rp->done++;
		else
			atomic_fetch_sub_explicit(&tp->in_flight, 1, memory_order_relaxed);
	}
	/* Room in the plugin again: end a back-pressure stall (read-mostly, written rarely). */
	if (G_UNLIKELY(atomic_load_explicit(&tp->stall_until_ns, memory_order_relaxed)))
		atomic_store_explicit(&tp->stall_until_ns, 0, memory_order_relaxed);
	/* The common case (not staged, complete, not given up on) here; the rest out of line. */
	if (G_LIKELY(s->bounce == UINT32_MAX && status == TE_OK && bytes == ps->length &&
		     !atomic_load_explicit(&s->abort_status, memory_order_acquire))) {
		if (ps->device < TRANSPORT_MAX_DEVICES)
			atomic_store_explicit(&s->task->last_device, ps->device,
					      memory_order_relaxed);
		slice_done_ok(tp, s, bytes, rp);
		return;
	}
	slice_done_slow(tp, s, status, bytes, detail);
}

void slice_retry(struct engine *e, struct slice *s)
{
	struct transport *tp = s->tp;
	enum te_status st;

	if (atomic_load_explicit(&s->term, memory_order_acquire)) {
		batch_release_slice(s);
		return;
	}
	if (atomic_load(&s->abort_status)) {
		char why[TE_DETAIL_MAX];
		int32_t abort = atomic_load(&s->abort_status);

		slice_abort_why(s, abort, why, sizeof(why));
		slice_fail(s, abort, why);
		batch_release_slice(s);
		return;
	}
	s->ps.excluded_devices |= transport_paused_devices(tp, engine_now_ns());
	if (tp->n_devices && tp->n_devices < 64 &&
	    (s->ps.excluded_devices & ((1ull << tp->n_devices) - 1)) == (1ull << tp->n_devices) - 1)
		s->ps.excluded_devices = 0; /* never exclude every device */
	st = transport_retry_prepare(tp, &s->ps);
	if (st != TE_OK && st != TE_ERR_UNSUPPORTED) {
		char why[TE_DETAIL_MAX];

		snprintf(why, sizeof(why), "%s: no path left for retry %u: %s", tp->plugin->name,
			 s->ps.attempt, te_status_str(st));
		slice_fail(s, st, why);
		batch_release_slice(s);
		return;
	}
	{
		/* Same reason as in slice_drain_backlog: hold the batch across posting. */
		struct batch *b = s->task->batch;

		atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
		slice_post(e, tp, &s, 1);
		batch_unref(b);
	}
}

enum te_status slice_submit_notify(struct engine *e, te_batch_id id, const struct te_request *reqs,
				   size_t n, const void *msg, size_t len)
{
	g_autofree char *addr = NULL;
	te_segment_id seg = TE_SEGMENT_LOCAL;
	struct batch *b;
	enum te_status st;

	if (len > TE_NOTIFY_MAX || (len && !msg) || (n && !reqs))
		return log_error(TE_ERR_INVALID_ARG,
				 "te_batch_submit_notify: message of %zu bytes (max %u) or NULL "
				 "argument",
				 len, TE_NOTIFY_MAX);
	for (size_t i = 0; i < n; i++) {
		if (i == 0)
			seg = reqs[i].segment;
		if (reqs[i].segment != seg || seg == TE_SEGMENT_LOCAL)
			return log_error(TE_ERR_INVALID_ARG,
					 "te_batch_submit_notify: request %zu: all requests must "
					 "target one remote segment",
					 i);
	}
	if (n == 0)
		return log_error(TE_ERR_INVALID_ARG, "te_batch_submit_notify: no requests");
	addr = segment_rpc_address(e, seg);
	if (!addr)
		return log_error(TE_ERR_UNKNOWN_SEGMENT,
				 "te_batch_submit_notify: segment %u is not open or has no "
				 "control-plane address",
				 seg);
	st = batch_get(e, id, &b);
	if (st != TE_OK)
		return st;
	if (b->notify_msg) {
		batch_unref(b);
		return log_error(TE_ERR_EXISTS, "te_batch_submit_notify: batch already has a "
						"notify");
	}
	b->notify_msg = g_bytes_new(msg, len);
	b->notify_addr = g_steal_pointer(&addr);
	st = slice_submit(e, id, reqs, n);
	if (st == TE_ERR_BATCH_FULL || st == TE_ERR_CANCELED) {
		/* Nothing was appended: disarm so a later call may try again. */
		g_bytes_unref(b->notify_msg);
		b->notify_msg = NULL;
		batch_unref(b);
		return st;
	}
	/* Armed after the tasks exist, so a completion in between cannot fire early. */
	atomic_store_explicit(&b->notify_state, 1, memory_order_release);
	batch_maybe_notify(b);
	batch_unref(b);
	return st;
}

void slice_drop_backlog(struct transport *tp)
{
	while (tp->backlog_head) {
		struct slice *s = tp->backlog_head;

		tp->backlog_head = s->next;
		batch_release_slice(s);
	}
	tp->backlog_tail = NULL;
	atomic_store(&tp->backlog_len, 0);
}
