/* SPDX-License-Identifier: Apache-2.0 */
/* cxl_test.c: the cxl transport between two engines of this process on one window file. */

/*
 * Every test creates its window as a file under /dev/shm, maps it itself (the application's
 * mapping: target buffers are pointers into it, registered as cxl:0) and checks the bytes
 * that transfers moved through that mapping, independently of the plugin's own mapping.
 */
#include "itest.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxlnode.h"
#include "logcap.h"

#define KiB (1024u)
#define MiB (1024u * 1024u)

static const char *const default_transfer = "timeout_ms: 60000";

/* --- windows ----------------------------------------------------------------------------- */

/* Window files to remove when the test dies of a signal (a failing assertion, a timeout). */
#define MAX_FILES 64
static char file_paths[MAX_FILES][64];
static volatile sig_atomic_t n_files;

static void on_fatal(int sig)
{
	for (int i = 0; i < n_files; i++)
		unlink(file_paths[i]);
	signal(sig, SIG_DFL);
	raise(sig);
}

struct win {
	char *path;
	uint8_t *map; /* the test's (the application's) shared mapping */
	size_t size;
};

static void win_new(struct win *w, size_t size)
{
	static unsigned counter;
	int fd;

	w->path = g_strdup_printf("/dev/shm/te-cxl-test-%d-%u", (int)getpid(), counter++);
	if (n_files < MAX_FILES) {
		g_strlcpy(file_paths[n_files], w->path, sizeof(file_paths[0]));
		n_files++;
	}
	w->size = size;
	fd = open(w->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	g_assert_cmpint(fd, >=, 0);
	g_assert_cmpint(ftruncate(fd, (off_t)size), ==, 0);
	w->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	g_assert_true(w->map != MAP_FAILED);
	close(fd);
}

static void win_free(struct win *w)
{
	munmap(w->map, w->size);
	unlink(w->path);
	g_free(w->path);
}

/* An engine with the cxl transport on @w plus @extra options ("threads: 1"), or NULL + why. */
static enum te_status engine_try(const char *name, const char *device, const char *extra,
				 struct te_engine **e_out)
{
	g_autofree char *opts = g_strdup_printf("device: \"%s\"%s%s", device,
						extra && *extra ? ", " : "", extra ? extra : "");
	struct itest_transport t = { .name = "cxl", .required = true, .options = opts };
	g_autofree char *yaml = itest_yaml(name, &t, 1, default_transfer);

	return te_engine_new_from_string(yaml, strlen(yaml), e_out);
}

static struct te_engine *engine_on(const char *name, const struct win *w, const char *extra)
{
	struct te_engine *e = NULL;

	assert_ok(engine_try(name, w->path, extra, &e));
	return e;
}

/* Run one batch from @e; returns the wait status; *bid_out for task queries (free it). */
static enum te_status run_batch(struct te_engine *e, const struct te_request *r, size_t n,
				te_batch_id *bid_out)
{
	te_batch_id bid;
	enum te_status st;

	assert_ok(te_batch_new(e, (uint32_t)n, &bid));
	st = te_batch_submit(e, bid, r, n);
	if (st == TE_OK)
		st = itest_wait(e, bid);
	else
		(void)itest_wait(e, bid);
	*bid_out = bid;
	return st;
}

static void run_ok(struct te_engine *e, const struct te_request *r, size_t n)
{
	te_batch_id bid;

	assert_ok(run_batch(e, r, n, &bid));
	assert_ok(te_batch_free(e, bid));
}

/* --- transfers ------------------------------------------------------------------------------ */

/*
 * B's buffer is window bytes [B_OFF, +B_LEN) (unaligned on purpose), filled with pattern 0;
 * A's local buffer is anonymous memory.
 */
#define B_OFF (1 * MiB + 3)
#define B_LEN (6 * MiB)

struct fixture {
	struct win w;
	struct itest_pair p;
	uint8_t *bbuf;
	uint8_t *local; /* 2 * B_LEN + 128 */
};

static void fixture_new(struct fixture *f, const char *extra)
{
	win_new(&f->w, 8 * MiB);
	f->p.a = engine_on("A", &f->w, extra);
	f->p.b = engine_on("B", &f->w, extra);
	f->bbuf = f->w.map + B_OFF;
	cxlnode_fill(f->bbuf, 0, B_LEN, 0);
	assert_ok(te_mem_register(f->p.b, f->bbuf, B_LEN, "cxl:0", TE_MEM_REMOTE));
	f->local = g_malloc(2 * B_LEN + 128);
	assert_ok(te_mem_register(f->p.a, f->local, 2 * B_LEN + 128, "cpu", TE_MEM_LOCAL));
}

/* Import B's descriptor into A: after every buffer of B is registered. */
static void fixture_connect(struct fixture *f)
{
	itest_pair_connect(&f->p);
}

static void fixture_free(struct fixture *f)
{
	itest_pair_free(&f->p);
	g_free(f->local);
	win_free(&f->w);
}

static uint64_t raddr(const struct fixture *f, size_t off)
{
	return (uint64_t)(uintptr_t)(f->bbuf + off);
}

/* WRITE [lo, +len) of local (pattern @seed at offsets from @roff) to B at @roff, READ it back. */
static void write_read_check(struct fixture *f, size_t lo, size_t roff, size_t len, uint64_t seed)
{
	uint8_t *src = f->local + lo, *back = f->local + B_LEN + 64 + (lo % 64);
	struct te_request r;
	size_t bad;

	cxlnode_fill(src, roff, len, seed);
	r = (struct te_request){ TE_OP_WRITE, f->p.seg, src, raddr(f, roff), len };
	run_ok(f->p.a, &r, 1);
	bad = cxlnode_check(f->bbuf + roff, roff, len, seed);
	if (bad != len)
		g_error("WRITE of %zu bytes to +%zu: byte %zu wrong in the window", len, roff, bad);
	/* Neighbours keep pattern 0 (or what an earlier step wrote: checked by the caller). */
	memset(back - 1, 0xa5, len + 2);
	r = (struct te_request){ TE_OP_READ, f->p.seg, back, raddr(f, roff), len };
	run_ok(f->p.a, &r, 1);
	bad = cxlnode_check(back, roff, len, seed);
	if (bad != len)
		g_error("READ of %zu bytes from +%zu: byte %zu wrong", len, roff, bad);
	g_assert_cmpuint(back[-1], ==, 0xa5);
	g_assert_cmpuint(back[len], ==, 0xa5);
}

static void test_transfer(void)
{
	static const size_t lens[] = { 1,     2,     3,		 7,	      15,
				       16,    17,    31,	 32,	      33,
				       63,    64,    65,	 100,	      127,
				       128,   129,   4095,	 4096,	      4097,
				       65535, 65537, 262144 + 5, 1 * MiB + 1, 3 * MiB + 7 };
	struct fixture f;
	te_batch_id bid;
	struct te_task_info ti;
	struct te_request r;
	g_autofree char *base = NULL;

	fixture_new(&f, NULL);
	fixture_connect(&f);
	for (size_t i = 0; i < G_N_ELEMENTS(lens); i++) {
		size_t roff = (i * 13 + 5) % 64 + (i % 3) * 4096, lo = (i * 7 + 1) % 64;

		write_read_check(&f, lo, roff, lens[i], 10 + i);
		/* Bytes just around the written range were not touched. */
		g_assert_cmpuint(cxlnode_check(f.bbuf + roff + lens[i], roff + lens[i], 1, 0), ==,
				 1);
		if (roff)
			g_assert_cmpuint(cxlnode_check(f.bbuf + roff - 1, roff - 1, 1, 0), ==, 1);
		cxlnode_fill(f.bbuf, 0, B_LEN, 0);
	}
	/* The task reports the transport and the window device. */
	r = (struct te_request){ TE_OP_READ, f.p.seg, f.local, raddr(&f, 0), 4096 };
	assert_ok(run_batch(f.p.a, &r, 1, &bid));
	ti = itest_task(f.p.a, bid, 0);
	g_assert_cmpstr(ti.transport, ==, "cxl");
	base = g_path_get_basename(f.w.path);
	g_assert_cmpstr(ti.device, ==, base);
	assert_ok(te_batch_free(f.p.a, bid));
	fixture_free(&f);
}

/* Many requests of random sizes in one batch, WRITEs then READs, every byte checked. */
static void test_many_requests(void)
{
	enum {
		N = 1500
	};
	struct fixture f;
	struct te_request *r = g_new0(struct te_request, N);
	size_t *roff = g_new0(size_t, N), *len = g_new0(size_t, N);
	size_t at = 0;
	GRand *rng = g_rand_new_with_seed(7);

	fixture_new(&f, "threads: 3, chunk_size: 4K");
	fixture_connect(&f);
	for (size_t i = 0; i < N; i++) {
		len[i] = (size_t)g_rand_int_range(rng, 1, 3000);
		roff[i] = at + (size_t)g_rand_int_range(rng, 0, 9);
		at = roff[i] + len[i];
		g_assert_cmpuint(at, <, B_LEN);
		cxlnode_fill(f.local + roff[i], roff[i], len[i], 99);
		r[i] = (struct te_request){ TE_OP_WRITE, f.p.seg, f.local + roff[i],
					    raddr(&f, roff[i]), len[i] };
	}
	run_ok(f.p.a, r, N);
	memset(f.local + B_LEN, 0, B_LEN);
	for (size_t i = 0; i < N; i++) {
		g_assert_cmpuint(cxlnode_check(f.bbuf + roff[i], roff[i], len[i], 99), ==, len[i]);
		if (i + 1 < N && roff[i] + len[i] < roff[i + 1])
			g_assert_cmpuint(cxlnode_check(f.bbuf + roff[i] + len[i], roff[i] + len[i],
						       roff[i + 1] - roff[i] - len[i], 0),
					 ==, roff[i + 1] - roff[i] - len[i]);
		r[i] = (struct te_request){ TE_OP_READ, f.p.seg, f.local + B_LEN + roff[i],
					    raddr(&f, roff[i]), len[i] };
	}
	run_ok(f.p.a, r, N);
	for (size_t i = 0; i < N; i++)
		g_assert_cmpuint(cxlnode_check(f.local + B_LEN + roff[i], roff[i], len[i], 99), ==,
				 len[i]);
	g_rand_free(rng);
	g_free(r);
	g_free(roff);
	g_free(len);
	fixture_free(&f);
}

/* Copy variants and worker counts: each one moves the same data correctly. */
static void test_variants(void)
{
	static const char *const extras[] = {
		"copy: plain, coherent: true",
		"copy: sse2",
		"copy: auto, coherent: false, threads: 1, chunk_size: 4K, slice_size: 64K",
		"threads: 4, chunk_size: 64K, slice_size: 1M",
		"coherent: yes, window_id: \"rack7-window0\"",
	};

	for (size_t i = 0; i < G_N_ELEMENTS(extras); i++) {
		struct fixture f;

		g_test_message("options: %s", extras[i]);
		fixture_new(&f, extras[i]);
		fixture_connect(&f);
		write_read_check(&f, 3, 5, 3 * MiB + 11, 50 + i);
		write_read_check(&f, 0, 64, 4096, 60 + i);
		write_read_check(&f, 1, 1, 1, 70 + i);
		fixture_free(&f);
	}
}

/* --- access checks ------------------------------------------------------------------------- */

static void test_out_of_range(void)
{
	struct fixture f;
	struct te_request r;
	te_batch_id bid;
	uint8_t *ro = NULL;
	struct te_task_info ti;

	fixture_new(&f, NULL);
	ro = f.w.map + 7 * MiB + 4097;
	assert_ok(te_mem_register(f.p.b, ro, 4096, "cxl:0", TE_MEM_REMOTE_READ));
	fixture_connect(&f);
	/* Past the end of B's buffer, and before it: rejected at submit, nothing moves. */
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, f.local, raddr(&f, B_LEN - 10), 11 };
	assert_status(run_batch(f.p.a, &r, 1, &bid), TE_ERR_REMOTE_ACCESS);
	ti = itest_task(f.p.a, bid, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	assert_ok(te_batch_free(f.p.a, bid));
	r = (struct te_request){ TE_OP_READ, f.p.seg, f.local, raddr(&f, 0) - 1, 8 };
	assert_status(run_batch(f.p.a, &r, 1, &bid), TE_ERR_REMOTE_ACCESS);
	assert_ok(te_batch_free(f.p.a, bid));
	g_assert_cmpuint(cxlnode_check(f.bbuf, 0, B_LEN, 0), ==, B_LEN);
	/* A read-only buffer refuses WRITE. */
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, f.local, (uint64_t)(uintptr_t)ro, 8 };
	assert_status(run_batch(f.p.a, &r, 1, &bid), TE_ERR_REMOTE_ACCESS);
	assert_ok(te_batch_free(f.p.a, bid));
	r.opcode = TE_OP_READ;
	run_ok(f.p.a, &r, 1);
	fixture_free(&f);
}

