/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_guest.c: two te processes over real verbs (soft-RoCE in the QEMU guest):
 * hw-rxe checks. */

/*
 *   rdma-guest --target --config FILE [--size BYTES] [--flip]
 *       registers a buffer filled with the target pattern, prints "segment:
 * NAME" and "descriptor: BASE64(JSON)", serves until its stdin reaches EOF
 * (--flip: and a flip buffer, flipped on "flip N" from stdin: target_flip).
 *   rdma-guest --scenario NAME --config FILE --target-config FILE [--down-if
 * DEV] starts a target child (the second te process) with --target-config,
 * imports its descriptor and runs one scenario; exit 0 when it passed: transfer
 * READ and WRITE of 1 B .. 8 MiB at odd offsets and batches of 1000, every byte
 * verified, bytes next to each written range untouched; kill      the target is
 * killed in the middle of a batch: every task is terminal within the deadline;
 *         qp-error  (with test_fault in --config) one work request goes outside
 * the remote MR: exactly that task fails with TE_ERR_REMOTE_ACCESS, all others
 * complete, and traffic goes on; failover  two local devices, batches in a
 * loop; `ip link set DEV down` (--down-if, the netdev under the first device)
 * mid-batch: no task lost, the work in flight is retried and traffic ends up on
 * the second device; cancel  WRITEs of one pattern are canceled in flight: the
 * plugin stops the QPs that carry them before it reports them, WRITEs of another
 * pattern to the same range then complete, and 2 s later the range holds the new
 * pattern; unregister-write, unregister-read  (the target started with --flip) the
 * target unregisters and registers again a 64 KiB buffer, 40 times, while two threads
 * WRITE into it (READ from it): nothing lands after te_mem_unregister, no READ returns its
 * canary, requests complete or are refused (TE_ERR_REMOTE_ACCESS), requests to the main
 * buffer meanwhile all complete, and after the last flip requests complete again under
 * the new keys. The first half of the target buffer
 * is only ever read (it keeps the target pattern); writes go to the second half.
 */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>

#include <te/te.h>

#define TARGET_SEED 0x5eedu
#define POISON 0xa5u
#define MiB (1024u * 1024u)

static int verbose;

#define say(...)                                                                                   \
	do {                                                                                       \
		printf(__VA_ARGS__);                                                               \
		putchar('\n');                                                                     \
		fflush(stdout);                                                                    \
	} while (0)

/* Byte @off of the pattern seeded @seed. */
static inline uint8_t pat(uint64_t seed, uint64_t off)
{
	uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull ^ seed * 0xbf58476d1ce4e5b9ull;

	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (uint8_t)(x >> (8 * (off & 7)));
}

static void fill(uint8_t *p, uint64_t len, uint64_t seed, uint64_t off)
{
	for (uint64_t i = 0; i < len; i++)
		p[i] = pat(seed, off + i);
}

/* First differing offset, or -1. */
static int64_t check(const uint8_t *p, uint64_t len, uint64_t seed, uint64_t off)
{
	for (uint64_t i = 0; i < len; i++)
		if (p[i] != pat(seed, off + i))
			return (int64_t)i;
	return -1;
}

static double now_s(void)
{
	return (double)g_get_monotonic_time() / 1e6;
}

/* Log lines of the cancel scenario's interest, counted (g_atomic_int). */
static gint qps_stopped; /* the plugin moved a QP to error to take back a canceled slice */
static gint slices_kept; /* the core gave up on a slice the plugin kept past its grace */

static void log_fn(void *user, enum te_log_level level, const char *msg)
{
	if (strstr(msg, "moved to error to take back a canceled"))
		g_atomic_int_inc(&qps_stopped);
	if (strstr(msg, "did not hand the slice back"))
		g_atomic_int_inc(&slices_kept);
	if (verbose || level <= TE_LOG_WARN || strstr(msg, "gid[") || strstr(msg, "path ") ||
	    strstr(msg, "device"))
		fprintf(stderr, "[%.3f %s] %s\n", now_s(), (const char *)user, msg);
}

static struct te_engine *engine_open(const char *config, const char *who)
{
	struct te_engine_opts o = { .size = sizeof(o) };
	struct te_engine *e = NULL;
	enum te_status st;

	o.config_path = config;
	o.log_fn = log_fn;
	o.log_user = (void *)who;
	o.log_level = verbose ? TE_LOG_DEBUG : TE_LOG_INFO;
	st = te_engine_new(&o, &e);
	if (st != TE_OK) {
		say("%s: engine start failed: %s: %s", who, te_status_str(st), te_last_error());
		exit(2);
	}
	return e;
}

/* --- target
 * -----------------------------------------------------------------------------
 */

/*
 * The unregister scenarios' buffer on the target (--flip): FLIP_LEN bytes, FLIP_LIVE while
 * registered. On "flip N" from the initiator, N rounds of: registered for FLIP_ON_MS, then
 * unregistered and filled with FLIP_CANARY for FLIP_OFF_MS, which must survive the WRITEs
 * aimed at it (no byte may land once te_mem_unregister has returned), then FLIP_LIVE and
 * registered again (new keys). Prints "flipped: N rounds, L late" (L: rounds where the
 * canary changed), or "flipped: error ...".
 */
enum {
	FLIP_LEN = 64 << 10,
	FLIP_CANARY = 0x5c,
	FLIP_LIVE = 0x3c,
	FLIP_ON_MS = 20,
	FLIP_OFF_MS = 20
};

static void target_flip(struct te_engine *e, uint8_t *x, unsigned rounds)
{
	unsigned late = 0;
	enum te_status st;

	for (unsigned r = 0; r < rounds; r++) {
		size_t bad = 0;

		g_usleep(FLIP_ON_MS * 1000);
		st = te_mem_unregister(e, x);
		if (st != TE_OK) {
			say("flipped: error in round %u: te_mem_unregister: %s: %s", r,
			    te_status_str(st), te_last_error());
			return;
		}
		memset(x, FLIP_CANARY, FLIP_LEN);
		g_usleep(FLIP_OFF_MS * 1000);
		for (size_t i = 0; i < FLIP_LEN; i++)
			bad += x[i] != FLIP_CANARY;
		if (bad) {
			say("flip round %u: %zu bytes changed after te_mem_unregister", r, bad);
			late++;
		}
		memset(x, FLIP_LIVE, FLIP_LEN);
		st = te_mem_register(e, x, FLIP_LEN, "cpu", TE_MEM_REMOTE);
		if (st != TE_OK) {
			say("flipped: error in round %u: te_mem_register: %s: %s", r,
			    te_status_str(st), te_last_error());
			return;
		}
	}
	say("flipped: %u rounds, %u late", rounds, late);
}

