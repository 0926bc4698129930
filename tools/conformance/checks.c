/* SPDX-License-Identifier: Apache-2.0 */
/* checks.c: te-conformance's behaviour checks: two engines in two processes, through te.h. */

/*
 * The target is another te-conformance process (target.c) serving a region with guard zones;
 * this process is the initiator. Byte j of the initiator's local buffer carries pattern index
 * j + LSHIFT, the index of the target byte a request at that local address pairs with, so one
 * fill of either side sets up any request, and every check compares bytes by pattern. The
 * initiator loads the shim (shim.c) in place of the plugin unless --no-shim: it checks the
 * plugin's side of the contract during every check and injects the faults of the retry,
 * mark_failed, peer_event, forged-slice and fini checks. Checks run in a fixed order; each
 * prints its line. A check that cannot run (a missing op, one device, no shim) says why.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conformance.h"

#define G ((uint64_t)CONF_GUARD)
#define R ((uint64_t)CONF_REGION)
#define MIB ((uint64_t)1 << 20)
/* Local buffer: the region plus 8 KiB; local offset lo pairs with target offset lo + LSHIFT. */
#define LLEN (R + 8192)
#define LSHIFT ((int64_t)G - 4093)
#define LOCAL_OF(x) ((uint64_t)((int64_t)(x)-LSHIFT))

/* The transfer section of the initiator's engine. */
#define TRANSFER                                                                                   \
	"timeout_ms: 20000, retries: 6, retry_backoff_us: 100, retry_backoff_max_us: 20000, "      \
	"quarantine_ms: 300, cancel_grace_ms: 2000"
#define QUARANTINE_MS 300

/* Log lines of this process's engines. */
static struct {
	GMutex lock;
	GPtrArray *lines;
} logs;

/* An initiator engine with its local buffer, and the segment of the target it talks to. */
struct ini {
	struct te_engine *e;
	uint8_t *mem;
	struct membuf local;
	te_segment_id seg;
	bool has_seg;
};

static struct {
	struct conf *c;
	struct ini *ini;
	struct target *t;
	char *local_location;
	bool can_read, can_write;
	double t64_s; /* seconds of the 64 MiB WRITE (0: not measured) */
	char err[512];
} run;

static struct target *hang_targets[8];

/* The hang guard's cleanup: no target process outlives te-conformance. */
static void kill_targets(void)
{
	for (size_t i = 0; i < G_N_ELEMENTS(hang_targets); i++)
		if (hang_targets[i] && hang_targets[i]->pid)
			kill(hang_targets[i]->pid, SIGKILL);
}

static void track_target(struct target *t, bool add)
{
	for (size_t i = 0; i < G_N_ELEMENTS(hang_targets); i++) {
		if (add && !hang_targets[i]) {
			hang_targets[i] = t;
			return;
		}
		if (!add && hang_targets[i] == t) {
			hang_targets[i] = NULL;
			return;
		}
	}
}

static void engine_log(void *user, enum te_log_level level, const char *msg)
{
	(void)user;
	g_mutex_lock(&logs.lock);
	g_ptr_array_add(logs.lines, g_strdup_printf("%s: %s",
						    level <= TE_LOG_ERROR  ? "error"
						    : level == TE_LOG_WARN ? "warn"
									   : "info",
						    msg));
	g_mutex_unlock(&logs.lock);
	report_note("initiator: %s", msg);
}

static guint log_mark(void)
{
	guint n;

	g_mutex_lock(&logs.lock);
	n = logs.lines->len;
	g_mutex_unlock(&logs.lock);
	return n;
}

/* The first log line since @mark that contains @needle (a copy), or NULL. */
static char *log_find(guint mark, const char *needle)
{
	char *hit = NULL;

	g_mutex_lock(&logs.lock);
	for (guint i = mark; i < logs.lines->len && !hit; i++)
		if (strstr(logs.lines->pdata[i], needle))
			hit = g_strdup(logs.lines->pdata[i]);
	g_mutex_unlock(&logs.lock);
	return hit;
}

/* Outcomes a check reads another way (task states), or that cannot change its verdict. */
static void discard(enum te_status st)
{
	(void)st;
}

static bool shim_on(void)
{
	return run.c->shim != NULL;
}

static void shim_modes(const struct conf_shim_modes *m)
{
	static const struct conf_shim_modes off;

	if (shim_on())
		run.c->shim->set_modes(m ? m : &off);
}

static void shim_stats(struct conf_shim_stats *s)
{
	memset(s, 0, sizeof(*s));
	if (shim_on())
		run.c->shim->stats(s);
}

/* --- engines -------------------------------------------------------------------------------- */

static void ini_free(struct ini *in)
{
	if (!in)
		return;
	membuf_release(&in->local);
	te_engine_free(in->e);
	g_free(in);
}

/* An initiator engine with its registered local buffer; NULL with why in run.err. */
static struct ini *ini_new(const char *transfer)
{
	const struct conf *c = run.c;
	struct ini *in = g_new0(struct ini, 1);
	g_autofree char *yaml =
		options_yaml(c->opts, c->name, c->shim ? c->shim_path : c->plugin, transfer);
	struct te_engine_opts o = {
		.size = sizeof(o),
		.config_yaml = yaml,
		.config_yaml_len = strlen(yaml),
		.config_name = "te-conformance initiator",
		.log_fn = engine_log,
		.log_level = -1,
	};
	enum te_status st = te_engine_new(&o, &in->e);
	char why[256];

	if (st != TE_OK) {
		g_snprintf(run.err, sizeof(run.err), "te_engine_new: %s: %s", te_status_str(st),
			   te_last_error());
		g_free(in);
		return NULL;
	}
	st = te_mem_alloc(in->e, run.local_location, LLEN, (void **)&in->mem);
	if (st == TE_OK)
		st = te_mem_register(in->e, in->mem, LLEN, run.local_location, TE_MEM_LOCAL);
	if (st != TE_OK) {
		g_snprintf(run.err, sizeof(run.err), "local buffer at %s: %s: %s",
			   run.local_location, te_status_str(st), te_last_error());
		ini_free(in);
		return NULL;
	}
	if (!membuf_init(&in->local, in->e, in->mem, LLEN, LSHIFT,
			 strncmp(run.local_location, "cpu", 3) != 0, why, sizeof(why))) {
		g_snprintf(run.err, sizeof(run.err), "%s", why);
		ini_free(in);
		return NULL;
	}
	return in;
}

static bool ini_open(struct ini *in, struct target *t)
{
	enum te_status st = te_segment_open(in->e, t->segment, &in->seg);

	if (st != TE_OK) {
		g_snprintf(run.err, sizeof(run.err), "te_segment_open(%s): %s: %s", t->segment,
			   te_status_str(st), te_last_error());
		return false;
	}
	in->has_seg = true;
	return true;
}

static struct target *start_target(void)
{
	struct target *t = target_start(run.c, run.err, sizeof(run.err));

	if (t)
		track_target(t, true);
	return t;
}

static void stop_target(struct target *t)
{
	if (!t)
		return;
	track_target(t, false);
	target_stop(t);
}

/* --- requests and batches --------------------------------------------------------------------- */

static struct te_request req(struct ini *in, struct target *t, enum te_opcode op, uint64_t x,
			     uint64_t len)
{
	struct te_request r = {
		.opcode = op,
		.segment = in->seg,
		.local = in->mem + LOCAL_OF(x),
		.remote = t->base + x,
		.length = len,
	};

	return r;
}

/* Outcome of one batch. */
struct outcome {
	enum te_status submit;
	enum te_status wait;
	uint32_t n;
	struct te_task_info *ti;
	uint32_t completed, failed, timed_out, canceled, invalid;
	uint64_t retries;
};

static void outcome_free(struct outcome *o)
{
	g_free(o->ti);
	memset(o, 0, sizeof(*o));
}

static const char *state_word(enum te_state s)
{
	return te_state_str(s);
}

/* Submit @n requests as one batch, optionally cancel at once, wait, read every task. */
static bool batch_run(struct ini *in, const struct te_request *reqs, uint32_t n, bool cancel,
		      struct outcome *o)
{
	te_batch_id b;
	enum te_status st;

