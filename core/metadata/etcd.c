/* SPDX-License-Identifier: Apache-2.0 */
/* etcd.c: descriptors in etcd v3 through its JSON gateway: leases, keepalive, watch. */
#include <inttypes.h>
#include <string.h>

#include <json-glib/json-glib.h>

#include "core/metadata/descriptor.h"
#include "core/metadata/mdcurl.h"
#include "core/metadata/metadata.h"

#define ETCD_DEFAULT_TIMEOUT_MS 5000u
/* Bounds on what the server may send: one value (base64) and a keys-only listing. */
#define ETCD_MAX_VALUE_RESPONSE ((size_t)DESCRIPTOR_MAX_JSON / 3 * 4 + (64u << 10))
#define ETCD_MAX_LIST_RESPONSE ((size_t)64u << 20)
#define ETCD_MAX_SMALL_RESPONSE ((size_t)1u << 20)
/* One message of the watch stream (events of one revision batch). */
#define ETCD_MAX_WATCH_MESSAGE ((size_t)64u << 20)
#define ETCD_MAX_JSON_DEPTH 64
/* Reconnect backoff of the watch and first retry of the keepalive. */
#define ETCD_BACKOFF_MIN_MS 100u
#define ETCD_WATCH_BACKOFF_MAX_MS 2000u
/* gRPC codes the gateway quotes in {"code": N}. */
#define ETCD_GRPC_NOT_FOUND 5
#define ETCD_GRPC_UNAVAILABLE 14

/* One name this engine publishes: kept alive by the lease, re-put after a loss. */
struct etcd {
	struct metadata_params p;
	struct mdcurl_endpoints eps;
	struct mdcurl_stop *stop;
	char *prefix; /* "<ns>/segments/" */
	uint32_t timeout_ms;

	GMutex lock; /* token, stopping, cond */
	GCond cond;
	bool stopping;
	char *token; /* auth token, NULL: none */

	/* Serializes publish, withdraw and the keeper's recovery (they own the fields below). */
	GMutex op_lock;
	int64_t lease; /* 0: none */
	int64_t lease_ttl_s;
	GHashTable *pubs; /* name -> struct mdcurl_pub */

	GThread *keeper;
	GThread *watcher;
	metadata_watch_fn watch_fn;
	void *watch_user;
};

/* ---- JSON helpers: every member read is type-checked ---- */

/* The member as a string; false when present with another type. */
static bool jstr(JsonObject *o, const char *m, const char **out)
{
	JsonNode *n = json_object_get_member(o, m);

	*out = NULL;
	if (!n || JSON_NODE_HOLDS_NULL(n))
		return true;
	if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING)
		return false;
	*out = json_node_get_string(n);
	return true;
}

/* An int64 the gateway sends as a decimal string (or a number); absent: 0. */
static bool ji64(JsonObject *o, const char *m, int64_t *out)
{
	JsonNode *n = json_object_get_member(o, m);
	gint64 v;

	*out = 0;
	if (!n || JSON_NODE_HOLDS_NULL(n))
		return true;
	if (!JSON_NODE_HOLDS_VALUE(n))
		return false;
	if (json_node_get_value_type(n) == G_TYPE_INT64) {
		*out = json_node_get_int(n);
		return true;
	}
	if (json_node_get_value_type(n) != G_TYPE_STRING ||
	    !g_ascii_string_to_signed(json_node_get_string(n), 10, G_MININT64, G_MAXINT64, &v,
				      NULL))
		return false;
	*out = v;
	return true;
}

static bool jbool(JsonObject *o, const char *m)
{
	JsonNode *n = json_object_get_member(o, m);

	return n && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_BOOLEAN &&
	       json_node_get_boolean(n);
}

/* The member as an object (NULL when absent); false when present with another type. */
static bool jobj(JsonObject *o, const char *m, JsonObject **out)
{
	JsonNode *n = json_object_get_member(o, m);

	*out = NULL;
	if (!n || JSON_NODE_HOLDS_NULL(n))
		return true;
	if (!JSON_NODE_HOLDS_OBJECT(n))
		return false;
	*out = json_node_get_object(n);
	return true;
}

static bool jarr(JsonObject *o, const char *m, JsonArray **out)
{
	JsonNode *n = json_object_get_member(o, m);

	*out = NULL;
	if (!n || JSON_NODE_HOLDS_NULL(n))
		return true;
	if (!JSON_NODE_HOLDS_ARRAY(n))
		return false;
	*out = json_node_get_array(n);
	return true;
}

/* Strict base64 (g_base64_decode skips what is not base64; a server's garbage must fail). */
static GBytes *b64_decode(const char *s)
{
	size_t n = strlen(s), pad = 0;
	gsize out_len = 0;
	guchar *out;

	if (n % 4)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (c == '=') {
			if (i < n - 2)
				return NULL;
			pad++;
		} else if (pad || !(g_ascii_isalnum(c) || c == '+' || c == '/')) {
			return NULL;
		}
	}
	if (n == 0)
		return g_bytes_new(NULL, 0);
	out = g_base64_decode(s, &out_len);
	return g_bytes_new_take(out, out_len);
}

/* The member as base64-decoded bytes (absent: empty); NULL when malformed. */
static GBytes *jb64(JsonObject *o, const char *m)
{
	const char *s;

	if (!jstr(o, m, &s))
		return NULL;
	return s ? b64_decode(s) : g_bytes_new(NULL, 0);
}

static char *b64(const void *data, size_t len)
{
	return g_base64_encode(data, len);
}

static char *b64s(const char *s)
{
	return b64(s, strlen(s));
}

/* The key just past every key starting with @prefix (etcd's range_end for a prefix). */
static char *prefix_end(const char *prefix)
{
	char *end = g_strdup(prefix);
	size_t n = strlen(end);

	while (n > 0) {
		if ((unsigned char)end[n - 1] < 0xff) {
			end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
			end[n] = '\0';
			return end;
		}
		n--;
	}
	g_free(end);
	return g_strdup("\\0"); /* unreachable for our prefixes (they end in '/') */
}

/*
 * A JSON object splitter for the gateway's streams (a sequence of objects, usually one a
 * line): finds where each top-level object ends without parsing it, keeping its state
 * across chunks so a long stream is scanned once.
 */
struct jsplit {
	GByteArray *buf;
	size_t pos;   /* next byte to scan */
	size_t start; /* start of the object being scanned */
	int depth;
	bool in_str, esc;
	size_t max;
};

/*
 * Feed @len bytes; calls @fn for each complete object. Returns false (and *err_out) on
 * bytes that are not a sequence of objects, an object over the bound, or when @fn says so
 * (*err_out NULL).
 */
