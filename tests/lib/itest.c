/* SPDX-License-Identifier: Apache-2.0 */
/* itest.c: engines in the test process: engine pairs, guarded buffers, patterns, plugin files. */
#include "itest.h"

#include "logcap.h"

#include <stdlib.h>

char *itest_yaml(const char *name, const struct itest_transport *transports, size_t n,
		 const char *transfer)
{
	GString *s = g_string_new(NULL);

	g_string_append_printf(s, "engine: {name: %s}\n", name);
	if (n)
		g_string_append(s, "transports:\n");
	for (size_t i = 0; i < n; i++) {
		const struct itest_transport *t = &transports[i];

		g_string_append_printf(s, "  - name: %s\n", t->name);
		if (t->path)
			g_string_append_printf(s, "    path: \"%s\"\n", t->path);
		g_string_append_printf(s, "    required: %s\n", t->required ? "true" : "false");
		if (t->options && *t->options)
			g_string_append_printf(s, "    options: {%s}\n", t->options);
	}
	if (transfer && *transfer)
		g_string_append_printf(s, "transfer: {%s}\n", transfer);
	return g_string_free(s, FALSE);
}

struct te_engine *itest_engine(const char *yaml)
{
	struct te_engine *e = NULL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);

	if (st != TE_OK)
		g_error("te_engine_new_from_string failed: %d (%s): %s\nconfig:\n%s", st,
			te_status_str(st), te_last_error(), yaml);
	g_assert_nonnull(e);
	return e;
}

struct te_engine *itest_engine1(const char *name, const char *plugin, const char *options,
				const char *transfer)
{
	struct itest_transport t = { .name = plugin, .required = true, .options = options };
	g_autofree char *yaml = itest_yaml(name, &t, 1, transfer);

	return itest_engine(yaml);
}

void itest_pair_new(struct itest_pair *p, const char *plugin, const char *options,
		    const char *transfer)
{
	p->a = itest_engine1("A", plugin, options, transfer);
	p->b = itest_engine1("B", plugin, options, transfer);
	p->seg = (te_segment_id)-1;
}

void itest_pair_connect(struct itest_pair *p)
{
	char *json = NULL;
	size_t len = 0;
	te_segment_id seg = (te_segment_id)-1;

	assert_ok(te_segment_export(p->b, &json, &len));
	g_assert_nonnull(json);
	g_assert_cmpuint(strlen(json), ==, len);
	assert_ok(te_segment_import(p->a, json, len, &seg));
	te_free(json);
	g_assert_cmpuint(seg, !=, TE_SEGMENT_LOCAL);
	p->seg = seg;
}

void itest_pair_free(struct itest_pair *p)
{
	te_engine_free(p->a);
	te_engine_free(p->b);
	p->a = NULL;
	p->b = NULL;
}

void itest_buf_new(struct itest_buf *b, size_t len, size_t guard, uint32_t seed)
{
	b->len = len;
	b->guard = guard;
	b->seed = seed;
	b->base = g_malloc(len + 2 * guard);
	b->data = b->base + guard;
	itest_buf_fill(b);
}

void itest_buf_free(struct itest_buf *b)
{
	g_free(b->base);
	b->base = NULL;
	b->data = NULL;
}

void itest_buf_register(struct itest_buf *b, struct te_engine *engine, uint32_t access)
{
	assert_ok(te_mem_register(engine, b->base, b->len + 2 * b->guard, "cpu", access));
}

void itest_buf_fill(struct itest_buf *b)
{
	size_t span = b->len + 2 * b->guard;

	for (size_t i = 0; i < span; i++)
		b->base[i] = itest_pattern(b->seed, i);
}

void itest_fx_new(struct itest_fx *f, const char *plugin, const char *options, const char *transfer,
		  size_t len, size_t guard)
{
	itest_pair_new(&f->p, plugin, options, transfer);
	itest_buf_new(&f->la, len, guard, 1);
	itest_buf_new(&f->rb, len, guard, 2);
	itest_buf_register(&f->la, f->p.a, TE_MEM_LOCAL);
	itest_buf_register(&f->rb, f->p.b, TE_MEM_REMOTE);
	itest_pair_connect(&f->p);
}

void itest_fx_free(struct itest_fx *f)
{
	itest_pair_free(&f->p);
	itest_buf_free(&f->la);
	itest_buf_free(&f->rb);
}

bool itest_range_is(const struct itest_buf *b, size_t off, size_t len, const struct itest_buf *src,
		    size_t src_off)
{
	for (size_t i = 0; i < len; i++) {
		uint8_t want = itest_pattern(src->seed, src->guard + src_off + i);
		uint8_t got = b->data[off + i];

		if (got != want) {
			g_test_message("byte %zu of range [%zu, +%zu): got 0x%02x, want 0x%02x", i,
				       off, len, got, want);
			return false;
		}
	}
	return true;
}

