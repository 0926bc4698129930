/* SPDX-License-Identifier: Apache-2.0 */
/* logcap_core.h: a logcap behind the core's struct log_sink, for tests linked with core_dep. */
#ifndef TE_TESTS_LIB_LOGCAP_CORE_H
#define TE_TESTS_LIB_LOGCAP_CORE_H

#include <stdatomic.h>
#include <string.h>

#include "core/log.h"
#include "logcap.h"

struct logcap_sink {
	struct logcap cap;
	struct log_sink sink; /* hand &sink to the module under test; it logs at debug */
};

static inline void logcap_sink_init(struct logcap_sink *s)
{
	logcap_init(&s->cap);
	memset(&s->sink, 0, sizeof(s->sink));
	s->sink.fn = logcap_fn;
	s->sink.user = &s->cap;
	atomic_init(&s->sink.level, TE_LOG_DEBUG);
}

static inline void logcap_sink_clear(struct logcap_sink *s)
{
	logcap_clear(&s->cap);
}

static inline struct logcap_sink *logcap_sink_new(void)
{
	struct logcap_sink *s = g_new0(struct logcap_sink, 1);

	logcap_sink_init(s);
	return s;
}

static inline void logcap_sink_free(struct logcap_sink *s)
{
	logcap_sink_clear(s);
	g_free(s);
}

#endif /* TE_TESTS_LIB_LOGCAP_CORE_H */
