/* SPDX-License-Identifier: Apache-2.0 */
/* te-metadata-server: the key-value HTTP server that te's (and Mooncake's) http metadata backend talks to. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <glib-unix.h>
#include <gio/gio.h>
#include <json-glib/json-glib.h>
#include <libsoup/soup.h>

#include "te_build_config.h"

#define PROG "te-metadata-server"
/* The persist file's "format" member; a later incompatible layout gets a new number. */
#define PERSIST_FORMAT "te-metadata-server/1"
#define KEY_MAX 4096
#define CONTENT_TYPE_MAX 256
#define DEFAULT_CONTENT_TYPE "application/octet-stream"
/* Upper bounds of the options: a GByteArray holds at most G_MAXUINT bytes, and deadlines are
 * computed in microseconds of a gint64. */
#define MAX_VALUE_LIMIT ((gint64)1 << 30)
#define MAX_KEYS_LIMIT ((gint64)100000000)
#define TTL_S_LIMIT ((gint64)10 * 365 * 24 * 3600)

struct entry {
	GBytes *value;
	char *content_type; /* NULL: DEFAULT_CONTENT_TYPE */
	gint64 expire_us;   /* g_get_monotonic_time() deadline; 0: never */
};

/* The body of one PUT, collected by on_got_chunk up to --max-value. */
struct upload {
	GByteArray *body; /* NULL once too_big */
	bool too_big;
};

struct mds {
	/* Options. */
	char *listen;
	char *path;
	gint64 ttl_s;
	char *persist;
	gint64 max_value;
	gint64 max_keys;
	gboolean verbose;

	GHashTable *entries; /* char *key -> struct entry * */
	guint64 revision;    /* bumped on every change of entries; persisted */
	bool dirty;	     /* entries changed since the persist file was written */
	gint64 last_persist_us;
	guint persist_timer;
	guint sweep_timer;
	GMainLoop *loop;
};

static void entry_free(gpointer data)
{
	struct entry *e = data;

	if (!e)
		return;
	g_bytes_unref(e->value);
	g_free(e->content_type);
	g_free(e);
}

static void upload_free(gpointer data)
{
	struct upload *u = data;

	if (!u)
		return;
	if (u->body)
		g_byte_array_unref(u->body);
	g_free(u);
}

static bool expired(const struct entry *e, gint64 now_us)
{
	return e->expire_us != 0 && e->expire_us <= now_us;
}

/* ---- persistence ------------------------------------------------------------------------ */

static bool persist_write(struct mds *m, GError **error)
{
	g_autoptr(JsonBuilder) b = json_builder_new();
	g_autoptr(JsonGenerator) gen = json_generator_new();
	g_autoptr(JsonNode) root = NULL;
	g_autofree char *text = NULL;
	GList *keys = g_list_sort(g_hash_table_get_keys(m->entries), (GCompareFunc)strcmp);
	gsize len = 0;
	bool ok;

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "format");
	json_builder_add_string_value(b, PERSIST_FORMAT);
	json_builder_set_member_name(b, "revision");
	json_builder_add_int_value(b, (gint64)m->revision);
	json_builder_set_member_name(b, "entries");
	json_builder_begin_object(b);
	for (GList *l = keys; l; l = l->next) {
		struct entry *e = g_hash_table_lookup(m->entries, l->data);
		gsize n = 0;
		const guchar *d = g_bytes_get_data(e->value, &n);
		g_autofree char *b64 = g_base64_encode(d, n);

		json_builder_set_member_name(b, l->data);
		json_builder_add_string_value(b, b64);
	}
	json_builder_end_object(b);
	/* Only the entries whose type is not the default, so the common file stays simple. */
	json_builder_set_member_name(b, "content_types");
	json_builder_begin_object(b);
	for (GList *l = keys; l; l = l->next) {
		struct entry *e = g_hash_table_lookup(m->entries, l->data);

		if (!e->content_type)
			continue;
		json_builder_set_member_name(b, l->data);
		json_builder_add_string_value(b, e->content_type);
	}
	json_builder_end_object(b);
	json_builder_end_object(b);
	g_list_free(keys);

	root = json_builder_get_root(b);
	json_generator_set_root(gen, root);
	text = json_generator_to_data(gen, &len);
	/* CONSISTENT: a temporary file in the same folder, fsync'ed, renamed over the old one. */
	ok = g_file_set_contents_full(m->persist, text, (gssize)len, G_FILE_SET_CONTENTS_CONSISTENT,
				      0600, error);
	return ok;
}

static gboolean on_persist_timer(gpointer data);