static int run_target(const char *config, uint64_t size, bool flip)
{
	struct te_engine *e = engine_open(config, "target");
	uint8_t *buf = g_malloc(size), *x = NULL;
	char *json = NULL, line[64];
	size_t len = 0;
	enum te_status st;

	fill(buf, size, TARGET_SEED, 0);
	st = te_mem_register(e, buf, size, "cpu", TE_MEM_REMOTE);
	if (st == TE_OK && flip) {
		x = g_malloc(FLIP_LEN);
		memset(x, FLIP_LIVE, FLIP_LEN);
		st = te_mem_register(e, x, FLIP_LEN, "cpu", TE_MEM_REMOTE);
	}
	if (st != TE_OK) {
		say("target: te_mem_register: %s: %s", te_status_str(st), te_last_error());
		return 2;
	}
	if (te_segment_export(e, &json, &len) != TE_OK)
		return 2;
	{
		g_autofree char *b64 = g_base64_encode((const guchar *)json, len);

		say("segment: %s", te_engine_name(e));
		say("descriptor: %s", b64);
	}
	te_free(json);
	while (fgets(line, sizeof(line), stdin)) {
		unsigned rounds;

		if (x && sscanf(line, "flip %u", &rounds) == 1)
			target_flip(e, x, rounds);
	}
	te_engine_free(e);
	g_free(buf);
	g_free(x);
	return 0;
}

/* --- initiator
 * -----------------------------------------------------------------------------
 */

struct ctx {
	struct te_engine *e;
	te_segment_id seg;
	uint64_t raddr, rlen; /* target buffer */
	uint8_t *loc;	      /* local area: transfers in the first half, read-backs in the
                   second */
	uint64_t llen;
	uint64_t xaddr; /* the target's flip buffer (--flip), 0: none */
	GPid child;
	int child_in, child_out;
	FILE *out; /* the target's stdout */
};

static bool start_target(struct ctx *c, const char *self, const char *tconfig, uint64_t size,
			 bool flip)
{
	g_autofree char *size_s = g_strdup_printf("%" PRIu64, size);
	const char *argv[] = {
		self, "--target", "--config", tconfig, "--size", size_s, flip ? "--flip" : NULL,
		NULL
	};
	g_autoptr(GError) err = NULL;
	g_autofree guchar *json = NULL;
	struct te_buffer_info bi[2];
	gsize jlen = 0;
	size_t n = 0;
	FILE *out;
	char line[65536];
	enum te_status st;

	if (!g_spawn_async_with_pipes(NULL, (char **)argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD, NULL,
				      NULL, &c->child, &c->child_in, &c->child_out, NULL, &err)) {
		say("cannot start the target: %s", err->message);
		return false;
	}
	out = c->out = fdopen(c->child_out, "r");
	while (fgets(line, sizeof(line), out)) {
		if (!strncmp(line, "descriptor: ", 12)) {
			g_strchomp(line);
			json = g_base64_decode(line + 12, &jlen);
			break;
		}
		fputs(line, stdout);
	}
	if (!json) {
		say("the target printed no descriptor");
		return false;
	}
	st = te_segment_import(c->e, (const char *)json, jlen, &c->seg);
	if (st != TE_OK) {
		say("te_segment_import: %s: %s", te_status_str(st), te_last_error());
		return false;
	}
	st = te_segment_buffers(c->e, c->seg, bi, 2, &n);
	if (st != TE_OK || n != (flip ? 2u : 1u)) {
		say("te_segment_buffers: %s, %zu buffers", te_status_str(st), n);
		return false;
	}
	/* The flip buffer is the small one. */
	if (n == 2 && bi[0].length == FLIP_LEN) {
		c->xaddr = bi[0].addr;
		bi[0] = bi[1];
	} else if (n == 2) {
		c->xaddr = bi[1].addr;
	}
	c->raddr = bi[0].addr;
	c->rlen = bi[0].length;
	return true;
}

static void stop_target(struct ctx *c)
{
	int status;

	if (c->child <= 0)
		return;
	close(c->child_in);
	waitpid(c->child, &status, 0);
	c->child = 0;
}

static void batch_free(struct ctx *c, te_batch_id bid)
{
	enum te_status st = te_batch_free(c->e, bid);

	if (st != TE_OK)
		say("te_batch_free: %s: %s", te_status_str(st), te_last_error());
}

/* Run requests as one batch; returns the wait status and leaves the batch for
 * inspection. */
static enum te_status batch(struct ctx *c, const struct te_request *r, size_t n, te_batch_id *bid,
			    int64_t timeout_ns)
{
	enum te_status st;

	st = te_batch_new(c->e, (uint32_t)n, bid);
	if (st == TE_OK)
		st = te_batch_submit(c->e, *bid, r, n);
	if (st != TE_OK) {
		say("submit: %s: %s", te_status_str(st), te_last_error());
		return st;
	}
	return te_batch_wait(c->e, *bid, timeout_ns);
}

/* Report the first failed tasks of a batch; true when all completed. */
static bool batch_ok(struct ctx *c, te_batch_id bid, size_t n, const char *what)
{
	uint32_t bad = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct te_task_info ti;

		if (te_task_status(c->e, bid, i, &ti) != TE_OK || ti.state == TE_STATE_COMPLETED)
			continue;
		if (bad++ < 3)
			say("  %s: task %u %s %s: %s", what, i, te_state_str(ti.state),
			    te_status_str(ti.status), ti.detail);
	}
	if (bad)
		say("  %s: %u of %zu tasks failed", what, bad, n);
	return !bad;
}

static struct te_request rq(struct ctx *c, enum te_opcode op, uint64_t loff, uint64_t roff,
			    uint64_t len)
{
	struct te_request r = {
		.opcode = op,
		.segment = c->seg,
		.local = c->loc + loff,
		.remote = c->raddr + roff,
		.length = len,
	};
	return r;
}

#define WAIT_NS (120ll * 1000 * 1000 * 1000)

/* One READ of the read-only half and one WRITE + read-back, of @len bytes at
 * odd offsets. */
