/* SPDX-License-Identifier: Apache-2.0 */
/* logcap.h: a te_log_fn that keeps every line, for tests that check what was logged. */
#ifndef TE_TESTS_LIB_LOGCAP_H
#define TE_TESTS_LIB_LOGCAP_H

#include <stdbool.h>

#include <glib.h>

#include <te/te.h>

/*
 * Lines are kept as "[<level>] <message>" ("[warn] ..."), so that a test can look for a
 * level and a text together. Thread-safe: engines log from their own threads.
 */
struct logcap {
	GMutex lock;
	GCond cond;
	GPtrArray *lines; /* g_free */
};

void logcap_init(struct logcap *c);
void logcap_clear(struct logcap *c);

/*
 * The te_log_fn: @user is the struct logcap. With g_test_verbose() or $TE_TEST_VERBOSE set,
 * every line is echoed on stderr as well.
 */
void logcap_fn(void *user, enum te_log_level level, const char *msg);

/* "[error] ", "[warn] ", "[info] ", "[debug] ", "[trace] ": the prefix of @level's lines. */
const char *logcap_tag(enum te_log_level level);

/* How many lines contain @a (and @b, when not NULL). */
unsigned logcap_count(struct logcap *c, const char *a, const char *b);
/* How many lines of @level contain @needle. */
unsigned logcap_count_at(struct logcap *c, enum te_log_level level, const char *needle);
/* Whether a line contains @needle. */
bool logcap_has(struct logcap *c, const char *needle);
/* How long logcap_wait waits; none of the lines waited for is expected to come near it. */
#define LOGCAP_WAIT_MS 30000

/* Wait until at least @n lines contain @a (and @b); false, saying so, after LOGCAP_WAIT_MS. */
bool logcap_wait(struct logcap *c, unsigned n, const char *a, const char *b);
/* Every line so far, each ending in '\n' (g_free). */
char *logcap_text(struct logcap *c);

/*
 * A logcap that holds the first line containing @a (and @b, when not NULL) inside the log
 * call until loggate_release: the thread logging it stays where it is (inside a host call of
 * a plugin, say) while the test does something else.
 */
struct loggate {
	struct logcap log;
	const char *a, *b;
	GMutex lock;
	GCond cond;
	gint entered; /* the line came; its thread is held */
	bool released, left;
};

void loggate_init(struct loggate *g, const char *a, const char *b);
void loggate_clear(struct loggate *g);
/* The te_log_fn: @user is the struct loggate. */
void loggate_fn(void *user, enum te_log_level level, const char *msg);
/* Whether the held line came (it may have come before). */
bool loggate_entered(struct loggate *g);
/* Wait up to @ms for the line; whether it came. */
bool loggate_wait(struct loggate *g, unsigned ms);
/* Let the held thread go. */
void loggate_release(struct loggate *g);
/* Whether the held thread went on (its log call returned, or is about to). */
bool loggate_left(struct loggate *g);

#endif /* TE_TESTS_LIB_LOGCAP_H */
