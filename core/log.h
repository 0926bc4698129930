/* SPDX-License-Identifier: Apache-2.0 */
/* log.h: the engine's log sink and the thread-local "last error" detail. */
#ifndef TE_CORE_LOG_H
#define TE_CORE_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include <te/te.h>

struct log_sink {
	te_log_fn fn; /* NULL: file */
	void *user;
	_Atomic int level;
	const char *prefix; /* engine name, for multi-engine processes */
	FILE *file;	    /* $TE_LOG_FILE opened for this engine, or NULL: stderr */
};

/*
 * The environment's say on logging, read at engine start: $TE_LOG_LEVEL (error, warn, info,
 * debug, trace or 0..4; *level_out -1 when unset) and $TE_LOG_FILE (lines appended there
 * instead of stderr; *file_out NULL when unset). TE_ERR_CONFIG with *err_out (g_free) naming
 * the variable for a bad level or a file that cannot be opened.
 */
enum te_status log_from_env(int *level_out, FILE **file_out, char **err_out);

/* Parse a level name (error, warn, warning, info, debug, trace) or digit 0..4; -1 if neither. */
int log_level_parse(const char *s);

/*
 * Log one line through @sink (NULL sink: stderr at WARN, or $TE_LOG_LEVEL). Without a callback
 * a line reads "<UTC time, us> te[<level>] <thread id> <engine>: <text>".
 */
void log_msg(const struct log_sink *sink, enum te_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void log_vmsg(const struct log_sink *sink, enum te_log_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));

static inline int log_enabled(const struct log_sink *sink, enum te_log_level level)
{
	/* Relaxed: the threshold is advisory; a stale read only mis-filters one line. */
	extern int log_null_level;

	return (int)level <=
	       (sink ? atomic_load_explicit(&sink->level, memory_order_relaxed) : log_null_level);
}

/* Set this thread's te_last_error() text; returns @status for tail calls. */
enum te_status log_error(enum te_status status, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Clear this thread's te_last_error(). */
void log_clear_error(void);

#endif /* TE_CORE_LOG_H */