/* Registration: what is window memory and what is not, with reasons. */
static void test_register(void)
{
	struct win w;
	struct te_engine *e;
	uint8_t *anon = g_malloc(8192), *priv, *alias;
	int fd;

	win_new(&w, 4 * MiB);
	e = engine_on("E", &w, NULL);
	assert_status(te_mem_register(e, anon, 8192, "cxl:0", TE_MEM_REMOTE), TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), "not in window");
	assert_contains(te_last_error(), w.path);
	assert_status(te_mem_register(e, w.map, 4096, "cxl:1", TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "cxl:0");
	/* Ordinary memory registers (the local side of transfers). */
	assert_ok(te_mem_register(e, anon, 8192, "cpu", TE_MEM_LOCAL));
	assert_ok(te_mem_unregister(e, anon));
	/* A private (copy-on-write) mapping of the window file is not the window. */
	fd = open(w.path, O_RDWR | O_CLOEXEC);
	g_assert_cmpint(fd, >=, 0);
	priv = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	g_assert_true(priv != MAP_FAILED);
	assert_status(te_mem_register(e, priv, 8192, "cxl:0", TE_MEM_REMOTE), TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), "private");
	munmap(priv, 8192);
	/* A second shared mapping at a file offset: registered at that window offset. */
	alias = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 2 * MiB);
	g_assert_true(alias != MAP_FAILED);
	close(fd);
	assert_ok(te_mem_register(e, alias + 100, 1000, "cxl:0", TE_MEM_REMOTE));
	{
		struct te_request r;
		te_segment_id self = TE_SEGMENT_LOCAL;

		assert_ok(te_mem_register(e, anon, 8192, "cpu", TE_MEM_LOCAL));
		cxlnode_fill(anon, 0, 1000, 5);
		r = (struct te_request){ TE_OP_WRITE, self, anon,
					 (uint64_t)(uintptr_t)(alias + 100), 1000 };
		run_ok(e, &r, 1);
		/* Landed at file offset 2 MiB + 100, seen through the test's first mapping. */
		g_assert_cmpuint(cxlnode_check(w.map + 2 * MiB + 100, 0, 1000, 5), ==, 1000);
		assert_ok(te_mem_unregister(e, anon));
	}
	assert_ok(te_mem_unregister(e, alias + 100));
	munmap(alias, 64 * KiB);
	te_engine_free(e);
	g_free(anon);
	win_free(&w);
}

