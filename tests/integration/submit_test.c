/* SPDX-License-Identifier: Apache-2.0 */
/* submit_test.c: requests rejected at submit become INVALID tasks with status and detail. */
#include "itest.h"

/* Buffers of the fixture: A's local ones, B's with each access mode. */
struct fx {
	struct itest_pair p;
	struct itest_buf la;	 /* A: registered, local only */
	struct itest_buf unreg;	 /* A: never registered */
	struct itest_buf rb;	 /* B: REMOTE (read and write) */
	struct itest_buf rb_loc; /* B: LOCAL only */
	struct itest_buf rb_ro;	 /* B: REMOTE_READ */
	struct itest_buf rb_wo;	 /* B: REMOTE_WRITE */
};

static void fx_new(struct fx *f)
{
	itest_pair_new(&f->p, "loopback", "progress: manual", "timeout_ms: 60000");
	itest_buf_new(&f->la, 4096, 0, 1);
	itest_buf_new(&f->unreg, 4096, 0, 2);
	itest_buf_new(&f->rb, 4096, 0, 3);
	itest_buf_new(&f->rb_loc, 4096, 0, 4);
	itest_buf_new(&f->rb_ro, 4096, 0, 5);
	itest_buf_new(&f->rb_wo, 4096, 0, 6);
	itest_buf_register(&f->la, f->p.a, TE_MEM_LOCAL);
	itest_buf_register(&f->rb, f->p.b, TE_MEM_REMOTE);
	itest_buf_register(&f->rb_loc, f->p.b, TE_MEM_LOCAL);
	itest_buf_register(&f->rb_ro, f->p.b, TE_MEM_REMOTE_READ);
	itest_buf_register(&f->rb_wo, f->p.b, TE_MEM_REMOTE_WRITE);
	itest_pair_connect(&f->p);
}

static void fx_free(struct fx *f)
{
	itest_pair_free(&f->p);
	itest_buf_free(&f->la);
	itest_buf_free(&f->unreg);
	itest_buf_free(&f->rb);
	itest_buf_free(&f->rb_loc);
	itest_buf_free(&f->rb_ro);
	itest_buf_free(&f->rb_wo);
}

static struct te_request req(struct fx *f, enum te_opcode op, void *local, uint64_t remote,
			     uint64_t len)
{
	return (struct te_request){ op, f->p.seg, local, remote, len };
}

/* True if @s names @addr in hex (with or without 0x) or in decimal. */
static bool names_addr(const char *s, uint64_t addr)
{
	char hex[32], dec[32];

	snprintf(hex, sizeof(hex), "%" PRIx64, addr);
	snprintf(dec, sizeof(dec), "%" PRIu64, addr);
	return strstr(s, hex) || strstr(s, dec);
}

/*
 * Submit @r alone on a new batch and check the rejection: submit returns @want
 * (or one of @want, @alt when alt != TE_OK), the task is INVALID with that status
 * and a detail, and the batch is terminal, FAILED and freeable.
 */
static enum te_status expect_rejected(struct fx *f, const char *what, struct te_request r,
				      enum te_status want, enum te_status alt)
{
	struct te_task_info ti;
	struct te_batch_info bi;
	enum te_status st;
	te_batch_id bid;

	assert_ok(te_batch_new(f->p.a, 1, &bid));
	st = te_batch_submit(f->p.a, bid, &r, 1);
	g_test_message("%s: submit %d %s: %s", what, st, te_status_str(st), te_last_error());
	if (st != want && (alt == TE_OK || st != alt))
		g_error("%s: submit returned %d (%s), want %d (%s)", what, st, te_status_str(st),
			want, te_status_str(want));
	ti = itest_task(f->p.a, bid, 0);
	g_test_message("%s: task %s %s detail \"%s\"", what, te_state_str(ti.state),
		       te_status_str(ti.status), ti.detail);
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	g_assert_cmpint(ti.status, ==, st);
	g_assert_cmpstr(ti.detail, !=, "");
	g_assert_cmpuint(ti.bytes, ==, 0);
	g_assert_cmpuint(ti.length, ==, r.length);

	bi = itest_batch(f->p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_FAILED);
	g_assert_cmpuint(bi.tasks, ==, 1);
	g_assert_cmpuint(bi.failed, ==, 1);
	g_assert_cmpuint(bi.bytes, ==, 0);
	assert_status(itest_wait(f->p.a, bid), st);
	assert_ok(te_batch_free(f->p.a, bid));
	return st;
}

