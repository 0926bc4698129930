/* SPDX-License-Identifier: Apache-2.0 */
/* mdcurl.c: one HTTP request through libcurl (bounded, cancellable) and endpoint failover. */
#include <string.h>

#include <curl/curl.h>
#include <json-glib/json-glib.h>

#include "core/metadata/descriptor.h"
#include "core/metadata/mdcurl.h"
#include "core/metadata/metadata.h"

#define MDCURL_DEFAULT_MAX_BODY (64u << 20)
#define MDCURL_DEFAULT_CONNECT_MS 10000u
/* The longest a request waits without looking at its stop switch (wakeups end it sooner). */
#define MDCURL_POLL_MS 1000

struct mdcurl_stop {
	GMutex lock;
	atomic_bool fired;
	GPtrArray *multis; /* CURLM * of the requests in flight */
};

struct mdcurl_stop *mdcurl_stop_new(void)
{
	struct mdcurl_stop *s = g_new0(struct mdcurl_stop, 1);

	g_mutex_init(&s->lock);
	s->multis = g_ptr_array_new();
	return s;
}

void mdcurl_stop_fire(struct mdcurl_stop *s)
{
	g_mutex_lock(&s->lock);
	atomic_store_explicit(&s->fired, true, memory_order_release);
	for (guint i = 0; i < s->multis->len; i++)
		curl_multi_wakeup(s->multis->pdata[i]);
	g_mutex_unlock(&s->lock);
}

bool mdcurl_stop_fired(struct mdcurl_stop *s)
{
	return s && atomic_load_explicit(&s->fired, memory_order_acquire);
}

void mdcurl_stop_free(struct mdcurl_stop *s)
{
	if (!s)
		return;
	g_ptr_array_free(s->multis, TRUE);
	g_mutex_clear(&s->lock);
	g_free(s);
}

/* curl_global_init is not thread-safe before 7.84: once per process. */
static void mdcurl_global_init(void)
{
	static gsize once;

	if (g_once_init_enter(&once)) {
		curl_global_init(CURL_GLOBAL_DEFAULT);
		g_once_init_leave(&once, 1);
	}
}

struct mdcurl_xfer {
	const struct mdcurl_request *r;
	GByteArray *body;
	size_t received;
	size_t max_body;
	bool too_large;
	bool ended_by_caller;
};

static size_t mdcurl_write(char *data, size_t size, size_t nmemb, void *user)
{
	struct mdcurl_xfer *x = user;
	size_t n = size * nmemb;

	if (n > x->max_body - x->received) {
		x->too_large = true;
		return 0; /* CURLE_WRITE_ERROR ends the transfer */
	}
	x->received += n;
	if (x->r->on_data) {
		if (!x->r->on_data(x->r->user, data, n)) {
			x->ended_by_caller = true;
			return 0;
		}
		/* A stream's bound is per message (the caller's), not over its whole life. */
		x->received = 0;
		return n;
	}
	g_byte_array_append(x->body, (const guint8 *)data, (guint)n);
	return n;
}

char *mdcurl_escape(const char *s)
{
	return g_uri_escape_string(s, NULL, FALSE);
}

static void mdcurl_register(struct mdcurl_stop *s, CURLM *m, bool add)
{
	g_mutex_lock(&s->lock);
	if (add)
		g_ptr_array_add(s->multis, m);
	else
		g_ptr_array_remove_fast(s->multis, m);
	g_mutex_unlock(&s->lock);
}

