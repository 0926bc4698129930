/* SPDX-License-Identifier: Apache-2.0 */
/* staging_test.c: GPU memory over tcp through host staging, with a fake GPU kind (fakegpu). */

/*
 * Each engine loads fakegpu (owns the "cuda" kind; its device memory faults on any direct CPU
 * access) and tcp. A cuda region as the local side is staged by the core (bounce buffers);
 * as the remote target it is served by tcp through its staging buffers. Every byte is checked
 * through te_mem_copy; a transport that touched device memory directly would crash the test.
 */
#include "itest.h"

#include <json-glib/json-glib.h>

#define MiB (1024u * 1024u)

static struct te_engine *engine_gpu(const char *name, const char *fakegpu_opts,
				    const char *tcp_opts, const char *transfer)
{
	struct itest_transport t[2] = {
		{ .name = "fakegpu", .required = true, .options = fakegpu_opts },
		{ .name = "tcp", .required = true, .options = tcp_opts },
	};
	g_autofree char *yaml = itest_yaml(name, t, 2, transfer);

	return itest_engine(yaml);
}

/* @len bytes at @location, filled with pattern @seed (through te_mem_copy for device memory). */
static void *gpu_buf(struct te_engine *e, const char *location, size_t len, uint32_t seed)
{
	g_autofree uint8_t *host = g_malloc(len);
	void *p = NULL;

	assert_ok(te_mem_alloc(e, location, len, &p));
	for (size_t i = 0; i < len; i++)
		host[i] = itest_pattern(seed, i);
	assert_ok(te_mem_copy(e, p, host, len));
	return p;
}

/* Whether @len bytes at device or host @p equal pattern @seed from offset @off. */
static bool gpu_is(struct te_engine *e, const void *p, size_t len, uint32_t seed, size_t off)
{
	g_autofree uint8_t *host = g_malloc(len);

	assert_ok(te_mem_copy(e, host, p, len));
	for (size_t i = 0; i < len; i++) {
		if (host[i] != itest_pattern(seed, off + i)) {
			g_test_message("byte %zu: 0x%02x, expected 0x%02x", i, host[i],
				       itest_pattern(seed, off + i));
			return false;
		}
	}
	return true;
}

static enum te_status run(struct te_engine *a, const struct te_request *r, size_t n,
			  te_batch_id *bid_out)
{
	te_batch_id bid;

	assert_ok(te_batch_new(a, (uint32_t)n, &bid));
	assert_ok(te_batch_submit(a, bid, r, n));
	*bid_out = bid;
	return te_batch_wait(a, bid, ITEST_WAIT_NS);
}

static void connect_pair(struct itest_pair *p)
{
	itest_pair_connect(p);
}

struct stage_case {
	const char *local;  /* location of A's buffer */
	const char *remote; /* location of B's buffer */
	uint64_t len;
};

/* WRITE A -> B then READ B -> A, each of the case's size, every byte checked both ways. */
static void test_sizes(gconstpointer data)
{
	const struct stage_case *c = data;
	const size_t span = 20 * MiB;
	struct itest_pair p;
	struct te_request r;
	struct te_task_info ti;
	te_batch_id bid;
	uint8_t *la, *rb;
	const size_t loff = 3, roff = 4096 + 5;

	p.a = engine_gpu("A", NULL, NULL, "timeout_ms: 60000");
	p.b = engine_gpu("B", NULL, NULL, NULL);
	la = gpu_buf(p.a, c->local, span, 0x51);
	rb = gpu_buf(p.b, c->remote, span, 0x62);
	assert_ok(te_mem_register(p.a, la, span, c->local, TE_MEM_LOCAL));
	assert_ok(te_mem_register(p.b, rb, span, c->remote, TE_MEM_REMOTE));
	connect_pair(&p);

	r = (struct te_request){ TE_OP_WRITE, p.seg, la + loff, (uintptr_t)rb + roff, c->len };
	assert_ok(run(p.a, &r, 1, &bid));
	ti = itest_task(p.a, bid, 0);
	g_assert_cmpstr(ti.transport, ==, "tcp");
	if (strcmp(c->local, "cpu") != 0)
		assert_contains(ti.device, "(staged)");
	g_assert_cmpuint(ti.bytes, ==, c->len);
	assert_ok(te_batch_free(p.a, bid));
	g_assert_true(gpu_is(p.b, rb + roff, c->len, 0x51, loff));
	/* Around it: untouched. */
	g_assert_true(gpu_is(p.b, rb, roff, 0x62, 0));
	g_assert_true(gpu_is(p.b, rb + roff + c->len, 4096, 0x62, roff + c->len));

	/* READ back into another part of A's buffer. */
	r = (struct te_request){ TE_OP_READ, p.seg, la + 10 * MiB, (uintptr_t)rb + roff, c->len };
	assert_ok(run(p.a, &r, 1, &bid));
	assert_ok(te_batch_free(p.a, bid));
	g_assert_true(gpu_is(p.a, la + 10 * MiB, c->len, 0x51, loff));
	g_assert_true(gpu_is(p.a, la + 10 * MiB + c->len, 4096, 0x51, 10 * MiB + c->len));

	assert_ok(te_mem_unregister(p.a, la));
	assert_ok(te_mem_unregister(p.b, rb));
	assert_ok(te_mem_free(p.a, la));
	assert_ok(te_mem_free(p.b, rb));
	itest_pair_free(&p);
}

