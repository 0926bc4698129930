/* SPDX-License-Identifier: Apache-2.0 */
/* http.c: descriptors on a plain HTTP key-value server (GET/PUT/DELETE <endpoint>?key=K). */
#include <inttypes.h>
#include <string.h>

#include "core/metadata/descriptor.h"
#include "core/metadata/mdcurl.h"
#include "core/metadata/metadata.h"

/*
 * The contract of Mooncake's http metadata server (and te-metadata-server): GET answers
 * 200 with the value or 404; PUT stores the body; DELETE removes the key. The store has no
 * TTL of its own: te-metadata-server --ttl-s N drops entries not PUT again within N s, so
 * this backend PUTs every publication again every ttl_s / 3, which also restores values a
 * restarted server lost. A value present under our name is taken to be held by its writer
 * (no liveness to check): only a value with our rpc address (its process is gone, since we
 * bound its port) or one that is not a descriptor is overwritten. There is no watch: the
 * core relies on refresh-on-failure.
 */

#define HTTP_DEFAULT_TIMEOUT_MS 5000u
#define HTTP_BACKOFF_MIN_MS 100u

struct httpmd {
	struct metadata_params p;
	struct mdcurl_endpoints eps;
	struct mdcurl_stop *stop;
	uint32_t timeout_ms;

	GMutex lock; /* stopping, cond */
	GCond cond;
	bool stopping;

	GMutex op_lock; /* pubs; one PUT sequence at a time */
	GHashTable *pubs;
	GThread *keeper;
};

struct http_call {
	struct httpmd *s;
	const char *method;
	const char *key;
	GBytes *body;
	size_t max_body;
	uint32_t timeout_ms;
	long code;
	GBytes *resp;
};

static enum te_status http_call_try(void *user, const char *endpoint, char **err_out)
{
	struct http_call *c = user;
	g_autofree char *k = mdcurl_escape(c->key);
	g_autofree char *url =
		g_strdup_printf("%s%skey=%s", endpoint, strchr(endpoint, '?') ? "&" : "?", k);
	const char *headers[] = { "Content-Type: application/json", NULL };
	struct mdcurl_request r = {
		.method = c->method,
		.url = url,
		.body = c->body ? g_bytes_get_data(c->body, NULL) : NULL,
		.body_len = c->body ? g_bytes_get_size(c->body) : 0,
		.headers = c->body ? headers : NULL,
		.timeout_ms = c->timeout_ms,
		.ca_file = c->s->p.ca_file,
		.max_body = c->max_body,
		.stop = c->s->stop,
	};
	enum te_status st = mdcurl_perform(&r, &c->code, &c->resp, err_out);

	if (st == TE_ERR_METADATA && strstr(*err_out, "longer than")) {
		char *e = *err_out;

		*err_out =
			g_strdup_printf("http metadata: %s of key '%s': %s", c->method, c->key, e);
		g_free(e);
		return st;
	}
	if (st != TE_OK)
		return st;
	if (c->code >= 500) {
		gsize n;
		const char *d = g_bytes_get_data(c->resp, &n);
		g_autofree char *text =
			g_strstrip(g_utf8_make_valid(n ? d : "", (gssize)MIN(n, 200u)));

		/* A server error (or a proxy's 502/503): another endpoint may do. */
		*err_out = g_strdup_printf("%s: HTTP %ld: %s", url, c->code, text);
		g_clear_pointer(&c->resp, g_bytes_unref);
		return TE_ERR_METADATA_UNAVAILABLE;
	}
	return TE_OK;
}

/* One request on the endpoints (failover): the HTTP status and the body. */
static enum te_status http_call(struct httpmd *s, const char *method, const char *key, GBytes *body,
				size_t max_body, uint32_t timeout_ms, long *code_out,
				GBytes **resp_out, char **err_out)
{
	struct http_call c = {
		.s = s,
		.method = method,
		.key = key,
		.body = body,
		.max_body = max_body,
		.timeout_ms = timeout_ms ? timeout_ms : s->timeout_ms,
	};
	enum te_status st = mdcurl_failover(&s->eps, "http metadata", http_call_try, &c, err_out);

	if (st != TE_OK)
		return st;
	*code_out = c.code;
	if (resp_out)
		*resp_out = c.resp;
	else
		g_bytes_unref(c.resp);
	return TE_OK;
}

static char *http_text(GBytes *b)
{
	gsize n;
	const char *d = g_bytes_get_data(b, &n);

	return g_strstrip(g_utf8_make_valid(n ? d : "", (gssize)MIN(n, 200u)));
}