static void expect_accepted(struct fx *f, struct te_request r)
{
	te_batch_id bid;

	assert_ok(te_batch_new(f->p.a, 1, &bid));
	assert_ok(te_batch_submit(f->p.a, bid, &r, 1));
	assert_ok(itest_wait(f->p.a, bid));
	g_assert_cmpuint(itest_task(f->p.a, bid, 0).bytes, ==, r.length);
	assert_ok(te_batch_free(f->p.a, bid));
}

static void test_local_unregistered(void)
{
	struct fx f;

	fx_new(&f);
	expect_rejected(&f, "local unregistered",
			req(&f, TE_OP_READ, f.unreg.data, itest_raddr(&f.rb, 0), 64),
			TE_ERR_NOT_REGISTERED, TE_OK);
	fx_free(&f);
}

static void test_local_out_of_range(void)
{
	struct fx f;

	fx_new(&f);
	expect_rejected(&f, "local past the region",
			req(&f, TE_OP_READ, f.la.data + 4000, itest_raddr(&f.rb, 0), 200),
			TE_ERR_OUT_OF_RANGE, TE_OK);
	expect_rejected(&f, "local one byte past",
			req(&f, TE_OP_WRITE, f.la.data + 1, itest_raddr(&f.rb, 0), 4096),
			TE_ERR_OUT_OF_RANGE, TE_OK);
	/* Exactly up to the end is fine. */
	expect_accepted(&f, req(&f, TE_OP_READ, f.la.data + 4000, itest_raddr(&f.rb, 0), 96));
	fx_free(&f);
}

static void test_local_wraps(void)
{
	struct fx f;

	fx_new(&f);
	expect_rejected(&f, "local length wraps",
			req(&f, TE_OP_READ, f.la.data + 1, itest_raddr(&f.rb, 0), UINT64_MAX),
			TE_ERR_OVERFLOW, TE_ERR_OUT_OF_RANGE);
	fx_free(&f);
}

static void test_remote_outside(void)
{
	struct fx f;
	struct te_task_info ti;
	uint64_t ra;
	te_batch_id bid;
	struct te_request r;

	fx_new(&f);
	/* Straddles the end of B's buffer. */
	ra = itest_raddr(&f.rb, 4000);
	expect_rejected(&f, "remote past the end", req(&f, TE_OP_READ, f.la.data, ra, 200),
			TE_ERR_REMOTE_ACCESS, TE_OK);

	/* Nowhere near any buffer of B: the detail names the range. */
	r = req(&f, TE_OP_WRITE, f.la.data, 0x1000, 64);
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_status(te_batch_submit(f.p.a, bid, &r, 1), TE_ERR_REMOTE_ACCESS);
	ti = itest_task(f.p.a, bid, 0);
	g_test_message("remote 0x1000+64: detail \"%s\"", ti.detail);
	if (!names_addr(ti.detail, 0x1000))
		g_error("detail \"%s\" does not name the remote range 0x1000", ti.detail);
	assert_status(itest_wait(f.p.a, bid), TE_ERR_REMOTE_ACCESS);
	assert_ok(te_batch_free(f.p.a, bid));

	/* The detail of a straddling range names its start too. */
	r = req(&f, TE_OP_READ, f.la.data, ra, 200);
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_status(te_batch_submit(f.p.a, bid, &r, 1), TE_ERR_REMOTE_ACCESS);
	ti = itest_task(f.p.a, bid, 0);
	if (!names_addr(ti.detail, ra))
		g_error("detail \"%s\" does not name the remote range %#" PRIx64, ti.detail, ra);
	assert_ok(te_batch_free(f.p.a, bid));

	/* Wrapping remote range. */
	expect_rejected(&f, "remote wraps", req(&f, TE_OP_READ, f.la.data, UINT64_MAX - 10, 64),
			TE_ERR_REMOTE_ACCESS, TE_ERR_OVERFLOW);
	fx_free(&f);
}

