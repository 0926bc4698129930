/* SPDX-License-Identifier: Apache-2.0 */
/* cxl_system_test.c: cxl transfers between processes that share one window file. */

/*
 * The target is a cxl-node process (tests/cxl/cxl-node.c) that maps a window file under
 * /dev/shm itself and registers a range of its mapping as cxl:0; the initiator is an engine
 * in this process with the cxl transport on the same file, and writers are further cxl-node
 * processes. This process maps the window too and checks the bytes that moved there; the
 * target checks them through its own mapping as well. Window files are removed on exit and
 * when the test dies of a signal (a failing assertion, a timeout). Nodes die with this
 * process (PR_SET_PDEATHSIG).
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib.h>

#include <te/te.h>

#include "sysnode_fixture.h"
#include "cxlnode.h"

#define MiB (1024ull * 1024ull)

/* Deadline for a node's line (a 256 MiB fill or check included), and for a batch. */
#define NODE_WAIT_MS 60000
#define BATCH_WAIT_NS (60 * S_NS)

static bool have_tcp; /* tcp.so along TE_PLUGIN_PATH */

/* --- window files ------------------------------------------------------------------------- */

/* Paths to unlink on exit or when the test dies of a signal (set before any can arrive). */
#define MAX_FILES 8
static char file_paths[MAX_FILES][96];
static volatile sig_atomic_t n_files;

static void files_remove(void)
{
	for (int i = 0; i < n_files; i++)
		unlink(file_paths[i]);
}

static void on_fatal(int sig)
{
	files_remove();
	signal(sig, SIG_DFL);
	raise(sig);
}

struct win {
	const char *path;
	uint8_t *map;
	size_t size;
};

/* A fresh window file of @size bytes, mapped shared by this process. */
static void win_new(struct win *w, size_t size)
{
	int fd;

	g_assert_cmpint(n_files, <, MAX_FILES);
	g_snprintf(file_paths[n_files], sizeof(file_paths[0]), "/dev/shm/te-cxl-sys-%d-%d",
		   (int)getpid(), (int)n_files);
	w->path = file_paths[n_files];
	n_files++;
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
}

/* The id the plugin derives for a whole-file window (README.md, "Window identity"). */
static char *win_id(const struct win *w)
{
	struct stat sb;

	g_assert_cmpint(stat(w->path, &sb), ==, 0);
	return g_strdup_printf("%x:%x:%" PRIx64 "@0+%" PRIx64, major(sb.st_dev), minor(sb.st_dev),
			       (uint64_t)sb.st_ino, (uint64_t)w->size);
}

static char *yaml_for(const struct win *w, const char *extra, bool tcp)
{
	return g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
			       "transfer: {timeout_ms: 60000}\n"
			       "transports:\n"
			       "  - name: cxl\n"
			       "    required: true\n"
			       "    options: {device: \"%s\"%s%s}\n"
			       "%s",
			       w->path, extra ? ", " : "", extra ? extra : "",
			       tcp ? "  - name: tcp\n    required: true\n" : "");
}

static struct te_engine *engine_new(const char *yaml)
{
	struct te_engine *e = NULL;

	assert_ok(te_engine_new_from_string(yaml, strlen(yaml), &e));
	return e;
}

/* --- nodes -------------------------------------------------------------------------------- */

/* End a node: "quit" (or EOF) for a target, then reap; the exit status must be 0. */
static void node_end(struct node *n, bool quit)
{
	g_autoptr(GError) err = NULL;

	if (quit)
		node_send(n, "quit");
	g_output_stream_close(n->in, NULL, NULL);
	if (!g_subprocess_wait_check(n->proc, NULL, &err))
		g_error("%s: %s", n->name, err->message);
	node_release(n);
}

