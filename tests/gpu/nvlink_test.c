/* SPDX-License-Identifier: Apache-2.0 */
/* nvlink_test.c: the nvlink plugin on the fake CUDA driver, in one process and two. */

/*
 * Every engine loads nvlink.so with option library: $FAKECUDA_LIB (tests/gpu/fakecuda), so the
 * plugin takes its normal dlopen path. With TE_NVLINK_REAL=1 (tests/hw-gpu/run.sh) FAKECUDA_LIB
 * names the real driver instead: cases that need the fake (its faults, its books, its device
 * names) skip, and "the second GPU" is cuda:0 again on a machine with one. The integration cases run engines in this process; the
 * system cases drive tests/system/te-node targets whose buffer is device memory (--location
 * cuda:0) and move data from an engine in this process, with a host or a device buffer on this
 * side. Faults are the fake driver's environment variables, set in this process after the
 * target started (so only the initiator has them) or before (so only the target has them).
 * One meson test runs one case: the fake reads its environment once per process. Every case
 * ends by its own verdict: a watchdog thread aborts it, naming its last step, after
 * $TE_NVLINK_WATCHDOG_S seconds (meson.build: 20 s under meson's timeout).
 */

#include <dlfcn.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib.h>

#include <te/te.h>

#include "../system/sysnode.h"
#include "../system/sysnode_fixture.h"

#define WAIT_NS (60 * S_NS)
#define MIB (1ull << 20)

static const char *fake_lib;
static char *nvlink_so;
static const char *xfer_tp = "nvlink"; /* the transport gxfer_* expect to move every task */
static bool real_driver;	       /* TE_NVLINK_REAL: FAKECUDA_LIB is NVIDIA's libcuda */
static const char *gpu1 = "cuda:1";    /* the second GPU, or cuda:0 where there is one */

/* What a case that needs the fake driver (its faults) runs on the real one. */
static void skip_fake(void)
{
	g_test_skip("needs the fake driver (its faults)");
}

/* --- case watchdog -------------------------------------------------------------------------- */

static struct {
	GMutex lock;
	char step[256];
	unsigned seconds;
} wdog;

static void step(const char *fmt, ...) G_GNUC_PRINTF(1, 2);
static void step(const char *fmt, ...)
{
	va_list ap;

	g_mutex_lock(&wdog.lock);
	va_start(ap, fmt);
	g_vsnprintf(wdog.step, sizeof(wdog.step), fmt, ap);
	va_end(ap);
	g_mutex_unlock(&wdog.lock);
	g_test_message("step: %s", wdog.step);
}

static gpointer case_watchdog(gpointer unused)
{
	(void)unused;
	g_usleep((gulong)wdog.seconds * G_USEC_PER_SEC);
	g_mutex_lock(&wdog.lock);
	fprintf(stderr, "case watchdog: still running after %u s; last step: %s\n", wdog.seconds,
		wdog.step);
	fflush(stderr);
	abort();
	return NULL;
}

/* --- engines -------------------------------------------------------------------------------- */

/* Engine YAML with nvlink on the fake driver; @opts and @transfer are extra flow-map items. */
static char *yaml_for(const char *opts, const char *transfer, const char *extra)
{
	return g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
			       "transfer: {%s}\n"
			       "transports:\n"
			       "  - name: nvlink\n"
			       "    required: true\n"
			       "    options: {library: \"%s\"%s%s}\n"
			       "%s",
			       transfer ? transfer : "", fake_lib, opts ? ", " : "",
			       opts ? opts : "", extra ? extra : "");
}

struct logbuf {
	GMutex lock;
	GString *text;
};

static void log_cb(void *user, enum te_log_level level, const char *msg)
{
	struct logbuf *l = user;

	g_mutex_lock(&l->lock);
	g_string_append_printf(l->text, "%d %s\n", (int)level, msg);
	g_mutex_unlock(&l->lock);
}

static enum te_status engine_new(const char *yaml, struct logbuf *log, struct te_engine **out)
{
	struct te_engine_opts o;

	memset(&o, 0, sizeof(o));
	o.size = sizeof(o);
	o.config_yaml = yaml;
	o.config_yaml_len = strlen(yaml);
	o.config_name = "nvlink_test";
	if (log) {
		o.log_fn = log_cb;
		o.log_user = log;
		o.log_level = TE_LOG_INFO;
	} else {
		o.log_level = -1;
	}
	return te_engine_new(&o, out);
}

static struct te_engine *engine_ok(const char *opts, const char *transfer)
{
	g_autofree char *y = yaml_for(opts, transfer, NULL);
	struct te_engine *e = NULL;

	assert_ok(engine_new(y, NULL, &e));
	return e;
}

/* --- the fake's books: nothing left behind --------------------------------------------------- */

struct fakecuda_live {
	int allocs, ipc_maps, vmm_maps, vmm_handles, reservations, host_regs, streams, events,
		ctx_refs;
};

static void assert_fake_clean(const char *when)
{
	void *dl = real_driver ? NULL : dlopen(fake_lib, RTLD_NOW | RTLD_NOLOAD);
	void (*live)(struct fakecuda_live *);
	struct fakecuda_live l;

	if (!dl)
		return; /* never loaded in this process */
	*(void **)&live = dlsym(dl, "fakecuda_live");
	g_assert_nonnull(live);
	live(&l);
	dlclose(dl);
	if (l.allocs || l.ipc_maps || l.vmm_maps || l.vmm_handles || l.reservations ||
	    l.host_regs || l.streams || l.events || l.ctx_refs)
		g_error("%s: left behind in the driver: %d allocations, %d IPC mappings, %d VMM "
			"mappings, %d VMM handles, %d reservations, %d host registrations, %d "
			"streams, %d events, %d context references",
			when, l.allocs, l.ipc_maps, l.vmm_maps, l.vmm_handles, l.reservations,
			l.host_regs, l.streams, l.events, l.ctx_refs);
}

static void free_engine(struct te_engine *e)
{
	initiator_free(e);
}

/* --- device buffers on this side ------------------------------------------------------------- */

/* A registered local buffer at @location with a host shadow for filling and checking. */
struct gbuf {
	uint8_t *dev;  /* what requests name */
	uint8_t *host; /* shadow */
	size_t len;
	bool device;
};

static void gbuf_new(struct gbuf *b, struct te_engine *e, size_t len, const char *location)
{
	b->len = len;
	b->host = g_malloc(len);
	memset(b->host, 0xee, len);
	b->device = strncmp(location, "cpu", 3) != 0;
	if (b->device) {
		assert_ok(te_mem_alloc(e, location, len, (void **)&b->dev));
		assert_ok(te_mem_copy(e, b->dev, b->host, len));
	} else {
		b->dev = g_aligned_alloc(1, len, 4096);
		memset(b->dev, 0xee, len);
	}
	assert_ok(te_mem_register(e, b->dev, len, location, TE_MEM_LOCAL));
}

static void gbuf_push(struct gbuf *b, struct te_engine *e, size_t off, size_t len)
{
	if (b->device)
		assert_ok(te_mem_copy(e, b->dev + off, b->host + off, len));
	else
		memcpy(b->dev + off, b->host + off, len);
}

static void gbuf_pull(struct gbuf *b, struct te_engine *e, size_t off, size_t len)
{
	if (b->device)
		assert_ok(te_mem_copy(e, b->host + off, b->dev + off, len));
	else
		memcpy(b->host + off, b->dev + off, len);
}

static void gbuf_free(struct gbuf *b, struct te_engine *e)
{
	int64_t t0 = now_ns();
	enum te_status st;

	while ((st = te_mem_unregister(e, b->dev)) == TE_ERR_BUSY && now_ns() - t0 < 2 * S_NS)
		sleep_ms(1);
	assert_ok(st);
	if (b->device)
		assert_ok(te_mem_free(e, b->dev));
	else
		g_aligned_free(b->dev);
	g_free(b->host);
}

/* --- data checks with a local buffer at any location ------------------------------------------ */