static void test_remote_access_modes(void)
{
	struct fx f;

	fx_new(&f);
	/* Registered on B without remote access: invisible to peers either way. */
	expect_rejected(&f, "remote local-only, READ",
			req(&f, TE_OP_READ, f.la.data, itest_raddr(&f.rb_loc, 0), 64),
			TE_ERR_REMOTE_ACCESS, TE_OK);
	expect_rejected(&f, "remote local-only, WRITE",
			req(&f, TE_OP_WRITE, f.la.data, itest_raddr(&f.rb_loc, 0), 64),
			TE_ERR_REMOTE_ACCESS, TE_OK);
	/* Read-only: WRITE refused, READ fine. */
	expect_rejected(&f, "remote read-only, WRITE",
			req(&f, TE_OP_WRITE, f.la.data, itest_raddr(&f.rb_ro, 0), 64),
			TE_ERR_REMOTE_ACCESS, TE_OK);
	expect_accepted(&f, req(&f, TE_OP_READ, f.la.data, itest_raddr(&f.rb_ro, 0), 64));
	/* Write-only: READ refused, WRITE fine. */
	expect_rejected(&f, "remote write-only, READ",
			req(&f, TE_OP_READ, f.la.data, itest_raddr(&f.rb_wo, 0), 64),
			TE_ERR_REMOTE_ACCESS, TE_OK);
	expect_accepted(&f, req(&f, TE_OP_WRITE, f.la.data, itest_raddr(&f.rb_wo, 0), 64));
	/* The refused buffers were not touched. */
	g_assert_true(itest_untouched_outside(&f.rb_loc, NULL, NULL, 0));
	g_assert_true(itest_untouched_outside(&f.rb_ro, NULL, NULL, 0));
	fx_free(&f);
}

static void test_unknown_segment(void)
{
	struct fx f;
	struct te_request r;

	fx_new(&f);
	r = req(&f, TE_OP_READ, f.la.data, itest_raddr(&f.rb, 0), 64);
	r.segment = 4242;
	expect_rejected(&f, "unknown segment", r, TE_ERR_UNKNOWN_SEGMENT, TE_OK);
	fx_free(&f);
}

static void test_zero_length_bad_opcode(void)
{
	struct fx f;
	struct te_request r;

	fx_new(&f);
	expect_rejected(&f, "zero length", req(&f, TE_OP_READ, f.la.data, itest_raddr(&f.rb, 0), 0),
			TE_ERR_INVALID_ARG, TE_OK);
	r = req(&f, TE_OP_READ, f.la.data, itest_raddr(&f.rb, 0), 64);
	r.opcode = (enum te_opcode)7;
	expect_rejected(&f, "bad opcode", r, TE_ERR_INVALID_ARG, TE_OK);
	r.opcode = (enum te_opcode) - 1;
	expect_rejected(&f, "negative opcode", r, TE_ERR_INVALID_ARG, TE_OK);
	r = req(&f, TE_OP_READ, NULL, itest_raddr(&f.rb, 0), 64);
	expect_rejected(&f, "NULL local", r, TE_ERR_INVALID_ARG, TE_ERR_NOT_REGISTERED);
	fx_free(&f);
}

static void test_mixed(void)
{
	/* Valid requests proceed; the first rejection is returned and named by index. */
	enum {
		N = 8
	};
	struct fx f;
	struct te_request r[N];
	struct te_batch_info bi;
	uint64_t total = 0;
	enum te_status st;
	te_batch_id bid;

	fx_new(&f);
	for (size_t i = 0; i < N; i++)
		r[i] = req(&f, TE_OP_READ, f.la.data + i * 512, itest_raddr(&f.rb, i * 256),
			   100 + i);
	r[5].segment = 4242;  /* UNKNOWN_SEGMENT */
	r[6].length = 0;      /* INVALID_ARG */
	r[7].remote = 0x1000; /* REMOTE_ACCESS */
	for (size_t i = 0; i < 5; i++)
		total += r[i].length;

	assert_ok(te_batch_new(f.p.a, N, &bid));
	st = te_batch_submit(f.p.a, bid, r, N);
	g_test_message("mixed submit: %d %s: %s", st, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_UNKNOWN_SEGMENT);
	if (!g_regex_match_simple("(^|[^0-9])5([^0-9]|$)", te_last_error(), 0, 0))
		g_error("te_last_error \"%s\" does not name request index 5", te_last_error());

	assert_status(itest_wait(f.p.a, bid), TE_ERR_UNKNOWN_SEGMENT);
	for (size_t i = 0; i < 5; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, (uint32_t)i);

		g_assert_cmpint(ti.state, ==, TE_STATE_COMPLETED);
		g_assert_cmpuint(ti.bytes, ==, r[i].length);
		g_assert_true(itest_range_is(&f.la, i * 512, r[i].length, &f.rb, i * 256));
	}
	g_assert_cmpint(itest_task(f.p.a, bid, 5).status, ==, TE_ERR_UNKNOWN_SEGMENT);
	g_assert_cmpint(itest_task(f.p.a, bid, 6).status, ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(itest_task(f.p.a, bid, 7).status, ==, TE_ERR_REMOTE_ACCESS);
	for (uint32_t i = 5; i < N; i++)
		g_assert_cmpint(itest_task(f.p.a, bid, i).state, ==, TE_STATE_INVALID);

	bi = itest_batch(f.p.a, bid);
	g_assert_cmpint(bi.state, ==, TE_STATE_FAILED);
	g_assert_cmpuint(bi.tasks, ==, N);
	g_assert_cmpuint(bi.completed, ==, 5);
	g_assert_cmpuint(bi.failed, ==, 3);
	g_assert_cmpuint(bi.bytes, ==, total);
	assert_ok(te_batch_free(f.p.a, bid));
	fx_free(&f);
}

