/* SPDX-License-Identifier: Apache-2.0 */
/* sysnode_fixture.c: the node driver and test helpers shared by the te-node/cxl-node tests. */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sysnode.h"
#include "sysnode_fixture.h"

char *node_path;

/* ---------------------------------------------------------------------------------------- */
/* small helpers */

static struct {
	GMutex lock;
	GCond cond;
	GThread *thread;
	int64_t deadline_us; /* 0: disarmed */
	char what[200];
} wd;

static gpointer watchdog_main(gpointer unused)
{
	(void)unused;
	g_mutex_lock(&wd.lock);
	for (;;) {
		if (wd.deadline_us == 0) {
			g_cond_wait(&wd.cond, &wd.lock);
			continue;
		}
		if (g_get_monotonic_time() >= wd.deadline_us) {
			fprintf(stderr, "watchdog: %s did not return in time; aborting\n", wd.what);
			fflush(stderr);
			abort();
		}
		g_cond_wait_until(&wd.cond, &wd.lock, wd.deadline_us);
	}
	return NULL;
}

void watchdog_arm(unsigned seconds, const char *what)
{
	g_mutex_lock(&wd.lock);
	if (!wd.thread)
		wd.thread = g_thread_new("watchdog", watchdog_main, NULL);
	g_strlcpy(wd.what, what, sizeof(wd.what));
	wd.deadline_us = g_get_monotonic_time() + (int64_t)seconds * G_USEC_PER_SEC;
	g_cond_signal(&wd.cond);
	g_mutex_unlock(&wd.lock);
}

void watchdog_disarm(void)
{
	g_mutex_lock(&wd.lock);
	wd.deadline_us = 0;
	g_cond_signal(&wd.cond);
	g_mutex_unlock(&wd.lock);
}

uint64_t parse_u64(const char *s, int base)
{
	char *end = NULL;
	guint64 v;

	errno = 0;
	v = g_ascii_strtoull(s, &end, base);
	if (errno || end == s)
		g_error("not a number: \"%s\"", s);
	return v;
}

void parse_range(const char *s, uint64_t *addr, uint64_t *len)
{
	g_auto(GStrv) f = g_strsplit(s, " ", 3);

	g_assert_nonnull(f[0]);
	g_assert_nonnull(f[1]);
	*addr = parse_u64(f[0], 16);
	*len = parse_u64(f[1], 10);
}

char *find_plugin(const char *file)
{
	const char *path = g_getenv("TE_PLUGIN_PATH");
	g_auto(GStrv) dirs = g_strsplit(path ? path : "", ":", -1);

	for (char **d = dirs; *d; d++) {
		char *p;

		if (!**d)
			continue;
		p = g_build_filename(*d, file, NULL);
		if (g_file_test(p, G_FILE_TEST_IS_REGULAR))
			return p;
		g_free(p);
	}
	return NULL;
}

char *find_te_node(void)
{
	const char *build = g_getenv("TE_BUILD_ROOT");
	char *p = g_strdup(g_getenv("TE_NODE"));

	if (!p && build)
		p = g_build_filename(build, "tests", "system", "te-node", NULL);
	if (p && !g_file_test(p, G_FILE_TEST_IS_EXECUTABLE)) {
		g_free(p);
		p = NULL;
	}
	return p;
}

/* ---------------------------------------------------------------------------------------- */
/* node processes */

static const char *node_who(const struct node *n)
{
	return n->name ? n->name : "te-node ?";
}

static gpointer node_out_main(gpointer data)
{
	struct node *n = data;
	g_autoptr(GDataInputStream) in =
		g_data_input_stream_new(g_subprocess_get_stdout_pipe(n->proc));
	char *line;

	while ((line = g_data_input_stream_read_line(in, NULL, NULL, NULL)))
		g_async_queue_push(n->lines, line);
	g_async_queue_push(n->lines, g_strdup(NODE_EOF));
	return NULL;
}

