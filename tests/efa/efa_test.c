/* SPDX-License-Identifier: Apache-2.0 */
/* efa_test.c: the efa plugin between two processes, on libfabric's tcp;ofi_rxm and shm. */

/*
 * The target is tests/system/te-node (its own process, a guarded 64 MiB buffer, driven over
 * stdin/stdout); the initiator is an engine in this process. Both load efa.so with the
 * libfabric provider named by $TE_EFA_PROVIDER (default tcp;ofi_rxm). Every test skips, with
 * the reason, when efa.so is not found along $TE_PLUGIN_PATH or the provider cannot open an
 * endpoint here. Every wait has a deadline; every node is killed and reaped by its test and
 * dies with this process (te-node sets PR_SET_PDEATHSIG). Every case ends by its own verdict,
 * before meson's timeout: the case watchdog (below) aborts it and says where it was.
 */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib.h>

#include <te/te.h>

#include "sysnode.h"
#include "sysnode_fixture.h"

#define BATCH_WAIT_NS (120 * S_NS) /* a batch expected to complete */
#define POLL_WAIT_NS (30 * S_NS)   /* 16 MiB, completion found by polling */
#define KILL_TIMEOUT_MS 3000	   /* transfer.timeout_ms of the fault tests */
#define DEADLINE_SLACK_MS 1500	   /* the engine checks deadlines on a timer */
#define CANCEL_GRACE_MS 2000	   /* transfer.cancel_grace_ms (the core's default) */

static char *efa_path;
static const char *provider;

/* ---------------------------------------------------------------------------------------- */
/* the case watchdog */

/*
 * A thread started by main aborts the process $TE_EFA_WATCHDOG_S seconds (default 100) after a
 * case started (meson.build: 20 s under the case's timeout), naming the last step the case
 * reached (efa_step) and, where gdb is installed, with every thread's stack: a hang anywhere,
 * in a fixture call or in a provider, ends as this case's failure with where it was stuck,
 * never as meson's timeout.
 */
static struct {
	GMutex lock;
	GCond cond;
	char step[256];
	unsigned seconds;
	int64_t deadline_us; /* monotonic; 0 between cases */
} where;