/* A target buffer in ordinary memory is not reachable over cxl: submit says why. */
static void test_cpu_target(void)
{
	struct fixture f;
	struct te_request r;
	te_batch_id bid;
	uint8_t *anon = g_malloc(4096);
	struct te_task_info ti;

	char addr[32], *json = NULL;
	const char *at, *keys, *end;

	fixture_new(&f, NULL);
	assert_ok(te_mem_register(f.p.b, anon, 4096, "cpu", TE_MEM_REMOTE));
	/* cxl publishes no key for it (pack_key length 0): the descriptor has none. */
	assert_ok(te_segment_export(f.p.b, &json, NULL));
	snprintf(addr, sizeof(addr), "\"0x%" PRIx64 "\"", (uint64_t)(uintptr_t)anon);
	at = strstr(json, addr);
	g_assert_nonnull(at);
	keys = strstr(at, "\"keys\"");
	g_assert_nonnull(keys);
	end = strchr(keys, '}');
	g_assert_nonnull(end);
	g_assert_null(g_strstr_len(keys, end - keys, "\"cxl\""));
	te_free(json);
	fixture_connect(&f);
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, f.local, (uint64_t)(uintptr_t)anon, 8 };
	assert_status(run_batch(f.p.a, &r, 1, &bid), TE_ERR_NO_TRANSPORT);
	ti = itest_task(f.p.a, bid, 0);
	assert_contains(ti.detail, "no key");
	assert_ok(te_batch_free(f.p.a, bid));
	fixture_free(&f);
	g_free(anon);
}

/* Engines on different windows cannot reach each other; the reason names both windows. */
static void test_other_window(void)
{
	struct win w1, w2;
	struct itest_pair p;
	char *json = NULL;
	size_t len = 0;
	te_segment_id seg;

	win_new(&w1, 1 * MiB);
	win_new(&w2, 1 * MiB);
	p.a = engine_on("A", &w1, NULL);
	p.b = engine_on("B", &w2, NULL);
	assert_ok(te_mem_register(p.b, w2.map, 4096, "cxl:0", TE_MEM_REMOTE));
	assert_ok(te_segment_export(p.b, &json, &len));
	assert_status(te_segment_import(p.a, json, len, &seg), TE_ERR_NO_TRANSPORT);
	assert_contains(te_last_error(), "peer unreachable");
	assert_contains(te_last_error(), "is on window");
	assert_contains(te_last_error(), "this engine on");
	te_free(json);
	itest_pair_free(&p);
	/* Same file, different explicit window ids: different windows. */
	p.a = engine_on("A", &w1, "window_id: left");
	p.b = engine_on("B", &w1, "window_id: right");
	assert_ok(te_mem_register(p.b, w1.map, 4096, "cxl:0", TE_MEM_REMOTE));
	assert_ok(te_segment_export(p.b, &json, &len));
	assert_status(te_segment_import(p.a, json, len, &seg), TE_ERR_NO_TRANSPORT);
	assert_contains(te_last_error(), "is on window right");
	te_free(json);
	itest_pair_free(&p);
	win_free(&w1);
	win_free(&w2);
}