static void gxfer_sizes(struct te_engine *e, te_segment_id seg, struct node *n, const size_t *sizes,
			size_t count, const char *location)
{
	uint8_t *mirror = mirror_new(n);
	struct gbuf l;
	uint64_t seed = 100;

	node_fill(n, 0, n->total, 0); /* back to what mirror_new says, after earlier checks */

	gbuf_new(&l, e, (64u << 20) + 8192, location);
	for (size_t s = 0; s < count; s++) {
		size_t len = sizes[s];
		const uint64_t places[3][2] = { { 0, 0 }, { 4097, 3 }, { n->size - len, 4093 } };

		for (size_t p = 0; p < G_N_ELEMENTS(places); p++) {
			uint64_t roff = places[p][0], abs = n->guard + roff;
			size_t loff = places[p][1], tail;
			g_autofree char *what =
				g_strdup_printf("%s: %zu bytes at buffer+%" PRIu64 ", local+%zu",
						location, len, roff, loff);
			struct te_request r;

			if (roff + len > n->size)
				continue;
			step("WRITE %s", what);
			sysnode_fill(l.host + loff, abs, len, ++seed);
			gbuf_push(&l, e, loff, len);
			r = (struct te_request){ TE_OP_WRITE, seg, l.dev + loff, n->buf + roff,
						 len };
			batch_run_ok(e, &r, 1, WAIT_NS, xfer_tp);
			memcpy(mirror + abs, l.host + loff, len);
			g_assert_cmphex(node_checksum(n, abs, len), ==,
					sysnode_fnv(mirror + abs, len));
			g_assert_cmphex(node_checksum(n, abs - 64, 64), ==,
					sysnode_fnv(mirror + abs - 64, 64));
			g_assert_cmphex(node_checksum(n, abs + len, 64), ==,
					sysnode_fnv(mirror + abs + len, 64));

			step("READ %s", what);
			node_fill(n, abs, len, ++seed);
			sysnode_fill(mirror + abs, abs, len, seed);
			tail = MIN(l.len, loff + len + 65536);
			memset(l.host, 0xee, tail);
			gbuf_push(&l, e, 0, tail);
			r = (struct te_request){ TE_OP_READ, seg, l.dev + loff, n->buf + roff,
						 len };
			batch_run_ok(e, &r, 1, WAIT_NS, xfer_tp);
			gbuf_pull(&l, e, 0, tail);
			assert_bytes(l.host + loff, mirror + abs, len, what);
			assert_untouched(l.host, 0, loff, what);
			assert_untouched(l.host, loff + len, tail, what);
		}
	}
	step("%s: the whole target mapping", location);
	assert_node_is(n, mirror, "after every size");
	gbuf_free(&l, e);
	g_free(mirror);
}

static void gxfer_batch(struct te_engine *e, te_segment_id seg, struct node *n, unsigned count,
			uint32_t max_len, const char *location)
{
	uint8_t *mirror = mirror_new(n);
	struct gbuf l;
	struct te_request *r = g_new0(struct te_request, count);
	uint64_t *roff = g_new(uint64_t, count), *loff = g_new(uint64_t, count);
	uint64_t rc = 7, lc = 1, seed = 500;
	GRand *rnd = g_rand_new_with_seed(g_test_rand_int());

	node_fill(n, 0, n->total, 0);
	for (unsigned i = 0; i < count; i++) {
		r[i].length = 1 + (uint64_t)g_rand_int_range(rnd, 0, (gint32)max_len);
		roff[i] = rc;
		loff[i] = lc;
		rc += r[i].length + (uint64_t)g_rand_int_range(rnd, 1, 16);
		lc += r[i].length + (uint64_t)g_rand_int_range(rnd, 1, 16);
	}
	g_assert_cmpuint(rc, <, n->size);
	gbuf_new(&l, e, lc + 4096, location);

	step("%s: %u WRITEs in one batch", location, count);
	for (unsigned i = 0; i < count; i++) {
		uint64_t abs = n->guard + roff[i];

		sysnode_fill(l.host + loff[i], abs, r[i].length, seed);
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l.dev + loff[i], n->buf + roff[i],
					    r[i].length };
		memcpy(mirror + abs, l.host + loff[i], r[i].length);
	}
	gbuf_push(&l, e, 0, l.len);
	batch_run_ok(e, r, count, WAIT_NS, xfer_tp);
	assert_node_is(n, mirror, "after the WRITE batch");

	step("%s: %u READs in one batch", location, count);
	node_fill(n, n->guard, rc, ++seed);
	sysnode_fill(mirror + n->guard, n->guard, rc, seed);
	memset(l.host, 0xee, l.len);
	gbuf_push(&l, e, 0, l.len);
	for (unsigned i = 0; i < count; i++)
		r[i].opcode = TE_OP_READ;
	batch_run_ok(e, r, count, WAIT_NS, xfer_tp);
	gbuf_pull(&l, e, 0, l.len);
	for (unsigned i = 0; i < count; i++) {
		g_autofree char *what = g_strdup_printf("READ request %u", i);

		assert_bytes(l.host + loff[i], mirror + n->guard + roff[i], r[i].length, what);
		assert_untouched(l.host, i ? loff[i - 1] + r[i - 1].length : 0, loff[i], what);
	}
	gbuf_free(&l, e);
	g_rand_free(rnd);
	g_free(loff);
	g_free(roff);
	g_free(r);
	g_free(mirror);
}

/* --- nodes ---------------------------------------------------------------------------------- */

/* A te-node target whose buffer is device memory at @location. */
static struct node *gnode_start(const char *opts, const char *location, const char *extra)
{
	g_autofree char *y = yaml_for(opts, NULL, extra);
	const char *argv[] = { node_path, "--yaml", y, "--location", location, NULL };

	step("start te-node at %s", location);
	return node_start_argv(argv);
}

static char *node_descriptor(struct node *n)
{
	node_send(n, "descriptor");
	return node_expect(n, "descriptor ", NODE_REPLY_MS);
}

/* Every task of @b terminal; counts by state into @by_state (TE_STATE_* indexed). */
static void count_states(struct te_engine *e, te_batch_id b, uint32_t n, uint32_t by_state[7])
{
	memset(by_state, 0, 7 * sizeof(by_state[0]));
	for (uint32_t i = 0; i < n; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		if (!te_state_is_terminal(ti.state))
			g_error("task %u of %u is %s after the batch ended", i, n,
				te_state_str(ti.state));
		by_state[ti.state]++;
	}
}

/* --- integration: loading, errors, memory ------------------------------------------------------ */

static void test_load(void)
{
	g_autofree char *y = yaml_for(NULL, NULL, NULL);
	struct logbuf log = { .text = g_string_new(NULL) };
	struct te_engine *e = NULL;
	void *p = NULL;

	g_mutex_init(&log.lock);
	step("engine with nvlink on the fake driver");
	assert_ok(engine_new(y, &log, &e));
	g_test_message("log:\n%s", log.text->str);
	if (!real_driver) {
		assert_contains(log.text->str,
				"2 GPU(s): cuda:0 fakecuda GPU 0 (0000:10:00.0, NUMA 0");
		assert_contains(log.text->str, "cuda:1 fakecuda GPU 1 (0000:20:00.0, NUMA 1");
		assert_contains(log.text->str, "CUDA driver 13.0 via ");
	}
	assert_contains(log.text->str, " GPU(s): cuda:0 ");
	assert_ok(te_mem_alloc(e, gpu1, 4096, &p));
	assert_ok(te_mem_free(e, p));
	free_engine(e);
	assert_fake_clean("after the engine");
	g_string_free(log.text, TRUE);
	g_mutex_clear(&log.lock);
}

/* te_engine_new fails with TE_ERR_PLUGIN_INIT and @text in the error. */
static void expect_init_failure(const char *opts, const char *text)
{
	g_autofree char *y = yaml_for(opts, NULL, NULL);
	struct te_engine *e = NULL;

	assert_status(engine_new(y, NULL, &e), TE_ERR_PLUGIN_INIT);
	g_assert_null(e);
	g_test_message("error: %s", te_last_error());
	assert_contains(te_last_error(), "transport 'nvlink' (required)");
	assert_contains(te_last_error(), "init failed: no device (-106)");
	assert_contains(te_last_error(), text);
}

static void test_no_device(void)
{
	g_setenv("FAKECUDA_DEVICES", "0", TRUE);
	expect_init_failure(NULL, "nvlink: cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device "
				  "is detected");
	assert_fake_clean("after the failed init");
}

