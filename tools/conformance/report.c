/* SPDX-License-Identifier: Apache-2.0 */
/* report.c: te-conformance's result lines, summary and hang guard. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conformance.h"

static struct {
	const struct conf *c;
	unsigned passed, failed, skipped;
	GMutex lock; /* lines, counts and the hang guard */
	GCond cond;
	GThread *watchdog;
	char check[128];  /* what the hang guard watches ("" none) */
	gint64 deadline;  /* monotonic us */
	unsigned seconds; /* of the watch */
	void (*on_hang)(void);
	int forward_fd; /* the runner process: results also go to the parent (-1: none) */
} rep = { .forward_fd = -1 };

/* Records of the runner to its parent: tag, then a NUL-terminated name. */
enum {
	REC_RESULT_OK = 'o',
	REC_RESULT_FAIL = 'f',
	REC_RESULT_SKIP = 's',
	REC_WATCH = 'w'
};

static void forward(char tag, const char *name)
{
	char buf[160];
	size_t n;

	if (rep.forward_fd < 0)
		return;
	n = (size_t)g_snprintf(buf, sizeof(buf), "%c%s", tag, name);
	n = MIN(n, sizeof(buf) - 1) + 1; /* with the NUL */
	for (size_t off = 0; off < n;) {
		ssize_t w = write(rep.forward_fd, buf + off, n - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		off += (size_t)w;
	}
}

static gpointer watchdog_main(gpointer unused)
{
	(void)unused;
	g_mutex_lock(&rep.lock);
	for (;;) {
		if (!rep.check[0]) {
			g_cond_wait(&rep.cond, &rep.lock);
			continue;
		}
		if (g_get_monotonic_time() < rep.deadline) {
			g_cond_wait_until(&rep.cond, &rep.lock, rep.deadline);
			continue;
		}
		/* Hung: say so, clean up the helpers, leave (the engines cannot be freed). */
		printf("FAIL - %s: no result after %u s (a hang: a transfer, wait or engine call "
		       "never returned)\n",
		       rep.check, rep.seconds);
		rep.failed++;
		fflush(stdout);
		forward(REC_RESULT_FAIL, rep.check);
		if (rep.forward_fd < 0)
			printf("%u skipped\n%u passed, %u failed\n", rep.skipped, rep.passed,
			       rep.failed);
		fflush(stdout);
		if (rep.on_hang)
			rep.on_hang();
		_exit(1);
	}
	return NULL;
}

void report_init(const struct conf *c)
{
	rep.c = c;
	setvbuf(stdout, NULL, _IOLBF, 0);
}

static bool match_any(char **patterns, const char *name)
{
	for (char **p = patterns; p && *p; p++)
		if (g_pattern_match_simple(*p, name))
			return true;
	return false;
}

bool report_selected(const char *name)
{
	return !rep.c->only || match_any(rep.c->only, name);
}

bool report_wanted(const char *name)
{
	if (rep.c->only && !match_any(rep.c->only, name))
		return false;
	if (match_any(rep.c->skip, name)) {
		report_skip(name, "skipped by --skip");
		return false;
	}
	return true;
}

void report(enum report_kind kind, const char *name, const char *fmt, ...)
{
	static const char *const word[] = { "ok", "FAIL", "skip" };
	g_autofree char *text = NULL;
	va_list ap;

	/* --only hides the others; --skip turns a result into a skip. */
	if (rep.c->only && !match_any(rep.c->only, name))
		return;
	if (kind != REPORT_SKIP && match_any(rep.c->skip, name)) {
		kind = REPORT_SKIP;
		text = g_strdup("skipped by --skip");
	} else {
		va_start(ap, fmt);
		text = g_strdup_vprintf(fmt, ap);
		va_end(ap);
	}
	/* One line each: a detail with a newline (an error text) must not break the format. */
	for (char *p = text; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	g_mutex_lock(&rep.lock);
	if (kind == REPORT_OK) {
		rep.passed++;
		printf("ok - %s%s%s\n", name, *text ? " " : "", text);
	} else {
		if (kind == REPORT_FAIL)
			rep.failed++;
		else
			rep.skipped++;
		printf("%s - %s%s%s\n", word[kind], name, *text ? ": " : "", text);
	}
	fflush(stdout);
	forward(kind == REPORT_OK     ? REC_RESULT_OK
		: kind == REPORT_FAIL ? REC_RESULT_FAIL
				      : REC_RESULT_SKIP,
		name);
	g_mutex_unlock(&rep.lock);
}

void report_note(const char *fmt, ...)
{
	va_list ap;

	if (!rep.c || !rep.c->verbose)
		return;
	va_start(ap, fmt);
	fputs("# ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

unsigned report_failures(void)
{
	unsigned n;

	g_mutex_lock(&rep.lock);
	n = rep.failed;
	g_mutex_unlock(&rep.lock);
	return n;
}

int report_summary(void)
{
	g_mutex_lock(&rep.lock);
	printf("%u skipped\n%u passed, %u failed\n", rep.skipped, rep.passed, rep.failed);
	fflush(stdout);
	g_mutex_unlock(&rep.lock);
	return rep.failed ? 1 : 0;
}

void report_on_hang(void (*fn)(void))
{
	rep.on_hang = fn;
}

void report_watch(const char *check, unsigned seconds)
{
	g_mutex_lock(&rep.lock);
	if (!rep.watchdog)
		rep.watchdog = g_thread_new("te-conf-watch", watchdog_main, NULL);
	g_strlcpy(rep.check, check, sizeof(rep.check));
	rep.seconds = seconds;
	rep.deadline = g_get_monotonic_time() + (gint64)seconds * G_USEC_PER_SEC;
	g_cond_signal(&rep.cond);
	forward(REC_WATCH, check);
	g_mutex_unlock(&rep.lock);
}

void report_unwatch(void)
{
	g_mutex_lock(&rep.lock);
	rep.check[0] = '\0';
	g_cond_signal(&rep.cond);
	forward(REC_WATCH, "");
	g_mutex_unlock(&rep.lock);
}

static const char *signal_word(int sig)
{
	switch (sig) {
	case SIGSEGV:
		return "SIGSEGV";
	case SIGBUS:
		return "SIGBUS";
	case SIGABRT:
		return "SIGABRT";
	case SIGFPE:
		return "SIGFPE";
	case SIGILL:
		return "SIGILL";
	case SIGKILL:
		return "SIGKILL";
	default:
		return NULL;
	}
}

void report_in_child(void (*fn)(void *), void *arg, const char *what)
{
	g_autofree char *current = NULL;
	GString *got = g_string_new(NULL);
	unsigned failed = 0;
	int fds[2], status = 0;
	size_t off = 0;
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	if (pipe(fds) != 0 || (pid = fork()) < 0) {
		report_fail(what, "cannot start the process that runs the checks: %s",
			    g_strerror(errno));
		g_string_free(got, TRUE);
		return;
	}
	if (pid == 0) {
		static const int crash[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };

		/* A crash is reported by the signal (a sanitizer's handler would exit instead). */
		for (size_t i = 0; i < G_N_ELEMENTS(crash); i++)
			signal(crash[i], SIG_DFL);
		close(fds[0]);
		rep.forward_fd = fds[1];
		fn(arg);
		fflush(stdout);
		exit(0); /* not _exit: leak checkers run at exit */
	}
	close(fds[1]);
	for (;;) {
		char chunk[4096];
		ssize_t r = read(fds[0], chunk, sizeof(chunk));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		g_string_append_len(got, chunk, r);
		/* Count what the runner printed; remember the check it is in. */
		for (char *nul; (nul = memchr(got->str + off, '\0', got->len - off));
		     off = (size_t)(nul - got->str) + 1) {
			const char *rec = got->str + off;

			if (rec[0] == REC_WATCH) {
				g_free(current);
				current = rec[1] ? g_strdup(rec + 1) : NULL;
			} else if (rec[0] == REC_RESULT_OK) {
				rep.passed++;
			} else if (rec[0] == REC_RESULT_FAIL) {
				rep.failed++;
				failed++;
			} else if (rec[0] == REC_RESULT_SKIP) {
				rep.skipped++;
			}
		}
	}
	close(fds[0]);
	g_string_free(got, TRUE);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(status)) {
		const char *sig = signal_word(WTERMSIG(status));
		g_autofree char *num = g_strdup_printf("signal %d", WTERMSIG(status));

		report_fail(
			current ? current : what,
			"te-conformance's initiator process crashed with %s during this check "
			"(in the plugin or the engine: run it under a debugger with --only); the "
			"checks after it did not run",
			sig ? sig : num);
	} else if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && !failed)) {
		report_fail(current ? current : what,
			    "the initiator process exited with status %d after its checks (a "
			    "sanitizer's report on stderr says why)",
			    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	}
}
