/* SPDX-License-Identifier: Apache-2.0 */
/* fault_test.c: fault and attack cases between te engines in network namespaces. */

/*
 * fault_test.sh creates three namespaces joined by a bridge in the first and runs
 * "fault_test CASE" inside the second (b) with FAULT_* in the environment. This program
 *   - starts the target, a te-node, in namespace a ("ip netns exec A te-node", which execs,
 *     so the child's PID is te-node's: its RSS and descriptors are read from /proc),
 *   - runs the honest initiator, an engine in this process, in b,
 *   - attacks from namespace c on threads that setns() there (raw sockets),
 *   - cuts links with ip and drops packets with nft rules inside the namespaces.
 * Both engines authenticate with the same secret (auth.secret), as off-loopback engines do.
 *
 * A case prints one line
 *
 *   figure: case=NAME tasks=.. terminal_within_deadline+1s=../.. bytes_verified=..
 *           honest_served=../.. rss_kb_before=.. rss_kb_after=.. fds_before=.. fds_after=.. ...
 *
 * (RSS and descriptors of the target, or of this process where the target is killed), one
 * "FAIL: ..." line per failed assertion, and "RESULT: ..."; it exits 1 on any failure. The
 * assertions are about states, bytes and bounds: "terminal by the deadline + 1 s" is checked
 * against the last poll at which the task was seen NOT terminal (so a slow poller cannot
 * fail it), server timeouts get 5 s of slack, and every wait has a generous limit. A
 * watchdog ends the case with a verdict well before meson's timeout.
 *
 * The limits asserted are the documented defaults (issue 12): tcp max_conns_per_host 64 (the
 * default until lanes went from 2 to 4; it is 128 now), hello_timeout_ms 5000; control
 * max_connections_per_host 64, auth_timeout_ms 5000, frame_timeout_ms 10000,
 * notify_per_sender 1024, notify_per_host 8192. The cases set none of these options, so an
 * engine that does not know them still starts.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te.h>

#include "sysnode.h"
#include "sysnode_fixture.h"

/* Registered bytes of the target. */
#define TARGET_SIZE (16u << 20)
#define MIB (1u << 20)
/* transfer.timeout_ms of the fault cases: short, so that a case takes seconds. */
#define FAULT_TIMEOUT_MS 3000u
/* transfer.timeout_ms where transfers are expected to complete (loss, attacks). */
#define SLOW_TIMEOUT_MS 30000u
/* "Every task terminal by its deadline + 1 s." */
#define GRACE_NS (1 * S_NS)
/*
 * Descriptors the target may open lazily or keep for a while beyond its baseline: an
 * epoll/eventfd pair created on first use, and a control-plane connection the initiator's
 * rpc client reopens (the target closes idle ones after control.idle_timeout_ms).
 */
#define FD_SLACK 4
/* RSS growth allowed over a case (the target's 16 MiB buffer is touched before). */
#define RSS_BOUND_KB (64u * 1024)
/* AddressSanitizer's default quarantine_size_mb. */
#define ASAN_QUARANTINE_MB 256L
/* The watchdog: a case ends with a verdict within this (meson: 240 s, the wrapper: 170 s). */
#define CASE_LIMIT_S 150u
/* Server-side timeouts are asserted with this much slack (timer ticks, a loaded machine). */
#define SERVER_SLACK_MS 5000u

/* The limits being asserted (issue 12, items b and c): defaults, tcp's per-host one before 4 lanes. */
#define TCP_MAX_CONNS_PER_HOST 64u
#define TCP_HELLO_TIMEOUT_MS 5000u
#define CTL_MAX_CONNS_PER_HOST 64u
#define CTL_AUTH_TIMEOUT_MS 5000u
#define CTL_FRAME_TIMEOUT_MS 10000u
#define NOTIFY_PER_SENDER 1024u
#define NOTIFY_PER_HOST 8192u

static struct {
	const char *ns_a, *ns_b, *ns_c;
	const char *addr_a, *addr_b, *addr_c;
	const char *dev_b;
	const char *secret;
	unsigned port; /* the target's control port: its segment is "addr_a:port" */
	char *ip;      /* the ip command */
} env;

static unsigned failures;
static GString *figure, *figure_tail;
/* Every task of every batch the case ran, and how many were terminal by deadline + 1 s. */
static unsigned all_tasks, all_within;

/* ---------------------------------------------------------------------------------------- */
/* verdicts */

