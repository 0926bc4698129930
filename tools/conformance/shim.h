/* SPDX-License-Identifier: Apache-2.0 */
/* shim.h: what te-conformance and its interposing shim plugin share (one process, one module). */
#ifndef TE_CONFORMANCE_SHIM_H
#define TE_CONFORMANCE_SHIM_H

#include <stdbool.h>
#include <stdint.h>

/*
 * The shim (te-conformance-shim.so) is a plugin that wraps another one: te-conformance dlopens
 * it, names the real module with set_plugin, and gives engines its path under the real
 * plugin's name. Its entry point returns a copy of the real descriptor whose ops are wrappers
 * (present exactly where the real plugin has them), and the real plugin gets a copy of the
 * host table whose services are wrappers too. The wrappers check the plugin's side of the
 * contract (the rules below), count what happens, and inject faults when asked (modes). The
 * core loads the module RTLD_NODELETE; te-conformance's own dlopen of the same file gives the
 * same instance, so the two share this API's state.
 */

#define CONF_SHIM_API_VERSION 1u
#define CONF_SHIM_API_SYMBOL "te_conformance_shim_api"
#define CONF_SHIM_TEXT 256

/* Contract rules the shim checks; te-conformance prints one line for each. */
enum conf_rule {
	CONF_RULE_DONE_ONCE = 0, /* slice_done exactly once per accepted attempt */
	CONF_RULE_ACCEPTED,	 /* accepted_out <= n, no report for a slice not accepted */
	CONF_RULE_FIELDS,	 /* read-only slice fields left as they were */
	CONF_RULE_OK_BYTES,	 /* TE_OK reports the slice's length */
	CONF_RULE_EXCLUDED,	 /* an attempt never completes on a device it was told to avoid */
	CONF_RULE_CANCEL_NOT_FOUND, /* cancel of a slice already handed back: TE_ERR_NOT_FOUND */
	CONF_RULE_FINI_CANCELED,    /* fini hands back every slice it owns, TE_ERR_CANCELED */
	CONF_RULE_HOST_ARGS,	    /* host services called with this instance's own handles */
	CONF_RULE_PROGRESS,	    /* progress returns at most its budget */
	CONF_RULE_COUNT,
};

/* inject_every hits a slice's attempts 0 .. this - 1 only (te.yaml retries: 6 here). */
#define CONF_SHIM_INJECT_ATTEMPTS 3u

/* Fault injection and test modes; all off when zeroed. */
struct conf_shim_modes {
	/*
	 * Every Nth successful completion is reported to the core as TE_ERR_TRANSIENT (0: off);
	 * a slice's attempts from CONF_SHIM_INJECT_ATTEMPTS on are spared, so injection alone
	 * never exhausts its retries.
	 */
	uint32_t inject_every;
	/* cancel answers TE_OK without reaching the plugin (it keeps the slice). */
	bool ignore_cancel;
	/* progress answers 0 without reaching the plugin. */
	bool freeze_progress;
	/* cancel waits up to this long for the slice to complete first (a finished-slice race). */
	uint32_t cancel_delay_us;
	/* At the next successful completion: host->mark_failed(DEVICE, its device) (one shot). */
	bool mark_device_next;
	/* At the next successful completion: host->peer_event(its peer, DOWN) (one shot). */
	bool peer_down_next;
	/* The next slice of opcode forge_opcode reaches the plugin with remote + forge_delta. */
	int64_t forge_delta;
	uint32_t forge_opcode;
};

/* Counters since the module was loaded (they only grow), and the first violation of each rule. */
struct conf_shim_stats {
	uint64_t inits, finis;
	uint64_t submits, offered, accepted, zero_accepts;
	uint64_t completions, ok_completions, injected;
	uint64_t retry_prepares, retry_prepares_excluding, retry_no_device;
	uint64_t excluded_completions; /* successful attempts told to avoid some device */
	uint64_t cancels, cancels_after_done;
	uint64_t marks, peer_downs;
	uint64_t owned_now, owned_max;
	uint64_t fini_owned, fini_reported, fini_canceled, fini_ok;
	/* The last forged slice: whether the plugin reported it, with what. */
	uint64_t forged;
	bool forged_done;
	int32_t forged_status;
	char forged_detail[CONF_SHIM_TEXT];
	uint32_t n_devices; /* of the last instance started */
	uint64_t rule_count[CONF_RULE_COUNT];
	char rule_first[CONF_RULE_COUNT][CONF_SHIM_TEXT];
};

struct conf_shim_api {
	uint32_t size;
	uint32_t version; /* CONF_SHIM_API_VERSION */
	/* The module to wrap; 0, or -1 with why in @err. Call before any engine loads the shim. */
	int (*set_plugin)(const char *path, char *err, size_t cap);
	void (*set_modes)(const struct conf_shim_modes *modes);
	void (*stats)(struct conf_shim_stats *out);
};

typedef const struct conf_shim_api *(*conf_shim_api_fn)(void);

#endif /* TE_CONFORMANCE_SHIM_H */