	memset(o, 0, sizeof(*o));
	st = te_batch_new(in->e, n, &b);
	if (st != TE_OK) {
		g_snprintf(run.err, sizeof(run.err), "te_batch_new(%u): %s: %s", n,
			   te_status_str(st), te_last_error());
		return false;
	}
	o->submit = te_batch_submit(in->e, b, reqs, n);
	if (cancel)
		discard(te_batch_cancel(in->e, b));
	o->wait = te_batch_wait(in->e, b, -1);
	o->n = n;
	o->ti = g_new0(struct te_task_info, n);
	for (uint32_t i = 0; i < n; i++) {
		discard(te_task_status(in->e, b, i, &o->ti[i]));
		o->retries += o->ti[i].retries;
		switch (o->ti[i].state) {
		case TE_STATE_COMPLETED:
			o->completed++;
			break;
		case TE_STATE_FAILED:
			o->failed++;
			break;
		case TE_STATE_TIMEOUT:
			o->timed_out++;
			break;
		case TE_STATE_CANCELED:
			o->canceled++;
			break;
		default:
			o->invalid++;
			break;
		}
	}
	st = te_batch_free(in->e, b);
	if (st != TE_OK) {
		g_snprintf(run.err, sizeof(run.err), "te_batch_free: %s: %s", te_status_str(st),
			   te_last_error());
		return false;
	}
	return true;
}

/* The first task that did not complete, as text (for a FAIL line), or NULL. */
static char *first_incomplete(const struct outcome *o, const struct te_request *reqs)
{
	for (uint32_t i = 0; i < o->n; i++) {
		const struct te_task_info *ti = &o->ti[i];

		if (ti->state == TE_STATE_COMPLETED && ti->bytes == ti->length)
			continue;
		return g_strdup_printf(
			"task %u (%s of %" PRIu64 " bytes) ended %s with %s (%s)%s%s", i,
			reqs[i].opcode == TE_OP_READ ? "READ" : "WRITE", reqs[i].length,
			state_word(ti->state), te_status_str(ti->status), ti->detail,
			ti->state == TE_STATE_COMPLETED ? ", bytes " : "",
			ti->state == TE_STATE_COMPLETED ? "short" : "");
	}
	return NULL;
}

/* Fill / check helpers; false with why in run.err. */
static bool tfill(struct target *t, uint64_t x, uint64_t len, uint64_t seed)
{
	if (target_cmd(t, "fill %" PRIu64 " %" PRIu64 " %" PRIu64, x, len, seed))
		return true;
	g_snprintf(run.err, sizeof(run.err), "target fill: %s", t->reply);
	return false;
}

static bool tcheck(struct target *t, uint64_t x, uint64_t len, uint64_t seed, const char *what)
{
	if (!len || target_cmd(t, "check %" PRIu64 " %" PRIu64 " %" PRIu64, x, len, seed))
		return true;
	g_snprintf(run.err, sizeof(run.err), "%s: target %s", what, t->reply);
	return false;
}