/* A batch of 1000 staged WRITEs of 64 KiB: more than the bounce buffers, so some wait. */
static void test_batch_1000(void)
{
	enum {
		N = 1000,
		LEN = 65536
	};
	struct itest_pair p;
	struct te_request *r = g_new(struct te_request, N);
	struct te_batch_info bi;
	te_batch_id bid;
	uint8_t *la, *rb;

	p.a = engine_gpu("A", NULL, "slice_size: 64K", "timeout_ms: 60000");
	p.b = engine_gpu("B", NULL, NULL, NULL);
	la = gpu_buf(p.a, "cuda:0", (size_t)N * LEN, 0x71);
	rb = gpu_buf(p.b, "cuda:1", (size_t)N * LEN, 0x72);
	assert_ok(te_mem_register(p.a, la, (size_t)N * LEN, "*", TE_MEM_LOCAL));
	assert_ok(te_mem_register(p.b, rb, (size_t)N * LEN, "*", TE_MEM_REMOTE));
	connect_pair(&p);
	for (int i = 0; i < N; i++)
		r[i] = (struct te_request){ TE_OP_WRITE, p.seg, la + (size_t)i * LEN,
					    (uintptr_t)rb + (size_t)(N - 1 - i) * LEN, LEN };
	assert_ok(run(p.a, r, N, &bid));
	assert_ok(te_batch_status(p.a, bid, &bi));
	g_assert_cmpuint(bi.completed, ==, N);
	assert_ok(te_batch_free(p.a, bid));
	for (int i = 0; i < N; i++)
		g_assert_true(
			gpu_is(p.b, rb + (size_t)(N - 1 - i) * LEN, LEN, 0x71, (size_t)i * LEN));
	assert_ok(te_mem_unregister(p.a, la));
	assert_ok(te_mem_unregister(p.b, rb));
	itest_pair_free(&p);
	g_free(r);
}