/* A target cxl-node serving window bytes [@offset, +@size) filled with pattern @seed. */
static struct node *target_start(const struct win *w, bool tcp, uint64_t offset, uint64_t size,
				 uint64_t seed)
{
	g_autofree char *yaml = yaml_for(w, NULL, tcp);
	g_autofree char *off = g_strdup_printf("%" PRIu64, offset);
	g_autofree char *sz = g_strdup_printf("%" PRIu64, size);
	g_autofree char *sd = g_strdup_printf("%" PRIu64, seed);
	g_autofree char *buf = NULL;
	const char *argv[] = { node_path, "--yaml", yaml, "--window", w->path, "--offset",
			       off,	  "--size", sz,	  "--seed",   sd,      NULL };
	struct node *n = node_spawn("target", argv);

	n->segment = node_expect(n, "segment: ", NODE_WAIT_MS);
	buf = node_expect(n, "buffer: ", NODE_WAIT_MS);
	parse_range(buf, &n->buf, &n->size);
	g_assert_cmpuint(n->size, ==, size);
	g_free(node_expect(n, "ready", NODE_WAIT_MS));
	return n;
}

/* The target's own view of [off, +len) holds pattern @seed. */
static void target_check(struct node *t, uint64_t off, uint64_t len, uint64_t seed)
{
	g_autofree char *got = NULL;

	node_send(t, "check %" PRIu64 " %" PRIu64 " %" PRIu64, off, len, seed);
	got = node_expect(t, "check ", NODE_WAIT_MS);
	if (g_ascii_strtoull(got, NULL, 10) != len)
		g_error("target: byte %s of [%" PRIu64 ", +%" PRIu64 ") is not pattern %" PRIu64,
			got, off, len, seed);
}

static void target_fill(struct node *t, uint64_t off, uint64_t len, uint64_t seed)
{
	node_send(t, "fill %" PRIu64 " %" PRIu64 " %" PRIu64, off, len, seed);
	g_free(node_expect(t, "ok", NODE_WAIT_MS));
}

static enum te_status run(struct te_engine *e, const struct te_request *r, size_t n,
			  struct te_task_info *first_out)
{
	te_batch_id b;
	enum te_status st, wst;

	assert_ok(te_batch_new(e, (uint32_t)n, &b));
	st = te_batch_submit(e, b, r, n);
	wst = te_batch_wait(e, b, BATCH_WAIT_NS);
	if (wst == TE_INPROGRESS)
		g_error("batch of %zu requests did not finish within 60 s", n);
	if (first_out)
		assert_ok(te_task_status(e, b, 0, first_out));
	assert_ok(te_batch_free(e, b));
	return st != TE_OK ? st : wst;
}

/* --- tests -------------------------------------------------------------------------------- */

/*
 * READ and WRITE of 1 B to 256 MiB at unaligned local and remote offsets; every byte checked
 * here and by the target, and the bytes next to each range untouched.
 */