/* The local side may be window memory too; overlapping ranges are refused. */
static void test_local_in_window(void)
{
	struct fixture f;
	uint8_t *lw;
	struct te_request r;
	te_batch_id bid;
	struct te_task_info ti;

	fixture_new(&f, NULL);
	fixture_connect(&f);
	lw = f.w.map + 7 * MiB + 9;
	assert_ok(te_mem_register(f.p.a, lw, 256 * KiB, "cxl:0", TE_MEM_LOCAL));
	cxlnode_fill(lw, 0, 100000, 33);
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, lw, raddr(&f, 77), 100000 };
	run_ok(f.p.a, &r, 1);
	g_assert_cmpuint(cxlnode_check(f.bbuf + 77, 0, 100000, 33), ==, 100000);
	memset(lw, 0, 256 * KiB);
	r = (struct te_request){ TE_OP_READ, f.p.seg, lw + 1, raddr(&f, 77), 100000 };
	run_ok(f.p.a, &r, 1);
	g_assert_cmpuint(cxlnode_check(lw + 1, 0, 100000, 33), ==, 100000);
	g_assert_cmpuint(lw[0], ==, 0);
	g_assert_cmpuint(lw[100001], ==, 0);
	assert_ok(te_mem_unregister(f.p.a, lw));
	/* A local range that is the same window bytes as the remote one. */
	lw = f.bbuf + 4096;
	assert_ok(te_mem_register(f.p.a, lw, 8192, "cxl:0", TE_MEM_LOCAL));
	r = (struct te_request){ TE_OP_WRITE, f.p.seg, lw, raddr(&f, 4096 + 100), 1000 };
	assert_status(run_batch(f.p.a, &r, 1, &bid), TE_ERR_INVALID_ARG);
	ti = itest_task(f.p.a, bid, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
	assert_contains(ti.detail, "overlap");
	assert_ok(te_batch_free(f.p.a, bid));
	assert_ok(te_mem_unregister(f.p.a, lw));
	fixture_free(&f);
}

/* Requests to this engine's own segment (id 0) go through the window as well. */
static void test_local_segment(void)
{
	struct win w;
	struct te_engine *e;
	uint8_t *local = g_malloc0(65536);
	struct te_request r;

	win_new(&w, 1 * MiB);
	e = engine_on("E", &w, NULL);
	cxlnode_fill(w.map + 1000, 0, 65536, 8);
	assert_ok(te_mem_register(e, w.map + 1000, 65536, "cxl:0", TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, local, 65536, "cpu", TE_MEM_LOCAL));
	r = (struct te_request){ TE_OP_READ, TE_SEGMENT_LOCAL, local,
				 (uint64_t)(uintptr_t)(w.map + 1000), 65536 };
	run_ok(e, &r, 1);
	g_assert_cmpuint(cxlnode_check(local, 0, 65536, 8), ==, 65536);
	te_engine_free(e);
	g_free(local);
	win_free(&w);
}

/* --- allocation (te_mem_alloc at cxl:0) -------------------------------------------------- */

/*
 * Two engines on one window allocate from disjoint ranges with te_mem_alloc_registered: B's
 * allocation is the target, A's (window memory too) the local side. Each is the start of its
 * engine's range, seen through the test's own mapping, and bytes moved between them are
 * checked there.
 */
static void test_alloc_transfer(void)
{
	const size_t len = 300 * KiB + 5;
	struct win w;
	struct itest_pair p;
	struct te_buffer_info bi[2];
	struct te_request r;
	uint8_t *la = NULL, *rb = NULL;
	size_t n = 0;

	win_new(&w, 8 * MiB);
	p.a = engine_on("A", &w, "alloc_offset: 0, alloc_size: 2M");
	p.b = engine_on("B", &w, "alloc_offset: 4M, alloc_size: 1M");
	assert_ok(te_mem_alloc_registered(p.b, "cxl:0", len, TE_MEM_REMOTE, (void **)&rb));
	assert_ok(te_mem_alloc_registered(p.a, "cxl:0", len, TE_MEM_LOCAL, (void **)&la));
	cxlnode_fill(rb, 0, len, 1);
	cxlnode_fill(la, 0, len, 2);
	g_assert_cmpuint(cxlnode_check(w.map + 4 * MiB, 0, len, 1), ==, len);
	g_assert_cmpuint(cxlnode_check(w.map, 0, len, 2), ==, len);
	itest_pair_connect(&p);
	assert_ok(te_segment_buffers(p.a, p.seg, bi, G_N_ELEMENTS(bi), &n));
	g_assert_cmpuint(n, ==, 1);
	g_assert_cmpuint(bi[0].addr, ==, (uintptr_t)rb);
	g_assert_cmpuint(bi[0].length, ==, len);
	g_assert_cmpstr(bi[0].location, ==, "cxl:0");

	/* WRITE A's [3, +len - 3) to B's [0, ...): B's last 3 bytes keep pattern 1. */
	r = (struct te_request){ TE_OP_WRITE, p.seg, la + 3, (uintptr_t)rb, len - 3 };
	run_ok(p.a, &r, 1);
	g_assert_cmpuint(cxlnode_check(w.map + 4 * MiB, 3, len - 3, 2), ==, len - 3);
	g_assert_cmpuint(cxlnode_check(w.map + 4 * MiB + len - 3, len - 3, 3, 1), ==, 3);
	/* B's bytes change under its own pointer; READ them back into A at 0. */
	cxlnode_fill(rb, 0, len, 9);
	r = (struct te_request){ TE_OP_READ, p.seg, la, (uintptr_t)rb + 1, len - 1 };
	run_ok(p.a, &r, 1);
	g_assert_cmpuint(cxlnode_check(w.map, 1, len - 1, 9), ==, len - 1);
	g_assert_cmpuint(cxlnode_check(w.map + len - 1, len - 1, 1, 2), ==, 1);

	assert_ok(te_mem_free(p.a, la));
	assert_ok(te_mem_free(p.b, rb));
	/* Unregistered with the free: B lists no buffer any more. */
	assert_ok(te_segment_buffers(p.b, TE_SEGMENT_LOCAL, bi, G_N_ELEMENTS(bi), &n));
	g_assert_cmpuint(n, ==, 0);
	itest_pair_free(&p);
	win_free(&w);
}

/*
 * One engine's range [1M, +1M) of a 4 MiB window: 64 KiB allocations fill it in order, the
 * next is TE_ERR_NOMEM saying how full it is; freed ranges are reused first fit; unknown
 * pointers are refused; large requests start on 2 MiB window offsets.
 */