/* Location detection and the errors of a wrong location. */
static void test_locations(void)
{
	struct te_engine *e = engine_gpu("A", NULL, NULL, NULL);
	g_autofree char *json = NULL;
	uint8_t *d0, *d1, host[64];
	size_t len = 0;
	void *p = NULL;

	d0 = gpu_buf(e, "cuda:0", MiB, 1);
	d1 = gpu_buf(e, "cuda:1", MiB, 2);
	/* "*" asks the owner. */
	assert_ok(te_mem_register(e, d1, MiB, "*", TE_MEM_REMOTE));
	assert_ok(te_segment_export(e, (char **)&json, &len));
	assert_contains(json, "\"cuda:1\"");
	assert_ok(te_mem_unregister(e, d1));
	/* A location that disagrees with the owner. */
	assert_status(te_mem_register(e, d0, MiB, "cuda:1", TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "is cuda:0 memory, not 'cuda:1'");
	assert_status(te_mem_register(e, d0, MiB, "cpu", TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "is cuda:0 memory, not 'cpu'");
	assert_status(te_mem_register(e, host, sizeof(host), "cuda:0", TE_MEM_REMOTE),
		      TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "is not cuda:0 memory");
	/* A range that runs past its allocation. */
	assert_status(te_mem_register(e, d0 + 4096, MiB, "*", TE_MEM_REMOTE), TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), "runs past its allocation");
	/* "*" on memory nobody has. */
	assert_status(te_mem_register(e, (void *)(uintptr_t)0x1000, 4096, "*", TE_MEM_REMOTE),
		      TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "not host memory of this process");
	/* A device that does not exist. */
	assert_status(te_mem_alloc(e, "cuda:7", 4096, &p), TE_ERR_NO_DEVICE);
	assert_contains(te_last_error(), "no device 7");
	assert_status(te_mem_alloc(e, "hip:0", 4096, &p), TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "no loaded transport owns hip memory");
	assert_ok(te_mem_free(e, d0));
	assert_ok(te_mem_free(e, d1));
	assert_status(te_mem_free(e, host), TE_ERR_NOT_FOUND);
	te_engine_free(e);
}

/* A failing device copy ends the task with the owner's reason, on either side. */
static void test_copy_failure(void)
{
	struct itest_pair p;
	struct te_request r;
	struct te_task_info ti;
	te_batch_id bid;
	uint8_t *la, *rb;

	/* B's fakegpu fails every copy after the 1st (the fill of its buffer). */
	p.a = engine_gpu("A", NULL, NULL, "timeout_ms: 60000, retries: 0");
	p.b = engine_gpu("B", "fail_copy_after: 1", NULL, NULL);
	la = gpu_buf(p.a, "cuda:0", MiB, 0x11);
	rb = gpu_buf(p.b, "cuda:0", MiB, 0x22);
	assert_ok(te_mem_register(p.a, la, MiB, "cuda:0", TE_MEM_LOCAL));
	assert_ok(te_mem_register(p.b, rb, MiB, "cuda:0", TE_MEM_REMOTE));
	connect_pair(&p);
	r = (struct te_request){ TE_OP_WRITE, p.seg, la, (uintptr_t)rb, 4096 };
	g_assert_cmpint(run(p.a, &r, 1, &bid), ==, TE_ERR_DEVICE_FAILED);
	ti = itest_task(p.a, bid, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
	assert_contains(ti.detail, "into cuda:0: the staging copy failed");
	assert_ok(te_batch_free(p.a, bid));
	r.opcode = TE_OP_READ;
	g_assert_cmpint(run(p.a, &r, 1, &bid), ==, TE_ERR_DEVICE_FAILED);
	ti = itest_task(p.a, bid, 0);
	assert_contains(ti.detail, "of cuda:0: the staging copy failed");
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);

	/* A's side: the core's staging copy fails. */
	p.a = engine_gpu("A", "fail_copy_after: 1", NULL, "timeout_ms: 60000, retries: 0");
	p.b = engine_gpu("B", NULL, NULL, NULL);
	la = gpu_buf(p.a, "cuda:0", MiB, 0x11);
	rb = gpu_buf(p.b, "cuda:0", MiB, 0x22);
	assert_ok(te_mem_register(p.a, la, MiB, "cuda:0", TE_MEM_LOCAL));
	assert_ok(te_mem_register(p.b, rb, MiB, "cuda:0", TE_MEM_REMOTE));
	connect_pair(&p);
	r = (struct te_request){ TE_OP_WRITE, p.seg, la, (uintptr_t)rb, 4096 };
	g_assert_cmpint(run(p.a, &r, 1, &bid), ==, TE_ERR_DEVICE_FAILED);
	ti = itest_task(p.a, bid, 0);
	assert_contains(ti.detail, "staging: copying 4096 bytes out of cuda:0");
	assert_ok(te_batch_free(p.a, bid));
	g_assert_true(gpu_is(p.b, rb, MiB, 0x22, 0)); /* nothing landed */
	r.opcode = TE_OP_READ;
	g_assert_cmpint(run(p.a, &r, 1, &bid), ==, TE_ERR_DEVICE_FAILED);
	ti = itest_task(p.a, bid, 0);
	assert_contains(ti.detail, "staging: copying 4096 bytes into cuda:0");
	assert_ok(te_batch_free(p.a, bid));
	itest_pair_free(&p);
}

/* Without an owner of the kind, neither side can stage: clear refusals. */
static void test_no_owner(void)
{
	struct te_engine *e = itest_engine1("A", "tcp", NULL, NULL);
	uint8_t buf[4096];
	void *p = NULL;

	assert_status(te_mem_register(e, buf, sizeof(buf), "cuda:0", TE_MEM_REMOTE),
		      TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "no loaded transport owns that kind");
	assert_status(te_mem_alloc(e, "cuda:0", 4096, &p), TE_ERR_MEMORY_TYPE);
	te_engine_free(e);
}

int main(int argc, char **argv)
{
	static const struct stage_case cases[] = {
		{ "cuda:0", "cpu", 1 },
		{ "cuda:0", "cpu", 4096 },
		{ "cuda:0", "cpu", 3 * MiB + 7 },
		{ "cpu", "cuda:0", 1 },
		{ "cpu", "cuda:0", 3 * MiB + 7 },
		{ "cuda:0", "cuda:1", 1 },
		{ "cuda:1", "cuda:0", 64 * 1024 },
		{ "cuda:0", "cuda:0", 5 * MiB + 3 },
	};

	g_test_init(&argc, &argv, NULL);
	for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
		g_autofree char *path =
			g_strdup_printf("/staging/tcp/%s-to-%s/%" PRIu64, cases[i].local,
					cases[i].remote, cases[i].len);

		for (char *q = path; *q; q++)
			if (*q == ':')
				*q = '_';
		g_test_add_data_func(path, &cases[i], test_sizes);
	}
	g_test_add_func("/staging/tcp/batch-1000", test_batch_1000);
	g_test_add_func("/staging/locations", test_locations);
	g_test_add_func("/staging/copy-failure", test_copy_failure);
	g_test_add_func("/staging/no-owner", test_no_owner);
	return g_test_run();
}
