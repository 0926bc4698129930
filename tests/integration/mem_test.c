/* SPDX-License-Identifier: Apache-2.0 */
/* mem_test.c: memory registration and unregistration errors through the public API. */
#include "itest.h"

static struct te_engine *new_engine(void)
{
	return itest_engine1("A", "loopback", "progress: manual", NULL);
}

static void expect_reg(struct te_engine *e, void *addr, size_t len, const char *loc,
		       uint32_t access, enum te_status want)
{
	enum te_status st = te_mem_register(e, addr, len, loc, access);

	g_test_message("register(%p, %zu, %s, %#x): %d %s: %s", addr, len, loc ? loc : "NULL",
		       access, st, te_status_str(st), st ? te_last_error() : "");
	if (st != want)
		g_error("te_mem_register(%p, %zu, %s, %#x) = %d (%s), want %d (%s): %s", addr, len,
			loc ? loc : "NULL", access, st, te_status_str(st), want,
			te_status_str(want), te_last_error());
}

static void test_register_unregister(void)
{
	struct te_engine *e = new_engine();
	g_autofree uint8_t *buf = g_malloc(1 << 16);

	assert_ok(te_mem_register(e, buf, 1 << 16, "cpu", TE_MEM_REMOTE));
	assert_ok(te_mem_unregister(e, buf));
	/* Again, with other spellings of the location. */
	assert_ok(te_mem_register(e, buf, 1 << 16, NULL, TE_MEM_LOCAL));
	assert_ok(te_mem_unregister(e, buf));
	assert_ok(te_mem_register(e, buf, 1 << 16, "*", TE_MEM_REMOTE_READ));
	assert_ok(te_mem_unregister(e, buf));
	assert_ok(te_mem_register(e, buf, 1 << 16, "cpu:0", TE_MEM_REMOTE_WRITE));
	assert_ok(te_mem_unregister(e, buf));
	/* Twice: the second time it is gone. */
	assert_status(te_mem_unregister(e, buf), TE_ERR_NOT_REGISTERED);
	te_engine_free(e);
}

static void test_register_invalid(void)
{
	struct te_engine *e = new_engine();
	g_autofree uint8_t *buf = g_malloc(4096);

	expect_reg(e, buf, 0, "cpu", TE_MEM_REMOTE, TE_ERR_INVALID_ARG);
	expect_reg(e, NULL, 4096, "cpu", TE_MEM_REMOTE, TE_ERR_INVALID_ARG);
	expect_reg(e, buf, 4096, "bogus", TE_MEM_REMOTE, TE_ERR_INVALID_ARG);
	expect_reg(e, buf, 4096, "cpu", 1u << 7, TE_ERR_INVALID_ARG);
	assert_status(te_mem_register(NULL, buf, 4096, "cpu", TE_MEM_REMOTE), TE_ERR_INVALID_ARG);
	/* Nothing of that was registered. */
	assert_status(te_mem_unregister(e, buf), TE_ERR_NOT_REGISTERED);
	te_engine_free(e);
}

static void test_register_overflow(void)
{
	struct te_engine *e = new_engine();

	/* addr + length wraps around the address space: refused before any transport. */
	expect_reg(e, (void *)(UINTPTR_MAX - 4095), 8192, "cpu", TE_MEM_REMOTE, TE_ERR_OVERFLOW);
	expect_reg(e, (void *)(UINTPTR_MAX - 15), SIZE_MAX, "cpu", TE_MEM_REMOTE, TE_ERR_OVERFLOW);
	te_engine_free(e);
}

static void test_register_overlap(void)
{
	struct te_engine *e = new_engine();
	g_autofree uint8_t *buf = g_malloc(3 * 4096);
	uint8_t *mid = buf + 4096;

	assert_ok(te_mem_register(e, mid, 4096, "cpu", TE_MEM_REMOTE));
	expect_reg(e, mid, 4096, "cpu", TE_MEM_REMOTE, TE_ERR_ADDRESS_OVERLAPPED);     /* same */
	expect_reg(e, mid + 100, 10, "cpu", TE_MEM_REMOTE, TE_ERR_ADDRESS_OVERLAPPED); /* inside */
	expect_reg(e, buf, 4097, "cpu", TE_MEM_REMOTE, TE_ERR_ADDRESS_OVERLAPPED);     /* head */
	expect_reg(e, mid + 4095, 4096, "cpu", TE_MEM_REMOTE, TE_ERR_ADDRESS_OVERLAPPED); /* tail */
	expect_reg(e, buf, 3 * 4096, "cpu", TE_MEM_REMOTE, TE_ERR_ADDRESS_OVERLAPPED); /* around */
	/* Adjacent on both sides is fine. */
	assert_ok(te_mem_register(e, buf, 4096, "cpu", TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, mid + 4096, 4096, "cpu", TE_MEM_REMOTE));
	assert_ok(te_mem_unregister(e, buf));
	assert_ok(te_mem_unregister(e, mid));
	assert_ok(te_mem_unregister(e, mid + 4096));
	te_engine_free(e);
}

