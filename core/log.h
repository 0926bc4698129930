/* SPDX-License-Identifier: Apache-2.0 */
/* log.h: the engine's log sink and the thread-local "last error" detail. */
#ifndef TE_CORE_LOG_H
#define TE_CORE_LOG_H

#include <stdarg.h>
#include <stdatomic.h>

#include <te/te.h>

struct log_sink {
	te_log_fn fn; /* NULL: stderr */
	void *user;
	_Atomic int level;
	const char *prefix; /* engine name, for multi-engine processes */
};

/* Log one line through @sink (NULL sink: stderr at WARN). */
void log_msg(const struct log_sink *sink, enum te_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void log_vmsg(const struct log_sink *sink, enum te_log_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));

static inline int log_enabled(const struct log_sink *sink, enum te_log_level level)
{
	/* Relaxed: the threshold is advisory; a stale read only mis-filters one line. */
	return (int)level <=
	       (sink ? atomic_load_explicit(&sink->level, memory_order_relaxed) : TE_LOG_WARN);
}

/* Set this thread's te_last_error() text; returns @status for tail calls. */
enum te_status log_error(enum te_status status, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Clear this thread's te_last_error(). */
void log_clear_error(void);

#endif /* TE_CORE_LOG_H */
