/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metadata.h: where segment descriptors are stored and found (p2p, etcd, redis, http).
 * A layer below segment.c, beside control.c (it calls neither): it reaches the engine's
 * own descriptor through engine->describe_local and reports changes to the callback it is
 * given.
 */
#ifndef TE_CORE_METADATA_METADATA_H
#define TE_CORE_METADATA_METADATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

#include "core/log.h"

struct descriptor;
struct engine;
struct metadata;

/*
 * What a store backend is opened with (from the engine's `metadata:` section). Strings stay
 * valid until close. Every key the backend reads or writes is metadata_key(prefix, name):
 * "<namespace>/segments/<name>"; it watches the prefix "<namespace>/segments/".
 */
struct metadata_params {
	const char *const *endpoints; /* tried in order; failover to the next on error */
	size_t n_endpoints;
	const char *ns;	      /* namespace, no trailing '/' (e.g. "/te/prod") */
	uint32_t ttl_s;	      /* publication TTL (lease, PX, republish period) */
	const char *username; /* NULL: none */
	const char *password; /* NULL: none (read from metadata.password_file) */
	const char *ca_file;  /* https: CA bundle; NULL: the system's */
	uint32_t timeout_ms;  /* one request's limit (connect + transfer) */
	const struct log_sink *log;
	struct engine *engine; /* p2p only: the engine whose control plane fetches */
};

/*
 * Changes seen under the namespace: @json (not NUL-terminated) is the new value of segment
 * @name, or NULL when its key was deleted or expired. @resync: a delete the watch inferred
 * (the key was missing when it compared the store with what it had seen, after it lost the
 * store for a while), not one the store reported: a store that lost its data and came back
 * empty looks the same, and the key's owner writes it again within its refresh period.
 * Called from the backend's own thread, never with a backend lock held; the callee may call
 * get/publish.
 */
typedef void (*metadata_watch_fn)(void *user, const char *name, const char *json, size_t len,
				  bool resync);

/*
 * A backend. Every op that fails returns a status and a g_malloc'd *err_out naming the
 * backend, the endpoint or key, and the reason (curl's or the server's words). get/publish/
 * withdraw block for at most params.timeout_ms per endpoint; callers hold no engine lock.
 *
 * Status contract:
 * - TE_ERR_METADATA_UNAVAILABLE: no endpoint answered (names the last endpoint and error);
 * - TE_ERR_METADATA_NOT_FOUND: no value under that key;
 * - TE_ERR_EXISTS: publish of a name another live holder has (names the holder: its "rpc"
 *   and "generation" from the value in the store);
 * - TE_ERR_AUTH: the store refused our credentials, or needs some and none are configured
 *   (says which of metadata.username / password_file to set);
 * - TE_ERR_METADATA: anything else the server refused (names the key and its words).
 */
struct metadata_ops {
	const char *name; /* "p2p", "etcd", "redis", "http" */
	enum te_status (*open)(const struct metadata_params *p, void **state_out, char **err_out);
	/* The value of segment @name: *json_out (GBytes, not NUL-terminated in general). */
	enum te_status (*get)(void *state, const char *name, uint32_t timeout_ms, GBytes **json_out,
			      char **err_out);
	/*
	 * Publish this engine's descriptor under @name; called once at start (@json has the
	 * engine's "generation" and "rpc") and again whenever it changes. The first publish
	 * claims the name: when another holder's value is there (a different generation whose
	 * holder is alive, i.e. whose TTL keeps being refreshed), TE_ERR_EXISTS. The backend then
	 * keeps the value alive on its own thread (lease keepalive, PX refresh, republish every
	 * ttl_s / 3) and re-publishes the latest @json when the store lost it (restart, expiry
	 * after a partition), logging once per outage and once on recovery.
	 */
	enum te_status (*publish)(void *state, const char *name, const char *json, size_t len,
				  char **err_out);
	/* Delete our key (engine shutdown) and stop keeping it alive. */
	enum te_status (*withdraw)(void *state, const char *name, char **err_out);
	/*
	 * Start delivering changes under the namespace to @fn (NULL op: the backend cannot
	 * watch; the core then relies on refresh-on-failure). Reconnects by itself after the
	 * server restarts or cuts the stream, without losing a delete (a resync compares what it
	 * had seen).
	 */
	enum te_status (*watch)(void *state, metadata_watch_fn fn, void *user, char **err_out);
	/* Stop threads, free everything; does not delete keys (withdraw does). */
	void (*close)(void *state);
};

/* "<ns>/segments/<name>" (g_free). */
char *metadata_key(const char *ns, const char *name);
/* The name in @key under @ns, or NULL when @key is not a segment key of @ns. */
const char *metadata_key_name(const char *ns, const char *key);

/* Open the backend the engine's configuration names. */
enum te_status metadata_open(struct engine *e, struct metadata **md_out, char **err_out);
enum te_status metadata_get(struct metadata *md, const char *name, uint32_t timeout_ms,
			    GBytes **json_out, char **err_out);
/*
 * metadata_fetch_descriptor - the descriptor of segment @name from the metadata backend
 * (decoded). TE_ERR_UNKNOWN_SEGMENT / TE_ERR_METADATA_* with detail.
 */
enum te_status metadata_fetch_descriptor(struct engine *e, const char *name, uint32_t timeout_ms,
					 struct descriptor **desc_out, char **err_out);
/*
 * Publish (or re-publish after a registration change) the engine's own descriptor, as
 * e->describe_local builds it.
 */
enum te_status metadata_publish_local(struct engine *e, char **err_out);
/*
 * A change seen by the watch: segment @name's new value @json (@len bytes), or NULL when
 * its key went (@resync: missing at a resync, see metadata_watch_fn); @backend names the
 * store. Called from the backend's thread.
 */
typedef void (*metadata_change_fn)(struct engine *e, const char *backend, const char *name,
				   const char *json, size_t len, bool resync);
/* Start watching, reporting to @fn (store backends with a watch op); no-op otherwise. */
enum te_status metadata_watch_start(struct engine *e, metadata_change_fn fn, char **err_out);
/*
 * Deliver no more changes (shutdown, before anything the change function touches goes):
 * returns after a delivery in progress on the watch thread has finished.
 */
void metadata_watch_quiet(struct engine *e);
/* Withdraw the engine's own descriptor (shutdown). */
void metadata_withdraw_local(struct engine *e);
const char *metadata_name(const struct metadata *md);
bool metadata_is_store(const struct metadata *md);
void metadata_close(struct metadata *md);

/* Backends (NULL-free: only those built are declared to the dispatcher). */
extern const struct metadata_ops metadata_p2p_ops;
extern const struct metadata_ops metadata_etcd_ops;
extern const struct metadata_ops metadata_redis_ops;
extern const struct metadata_ops metadata_http_ops;

#endif /* TE_CORE_METADATA_METADATA_H */