static void test_sizes(void)
{
	/* 1 B to 256 MiB: around vector, line and page sizes, then MiB +- 1, 4M+3, 16M+7, 64M+1. */
	static const uint64_t lens[] = { 1,	  2,	   3,	     7,	       8,	 9,
					 15,	  16,	   17,	     31,       33,	 63,
					 64,	  65,	   127,	     129,      255,	 257,
					 4095,	  4096,	   4097,     65535,    65537,	 1048575,
					 1048577, 4194307, 16777223, 67108865, 268435456 };
	const uint64_t boff = 4096 + 5, bsize = 256 * MiB + 256 * 1024;
	const size_t lsize = 256 * MiB + 8192;
	struct win w;
	struct node *t;
	struct te_engine *e;
	g_autofree char *yaml = NULL;
	te_segment_id seg;
	uint8_t *local, *wbuf;
	struct te_task_info ti;
	int64_t t0 = g_get_monotonic_time();

	win_new(&w, 258 * MiB);
	t = target_start(&w, false, boff, bsize, 0);
	wbuf = w.map + boff;
	yaml = yaml_for(&w, NULL, false);
	e = engine_new(yaml);
	assert_ok(te_segment_open(e, t->segment, &seg));
	local = mmap(NULL, lsize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	g_assert_true(local != MAP_FAILED);
	assert_ok(te_mem_register(e, local, lsize, "cpu", TE_MEM_LOCAL));
	for (size_t i = 0; i < G_N_ELEMENTS(lens); i++) {
		uint64_t len = lens[i], seed = 100 + i;
		uint64_t ro = (i * 29 + 3) % 64 + (len < 64 * MiB ? (i % 5) * 65536 : 0);
		uint64_t lo = (i * 11 + 1) % 64 + 64;
		struct te_request r;

		g_assert_cmpuint(ro + len, <=, bsize);
		/* WRITE: local pattern @seed (window offsets) lands in the window. */
		cxlnode_fill(local + lo, ro, len, seed);
		r = (struct te_request){ TE_OP_WRITE, seg, local + lo, t->buf + ro, len };
		assert_ok(run(e, &r, 1, &ti));
		g_assert_cmpstr(ti.transport, ==, "cxl");
		g_assert_cmpuint(cxlnode_check(wbuf + ro, ro, len, seed), ==, len);
		target_check(t, ro, len, seed);
		if (ro)
			g_assert_cmpuint(cxlnode_check(wbuf + ro - 1, ro - 1, 1, 0), ==, 1);
		g_assert_cmpuint(cxlnode_check(wbuf + ro + len, ro + len, 64, 0), ==, 64);
		/* READ it back into a poisoned area at another local offset. */
		memset(local + lo - 1, 0xa5, len + 2);
		r = (struct te_request){ TE_OP_READ, seg, local + lo, t->buf + ro, len };
		assert_ok(run(e, &r, 1, NULL));
		g_assert_cmpuint(cxlnode_check(local + lo, ro, len, seed), ==, len);
		g_assert_cmpuint(local[lo - 1], ==, 0xa5);
		g_assert_cmpuint(local[lo + len], ==, 0xa5);
		target_fill(t, ro, len, 0);
	}
	g_test_message("sizes: %zu sizes up to 256 MiB in %.1f s", G_N_ELEMENTS(lens),
		       (double)(g_get_monotonic_time() - t0) / 1e6);
	assert_ok(te_mem_unregister(e, local));
	munmap(local, lsize);
	assert_ok(te_segment_close(e, seg));
	te_engine_free(e);
	node_end(t, true);
	win_free(&w);
}

/*
 * Two writer processes WRITE interleaved 100-byte ranges (neighbours share cache lines) of
 * the target's buffer, round after round, at the same time; each range ends up with the last
 * round of its own writer, and the bytes past the ranges keep the target's pattern.
 */
static void test_concurrent_writers(void)
{
	enum {
		COUNT = 8000,
		STRIDE = 100,
		ROUNDS = 200
	};
	const uint64_t seeds[2] = { 1000, 5000 };
	const uint64_t bsize = 2 * MiB;
	struct win w;
	struct node *t, *wr[2];
	g_autofree char *yaml = NULL;
	int64_t start_us[2], end_us[2], overlap;
	uint8_t *wbuf;

	win_new(&w, 4 * MiB);
	t = target_start(&w, false, 64 + 3, bsize, 0);
	wbuf = w.map + 64 + 3;
	yaml = yaml_for(&w, "threads: 2, chunk_size: 4K", false);
	for (int p = 0; p < 2; p++) {
		g_autofree char *cnt = g_strdup_printf("%d", COUNT);
		g_autofree char *par = g_strdup_printf("%d", p);
		g_autofree char *rnd = g_strdup_printf("%d", ROUNDS);
		g_autofree char *sd = g_strdup_printf("%" PRIu64, seeds[p]);
		g_autofree char *stride = g_strdup_printf("%d", STRIDE);
		const char *argv[] = { node_path,  "--yaml",   yaml,	"--writer", t->segment,
				       "--stride", stride,     "--len", stride,	    "--count",
				       cnt,	   "--parity", par,	"--rounds", rnd,
				       "--seed",   sd,	       NULL };

		wr[p] = node_spawn(p ? "writer1" : "writer0", argv);
	}
	for (int p = 0; p < 2; p++)
		g_free(node_expect(wr[p], "ready", NODE_WAIT_MS));
	for (int p = 0; p < 2; p++)
		node_send(wr[p], "go");
	for (int p = 0; p < 2; p++) {
		g_autofree char *done = node_expect(wr[p], "done ", NODE_WAIT_MS);
		char *end = NULL;

		(void)g_ascii_strtoull(done, &end, 10);
		start_us[p] = (int64_t)g_ascii_strtoull(end, &end, 10);
		end_us[p] = (int64_t)g_ascii_strtoull(end, NULL, 10);
		node_end(wr[p], false);
	}
	/* The writers really ran at the same time (else this tests nothing). */
	overlap = MIN(end_us[0], end_us[1]) - MAX(start_us[0], start_us[1]);
	g_test_message("writers ran %.1f and %.1f ms, overlapping %.1f ms",
		       (double)(end_us[0] - start_us[0]) / 1e3,
		       (double)(end_us[1] - start_us[1]) / 1e3, (double)overlap / 1e3);
	g_assert_cmpint(overlap, >, 0);
	for (uint64_t k = 0; k < COUNT; k++) {
		uint64_t seed = seeds[k & 1] + ROUNDS - 1;

		if (cxlnode_check(wbuf + k * STRIDE, k * STRIDE, STRIDE, seed) != STRIDE)
			g_error("range %" PRIu64 " does not hold writer %" PRIu64 "'s last round",
				k, k & 1);
	}
	g_assert_cmpuint(
		cxlnode_check(wbuf + COUNT * STRIDE, COUNT * STRIDE, bsize - COUNT * STRIDE, 0), ==,
		bsize - COUNT * STRIDE);
	target_check(t, 0, STRIDE, seeds[0] + ROUNDS - 1);
	target_check(t, STRIDE, STRIDE, seeds[1] + ROUNDS - 1);
	node_end(t, true);
	win_free(&w);
}

/*
 * A target on another window: without another transport the segment cannot be opened; with
 * tcp beside cxl it opens, and a request to the target's window buffer is refused at submit.
 * Both reasons name the two windows.
 */
static void test_other_window(void)
{
	struct win wt, wi;
	struct node *t;
	struct te_engine *e;
	g_autofree char *yaml = NULL, *tid = NULL, *iid = NULL;
	te_segment_id seg;
	struct te_task_info ti;
	struct te_request r;
	uint8_t *local = g_malloc0(4096);

	win_new(&wt, 1 * MiB);
	win_new(&wi, 1 * MiB);
	tid = win_id(&wt);
	iid = win_id(&wi);
	t = target_start(&wt, have_tcp, 0, 65536, 0);

	yaml = yaml_for(&wi, NULL, false);
	e = engine_new(yaml);
	assert_status(te_segment_open(e, t->segment, &seg), TE_ERR_NO_TRANSPORT);
	g_test_message("cxl only: %s", te_last_error());
	assert_contains(te_last_error(), "peer unreachable");
	assert_contains(te_last_error(), tid);
	assert_contains(te_last_error(), iid);
	te_engine_free(e);

	if (!have_tcp) {
		g_test_message("tcp.so not found along TE_PLUGIN_PATH: cxl-only part done");
		goto out;
	}
	g_free(yaml);
	yaml = yaml_for(&wi, NULL, true);
	e = engine_new(yaml);
	assert_ok(te_segment_open(e, t->segment, &seg));
	assert_ok(te_mem_register(e, local, 4096, "cpu", TE_MEM_LOCAL));
	r = (struct te_request){ TE_OP_WRITE, seg, local, t->buf, 4096 };
	assert_status(run(e, &r, 1, &ti), TE_ERR_NO_TRANSPORT);
	g_test_message("cxl and tcp: %s", ti.detail);
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	assert_contains(ti.detail, "is on window");
	assert_contains(ti.detail, tid);
	assert_contains(ti.detail, "tcp: remote buffer has no key");
	assert_ok(te_mem_unregister(e, local));
	assert_ok(te_segment_close(e, seg));
	te_engine_free(e);
out:
	node_end(t, true);
	win_free(&wt);
	win_free(&wi);
	g_free(local);
}

/*
 * te_mem_alloc_registered on cxl:0 in two processes on one window, with disjoint allocation
 * ranges: the target (a cxl-node, range [4M, +2M)) serves an allocation of its own, this
 * process's engine (range [0, +2M)) takes its local side from its own. Each allocation is the
 * start of its engine's range (checked through this process's mapping: the engines hand out
 * disjoint window bytes), and bytes WRITTEN to and READ from the target's allocation are
 * checked here, in the window, and by the target.
 */
static void test_alloc(void)
{
	const uint64_t len = 1 * MiB + 5, t_off = 4 * MiB;
	g_autofree char *tyaml = NULL, *yaml = NULL;
	const char *argv[] = { node_path, "--yaml", NULL, "--alloc", "--size",
			       "1048581", "--seed", "3",  NULL };
	struct te_buffer_info bi[2];
	struct win w;
	struct node *t;
	struct te_engine *e;
	struct te_task_info ti;
	struct te_request r;
	te_segment_id seg;
	uint8_t *local = NULL;
	size_t n = 0;

	win_new(&w, 8 * MiB);
	tyaml = yaml_for(&w, "alloc_offset: 4M, alloc_size: 2M", false);
	argv[2] = tyaml;
	t = node_spawn("target (alloc)", argv);
	t->segment = node_expect(t, "segment: ", NODE_WAIT_MS);
	{
		g_autofree char *buf = node_expect(t, "buffer: ", NODE_WAIT_MS);

		parse_range(buf, &t->buf, &t->size);
	}
	g_free(node_expect(t, "ready", NODE_WAIT_MS));
	g_assert_cmpuint(t->size, ==, len);
	/* The target's allocation is window bytes [4M, +len), filled by the target. */
	g_assert_cmpuint(cxlnode_check(w.map + t_off, 0, len, 3), ==, len);

	yaml = yaml_for(&w, "alloc_offset: 0, alloc_size: 2M", false);
	e = engine_new(yaml);
	assert_ok(te_mem_alloc_registered(e, "cxl:0", len, TE_MEM_LOCAL, (void **)&local));
	cxlnode_fill(local, 0, len, 11);
	g_assert_cmpuint(cxlnode_check(w.map, 0, len, 11), ==, len);
	/* Untouched by this engine: the target's bytes are still its own. */
	g_assert_cmpuint(cxlnode_check(w.map + t_off, 0, len, 3), ==, len);

	assert_ok(te_segment_open(e, t->segment, &seg));
	assert_ok(te_segment_buffers(e, seg, bi, G_N_ELEMENTS(bi), &n));
	g_assert_cmpuint(n, ==, 1);
	g_assert_cmpuint(bi[0].addr, ==, t->buf);
	g_assert_cmpuint(bi[0].length, ==, len);
	g_assert_cmpstr(bi[0].location, ==, "cxl:0");

	/* WRITE local bytes [7, +len - 9) to the target's allocation at 2. */
	r = (struct te_request){ TE_OP_WRITE, seg, local + 7, t->buf + 2, len - 9 };
	assert_ok(run(e, &r, 1, &ti));
	g_assert_cmpstr(ti.transport, ==, "cxl");
	g_assert_cmpuint(ti.bytes, ==, len - 9);
	{
		g_autofree uint8_t *want = g_malloc(len);

		cxlnode_fill(want, 0, len, 3);
		cxlnode_fill(want + 2, 7, len - 9, 11);
		g_assert_true(memcmp(w.map + t_off, want, len) == 0);
	}
	target_check(t, 0, 2, 3);
	target_check(t, len - 7, 7, 3);

	/* READ what the target wrote into its allocation back into local bytes [5, +len - 5). */
	target_fill(t, 0, len, 21);
	r = (struct te_request){ TE_OP_READ, seg, local + 5, t->buf, len - 5 };
	assert_ok(run(e, &r, 1, &ti));
	g_assert_cmpuint(ti.bytes, ==, len - 5);
	g_assert_cmpuint(cxlnode_check(local + 5, 0, len - 5, 21), ==, len - 5);
	g_assert_cmpuint(cxlnode_check(w.map, 0, 5, 11), ==, 5);
	g_assert_cmpuint(cxlnode_check(w.map + 5, 0, len - 5, 21), ==, len - 5);

	assert_ok(te_segment_close(e, seg));
	assert_ok(te_mem_free(e, local));
	assert_status(te_mem_free(e, local), TE_ERR_NOT_FOUND);
	te_engine_free(e);
	/* The target frees its allocation on quit and exits 0 only if that succeeded. */
	node_end(t, true);
	win_free(&w);
}

/* A missing or too small window file fails engine start, naming the file and the sizes. */
static void test_install_errors(void)
{
	struct win w;
	struct te_engine *e = NULL;
	g_autofree char *yaml = NULL;
	g_autofree char *missing = g_strdup_printf("/dev/shm/te-cxl-sys-%d-missing", (int)getpid());
	struct win none = { .path = missing };

	yaml = yaml_for(&none, NULL, false);
	assert_status(te_engine_new_from_string(yaml, strlen(yaml), &e), TE_ERR_PLUGIN_INIT);
	g_test_message("missing: %s", te_last_error());
	assert_contains(te_last_error(), "cannot open window device");
	assert_contains(te_last_error(), missing);
	assert_contains(te_last_error(), strerror(ENOENT));
	assert_contains(te_last_error(), "no device");

	win_new(&w, 1 * MiB);
	g_free(yaml);
	yaml = yaml_for(&w, "size: 64M", false);
	assert_status(te_engine_new_from_string(yaml, strlen(yaml), &e), TE_ERR_PLUGIN_INIT);
	g_test_message("too small: %s", te_last_error());
	assert_contains(te_last_error(), w.path);
	assert_contains(te_last_error(), "is 1048576 bytes, too small");
	assert_contains(te_last_error(), "size 67108864");
	g_free(yaml);
	yaml = yaml_for(&w, "offset: 1M", false);
	assert_status(te_engine_new_from_string(yaml, strlen(yaml), &e), TE_ERR_PLUGIN_INIT);
	assert_contains(te_last_error(), "nothing to map at offset 1048576");
	g_assert_null(e);
	win_free(&w);
}

/* cxl-node next to this test binary. */
static char *find_node(const char *argv0)
{
	g_autofree char *dir = g_path_get_dirname(argv0);
	char *p = g_build_filename(dir, "cxl-node", NULL);

	if (!g_file_test(p, G_FILE_TEST_IS_EXECUTABLE))
		g_error("%s not found", p);
	return p;
}

/* @file is in a directory of $TE_PLUGIN_PATH. */
static bool have_plugin(const char *file)
{
	g_autofree char *p = find_plugin(file);

	return p != NULL;
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	if (!g_file_test("/dev/shm", G_FILE_TEST_IS_DIR)) {
		printf("1..0 # SKIP no /dev/shm\n");
		return 0;
	}
	if (!have_plugin("cxl.so")) {
		printf("1..0 # SKIP cxl.so not found along TE_PLUGIN_PATH\n");
		return 0;
	}
	have_tcp = have_plugin("tcp.so");
	node_path = find_node(argv[0]);
	/* g_error traps (SIGTRAP) or aborts; meson's timeout terminates. */
	signal(SIGABRT, on_fatal);
	signal(SIGTRAP, on_fatal);
	signal(SIGTERM, on_fatal);
	signal(SIGSEGV, on_fatal);
	signal(SIGBUS, on_fatal);
	atexit(files_remove);
	g_test_add_func("/cxl-system/sizes", test_sizes);
	g_test_add_func("/cxl-system/concurrent-writers", test_concurrent_writers);
	g_test_add_func("/cxl-system/other-window", test_other_window);
	g_test_add_func("/cxl-system/install-errors", test_install_errors);
	g_test_add_func("/cxl-system/alloc", test_alloc);
	return g_test_run();
}