static void efa_step(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static void efa_step(const char *fmt, ...)
{
	va_list ap;

	g_mutex_lock(&where.lock);
	va_start(ap, fmt);
	g_vsnprintf(where.step, sizeof(where.step), fmt, ap);
	va_end(ap);
	g_mutex_unlock(&where.lock);
}

/* Every thread's stack of this process, by gdb (at most 15 s), when gdb is installed. */
static void dump_stacks(void)
{
	g_autofree char *gdb = g_find_program_in_path("gdb");
	char pid[16];
	pid_t child;

	if (!gdb) {
		fprintf(stderr, "case watchdog: gdb is not installed: no stacks\n");
		return;
	}
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	/* Yama ptrace_scope 1 lets only an ancestor attach, unless we allow it. */
	(void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	child = fork();
	if (child == 0) {
		execl(gdb, "gdb", "-p", pid, "-batch", "-nx", "-ex", "thread apply all bt",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; child > 0 && i < 1500; i++) {
		if (waitpid(child, NULL, WNOHANG) == child)
			return;
		g_usleep(10000);
	}
	if (child > 0) {
		kill(child, SIGKILL);
		(void)waitpid(child, NULL, 0);
	}
}

static gpointer case_watchdog(gpointer data)
{
	char step[sizeof(where.step)];

	(void)data;
	g_mutex_lock(&where.lock);
	while (!where.deadline_us || g_get_monotonic_time() < where.deadline_us) {
		if (where.deadline_us)
			g_cond_wait_until(&where.cond, &where.lock, where.deadline_us);
		else
			g_cond_wait(&where.cond, &where.lock);
	}
	g_strlcpy(step, where.step, sizeof(step));
	g_mutex_unlock(&where.lock);
	fprintf(stderr, "case watchdog: no verdict %u s after the case started; last step: %s\n",
		where.seconds, step);
	fflush(stderr);
	dump_stacks();
	fprintf(stderr, "case watchdog: aborting (stuck at: %s)\n", step);
	fflush(stderr);
	abort();
	return NULL;
}

/* Runs one case (@data) with the watchdog armed. */
static void watched_case(gconstpointer data)
{
	void (*fn)(void) = (void (*)(void))(uintptr_t)data;

	g_mutex_lock(&where.lock);
	g_strlcpy(where.step, "the case's start", sizeof(where.step));
	where.deadline_us = g_get_monotonic_time() + (int64_t)where.seconds * G_USEC_PER_SEC;
	g_cond_signal(&where.cond);
	g_mutex_unlock(&where.lock);
	fn();
	g_mutex_lock(&where.lock);
	where.deadline_us = 0;
	g_cond_signal(&where.cond);
	g_mutex_unlock(&where.lock);
}

static void add_case(const char *path, void (*fn)(void))
{
	g_test_add_data_func(path, (gconstpointer)(uintptr_t)fn, watched_case);
}

/* ---------------------------------------------------------------------------------------- */
/* helpers */

/*
 * Engine YAML with the efa transport on @prov (required). $TE_EFA_PROGRESS (caller, adaptive,
 * busy) sets the progress option of both sides unless @extra_options names one.
 */
static char *efa_yaml(const char *prov, unsigned timeout_ms, const char *extra_options)
{
	/* TE_EFA_TEST_LOG=debug (or trace, info) shows both engines' logs on stderr. */
	const char *level = g_getenv("TE_EFA_TEST_LOG");
	const char *progress = g_getenv("TE_EFA_PROGRESS");
	g_autofree char *prog = NULL;

	if (progress && *progress && !(extra_options && strstr(extra_options, "progress:")))
		prog = g_strdup_printf(", progress: %s", progress);
	return g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
			       "log: {level: %s}\n"
			       "transfer: {timeout_ms: %u}\n"
			       "transports:\n"
			       "  - name: efa\n"
			       "    required: true\n"
			       "    options: {provider: \"%s\"%s%s%s}\n",
			       level && *level ? level : "warn", timeout_ms, prov,
			       extra_options ? ", " : "", extra_options ? extra_options : "",
			       prog ? prog : "");
}

/* ---------------------------------------------------------------------------------------- */
/* te-node targets */

/*
 * A killed node cannot close its shm endpoint: remove the region it leaves in /dev/shm
 * (the plugin names it te-efa-<pid>-...).
 */
static void node_shm_cleanup(struct node *n)
{
	g_autofree char *prefix = g_strdup_printf("te-efa-%s-", n->pid ? n->pid : "?");
	g_autoptr(GDir) d = g_dir_open("/dev/shm", 0, NULL);
	const char *name;

	while (d && (name = g_dir_read_name(d))) {
		if (g_str_has_prefix(name, prefix)) {
			g_autofree char *path = g_build_filename("/dev/shm", name, NULL);

			if (unlink(path) == 0)
				g_test_message("removed %s, left by the killed te-node", path);
		}
	}
}

/* SIGKILL the node, reap it and remove what its shm endpoint left. */
static void target_kill(struct node *n)
{
	if (n->dead)
		return;
	efa_step("killing and reaping te-node %s", n->segment);
	node_kill(n);
	node_shm_cleanup(n);
}

/* Stop the node (stdin EOF, then SIGKILL after 15 s: an error), reap it and free it. */
static void node_free(struct node *n)
{
	efa_step("stopping te-node %s (stdin EOF)", n->segment);
	node_close_free(n, 15000, false);
}

/* ---------------------------------------------------------------------------------------- */
/* the initiator side */

/*
 * Initiator engine on the test's provider, with extra efa options (may be NULL) and a log
 * sink (@log_fn NULL: the core's, at the configuration's level; else messages up to
 * @log_level reach it).
 */
static struct te_engine *initiator_new_log(unsigned timeout_ms, const char *options,
					   te_log_fn log_fn, void *log_user, int log_level)
{
	g_autofree char *yaml = efa_yaml(provider, timeout_ms, options);
	struct te_engine_opts eo = { .size = sizeof(eo),
				     .config_yaml = yaml,
				     .config_yaml_len = strlen(yaml),
				     .log_fn = log_fn,
				     .log_user = log_user,
				     .log_level = log_fn ? log_level : -1 };
	struct te_engine *e = NULL;
	enum te_status st;

	efa_step("te_engine_new of the initiator on %s", provider);
	st = te_engine_new(&eo, &e);
	if (st != TE_OK)
		g_error("initiator engine on %s: %s: %s", provider, te_status_str(st),
			te_last_error());
	return e;
}

static struct te_engine *initiator_new_opts(unsigned timeout_ms, const char *options)
{
	return initiator_new_log(timeout_ms, options, NULL, NULL, -1);
}

static struct te_engine *initiator_new(unsigned timeout_ms)
{
	return initiator_new_opts(timeout_ms, NULL);
}

/* Skip unless efa.so is built and @provider opens an endpoint here. */
static bool need_provider(void)
{
	g_autofree char *yaml = NULL;
	struct te_engine *e = NULL;
	enum te_status st;

	if (!efa_path) {
		g_test_skip("efa.so is not found along TE_PLUGIN_PATH (libfabric-dev missing?)");
		return false;
	}
	yaml = efa_yaml(provider, 1000, NULL);
	efa_step("probing provider %s (te_engine_new)", provider);
	st = te_engine_new_from_string(yaml, strlen(yaml), &e);
	if (st != TE_OK) {
		g_autofree char *why = g_strdup_printf("libfabric provider %s unusable here: %s",
						       provider, te_last_error());

		g_test_skip(why);
		return false;
	}
	efa_step("probing provider %s (te_engine_free)", provider);
	te_engine_free(e);
	return true;
}

/* Run @n requests in one batch; all must complete over efa. */
static void run_ok(struct te_engine *e, const struct te_request *reqs, size_t n)
{
	efa_step("a batch of %zu request(s) that must complete", n);
	batch_run_ok(e, reqs, n, BATCH_WAIT_NS, "efa");
}

/* te_engine_free of the initiator (the fixture arms its own 30 s watchdog). */
static void efa_free(struct te_engine *e)
{
	efa_step("te_engine_free of the initiator");
	initiator_free(e);
}

/* Open @n's segment (te_segment_open: the warm-up of the connections). */
static te_segment_id efa_open(struct te_engine *e, struct node *n)
{
	efa_step("te_segment_open of %s", n->segment);
	return open_node(e, n);
}

/* ---------------------------------------------------------------------------------------- */
/* data path */

static struct node *target_start(unsigned timeout_ms)
{
	g_autofree char *yaml = efa_yaml(provider, timeout_ms, NULL);

	efa_step("starting a te-node target on %s", provider);
	return node_start(yaml, NULL);
}

/* READ and WRITE of 1 B ... 64 MiB, aligned, unaligned and at the end; bytes verified. */
static void test_transfer_sizes(void)
{
	static const size_t sizes[] = {
		1, 3, 4096, 65536 + 7, 1u << 20, (16u << 20) + 1, 64u << 20
	};
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;

	if (!need_provider())
		return;
	n = target_start(60000);
	e = initiator_new(60000);
	seg = efa_open(e, n);
	efa_step("READ and WRITE of every size (xfer_sizes)");
	xfer_sizes(e, seg, n, sizes, G_N_ELEMENTS(sizes), BATCH_WAIT_NS, "efa");
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	node_free(n);
}

#define N_BATCH 1000

/* 1000 unaligned requests per batch: WRITEs, READs, then both mixed; bytes verified. */
static void test_batch_1000(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;

	if (!need_provider())
		return;
	n = target_start(60000);
	e = initiator_new(60000);
	seg = efa_open(e, n);
	efa_step("batches of %u requests (xfer_batch)", N_BATCH);
	xfer_batch(e, seg, n, N_BATCH, 16384, BATCH_WAIT_NS, "efa");
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	node_free(n);
}

/* Poll te_batch_status (never te_batch_wait) until @b is terminal; it must complete. */
static void poll_until_done(struct te_engine *e, te_batch_id b, uint32_t n, const char *what)
{
	int64_t deadline = now_ns() + POLL_WAIT_NS;
	struct te_batch_info bi;

	efa_step("%s: polling te_batch_status until the batch ends", what);
	for (;;) {
		assert_ok(te_batch_status(e, b, &bi));
		if (te_state_is_terminal(bi.state))
			break;
		if (now_ns() > deadline)
			g_error("%s: batch not terminal after %lld s of polling", what,
				POLL_WAIT_NS / S_NS);
		g_usleep(200);
	}
	if (bi.state != TE_STATE_COMPLETED || bi.completed != n)
		g_error("%s: batch %s with %u of %u completed: %s", what, te_state_str(bi.state),
			bi.completed, n, te_last_error());
}

struct log_capture {
	GMutex lock;
	GString *text;
};

static void log_collect(void *user, enum te_log_level level, const char *msg)
{
	struct log_capture *c = user;

	(void)level;
	g_mutex_lock(&c->lock);
	g_string_append_printf(c->text, "%s\n", msg);
	g_mutex_unlock(&c->lock);
}

/*
 * The fault tests' initiator log: warnings and errors to stderr as usual, and a count of the
 * plugin's debug line that a fence left a connection open for its READ responses
 * (plugins/efa/README.md, "Cancel and timeouts": libfabric < 1.18).
 */
#define EFA_READ_HOLD_LINE "a connection with canceled operations closes once its READ responses"

struct fault_log {
	atomic_uint read_holds;
	bool echo_all; /* TE_EFA_TEST_LOG (efa_yaml) asks for more than warnings: all of it */
};

static void fault_log_fn(void *user, enum te_log_level level, const char *msg)
{
	struct fault_log *fl = user;

	if (strstr(msg, EFA_READ_HOLD_LINE))
		atomic_fetch_add(&fl->read_holds, 1);
	if (level <= TE_LOG_WARN || fl->echo_all)
		g_printerr("%s\n", msg);
}

/*
 * Every progress mode moves bytes, also when the application never calls te_batch_wait: the
 * plugin's own thread then polls the CQ ('caller' is hybrid: only a thread in te_batch_wait
 * polls besides it, never the core's worker), as with 'adaptive' and 'busy'.
 */
static void test_progress_modes(void)
{
	static const char *const modes[] = { "caller", "adaptive", "busy" };
	enum {
		N = 8,
		LEN = 1u << 20
	};

	if (!need_provider())
		return;
	for (size_t m = 0; m < G_N_ELEMENTS(modes); m++) {
		g_autofree char *opts = g_strdup_printf("progress: %s", modes[m]);
		g_autofree char *plugin_says = g_strdup_printf(", progress %s,", modes[m]);
		const char *core_says = m == 0 ? "(hybrid progress" : "(auto progress";
		struct log_capture logs = { .text = g_string_new(NULL) };
		struct node *n = target_start(60000);
		struct te_engine *e;
		te_segment_id seg;
		uint8_t *mirror = mirror_new(n);
		struct te_request r[N];
		struct lbuf l;
		te_batch_id b;
		uint64_t seed = 900 + m;

		g_mutex_init(&logs.lock);
		e = initiator_new_log(60000, opts, log_collect, &logs, TE_LOG_INFO);
		/* The mode is in force: the plugin names it, the core polls 'caller' (hybrid). */
		g_mutex_lock(&logs.lock);
		if (!strstr(logs.text->str, plugin_says) || !strstr(logs.text->str, core_says))
			g_error("%s: the engine log lacks \"%s\" or \"%s\":\n%s", opts, plugin_says,
				core_says, logs.text->str);
		g_mutex_unlock(&logs.lock);
		seg = efa_open(e, n);
		lbuf_new(&l, e, (size_t)N * LEN);
		for (unsigned i = 0; i < N; i++) {
			uint64_t abs = n->guard + (uint64_t)i * LEN;

			sysnode_fill(l.p + (size_t)i * LEN, abs, LEN, seed);
			memcpy(mirror + abs, l.p + (size_t)i * LEN, LEN);
			r[i] = (struct te_request){ TE_OP_WRITE, seg, l.p + (size_t)i * LEN,
						    n->buf + (uint64_t)i * LEN, LEN };
		}
		assert_ok(te_batch_new(e, N, &b));
		assert_ok(te_batch_submit(e, b, r, N));
		poll_until_done(e, b, N, opts);
		assert_ok(te_batch_free(e, b));
		assert_node_is(n, mirror, opts);

		node_fill(n, n->guard, (uint64_t)N * LEN, ++seed);
		sysnode_fill(mirror + n->guard, n->guard, (uint64_t)N * LEN, seed);
		memset(l.p, 0xee, l.len);
		for (unsigned i = 0; i < N; i++)
			r[i].opcode = TE_OP_READ;
		assert_ok(te_batch_new(e, N, &b));
		assert_ok(te_batch_submit(e, b, r, N));
		poll_until_done(e, b, N, opts);
		assert_ok(te_batch_free(e, b));
		assert_bytes(l.p, mirror + n->guard, (size_t)N * LEN, opts);
		g_test_message("%s: 8 x 1 MiB written and read back, completion by polling", opts);

		lbuf_free(&l, e);
		assert_ok(te_segment_close(e, seg));
		efa_free(e);
		g_string_free(logs.text, TRUE);
		g_mutex_clear(&logs.lock);
		g_free(mirror);
		node_free(n);
	}
}

/* One request that must be refused at submit: INVALID at once, nothing moved. */
static void reject_one(struct te_engine *e, const struct te_request *r, const char *what)
{
	struct te_task_info ti;
	te_batch_id b;
	enum te_status st;

	assert_ok(te_batch_new(e, 1, &b));
	st = te_batch_submit(e, b, r, 1);
	g_test_message("%s: submit %s: %s", what, te_status_str(st), te_last_error());
	if (st != TE_ERR_REMOTE_ACCESS && st != TE_ERR_OVERFLOW)
		g_error("%s: submit returned %s, expected %s", what, te_status_str(st),
			te_status_str(TE_ERR_REMOTE_ACCESS));
	g_assert_cmpint(te_batch_wait(e, b, 0), ==, st);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	g_assert_cmpuint(ti.bytes, ==, 0);
	assert_ok(te_batch_free(e, b));
}

/* Remote ranges outside the target's buffer are refused at submit; nothing is touched. */
static void test_out_of_range(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	uint8_t *mirror;
	struct lbuf l;
	struct te_request r[3];
	struct te_batch_info bi;
	struct te_task_info ti;
	te_batch_id b;
	enum te_status sst, wst;

	if (!need_provider())
		return;
	n = target_start(30000);
	e = initiator_new(5000);
	seg = efa_open(e, n);
	mirror = mirror_new(n);
	lbuf_new(&l, e, 4u << 20);
	sysnode_fill(l.p, 0, l.len, 9);
	{
		struct bad_range bad[BAD_RANGES];
		struct te_request wrap = { TE_OP_WRITE, seg, l.p, UINT64_MAX - 3, 8 };

		bad_ranges(n, bad);
		for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
			struct te_request q = { bad[i].op, seg, l.p, bad[i].addr, bad[i].len };

			reject_one(e, &q, bad[i].what);
		}
		reject_one(e, &wrap, "wraps around");
	}
	/* One bad request among good ones: only it is refused. */
	r[0] = (struct te_request){ TE_OP_WRITE, seg, l.p, n->buf + 100, 4096 };
	r[1] = (struct te_request){ TE_OP_WRITE, seg, l.p + 8192, n->buf + n->size - 1, 2 };
	r[2] = (struct te_request){ TE_OP_READ, seg, l.p + 65536, n->buf + 100000, 4096 };
	assert_ok(te_batch_new(e, 3, &b));
	sst = te_batch_submit(e, b, r, 3);
	watchdog_arm(60, "te_batch_wait");
	wst = te_batch_wait(e, b, 30 * S_NS);
	watchdog_disarm();
	g_assert_cmpint(sst, ==, TE_ERR_REMOTE_ACCESS);
	g_assert_cmpint(wst, !=, TE_INPROGRESS);
	assert_ok(te_batch_status(e, b, &bi));
	g_assert_cmpint(bi.state, ==, TE_STATE_FAILED);
	g_assert_cmpuint(bi.completed, ==, 2);
	g_assert_cmpuint(bi.failed, ==, 1);
	assert_ok(te_task_status(e, b, 1, &ti));
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	assert_ok(te_batch_free(e, b));
	memcpy(mirror + n->guard + 100, l.p, 4096);
	assert_bytes(l.p + 65536, mirror + n->guard + 100000, 4096, "READ next to a refusal");
	assert_node_is(n, mirror, "after refused requests");

	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	g_free(mirror);
	node_free(n);
}

/* A case about remote keys can run: a provider is there, and it checks keys (shm does not). */
static bool keys_checked(void)
{
	if (!need_provider())
		return false;
	if (strcmp(provider, "shm") == 0) {
		g_test_skip("shm moves RMA with process_vm_readv/writev and checks no keys");
		return false;
	}
	return true;
}

/*
 * The descriptor says the range is fine but the target no longer has it registered: its
 * provider must refuse the key (tcp;ofi_rxm), as a FAILED task with detail, by the deadline.
 * shm's CMA path does not check keys (see plugins/efa/README.md): skipped there.
 */
static void test_unregistered(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	uint8_t *mirror;
	struct lbuf l;
	g_autofree char *s1 = NULL, *s2 = NULL;

	if (!keys_checked())
		return;
	n = target_start(30000);
	e = initiator_new(KILL_TIMEOUT_MS);
	seg = efa_open(e, n);
	mirror = mirror_new(n);
	lbuf_new(&l, e, 4u << 20);
	sysnode_fill(l.p, 0, l.len, 11);
	node_send(n, "unregister");
	s1 = node_expect(n, "ok", NODE_REPLY_MS);
	for (unsigned i = 0; i < 4; i++) {
		uint64_t len = i < 2 ? 65536 : (1u << 20) + 3;
		struct te_request q = { i % 2 ? TE_OP_READ : TE_OP_WRITE, seg, l.p + (i % 2) * len,
					n->buf + 4096, len };
		struct te_task_info ti;
		int64_t t0 = now_ns();
		enum te_status st;
		te_batch_id b;

		efa_step("request %u to an unregistered range", i);
		assert_ok(te_batch_new(e, 1, &b));
		st = te_batch_submit(e, b, &q, 1);
		if (st == TE_ERR_REMOTE_ACCESS) {
			/*
			 * A failure before this one made the core fetch the descriptor again, and
			 * the fresh one no longer lists the range: refused at submit.
			 */
			g_assert_cmpuint(i, >, 0);
			assert_ok(te_task_status(e, b, 0, &ti));
			g_test_message("request %u refused at submit: %s", i, ti.detail);
			g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
			assert_contains(ti.detail, "outside the registered buffers");
			assert_ok(te_batch_free(e, b));
			continue;
		}
		assert_ok(st);
		watchdog_arm(60, "te_batch_wait on an unregistered range");
		g_assert_cmpint(te_batch_wait(e, b, 30 * S_NS), !=, TE_INPROGRESS);
		watchdog_disarm();
		assert_ok(te_task_status(e, b, 0, &ti));
		g_test_message("%s of %" PRIu64 " bytes of an unregistered range: %s, %s: \"%s\" "
			       "after %.1f ms",
			       i % 2 ? "READ" : "WRITE", len, te_state_str(ti.state),
			       te_status_str(ti.status), ti.detail, (now_ns() - t0) / 1e6);
		g_assert_true(ti.state == TE_STATE_FAILED || ti.state == TE_STATE_TIMEOUT);
		g_assert_cmpstr(ti.detail, !=, "");
		if (now_ns() - t0 > (KILL_TIMEOUT_MS + DEADLINE_SLACK_MS) * MS_NS)
			g_error("the request took %.1f ms to end, past its deadline",
				(now_ns() - t0) / 1e6);
		assert_ok(te_batch_free(e, b));
	}
	assert_node_is(n, mirror, "after requests to an unregistered range");
	node_send(n, "register");
	s2 = node_expect(n, "ok", NODE_REPLY_MS);
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	g_free(mirror);
	node_free(n);
}

/*
 * The target registers its buffer again (te_mem_unregister, then te_mem_register: new keys)
 * between two of the initiator's transfers, with no failure in between to make the core
 * fetch the descriptor again. The cached descriptor still lists the range, with the old
 * keys, so the first request after is refused by the provider (TE_ERR_REMOTE_ACCESS; under
 * tcp;ofi_rxm TE_ERR_CONN_RESET, below). That failure must make the next submit fetch the
 * descriptor again, so that a request soon completes. Without it every later request failed until the application imported the
 * segment anew. shm checks no keys: skipped there.
 */
static void test_reregistered(void)
{
	const uint64_t len = 65536;
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	uint8_t *mirror;
	struct lbuf l;

	if (!keys_checked())
		return;
	n = target_start(30000);
	e = initiator_new(KILL_TIMEOUT_MS);
	seg = efa_open(e, n);
	mirror = mirror_new(n);
	lbuf_new(&l, e, 4 * len);
	for (unsigned round = 0; round < 3; round++) {
		uint64_t off = 4096 + round * len;
		struct te_request w = { TE_OP_WRITE, seg, l.p, n->buf + off, len };
		struct te_request r = { TE_OP_READ, seg, l.p + 2 * len, n->buf + off, len };
		g_autofree char *s1 = NULL, *s2 = NULL;
		struct te_task_info ti = { 0 };
		unsigned attempt;

		sysnode_fill(l.p, 0, len, 20 + round);
		/* A refusal less than SEGMENT_REFETCH_NS after the last may mark nothing. */
		sleep_ms(150);
		efa_step("round %u: the target registers its buffer again", round);
		node_send(n, "unregister");
		s1 = node_expect(n, "ok", NODE_REPLY_MS);
		node_send(n, "register");
		s2 = node_expect(n, "ok", NODE_REPLY_MS);
		for (attempt = 1; attempt <= 4; attempt++) {
			te_batch_id b;

			assert_ok(te_batch_new(e, 1, &b));
			assert_ok(te_batch_submit(e, b, &w, 1));
			watchdog_arm(60, "te_batch_wait (WRITE after the target registered again)");
			g_assert_cmpint(te_batch_wait(e, b, 30 * S_NS), !=, TE_INPROGRESS);
			watchdog_disarm();
			assert_ok(te_task_status(e, b, 0, &ti));
			assert_ok(te_batch_free(e, b));
			g_test_message("round %u, attempt %u: WRITE %s %s%s%s", round, attempt,
				       te_state_str(ti.state), te_status_str(ti.status),
				       ti.detail[0] ? ": " : "", ti.detail);
			if (ti.state == TE_STATE_COMPLETED)
				break;
			/*
			 * The old key, refused by the target's provider: nothing written.
			 * tcp;ofi_rxm closes the connection on it (TE_ERR_CONN_RESET once its
			 * retries on new connections meet the same refusal), which also makes
			 * the core fetch the descriptor again. The next request may still meet
			 * the closed connection (the same error) before rxm connects again:
			 * up to 4 tries, 100 ms apart.
			 */
			g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
			if (ti.status != TE_ERR_REMOTE_ACCESS && ti.status != TE_ERR_CONN_RESET)
				g_error("round %u: WRITE under the old key: %s, expected %s or %s",
					round, te_status_str(ti.status),
					te_status_str(TE_ERR_REMOTE_ACCESS),
					te_status_str(TE_ERR_CONN_RESET));
			sleep_ms(100);
		}
		if (attempt > 4)
			g_error("round %u: no WRITE completed in 4 attempts after the target "
				"registered its buffer again: the failures did not lead to a fresh "
				"descriptor",
				round);
		memcpy(mirror + n->guard + off, l.p, len);
		memset(l.p + 2 * len, 0, len);
		run_ok(e, &r, 1);
		assert_bytes(l.p + 2 * len, l.p, len, "READ back after the new registration");
	}
	assert_node_is(n, mirror, "after the target registered its buffer again");
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	g_free(mirror);
	node_free(n);
}

/* The thread that strikes once the batch has moved its first bytes. */
struct fault {
	struct te_engine *e;
	te_batch_id b;
	struct node *n;
	int sig;
	int64_t t_submit;
	int64_t t_fault;
	uint64_t bytes;
	bool late;	       /* the fault came after every byte had moved */
	atomic_bool submitted; /* te_batch_submit returned */
	bool resumed;	       /* SIGCONT sent because te_batch_submit stayed blocked */
};

/* How long a stopped shm target may block te_batch_submit before the striker resumes it. */
#define FREEZE_STALL_S 10

static gpointer fault_main(gpointer data)
{
	struct fault *f = data;
	struct te_batch_info bi;

	/*
	 * From its own thread: on shm, te_batch_submit itself copies (CMA runs in the posting
	 * thread), so the submitting thread could only strike after the batch.
	 */
	do {
		assert_ok(te_batch_status(f->e, f->b, &bi));
	} while ((bi.tasks == 0 || (bi.bytes == 0 && !te_state_is_terminal(bi.state))) &&
		 now_ns() - f->t_submit < 5 * S_NS);
	g_subprocess_send_signal(f->n->proc, f->sig);
	f->t_fault = now_ns();
	f->bytes = bi.bytes;
	f->late = te_state_is_terminal(bi.state);
	/*
	 * shm: a target stopped inside its own progress keeps its region's spinlock, and every
	 * post to it spins in the provider until it runs again (libfabric's shm, not this
	 * plugin). Should te_batch_submit stay blocked that long, resume the target and say so.
	 */
	if (f->sig == SIGSTOP) {
		while (!atomic_load(&f->submitted) && now_ns() - f->t_fault < FREEZE_STALL_S * S_NS)
			g_usleep(10000);
		if (!atomic_load(&f->submitted)) {
			f->resumed = true;
			g_subprocess_send_signal(f->n->proc, SIGCONT);
		}
	} else if (strcmp(provider, "shm") == 0) {
		/*
		 * A target killed while it held that lock never lets go of it: a post already
		 * spinning on it never returns (the plugin keeps later posts out with the peer's
		 * pidfd, not one already inside libfabric; README "Dead peer, shm"). Nothing can
		 * end it from outside, so when te_batch_submit is still inside FREEZE_STALL_S
		 * after the kill (copies into a dead process fail at once), report that as a
		 * skip with the reason instead of hanging or failing by timeout.
		 */
		while (!atomic_load(&f->submitted) && now_ns() - f->t_fault < FREEZE_STALL_S * S_NS)
			g_usleep(10000);
		if (!atomic_load(&f->submitted)) {
			node_shm_cleanup(f->n);
			printf("ok 1 /efa/kill-mid-batch # SKIP te_batch_submit spins in libfabric's "
			       "shm on the killed target's region lock (it died holding it; a "
			       "libfabric shm limitation, plugins/efa/README.md 'Dead peer, shm')\n"
			       "1..1\n");
			fflush(stdout);
			_exit(0);
		}
	}
	return NULL;
}

/*
 * Fault in the middle of a batch (@sig: SIGKILL, or SIGSTOP for a frozen target): every task
 * terminal by its deadline, the batch freeable, the engine shuts down without hanging.
 */
static void fault_mid_batch(int sig)
{
	enum {
		N = 1024,
		LEN = 1u << 20
	};
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	struct lbuf l;
	struct te_request *r = g_new0(struct te_request, N);
	struct te_batch_info bi;
	unsigned count[TE_STATE_INVALID + 1] = { 0 };
	struct fault f = { .sig = sig };
	struct fault_log fl = { .echo_all = g_getenv("TE_EFA_TEST_LOG") != NULL };
	unsigned held = 0;
	GThread *striker;
	te_batch_id b;
	enum te_status st;
	int64_t t_submit, t_done;

	if (!need_provider()) {
		g_free(r);
		return;
	}
	n = target_start(30000);
	/* A dead peer's connection does not come back: ops to it fail after 500 ms. */
	e = initiator_new_log(KILL_TIMEOUT_MS, "connect_timeout_ms: 500", fault_log_fn, &fl,
			      TE_LOG_DEBUG);
	seg = efa_open(e, n);
	lbuf_new(&l, e, LEN);
	sysnode_fill(l.p, 0, LEN, 3);
	{
		struct te_request w = { TE_OP_WRITE, seg, l.p, n->buf, 4096 };

		run_ok(e, &w, 1); /* the path is up before the big batch */
	}
	for (unsigned i = 0; i < N; i++)
		r[i] = (struct te_request){ i % 4 == 3 ? TE_OP_READ : TE_OP_WRITE, seg, l.p,
					    n->buf + (uint64_t)(i % 48) * LEN, LEN };
	assert_ok(te_batch_new(e, N, &b));
	f = (struct fault){ .e = e, .b = b, .n = n, .sig = sig, .t_submit = now_ns() };
	t_submit = f.t_submit;
	striker = g_thread_new("striker", fault_main, &f);
	efa_step("te_batch_submit of %u x 1 MiB; a %s strikes the target meanwhile", N,
		 sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
	watchdog_arm(FREEZE_STALL_S + 60, "te_batch_submit");
	st = te_batch_submit(e, b, r, N);
	atomic_store(&f.submitted, true);
	watchdog_disarm();
	g_test_message("submit: %s after %.1f ms", te_status_str(st), (now_ns() - t_submit) / 1e6);
	efa_step("te_batch_wait after the %s", sig == SIGKILL ? "kill" : "freeze");
	watchdog_arm(KILL_TIMEOUT_MS / 1000 + 60, "te_batch_wait after the fault");
	st = te_batch_wait(e, b, (KILL_TIMEOUT_MS + 30000) * MS_NS);
	watchdog_disarm();
	t_done = now_ns();
	efa_step("joining the striker thread");
	g_thread_join(striker);
	assert_ok(te_batch_status(e, b, &bi));
	g_test_message("%s %.1f ms after submit with %" PRIu64 " of %" PRIu64
		       " bytes moved; batch %s (%s) %.1f ms after submit: %u completed, %u "
		       "failed, %u timed out, %u canceled",
		       sig == SIGKILL ? "killed" : "frozen", (f.t_fault - t_submit) / 1e6, f.bytes,
		       (uint64_t)N * LEN, te_state_str(bi.state), te_status_str(st),
		       (t_done - t_submit) / 1e6, bi.completed, bi.failed, bi.timed_out,
		       bi.canceled);
	/*
	 * shm copies inside the post call (CMA), and a copy into a dead process fails: when
	 * every task completed, every copy ran before the target's memory went away (the
	 * striker, seeing the late-reported bytes, can strike during the last posts). A frozen
	 * target's memory stays reachable for those copies: they complete.
	 */
	if (sig == SIGKILL && strcmp(provider, "shm") == 0 && bi.completed == N)
		f.late = true;
	if (f.late)
		g_test_message("every byte had moved before the fault: nothing to test this time");
	else if (sig == SIGKILL)
		g_assert_cmpuint(bi.completed, <, N);
	g_assert_cmpint(st, !=, TE_INPROGRESS);
	g_assert_true(te_state_is_terminal(bi.state));
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		g_assert_true(te_state_is_terminal(ti.state));
		count[ti.state]++;
		if (ti.state == TE_STATE_COMPLETED) {
			g_assert_cmpuint(ti.bytes, ==, LEN);
			continue;
		}
		g_assert_cmpint(ti.status, <, 0);
		if (!ti.detail[0])
			g_error("task %u: %s (%s) without detail", i, te_state_str(ti.state),
				te_status_str(ti.status));
		if (strstr(ti.detail, "did not hand the slice back"))
			held++;
		if (count[ti.state] == 1)
			g_test_message("first %s task (%u): %s: %s", te_state_str(ti.state), i,
				       te_status_str(ti.status), ti.detail);
	}
	if (f.resumed)
		g_test_message("te_batch_submit spun %d s on the stopped target's shm region lock "
			       "(a libfabric shm limitation, README 'Frozen peer'): the target was "
			       "resumed; the deadline is not checked this time",
			       FREEZE_STALL_S);
	else if (t_done - t_submit > (KILL_TIMEOUT_MS + DEADLINE_SLACK_MS) * MS_NS) {
		/*
		 * The one documented exception (README "Cancel and timeouts"): the target froze
		 * in the middle of a READ response, and libfabric < 1.18 would crash closing that
		 * connection, so the plugin (its debug line says so) leaves it open and the core
		 * gives its slices up cancel_grace_ms after the deadline.
		 */
		if (sig == SIGSTOP && atomic_load(&fl.read_holds) && held &&
		    t_done - t_submit <=
			    (KILL_TIMEOUT_MS + CANCEL_GRACE_MS + DEADLINE_SLACK_MS) * MS_NS)
			g_test_message("terminal %.1f ms after submit: the target froze inside a "
				       "READ response; a fence left %u connection%s open for it "
				       "(libfabric < 1.18), and %u task%s ended by the core's "
				       "%u ms grace (README 'Cancel and timeouts')",
				       (t_done - t_submit) / 1e6, atomic_load(&fl.read_holds),
				       atomic_load(&fl.read_holds) == 1 ? "" : "s", held,
				       held == 1 ? "" : "s", CANCEL_GRACE_MS);
		else
			g_error("the batch became terminal %.1f ms after submit, past the %u ms "
				"deadline (%u task%s the core gave up on; %u connection%s left "
				"open for READ responses)",
				(t_done - t_submit) / 1e6, KILL_TIMEOUT_MS, held,
				held == 1 ? "" : "s", atomic_load(&fl.read_holds),
				atomic_load(&fl.read_holds) == 1 ? "" : "s");
	}
	assert_ok(te_batch_free(e, b));

	if (sig == SIGKILL) {
		/* Later transfers to the dead (and reaped) peer end by their deadline too. */
		struct te_request w = { TE_OP_WRITE, seg, l.p, n->buf, 4096 };
		struct te_task_info ti;

		target_kill(n);
		assert_ok(te_batch_new(e, 1, &b));
		t_submit = now_ns();
		/*
		 * shm: a target killed while it held its region's lock leaves it held; a post to
		 * it would spin in the provider forever, which the plugin's pidfd check rules out.
		 */
		efa_step("te_batch_submit to the dead peer");
		watchdog_arm(60, "te_batch_submit to the dead peer");
		st = te_batch_submit(e, b, &w, 1);
		watchdog_disarm();
		g_test_message("submit to the dead peer: %s", te_status_str(st));
		efa_step("te_batch_wait of a WRITE to the dead peer");
		watchdog_arm(60, "te_batch_wait to a dead peer");
		g_assert_cmpint(te_batch_wait(e, b, 30 * S_NS), !=, TE_INPROGRESS);
		watchdog_disarm();
		assert_ok(te_task_status(e, b, 0, &ti));
		g_test_message("WRITE to the dead peer: %s, %s: %s after %.1f ms",
			       te_state_str(ti.state), te_status_str(ti.status), ti.detail,
			       (now_ns() - t_submit) / 1e6);
		g_assert_true(ti.state == TE_STATE_FAILED || ti.state == TE_STATE_TIMEOUT ||
			      ti.state == TE_STATE_INVALID);
		g_assert_cmpint(now_ns() - t_submit, <=,
				(KILL_TIMEOUT_MS + DEADLINE_SLACK_MS) * MS_NS);
		/* Over tcp;ofi_rxm the refused reconnects are noticed well before the deadline. */
		if (strcmp(provider, "shm") != 0) {
			g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
			g_assert_cmpint(now_ns() - t_submit, <, KILL_TIMEOUT_MS * MS_NS);
		}
		assert_ok(te_batch_free(e, b));
		/*
		 * The provider returned every operation: the local region is free again. Not
		 * on shm with delivery completion (no CMA here): shm never fails operations
		 * a dead peer was to complete, and only engine shutdown ends them.
		 */
		efa_step("te_mem_unregister and te_segment_close after the kill");
		if (strcmp(provider, "shm") == 0) {
			int64_t t0 = now_ns();

			while ((st = te_mem_unregister(e, l.p)) == TE_ERR_BUSY &&
			       now_ns() - t0 < 2 * S_NS)
				g_usleep(1000);
			g_test_message("shm: te_mem_unregister after the kill: %s",
				       te_status_str(st));
			if (st == TE_OK)
				g_aligned_free(l.p);
		} else {
			lbuf_free(&l, e);
			st = TE_OK;
		}
		assert_ok(te_segment_close(e, seg) == TE_OK || st != TE_OK ? TE_OK : TE_ERR_BUSY);
		efa_free(e);
		if (st != TE_OK)
			g_aligned_free(l.p);
	} else {
		/*
		 * A frozen peer keeps RMA operations posted (libfabric cannot take them back):
		 * the region stays busy until the provider returns them. Once the target runs
		 * again they complete, the plugin lets go and the region is free.
		 */
		int64_t t0;

		efa_step("te_mem_unregister, then SIGCONT of the frozen target");
		st = te_mem_unregister(e, l.p);
		g_test_message("te_mem_unregister with operations posted to a frozen peer: %s",
			       te_status_str(st));
		g_subprocess_send_signal(n->proc, SIGCONT);
		t0 = now_ns();
		while (st == TE_ERR_BUSY && now_ns() - t0 < 20 * S_NS) {
			g_usleep(5000);
			st = te_mem_unregister(e, l.p);
		}
		g_test_message("te_mem_unregister %.1f ms after SIGCONT: %s", (now_ns() - t0) / 1e6,
			       te_status_str(st));
		assert_ok(st);
		g_aligned_free(l.p);
		assert_ok(te_segment_close(e, seg));
		efa_free(e);
	}
	target_kill(n);
	node_free(n);
	g_free(r);
}

static void test_kill_mid_batch(void)
{
	fault_mid_batch(SIGKILL);
}

/* ---------------------------------------------------------------------------------------- */
/* no write lands after its task ended */

#define LATE_N 8	    /* WRITEs of the batch that ends while the target is stopped */
#define LATE_LEN (1u << 20) /* bytes of each */
#define LATE_WAIT_S 3	    /* how long late bytes get to land before the check */

/* Resumes a stopped target that keeps te_batch_submit spinning (shm; see fault_main). */
struct resumer {
	struct node *n;
	atomic_bool done; /* te_batch_submit returned */
	bool resumed;
};

static gpointer resumer_main(gpointer data)
{
	struct resumer *r = data;
	int64_t t0 = now_ns();

	while (!atomic_load(&r->done) && now_ns() - t0 < FREEZE_STALL_S * S_NS)
		g_usleep(10000);
	if (!atomic_load(&r->done)) {
		r->resumed = true;
		g_subprocess_send_signal(r->n->proc, SIGCONT);
	}
	return NULL;
}

/*
 * One round: the target is stopped (SIGSTOP) while LATE_N WRITEs of old data to a range are in
 * flight; they end by their deadline (@cancel: by te_batch_cancel) and are handed back by the
 * plugin, not by the core's cancel_grace_ms; then the target runs again, WRITEs of new data to
 * the same range complete, and LATE_WAIT_S later the target holds the new data and nothing
 * else changed: no byte of the old WRITEs landed after their tasks ended (on tcp;ofi_rxm the
 * bytes already in the sockets land when the target resumes, before the new WRITEs: README).
 */
static void late_write_round(struct te_engine *e, te_segment_id seg, struct node *n,
			     uint8_t *mirror, struct lbuf *l, bool cancel, uint64_t seed)
{
	const char *how = cancel ? "te_batch_cancel" : "deadline";
	struct te_request r[LATE_N];
	struct resumer rs = { .n = n };
	unsigned count[TE_STATE_INVALID + 1] = { 0 };
	uint8_t *fresh = l->p + (size_t)LATE_N * LATE_LEN;
	GThread *t;
	te_batch_id b;
	enum te_status st;

	sysnode_fill(l->p, n->guard, (uint64_t)LATE_N * LATE_LEN, seed);
	for (unsigned i = 0; i < LATE_N; i++)
		r[i] = (struct te_request){ TE_OP_WRITE, seg, l->p + (size_t)i * LATE_LEN,
					    n->buf + (uint64_t)i * LATE_LEN, LATE_LEN };
	efa_step("%s round: stopping the target", how);
	g_subprocess_send_signal(n->proc, SIGSTOP);
	assert_ok(te_batch_new(e, LATE_N, &b));
	t = g_thread_new("resumer", resumer_main, &rs);
	efa_step("%s round: te_batch_submit of old data to the stopped target", how);
	st = te_batch_submit(e, b, r, LATE_N);
	atomic_store(&rs.done, true);
	g_thread_join(t);
	assert_ok(st);
	if (cancel) {
		g_usleep(200 * 1000);
		assert_ok(te_batch_cancel(e, b));
	}
	efa_step("%s round: te_batch_wait for the old WRITEs", how);
	st = te_batch_wait(e, b, (KILL_TIMEOUT_MS + 30000) * MS_NS);
	g_assert_cmpint(st, !=, TE_INPROGRESS);
	for (uint32_t i = 0; i < LATE_N; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		g_assert_true(te_state_is_terminal(ti.state));
		count[ti.state]++;
		if (ti.state == TE_STATE_COMPLETED)
			continue; /* shm copies into a stopped process (CMA) */
		g_assert_cmpint(ti.state, ==, cancel ? TE_STATE_CANCELED : TE_STATE_TIMEOUT);
		g_assert_cmpint(ti.status, ==, cancel ? TE_ERR_CANCELED : TE_ERR_TIMEOUT);
		assert_contains(ti.detail, cancel ? "canceled by te_batch_cancel" : "deadline of");
		/* The plugin handed the slice back: the core did not have to give up on it. */
		if (strstr(ti.detail, "did not hand the slice back"))
			g_error("%s round, task %u: the plugin kept the slice: %s", how, i,
				ti.detail);
		if (count[ti.state] == 1)
			g_test_message("%s round: first %s task (%u): %s", how,
				       te_state_str(ti.state), i, ti.detail);
	}
	g_test_message("%s round: %u completed, %u timed out, %u canceled%s", how,
		       count[TE_STATE_COMPLETED], count[TE_STATE_TIMEOUT], count[TE_STATE_CANCELED],
		       rs.resumed ? " (te_batch_submit spun on the stopped target: it was resumed)"
				  : "");
	assert_ok(te_batch_free(e, b));
	if (!rs.resumed)
		g_subprocess_send_signal(n->proc, SIGCONT);

	sysnode_fill(fresh, n->guard, (uint64_t)LATE_N * LATE_LEN, seed + 1);
	memcpy(mirror + n->guard, fresh, (size_t)LATE_N * LATE_LEN);
	for (unsigned i = 0; i < LATE_N; i++)
		r[i].local = fresh + (size_t)i * LATE_LEN;
	run_ok(e, r, LATE_N);
	efa_step("%s round: waiting %d s for late bytes of the old WRITEs", how, LATE_WAIT_S);
	g_usleep(LATE_WAIT_S * G_USEC_PER_SEC);
	efa_step("%s round: checking the target's bytes", how);
	assert_node_is(n, mirror,
		       cancel ? "after te_batch_cancel of WRITEs to a stopped target"
			      : "after WRITEs to a stopped target timed out");
}

/*
 * cancel-race: te_batch_cancel right after te_batch_submit, many rounds of READs, WRITEs and
 * both, of 4 KiB to 4 MiB (each cancel lands somewhere else in the operations' life). Pins:
 * a fence that closed a connection receiving a READ response crashed libfabric < 1.18 (tcp
 * completes that READ twice, rxm dereferences the second completion's missing context in
 * fi_av_remove); a fence after a reconnect the peer rejected crashed rxm too (it closes an
 * idle connection again); bytes of a canceled WRITE that land after its task ended. Every
 * task ends COMPLETED (right bytes) or CANCELED (each byte old or new, nothing between the
 * requests touched), including the bytes of earlier rounds' canceled WRITEs that could still
 * be in the sockets; the path works afterwards.
 */
#define RACE_ROUNDS 60
#define RACE_N 4

static const uint64_t race_lens[RACE_N] = { 4096, (256u << 10) + 1, (1u << 20) + 3, 4u << 20 };

/* Whether each byte of @got is pattern @a or pattern @b at node offset @off + k. */
static void assert_either(const uint8_t *got, uint64_t off, uint64_t len, uint64_t a, uint64_t b,
			  const char *what, unsigned round, uint32_t task)
{
	for (uint64_t k = 0; k < len; k++) {
		uint8_t x = got[k];

		if (x != sysnode_pattern(a, off + k) && x != sysnode_pattern(b, off + k))
			g_error("round %u, %s of task %u: byte %" PRIu64 " of %" PRIu64
				" is 0x%02x, neither seed %" PRIu64 " (0x%02x) nor seed %" PRIu64
				" (0x%02x)",
				round, what, task, k, len, x, a, sysnode_pattern(a, off + k), b,
				sysnode_pattern(b, off + k));
	}
}

static void test_cancel_race(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	struct lbuf l;
	uint64_t span = 0, woff, roff, rseed = 500;
	unsigned count[TE_STATE_INVALID + 1] = { 0 };

	if (!need_provider())
		return;
	for (unsigned i = 0; i < RACE_N; i++)
		span += race_lens[i] + 7;
	n = target_start(60000);
	e = initiator_new(60000);
	seg = efa_open(e, n);
	/* Node offsets (from its mapping's base) of the WRITE and READ ranges, unaligned. */
	woff = n->guard + 1;
	roff = n->guard + (32u << 20) + 1;
	g_assert_cmpuint(roff + span, <=, n->guard + n->size);
	/* Local: the WRITE source, the READ destination, then where WRITE ranges are read back. */
	lbuf_new(&l, e, 3 * (size_t)span);
	node_fill(n, roff, span, rseed);
	for (unsigned r = 0; r < RACE_ROUNDS; r++) {
		uint64_t wold = 1000 + r, wnew = 2000 + r, rold = 3000 + r, x = 0;
		struct te_request q[RACE_N];
		struct te_task_info ti[RACE_N];
		uint8_t *wsrc = l.p, *rdst = l.p + span, *back = l.p + 2 * span;
		bool any_write = false;
		te_batch_id b;
		enum te_status st;

		/* READs, WRITEs, then both: the crash needed a READ response being received. */
		for (unsigned i = 0; i < RACE_N; i++) {
			bool wr = r % 3 == 1 || (r % 3 == 2 && i % 2);

			q[i] = (struct te_request){ wr ? TE_OP_WRITE : TE_OP_READ, seg,
						    (wr ? wsrc : rdst) + x,
						    n->base + (wr ? woff : roff) + x,
						    race_lens[i] };
			any_write |= wr;
			x += race_lens[i] + 7;
		}
		if (any_write)
			node_fill(n, woff, span, wold);
		sysnode_fill(wsrc, woff, span, wnew);
		sysnode_fill(rdst, roff, span, rold);
		efa_step("round %u: te_batch_submit then te_batch_cancel", r);
		assert_ok(te_batch_new(e, RACE_N, &b));
		assert_ok(te_batch_submit(e, b, q, RACE_N));
		assert_ok(te_batch_cancel(e, b));
		efa_step("round %u: te_batch_wait after the cancel", r);
		st = te_batch_wait(e, b, 60 * S_NS);
		g_assert_cmpint(st, !=, TE_INPROGRESS);
		for (uint32_t i = 0; i < RACE_N; i++) {
			assert_ok(te_task_status(e, b, i, &ti[i]));
			if (ti[i].state != TE_STATE_COMPLETED && ti[i].state != TE_STATE_CANCELED)
				g_error("round %u: task %u (%s) ended %s (%s): %s; a canceled "
					"batch's tasks end COMPLETED or CANCELED",
					r, i, q[i].opcode == TE_OP_READ ? "READ" : "WRITE",
					te_state_str(ti[i].state), te_status_str(ti[i].status),
					ti[i].detail);
			if (ti[i].state == TE_STATE_CANCELED &&
			    strstr(ti[i].detail, "did not hand the slice back"))
				g_error("round %u, task %u: the plugin kept the slice: %s", r, i,
					ti[i].detail);
			count[ti[i].state]++;
		}
		assert_ok(te_batch_free(e, b));
		/* READs: the node's bytes when COMPLETED; old local or node bytes when CANCELED. */
		x = 0;
		for (uint32_t i = 0; i < RACE_N; i++) {
			bool done = ti[i].state == TE_STATE_COMPLETED;

			if (q[i].opcode == TE_OP_READ)
				assert_either(rdst + x, roff + x, race_lens[i], rseed,
					      done ? rseed : rold, "the READ bytes", r, i);
			x += race_lens[i] + 7;
		}
		if (!any_write)
			continue;
		/* WRITEs: read the whole range back (gaps included): new when COMPLETED. */
		{
			struct te_request rb = { TE_OP_READ, seg, back, n->base + woff, span };

			run_ok(e, &rb, 1);
		}
		x = 0;
		for (uint32_t i = 0; i < RACE_N; i++) {
			bool done = ti[i].state == TE_STATE_COMPLETED;

			if (q[i].opcode == TE_OP_WRITE)
				assert_either(back + x, woff + x, race_lens[i], wnew,
					      done ? wnew : wold, "the target's bytes", r, i);
			else
				assert_either(back + x, woff + x, race_lens[i], wold, wold,
					      "the target's bytes (no WRITE there)", r, i);
			assert_either(back + x + race_lens[i], woff + x + race_lens[i], 7, wold,
				      wold, "the gap after", r, i);
			x += race_lens[i] + 7;
		}
	}
	g_test_message("%u rounds: %u tasks completed, %u canceled", RACE_ROUNDS,
		       count[TE_STATE_COMPLETED], count[TE_STATE_CANCELED]);
	/* The path works after all those fences. */
	{
		struct te_request ok[2] = {
			{ TE_OP_WRITE, seg, l.p, n->base + woff, 1u << 20 },
			{ TE_OP_READ, seg, l.p + span, n->base + roff, 1u << 20 },
		};

		sysnode_fill(l.p, woff, 1u << 20, 77);
		run_ok(e, ok, 2);
		g_assert_cmpuint(node_checksum(n, woff, 1u << 20), ==, sysnode_fnv(l.p, 1u << 20));
		assert_either(l.p + span, roff, 1u << 20, rseed, rseed, "the final READ", 0, 1);
	}
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	node_free(n);
}

/* A WRITE reported TIMEOUT or CANCELED never modifies the target after it was reported. */
static void test_no_late_write(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	uint8_t *mirror;
	struct lbuf l;

	if (!need_provider())
		return;
	n = target_start(30000);
	e = initiator_new(KILL_TIMEOUT_MS);
	seg = efa_open(e, n);
	mirror = mirror_new(n);
	lbuf_new(&l, e, 2 * (size_t)LATE_N * LATE_LEN);
	{
		struct te_request w = { TE_OP_WRITE, seg, l.p, n->buf, 4096 };

		run_ok(e, &w, 1); /* the path is up before the target stops */
		memcpy(mirror + n->guard, l.p, 4096);
	}
	late_write_round(e, seg, n, mirror, &l, false, 61);
	late_write_round(e, seg, n, mirror, &l, true, 71);
	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	efa_free(e);
	g_free(mirror);
	node_free(n);
}

static void test_freeze_mid_batch(void)
{
	fault_mid_batch(SIGSTOP);
}

/* ---------------------------------------------------------------------------------------- */
/* install */

/* provider: efa without an EFA device fails engine start with a clear reason. */
static void test_no_device(void)
{
	g_autofree char *yaml = efa_yaml("efa", 1000, NULL);
	struct te_engine *e = NULL;
	enum te_status st;

	if (!efa_path) {
		g_test_skip("efa.so is not found along TE_PLUGIN_PATH");
		return;
	}
	st = te_engine_new_from_string(yaml, strlen(yaml), &e);
	if (st == TE_OK) {
		te_engine_free(e);
		g_test_skip("this machine has an EFA device: nothing to refuse");
		return;
	}
	g_test_message("provider efa: %s: %s", te_status_str(st), te_last_error());
	if (!strstr(te_last_error(), "no EFA device found"))
		g_error("the reason does not say \"no EFA device found\": %s", te_last_error());
	g_assert_nonnull(strstr(te_last_error(), "fi_getinfo(efa)"));
}

/* Option errors fail engine start and name the option. */
static void test_options(void)
{
	static const struct {
		const char *options, *needle;
	} bad[] = {
		/* Declared options: the core's checks (efa checks the rest itself). */
		{ "colour: blue", "options.colour: unknown option of plugin efa" },
		{ "window: 0x10", "options.window: expected an integer, got \"0x10\"" },
		{ "window: 100000", "options.window: value 100000 out of range 0..16384" },
		{ "progress: sometimes",
		  "options.progress: expected one of: auto, adaptive, busy, caller, got "
		  "\"sometimes\"" },
		{ "write_completion: maybe",
		  "options.write_completion: expected one of: auto, delivery, transmit, got "
		  "\"maybe\"" },
		{ "slice_size: 1k", "options.slice_size: value 1k out of range 4K..1G" },
		{ "warmup: perhaps",
		  "options.warmup: expected a boolean (true, false, yes, no, on, off), got "
		  "\"perhaps\"" },
		{ "iface: no-such-if0", "no interface 'no-such-if0'" },
		{ "devices: no-such-domain", "no domain named in 'devices'" },
		{ "node: 127.0.0.1, iface: lo", "mutually exclusive" },
	};

	if (!need_provider())
		return;
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *yaml = efa_yaml(provider, 1000, bad[i].options);
		struct te_engine *e = NULL;
		enum te_status st;

		efa_step("te_engine_new with options {%s}", bad[i].options);
		st = te_engine_new_from_string(yaml, strlen(yaml), &e);

		if (st == TE_OK) {
			te_engine_free(e);
			g_error("options {%s} were accepted", bad[i].options);
		}
		g_test_message("{%s}: %s: %s", bad[i].options, te_status_str(st), te_last_error());
		if (!strstr(te_last_error(), bad[i].needle))
			g_error("options {%s}: the error does not say \"%s\": %s", bad[i].options,
				bad[i].needle, te_last_error());
	}
	/* And the good ones load. */
	{
		g_autofree char *yaml = efa_yaml(
			provider, 1000,
			"window: 64, slice_size: 1MiB, progress: busy, spin_us: 0, poll_us: 10, "
			"progress_threads: 2, write_completion: transmit, warmup: false, "
			"connect_timeout_ms: 500");
		struct te_engine *e = NULL;

		assert_ok(te_engine_new_from_string(yaml, strlen(yaml), &e));
		te_engine_free(e);
	}
}