static void test_old_driver(void)
{
	g_autofree char *want = g_strdup_printf("nvlink: the CUDA driver %s is version 11.8 "
						"(11080); nvlink needs 12.0 (12000) or newer",
						fake_lib);

	g_setenv("FAKECUDA_DRIVER_VERSION", "11080", TRUE);
	expect_init_failure(NULL, want);
}

static void test_missing_library(void)
{
	g_autofree char *y = NULL;
	struct logbuf log = { .text = g_string_new(NULL) };
	struct te_engine *e = NULL;
	const char *at;
	void *p = NULL;
	int hits = 0;

	step("required: the engine does not start");
	y = g_strdup_printf("transports:\n  - name: nvlink\n    required: true\n"
			    "    options: {library: /nonexistent/libcuda.so.1}\n");
	assert_status(engine_new(y, NULL, &e), TE_ERR_PLUGIN_INIT);
	assert_contains(te_last_error(),
			"nvlink: no CUDA driver: cannot load "
			"/nonexistent/libcuda.so.1: /nonexistent/libcuda.so.1: "
			"cannot open shared object file: No such file or directory");
	g_free(y);

	step("optional: the engine starts without it and says so once");
	g_mutex_init(&log.lock);
	y = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
			    "transports:\n  - name: nvlink\n    required: false\n"
			    "    options: {library: /nonexistent/libcuda.so.1}\n"
			    "  - name: tcp\n");
	assert_ok(engine_new(y, &log, &e));
	for (at = log.text->str; (at = strstr(at, "nvlink")); at++)
		hits += g_str_has_prefix(at, "nvlink' (optional) skipped");
	g_test_message("log:\n%s", log.text->str);
	g_assert_cmpint(hits, ==, 1);
	assert_contains(log.text->str, "cannot load /nonexistent/libcuda.so.1");
	/* Nobody owns cuda memory now. */
	assert_status(te_mem_alloc(e, "cuda:0", 4096, &p), TE_ERR_MEMORY_TYPE);
	free_engine(e);
	g_string_free(log.text, TRUE);
	g_mutex_clear(&log.lock);
}

static void test_options(void)
{
	g_autofree char *y1 = yaml_for("bogus: 1", NULL, NULL);
	g_autofree char *y2 = yaml_for("window: 0", NULL, NULL);
	g_autofree char *y3 = yaml_for("alloc: managed", NULL, NULL);
	struct te_engine *e = NULL;

	assert_status(engine_new(y1, NULL, &e), TE_ERR_PLUGIN_INIT);
	assert_contains(te_last_error(), "nvlink: unknown option 'bogus'");
	assert_status(engine_new(y2, NULL, &e), TE_ERR_PLUGIN_INIT);
	assert_contains(te_last_error(), "nvlink: option 'window': expected an integer in [1, "
					 "4096], got '0'");
	assert_status(engine_new(y3, NULL, &e), TE_ERR_PLUGIN_INIT);
	assert_contains(te_last_error(), "nvlink: option 'alloc': 'managed' is not one of legacy, "
					 "vmm");
	assert_fake_clean("after refused options");
}