static bool jsplit_feed(struct jsplit *js, const char *data, size_t len,
			bool (*fn)(void *user, const char *obj, size_t n), void *user,
			char **err_out)
{
	size_t consumed = 0;
	bool ok = true;

	g_byte_array_append(js->buf, (const guint8 *)data, (guint)len);
	for (; js->pos < js->buf->len && ok; js->pos++) {
		char c = (char)js->buf->data[js->pos];

		if (js->depth == 0) {
			if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
				consumed = js->pos + 1;
				continue;
			}
			if (c != '{') {
				*err_out =
					g_strdup_printf("unexpected byte 0x%02x between messages",
							(unsigned char)c);
				return false;
			}
			js->start = js->pos;
			js->depth = 1;
			continue;
		}
		if (js->in_str) {
			if (js->esc)
				js->esc = false;
			else if (c == '\\')
				js->esc = true;
			else if (c == '"')
				js->in_str = false;
			continue;
		}
		if (c == '"') {
			js->in_str = true;
		} else if (c == '{' || c == '[') {
			if (++js->depth > ETCD_MAX_JSON_DEPTH) {
				*err_out = g_strdup_printf("message nested deeper than %d",
							   ETCD_MAX_JSON_DEPTH);
				return false;
			}
		} else if (c == '}' || c == ']') {
			if (--js->depth == 0) {
				ok = fn(user, (const char *)js->buf->data + js->start,
					js->pos + 1 - js->start);
				consumed = js->pos + 1;
				if (!ok)
					*err_out = NULL;
			}
		}
	}
	if (consumed) {
		g_byte_array_remove_range(js->buf, 0, (guint)consumed);
		js->pos -= consumed;
		js->start = js->start >= consumed ? js->start - consumed : 0;
	}
	if (ok && js->depth > 0 && js->buf->len - js->start > js->max) {
		*err_out = g_strdup_printf("a message longer than %zu bytes", js->max);
		return false;
	}
	return ok;
}

/* Parse @n bytes as a JSON object (a new reference in *node_out) or say why not. */
static bool jparse(const char *data, size_t n, JsonNode **node_out, char **why_out)
{
	JsonParser *parser;
	GError *gerr = NULL;
	JsonNode *root;

	if (n > (size_t)G_MAXSSIZE || memchr(data, '\0', n)) {
		*why_out = g_strdup("not JSON (NUL byte)");
		return false;
	}
	parser = json_parser_new();
	if (!json_parser_load_from_data(parser, data, (gssize)n, &gerr)) {
		*why_out = g_strdup_printf("not JSON (%s)", gerr->message);
		g_error_free(gerr);
		g_object_unref(parser);
		return false;
	}
	root = json_parser_get_root(parser);
	if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
		*why_out = g_strdup("not a JSON object");
		g_object_unref(parser);
		return false;
	}
	*node_out = json_node_ref(root);
	g_object_unref(parser);
	return true;
}

/* ---- requests ---- */

struct etcd_call {
	struct etcd *s;
	const char *path;  /* "/v3/kv/range" */
	const char *body;  /* JSON */
	const char *about; /* "key '/te/segments/a'" for errors */
	size_t max_body;
	uint32_t timeout_ms;
	bool no_token; /* the authenticate call itself */
	JsonNode *resp;
	int64_t grpc_code;
};

static enum te_status etcd_authenticate(struct etcd *s, const char *endpoint, char **err_out);

/* The server's words in an error body ({"error": ..., "code": N, "message": ...}). */
static char *etcd_error_text(long http, GBytes *body, int64_t *code_out)
{
	const char *data = g_bytes_get_data(body, NULL), *msg = NULL;
	size_t n = g_bytes_get_size(body);
	JsonNode *node = NULL;
	char *why = NULL, *text;

	*code_out = 0;
	if (n && jparse(data, n, &node, &why)) {
		JsonObject *o = json_node_get_object(node), *inner = NULL;

		/* Streams wrap errors: {"error": {"grpc_code", "http_code", "message"}}. */
		if (jobj(o, "error", &inner) && inner) {
			if (!ji64(inner, "grpc_code", code_out))
				*code_out = 0;
			if (!jstr(inner, "message", &msg))
				msg = NULL;
		} else {
			if (!ji64(o, "code", code_out))
				*code_out = 0;
			if (!jstr(o, "error", &msg) || !msg)
				if (!jstr(o, "message", &msg))
					msg = NULL;
		}
	}
	if (msg) {
		text = g_strdup_printf("HTTP %ld: %s", http, msg);
	} else {
		g_autofree char *raw = g_utf8_make_valid(n ? data : "", (gssize)MIN(n, 200u));

		text = g_strdup_printf("HTTP %ld: %s", http, g_strstrip(raw));
	}
	if (node)
		json_node_unref(node);
	g_free(why);
	return text;
}

/* A stream endpoint's error after its 200 header: {"error": {...}}. */
static bool etcd_is_stream_error(GBytes *body)
{
	gsize n;
	const char *data = g_bytes_get_data(body, &n);

	while (n && g_ascii_isspace(*data)) {
		data++;
		n--;
	}
	return n >= 8 && memcmp(data, "{\"error\"", 8) == 0;
}

static bool etcd_is_token_error(const char *text)
{
	return strstr(text, "invalid auth token") || strstr(text, "user name is empty") ||
	       strstr(text, "auth token is expired");
}

static char *etcd_token_header(struct etcd *s)
{
	char *h = NULL;

	g_mutex_lock(&s->lock);
	if (s->token)
		h = g_strdup_printf("Authorization: %s", s->token);
	g_mutex_unlock(&s->lock);
	return h;
}

static enum te_status etcd_call_try(void *user, const char *endpoint, char **err_out)
{
	struct etcd_call *c = user;
	struct etcd *s = c->s;
	enum te_status st = TE_OK;

	for (int attempt = 0; attempt < 2; attempt++) {
		g_autofree char *url = g_strconcat(endpoint, c->path, NULL);
		g_autofree char *auth = c->no_token ? NULL : etcd_token_header(s);
		const char *headers[] = { "Content-Type: application/json", auth, NULL };
		struct mdcurl_request r = {
			.method = "POST",
			.url = url,
			.body = c->body,
			.body_len = strlen(c->body),
			.headers = headers,
			.timeout_ms = c->timeout_ms,
			.ca_file = s->p.ca_file,
			.max_body = c->max_body,
			.stop = s->stop,
		};
		g_autofree char *why = NULL;
		GBytes *body = NULL;
		long http = 0;
		char *text;

		st = mdcurl_perform(&r, &http, &body, err_out);
		if (st != TE_OK)
			return st;
		if (http == 200 && !etcd_is_stream_error(body)) {
			gsize n;
			const char *data = g_bytes_get_data(body, &n);
			JsonNode *node;

			if (!jparse(data, n, &node, &why)) {
				*err_out = g_strdup_printf(
					"etcd metadata: %s (%s): malformed response: "
					"%s",
					url, c->about, why);
				g_bytes_unref(body);
				return TE_ERR_METADATA;
			}
			/* Stream endpoints (lease keepalive) wrap: {"result": {...}}. */
			if (json_object_has_member(json_node_get_object(node), "result")) {
				JsonObject *res;

				if (!jobj(json_node_get_object(node), "result", &res) || !res) {
					*err_out = g_strdup_printf(
						"etcd metadata: %s (%s): malformed response: "
						"\"result\" is not an object",
						url, c->about);
					json_node_unref(node);
					g_bytes_unref(body);
					return TE_ERR_METADATA;
				}
				JsonNode *inner = json_node_alloc();

				json_node_init_object(inner, res);
				json_node_unref(node);
				node = inner;
			}
			c->resp = node;
			g_bytes_unref(body);
			return TE_OK;
		}
		text = etcd_error_text(http, body, &c->grpc_code);
		g_bytes_unref(body);
		if (attempt == 0 && !c->no_token && s->p.username && etcd_is_token_error(text)) {
			/* Simple tokens expire and are per member: get a new one and retry. */
			g_autofree char *aerr = NULL;

			log_msg(s->p.log, TE_LOG_DEBUG,
				"etcd metadata: %s refused our token (%s): authenticating again",
				endpoint, text);
			g_free(text);
			st = etcd_authenticate(s, endpoint, &aerr);
			if (st != TE_OK) {
				*err_out = g_steal_pointer(&aerr);
				return st;
			}
			continue;
		}
		if (!s->p.username && strstr(text, "user name is empty")) {
			*err_out = g_strdup_printf("etcd metadata: %s (%s): %s: etcd has "
						   "authentication enabled; configure "
						   "metadata.username and metadata.password_file",
						   url, c->about, text);
			g_free(text);
			return TE_ERR_AUTH;
		}
		*err_out = g_strdup_printf("etcd metadata: %s (%s): %s", url, c->about, text);
		g_free(text);
		if (c->grpc_code == ETCD_GRPC_UNAVAILABLE || http == 503)
			return TE_ERR_METADATA_UNAVAILABLE;
		return TE_ERR_METADATA;
	}
	return st;
}

