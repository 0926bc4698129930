/* SPDX-License-Identifier: Apache-2.0 */
/* log.c: log sink dispatch and the thread-local last-error detail. */
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "core/log.h"

static _Thread_local char last_error[1024];

static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };

void log_vmsg(const struct log_sink *sink, enum te_log_level level, const char *fmt, va_list ap)
{
	char line[1024];

	if (!log_enabled(sink, level))
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (sink && sink->fn) {
		sink->fn(sink->user, level, line);
		return;
	}
	fprintf(stderr, "te[%s]%s%s: %s\n", level_names[level], sink && sink->prefix ? " " : "",
		sink && sink->prefix ? sink->prefix : "", line);
}

void log_msg(const struct log_sink *sink, enum te_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vmsg(sink, level, fmt, ap);
	va_end(ap);
}

enum te_status log_error(enum te_status status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return status;
}

void log_clear_error(void)
{
	last_error[0] = '\0';
}

const char *te_last_error(void)
{
	return last_error;
}

void te_free(void *ptr)
{
	g_free(ptr);
}