static void persist_schedule(struct mds *m)
{
	gint64 now = g_get_monotonic_time();
	gint64 due = m->last_persist_us + G_USEC_PER_SEC;
	guint delay_ms = due > now ? (guint)((due - now + 999) / 1000) : 0;

	if (m->persist_timer)
		return;
	m->persist_timer = g_timeout_add(delay_ms, on_persist_timer, m);
}

static bool persist_now(struct mds *m)
{
	g_autoptr(GError) err = NULL;

	m->last_persist_us = g_get_monotonic_time();
	if (!persist_write(m, &err)) {
		g_printerr(PROG ": cannot write %s: %s\n", m->persist, err->message);
		return false;
	}
	m->dirty = false;
	return true;
}

static gboolean on_persist_timer(gpointer data)
{
	struct mds *m = data;

	m->persist_timer = 0;
	/* A failed write is retried a second later; the error is logged each time. */
	if (m->dirty && !persist_now(m))
		persist_schedule(m);
	return G_SOURCE_REMOVE;
}

static void changed(struct mds *m)
{
	m->revision++;
	if (!m->persist)
		return;
	m->dirty = true;
	persist_schedule(m);
}

/* Strict base64 (g_base64_decode accepts anything): length a multiple of 4, the alphabet, at
 * most two '=' at the end. */
static bool base64_valid(const char *s)
{
	size_t n = strlen(s);

	if (n % 4)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (g_ascii_isalnum(c) || c == '+' || c == '/')
			continue;
		if (c == '=' && (i == n - 1 || (i == n - 2 && s[n - 1] == '=')))
			continue;
		return false;
	}
	return true;
}

/* Load --persist into m->entries; false with *what_out (allocated) when the file is unusable. A
 * missing file is an empty store. TTLs restart from now: deadlines are not persisted. */
static bool persist_load(struct mds *m, bool *missing_out, char **what_out)
{
	g_autoptr(JsonParser) parser = json_parser_new();
	g_autoptr(GError) err = NULL;
	JsonNode *root;
	JsonObject *top, *entries, *types = NULL;
	JsonNode *node;
	const char *format;
	gint64 now = g_get_monotonic_time();
	g_autoptr(GList) members = NULL;

	*missing_out = false;
	if (!g_file_test(m->persist, G_FILE_TEST_EXISTS)) {
		*missing_out = true;
		return true;
	}
	if (!json_parser_load_from_mapped_file(parser, m->persist, &err)) {
		/* json-glib starts with "FILE:", which the caller already says. */
		const char *text = err->message;

		if (g_str_has_prefix(text, m->persist) && text[strlen(m->persist)] == ':')
			text += strlen(m->persist) + 1;
		*what_out = g_strdup_printf("not valid JSON: line:column %s", text);
		return false;
	}
	root = json_parser_get_root(parser);
	if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
		*what_out = g_strdup("the top level is not a JSON object");
		return false;
	}
	top = json_node_get_object(root);
	node = json_object_get_member(top, "format");
	format = node && JSON_NODE_HOLDS_VALUE(node) &&
				 json_node_get_value_type(node) == G_TYPE_STRING
			 ? json_node_get_string(node)
			 : NULL;
	if (g_strcmp0(format, PERSIST_FORMAT) != 0) {
		*what_out = g_strdup_printf("\"format\" is not \"%s\" (not a file of " PROG
					    ", or of another version)",
					    PERSIST_FORMAT);
		return false;
	}
	node = json_object_get_member(top, "revision");
	if (!node || !JSON_NODE_HOLDS_VALUE(node) ||
	    json_node_get_value_type(node) != G_TYPE_INT64 || json_node_get_int(node) < 0) {
		*what_out = g_strdup("\"revision\" is missing or not a non-negative integer");
		return false;
	}
	m->revision = (guint64)json_node_get_int(node);
	node = json_object_get_member(top, "entries");
	if (!node || !JSON_NODE_HOLDS_OBJECT(node)) {
		*what_out = g_strdup("\"entries\" is missing or not an object");
		return false;
	}
	entries = json_node_get_object(node);
	node = json_object_get_member(top, "content_types");
	if (node) {
		if (!JSON_NODE_HOLDS_OBJECT(node)) {
			*what_out = g_strdup("\"content_types\" is not an object");
			return false;
		}
		types = json_node_get_object(node);
	}
	if ((gint64)json_object_get_size(entries) > m->max_keys) {
		*what_out = g_strdup_printf("%u entries, more than --max-keys %" G_GINT64_FORMAT,
					    json_object_get_size(entries), m->max_keys);
		return false;
	}

	members = json_object_get_members(entries);
	for (GList *l = members; l; l = l->next) {
		const char *key = l->data;
		const char *b64, *type = NULL;
		struct entry *e;
		guchar *data;
		gsize n = 0;

		if (!*key || strlen(key) > KEY_MAX) {
			*what_out =
				g_strdup_printf("a key is empty or longer than %d bytes", KEY_MAX);
			return false;
		}
		node = json_object_get_member(entries, key);
		b64 = JSON_NODE_HOLDS_VALUE(node) && json_node_get_value_type(node) == G_TYPE_STRING
			      ? json_node_get_string(node)
			      : NULL;
		if (!b64 || !base64_valid(b64)) {
			*what_out = g_strdup_printf(
				"entry \"%.64s\": the value is not a base64 string", key);
			return false;
		}
		if (types && json_object_has_member(types, key)) {
			node = json_object_get_member(types, key);
			type = JSON_NODE_HOLDS_VALUE(node) &&
					       json_node_get_value_type(node) == G_TYPE_STRING
				       ? json_node_get_string(node)
				       : NULL;
			if (!type || !*type || strlen(type) > CONTENT_TYPE_MAX) {
				*what_out = g_strdup_printf(
					"entry \"%.64s\": bad content type (a string of 1..%d bytes)",
					key, CONTENT_TYPE_MAX);
				return false;
			}
		}
		data = g_base64_decode(b64, &n);
		if ((gint64)n > m->max_value) {
			g_free(data);
			*what_out =
				g_strdup_printf("entry \"%.64s\": a value of %zu bytes, more than "
						"--max-value %" G_GINT64_FORMAT,
						key, (size_t)n, m->max_value);
			return false;
		}
		e = g_new0(struct entry, 1);
		e->value = g_bytes_new_take(data, n);
		e->content_type = g_strdup(type);
		e->expire_us = m->ttl_s ? now + m->ttl_s * G_USEC_PER_SEC : 0;
		g_hash_table_replace(m->entries, g_strdup(key), e);
	}
	return true;
}