enum te_status mdcurl_perform(const struct mdcurl_request *r, long *code_out, GBytes **body_out,
			      char **err_out)
{
	char errbuf[CURL_ERROR_SIZE] = "";
	struct curl_slist *hdrs = NULL;
	struct mdcurl_xfer x = { .r = r };
	enum te_status st = TE_OK;
	CURLcode cc = CURLE_OK;
	int running = 1;
	CURLMsg *msg;
	CURLM *m;
	CURL *h;
	int left;

	mdcurl_global_init();
	if (mdcurl_stop_fired(r->stop)) {
		*err_out = g_strdup_printf("%s: canceled (shutting down)", r->url);
		return TE_ERR_CANCELED;
	}
	x.max_body = r->max_body ? r->max_body : MDCURL_DEFAULT_MAX_BODY;
	if (!r->on_data)
		x.body = g_byte_array_new();
	h = curl_easy_init();
	m = curl_multi_init();
	if (!h || !m) {
		*err_out = g_strdup_printf("%s: libcurl could not create a handle", r->url);
		st = TE_ERR_NOMEM;
		goto out;
	}
	curl_easy_setopt(h, CURLOPT_URL, r->url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mdcurl_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)r->timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)(r->connect_timeout_ms ? r->connect_timeout_ms
				: r->timeout_ms	      ? r->timeout_ms
						      : MDCURL_DEFAULT_CONNECT_MS));
	if (r->ca_file)
		curl_easy_setopt(h, CURLOPT_CAINFO, r->ca_file);
	if (r->tcp_keepalive) {
		curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
		curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
		curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
	}
	if (strcmp(r->method, "GET") == 0) {
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
	} else {
		if (strcmp(r->method, "POST") == 0 || strcmp(r->method, "PUT") == 0 || r->body) {
			curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body ? r->body : "");
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
					 (curl_off_t)(r->body ? r->body_len : 0));
		}
		if (strcmp(r->method, "POST") != 0)
			curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
	}
	hdrs = curl_slist_append(hdrs, "Expect:"); /* no 100-continue round trip */
	for (const char *const *p = r->headers; p && *p; p++)
		hdrs = curl_slist_append(hdrs, *p);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);

	curl_multi_add_handle(m, h);
	if (r->stop)
		mdcurl_register(r->stop, m, true);
	while (running) {
		CURLMcode mc = curl_multi_perform(m, &running);

		if (mc != CURLM_OK) {
			*err_out = g_strdup_printf("%s: %s", r->url, curl_multi_strerror(mc));
			st = TE_ERR_METADATA_UNAVAILABLE;
			break;
		}
		if (!running)
			break;
		if (mdcurl_stop_fired(r->stop)) {
			*err_out = g_strdup_printf("%s: canceled (shutting down)", r->url);
			st = TE_ERR_CANCELED;
			break;
		}
		mc = curl_multi_poll(m, NULL, 0, MDCURL_POLL_MS, NULL);
		if (mc != CURLM_OK) {
			*err_out = g_strdup_printf("%s: %s", r->url, curl_multi_strerror(mc));
			st = TE_ERR_METADATA_UNAVAILABLE;
			break;
		}
	}
	if (r->stop)
		mdcurl_register(r->stop, m, false);
	if (st != TE_OK)
		goto out_remove;
	while ((msg = curl_multi_info_read(m, &left)))
		if (msg->msg == CURLMSG_DONE)
			cc = msg->data.result;
	if (x.too_large) {
		*err_out = g_strdup_printf("%s: the response is longer than %zu bytes (refused)",
					   r->url, x.max_body);
		st = TE_ERR_METADATA;
		goto out_remove;
	}
	if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && x.ended_by_caller)) {
		*err_out = g_strdup_printf("%s: %s%s%s%s", r->url, curl_easy_strerror(cc),
					   errbuf[0] ? " (" : "", errbuf, errbuf[0] ? ")" : "");
		st = mdcurl_stop_fired(r->stop) ? TE_ERR_CANCELED : TE_ERR_METADATA_UNAVAILABLE;
		goto out_remove;
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, code_out);
	if (body_out)
		*body_out = x.body ? g_byte_array_free_to_bytes(g_steal_pointer(&x.body))
				   : g_bytes_new(NULL, 0);
out_remove:
	curl_multi_remove_handle(m, h);
out:
	curl_slist_free_all(hdrs);
	if (h)
		curl_easy_cleanup(h);
	if (m)
		curl_multi_cleanup(m);
	if (x.body)
		g_byte_array_free(x.body, TRUE);
	return st;
}

void mdcurl_endpoints_init(struct mdcurl_endpoints *e, const char *const *endpoints, size_t n)
{
	e->urls = g_new0(char *, n + 1);
	e->n = n;
	atomic_init(&e->current, 0);
	for (size_t i = 0; i < n; i++) {
		const char *u = endpoints[i];
		char *s = strstr(u, "://") ? g_strdup(u) : g_strconcat("http://", u, NULL);
		size_t len = strlen(s);

		while (len > 0 && s[len - 1] == '/')
			s[--len] = '\0';
		e->urls[i] = s;
	}
}