/* POST @body to @path on the endpoints (failover); the response object in *resp_out. */
static enum te_status etcd_call(struct etcd *s, const char *path, const char *body,
				const char *about, size_t max_body, uint32_t timeout_ms,
				JsonNode **resp_out, int64_t *grpc_code_out, char **err_out)
{
	struct etcd_call c = {
		.s = s,
		.path = path,
		.body = body,
		.about = about,
		.max_body = max_body,
		.timeout_ms = timeout_ms ? timeout_ms : s->timeout_ms,
	};
	enum te_status st = mdcurl_failover(&s->eps, "etcd metadata", etcd_call_try, &c, err_out);

	if (grpc_code_out)
		*grpc_code_out = c.grpc_code;
	if (st == TE_OK)
		*resp_out = c.resp;
	return st;
}

/* A new token from @endpoint (username/password); "auth not enabled" means none needed. */
static enum te_status etcd_authenticate(struct etcd *s, const char *endpoint, char **err_out)
{
	g_autofree char *url = g_strconcat(endpoint, "/v3/auth/authenticate", NULL);
	JsonBuilder *b = json_builder_new();
	g_autofree char *body = NULL;
	struct etcd_call c = {
		.s = s,
		.path = "/v3/auth/authenticate",
		.about = "authenticate",
		.max_body = ETCD_MAX_SMALL_RESPONSE,
		.timeout_ms = s->timeout_ms,
		.no_token = true,
	};
	const char *token = NULL;
	enum te_status st;
	JsonNode *root;

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "name");
	json_builder_add_string_value(b, s->p.username);
	json_builder_set_member_name(b, "password");
	json_builder_add_string_value(b, s->p.password ? s->p.password : "");
	json_builder_end_object(b);
	root = json_builder_get_root(b);
	body = json_to_string(root, FALSE);
	json_node_unref(root);
	g_object_unref(b);
	c.body = body;

	st = etcd_call_try(&c, endpoint, err_out);
	if (st == TE_ERR_METADATA && strstr(*err_out, "authentication is not enabled")) {
		g_clear_pointer(err_out, g_free);
		g_mutex_lock(&s->lock);
		g_clear_pointer(&s->token, g_free);
		g_mutex_unlock(&s->lock);
		return TE_OK;
	}
	if (st == TE_ERR_METADATA) {
		char *e = *err_out;

		*err_out = g_strdup_printf("%s (user '%s')", e, s->p.username);
		g_free(e);
		return strstr(*err_out, "authentication failed") ? TE_ERR_AUTH : st;
	}
	if (st != TE_OK)
		return st;
	if (!jstr(json_node_get_object(c.resp), "token", &token) || !token || !*token) {
		*err_out =
			g_strdup_printf("etcd metadata: %s: malformed response: no \"token\"", url);
		json_node_unref(c.resp);
		return TE_ERR_METADATA;
	}
	g_mutex_lock(&s->lock);
	g_free(s->token);
	s->token = g_strdup(token);
	g_mutex_unlock(&s->lock);
	json_node_unref(c.resp);
	return TE_OK;
}

static enum te_status etcd_authenticate_any(void *user, const char *endpoint, char **err_out)
{
	return etcd_authenticate(user, endpoint, err_out);
}

/* The header's revision of a response. */
static bool etcd_revision(JsonObject *o, int64_t *rev_out)
{
	JsonObject *h;

	return jobj(o, "header", &h) && h && ji64(h, "revision", rev_out);
}

/* One kv of a range response: key (NUL-terminated copy), value, revisions, lease. */
struct etcd_kv {
	char *key;
	GBytes *value; /* NULL with keys_only */
	int64_t mod_revision;
	int64_t lease;
};

static void etcd_kv_clear(struct etcd_kv *kv)
{
	g_free(kv->key);
	if (kv->value)
		g_bytes_unref(kv->value);
	memset(kv, 0, sizeof(*kv));
}

static bool etcd_kv_parse(JsonNode *n, bool with_value, struct etcd_kv *kv, char **why_out)
{
	JsonObject *o;
	GBytes *key;
	gsize klen;
	const char *k;

	memset(kv, 0, sizeof(*kv));
	if (!n || !JSON_NODE_HOLDS_OBJECT(n)) {
		*why_out = g_strdup("a kv is not an object");
		return false;
	}
	o = json_node_get_object(n);
	key = jb64(o, "key");
	if (!key) {
		*why_out = g_strdup("a kv's \"key\" is not base64");
		return false;
	}
	k = g_bytes_get_data(key, &klen);
	if (klen == 0 || memchr(k, '\0', klen)) {
		g_bytes_unref(key);
		*why_out = g_strdup("a kv's \"key\" is empty or holds a NUL byte");
		return false;
	}
	kv->key = g_strndup(k, klen);
	g_bytes_unref(key);
	if (!ji64(o, "mod_revision", &kv->mod_revision) || !ji64(o, "lease", &kv->lease)) {
		*why_out = g_strdup_printf("kv '%s': \"mod_revision\" or \"lease\" is not an "
					   "integer",
					   kv->key);
		etcd_kv_clear(kv);
		return false;
	}
	if (with_value) {
		kv->value = jb64(o, "value");
		if (!kv->value) {
			*why_out = g_strdup_printf("kv '%s': \"value\" is not base64", kv->key);
			etcd_kv_clear(kv);
			return false;
		}
		if (g_bytes_get_size(kv->value) > DESCRIPTOR_MAX_JSON) {
			*why_out = g_strdup_printf("kv '%s': value of %zu bytes is over the limit "
						   "of %u",
						   kv->key, g_bytes_get_size(kv->value),
						   DESCRIPTOR_MAX_JSON);
			etcd_kv_clear(kv);
			return false;
		}
	}
	return true;
}

/* Range of one key: *found false when absent. */
static enum te_status etcd_range_key(struct etcd *s, const char *key, uint32_t timeout_ms,
				     bool *found_out, struct etcd_kv *kv_out, char **err_out)
{
	g_autofree char *k64 = b64s(key);
	g_autofree char *body = g_strdup_printf("{\"key\":\"%s\"}", k64);
	g_autofree char *about = g_strdup_printf("key '%s'", key);
	g_autofree char *why = NULL;
	JsonNode *resp;
	JsonArray *kvs;
	enum te_status st;

	st = etcd_call(s, "/v3/kv/range", body, about, ETCD_MAX_VALUE_RESPONSE, timeout_ms, &resp,
		       NULL, err_out);
	if (st != TE_OK)
		return st;
	*found_out = false;
	if (!jarr(json_node_get_object(resp), "kvs", &kvs)) {
		why = g_strdup("\"kvs\" is not an array");
	} else if (kvs && json_array_get_length(kvs) > 0) {
		if (etcd_kv_parse(json_array_get_element(kvs, 0), true, kv_out, &why))
			*found_out = true;
	}
	json_node_unref(resp);
	if (why) {
		*err_out = g_strdup_printf(
			"etcd metadata: range of key '%s': malformed response: %s", key, why);
		return TE_ERR_METADATA;
	}
	return TE_OK;
}