static void test_alloc_range(void)
{
	struct win w;
	struct te_engine *e;
	uint8_t *p[16], *q = NULL, *x = NULL, *y = NULL;

	win_new(&w, 4 * MiB);
	e = engine_on("E", &w, "alloc_offset: 1M, alloc_size: 1M");
	for (size_t i = 0; i < G_N_ELEMENTS(p); i++) {
		assert_ok(te_mem_alloc_registered(e, "cxl:0", 64 * KiB - (i % 3), TE_MEM_REMOTE,
						  (void **)&p[i]));
		g_assert_true(p[i] == p[0] + i * 64 * KiB);
		cxlnode_fill(p[i], 0, 64 * KiB - 2, 40 + i);
	}
	g_assert_cmpuint(cxlnode_check(w.map + 1 * MiB, 0, 64 * KiB - 2, 40), ==, 64 * KiB - 2);
	g_assert_cmpuint(cxlnode_check(w.map + 2 * MiB - 64 * KiB, 0, 64 * KiB - 2, 55), ==,
			 64 * KiB - 2);
	assert_status(te_mem_alloc_registered(e, "cxl:0", 4096, TE_MEM_REMOTE, (void **)&q),
		      TE_ERR_NOMEM);
	g_test_message("full: %s", te_last_error());
	assert_contains(te_last_error(), "te_mem_alloc_registered: cxl:0: cxl: 4096 bytes: ");
	assert_contains(te_last_error(), "no free 4096 bytes in the allocation range "
					 "[1048576, +1048576) of window");
	assert_contains(te_last_error(), "1048576 bytes in use by 16 allocation(s), largest free "
					 "gap 0 bytes");
	assert_status(te_mem_alloc(e, "cxl:0", 2 * MiB, (void **)&q), TE_ERR_NOMEM);
	assert_contains(te_last_error(), "larger than the allocation range");
	g_assert_null(q);

	/* Free two neighbours: 100 KiB goes there (first fit), 64 KiB no longer fits anywhere. */
	assert_ok(te_mem_free(e, p[3]));
	assert_ok(te_mem_free(e, p[4]));
	assert_ok(te_mem_alloc_registered(e, "cxl:0", 100 * KiB, TE_MEM_REMOTE, (void **)&q));
	g_assert_true(q == p[3]);
	assert_status(te_mem_alloc(e, "cxl:0", 64 * KiB, (void **)&x), TE_ERR_NOMEM);
	assert_contains(te_last_error(), "largest free gap 28672 bytes");
	assert_ok(te_mem_alloc(e, "cxl:0", 20 * KiB, (void **)&x));
	g_assert_true(x == p[3] + 100 * KiB);

	/* Pointers te_mem_alloc did not return. */
	assert_status(te_mem_free(e, p[5] + 4096), TE_ERR_NOT_FOUND);
	assert_contains(te_last_error(), "did not come from te_mem_alloc");
	assert_status(te_mem_free(e, w.map), TE_ERR_NOT_FOUND);
	assert_status(te_mem_free(e, p[3] + 100 * KiB + 20 * KiB), TE_ERR_NOT_FOUND);
	assert_ok(te_mem_free(e, x));
	assert_status(te_mem_free(e, x), TE_ERR_NOT_FOUND);
	assert_contains(te_last_error(), "or was freed already");
	assert_ok(te_mem_free(e, q));
	for (size_t i = 0; i < G_N_ELEMENTS(p); i++)
		if (i != 3 && i != 4)
			assert_ok(te_mem_free(e, p[i]));
	te_engine_free(e);

	/* A 2 MiB request starts on a 2 MiB window offset; a small one takes the first page. */
	e = engine_on("E", &w, "alloc_offset: 4K, alloc_size: 4092K");
	assert_ok(te_mem_alloc_registered(e, "cxl:0", 2 * MiB, TE_MEM_REMOTE, (void **)&x));
	assert_ok(te_mem_alloc_registered(e, "cxl:0", 100, TE_MEM_REMOTE, (void **)&y));
	g_assert_true(x - y == 2 * MiB - 4 * KiB);
	cxlnode_fill(x, 0, 2 * MiB, 60);
	g_assert_cmpuint(cxlnode_check(w.map + 2 * MiB, 0, 2 * MiB, 60), ==, 2 * MiB);
	te_engine_free(e);
	win_free(&w);
}

/*
 * te_mem_free refuses, freeing nothing, while a batch still refers to the memory or the
 * application still has a region inside it registered.
 */
static void test_alloc_busy(void)
{
	struct win w;
	struct te_engine *e;
	uint8_t *l = NULL, *t = NULL, *u = NULL;
	struct te_request r;
	te_batch_id bid;

	win_new(&w, 4 * MiB);
	e = engine_on("E", &w, "alloc_offset: 0, alloc_size: 4M");
	assert_ok(te_mem_alloc_registered(e, "cxl:0", 64 * KiB, TE_MEM_LOCAL, (void **)&l));
	assert_ok(te_mem_alloc_registered(e, "cxl:0", 64 * KiB, TE_MEM_REMOTE, (void **)&t));
	cxlnode_fill(l, 0, 64 * KiB, 70);
	r = (struct te_request){ TE_OP_WRITE, TE_SEGMENT_LOCAL, l, (uintptr_t)t, 64 * KiB };
	assert_ok(run_batch(e, &r, 1, &bid));
	assert_status(te_mem_free(e, l), TE_ERR_BUSY);
	g_test_message("batch: %s", te_last_error());
	assert_contains(te_last_error(), "te_mem_free: ");
	assert_contains(te_last_error(), "(cxl:0, 65536 bytes from cxl) not freed");
	assert_contains(te_last_error(), "used by 1 task(s)");
	/* Nothing was freed or unregistered: the batch's bytes are there, and l still works. */
	g_assert_cmpuint(cxlnode_check(t, 0, 64 * KiB, 70), ==, 64 * KiB);
	assert_ok(te_batch_free(e, bid));
	cxlnode_fill(l, 0, 64 * KiB, 71);
	run_ok(e, &r, 1);
	g_assert_cmpuint(cxlnode_check(t, 0, 64 * KiB, 71), ==, 64 * KiB);
	assert_ok(te_mem_free(e, l));

	/* Allocated unregistered, then a part registered by the application. */
	assert_ok(te_mem_alloc(e, "cxl:0", 64 * KiB, (void **)&u));
	assert_ok(te_mem_register(e, u + 4096, 4096, "cxl:0", TE_MEM_REMOTE));
	assert_status(te_mem_free(e, u), TE_ERR_BUSY);
	assert_contains(te_last_error(), "inside it is still registered (te_mem_unregister it");
	assert_ok(te_mem_unregister(e, u + 4096));
	assert_ok(te_mem_free(e, u));
	/* The application unregistered a registered allocation itself: the free still works. */
	assert_ok(te_mem_unregister(e, t));
	assert_ok(te_mem_free(e, t));
	te_engine_free(e);
	win_free(&w);
}