static void test_unregister_unknown(void)
{
	struct te_engine *e = new_engine();
	g_autofree uint8_t *buf = g_malloc(8192);

	assert_status(te_mem_unregister(e, buf), TE_ERR_NOT_REGISTERED);
	g_assert_cmpint(te_mem_unregister(e, NULL), <, 0);
	assert_ok(te_mem_register(e, buf, 8192, "cpu", TE_MEM_REMOTE));
	/* Only the start address identifies a region. */
	assert_status(te_mem_unregister(e, buf + 1), TE_ERR_NOT_REGISTERED);
	assert_status(te_mem_unregister(e, buf + 4096), TE_ERR_NOT_REGISTERED);
	assert_ok(te_mem_unregister(e, buf));
	te_engine_free(e);
}

static void test_unregister_busy(gconstpointer data)
{
	/*
	 * A live batch refers to the local region: unregister is BUSY until the batch
	 * is freed, whether it is still in flight or already terminal.
	 */
	const char *plugin = data;
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r;
	te_batch_id bid;

	itest_pair_new(&p, plugin, NULL, "timeout_ms: 60000");
	itest_buf_new(&la, 4096, 0, 1);
	itest_buf_new(&rb, 4096, 0, 2);
	itest_buf_register(&la, p.a, TE_MEM_LOCAL);
	itest_buf_register(&rb, p.b, TE_MEM_REMOTE);
	itest_pair_connect(&p);

	r = (struct te_request){ TE_OP_WRITE, p.seg, la.data, itest_raddr(&rb, 0), 4096 };
	assert_ok(te_batch_new(p.a, 1, &bid));
	assert_ok(te_batch_submit(p.a, bid, &r, 1));
	assert_status(te_mem_unregister(p.a, la.base), TE_ERR_BUSY);
	g_test_message("unregister busy: %s", te_last_error());
	if (g_str_equal(plugin, "never_complete")) {
		assert_ok(te_batch_cancel(p.a, bid));
		assert_status(itest_wait(p.a, bid), TE_ERR_CANCELED);
	} else {
		assert_ok(itest_wait(p.a, bid));
	}
	/* Terminal but not freed: still referenced. */
	assert_status(te_mem_unregister(p.a, la.base), TE_ERR_BUSY);
	assert_ok(te_batch_free(p.a, bid));
	assert_ok(te_mem_unregister(p.a, la.base));
	assert_ok(te_mem_unregister(p.b, rb.base));
	itest_pair_free(&p);
	itest_buf_free(&la);
	itest_buf_free(&rb);
}

struct reg_job {
	struct te_engine *e;
	uint8_t *base;
	unsigned n;
	size_t each;
	enum te_status st;
};

static gpointer reg_thread(gpointer data)
{
	struct reg_job *j = data;

	for (unsigned round = 0; round < 4; round++) {
		for (unsigned i = 0; i < j->n && j->st == TE_OK; i++)
			j->st = te_mem_register(j->e, j->base + i * j->each, j->each, "cpu",
						TE_MEM_REMOTE);
		for (unsigned i = 0; i < j->n && j->st == TE_OK; i++)
			j->st = te_mem_unregister(j->e, j->base + i * j->each);
	}
	return NULL;
}

static void test_register_concurrent(void)
{
	/* Threads register and unregister disjoint, adjacent regions of one engine at once. */
	enum {
		THREADS = 4,
		PER = 64,
		EACH = 256
	};
	struct te_engine *e = new_engine();
	g_autofree uint8_t *buf = g_malloc(THREADS * PER * EACH);
	struct reg_job jobs[THREADS];
	GThread *t[THREADS];

	for (int i = 0; i < THREADS; i++) {
		jobs[i] = (struct reg_job){ e, buf + (size_t)i * PER * EACH, PER, EACH, TE_OK };
		t[i] = g_thread_new("reg", reg_thread, &jobs[i]);
	}
	for (int i = 0; i < THREADS; i++) {
		g_thread_join(t[i]);
		g_assert_cmpint(jobs[i].st, ==, TE_OK);
	}
	/* Everything was unregistered. */
	assert_status(te_mem_unregister(e, buf), TE_ERR_NOT_REGISTERED);
	te_engine_free(e);
}

static void test_engine_free_with_registered(void)
{
	/* te_engine_free releases what is still registered (ASan reports leaks). */
	struct te_engine *e = new_engine();
	g_autofree uint8_t *buf = g_malloc(8192);

	assert_ok(te_mem_register(e, buf, 4096, "cpu", TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, buf + 4096, 4096, "cpu", TE_MEM_LOCAL));
	te_engine_free(e);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/mem/register-unregister", test_register_unregister);
	g_test_add_func("/mem/register-invalid", test_register_invalid);
	g_test_add_func("/mem/register-overflow", test_register_overflow);
	g_test_add_func("/mem/register-overlap", test_register_overlap);
	g_test_add_func("/mem/unregister-unknown", test_unregister_unknown);
	g_test_add_data_func("/mem/unregister-busy/loopback", "loopback", test_unregister_busy);
	g_test_add_data_func("/mem/unregister-busy/never_complete", "never_complete",
			     test_unregister_busy);
	g_test_add_func("/mem/register-concurrent", test_register_concurrent);
	g_test_add_func("/mem/engine-free-with-registered", test_engine_free_with_registered);
	return g_test_run();
}