/* ---- ops ---- */

static gpointer etcd_keeper_main(gpointer data);

static enum te_status etcd_get(void *state, const char *name, uint32_t timeout_ms,
			       GBytes **json_out, char **err_out)
{
	struct etcd *s = state;
	g_autofree char *key = metadata_key(s->p.ns, name);
	struct etcd_kv kv;
	bool found;
	enum te_status st = etcd_range_key(s, key, timeout_ms, &found, &kv, err_out);

	if (st != TE_OK)
		return st;
	if (!found) {
		*err_out = g_strdup_printf("etcd metadata: no segment '%s' (key '%s' is absent)",
					   name, key);
		return TE_ERR_METADATA_NOT_FOUND;
	}
	*json_out = g_bytes_ref(kv.value);
	etcd_kv_clear(&kv);
	return TE_OK;
}

/* A lease of ttl_s (op_lock held). */
static enum te_status etcd_lease_grant(struct etcd *s, char **err_out)
{
	g_autofree char *body = g_strdup_printf("{\"TTL\":\"%" PRIu32 "\"}", s->p.ttl_s);
	JsonNode *resp;
	int64_t id = 0, ttl = 0;
	enum te_status st;

	st = etcd_call(s, "/v3/lease/grant", body, "lease grant", ETCD_MAX_SMALL_RESPONSE, 0, &resp,
		       NULL, err_out);
	if (st != TE_OK)
		return st;
	if (!ji64(json_node_get_object(resp), "ID", &id) ||
	    !ji64(json_node_get_object(resp), "TTL", &ttl) || id == 0 || ttl <= 0) {
		const char *e = NULL;

		if (!jstr(json_node_get_object(resp), "error", &e))
			e = NULL;
		*err_out = g_strdup_printf("etcd metadata: lease grant: malformed response "
					   "(no \"ID\" and \"TTL\")%s%s",
					   e ? ": " : "", e ? e : "");
		json_node_unref(resp);
		return TE_ERR_METADATA;
	}
	json_node_unref(resp);
	s->lease = id;
	s->lease_ttl_s = ttl;
	return TE_OK;
}

static void etcd_lease_revoke(struct etcd *s)
{
	g_autofree char *body = NULL;
	g_autofree char *err = NULL;
	JsonNode *resp;

	if (!s->lease)
		return;
	body = g_strdup_printf("{\"ID\":\"%" PRId64 "\"}", s->lease);
	if (etcd_call(s, "/v3/lease/revoke", body, "lease revoke", ETCD_MAX_SMALL_RESPONSE, 0,
		      &resp, NULL, &err) == TE_OK)
		json_node_unref(resp);
	else
		log_msg(s->p.log, TE_LOG_DEBUG, "%s (the lease expires by itself)", err);
	s->lease = 0;
}

/*
 * A txn on @key: if @cmp (a compare object) holds, put @pub's value with our lease; else
 * range the key. *succeeded and, on failure, the key's current kv (*found false: absent).
 */
static enum te_status etcd_txn_put(struct etcd *s, struct mdcurl_pub *pub, const char *cmp,
				   bool *succeeded_out, bool *found_out, struct etcd_kv *kv_out,
				   int64_t *grpc_code_out, char **err_out)
{
	g_autofree char *k64 = b64s(pub->key);
	g_autofree char *v64 = b64(g_bytes_get_data(pub->json, NULL), g_bytes_get_size(pub->json));
	g_autofree char *about = g_strdup_printf("txn on key '%s'", pub->key);
	g_autofree char *body = g_strdup_printf(
		"{\"compare\":[%s],"
		"\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64
		"\"}}],"
		"\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
		cmp, k64, v64, s->lease, k64);
	g_autofree char *why = NULL;
	JsonObject *o;
	JsonArray *resps;
	JsonNode *resp;
	enum te_status st;

	st = etcd_call(s, "/v3/kv/txn", body, about, ETCD_MAX_VALUE_RESPONSE, 0, &resp,
		       grpc_code_out, err_out);
	if (st != TE_OK)
		return st;
	o = json_node_get_object(resp);
	*succeeded_out = jbool(o, "succeeded");
	*found_out = false;
	if (!*succeeded_out) {
		JsonObject *r0 = NULL, *rr = NULL;
		JsonArray *kvs = NULL;

		if (!jarr(o, "responses", &resps) || !resps || json_array_get_length(resps) != 1 ||
		    !JSON_NODE_HOLDS_OBJECT(json_array_get_element(resps, 0)))
			why = g_strdup("no \"responses\" of the failure branch");
		else if (!(r0 = json_array_get_object_element(resps, 0)) ||
			 !jobj(r0, "response_range", &rr) || !rr || !jarr(rr, "kvs", &kvs))
			why = g_strdup("no \"response_range\" with \"kvs\"");
		else if (kvs && json_array_get_length(kvs) > 0 &&
			 etcd_kv_parse(json_array_get_element(kvs, 0), true, kv_out, &why))
			*found_out = true;
	}
	json_node_unref(resp);
	if (why) {
		*err_out = g_strdup_printf("etcd metadata: txn on key '%s': malformed response: %s",
					   pub->key, why);
		return TE_ERR_METADATA;
	}
	return TE_OK;
}

static bool etcd_lease_lost(int64_t grpc_code, const char *err)
{
	return grpc_code == ETCD_GRPC_NOT_FOUND || (err && strstr(err, "lease not found"));
}

/*
 * Store @pub's value under its key with our lease (op_lock held): create it when absent,
 * overwrite it when it is ours (same generation), when its holder is gone (same rpc: we
 * bound its port) or when no lease keeps it; else TE_ERR_EXISTS naming the holder.
 */