/* Allocation refusals name the location, the transport and what to do. */
static void test_alloc_errors(void)
{
	struct win w;
	struct te_engine *e;
	void *q = NULL;

	win_new(&w, 1 * MiB);
	e = engine_on("E", &w, NULL);
	/* No range configured: the options to set. */
	assert_status(te_mem_alloc(e, "cxl:0", 4096, &q), TE_ERR_CONFIG);
	g_test_message("no range: %s", te_last_error());
	assert_contains(te_last_error(), "te_mem_alloc: cxl:0: cxl: 4096 bytes: configuration "
					 "error: cxl: no allocation range: set the options "
					 "'alloc_offset' and 'alloc_size'");
	assert_status(te_mem_alloc_registered(e, "cxl:0", 4096, TE_MEM_REMOTE, &q), TE_ERR_CONFIG);
	assert_contains(te_last_error(), "te_mem_alloc_registered: cxl:0: cxl: ");
	/* A window this engine does not map. */
	assert_status(te_mem_alloc(e, "cxl:1", 4096, &q), TE_ERR_NO_DEVICE);
	assert_contains(te_last_error(), "this engine maps one window, cxl:0");
	/* A kind no loaded transport allocates. */
	assert_status(te_mem_alloc(e, "hip:0", 4096, &q), TE_ERR_MEMORY_TYPE);
	g_test_message("hip: %s", te_last_error());
	assert_contains(te_last_error(), "te_mem_alloc: hip:0: no loaded transport owns hip "
					 "memory or allocates it (loaded: cxl)");
	assert_status(te_mem_alloc_registered(e, "cuda:0", 4096, TE_MEM_LOCAL, &q),
		      TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "te_mem_alloc_registered: cuda:0: no loaded transport");
	/* Bad arguments. */
	assert_status(te_mem_alloc(e, "*", 4096, &q), TE_ERR_INVALID_ARG);
	assert_status(te_mem_alloc(e, "cxl:0", 0, &q), TE_ERR_INVALID_ARG);
	assert_status(te_mem_alloc_registered(e, "cxl:0", 4096, 0x10, &q), TE_ERR_INVALID_ARG);
	assert_contains(te_last_error(), "unknown access bits 0x10");
	g_assert_null(q);
	/* Host memory, registered in one step, is freed (and unregistered) like the rest. */
	assert_ok(te_mem_alloc_registered(e, "cpu", 10000, TE_MEM_LOCAL, &q));
	g_assert_cmpuint((uintptr_t)q % 4096, ==, 0);
	assert_status(te_mem_register(e, q, 100, "cpu", TE_MEM_LOCAL), TE_ERR_ADDRESS_OVERLAPPED);
	assert_ok(te_mem_free(e, q));
	assert_status(te_mem_unregister(e, q), TE_ERR_NOT_REGISTERED);
	te_engine_free(e);
	win_free(&w);
}

/*
 * An allocation range that is not inside the window, not page-aligned, or half given fails
 * install with a configuration error at the option in the YAML.
 */
static void test_alloc_options(void)
{
	static const struct {
		const char *extra;
		const char *why;
	} cases[] = {
		{ "alloc_size: 64K", "options.alloc_size: given without 'alloc_offset'" },
		{ "alloc_offset: 64K", "options.alloc_offset: given without 'alloc_size'" },
		{ "alloc_offset: 0, alloc_size: 2M",
		  "options.alloc_size: the allocation range [0, +2097152) is outside the "
		  "1048576-byte window" },
		{ "alloc_offset: 1M, alloc_size: 4K",
		  "options.alloc_offset: the allocation range [1048576, +4096) is outside" },
		{ "alloc_offset: 100, alloc_size: 4K",
		  "options.alloc_offset: 100 is not a multiple of the page size" },
		{ "alloc_offset: 4K, alloc_size: 5000",
		  "options.alloc_size: 5000 is not a multiple of the page size" },
	};
	struct win w;

	win_new(&w, 1 * MiB);
	for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
		struct te_engine *e = NULL;

		assert_status(engine_try("E", w.path, cases[i].extra, &e), TE_ERR_CONFIG);
		g_assert_null(e);
		g_test_message("%s: %s", cases[i].extra, te_last_error());
		assert_contains(te_last_error(), "transports[0].");
		assert_contains(te_last_error(), cases[i].why);
	}
	win_free(&w);
}

/* Allocations left at engine free are unregistered, then released, while cxl still runs. */
static void test_alloc_engine_free(void)
{
	struct logcap c;
	struct win w;
	struct te_engine *e = NULL;
	struct te_engine_opts o = { .size = sizeof(o) };
	g_autofree char *opts = NULL, *yaml = NULL;
	void *a = NULL, *b = NULL, *h = NULL;

	win_new(&w, 1 * MiB);
	opts = g_strdup_printf("device: \"%s\", alloc_offset: 0, alloc_size: 1M", w.path);
	{
		struct itest_transport t = { .name = "cxl", .required = true, .options = opts };

		yaml = itest_yaml("E", &t, 1, default_transfer);
	}
	logcap_init(&c);
	o.config_yaml = yaml;
	o.config_yaml_len = strlen(yaml);
	o.log_fn = logcap_fn;
	o.log_user = &c;
	o.log_level = TE_LOG_DEBUG;
	assert_ok(te_engine_new(&o, &e));
	assert_ok(te_mem_alloc_registered(e, "cxl:0", 8192, TE_MEM_REMOTE, &a));
	assert_ok(te_mem_alloc(e, "cxl:0", 4096, &b));
	assert_ok(te_mem_alloc_registered(e, "cpu", 4096, TE_MEM_LOCAL, &h));
	te_engine_free(e);
	/* cxl's mem_free refuses a range still registered: these lines say it was not. */
	g_assert_cmpuint(logcap_count(&c, "engine free: released 8192 bytes", "(cxl:0)"), ==, 1);
	g_assert_cmpuint(logcap_count(&c, "engine free: released 4096 bytes", "(cxl:0)"), ==, 1);
	g_assert_cmpuint(logcap_count(&c, "engine free: released 4096 bytes", "(cpu)"), ==, 1);
	g_assert_cmpuint(logcap_count(&c, "not released", NULL), ==, 0);
	g_assert_cmpuint(logcap_count(&c, "cxl: freed window [0, +8192)", NULL), ==, 1);
	logcap_clear(&c);
	win_free(&w);
}