/* A target on another libfabric provider is refused at segment open, naming both. */
static void test_provider_mismatch(void)
{
	const char *other = strcmp(provider, "shm") == 0 ? "tcp;ofi_rxm" : "shm";
	g_autofree char *yaml = efa_yaml(other, 30000, NULL);
	struct te_engine *e = NULL, *probe = NULL;
	te_segment_id seg = 0;
	struct node *n;
	enum te_status st;

	if (!need_provider())
		return;
	if (te_engine_new_from_string(yaml, strlen(yaml), &probe) != TE_OK) {
		g_test_skip("the other provider is not usable here");
		return;
	}
	te_engine_free(probe);
	efa_step("starting a te-node target on %s", other);
	n = node_start(yaml, NULL);
	e = initiator_new(5000);
	efa_step("te_segment_open of a %s target", other);
	st = te_segment_open(e, n->segment, &seg);
	g_test_message("open of a %s target from %s: %s: %s", other, provider, te_status_str(st),
		       te_last_error());
	g_assert_cmpint(st, !=, TE_OK);
	if (!strstr(te_last_error(), other) || !strstr(te_last_error(), provider))
		g_error("the reason does not name both providers: %s", te_last_error());
	efa_free(e);
	node_free(n);
}

/* ---------------------------------------------------------------------------------------- */
/* GPU memory */