static enum te_status etcd_claim(struct etcd *s, struct mdcurl_pub *pub, char **err_out)
{
	for (int attempt = 0; attempt < 5; attempt++) {
		g_autofree char *k64 = b64s(pub->key);
		g_autofree char *cmp = NULL;
		g_autofree char *holder_gen = NULL;
		g_autofree char *holder_rpc = NULL;
		struct etcd_kv kv = { 0 };
		int64_t code = 0;
		bool ok, found, ours, same_rpc;
		enum te_status st;

		if (!s->lease) {
			st = etcd_lease_grant(s, err_out);
			if (st != TE_OK)
				return st;
		}
		cmp = g_strdup_printf("{\"key\":\"%s\",\"result\":\"EQUAL\",\"target\":\"CREATE\","
				      "\"create_revision\":\"0\"}",
				      k64);
		st = etcd_txn_put(s, pub, cmp, &ok, &found, &kv, &code, err_out);
		if (st == TE_ERR_METADATA && etcd_lease_lost(code, *err_out)) {
			g_clear_pointer(err_out, g_free);
			s->lease = 0;
			continue;
		}
		if (st != TE_OK)
			return st;
		if (ok) {
			pub->dirty = false;
			return TE_OK;
		}
		if (!found)
			continue; /* deleted in between */
		mdcurl_holder(g_bytes_get_data(kv.value, NULL), g_bytes_get_size(kv.value),
			      &holder_gen, &holder_rpc);
		ours = holder_gen && pub->generation && strcmp(holder_gen, pub->generation) == 0;
		same_rpc =
			holder_rpc && *holder_rpc && pub->rpc && strcmp(holder_rpc, pub->rpc) == 0;
		if (!ours && !same_rpc && kv.lease != 0) {
			*err_out = g_strdup_printf(
				"etcd metadata: segment name '%s' is held by another live engine "
				"(rpc %s, generation %s; key '%s' under lease %" PRId64
				"): is an engine with the same name running? Stop it, or give this "
				"one another name",
				pub->name, holder_rpc ? holder_rpc : "(none)",
				holder_gen ? holder_gen : "(none)", pub->key, kv.lease);
			etcd_kv_clear(&kv);
			return TE_ERR_EXISTS;
		}
		if (!ours)
			log_msg(s->p.log, same_rpc ? TE_LOG_INFO : TE_LOG_WARN,
				"etcd metadata: taking over segment name '%s' from generation %s "
				"(%s)",
				pub->name, holder_gen ? holder_gen : "(none)",
				same_rpc ? "same rpc address: that process is gone"
					 : "a value no lease keeps alive");
		g_free(cmp);
		cmp = g_strdup_printf("{\"key\":\"%s\",\"result\":\"EQUAL\",\"target\":\"MOD\","
				      "\"mod_revision\":\"%" PRId64 "\"}",
				      k64, kv.mod_revision);
		etcd_kv_clear(&kv);
		st = etcd_txn_put(s, pub, cmp, &ok, &found, &kv, &code, err_out);
		etcd_kv_clear(&kv);
		if (st == TE_ERR_METADATA && etcd_lease_lost(code, *err_out)) {
			g_clear_pointer(err_out, g_free);
			s->lease = 0;
			continue;
		}
		if (st != TE_OK)
			return st;
		if (ok) {
			pub->dirty = false;
			return TE_OK;
		}
	}
	*err_out = g_strdup_printf("etcd metadata: key '%s' kept changing while publishing "
				   "segment '%s' (5 attempts)",
				   pub->key, pub->name);
	return TE_ERR_METADATA;
}

static enum te_status etcd_publish(void *state, const char *name, const char *json, size_t len,
				   char **err_out)
{
	struct etcd *s = state;
	struct mdcurl_pub *pub;
	bool is_new = false;
	enum te_status st;

	g_mutex_lock(&s->op_lock);
	st = mdcurl_pub_set(s->pubs, "etcd", s->p.ns, name, json, len, &pub, &is_new, err_out);
	if (st != TE_OK) {
		g_mutex_unlock(&s->op_lock);
		return st;
	}
	pub->dirty = true;
	st = etcd_claim(s, pub, err_out);
	if (st != TE_OK && is_new) {
		g_hash_table_remove(s->pubs, name);
		if (g_hash_table_size(s->pubs) == 0)
			etcd_lease_revoke(s);
	}
	g_mutex_unlock(&s->op_lock);
	if (st == TE_OK) {
		/* Wake the keeper so its period starts from a live lease. */
		g_mutex_lock(&s->lock);
		g_cond_broadcast(&s->cond);
		g_mutex_unlock(&s->lock);
	}
	return st;
}

static enum te_status etcd_withdraw(void *state, const char *name, char **err_out)
{
	struct etcd *s = state;
	enum te_status st = TE_OK;
	struct mdcurl_pub *pub;

	g_mutex_lock(&s->op_lock);
	pub = g_hash_table_lookup(s->pubs, name);
	if (pub && s->lease) {
		/* Delete only while the key is still under our lease (not taken over). */
		g_autofree char *k64 = b64s(pub->key);
		g_autofree char *about = g_strdup_printf("delete of key '%s'", pub->key);
		g_autofree char *body = g_strdup_printf(
			"{\"compare\":[{\"key\":\"%s\",\"result\":\"EQUAL\",\"target\":\"LEASE\","
			"\"lease\":\"%" PRId64 "\"}],"
			"\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
			k64, s->lease, k64);
		JsonNode *resp;

		st = etcd_call(s, "/v3/kv/txn", body, about, ETCD_MAX_SMALL_RESPONSE, 0, &resp,
			       NULL, err_out);
		if (st == TE_OK)
			json_node_unref(resp);
	}
	if (pub)
		g_hash_table_remove(s->pubs, name);
	if (g_hash_table_size(s->pubs) == 0)
		etcd_lease_revoke(s);
	g_mutex_unlock(&s->op_lock);
	return st;
}

/* ---- keeper: lease keepalive, re-publication after a loss ---- */

/* Keep the lease alive once (op_lock held): *lost when etcd no longer has it. */
static enum te_status etcd_keepalive(struct etcd *s, bool *lost_out, char **err_out)
{
	g_autofree char *body = NULL;
	JsonNode *resp;
	int64_t ttl = 0, code = 0;
	enum te_status st;

	*lost_out = false;
	if (!s->lease) {
		*lost_out = true;
		return TE_OK;
	}
	body = g_strdup_printf("{\"ID\":\"%" PRId64 "\"}", s->lease);
	st = etcd_call(s, "/v3/lease/keepalive", body, "lease keepalive", ETCD_MAX_SMALL_RESPONSE,
		       0, &resp, &code, err_out);
	if (st == TE_ERR_METADATA && etcd_lease_lost(code, *err_out)) {
		g_clear_pointer(err_out, g_free);
		*lost_out = true;
		return TE_OK;
	}
	if (st != TE_OK)
		return st;
	if (!ji64(json_node_get_object(resp), "TTL", &ttl)) {
		*err_out = g_strdup("etcd metadata: lease keepalive: malformed response (\"TTL\" "
				    "is not an integer)");
		json_node_unref(resp);
		return TE_ERR_METADATA;
	}
	json_node_unref(resp);
	*lost_out = ttl <= 0; /* etcd answers TTL 0 for a lease it does not have */
	return TE_OK;
}

/* Claim every publication again under the current (new) lease (op_lock held). */
static enum te_status etcd_republish(struct etcd *s, bool all, char **err_out)
{
	GHashTableIter it;
	gpointer v;

	g_hash_table_iter_init(&it, s->pubs);
	while (g_hash_table_iter_next(&it, NULL, &v)) {
		struct mdcurl_pub *pub = v;
		enum te_status st;

		if (!all && !pub->dirty)
			continue;
		pub->dirty = true;
		st = etcd_claim(s, pub, err_out);
		if (st != TE_OK)
			return st;
	}
	return TE_OK;
}

static char *etcd_pub_names(struct etcd *s)
{
	GString *names = g_string_new(NULL);
	GHashTableIter it;
	gpointer k;

	g_hash_table_iter_init(&it, s->pubs);
	while (g_hash_table_iter_next(&it, &k, NULL))
		g_string_append_printf(names, "%s'%s'", names->len ? ", " : "", (char *)k);
	return g_string_free(names, FALSE);
}