static void test_capacity(void)
{
	struct fx f;
	struct te_request r[4];
	struct te_task_info ti;
	te_batch_id bid;

	fx_new(&f);
	for (size_t i = 0; i < 4; i++)
		r[i] = req(&f, TE_OP_READ, f.la.data + i * 64, itest_raddr(&f.rb, i * 64), 64);
	assert_ok(te_batch_new(f.p.a, 4, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, r, 3));
	/* Two more do not fit: nothing is appended. */
	assert_status(te_batch_submit(f.p.a, bid, r, 2), TE_ERR_BATCH_FULL);
	g_test_message("batch full: %s", te_last_error());
	g_assert_cmpuint(itest_batch(f.p.a, bid).tasks, ==, 3);
	assert_status(te_task_status(f.p.a, bid, 3, &ti), TE_ERR_INVALID_ARG);
	assert_status(te_batch_submit(f.p.a, bid, r + 3, 1), TE_OK);
	g_assert_cmpuint(itest_batch(f.p.a, bid).tasks, ==, 4);
	assert_status(te_batch_submit(f.p.a, bid, r, 1), TE_ERR_BATCH_FULL);
	assert_ok(itest_wait(f.p.a, bid));
	g_assert_cmpuint(itest_batch(f.p.a, bid).completed, ==, 4);
	assert_ok(te_batch_free(f.p.a, bid));

	/* More than the capacity in a single submit. */
	assert_ok(te_batch_new(f.p.a, 2, &bid));
	assert_status(te_batch_submit(f.p.a, bid, r, 3), TE_ERR_BATCH_FULL);
	g_assert_cmpuint(itest_batch(f.p.a, bid).tasks, ==, 0);
	assert_ok(te_batch_free(f.p.a, bid));
	fx_free(&f);
}

static void test_bad_arguments(void)
{
	struct fx f;
	struct te_task_info ti;
	te_batch_id bid;

	fx_new(&f);
	assert_ok(te_batch_new(f.p.a, 1, &bid));
	assert_status(te_batch_submit(f.p.a, bid, NULL, 1), TE_ERR_INVALID_ARG);
	g_assert_cmpint(te_batch_submit(NULL, bid, NULL, 1), <, 0);
	assert_status(te_task_status(f.p.a, bid, 0, &ti), TE_ERR_INVALID_ARG);
	assert_status(te_task_status(f.p.a, bid, 0, NULL), TE_ERR_INVALID_ARG);
	assert_status(te_batch_status(f.p.a, bid, NULL), TE_ERR_INVALID_ARG);
	g_assert_cmpuint(itest_batch(f.p.a, bid).tasks, ==, 0);
	assert_ok(te_batch_free(f.p.a, bid));
	fx_free(&f);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/submit/local-unregistered", test_local_unregistered);
	g_test_add_func("/submit/local-out-of-range", test_local_out_of_range);
	g_test_add_func("/submit/local-wraps", test_local_wraps);
	g_test_add_func("/submit/remote-outside", test_remote_outside);
	g_test_add_func("/submit/remote-access-modes", test_remote_access_modes);
	g_test_add_func("/submit/unknown-segment", test_unknown_segment);
	g_test_add_func("/submit/zero-length-bad-opcode", test_zero_length_bad_opcode);
	g_test_add_func("/submit/mixed", test_mixed);
	g_test_add_func("/submit/capacity", test_capacity);
	g_test_add_func("/submit/bad-arguments", test_bad_arguments);
	return g_test_run();
}