static void test_mem(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = g_strdup_printf("alloc: %s", alloc);
	struct te_engine *e = engine_ok(opts, NULL);
	struct te_buffer_info bi[4];
	/* 2 MiB: a whole VMM granule, so both kinds of allocation end exactly there. */
	const size_t len = 2 * MIB;
	uint8_t *d0 = NULL, *d1 = NULL, *h = g_malloc(len), *back = g_malloc0(len);
	size_t nb = 0;

	step("te_mem_alloc at cuda:0 and %s (%s)", gpu1, alloc);
	assert_ok(te_mem_alloc(e, "cuda:0", len, (void **)&d0));
	assert_ok(te_mem_alloc(e, gpu1, len, (void **)&d1));
	step("a cuda index that does not exist");
	{
		void *p = NULL;

		assert_status(te_mem_alloc(e, "cuda:63", MIB, &p), TE_ERR_NO_DEVICE);
		assert_contains(te_last_error(), "nvlink: cuda:63: no such CUDA device (");
		if (!real_driver)
			assert_contains(te_last_error(), "(2 visible: cuda:0..1)");
	}
	step("te_mem_copy host -> cuda:0 -> %s -> host", gpu1);
	sysnode_fill(h, 0, len, 77);
	assert_ok(te_mem_copy(e, d0, h, len));
	assert_ok(te_mem_copy(e, d1, d0, len));
	assert_ok(te_mem_copy(e, back, d1 + 0, len));
	assert_bytes(back, h, len, "round trip through two GPUs");
	assert_ok(te_mem_copy(e, back, d0 + 5, 100));
	assert_bytes(back, h + 5, 100, "an unaligned piece");

	step("a range crossing the end of its allocation");
	assert_status(te_mem_copy(e, back, d0 + len - 10, 100), TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), "runs past the end of its cuda:0 allocation");
	assert_status(te_mem_register(e, d0 + len - 10, 100, "cuda:0", TE_MEM_REMOTE),
		      TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), "runs past the end of its cuda:0 allocation");
	assert_status(te_mem_register(e, d0 + len - 10, 100, "*", TE_MEM_REMOTE),
		      TE_ERR_OUT_OF_RANGE);

	step("te_mem_register: a wrong device, '*' detection, host memory");
	assert_status(te_mem_register(e, d0, len, "cuda:5", TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), "is cuda:0 memory, not 'cuda:5'");
	assert_status(te_mem_register(e, h, len, "cuda:0", TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_ok(te_mem_register(e, d1 + 4096, 8192, "*", TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, d0, len, "cuda:0", TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, h, len, "*", TE_MEM_LOCAL));
	assert_ok(te_segment_buffers(e, TE_SEGMENT_LOCAL, bi, G_N_ELEMENTS(bi), &nb));
	g_assert_cmpuint(nb, ==, 2);
	for (size_t i = 0; i < nb; i++) {
		if (bi[i].addr == (uintptr_t)d1 + 4096)
			g_assert_cmpstr(bi[i].location, ==, gpu1);
		else
			g_assert_cmpstr(bi[i].location, ==, "cuda:0");
	}
	assert_ok(te_mem_unregister(e, h));
	assert_ok(te_mem_unregister(e, d0));
	assert_ok(te_mem_unregister(e, d1 + 4096));
	assert_ok(te_mem_free(e, d0));
	assert_ok(te_mem_free(e, d1));
	step("memory te_mem_alloc handed out and nobody freed goes with the engine");
	assert_ok(te_mem_alloc(e, "cuda:0", 3 * MIB, (void **)&d0));
	free_engine(e);
	assert_fake_clean("after the engine");
	g_free(h);
	g_free(back);
}

static void test_oom(void)
{
	struct te_engine *e;
	void *p = NULL, *q = NULL;

	g_setenv("FAKECUDA_OOM_BYTES", "4194304", TRUE);
	e = engine_ok(NULL, NULL);
	assert_ok(te_mem_alloc(e, "cuda:0", 2 * MIB, &p));
	assert_status(te_mem_alloc(e, "cuda:0", 4 * MIB, &q), TE_ERR_NOMEM);
	g_test_message("error: %s", te_last_error());
	assert_contains(te_last_error(), "nvlink: cuda:0 (0000:10:00.0): cuMemAlloc of 4194304 "
					 "bytes: CUDA_ERROR_OUT_OF_MEMORY: out of memory");
	assert_ok(te_mem_free(e, p));
	free_engine(e);
	assert_fake_clean("after the engine");
}

/* Two engines of this process: device pointers of the other are valid here, no import. */
static void test_in_process(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = g_strdup_printf("alloc: %s", alloc);
	struct te_engine *a = engine_ok(opts, NULL), *b = engine_ok(opts, NULL);
	const char *locs[] = { gpu1, "cuda:0", "cpu" };
	const size_t len = 3 * MIB + 5;
	uint8_t *target = NULL, *want = g_malloc(len);
	char *json = NULL;
	size_t jlen = 0;
	te_segment_id seg;

	assert_ok(te_mem_alloc(b, "cuda:0", len, (void **)&target));
	assert_ok(te_mem_register(b, target, len, "cuda:0", TE_MEM_REMOTE));
	assert_ok(te_segment_export(b, &json, &jlen));
	assert_ok(te_segment_import(a, json, jlen, &seg));
	te_free(json);
	for (size_t k = 0; k < G_N_ELEMENTS(locs); k++) {
		struct gbuf l;
		struct te_request r;
		te_batch_id bid;
		enum te_status sst, wst;
		struct te_task_info ti;

		step("in process, local %s, %s allocations", locs[k], alloc);
		gbuf_new(&l, a, len, locs[k]);
		sysnode_fill(l.host, 0, len, 10 + k);
		gbuf_push(&l, a, 0, len);
		r = (struct te_request){ TE_OP_WRITE, seg, l.dev, (uintptr_t)target, len };
		bid = batch_run(a, &r, 1, WAIT_NS, &sst, &wst);
		assert_ok(sst);
		assert_ok(wst);
		assert_ok(te_task_status(a, bid, 0, &ti));
		g_assert_cmpstr(ti.transport, ==, "nvlink");
		/* The local GPU copies; for host memory, the GPU holding the target. */
		g_assert_true(g_str_has_prefix(
			ti.device, k == 0 && !strcmp(gpu1, "cuda:1") ? "cuda:1 " : "cuda:0 "));
		assert_ok(te_batch_free(a, bid));
		assert_ok(te_mem_copy(b, want, target, len));
		assert_bytes(want, l.host, len, "WRITE in process");
		sysnode_fill(want, 0, len, 20 + k);
		assert_ok(te_mem_copy(b, target, want, len));
		r.opcode = TE_OP_READ;
		batch_run_ok(a, &r, 1, WAIT_NS, "nvlink");
		gbuf_pull(&l, a, 0, len);
		assert_bytes(l.host, want, len, "READ in process");
		gbuf_free(&l, a);
	}
	assert_ok(te_segment_close(a, seg));
	free_engine(a);
	free_engine(b);
	assert_fake_clean("after both engines");
	g_free(want);
}

/* --- system: two processes ------------------------------------------------------------------- */

static const size_t xfer_size_list[] = { 1, 7, 4097, 65536, MIB + 3, 16 * MIB, 64 * MIB };

static void test_sys_sizes(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = g_strdup_printf("alloc: %s", alloc);
	struct node *n = gnode_start(opts, "cuda:0", NULL);
	struct te_engine *e = engine_ok(NULL, NULL);
	te_segment_id seg = open_node(e, n);

	step("host buffer here, cuda:0 there (%s)", alloc);
	xfer_sizes(e, seg, n, xfer_size_list, G_N_ELEMENTS(xfer_size_list), WAIT_NS, "nvlink");
	gxfer_sizes(e, seg, n, xfer_size_list, G_N_ELEMENTS(xfer_size_list), gpu1);
	gxfer_sizes(e, seg, n, xfer_size_list, G_N_ELEMENTS(xfer_size_list), "cuda:0");
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

static void test_sys_batch(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = g_strdup_printf("alloc: %s", alloc);
	struct node *n = gnode_start(opts, "cuda:0", NULL);
	struct te_engine *e = engine_ok(NULL, NULL);
	te_segment_id seg = open_node(e, n);

	step("1000 requests, host buffer here");
	xfer_batch(e, seg, n, 1000, 40000, WAIT_NS, "nvlink");
	gxfer_batch(e, seg, n, 1000, 40000, gpu1);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

/*
 * Slow copies and a short deadline (or a cancel): every task ends TIMEOUT (CANCELED), and only
 * once its copy ran to its end: the target holds every byte sent when the batch is reported,
 * and nothing changes afterwards.
 */
static void slow_writes(bool cancel)
{
	struct node *n = gnode_start(NULL, "cuda:0", NULL);
	struct te_engine *e;
	te_segment_id seg;
	const uint32_t count = 8;
	const size_t len = 256 * 1024;
	struct te_request r[8];
	uint8_t *mirror = mirror_new(n);
	uint32_t states[7];
	struct lbuf l;
	te_batch_id b;
	enum te_status st;
	int64_t t0;


	g_setenv("FAKECUDA_COPY_DELAY_US", "400000", TRUE); /* this process only */
	e = engine_ok(NULL, cancel ? "timeout_ms: 30000" : "timeout_ms: 100");
	seg = open_node(e, n);
	lbuf_new(&l, e, count * len);
	for (uint32_t i = 0; i < count; i++) {
		uint64_t abs = n->guard + i * len;

		sysnode_fill(l.p + i * len, abs, len, 900 + i);
		memcpy(mirror + abs, l.p + i * len, len);
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l.p + i * len, n->buf + i * len,
					    len };
	}
	step("%u slow WRITEs, %s", count, cancel ? "canceled at once" : "deadline 100 ms");
	assert_ok(te_batch_new(e, count, &b));
	t0 = now_ns();
	assert_ok(te_batch_submit(e, b, r, count));
	if (cancel)
		assert_ok(te_batch_cancel(e, b));
	st = te_batch_wait(e, b, WAIT_NS);
	g_test_message("batch reported after %.0f ms: %s", (now_ns() - t0) / 1e6,
		       te_status_str(st));
	g_assert_cmpint(st, ==, cancel ? TE_ERR_CANCELED : TE_ERR_TIMEOUT);
	count_states(e, b, count, states);
	g_assert_cmpuint(states[cancel ? TE_STATE_CANCELED : TE_STATE_TIMEOUT], ==, count);
	/* Reported only once the copies were done: every byte is there, no later change. */
	g_assert_cmpint(now_ns() - t0, >=, 400 * MS_NS);
	step("target after the report");
	assert_node_is(n, mirror, "when the batch was reported");
	sleep_ms(500);
	assert_node_is(n, mirror, "0.5 s after the report");
	assert_ok(te_batch_free(e, b));
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
	g_free(mirror);
}

static void test_sys_deadline(void)
{
	slow_writes(false);
}

static void test_sys_cancel(void)
{
	slow_writes(true);
}

static void test_sys_kill(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", NULL);
	g_autofree char *desc = node_descriptor(n);
	g_autofree char *pid = g_strdup(n->pid);
	g_autofree char *gone = g_strdup_printf("process %s of this host is gone", pid);
	struct te_engine *e, *e2;
	te_segment_id seg, seg2 = 0;
	const uint32_t count = 1000;
	struct te_request *r = g_new0(struct te_request, count);
	uint32_t states[7];
	struct lbuf l;
	te_batch_id b;
	enum te_status st;

	g_setenv("FAKECUDA_COPY_DELAY_US", "2000", TRUE);
	e = engine_ok(NULL, "timeout_ms: 20000");
	seg = open_node(e, n);
	lbuf_new(&l, e, count * 4096);
	for (uint32_t i = 0; i < count; i++)
		r[i] = (struct te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg, l.p + i * 4096,
					    n->buf + i * 4096, 4096 };
	step("1000 requests, then SIGKILL of the target");
	assert_ok(te_batch_new(e, count, &b));
	assert_ok(te_batch_submit(e, b, r, count));
	sleep_ms(100);
	node_kill(n);
	watchdog_arm(60, "te_batch_wait after the kill");
	st = te_batch_wait(e, b, WAIT_NS);
	watchdog_disarm();
	g_assert_cmpint(st, !=, TE_INPROGRESS);
	count_states(e, b, count, states);
	g_test_message("after the kill: %u completed, %u failed, %u timed out, %u canceled",
		       states[TE_STATE_COMPLETED], states[TE_STATE_FAILED],
		       states[TE_STATE_TIMEOUT], states[TE_STATE_CANCELED]);
	assert_ok(te_batch_free(e, b));

	step("the dead process's handles are refused, with a clear error");
	e2 = engine_ok(NULL, NULL);
	st = te_segment_import(e2, desc, strlen(desc), &seg2);
	g_test_message("import of the dead target's descriptor: %s: %s", te_status_str(st),
		       te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_NO_TRANSPORT);
	assert_contains(te_last_error(), gone);
	free_engine(e2);

	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiators (the dead target's mappings released)");
	node_release(n);
	g_free(r);
}

/* Run @count WRITEs of 64 KiB from a host buffer; returns the batch (terminal). */
static te_batch_id run_writes(struct te_engine *e, te_segment_id seg, struct node *n,
			      struct lbuf *l, uint32_t count, enum te_status *wait_out)
{
	struct te_request *r = g_new0(struct te_request, count);
	enum te_status sst;
	te_batch_id b;

	for (uint32_t i = 0; i < count; i++)
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l->p + i * 65536, n->buf + i * 65536,
					    65536 };
	b = batch_run(e, r, count, WAIT_NS, &sst, wait_out);
	g_free(r);
	return b;
}

static void test_sys_fault_copy(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", NULL);
	struct te_engine *e;
	te_segment_id seg;
	uint32_t states[7], failed = 0;
	struct lbuf l;
	te_batch_id b;
	enum te_status st;


	g_setenv("FAKECUDA_FAIL_COPY_AFTER", "5", TRUE);
	e = engine_ok(NULL, "retries: 0");
	seg = open_node(e, n);
	lbuf_new(&l, e, 20 * 65536);
	step("20 WRITEs, the 6th copy fails at launch");
	b = run_writes(e, seg, n, &l, 20, &st);
	count_states(e, b, 20, states);
	g_assert_cmpuint(states[TE_STATE_FAILED], ==, 1);
	g_assert_cmpuint(states[TE_STATE_COMPLETED], ==, 19);
	for (uint32_t i = 0; i < 20; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		if (ti.state != TE_STATE_FAILED)
			continue;
		failed++;
		g_test_message("task %u: %s: %s", i, te_status_str(ti.status), ti.detail);
		g_assert_cmpint(ti.status, ==, TE_ERR_DEVICE_FAILED);
		assert_contains(ti.detail, "nvlink: cuda:0 (0000:10:00.0): cuMemcpyAsync of 65536 "
					   "bytes to 0x");
		assert_contains(ti.detail, "CUDA_ERROR_UNKNOWN: unknown error");
	}
	g_assert_cmpuint(failed, ==, 1);
	assert_ok(te_batch_free(e, b));
	step("later copies work");
	b = run_writes(e, seg, n, &l, 20, &st);
	assert_ok(st);
	assert_ok(te_batch_free(e, b));
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

static void test_sys_fault_sticky(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", NULL);
	const char *text = "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered";
	struct te_engine *e;
	te_segment_id seg;
	uint32_t states[7];
	struct lbuf l;
	te_batch_id b;
	enum te_status st;
	uint8_t host[64];
	void *dev = NULL;


	g_setenv("FAKECUDA_STICKY_AFTER", "3", TRUE);
	e = engine_ok(NULL, NULL);
	assert_ok(te_mem_alloc(e, "cuda:0", 4096, &dev));
	seg = open_node(e, n);
	lbuf_new(&l, e, 20 * 65536);
	step("20 WRITEs; the 4th copy raises a sticky error");
	b = run_writes(e, seg, n, &l, 20, &st);
	count_states(e, b, 20, states);
	g_test_message("%u completed, %u failed", states[TE_STATE_COMPLETED],
		       states[TE_STATE_FAILED]);
	g_assert_cmpuint(states[TE_STATE_FAILED], >=, 17);
	g_assert_cmpuint(states[TE_STATE_COMPLETED] + states[TE_STATE_FAILED], ==, 20);
	for (uint32_t i = 0; i < 20; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		if (ti.state != TE_STATE_FAILED)
			continue;
		g_assert_cmpint(ti.status, ==, TE_ERR_DEVICE_FAILED);
		assert_contains(ti.detail, "nvlink: cuda:0 (0000:10:00.0): ");
		assert_contains(ti.detail, text);
	}
	assert_ok(te_batch_free(e, b));
	step("the device stays failed: new slices and te_mem_copy fail with the driver text");
	b = run_writes(e, seg, n, &l, 4, &st);
	count_states(e, b, 4, states);
	g_assert_cmpuint(states[TE_STATE_FAILED], ==, 4);
	{
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, 0, &ti));
		assert_contains(ti.detail, text);
	}
	assert_ok(te_batch_free(e, b));
	assert_status(te_mem_copy(e, host, dev, sizeof(host)), TE_ERR_DEVICE_FAILED);
	lbuf_free(&l, e);
	assert_ok(te_mem_free(e, dev));
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

static void test_sys_fault_oom(void)
{
	g_autofree char *y = yaml_for(NULL, NULL, NULL);
	const char *argv[] = { node_path, "--yaml", y, "--location", "cuda:0", NULL };
	g_autofree char *err = NULL;
	struct node *n;


	step("a target whose GPU has 1 MiB");
	g_setenv("FAKECUDA_OOM_BYTES", "1048576", TRUE); /* inherited by the node only */
	n = node_spawn("te-node (oom)", argv);
	g_unsetenv("FAKECUDA_OOM_BYTES");
	g_assert_true(node_wait_exit(n, 30000));
	n->dead = true;
	g_assert_true(g_subprocess_get_if_exited(n->proc));
	g_assert_cmpint(g_subprocess_get_exit_status(n->proc), ==, 1);
	err = node_stderr(n);
	g_test_message("te-node said: %s", err);
	assert_contains(err, "te_mem_alloc(cuda:0, ");
	assert_contains(err, "out of memory: te_mem_alloc: cuda:0: nvlink: ");
	assert_contains(err, "cuMemAlloc of ");
	assert_contains(err, "CUDA_ERROR_OUT_OF_MEMORY: out of memory");
	node_release(n);
}

static void test_sys_fault_ipc(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = g_strdup_printf("alloc: %s", alloc);
	struct node *n = gnode_start(opts, "cuda:0", NULL);
	const char *how = strcmp(alloc, "vmm") == 0 ? "cuMemImportFromShareableHandle(fd)"
						    : "cuIpcOpenMemHandle";
	struct te_engine *e;
	te_segment_id seg;
	uint32_t states[7];
	struct lbuf l;
	te_batch_id b;
	enum te_status st;


	g_setenv("FAKECUDA_IPC_OPEN_FAIL", "1", TRUE);
	e = engine_ok(NULL, NULL);
	step("open the segment: mapping its buffer fails (%s)", how);
	seg = open_node(e, n);
	lbuf_new(&l, e, 4 * 65536);
	b = run_writes(e, seg, n, &l, 4, &st);
	count_states(e, b, 4, states);
	g_assert_cmpuint(states[TE_STATE_FAILED], ==, 4);
	for (uint32_t i = 0; i < 4; i++) {
		struct te_task_info ti;
		g_autofree char *who = g_strdup_printf("of %s (cuda:0 0000:10:00.0, pid %s): %s: "
						       "CUDA_ERROR_MAP_FAILED: mapping of buffer "
						       "object failed",
						       n->segment, n->pid, how);

		assert_ok(te_task_status(e, b, i, &ti));
		g_test_message("task %u: %s", i, ti.detail);
		g_assert_cmpint(ti.status, ==, TE_ERR_PEER_UNREACHABLE);
		assert_contains(ti.detail, "nvlink: cannot map region [0x");
		assert_contains(ti.detail, who);
	}
	assert_ok(te_batch_free(e, b));
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

static void test_sys_no_peer(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", NULL);
	struct te_engine *e;
	te_segment_id seg;
	struct gbuf l;
	struct te_request r;
	te_batch_id b;
	enum te_status sst, wst;
	struct te_task_info ti;


	g_setenv("FAKECUDA_NO_PEER", "1", TRUE);
	e = engine_ok(NULL, NULL);
	seg = open_node(e, n);
	step("cuda:1 here cannot reach cuda:0 there without peer access");
	gbuf_new(&l, e, 65536, "cuda:1");
	r = (struct te_request){ TE_OP_READ, seg, l.dev, n->buf, 65536 };
	b = batch_run(e, &r, 1, WAIT_NS, &sst, &wst);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_test_message("%s", ti.detail);
	g_assert_cmpint(ti.status, ==, TE_ERR_NO_DEVICE);
	assert_contains(ti.detail,
			"nvlink: no path from cuda:1 (0000:20:00.0) to the peer's memory "
			"on GPU 0000:10:00.0 (cuda:0 there): no peer access between them");
	assert_ok(te_batch_free(e, b));
	gbuf_free(&l, e);
	step("cuda:0 here does");
	gbuf_new(&l, e, 65536, "cuda:0");
	r.local = l.dev;
	batch_run_ok(e, &r, 1, WAIT_NS, "nvlink");
	gbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

/* VMM memory with the engines' shared secret: the fd socket authenticates both ways. */
static void test_sys_auth(void)
{
	const char *secret = "auth: {secret: \"nvlink-test-secret-0123456789\"}\n";
	struct node *n = gnode_start("alloc: vmm", "cuda:0", secret);
	g_autofree char *y = yaml_for(NULL, NULL, secret);
	static const size_t sizes[] = { 1, MIB + 3 };
	struct te_engine *e = NULL;
	te_segment_id seg;

	assert_ok(engine_new(y, NULL, &e));
	seg = open_node(e, n);
	step("fd passing with authentication");
	xfer_sizes(e, seg, n, sizes, G_N_ELEMENTS(sizes), WAIT_NS, "nvlink");
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

/* @json with the value of the first "@key":"..." replaced by @value (g_free). */
static char *json_replace(const char *json, const char *key, const char *value)
{
	g_autofree char *pat = g_strdup_printf("\"%s\":\"", key);
	const char *at = strstr(json, pat), *end;

	g_assert_nonnull(at);
	at += strlen(pat);
	end = strchr(at, '"');
	g_assert_nonnull(end);
	return g_strdup_printf("%.*s%s%s", (int)(at - json), json, value, end);
}

/* The value of the first "@key":"..." of @json (g_free). */
static char *json_value(const char *json, const char *key)
{
	g_autofree char *pat = g_strdup_printf("\"%s\":\"", key);
	const char *at = strstr(json, pat), *end;

	g_assert_nonnull(at);
	at += strlen(pat);
	end = strchr(at, '"');
	return g_strndup(at, (gsize)(end - at));
}

/*
 * The target's descriptor as if it came from another host: another host id for the core, and
 * another boot id in nvlink's blob (bytes 8..23) for the plugin.
 */
static char *other_host(const char *desc)
{
	g_autofree char *b64 = json_value(desc, "nvlink");
	g_autofree char *nb64 = NULL, *d1 = NULL;
	gsize n = 0;
	g_autofree guchar *blob = g_base64_decode(b64, &n);

	g_assert_cmpuint(n, >=, 24);
	for (gsize i = 8; i < 24; i++)
		blob[i] ^= 0x5a;
	nb64 = g_base64_encode(blob, n);
	d1 = json_replace(desc, "host", "00000000-0000-0000-0000-00000000beef");
	return json_replace(d1, "nvlink", nb64);
}

/* The kind byte (1 IPC, 2 fd, 3 FABRIC) of the nvlink key of the descriptor's first buffer. */
static int key_kind(const char *desc)
{
	const char *keys = strstr(desc, "\"keys\"");
	g_autofree char *b64 = NULL;
	g_autofree guchar *key = NULL;
	gsize n = 0;

	g_assert_nonnull(keys);
	b64 = json_value(keys, "nvlink");
	key = g_base64_decode(b64, &n);
	g_assert_cmpuint(n, >, 5);
	return key[5];
}

/* Without FABRIC handles, a peer on another host is refused, saying why. */
static void test_sys_other_host(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", NULL);
	g_autofree char *desc = node_descriptor(n);
	g_autofree char *far = other_host(desc);
	struct te_engine *e = engine_ok(NULL, NULL);
	te_segment_id seg = 0;

	step("import the target's descriptor as if from another host");
	assert_status(te_segment_import(e, far, strlen(far), &seg), TE_ERR_NO_TRANSPORT);
	g_test_message("%s", te_last_error());
	assert_contains(te_last_error(), "nvlink: same-host transport, peer is on another host");
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

/*
 * With FABRIC handles (FAKECUDA_FABRIC=1 in both processes): VMM memory is shared through them,
 * also with a peer on "another host"; an IPC handle of another host is refused, naming region,
 * GPU and why.
 */
static void test_sys_fabric(void)
{
	static const size_t sizes[] = { 1, MIB + 3 };
	struct node *vmm, *legacy;
	g_autofree char *dv = NULL, *dl = NULL, *far_v = NULL, *far_l = NULL;
	struct te_engine *e;
	te_segment_id seg, seg_l;
	struct lbuf l;
	struct te_request r;
	te_batch_id b;
	enum te_status sst, wst;
	struct te_task_info ti;

	g_setenv("FAKECUDA_FABRIC", "1", TRUE); /* inherited by the targets */
	vmm = gnode_start("alloc: vmm", "cuda:0", NULL);
	legacy = gnode_start(NULL, "cuda:0", NULL);
	dv = node_descriptor(vmm);
	dl = node_descriptor(legacy);
	g_assert_cmpint(key_kind(dv), ==, 3);
	g_assert_cmpint(key_kind(dl), ==, 1);
	e = engine_ok(NULL, NULL);

	step("VMM memory through FABRIC handles, same host");
	seg = open_node(e, vmm);
	xfer_sizes(e, seg, vmm, sizes, G_N_ELEMENTS(sizes), WAIT_NS, "nvlink");
	assert_ok(te_segment_close(e, seg));

	step("VMM memory through FABRIC handles, a peer on another host");
	far_v = other_host(dv);
	assert_ok(te_segment_import(e, far_v, strlen(far_v), &seg));
	node_fill(vmm, 0, vmm->total, 0); /* what xfer_sizes starts from */
	xfer_sizes(e, seg, vmm, sizes, G_N_ELEMENTS(sizes), WAIT_NS, "nvlink");
	assert_ok(te_segment_close(e, seg));

	step("an IPC handle from another host");
	far_l = other_host(dl);
	assert_ok(te_segment_import(e, far_l, strlen(far_l), &seg_l));
	lbuf_new(&l, e, 4096);
	r = (struct te_request){ TE_OP_READ, seg_l, l.p, legacy->buf, 4096 };
	b = batch_run(e, &r, 1, WAIT_NS, &sst, &wst);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_test_message("%s", ti.detail);
	g_assert_cmpint(ti.status, ==, TE_ERR_PEER_UNREACHABLE);
	assert_contains(ti.detail, "is on another host and has no FABRIC handle (ipc)");
	assert_contains(ti.detail, "(cuda:0 0000:10:00.0)");
	assert_ok(te_batch_free(e, b));
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg_l));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(vmm, 10000, false);
	node_close_free(legacy, 10000, false);
}

/* --- GPU memory over tcp: host staging on both sides ---------------------------------------- */

/*
 * Engines with nvlink (the cuda owner) and tcp. The initiator loads nvlink memory_only, so the
 * core never picks it to move bytes: a cuda buffer here is staged by the core through tcp's
 * bounce buffers, and a cuda buffer of the target is served by the target's tcp through its
 * staging buffers. Both copy through nvlink (the fake driver's copy threads).
 */
static const char tcp_entry[] = "  - name: tcp\n    required: true\n";

static struct te_engine *tcp_initiator(const char *transfer)
{
	g_autofree char *y = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
					     "transfer: {%s}\n"
					     "transports:\n"
					     "  - name: nvlink\n"
					     "    required: true\n"
					     "    memory_only: true\n"
					     "    options: {library: \"%s\"}\n"
					     "%s",
					     transfer ? transfer : "", fake_lib, tcp_entry);
	struct te_engine *e = NULL;

	assert_ok(engine_new(y, NULL, &e));
	return e;
}

/* One READ of @len bytes into device memory here: moved by tcp, staged on this side. */
static void assert_staged_here(struct te_engine *e, te_segment_id seg, struct node *n)
{
	struct gbuf l;
	struct te_request r;
	struct te_task_info ti;
	enum te_status sst, wst;
	te_batch_id b;

	gbuf_new(&l, e, 65536, "cuda:0");
	r = (struct te_request){ TE_OP_READ, seg, l.dev, n->buf, 65536 };
	b = batch_run(e, &r, 1, WAIT_NS, &sst, &wst);
	assert_ok(sst);
	assert_ok(wst);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_assert_cmpstr(ti.transport, ==, "tcp");
	assert_contains(ti.device, "(staged)");
	assert_ok(te_batch_free(e, b));
	gbuf_free(&l, e);
}

static void test_tcp_sizes(void)
{
	struct node *gpu = gnode_start(NULL, "cuda:0", tcp_entry);
	struct node *cpu = gnode_start(NULL, "cpu", tcp_entry);
	struct te_engine *e = tcp_initiator(NULL);
	te_segment_id seg = open_node(e, gpu), seg_cpu;

	xfer_tp = "tcp";
	assert_staged_here(e, seg, gpu);
	step("host memory here, cuda:0 there (served by the target's tcp staging)");
	xfer_sizes(e, seg, gpu, xfer_size_list, G_N_ELEMENTS(xfer_size_list), WAIT_NS, "tcp");
	step("cuda:0 here (staged by the core), cuda:0 there");
	gxfer_sizes(e, seg, gpu, xfer_size_list, G_N_ELEMENTS(xfer_size_list), "cuda:0");
	step("cuda:1 here, host memory there");
	seg_cpu = open_node(e, cpu);
	gxfer_sizes(e, seg_cpu, cpu, xfer_size_list, G_N_ELEMENTS(xfer_size_list), gpu1);
	assert_ok(te_segment_close(e, seg_cpu));
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(cpu, 10000, false);
	node_close_free(gpu, 10000, false);
}

static void test_tcp_batch(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", tcp_entry);
	struct te_engine *e = tcp_initiator(NULL);
	te_segment_id seg = open_node(e, n);

	xfer_tp = "tcp";
	step("1000 requests, host memory here, cuda:0 there");
	xfer_batch(e, seg, n, 1000, 40000, WAIT_NS, "tcp");
	step("1000 requests, cuda:0 here and there");
	gxfer_batch(e, seg, n, 1000, 40000, "cuda:0");
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

/*
 * Staged WRITEs from slow device memory here (every device copy takes 300 ms) with a short
 * deadline or a cancel: every task ends TIMEOUT or CANCELED (or COMPLETED when it beat it), and
 * once the batch is reported the target never changes again.
 */
static void tcp_slow(bool cancel)
{
	struct node *n = gnode_start(NULL, "cuda:0", tcp_entry);
	const uint32_t count = 16;
	const size_t len = 256 * 1024;
	struct te_request r[16];
	uint32_t states[7];
	struct te_engine *e;
	te_segment_id seg;
	struct gbuf l;
	te_batch_id b;
	enum te_status st;
	uint64_t sum;
	int64_t t0;

	g_setenv("FAKECUDA_COPY_DELAY_US", "300000", TRUE); /* this process only */
	g_setenv("FAKECUDA_SYNC_FAULTS", "1", TRUE);
	e = tcp_initiator(cancel ? "timeout_ms: 30000" : "timeout_ms: 200");
	seg = open_node(e, n);
	gbuf_new(&l, e, count * len, "cuda:0");
	for (uint32_t i = 0; i < count; i++) {
		sysnode_fill(l.host + i * len, n->guard + i * len, len, 700 + i);
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l.dev + i * len, n->buf + i * len,
					    len };
	}
	gbuf_push(&l, e, 0, l.len);
	step("%u staged WRITEs from slow device memory, %s", count,
	     cancel ? "canceled at once" : "deadline 200 ms");
	assert_ok(te_batch_new(e, count, &b));
	t0 = now_ns();
	assert_ok(te_batch_submit(e, b, r, count));
	if (cancel)
		assert_ok(te_batch_cancel(e, b));
	watchdog_arm(60, "te_batch_wait of slow staged WRITEs");
	st = te_batch_wait(e, b, WAIT_NS);
	watchdog_disarm();
	g_test_message("batch reported after %.0f ms: %s", (now_ns() - t0) / 1e6,
		       te_status_str(st));
	g_assert_cmpint(st, ==, cancel ? TE_ERR_CANCELED : TE_ERR_TIMEOUT);
	count_states(e, b, count, states);
	g_test_message("%u completed, %u timed out, %u canceled", states[TE_STATE_COMPLETED],
		       states[TE_STATE_TIMEOUT], states[TE_STATE_CANCELED]);
	g_assert_cmpuint(states[TE_STATE_COMPLETED] +
				 states[cancel ? TE_STATE_CANCELED : TE_STATE_TIMEOUT],
			 ==, count);
	g_assert_cmpuint(states[cancel ? TE_STATE_CANCELED : TE_STATE_TIMEOUT], >, 0);
	for (uint32_t i = 0; i < count; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		if (ti.state == TE_STATE_COMPLETED)
			continue;
		g_assert_cmpint(ti.status, ==, cancel ? TE_ERR_CANCELED : TE_ERR_TIMEOUT);
		g_assert_cmpstr(ti.detail, !=, "");
	}
	step("the target after the report");
	sum = node_checksum(n, n->guard, count * len);
	sleep_ms(1000);
	g_assert_cmphex(node_checksum(n, n->guard, count * len), ==, sum);
	assert_ok(te_batch_free(e, b));
	g_unsetenv("FAKECUDA_COPY_DELAY_US"); /* read once per process: stays slow */
	gbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

static void test_tcp_deadline(void)
{
	tcp_slow(false);
}

static void test_tcp_cancel(void)
{
	tcp_slow(true);
}

/* 1000 staged requests from device memory here; SIGKILL of the target: every task ends. */
static void test_tcp_kill(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", tcp_entry);
	const uint32_t count = 1000;
	struct te_request *r = g_new0(struct te_request, count);
	uint32_t states[7];
	struct te_engine *e;
	te_segment_id seg;
	struct gbuf l;
	te_batch_id b;
	enum te_status st;

	g_setenv("FAKECUDA_COPY_DELAY_US", "2000", TRUE);
	g_setenv("FAKECUDA_SYNC_FAULTS", "1", TRUE);
	e = tcp_initiator("timeout_ms: 20000");
	seg = open_node(e, n);
	gbuf_new(&l, e, count * 4096, "cuda:0");
	for (uint32_t i = 0; i < count; i++)
		r[i] = (struct te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg, l.dev + i * 4096,
					    n->buf + i * 4096, 4096 };
	step("1000 staged requests, then SIGKILL of the target");
	assert_ok(te_batch_new(e, count, &b));
	assert_ok(te_batch_submit(e, b, r, count));
	sleep_ms(100);
	node_kill(n);
	watchdog_arm(60, "te_batch_wait after the kill");
	st = te_batch_wait(e, b, WAIT_NS);
	watchdog_disarm();
	g_assert_cmpint(st, !=, TE_INPROGRESS);
	count_states(e, b, count, states);
	g_test_message("after the kill: %u completed, %u failed, %u timed out, %u canceled",
		       states[TE_STATE_COMPLETED], states[TE_STATE_FAILED],
		       states[TE_STATE_TIMEOUT], states[TE_STATE_CANCELED]);
	g_assert_cmpuint(states[TE_STATE_COMPLETED], <, count);
	for (uint32_t i = 0; i < count; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		if (ti.state != TE_STATE_COMPLETED)
			g_assert_cmpstr(ti.detail, !=, "");
	}
	assert_ok(te_batch_free(e, b));
	gbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_release(n);
	g_free(r);
}

/*
 * A failing device copy while staging (here: the core's copy into a bounce buffer; there: the
 * target's tcp copying out of its staging buffer) fails that task with the driver's text.
 */
static void test_tcp_fault_copy(void)
{
	struct node *n = gnode_start(NULL, "cuda:0", tcp_entry);
	struct te_engine *e;
	te_segment_id seg;
	struct te_request r[20];
	uint32_t states[7], failed = 0;
	struct gbuf l;
	te_batch_id b;
	enum te_status sst, wst;

	/* This process's copies: gbuf_new's one fill, then the staged WRITEs' copies. */
	g_setenv("FAKECUDA_FAIL_COPY_AFTER", "6", TRUE);
	g_setenv("FAKECUDA_FAIL_COPY_COUNT", "1", TRUE);
	g_setenv("FAKECUDA_SYNC_FAULTS", "1", TRUE);
	e = tcp_initiator("retries: 0");
	seg = open_node(e, n);
	gbuf_new(&l, e, 20 * 65536, "cuda:0");
	for (uint32_t i = 0; i < 20; i++)
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l.dev + i * 65536, n->buf + i * 65536,
					    65536 };
	step("20 staged WRITEs, one device copy fails");
	b = batch_run(e, r, 20, WAIT_NS, &sst, &wst);
	count_states(e, b, 20, states);
	g_assert_cmpuint(states[TE_STATE_FAILED], ==, 1);
	g_assert_cmpuint(states[TE_STATE_COMPLETED], ==, 19);
	for (uint32_t i = 0; i < 20; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		if (ti.state != TE_STATE_FAILED)
			continue;
		failed++;
		g_test_message("task %u: %s: %s", i, te_status_str(ti.status), ti.detail);
		assert_contains(ti.detail, "CUDA_ERROR_UNKNOWN: unknown error");
	}
	g_assert_cmpuint(failed, ==, 1);
	assert_ok(te_batch_free(e, b));
	step("later staged WRITEs work");
	b = batch_run(e, r, 20, WAIT_NS, &sst, &wst);
	assert_ok(sst);
	assert_ok(wst);
	assert_ok(te_batch_free(e, b));
	gbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

/* The transport and device of a one-request batch from @local to @remote (@len bytes). */
static void assert_moved_by(struct te_engine *e, te_segment_id seg, void *local, uint64_t remote,
			    const char *transport, bool staged)
{
	struct te_request r = { TE_OP_WRITE, seg, local, remote, 4096 };
	struct te_task_info ti;
	enum te_status sst, wst;
	te_batch_id b;

	b = batch_run(e, &r, 1, WAIT_NS, &sst, &wst);
	assert_ok(sst);
	assert_ok(wst);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_test_message("%s -> %s", ti.transport, ti.device);
	g_assert_cmpstr(ti.transport, ==, transport);
	if (staged)
		assert_contains(ti.device, "(staged)");
	else
		g_assert_null(strstr(ti.device, "(staged)"));
	assert_ok(te_batch_free(e, b));
}

/*
 * tcp first in the YAML, nvlink second: GPU memory on either side of one host still goes over
 * nvlink; host memory on both sides follows the YAML order; GPU memory here to host memory
 * there (no nvlink key for host memory) goes over tcp, staged.
 */
static void test_sys_prefer(void)
{
	g_autofree char *tail = g_strdup_printf("  - name: nvlink\n"
						"    required: true\n"
						"    options: {library: \"%s\"}\n",
						fake_lib);
	g_autofree char *y = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
					     "transports:\n"
					     "%s%s",
					     tcp_entry, tail);
	const char *argv_gpu[] = { node_path, "--yaml", y, "--location", "cuda:0", NULL };
	const char *argv_cpu[] = { node_path, "--yaml", y, NULL };
	struct node *gpu = node_start_argv(argv_gpu), *cpu = node_start_argv(argv_cpu);
	struct te_engine *e = NULL;
	te_segment_id sg, sc;
	struct gbuf dev, host;

	assert_ok(engine_new(y, NULL, &e));
	sg = open_node(e, gpu);
	sc = open_node(e, cpu);
	gbuf_new(&dev, e, 65536, "cuda:0");
	gbuf_new(&host, e, 65536, "cpu");
	step("cuda:0 here, cuda:0 there");
	assert_moved_by(e, sg, dev.dev, gpu->buf, "nvlink", false);
	step("host memory here, cuda:0 there");
	assert_moved_by(e, sg, host.dev, gpu->buf, "nvlink", false);
	step("host memory on both sides");
	assert_moved_by(e, sc, host.dev, cpu->buf, "tcp", false);
	step("cuda:0 here, host memory there");
	assert_moved_by(e, sc, dev.dev, cpu->buf, "tcp", true);
	gbuf_free(&dev, e);
	gbuf_free(&host, e);
	assert_ok(te_segment_close(e, sc));
	assert_ok(te_segment_close(e, sg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(cpu, 10000, false);
	node_close_free(gpu, 10000, false);
}

static void add(const char *path, GTestFunc fn)
{
	g_test_add_func(path, fn);
}

/* A case that needs the fake driver's faults. */
static void add_fake(const char *path, GTestFunc fn)
{
	g_test_add_func(path, real_driver ? skip_fake : fn);
}

static void add_data(const char *path, gconstpointer data, GTestDataFunc fn)
{
	g_test_add_data_func(path, data, fn);
}

int main(int argc, char **argv)
{
	const char *w;

	g_test_init(&argc, &argv, NULL);
	signal(SIGPIPE, SIG_IGN);
	fake_lib = g_getenv("FAKECUDA_LIB");
	nvlink_so = find_plugin("nvlink.so");
	node_path = find_te_node();
	if (!fake_lib || !*fake_lib || !nvlink_so || !node_path) {
		printf("1..0 # SKIP needs FAKECUDA_LIB, nvlink.so on TE_PLUGIN_PATH and te-node\n");
		return 77;
	}
	real_driver = g_strcmp0(g_getenv("TE_NVLINK_REAL"), "1") == 0;
	if (real_driver && g_strcmp0(g_getenv("TE_NVLINK_GPUS"), "1") == 0)
		gpu1 = "cuda:0";
	w = g_getenv("TE_NVLINK_WATCHDOG_S");
	wdog.seconds = w && *w ? (unsigned)parse_u64(w, 10) : 100;
	g_thread_unref(g_thread_new("case-watchdog", case_watchdog, NULL));
	g_test_message("fake driver %s; plugin %s; te-node %s", fake_lib, nvlink_so, node_path);

	add("/nvlink/load", test_load);
	add_fake("/nvlink/no-device", test_no_device);
	add_fake("/nvlink/old-driver", test_old_driver);
	add("/nvlink/missing-library", test_missing_library);
	add("/nvlink/options", test_options);
	add_data("/nvlink/mem/legacy", "legacy", test_mem);
	add_data("/nvlink/mem/vmm", "vmm", test_mem);
	add_fake("/nvlink/mem/oom", test_oom);
	add_data("/nvlink/in-process/legacy", "legacy", test_in_process);
	add_data("/nvlink/in-process/vmm", "vmm", test_in_process);
	add_data("/nvlink/sys/sizes/legacy", "legacy", test_sys_sizes);
	add_data("/nvlink/sys/sizes/vmm", "vmm", test_sys_sizes);
	add_data("/nvlink/sys/batch-1000/legacy", "legacy", test_sys_batch);
	add_data("/nvlink/sys/batch-1000/vmm", "vmm", test_sys_batch);
	add_fake("/nvlink/sys/deadline", test_sys_deadline);
	add_fake("/nvlink/sys/cancel", test_sys_cancel);
	add("/nvlink/sys/kill-mid-batch", test_sys_kill);
	add_fake("/nvlink/sys/fault-copy", test_sys_fault_copy);
	add("/nvlink/sys/prefer", test_sys_prefer);
	add("/nvlink/sys/tcp-staged/sizes", test_tcp_sizes);
	add("/nvlink/sys/tcp-staged/batch-1000", test_tcp_batch);
	add_fake("/nvlink/sys/tcp-staged/deadline", test_tcp_deadline);
	add_fake("/nvlink/sys/tcp-staged/cancel", test_tcp_cancel);
	add("/nvlink/sys/tcp-staged/kill-mid-batch", test_tcp_kill);
	add_fake("/nvlink/sys/tcp-staged/fault-copy", test_tcp_fault_copy);
	add_fake("/nvlink/sys/fault-sticky", test_sys_fault_sticky);
	add_fake("/nvlink/sys/fault-oom", test_sys_fault_oom);
	if (!real_driver) {
		add_data("/nvlink/sys/fault-ipc/legacy", "legacy", test_sys_fault_ipc);
		add_data("/nvlink/sys/fault-ipc/vmm", "vmm", test_sys_fault_ipc);
	}
	add_fake("/nvlink/sys/no-peer", test_sys_no_peer);
	add_fake("/nvlink/sys/other-host", test_sys_other_host);
	add_fake("/nvlink/sys/fabric", test_sys_fabric);
	add("/nvlink/sys/auth", test_sys_auth);
	return g_test_run();
}
