/* SPDX-License-Identifier: Apache-2.0 */
/* metadata.c: the configured descriptor backend, this engine's publication and the watch. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/metadata/descriptor.h"
#include "core/metadata/metadata.h"
#include "core/te_metadata_config.h"

/* metadata.password_file: at most this many bytes. */
#define METADATA_PASSWORD_MAX 4096

struct metadata {
	const struct metadata_ops *ops;
	void *state;
	struct metadata_params params;
	char *password;	     /* from metadata.password_file, wiped at close */
	GMutex publish_lock; /* one publication at a time, in registration order */
	uint64_t published;  /* mem.version of the last successful publication + 1; 0: none */
	bool withdrawn;
	struct engine *engine;
	metadata_change_fn on_change; /* set by metadata_watch_start */
	/*
	 * Held across each delivery, so metadata_watch_quiet waits for one in progress;
	 * quiet: deliver nothing more (the engine is coming apart).
	 */
	GMutex change_lock;
	bool quiet;
};

static const char *const metadata_type_names[] = { "p2p", "etcd", "redis", "http" };

/* The backend of @type in this build, or NULL with the reason in @why. */
static const struct metadata_ops *metadata_ops_of(enum config_metadata_type type)
{
	switch (type) {
	case CONFIG_METADATA_P2P:
		return &metadata_p2p_ops;
	case CONFIG_METADATA_ETCD:
#ifdef TE_HAVE_ETCD
		return &metadata_etcd_ops;
#else
		return NULL;
#endif
	case CONFIG_METADATA_REDIS:
#ifdef TE_HAVE_REDIS
		return &metadata_redis_ops;
#else
		return NULL;
#endif
	case CONFIG_METADATA_HTTP:
#ifdef TE_HAVE_HTTP
		return &metadata_http_ops;
#else
		return NULL;
#endif
	}
	return NULL;
}

/* What this build offers, e.g. "p2p, etcd, redis, http". */
static char *metadata_available(void)
{
	GString *s = g_string_new(NULL);

	for (int t = CONFIG_METADATA_P2P; t <= CONFIG_METADATA_HTTP; t++)
		if (metadata_ops_of((enum config_metadata_type)t))
			g_string_append_printf(s, "%s%s", s->len ? ", " : "",
					       metadata_type_names[t]);
	return g_string_free(s, FALSE);
}

/* metadata.password_file: a regular file of at most 4 KiB; one trailing newline dropped. */
static enum te_status metadata_password_load(const char *path, char **out, char **err_out)
{
	char buf[METADATA_PASSWORD_MAX + 1];
	struct stat stt;
	ssize_t n;
	size_t len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0) {
		*err_out = g_strdup_printf("metadata.password_file: cannot open %s: %s", path,
					   g_strerror(errno));
		return TE_ERR_CONFIG;
	}
	if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode)) {
		close(fd);
		*err_out =
			g_strdup_printf("metadata.password_file: %s is not a regular file", path);
		return TE_ERR_CONFIG;
	}
	while (len < sizeof(buf) && (n = read(fd, buf + len, sizeof(buf) - len)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			*err_out = g_strdup_printf("metadata.password_file: cannot read %s: %s",
						   path, g_strerror(errno));
			close(fd);
			explicit_bzero(buf, sizeof(buf));
			return TE_ERR_CONFIG;
		}
		len += (size_t)n;
	}
	close(fd);
	if (len > METADATA_PASSWORD_MAX) {
		explicit_bzero(buf, sizeof(buf));
		*err_out = g_strdup_printf("metadata.password_file: %s is over the %u-byte limit",
					   path, METADATA_PASSWORD_MAX);
		return TE_ERR_CONFIG;
	}
	if (len && buf[len - 1] == '\n')
		len--;
	if (len && buf[len - 1] == '\r')
		len--;
	if (!len || memchr(buf, '\0', len)) {
		explicit_bzero(buf, sizeof(buf));
		*err_out = g_strdup_printf("metadata.password_file: %s is %s", path,
					   len ? "binary (holds a NUL byte)" : "empty");
		return TE_ERR_CONFIG;
	}
	*out = g_strndup(buf, len);
	explicit_bzero(buf, sizeof(buf));
	return TE_OK;
}

enum te_status metadata_open(struct engine *e, struct metadata **md_out, char **err_out)
{
	const struct config *cfg = e->cfg;
	const struct metadata_ops *ops = metadata_ops_of(cfg->metadata_type);
	g_autofree char *err = NULL;
	struct metadata *md;
	enum te_status st;