void mdcurl_endpoints_clear(struct mdcurl_endpoints *e)
{
	g_strfreev(e->urls);
	e->urls = NULL;
	e->n = 0;
}

enum te_status mdcurl_failover(struct mdcurl_endpoints *e, const char *backend, mdcurl_try_fn fn,
			       void *user, char **err_out)
{
	/* Relaxed: a stale index only means one extra attempt on a dead endpoint. */
	size_t first = atomic_load_explicit(&e->current, memory_order_relaxed);
	GString *why = NULL;

	if (e->n == 0) {
		*err_out =
			g_strdup_printf("%s: no endpoint configured (metadata.endpoints)", backend);
		return TE_ERR_METADATA_UNAVAILABLE;
	}
	for (size_t k = 0; k < e->n; k++) {
		size_t i = (first + k) % e->n;
		char *err = NULL;
		enum te_status st = fn(user, e->urls[i], &err);

		if (st != TE_ERR_METADATA_UNAVAILABLE) {
			if (st != TE_ERR_CANCELED)
				atomic_store_explicit(&e->current, i, memory_order_relaxed);
			if (why)
				g_string_free(why, TRUE);
			if (st != TE_OK)
				*err_out = err;
			else
				g_free(err);
			return st;
		}
		if (!why)
			why = g_string_new(NULL);
		else
			g_string_append(why, "; ");
		g_string_append(why, err ? err : e->urls[i]);
		g_free(err);
	}
	*err_out = g_strdup_printf("%s: no endpoint answered: %s", backend, why->str);
	g_string_free(why, TRUE);
	return TE_ERR_METADATA_UNAVAILABLE;
}

void mdcurl_holder(const char *json, size_t len, char **generation_out, char **rpc_out)
{
	JsonParser *parser = json_parser_new();
	JsonObject *o = NULL;
	JsonNode *n;

	*generation_out = NULL;
	*rpc_out = NULL;
	if (len > (size_t)G_MAXSSIZE || memchr(json, '\0', len) ||
	    !json_parser_load_from_data(parser, json, (gssize)len, NULL))
		goto out;
	n = json_parser_get_root(parser);
	if (!n || !JSON_NODE_HOLDS_OBJECT(n))
		goto out;
	o = json_node_get_object(n);
	n = json_object_get_member(o, "generation");
	if (n && JSON_NODE_HOLDS_VALUE(n)) {
		if (json_node_get_value_type(n) == G_TYPE_STRING)
			*generation_out = g_strdup(json_node_get_string(n));
		else if (json_node_get_value_type(n) == G_TYPE_INT64)
			*generation_out =
				g_strdup_printf("%" G_GINT64_FORMAT, json_node_get_int(n));
	}
	n = json_object_get_member(o, "rpc");
	if (n && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING)
		*rpc_out = g_strdup(json_node_get_string(n));
out:
	g_object_unref(parser);
}

enum te_status mdcurl_pub_set(GHashTable *pubs, const char *backend, const char *ns,
			      const char *name, const char *json, size_t len,
			      struct mdcurl_pub **pub_out, bool *is_new, char **err_out)
{
	struct mdcurl_pub *pub;

	if (len > DESCRIPTOR_MAX_JSON) {
		*err_out = g_strdup_printf("%s metadata: descriptor of '%s' is %zu bytes, over the "
					   "limit of %u",
					   backend, name, len, DESCRIPTOR_MAX_JSON);
		return TE_ERR_TOO_LARGE;
	}
	pub = g_hash_table_lookup(pubs, name);
	*is_new = pub == NULL;
	if (!pub) {
		pub = g_new0(struct mdcurl_pub, 1);
		pub->name = g_strdup(name);
		pub->key = metadata_key(ns, name);
		g_hash_table_insert(pubs, pub->name, pub);
	}
	if (pub->json)
		g_bytes_unref(pub->json);
	pub->json = g_bytes_new(json, len);
	g_free(pub->generation);
	g_free(pub->rpc);
	mdcurl_holder(json, len, &pub->generation, &pub->rpc);
	*pub_out = pub;
	return TE_OK;
}

void mdcurl_pub_free(void *data)
{
	struct mdcurl_pub *pub = data;

	g_free(pub->name);
	g_free(pub->key);
	if (pub->json)
		g_bytes_unref(pub->json);
	g_free(pub->generation);
	g_free(pub->rpc);
	g_free(pub);
}