/*
 * An engine in this process with fakegpu (tests/plugins: owns "cuda", its device pointers fault
 * on any CPU access, exports no dmabuf) before efa on the test's provider; its log in @logs.
 */
static struct te_engine *gpu_engine(struct log_capture *logs)
{
	const char *level = g_getenv("TE_EFA_TEST_LOG");
	g_autofree char *yaml = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
						"log: {level: %s}\n"
						"transfer: {timeout_ms: 60000}\n"
						"transports:\n"
						"  - name: fakegpu\n"
						"    required: true\n"
						"  - name: efa\n"
						"    required: true\n"
						"    options: {provider: \"%s\"}\n",
						level && *level ? level : "warn", provider);
	struct te_engine_opts eo = { .size = sizeof(eo),
				     .config_yaml = yaml,
				     .config_yaml_len = strlen(yaml),
				     .log_fn = log_collect,
				     .log_user = logs,
				     .log_level = TE_LOG_INFO };
	struct te_engine *e = NULL;

	efa_step("te_engine_new with fakegpu and efa on %s", provider);
	assert_ok(te_engine_new(&eo, &e));
	return e;
}

/* @len bytes at @loc, filled with @mirror's bytes (through te_mem_copy for GPU memory). */
static uint8_t *gpu_alloc(struct te_engine *e, const char *loc, const uint8_t *mirror, size_t len)
{
	void *p = NULL;

	assert_ok(te_mem_alloc(e, loc, len, &p));
	assert_ok(te_mem_copy(e, p, mirror, len));
	return p;
}