/* ---- expiry ----------------------------------------------------------------------------- */

static void sweep(struct mds *m)
{
	gint64 now = g_get_monotonic_time();
	GHashTableIter it;
	gpointer value;
	guint n = 0;

	g_hash_table_iter_init(&it, m->entries);
	while (g_hash_table_iter_next(&it, NULL, &value)) {
		if (expired(value, now)) {
			g_hash_table_iter_remove(&it);
			n++;
		}
	}
	while (n--)
		changed(m);
}

static gboolean on_sweep_timer(gpointer data)
{
	sweep(data);
	return G_SOURCE_CONTINUE;
}

/* The live entry of @key; an expired one is dropped here (sweep only frees memory sooner). */
static struct entry *lookup(struct mds *m, const char *key)
{
	struct entry *e = g_hash_table_lookup(m->entries, key);

	if (e && expired(e, g_get_monotonic_time())) {
		g_hash_table_remove(m->entries, key);
		changed(m);
		return NULL;
	}
	return e;
}

/* ---- HTTP ------------------------------------------------------------------------------- */

static void set_revision(struct mds *m, SoupServerMessage *msg)
{
	char rev[32];

	g_snprintf(rev, sizeof(rev), "%" G_GUINT64_FORMAT, m->revision);
	soup_message_headers_replace(soup_server_message_get_response_headers(msg), "X-TE-Revision",
				     rev);
}

static void G_GNUC_PRINTF(4, 5)
	reply_text(struct mds *m, SoupServerMessage *msg, guint status, const char *fmt, ...)
{
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	soup_server_message_set_status(msg, status, NULL);
	soup_server_message_set_response(msg, "text/plain; charset=utf-8", SOUP_MEMORY_TAKE, text,
					 strlen(text));
	set_revision(m, msg);
}

static void reply_empty(struct mds *m, SoupServerMessage *msg, guint status)
{
	soup_server_message_set_status(msg, status, NULL);
	set_revision(m, msg);
}

static bool path_served(const struct mds *m, const char *path)
{
	size_t n = strlen(m->path);

	if (!path)
		return false;
	if (strcmp(path, m->path) == 0)
		return true;
	/* "/metadata/" too (but "/" serves only "/"). */
	return n > 1 && strncmp(path, m->path, n) == 0 && strcmp(path + n, "/") == 0;
}