/* --- cancel and shutdown ------------------------------------------------------------------ */

static void test_cancel(void)
{
	enum {
		N = 64
	};
	struct fixture f;
	struct te_request r[N];
	te_batch_id bid;
	struct te_batch_info bi;
	uint32_t canceled = 0;

	fixture_new(&f, "threads: 1, chunk_size: 4K");
	fixture_connect(&f);
	for (size_t i = 0; i < N; i++)
		r[i] = (struct te_request){ TE_OP_WRITE, f.p.seg, f.local + (i % 4) * MiB,
					    raddr(&f, (i % 5) * MiB), 1 * MiB };
	assert_ok(te_batch_new(f.p.a, N, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, r, N));
	assert_ok(te_batch_cancel(f.p.a, bid));
	(void)itest_wait(f.p.a, bid);
	bi = itest_batch(f.p.a, bid);
	g_assert_true(te_state_is_terminal(bi.state));
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti = itest_task(f.p.a, bid, i);

		g_assert_true(ti.state == TE_STATE_COMPLETED || ti.state == TE_STATE_CANCELED);
		canceled += ti.state == TE_STATE_CANCELED;
	}
	g_test_message("%u of %d tasks canceled", canceled, N);
	assert_ok(te_batch_free(f.p.a, bid));
	/* The engine still works afterwards. */
	write_read_check(&f, 0, 0, 4096, 3);
	fixture_free(&f);
}

/* Freeing an engine with slices queued in the plugin cancels them without hanging. */
static void test_free_in_flight(void)
{
	enum {
		N = 64
	};
	struct fixture f;
	struct te_request r[N];
	te_batch_id bid;

	fixture_new(&f, "threads: 1, chunk_size: 4K");
	fixture_connect(&f);
	for (size_t i = 0; i < N; i++)
		r[i] = (struct te_request){ TE_OP_READ, f.p.seg, f.local + (i % 4) * MiB,
					    raddr(&f, (i % 5) * MiB), 1 * MiB };
	assert_ok(te_batch_new(f.p.a, N, &bid));
	assert_ok(te_batch_submit(f.p.a, bid, r, N));
	fixture_free(&f);
}

/* --- options -------------------------------------------------------------------------------- */

static void test_bad_options(void)
{
	/* Declared options: the core refuses bad ones (TE_ERR_CONFIG); cxl checks the rest. */
	static const struct {
		const char *extra;
		enum te_status st;
		const char *why;
	} cases[] = {
		{ "colour: blue", TE_ERR_CONFIG, "options.colour: unknown option of plugin cxl" },
		{ "coherent: maybe", TE_ERR_CONFIG,
		  "options.coherent: expected a boolean (true, false, yes, no, on, off), got "
		  "\"maybe\"" },
		{ "threads: 0", TE_ERR_CONFIG, "options.threads: value 0 out of range 1..64" },
		{ "threads: 65", TE_ERR_CONFIG, "options.threads: value 65 out of range 1..64" },
		{ "chunk_size: 1K", TE_ERR_CONFIG,
		  "options.chunk_size: value 1K out of range 4K..1G" },
		{ "copy: neon", TE_ERR_CONFIG,
		  "options.copy: expected one of: auto, avx2, sse2, plain, got \"neon\"" },
		/* cxl's own checks, located like the core's ("option '<key>': <why>"). */
		{ "offset: 100", TE_ERR_CONFIG,
		  "transports[0].options.offset: 100 is not a multiple of the page size" },
		{ "size: 0", TE_ERR_CONFIG, "options.size: value 0 out of range 1..4194304T" },
		{ "window_id: \"a b\"", TE_ERR_CONFIG,
		  "transports[0].options.window_id: 'a b' has a space or a non-printable "
		  "character" },
	};
	struct win w;

	win_new(&w, 1 * MiB);
	for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
		struct te_engine *e = NULL;

		assert_status(engine_try("E", w.path, cases[i].extra, &e), cases[i].st);
		g_assert_null(e);
		assert_contains(te_last_error(), cases[i].why);
	}
	{
		struct te_engine *e = NULL;
		struct itest_transport t = { .name = "cxl", .required = true, .options = NULL };
		g_autofree char *yaml = itest_yaml("E", &t, 1, NULL);

		assert_status(te_engine_new_from_string(yaml, strlen(yaml), &e), TE_ERR_CONFIG);
		assert_contains(te_last_error(),
				"transports[0].options.device: missing required option of plugin "
				"cxl (the DAX device (/dev/daxX.Y) or file that maps the shared "
				"window)");
	}
	win_free(&w);
}

/*
 * GPU memory (the fakegpu test plugin owns "cuda"; its device pointers fault on any direct CPU
 * access) as the local side of cxl transfers: the core stages it through host bounce buffers,
 * and every byte is checked through te_mem_copy.
 */