static bool one_size(struct ctx *c, uint64_t len, uint64_t *woff)
{
	uint64_t half = c->rlen / 2, roff = 13 + (len * 7) % 4093, margin = 64;
	uint64_t wo = *woff + margin, wseed = 0xabc0 + len;
	struct te_request r[2];
	te_batch_id bid;
	int64_t at;
	bool ok = true;

	if (roff + len > half || wo + len + margin > c->rlen || 2 * (len + 2 * margin) > c->llen) {
		say("  size %" PRIu64 ": buffers too small", len);
		return false;
	}
	/* READ: the target's pattern lands exactly in [8, 8 + len) of the local area.
   */
	memset(c->loc, POISON, len + 16);
	r[0] = rq(c, TE_OP_READ, 8, roff, len);
	if (batch(c, r, 1, &bid, WAIT_NS) != TE_OK || !batch_ok(c, bid, 1, "read"))
		ok = false;
	batch_free(c, bid);
	if (ok && (at = check(c->loc + 8, len, TARGET_SEED, roff)) >= 0) {
		say("  READ %" PRIu64 " B: byte %" PRId64 " differs", len, at);
		ok = false;
	}
	for (int i = 0; ok && i < 8; i++)
		if (c->loc[i] != POISON || c->loc[8 + len + i] != POISON) {
			say("  READ %" PRIu64 " B wrote outside its range", len);
			ok = false;
		}
	/* WRITE, then READ back the range with 64 bytes on each side. */
	fill(c->loc, len, wseed, 0);
	r[0] = rq(c, TE_OP_WRITE, 0, wo, len);
	if (ok && (batch(c, r, 1, &bid, WAIT_NS) != TE_OK || !batch_ok(c, bid, 1, "write")))
		ok = false;
	batch_free(c, bid);
	memset(c->loc + c->llen / 2, POISON, len + 2 * margin);
	r[0] = rq(c, TE_OP_READ, c->llen / 2, wo - margin, len + 2 * margin);
	if (ok && (batch(c, r, 1, &bid, WAIT_NS) != TE_OK || !batch_ok(c, bid, 1, "read-back")))
		ok = false;
	batch_free(c, bid);
	if (ok && ((at = check(c->loc + c->llen / 2 + margin, len, wseed, 0)) >= 0)) {
		say("  WRITE %" PRIu64 " B: byte %" PRId64 " differs", len, at);
		ok = false;
	}
	if (ok &&
	    (check(c->loc + c->llen / 2, margin, TARGET_SEED, wo - margin) >= 0 ||
	     check(c->loc + c->llen / 2 + margin + len, margin, TARGET_SEED, wo + len) >= 0)) {
		say("  WRITE %" PRIu64 " B changed bytes next to its range", len);
		ok = false;
	}
	*woff = wo + len + margin;
	return ok;
}

/* 1000 requests of @len per batch: WRITE, read back, and READ of the read-only
 * half. */
static bool batch_1000(struct ctx *c, uint64_t len)
{
	const size_t n = 1000;
	uint64_t half = c->rlen / 2, stride = len + 8, seed = 0x1000 + len;
	g_autofree struct te_request *r = g_new(struct te_request, n);
	te_batch_id bid;
	double t0;
	bool ok = true;

	if (n * stride > half || n * stride * 2 > c->llen)
		return false;
	fill(c->loc, n * stride, seed, 0);
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_WRITE, i * stride, half + i * stride, len);
	t0 = now_s();
	ok &= batch(c, r, n, &bid, WAIT_NS) == TE_OK && batch_ok(c, bid, n, "batch write");
	batch_free(c, bid);
	memset(c->loc + c->llen / 2, POISON, n * stride);
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_READ, c->llen / 2 + i * stride, half + i * stride, len);
	ok &= batch(c, r, n, &bid, WAIT_NS) == TE_OK && batch_ok(c, bid, n, "batch read-back");
	batch_free(c, bid);
	for (size_t i = 0; ok && i < n; i++) {
		if (check(c->loc + c->llen / 2 + i * stride, len, seed, i * stride) >= 0) {
			say("  batch of 1000 x %" PRIu64 " B: request %zu differs", len, i);
			ok = false;
		}
	}
	memset(c->loc, POISON, n * stride);
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_READ, i * stride, 5 + i * stride, len);
	ok &= batch(c, r, n, &bid, WAIT_NS) == TE_OK && batch_ok(c, bid, n, "batch read");
	batch_free(c, bid);
	for (size_t i = 0; ok && i < n; i++) {
		if (check(c->loc + i * stride, len, TARGET_SEED, 5 + i * stride) >= 0) {
			say("  batch READ of 1000 x %" PRIu64 " B: request %zu differs", len, i);
			ok = false;
		}
	}
	say("  batches of 1000 x %" PRIu64 " B (write, read-back, read): %s, %.2f s", len,
	    ok ? "verified" : "FAILED", now_s() - t0);
	return ok;
}

static bool scenario_transfer(struct ctx *c)
{
	static const uint64_t sizes[] = { 1, 3, 4095, 4096, 65535, 65536, 65537, MiB + 5, 8 * MiB };
	uint64_t woff = c->rlen / 2;
	bool ok = true;

	for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
		double t0 = now_s();
		bool one = one_size(c, sizes[i], &woff);

		say("  %8" PRIu64 " B READ + WRITE: %s (%.3f s)", sizes[i],
		    one ? "verified" : "FAILED", now_s() - t0);
		ok &= one;
	}
	ok &= batch_1000(c, 4096);
	ok &= batch_1000(c, 1);
	return ok;
}

/* Kills the target once a tenth of the batch has moved, from its own thread
 * (submit may post most of a batch before it returns). */
struct killer {
	struct ctx *c;
	te_batch_id bid;
	size_t n;
	double t_kill;
	uint32_t done_at_kill;
};

static gpointer killer_main(gpointer data)
{
	struct killer *k = data;
	struct te_batch_info bi = { 0 };
	double t0 = now_s();
	int status;

	while (now_s() - t0 < 30) {
		if (te_batch_status(k->c->e, k->bid, &bi) == TE_OK && bi.tasks == k->n &&
		    (bi.completed >= k->n / 10 || bi.state > TE_STATE_PENDING))
			break;
		g_usleep(500);
	}
	kill(k->c->child, SIGKILL);
	k->t_kill = now_s();
	k->done_at_kill = bi.completed;
	waitpid(k->c->child, &status, 0);
	return NULL;
}

