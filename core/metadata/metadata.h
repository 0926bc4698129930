/* SPDX-License-Identifier: Apache-2.0 */
/* metadata.h: where segment descriptors are stored and found (p2p, etcd, redis, http). */
#ifndef TE_CORE_METADATA_METADATA_H
#define TE_CORE_METADATA_METADATA_H

#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

struct engine;
struct metadata;

/*
 * A backend. Every op returns a status and, on failure, a g_malloc'd *err_out
 * naming the backend, the key and the reason. get/put/del may block (network);
 * callers never hold engine locks across them.
 */
struct metadata_ops {
	const char *name;
	enum te_status (*open)(struct engine *e, void **state_out, char **err_out);
	/* Descriptor JSON of segment @name; TE_ERR_METADATA_NOT_FOUND if absent. */
	enum te_status (*get)(void *state, const char *name, uint32_t timeout_ms, GBytes **json_out,
			      char **err_out);
	/* Publish our descriptor under @name with a TTL (kept alive by the backend). */
	enum te_status (*put)(void *state, const char *name, const char *json, size_t len,
			      char **err_out);
	enum te_status (*del)(void *state, const char *name, char **err_out);
	void (*close)(void *state);
};

/* Open the backend the engine's configuration names. */
enum te_status metadata_open(struct engine *e, struct metadata **md_out, char **err_out);
enum te_status metadata_get(struct metadata *md, const char *name, uint32_t timeout_ms,
			    GBytes **json_out, char **err_out);
enum te_status metadata_put(struct metadata *md, const char *name, const char *json, size_t len,
			    char **err_out);
enum te_status metadata_del(struct metadata *md, const char *name, char **err_out);
const char *metadata_name(const struct metadata *md);
void metadata_close(struct metadata *md);

/* Backends. */
extern const struct metadata_ops metadata_p2p_ops;

#endif /* TE_CORE_METADATA_METADATA_H */