static gpointer node_err_main(gpointer data)
{
	struct node *n = data;
	GInputStream *in = g_subprocess_get_stderr_pipe(n->proc);
	char buf[4096];
	gssize got;

	while ((got = g_input_stream_read(in, buf, sizeof(buf), NULL, NULL)) > 0) {
		g_mutex_lock(&n->err_lock);
		g_string_append_len(n->err, buf, got);
		g_mutex_unlock(&n->err_lock);
		/* Shown in the test log, so that a failure comes with the node's side of it. */
		fprintf(stderr, "[%s] %.*s", node_who(n), (int)got, buf);
	}
	return NULL;
}

struct node *node_spawn(const char *name, const char *const *argv)
{
	struct node *n = g_new0(struct node, 1);
	g_autoptr(GError) err = NULL;

	n->name = g_strdup(name);
	g_mutex_init(&n->err_lock);
	n->err = g_string_new(NULL);
	n->lines = g_async_queue_new_full(g_free);
	n->proc = g_subprocess_newv(argv,
				    G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE |
					    G_SUBPROCESS_FLAGS_STDERR_PIPE,
				    &err);
	if (!n->proc)
		g_error("cannot start %s: %s", argv[0], err->message);
	n->in = g_subprocess_get_stdin_pipe(n->proc);
	n->pid = g_strdup(g_subprocess_get_identifier(n->proc));
	n->out_thread = g_thread_new("node-out", node_out_main, n);
	n->err_thread = g_thread_new("node-err", node_err_main, n);
	return n;
}

struct node *node_start(const char *yaml, const char *listen)
{
	const char *argv[] = { node_path, yaml ? "--yaml" : "--listen", yaml ? yaml : listen,
			       NULL };

	return node_start_argv(argv);
}

struct node *node_start_argv(const char *const *argv)
{
	struct node *n = node_spawn(NULL, argv);
	g_autofree char *s = NULL;
	uint64_t a, l;

	n->segment = node_expect(n, "segment: ", NODE_READY_MS);
	n->name = g_strdup_printf("te-node %s", n->segment);
	s = node_expect(n, "base: ", NODE_READY_MS);
	parse_range(s, &n->base, &n->total);
	g_free(s);
	s = node_expect(n, "buffer: ", NODE_READY_MS);
	parse_range(s, &n->buf, &n->size);
	g_free(s);
	s = node_expect(n, "guard: ", NODE_READY_MS);
	parse_range(s, &a, &l);
	g_assert_cmphex(a, ==, n->base);
	n->guard = l;
	g_free(s);
	s = node_expect(n, "guard: ", NODE_READY_MS);
	parse_range(s, &a, &l);
	g_assert_cmphex(a, ==, n->buf + n->size);
	g_assert_cmpuint(l, ==, n->guard);
	g_assert_cmpuint(n->total, ==, n->size + 2 * n->guard);
	g_free(s);
	s = node_expect(n, "ready", NODE_READY_MS);
	g_test_message("te-node %s: pid %s, buffer 0x%" PRIx64 " + %" PRIu64, n->segment, n->pid,
		       n->buf, n->size);
	return n;
}

char *node_stderr(struct node *n)
{
	char *s;

	g_mutex_lock(&n->err_lock);
	s = g_strdup(n->err->str);
	g_mutex_unlock(&n->err_lock);
	return s;
}

char *node_line(struct node *n, unsigned ms)
{
	return g_async_queue_timeout_pop(n->lines, (guint64)ms * 1000);
}

char *node_expect(struct node *n, const char *prefix, unsigned ms)
{
	g_autofree char *line = node_line(n, ms);
	g_autofree char *err = NULL;

	if (line && g_str_has_prefix(line, prefix))
		return g_strdup(line + strlen(prefix));
	err = node_stderr(n);
	g_error("%s: expected a line \"%s...\" within %u ms, got %s%s%s; its stderr:\n%s",
		node_who(n), prefix, ms, line ? "\"" : "", line ? line : "nothing",
		line ? "\"" : "", err);
	return NULL;
}