static gpointer etcd_keeper_main(gpointer data)
{
	struct etcd *s = data;
	bool outage = false;
	gint64 outage_since = 0;
	uint32_t backoff_ms = 0;

	for (;;) {
		g_autofree char *err = NULL;
		uint32_t period_ms;
		enum te_status st;
		bool lost = false;
		bool stopping;
		gint64 until;

		g_mutex_lock(&s->op_lock);
		period_ms =
			(uint32_t)MAX((s->lease_ttl_s ? s->lease_ttl_s : s->p.ttl_s) * 1000 / 3, 1);
		g_mutex_unlock(&s->op_lock);
		until = g_get_monotonic_time() +
			(gint64)(backoff_ms ? backoff_ms : period_ms) * 1000;
		g_mutex_lock(&s->lock);
		while (!s->stopping && g_get_monotonic_time() < until)
			g_cond_wait_until(&s->cond, &s->lock, until);
		stopping = s->stopping;
		g_mutex_unlock(&s->lock);
		if (stopping)
			break;

		g_mutex_lock(&s->op_lock);
		if (g_hash_table_size(s->pubs) == 0) {
			g_mutex_unlock(&s->op_lock);
			backoff_ms = 0;
			continue;
		}
		st = etcd_keepalive(s, &lost, &err);
		if (st == TE_OK && lost) {
			g_autofree char *names = etcd_pub_names(s);

			if (!outage)
				log_msg(s->p.log, TE_LOG_WARN,
					"etcd metadata: lease %" PRId64 " is gone (etcd lost its "
					"data, or it expired during a partition); re-publishing "
					"%s",
					s->lease, names);
			if (!outage)
				outage_since = g_get_monotonic_time();
			outage = true;
			s->lease = 0;
			st = etcd_republish(s, true, &err);
		} else if (st == TE_OK) {
			st = etcd_republish(s, false, &err); /* a publish etcd missed */
		}
		if (st == TE_OK) {
			if (outage) {
				g_autofree char *names = etcd_pub_names(s);

				log_msg(s->p.log, TE_LOG_INFO,
					"etcd metadata: %s published again (lease %" PRId64
					") after %.1f s",
					names, s->lease,
					(double)(g_get_monotonic_time() - outage_since) / 1e6);
			}
			outage = false;
			backoff_ms = 0;
		} else if (st != TE_ERR_CANCELED) {
			if (!outage) {
				log_msg(s->p.log, TE_LOG_WARN,
					"etcd metadata: keeping lease %" PRId64
					" alive failed: %s; "
					"retrying (published names may expire)",
					s->lease, err);
				outage_since = g_get_monotonic_time();
			} else {
				log_msg(s->p.log, TE_LOG_DEBUG, "etcd metadata: still failing: %s",
					err);
			}
			outage = true;
			backoff_ms = backoff_ms ? MIN(backoff_ms * 2, period_ms)
						: MIN(ETCD_BACKOFF_MIN_MS, period_ms);
		}
		g_mutex_unlock(&s->op_lock);
	}
	return NULL;
}

/* ---- watcher ---- */

/*
 * What the watcher last knew of a name. A store that lost its data counts revisions from 1
 * again, so a value put back may carry the mod_revision it had before: its lease (granted
 * anew, with another id) tells it apart, and a store revision below the last one seen says
 * that every value is new.
 */
struct etcd_seen {
	int64_t mod_revision;
	int64_t lease;
};

static struct etcd_seen *etcd_seen_new(const struct etcd_kv *kv)
{
	struct etcd_seen *e = g_new(struct etcd_seen, 1);

	e->mod_revision = kv->mod_revision;
	e->lease = kv->lease;
	return e;
}

struct etcd_watch {
	struct etcd *s;
	char *prefix_end;
	GHashTable *seen; /* name -> struct etcd_seen* */
	int64_t next_rev; /* watch from here */
	bool synced;	  /* seen reflects the store */
	bool established; /* the stream's creation was confirmed */
	bool reauth;	  /* the stream said our token is no good */
	struct jsplit js;
	char *stream_err;
};

/* @resync: a delete found by etcd_resync (metadata_watch_fn), not reported by the stream. */
static void etcd_deliver(struct etcd *s, const char *name, GBytes *value, bool resync)
{
	if (value) {
		gsize n;
		const char *d = g_bytes_get_data(value, &n);

		/* An empty value is a value, not a delete: never hand out NULL for it. */
		s->watch_fn(s->watch_user, name, d ? d : "", n, false);
	} else
		s->watch_fn(s->watch_user, name, NULL, 0, resync);
}

/*
 * Range the prefix (keys only) and bring seen up to date, delivering (after the first
 * sync) what changed while the stream was down: values whose mod_revision differs (newer,
 * or a store that lost its data and counts again) and deletes of names that are gone.
 */
static enum te_status etcd_resync(struct etcd_watch *w, char **err_out)
{
	struct etcd *s = w->s;
	g_autofree char *p64 = b64s(s->prefix);
	g_autofree char *e64 = b64s(w->prefix_end);
	g_autofree char *body = g_strdup_printf(
		"{\"key\":\"%s\",\"range_end\":\"%s\",\"keys_only\":true}", p64, e64);
	g_autofree char *about = g_strdup_printf("prefix '%s'", s->prefix);
	g_autofree char *why = NULL;
	GHashTable *now = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	GPtrArray *changed = g_ptr_array_new_with_free_func(g_free);
	GPtrArray *gone = g_ptr_array_new_with_free_func(g_free);
	int64_t rev = 0;
	JsonArray *kvs = NULL;
	JsonNode *resp;
	GHashTableIter it;
	gpointer k, v;
	enum te_status st;

	st = etcd_call(s, "/v3/kv/range", body, about, ETCD_MAX_LIST_RESPONSE, 0, &resp, NULL,
		       err_out);
	if (st != TE_OK)
		goto out;
	if (!etcd_revision(json_node_get_object(resp), &rev) || rev <= 0)
		why = g_strdup("no \"header\".\"revision\"");
	else if (!jarr(json_node_get_object(resp), "kvs", &kvs))
		why = g_strdup("\"kvs\" is not an array");
	for (guint i = 0; !why && kvs && i < json_array_get_length(kvs); i++) {
		struct etcd_kv kv;
		const char *name;

		if (!etcd_kv_parse(json_array_get_element(kvs, i), false, &kv, &why))
			break;
		name = metadata_key_name(s->p.ns, kv.key);
		if (name)
			g_hash_table_replace(now, g_strdup(name), etcd_seen_new(&kv));
		etcd_kv_clear(&kv);
	}
	json_node_unref(resp);
	if (why) {
		*err_out = g_strdup_printf("etcd metadata: range of prefix '%s': malformed "
					   "response: %s",
					   s->prefix, why);
		st = TE_ERR_METADATA;
		goto out;
	}
	if (w->synced) {
		/* The store went back in time: it lost its data, and every value is new. */
		bool wiped = rev < w->next_rev - 1;

		if (wiped)
			log_msg(s->p.log, TE_LOG_INFO,
				"etcd metadata: the store's revision went back from %" PRId64
				" to %" PRId64 " (it lost its data): every value under '%s' is new",
				w->next_rev - 1, rev, s->prefix);
		g_hash_table_iter_init(&it, now);
		while (g_hash_table_iter_next(&it, &k, &v)) {
			const struct etcd_seen *old = g_hash_table_lookup(w->seen, k);
			const struct etcd_seen *cur = v;

			if (wiped || !old || old->mod_revision != cur->mod_revision ||
			    old->lease != cur->lease)
				g_ptr_array_add(changed, g_strdup(k));
		}
		g_hash_table_iter_init(&it, w->seen);
		while (g_hash_table_iter_next(&it, &k, NULL))
			if (!g_hash_table_contains(now, k))
				g_ptr_array_add(gone, g_strdup(k));
	}
	g_hash_table_unref(w->seen);
	w->seen = g_hash_table_ref(now);
	w->next_rev = rev + 1;
	w->synced = true;
	for (guint i = 0; i < gone->len; i++)
		etcd_deliver(s, gone->pdata[i], NULL, true);
	for (guint i = 0; i < changed->len; i++) {
		g_autofree char *key = metadata_key(s->p.ns, changed->pdata[i]);
		g_autofree char *err = NULL;
		struct etcd_kv kv;
		bool found = false;

		if (mdcurl_stop_fired(s->stop))
			break;
		if (etcd_range_key(s, key, 0, &found, &kv, &err) != TE_OK) {
			/* The value is still announced: a reader refreshes on a failure. */
			log_msg(s->p.log, TE_LOG_DEBUG, "%s", err);
			continue;
		}
		if (found) {
			etcd_deliver(s, changed->pdata[i], kv.value, false);
			etcd_kv_clear(&kv);
		} else {
			g_hash_table_remove(w->seen, changed->pdata[i]);
			etcd_deliver(s, changed->pdata[i], NULL, true);
		}
	}
out:
	g_hash_table_unref(now);
	g_ptr_array_unref(changed);
	g_ptr_array_unref(gone);
	return st;
}