/* What a request to the served path asks for, once its path, method and query are valid. */
struct target {
	const char *method; /* interned SOUP_METHOD_* */
	char *key;	    /* GET/PUT/DELETE of one key; NULL for a listing */
	char *prefix;	    /* GET listing */
};

static void target_clear(struct target *t)
{
	g_free(t->key);
	g_free(t->prefix);
}

/* Check what needs no body; false after setting the error reply. Called from the early
 * handler (so a bad PUT is refused before its body is read) and again from the handler. */
static bool target_parse(struct mds *m, SoupServerMessage *msg, const char *path,
			 struct target *t_out)
{
	const char *method = soup_server_message_get_method(msg);
	GUri *uri = soup_server_message_get_uri(msg);
	const char *query = uri ? g_uri_get_query(uri) : NULL;
	g_autoptr(GHashTable) params = NULL;
	g_autoptr(GError) err = NULL;
	const char *key, *prefix;

	memset(t_out, 0, sizeof(*t_out));
	if (!path_served(m, path)) {
		reply_text(m, msg, SOUP_STATUS_NOT_FOUND,
			   "not found: this server serves %s only (GET/PUT/DELETE %s?key=KEY)\n",
			   m->path, m->path);
		return false;
	}
	if (method != SOUP_METHOD_GET && method != SOUP_METHOD_PUT &&
	    method != SOUP_METHOD_DELETE) {
		reply_text(m, msg, SOUP_STATUS_METHOD_NOT_ALLOWED,
			   "method %s not allowed: use GET, PUT or DELETE\n", method);
		soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Allow",
					     "GET, PUT, DELETE");
		return false;
	}
	/* Parsed here rather than with libsoup's table: GLib reports bad %-escapes, NUL bytes and
	 * non-UTF-8, which would otherwise truncate or mangle a key silently. */
	if (query) {
		params = g_uri_parse_params(query, -1, "&", G_URI_PARAMS_WWW_FORM, &err);
		if (!params) {
			reply_text(m, msg, SOUP_STATUS_BAD_REQUEST,
				   "malformed query (URL-encoded UTF-8 without NUL bytes): %s\n",
				   err->message);
			return false;
		}
	}
	key = params ? g_hash_table_lookup(params, "key") : NULL;
	prefix = params ? g_hash_table_lookup(params, "prefix") : NULL;
	if (key && prefix) {
		reply_text(m, msg, SOUP_STATUS_BAD_REQUEST,
			   "give either key= (one entry) or prefix= (a listing), not both\n");
		return false;
	}
	if (prefix) {
		if (method != SOUP_METHOD_GET) {
			reply_text(m, msg, SOUP_STATUS_BAD_REQUEST,
				   "prefix= lists entries and is for GET only\n");
			return false;
		}
		if (strlen(prefix) > KEY_MAX) {
			reply_text(m, msg, SOUP_STATUS_BAD_REQUEST, "prefix longer than %d bytes\n",
				   KEY_MAX);
			return false;
		}
		t_out->method = method;
		t_out->prefix = g_strdup(prefix);
		return true;
	}
	if (!key || !*key) {
		reply_text(m, msg, SOUP_STATUS_BAD_REQUEST,
			   "missing key: use %s %s?key=KEY (a non-empty, URL-encoded string)\n",
			   method, m->path);
		return false;
	}
	if (strlen(key) > KEY_MAX) {
		reply_text(m, msg, SOUP_STATUS_BAD_REQUEST, "key of %zu bytes, longer than %d\n",
			   strlen(key), KEY_MAX);
		return false;
	}
	t_out->method = method;
	t_out->key = g_strdup(key);
	return true;
}

static void on_got_chunk(SoupServerMessage *msg, GBytes *chunk, gpointer data)
{
	struct mds *m = data;
	struct upload *u = g_object_get_data(G_OBJECT(msg), "te-upload");
	gsize n = 0;
	const guint8 *d = g_bytes_get_data(chunk, &n);

	if (!u || u->too_big)
		return;
	if ((gint64)u->body->len + (gint64)n > m->max_value) {
		/* The rest is read and dropped (libsoup has no way to stop mid-body), so memory
		 * stays bounded by --max-value; the reply is 413 and the connection closes. */
		u->too_big = true;
		g_clear_pointer(&u->body, g_byte_array_unref);
		return;
	}
	g_byte_array_append(u->body, d, (guint)n);
}

static void reply_too_big(struct mds *m, SoupServerMessage *msg)
{
	reply_text(m, msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE,
		   "value larger than --max-value %" G_GINT64_FORMAT " bytes\n", m->max_value);
	soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Connection",
				     "close");
}

