/* SPDX-License-Identifier: Apache-2.0 */
/* target.c: te-conformance's target process (an engine serving a guarded region) and its driver. */

/*
 * te-conformance --target --yaml FILE --location LOC [--verbose]
 *
 * Creates an engine from FILE, allocates CONF_GUARD + CONF_REGION + CONF_GUARD bytes at LOC
 * (te_mem_alloc), fills the guards with PATTERN_GUARD and the region with pattern 1, registers
 * the region (remote read and write) and prints
 *
 *   segment <name>
 *   base 0x<addr> <bytes>      the whole allocation
 *   region 0x<addr> <bytes>    the registered part
 *   ready
 *
 * then answers one line per command read from stdin. Offsets count from base (so guards are
 * addressable) and pattern bytes are indexed by that offset:
 *
 *   fill OFF LEN SEED          ok
 *   check OFF LEN SEED         ok | bad <why>       every byte is pattern SEED
 *   either OFF LEN A B         ok | bad <why>       every byte is pattern A or pattern B
 *   sum OFF LEN                sum <16 hex digits>  (FNV-1a 64)
 *   reregister                 ok | error <why>     te_mem_unregister, te_mem_register again
 *   quit                       exits 0 (so does the end of stdin)
 *
 * Errors are "error <why>"; a failed start prints "error <why>" and exits 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conformance.h"

#define TARGET_TOTAL ((uint64_t)CONF_GUARD * 2 + CONF_REGION)

static bool target_verbose;

static void target_log(void *user, enum te_log_level level, const char *msg)
{
	(void)user;
	if (target_verbose)
		fprintf(stderr, "# target %d: %s: %s\n", (int)getpid(),
			level <= TE_LOG_ERROR  ? "error"
			: level == TE_LOG_WARN ? "warn"
					       : "info",
			msg);
}

static void say(const char *fmt, ...) G_GNUC_PRINTF(1, 2);
static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static bool num(const char *s, uint64_t *out)
{
	return s && g_ascii_string_to_unsigned(s, 10, 0, UINT64_MAX, out, NULL);
}

static void serve(struct membuf *b, struct te_engine *e, const char *location)
{
	char line[512];

	while (fgets(line, sizeof(line), stdin)) {
		g_auto(GStrv) w = g_strsplit_set(g_strstrip(line), " ", 0);
		uint64_t off = 0, len = 0, a = 0, b2 = 0;
		struct membuf_diff d = { 0 };
		char err[256];
		guint n = g_strv_length(w);

		if (n == 0 || !*w[0])
			continue;
		if (strcmp(w[0], "quit") == 0)
			return;
		if (strcmp(w[0], "reregister") == 0) {
			enum te_status st = te_mem_unregister(e, b->base + CONF_GUARD);

			if (st == TE_OK)
				st = te_mem_register(e, b->base + CONF_GUARD, CONF_REGION, location,
						     TE_MEM_REMOTE);
			if (st == TE_OK)
				say("ok");
			else
				say("error %s: %s", te_status_str(st), te_last_error());
			continue;
		}
		if (n < 3 || !num(w[1], &off) || !num(w[2], &len) || (n > 3 && !num(w[3], &a)) ||
		    (n > 4 && !num(w[4], &b2))) {
			say("error malformed command");
			continue;
		}
		if (strcmp(w[0], "fill") == 0 && n == 4) {
			if (membuf_fill(b, off, len, a, err, sizeof(err)))
				say("ok");
			else
				say("error %s", err);
		} else if ((strcmp(w[0], "check") == 0 && n == 4) ||
			   (strcmp(w[0], "either") == 0 && n == 5)) {
			enum membuf_bad r = membuf_check(b, off, len, a, b2, n == 5, &d);

			if (r == MEMBUF_OK)
				say("ok");
			else
				say("bad %s", d.why);
		} else if (strcmp(w[0], "sum") == 0 && n == 3) {
			uint64_t h = 0;

			if (membuf_sum(b, off, len, &h, err, sizeof(err)))
				say("sum %016" PRIx64, h);
			else
				say("error %s", err);
		} else {
			say("error unknown command '%s'", w[0]);
		}
	}
}

int target_main(int argc, char **argv)
{
	const char *yaml_path = NULL, *location = "cpu";
	struct te_engine_opts o = { .size = sizeof(o), .log_fn = target_log, .log_level = -1 };
	g_autofree char *yaml = NULL;
	g_autoptr(GError) gerr = NULL;
	struct te_engine *e = NULL;
	struct membuf b;
	uint8_t *base = NULL;
	char err[256];
	enum te_status st;
	gsize len = 0;

	/* A target never outlives the te-conformance process that drives it (a hang, a crash). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		return 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--yaml") == 0 && i + 1 < argc)
			yaml_path = argv[++i];
		else if (strcmp(argv[i], "--location") == 0 && i + 1 < argc)
			location = argv[++i];
		else if (strcmp(argv[i], "--verbose") == 0)
			target_verbose = true;
	}
	if (!yaml_path || !g_file_get_contents(yaml_path, &yaml, &len, &gerr)) {
		say("error target: no --yaml file: %s", gerr ? gerr->message : "missing");
		return 1;
	}
	o.config_yaml = yaml;
	o.config_yaml_len = len;
	o.config_name = yaml_path;
	st = te_engine_new(&o, &e);
	if (st != TE_OK) {
		say("error te_engine_new: %s: %s", te_status_str(st), te_last_error());
		return 1;
	}
	st = te_mem_alloc(e, location, TARGET_TOTAL, (void **)&base);
	if (st != TE_OK) {
		say("error te_mem_alloc(%s, %" PRIu64 "): %s: %s", location, TARGET_TOTAL,
		    te_status_str(st), te_last_error());
		te_engine_free(e);
		return 1;
	}
	if (!membuf_init(&b, e, base, TARGET_TOTAL, 0, strncmp(location, "cpu", 3) != 0, err,
			 sizeof(err)) ||
	    !membuf_fill(&b, 0, CONF_GUARD, PATTERN_GUARD, err, sizeof(err)) ||
	    !membuf_fill(&b, CONF_GUARD + CONF_REGION, CONF_GUARD, PATTERN_GUARD, err,
			 sizeof(err)) ||
	    !membuf_fill(&b, CONF_GUARD, CONF_REGION, 1, err, sizeof(err))) {
		say("error %s", err);
		te_engine_free(e);
		return 1;
	}
	st = te_mem_register(e, base + CONF_GUARD, CONF_REGION, location, TE_MEM_REMOTE);
	if (st != TE_OK) {
		say("error te_mem_register(%s): %s: %s", location, te_status_str(st),
		    te_last_error());
		te_engine_free(e);
		return 1;
	}
	say("segment %s", te_engine_name(e));
	say("base 0x%" PRIxPTR " %" PRIu64, (uintptr_t)base, TARGET_TOTAL);
	say("region 0x%" PRIxPTR " %u", (uintptr_t)(base + CONF_GUARD), CONF_REGION);
	say("ready");
	serve(&b, e, location);
	membuf_release(&b);
	te_engine_free(e);
	return 0;
}

/* --- the driver, in te-conformance's main process ------------------------------------------ */

