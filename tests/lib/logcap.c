/* SPDX-License-Identifier: Apache-2.0 */
/* logcap.c: a te_log_fn that keeps every line, for tests that check what was logged. */
#include "logcap.h"

#include <string.h>

static const char *const tags[] = { "[error] ", "[warn] ", "[info] ", "[debug] ", "[trace] " };

const char *logcap_tag(enum te_log_level level)
{
	return (unsigned)level < G_N_ELEMENTS(tags) ? tags[level] : "[?] ";
}

void logcap_init(struct logcap *c)
{
	g_mutex_init(&c->lock);
	g_cond_init(&c->cond);
	c->lines = g_ptr_array_new_with_free_func(g_free);
}

void logcap_clear(struct logcap *c)
{
	g_ptr_array_unref(c->lines);
	c->lines = NULL;
	g_cond_clear(&c->cond);
	g_mutex_clear(&c->lock);
}

void logcap_fn(void *user, enum te_log_level level, const char *msg)
{
	struct logcap *c = user;

	g_mutex_lock(&c->lock);
	g_ptr_array_add(c->lines, g_strconcat(logcap_tag(level), msg, NULL));
	g_cond_broadcast(&c->cond);
	g_mutex_unlock(&c->lock);
	if (g_test_verbose() || g_getenv("TE_TEST_VERBOSE"))
		g_printerr("# log: %s%s\n", logcap_tag(level), msg);
}

static unsigned count_locked(struct logcap *c, const char *prefix, const char *a, const char *b)
{
	unsigned n = 0;

	for (guint i = 0; i < c->lines->len; i++) {
		const char *line = c->lines->pdata[i];

		if (prefix && !g_str_has_prefix(line, prefix))
			continue;
		if (strstr(line, a) && (!b || strstr(line, b)))
			n++;
	}
	return n;
}

unsigned logcap_count(struct logcap *c, const char *a, const char *b)
{
	unsigned n;

	g_mutex_lock(&c->lock);
	n = count_locked(c, NULL, a, b);
	g_mutex_unlock(&c->lock);
	return n;
}

unsigned logcap_count_at(struct logcap *c, enum te_log_level level, const char *needle)
{
	unsigned n;

	g_mutex_lock(&c->lock);
	n = count_locked(c, logcap_tag(level), needle, NULL);
	g_mutex_unlock(&c->lock);
	return n;
}

bool logcap_has(struct logcap *c, const char *needle)
{
	return logcap_count(c, needle, NULL) > 0;
}

bool logcap_wait(struct logcap *c, unsigned n, const char *a, const char *b)
{
	gint64 end = g_get_monotonic_time() + LOGCAP_WAIT_MS * G_TIME_SPAN_MILLISECOND;
	bool found;

	g_mutex_lock(&c->lock);
	while (count_locked(c, NULL, a, b) < n)
		if (!g_cond_wait_until(&c->cond, &c->lock, end))
			break;
	found = count_locked(c, NULL, a, b) >= n;
	g_mutex_unlock(&c->lock);
	if (!found)
		g_printerr("# no log line with '%s' '%s'\n", a, b ? b : "");
	return found;
}

char *logcap_text(struct logcap *c)
{
	GString *s = g_string_new(NULL);

	g_mutex_lock(&c->lock);
	for (guint i = 0; i < c->lines->len; i++)
		g_string_append_printf(s, "%s\n", (const char *)c->lines->pdata[i]);
	g_mutex_unlock(&c->lock);
	return g_string_free(s, FALSE);
}

void loggate_init(struct loggate *g, const char *a, const char *b)
{
	memset(g, 0, sizeof(*g));
	logcap_init(&g->log);
	g->a = a;
	g->b = b;
	g_mutex_init(&g->lock);
	g_cond_init(&g->cond);
}

void loggate_clear(struct loggate *g)
{
	logcap_clear(&g->log);
	g_cond_clear(&g->cond);
	g_mutex_clear(&g->lock);
}

void loggate_fn(void *user, enum te_log_level level, const char *msg)
{
	struct loggate *g = user;

	logcap_fn(&g->log, level, msg);
	if (!strstr(msg, g->a) || (g->b && !strstr(msg, g->b)))
		return;
	g_mutex_lock(&g->lock);
	if (!g->entered) {
		g_atomic_int_set(&g->entered, 1);
		g_cond_broadcast(&g->cond);
		while (!g->released)
			g_cond_wait(&g->cond, &g->lock);
		g->left = true;
	}
	g_mutex_unlock(&g->lock);
}

bool loggate_entered(struct loggate *g)
{
	return g_atomic_int_get(&g->entered) != 0;
}

bool loggate_wait(struct loggate *g, unsigned ms)
{
	gint64 until = g_get_monotonic_time() + (gint64)ms * 1000;
	bool in;

	g_mutex_lock(&g->lock);
	while (!g->entered && g_cond_wait_until(&g->cond, &g->lock, until))
		;
	in = g->entered != 0;
	g_mutex_unlock(&g->lock);
	return in;
}

void loggate_release(struct loggate *g)
{
	g_mutex_lock(&g->lock);
	g->released = true;
	g_cond_broadcast(&g->cond);
	g_mutex_unlock(&g->lock);
}

bool loggate_left(struct loggate *g)
{
	bool left;

	g_mutex_lock(&g->lock);
	left = g->left;
	g_mutex_unlock(&g->lock);
	return left;
}