static void on_early(SoupServer *server, SoupServerMessage *msg, const char *path,
		     GHashTable *query, gpointer data)
{
	struct mds *m = data;
	SoupMessageHeaders *h = soup_server_message_get_request_headers(msg);
	struct target t;
	struct upload *u;
	goffset len = -1;

	/* No request body is kept by libsoup: one that is refused here is still read (HTTP/1.1
	 * has no other way to go on with the connection) but dropped, and a PUT's is collected by
	 * on_got_chunk under --max-value. */
	soup_message_body_set_accumulate(soup_server_message_get_request_body(msg), FALSE);
	if (!target_parse(m, msg, path, &t))
		return;
	target_clear(&t);
	if (soup_server_message_get_method(msg) != SOUP_METHOD_PUT)
		return;
	if (soup_message_headers_get_encoding(h) == SOUP_ENCODING_CONTENT_LENGTH)
		len = soup_message_headers_get_content_length(h);
	if (len > m->max_value) {
		/* With "Expect: 100-continue" the client does not even send the body. */
		reply_too_big(m, msg);
		return;
	}
	/* Collect the body ourselves: bounded while it arrives, and handed to the table as one
	 * GBytes without a copy. The reservation is capped: a Content-Length alone is no data. */
	u = g_new0(struct upload, 1);
	u->body = g_byte_array_sized_new((guint)CLAMP(len, 0, 1 << 20));
	g_object_set_data_full(G_OBJECT(msg), "te-upload", u, upload_free);
	g_signal_connect(msg, "got-chunk", G_CALLBACK(on_got_chunk), m);
}

static void handle_list(struct mds *m, SoupServerMessage *msg, const char *prefix)
{
	g_autoptr(JsonBuilder) b = json_builder_new();
	g_autoptr(JsonGenerator) gen = json_generator_new();
	g_autoptr(JsonNode) root = NULL;
	GList *keys = NULL;
	GHashTableIter it;
	gpointer key, value;
	gint64 now = g_get_monotonic_time();
	size_t plen = strlen(prefix);
	char *text;
	gsize len = 0;

	g_hash_table_iter_init(&it, m->entries);
	while (g_hash_table_iter_next(&it, &key, &value)) {
		if (!expired(value, now) && strncmp(key, prefix, plen) == 0)
			keys = g_list_prepend(keys, key);
	}
	keys = g_list_sort(keys, (GCompareFunc)strcmp);
	json_builder_begin_object(b);
	for (GList *l = keys; l; l = l->next) {
		struct entry *e = g_hash_table_lookup(m->entries, l->data);
		gsize n = 0;
		const guchar *d = g_bytes_get_data(e->value, &n);
		g_autofree char *b64 = g_base64_encode(d, n);

		json_builder_set_member_name(b, l->data);
		json_builder_add_string_value(b, b64);
	}
	json_builder_end_object(b);
	g_list_free(keys);
	root = json_builder_get_root(b);
	json_generator_set_root(gen, root);
	text = json_generator_to_data(gen, &len);
	soup_server_message_set_status(msg, SOUP_STATUS_OK, NULL);
	soup_server_message_set_response(msg, "application/json", SOUP_MEMORY_TAKE, text, len);
	set_revision(m, msg);
}

static void handle_get(struct mds *m, SoupServerMessage *msg, const char *key)
{
	struct entry *e = lookup(m, key);

	if (!e) {
		reply_text(m, msg, SOUP_STATUS_NOT_FOUND, "no such key\n");
		return;
	}
	soup_server_message_set_status(msg, SOUP_STATUS_OK, NULL);
	soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Content-Type",
				     e->content_type ? e->content_type : DEFAULT_CONTENT_TYPE);
	/* libsoup refuses empty chunks; an empty value is just no body. */
	if (g_bytes_get_size(e->value) > 0)
		soup_message_body_append_bytes(soup_server_message_get_response_body(msg),
					       e->value);
	set_revision(m, msg);
}

static bool same_value(const struct entry *e, GBytes *value, const char *type)
{
	return g_bytes_equal(e->value, value) && g_strcmp0(e->content_type, type) == 0;
}