static bool scenario_kill(struct ctx *c, int64_t deadline_ms)
{
	const size_t n = 1000;
	const uint64_t len = 65536;
	g_autofree struct te_request *r = g_new(struct te_request, n);
	struct killer k = { .c = c, .n = n };
	uint32_t counts[7] = { 0 };
	enum te_status st;
	GThread *th;

	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_WRITE, (i * len) % (c->llen - len),
			  c->rlen / 2 + (i * len) % (c->rlen / 2 - len), len);
	if (te_batch_new(c->e, n, &k.bid) != TE_OK) {
		say("  te_batch_new: %s", te_last_error());
		return false;
	}
	th = g_thread_new("killer", killer_main, &k);
	st = te_batch_submit(c->e, k.bid, r, n);
	if (st != TE_OK)
		say("  submit: %s: %s", te_status_str(st), te_last_error());
	g_thread_join(th);
	close(c->child_in);
	c->child = 0;
	say("  target killed with %u of %zu tasks completed", k.done_at_kill, n);
	st = te_batch_wait(c->e, k.bid, (deadline_ms + 5000) * 1000000ll);
	if (st == TE_INPROGRESS) {
		say("  tasks still pending %.1f s after the kill (deadline %" PRId64 " ms)",
		    now_s() - k.t_kill, deadline_ms);
		return false;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct te_task_info ti;

		if (te_task_status(c->e, k.bid, i, &ti) == TE_OK && ti.state < 7) {
			counts[ti.state]++;
			if (ti.state != TE_STATE_COMPLETED && counts[ti.state] == 1)
				say("  first %s: %s: %s", te_state_str(ti.state),
				    te_status_str(ti.status), ti.detail);
		}
	}
	say("  all %zu tasks terminal %.3f s after the kill (deadline %" PRId64
	    " ms): %u completed, "
	    "%u failed, %u timed out, %u canceled",
	    n, now_s() - k.t_kill, deadline_ms, counts[TE_STATE_COMPLETED], counts[TE_STATE_FAILED],
	    counts[TE_STATE_TIMEOUT], counts[TE_STATE_CANCELED]);
	batch_free(c, k.bid);
	return k.done_at_kill < n && counts[TE_STATE_COMPLETED] + counts[TE_STATE_FAILED] +
						     counts[TE_STATE_TIMEOUT] +
						     counts[TE_STATE_CANCELED] ==
					     n;
}

static bool write_batch_verified(struct ctx *c, size_t n, uint64_t len, uint64_t seed,
				 uint32_t *failed_out, te_batch_id *bid_out, bool keep)
{
	g_autofree struct te_request *r = g_new(struct te_request, n);
	uint64_t half = c->rlen / 2;
	te_batch_id bid, rb;
	uint32_t failed = 0;
	bool ok = true;

	fill(c->loc, n * len, seed, 0);
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_WRITE, i * len, half + i * len, len);
	(void)batch(c, r, n, &bid, WAIT_NS);
	memset(c->loc + c->llen / 2, POISON, n * len);
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_READ, c->llen / 2 + i * len, half + i * len, len);
	ok = batch(c, r, n, &rb, WAIT_NS) == TE_OK && batch_ok(c, rb, n, "read-back");
	batch_free(c, rb);
	for (uint32_t i = 0; ok && i < n; i++) {
		struct te_task_info ti;

		if (te_task_status(c->e, bid, i, &ti) != TE_OK)
			return false;
		if (ti.state != TE_STATE_COMPLETED) {
			failed++;
			continue;
		}
		if (check(c->loc + c->llen / 2 + i * len, len, seed, i * len) >= 0) {
			say("  write %u: data differs", i);
			ok = false;
		}
	}
	*failed_out = failed;
	if (keep)
		*bid_out = bid;
	else
		batch_free(c, bid);
	return ok;
}

static bool scenario_qp_error(struct ctx *c)
{
	const size_t n = 200;
	uint32_t failed = 0, bad = 0;
	te_batch_id bid;
	bool ok;

	ok = write_batch_verified(c, n, 65536, 0x77, &failed, &bid, true);
	for (uint32_t i = 0; i < n; i++) {
		struct te_task_info ti;

		if (te_task_status(c->e, bid, i, &ti) != TE_OK || ti.state == TE_STATE_COMPLETED)
			continue;
		say("  task %u: %s %s (%d): %s", i, te_state_str(ti.state),
		    te_status_str(ti.status), ti.status, ti.detail);
		if (ti.status != TE_ERR_REMOTE_ACCESS || !strstr(ti.detail, "remote access error"))
			bad++;
	}
	batch_free(c, bid);
	say("  first batch: %u of %zu failed (want exactly 1, with "
	    "TE_ERR_REMOTE_ACCESS); the others "
	    "%s",
	    failed, n, ok ? "verified" : "NOT verified");
	ok &= failed == 1 && bad == 0;
	/* Traffic goes on over a fresh QP. */
	ok &= write_batch_verified(c, n, 65536, 0x78, &failed, &bid, false) && failed == 0;
	say("  second batch: %u failed", failed);
	return ok;
}

/*
 * Which bytes a failed read-back of the failover scenario holds, per 64 KiB chunk (the
 * first 4 bad ones): still POISON (the READ reported done placed nothing), the previous
 * round's pattern or the target's initial one (a WRITE reported done did not land), the
 * expected pattern, or other bytes. @dev/@retries: per chunk, the device and retries of
 * the last copy's WRITE and of the read-back READ. Returns the bad chunks.
 */
struct fo_chunk {
	char wdev[24], rdev[24];
	uint32_t wretries, rretries;
};

static uint32_t explain_chunks(const uint8_t *p, size_t n, uint64_t seed, uint64_t half,
			       const struct fo_chunk *ch)
{
	uint32_t bad = 0;

	for (size_t i = 0; i < n; i++) {
		const uint8_t *q = p + i * 65536;
		uint64_t roff = half + (i * 65536) % (half - 65536);
		uint32_t poison = 0, want = 0, prev = 0, init = 0;
		int64_t first = check(q, 65536, seed, i * 65536);

		if (first < 0)
			continue;
		for (uint64_t j = 0; j < 65536; j++) {
			poison += q[j] == POISON;
			want += q[j] == pat(seed, i * 65536 + j);
			prev += q[j] == pat(seed - 1, i * 65536 + j);
			init += q[j] == pat(TARGET_SEED, roff + j);
		}
		if (bad++ < 4)
			say("  chunk %zu (remote +%" PRIu64 "): first bad byte at +%" PRId64
			    "; of 65536 bytes %u expected, %u POISON, %u the previous round's, "
			    "%u the target's initial; WRITE via %s (%u retries), READ via %s "
			    "(%u retries)",
			    i, roff, first, want, poison, prev, init, ch[i].wdev, ch[i].wretries,
			    ch[i].rdev, ch[i].rretries);
	}
	return bad;
}