/* One message of the stream; false ends it (the reason in w->stream_err). */
static bool etcd_watch_message(void *user, const char *data, size_t n)
{
	struct etcd_watch *w = user;
	struct etcd *s = w->s;
	g_autofree char *why = NULL;
	JsonObject *o, *res = NULL, *err = NULL;
	JsonArray *events = NULL;
	JsonNode *node;
	bool keep = true;

	if (!jparse(data, n, &node, &why)) {
		w->stream_err = g_strdup_printf("malformed watch message: %s", why);
		return false;
	}
	o = json_node_get_object(node);
	if (!jobj(o, "error", &err) || err) {
		const char *msg = NULL;

		if (err && !jstr(err, "message", &msg))
			msg = NULL;
		w->stream_err = g_strdup_printf("watch error: %s", msg ? msg : "(no message)");
		w->reauth = msg && etcd_is_token_error(msg);
		keep = false;
		goto out;
	}
	if (!jobj(o, "result", &res) || !res || !jarr(res, "events", &events)) {
		w->stream_err = g_strdup("malformed watch message: no \"result\" object");
		keep = false;
		goto out;
	}
	if (jbool(res, "created"))
		w->established = true;
	if (jbool(res, "canceled")) {
		const char *reason = NULL;
		int64_t compact = 0;

		if (!jstr(res, "cancel_reason", &reason))
			reason = NULL;
		if (!ji64(res, "compact_revision", &compact))
			compact = 0;
		w->stream_err = g_strdup_printf("watch canceled by etcd: %s (compact revision "
						"%" PRId64 ")",
						reason ? reason : "no reason", compact);
		w->reauth = reason && etcd_is_token_error(reason);
		keep = false;
		goto out;
	}
	for (guint i = 0; events && i < json_array_get_length(events); i++) {
		JsonNode *en = json_array_get_element(events, i);
		JsonObject *eo, *kvo = NULL;
		const char *type = NULL, *name;
		struct etcd_kv kv;
		bool del;

		if (!JSON_NODE_HOLDS_OBJECT(en) || !(eo = json_node_get_object(en)) ||
		    !jstr(eo, "type", &type) || !jobj(eo, "kv", &kvo) || !kvo) {
			w->stream_err = g_strdup("malformed watch event (no \"kv\" object)");
			keep = false;
			goto out;
		}
		/* The gateway leaves out default values: no "type" is PUT. */
		del = type && strcmp(type, "DELETE") == 0;
		if (type && !del && strcmp(type, "PUT") != 0) {
			w->stream_err = g_strdup_printf("watch event of unknown type '%s'", type);
			keep = false;
			goto out;
		}
		if (!etcd_kv_parse(json_object_get_member(eo, "kv"), !del, &kv, &why)) {
			w->stream_err = g_strdup_printf("malformed watch event: %s", why);
			keep = false;
			goto out;
		}
		if (kv.mod_revision >= w->next_rev)
			w->next_rev = kv.mod_revision + 1;
		name = metadata_key_name(s->p.ns, kv.key);
		if (name) {
			if (del) {
				g_hash_table_remove(w->seen, name);
			} else {
				g_hash_table_replace(w->seen, g_strdup(name), etcd_seen_new(&kv));
			}
			etcd_deliver(s, name, del ? NULL : kv.value, false);
		}
		etcd_kv_clear(&kv);
	}
out:
	json_node_unref(node);
	return keep;
}

static bool etcd_watch_data(void *user, const char *data, size_t len)
{
	struct etcd_watch *w = user;
	char *err = NULL;

	if (!jsplit_feed(&w->js, data, len, etcd_watch_message, w, &err)) {
		if (err) {
			g_free(w->stream_err);
			w->stream_err = err;
		}
		return false;
	}
	return true;
}

/* Hold one watch stream on @endpoint from w->next_rev until it ends. */
static enum te_status etcd_watch_try(void *user, const char *endpoint, char **err_out)
{
	struct etcd_watch *w = user;
	struct etcd *s = w->s;
	g_autofree char *url = g_strconcat(endpoint, "/v3/watch", NULL);
	g_autofree char *auth = etcd_token_header(s);
	g_autofree char *p64 = b64s(s->prefix);
	g_autofree char *e64 = b64s(w->prefix_end);
	g_autofree char *body = g_strdup_printf(
		"{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\",\"start_revision\":"
		"\"%" PRId64 "\"}}",
		p64, e64, w->next_rev);
	const char *headers[] = { "Content-Type: application/json", auth, NULL };
	struct mdcurl_request r = {
		.method = "POST",
		.url = url,
		.body = body,
		.body_len = strlen(body),
		.headers = headers,
		.timeout_ms = 0,
		.connect_timeout_ms = s->timeout_ms,
		.ca_file = s->p.ca_file,
		.max_body = ETCD_MAX_WATCH_MESSAGE,
		.on_data = etcd_watch_data,
		.user = w,
		.stop = s->stop,
		.tcp_keepalive = true,
	};
	enum te_status st;
	long http = 0;

	g_byte_array_set_size(w->js.buf, 0);
	w->js.pos = w->js.start = 0;
	w->js.depth = 0;
	w->js.in_str = w->js.esc = false;
	w->established = false;
	g_clear_pointer(&w->stream_err, g_free);
	st = mdcurl_perform(&r, &http, NULL, err_out);
	if (st == TE_ERR_METADATA_UNAVAILABLE && w->established) {
		/* It worked, then broke (server restart): resync, from this endpoint first. */
		char *e = *err_out;

		*err_out = g_strdup_printf("etcd metadata: watch stream broke: %s", e);
		g_free(e);
		return TE_ERR_CONN_RESET;
	}
	if (st != TE_OK)
		return st;
	if (http != 200) {
		*err_out = g_strdup_printf("etcd metadata: %s: HTTP %ld%s%s", url, http,
					   w->stream_err ? ": " : "",
					   w->stream_err ? w->stream_err : "");
		return http == 503 ? TE_ERR_METADATA_UNAVAILABLE : TE_ERR_METADATA;
	}
	*err_out = g_strdup_printf("etcd metadata: %s: watch stream ended: %s", url,
				   w->stream_err ? w->stream_err : "closed by the server");
	return TE_ERR_CONN_RESET;
}

