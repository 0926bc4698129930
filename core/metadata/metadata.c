/* SPDX-License-Identifier: Apache-2.0 */
/* metadata.c: dispatch to the configured descriptor backend. */
#include "core/engine.h"
#include "core/metadata/metadata.h"

struct metadata {
	const struct metadata_ops *ops;
	void *state;
};

enum te_status metadata_open(struct engine *e, struct metadata **md_out, char **err_out)
{
	const struct metadata_ops *ops = NULL;
	struct metadata *md;
	enum te_status st;

	switch (e->cfg->metadata_type) {
	case CONFIG_METADATA_P2P:
		ops = &metadata_p2p_ops;
		break;
	case CONFIG_METADATA_ETCD:
	case CONFIG_METADATA_REDIS:
	case CONFIG_METADATA_HTTP:
		break;
	}
	if (!ops) {
		static const char *const names[] = { "p2p", "etcd", "redis", "http" };

		*err_out = g_strdup_printf("metadata: backend '%s' is not available in this build "
					   "(available: p2p)",
					   names[e->cfg->metadata_type]);
		return TE_ERR_CONFIG;
	}
	md = g_new0(struct metadata, 1);
	md->ops = ops;
	st = ops->open(e, &md->state, err_out);
	if (st != TE_OK) {
		g_free(md);
		return st;
	}
	*md_out = md;
	return TE_OK;
}

enum te_status metadata_get(struct metadata *md, const char *name, uint32_t timeout_ms,
			    GBytes **json_out, char **err_out)
{
	return md->ops->get(md->state, name, timeout_ms, json_out, err_out);
}

enum te_status metadata_put(struct metadata *md, const char *name, const char *json, size_t len,
			    char **err_out)
{
	return md->ops->put(md->state, name, json, len, err_out);
}

enum te_status metadata_del(struct metadata *md, const char *name, char **err_out)
{
	return md->ops->del(md->state, name, err_out);
}

const char *metadata_name(const struct metadata *md)
{
	return md->ops->name;
}

void metadata_close(struct metadata *md)
{
	if (!md)
		return;
	md->ops->close(md->state);
	g_free(md);
}
