/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_test.c: a GPU plugin (nvlink, hip) on its fake runtime, in one process and two. */

/*
 * One source for every GPU plugin: TE_GPU_TEST_VENDOR (nvlink, the default, or hip) picks the
 * plugin, its location kind (cuda:N, hip:N), its fake runtime (tests/gpu/fakecuda,
 * tests/gpu/fakehip over tests/gpu/fakedev: $FAKECUDA_LIB, $FAKEHIP_LIB), the prefix of the
 * fake's fault variables (FAKECUDA_*, FAKEHIP_*) and the runtime's words the cases expect.
 * Every engine loads the plugin with option library: the fake, so the plugin takes its normal
 * dlopen path. With TE_NVLINK_REAL=1 (tests/hw-gpu/run.sh) FAKECUDA_LIB
 * names the real driver instead: cases that need the fake (its faults, its books, its device
 * names) skip, and "the second GPU" is cuda:0 again on a machine with one. The integration cases run engines in this process; the
 * system cases drive tests/system/te-node targets whose buffer is device memory (--location
 * cuda:0) and move data from an engine in this process, with a host or a device buffer on this
 * side. Faults are the fake driver's environment variables, set in this process after the
 * target started (so only the initiator has them) or before (so only the target has them).
 * One meson test runs one case: the fake reads its environment once per process. Every case
 * ends by its own verdict: a watchdog thread aborts it, naming its last step, after
 * $TE_GPU_WATCHDOG_S seconds (meson.build: 20 s under meson's timeout).
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

#include "logcap.h"
#include "sysnode.h"
#include "sysnode_fixture.h"

#define WAIT_NS (60 * S_NS)
#define MIB (1ull << 20)

/* What differs between the plugins under test: names, and the runtime's words. */
struct vendor {
	const char *name;      /* the plugin, its transport name and blob key: "nvlink" */
	const char *kind;      /* location kind: "cuda" */
	const char *prefix;    /* of the fake's variables: "FAKECUDA" (_LIB, _DEVICES, ...) */
	const char *fake;      /* the fake's GPU names: "fakecuda" */
	const char *runtime;   /* the load log: "CUDA driver 13.0 via " */
	const char *api;       /* "no such CUDA device" */
	const char *no_device; /* init failure with <prefix>_DEVICES=0 */
	const char *old_value; /* <prefix>_<old_var>: a runtime too old */
	const char *old_var;
	const char *old_head, *old_tail;    /* its init failure, the library between them */
	const char *missing;		    /* a library that does not exist */
	const char *no_runtime;		    /* "no CUDA driver" */
	bool has_alloc;			    /* option alloc: legacy | vmm */
	const char *bad_opt, *bad_opt_text; /* a third refused option */
	const char *fn_alloc, *fn_copy_async, *fn_ipc_open;
	const char *e_oom, *e_unknown, *e_illegal, *e_map; /* strerror of the injected faults */
};

static const struct vendor vendors[] = {
	{
		.name = "nvlink",
		.kind = "cuda",
		.prefix = "FAKECUDA",
		.fake = "fakecuda",
		.runtime = "CUDA driver 13.0 via ",
		.api = "CUDA",
		.no_device = "nvlink: cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is "
			     "detected",
		.old_var = "DRIVER_VERSION",
		.old_value = "11080",
		.old_head = "nvlink: the CUDA driver ",
		.old_tail = " is version 11.8 (11080); nvlink needs 12.0 (12000) or newer",
		.missing = "/nonexistent/libcuda.so.1",
		.no_runtime = "no CUDA driver",
		.has_alloc = true,
		.bad_opt = "alloc: managed",
		.bad_opt_text = "options.alloc: expected one of: legacy, vmm, got \"managed\"",
		.fn_alloc = "cuMemAlloc",
		.fn_copy_async = "cuMemcpyAsync",
		.fn_ipc_open = "cuIpcOpenMemHandle",
		.e_oom = "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
		.e_unknown = "CUDA_ERROR_UNKNOWN: unknown error",
		.e_illegal = "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
		.e_map = "CUDA_ERROR_MAP_FAILED: mapping of buffer object failed",
	},
	{
		/* ROCm 5 (the fake's default): hipGetErrorString gives the error's name. */
		.name = "hip",
		.kind = "hip",
		.prefix = "FAKEHIP",
		.fake = "fakehip",
		.runtime = "HIP runtime 5.7 (driver 5.7) via ",
		.api = "HIP",
		.no_device = "hip: no HIP device: hipGetDeviceCount: hipErrorNoDevice",
		.old_var = "RUNTIME_VERSION",
		.old_value = "40500000",
		.old_head = "hip: the HIP runtime ",
		.old_tail = " is version 4.5 (40500000); hip needs 5.0 (50000000) or newer",
		.missing = "/nonexistent/libamdhip64.so",
		.no_runtime = "no HIP runtime",
		.has_alloc = false,
		.bad_opt = "alloc: vmm",
		.bad_opt_text = "options.alloc: unknown option of plugin hip (expected one of: "
				"library, streams, window, slice_size, pin_host)",
		.fn_alloc = "hipMalloc",
		.fn_copy_async = "hipMemcpyAsync",
		.fn_ipc_open = "hipIpcOpenMemHandle",
		.e_oom = "hipErrorOutOfMemory",
		.e_unknown = "hipErrorUnknown",
		.e_illegal = "hipErrorIllegalAddress",
		.e_map = "hipErrorMapFailed",
	},
};

static const struct vendor *V = &vendors[0];
static const char *fake_lib;
static char *plugin_so;
static const char *xfer_tp; /* the transport gxfer_* expect to move every task */
static bool real_driver;    /* TE_NVLINK_REAL: FAKECUDA_LIB is NVIDIA's libcuda */
/* The first and the second GPU (or the first again where there is one), and two that are not. */
static const char *gpu0, *gpu1, *gpu5, *gpu63;