/* One line from the target into t->reply; false at the end of its output. */
static bool read_line(struct target *t)
{
	for (;;) {
		char *nl = memchr(t->rbuf->str, '\n', t->rbuf->len);
		char chunk[4096];
		ssize_t r;

		if (nl) {
			size_t n = (size_t)(nl - t->rbuf->str);

			g_snprintf(t->reply, sizeof(t->reply), "%.*s", (int)n, t->rbuf->str);
			g_string_erase(t->rbuf, 0, (gssize)n + 1);
			return true;
		}
		r = read(t->from_fd, chunk, sizeof(chunk));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			g_snprintf(t->reply, sizeof(t->reply), "error the target process ended");
			t->dead = true;
			return false;
		}
		g_string_append_len(t->rbuf, chunk, r);
	}
}

static void target_free(struct target *t)
{
	if (t->to_fd >= 0)
		close(t->to_fd);
	if (t->from_fd >= 0)
		close(t->from_fd);
	g_string_free(t->rbuf, TRUE);
	g_free(t->segment);
	g_free(t);
}

struct target *target_start(const struct conf *c, char *err, size_t cap)
{
	static unsigned serial;
	struct target *t = g_new0(struct target, 1);
	g_autofree char *transfer = g_strdup("timeout_ms: 30000");
	g_autofree char *yaml = options_yaml(c->opts, c->name, c->plugin, transfer);
	g_autofree char *path = g_strdup_printf("%s/target-%u.yaml", c->tmpdir, ++serial);
	g_autoptr(GError) gerr = NULL;
	const char *argv[] = { c->self,
			       "--target",
			       "--yaml",
			       path,
			       "--location",
			       c->location,
			       c->verbose ? "--verbose" : NULL,
			       NULL };