static void handle_put(struct mds *m, SoupServerMessage *msg, const char *key)
{
	struct upload *u = g_object_get_data(G_OBJECT(msg), "te-upload");
	const char *type = soup_message_headers_get_content_type(
		soup_server_message_get_request_headers(msg), NULL);
	g_autoptr(GBytes) value = NULL;
	struct entry *e;
	gint64 expire_us = m->ttl_s ? g_get_monotonic_time() + m->ttl_s * G_USEC_PER_SEC : 0;

	if (u && u->too_big) {
		reply_too_big(m, msg);
		return;
	}
	if (u) {
		value = g_byte_array_free_to_bytes(u->body);
		u->body = NULL;
	} else {
		/* Not seen by the early handler (cannot happen with libsoup 3.2; kept bounded). */
		SoupMessageBody *body = soup_server_message_get_request_body(msg);

		if (body->length > m->max_value) {
			reply_too_big(m, msg);
			return;
		}
		value = soup_message_body_flatten(body);
	}
	/* curl -d sends a form type by default; a value is never a form, so it is just bytes. */
	if (type && (!*type || g_ascii_strcasecmp(type, "application/x-www-form-urlencoded") == 0 ||
		     g_ascii_strcasecmp(type, DEFAULT_CONTENT_TYPE) == 0))
		type = NULL;
	if (type && strlen(type) > CONTENT_TYPE_MAX) {
		reply_text(m, msg, SOUP_STATUS_BAD_REQUEST, "Content-Type longer than %d bytes\n",
			   CONTENT_TYPE_MAX);
		return;
	}

	e = lookup(m, key);
	if (e) {
		/* A republish of the same bytes only extends the TTL: no revision, no write. */
		e->expire_us = expire_us;
		if (!same_value(e, value, type)) {
			g_bytes_unref(e->value);
			e->value = g_steal_pointer(&value);
			g_free(e->content_type);
			e->content_type = g_strdup(type);
			changed(m);
		}
		reply_empty(m, msg, SOUP_STATUS_OK);
		return;
	}
	if ((gint64)g_hash_table_size(m->entries) >= m->max_keys) {
		if (m->ttl_s)
			sweep(m);
		if ((gint64)g_hash_table_size(m->entries) >= m->max_keys) {
			reply_text(m, msg, SOUP_STATUS_INSUFFICIENT_STORAGE,
				   "store full: --max-keys %" G_GINT64_FORMAT " entries\n",
				   m->max_keys);
			return;
		}
	}
	e = g_new0(struct entry, 1);
	e->value = g_steal_pointer(&value);
	e->content_type = g_strdup(type);
	e->expire_us = expire_us;
	g_hash_table_replace(m->entries, g_strdup(key), e);
	changed(m);
	reply_empty(m, msg, SOUP_STATUS_OK);
}

static void handle_delete(struct mds *m, SoupServerMessage *msg, const char *key)
{
	if (!lookup(m, key)) {
		reply_text(m, msg, SOUP_STATUS_NOT_FOUND, "no such key\n");
		return;
	}
	g_hash_table_remove(m->entries, key);
	changed(m);
	reply_empty(m, msg, SOUP_STATUS_OK);
}

static void on_request(SoupServer *server, SoupServerMessage *msg, const char *path,
		       GHashTable *query, gpointer data)
{
	struct mds *m = data;
	struct target t;

	if (!target_parse(m, msg, path, &t))
		return;
	if (t.prefix)
		handle_list(m, msg, t.prefix);
	else if (t.method == SOUP_METHOD_GET)
		handle_get(m, msg, t.key);
	else if (t.method == SOUP_METHOD_PUT)
		handle_put(m, msg, t.key);
	else
		handle_delete(m, msg, t.key);
	target_clear(&t);
}

static void on_finished(SoupServer *server, SoupServerMessage *msg, gpointer data)
{
	GUri *uri = soup_server_message_get_uri(msg);
	const char *query = uri ? g_uri_get_query(uri) : NULL;

	g_printerr(PROG ": %s %s%s%s -> %u\n", soup_server_message_get_method(msg),
		   uri ? g_uri_get_path(uri) : "?", query ? "?" : "", query ? query : "",
		   soup_server_message_get_status(msg));
}

static gboolean on_stop_signal(gpointer data)
{
	struct mds *m = data;

	g_main_loop_quit(m->loop);
	return G_SOURCE_CONTINUE;
}

/* ---- setup ------------------------------------------------------------------------------ */