/* Set the fake's variable <prefix>_@name (this process, and what it starts from now on). */
static void fake_setenv(const char *name, const char *value)
{
	g_autofree char *var = g_strdup_printf("%s_%s", V->prefix, name);

	g_setenv(var, value, TRUE);
}

static void fake_unsetenv(const char *name)
{
	g_autofree char *var = g_strdup_printf("%s_%s", V->prefix, name);

	g_unsetenv(var);
}

/* "alloc: <alloc>" for plugins with that option; NULL for the others (they have one kind). */
static char *alloc_opt(const char *alloc)
{
	return V->has_alloc ? g_strdup_printf("alloc: %s", alloc) : NULL;
}

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

/* Engine YAML with the plugin on the fake runtime; @opts and @transfer are extra flow-map items. */
static char *yaml_for(const char *opts, const char *transfer, const char *extra)
{
	return g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
			       "transfer: {%s}\n"
			       "transports:\n"
			       "  - name: %s\n"
			       "    required: true\n"
			       "    options: {library: \"%s\"%s%s}\n"
			       "%s",
			       transfer ? transfer : "", V->name, fake_lib, opts ? ", " : "",
			       opts ? opts : "", extra ? extra : "");
}

static enum te_status engine_new(const char *yaml, struct logcap *log, struct te_engine **out)
{
	struct te_engine_opts o;