void node_send(struct node *n, const char *fmt, ...)
{
	g_autofree char *cmd = NULL;
	g_autoptr(GError) err = NULL;
	va_list ap;

	g_assert_false(n->dead);
	va_start(ap, fmt);
	cmd = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	if (!g_output_stream_write_all(n->in, cmd, strlen(cmd), NULL, NULL, &err) ||
	    !g_output_stream_write_all(n->in, "\n", 1, NULL, NULL, &err) ||
	    !g_output_stream_flush(n->in, NULL, &err))
		g_error("%s: cannot send \"%s\": %s", node_who(n), cmd, err->message);
}

static void node_wait_cb(GObject *src, GAsyncResult *res, gpointer data)
{
	gboolean *done = data;

	(void)g_subprocess_wait_finish(G_SUBPROCESS(src), res, NULL);
	*done = TRUE;
}

bool node_wait_exit(struct node *n, unsigned ms)
{
	gboolean done = FALSE;
	int64_t end = now_ns() + ms * MS_NS;

	g_subprocess_wait_async(n->proc, NULL, node_wait_cb, &done);
	while (!done && now_ns() < end) {
		while (g_main_context_iteration(NULL, FALSE))
			;
		if (!done)
			sleep_ms(5);
	}
	if (done)
		return true;
	/* The callback still points at done: kill and wait again until it ran. */
	g_subprocess_force_exit(n->proc);
	while (!done) {
		while (g_main_context_iteration(NULL, FALSE))
			;
		if (!done)
			sleep_ms(5);
	}
	return false;
}

void node_kill(struct node *n)
{
	if (n->dead)
		return;
	g_subprocess_send_signal(n->proc, SIGKILL);
	(void)node_wait_exit(n, 10000);
	n->dead = true;
}

void node_close_free(struct node *n, unsigned ms, bool kill_ok)
{
	if (!n)
		return;
	if (!n->dead) {
		(void)g_output_stream_close(n->in, NULL, NULL);
		if (!node_wait_exit(n, ms)) {
			if (!kill_ok)
				g_error("te-node %s did not exit within %u s of stdin EOF",
					n->segment, ms / 1000);
			g_test_message("te-node %s did not exit within %u s of stdin EOF; killed",
				       n->segment, ms / 1000);
		} else if (!g_subprocess_get_if_exited(n->proc) ||
			   g_subprocess_get_exit_status(n->proc) != 0) {
			g_error("te-node %s: did not exit with status 0 on stdin EOF", n->segment);
		}
		n->dead = true;
	}
	node_release(n);
}

void node_release(struct node *n)
{
	g_thread_join(n->out_thread);
	g_thread_join(n->err_thread);
	g_object_unref(n->proc);
	g_async_queue_unref(n->lines);
	g_string_free(n->err, TRUE);
	g_mutex_clear(&n->err_lock);
	g_free(n->segment);
	g_free(n->name);
	g_free(n->pid);
	g_free(n);
}

uint64_t node_checksum(struct node *n, uint64_t off, uint64_t len)
{
	g_autofree char *s = NULL;

	node_send(n, "checksum %" PRIu64 " %" PRIu64, off, len);
	s = node_expect(n, "sum ", NODE_REPLY_MS);
	return parse_u64(s, 16);
}

void node_fill(struct node *n, uint64_t off, uint64_t len, uint64_t seed)
{
	g_autofree char *s = NULL;

	node_send(n, "fill %" PRIu64 " %" PRIu64 " %" PRIu64, off, len, seed);
	s = node_expect(n, "ok", NODE_REPLY_MS);
}

/* ---------------------------------------------------------------------------------------- */
/* the initiator side */

void initiator_free(struct te_engine *e)
{
	watchdog_arm(30, "te_engine_free of the initiator");
	te_engine_free(e);
	watchdog_disarm();
}

void lbuf_new(struct lbuf *b, struct te_engine *e, size_t len)
{
	b->len = len;
	b->p = g_aligned_alloc(1, len, 4096);
	memset(b->p, 0xee, len);
	assert_ok(te_mem_register(e, b->p, len, "cpu", TE_MEM_LOCAL));
}

