/* SPDX-License-Identifier: Apache-2.0 */
/* fake.h: a fake transport in the test process, to drive the core modules from below. */
#ifndef TE_TESTS_CORE_FAKE_H
#define TE_TESTS_CORE_FAKE_H

#include <stdatomic.h>
#include <stdbool.h>

#include <te/te.h>
#include <te/te_plugin.h>

#include "core/engine.h"
#include "core/plugin.h"
#include "core/transport.h"

#define FAKE_MAX_HELD 1024
#define FAKE_PRIV_SIZE 16u /* priv bytes checked: the loopback plugin's slice_priv_size */

/* What the fake does and saw. One at a time per test process (the ops find it here). */
struct fake {
	/* Behaviour. */
	uint32_t accept_max;	   /* submit accepts at most this many per call (UINT32_MAX) */
	uint32_t refuse_calls;	   /* the first N submit calls accept nothing (back-pressure) */
	uint64_t refuse_until_ns;  /* and all calls before (ns of g_get_monotonic_time) */
	enum te_status fail_first; /* first attempt of each slice ends with this (TE_OK: no) */
	bool hold;		   /* keep slices (complete with fake_complete_held) */
	bool cancel_hands_back;	   /* cancel reports the slice TE_ERR_CANCELED at once */
	uint32_t caps_flags;	   /* query_caps sets caps.flags to this */
	/* Observations. */
	_Atomic uint32_t submit_calls, submitted, cancels, retry_prepares, overlaps;
	_Atomic uint32_t refused_calls; /* submit calls that accepted nothing */
	_Atomic uint32_t max_n;		/* the most slices one submit call was handed */
	_Atomic uint32_t dirty_priv;	/* first attempts with priv not zeroed, retries without
					 * the fake's mark */
	_Atomic uint32_t in_call;	/* ops running now (a serialized plugin must see <= 1) */
	GMutex lock;
	struct te_plugin_slice *held[FAKE_MAX_HELD];
	uint32_t n_held;
	struct transport *tp; /* the transport the overrides act for */
};

extern struct fake fake;

/* Reset the fake's state (behaviour: accept everything, complete at once). */
void fake_reset(void);

/* Make @tp's ops (a loaded plugin's core-owned copy) the fake's data-path ops. */
void fake_take_over(struct transport *tp);

/* A stand-alone transport on the fake plugin (no engine); fake_transport_free it. */
struct transport *fake_transport_new(enum te_plugin_thread_level level, uint32_t n_devices);
/* The same, but returns transport_start's status and error (*tp_out NULL unless TE_OK). */
enum te_status fake_transport_try(enum te_plugin_thread_level level, uint32_t n_devices,
				  struct transport **tp_out, char **err_out);
/* transport_stop, and free the plugin record fake_transport_new made (no dlopen handle). */
void fake_transport_free(struct transport *tp);

/* Report every held slice with @status (bytes: full length on TE_OK). */
void fake_complete_held(enum te_status status);

/* The engine behind a public handle (tests reach the modules directly). */
static inline struct engine *fake_engine(struct te_engine *te)
{
	return (struct engine *)te;
}

#endif /* TE_TESTS_CORE_FAKE_H */