/* Every byte of @p (any memory of @e) equals @mirror. */
static void gpu_assert_is(struct te_engine *e, const uint8_t *p, const uint8_t *mirror, size_t len,
			  const char *what)
{
	g_autofree uint8_t *host = g_malloc(len);

	assert_ok(te_mem_copy(e, host, p, len));
	assert_bytes(host, mirror, len, what);
}

/* Run @r (one request from a cuda region); it must complete over efa, staged. */
static void gpu_run_staged(struct te_engine *e, const struct te_request *r)
{
	struct te_task_info ti;
	te_batch_id bid;

	assert_ok(te_batch_new(e, 1, &bid));
	assert_ok(te_batch_submit(e, bid, r, 1));
	watchdog_arm(BATCH_WAIT_NS / S_NS + 10, "te_batch_wait of a staged request");
	assert_ok(te_batch_wait(e, bid, BATCH_WAIT_NS));
	watchdog_disarm();
	assert_ok(te_task_status(e, bid, 0, &ti));
	g_assert_cmpstr(ti.transport, ==, "efa");
	assert_contains(ti.device, "(staged)");
	g_assert_cmpuint(ti.bytes, ==, r->length);
	assert_ok(te_batch_free(e, bid));
}

/*
 * Without FI_HMEM (Debian's libfabric has no CUDA or ROCr) efa takes host memory only: a cuda
 * region as the local side is staged by the core (the task's device says "(staged)"), every
 * byte checked both ways; a peer's cuda region has no efa key, so a request to it fails at
 * submit saying so (one-sided RMA cannot stage at the target).
 */