void lbuf_free(struct lbuf *b, struct te_engine *e)
{
	int64_t t0 = now_ns();
	enum te_status st;

	while ((st = te_mem_unregister(e, b->p)) == TE_ERR_BUSY && now_ns() - t0 < 2 * S_NS)
		sleep_ms(1);
	if (st == TE_OK && now_ns() - t0 > MS_NS)
		g_test_message("te_mem_unregister: busy for %.1f ms after te_batch_free",
			       (now_ns() - t0) / 1e6);
	assert_ok(st);
	g_aligned_free(b->p);
}

uint8_t *mirror_new(const struct node *n)
{
	uint8_t *m = g_malloc(n->total);

	sysnode_fill(m, 0, n->total, 0);
	return m;
}

void assert_node_is(struct node *n, const uint8_t *mirror, const char *when)
{
	uint64_t want = sysnode_fnv(mirror, n->guard);

	if (node_checksum(n, 0, n->guard) != want)
		g_error("%s: the guard zone before the buffer changed", when);
	want = sysnode_fnv(mirror + n->guard + n->size, n->guard);
	if (node_checksum(n, n->guard + n->size, n->guard) != want)
		g_error("%s: the guard zone after the buffer changed", when);
	want = sysnode_fnv(mirror + n->guard, n->size);
	if (node_checksum(n, n->guard, n->size) != want)
		g_error("%s: the registered buffer does not hold what the test wrote", when);
}

void assert_bytes(const uint8_t *got, const uint8_t *want, size_t len, const char *what)
{
	if (memcmp(got, want, len) == 0)
		return;
	for (size_t k = 0; k < len; k++)
		if (got[k] != want[k])
			g_error("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, k, len,
				got[k], want[k]);
}

void assert_untouched(const uint8_t *p, size_t from, size_t to, const char *what)
{
	for (size_t k = from; k < to; k++)
		if (p[k] != 0xee)
			g_error("%s: local byte %zu outside the read range changed to 0x%02x", what,
				k, p[k]);
}

te_segment_id open_node(struct te_engine *e, struct node *n)
{
	struct te_buffer_info bufs[4];
	te_segment_id seg = 0;
	size_t nb = 0;

	assert_ok(te_segment_open(e, n->segment, &seg));
	g_assert_cmpuint(seg, !=, TE_SEGMENT_LOCAL);
	assert_ok(te_segment_buffers(e, seg, bufs, G_N_ELEMENTS(bufs), &nb));
	g_assert_cmpuint(nb, ==, 1);
	g_assert_cmphex(bufs[0].addr, ==, n->buf);
	g_assert_cmpuint(bufs[0].length, ==, n->size);
	g_assert_cmpuint(bufs[0].access, ==, TE_MEM_REMOTE);
	return seg;
}

te_batch_id batch_run(struct te_engine *e, const struct te_request *reqs, size_t n, int64_t wait_ns,
		      enum te_status *submit_out, enum te_status *wait_out)
{
	te_batch_id b;

	assert_ok(te_batch_new(e, (uint32_t)n, &b));
	*submit_out = te_batch_submit(e, b, reqs, n);
	watchdog_arm((unsigned)(wait_ns / S_NS) + 30, "te_batch_wait");
	*wait_out = te_batch_wait(e, b, wait_ns);
	watchdog_disarm();
	g_assert_cmpint(*wait_out, !=, TE_INPROGRESS);
	return b;
}

void batch_run_ok(struct te_engine *e, const struct te_request *reqs, size_t n, int64_t wait_ns,
		  const char *transport)
{
	enum te_status sst, wst;
	te_batch_id b = batch_run(e, reqs, n, wait_ns, &sst, &wst);
	struct te_batch_info bi;

	if (sst != TE_OK || wst != TE_OK) {
		for (uint32_t i = 0; i < n; i++) {
			struct te_task_info ti;

			assert_ok(te_task_status(e, b, i, &ti));
			if (ti.state != TE_STATE_COMPLETED)
				g_error("task %u of %zu (%s of %" PRIu64 " bytes): %s, %s: %s", i,
					n, reqs[i].opcode == TE_OP_READ ? "READ" : "WRITE",
					reqs[i].length, te_state_str(ti.state),
					te_status_str(ti.status), ti.detail);
		}
		g_error("batch: submit %s, wait %s, but every task completed?", te_status_str(sst),
			te_status_str(wst));
	}
	assert_ok(te_batch_status(e, b, &bi));
	g_assert_cmpint(bi.state, ==, TE_STATE_COMPLETED);
	g_assert_cmpuint(bi.completed, ==, n);
	for (uint32_t i = 0; i < n; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		g_assert_cmpuint(ti.bytes, ==, reqs[i].length);
		g_assert_cmpstr(ti.transport, ==, transport);
	}
	assert_ok(te_batch_free(e, b));
}