static void test_gpu_staged(void)
{
	const size_t len = 3 * MiB + 7, span = 8 * MiB;
	struct win w;
	struct itest_pair p;
	g_autofree char *opts = NULL;
	g_autofree char *ya = NULL, *yb = NULL;
	g_autofree uint8_t *host = g_malloc(span);
	struct itest_transport t[2] = { { .name = "fakegpu", .required = true },
					{ .name = "cxl", .required = true } };
	uint8_t *dev = NULL, *bbuf;
	struct te_request r;
	struct te_task_info ti;
	te_batch_id bid;

	win_new(&w, 8 * MiB);
	opts = g_strdup_printf("device: \"%s\"", w.path);
	t[1].options = opts;
	ya = itest_yaml("A", t, 2, default_transfer);
	yb = itest_yaml("B", t, 2, default_transfer);
	p.a = itest_engine(ya);
	p.b = itest_engine(yb);
	bbuf = w.map + B_OFF;
	cxlnode_fill(bbuf, 0, B_LEN, 0);
	assert_ok(te_mem_register(p.b, bbuf, B_LEN, "cxl:0", TE_MEM_REMOTE));

	assert_ok(te_mem_alloc(p.a, "cuda:0", span, (void **)&dev));
	cxlnode_fill(host, 0, span, 21);
	assert_ok(te_mem_copy(p.a, dev, host, span));
	assert_ok(te_mem_register(p.a, dev, span, "cuda:0", TE_MEM_LOCAL));
	itest_pair_connect(&p);

	/* WRITE device bytes [5, +len) to window offset 11. */
	r = (struct te_request){ TE_OP_WRITE, p.seg, dev + 5, (uint64_t)(uintptr_t)(bbuf + 11),
				 len };
	assert_ok(run_batch(p.a, &r, 1, &bid));
	ti = itest_task(p.a, bid, 0);
	g_assert_cmpstr(ti.transport, ==, "cxl");
	assert_contains(ti.device, "(staged)");
	g_assert_cmpuint(ti.bytes, ==, len);
	assert_ok(te_batch_free(p.a, bid));
	/* The window holds pattern 21 from offset 5 (shifted by 11 - 5 against window offsets). */
	{
		g_autofree uint8_t *want = g_malloc(len);

		cxlnode_fill(want, 5, len, 21);
		g_assert_true(memcmp(bbuf + 11, want, len) == 0);
	}
	g_assert_cmpuint(cxlnode_check(bbuf + 10, 10, 1, 0), ==, 1);
	g_assert_cmpuint(cxlnode_check(bbuf + 11 + len, 11 + len, 1, 0), ==, 1);

	/* READ it back into device bytes [4 MiB + 1, +len): the rest of the device untouched. */
	r = (struct te_request){ TE_OP_READ, p.seg, dev + 4 * MiB + 1,
				 (uint64_t)(uintptr_t)(bbuf + 11), len };
	run_ok(p.a, &r, 1);
	assert_ok(te_mem_copy(p.a, host, dev, span));
	{
		g_autofree uint8_t *want = g_malloc(span);

		cxlnode_fill(want, 0, span, 21);
		memcpy(want + 4 * MiB + 1, want + 5, len);
		for (size_t i = 0; i < span; i++)
			if (host[i] != want[i])
				g_error("device byte %zu: 0x%02x, expected 0x%02x", i, host[i],
					want[i]);
	}
	assert_ok(te_mem_unregister(p.a, dev));
	assert_ok(te_mem_free(p.a, dev));
	itest_pair_free(&p);
	win_free(&w);
}

/* A window inside a larger file: offset and size select it. */
static void test_offset_window(void)
{
	struct win w;
	struct itest_pair p;
	uint8_t *local = g_malloc(4096);
	struct te_request r;

	win_new(&w, 4 * MiB);
	p.a = engine_on("A", &w, "offset: 1M, size: 2M");
	p.b = engine_on("B", &w, "offset: 1M, size: 2M");
	/* Window offset 0 is file offset 1 MiB; the test's mapping sees it there. */
	assert_ok(te_mem_register(p.b, w.map + 1 * MiB + 10, 8192, "cxl:0", TE_MEM_REMOTE));
	assert_status(te_mem_register(p.b, w.map + 3 * MiB, 4096, "cxl:0", TE_MEM_REMOTE),
		      TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), "outside the window");
	assert_ok(te_mem_register(p.a, local, 4096, "cpu", TE_MEM_LOCAL));
	itest_pair_connect(&p);
	cxlnode_fill(local, 0, 4096, 4);
	r = (struct te_request){ TE_OP_WRITE, p.seg, local,
				 (uint64_t)(uintptr_t)(w.map + 1 * MiB + 10), 4096 };
	run_ok(p.a, &r, 1);
	g_assert_cmpuint(cxlnode_check(w.map + 1 * MiB + 10, 0, 4096, 4), ==, 4096);
	itest_pair_free(&p);
	g_free(local);
	win_free(&w);
}

int main(int argc, char **argv)
{
	g_autofree char *so = NULL;

	g_test_init(&argc, &argv, NULL);
	so = itest_plugin_file("cxl");
	if (!so) {
		g_test_message("cxl.so not found along TE_PLUGIN_PATH");
		return 77;
	}
	/* g_error traps (SIGTRAP) or aborts; meson's timeout terminates. */
	signal(SIGABRT, on_fatal);
	signal(SIGTRAP, on_fatal);
	signal(SIGTERM, on_fatal);
	signal(SIGSEGV, on_fatal);
	signal(SIGBUS, on_fatal);
	g_test_add_func("/cxl/transfer/sizes", test_transfer);
	g_test_add_func("/cxl/transfer/many-requests", test_many_requests);
	g_test_add_func("/cxl/transfer/variants", test_variants);
	g_test_add_func("/cxl/transfer/local-in-window", test_local_in_window);
	g_test_add_func("/cxl/transfer/local-segment", test_local_segment);
	g_test_add_func("/cxl/transfer/offset-window", test_offset_window);
	g_test_add_func("/cxl/transfer/gpu-staged", test_gpu_staged);
	g_test_add_func("/cxl/access/out-of-range", test_out_of_range);
	g_test_add_func("/cxl/access/register", test_register);
	g_test_add_func("/cxl/access/cpu-target", test_cpu_target);
	g_test_add_func("/cxl/access/other-window", test_other_window);
	g_test_add_func("/cxl/failure/cancel", test_cancel);
	g_test_add_func("/cxl/failure/free-in-flight", test_free_in_flight);
	g_test_add_func("/cxl/options/bad", test_bad_options);
	g_test_add_func("/cxl/alloc/transfer", test_alloc_transfer);
	g_test_add_func("/cxl/alloc/range", test_alloc_range);
	g_test_add_func("/cxl/alloc/busy", test_alloc_busy);
	g_test_add_func("/cxl/alloc/errors", test_alloc_errors);
	g_test_add_func("/cxl/alloc/options", test_alloc_options);
	g_test_add_func("/cxl/alloc/engine-free", test_alloc_engine_free);
	return g_test_run();
}