static enum te_status http_get(void *state, const char *name, uint32_t timeout_ms,
			       GBytes **json_out, char **err_out)
{
	struct httpmd *s = state;
	g_autofree char *key = metadata_key(s->p.ns, name);
	GBytes *resp = NULL;
	long code = 0;
	enum te_status st;

	st = http_call(s, "GET", key, NULL, DESCRIPTOR_MAX_JSON, timeout_ms, &code, &resp, err_out);
	if (st != TE_OK)
		return st;
	if (code == 200) {
		*json_out = resp;
		return TE_OK;
	}
	if (code == 404) {
		*err_out = g_strdup_printf("http metadata: no segment '%s' (key '%s' is absent)",
					   name, key);
		st = TE_ERR_METADATA_NOT_FOUND;
	} else {
		g_autofree char *text = http_text(resp);

		*err_out = g_strdup_printf("http metadata: GET of key '%s': HTTP %ld: %s", key,
					   code, text);
		st = TE_ERR_METADATA;
	}
	g_bytes_unref(resp);
	return st;
}

static enum te_status http_put(struct httpmd *s, struct mdcurl_pub *pub, char **err_out)
{
	GBytes *resp = NULL;
	long code = 0;
	enum te_status st;

	st = http_call(s, "PUT", pub->key, pub->json, 1u << 20, 0, &code, &resp, err_out);
	if (st != TE_OK)
		return st;
	if (code < 200 || code > 299) {
		g_autofree char *text = http_text(resp);

		*err_out = g_strdup_printf("http metadata: PUT of key '%s': HTTP %ld: %s", pub->key,
					   code, text);
		st = TE_ERR_METADATA;
	}
	g_bytes_unref(resp);
	return st;
}

/* Whether the value under @pub's key lets us publish (absent, ours, or its holder gone). */
static enum te_status http_check_holder(struct httpmd *s, struct mdcurl_pub *pub, char **err_out)
{
	g_autofree char *holder_gen = NULL;
	g_autofree char *holder_rpc = NULL;
	GBytes *resp = NULL;
	long code = 0;
	bool ours, same_rpc;
	enum te_status st;

	st = http_call(s, "GET", pub->key, NULL, DESCRIPTOR_MAX_JSON, 0, &code, &resp, err_out);
	if (st != TE_OK)
		return st;
	if (code == 404) {
		g_bytes_unref(resp);
		return TE_OK;
	}
	if (code != 200) {
		g_autofree char *text = http_text(resp);

		*err_out = g_strdup_printf("http metadata: GET of key '%s': HTTP %ld: %s", pub->key,
					   code, text);
		g_bytes_unref(resp);
		return TE_ERR_METADATA;
	}
	mdcurl_holder(g_bytes_get_data(resp, NULL), g_bytes_get_size(resp), &holder_gen,
		      &holder_rpc);
	g_bytes_unref(resp);
	ours = holder_gen && pub->generation && strcmp(holder_gen, pub->generation) == 0;
	same_rpc = holder_rpc && *holder_rpc && pub->rpc && strcmp(holder_rpc, pub->rpc) == 0;
	if (ours)
		return TE_OK;
	if (holder_gen && !same_rpc) {
		*err_out = g_strdup_printf(
			"http metadata: segment name '%s' is held by another engine (rpc %s, "
			"generation %s; key '%s'): is an engine with the same name running? Stop "
			"it, or give this one another name (a server run with --ttl-s drops a dead "
			"engine's value after that TTL)",
			pub->name, holder_rpc ? holder_rpc : "(none)", holder_gen, pub->key);
		return TE_ERR_EXISTS;
	}
	log_msg(s->p.log, same_rpc ? TE_LOG_INFO : TE_LOG_WARN,
		"http metadata: taking over segment name '%s' from generation %s (%s)", pub->name,
		holder_gen ? holder_gen : "(none)",
		same_rpc ? "same rpc address: that process is gone"
			 : "the value is not a descriptor");
	return TE_OK;
}

static enum te_status http_publish(void *state, const char *name, const char *json, size_t len,
				   char **err_out)
{
	struct httpmd *s = state;
	struct mdcurl_pub *pub;
	enum te_status st = TE_OK;
	bool is_new = false;

	g_mutex_lock(&s->op_lock);
	st = mdcurl_pub_set(s->pubs, "http", s->p.ns, name, json, len, &pub, &is_new, err_out);
	if (st != TE_OK) {
		g_mutex_unlock(&s->op_lock);
		return st;
	}
	if (is_new)
		st = http_check_holder(s, pub, err_out);
	if (st == TE_OK)
		st = http_put(s, pub, err_out);
	if (st != TE_OK && is_new)
		g_hash_table_remove(s->pubs, name);
	g_mutex_unlock(&s->op_lock);
	return st;
}

static enum te_status http_withdraw(void *state, const char *name, char **err_out)
{
	struct httpmd *s = state;
	struct mdcurl_pub *pub;
	enum te_status st = TE_OK;
	GBytes *resp = NULL;
	long code = 0;