bool itest_untouched_outside(const struct itest_buf *b, const size_t *offs, const size_t *lens,
			     size_t n)
{
	size_t span = b->len + 2 * b->guard;
	g_autofree uint8_t *covered = g_malloc0(span);

	for (size_t i = 0; i < n; i++)
		memset(covered + b->guard + offs[i], 1, lens[i]);
	for (size_t i = 0; i < span; i++) {
		if (covered[i])
			continue;
		if (b->base[i] != itest_pattern(b->seed, i)) {
			g_test_message("byte at data%+td outside the transfer ranges was changed",
				       (ptrdiff_t)i - (ptrdiff_t)b->guard);
			return false;
		}
	}
	return true;
}

char *itest_plugin_file(const char *name)
{
	const char *env = g_getenv("TE_PLUGIN_PATH");
	const char *root = g_getenv("TE_SOURCE_ROOT");
	g_autofree char *file = g_strconcat(name, ".so", NULL);

	if (env) {
		g_auto(GStrv) dirs = g_strsplit(env, ":", -1);

		for (size_t i = 0; dirs[i]; i++) {
			char *p;

			if (!*dirs[i])
				continue;
			p = g_build_filename(dirs[i], file, NULL);
			if (g_file_test(p, G_FILE_TEST_EXISTS))
				return p;
			g_free(p);
		}
	}
	if (root) {
		char *p = g_build_filename(root, "tests", "plugins", file, NULL);

		if (g_file_test(p, G_FILE_TEST_EXISTS))
			return p;
		g_free(p);
	}
	return NULL;
}

enum te_status itest_wait(struct te_engine *e, te_batch_id batch)
{
	enum te_status st = te_batch_wait(e, batch, ITEST_WAIT_NS);

	if (st == TE_INPROGRESS)
		g_error("te_batch_wait did not finish within %lld s", ITEST_WAIT_NS / 1000000000ll);
	return st;
}

struct te_task_info itest_task(struct te_engine *e, te_batch_id batch, uint32_t task)
{
	struct te_task_info info;

	memset(&info, 0, sizeof(info));
	assert_ok(te_task_status(e, batch, task, &info));
	return info;
}

struct te_batch_info itest_batch(struct te_engine *e, te_batch_id batch)
{
	struct te_batch_info info;

	memset(&info, 0, sizeof(info));
	assert_ok(te_batch_status(e, batch, &info));
	return info;
}

/* te_segment_close (seg != 0) or te_engine_free (seg 0) from another thread. */
struct held_op {
	struct te_engine *e;
	te_segment_id seg;
	enum te_status st;
	char err[256];
	gint done;
};

static gpointer held_op_run(gpointer data)
{
	struct held_op *op = data;

	if (op->seg) {
		op->st = te_segment_close(op->e, op->seg);
		g_strlcpy(op->err, te_last_error(), sizeof(op->err));
	} else {
		te_engine_free(op->e);
		op->st = TE_OK;
	}
	g_atomic_int_set(&op->done, 1);
	return NULL;
}

/*
 * Run @op (named @what) while @g holds a host call: it must not return while held, and must
 * within ITEST_HELD_WAIT_MS once let go.
 */
static void held_op_check(struct held_op *op, struct loggate *g, const char *what)
{
	GThread *th;
	unsigned waited = 0;

	g_assert_true(loggate_entered(g));
	th = g_thread_new("held-op", held_op_run, op);
	sleep_ms(300);
	if (g_atomic_int_get(&op->done)) {
		loggate_release(g);
		g_thread_join(th);
		g_error("%s returned (%s) while the held host call was still under way", what,
			te_status_str(op->st));
	}
	loggate_release(g);
	while (!g_atomic_int_get(&op->done) && waited < ITEST_HELD_WAIT_MS) {
		sleep_ms(10);
		waited += 10;
	}
	if (!g_atomic_int_get(&op->done))
		g_error("%s did not return within %u ms of the held host call being let go (%s): "
			"a deadlock",
			what, ITEST_HELD_WAIT_MS,
			loggate_left(g) ? "its log call returned" : "its log call never returned");
	g_thread_join(th);
}

void itest_close_waits_for_held_call(struct te_engine *e, te_segment_id seg, struct loggate *g)
{
	struct held_op op = { .e = e, .seg = seg };

	g_assert_cmpuint(seg, !=, 0);
	held_op_check(&op, g, "te_segment_close");
	if (op.st != TE_OK)
		g_error("te_segment_close: %s: %s", te_status_str(op.st), op.err);
	g_assert_true(loggate_left(g));
}

void itest_free_waits_for_held_call(struct te_engine *e, struct loggate *g)
{
	struct held_op op = { .e = e };

	held_op_check(&op, g, "te_engine_free");
}