static bool teither(struct target *t, uint64_t x, uint64_t len, uint64_t a, uint64_t b,
		    const char *what)
{
	if (!len ||
	    target_cmd(t, "either %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, x, len, a, b))
		return true;
	g_snprintf(run.err, sizeof(run.err), "%s: target %s", what, t->reply);
	return false;
}

static bool tsum(struct target *t, uint64_t x, uint64_t len, uint64_t *sum)
{
	if (target_cmd(t, "sum %" PRIu64 " %" PRIu64, x, len) &&
	    sscanf(t->reply, "sum %" SCNx64, sum) == 1)
		return true;
	g_snprintf(run.err, sizeof(run.err), "target sum: %s", t->reply);
	return false;
}

/* Local [x, +len) in target offsets; clipped to the local buffer. */
static bool lfill(struct ini *in, uint64_t x, uint64_t len, uint64_t seed)
{
	char why[256];

	if (membuf_fill(&in->local, LOCAL_OF(x), len, seed, why, sizeof(why)))
		return true;
	g_snprintf(run.err, sizeof(run.err), "local fill: %s", why);
	return false;
}

static bool lcheck(struct ini *in, uint64_t x, uint64_t len, uint64_t a, uint64_t b, bool either,
		   const char *what)
{
	struct membuf_diff d = { 0 };

	if (!len || membuf_check(&in->local, LOCAL_OF(x), len, a, b, either, &d) == MEMBUF_OK)
		return true;
	g_snprintf(run.err, sizeof(run.err), "%s: local %s", what, d.why);
	return false;
}

static bool op_ok(enum te_opcode op)
{
	return op == TE_OP_READ ? run.can_read : run.can_write;
}

/* --- the checks --------------------------------------------------------------------------- */

static const struct {
	uint64_t len;
	const char *name;
} sizes[] = {
	{ 1, "1" },
	{ 7, "7" },
	{ 4095, "4095" },
	{ 4096, "4096" },
	{ 65537, "65537" },
	{ MIB + 3, "1MiB+3" },
	{ 64 * MIB, "64MiB" },
};

/* One READ or WRITE of sizes[k] at an odd offset, checked byte for byte with its margins. */
static void check_size(size_t k, enum te_opcode op)
{
	struct ini *in = run.ini;
	struct target *t = run.t;
	uint64_t len = sizes[k].len;
	uint64_t x = len >= 64 * MIB ? G + 5 : G + k * MIB + 2 * k + 1;
	uint64_t a = MAX(G, x - 4096), b = MIN(G + R, x + len + 4096);
	uint64_t la = MAX(a, (uint64_t)LSHIFT), seed_t = 100 + k, seed_x = 200 + k;
	g_autofree char *name =
		g_strdup_printf("%s-%s", op == TE_OP_READ ? "read" : "write", sizes[k].name);
	struct te_request r = req(in, t, op, x, len);
	struct outcome o;
	g_autofree char *bad = NULL;
	gint64 t0;

	if (!report_wanted(name))
		return;
	if (!op_ok(op)) {
		report_skip(name, "the plugin does not do %s (caps.ops)",
			    op == TE_OP_READ ? "READ" : "WRITE");
		return;
	}
	report_watch(name, run.c->hang_s);
	/* WRITE: target old (seed_t), local new (seed_x); READ: target new, local old. */
	if (!tfill(t, a, b - a, op == TE_OP_WRITE ? seed_t : seed_x) ||
	    !lfill(in, la, b - la, op == TE_OP_WRITE ? seed_x : seed_t))
		goto fail;
	t0 = g_get_monotonic_time();
	if (!batch_run(in, &r, 1, false, &o))
		goto fail;
	if (op == TE_OP_WRITE && len == 64 * MIB)
		run.t64_s = (double)(g_get_monotonic_time() - t0) / 1e6;
	bad = first_incomplete(&o, &r);
	if (!bad && o.ti[0].transport && strcmp(o.ti[0].transport, run.c->name) != 0)
		bad = g_strdup_printf("moved by transport '%s', not '%s'", o.ti[0].transport,
				      run.c->name);
	outcome_free(&o);
	if (bad) {
		report_unwatch();
		report_fail(name, "%s", bad);
		return;
	}
	if (op == TE_OP_WRITE) {
		if (!tcheck(t, x, len, seed_x, "the bytes written") ||
		    !tcheck(t, a, x - a, seed_t, "the bytes before the range") ||
		    !tcheck(t, x + len, b - x - len, seed_t, "the bytes after the range"))
			goto fail;
	} else {
		if (!lcheck(in, x, len, seed_x, 0, false, "the bytes read") ||
		    !lcheck(in, la, x - la, seed_t, 0, false, "the bytes before the range") ||
		    !lcheck(in, x + len, b - x - len, seed_t, 0, false,
			    "the bytes after the range"))
			goto fail;
	}
	report_unwatch();
	report_ok(name, "(remote offset +%" PRIu64 ", local offset +%" PRIu64 ")", x - G,
		  LOCAL_OF(x));
	return;
fail:
	report_unwatch();
	report_fail(name, "%s", run.err);
}

/* 1000 requests of 1 B to 64 KiB with gaps between them, in one batch. */
static void check_batch(enum te_opcode op)
{
	const char *name = op == TE_OP_READ ? "batch-1000-read" : "batch-1000-write";
	struct ini *in = run.ini;
	struct target *t = run.t;
	struct te_request *reqs;
	uint64_t *xs, *ls, cur = G + 3, seed_t = 300, seed_x = 301;
	struct outcome o;
	g_autofree char *bad = NULL;
	const uint32_t n = 1000;

	if (!report_wanted(name))
		return;
	if (!op_ok(op)) {
		report_skip(name, "the plugin does not do %s", op == TE_OP_READ ? "READ" : "WRITE");
		return;
	}
	report_watch(name, run.c->hang_s);
	reqs = g_new(struct te_request, n);
	xs = g_new(uint64_t, n);
	ls = g_new(uint64_t, n);
	for (uint32_t i = 0; i < n; i++) {
		xs[i] = cur;
		ls[i] = 1 + ((uint64_t)i * 7919 + 13) % 65536;
		reqs[i] = req(in, t, op, xs[i], ls[i]);
		cur += ls[i] + 1 + i % 61;
	}
	if (!tfill(t, G, R, op == TE_OP_WRITE ? seed_t : seed_x) ||
	    !lfill(in, G, R, op == TE_OP_WRITE ? seed_x : seed_t))
		goto fail;
	if (!batch_run(in, reqs, n, false, &o))
		goto fail;
	bad = first_incomplete(&o, reqs);
	outcome_free(&o);
	if (bad) {
		g_snprintf(run.err, sizeof(run.err), "%s", bad);
		goto fail;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t gap_end = i + 1 < n ? xs[i + 1] : cur;
		g_autofree char *what = g_strdup_printf("request %u", i);
		g_autofree char *after = g_strdup_printf("the gap after request %u", i);
		bool ok = op == TE_OP_WRITE
				  ? tcheck(t, xs[i], ls[i], seed_x, what) &&
					    tcheck(t, xs[i] + ls[i], gap_end - xs[i] - ls[i],
						   seed_t, after)
				  : lcheck(in, xs[i], ls[i], seed_x, 0, false, what) &&
					    lcheck(in, xs[i] + ls[i], gap_end - xs[i] - ls[i],
						   seed_t, 0, false, after);

		if (!ok)
			goto fail;
	}
	report_unwatch();
	report_ok(name, "(%" PRIu64 " bytes in 1000 requests, gaps untouched)", cur - G - 3);
	g_free(reqs);
	g_free(xs);
	g_free(ls);
	return;
fail:
	report_unwatch();
	report_fail(name, "%s", run.err);
	g_free(reqs);
	g_free(xs);
	g_free(ls);
}

/* Far more slices in flight than any plugin queues: 2 x 8192 requests of 4 KiB. */
static void check_backpressure(void)
{
	const char *name = "back-pressure";
	const uint32_t n = 8192;
	const uint64_t wx = G + 1, rx = G + 1 + 32 * MIB + 4096, len = 4096;
	struct ini *in = run.ini;
	struct target *t = run.t;
	struct te_request *w = NULL, *rd = NULL;
	struct conf_shim_stats s0, s1;
	te_batch_id bw = 0, br = 0;
	bool have_w = false, have_r = false, ok = false;
	struct te_batch_info bi;
	char extra[160] = "";

	if (!report_wanted(name))
		return;
	report_watch(name, run.c->hang_s);
	shim_stats(&s0);
	w = g_new(struct te_request, n);
	rd = g_new(struct te_request, n);
	for (uint32_t i = 0; i < n; i++) {
		w[i] = req(in, t, TE_OP_WRITE, wx + i * len, len);
		rd[i] = req(in, t, TE_OP_READ, rx + i * len, len);
	}
	if (!tfill(t, wx, n * len, 400) || !tfill(t, rx, n * len, 401) ||
	    !lfill(in, wx, n * len, 402) || !lfill(in, rx, n * len, 403))
		goto out;
	/* Both batches are submitted before either is waited for. */
	if (run.can_write) {
		have_w = te_batch_new(in->e, n, &bw) == TE_OK;
		if (!have_w || te_batch_submit(in->e, bw, w, n) != TE_OK) {
			g_snprintf(run.err, sizeof(run.err), "submitting %u WRITEs: %s", n,
				   te_last_error());
			goto out;
		}
	}
	if (run.can_read) {
		have_r = te_batch_new(in->e, n, &br) == TE_OK;
		if (!have_r || te_batch_submit(in->e, br, rd, n) != TE_OK) {
			g_snprintf(run.err, sizeof(run.err), "submitting %u READs: %s", n,
				   te_last_error());
			goto out;
		}
	}
	for (int k = 0; k < 2; k++) {
		te_batch_id b = k ? br : bw;

		if (!(k ? have_r : have_w))
			continue;
		discard(te_batch_wait(in->e, b, -1));
		if (te_batch_status(in->e, b, &bi) != TE_OK || bi.completed != n) {
			struct te_task_info ti = { 0 };

			for (uint32_t i = 0; i < n; i++) {
				discard(te_task_status(in->e, b, i, &ti));
				if (ti.state != TE_STATE_COMPLETED)
					break;
			}
			g_snprintf(run.err, sizeof(run.err),
				   "%u of %u %s requests completed; one ended %s: %s (%s)",
				   bi.completed, n, k ? "READ" : "WRITE", state_word(ti.state),
				   te_status_str(ti.status), ti.detail);
			goto out;
		}
	}
	if (have_w && !tcheck(t, wx, n * len, 402, "the WRITEs"))
		goto out;
	if (have_r && !lcheck(in, rx, n * len, 401, 0, false, "the READs"))
		goto out;
	shim_stats(&s1);
	if (shim_on())
		g_snprintf(extra, sizeof(extra),
			   "; the plugin held at most %" PRIu64 " at once and accepted %" PRIu64
			   " of %" PRIu64 " offered, %" PRIu64 " submits took none",
			   s1.owned_max, s1.accepted - s0.accepted, s1.offered - s0.offered,
			   s1.zero_accepts - s0.zero_accepts);
	ok = true;
out:
	if (have_w)
		discard(te_batch_free(in->e, bw));
	if (have_r)
		discard(te_batch_free(in->e, br));
	report_unwatch();
	if (ok)
		report_ok(name, "(%u slices of 4 KiB in flight, all complete and right%s)",
			  (have_w + have_r) * n, extra);
	else
		report_fail(name, "%s", run.err);
	g_free(w);
	g_free(rd);
}

/* Submit, te_batch_cancel at once, many rounds: COMPLETED (right bytes) or CANCELED only. */
static void check_cancel_race(void)
{
	const char *name = "cancel-race";
	static const uint64_t lens[] = { 4096, (256u << 10) + 1, MIB + 3, 4 * MIB };
	const unsigned rounds = 80;
	struct ini *in = run.ini;
	struct target *t = run.t;
	struct conf_shim_stats s0, s1;
	uint64_t wx = G + 1, rx = G + 32 * MIB + 1, span = 0;
	unsigned completed = 0, canceled = 0;
	guint mark = log_mark();
	g_autofree char *late = NULL;

	if (!report_wanted(name))
		return;
	report_watch(name, run.c->hang_s);
	shim_stats(&s0);
	for (size_t i = 0; i < G_N_ELEMENTS(lens); i++)
		span += lens[i] + 7;
	if (run.can_read && !tfill(t, rx, span, 500))
		goto fail;
	for (unsigned r = 0; r < rounds; r++) {
		enum te_opcode op =
			(r % 2 && run.can_read) || !run.can_write ? TE_OP_READ : TE_OP_WRITE;
		uint64_t base = op == TE_OP_WRITE ? wx : rx, x = base;
		uint64_t seed_old = 1000 + r, seed_new = op == TE_OP_WRITE ? 2000 + r : 500;
		struct te_request reqs[G_N_ELEMENTS(lens)];
		uint64_t xs[G_N_ELEMENTS(lens)];
		struct conf_shim_modes m = { .cancel_delay_us = (r / 2) % 2 ? 300 : 0 };
		struct outcome o;

		shim_modes(&m);
		for (size_t i = 0; i < G_N_ELEMENTS(lens); i++) {
			xs[i] = x;
			reqs[i] = req(in, t, op, x, lens[i]);
			x += lens[i] + 7;
		}
		if (op == TE_OP_WRITE
			    ? !tfill(t, base, span, seed_old) || !lfill(in, base, span, seed_new)
			    : !lfill(in, base, span, seed_old))
			goto fail;
		if (!batch_run(in, reqs, G_N_ELEMENTS(lens), true, &o))
			goto fail;
		for (size_t i = 0; i < G_N_ELEMENTS(lens); i++) {
			const struct te_task_info *ti = &o.ti[i];
			bool ok;

			if (ti->state == TE_STATE_COMPLETED) {
				completed++;
				ok = op == TE_OP_WRITE ? tcheck(t, xs[i], lens[i], seed_new,
								"a COMPLETED WRITE")
						       : lcheck(in, xs[i], lens[i], seed_new, 0,
								false, "a COMPLETED READ");
			} else if (ti->state == TE_STATE_CANCELED) {
				canceled++;
				ok = op == TE_OP_WRITE ? teither(t, xs[i], lens[i], seed_old,
								 seed_new, "a CANCELED WRITE")
						       : lcheck(in, xs[i], lens[i], seed_old,
								seed_new, true, "a CANCELED READ");
			} else {
				g_snprintf(
					run.err, sizeof(run.err),
					"round %u: task %zu (%s) ended %s with %s (%s); a canceled "
					"batch's tasks end COMPLETED or CANCELED",
					r, i, op == TE_OP_READ ? "READ" : "WRITE",
					state_word(ti->state), te_status_str(ti->status),
					ti->detail);
				ok = false;
			}
			/* Nothing lands between the requests. */
			if (ok)
				ok = op == TE_OP_WRITE
					     ? tcheck(t, xs[i] + lens[i], 7, seed_old, "a gap")
					     : lcheck(in, xs[i] + lens[i], 7, seed_old, 0, false,
						      "a gap");
			if (!ok) {
				outcome_free(&o);
				goto fail;
			}
		}
		outcome_free(&o);
	}
	shim_modes(NULL);
	shim_stats(&s1);
	late = log_find(mark, "did not hand the slice back");
	report_unwatch();
	if (late) {
		report_fail(name, "a canceled slice was not handed back within cancel_grace_ms: %s",
			    late);
		return;
	}
	report_ok(name, "(%u rounds: %u tasks completed, %u canceled%s)", rounds, completed,
		  canceled,
		  shim_on() ? (s1.cancels_after_done > s0.cancels_after_done
				       ? "; some cancels reached slices the plugin no longer held"
				       : "; every cancel reached a slice the plugin held")
			    : "");
	return;
fail:
	shim_modes(NULL);
	report_unwatch();
	report_fail(name, "%s", run.err);
}

/* READs and WRITEs of 64 KiB, every one checked: used by the fault checks. */
static bool verified_batch(struct ini *in, struct target *t, unsigned n, uint64_t seed,
			   struct outcome *o_out, bool keep)
{
	const uint64_t len = 65536 + 3;
	struct te_request *reqs = g_new(struct te_request, 2 * n);
	uint64_t x = G + 11;
	unsigned k = 0;
	struct outcome o;
	g_autofree char *bad = NULL;
	bool ok = false;

	for (unsigned i = 0; i < n; i++) {
		if (run.can_write)
			reqs[k++] = req(in, t, TE_OP_WRITE, x + i * (2 * len + 64), len);
		if (run.can_read)
			reqs[k++] = req(in, t, TE_OP_READ, x + i * (2 * len + 64) + len + 32, len);
	}
	if (!tfill(t, x, n * (2 * len + 64), seed) || !lfill(in, x, n * (2 * len + 64), seed + 1))
		goto out;
	if (!batch_run(in, reqs, k, false, &o))
		goto out;
	bad = first_incomplete(&o, reqs);
	if (bad) {
		g_snprintf(run.err, sizeof(run.err), "%s", bad);
		outcome_free(&o);
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		uint64_t wx = x + i * (2 * len + 64);

		if (run.can_write && !tcheck(t, wx, len, seed + 1, "a WRITE"))
			goto out_o;
		if (run.can_read && !lcheck(in, wx + len + 32, len, seed, 0, false, "a READ"))
			goto out_o;
	}
	ok = true;
out_o:
	if (keep && ok)
		*o_out = o;
	else
		outcome_free(&o);
out:
	g_free(reqs);
	return ok;
}

/*
 * The injection checks' common part, for @name (wanted, the shim on): @n verified
 * WRITE+READ pairs (seed @seed) with every @every-th successful completion failed as
 * TE_ERR_TRANSIENT; *@o (NULL: not kept) and the shim's stats before and after. Then it
 * waits for a quarantined device to come back. False when done (reported skip or fail).
 */
static bool injected_batch(const char *name, uint32_t every, unsigned n, uint64_t seed,
			   struct outcome *o, struct conf_shim_stats *s0,
			   struct conf_shim_stats *s1)
{
	struct conf_shim_modes m = { .inject_every = every };
	bool ok;

	if (!report_wanted(name))
		return false;
	if (!shim_on()) {
		report_skip(name, "needs the shim (fault injection); --no-shim was given");
		return false;
	}
	report_watch(name, run.c->hang_s);
	shim_stats(s0);
	shim_modes(&m);
	ok = verified_batch(run.ini, run.t, n, seed, o, o != NULL);
	shim_modes(NULL);
	shim_stats(s1);
	report_unwatch();
	/* The failures may have quarantined a device: let it come back. */
	g_usleep((QUARANTINE_MS + 100) * 1000);
	if (!ok)
		report_fail(name, "with injected retryable failures (every %u): %s", every,
			    run.err);
	return ok;
}

/* Every 4th successful completion is reported as TE_ERR_TRANSIENT: the core retries. */
static void check_retry(void)
{
	const char *name = "retry";
	struct conf_shim_stats s0, s1;
	struct outcome o;

	if (!injected_batch(name, 4, 100, 600, &o, &s0, &s1))
		return;
	if (s1.injected == s0.injected)
		report_skip(name, "no failure could be injected");
	else if (o.retries == 0)
		report_fail(name, "%" PRIu64 " failures were injected but no task was retried",
			    s1.injected - s0.injected);
	else
		report_ok(name,
			  "(%" PRIu64 " injected TE_ERR_TRANSIENT, %" PRIu64 " retries, %" PRIu64
			  " retry_prepare calls; all bytes right)",
			  s1.injected - s0.injected, o.retries,
			  s1.retry_prepares - s0.retry_prepares);
	outcome_free(&o);
}

/*
 * Every successful completion of a slice's first CONF_SHIM_INJECT_ATTEMPTS attempts is
 * reported as TE_ERR_TRANSIENT: each slice is retried that often, then lands, right.
 */
static void check_retry_repeated(void)
{
	const char *name = "retry-repeated";
	struct conf_shim_stats s0, s1;
	uint64_t slices = 0;
	struct outcome o;

	if (!injected_batch(name, 1, 20, 650, &o, &s0, &s1))
		return;
	for (uint32_t i = 0; i < o.n; i++) {
		slices += o.ti[i].slices;
		if (o.ti[i].retries < CONF_SHIM_INJECT_ATTEMPTS * o.ti[i].slices) {
			report_fail(name,
				    "task %u (%u slice%s) was retried %u times; each slice's first "
				    "%u attempts were failed",
				    i, o.ti[i].slices, o.ti[i].slices == 1 ? "" : "s",
				    o.ti[i].retries, CONF_SHIM_INJECT_ATTEMPTS);
			outcome_free(&o);
			return;
		}
	}
	if (s1.injected - s0.injected < CONF_SHIM_INJECT_ATTEMPTS * slices)
		report_fail(name,
			    "%" PRIu64 " failures injected for %" PRIu64 " slices: fewer than %u "
			    "each",
			    s1.injected - s0.injected, slices, CONF_SHIM_INJECT_ATTEMPTS);
	else
		report_ok(name,
			  "(%u tasks, %" PRIu64 " slices, each failed on its first %u attempts: "
			  "%" PRIu64 " retries, all bytes right)",
			  o.n, slices, CONF_SHIM_INJECT_ATTEMPTS, o.retries);
	outcome_free(&o);
}

/* After retry: did the core pass excluded devices, and did attempts complete elsewhere? */
static void check_retry_excluded(void)
{
	const char *name = "retry-excluded-device";
	struct conf_shim_stats s0, s1;

	if (!report_wanted(name))
		return;
	if (run.c->n_devices < 2) {
		report_skip(name, "the plugin reports %u device%s: nothing to exclude",
			    run.c->n_devices, run.c->n_devices == 1 ? "" : "s");
		return;
	}
	if (run.c->caps.flags & TE_PLUGIN_CAP_FIXED_DEVICES) {
		report_skip(name, "caps say TE_PLUGIN_CAP_FIXED_DEVICES (the memory decides the "
				  "device): the core excludes none");
		return;
	}
	if (!injected_batch(name, 3, 60, 700, NULL, &s0, &s1))
		return;
	if (s1.retry_prepares_excluding == s0.retry_prepares_excluding)
		report_fail(
			name,
			"%" PRIu64 " failures were injected on a plugin with %u devices, but "
			"retry_prepare never saw a device in excluded_devices (the core's part)",
			s1.injected - s0.injected, run.c->n_devices);
	else
		report_ok(name,
			  "(%" PRIu64 " retries told to avoid the failed device, %" PRIu64
			  " attempts under exclusion completed; each checked against its mask: "
			  "contract-excluded-devices)",
			  s1.retry_prepares_excluding - s0.retry_prepares_excluding,
			  s1.excluded_completions - s0.excluded_completions);
}

/* host->mark_failed(DEVICE) in the middle of a batch; later transfers avoid or reuse it. */
static void check_mark_failed(void)
{
	const char *name = "mark-failed";
	struct conf_shim_modes m = { .mark_device_next = true };
	struct conf_shim_stats s0, s1;

	if (!report_wanted(name))
		return;
	if (!shim_on()) {
		report_skip(name, "needs the shim (it calls mark_failed); --no-shim was given");
		return;
	}
	report_watch(name, run.c->hang_s);
	shim_stats(&s0);
	shim_modes(&m);
	if (!verified_batch(run.ini, run.t, 10, 800, NULL, false) ||
	    !verified_batch(run.ini, run.t, 50, 810, NULL, false)) {
		shim_modes(NULL);
		report_unwatch();
		report_fail(name, "after mark_failed(DEVICE): %s", run.err);
		return;
	}
	shim_modes(NULL);
	shim_stats(&s1);
	report_unwatch();
	if (s1.marks == s0.marks)
		report_skip(name, "mark_failed could not be called (no successful completion)");
	else if (run.c->n_devices < 2)
		report_ok(name, "(one device: quarantining it leaves it in use; every transfer "
				"completed with the right bytes)");
	else if (run.c->caps.flags & TE_PLUGIN_CAP_FIXED_DEVICES)
		report_ok(name, "(fixed devices: a quarantined device stays the memory's path; "
				"every transfer completed with the right bytes)");
	else
		report_ok(name,
			  "(a device quarantined for %u ms; %" PRIu64
			  " later attempts were told to "
			  "avoid it, see contract-excluded-devices; all bytes right)",
			  QUARANTINE_MS, s1.excluded_completions - s0.excluded_completions);
	g_usleep((QUARANTINE_MS + 100) * 1000);
}

/* host->peer_event(DOWN): the core quarantines the peer; transfers resume afterwards. */
static void check_peer_event(void)
{
	const char *name = "peer-event";
	struct conf_shim_modes m = { .peer_down_next = true };
	struct conf_shim_stats s0, s1;
	struct ini *in = run.ini;
	struct target *t = run.t;
	struct te_request r = req(in, t, run.can_read ? TE_OP_READ : TE_OP_WRITE, G + 100, 4096);
	struct outcome o;
	char during[200] = "";

	if (!report_wanted(name))
		return;
	if (!shim_on()) {
		report_skip(name, "needs the shim (it calls peer_event); --no-shim was given");
		return;
	}
	report_watch(name, run.c->hang_s);
	shim_stats(&s0);
	shim_modes(&m);
	if (!verified_batch(in, t, 5, 900, NULL, false)) {
		shim_modes(NULL);
		report_unwatch();
		report_fail(name, "the batch during which peer_event(DOWN) came: %s", run.err);
		return;
	}
	shim_modes(NULL);
	shim_stats(&s1);
	/* Right after DOWN: the core refuses the peer for quarantine_ms (its rule, not checked). */
	if (s1.peer_downs > s0.peer_downs && batch_run(in, &r, 1, false, &o)) {
		g_snprintf(during, sizeof(during), "; a request right after it ended %s (%s)",
			   state_word(o.ti[0].state), te_status_str(o.ti[0].status));
		outcome_free(&o);
	}
	g_usleep((QUARANTINE_MS + 100) * 1000);
	if (!verified_batch(in, t, 10, 910, NULL, false)) {
		report_unwatch();
		report_fail(name, "transfers after the peer's quarantine ended: %s", run.err);
		return;
	}
	report_unwatch();
	if (s1.peer_downs == s0.peer_downs)
		report_skip(name, "peer_event could not be called (no successful completion)");
	else
		report_ok(name,
			  "(peer_event(DOWN) quarantined the peer%s; transfers resumed after "
			  "%u ms)",
			  during, QUARANTINE_MS);
}

static bool status_in(enum te_status st, const enum te_status *set, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (st == set[i])
			return true;
	return false;
}

/* A request the core must refuse at submit; the plugin never sees it. */
static void bad_request(const char *name, struct te_request r, const enum te_status *allowed,
			size_t n_allowed)
{
	struct outcome o;
	GString *want = g_string_new(NULL);

	if (!report_wanted(name)) {
		g_string_free(want, TRUE);
		return;
	}
	if (!op_ok(r.opcode))
		r.opcode = r.opcode == TE_OP_READ ? TE_OP_WRITE : TE_OP_READ;
	for (size_t i = 0; i < n_allowed; i++)
		g_string_append_printf(want, "%s%s", i ? " or " : "", te_status_str(allowed[i]));
	report_watch(name, run.c->hang_s);
	if (!batch_run(run.ini, &r, 1, false, &o)) {
		report_unwatch();
		report_fail(name, "%s", run.err);
	} else if (o.ti[0].state == TE_STATE_COMPLETED || o.submit == TE_OK) {
		report_unwatch();
		report_fail(name,
			    "accepted (submit %s, task %s %s); want a refusal at submit with %s",
			    te_status_str(o.submit), state_word(o.ti[0].state),
			    te_status_str(o.ti[0].status), want->str);
	} else if (!status_in(o.ti[0].status, allowed, n_allowed) || !o.ti[0].detail[0]) {
		report_unwatch();
		report_fail(name, "refused with %s (%s); want %s with a detail",
			    te_status_str(o.ti[0].status), o.ti[0].detail, want->str);
	} else {
		report_unwatch();
		report_ok(name, "(%s: %s)", te_status_str(o.ti[0].status), o.ti[0].detail);
	}
	if (o.ti)
		outcome_free(&o);
	g_string_free(want, TRUE);
}

static void check_bad_input(void)
{
	static const enum te_status remote[] = { TE_ERR_REMOTE_ACCESS, TE_ERR_OUT_OF_RANGE,
						 TE_ERR_NOT_REGISTERED };
	static const enum te_status wrap[] = { TE_ERR_OVERFLOW, TE_ERR_REMOTE_ACCESS,
					       TE_ERR_INVALID_ARG, TE_ERR_OUT_OF_RANGE };
	static const enum te_status local[] = { TE_ERR_NOT_REGISTERED, TE_ERR_OUT_OF_RANGE };
	static const enum te_status zero[] = { TE_ERR_INVALID_ARG };
	struct ini *in = run.ini;
	struct target *t = run.t;
	uint64_t s0 = 0, s1 = 0;
	uint8_t stray[64];
	struct te_request r;
	bool have_sum;

	have_sum = tsum(t, 0, 2 * G + R, &s0);
	bad_request("bad-input-remote-past-end", req(in, t, TE_OP_WRITE, G + R - 100, 200), remote,
		    G_N_ELEMENTS(remote));
	bad_request("bad-input-remote-before-start", req(in, t, TE_OP_WRITE, G - 1, 100), remote,
		    G_N_ELEMENTS(remote));
	r = req(in, t, TE_OP_WRITE, G, 100);
	r.remote = t->base + 100; /* in the guard zone before the region */
	bad_request("bad-input-remote-unregistered", r, remote, G_N_ELEMENTS(remote));
	r = req(in, t, TE_OP_READ, G, 100);
	r.remote = UINT64_MAX - 10;
	bad_request("bad-input-remote-wrap", r, wrap, G_N_ELEMENTS(wrap));
	r = req(in, t, TE_OP_READ, G, sizeof(stray));
	r.local = stray;
	bad_request("bad-input-local-unregistered", r, local, G_N_ELEMENTS(local));
	r = req(in, t, TE_OP_WRITE, G, 100);
	r.local = in->mem + LLEN - 10;
	bad_request("bad-input-local-past-end", r, local, G_N_ELEMENTS(local));
	r = req(in, t, TE_OP_READ, G, 0);
	bad_request("bad-input-zero-length", r, zero, G_N_ELEMENTS(zero));

	if (!report_wanted("bad-input-target-untouched"))
		return;
	if (!have_sum || !tsum(t, 0, 2 * G + R, &s1))
		report_fail("bad-input-target-untouched", "%s", run.err);
	else if (s0 != s1)
		report_fail("bad-input-target-untouched",
			    "the target's bytes changed although every request was refused");
	else
		report_ok("bad-input-target-untouched", "(region and guard zones)");
}

/*
 * A slice reaches the plugin with its remote address moved by @delta (the shim forges it):
 * half of it lies outside the remote key's region. The plugin must refuse it (a non-OK
 * report) and the target's guard bytes must stay as they were.
 */
static void check_forged(const char *name, enum te_opcode op, bool past_end)
{
	struct ini *in = run.ini;
	struct target *t = run.t;
	uint64_t max = run.c->caps.max_slice_size;
	uint64_t len = max && max < 4096 ? max & ~1ull : 4096;
	uint64_t x = past_end ? G + R - len : G;
	int64_t delta = past_end ? (int64_t)len / 2 : -(int64_t)len / 2;
	struct conf_shim_modes m = { .forge_delta = delta,
				     .forge_opcode = op == TE_OP_READ ? TE_PLUGIN_OP_READ
								      : TE_PLUGIN_OP_WRITE };
	struct conf_shim_stats s0, s1;
	struct te_request r = req(in, t, op, x, len);
	struct outcome o = { 0 };
	uint64_t gx = past_end ? G + R : 0;

	if (!report_wanted(name))
		return;
	if (!shim_on()) {
		report_skip(name, "needs the shim (it forges the slice); --no-shim was given");
		return;
	}
	if (!op_ok(op) || len < 2) {
		report_skip(name, "the plugin does not do %s", op == TE_OP_READ ? "READ" : "WRITE");
		return;
	}
	report_watch(name, run.c->hang_s);
	shim_stats(&s0);
	/* A guard zone an earlier check let the plugin damage is made whole again first. */
	if (!tfill(t, G, R, 1000) || !lfill(in, G, R, 1001) || !tfill(t, gx, G, PATTERN_GUARD))
		goto fail;
	shim_modes(&m);
	if (!batch_run(in, &r, 1, false, &o)) {
		shim_modes(NULL);
		goto fail;
	}
	shim_modes(NULL);
	shim_stats(&s1);
	if (!tcheck(t, gx, G, PATTERN_GUARD, "the guard zone")) {
		report_unwatch();
		report_fail(name,
			    "the target's bytes outside the registered region changed (a %s "
			    "whose remote range was moved %s the region by %" PRIu64 " bytes): %s",
			    op == TE_OP_READ ? "READ" : "WRITE",
			    past_end ? "past the end of" : "before", len / 2, run.err);
		outcome_free(&o);
		return;
	}
	report_unwatch();
	if (s1.forged == s0.forged || !s1.forged_done)
		report_skip(name, "the forged slice was not reported (task %s: %s)",
			    state_word(o.ti[0].state), o.ti[0].detail);
	else if (s1.forged_status == TE_OK)
		report_fail(name,
			    "the plugin reported TE_OK for a %s whose remote range [%s%" PRIu64
			    ", +%" PRIu64 ") runs %" PRIu64
			    " bytes %s its key's region (the target's "
			    "bytes outside a registered region must be unreachable)",
			    op == TE_OP_READ ? "READ" : "WRITE", past_end ? "end-" : "start-",
			    len / 2, len, len / 2, past_end ? "past" : "before");
	else
		report_ok(name, "(refused with %s: %s)", te_status_str(s1.forged_status),
			  s1.forged_detail);
	outcome_free(&o);
	return;
fail:
	report_unwatch();
	report_fail(name, "%s", run.err);
	outcome_free(&o);
}

/* A deadline of 1 ms on large transfers: TIMEOUT or COMPLETED, handed back, no late write. */
static void check_deadline(void)
{
	const char *name = "deadline";
	const uint64_t len = 16 * MIB;
	struct ini *dl;
	struct te_request reqs[4];
	uint64_t xs[4];
	unsigned n = 0, timed = 0, done = 0;
	struct outcome o = { 0 };
	guint mark = log_mark();
	g_autofree char *late = NULL;
	g_autofree char *transfer =
		g_strdup_printf("timeout_ms: 1, retries: 0, cancel_grace_ms: 2000");

	if (!report_wanted(name))
		return;
	report_watch(name, run.c->hang_s);
	dl = ini_new(transfer);
	if (!dl || !ini_open(dl, run.t))
		goto fail;
	for (unsigned i = 0; i < 4; i++) {
		enum te_opcode op = i < 2 ? TE_OP_WRITE : TE_OP_READ;

		if (!op_ok(op))
			continue;
		xs[n] = G + 1 + i * len;
		reqs[n++] = req(dl, run.t, op, G + 1 + i * len, len);
	}
	if (!tfill(run.t, G, R, 1100) || !lfill(dl, G, R, 1101))
		goto fail;
	if (!batch_run(dl, reqs, n, false, &o))
		goto fail;
	late = log_find(mark, "did not hand the slice back");
	if (late) {
		g_snprintf(run.err, sizeof(run.err),
			   "a slice was not handed back within cancel_grace_ms of its deadline: %s",
			   late);
		goto fail;
	}
	for (unsigned i = 0; i < n; i++) {
		const struct te_task_info *ti = &o.ti[i];
		bool w = reqs[i].opcode == TE_OP_WRITE;
		uint64_t a = 0, b = 1;

		if (ti->state == TE_STATE_COMPLETED) {
			done++;
			if (w ? !tcheck(run.t, xs[i], len, 1101, "a COMPLETED WRITE")
			      : !lcheck(dl, xs[i], len, 1100, 0, false, "a COMPLETED READ"))
				goto fail;
			continue;
		}
		if (ti->state != TE_STATE_TIMEOUT && ti->state != TE_STATE_CANCELED) {
			g_snprintf(run.err, sizeof(run.err),
				   "task %u ended %s with %s (%s); want TIMEOUT or COMPLETED", i,
				   state_word(ti->state), te_status_str(ti->status), ti->detail);
			goto fail;
		}
		timed++;
		if (!w)
			continue;
		/* A WRITE reported TIMEOUT never lands afterwards. */
		if (!teither(run.t, xs[i], len, 1100, 1101, "a WRITE that timed out") ||
		    !tsum(run.t, xs[i], len, &a))
			goto fail;
		g_usleep(300 * 1000);
		if (!tsum(run.t, xs[i], len, &b))
			goto fail;
		if (a != b) {
			g_snprintf(run.err, sizeof(run.err),
				   "bytes of a WRITE reported %s changed afterwards (a late write)",
				   state_word(ti->state));
			goto fail;
		}
	}
	outcome_free(&o);
	ini_free(dl);
	report_unwatch();
	if (!timed)
		report_skip(name,
			    "all %u tasks of %" PRIu64 " MiB completed within their 1 ms "
			    "deadline: the deadline path was not exercised",
			    n, len / MIB);
	else
		report_ok(name,
			  "(%u of %u tasks ended TIMEOUT, %u COMPLETED; every slice handed "
			  "back within the grace; no late write)",
			  timed, n, done);
	return;
fail:
	outcome_free(&o);
	ini_free(dl);
	report_unwatch();
	report_fail(name, "%s", run.err);
}

/* SIGKILL the target with a batch in flight; then a new target works with the same engine. */
static void check_peer_killed(void)
{
	const char *name = "peer-killed";
	const char *name2 = "peer-killed-recovery";
	const unsigned n = 64;
	struct ini *in = run.ini;
	struct target *t = run.t, *t2;
	struct te_request reqs[64];
	struct te_batch_info bi = { 0 };
	te_batch_id b;
	unsigned completed = 0, failed = 0;
	char first[300] = "";
	enum te_status st;
	te_segment_id old = in->seg;

	if (!report_wanted(name))
		return;
	report_watch(name, run.c->hang_s);
	for (unsigned i = 0; i < n; i++) {
		enum te_opcode op =
			(i % 2 && run.can_read) || !run.can_write ? TE_OP_READ : TE_OP_WRITE;

		reqs[i] = req(in, t, op, G + 1 + i * (MIB + 7), MIB);
	}
	st = te_batch_new(in->e, n, &b);
	if (st == TE_OK)
		st = te_batch_submit(in->e, b, reqs, n);
	if (st != TE_OK) {
		report_unwatch();
		report_fail(name, "submit: %s: %s", te_status_str(st), te_last_error());
		return;
	}
	/* Mid-batch: once the first task completed (or after 2 s). */
	for (int i = 0; i < 2000; i++) {
		if (te_batch_status(in->e, b, &bi) != TE_OK || bi.completed ||
		    te_state_is_terminal(bi.state))
			break;
		g_usleep(1000);
	}
	track_target(t, false);
	target_kill(t);
	discard(te_batch_wait(in->e, b, -1));
	discard(te_batch_status(in->e, b, &bi));
	for (unsigned i = 0; i < n; i++) {
		struct te_task_info ti;

		discard(te_task_status(in->e, b, i, &ti));
		if (ti.state == TE_STATE_COMPLETED) {
			completed++;
			continue;
		}
		failed++;
		if (ti.status == TE_OK || !ti.detail[0] || !te_state_is_terminal(ti.state)) {
			g_snprintf(
				run.err, sizeof(run.err),
				"task %u ended %s with %s and detail \"%s\": a failed task needs "
				"a status and a reason",
				i, state_word(ti.state), te_status_str(ti.status), ti.detail);
			discard(te_batch_free(in->e, b));
			report_unwatch();
			report_fail(name, "%s", run.err);
			return;
		}
		if (!first[0])
			g_snprintf(first, sizeof(first), "; first: %s %s: %s", state_word(ti.state),
				   te_status_str(ti.status), ti.detail);
	}
	st = te_batch_free(in->e, b);
	report_unwatch();
	if (st != TE_OK)
		report_fail(name, "te_batch_free after the batch ended: %s", te_status_str(st));
	else
		report_ok(name, "(%u tasks completed, %u failed%s)", completed, failed, first);

	if (!report_wanted(name2))
		return;
	report_watch(name2, run.c->hang_s);
	stop_target(t);
	run.t = NULL;
	st = te_segment_close(in->e, old);
	in->has_seg = false;
	t2 = start_target();
	if (!t2) {
		report_unwatch();
		report_fail(name2, "%s", run.err);
		return;
	}
	run.t = t2;
	if (!ini_open(in, t2) || !verified_batch(in, t2, 4, 1200, NULL, false)) {
		report_unwatch();
		report_fail(name2, "the same engine with a new target: %s", run.err);
		return;
	}
	report_unwatch();
	report_ok(name2,
		  "(the dead segment closed with %s; a new target opened and transfers "
		  "verified with the same engine)",
		  te_status_str(st));
}

/* te_engine_free with slices the plugin holds: fini must hand each back, TE_ERR_CANCELED. */
static void check_fini(void)
{
	const char *name = "fini-in-flight";
	struct conf_shim_modes m = { .ignore_cancel = true, .freeze_progress = true };
	struct conf_shim_stats s0, s1;
	struct ini *in = run.ini;
	struct target *t = run.t;
	unsigned k;
	struct te_request *reqs;
	te_batch_id b;
	enum te_status st;

	if (!report_wanted(name))
		return;
	/* Enough work that it cannot finish during the core's 2 s drain: ~4 s at the 64 MiB rate. */
	k = run.t64_s > 0 ? (unsigned)(4.0 / run.t64_s) + 1 : 64;
	k = CLAMP(k, 8u, 512u);
	report_watch(name, run.c->hang_s);
	shim_stats(&s0);
	reqs = g_new(struct te_request, k);
	for (unsigned i = 0; i < k; i++) {
		enum te_opcode op =
			(i % 2 && run.can_read) || !run.can_write ? TE_OP_READ : TE_OP_WRITE;

		reqs[i] = req(in, t, op, G + 1, 64 * MIB);
	}
	shim_modes(&m);
	/* A stopped target holds a two-sided transport's slices; frozen progress a MANUAL one's. */
	kill(t->pid, SIGSTOP);
	st = te_batch_new(in->e, k, &b);
	if (st == TE_OK)
		st = te_batch_submit(in->e, b, reqs, k);
	g_free(reqs);
	if (st != TE_OK) {
		kill(t->pid, SIGCONT);
		shim_modes(NULL);
		report_unwatch();
		report_fail(name, "submit: %s: %s", te_status_str(st), te_last_error());
		return;
	}
	g_usleep(50 * 1000);
	ini_free(in);
	run.ini = NULL;
	shim_modes(NULL);
	shim_stats(&s1);
	track_target(t, false);
	target_kill(t);
	stop_target(t);
	run.t = NULL;
	report_unwatch();
	if (!shim_on())
		report_ok(name, "(te_engine_free returned with %u requests of 64 MiB in flight)",
			  k);
	else if (s1.fini_owned == s0.fini_owned)
		report_skip(name,
			    "no slice was held at fini: the plugin finished %u requests of 64 "
			    "MiB within the core's 2 s drain",
			    k);
	else
		report_ok(name,
			  "(%" PRIu64 " slices held at fini: %" PRIu64
			  " handed back CANCELED, %" PRIu64
			  " completed; see contract-fini-canceled)",
			  s1.fini_owned - s0.fini_owned, s1.fini_canceled - s0.fini_canceled,
			  s1.fini_ok - s0.fini_ok);
}

/* The engine freed and created again in this process: the plugin works again. */
static void check_reload(void)
{
	const char *name = "reload";
	struct target *t;
	unsigned rounds = 2;

	if (!report_wanted(name))
		return;
	report_watch(name, run.c->hang_s);
	t = start_target();
	if (!t) {
		report_unwatch();
		report_fail(name, "%s", run.err);
		return;
	}
	for (unsigned i = 0; i < rounds; i++) {
		struct ini *in = ini_new(TRANSFER);

		if (!in || !ini_open(in, t) || !verified_batch(in, t, 4, 1300 + i, NULL, false)) {
			report_unwatch();
			report_fail(name, "engine %u of %u in this process: %s", i + 2, rounds + 1,
				    run.err);
			ini_free(in);
			stop_target(t);
			return;
		}
		ini_free(in);
	}
	stop_target(t);
	report_unwatch();
	report_ok(name,
		  "(engines freed and created again %u times in this process; transfers "
		  "verified each time)",
		  rounds);
}

/* One line per contract rule the shim checked over the whole run. */
static void check_contract(void)
{
	static const struct {
		const char *name;
		const char *what;
	} rules[CONF_RULE_COUNT] = {
		[CONF_RULE_DONE_ONCE] = { "contract-slice-done-once",
					  "slice_done exactly once per accepted attempt" },
		[CONF_RULE_ACCEPTED] = { "contract-accepted-prefix",
					 "accepted_out <= n, no report for a slice not accepted" },
		[CONF_RULE_FIELDS] = { "contract-slice-fields",
				       "read-only slice fields unchanged" },
		[CONF_RULE_OK_BYTES] = { "contract-ok-bytes", "TE_OK reports the slice's length" },
		[CONF_RULE_EXCLUDED] = { "contract-excluded-devices",
					 "attempts avoid slice->excluded_devices" },
		[CONF_RULE_CANCEL_NOT_FOUND] = { "contract-cancel-not-found",
						 "cancel of a finished slice: TE_ERR_NOT_FOUND" },
		[CONF_RULE_FINI_CANCELED] = { "contract-fini-canceled",
					      "fini hands every slice back, TE_ERR_CANCELED" },
		[CONF_RULE_HOST_ARGS] = { "contract-host-args",
					  "mark_failed and events name own devices and loaded peers" },
		[CONF_RULE_PROGRESS] = { "contract-progress-budget",
					 "progress returns at most its budget" },
	};
	struct conf_shim_stats s;

	shim_stats(&s);
	for (int i = 0; i < CONF_RULE_COUNT; i++) {
		if (!report_wanted(rules[i].name))
			continue;
		if (!shim_on()) {
			report_skip(rules[i].name, "needs the shim; --no-shim was given");
			continue;
		}
		if (s.rule_count[i]) {
			report_fail(rules[i].name, "%" PRIu64 " violation%s; first: %s",
				    s.rule_count[i], s.rule_count[i] == 1 ? "" : "s",
				    s.rule_first[i]);
			continue;
		}
		if (i == CONF_RULE_CANCEL_NOT_FOUND && !s.cancels_after_done)
			report_skip(rules[i].name, "never exercised: every cancel reached a slice "
						   "the plugin held");
		else if (i == CONF_RULE_FINI_CANCELED && !s.fini_owned)
			report_skip(rules[i].name, "never exercised: no slice was held at fini");
		else if (i == CONF_RULE_EXCLUDED && !s.excluded_completions)
			report_skip(rules[i].name,
				    "never exercised: no attempt was told to avoid a "
				    "device (one device, or no retry)");
		else if (i == CONF_RULE_PROGRESS &&
			 run.c->caps.progress != TE_PLUGIN_PROGRESS_MANUAL &&
			 !(run.c->caps.flags & TE_PLUGIN_CAP_HYBRID_PROGRESS))
			report_skip(rules[i].name, "an AUTO plugin: the core never calls progress");
		else
			report_ok(rules[i].name, "(%s: %" PRIu64 " completions checked)",
				  rules[i].what, s.completions);
	}
	if (report_wanted("core-log-plugin-bugs")) {
		g_autofree char *bug = log_find(0, "plugin bug");

		if (bug)
			report_fail("core-log-plugin-bugs", "the core logged: %s", bug);
		else
			report_ok("core-log-plugin-bugs", "(the core logged no plugin bug)");
	}
}

/* The shim: loaded by this process first, so the engines' dlopen finds the same instance. */
static bool shim_load(struct conf *c)
{
	conf_shim_api_fn fn;
	char err[512];
	void *dl;

	if (c->no_shim)
		return true;
	dl = dlopen(c->shim_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!dl) {
		report_fail("engine-shim",
			    "cannot load the shim %s: %s (set TE_CONFORMANCE_SHIM, "
			    "or run with --no-shim)",
			    c->shim_path, dlerror());
		return false;
	}
	*(void **)&fn = dlsym(dl, CONF_SHIM_API_SYMBOL);
	c->shim = fn ? fn() : NULL;
	if (!c->shim || c->shim->version != CONF_SHIM_API_VERSION) {
		c->shim = NULL;
		report_fail("engine-shim", "%s is not te-conformance's shim of this version",
			    c->shim_path);
		return false;
	}
	if (c->shim->set_plugin(c->plugin, err, sizeof(err)) != 0) {
		c->shim = NULL;
		report_fail("engine-shim", "%s", err);
		return false;
	}
	return true;
}

/* One small transfer; false with why (and what to try) in run.err. */
static bool probe_transfer(void)
{
	enum te_opcode op = run.can_read ? TE_OP_READ : TE_OP_WRITE;
	struct te_request r = req(run.ini, run.t, op, G + 1, 64);
	struct outcome o;
	g_autofree char *bad = NULL;

	if (!batch_run(run.ini, &r, 1, false, &o))
		return false;
	bad = first_incomplete(&o, &r);
	if (bad)
		g_snprintf(run.err, sizeof(run.err), "a first %s of 64 bytes: %s%s",
			   op == TE_OP_READ ? "READ" : "WRITE", bad,
			   o.ti[0].status == TE_ERR_NO_TRANSPORT
				   ? " (the plugin publishes no key for a region at this location: "
				     "try another --location)"
				   : "");
	outcome_free(&o);
	return !bad;
}

/* Where the regions live: the target's (--location) and the initiator's local buffer. */
static void choose_locations(struct conf *c)
{
	const struct te_plugin_caps *k = &c->caps;
	uint32_t handed;

	if (!c->location) {
		/* A kind the plugin owns is what it is for (its host memory may be local-only). */
		uint32_t kinds = k->mem_types & k->owned_mem_types;

		if (!kinds && (k->mem_types & TE_PLUGIN_MEM_CPU))
			kinds = TE_PLUGIN_MEM_CPU;
		if (!kinds)
			kinds = k->mem_types & k->alloc_mem_types;
		c->location = g_strdup(kinds & TE_PLUGIN_MEM_CUDA  ? "cuda:0"
				       : kinds & TE_PLUGIN_MEM_HIP ? "hip:0"
				       : kinds & TE_PLUGIN_MEM_CXL ? "cxl:0"
								   : "cpu");
	}
	/*
	 * Memory a plugin hands out without owning it (alloc_mem_types: a shared window) comes
	 * from one range every process of this host shares: both engines would get the same
	 * bytes. The local side is host memory then.
	 */
	handed = g_str_has_prefix(c->location, "cxl")	? TE_PLUGIN_MEM_CXL
		 : g_str_has_prefix(c->location, "cpu") ? TE_PLUGIN_MEM_CPU
							: 0;
	run.local_location =
		g_strdup(handed && (k->alloc_mem_types & handed) && !(k->owned_mem_types & handed)
				 ? "cpu"
				 : c->location);
}

/* The engine checks' names (with those made below), for --only. */
static const char *const engine_checks[] = {
	"engine-start",	   "segment-open",	    "register-roundtrip",   "batch-1000-write",
	"batch-1000-read", "back-pressure",	    "cancel-race",	    "retry",
	"retry-repeated",  "retry-excluded-device", "mark-failed",	    "peer-event",
	"deadline",	   "peer-killed",	    "peer-killed-recovery", "fini-in-flight",
	"reload",	   "core-log-plugin-bugs",
};

static bool any_engine_check(void)
{
	static const char *const sizes_names[] = { "1",	    "7",      "4095", "4096",
						   "65537", "1MiB+3", "64MiB" };
	static const char *const bad[] = {
		"remote-past-end",	 "remote-before-start",
		"remote-unregistered",	 "remote-wrap",
		"local-unregistered",	 "local-past-end",
		"zero-length",		 "target-untouched",
		"forged-write-past-end", "forged-write-before-start",
		"forged-read-past-end",
	};
	static const char *const rules[] = {
		"slice-done-once", "accepted-prefix",  "slice-fields",
		"ok-bytes",	   "excluded-devices", "cancel-not-found",
		"fini-canceled",   "host-args",	       "progress-budget",
	};

	for (size_t i = 0; i < G_N_ELEMENTS(engine_checks); i++) {
		if (report_selected(engine_checks[i]))
			return true;
	}
	for (size_t i = 0; i < G_N_ELEMENTS(sizes_names); i++) {
		g_autofree char *w = g_strdup_printf("write-%s", sizes_names[i]);
		g_autofree char *r = g_strdup_printf("read-%s", sizes_names[i]);

		if (report_selected(w) || report_selected(r))
			return true;
	}
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *n = g_strdup_printf("bad-input-%s", bad[i]);

		if (report_selected(n))
			return true;
	}
	for (size_t i = 0; i < G_N_ELEMENTS(rules); i++) {
		g_autofree char *n = g_strdup_printf("contract-%s", rules[i]);

		if (report_selected(n))
			return true;
	}
	return false;
}

void checks_run(struct conf *c)
{
	const char *start = "engine-start";

	run.c = c;
	logs.lines = g_ptr_array_new_with_free_func(g_free);
	report_on_hang(kill_targets);
	if (!any_engine_check())
		return;
	if (!c->abi_ready) {
		report_skip("engine", "the module did not load and initialise (abi-*): no engine "
				      "check ran");
		return;
	}
	if (c->caps.flags & TE_PLUGIN_CAP_SAME_PROCESS_ONLY) {
		report_skip("engine", "a same-process-only plugin: te-conformance checks two "
				      "processes");
		return;
	}
	run.can_read = c->caps.ops & TE_PLUGIN_CAN_READ;
	run.can_write = c->caps.ops & TE_PLUGIN_CAN_WRITE;
	choose_locations(c);
	if (!shim_load(c))
		return;
	report_watch(start, c->hang_s);
	run.t = start_target();
	if (!run.t) {
		report_unwatch();
		report_fail(start, "%s", run.err);
		return;
	}
	run.ini = ini_new(TRANSFER);
	if (!run.ini) {
		report_unwatch();
		report_fail(start, "initiator: %s", run.err);
		stop_target(run.t);
		return;
	}
	report_unwatch();
	report_ok(start, "(target pid %d at %s, initiator local memory at %s%s)", (int)run.t->pid,
		  c->location, run.local_location, c->shim ? ", through the shim" : "");

	if (report_wanted("segment-open")) {
		struct te_buffer_info bi[4];
		size_t nb = 0;

		report_watch("segment-open", c->hang_s);
		if (!ini_open(run.ini, run.t)) {
			report_unwatch();
			report_fail("segment-open", "%s", run.err);
			goto out;
		}
		if (te_segment_buffers(run.ini->e, run.ini->seg, bi, 4, &nb) != TE_OK || nb != 1 ||
		    bi[0].addr != run.t->region || bi[0].length != R) {
			report_unwatch();
			report_fail("segment-open",
				    "the segment lists %zu buffers; want exactly the region "
				    "[0x%" PRIx64 ", +%" PRIu64 ")",
				    nb, run.t->region, R);
			goto out;
		}
		/* Whether the plugin reaches the region at all: nothing else can run if not. */
		if (!probe_transfer()) {
			report_unwatch();
			report_fail("segment-open", "%s", run.err);
			goto out;
		}
		report_unwatch();
		report_ok("segment-open", "(%s: one buffer at %s, access 0x%x, reached)",
			  run.t->segment, bi[0].location, bi[0].access);
	} else if (!ini_open(run.ini, run.t)) {
		report_fail("segment-open", "%s", run.err);
		goto out;
	}

	if (report_wanted("register-roundtrip")) {
		bool ok;
		void *extra = NULL;
		enum te_status st;

		report_watch("register-roundtrip", c->hang_s);
		/* Local: register, unregister, register again, unregister. */
		st = te_mem_alloc(run.ini->e, run.local_location, 1 << 20, &extra);
		for (int i = 0; st == TE_OK && i < 2; i++) {
			st = te_mem_register(run.ini->e, extra, 1 << 20, run.local_location,
					     TE_MEM_REMOTE);
			if (st == TE_OK)
				st = te_mem_unregister(run.ini->e, extra);
		}
		if (extra)
			discard(te_mem_free(run.ini->e, extra));
		ok = st == TE_OK;
		if (!ok)
			g_snprintf(run.err, sizeof(run.err), "local register/unregister: %s: %s",
				   te_status_str(st), te_last_error());
		/* Remote: the target registers its region again; a reopened segment reaches it. */
		if (ok && !target_cmd(run.t, "reregister")) {
			g_snprintf(run.err, sizeof(run.err), "target: %s", run.t->reply);
			ok = false;
		}
		if (ok) {
			discard(te_segment_close(run.ini->e, run.ini->seg));
			ok = ini_open(run.ini, run.t) &&
			     verified_batch(run.ini, run.t, 2, 50, NULL, false);
		}
		report_unwatch();
		if (ok)
			report_ok("register-roundtrip", "(local twice; the target's region again, "
							"reached through the reopened segment)");
		else
			report_fail("register-roundtrip", "%s", run.err);
	}

	for (size_t k = 0; k < G_N_ELEMENTS(sizes); k++)
		check_size(k, TE_OP_WRITE);
	for (size_t k = 0; k < G_N_ELEMENTS(sizes); k++)
		check_size(k, TE_OP_READ);
	check_batch(TE_OP_WRITE);
	check_batch(TE_OP_READ);
	check_backpressure();
	check_cancel_race();
	check_retry();
	check_retry_repeated();
	check_retry_excluded();
	check_mark_failed();
	check_peer_event();
	check_bad_input();
	check_forged("bad-input-forged-write-past-end", TE_OP_WRITE, true);
	check_forged("bad-input-forged-write-before-start", TE_OP_WRITE, false);
	check_forged("bad-input-forged-read-past-end", TE_OP_READ, true);
	check_deadline();
	check_peer_killed();
	if (run.t && run.ini)
		check_fini();
	check_reload();
	check_contract();
out:
	ini_free(run.ini);
	run.ini = NULL;
	stop_target(run.t);
	run.t = NULL;
}