static void test_gpu_staged(void)
{
	enum {
		LEN = 4u << 20
	};
	static const size_t sizes[] = { 1, 4097, (1u << 20) + 3 };
	struct log_capture la = { .text = g_string_new(NULL) }, lb = { .text = g_string_new(NULL) };
	g_autofree uint8_t *ma = g_malloc(LEN), *mb = g_malloc(LEN), *mg = g_malloc(LEN);
	struct te_engine *a, *b;
	uint8_t *ag, *bh, *bg, *ah;
	char *json = NULL;
	size_t jlen = 0;
	te_segment_id seg;
	struct te_request r;
	struct te_task_info ti;
	te_batch_id bid;

	if (!need_provider())
		return;
	g_mutex_init(&la.lock);
	g_mutex_init(&lb.lock);
	a = gpu_engine(&la);
	if (strstr(la.text->str, "through FI_HMEM")) {
		/* A libfabric with CUDA would take fakegpu's pointers for real ones. */
		g_test_skip("this libfabric's provider has a usable FI_HMEM interface");
		te_engine_free(a);
		goto out;
	}
	assert_contains(la.text->str, "GPU memory: staged by the core here");
	b = gpu_engine(&lb);
	sysnode_fill(ma, 0, LEN, 71);
	sysnode_fill(mb, 0, LEN, 72);
	sysnode_fill(mg, 0, LEN, 73);
	ag = gpu_alloc(a, "cuda:0", ma, LEN);
	ah = gpu_alloc(a, "cpu", ma, LEN);
	bh = gpu_alloc(b, "cpu", mb, LEN);
	bg = gpu_alloc(b, "cuda:1", mg, LEN);
	assert_ok(te_mem_register(a, ag, LEN, "cuda:0", TE_MEM_LOCAL));
	assert_ok(te_mem_register(a, ah, LEN, "cpu", TE_MEM_LOCAL));
	assert_ok(te_mem_register(b, bh, LEN, "cpu", TE_MEM_REMOTE));
	/* Registered (fakegpu takes it), but efa publishes no key for it. */
	assert_ok(te_mem_register(b, bg, LEN, "cuda:1", TE_MEM_REMOTE));
	assert_ok(te_segment_export(b, &json, &jlen));
	assert_ok(te_segment_import(a, json, jlen, &seg));
	te_free(json);

	for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
		size_t len = sizes[i], loff = 3 + i, roff = 4096 + 5 + i, back = (2u << 20) + 11;
		g_autofree char *what = g_strdup_printf("%zu B cuda:0 <-> cpu over efa", len);

		efa_step("staged WRITE and READ of %zu B", len);
		r = (struct te_request){ TE_OP_WRITE, seg, ag + loff,
					 (uint64_t)(uintptr_t)bh + roff, len };
		gpu_run_staged(a, &r);
		memcpy(mb + roff, ma + loff, len);
		r.local = ag + back;
		r.opcode = TE_OP_READ;
		gpu_run_staged(a, &r);
		memcpy(ma + back, mb + roff, len);
		gpu_assert_is(b, bh, mb, LEN, what);
		gpu_assert_is(a, ag, ma, LEN, what);
	}

	/* B's cuda region: no efa key, refused at submit, nothing touched. */
	efa_step("a request to the peer's cuda region");
	r = (struct te_request){ TE_OP_WRITE, seg, ah, (uint64_t)(uintptr_t)bg, 4096 };
	assert_ok(te_batch_new(a, 1, &bid));
	assert_status(te_batch_submit(a, bid, &r, 1), TE_ERR_NO_TRANSPORT);
	assert_contains(te_last_error(), "efa: remote buffer has no key for it");
	assert_ok(te_task_status(a, bid, 0, &ti));
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	assert_contains(ti.detail, "no key");
	assert_ok(te_batch_free(a, bid));
	gpu_assert_is(b, bg, mg, LEN, "the peer's cuda region after the refusal");

	assert_ok(te_segment_close(a, seg));
	assert_ok(te_mem_unregister(a, ag));
	assert_ok(te_mem_unregister(a, ah));
	assert_ok(te_mem_unregister(b, bh));
	assert_ok(te_mem_unregister(b, bg));
	assert_ok(te_mem_free(a, ag));
	assert_ok(te_mem_free(a, ah));
	assert_ok(te_mem_free(b, bh));
	assert_ok(te_mem_free(b, bg));
	efa_free(a);
	efa_step("te_engine_free of the target");
	te_engine_free(b);