/*
 * Takes the link down once part of the batch has moved (from its own thread).
 * The command is `ip -batch -` started beforehand: spawning ip under TCG takes
 * longer than a batch, so only "link set DEV down" is written to it at the
 * right moment.
 */
struct downer {
	struct ctx *c;
	te_batch_id bid;
	size_t n;
	int ip_in;	 /* stdin of the waiting ip -batch */
	const char *dev; /* the netdev under the first rxe device */
	uint32_t done_at;
};

static gpointer downer_main(gpointer data)
{
	struct downer *d = data;
	struct te_batch_info bi = { 0 };
	double t0 = now_s();
	char cmd[96];
	int len;

	while (now_s() - t0 < 30) {
		if (te_batch_status(d->c->e, d->bid, &bi) == TE_OK && bi.tasks == d->n &&
		    (bi.completed >= d->n / 16 || bi.state > TE_STATE_PENDING))
			break;
		g_usleep(200);
	}
	d->done_at = bi.completed;
	len = snprintf(cmd, sizeof(cmd), "link set %s down\n", d->dev);
	if (write(d->ip_in, cmd, (size_t)len) != len)
		say("  (writing to ip failed: %s)", strerror(errno));
	close(d->ip_in);
	return NULL;
}

static bool scenario_failover(struct ctx *c, const char *down_if)
{
	const size_t small = 64, big = 352, rounds = 10, down_round = 3; /* big: within half */
	const char *ip_argv[] = { "/usr/sbin/ip", "-batch", "-", NULL };
	GPid ip_pid = 0;
	int status;
	uint32_t lost = 0, failed, first_dev_before = 0, second_dev_before = 0, late_first = 0;
	uint32_t retried_down = 0;
	char first[64] = "";
	bool ok = true;

	for (size_t k = 0; k < rounds; k++) {
		size_t n = k == down_round ? big : small;
		/*
		 * The down round submits the same writes in several batches at once, so that
		 * the first device still has work in flight when `ip` gets to run: with one
		 * batch, everything could already be posted and acknowledged by then (seen
		 * under TCG), leaving nothing to retry.
		 */
		size_t copies = k == down_round ? 4 : 1;
		g_autofree struct te_request *r = g_new(struct te_request, n);
		g_autofree struct fo_chunk *ch = g_new0(struct fo_chunk, n);
		te_batch_id bids[4];
		uint64_t half = c->rlen / 2, seed = 0x900 + k;
		struct downer dn = { .c = c, .n = n, .dev = down_if, .ip_in = -1 };
		uint32_t on_first = 0, retried = 0;
		GThread *th = NULL;
		te_batch_id bid;

		fill(c->loc, n * 65536, seed, 0);
		for (size_t i = 0; i < n; i++)
			r[i] = rq(c, TE_OP_WRITE, i * 65536, half + (i * 65536) % (half - 65536),
				  65536);
		for (size_t b = 0; b < copies; b++)
			if (te_batch_new(c->e, n, &bids[b]) != TE_OK)
				return false;
		if (k == down_round) {
			/* The first device's link goes down while these batches are in flight. */
			if (!g_spawn_async_with_pipes(NULL, (char **)ip_argv, NULL,
						      G_SPAWN_DO_NOT_REAP_CHILD, NULL, NULL,
						      &ip_pid, &dn.ip_in, NULL, NULL, NULL)) {
				say("  cannot start %s", ip_argv[0]);
				return false;
			}
			g_usleep(300000); /* let it load */
			dn.bid = bids[0];
			th = g_thread_new("down", downer_main, &dn);
		}
		for (size_t b = 0; b < copies; b++)
			if (te_batch_submit(c->e, bids[b], r, n) != TE_OK)
				return false;
		for (size_t b = 0; b < copies; b++)
			if (te_batch_wait(c->e, bids[b], WAIT_NS) == TE_INPROGRESS)
				say("  round %zu: batch %zu not finished after 120 s", k, b);
		if (th) {
			g_thread_join(th);
			waitpid(ip_pid, &status, 0);
			say("  round %zu: `ip link set %s down` (exit %d) with %u of %zu tasks "
			    "of the first batch done",
			    k, down_if, WIFEXITED(status) ? WEXITSTATUS(status) : -1, dn.done_at,
			    n);
		}
		for (size_t b = 0; b < copies; b++) {
			for (uint32_t i = 0; i < n; i++) {
				struct te_task_info ti;

				if (te_task_status(c->e, bids[b], i, &ti) != TE_OK)
					return false;
				if (ti.state != TE_STATE_COMPLETED && lost++ < 3)
					say("  round %zu batch %zu task %u: %s %s: %s", k, b, i,
					    te_state_str(ti.state), te_status_str(ti.status),
					    ti.detail);
				if (!*first && k == 0 && i == 0)
					snprintf(first, sizeof(first), "%s", ti.device);
				on_first += !strcmp(ti.device, first);
				retried += ti.retries > 0;
				snprintf(ch[i].wdev, sizeof(ch[i].wdev), "%s", ti.device);
				ch[i].wretries = ti.retries;
			}
			batch_free(c, bids[b]);
		}
		if (k < down_round) {
			first_dev_before += on_first;
			second_dev_before += (uint32_t)n - on_first;
		} else if (k > down_round) {
			late_first += on_first;
		} else {
			retried_down = retried;
		}
		/* Read back what this round wrote (its last, not overwritten, copies) and
     * verify. */
		n = n < (half / 65536) - 1 ? n : (half / 65536) - 1;
		memset(c->loc + c->llen / 2, POISON, n * 65536);
		for (size_t i = 0; i < n; i++)
			r[i] = rq(c, TE_OP_READ, c->llen / 2 + i * 65536, half + i * 65536, 65536);
		failed = 0;
		if (batch(c, r, n, &bid, WAIT_NS) != TE_OK) {
			(void)batch_ok(c, bid, n, "read-back");
			failed = 1;
		}
		for (uint32_t i = 0; i < n; i++) {
			struct te_task_info ti;

			if (te_task_status(c->e, bid, i, &ti) == TE_OK) {
				snprintf(ch[i].rdev, sizeof(ch[i].rdev), "%s", ti.device);
				ch[i].rretries = ti.retries;
			}
		}
		batch_free(c, bid);
		if (failed || check(c->loc + c->llen / 2, n * 65536, seed, 0) >= 0) {
			uint32_t bad = explain_chunks(c->loc + c->llen / 2, n, seed, half, ch);

			say("  round %zu: data NOT verified (%u of %zu chunks wrong)", k, bad, n);
			/*
			 * Read it all again: right now means the first read-back's READs were
			 * reported done without their bytes; wrong again means WRITEs reported
			 * done did not land.
			 */
			memset(c->loc + c->llen / 2, POISON, n * 65536);
			if (batch(c, r, n, &bid, WAIT_NS) != TE_OK)
				(void)batch_ok(c, bid, n, "second read-back");
			else if (check(c->loc + c->llen / 2, n * 65536, seed, 0) >= 0)
				say("  round %zu: a second read-back is wrong too (%u chunks): "
				    "WRITEs reported done did not land",
				    k, explain_chunks(c->loc + c->llen / 2, n, seed, half, ch));
			else
				say("  round %zu: a second read-back is right: the first one's "
				    "READs were reported done without their bytes",
				    k);
			batch_free(c, bid);
			ok = false;
		}
		say("  round %2zu: %zu x 64 KiB written, %zu read back and verified; %u on "
		    "%s, %u on "
		    "the other, %u retried",
		    k, copies * (k == down_round ? big : small), n, on_first, first,
		    (uint32_t)(copies * (k == down_round ? big : small)) - on_first, retried);
	}
	say("  before the link went down: %u tasks on %s, %u on the other; while: %u "
	    "retried; "
	    "after: %u on %s; %u lost",
	    first_dev_before, first, second_dev_before, retried_down, late_first, first, lost);
	return ok && lost == 0 && first_dev_before && second_dev_before && retried_down &&
	       !late_first;
}