	memset(&o, 0, sizeof(o));
	o.size = sizeof(o);
	o.config_yaml = yaml;
	o.config_yaml_len = strlen(yaml);
	o.config_name = "gpu_test";
	if (log) {
		o.log_fn = logcap_fn;
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

/* tests/gpu/fakedev/fakedev.h */
struct fakedev_live {
	int allocs, ipc_maps, vmm_maps, vmm_handles, reservations, host_regs, streams, events,
		ctx_refs;
};

static void assert_fake_clean(const char *when)
{
	void *dl = real_driver ? NULL : dlopen(fake_lib, RTLD_NOW | RTLD_NOLOAD);
	void (*live)(struct fakedev_live *);
	struct fakedev_live l;

	if (!dl)
		return; /* never loaded in this process */
	*(void **)&live = dlsym(dl, "fakedev_live");
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
/* te-node with its buffer at @location, of @size bytes (NULL: te-node's default). */
static struct node *gnode_start_sized(const char *opts, const char *location, const char *extra,
				      const char *size)
{
	g_autofree char *y = yaml_for(opts, NULL, extra);
	const char *argv[] = { node_path,    "--yaml", y,
			       "--location", location, size ? "--size" : NULL,
			       size,	     NULL };

	step("start te-node at %s%s%s", location, size ? " with bytes: " : "", size ? size : "");
	return node_start_argv(argv);
}

static struct node *gnode_start(const char *opts, const char *location, const char *extra)
{
	return gnode_start_sized(opts, location, extra, NULL);
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
	struct logcap log;
	g_autofree char *text = NULL;
	struct te_engine *e = NULL;
	void *p = NULL;

	logcap_init(&log);
	step("engine with %s on the fake runtime", V->name);
	assert_ok(engine_new(y, &log, &e));
	text = logcap_text(&log);
	g_test_message("log:\n%s", text);
	if (!real_driver) {
		g_autofree char *d0 = g_strdup_printf("2 GPU(s): %s %s GPU 0 (0000:10:00.0, NUMA ",
						      gpu0, V->fake);
		g_autofree char *d1 =
			g_strdup_printf("%s:1 %s GPU 1 (0000:20:00.0, NUMA ", V->kind, V->fake);

		assert_contains(text, d0);
		assert_contains(text, d1);
		assert_contains(text, V->runtime);
	}
	{
		g_autofree char *any = g_strdup_printf(" GPU(s): %s ", gpu0);

		assert_contains(text, any);
	}
	assert_ok(te_mem_alloc(e, gpu1, 4096, &p));
	assert_ok(te_mem_free(e, p));
	free_engine(e);
	assert_fake_clean("after the engine");
	logcap_clear(&log);
}

/* te_engine_new fails with TE_ERR_PLUGIN_INIT and @text in the error. */
static void expect_init_failure(const char *opts, const char *text)
{
	g_autofree char *y = yaml_for(opts, NULL, NULL);
	g_autofree char *who = g_strdup_printf("transport '%s' (required)", V->name);
	struct te_engine *e = NULL;

	assert_status(engine_new(y, NULL, &e), TE_ERR_PLUGIN_INIT);
	g_assert_null(e);
	g_test_message("error: %s", te_last_error());
	assert_contains(te_last_error(), who);
	assert_contains(te_last_error(), "init failed: no device (-106)");
	assert_contains(te_last_error(), text);
}

static void test_no_device(void)
{
	fake_setenv("DEVICES", "0");
	expect_init_failure(NULL, V->no_device);
	assert_fake_clean("after the failed init");
}

static void test_old_driver(void)
{
	g_autofree char *want = g_strconcat(V->old_head, fake_lib, V->old_tail, NULL);

	fake_setenv(V->old_var, V->old_value);
	expect_init_failure(NULL, want);
}

static void test_missing_library(void)
{
	g_autofree char *y = NULL;
	g_autofree char *want = g_strdup_printf("%s: %s: cannot load %s: %s: cannot open shared "
						"object file: No such file or directory",
						V->name, V->no_runtime, V->missing, V->missing);
	g_autofree char *skipped = g_strdup_printf("%s' (optional) skipped", V->name);
	g_autofree char *cannot = g_strdup_printf("cannot load %s", V->missing);
	struct logcap log;
	g_autofree char *text = NULL;
	struct te_engine *e = NULL;
	const char *at;
	void *p = NULL;
	int hits = 0;

	step("required: the engine does not start");
	y = g_strdup_printf("transports:\n  - name: %s\n    required: true\n"
			    "    options: {library: %s}\n",
			    V->name, V->missing);
	assert_status(engine_new(y, NULL, &e), TE_ERR_PLUGIN_INIT);
	assert_contains(te_last_error(), want);
	g_free(y);

	step("optional: the engine starts without it and says so once");
	logcap_init(&log);
	y = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
			    "transports:\n  - name: %s\n    required: false\n"
			    "    options: {library: %s}\n"
			    "  - name: tcp\n",
			    V->name, V->missing);
	assert_ok(engine_new(y, &log, &e));
	text = logcap_text(&log);
	for (at = text; (at = strstr(at, V->name)); at++)
		hits += g_str_has_prefix(at, skipped);
	g_test_message("log:\n%s", text);
	g_assert_cmpint(hits, ==, 1);
	assert_contains(text, cannot);
	/* Nobody owns the kind's memory now. */
	assert_status(te_mem_alloc(e, gpu0, 4096, &p), TE_ERR_MEMORY_TYPE);
	free_engine(e);
	logcap_clear(&log);
}

static void test_options(void)
{
	g_autofree char *y1 = yaml_for("bogus: 1", NULL, NULL);
	g_autofree char *y2 = yaml_for("window: 0", NULL, NULL);
	g_autofree char *y3 = yaml_for(V->bad_opt, NULL, NULL);
	/* Declared options: the core refuses them before init (nothing of the fake runs). */
	g_autofree char *unknown =
		g_strdup_printf("options.bogus: unknown option of plugin %s", V->name);
	const char *window = "options.window: value 0 out of range 1..4096";
	struct te_engine *e = NULL;

	assert_status(engine_new(y1, NULL, &e), TE_ERR_CONFIG);
	assert_contains(te_last_error(), unknown);
	assert_status(engine_new(y2, NULL, &e), TE_ERR_CONFIG);
	assert_contains(te_last_error(), window);
	assert_status(engine_new(y3, NULL, &e), TE_ERR_CONFIG);
	assert_contains(te_last_error(), V->bad_opt_text);
	assert_fake_clean("after refused options");
}

static void test_mem(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = alloc_opt(alloc);
	struct te_engine *e = engine_ok(opts, NULL);
	struct te_buffer_info bi[4];
	/* 2 MiB: a whole VMM granule, so both kinds of allocation end exactly there. */
	const size_t len = 2 * MIB;
	uint8_t *d0 = NULL, *d1 = NULL, *h = g_malloc(len), *back = g_malloc0(len);
	size_t nb = 0;
	g_autofree char *nodev =
		g_strdup_printf("%s: %s: no such %s device (", V->name, gpu63, V->api);
	g_autofree char *visible = g_strdup_printf("(2 visible: %s..1)", gpu0);
	g_autofree char *past = g_strdup_printf("runs past the end of its %s allocation", gpu0);
	g_autofree char *wrong = g_strdup_printf("is %s memory, not '%s'", gpu0, gpu5);

	step("te_mem_alloc at %s and %s (%s)", gpu0, gpu1, alloc);
	assert_ok(te_mem_alloc(e, gpu0, len, (void **)&d0));
	assert_ok(te_mem_alloc(e, gpu1, len, (void **)&d1));
	step("a %s index that does not exist", V->kind);
	{
		void *p = NULL;

		assert_status(te_mem_alloc(e, gpu63, MIB, &p), TE_ERR_NO_DEVICE);
		assert_contains(te_last_error(), nodev);
		if (!real_driver)
			assert_contains(te_last_error(), visible);
	}
	step("te_mem_copy host -> %s -> %s -> host", gpu0, gpu1);
	sysnode_fill(h, 0, len, 77);
	assert_ok(te_mem_copy(e, d0, h, len));
	assert_ok(te_mem_copy(e, d1, d0, len));
	assert_ok(te_mem_copy(e, back, d1 + 0, len));
	assert_bytes(back, h, len, "round trip through two GPUs");
	assert_ok(te_mem_copy(e, back, d0 + 5, 100));
	assert_bytes(back, h + 5, 100, "an unaligned piece");

	step("a range crossing the end of its allocation");
	assert_status(te_mem_copy(e, back, d0 + len - 10, 100), TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), past);
	assert_status(te_mem_register(e, d0 + len - 10, 100, gpu0, TE_MEM_REMOTE),
		      TE_ERR_OUT_OF_RANGE);
	assert_contains(te_last_error(), past);
	assert_status(te_mem_register(e, d0 + len - 10, 100, "*", TE_MEM_REMOTE),
		      TE_ERR_OUT_OF_RANGE);

	step("te_mem_register: a wrong device, '*' detection, host memory");
	assert_status(te_mem_register(e, d0, len, gpu5, TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_contains(te_last_error(), wrong);
	assert_status(te_mem_register(e, h, len, gpu0, TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_ok(te_mem_register(e, d1 + 4096, 8192, "*", TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, d0, len, gpu0, TE_MEM_REMOTE));
	assert_ok(te_mem_register(e, h, len, "*", TE_MEM_LOCAL));
	assert_ok(te_segment_buffers(e, TE_SEGMENT_LOCAL, bi, G_N_ELEMENTS(bi), &nb));
	g_assert_cmpuint(nb, ==, 2);
	for (size_t i = 0; i < nb; i++) {
		if (bi[i].addr == (uintptr_t)d1 + 4096)
			g_assert_cmpstr(bi[i].location, ==, gpu1);
		else
			g_assert_cmpstr(bi[i].location, ==, gpu0);
	}
	assert_ok(te_mem_unregister(e, h));
	assert_ok(te_mem_unregister(e, d0));
	assert_ok(te_mem_unregister(e, d1 + 4096));
	assert_ok(te_mem_free(e, d0));
	assert_ok(te_mem_free(e, d1));
	step("memory te_mem_alloc handed out and nobody freed goes with the engine");
	assert_ok(te_mem_alloc(e, gpu0, 3 * MIB, (void **)&d0));
	free_engine(e);
	assert_fake_clean("after the engine");
	g_free(h);
	g_free(back);
}

static void test_oom(void)
{
	struct te_engine *e;
	void *p = NULL, *q = NULL;

	fake_setenv("OOM_BYTES", "4194304");
	e = engine_ok(NULL, NULL);
	assert_ok(te_mem_alloc(e, gpu0, 2 * MIB, &p));
	assert_status(te_mem_alloc(e, gpu0, 4 * MIB, &q), TE_ERR_NOMEM);
	g_test_message("error: %s", te_last_error());
	{
		g_autofree char *want = g_strdup_printf("%s: %s (0000:10:00.0): %s of 4194304 "
							"bytes: %s",
							V->name, gpu0, V->fn_alloc, V->e_oom);

		assert_contains(te_last_error(), want);
	}
	assert_ok(te_mem_free(e, p));
	free_engine(e);
	assert_fake_clean("after the engine");
}

/* Two engines of this process: device pointers of the other are valid here, no import. */
static void test_in_process(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = alloc_opt(alloc);
	struct te_engine *a = engine_ok(opts, NULL), *b = engine_ok(opts, NULL);
	const char *locs[] = { gpu1, gpu0, "cpu" };
	const size_t len = 3 * MIB + 5;
	uint8_t *target = NULL, *want = g_malloc(len);
	char *json = NULL;
	size_t jlen = 0;
	te_segment_id seg;

	assert_ok(te_mem_alloc(b, gpu0, len, (void **)&target));
	assert_ok(te_mem_register(b, target, len, gpu0, TE_MEM_REMOTE));
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
		g_assert_cmpstr(ti.transport, ==, V->name);
		/* The local GPU copies; for host memory, the GPU holding the target. */
		g_assert_true(g_str_has_prefix(ti.device, k == 0 ? gpu1 : gpu0));
		g_assert_cmpint(ti.device[strlen(k == 0 ? gpu1 : gpu0)], ==, ' ');
		assert_ok(te_batch_free(a, bid));
		assert_ok(te_mem_copy(b, want, target, len));
		assert_bytes(want, l.host, len, "WRITE in process");
		sysnode_fill(want, 0, len, 20 + k);
		assert_ok(te_mem_copy(b, target, want, len));
		r.opcode = TE_OP_READ;
		batch_run_ok(a, &r, 1, WAIT_NS, V->name);
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
	g_autofree char *opts = alloc_opt(alloc);
	struct node *n = gnode_start(opts, gpu0, NULL);
	struct te_engine *e = engine_ok(NULL, NULL);
	te_segment_id seg = open_node(e, n);

	step("host buffer here, %s there (%s)", gpu0, alloc);
	xfer_sizes(e, seg, n, xfer_size_list, G_N_ELEMENTS(xfer_size_list), WAIT_NS, V->name);
	gxfer_sizes(e, seg, n, xfer_size_list, G_N_ELEMENTS(xfer_size_list), gpu1);
	gxfer_sizes(e, seg, n, xfer_size_list, G_N_ELEMENTS(xfer_size_list), gpu0);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
}

static void test_sys_batch(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = alloc_opt(alloc);
	struct node *n = gnode_start(opts, gpu0, NULL);
	struct te_engine *e = engine_ok(NULL, NULL);
	te_segment_id seg = open_node(e, n);

	step("1000 requests, host buffer here");
	xfer_batch(e, seg, n, 1000, 40000, WAIT_NS, V->name);
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
	struct node *n = gnode_start(NULL, gpu0, NULL);
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


	fake_setenv("COPY_DELAY_US", "400000"); /* this process only */
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
	struct node *n = gnode_start(NULL, gpu0, NULL);
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

	fake_setenv("COPY_DELAY_US", "2000");
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
	struct node *n = gnode_start(NULL, gpu0, NULL);
	struct te_engine *e;
	te_segment_id seg;
	uint32_t states[7], failed = 0;
	struct lbuf l;
	te_batch_id b;
	enum te_status st;
	g_autofree char *copy_fails = g_strdup_printf(
		"%s: %s (0000:10:00.0): %s of 65536 bytes to 0x", V->name, gpu0, V->fn_copy_async);

	fake_setenv("FAIL_COPY_AFTER", "5");
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
		assert_contains(ti.detail, copy_fails);
		assert_contains(ti.detail, V->e_unknown);
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
	struct node *n = gnode_start(NULL, gpu0, NULL);
	const char *text = V->e_illegal;
	g_autofree char *who = g_strdup_printf("%s: %s (0000:10:00.0): ", V->name, gpu0);
	struct te_engine *e;
	te_segment_id seg;
	uint32_t states[7];
	struct lbuf l;
	te_batch_id b;
	enum te_status st;
	uint8_t host[64];
	void *dev = NULL;


	fake_setenv("STICKY_AFTER", "3");
	e = engine_ok(NULL, NULL);
	assert_ok(te_mem_alloc(e, gpu0, 4096, &dev));
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
		assert_contains(ti.detail, who);
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
	const char *argv[] = { node_path, "--yaml", y, "--location", gpu0, NULL };
	g_autofree char *err = NULL;
	g_autofree char *what = g_strdup_printf("te_mem_alloc(%s, ", gpu0);
	g_autofree char *oom =
		g_strdup_printf("out of memory: te_mem_alloc: %s: %s: ", gpu0, V->name);
	g_autofree char *call = g_strdup_printf("%s of ", V->fn_alloc);
	struct node *n;


	step("a target whose GPU has 1 MiB");
	fake_setenv("OOM_BYTES", "1048576"); /* inherited by the node only */
	n = node_spawn("te-node (oom)", argv);
	fake_unsetenv("OOM_BYTES");
	g_assert_true(node_wait_exit(n, 30000));
	n->dead = true;
	g_assert_true(g_subprocess_get_if_exited(n->proc));
	g_assert_cmpint(g_subprocess_get_exit_status(n->proc), ==, 1);
	err = node_stderr(n);
	g_test_message("te-node said: %s", err);
	assert_contains(err, what);
	assert_contains(err, oom);
	assert_contains(err, call);
	assert_contains(err, V->e_oom);
	node_release(n);
}

static void test_sys_fault_ipc(gconstpointer data)
{
	const char *alloc = data;
	g_autofree char *opts = alloc_opt(alloc);
	struct node *n = gnode_start(opts, gpu0, NULL);
	const char *how =
		strcmp(alloc, "vmm") == 0 ? "cuMemImportFromShareableHandle(fd)" : V->fn_ipc_open;
	g_autofree char *cannot = g_strdup_printf("%s: cannot map region [0x", V->name);
	struct te_engine *e;
	te_segment_id seg;
	uint32_t states[7];
	struct lbuf l;
	te_batch_id b;
	enum te_status st;


	fake_setenv("IPC_OPEN_FAIL", "1");
	e = engine_ok(NULL, NULL);
	step("open the segment: mapping its buffer fails (%s)", how);
	seg = open_node(e, n);
	lbuf_new(&l, e, 4 * 65536);
	b = run_writes(e, seg, n, &l, 4, &st);
	count_states(e, b, 4, states);
	g_assert_cmpuint(states[TE_STATE_FAILED], ==, 4);
	for (uint32_t i = 0; i < 4; i++) {
		struct te_task_info ti;
		g_autofree char *who = g_strdup_printf("of %s (%s 0000:10:00.0, pid %s): %s: %s",
						       n->segment, gpu0, n->pid, how, V->e_map);

		assert_ok(te_task_status(e, b, i, &ti));
		g_test_message("task %u: %s", i, ti.detail);
		g_assert_cmpint(ti.status, ==, TE_ERR_PEER_UNREACHABLE);
		assert_contains(ti.detail, cannot);
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
	struct node *n = gnode_start(NULL, gpu0, NULL);
	struct te_engine *e;
	te_segment_id seg;
	struct gbuf l;
	struct te_request r;
	te_batch_id b;
	enum te_status sst, wst;
	struct te_task_info ti;


	fake_setenv("NO_PEER", "1");
	e = engine_ok(NULL, NULL);
	seg = open_node(e, n);
	step("%s here cannot reach %s there without peer access", gpu1, gpu0);
	gbuf_new(&l, e, 65536, gpu1);
	r = (struct te_request){ TE_OP_READ, seg, l.dev, n->buf, 65536 };
	b = batch_run(e, &r, 1, WAIT_NS, &sst, &wst);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_test_message("%s", ti.detail);
	g_assert_cmpint(ti.status, ==, TE_ERR_NO_DEVICE);
	{
		g_autofree char *want = g_strdup_printf("%s: no path from %s (0000:20:00.0) to the "
							"peer's memory on GPU 0000:10:00.0 (%s "
							"there): no peer access between them",
							V->name, gpu1, gpu0);

		assert_contains(ti.detail, want);
	}
	assert_ok(te_batch_free(e, b));
	gbuf_free(&l, e);
	step("%s here does", gpu0);
	gbuf_new(&l, e, 65536, gpu0);
	r.local = l.dev;
	batch_run_ok(e, &r, 1, WAIT_NS, V->name);
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
	g_autofree char *opts = alloc_opt("vmm");
	struct node *n = gnode_start(opts, gpu0, secret);
	g_autofree char *y = yaml_for(NULL, NULL, secret);
	static const size_t sizes[] = { 1, MIB + 3 };
	struct te_engine *e = NULL;
	te_segment_id seg;

	assert_ok(engine_new(y, NULL, &e));
	seg = open_node(e, n);
	step("fd passing with authentication");
	xfer_sizes(e, seg, n, sizes, G_N_ELEMENTS(sizes), WAIT_NS, V->name);
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
 * another boot id in the plugin's blob (bytes 8..23) for the plugin.
 */
static char *other_host(const char *desc)
{
	g_autofree char *b64 = json_value(desc, V->name);
	g_autofree char *nb64 = NULL, *d1 = NULL;
	gsize n = 0;
	g_autofree guchar *blob = g_base64_decode(b64, &n);

	g_assert_cmpuint(n, >=, 24);
	for (gsize i = 8; i < 24; i++)
		blob[i] ^= 0x5a;
	nb64 = g_base64_encode(blob, n);
	d1 = json_replace(desc, "host", "00000000-0000-0000-0000-00000000beef");
	return json_replace(d1, V->name, nb64);
}

/* The kind byte (1 IPC, 2 fd, 3 FABRIC) of the plugin's key of the descriptor's first buffer. */
static int key_kind(const char *desc)
{
	const char *keys = strstr(desc, "\"keys\"");
	g_autofree char *b64 = NULL;
	g_autofree guchar *key = NULL;
	gsize n = 0;

	g_assert_nonnull(keys);
	b64 = json_value(keys, V->name);
	key = g_base64_decode(b64, &n);
	g_assert_cmpuint(n, >, 5);
	return key[5];
}

/* Without FABRIC handles, a peer on another host is refused, saying why. */
static void test_sys_other_host(void)
{
	struct node *n = gnode_start(NULL, gpu0, NULL);
	g_autofree char *desc = node_descriptor(n);
	g_autofree char *far = other_host(desc);
	struct te_engine *e = engine_ok(NULL, NULL);
	te_segment_id seg = 0;

	step("import the target's descriptor as if from another host");
	assert_status(te_segment_import(e, far, strlen(far), &seg), TE_ERR_NO_TRANSPORT);
	g_test_message("%s", te_last_error());
	{
		g_autofree char *want = g_strdup_printf(
			"%s: same-host transport, peer is on another host", V->name);

		assert_contains(te_last_error(), want);
	}
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

	fake_setenv("FABRIC", "1"); /* inherited by the targets */
	vmm = gnode_start("alloc: vmm", gpu0, NULL);
	legacy = gnode_start(NULL, gpu0, NULL);
	dv = node_descriptor(vmm);
	dl = node_descriptor(legacy);
	g_assert_cmpint(key_kind(dv), ==, 3);
	g_assert_cmpint(key_kind(dl), ==, 1);
	e = engine_ok(NULL, NULL);

	step("VMM memory through FABRIC handles, same host");
	seg = open_node(e, vmm);
	xfer_sizes(e, seg, vmm, sizes, G_N_ELEMENTS(sizes), WAIT_NS, V->name);
	assert_ok(te_segment_close(e, seg));

	step("VMM memory through FABRIC handles, a peer on another host");
	far_v = other_host(dv);
	assert_ok(te_segment_import(e, far_v, strlen(far_v), &seg));
	node_fill(vmm, 0, vmm->total, 0); /* what xfer_sizes starts from */
	xfer_sizes(e, seg, vmm, sizes, G_N_ELEMENTS(sizes), WAIT_NS, V->name);
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
 * Engines with the plugin (the kind's owner) and tcp. The initiator loads it memory_only, so the
 * core never picks it to move bytes: a cuda buffer here is staged by the core through tcp's
 * bounce buffers, and a cuda buffer of the target is served by the target's tcp through its
 * staging buffers. Both copy through the plugin (the fake driver's copy threads).
 */
static const char tcp_entry[] = "  - name: tcp\n    required: true\n";

static struct te_engine *tcp_initiator(const char *transfer)
{
	g_autofree char *y =
		g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
				"transfer: {%s}\n"
				"transports:\n"
				"  - name: %s\n"
				"    required: true\n"
				"    memory_only: true\n"
				"    options: {library: \"%s\"}\n"
				"%s",
				transfer ? transfer : "", V->name, fake_lib, tcp_entry);
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

	gbuf_new(&l, e, 65536, gpu0);
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
	struct node *gpu = gnode_start(NULL, gpu0, tcp_entry);
	struct node *cpu = gnode_start(NULL, "cpu", tcp_entry);
	struct te_engine *e = tcp_initiator(NULL);
	te_segment_id seg = open_node(e, gpu), seg_cpu;

	xfer_tp = "tcp";
	assert_staged_here(e, seg, gpu);
	step("host memory here, %s there (served by the target's tcp staging)", gpu0);
	xfer_sizes(e, seg, gpu, xfer_size_list, G_N_ELEMENTS(xfer_size_list), WAIT_NS, "tcp");
	step("%s here (staged by the core), %s there", gpu0, gpu0);
	gxfer_sizes(e, seg, gpu, xfer_size_list, G_N_ELEMENTS(xfer_size_list), gpu0);
	step("%s here, host memory there", gpu1);
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
	struct node *n = gnode_start(NULL, gpu0, tcp_entry);
	struct te_engine *e = tcp_initiator(NULL);
	te_segment_id seg = open_node(e, n);

	xfer_tp = "tcp";
	step("1000 requests, host memory here, %s there", gpu0);
	xfer_batch(e, seg, n, 1000, 40000, WAIT_NS, "tcp");
	step("1000 requests, %s here and there", gpu0);
	gxfer_batch(e, seg, n, 1000, 40000, gpu0);
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
	struct node *n = gnode_start(NULL, gpu0, tcp_entry);
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

	fake_setenv("COPY_DELAY_US", "300000"); /* this process only */
	fake_setenv("SYNC_FAULTS", "1");
	e = tcp_initiator(cancel ? "timeout_ms: 30000" : "timeout_ms: 200");
	seg = open_node(e, n);
	gbuf_new(&l, e, count * len, gpu0);
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
	fake_unsetenv("COPY_DELAY_US"); /* read once per process: stays slow */
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

/*
 * 1000 staged requests from device memory here; SIGKILL of the target: every task ends. The
 * fake driver slows its copies so the kill lands mid-batch; a real GPU's are fast, so there the
 * requests are 1 MiB each (1 GiB staged over tcp, well over the 100 ms before the kill).
 */
static void test_tcp_kill(void)
{
	const uint64_t len = real_driver ? MIB : 4096;
	g_autofree char *size = g_strdup_printf("%" PRIu64, 1000 * len);
	struct node *n = gnode_start_sized(NULL, gpu0, tcp_entry, size);
	const uint32_t count = 1000;
	struct te_request *r = g_new0(struct te_request, count);
	uint32_t states[7];
	struct te_engine *e;
	te_segment_id seg;
	struct gbuf l;
	te_batch_id b;
	enum te_status st;

	fake_setenv("COPY_DELAY_US", "2000");
	fake_setenv("SYNC_FAULTS", "1");
	e = tcp_initiator("timeout_ms: 20000");
	seg = open_node(e, n);
	gbuf_new(&l, e, count * len, gpu0);
	for (uint32_t i = 0; i < count; i++)
		r[i] = (struct te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg, l.dev + i * len,
					    n->buf + i * len, len };
	step("1000 staged requests of %" PRIu64 " bytes, then SIGKILL of the target", len);
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
	struct node *n = gnode_start(NULL, gpu0, tcp_entry);
	struct te_engine *e;
	te_segment_id seg;
	struct te_request r[20];
	uint32_t states[7], failed = 0;
	struct gbuf l;
	te_batch_id b;
	enum te_status sst, wst;

	/* This process's copies: gbuf_new's one fill, then the staged WRITEs' copies. */
	fake_setenv("FAIL_COPY_AFTER", "6");
	fake_setenv("FAIL_COPY_COUNT", "1");
	fake_setenv("SYNC_FAULTS", "1");
	e = tcp_initiator("retries: 0");
	seg = open_node(e, n);
	gbuf_new(&l, e, 20 * 65536, gpu0);
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
		assert_contains(ti.detail, V->e_unknown);
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
 * tcp first in the YAML, the plugin second: GPU memory on either side of one host still goes over
 * the plugin; host memory on both sides follows the YAML order; GPU memory here to host memory
 * there (no plugin key for host memory) goes over tcp, staged. With FABRIC handles (/sys/prefer-fabric) the
 * plugin also reaches other hosts, so it is no longer flagged same-host only: it must still come
 * first, because it moves GPU memory itself (tcp only through the peer's staging). NVIDIA's
 * driver on an H200 offers FABRIC handles: the real-GPU run found this case.
 */
static void test_sys_prefer(void)
{
	g_autofree char *tail = g_strdup_printf("  - name: %s\n"
						"    required: true\n"
						"    options: {library: \"%s\"}\n",
						V->name, fake_lib);
	g_autofree char *y = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
					     "transports:\n"
					     "%s%s",
					     tcp_entry, tail);
	const char *argv_gpu[] = { node_path, "--yaml", y, "--location", gpu0, NULL };
	const char *argv_cpu[] = { node_path, "--yaml", y, NULL };
	struct node *gpu = node_start_argv(argv_gpu), *cpu = node_start_argv(argv_cpu);
	struct te_engine *e = NULL;
	te_segment_id sg, sc;
	struct gbuf dev, host;

	assert_ok(engine_new(y, NULL, &e));
	sg = open_node(e, gpu);
	sc = open_node(e, cpu);
	gbuf_new(&dev, e, 65536, gpu0);
	gbuf_new(&host, e, 65536, "cpu");
	step("%s here, %s there", gpu0, gpu0);
	assert_moved_by(e, sg, dev.dev, gpu->buf, V->name, false);
	step("host memory here, %s there", gpu0);
	assert_moved_by(e, sg, host.dev, gpu->buf, V->name, false);
	step("host memory on both sides");
	assert_moved_by(e, sc, host.dev, cpu->buf, "tcp", false);
	step("%s here, host memory there", gpu0);
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

static void test_sys_prefer_fabric(void)
{
	fake_setenv("FABRIC", "1"); /* inherited by the targets */
	test_sys_prefer();
	fake_unsetenv("FABRIC");
}

/*
 * ROCm 6 (hip only): the runtime renumbered hipMemoryType and says more in hipGetErrorString;
 * the plugin reads pointer attributes by the runtime's version, not its headers'. Both
 * processes run the fake as ROCm 6.2.
 */
static void test_rocm6(void)
{
	static const size_t sizes[] = { 1, 4097, MIB + 3 };
	g_autofree char *oom = g_strdup_printf("%s (0000:10:00.0): hipMalloc of 134217728 bytes: "
					       "hipErrorOutOfMemory: out of memory",
					       gpu0);
	struct logcap log;
	g_autofree char *text = NULL;
	g_autofree char *y = NULL;
	struct te_engine *e = NULL;
	struct node *n;
	te_segment_id seg;
	uint8_t *d = NULL, *h = g_malloc(MIB);
	void *q = NULL;
	struct te_buffer_info bi[4];
	size_t nb = 0;

	fake_setenv("RUNTIME_VERSION", "60200000"); /* inherited by the target */
	n = gnode_start(NULL, gpu0, NULL);
	fake_setenv("OOM_BYTES", "104857600"); /* this process only */
	logcap_init(&log);
	y = yaml_for(NULL, NULL, NULL);
	assert_ok(engine_new(y, &log, &e));
	text = logcap_text(&log);
	assert_contains(text, "HIP runtime 6.2 (driver 6.2) via ");

	step("pointer attributes of ROCm 6: device memory, host memory, '*'");
	assert_ok(te_mem_alloc(e, gpu1, MIB, (void **)&d));
	assert_ok(te_mem_register(e, d + 4096, 8192, "*", TE_MEM_REMOTE));
	assert_ok(te_segment_buffers(e, TE_SEGMENT_LOCAL, bi, G_N_ELEMENTS(bi), &nb));
	g_assert_cmpuint(nb, ==, 1);
	g_assert_cmpstr(bi[0].location, ==, gpu1);
	assert_status(te_mem_register(e, h, MIB, gpu0, TE_MEM_REMOTE), TE_ERR_MEMORY_TYPE);
	assert_ok(te_mem_register(e, h, MIB, "*", TE_MEM_LOCAL));
	assert_ok(te_mem_unregister(e, h));
	assert_ok(te_mem_unregister(e, d + 4096));
	assert_ok(te_mem_free(e, d));

	step("an error in ROCm 6's words");
	assert_status(te_mem_alloc(e, gpu0, 128 * MIB, &q), TE_ERR_NOMEM);
	g_test_message("error: %s", te_last_error());
	assert_contains(te_last_error(), oom);

	step("IPC handles between two ROCm 6 processes");
	seg = open_node(e, n);
	xfer_sizes(e, seg, n, sizes, G_N_ELEMENTS(sizes), WAIT_NS, V->name);
	gxfer_sizes(e, seg, n, sizes, G_N_ELEMENTS(sizes), gpu1);
	assert_ok(te_segment_close(e, seg));
	free_engine(e);
	assert_fake_clean("after the initiator");
	node_close_free(n, 10000, false);
	logcap_clear(&log);
	g_free(h);
}

/* Test paths are "/<plugin><path>"; kept until g_test_run returns. */
static GPtrArray *paths;

static const char *vpath(const char *path)
{
	char *p = g_strdup_printf("/%s%s", V->name, path);

	g_ptr_array_add(paths, p);
	return p;
}

static void add(const char *path, GTestFunc fn)
{
	g_test_add_func(vpath(path), fn);
}

/* A case that needs the fake driver's faults. */
static void add_fake(const char *path, GTestFunc fn)
{
	g_test_add_func(vpath(path), real_driver ? skip_fake : fn);
}

static void add_data(const char *path, gconstpointer data, GTestDataFunc fn)
{
	g_test_add_data_func(vpath(path), data, fn);
}

/* Cases of plugins with VMM memory (option alloc) only. */
static void add_vmm(const char *path, gconstpointer data, GTestDataFunc fn)
{
	if (V->has_alloc)
		add_data(path, data, fn);
}

int main(int argc, char **argv)
{
	const char *w, *vendor = g_getenv("TE_GPU_TEST_VENDOR");
	g_autofree char *lib_var = NULL, *so = NULL;
	int rc;

	g_test_init(&argc, &argv, NULL);
	signal(SIGPIPE, SIG_IGN);
	for (size_t i = 0; vendor && *vendor && i < G_N_ELEMENTS(vendors); i++)
		if (strcmp(vendor, vendors[i].name) == 0)
			V = &vendors[i];
	if (vendor && *vendor && strcmp(vendor, V->name) != 0) {
		printf("Bail out! TE_GPU_TEST_VENDOR=%s is not nvlink or hip\n", vendor);
		return 1;
	}
	xfer_tp = V->name;
	gpu0 = g_strdup_printf("%s:0", V->kind);
	gpu1 = g_strdup_printf("%s:1", V->kind);
	gpu5 = g_strdup_printf("%s:5", V->kind);
	gpu63 = g_strdup_printf("%s:63", V->kind);
	lib_var = g_strdup_printf("%s_LIB", V->prefix);
	so = g_strdup_printf("%s.so", V->name);
	fake_lib = g_getenv(lib_var);
	plugin_so = find_plugin(so);
	node_path = find_te_node();
	if (!fake_lib || !*fake_lib || !plugin_so || !node_path) {
		printf("1..0 # SKIP needs %s, %s on TE_PLUGIN_PATH and te-node\n", lib_var, so);
		return 77;
	}
	real_driver = g_strcmp0(g_getenv("TE_NVLINK_REAL"), "1") == 0;
	if (real_driver && g_strcmp0(g_getenv("TE_NVLINK_GPUS"), "1") == 0)
		gpu1 = gpu0;
	w = g_getenv("TE_GPU_WATCHDOG_S");
	wdog.seconds = w && *w ? (unsigned)parse_u64(w, 10) : 100;
	g_thread_unref(g_thread_new("case-watchdog", case_watchdog, NULL));
	g_test_message("fake runtime %s; plugin %s; te-node %s", fake_lib, plugin_so, node_path);

	paths = g_ptr_array_new_with_free_func(g_free);
	add("/load", test_load);
	add_fake("/no-device", test_no_device);
	add_fake("/old-driver", test_old_driver);
	add("/missing-library", test_missing_library);
	add("/options", test_options);
	add_data("/mem/legacy", "legacy", test_mem);
	add_vmm("/mem/vmm", "vmm", test_mem);
	add_fake("/mem/oom", test_oom);
	add_data("/in-process/legacy", "legacy", test_in_process);
	add_vmm("/in-process/vmm", "vmm", test_in_process);
	add_data("/sys/sizes/legacy", "legacy", test_sys_sizes);
	add_vmm("/sys/sizes/vmm", "vmm", test_sys_sizes);
	add_data("/sys/batch-1000/legacy", "legacy", test_sys_batch);
	add_vmm("/sys/batch-1000/vmm", "vmm", test_sys_batch);
	add_fake("/sys/deadline", test_sys_deadline);
	add_fake("/sys/cancel", test_sys_cancel);
	add("/sys/kill-mid-batch", test_sys_kill);
	add_fake("/sys/fault-copy", test_sys_fault_copy);
	add("/sys/prefer", test_sys_prefer);
	if (V->has_alloc)
		add_fake("/sys/prefer-fabric", test_sys_prefer_fabric);
	add("/sys/tcp-staged/sizes", test_tcp_sizes);
	add("/sys/tcp-staged/batch-1000", test_tcp_batch);
	add_fake("/sys/tcp-staged/deadline", test_tcp_deadline);
	add_fake("/sys/tcp-staged/cancel", test_tcp_cancel);
	add("/sys/tcp-staged/kill-mid-batch", test_tcp_kill);
	add_fake("/sys/tcp-staged/fault-copy", test_tcp_fault_copy);
	add_fake("/sys/fault-sticky", test_sys_fault_sticky);
	add_fake("/sys/fault-oom", test_sys_fault_oom);
	if (!real_driver) {
		add_data("/sys/fault-ipc/legacy", "legacy", test_sys_fault_ipc);
		add_vmm("/sys/fault-ipc/vmm", "vmm", test_sys_fault_ipc);
	}
	add_fake("/sys/no-peer", test_sys_no_peer);
	add_fake("/sys/other-host", test_sys_other_host);
	if (V->has_alloc)
		add_fake("/sys/fabric", test_sys_fabric);
	else
		add_fake("/sys/rocm6", test_rocm6);
	add("/sys/auth", test_sys_auth);
	rc = g_test_run();
	g_ptr_array_free(paths, TRUE);
	return rc;
}