static void etcd_sleep(struct etcd *s, uint32_t ms)
{
	gint64 until = g_get_monotonic_time() + (gint64)ms * 1000;

	g_mutex_lock(&s->lock);
	while (!s->stopping && g_get_monotonic_time() < until)
		g_cond_wait_until(&s->cond, &s->lock, until);
	g_mutex_unlock(&s->lock);
}

static gpointer etcd_watch_main(gpointer data)
{
	struct etcd_watch *w = data;
	struct etcd *s = w->s;
	uint32_t backoff_ms = 0;
	bool outage = false;

	while (!mdcurl_stop_fired(s->stop)) {
		g_autofree char *err = NULL;
		gint64 started;
		enum te_status st;

		if (backoff_ms)
			etcd_sleep(s, backoff_ms);
		if (mdcurl_stop_fired(s->stop))
			break;
		if (w->reauth && s->p.username) {
			w->reauth = false;
			st = mdcurl_failover(&s->eps, "etcd metadata", etcd_authenticate_any, s,
					     &err);
			if (st != TE_OK)
				goto failed;
		}
		st = etcd_resync(w, &err);
		if (st != TE_OK)
			goto failed;
		if (outage)
			log_msg(s->p.log, TE_LOG_INFO, "etcd metadata: watch of '%s' resumed",
				s->prefix);
		outage = false;
		backoff_ms = 0;
		started = g_get_monotonic_time();
		st = mdcurl_failover(&s->eps, "etcd metadata", etcd_watch_try, w, &err);
		if (st == TE_ERR_CANCELED)
			break;
		/*
		 * A stream that ran a while and ended is resynced at once; one that failed or
		 * was cut right away backs off (no spinning on a server that refuses it).
		 */
		log_msg(s->p.log, TE_LOG_DEBUG, "%s", err);
		if (w->established && !w->reauth &&
		    g_get_monotonic_time() - started > G_USEC_PER_SEC)
			continue;
failed:
		if (st == TE_ERR_CANCELED)
			break;
		if (!outage)
			log_msg(s->p.log, TE_LOG_WARN,
				"etcd metadata: watch of '%s' interrupted: %s; reconnecting",
				s->prefix, err);
		outage = true;
		backoff_ms = backoff_ms ? MIN(backoff_ms * 2, ETCD_WATCH_BACKOFF_MAX_MS)
					: ETCD_BACKOFF_MIN_MS;
	}
	return w;
}

static enum te_status etcd_watch_start(void *state, metadata_watch_fn fn, void *user,
				       char **err_out)
{
	struct etcd *s = state;
	struct etcd_watch *w;
	GError *gerr = NULL;
	enum te_status st;

	if (s->watcher) {
		*err_out = g_strdup("etcd metadata: already watching");
		return TE_ERR_BUSY;
	}
	w = g_new0(struct etcd_watch, 1);
	w->s = s;
	w->prefix_end = prefix_end(s->prefix);
	w->seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	w->js.buf = g_byte_array_new();
	w->js.max = ETCD_MAX_WATCH_MESSAGE;
	s->watch_fn = fn;
	s->watch_user = user;
	/* The first sync here: a watch that cannot start fails the call. */
	st = etcd_resync(w, err_out);
	if (st == TE_OK) {
		s->watcher = g_thread_try_new("te-etcd-watch", etcd_watch_main, w, &gerr);
		if (!s->watcher) {
			*err_out =
				g_strdup_printf("etcd metadata: watch thread: %s", gerr->message);
			g_error_free(gerr);
			st = TE_ERR_SYSTEM;
		}
	}
	if (st != TE_OK) {
		g_hash_table_unref(w->seen);
		g_byte_array_free(w->js.buf, TRUE);
		g_free(w->prefix_end);
		g_free(w);
	}
	return st;
}

static void etcd_watch_free(struct etcd_watch *w)
{
	g_hash_table_unref(w->seen);
	g_byte_array_free(w->js.buf, TRUE);
	g_free(w->prefix_end);
	g_free(w->stream_err);
	g_free(w);
}

/* ---- open / close ---- */

static void etcd_free(struct etcd *s)
{
	mdcurl_endpoints_clear(&s->eps);
	mdcurl_stop_free(s->stop);
	g_hash_table_unref(s->pubs);
	g_free(s->prefix);
	g_free(s->token);
	g_mutex_clear(&s->lock);
	g_mutex_clear(&s->op_lock);
	g_cond_clear(&s->cond);
	g_free(s);
}

static enum te_status etcd_open(const struct metadata_params *p, void **state_out, char **err_out)
{
	struct etcd *s;
	g_autofree char *probe = NULL;
	g_autofree char *p64 = NULL;
	GError *gerr = NULL;
	JsonNode *resp;
	enum te_status st;

	if (!p->ns || p->n_endpoints == 0) {
		*err_out = g_strdup("etcd metadata: no endpoint configured (metadata.endpoints)");
		return TE_ERR_CONFIG;
	}
	s = g_new0(struct etcd, 1);
	s->p = *p;
	s->p.ttl_s = p->ttl_s ? p->ttl_s : 10;
	s->timeout_ms = p->timeout_ms ? p->timeout_ms : ETCD_DEFAULT_TIMEOUT_MS;
	mdcurl_endpoints_init(&s->eps, p->endpoints, p->n_endpoints);
	s->stop = mdcurl_stop_new();
	s->prefix = metadata_key(p->ns, "");
	s->pubs = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, mdcurl_pub_free);
	g_mutex_init(&s->lock);
	g_mutex_init(&s->op_lock);
	g_cond_init(&s->cond);

	if (p->username) {
		st = mdcurl_failover(&s->eps, "etcd metadata", etcd_authenticate_any, s, err_out);
		if (st != TE_OK)
			goto err_free;
	}
	/* etcd answers (and lets us read the namespace) before the engine starts on it. */
	p64 = b64s(s->prefix);
	probe = g_strdup_printf("{\"key\":\"%s\",\"limit\":\"1\",\"count_only\":true}", p64);
	st = etcd_call(s, "/v3/kv/range", probe, "probe", ETCD_MAX_SMALL_RESPONSE, 0, &resp, NULL,
		       err_out);
	if (st != TE_OK)
		goto err_free;
	json_node_unref(resp);
	s->keeper = g_thread_try_new("te-etcd-lease", etcd_keeper_main, s, &gerr);
	if (!s->keeper) {
		*err_out = g_strdup_printf("etcd metadata: keepalive thread: %s", gerr->message);
		g_error_free(gerr);
		st = TE_ERR_SYSTEM;
		goto err_free;
	}
	*state_out = s;
	return TE_OK;

err_free:
	etcd_free(s);
	return st;
}

static void etcd_close(void *state)
{
	struct etcd *s = state;

	if (!s)
		return;
	g_mutex_lock(&s->lock);
	s->stopping = true;
	g_cond_broadcast(&s->cond);
	g_mutex_unlock(&s->lock);
	mdcurl_stop_fire(s->stop);
	if (s->keeper)
		g_thread_join(s->keeper);
	if (s->watcher) {
		struct etcd_watch *w;

		/* The thread's argument is not kept elsewhere: it hands it back. */
		w = g_thread_join(s->watcher);
		etcd_watch_free(w);
	}
	etcd_free(s);
}

const struct metadata_ops metadata_etcd_ops = {
	.name = "etcd",
	.open = etcd_open,
	.get = etcd_get,
	.publish = etcd_publish,
	.withdraw = etcd_withdraw,
	.watch = etcd_watch_start,
	.close = etcd_close,
};