/*
 * WRITEs of one pattern to a range, canceled (te_batch_cancel) while in flight: the plugin moves
 * the QPs that carry them to the error state before it hands them back (its log says so), and
 * the core never has to give up on a slice the plugin kept (its warning would say so); a task
 * whose WRITE reached a QP says "... Work Request Flushed Error after a cancel stopped the QP"
 * (the others were canceled by the core before they were posted). Then WRITEs of another pattern to the same range complete (over
 * fresh QPs) and, 2 s later, the range holds the new pattern: no byte of a canceled WRITE
 * landed after them.
 */
static bool scenario_cancel(struct ctx *c)
{
	/* One slice per request (the default slice is 64 KiB): a task's detail is its slice's. */
	const size_t n = 256, copies = 4;
	const uint64_t len = 65536, old_seed = 0xc1, new_seed = 0xc2;
	uint64_t half = c->rlen / 2;
	uint8_t *old = c->loc, *fresh = c->loc + n * len, *back = c->loc + 2 * n * len;
	g_autofree struct te_request *r = g_new(struct te_request, n);
	uint32_t counts[7] = { 0 }, flushed = 0, fenced = 0, kept = 0;
	te_batch_id bids[4], bid;
	int64_t at;
	bool ok = true;

	if (3 * n * len > c->llen || n * len > half)
		return false;
	fill(old, n * len, old_seed, 0);
	fill(fresh, n * len, new_seed, 0);
	for (int attempt = 0; attempt < 3 && !flushed; attempt++) {
		for (size_t i = 0; i < n; i++)
			r[i] = rq(c, TE_OP_WRITE, i * len, half + i * len, len);
		for (size_t b = 0; b < copies; b++) {
			if (te_batch_new(c->e, n, &bids[b]) != TE_OK ||
			    te_batch_submit(c->e, bids[b], r, n) != TE_OK) {
				say("  submit: %s", te_last_error());
				return false;
			}
		}
		for (size_t b = 0; b < copies; b++)
			if (te_batch_cancel(c->e, bids[b]) != TE_OK)
				return false;
		for (size_t b = 0; b < copies; b++) {
			if (te_batch_wait(c->e, bids[b], WAIT_NS) == TE_INPROGRESS) {
				say("  a canceled batch is not terminal after 120 s");
				return false;
			}
			for (uint32_t i = 0; i < n; i++) {
				struct te_task_info ti;

				if (te_task_status(c->e, bids[b], i, &ti) != TE_OK || ti.state >= 7)
					return false;
				counts[ti.state]++;
				if (strstr(ti.detail, "a cancel stopped the QP") && flushed++ == 0)
					say("  first task whose slice was taken back: %s %s: %s",
					    te_state_str(ti.state), te_status_str(ti.status),
					    ti.detail);
			}
			batch_free(c, bids[b]);
		}
		fenced = (uint32_t)g_atomic_int_get(&qps_stopped);
		kept = (uint32_t)g_atomic_int_get(&slices_kept);
		say("  attempt %d: %u completed, %u canceled, %u failed (%u detail(s) from a "
		    "flush); QPs moved to error by a cancel: %u; slices kept past the grace: %u",
		    attempt, counts[TE_STATE_COMPLETED], counts[TE_STATE_CANCELED],
		    counts[TE_STATE_FAILED], flushed, fenced, kept);
	}
	if (!flushed)
		say("  nothing was in flight at the cancel in 3 attempts");
	ok = flushed > 0 && fenced > 0 && kept == 0;
	/* The new pattern over the same range: it completes, and it stays. */
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_WRITE, n * len + i * len, half + i * len, len);
	if (batch(c, r, n, &bid, WAIT_NS) != TE_OK || !batch_ok(c, bid, n, "new write"))
		ok = false;
	batch_free(c, bid);
	g_usleep(2 * G_USEC_PER_SEC);
	memset(back, POISON, n * len);
	for (size_t i = 0; i < n; i++)
		r[i] = rq(c, TE_OP_READ, 2 * n * len + i * len, half + i * len, len);
	if (batch(c, r, n, &bid, WAIT_NS) != TE_OK || !batch_ok(c, bid, n, "read-back"))
		ok = false;
	batch_free(c, bid);
	if ((at = check(back, n * len, new_seed, 0)) >= 0) {
		say("  2 s after the new WRITEs completed, byte %" PRId64 " of the range is %s", at,
		    back[at] == pat(old_seed, (uint64_t)at) ? "from a canceled WRITE" : "wrong");
		ok = false;
	} else {
		say("  %zu MiB of new data written over the canceled range and verified 2 s later",
		    n * len / MiB);
	}
	return ok;
}