	t->to_fd = t->from_fd = -1;
	t->rbuf = g_string_new(NULL);
	if (!g_file_set_contents(path, yaml, -1, &gerr) ||
	    !g_spawn_async_with_pipes(NULL, (char **)argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD, NULL,
				      NULL, &t->pid, &t->to_fd, &t->from_fd, NULL, &gerr)) {
		g_snprintf(err, cap, "cannot start the target process: %s", gerr->message);
		target_free(t);
		return NULL;
	}
	while (read_line(t)) {
		uint64_t a = 0, n = 0;

		if (g_str_has_prefix(t->reply, "segment ")) {
			t->segment = g_strdup(t->reply + 8);
		} else if (sscanf(t->reply, "base 0x%" SCNx64 " %" SCNu64, &a, &n) == 2) {
			t->base = a;
		} else if (sscanf(t->reply, "region 0x%" SCNx64 " %" SCNu64, &a, &n) == 2) {
			t->region = a;
			t->len = n;
		} else if (strcmp(t->reply, "ready") == 0) {
			if (t->segment && t->region)
				return t;
			break;
		} else if (g_str_has_prefix(t->reply, "error")) {
			break;
		}
	}
	g_snprintf(err, cap, "target process: %s", t->reply);
	target_kill(t);
	target_free(t);
	return NULL;
}

bool target_cmd(struct target *t, const char *fmt, ...)
{
	g_autofree char *line = NULL;
	size_t off = 0, n;
	va_list ap;

	if (t->dead) {
		g_snprintf(t->reply, sizeof(t->reply), "error the target process is gone");
		return false;
	}
	va_start(ap, fmt);
	line = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	n = strlen(line);
	line[n] = '\n';
	while (off <= n) {
		ssize_t w = write(t->to_fd, line + off, n + 1 - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			g_snprintf(t->reply, sizeof(t->reply), "error the target process is gone");
			t->dead = true;
			return false;
		}
		off += (size_t)w;
	}
	if (!read_line(t))
		return false;
	return g_str_has_prefix(t->reply, "ok") || g_str_has_prefix(t->reply, "sum ");
}

void target_kill(struct target *t)
{
	int status;

	if (!t || !t->pid)
		return;
	kill(t->pid, SIGKILL);
	while (waitpid(t->pid, &status, 0) < 0 && errno == EINTR)
		;
	g_spawn_close_pid(t->pid);
	t->pid = 0;
	t->dead = true;
}

void target_stop(struct target *t)
{
	if (!t)
		return;
	if (t->pid && !t->dead) {
		int status;

		(void)!write(t->to_fd, "quit\n", 5);
		close(t->to_fd);
		t->to_fd = -1;
		/* A target stuck in te_engine_free is killed after 20 s. */
		for (int i = 0; i < 2000; i++) {
			pid_t r = waitpid(t->pid, &status, WNOHANG);

			if (r == t->pid || (r < 0 && errno != EINTR)) {
				g_spawn_close_pid(t->pid);
				t->pid = 0;
				break;
			}
			g_usleep(10000);
		}
	}
	target_kill(t);
	target_free(t);
}
