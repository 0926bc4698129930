/* SPDX-License-Identifier: Apache-2.0 */
/* handle_test.c: stale, forged and zero batch handles are rejected by every batch call. */
#include "itest.h"

static void fx_new(struct itest_fx *f, const char *plugin)
{
	itest_fx_new(f, plugin, NULL, "timeout_ms: 60000", 4096, 0);
}

/* Every batch call on @bid must answer TE_ERR_INVALID_HANDLE and leave outputs alone. */
static void expect_invalid_everywhere(struct itest_fx *f, struct te_engine *e, te_batch_id bid,
				      const char *what)
{
	struct te_request r = { TE_OP_READ, f->p.seg, f->la.data, itest_raddr(&f->rb, 0), 64 };
	struct te_task_info ti;
	struct te_batch_info bi;

	g_test_message("%s handle %#" PRIx64, what, bid);
	memset(&ti, 0xa5, sizeof(ti));
	memset(&bi, 0xa5, sizeof(bi));
	assert_status(te_batch_submit(e, bid, &r, 1), TE_ERR_INVALID_HANDLE);
	assert_status(te_task_status(e, bid, 0, &ti), TE_ERR_INVALID_HANDLE);
	assert_status(te_batch_status(e, bid, &bi), TE_ERR_INVALID_HANDLE);
	assert_status(te_batch_wait(e, bid, 0), TE_ERR_INVALID_HANDLE);
	assert_status(te_batch_wait(e, bid, 1000000), TE_ERR_INVALID_HANDLE);
	assert_status(te_batch_cancel(e, bid), TE_ERR_INVALID_HANDLE);
	assert_status(te_batch_free(e, bid), TE_ERR_INVALID_HANDLE);
	g_assert_cmpuint(((uint8_t *)&ti)[0], ==, 0xa5);
	g_assert_cmpuint(((uint8_t *)&bi)[0], ==, 0xa5);
}

static void test_zero(void)
{
	struct itest_fx f;

	fx_new(&f, "loopback");
	expect_invalid_everywhere(&f, f.p.a, 0, "zero");
	itest_fx_free(&f);
}

static void test_stale(void)
{
	struct itest_fx f;
	struct te_request r;
	te_batch_id bid, next;

	fx_new(&f, "loopback");
	r = (struct te_request){ TE_OP_READ, f.p.seg, f.la.data, itest_raddr(&f.rb, 0), 64 };
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, &r, 1));
	assert_ok(itest_wait(f.p.a, bid));
	assert_ok(te_batch_free(f.p.a, bid));
	expect_invalid_everywhere(&f, f.p.a, bid, "freed");

	/* The slot is reused by a new batch: the old handle is still stale. */
	assert_ok(te_batch_new(f.p.a, 1, &next));
	expect_invalid_everywhere(&f, f.p.a, bid, "freed, slot reused");
	g_assert_cmpuint(itest_batch(f.p.a, next).tasks, ==, 0);
	assert_ok(te_batch_free(f.p.a, next));
	itest_fx_free(&f);
}

static void test_forged(void)
{
	struct itest_fx f;
	te_batch_id bid;
	GRand *rnd = g_rand_new_with_seed(0x7e7e);

	fx_new(&f, "loopback");
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	for (int i = 0; i < 200; i++) {
		te_batch_id forged = ((uint64_t)g_rand_int(rnd) << 32) | g_rand_int(rnd);

		if (forged == bid)
			continue;
		expect_invalid_everywhere(&f, f.p.a, forged, "random");
	}
	/* Near misses of the live handle: other generation or slot bits. */
	for (int bit = 0; bit < 64; bit++)
		expect_invalid_everywhere(&f, f.p.a, bid ^ (1ull << bit), "bit-flipped");
	expect_invalid_everywhere(&f, f.p.a, UINT64_MAX, "all ones");
	/* The live one still works after all that. */
	g_assert_cmpuint(itest_batch(f.p.a, bid).tasks, ==, 0);
	assert_ok(te_batch_free(f.p.a, bid));
	g_rand_free(rnd);
	itest_fx_free(&f);
}

static void test_other_engine(void)
{
	/* A handle of engine A means nothing to engine B, which has no batches. */
	struct itest_fx f;
	te_batch_id bid;

	fx_new(&f, "loopback");
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	expect_invalid_everywhere(&f, f.p.b, bid, "other engine's");
	assert_ok(te_batch_free(f.p.a, bid));
	itest_fx_free(&f);
}

static void test_free_busy(void)
{
	struct itest_fx f;
	struct te_request r;
	struct te_batch_info bi;
	te_batch_id bid;

	fx_new(&f, "never_complete");
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, f.la.data, itest_raddr(&f.rb, 0), 64 };
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, &r, 1));
	assert_status(te_batch_free(f.p.a, bid), TE_ERR_BUSY);
	g_test_message("free busy: %s", te_last_error());
	/* The refused free left the batch intact. */
	bi = itest_batch(f.p.a, bid);
	g_assert_false(te_state_is_terminal(bi.state));
	g_assert_cmpuint(bi.tasks, ==, 1);
	assert_ok(te_batch_cancel(f.p.a, bid));
	assert_status(itest_wait(f.p.a, bid), TE_ERR_CANCELED);
	assert_ok(te_batch_free(f.p.a, bid));
	expect_invalid_everywhere(&f, f.p.a, bid, "freed after cancel");
	itest_fx_free(&f);
}

static void test_engine_free_with_live_batches(void)
{
	/* te_engine_free cancels what is in flight and releases unfreed batches. */
	struct itest_fx f;
	struct te_request r;
	te_batch_id bid, done;

	fx_new(&f, "never_complete");
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, f.la.data, itest_raddr(&f.rb, 0), 64 };
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, &r, 1));
	assert_ok(te_batch_new(f.p.a, 1, &done));
	itest_fx_free(&f);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/handle/zero", test_zero);
	g_test_add_func("/handle/stale", test_stale);
	g_test_add_func("/handle/forged", test_forged);
	g_test_add_func("/handle/other-engine", test_other_engine);
	g_test_add_func("/handle/free-busy", test_free_busy);
	g_test_add_func("/handle/engine-free-with-live-batches",
			test_engine_free_with_live_batches);
	return g_test_run();
}