/*
 * unregister-write / unregister-read: the target flips its flip buffer between registered
 * and not (target_flip) while two threads of the initiator WRITE into it (or READ from it)
 * in batches of 8 x 4 KiB. Once te_mem_unregister has returned on the target, no byte may
 * land there (its canary survives) and no READ may return it; every request completes or
 * fails with TE_ERR_REMOTE_ACCESS (the device refuses the old key; the plugin, having seen
 * that key refused, fails requests under it at submit and does not retry the ones flushed
 * behind the refusal; or the core's fresh descriptor lacks the buffer); nothing else. A
 * third thread moves data to the main buffer, registered throughout, over the same QPs:
 * every one of its requests completes (before the plugin held refused keys, requests
 * flushed behind one refusal after another ran out of retries: 15-45 of about 1000). Each
 * re-registration brings new keys, so requests complete again only if a refusal makes the
 * core fetch the descriptor again: after the last flip, a batch must complete within 3
 * tries.
 */
#define FLIP_ROUNDS 40u

struct flipper {
	struct ctx *c;
	enum te_opcode op;
	_Atomic uint32_t completed, rejected, other, read_late, next;
	_Atomic uint32_t by_ok, by_bad; /* flip_bystander's tasks */
	atomic_bool stop;
};

/* One batch of 8 x 4 KiB between @mine and random places of the flip buffer. */
static te_batch_id flip_batch(struct flipper *f, GRand *rnd, uint8_t *mine)
{
	struct te_request r[8];
	te_batch_id bid = 0;

	for (int i = 0; i < 8; i++) {
		uint64_t off = (uint64_t)g_rand_int_range(rnd, 0, FLIP_LEN / 4096) * 4096;

		r[i] = (struct te_request){ f->op, f->c->seg, mine + (size_t)i * 4096,
					    f->c->xaddr + off, 4096 };
	}
	if (f->op == TE_OP_READ)
		memset(mine, 0, FLIP_LEN / 2);
	if (te_batch_new(f->c->e, 8, &bid) != TE_OK) {
		say("  te_batch_new: %s", te_last_error());
		return 0;
	}
	/* Per-task statuses are read after: a submit may refuse some and go on. */
	if (te_batch_submit(f->c->e, bid, r, 8) == TE_ERR_BATCH_FULL ||
	    te_batch_wait(f->c->e, bid, WAIT_NS) == TE_INPROGRESS)
		atomic_fetch_add(&f->other, 1);
	return bid;
}

/* Count a finished flip batch's tasks; returns how many completed. */
static uint32_t flip_count(struct flipper *f, te_batch_id bid, const uint8_t *mine)
{
	uint32_t done = 0;

	for (uint32_t i = 0; i < 8; i++) {
		struct te_task_info ti;

		if (te_task_status(f->c->e, bid, i, &ti) != TE_OK) {
			atomic_fetch_add(&f->other, 1);
		} else if (ti.state == TE_STATE_COMPLETED) {
			done++;
			atomic_fetch_add(&f->completed, 1);
			for (size_t k = 0; f->op == TE_OP_READ && k < 4096; k++) {
				if (mine[i * 4096 + k] != FLIP_LIVE) {
					say("  READ returned 0x%02x, not 0x%02x",
					    mine[i * 4096 + k], FLIP_LIVE);
					atomic_fetch_add(&f->read_late, 1);
					break;
				}
			}
		} else if (ti.status == TE_ERR_REMOTE_ACCESS) {
			atomic_fetch_add(&f->rejected, 1);
		} else {
			if (atomic_fetch_add(&f->other, 1) < 5)
				say("  task: %s %s: %s", te_state_str(ti.state),
				    te_status_str(ti.status), ti.detail);
		}
	}
	batch_free(f->c, bid);
	return done;
}

static gpointer flip_worker(gpointer data)
{
	struct flipper *f = data;
	uint32_t idx = atomic_fetch_add(&f->next, 1);
	GRand *rnd = g_rand_new_with_seed(300 + idx);
	uint8_t *mine = f->c->loc + f->c->llen / 2 + (size_t)idx * (FLIP_LEN / 2);

	while (!atomic_load(&f->stop)) {
		te_batch_id bid = flip_batch(f, rnd, mine);

		if (!bid) {
			atomic_fetch_add(&f->other, 1);
			break;
		}
		flip_count(f, bid, mine);
	}
	g_rand_free(rnd);
	return NULL;
}

/*
 * Bystanders: batches of 8 x 4 KiB to the target's main buffer (registered throughout) on
 * the same QPs, while the flip buffer's refusals put those QPs in error.
 */
static gpointer flip_bystander(gpointer data)
{
	struct flipper *f = data;
	struct ctx *c = f->c;
	uint64_t half = c->rlen / 2;
	struct te_request r[8];

	for (int i = 0; i < 8; i++)
		r[i] = (struct te_request){ f->op, c->seg, c->loc + (size_t)i * 4096,
					    c->raddr + (f->op == TE_OP_WRITE ? half : 0) +
						    (uint64_t)i * 4096,
					    4096 };
	while (!atomic_load(&f->stop)) {
		te_batch_id bid;

		if (te_batch_new(c->e, 8, &bid) != TE_OK)
			break;
		if (te_batch_submit(c->e, bid, r, 8) != TE_OK ||
		    te_batch_wait(c->e, bid, WAIT_NS) == TE_INPROGRESS)
			say("  bystander: submit or wait: %s", te_last_error());
		for (uint32_t i = 0; i < 8; i++) {
			struct te_task_info ti = { 0 }; /* printed below even if the call fails */

			if (te_task_status(c->e, bid, i, &ti) == TE_OK &&
			    ti.state == TE_STATE_COMPLETED) {
				atomic_fetch_add(&f->by_ok, 1);
			} else {
				if (atomic_fetch_add(&f->by_bad, 1) < 3)
					say("  bystander: %s %s: %s", te_state_str(ti.state),
					    te_status_str(ti.status), ti.detail);
			}
		}
		batch_free(c, bid);
	}
	return NULL;
}

