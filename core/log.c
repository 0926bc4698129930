/* SPDX-License-Identifier: Apache-2.0 */
/* log.c: log sink dispatch and the thread-local last-error detail. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <glib.h>

#include "core/log.h"

static _Thread_local char last_error[1024];

static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };

/*
 * Threshold of lines logged with no engine (NULL sink): WARN, or $TE_LOG_LEVEL read once by
 * log_null_init. Written once before any reader that matters; a plain int is enough.
 */
int log_null_level = TE_LOG_WARN;

__attribute__((constructor)) static void log_null_init(void)
{
	int level = log_level_parse(g_getenv("TE_LOG_LEVEL"));

	if (level >= 0)
		log_null_level = level;
}

int log_level_parse(const char *s)
{
	if (!s || !*s)
		return -1;
	if (s[0] >= '0' && s[0] <= '4' && !s[1])
		return s[0] - '0';
	for (int i = 0; i < (int)G_N_ELEMENTS(level_names); i++)
		if (strcasecmp(s, level_names[i]) == 0)
			return i;
	if (strcasecmp(s, "warning") == 0)
		return TE_LOG_WARN;
	return -1;
}

enum te_status log_from_env(int *level_out, FILE **file_out, char **err_out)
{
	const char *lv = g_getenv("TE_LOG_LEVEL");
	const char *path = g_getenv("TE_LOG_FILE");
	FILE *f = NULL;
	int level = -1;

	if (lv && *lv) {
		level = log_level_parse(lv);
		if (level < 0) {
			*err_out = g_strdup_printf("TE_LOG_LEVEL: '%s' is not one of error, warn, "
						   "info, debug, trace (or 0..4)",
						   lv);
			return TE_ERR_CONFIG;
		}
	}
	if (path && *path) {
		f = fopen(path, "ae");
		if (!f) {
			*err_out =
				g_strdup_printf("TE_LOG_FILE: cannot open '%s' for appending: %s",
						path, g_strerror(errno));
			return TE_ERR_CONFIG;
		}
		setvbuf(f, NULL, _IOLBF, 0);
	}
	*level_out = level;
	*file_out = f;
	return TE_OK;
}

void log_vmsg(const struct log_sink *sink, enum te_log_level level, const char *fmt, va_list ap)
{
	char line[1024], stamp[40];
	struct timespec ts;
	struct tm tm;

	if (!log_enabled(sink, level))
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (sink && sink->fn) {
		sink->fn(sink->user, level, line);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	/* One fprintf per line: stdio locks the stream, so lines of threads never mix. */
	fprintf(sink && sink->file ? sink->file : stderr, "%s.%06ldZ te[%s] %ld%s%s: %s\n", stamp,
		ts.tv_nsec / 1000, level_names[level], (long)gettid(),
		sink && sink->prefix ? " " : "", sink && sink->prefix ? sink->prefix : "", line);
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