	if (!ops) {
		g_autofree char *have = metadata_available();

		*err_out = g_strdup_printf(
			"metadata: backend '%s' is not available in this build (available: %s); "
			"etcd and http need libcurl (libcurl4-openssl-dev), redis needs hiredis "
			"(libhiredis-dev) when te is built",
			metadata_type_names[cfg->metadata_type], have);
		return TE_ERR_CONFIG;
	}
	md = g_new0(struct metadata, 1);
	md->ops = ops;
	md->engine = e;
	g_mutex_init(&md->publish_lock);
	g_mutex_init(&md->change_lock);
	if (cfg->metadata_password_file) {
		st = metadata_password_load(cfg->metadata_password_file, &md->password, err_out);
		if (st != TE_OK) {
			metadata_close(md);
			return st;
		}
	}
	md->params.endpoints = (const char *const *)cfg->metadata_endpoints;
	md->params.n_endpoints = cfg->n_metadata_endpoints;
	md->params.ns = cfg->metadata_namespace;
	md->params.ttl_s = cfg->metadata_ttl_s;
	md->params.username = cfg->metadata_username;
	md->params.password = md->password;
	md->params.ca_file = cfg->metadata_ca_file;
	md->params.timeout_ms = cfg->metadata_timeout_ms;
	md->params.log = &e->log;
	md->params.engine = e;
	st = ops->open(&md->params, &md->state, &err);
	if (st != TE_OK) {
		*err_out = g_steal_pointer(&err);
		md->ops = NULL;
		metadata_close(md);
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

enum te_status metadata_fetch_descriptor(struct engine *e, const char *name, uint32_t timeout_ms,
					 struct descriptor **desc_out, char **err_out)
{
	g_autoptr(GBytes) json = NULL;
	g_autofree char *err = NULL;
	enum te_status st;
	gsize len = 0;
	const char *data;

	if (!e->md) {
		*err_out = g_strdup_printf("segment '%s' not found: no metadata backend", name);
		return TE_ERR_UNKNOWN_SEGMENT;
	}
	st = metadata_get(e->md, name, timeout_ms, &json, &err);
	if (st == TE_ERR_METADATA_NOT_FOUND) {
		g_autofree char *key = metadata_key(e->cfg->metadata_namespace, name);

		*err_out = g_strdup_printf("segment '%s': no engine of that name is published in "
					   "%s (key %s): %s",
					   name, metadata_name(e->md), key, err);
		return st;
	}
	if (st != TE_OK) {
		*err_out = g_steal_pointer(&err);
		return st;
	}
	data = g_bytes_get_data(json, &len);
	st = descriptor_decode(data, len, desc_out, &err);
	if (st != TE_OK) {
		if (metadata_is_store(e->md)) {
			g_autofree char *key = metadata_key(e->cfg->metadata_namespace, name);

			*err_out = g_strdup_printf("segment '%s': the value of key %s in %s is not "
						   "a segment descriptor: %s",
						   name, key, metadata_name(e->md), err);
		} else {
			*err_out = g_strdup_printf("segment '%s': %s", name, err);
		}
		return st;
	}
	if (metadata_is_store(e->md) && strcmp((*desc_out)->name, name) != 0) {
		g_autofree char *key = metadata_key(e->cfg->metadata_namespace, name);

		*err_out = g_strdup_printf("segment '%s': the value of key %s in %s describes "
					   "segment '%s'",
					   name, key, metadata_name(e->md), (*desc_out)->name);
		descriptor_free(*desc_out);
		*desc_out = NULL;
		return TE_ERR_METADATA_MALFORMED;
	}
	return TE_OK;
}

enum te_status metadata_publish_local(struct engine *e, char **err_out)
{
	struct metadata *md = e->md;
	struct descriptor *d;
	enum te_status st;
	uint64_t version;
	size_t len = 0;
	char *json;

	if (!md || md->ops == &metadata_p2p_ops)
		return TE_OK; /* our listener serves the current descriptor on demand */
	g_mutex_lock(&md->publish_lock);
	version = atomic_load_explicit(&e->mem.version, memory_order_acquire);
	if (md->withdrawn || md->published == version + 1) {
		g_mutex_unlock(&md->publish_lock);
		return TE_OK;
	}
	d = e->describe_local(e);
	json = descriptor_encode(d, &len);
	descriptor_free(d);
	if (!json) {
		g_mutex_unlock(&md->publish_lock);
		*err_out = g_strdup("metadata: cannot encode this engine's descriptor");
		return TE_ERR_NOMEM;
	}
	st = md->ops->publish(md->state, e->name, json, len, err_out);
	if (st == TE_OK)
		md->published = version + 1;
	g_mutex_unlock(&md->publish_lock);
	g_free(json);
	return st;
}

/* A change under the namespace, from the backend's watch thread. */
static void metadata_on_change(void *user, const char *name, const char *json, size_t len,
			       bool resync)
{
	struct metadata *md = user;
	struct engine *e = md->engine;

	if (strcmp(name, e->name) == 0)
		return; /* our own key: the backend keeps it published */
	g_mutex_lock(&md->change_lock);
	if (!md->quiet) /* set first thing in engine_destroy */
		md->on_change(e, md->ops->name, name, json, len, resync);
	g_mutex_unlock(&md->change_lock);
}

enum te_status metadata_watch_start(struct engine *e, metadata_change_fn fn, char **err_out)
{
	struct metadata *md = e->md;

	if (!md || !md->ops->watch)
		return TE_OK;
	md->on_change = fn;
	return md->ops->watch(md->state, metadata_on_change, md, err_out);
}

void metadata_watch_quiet(struct engine *e)
{
	struct metadata *md = e->md;

	if (!md)
		return;
	g_mutex_lock(&md->change_lock);
	md->quiet = true;
	g_mutex_unlock(&md->change_lock);
}

void metadata_withdraw_local(struct engine *e)
{
	struct metadata *md = e->md;
	g_autofree char *err = NULL;

	if (!md || md->ops == &metadata_p2p_ops)
		return;
	g_mutex_lock(&md->publish_lock);
	if (md->published && !md->withdrawn && md->ops->withdraw(md->state, e->name, &err) != TE_OK)
		ENGINE_LOG(e, TE_LOG_WARN,
			   "metadata: could not withdraw segment %s (it expires after %u s): %s",
			   e->name, md->params.ttl_s, err);
	md->withdrawn = true;
	g_mutex_unlock(&md->publish_lock);
}

const char *metadata_name(const struct metadata *md)
{
	return md->ops->name;
}

bool metadata_is_store(const struct metadata *md)
{
	return md && md->ops != &metadata_p2p_ops;
}

void metadata_close(struct metadata *md)
{
	if (!md)
		return;
	if (md->ops)
		md->ops->close(md->state);
	if (md->password) {
		explicit_bzero(md->password, strlen(md->password));
		g_free(md->password);
	}
	g_mutex_clear(&md->publish_lock);
	g_mutex_clear(&md->change_lock);
	g_free(md);
}
