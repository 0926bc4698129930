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

#endif /* TE_TESTS_LIB_LOGCAP_H */