out:
	g_string_free(la.text, TRUE);
	g_string_free(lb.text, TRUE);
	g_mutex_clear(&la.lock);
	g_mutex_clear(&lb.lock);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	signal(SIGPIPE, SIG_IGN);
	provider = g_getenv("TE_EFA_PROVIDER");
	if (!provider || !*provider)
		provider = "tcp;ofi_rxm";
	node_path = find_te_node();
	if (!node_path) {
		printf("1..0 # SKIP te-node not found (set TE_NODE or TE_BUILD_ROOT)\n");
		return 77;
	}
	{
		const char *w = g_getenv("TE_EFA_WATCHDOG_S");

		where.seconds = w && *w ? (unsigned)parse_u64(w, 10) : 100;
		g_thread_unref(g_thread_new("case-watchdog", case_watchdog, NULL));
	}
	efa_path = find_plugin("efa.so");
	g_test_message("te-node: %s; efa plugin: %s; provider %s", node_path,
		       efa_path ? efa_path : "not found", provider);

	add_case("/efa/transfer-sizes", test_transfer_sizes);
	add_case("/efa/batch-1000", test_batch_1000);
	add_case("/efa/progress-modes", test_progress_modes);
	add_case("/efa/out-of-range", test_out_of_range);
	add_case("/efa/unregistered", test_unregistered);
	add_case("/efa/reregistered", test_reregistered);
	add_case("/efa/kill-mid-batch", test_kill_mid_batch);
	add_case("/efa/freeze-mid-batch", test_freeze_mid_batch);
	add_case("/efa/no-late-write", test_no_late_write);
	add_case("/efa/cancel-race", test_cancel_race);
	add_case("/efa/no-device", test_no_device);
	add_case("/efa/options", test_options);
	add_case("/efa/provider-mismatch", test_provider_mismatch);
	add_case("/efa/gpu-staged", test_gpu_staged);
	return g_test_run();
}