/* HOST:PORT or [IPV6]:PORT into an allocated host (no brackets) and a port. */
static bool parse_listen(const char *s, char **host_out, guint16 *port_out, char **what_out)
{
	g_autofree char *host = NULL;
	const char *colon;
	guint64 port;

	if (s[0] == '[') {
		const char *end = strchr(s, ']');

		if (!end || end[1] != ':') {
			*what_out = g_strdup("expected [ADDRESS]:PORT");
			return false;
		}
		host = g_strndup(s + 1, (gsize)(end - s - 1));
		colon = end + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon) {
			*what_out = g_strdup("expected HOST:PORT");
			return false;
		}
		host = g_strndup(s, (gsize)(colon - s));
		if (strchr(host, ':')) {
			*what_out = g_strdup("write an IPv6 address as [ADDRESS]:PORT");
			return false;
		}
	}
	if (!*host) {
		*what_out = g_strdup("empty host");
		return false;
	}
	if (!g_ascii_string_to_unsigned(colon + 1, 10, 0, 65535, &port, NULL)) {
		*what_out = g_strdup_printf("bad port \"%s\" (0..65535; 0 picks a free one)",
					    colon + 1);
		return false;
	}
	*host_out = g_steal_pointer(&host);
	*port_out = (guint16)port;
	return true;
}

static GSocketAddress *resolve(const char *host, guint16 port, GError **error)
{
	g_autoptr(GInetAddress) ia = g_inet_address_new_from_string(host);
	GList *list;
	GSocketAddress *sa;

	if (ia)
		return g_inet_socket_address_new(ia, port);
	list = g_resolver_lookup_by_name(g_resolver_get_default(), host, NULL, error);
	if (!list)
		return NULL;
	sa = g_inet_socket_address_new(list->data, port);
	g_resolver_free_addresses(list);
	return sa;
}

static guint16 bound_port(SoupServer *server)
{
	GSList *listeners = soup_server_get_listeners(server);
	guint16 port = 0;

	if (listeners) {
		g_autoptr(GSocketAddress) sa = g_socket_get_local_address(listeners->data, NULL);

		if (sa && G_IS_INET_SOCKET_ADDRESS(sa))
			port = g_inet_socket_address_get_port(G_INET_SOCKET_ADDRESS(sa));
	}
	g_slist_free(listeners);
	return port;
}

static bool check_options(struct mds *m, char **what_out)
{
	size_t n;

	if (!m->path[0] || m->path[0] != '/' || strpbrk(m->path, "?# \t\r\n")) {
		*what_out = g_strdup_printf("--path \"%s\": must start with / and hold no ?, # or "
					    "spaces",
					    m->path);
		return false;
	}
	n = strlen(m->path);
	while (n > 1 && m->path[n - 1] == '/')
		m->path[--n] = '\0';
	if (m->ttl_s < 0 || m->ttl_s > TTL_S_LIMIT) {
		*what_out = g_strdup_printf("--ttl-s %" G_GINT64_FORMAT
					    ": 0 (never) .. %" G_GINT64_FORMAT,
					    m->ttl_s, TTL_S_LIMIT);
		return false;
	}
	if (m->max_value < 0 || m->max_value > MAX_VALUE_LIMIT) {
		*what_out =
			g_strdup_printf("--max-value %" G_GINT64_FORMAT ": 0 .. %" G_GINT64_FORMAT,
					m->max_value, MAX_VALUE_LIMIT);
		return false;
	}
	if (m->max_keys < 1 || m->max_keys > MAX_KEYS_LIMIT) {
		*what_out =
			g_strdup_printf("--max-keys %" G_GINT64_FORMAT ": 1 .. %" G_GINT64_FORMAT,
					m->max_keys, MAX_KEYS_LIMIT);
		return false;
	}
	if (m->persist && !*m->persist) {
		*what_out = g_strdup("--persist: empty file name");
		return false;
	}
	return true;
}

