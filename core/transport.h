/* SPDX-License-Identifier: Apache-2.0 */
/* transport.h: one initialised plugin instance inside an engine, and the host services. */
#ifndef TE_CORE_TRANSPORT_H
#define TE_CORE_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>

#include <glib.h>

#include "core/config.h"
#include "core/plugin.h"

#define TRANSPORT_MAX_DEVICES 64
#define TRANSPORT_MAX_PRIV 256

struct engine;
struct slice;

struct transport {
	struct engine *engine; /* NULL when probed by tools */
	struct plugin *plugin;
	const struct config_transport *cfg; /* NULL: no options */
	unsigned index;			    /* position in the engine's priority list */
	struct te_plugin_inst *inst;
	struct te_plugin_caps caps;
	struct te_plugin_device devices[TRANSPORT_MAX_DEVICES];
	uint32_t n_devices;
	/* "<device> (staged)": what a task moved through host bounce buffers reports. */
	char staged_names[TRANSPORT_MAX_DEVICES][96];
	/* Published transport blob (descriptor "transports" section). */
	GMutex blob_lock;
	GBytes *blob;
	/* SERIALIZED plugins: every data-path call under this lock. */
	bool serialized;
	GMutex call_lock;
	/* Quarantine: absolute now_ns until which device d is paused (0: usable). */
	_Atomic uint64_t dev_paused_until[TRANSPORT_MAX_DEVICES];
	_Atomic uint32_t dev_failures[TRANSPORT_MAX_DEVICES];
	_Atomic uint64_t any_paused_until; /* max of dev_paused_until (fast path) */
	/* Slices refused by back-pressure, resubmitted by the engine worker. */
	GMutex backlog_lock;
	struct slice *backlog_head;
	struct slice *backlog_tail;
	_Atomic uint32_t backlog_len;
	/* Set before fini: the core makes no further calls into the plugin. */
	_Atomic bool stopped;
	/* Last error/warning line the plugin logged (quoted in init failures). */
	char last_log[256];
	/* Slices handed to the plugin and not yet returned (for manual progress). */
	_Atomic int64_t in_flight;
	/* Bounce buffers for local memory it cannot reach itself (core/stage.c), made lazily. */
	GMutex stage_lock;
	struct stage_pool *stage;
};

/*
 * transport_start - init the plugin with its YAML options, query caps and devices.
 * @engine may be NULL (te-info probing): logs then go to stderr.
 * On failure *err_out (g_free) names the plugin file and the reason.
 */
enum te_status transport_start(struct engine *engine, struct plugin *plugin,
			       const struct config_transport *cfg, unsigned index,
			       struct transport **transport_out, char **err_out);

/* fini the plugin instance and free; NULL is a no-op. */
void transport_stop(struct transport *t);

/* Free a transport whose plugin instance was already fini'd. */
void transport_free(struct transport *t);

/* Copy of the published blob (or NULL); caller g_bytes_unref. */
GBytes *transport_blob(struct transport *t);

/* Quarantine device @dev until @until_ns (UINT64_MAX: until an UP event). */
void transport_pause_device(struct transport *tp, uint32_t dev, uint64_t until_ns);

/* Per-thread "why the last op failed" that plugins give through host->set_error. */
void transport_clear_error(void);
const char *transport_error(struct transport *tp);
/* What the last plugin op on this thread said with set_error ("" if nothing). */
const char *transport_op_error(void);

/* The host services table handed to every plugin. */
extern const struct te_plugin_host transport_host;

#endif /* TE_CORE_TRANSPORT_H */