	g_mutex_lock(&s->op_lock);
	pub = g_hash_table_lookup(s->pubs, name);
	if (pub) {
		st = http_call(s, "DELETE", pub->key, NULL, 1u << 20, 0, &code, &resp, err_out);
		if (st == TE_OK && (code < 200 || code > 299) && code != 404) {
			g_autofree char *text = http_text(resp);

			*err_out =
				g_strdup_printf("http metadata: DELETE of key '%s': HTTP %ld: %s",
						pub->key, code, text);
			st = TE_ERR_METADATA;
		}
		if (resp)
			g_bytes_unref(resp);
		g_hash_table_remove(s->pubs, name);
	}
	g_mutex_unlock(&s->op_lock);
	return st;
}

/* PUT every publication again every ttl_s / 3 (the server's expiry keeps live ones). */
static gpointer http_keeper_main(gpointer data)
{
	struct httpmd *s = data;
	uint32_t period_ms = MAX(s->p.ttl_s * 1000 / 3, 1u), backoff_ms = 0;
	gint64 outage_since = 0;
	bool outage = false;

	for (;;) {
		bool stopping;
		gint64 until = g_get_monotonic_time() +
			       (gint64)(backoff_ms ? backoff_ms : period_ms) * 1000;
		g_autofree char *err = NULL;
		enum te_status st = TE_OK;
		GHashTableIter it;
		gpointer v;

		g_mutex_lock(&s->lock);
		while (!s->stopping && g_get_monotonic_time() < until)
			g_cond_wait_until(&s->cond, &s->lock, until);
		stopping = s->stopping;
		g_mutex_unlock(&s->lock);
		if (stopping)
			break;
		g_mutex_lock(&s->op_lock);
		g_hash_table_iter_init(&it, s->pubs);
		while (st == TE_OK && g_hash_table_iter_next(&it, NULL, &v))
			st = http_put(s, v, &err);
		if (st == TE_OK) {
			if (outage)
				log_msg(s->p.log, TE_LOG_INFO,
					"http metadata: published again after %.1f s",
					(double)(g_get_monotonic_time() - outage_since) / 1e6);
			outage = false;
			backoff_ms = 0;
		} else if (st != TE_ERR_CANCELED) {
			if (!outage) {
				log_msg(s->p.log, TE_LOG_WARN,
					"http metadata: re-publishing failed: %s; retrying "
					"(published names may expire)",
					err);
				outage_since = g_get_monotonic_time();
			}
			outage = true;
			backoff_ms = backoff_ms ? MIN(backoff_ms * 2, period_ms)
						: MIN(HTTP_BACKOFF_MIN_MS, period_ms);
		}
		g_mutex_unlock(&s->op_lock);
	}
	return NULL;
}

static void http_free(struct httpmd *s)
{
	mdcurl_endpoints_clear(&s->eps);
	mdcurl_stop_free(s->stop);
	g_hash_table_unref(s->pubs);
	g_mutex_clear(&s->lock);
	g_mutex_clear(&s->op_lock);
	g_cond_clear(&s->cond);
	g_free(s);
}

static enum te_status http_open(const struct metadata_params *p, void **state_out, char **err_out)
{
	struct httpmd *s;
	GError *gerr = NULL;

	if (!p->ns || p->n_endpoints == 0) {
		*err_out = g_strdup("http metadata: no endpoint configured (metadata.endpoints)");
		return TE_ERR_CONFIG;
	}
	s = g_new0(struct httpmd, 1);
	s->p = *p;
	s->p.ttl_s = p->ttl_s ? p->ttl_s : 10;
	s->timeout_ms = p->timeout_ms ? p->timeout_ms : HTTP_DEFAULT_TIMEOUT_MS;
	mdcurl_endpoints_init(&s->eps, p->endpoints, p->n_endpoints);
	s->stop = mdcurl_stop_new();
	s->pubs = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, mdcurl_pub_free);
	g_mutex_init(&s->lock);
	g_mutex_init(&s->op_lock);
	g_cond_init(&s->cond);
	s->keeper = g_thread_try_new("te-http-md", http_keeper_main, s, &gerr);
	if (!s->keeper) {
		*err_out = g_strdup_printf("http metadata: republish thread: %s", gerr->message);
		g_error_free(gerr);
		http_free(s);
		return TE_ERR_SYSTEM;
	}
	*state_out = s;
	return TE_OK;
}

static void http_close(void *state)
{
	struct httpmd *s = state;

	if (!s)
		return;
	g_mutex_lock(&s->lock);
	s->stopping = true;
	g_cond_broadcast(&s->cond);
	g_mutex_unlock(&s->lock);
	mdcurl_stop_fire(s->stop);
	g_thread_join(s->keeper);
	http_free(s);
}

const struct metadata_ops metadata_http_ops = {
	.name = "http",
	.open = http_open,
	.get = http_get,
	.publish = http_publish,
	.withdraw = http_withdraw,
	.watch = NULL, /* plain GET/PUT/DELETE: nothing to watch; refresh-on-failure */
	.close = http_close,
};