/* ---------------------------------------------------------------------------------------- */
/* data checks */

void xfer_sizes(struct te_engine *e, te_segment_id seg, struct node *n, const size_t *sizes,
		size_t count, int64_t wait_ns, const char *transport)
{
	uint8_t *mirror = mirror_new(n);
	struct lbuf l;
	uint64_t seed = 100;

	lbuf_new(&l, e, (64u << 20) + 8192);
	for (size_t s = 0; s < count; s++) {
		size_t len = sizes[s];
		/* remote offset in the buffer, local offset: aligned, unaligned, at the end */
		const uint64_t places[3][2] = { { 0, 0 }, { 4097, 3 }, { n->size - len, 4093 } };

		for (size_t p = 0; p < G_N_ELEMENTS(places); p++) {
			uint64_t roff = places[p][0], abs = n->guard + roff;
			size_t loff = places[p][1];
			g_autofree char *what = g_strdup_printf(
				"%zu bytes at buffer+%" PRIu64 ", local+%zu", len, roff, loff);
			struct te_request r;
			int64_t t0;

			if (roff + len > n->size)
				continue;
			/* WRITE: the node's bytes become ours, exactly there. */
			sysnode_fill(l.p + loff, abs, len, ++seed);
			r = (struct te_request){ TE_OP_WRITE, seg, l.p + loff, n->buf + roff, len };
			t0 = now_ns();
			batch_run_ok(e, &r, 1, wait_ns, transport);
			g_test_message("WRITE %s: %.2f ms", what, (now_ns() - t0) / 1e6);
			memcpy(mirror + abs, l.p + loff, len);
			g_assert_cmphex(node_checksum(n, abs, len), ==,
					sysnode_fnv(mirror + abs, len));
			g_assert_cmphex(node_checksum(n, abs - 64, 64), ==,
					sysnode_fnv(mirror + abs - 64, 64));
			g_assert_cmphex(node_checksum(n, abs + len, 64), ==,
					sysnode_fnv(mirror + abs + len, 64));

			/* READ: our bytes become the node's, nothing around them changes. */
			node_fill(n, abs, len, ++seed);
			sysnode_fill(mirror + abs, abs, len, seed);
			memset(l.p, 0xee, l.len);
			r = (struct te_request){ TE_OP_READ, seg, l.p + loff, n->buf + roff, len };
			t0 = now_ns();
			batch_run_ok(e, &r, 1, wait_ns, transport);
			g_test_message("READ %s: %.2f ms", what, (now_ns() - t0) / 1e6);
			assert_bytes(l.p + loff, mirror + abs, len, what);
			assert_untouched(l.p, 0, loff, what);
			assert_untouched(l.p, loff + len, MIN(l.len, loff + len + 65536), what);
		}
	}
	assert_node_is(n, mirror, "after every size");
	lbuf_free(&l, e);
	g_free(mirror);
}