static bool scenario_unregister(struct ctx *c, enum te_opcode op)
{
	struct flipper f = { .c = c, .op = op };
	GRand *rnd = g_rand_new_with_seed(7);
	uint8_t *mine = c->loc + c->llen / 2 + FLIP_LEN;
	GThread *th[3];
	char line[256], cmd[32];
	bool ok = true, flipped = false;
	uint32_t tries = 0, late = UINT32_MAX;
	int len;

	/* WRITEs carry FLIP_LIVE: while registered the buffer keeps holding it. */
	memset(c->loc + c->llen / 2, FLIP_LIVE, 2 * FLIP_LEN);
	for (int t = 0; t < 2; t++)
		th[t] = g_thread_new("flip", flip_worker, &f);
	th[2] = g_thread_new("bystander", flip_bystander, &f);
	len = snprintf(cmd, sizeof(cmd), "flip %u\n", FLIP_ROUNDS);
	if (write(c->child_in, cmd, (size_t)len) != len) {
		say("  writing to the target failed: %s", strerror(errno));
		ok = false;
	}
	while (ok && fgets(line, sizeof(line), c->out)) {
		fputs(line, stdout);
		if (!strncmp(line, "flipped: ", 9)) {
			flipped = sscanf(line, "flipped: %*u rounds, %u late", &late) == 1;
			break;
		}
	}
	atomic_store(&f.stop, true);
	for (int t = 0; t < 3; t++)
		g_thread_join(th[t]);
	say("  bystanders (the main buffer, registered throughout): %u completed, %u did not",
	    atomic_load(&f.by_ok), atomic_load(&f.by_bad));
	say("  %u flips: %u %ss completed, %u refused (TE_ERR_REMOTE_ACCESS), %u otherwise, "
	    "%u READs returned the canary",
	    FLIP_ROUNDS, atomic_load(&f.completed), op == TE_OP_READ ? "READ" : "WRITE",
	    atomic_load(&f.rejected), atomic_load(&f.other), atomic_load(&f.read_late));
	/* Registered again for good, under keys the initiator has not seen yet. */
	for (tries = 1; tries <= 3; tries++) {
		te_batch_id bid;

		g_usleep(150 * 1000); /* past SEGMENT_REFETCH_NS */
		bid = flip_batch(&f, rnd, mine);
		if (bid && flip_count(&f, bid, mine) == 8)
			break;
	}
	if (tries <= 3)
		say("  after the last flip: a whole batch completed at try %u", tries);
	else
		say("  after the last flip: no whole batch completed in 3 tries (the refusals did "
		    "not lead to a fresh descriptor)");
	g_rand_free(rnd);
	if (!flipped) {
		say("  the target reported no flips");
		ok = false;
	}
	ok &= late == 0 && atomic_load(&f.read_late) == 0 && atomic_load(&f.other) == 0 &&
	      atomic_load(&f.by_bad) == 0 && atomic_load(&f.by_ok) > 0 &&
	      atomic_load(&f.completed) > 0 && atomic_load(&f.rejected) > 0 && tries <= 3;
	return ok;
}

int main(int argc, char **argv)
{
	g_autofree char *config = NULL, *tconfig = NULL, *scenario = NULL, *down = NULL;
	gint64 size = 48 * MiB;
	gboolean target = FALSE, flip = FALSE;
	gint deadline_ms = 10000;
	GOptionEntry entries[] = {
		{ "target", 0, 0, G_OPTION_ARG_NONE, &target, "Serve a buffer", NULL },
		{ "flip", 0, 0, G_OPTION_ARG_NONE, &flip, "target: and a flip buffer", NULL },
		{ "config", 0, 0, G_OPTION_ARG_FILENAME, &config, "Engine configuration", "FILE" },
		{ "target-config", 0, 0, G_OPTION_ARG_FILENAME, &tconfig, "Target's", "FILE" },
		{ "size", 0, 0, G_OPTION_ARG_INT64, &size, "Target buffer bytes", "N" },
		{ "scenario", 0, 0, G_OPTION_ARG_STRING, &scenario, "What to run", "NAME" },
		{ "down-if", 0, 0, G_OPTION_ARG_STRING, &down, "failover: netdev to take down",
		  "DEV" },
		{ "deadline-ms", 0, 0, G_OPTION_ARG_INT, &deadline_ms, "kill: transfer.timeout_ms",
		  "MS" },
		{ "verbose", 'v', 0, G_OPTION_ARG_NONE, &verbose, "Debug log", NULL },
		{ NULL, 0, 0, G_OPTION_ARG_NONE, NULL, NULL, NULL },
	};
	g_autoptr(GOptionContext) oc = g_option_context_new("- te rdma checks in the guest");
	g_autoptr(GError) err = NULL;
	struct ctx c = { 0 };
	bool ok = false;
	double t0 = now_s();

	g_option_context_add_main_entries(oc, entries, NULL);
	if (!g_option_context_parse(oc, &argc, &argv, &err) || !config) {
		fprintf(stderr, "rdma-guest: %s\n", err ? err->message : "--config is required");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (g_getenv("RDMA_GUEST_VERBOSE"))
		verbose = 1;
	if (target)
		return run_target(config, (uint64_t)size, flip);
	if (!scenario || !tconfig) {
		fprintf(stderr, "rdma-guest: --scenario and --target-config are required\n");
		return 2;
	}
	c.e = engine_open(config, "initiator");
	c.llen = 48 * MiB;
	c.loc = g_malloc(c.llen);
	memset(c.loc, POISON, c.llen);
	if (te_mem_register(c.e, c.loc, c.llen, "cpu", TE_MEM_LOCAL) != TE_OK) {
		say("te_mem_register: %s", te_last_error());
		return 1;
	}
	if (!start_target(&c, argv[0], tconfig, (uint64_t)size,
			  g_str_has_prefix(scenario, "unregister-")))
		goto out;
	if (!strcmp(scenario, "transfer"))
		ok = scenario_transfer(&c);
	else if (!strcmp(scenario, "kill"))
		ok = scenario_kill(&c, deadline_ms);
	else if (!strcmp(scenario, "qp-error"))
		ok = scenario_qp_error(&c);
	else if (!strcmp(scenario, "failover") && down)
		ok = scenario_failover(&c, down);
	else if (!strcmp(scenario, "cancel"))
		ok = scenario_cancel(&c);
	else if (!strcmp(scenario, "unregister-write"))
		ok = scenario_unregister(&c, TE_OP_WRITE);
	else if (!strcmp(scenario, "unregister-read"))
		ok = scenario_unregister(&c, TE_OP_READ);
	else
		say("unknown scenario '%s' (or --down-if missing)", scenario);
out:
	/* The engine first: its close messages still find the target. */
	te_engine_free(c.e);
	stop_target(&c);
	g_free(c.loc);
	say("scenario %s: %s (%.1f s)", scenario, ok ? "passed" : "FAILED", now_s() - t0);
	return ok ? 0 : 1;
}