int main(int argc, char **argv)
{
	struct mds m = {
		.max_value = 16 << 20,
		.max_keys = 1000000,
	};
	GOptionEntry options[] = {
		{ "listen", 'l', 0, G_OPTION_ARG_STRING, &m.listen,
		  "Address to listen on (default 127.0.0.1:8080; port 0 picks a free one)",
		  "HOST:PORT" },
		{ "path", 'p', 0, G_OPTION_ARG_STRING, &m.path,
		  "Base path of the store (default /metadata)", "PATH" },
		{ "ttl-s", 't', 0, G_OPTION_ARG_INT64, &m.ttl_s,
		  "Drop an entry not PUT again within N seconds (default 0: never)", "N" },
		{ "persist", 'f', 0, G_OPTION_ARG_FILENAME, &m.persist,
		  "Load FILE at start, rewrite it (atomically) after changes and at exit", "FILE" },
		{ "max-value", 0, 0, G_OPTION_ARG_INT64, &m.max_value,
		  "Largest value in bytes (default 16777216); larger PUTs get 413", "BYTES" },
		{ "max-keys", 0, 0, G_OPTION_ARG_INT64, &m.max_keys,
		  "Most entries (default 1000000); a new key beyond gets 507", "N" },
		{ "verbose", 'v', 0, G_OPTION_ARG_NONE, &m.verbose, "Log every request to stderr",
		  NULL },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	g_autoptr(GOptionContext) ctx = g_option_context_new(NULL);
	g_autoptr(GError) err = NULL;
	g_autoptr(SoupServer) server = NULL;
	g_autoptr(GSocketAddress) addr = NULL;
	g_autofree char *host = NULL;
	g_autofree char *what = NULL;
	guint16 port = 0;
	guint sig_term, sig_int;
	int rc = 0;

	g_option_context_set_summary(
		ctx, "Serve GET/PUT/DELETE PATH?key=KEY: te's and Mooncake's http metadata store.\n"
		     "Prints \"listening on http://HOST:PORT/PATH\" when ready.");
	g_option_context_add_main_entries(ctx, options, NULL);
	if (!g_option_context_parse(ctx, &argc, &argv, &err)) {
		g_printerr(PROG ": %s (see --help)\n", err->message);
		rc = 2;
		goto out_free_options;
	}
	if (argc > 1) {
		g_printerr(PROG ": unexpected argument \"%s\" (see --help)\n", argv[1]);
		rc = 2;
		goto out_free_options;
	}
	/* Defaults set after parsing: GOption does not free a string it replaces. */
	if (!m.listen)
		m.listen = g_strdup("127.0.0.1:8080");
	if (!m.path)
		m.path = g_strdup("/metadata");
	if (!check_options(&m, &what) || !parse_listen(m.listen, &host, &port, &what)) {
		g_printerr(PROG ": %s\n", what);
		rc = 2;
		goto out_free_options;
	}

	/* Peers that hang up mid-reply must not kill the server. */
	signal(SIGPIPE, SIG_IGN);
	m.entries = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, entry_free);
	if (m.persist) {
		bool missing = false;

		if (!persist_load(&m, &missing, &what)) {
			g_printerr(PROG ": %s: %s\n", m.persist, what);
			rc = 1;
			goto out_free_all;
		}
		/* Create it now so an unwritable place fails at start, not at the first PUT. */
		if (missing && !persist_write(&m, &err)) {
			g_printerr(PROG ": cannot write %s: %s\n", m.persist, err->message);
			rc = 1;
			goto out_free_all;
		}
	}

	addr = resolve(host, port, &err);
	if (!addr) {
		g_printerr(PROG ": --listen %s: %s\n", m.listen, err->message);
		rc = 1;
		goto out_free_all;
	}
	server = soup_server_new("server-header", PROG "/" TE_VERSION " ", NULL);
	soup_server_add_early_handler(server, NULL, on_early, &m, NULL);
	soup_server_add_handler(server, NULL, on_request, &m, NULL);
	if (m.verbose)
		g_signal_connect(server, "request-finished", G_CALLBACK(on_finished), &m);
	if (!soup_server_listen(server, addr, 0, &err)) {
		g_printerr(PROG ": cannot listen on %s: %s\n", m.listen, err->message);
		rc = 1;
		goto out_free_all;
	}

	m.loop = g_main_loop_new(NULL, FALSE);
	sig_term = g_unix_signal_add(SIGTERM, on_stop_signal, &m);
	sig_int = g_unix_signal_add(SIGINT, on_stop_signal, &m);
	if (m.ttl_s) {
		/* A quarter of the TTL (0.25..10 s): entries go at most that late; lookups never
		 * return an expired one anyway. */
		gint64 every_ms = CLAMP(m.ttl_s * 250, 250, 10000);

		m.sweep_timer = g_timeout_add((guint)every_ms, on_sweep_timer, &m);
	}

	printf("listening on http://%s%s%s:%u%s\n", strchr(host, ':') ? "[" : "", host,
	       strchr(host, ':') ? "]" : "", bound_port(server), m.path);
	fflush(stdout);

	g_main_loop_run(m.loop);

	soup_server_disconnect(server);
	g_source_remove(sig_term);
	g_source_remove(sig_int);
	if (m.sweep_timer)
		g_source_remove(m.sweep_timer);
	if (m.persist_timer)
		g_source_remove(m.persist_timer);
	if (m.persist && m.dirty && !persist_now(&m))
		rc = 1;
	g_main_loop_unref(m.loop);

out_free_all:
	g_hash_table_unref(m.entries);
out_free_options:
	g_free(m.listen);
	g_free(m.path);
	g_free(m.persist);
	return rc;
}