void xfer_batch(struct te_engine *e, te_segment_id seg, struct node *n, unsigned count,
		uint32_t max_len, int64_t wait_ns, const char *transport)
{
	uint8_t *mirror = mirror_new(n);
	struct lbuf l;
	struct te_request *r = g_new0(struct te_request, count);
	uint64_t *roff = g_new(uint64_t, count), *loff = g_new(uint64_t, count);
	uint64_t rc = 7, lc = 1, seed = 500;
	uint32_t rseed = g_test_rand_int();
	GRand *rnd = g_rand_new_with_seed(rseed);
	g_autofree char *writes = g_strdup_printf("after %u WRITEs", count);

	g_test_message("request layout seed %u", rseed);
	/* @count requests of 1..@max_len bytes, unaligned, with gaps on both sides. */
	for (unsigned i = 0; i < count; i++) {
		r[i].length = 1 + (uint64_t)g_rand_int_range(rnd, 0, (gint32)max_len);
		roff[i] = rc;
		loff[i] = lc;
		rc += r[i].length + (uint64_t)g_rand_int_range(rnd, 1, 16);
		lc += r[i].length + (uint64_t)g_rand_int_range(rnd, 1, 16);
	}
	g_assert_cmpuint(rc, <, n->size);
	lbuf_new(&l, e, lc + 4096);

	/* @count WRITEs in one batch. */
	for (unsigned i = 0; i < count; i++) {
		uint64_t abs = n->guard + roff[i];

		sysnode_fill(l.p + loff[i], abs, r[i].length, seed);
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l.p + loff[i], n->buf + roff[i],
					    r[i].length };
		memcpy(mirror + abs, l.p + loff[i], r[i].length);
	}
	batch_run_ok(e, r, count, wait_ns, transport);
	assert_node_is(n, mirror, writes);

	/* @count READs in one batch, of fresh node data. */
	node_fill(n, n->guard, rc, ++seed);
	sysnode_fill(mirror + n->guard, n->guard, rc, seed);
	memset(l.p, 0xee, l.len);
	for (unsigned i = 0; i < count; i++)
		r[i].opcode = TE_OP_READ;
	batch_run_ok(e, r, count, wait_ns, transport);
	for (unsigned i = 0; i < count; i++) {
		g_autofree char *what = g_strdup_printf("READ request %u", i);

		assert_bytes(l.p + loff[i], mirror + n->guard + roff[i], r[i].length, what);
		assert_untouched(l.p, i ? loff[i - 1] + r[i - 1].length : 0, loff[i], what);
	}
	assert_untouched(l.p, loff[count - 1] + r[count - 1].length, l.len, "after READs");

	/* READs and WRITEs mixed in one batch, over disjoint ranges. */
	node_fill(n, n->guard, rc, ++seed);
	sysnode_fill(mirror + n->guard, n->guard, rc, seed);
	memset(l.p, 0xee, l.len);
	++seed;
	for (unsigned i = 0; i < count; i++) {
		uint64_t abs = n->guard + roff[i];

		r[i].opcode = i % 2 ? TE_OP_READ : TE_OP_WRITE;
		if (r[i].opcode == TE_OP_WRITE) {
			sysnode_fill(l.p + loff[i], abs, r[i].length, seed);
			memcpy(mirror + abs, l.p + loff[i], r[i].length);
		}
	}
	batch_run_ok(e, r, count, wait_ns, transport);
	for (unsigned i = 1; i < count; i += 2)
		assert_bytes(l.p + loff[i], mirror + n->guard + roff[i], r[i].length,
			     "mixed batch READ");
	assert_node_is(n, mirror, "after a mixed batch");

	lbuf_free(&l, e);
	g_rand_free(rnd);
	g_free(loff);
	g_free(roff);
	g_free(r);
	g_free(mirror);
}

void bad_ranges(const struct node *n, struct bad_range out[BAD_RANGES])
{
	const struct bad_range bad[BAD_RANGES] = {
		{ "crosses the end", TE_OP_WRITE, n->buf + n->size - 10, 100 },
		{ "first byte after the end", TE_OP_WRITE, n->buf + n->size, 1 },
		{ "straddles the start", TE_OP_WRITE, n->buf - 1, 2 },
		{ "inside the guard before", TE_OP_READ, n->buf - 4096, 16 },
		{ "inside the guard after", TE_OP_READ, n->buf + n->size + 16, 16 },
		{ "nowhere near", TE_OP_WRITE, 4096, 8 },
		{ "1 MiB over the end", TE_OP_READ, n->buf + n->size - 4096, 1u << 20 },
	};

	memcpy(out, bad, sizeof(bad));
}