static bool check(bool ok, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static bool check(bool ok, const char *fmt, ...)
{
	va_list ap;

	if (ok)
		return true;
	va_start(ap, fmt);
	printf("FAIL: ");
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
	va_end(ap);
	failures++;
	return false;
}

static void fig(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static void fig(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	g_string_append_c(figure, ' ');
	g_string_append_vprintf(figure, fmt, ap);
	va_end(ap);
}

/* Figures printed after the case's own (per-block verdicts and such). */
static void fig_tail(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static void fig_tail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	g_string_append_c(figure_tail, ' ');
	g_string_append_vprintf(figure_tail, fmt, ap);
	va_end(ap);
}

static void note(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static void note(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("# ");
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
	va_end(ap);
}

static void watchdog_fired(int sig)
{
	static const char msg[] = "FAIL: watchdog: the case did not end within its limit\n";

	(void)sig;
	(void)!write(STDOUT_FILENO, msg, sizeof(msg) - 1);
	_exit(1);
}

/* ---------------------------------------------------------------------------------------- */
/* processes, namespaces, commands */

/* Run @cmd with sh; its exit status (-1 if it could not run). Output goes to our stderr. */
static int sh(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static int sh(const char *fmt, ...)
{
	g_autofree char *cmd = NULL;
	g_autoptr(GError) err = NULL;
	const char *argv[] = { "/bin/sh", "-c", NULL, NULL };
	int status = 0;
	va_list ap;

	va_start(ap, fmt);
	cmd = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	argv[2] = cmd;
	if (!g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_CHILD_INHERITS_STDIN, NULL, NULL, NULL,
			  NULL, &status, &err)) {
		note("cannot run '%s': %s", cmd, err->message);
		return -1;
	}
	if (!g_spawn_check_wait_status(status, NULL)) {
		note("'%s' failed (wait status %d)", cmd, status);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
	}
	return 0;
}

static void sh_ok(const char *what, int rc)
{
	if (rc != 0)
		g_error("%s failed (%d)", what, rc);
}

/* Move the calling thread into namespace @ns (its threads created later follow). */
static void enter_ns(const char *ns)
{
	g_autofree char *path = g_strdup_printf("/run/netns/%s", ns);
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
		g_error("cannot enter network namespace %s: %s", ns, g_strerror(errno));
	close(fd);
}

static long proc_rss_kb(const char *pid)
{
	g_autofree char *path = g_strdup_printf("/proc/%s/status", pid);
	g_autofree char *text = NULL;
	const char *p;

	if (!g_file_get_contents(path, &text, NULL, NULL) || !(p = strstr(text, "VmRSS:")))
		return -1;
	return strtol(p + 6, NULL, 10);
}

/*
 * RSS growth a sanitizer build adds to every bound: AddressSanitizer keeps freed memory in
 * its quarantine (ASAN_OPTIONS quarantine_size_mb, 256 MiB by default) instead of reusing
 * it, so the target's RSS under the notify flood grew by 132 MiB there, 36 MiB in
 * a plain build.
 * 0 in other builds, where the bounds stand as written.
 */
static long rss_slack_kb(void)
{
#if defined(__SANITIZE_ADDRESS__)
	const char *o = getenv("ASAN_OPTIONS");
	const char *q = o ? strstr(o, "quarantine_size_mb=") : NULL;
	long mb = q ? strtol(q + strlen("quarantine_size_mb="), NULL, 10) : ASAN_QUARANTINE_MB;

	return (mb >= 0 ? mb : ASAN_QUARANTINE_MB) * 1024;
#else
	return 0;
#endif
}

/* RSS growth allowed over a case: RSS_BOUND_KB, plus a sanitizer's quarantine. */
static long rss_bound_kb(void)
{
	return (long)RSS_BOUND_KB + rss_slack_kb();
}

static int proc_fds(const char *pid)
{
	g_autofree char *path = g_strdup_printf("/proc/%s/fd", pid);
	g_autoptr(GDir) d = g_dir_open(path, 0, NULL);
	int n = 0;

	if (!d)
		return -1;
	while (g_dir_read_name(d))
		n++;
	return n;
}

/*
 * Connected (not listening) TCP sockets of process @pid whose local port is @port: from
 * /proc/PID/net/tcp (the process's own namespace) and its descriptors.
 */
static int proc_conns(const char *pid, unsigned port)
{
	g_autofree char *path = g_strdup_printf("/proc/%s/net/tcp", pid);
	g_autofree char *dir = g_strdup_printf("/proc/%s/fd", pid);
	g_autofree char *text = NULL;
	g_autoptr(GHashTable) inodes = g_hash_table_new(g_int64_hash, g_int64_equal);
	g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
	g_auto(GStrv) lines = NULL;
	g_autoptr(GDir) d = NULL;
	const char *name;
	int n = 0;

	if (!g_file_get_contents(path, &text, NULL, NULL))
		return -1;
	lines = g_strsplit(text, "\n", -1);
	for (char **l = lines; *l; l++) {
		unsigned lport, st;
		unsigned long inode;

		if (sscanf(*l, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &lport,
			   &st, &inode) == 3 &&
		    lport == port && st != 0x0a && inode) {
			gint64 *k = g_new(gint64, 1);

			*k = (gint64)inode;
			g_ptr_array_add(keep, k);
			g_hash_table_add(inodes, k);
		}
	}
	d = g_dir_open(dir, 0, NULL);
	while (d && (name = g_dir_read_name(d))) {
		g_autofree char *fd = g_build_filename(dir, name, NULL);
		g_autofree char *link = g_file_read_link(fd, NULL);
		gint64 ino;

		if (link && sscanf(link, "socket:[%" G_GINT64_FORMAT "]", &ino) == 1 &&
		    g_hash_table_contains(inodes, &ino))
			n++;
	}
	return n;
}

/* Poll until the fd count of @pid is at most @limit (up to @ms); the last count. */
static int fds_settle(const char *pid, int limit, unsigned ms)
{
	int64_t end = now_ns() + ms * MS_NS;
	int n;

	while ((n = proc_fds(pid)) > limit && now_ns() < end)
		sleep_ms(100);
	return n;
}

/* SIGSTOP the node and wait (10 s at most) until every thread of it is stopped. */
static void node_stop_all(struct node *n)
{
	g_autofree char *dir = g_strdup_printf("/proc/%s/task", n->pid);
	int64_t end = now_ns() + 10 * S_NS;

	g_subprocess_send_signal(n->proc, SIGSTOP);
	for (;;) {
		g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
		bool all = d != NULL;
		const char *tid;

		while (d && (tid = g_dir_read_name(d))) {
			g_autofree char *path = g_strdup_printf("%s/%s/stat", dir, tid);
			g_autofree char *stat = NULL;
			const char *paren;

			if (g_file_get_contents(path, &stat, NULL, NULL) &&
			    (paren = strrchr(stat, ')')) && paren[1] == ' ' &&
			    (paren[2] == 'T' || paren[2] == 't'))
				continue;
			all = false;
		}
		if (all)
			return;
		if (now_ns() >= end)
			g_error("te-node (pid %s) did not stop within 10 s of SIGSTOP", n->pid);
		sleep_ms(1);
	}
}

/* ---------------------------------------------------------------------------------------- */
/* engines */

/*
 * The target's YAML; @limits adds the control and tcp limits the attack cases assert, set
 * explicitly (to the documented defaults) so that the cases test behaviour, not defaults.
 */
static char *target_yaml(bool limits)
{
	g_autofree char *tcp_limits = NULL, *control = NULL;

	if (limits) {
		tcp_limits = g_strdup_printf(", max_conns_per_host: %u, hello_timeout_ms: %u",
					     TCP_MAX_CONNS_PER_HOST, TCP_HELLO_TIMEOUT_MS);
		control = g_strdup_printf("control: {max_connections_per_host: %u, "
					  "auth_timeout_ms: %u, frame_timeout_ms: %u, "
					  "notify_per_sender: %u, notify_per_host: %u}\n",
					  CTL_MAX_CONNS_PER_HOST, CTL_AUTH_TIMEOUT_MS,
					  CTL_FRAME_TIMEOUT_MS, NOTIFY_PER_SENDER, NOTIFY_PER_HOST);
	}
	return g_strdup_printf("engine: {listen: \"%s:%u\"}\n"
			       "transports:\n"
			       "  - name: tcp\n"
			       "    required: true\n"
			       "    options: {bind: \"%s\"%s}\n"
			       "auth: {secret: \"%s\"}\n"
			       "%s",
			       env.addr_a, env.port, env.addr_a, limits ? tcp_limits : "",
			       env.secret, limits ? control : "");
}

/* The target: te-node in namespace a, a 16 MiB buffer of pattern 0 between guards. */
static struct node *target_start_with(bool limits)
{
	g_autofree char *yaml = target_yaml(limits);
	const char *argv[] = { env.ip,	 "netns", "exec",   env.ns_a, node_path,
			       "--yaml", yaml,	  "--size", "16M",    NULL };
	struct node *n = node_start_argv(argv);
	g_autofree char *want = g_strdup_printf("%s:%u", env.addr_a, env.port);

	if (strcmp(n->segment, want) != 0)
		g_error("the target's segment is %s, expected %s", n->segment, want);
	return n;
}

static struct node *target_start(void)
{
	return target_start_with(false);
}

/* An engine in the calling thread's namespace (b for the honest initiator). */
static struct te_engine *engine_new(const char *addr, unsigned timeout_ms)
{
	g_autofree char *yaml = g_strdup_printf("engine: {listen: \"%s:0\"}\n"
						"transfer: {timeout_ms: %u}\n"
						"transports:\n"
						"  - name: tcp\n"
						"    required: true\n"
						"    options: {bind: \"%s\"}\n"
						"auth: {secret: \"%s\"}\n",
						addr, timeout_ms, addr, env.secret);
	struct te_engine *e = NULL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);

	if (st != TE_OK)
		g_error("initiator engine: %s: %s", te_status_str(st), te_last_error());
	return e;
}

static void engine_free(struct te_engine *e)
{
	watchdog_arm(60, "te_engine_free");
	te_engine_free(e);
	watchdog_disarm();
}

/* The tcp endpoint the node publishes (transports.tcp of its descriptor). */
struct endpoint {
	char host[64];
	unsigned port;
	uint64_t nonce;
};

static uint64_t le_get(const uint8_t *p, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void le_put(uint8_t *p, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void node_endpoint(struct node *n, struct endpoint *ep)
{
	g_autofree char *json = NULL;
	g_autoptr(JsonParser) parser = json_parser_new();
	g_autoptr(GError) err = NULL;
	g_autofree guchar *blob = NULL;
	JsonObject *root, *tps;
	const char *b64;
	gsize len = 0;

	node_send(n, "descriptor");
	json = node_expect(n, "descriptor ", NODE_REPLY_MS);
	if (!json_parser_load_from_data(parser, json, -1, &err))
		g_error("descriptor is not JSON: %s", err->message);
	root = json_node_get_object(json_parser_get_root(parser));
	tps = root ? json_object_get_object_member(root, "transports") : NULL;
	b64 = tps ? json_object_get_string_member(tps, "tcp") : NULL;
	if (!b64)
		g_error("the descriptor has no transports.tcp: %s", json);
	blob = g_base64_decode(b64, &len);
	/* "TCB1", version, family 4, port, instance nonce, address (plugins/tcp/README.md) */
	if (len < 32 || memcmp(blob, "TCB1", 4) != 0 || blob[5] != 4)
		g_error("unexpected tcp blob in the descriptor (%zu bytes)", (size_t)len);
	ep->port = (unsigned)le_get(blob + 6, 2);
	ep->nonce = le_get(blob + 8, 8);
	g_snprintf(ep->host, sizeof(ep->host), "%u.%u.%u.%u", blob[16], blob[17], blob[18],
		   blob[19]);
}

/* ---------------------------------------------------------------------------------------- */
/* batches */

/* How every task of one batch ended, and when. */
struct track {
	uint32_t n;
	int64_t t_submit, deadline; /* ns; deadline = t_submit + transfer.timeout_ms */
	int64_t *seen;		    /* last time the task was seen NOT terminal */
	struct te_task_info *ti;    /* final */
	unsigned within;	    /* terminal by deadline + 1 s */
	unsigned states[TE_STATE_INVALID + 1];
	bool triggered;
	int64_t t_trigger, t_all;
	uint64_t bytes_at_trigger;
	GString *statuses; /* "COMPLETED:3,TIMEOUT/-122:5" */
};

typedef void (*trigger_fn)(void *ctx);

static void track_clear(struct track *t)
{
	g_free(t->seen);
	g_free(t->ti);
	if (t->statuses)
		g_string_free(t->statuses, TRUE);
	memset(t, 0, sizeof(*t));
}

/*
 * Submit @n requests as one batch and poll every task until all are terminal; @fn (if
 * any) runs once, as soon as the batch has moved a byte (mid-batch). Gives up 30 s past
 * the deadline (cancels; tasks still not terminal then count as late). Returns the batch
 * (caller frees).
 */
static te_batch_id track_run(struct te_engine *e, const struct te_request *reqs, uint32_t n,
			     unsigned timeout_ms, trigger_fn fn, void *ctx, struct track *t)
{
	g_autoptr(GHashTable) by = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	te_batch_id b;
	enum te_status st;
	bool *done = g_new0(bool, n);
	uint32_t left = n;
	bool canceled = false;

	memset(t, 0, sizeof(*t));
	t->n = n;
	t->seen = g_new0(int64_t, n);
	t->ti = g_new0(struct te_task_info, n);
	t->statuses = g_string_new(NULL);
	if (te_batch_new(e, n, &b) != TE_OK)
		g_error("te_batch_new(%u): %s", n, te_last_error());
	st = te_batch_submit(e, b, reqs, n);
	t->t_submit = now_ns();
	t->deadline = t->t_submit + (int64_t)timeout_ms * MS_NS;
	if (st != TE_OK)
		note("te_batch_submit: %s: %s", te_status_str(st), te_last_error());
	for (uint32_t i = 0; i < n; i++)
		t->seen[i] = t->t_submit;
	while (left) {
		int64_t now = now_ns();

		if (fn && !t->triggered) {
			struct te_batch_info bi;

			if (te_batch_status(e, b, &bi) == TE_OK &&
			    (bi.bytes > 0 || now - t->t_submit > 5 * S_NS)) {
				t->bytes_at_trigger = bi.bytes;
				fn(ctx);
				t->triggered = true;
				t->t_trigger = now_ns();
				continue;
			}
		}
		for (uint32_t i = 0; i < n; i++) {
			if (done[i])
				continue;
			if (te_task_status(e, b, i, &t->ti[i]) != TE_OK)
				g_error("te_task_status: %s", te_last_error());
			if (te_state_is_terminal(t->ti[i].state)) {
				done[i] = true;
				left--;
			} else {
				t->seen[i] = now;
			}
		}
		if (!left)
			break;
		if (!canceled && now > t->deadline + 30 * S_NS) {
			note("%u tasks not terminal 30 s past the deadline: canceling", left);
			if (te_batch_cancel(e, b) != TE_OK)
				note("te_batch_cancel: %s", te_last_error());
			canceled = true;
		}
		if (canceled && now > t->deadline + 45 * S_NS) {
			note("%u tasks still not terminal after te_batch_cancel", left);
			break;
		}
		sleep_ms(2);
	}
	t->t_all = now_ns();
	for (uint32_t i = 0; i < n; i++) {
		all_tasks++;
		all_within += done[i] && t->seen[i] <= t->deadline + GRACE_NS;
		g_autofree char *k = NULL;

		if (!done[i])
			continue;
		t->states[t->ti[i].state]++;
		if (t->seen[i] <= t->deadline + GRACE_NS)
			t->within++;
		k = t->ti[i].state == TE_STATE_COMPLETED
			    ? g_strdup("COMPLETED")
			    : g_strdup_printf("%s/%d", te_state_str(t->ti[i].state),
					      t->ti[i].status);
		g_hash_table_insert(
			by, g_strdup(k),
			GUINT_TO_POINTER(GPOINTER_TO_UINT(g_hash_table_lookup(by, k)) + 1));
	}
	{
		g_autoptr(GList) keys =
			g_list_sort(g_hash_table_get_keys(by), (GCompareFunc)strcmp);

		for (GList *k = keys; k; k = k->next)
			g_string_append_printf(t->statuses, "%s%s:%u", k == keys ? "" : ",",
					       (const char *)k->data,
					       GPOINTER_TO_UINT(g_hash_table_lookup(by, k->data)));
	}
	g_free(done);
	return b;
}

/* Describe a tracked batch; every task must be terminal by deadline + 1 s. */
static void track_check(const struct track *t, const char *what)
{
	int64_t late = 0;

	for (uint32_t i = 0; i < t->n; i++)
		late = MAX(late, t->seen[i] - t->deadline);
	{
		g_autofree char *fault =
			t->triggered ? g_strdup_printf(", fault %.0f ms after submit with "
						       "%" PRIu64 " bytes moved",
						       (t->t_trigger - t->t_submit) / 1e6,
						       t->bytes_at_trigger)
				     : g_strdup("");

		note("%s: %u tasks, %s; all terminal %.0f ms after submit (deadline %.0f ms)%s",
		     what, t->n, t->statuses->str, (t->t_all - t->t_submit) / 1e6,
		     (t->deadline - t->t_submit) / 1e6, fault);
		/* The first task of each way of failing, with its detail. */
		for (uint32_t i = 0; i < t->n; i++) {
			bool seen = false;

			if (!te_state_is_terminal(t->ti[i].state) ||
			    t->ti[i].state == TE_STATE_COMPLETED)
				continue;
			for (uint32_t j = 0; j < i && !seen; j++)
				seen = t->ti[j].state == t->ti[i].state &&
				       t->ti[j].status == t->ti[i].status;
			if (!seen)
				note("%s: first %s/%d task (%u): %s: %s", what,
				     te_state_str(t->ti[i].state), t->ti[i].status, i,
				     te_status_str(t->ti[i].status), t->ti[i].detail);
		}
	}
	check(t->within == t->n,
	      "%s: %u of %u tasks terminal by the deadline + 1 s (one was still not terminal "
	      "%.0f ms past the deadline)",
	      what, t->within, t->n, late / 1e6);
	for (uint32_t i = 0; i < t->n; i++)
		if (t->ti[i].state != TE_STATE_COMPLETED && te_state_is_terminal(t->ti[i].state) &&
		    !check(t->ti[i].status < 0 && t->ti[i].detail[0],
			   "%s: task %u ended %s without an error status and a detail", what, i,
			   te_state_str(t->ti[i].state)))
			break;
}

static void batch_free_wait(struct te_engine *e, te_batch_id b)
{
	int64_t end = now_ns() + 10 * S_NS;
	enum te_status st;

	while ((st = te_batch_free(e, b)) == TE_ERR_BUSY && now_ns() < end)
		sleep_ms(5);
	check(st == TE_OK, "te_batch_free of a terminal batch: %s", te_status_str(st));
}

/* Run @n requests that should complete; the first failure's status (TE_OK if none). */
static enum te_status run_quiet(struct te_engine *e, const struct te_request *reqs, uint32_t n,
				unsigned timeout_ms, const char *what)
{
	struct track t;
	te_batch_id b = track_run(e, reqs, n, timeout_ms, NULL, NULL, &t);
	enum te_status st = TE_OK;

	for (uint32_t i = 0; i < n; i++) {
		if (t.ti[i].state != TE_STATE_COMPLETED) {
			st = t.ti[i].status ? t.ti[i].status : TE_ERR_INTERNAL;
			note("%s: task %u %s: %s (%d): %s", what, i, te_state_str(t.ti[i].state),
			     te_status_str(t.ti[i].status), t.ti[i].status, t.ti[i].detail);
			break;
		}
	}
	if (t.within != t.n)
		check(false, "%s: %u of %u tasks terminal by the deadline + 1 s", what, t.within,
		      t.n);
	batch_free_wait(e, b);
	track_clear(&t);
	return st;
}

/* The target's bytes at offset @off (from its base) hold pattern @seed for @len bytes. */
static bool target_holds(struct node *n, uint64_t off, uint64_t len, uint64_t seed)
{
	uint8_t *want = g_malloc(len);
	bool ok;

	sysnode_fill(want, off, len, seed);
	ok = node_checksum(n, off, len) == sysnode_fnv(want, len);
	g_free(want);
	return ok;
}

static bool guards_intact(struct node *n)
{
	return target_holds(n, 0, n->guard, 0) && target_holds(n, n->guard + n->size, n->guard, 0);
}

/*
 * Honest traffic: WRITE @len bytes of pattern @seed at buffer offset @roff, READ them back,
 * compare, and compare the target's checksum. Adds the bytes to *verified; false (with a
 * note) on any failure.
 */
static bool roundtrip(struct te_engine *e, te_segment_id seg, struct node *n, struct lbuf *l,
		      uint64_t roff, size_t len, uint64_t seed, unsigned timeout_ms,
		      uint64_t *verified)
{
	uint64_t abs = n->guard + roff;
	struct te_request r;
	enum te_status st;

	g_assert_cmpuint(2 * len, <=, l->len);
	sysnode_fill(l->p, abs, len, seed);
	memset(l->p + len, 0, len);
	r = (struct te_request){ TE_OP_WRITE, seg, l->p, n->buf + roff, len };
	if ((st = run_quiet(e, &r, 1, timeout_ms, "honest WRITE")) != TE_OK)
		return false;
	r = (struct te_request){ TE_OP_READ, seg, l->p + len, n->buf + roff, len };
	if ((st = run_quiet(e, &r, 1, timeout_ms, "honest READ")) != TE_OK)
		return false;
	if (memcmp(l->p, l->p + len, len) != 0) {
		check(false,
		      "honest READ of %zu bytes at +%" PRIu64 " differs from what was written", len,
		      roff);
		return false;
	}
	if (node_checksum(n, abs, len) != sysnode_fnv(l->p, len)) {
		check(false, "the target does not hold the %zu bytes written at +%" PRIu64, len,
		      roff);
		return false;
	}
	*verified += len;
	return true;
}

static te_segment_id segment_open(struct te_engine *e, struct node *n)
{
	struct te_buffer_info b;
	te_segment_id seg = 0;
	size_t nb = 0;
	enum te_status st = te_segment_open(e, n->segment, &seg);

	if (st != TE_OK)
		g_error("te_segment_open %s: %s: %s", n->segment, te_status_str(st),
			te_last_error());
	if (te_segment_buffers(e, seg, &b, 1, &nb) != TE_OK || nb != 1 || b.addr != n->buf)
		g_error("te_segment_buffers of %s: not the node's buffer", n->segment);
	return seg;
}

/* Unregister a local buffer, waiting (up to @ms) while a transport still holds it. */
static enum te_status lbuf_release(struct te_engine *e, struct lbuf *l, unsigned ms)
{
	int64_t end = now_ns() + ms * MS_NS;
	enum te_status st;

	while ((st = te_mem_unregister(e, l->p)) == TE_ERR_BUSY && now_ns() < end)
		sleep_ms(5);
	if (st == TE_OK)
		g_aligned_free(l->p);
	return st;
}

/* A target, an initiator in this namespace, its segment, a local buffer, lanes up. */
struct rig {
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	struct lbuf l;
	struct endpoint ep;
	unsigned timeout_ms;
};

static void rig_up_with(struct rig *r, unsigned timeout_ms, size_t local, bool limits)
{
	uint64_t v = 0;

	memset(r, 0, sizeof(*r));
	r->timeout_ms = timeout_ms;
	r->n = target_start_with(limits);
	node_endpoint(r->n, &r->ep);
	r->e = engine_new(env.addr_b, timeout_ms);
	r->seg = segment_open(r->e, r->n);
	lbuf_new(&r->l, r->e, MAX(local, 2 * MIB));
	/* Lanes up and the path proven before any fault; then pattern 0 everywhere again. */
	if (!roundtrip(r->e, r->seg, r->n, &r->l, 0, MIB, 1, SLOW_TIMEOUT_MS, &v))
		g_error("the warm-up transfer failed: no fault injected yet");
	node_fill(r->n, r->n->guard, MIB, 0);
	note("target %s pid %s, tcp %s:%u; initiator %s", r->n->segment, r->n->pid, r->ep.host,
	     r->ep.port, te_engine_name(r->e));
}

static void rig_up(struct rig *r, unsigned timeout_ms, size_t local)
{
	rig_up_with(r, timeout_ms, local, false);
}

static void rig_down(struct rig *r)
{
	if (r->l.p)
		check(lbuf_release(r->e, &r->l, 10000) == TE_OK,
		      "the local buffer is still held 10 s after every batch was freed");
	if (r->seg)
		if (te_segment_close(r->e, r->seg) != TE_OK)
			note("te_segment_close: %s", te_last_error());
	engine_free(r->e);
	if (r->n)
		node_close_free(r->n, 10000, true);
}

/* Target figures, taken now. */
struct sample {
	long rss_kb;
	int fds, data_conns, ctl_conns;
};

static struct sample target_sample(struct rig *r)
{
	struct sample s = {
		.rss_kb = proc_rss_kb(r->n->pid),
		.fds = proc_fds(r->n->pid),
		.data_conns = proc_conns(r->n->pid, r->ep.port),
		.ctl_conns = proc_conns(r->n->pid, env.port),
	};
	return s;
}

static void fig_samples(const struct sample *a, const struct sample *b)
{
	fig("rss_kb_before=%ld rss_kb_after=%ld fds_before=%d fds_after=%d "
	    "data_conns_before=%d data_conns_after=%d",
	    a->rss_kb, b->rss_kb, a->fds, b->fds, a->data_conns, b->data_conns);
}

/* After-fault checks of the target against its baseline: descriptors (polled) and RSS. */
static struct sample target_settle(struct rig *r, const struct sample *before, unsigned ms)
{
	struct sample after;

	(void)fds_settle(r->n->pid, before->fds + FD_SLACK, ms);
	after = target_sample(r);
	check(after.fds <= before->fds + FD_SLACK,
	      "the target holds %d descriptors %u s after the fault ended, baseline %d (+%d "
	      "allowed); %d data-port connections (%d before)",
	      after.fds, ms / 1000, before->fds, FD_SLACK, after.data_conns, before->data_conns);
	check(after.rss_kb <= before->rss_kb + rss_bound_kb(),
	      "the target's RSS grew from %ld to %ld KiB (bound +%ld KiB)", before->rss_kb,
	      after.rss_kb, rss_bound_kb());
	return after;
}

/* ---------------------------------------------------------------------------------------- */
/* cases: peers dying, freezing, restarting; links going down; loss; partitions */

static void trigger_kill(void *ctx)
{
	struct node *n = ctx;

	g_subprocess_send_signal(n->proc, SIGKILL);
}

static void trigger_stop(void *ctx)
{
	node_stop_all(ctx);
}

static void trigger_link_down(void *ctx)
{
	(void)ctx;
	sh_ok("link down", sh("%s -n %s link set %s down", env.ip, env.ns_b, env.dev_b));
}

/*
 * 256 requests of 1 MiB (WRITEs from l[0, 1 MiB) seeded @seed, every fourth a READ of the
 * target into l[(1 + k) MiB]), spread over the target's 16 MiB: 256 MiB, long enough for a
 * fault to come mid-batch.
 */
static struct te_request *mixed_batch(struct rig *r, uint32_t n)
{
	struct te_request *q = g_new0(struct te_request, n);

	sysnode_fill(r->l.p, 0, MIB, 77);
	for (uint32_t i = 0; i < n; i++) {
		bool rd = i % 4 == 3;

		q[i] = (struct te_request){ rd ? TE_OP_READ : TE_OP_WRITE, r->seg,
					    rd ? r->l.p + (size_t)(1 + i / 4) * MIB : r->l.p,
					    r->n->buf + (uint64_t)(i % 16) * MIB, MIB };
	}
	return q;
}

/* Completed READs of a mixed batch hold the target's pattern 0: the verified bytes. */
static uint64_t mixed_verify(struct rig *r, const struct te_request *q, const struct track *t)
{
	uint8_t *want = g_malloc(MIB);
	uint64_t v = 0;

	for (uint32_t i = 0; i < t->n; i++) {
		uint64_t abs = q[i].remote - r->n->base;

		if (q[i].opcode != TE_OP_READ || t->ti[i].state != TE_STATE_COMPLETED)
			continue;
		sysnode_fill(want, abs, MIB, 0);
		if (!check(memcmp(q[i].local, want, MIB) == 0,
			   "completed READ task %u does not hold the target's bytes", i))
			break;
		v += MIB;
	}
	g_free(want);
	return v;
}

static void case_sigkill(void)
{
	enum {
		N = 256
	};
	struct rig r;
	struct te_request *q;
	struct track t, t2;
	te_batch_id b;
	uint64_t verified;
	long rss0, rss1;
	int fds0, fds1;

	rig_up(&r, FAULT_TIMEOUT_MS, (size_t)(1 + N / 4) * MIB);
	rss0 = proc_rss_kb("self");
	fds0 = proc_fds("self");
	q = mixed_batch(&r, N);
	b = track_run(r.e, q, N, r.timeout_ms, trigger_kill, r.n, &t);
	track_check(&t, "batch with the target killed");
	check(t.triggered && t.states[TE_STATE_COMPLETED] < N,
	      "the kill did not come mid-batch (%u of %u tasks completed)",
	      t.states[TE_STATE_COMPLETED], N);
	verified = mixed_verify(&r, q, &t);
	batch_free_wait(r.e, b);

	/* A later transfer to the dead peer ends by its deadline too, without a hang. */
	q[0] = (struct te_request){ TE_OP_WRITE, r.seg, r.l.p, r.n->buf, 4096 };
	b = track_run(r.e, q, 1, r.timeout_ms, NULL, NULL, &t2);
	track_check(&t2, "WRITE to the dead peer");
	check(t2.ti[0].state != TE_STATE_COMPLETED, "a WRITE to the killed target COMPLETED");
	batch_free_wait(r.e, b);

	node_kill(r.n);
	node_release(r.n);
	r.n = NULL;
	/* This process: the lanes to the dead peer are gone, nothing grew. */
	sleep_ms(500);
	fds1 = proc_fds("self");
	rss1 = proc_rss_kb("self");
	check(fds1 <= fds0 + FD_SLACK,
	      "the initiator holds %d descriptors after the kill, %d before", fds1, fds0);
	check(rss1 <= rss0 + rss_bound_kb(), "the initiator's RSS grew from %ld to %ld KiB", rss0,
	      rss1);
	fig("statuses=%s bytes_verified=%" PRIu64
	    " honest_served=- who=initiator rss_kb_before=%ld rss_kb_after=%ld fds_before=%d "
	    "fds_after=%d",
	    t.statuses->str, verified, rss0, rss1, fds0, fds1);
	track_clear(&t);
	track_clear(&t2);
	g_free(q);
	rig_down(&r);
}

/* WRITE pattern @seed over the target's whole buffer (16 x 1 MiB); TE_OK or why not. */
static enum te_status write_all(struct rig *r, uint64_t seed, const char *what)
{
	struct te_request q[16];

	g_assert_cmpuint(r->l.len, >=, TARGET_SIZE);
	sysnode_fill(r->l.p, r->n->guard, TARGET_SIZE, seed);
	for (uint32_t i = 0; i < 16; i++)
		q[i] = (struct te_request){ TE_OP_WRITE, r->seg, r->l.p + (size_t)i * MIB,
					    r->n->buf + (uint64_t)i * MIB, MIB };
	return run_quiet(r->e, q, 16, r->timeout_ms, what);
}

/* READ the whole buffer back (16 x 1 MiB) and compare with pattern @seed; bytes verified. */
static uint64_t read_all_verify(struct rig *r, uint64_t seed, const char *what)
{
	struct te_request q[16];
	uint8_t *want = g_malloc(TARGET_SIZE);
	uint64_t v = 0;

	memset(r->l.p, 0, TARGET_SIZE);
	for (uint32_t i = 0; i < 16; i++)
		q[i] = (struct te_request){ TE_OP_READ, r->seg, r->l.p + (size_t)i * MIB,
					    r->n->buf + (uint64_t)i * MIB, MIB };
	if (check(run_quiet(r->e, q, 16, SLOW_TIMEOUT_MS, what) == TE_OK,
		  "%s: READ of the whole buffer failed", what)) {
		sysnode_fill(want, r->n->guard, TARGET_SIZE, seed);
		if (check(memcmp(r->l.p, want, TARGET_SIZE) == 0,
			  "%s: the buffer read back is not the last pattern written", what))
			v = TARGET_SIZE;
	}
	g_free(want);
	return v;
}

/*
 * Per-MiB verdict of the target's buffer after a stale-write window: how many MiB hold the
 * new pattern, the old one, pattern 0, or a mix (torn).
 */
static bool stale_check(struct rig *r, uint64_t new_seed, uint64_t old_seed, uint64_t bytes,
			uint64_t block, const char *what)
{
	unsigned fresh = 0, old = 0, zero = 0, torn = 0;

	for (uint64_t off = 0; off < bytes; off += block) {
		uint64_t abs = r->n->guard + off;

		if (target_holds(r->n, abs, block, new_seed))
			fresh++;
		else if (target_holds(r->n, abs, block, old_seed))
			old++;
		else if (target_holds(r->n, abs, block, 0))
			zero++;
		else
			torn++;
	}
	fig_tail("blocks_new=%u blocks_old=%u blocks_torn=%u", fresh, old, torn);
	return check(old == 0 && torn == 0 && zero == 0,
		     "%s: stale write: of %" PRIu64 " blocks of %" PRIu64
		     " KiB, %u hold the new data, %u the old data of ended WRITEs, %u are torn, "
		     "%u were never written",
		     what, bytes / block, block >> 10, fresh, old, torn, zero);
}

static void case_sigstop(void)
{
	enum {
		N = 256
	};
	struct rig r;
	struct te_request *q = g_new0(struct te_request, N);
	struct sample s0, s1;
	struct track t;
	te_batch_id b;
	uint64_t verified = 0;
	unsigned served = 0, tries = 0, other = 0;
	enum te_status st = TE_ERR_INTERNAL;

	rig_up(&r, FAULT_TIMEOUT_MS, TARGET_SIZE);
	s0 = target_sample(&r);
	/* OLD data: 256 WRITEs of 1 MiB over the 16 MiB; the target freezes mid-batch. */
	sysnode_fill(r.l.p, r.n->guard, TARGET_SIZE, 31);
	for (uint32_t i = 0; i < N; i++)
		q[i] = (struct te_request){ TE_OP_WRITE, r.seg, r.l.p + (size_t)(i % 16) * MIB,
					    r.n->buf + (uint64_t)(i % 16) * MIB, MIB };
	b = track_run(r.e, q, N, r.timeout_ms, trigger_stop, r.n, &t);
	track_check(&t, "batch with the target stopped");
	check(t.triggered && t.states[TE_STATE_COMPLETED] < N,
	      "SIGSTOP did not come mid-batch (%u of %u tasks completed)",
	      t.states[TE_STATE_COMPLETED], N);
	for (uint32_t i = 0; i < N; i++)
		other += t.ti[i].state != TE_STATE_COMPLETED && t.ti[i].state != TE_STATE_TIMEOUT;
	check(other == 0, "%u tasks towards the frozen target ended neither COMPLETED nor TIMEOUT",
	      other);
	batch_free_wait(r.e, b);

	/* Resume; a new batch completes and its NEW data is what the target keeps. */
	g_subprocess_send_signal(r.n->proc, SIGCONT);
	for (tries = 1; tries <= 3; tries++) {
		st = write_all(&r, 32, "NEW after SIGCONT");
		if (st == TE_OK)
			break;
		sleep_ms(1000);
	}
	if (check(st == TE_OK, "no WRITE completed in 3 tries after SIGCONT: %s",
		  te_status_str(st))) {
		served++;
		sleep_ms(3000); /* what the resumed target still had queued is processed by now */
		stale_check(&r, 32, 31, TARGET_SIZE, MIB, "after SIGSTOP/SIGCONT");
		verified = read_all_verify(&r, 32, "after SIGCONT");
		served += verified > 0;
	}
	check(guards_intact(r.n), "a guard zone of the target changed");
	s1 = target_settle(&r, &s0, 15000);
	fig("statuses=%s new_write_tries=%u "
	    "bytes_verified=%" PRIu64 " honest_served=%u/2",
	    t.statuses->str, tries, verified, served);
	fig_samples(&s0, &s1);
	track_clear(&t);
	g_free(q);
	rig_down(&r);
}

static void case_restart(void)
{
	enum {
		N = 256
	};
	struct rig r;
	struct te_request *q;
	struct track t;
	te_batch_id b;
	uint64_t verified = 0;
	unsigned served = 0, attempts = 0, rounds = 4;
	long rss0, rss1;
	int fds0, fds1;
	struct sample n0, n1;

	rig_up(&r, FAULT_TIMEOUT_MS, (size_t)(1 + N / 4) * MIB);
	rss0 = proc_rss_kb("self");
	fds0 = proc_fds("self");
	q = mixed_batch(&r, N);
	b = track_run(r.e, q, N, r.timeout_ms, trigger_kill, r.n, &t);
	track_check(&t, "batch with the target killed");
	verified += mixed_verify(&r, q, &t);
	batch_free_wait(r.e, b);
	node_kill(r.n);
	node_release(r.n);

	/* A new incarnation at the same address: the core must notice and refresh. */
	r.n = target_start();
	node_endpoint(r.n, &r.ep);
	for (attempts = 1; attempts <= 10; attempts++) {
		if (roundtrip(r.e, r.seg, r.n, &r.l, 12345, MIB, 40 + attempts, SLOW_TIMEOUT_MS,
			      &verified))
			break;
		/* The second attempt follows at once; later ones wait out the refresh limit. */
		if (attempts > 1)
			sleep_ms(1100);
	}
	if (check(attempts <= 10, "no transfer to the restarted target succeeded in 10 attempts")) {
		served++;
		n0 = target_sample(&r);
		for (unsigned k = 0; k < rounds - 1; k++)
			served += roundtrip(r.e, r.seg, r.n, &r.l, (uint64_t)k * 3 * MIB + 7, MIB,
					    60 + k, SLOW_TIMEOUT_MS, &verified);
		check(served == rounds, "%u of %u transfers to the restarted target succeeded",
		      served, rounds);
		check(attempts <= 2,
		      "the restarted target was reached only at attempt %u (the second batch after "
		      "a failure should use the refreshed descriptor)",
		      attempts);
		n1 = target_settle(&r, &n0, 10000);
	} else {
		n0 = n1 = target_sample(&r);
	}
	fds1 = fds_settle("self", fds0 + FD_SLACK, 10000);
	rss1 = proc_rss_kb("self");
	check(fds1 <= fds0 + FD_SLACK,
	      "the initiator holds %d descriptors after the restart, %d before (old lanes not "
	      "closed?)",
	      fds1, fds0);
	check(rss1 <= rss0 + rss_bound_kb(), "the initiator's RSS grew from %ld to %ld KiB", rss0,
	      rss1);
	fig("statuses=%s reached_at_attempt=%u "
	    "bytes_verified=%" PRIu64 " honest_served=%u/%u who=initiator rss_kb_before=%ld "
	    "rss_kb_after=%ld fds_before=%d fds_after=%d new_target_fds=%d/%d",
	    t.statuses->str, attempts, verified, served, rounds, rss0, rss1, fds0, fds1, n0.fds,
	    n1.fds);
	track_clear(&t);
	g_free(q);
	rig_down(&r);
}

static void case_link_down(void)
{
	enum {
		N = 256
	};
	struct rig r;
	struct te_request *q = g_new0(struct te_request, N);
	struct sample s0, s1;
	struct track t;
	te_batch_id b;
	uint64_t verified = 0;
	unsigned served = 0, tries;
	enum te_status st = TE_ERR_INTERNAL;
	int64_t t_up;

	rig_up(&r, FAULT_TIMEOUT_MS, TARGET_SIZE);
	s0 = target_sample(&r);
	sysnode_fill(r.l.p, r.n->guard, TARGET_SIZE, 51);
	for (uint32_t i = 0; i < N; i++)
		q[i] = (struct te_request){ TE_OP_WRITE, r.seg, r.l.p + (size_t)(i % 16) * MIB,
					    r.n->buf + (uint64_t)(i % 16) * MIB, MIB };
	b = track_run(r.e, q, N, r.timeout_ms, trigger_link_down, NULL, &t);
	track_check(&t, "batch with the link going down");
	check(t.triggered && t.states[TE_STATE_COMPLETED] < N,
	      "the link went down after the batch (%u of %u tasks completed)",
	      t.states[TE_STATE_COMPLETED], N);
	batch_free_wait(r.e, b);
	sleep_ms(500);
	sh_ok("link up", sh("%s -n %s link set %s up", env.ip, env.ns_b, env.dev_b));
	t_up = now_ns();

	/* Later transfers succeed once the link is back (lanes are re-opened on demand). */
	for (tries = 1; tries <= 10; tries++) {
		st = write_all(&r, 52, "NEW after link up");
		if (st == TE_OK || now_ns() - t_up > 20 * S_NS)
			break;
		sleep_ms(1000);
	}
	if (check(st == TE_OK, "no WRITE completed within 20 s of the link coming back: %s",
		  te_status_str(st))) {
		served++;
		/* Longer than the retransmission backoff that delivered stale bytes (issue 12). */
		sleep_ms(6000);
		stale_check(&r, 52, 51, TARGET_SIZE, MIB, "after link down/up");
		verified = read_all_verify(&r, 52, "after link up");
		served += verified > 0;
	}
	check(guards_intact(r.n), "a guard zone of the target changed");
	s1 = target_settle(&r, &s0, 30000);
	fig("statuses=%s new_write_tries=%u "
	    "bytes_verified=%" PRIu64 " honest_served=%u/2",
	    t.statuses->str, tries, verified, served);
	fig_samples(&s0, &s1);
	track_clear(&t);
	g_free(q);
	rig_down(&r);
}

/* nft rules in table inet tefault of namespace @ns: its input chain gets @rule. */
static int nft_input(const char *ns, const char *rule)
{
	return sh("%s netns exec %s nft 'add table inet tefault; add chain inet tefault in { type "
		  "filter hook input priority 0; policy accept; }; add rule inet tefault in %s'",
		  env.ip, ns, rule);
}

static void nft_clear(const char *ns)
{
	(void)sh("%s netns exec %s nft delete table inet tefault 2>/dev/null", env.ip, ns);
}

static void case_loss(void)
{
	enum {
		ROUNDS = 3,
		PER = 4
	};
	struct rig r;
	struct sample s0, s1;
	uint64_t verified = 0;
	unsigned served = 0;
	int64_t t0, busy = 0;
	uint8_t *want = g_malloc(PER * MIB);
	bool probe_ok;

	rig_up(&r, SLOW_TIMEOUT_MS, 2 * PER * MIB);
	s0 = target_sample(&r);
	/* 5% of the packets arriving in each namespace are dropped: both directions. */
	sh_ok("nft loss in a", nft_input(env.ns_a, "numgen random mod 100 < 5 drop"));
	sh_ok("nft loss in b", nft_input(env.ns_b, "numgen random mod 100 < 5 drop"));
	t0 = now_ns();
	for (unsigned k = 0; k < ROUNDS; k++) {
		struct te_request q[PER];
		struct track t;
		te_batch_id b;
		bool ok = true;
		uint64_t roff = (uint64_t)k * PER * MIB;

		sysnode_fill(r.l.p, r.n->guard + roff, PER * MIB, 60 + k);
		for (unsigned op = 0; op < 2 && ok; op++) {
			if (op == 1)
				memset(r.l.p + PER * MIB, 0, PER * MIB);
			for (unsigned i = 0; i < PER; i++)
				q[i] = (struct te_request){ op ? TE_OP_READ : TE_OP_WRITE, r.seg,
							    r.l.p + (size_t)(op * PER + i) * MIB,
							    r.n->buf + roff + (uint64_t)i * MIB,
							    MIB };
			b = track_run(r.e, q, PER, r.timeout_ms, NULL, NULL, &t);
			busy += t.t_all - t.t_submit;
			track_check(&t, op ? "READ under 5% loss" : "WRITE under 5% loss");
			ok = check(t.states[TE_STATE_COMPLETED] == PER,
				   "round %u: %s under 5%% loss: %s", k, op ? "READ" : "WRITE",
				   t.statuses->str);
			batch_free_wait(r.e, b);
			track_clear(&t);
		}
		if (!ok)
			continue;
		sysnode_fill(want, r.n->guard + roff, PER * MIB, 60 + k);
		if (check(memcmp(r.l.p + PER * MIB, want, PER * MIB) == 0,
			  "round %u: the bytes read back under loss differ", k) &&
		    check(node_checksum(r.n, r.n->guard + roff, PER * MIB) ==
				  sysnode_fnv(want, PER * MIB),
			  "round %u: the target does not hold what was written", k)) {
			verified += 2 * PER * MIB;
			served++;
		}
	}
	/* The control plane answers through the loss as well. */
	probe_ok = te_peer_probe(r.e, r.n->segment, 10000) == TE_OK;
	check(probe_ok, "te_peer_probe under 5%% loss: %s", te_last_error());
	nft_clear(env.ns_a);
	nft_clear(env.ns_b);
	check(guards_intact(r.n), "a guard zone of the target changed");
	s1 = target_settle(&r, &s0, 15000);
	fig("bytes_verified=%" PRIu64 " honest_served=%u/%u goodput_MBps=%.1f elapsed_s=%.1f",
	    verified, served + probe_ok, ROUNDS + 1, busy ? verified / (busy / 1e3) : 0.0,
	    (now_ns() - t0) / 1e9);
	fig_samples(&s0, &s1);
	g_free(want);
	rig_down(&r);
}

static void case_partition_heal(void)
{
	enum {
		N = 64,
		BLK = 128u << 10,
		SPAN = N * BLK
	}; /* 8 MiB */
	struct rig r;
	struct te_request q[N];
	struct sample s0, s1;
	struct track t_old, t_new;
	te_batch_id b;
	uint64_t verified = 0;
	unsigned served = 0, tries = 0, completed_old;
	uint8_t *want;
	int64_t t_done;

	rig_up(&r, FAULT_TIMEOUT_MS, 2 * SPAN);
	s0 = target_sample(&r);
	/* Silent partition: every packet from the other side is dropped, both ways. */
	{
		g_autofree char *from_b = g_strdup_printf("ip saddr %s drop", env.addr_b);
		g_autofree char *from_a = g_strdup_printf("ip saddr %s drop", env.addr_a);

		sh_ok("partition a", nft_input(env.ns_a, from_b));
		sh_ok("partition b", nft_input(env.ns_b, from_a));
	}
	sysnode_fill(r.l.p, r.n->guard, SPAN, 71); /* OLD */
	for (uint32_t i = 0; i < N; i++)
		q[i] = (struct te_request){ TE_OP_WRITE, r.seg, r.l.p + (size_t)i * BLK,
					    r.n->buf + (uint64_t)i * BLK, BLK };
	b = track_run(r.e, q, N, r.timeout_ms, NULL, NULL, &t_old);
	track_check(&t_old, "OLD WRITEs across the partition");
	completed_old = t_old.states[TE_STATE_COMPLETED];
	check(completed_old == 0, "%u OLD WRITEs COMPLETED across a silent partition",
	      completed_old);
	batch_free_wait(r.e, b);

	nft_clear(env.ns_a);
	nft_clear(env.ns_b);
	/* Heal; NEW data to the same range completes. */
	sysnode_fill(r.l.p, r.n->guard, SPAN, 72);
	for (tries = 1; tries <= 3; tries++) {
		b = track_run(r.e, q, N, r.timeout_ms, NULL, NULL, &t_new);
		batch_free_wait(r.e, b);
		if (t_new.states[TE_STATE_COMPLETED] == N)
			break;
		note("NEW WRITEs after healing, try %u: %s", tries, t_new.statuses->str);
		if (tries < 3)
			track_clear(&t_new);
	}
	t_done = now_ns();
	track_check(&t_new, "NEW WRITEs after healing");
	check(t_new.states[TE_STATE_COMPLETED] == N && tries == 1,
	      "NEW WRITEs after healing: %s (try %u; expected all COMPLETED at the first)",
	      t_new.statuses->str, MIN(tries, 3u));
	if (t_new.states[TE_STATE_COMPLETED] == N) {
		served++;
		/* Longer than the retransmission backoff that brought the old bytes back. */
		sleep_ms(6000);
		note("checking %.1f s after the NEW WRITEs completed", (now_ns() - t_done) / 1e9);
		stale_check(&r, 72, 71, SPAN, BLK, "partition, heal, NEW over OLD");
		check(target_holds(r.n, r.n->guard + SPAN, TARGET_SIZE - SPAN, 0),
		      "bytes after the written range changed");
		/* And through te: READ back the range. */
		memset(r.l.p + SPAN, 0, SPAN);
		for (uint32_t i = 0; i < N; i++)
			q[i] = (struct te_request){ TE_OP_READ, r.seg,
						    r.l.p + SPAN + (size_t)i * BLK,
						    r.n->buf + (uint64_t)i * BLK, BLK };
		want = r.l.p;
		if (check(run_quiet(r.e, q, N, SLOW_TIMEOUT_MS, "READ back") == TE_OK,
			  "READ back after healing failed") &&
		    check(memcmp(r.l.p + SPAN, want, SPAN) == 0,
			  "the range READ back is not the NEW data")) {
			verified = SPAN;
			served++;
		}
	}
	check(guards_intact(r.n), "a guard zone of the target changed");
	s1 = target_settle(&r, &s0, 30000);
	fig("old_statuses=%s new_statuses=%s "
	    "bytes_verified=%" PRIu64 " honest_served=%u/2",
	    t_old.statuses->str, t_new.statuses->str, verified, served);
	fig_samples(&s0, &s1);
	track_clear(&t_old);
	track_clear(&t_new);
	rig_down(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* raw clients: the control plane (core/rpc.h) and the tcp data port, written independently */

#define RPC_HDR 24u
enum {
	RPC_T_HELLO = 1,
	RPC_T_AUTH = 2,
	RPC_T_AUTH_OK = 3,
	RPC_T_ERROR = 4,
	RPC_T_DESC_FETCH = 16,
	RPC_T_NOTIFY = 20,
	RPC_T_NOTIFY_ACK = 21,
};

static void rpc_put(uint8_t *p, uint8_t type, uint64_t id, uint32_t len)
{
	memcpy(p, "TECP", 4);
	p[4] = 1;
	p[5] = type;
	le_put(p + 6, 0, 2);
	le_put(p + 8, id, 8);
	le_put(p + 16, 0, 4);
	le_put(p + 20, len, 4);
}

/* Connect (5 s at most) from the calling thread's namespace; -1 on failure. */
static int tcp_connect(const char *host, unsigned port, unsigned ms)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct pollfd pfd;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1, err = 0;
	socklen_t el = sizeof(err);

	if (fd < 0)
		return -1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	g_assert_cmpint(inet_pton(AF_INET, host, &sa.sin_addr), ==, 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS)
		goto fail;
	pfd = (struct pollfd){ .fd = fd, .events = POLLOUT };
	if (poll(&pfd, 1, (int)ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 ||
	    err != 0)
		goto fail;
	return fd;
fail:
	close(fd);
	return -1;
}

static bool send_all(int fd, const void *p, size_t n, int64_t deadline)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

		if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };

			if (now_ns() >= deadline)
				return false;
			(void)poll(&pfd, 1, 100);
			continue;
		}
		if (w <= 0)
			return false;
		b += w;
		n -= (size_t)w;
	}
	return true;
}

/* Exactly @n bytes before @deadline: n, 0 on close/reset, -1 on timeout or error. */
static ssize_t recv_all(int fd, void *p, size_t n, int64_t deadline)
{
	uint8_t *b = p;
	size_t got = 0;

	while (got < n) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int64_t left = (deadline - now_ns()) / MS_NS;
		ssize_t r;

		if (left <= 0)
			return -1;
		if (poll(&pfd, 1, (int)MIN(left, 200)) <= 0)
			continue;
		r = recv(fd, b + got, n - got, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 0;
		if (r < 0 && errno != EINTR && errno != EAGAIN)
			return -1;
		if (r > 0)
			got += (size_t)r;
	}
	return (ssize_t)n;
}

/* Everything until the peer closes (true) or @deadline (false); at most 1 MiB kept. */
static bool recv_until_closed(int fd, GByteArray *out, int64_t deadline)
{
	uint8_t buf[4096];

	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int64_t left = (deadline - now_ns()) / MS_NS;
		ssize_t r;

		if (left <= 0)
			return false;
		if (poll(&pfd, 1, (int)MIN(left, 200)) <= 0)
			continue;
		r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			return true;
		if (out->len < MIB)
			g_byte_array_append(out, buf, (guint)r);
	}
}

/* One control frame: header fields and body (g_free). */
static bool rpc_read(int fd, uint8_t *type, int32_t *status, uint8_t **body, uint32_t *len,
		     int64_t deadline)
{
	uint8_t h[RPC_HDR];

	*body = NULL;
	if (recv_all(fd, h, RPC_HDR, deadline) != RPC_HDR || memcmp(h, "TECP", 4) != 0)
		return false;
	*type = h[5];
	*status = (int32_t)(uint32_t)le_get(h + 16, 4);
	*len = (uint32_t)le_get(h + 20, 4);
	if (*len > (1u << 20))
		return false;
	*body = g_malloc0(*len + 1);
	if (*len && recv_all(fd, *body, *len, deadline) != (ssize_t)*len) {
		g_free(*body);
		*body = NULL;
		return false;
	}
	return true;
}

static void hmac(const char *label, const uint8_t *s, const uint8_t *c, uint8_t out[32])
{
	GHmac *h = g_hmac_new(G_CHECKSUM_SHA256, (const guchar *)env.secret, strlen(env.secret));
	gsize n = 32;

	g_hmac_update(h, (const guchar *)label, (gssize)strlen(label));
	g_hmac_update(h, s, 32);
	g_hmac_update(h, c, 32);
	g_hmac_get_digest(h, out, &n);
	g_hmac_unref(h);
}

/* A control-plane session that proved the secret (HELLO, AUTH, AUTH_OK): fd or -1. */
static int ctl_session(const char *host, unsigned port)
{
	int64_t deadline = now_ns() + 10 * S_NS;
	int fd = tcp_connect(host, port, 5000);
	uint8_t type, frame[RPC_HDR + 64], srv_nonce[32], cli[32];
	g_autofree uint8_t *body = NULL;
	uint8_t *b2 = NULL;
	int32_t st;
	uint32_t len;

	if (fd < 0)
		return -1;
	if (!rpc_read(fd, &type, &st, &body, &len, deadline) || type != RPC_T_HELLO || len != 32)
		goto fail;
	memcpy(srv_nonce, body, 32);
	g_assert_cmpint(getrandom(cli, sizeof(cli), 0), ==, (int)sizeof(cli));
	rpc_put(frame, RPC_T_AUTH, 1, 64);
	memcpy(frame + RPC_HDR, cli, 32);
	hmac("te-rpc-v1 client", srv_nonce, cli, frame + RPC_HDR + 32);
	if (!send_all(fd, frame, sizeof(frame), deadline) ||
	    !rpc_read(fd, &type, &st, &b2, &len, deadline) || type != RPC_T_AUTH_OK) {
		g_free(b2);
		goto fail;
	}
	g_free(b2);
	return fd;
fail:
	close(fd);
	return -1;
}

/* tcp data port, wire version 2 (issue 12 b): 32-byte header, HELLO and AUTH. */
#define W_HDR 32u
#define W_MAGIC 0x31504354u
enum {
	W_READ = 0,
	W_WRITE = 1,
	W_HELLO = 2,
	W_AUTH = 3,
};
#define W_NO_DEADLINE 0xffffffffu
#define W_HELLO_BODY 56u
#define W_HELLO_REPLY 72u

static void w_put(uint8_t *p, uint8_t version, uint8_t op, uint32_t id, uint32_t status,
		  uint64_t addr, uint64_t len)
{
	le_put(p, W_MAGIC, 4);
	p[4] = version;
	p[5] = op;
	le_put(p + 6, 0, 2);
	le_put(p + 8, id, 4);
	le_put(p + 12, status, 4);
	le_put(p + 16, addr, 8);
	le_put(p + 24, len, 8);
}

/* A v2 HELLO frame (header + body) for instance @nonce, client with a secret. */
static void w_hello(uint8_t *p, uint64_t nonce)
{
	w_put(p, 2, W_HELLO, 0, 0, nonce, W_HELLO_BODY);
	g_assert_cmpint(getrandom(p + W_HDR, W_HELLO_BODY, 0), ==, (int)W_HELLO_BODY);
	le_put(p + W_HDR + 8, 1, 8);  /* epoch */
	le_put(p + W_HDR + 16, 0, 4); /* lane */
	le_put(p + W_HDR + 20, 1, 4); /* flags: the client has a secret */
}

/* ---------------------------------------------------------------------------------------- */
/* attacks */

/* A thread in namespace c running @fn(@arg). */
struct in_c {
	GThreadFunc fn;
	gpointer arg;
};

static gpointer in_c_main(gpointer data)
{
	struct in_c *c = data;
	gpointer ret;

	enter_ns(env.ns_c);
	ret = c->fn(c->arg);
	g_free(c);
	return ret;
}

static GThread *thread_in_c(const char *name, GThreadFunc fn, gpointer arg)
{
	struct in_c *c = g_new0(struct in_c, 1);

	c->fn = fn;
	c->arg = arg;
	return g_thread_new(name, in_c_main, c);
}

/* A connection that trickles one byte a second until the server closes it. */
enum slow_kind {
	SLOW_DATA,     /* tcp data port: a HELLO frame, never complete */
	SLOW_CTL_PRE,  /* control port: an AUTH frame, before authentication */
	SLOW_CTL_POST, /* control port, authenticated: a request frame */
	SLOW_KINDS,
};

static const char *const slow_names[SLOW_KINDS] = { "data-hello", "control-auth", "control-frame" };
static const unsigned slow_limit_ms[SLOW_KINDS] = {
	TCP_HELLO_TIMEOUT_MS + SERVER_SLACK_MS,
	CTL_AUTH_TIMEOUT_MS + SERVER_SLACK_MS,
	CTL_FRAME_TIMEOUT_MS + SERVER_SLACK_MS,
};

struct slowloris {
	unsigned data_port;
	unsigned count[SLOW_KINDS];
	/* results */
	unsigned opened[SLOW_KINDS], closed_in_time[SLOW_KINDS], never_closed[SLOW_KINDS];
	int64_t worst_ms[SLOW_KINDS];
	gint running;
};

static gpointer slowloris_main(gpointer data)
{
	struct slowloris *s = data;
	struct conn {
		int fd;
		enum slow_kind kind;
		int64_t t0, closed;
		uint8_t frame[W_HDR + W_HELLO_BODY];
		size_t sent, flen;
	};
	GArray *cs = g_array_new(FALSE, TRUE, sizeof(struct conn));
	int64_t t_end, next_tick;
	uint64_t nonce = 0;

	for (int k = 0; k < SLOW_KINDS; k++) {
		for (unsigned i = 0; i < s->count[k]; i++) {
			struct conn c = { .kind = (enum slow_kind)k, .fd = -1 };

			c.fd = k == SLOW_CTL_POST
				       ? ctl_session(env.addr_a, env.port)
				       : tcp_connect(env.addr_a,
						     k == SLOW_DATA ? s->data_port : env.port,
						     5000);
			if (c.fd < 0)
				continue;
			c.t0 = now_ns();
			if (k == SLOW_DATA) {
				w_hello(c.frame, nonce);
				c.flen = W_HDR + W_HELLO_BODY;
			} else if (k == SLOW_CTL_PRE) {
				rpc_put(c.frame, RPC_T_AUTH, 1, 64);
				c.flen = RPC_HDR + 64;
			} else {
				rpc_put(c.frame, RPC_T_DESC_FETCH, 2, 0);
				c.flen = RPC_HDR;
			}
			s->opened[k]++;
			g_array_append_val(cs, c);
		}
	}
	t_end = now_ns();
	for (int k = 0; k < SLOW_KINDS; k++)
		t_end = MAX(t_end, now_ns() + (int64_t)(slow_limit_ms[k] + 2000) * MS_NS);
	next_tick = now_ns();
	for (;;) {
		unsigned open = 0;
		int64_t now = now_ns();
		bool tick = now >= next_tick;

		if (tick)
			next_tick = now + S_NS;
		for (guint i = 0; i < cs->len; i++) {
			struct conn *c = &g_array_index(cs, struct conn, i);
			uint8_t buf[4096];
			ssize_t r;

			if (c->closed)
				continue;
			/* Drain what the server says (HELLO, errors); notice its close. */
			while ((r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
				;
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
				c->closed = now;
				continue;
			}
			if (tick && c->sent < c->flen) {
				if (send(c->fd, c->frame + c->sent, 1,
					 MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
					c->sent++;
				else if (errno != EAGAIN)
					c->closed = now;
			}
			open += !c->closed;
		}
		if (!open || now >= t_end)
			break;
		sleep_ms(50);
	}
	for (guint i = 0; i < cs->len; i++) {
		struct conn *c = &g_array_index(cs, struct conn, i);
		int64_t ms = ((c->closed ? c->closed : now_ns()) - c->t0) / MS_NS;

		s->worst_ms[c->kind] = MAX(s->worst_ms[c->kind], ms);
		if (!c->closed)
			s->never_closed[c->kind]++;
		else if (ms <= slow_limit_ms[c->kind])
			s->closed_in_time[c->kind]++;
		close(c->fd);
	}
	g_array_free(cs, TRUE);
	g_atomic_int_set(&s->running, 0);
	return NULL;
}

/*
 * Honest work while an attack runs: roundtrips on the rig's engine and probes, and once a
 * fresh engine (new control connection, new lanes) that opens the segment and moves data.
 */
struct honest {
	unsigned served, tried;
	uint64_t verified;
	bool fresh_done;
};

static void honest_round(struct rig *r, struct honest *h, unsigned k)
{
	h->tried++;
	h->served += roundtrip(r->e, r->seg, r->n, &r->l, (uint64_t)(k % 8) * MIB + 11, MIB,
			       1000 + k, SLOW_TIMEOUT_MS, &h->verified);
	h->tried++;
	h->served += check(te_peer_probe(r->e, r->n->segment, 10000) == TE_OK,
			   "honest te_peer_probe during the attack: %s", te_last_error());
}

static void honest_fresh(struct rig *r, struct honest *h)
{
	struct te_engine *e = engine_new(env.addr_b, SLOW_TIMEOUT_MS);
	te_segment_id seg = 0;
	struct lbuf l;
	enum te_status st;

	h->tried++;
	h->fresh_done = true;
	st = te_segment_open(e, r->n->segment, &seg);
	if (check(st == TE_OK,
		  "a fresh honest engine could not open the segment during the "
		  "attack: %s: %s",
		  te_status_str(st), te_last_error())) {
		lbuf_new(&l, e, 2 * MIB);
		h->served += roundtrip(e, seg, r->n, &l, 9 * MIB + 5, MIB, 999, SLOW_TIMEOUT_MS,
				       &h->verified);
		(void)lbuf_release(e, &l, 10000);
		if (te_segment_close(e, seg) != TE_OK)
			note("te_segment_close: %s", te_last_error());
	}
	engine_free(e);
}

static void case_slowloris(void)
{
	struct rig r;
	struct slowloris s = { .count = { 24, 24, 8 } };
	struct honest h = { 0 };
	struct sample s0, s1;
	GThread *th;
	unsigned k = 0;
	int64_t t0;

	rig_up_with(&r, SLOW_TIMEOUT_MS, 2 * MIB, true);
	s0 = target_sample(&r);
	s.data_port = r.ep.port;
	g_atomic_int_set(&s.running, 1);
	th = thread_in_c("slowloris", slowloris_main, &s);
	t0 = now_ns();
	while (g_atomic_int_get(&s.running)) {
		honest_round(&r, &h, k++);
		if (!h.fresh_done && now_ns() - t0 > 3 * S_NS)
			honest_fresh(&r, &h);
		sleep_ms(250);
	}
	g_thread_join(th);
	if (!h.fresh_done)
		honest_fresh(&r, &h);
	for (int i = 0; i < SLOW_KINDS; i++) {
		check(s.opened[i] == s.count[i], "slowloris %s: only %u of %u connections opened",
		      slow_names[i], s.opened[i], s.count[i]);
		check(s.closed_in_time[i] == s.opened[i],
		      "slowloris %s: %u of %u trickling connections closed by the server within "
		      "%u ms (%u never closed; slowest %" PRId64 " ms)",
		      slow_names[i], s.closed_in_time[i], s.opened[i], slow_limit_ms[i],
		      s.never_closed[i], s.worst_ms[i]);
		fig_tail("slow_%s_closed=%u/%u slow_%s_worst_ms=%" PRId64, slow_names[i],
			 s.closed_in_time[i], s.opened[i], slow_names[i], s.worst_ms[i]);
	}
	check(h.served == h.tried && h.tried > 0,
	      "honest traffic during the attack: %u of %u operations served", h.served, h.tried);
	check(guards_intact(r.n), "a guard zone of the target changed");
	s1 = target_settle(&r, &s0, 15000);
	fig("bytes_verified=%" PRIu64 " honest_served=%u/%u", h.verified, h.served, h.tried);
	fig_samples(&s0, &s1);
	rig_down(&r);
}

/* Many idle connections from c to both ports. */
struct flood {
	unsigned data_port, want;
	/* results */
	unsigned data_opened, ctl_opened, data_open, ctl_open;
	unsigned ctl_refused, ctl_refused_again; /* closed by the server / with TE_ERR_AGAIN */
	char again_text[160];
	gint phase; /* 0 opening, 1 measured (holding), 2 main is done: close */
};

static gpointer flood_main(gpointer data)
{
	struct flood *f = data;
	int *dfd = g_new(int, f->want), *cfd = g_new(int, f->want);
	bool *cgone = g_new0(bool, f->want), *dgone = g_new0(bool, f->want);
	GByteArray **cin = g_new0(GByteArray *, f->want);
	int64_t end;

	for (unsigned i = 0; i < f->want; i++) {
		dfd[i] = tcp_connect(env.addr_a, f->data_port, 3000);
		cfd[i] = tcp_connect(env.addr_a, env.port, 3000);
		f->data_opened += dfd[i] >= 0;
		f->ctl_opened += cfd[i] >= 0;
		dgone[i] = dfd[i] < 0;
		cgone[i] = cfd[i] < 0;
		cin[i] = g_byte_array_new();
	}
	/* Over-limit connections are closed "at once"; give the server 4 s (< hello timeout). */
	end = now_ns() + 4 * S_NS;
	for (;;) {
		unsigned dopen = 0, copen = 0;

		for (unsigned i = 0; i < f->want; i++) {
			uint8_t buf[4096];
			ssize_t r;

			if (!dgone[i]) {
				while ((r = recv(dfd[i], buf, sizeof(buf), MSG_DONTWAIT)) > 0)
					;
				dgone[i] = r == 0 || (r < 0 && errno != EAGAIN);
			}
			if (!cgone[i]) {
				while ((r = recv(cfd[i], buf, sizeof(buf), MSG_DONTWAIT)) > 0)
					g_byte_array_append(cin[i], buf, (guint)r);
				cgone[i] = r == 0 || (r < 0 && errno != EAGAIN);
			}
			dopen += !dgone[i];
			copen += !cgone[i];
		}
		f->data_open = dopen;
		f->ctl_open = copen;
		if ((dopen <= TCP_MAX_CONNS_PER_HOST && copen <= CTL_MAX_CONNS_PER_HOST) ||
		    now_ns() >= end)
			break;
		sleep_ms(100);
	}
	for (unsigned i = 0; i < f->want; i++) {
		if (cfd[i] < 0 || !cgone[i])
			continue;
		f->ctl_refused++;
		/* Frames before the close: HELLO, then the RPC_ERROR naming the limit. */
		for (guint off = 0; off + RPC_HDR <= cin[i]->len;) {
			const uint8_t *p = cin[i]->data + off;
			uint32_t len = (uint32_t)le_get(p + 20, 4);

			if (off + RPC_HDR + len > cin[i]->len)
				break;
			if (p[5] == RPC_T_ERROR &&
			    (int32_t)(uint32_t)le_get(p + 16, 4) == TE_ERR_AGAIN && len > 0) {
				f->ctl_refused_again++;
				if (!f->again_text[0])
					g_snprintf(f->again_text, sizeof(f->again_text), "%.*s",
						   (int)MIN(len, 150u), (const char *)p + RPC_HDR);
			}
			off += RPC_HDR + len;
		}
	}
	g_atomic_int_set(&f->phase, 1);
	while (g_atomic_int_get(&f->phase) != 2)
		sleep_ms(20);
	for (unsigned i = 0; i < f->want; i++) {
		if (dfd[i] >= 0)
			close(dfd[i]);
		if (cfd[i] >= 0)
			close(cfd[i]);
		g_byte_array_unref(cin[i]);
	}
	g_free(cin);
	g_free(dgone);
	g_free(cgone);
	g_free(dfd);
	g_free(cfd);
	return NULL;
}

static void case_conn_flood(void)
{
	struct rig r;
	struct flood f = { .want = 200 };
	struct honest h = { 0 };
	struct sample s0, s1, peak;
	GThread *th;

	rig_up_with(&r, SLOW_TIMEOUT_MS, 2 * MIB, true);
	s0 = target_sample(&r);
	f.data_port = r.ep.port;
	th = thread_in_c("flood", flood_main, &f);
	while (g_atomic_int_get(&f.phase) == 0)
		sleep_ms(20);
	peak = target_sample(&r);
	/* While c holds whatever the target let it keep: honest work from b. */
	for (unsigned k = 0; k < 3; k++)
		honest_round(&r, &h, k);
	honest_fresh(&r, &h);
	g_atomic_int_set(&f.phase, 2);
	g_thread_join(th);

	note("flood: %u/%u data and %u/%u control connections opened; %u and %u still open; "
	     "%u control refusals, %u with TE_ERR_AGAIN (\"%s\"); target fds %d -> %d",
	     f.data_opened, f.want, f.ctl_opened, f.want, f.data_open, f.ctl_open, f.ctl_refused,
	     f.ctl_refused_again, f.again_text, s0.fds, peak.fds);
	check(f.data_open <= TCP_MAX_CONNS_PER_HOST,
	      "data port: %u connections from one host kept open (max_conns_per_host %u)",
	      f.data_open, TCP_MAX_CONNS_PER_HOST);
	check(f.ctl_open <= CTL_MAX_CONNS_PER_HOST,
	      "control port: %u connections from one host kept open (max_connections_per_host "
	      "%u)",
	      f.ctl_open, CTL_MAX_CONNS_PER_HOST);
	check(f.ctl_refused == f.ctl_refused_again,
	      "control port: %u of %u refused connections got RPC_ERROR TE_ERR_AGAIN with a text",
	      f.ctl_refused_again, f.ctl_refused);
	check(peak.fds <=
		      s0.fds + (int)(TCP_MAX_CONNS_PER_HOST + CTL_MAX_CONNS_PER_HOST) + FD_SLACK,
	      "the target held %d descriptors during the flood, baseline %d + %u per-host limits",
	      peak.fds, s0.fds, TCP_MAX_CONNS_PER_HOST + CTL_MAX_CONNS_PER_HOST);
	check(h.served == h.tried,
	      "honest traffic from another host during the flood: %u of %u operations served",
	      h.served, h.tried);
	check(guards_intact(r.n), "a guard zone of the target changed");
	s1 = target_settle(&r, &s0, 15000);
	fig("flood_conns=%u+%u data_kept=%u ctl_kept=%u ctl_refused_again=%u/%u fds_peak=%d "
	    "bytes_verified=%" PRIu64 " honest_served=%u/%u",
	    f.data_opened, f.ctl_opened, f.data_open, f.ctl_open, f.ctl_refused_again,
	    f.ctl_refused, peak.fds, h.verified, h.served, h.tried);
	fig_samples(&s0, &s1);
	rig_down(&r);
}

/* Notifies from c: raw RPC_NOTIFY frames of @names senders, @per each, on one connection. */
struct nflood {
	unsigned first_name, names, per;
	/* results */
	unsigned *accepted; /* per name */
	unsigned refused, reconnects;
};

static gpointer nflood_main(gpointer data)
{
	struct nflood *f = data;
	const size_t msg_len = TE_NOTIFY_MAX;
	uint8_t *frame = g_malloc(RPC_HDR + 64 + 16 + msg_len);
	int fd = -1;
	uint64_t seq = 0;

	f->accepted = g_new0(unsigned, f->names);
	for (unsigned i = 0; i < f->names * f->per; i++) {
		unsigned k = i % f->names;
		g_autofree char *name = g_strdup_printf("flood-%u", f->first_name + k);
		size_t nl = strlen(name) + 1, body = nl + 16 + msg_len;
		int64_t deadline = now_ns() + 10 * S_NS;
		uint8_t type;
		int32_t st;
		uint8_t *reply = NULL;
		uint32_t len;

		if (fd < 0) {
			if (f->reconnects++ > 100)
				break;
			fd = ctl_session(env.addr_a, env.port);
			if (fd < 0) {
				f->refused++;
				sleep_ms(10);
				continue;
			}
		}
		rpc_put(frame, RPC_T_NOTIFY, i + 1, (uint32_t)body);
		memcpy(frame + RPC_HDR, name, nl);
		le_put(frame + RPC_HDR + nl, 0xf100d, 8); /* generation */
		le_put(frame + RPC_HDR + nl + 8, ++seq, 8);
		memset(frame + RPC_HDR + nl + 16, (int)(i & 0xff), msg_len);
		if (!send_all(fd, frame, RPC_HDR + body, deadline) ||
		    !rpc_read(fd, &type, &st, &reply, &len, deadline)) {
			f->refused++;
			close(fd);
			fd = -1;
			continue;
		}
		if (type == RPC_T_NOTIFY_ACK && st == TE_OK) {
			f->accepted[k]++;
		} else {
			f->refused++;
			if (type == RPC_T_ERROR) {
				close(fd);
				fd = -1;
			}
		}
		g_free(reply);
	}
	if (fd >= 0)
		close(fd);
	g_free(frame);
	return NULL;
}

/* The target's per-sender counts ("senders"): name -> "count sum". */
static GHashTable *target_senders(struct node *n)
{
	GHashTable *t = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

	node_send(n, "senders");
	for (;;) {
		g_autofree char *line = node_line(n, NODE_REPLY_MS);
		char *sp;

		if (!line)
			g_error("te-node did not answer \"senders\"");
		if (g_str_has_prefix(line, "end "))
			break;
		if (!g_str_has_prefix(line, "sender ") || !(sp = strchr(line + 7, ' ')))
			g_error("unexpected line \"%s\" after \"senders\"", line);
		*sp = '\0';
		g_hash_table_insert(t, g_strdup(line + 7), g_strdup(sp + 1));
	}
	return t;
}

static void case_notify_flood(void)
{
	enum {
		HONEST = 64,
		PHASE1 = 2000,
		NAMES = 20,
		PER = 500,
		THREADS = 4
	};
	struct rig r;
	struct nflood one = { .first_name = 0, .names = 1, .per = PHASE1 };
	struct nflood many[THREADS];
	struct sample s0, s1, peak;
	unsigned acc_host = 0, delivered_flood = 0, mismatch = 0, honest_got = 0, refused = 0;
	uint64_t honest_sum = 0, verified = 0;
	g_autoptr(GHashTable) counts = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	GHashTable *got = NULL; /* the target's "senders": name -> "count sum" */
	GThread *th[THREADS];
	int64_t end;

	rig_up_with(&r, SLOW_TIMEOUT_MS, 2 * MIB, true);
	s0 = target_sample(&r);
	/* One sender over its quota, then many names from the same host. */
	g_thread_join(thread_in_c("nflood", nflood_main, &one));
	for (unsigned t = 0; t < THREADS; t++) {
		many[t] = (struct nflood){ .first_name = 1 + t * (NAMES / THREADS),
					   .names = NAMES / THREADS,
					   .per = PER };
		th[t] = thread_in_c("nflood", nflood_main, &many[t]);
	}
	for (unsigned t = 0; t < THREADS; t++)
		g_thread_join(th[t]);
	peak = target_sample(&r);
	acc_host = one.accepted[0];
	refused = one.refused;
	g_hash_table_insert(counts, g_strdup("flood-0"), GUINT_TO_POINTER(one.accepted[0]));
	for (unsigned t = 0; t < THREADS; t++) {
		refused += many[t].refused;
		for (unsigned k = 0; k < many[t].names; k++) {
			acc_host += many[t].accepted[k];
			g_hash_table_insert(counts,
					    g_strdup_printf("flood-%u", many[t].first_name + k),
					    GUINT_TO_POINTER(many[t].accepted[k]));
		}
	}
	note("notify flood: sender flood-0 %u of %u accepted; all flood senders %u of %u "
	     "accepted, %u refused; target RSS %ld -> %ld KiB",
	     one.accepted[0], PHASE1, acc_host, PHASE1 + NAMES * PER, refused, s0.rss_kb,
	     peak.rss_kb);

	/* An honest sender on another host: every notify arrives, exactly once. */
	for (unsigned i = 0; i < HONEST; i++) {
		struct te_request q = { TE_OP_WRITE, r.seg, r.l.p, r.n->buf + (uint64_t)i * 4096,
					4096 };
		uint8_t msg[64];
		te_batch_id b;
		enum te_status st;

		for (size_t k = 0; k < sizeof(msg); k++)
			msg[k] = (uint8_t)(i * 31 + k * 7 + 1);
		honest_sum += sysnode_fnv(msg, sizeof(msg));
		if (te_batch_new(r.e, 1, &b) != TE_OK)
			g_error("te_batch_new: %s", te_last_error());
		st = te_batch_submit_notify(r.e, b, &q, 1, msg, sizeof(msg));
		if (st == TE_OK)
			st = te_batch_wait(r.e, b, 30 * S_NS);
		check(st == TE_OK, "honest notify batch %u: %s: %s", i, te_status_str(st),
		      te_last_error());
		if (st == TE_INPROGRESS)
			if (te_batch_cancel(r.e, b) != TE_OK)
				note("te_batch_cancel: %s", te_last_error());
		batch_free_wait(r.e, b);
		verified += st == TE_OK ? 4096 : 0;
	}
	/* te-node's counts are cumulative: poll until the honest sender's are all in. */
	end = now_ns() + 20 * S_NS;
	for (;;) {
		const char *v;

		if (got)
			g_hash_table_destroy(got);
		got = target_senders(r.n);
		v = g_hash_table_lookup(got, te_engine_name(r.e));
		if ((v && strtoul(v, NULL, 10) >= HONEST) || now_ns() >= end)
			break;
		sleep_ms(200);
	}
	{
		GHashTableIter it;
		gpointer key, val;

		g_hash_table_iter_init(&it, got);
		while (g_hash_table_iter_next(&it, &key, &val)) {
			unsigned c = (unsigned)strtoul(val, NULL, 10);

			if (strcmp(key, te_engine_name(r.e)) == 0) {
				honest_got = c;
				honest_sum -= strtoull(strchr(val, ' ') + 1, NULL, 16);
			} else if (!g_hash_table_contains(counts, key) ||
				   GPOINTER_TO_UINT(g_hash_table_lookup(counts, key)) != c) {
				mismatch++;
				delivered_flood += c;
			} else {
				delivered_flood += c;
			}
		}
		/* A flood sender with accepted messages that never arrived. */
		g_hash_table_iter_init(&it, counts);
		while (g_hash_table_iter_next(&it, &key, &val))
			mismatch += GPOINTER_TO_UINT(val) && !g_hash_table_contains(got, key);
	}
	check(one.accepted[0] <= NOTIFY_PER_SENDER,
	      "one sender had %u of %u notifies accepted while nobody drained the inbox "
	      "(notify_per_sender %u)",
	      one.accepted[0], PHASE1, NOTIFY_PER_SENDER);
	check(acc_host <= NOTIFY_PER_HOST,
	      "one host had %u notifies accepted while nobody drained the inbox (notify_per_host "
	      "%u)",
	      acc_host, NOTIFY_PER_HOST);
	check(mismatch == 0,
	      "%u flood senders: the target delivered a different number of messages than it "
	      "acknowledged",
	      mismatch);
	check(honest_got == HONEST && honest_sum == 0,
	      "honest sender: %u of %u notifies received%s", honest_got, HONEST,
	      honest_sum ? " (contents differ)" : "");
	check(peak.rss_kb <= s0.rss_kb + (long)(48u << 10) + rss_slack_kb(),
	      "the target's RSS grew from %ld to %ld KiB under the notify flood (bound: one host's "
	      "quota of %u messages, 48 MiB, + %ld KiB of sanitizer quarantine)",
	      s0.rss_kb, peak.rss_kb, NOTIFY_PER_HOST, rss_slack_kb());
	s1 = target_settle(&r, &s0, 15000);
	fig("flood_sent=%u flood_accepted=%u flood_refused=%u one_sender_accepted=%u/%u "
	    "flood_delivered=%u rss_kb_peak=%ld bytes_verified=%" PRIu64 " honest_served=%u/%u",
	    PHASE1 + NAMES * PER, acc_host, refused, one.accepted[0], PHASE1, delivered_flood,
	    peak.rss_kb, verified, honest_got, HONEST);
	fig_samples(&s0, &s1);
	g_hash_table_destroy(got);
	g_free(one.accepted);
	for (unsigned t = 0; t < THREADS; t++)
		g_free(many[t].accepted);
	rig_down(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* unauthenticated access to the data port */

/* One probe: connect, send @pre (answer read: @pre_reply bytes), send @post, read to close. */
struct probe {
	const char *what;
	bool closed;
	GByteArray *pre_reply; /* the HELLO answer, if @pre was a HELLO */
	GByteArray *rest;      /* everything after it until the close */
};

static void probe_run(struct endpoint *ep, struct probe *p, const uint8_t *pre, size_t pre_len,
		      const uint8_t *post, size_t post_len)
{
	int64_t deadline = now_ns() + 15 * S_NS;
	int fd = tcp_connect(ep->host, ep->port, 5000);

	p->pre_reply = g_byte_array_new();
	p->rest = g_byte_array_new();
	if (fd < 0)
		g_error("%s: cannot connect to %s:%u", p->what, ep->host, ep->port);
	if (pre_len) {
		uint8_t h[W_HDR];

		(void)send_all(fd, pre, pre_len, deadline);
		if (recv_all(fd, h, W_HDR, deadline) == W_HDR) {
			uint64_t len = le_get(h + 24, 8);

			g_byte_array_append(p->pre_reply, h, W_HDR);
			if (len <= 4096) {
				uint8_t *b = g_malloc(len + 1);

				if (len && recv_all(fd, b, len, deadline) == (ssize_t)len)
					g_byte_array_append(p->pre_reply, b, (guint)len);
				g_free(b);
			}
		}
	}
	if (post_len)
		(void)send_all(fd, post, post_len, deadline);
	p->closed = recv_until_closed(fd, p->rest, deadline);
	close(fd);
}

static void probe_free(struct probe *p)
{
	g_byte_array_unref(p->pre_reply);
	g_byte_array_unref(p->rest);
}

/*
 * The generic refusal: exactly one v2 frame with status TE_ERR_AUTH and text @text, then the
 * close. Returns whether it was.
 */
static bool refusal_ok(const struct probe *p, const GByteArray *bytes, const char *text)
{
	const uint8_t *d = bytes->data;
	uint64_t len;
	int32_t st;

	if (!check(p->closed, "%s: the server did not close the connection within 15 s", p->what))
		return false;
	if (!check(bytes->len >= W_HDR, "%s: no refusal frame before the close (%u bytes)", p->what,
		   bytes->len))
		return false;
	st = (int32_t)(uint32_t)le_get(d + 12, 4);
	len = le_get(d + 24, 8);
	return check(le_get(d, 4) == W_MAGIC && d[4] == 2 && st == TE_ERR_AUTH,
		     "%s: the answer is not a v2 frame with status TE_ERR_AUTH (magic %08" PRIx64
		     ", version %u, status %d)",
		     p->what, le_get(d, 4), d[4], st) &&
	       check(bytes->len == W_HDR + len && len == strlen(text) &&
			     memcmp(d + W_HDR, text, len) == 0,
		     "%s: expected exactly one refusal \"%s\", got %u bytes (\"%.*s\")", p->what,
		     text, bytes->len, (int)MIN(len, 100u),
		     bytes->len > W_HDR ? (const char *)d + W_HDR : "");
}

/* No frame in @bytes carries status 0 with the @len bytes asked for: no data leaked. */
static bool no_data(const struct probe *p, const GByteArray *bytes, uint64_t len)
{
	for (guint off = 0; off + W_HDR <= bytes->len;) {
		const uint8_t *h = bytes->data + off;
		uint64_t l = le_get(h + 24, 8);

		if (le_get(h + 12, 4) == 0 && l == len && h[5] == W_READ)
			return check(false,
				     "%s: the server answered a READ of %" PRIu64
				     " bytes with data, unauthenticated",
				     p->what, len);
		if (l > MIB)
			break;
		off += W_HDR + (guint)l;
	}
	return true;
}

static void case_unauth(void)
{
	struct rig r;
	struct sample s0, s1;
	uint64_t before, after, reg, unreg, v = 0;
	uint8_t hello[W_HDR + W_HELLO_BODY], rd_reg[W_HDR], rd_unreg[W_HDR], rd_far[W_HDR];
	uint8_t *wr = g_malloc(W_HDR + 4096), auth[W_HDR + 32], v1[2 * W_HDR + 4096];
	struct probe p[10] = {
		{ .what = "READ before HELLO (registered address)" },
		{ .what = "READ before HELLO (unregistered address)" },
		{ .what = "READ before HELLO (address 0x1000)" },
		{ .what = "HELLO with instance nonce 0" },
		{ .what = "HELLO + AUTH with a garbage MAC" },
		{ .what = "HELLO + READ without AUTH (registered)" },
		{ .what = "HELLO + READ without AUTH (unregistered)" },
		{ .what = "HELLO + WRITE without AUTH" },
		{ .what = "WRITE before HELLO" },
		{ .what = "version 1 HELLO + READ" },
	};
	unsigned ok = 0, total = G_N_ELEMENTS(p);
	bool served;

	rig_up(&r, SLOW_TIMEOUT_MS, 2 * MIB);
	s0 = target_sample(&r);
	before = node_checksum(r.n, 0, r.n->total);
	reg = r.n->buf + 4096;
	unreg = r.n->base + 64; /* the guard before the buffer */
	w_put(rd_reg, 2, W_READ, 7, W_NO_DEADLINE, reg, 4096);
	w_put(rd_unreg, 2, W_READ, 7, W_NO_DEADLINE, unreg, 4096);
	w_put(rd_far, 2, W_READ, 7, W_NO_DEADLINE, 0x1000, 4096);
	w_put(wr, 2, W_WRITE, 8, W_NO_DEADLINE, reg, 4096);
	memset(wr + W_HDR, 0xa5, 4096);
	w_put(auth, 2, W_AUTH, 0, 0, 0, 32);
	memset(auth + W_HDR, 0x5a, 32);

	probe_run(&r.ep, &p[0], NULL, 0, rd_reg, W_HDR);
	probe_run(&r.ep, &p[1], NULL, 0, rd_unreg, W_HDR);
	probe_run(&r.ep, &p[2], NULL, 0, rd_far, W_HDR);
	w_hello(hello, 0);
	probe_run(&r.ep, &p[3], NULL, 0, hello, sizeof(hello));
	w_hello(hello, r.ep.nonce);
	probe_run(&r.ep, &p[4], hello, sizeof(hello), auth, sizeof(auth));
	w_hello(hello, r.ep.nonce);
	probe_run(&r.ep, &p[5], hello, sizeof(hello), rd_reg, W_HDR);
	w_hello(hello, r.ep.nonce);
	probe_run(&r.ep, &p[6], hello, sizeof(hello), rd_unreg, W_HDR);
	w_hello(hello, r.ep.nonce);
	probe_run(&r.ep, &p[7], hello, sizeof(hello), wr, W_HDR + 4096);
	probe_run(&r.ep, &p[8], NULL, 0, wr, W_HDR + 4096);
	/* A version-1 client (no authentication in that protocol) must get nothing either. */
	w_put(v1, 1, W_HELLO, 0, 0, r.ep.nonce, 0);
	w_put(v1 + W_HDR, 1, W_READ, 9, 0, reg, 4096);
	probe_run(&r.ep, &p[9], NULL, 0, v1, 2 * W_HDR);

	/* Before authentication: the generic refusal, and the close. */
	ok += refusal_ok(&p[0], p[0].rest, "tcp: not authenticated");
	ok += check(p[0].rest->len == p[1].rest->len && p[0].rest->len == p[2].rest->len &&
			    memcmp(p[0].rest->data, p[1].rest->data, p[0].rest->len) == 0 &&
			    memcmp(p[0].rest->data, p[2].rest->data, p[0].rest->len) == 0,
		    "READs before HELLO of a registered and of unregistered addresses got "
		    "different answers (%u, %u, %u bytes): an oracle",
		    p[0].rest->len, p[1].rest->len, p[2].rest->len);
	ok += refusal_ok(&p[2], p[2].rest, "tcp: not authenticated");
	/*
	 * A HELLO naming another instance: refused as "restarted" (an honest client with a
	 * stale descriptor learns to fetch it again), without giving the instance nonce away.
	 */
	{
		const uint8_t *d = p[3].rest->data;

		ok += check(
			p[3].closed && p[3].rest->len >= W_HDR &&
				(int32_t)(uint32_t)le_get(d + 12, 4) == TE_ERR_PEER_RESTARTED &&
				le_get(d + 16, 8) == 0 &&
				p[3].rest->len == W_HDR + le_get(d + 24, 8) &&
				!memmem(d, p[3].rest->len, &r.ep.nonce, sizeof(r.ep.nonce)),
			"%s: expected one TE_ERR_PEER_RESTARTED frame without the instance nonce, "
			"then the close (%u bytes, closed %d)",
			p[3].what, p[3].rest->len, p[3].closed);
	}
	/* A good HELLO is answered (auth required), then AUTH with a wrong MAC is refused. */
	ok += check(p[4].pre_reply->len == W_HDR + W_HELLO_REPLY &&
			    le_get(p[4].pre_reply->data + 12, 4) == 0 &&
			    (le_get(p[4].pre_reply->data + W_HDR, 4) & 1),
		    "HELLO to an engine with a secret: expected status 0 and a 72-byte body with "
		    "the auth-required flag, got %u bytes",
		    p[4].pre_reply->len) &&
	      refusal_ok(&p[4], p[4].rest, "tcp: authentication failed");
	ok += refusal_ok(&p[5], p[5].rest, "tcp: not authenticated");
	ok += check(p[5].rest->len == p[6].rest->len &&
			    memcmp(p[5].rest->data, p[6].rest->data, p[5].rest->len) == 0,
		    "READs after HELLO (no AUTH) of a registered and an unregistered address got "
		    "different answers (%u and %u bytes): an oracle",
		    p[5].rest->len, p[6].rest->len);
	ok += refusal_ok(&p[7], p[7].rest, "tcp: not authenticated");
	ok += refusal_ok(&p[8], p[8].rest, "tcp: not authenticated");
	ok += check(p[9].closed, "%s: the server did not close the connection", p[9].what) &&
	      no_data(&p[9], p[9].rest, 4096);
	for (unsigned i = 0; i < total; i++)
		no_data(&p[i], p[i].rest, 4096);
	after = node_checksum(r.n, 0, r.n->total);
	check(after == before, "the target's memory changed during the unauthenticated probes");

	/* An engine that has the secret is served. */
	served = roundtrip(r.e, r.seg, r.n, &r.l, 5 * MIB + 3, MIB, 88, SLOW_TIMEOUT_MS, &v);
	check(served, "the authenticated initiator was not served after the probes");
	s1 = target_settle(&r, &s0, 15000);
	fig("probe_checks_passed=%u/%u memory_unchanged=%s bytes_verified=%" PRIu64
	    " honest_served=%u/1",
	    ok, total, after == before ? "yes" : "no", v, served);
	fig_samples(&s0, &s1);
	for (unsigned i = 0; i < total; i++)
		probe_free(&p[i]);
	g_free(wr);
	rig_down(&r);
}

/* ---------------------------------------------------------------------------------------- */

static const struct {
	const char *name;
	void (*fn)(void);
} cases[] = {
	{ "sigkill", case_sigkill },
	{ "sigstop", case_sigstop },
	{ "restart", case_restart },
	{ "link-down", case_link_down },
	{ "loss", case_loss },
	{ "partition-heal", case_partition_heal },
	{ "slowloris", case_slowloris },
	{ "conn-flood", case_conn_flood },
	{ "notify-flood", case_notify_flood },
	{ "unauth", case_unauth },
};

static const char *need(const char *var)
{
	const char *v = g_getenv(var);

	if (!v || !*v) {
		fprintf(stderr, "fault_test: %s is not set: run me through fault_test.sh\n", var);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	const char *name = argc == 2 ? argv[1] : NULL;
	void (*fn)(void) = NULL;

	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, BUFSIZ);
	for (size_t i = 0; name && i < G_N_ELEMENTS(cases); i++)
		if (strcmp(cases[i].name, name) == 0)
			fn = cases[i].fn;
	if (!fn) {
		fprintf(stderr, "usage: fault_test.sh FAULT_TEST TE_NODE CASE; cases:");
		for (size_t i = 0; i < G_N_ELEMENTS(cases); i++)
			fprintf(stderr, " %s", cases[i].name);
		fprintf(stderr, "\n");
		return 2;
	}
	env.ns_a = need("FAULT_NS_A");
	env.ns_b = need("FAULT_NS_B");
	env.ns_c = need("FAULT_NS_C");
	env.addr_a = need("FAULT_ADDR_A");
	env.addr_b = need("FAULT_ADDR_B");
	env.addr_c = need("FAULT_ADDR_C");
	env.dev_b = need("FAULT_DEV_B");
	env.secret = need("FAULT_SECRET");
	env.port = (unsigned)parse_u64(need("FAULT_PORT"), 10);
	node_path = g_strdup(need("TE_NODE"));
	env.ip = g_find_program_in_path("ip");
	if (!env.ip)
		g_error("no ip command");
	figure = g_string_new(NULL);
	figure_tail = g_string_new(NULL);

	signal(SIGALRM, watchdog_fired);
	alarm(CASE_LIMIT_S);
	fn();
	alarm(0);
	printf("figure: case=%s tasks=%u terminal_within_deadline+1s=%u/%u%s%s\n", name, all_tasks,
	       all_within, all_tasks, figure->str, figure_tail->str);
	if (failures) {
		printf("RESULT: %s: %u assertion(s) failed\n", name, failures);
		return 1;
	}
	printf("RESULT: %s: pass\n", name);
	return 0;
}
