/* SPDX-License-Identifier: Apache-2.0 */
/* descriptor.c: JSON encoding and strict, bounded decoding of segment descriptors. */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-glib/json-glib.h>

#include <te/te.h>

#include "core/metadata/descriptor.h"

/*
 * json-glib parses recursively without a depth limit (a few hundred thousand '['
 * overflow the stack), and an object with many duplicate member names costs it
 * quadratic time. A descriptor nests four levels deep and its largest object holds
 * DESCRIPTOR_MAX_TRANSPORTS members, so these bounds leave room for extensions
 * while a 16 MiB hostile input costs about what a legitimate one of that size
 * does (~2 s for a flood of duplicate names vs ~1.4 s for 65536 buffers, -O2).
 */
#define DESCRIPTOR_MAX_DEPTH 32u
#define DESCRIPTOR_MAX_MEMBERS 64u

/* Longest base64 text that can decode to DESCRIPTOR_MAX_BLOB bytes. */
#define DESCRIPTOR_MAX_BASE64 (4u * ((DESCRIPTOR_MAX_BLOB + 2u) / 3u))

/* A buffer's range and its index in the JSON array, for sorting and error text. */
struct descriptor_span {
	uint64_t addr;
	uint64_t end;
	size_t index;
};

static enum te_status descriptor_fail(char **err_out, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* Every decode error funnels through here so the status and the prefix are uniform. */
static enum te_status descriptor_fail(char **err_out, const char *fmt, ...)
{
	va_list ap;
	char *why;

	if (!err_out)
		return TE_ERR_METADATA_MALFORMED;
	va_start(ap, fmt);
	why = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	*err_out = g_strconcat("descriptor: ", why, NULL);
	g_free(why);
	return TE_ERR_METADATA_MALFORMED;
}

static void descriptor_blobs_free(struct descriptor_blob *blobs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		g_free(blobs[i].transport);
		if (blobs[i].blob)
			g_bytes_unref(blobs[i].blob);
	}
	g_free(blobs);
}

void descriptor_free(struct descriptor *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n_buffers; i++) {
		g_free(d->buffers[i].location);
		descriptor_blobs_free(d->buffers[i].keys, d->buffers[i].n_keys);
	}
	g_free(d->buffers);
	descriptor_blobs_free(d->transports, d->n_transports);
	g_free(d->name);
	g_free(d->rpc);
	g_free(d->host_id);
	g_free(d->pid_ns);
	g_free(d);
}

/* ---- encoding ---- */

static void descriptor_add_blobs(JsonBuilder *b, const struct descriptor_blob *blobs, size_t n)
{
	json_builder_begin_object(b);
	for (size_t i = 0; i < n; i++) {
		gsize size = 0;
		const void *data = blobs[i].blob ? g_bytes_get_data(blobs[i].blob, &size) : NULL;
		g_autofree char *text = g_base64_encode(data, size);

		json_builder_set_member_name(b, blobs[i].transport ? blobs[i].transport : "");
		json_builder_add_string_value(b, text);
	}
	json_builder_end_object(b);
}

char *descriptor_encode(const struct descriptor *d, size_t *len_out)
{
	g_autoptr(JsonBuilder) b = json_builder_new_immutable();
	g_autoptr(JsonGenerator) gen = json_generator_new();
	g_autoptr(JsonNode) root = NULL;
	char num[32];
	gsize len = 0;
	char *text;

	assert(d);
	json_builder_begin_object(b);
	json_builder_set_member_name(b, "name");
	json_builder_add_string_value(b, d->name ? d->name : "");
	/* A string: JSON readers commonly hold numbers in doubles (53 bits). */
	snprintf(num, sizeof(num), "%" PRIu64, d->generation);
	json_builder_set_member_name(b, "generation");
	json_builder_add_string_value(b, num);
	json_builder_set_member_name(b, "rpc");
	json_builder_add_string_value(b, d->rpc ? d->rpc : "");
	json_builder_set_member_name(b, "host");
	json_builder_add_string_value(b, d->host_id ? d->host_id : "");
	json_builder_set_member_name(b, "pid");
	json_builder_add_int_value(b, d->pid);
	if (d->pid_ns) {
		json_builder_set_member_name(b, "pidns");
		json_builder_add_string_value(b, d->pid_ns);
	}
	json_builder_set_member_name(b, "transports");
	descriptor_add_blobs(b, d->transports, d->n_transports);

	json_builder_set_member_name(b, "buffers");
	json_builder_begin_array(b);
	for (size_t i = 0; i < d->n_buffers; i++) {
		const struct descriptor_buffer *buf = &d->buffers[i];

		json_builder_begin_object(b);
		snprintf(num, sizeof(num), "0x%" PRIx64, buf->addr);
		json_builder_set_member_name(b, "addr");
		json_builder_add_string_value(b, num);
		snprintf(num, sizeof(num), "%" PRIu64, buf->length);
		json_builder_set_member_name(b, "length");
		json_builder_add_string_value(b, num);
		json_builder_set_member_name(b, "location");
		json_builder_add_string_value(b, buf->location ? buf->location : "");
		json_builder_set_member_name(b, "access");
		json_builder_add_int_value(b, buf->access);
		json_builder_set_member_name(b, "keys");
		descriptor_add_blobs(b, buf->keys, buf->n_keys);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	json_builder_end_object(b);

	root = json_builder_get_root(b);
	json_generator_set_root(gen, root);
	text = json_generator_to_data(gen, &len);
	if (len_out)
		*len_out = len;
	return text;
}

/* ---- decoding ---- */

static bool descriptor_is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/*
 * Outside strings, JSON needs only structure, whitespace, numbers and the letters of
 * true/false/null. Refusing everything else also refuses json-glib's extensions
 * (comments, single-quoted strings), which could hide brackets from the depth count.
 */
static bool descriptor_is_json_char(char c)
{
	return descriptor_is_space(c) || (c && strchr("{}[]:,-+.0123456789eEtrufalsn", c));
}

/*
 * descriptor_prescan - bound the nesting depth and the members per object before
 * json-glib sees the text, and refuse trailing data after the root value.
 */
static enum te_status descriptor_prescan(const char *json, size_t len, char **err_out)
{
	uint32_t members[DESCRIPTOR_MAX_DEPTH + 1];
	bool is_object[DESCRIPTOR_MAX_DEPTH + 1];
	bool in_string = false, escaped = false, closed = false;
	uint32_t depth = 0;

	for (size_t i = 0; i < len; i++) {
		char c = json[i];

		if (in_string) {
			if (escaped)
				escaped = false;
			else if (c == '\\')
				escaped = true;
			else if (c == '"')
				in_string = false;
			continue;
		}
		if (closed && !descriptor_is_space(c))
			return descriptor_fail(err_out, "input: trailing data at offset %zu", i);
		switch (c) {
		case '"':
			in_string = true;
			break;
		case '{':
		case '[':
			if (depth == DESCRIPTOR_MAX_DEPTH)
				return descriptor_fail(err_out, "input: nested deeper than %u",
						       DESCRIPTOR_MAX_DEPTH);
			depth++;
			members[depth] = 0;
			is_object[depth] = c == '{';
			break;
		case '}':
		case ']':
			if (depth == 0)
				return descriptor_fail(
					err_out, "input: unbalanced '%c' at offset %zu", c, i);
			depth--;
			closed = depth == 0;
			break;
		case ':':
			/* One ':' per member at the object's own depth. */
			if (depth > 0 && is_object[depth] &&
			    ++members[depth] > DESCRIPTOR_MAX_MEMBERS)
				return descriptor_fail(err_out,
						       "input: object with more than %u members",
						       DESCRIPTOR_MAX_MEMBERS);
			break;
		default:
			if (!descriptor_is_json_char(c))
				return descriptor_fail(
					err_out, "input: unexpected character at offset %zu", i);
			break;
		}
	}
	return TE_OK;
}

static bool descriptor_is_string(JsonNode *node)
{
	return JSON_NODE_HOLDS_VALUE(node) && json_node_get_value_type(node) == G_TYPE_STRING;
}

static bool descriptor_is_int(JsonNode *node)
{
	return JSON_NODE_HOLDS_VALUE(node) && json_node_get_value_type(node) == G_TYPE_INT64;
}

/* Digits only (no sign, space or empty string), overflow checked. */
static bool descriptor_parse_decimal(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

/* "0x" then at least one hex digit, overflow checked. */
static bool descriptor_parse_hex(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (s[0] != '0' || s[1] != 'x' || !s[2])
		return false;
	for (s += 2; *s; s++) {
		int digit = g_ascii_xdigit_value(*s);

		if (digit < 0 || v > (UINT64_MAX >> 4))
			return false;
		v = (v << 4) | (uint64_t)digit;
	}
	*out = v;
	return true;
}

/*
 * descriptor_get_string - optional or required string member @key of @obj, at most
 * DESCRIPTOR_MAX_NAME bytes; a missing optional member reads as "". @path prefixes
 * @key in error text ("" or "buffers[3].").
 */
static enum te_status descriptor_get_string(JsonObject *obj, const char *path, const char *key,
					    bool required, char **out, char **err_out)
{
	JsonNode *node = json_object_get_member(obj, key);
	const char *s;

	if (!node) {
		if (required)
			return descriptor_fail(err_out, "%s%s: missing", path, key);
		*out = g_strdup("");
		return TE_OK;
	}
	if (!descriptor_is_string(node))
		return descriptor_fail(err_out, "%s%s: must be a string", path, key);
	s = json_node_get_string(node);
	if (strlen(s) > DESCRIPTOR_MAX_NAME)
		return descriptor_fail(err_out, "%s%s: longer than %u bytes", path, key,
				       DESCRIPTOR_MAX_NAME);
	/* json-glib turns a lone surrogate escape ("\ud800x") into invalid UTF-8. */
	if (!g_utf8_validate(s, -1, NULL))
		return descriptor_fail(err_out, "%s%s: not valid UTF-8", path, key);
	*out = g_strdup(s);
	return TE_OK;
}

/* Which spellings a 64-bit member accepts. */
enum descriptor_u64_form {
	DESCRIPTOR_U64_DECIMAL, /* decimal string or JSON integer >= 0 */
	DESCRIPTOR_U64_ADDR,	/* "0x" hex string or decimal string */
};

static enum te_status descriptor_get_u64(JsonObject *obj, const char *path, const char *key,
					 enum descriptor_u64_form form, uint64_t *out,
					 char **err_out)
{
	JsonNode *node = json_object_get_member(obj, key);

	if (!node)
		return descriptor_fail(err_out, "%s%s: missing", path, key);
	if (form == DESCRIPTOR_U64_DECIMAL) {
		if (descriptor_is_int(node) && json_node_get_int(node) >= 0) {
			*out = (uint64_t)json_node_get_int(node);
			return TE_OK;
		}
		if (descriptor_is_string(node) &&
		    descriptor_parse_decimal(json_node_get_string(node), out))
			return TE_OK;
		return descriptor_fail(err_out,
				       "%s%s: must be a decimal string or a non-negative integer",
				       path, key);
	}
	if (descriptor_is_string(node) &&
	    (descriptor_parse_hex(json_node_get_string(node), out) ||
	     descriptor_parse_decimal(json_node_get_string(node), out)))
		return TE_OK;
	return descriptor_fail(err_out, "%s%s: must be a hex (0x...) or decimal string", path, key);
}

/*
 * Strict RFC 4648 base64 (padded, no whitespace, zero trailing bits): g_base64_decode
 * skips bad characters silently, and only a canonical text makes re-encoding exact.
 * On success *size_out is the decoded length.
 */
static bool descriptor_base64_check(const char *s, size_t len, size_t *size_out)
{
	static const char alphabet[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t pad = 0;

	if (len % 4 != 0)
		return false;
	if (len >= 1 && s[len - 1] == '=')
		pad++;
	if (len >= 2 && s[len - 2] == '=')
		pad++;
	for (size_t i = 0; i < len - pad; i++) {
		if (!s[i] || !strchr(alphabet, s[i]))
			return false;
	}
	if (pad > 0) {
		size_t last = (size_t)(strchr(alphabet, s[len - pad - 1]) - alphabet);

		/* The bits past the final byte must be zero. */
		if (last & (pad == 2 ? 0x0fu : 0x03u))
			return false;
	}
	*size_out = len / 4 * 3 - pad;
	return true;
}

/*
 * descriptor_get_blobs - an object {<transport>: <base64>} at @path ("transports",
 * "buffers[3].keys"), in document order. A missing member means none.
 */
static enum te_status descriptor_get_blobs(JsonObject *obj, const char *path, const char *key,
					   struct descriptor_blob **blobs_out, size_t *n_out,
					   char **err_out)
{
	JsonNode *node = json_object_get_member(obj, key);
	struct descriptor_blob *blobs;
	enum te_status st = TE_OK;
	JsonObject *map;
	GList *names;
	size_t n = 0;

	if (!node) {
		*blobs_out = NULL;
		*n_out = 0;
		return TE_OK;
	}
	if (!JSON_NODE_HOLDS_OBJECT(node))
		return descriptor_fail(err_out, "%s%s: must be an object", path, key);
	map = json_node_get_object(node);
	if (json_object_get_size(map) > DESCRIPTOR_MAX_TRANSPORTS)
		return descriptor_fail(err_out, "%s%s: more than %u entries", path, key,
				       DESCRIPTOR_MAX_TRANSPORTS);

	blobs = g_new0(struct descriptor_blob, json_object_get_size(map));
	names = json_object_get_members(map);
	for (GList *l = names; l; l = l->next, n++) {
		const char *name = l->data;
		JsonNode *value = json_object_get_member(map, name);
		g_autofree char *shown = NULL;
		const char *text;
		guchar *data = NULL;
		gsize decoded = 0;
		size_t text_len;
		size_t size = 0;

		if (!*name) {
			st = descriptor_fail(err_out, "%s%s: empty transport name", path, key);
			break;
		}
		if (strlen(name) > DESCRIPTOR_MAX_NAME) {
			st = descriptor_fail(err_out, "%s%s: transport name longer than %u bytes",
					     path, key, DESCRIPTOR_MAX_NAME);
			break;
		}
		/* As in descriptor_get_string(): escapes can produce invalid UTF-8. */
		if (!g_utf8_validate(name, -1, NULL)) {
			st = descriptor_fail(err_out, "%s%s: transport name not valid UTF-8", path,
					     key);
			break;
		}
		/* The name comes from a peer: keep control bytes out of log lines. */
		shown = g_strescape(name, NULL);
		if (!descriptor_is_string(value)) {
			st = descriptor_fail(err_out, "%s%s.%s: must be a base64 string", path, key,
					     shown);
			break;
		}
		text = json_node_get_string(value);
		text_len = strlen(text);
		if (text_len > DESCRIPTOR_MAX_BASE64) {
			st = descriptor_fail(err_out, "%s%s.%s: decodes to more than %u bytes",
					     path, key, shown, DESCRIPTOR_MAX_BLOB);
			break;
		}
		if (!descriptor_base64_check(text, text_len, &size)) {
			st = descriptor_fail(err_out, "%s%s.%s: invalid base64", path, key, shown);
			break;
		}
		if (size > DESCRIPTOR_MAX_BLOB) {
			st = descriptor_fail(err_out, "%s%s.%s: decodes to more than %u bytes",
					     path, key, shown, DESCRIPTOR_MAX_BLOB);
			break;
		}
		blobs[n].transport = g_strdup(name);
		if (size > 0) {
			data = g_base64_decode(text, &decoded);
			assert(decoded == size);
		}
		blobs[n].blob = g_bytes_new_take(data, size);
	}
	g_list_free(names);
	if (st != TE_OK) {
		descriptor_blobs_free(blobs, n);
		return st;
	}
	*blobs_out = blobs;
	*n_out = n;
	return TE_OK;
}

static enum te_status descriptor_get_buffer(JsonNode *node, size_t index,
					    struct descriptor_buffer *buf, char **err_out)
{
	char path[48];
	JsonObject *obj;
	JsonNode *access;
	enum te_status st;

	if (!JSON_NODE_HOLDS_OBJECT(node))
		return descriptor_fail(err_out, "buffers[%zu]: must be an object", index);
	obj = json_node_get_object(node);
	snprintf(path, sizeof(path), "buffers[%zu].", index);

	st = descriptor_get_u64(obj, path, "addr", DESCRIPTOR_U64_ADDR, &buf->addr, err_out);
	if (st != TE_OK)
		return st;
	st = descriptor_get_u64(obj, path, "length", DESCRIPTOR_U64_DECIMAL, &buf->length, err_out);
	if (st != TE_OK)
		return st;
	if (buf->length == 0)
		return descriptor_fail(err_out, "%slength: must be > 0", path);
	if (buf->length - 1 > UINT64_MAX - buf->addr)
		return descriptor_fail(err_out, "%slength: addr + length wraps around", path);

	/* Missing access grants nothing: a peer must opt in to remote access. */
	access = json_object_get_member(obj, "access");
	if (access) {
		gint64 bits;

		if (!descriptor_is_int(access))
			return descriptor_fail(err_out, "%saccess: must be an integer", path);
		bits = json_node_get_int(access);
		if (bits < 0 || (bits & ~(gint64)TE_MEM_REMOTE) != 0)
			return descriptor_fail(
				err_out, "%saccess: bits other than 1 (read) and 2 (write)", path);
		buf->access = (uint32_t)bits;
	}

	st = descriptor_get_string(obj, path, "location", false, &buf->location, err_out);
	if (st != TE_OK)
		return st;
	return descriptor_get_blobs(obj, path, "keys", &buf->keys, &buf->n_keys, err_out);
}

static int descriptor_span_cmp(const void *a, const void *b)
{
	const struct descriptor_span *x = a, *y = b;

	if (x->addr != y->addr)
		return x->addr < y->addr ? -1 : 1;
	/* Ties by index keep the sort deterministic, so error text is too. */
	return x->index < y->index ? -1 : x->index > y->index;
}

/* Sort @d's buffers by address and refuse overlaps, naming the JSON indices. */
static enum te_status descriptor_sort_buffers(struct descriptor *d, char **err_out)
{
	struct descriptor_span *spans;
	struct descriptor_buffer *sorted;
	size_t n = d->n_buffers;

	if (n < 2)
		return TE_OK;
	spans = g_new(struct descriptor_span, n);
	for (size_t i = 0; i < n; i++) {
		/* Inclusive end: a buffer ending at 2^64 would wrap an exclusive one to 0. */
		spans[i].addr = d->buffers[i].addr;
		spans[i].end = d->buffers[i].addr + (d->buffers[i].length - 1);
		spans[i].index = i;
	}
	qsort(spans, n, sizeof(*spans), descriptor_span_cmp);
	for (size_t i = 1; i < n; i++) {
		if (spans[i].addr <= spans[i - 1].end) {
			enum te_status st =
				descriptor_fail(err_out, "buffers[%zu]: overlaps buffers[%zu]",
						spans[i].index, spans[i - 1].index);

			g_free(spans);
			return st;
		}
	}
	sorted = g_new(struct descriptor_buffer, n);
	for (size_t i = 0; i < n; i++)
		sorted[i] = d->buffers[spans[i].index];
	g_free(d->buffers);
	d->buffers = sorted;
	g_free(spans);
	return TE_OK;
}

static enum te_status descriptor_get_buffers(JsonObject *root, struct descriptor *d, char **err_out)
{
	JsonNode *node = json_object_get_member(root, "buffers");
	JsonArray *array;
	size_t n;

	if (!node)
		return descriptor_fail(err_out, "buffers: missing");
	if (!JSON_NODE_HOLDS_ARRAY(node))
		return descriptor_fail(err_out, "buffers: must be an array");
	array = json_node_get_array(node);
	n = json_array_get_length(array);
	if (n > DESCRIPTOR_MAX_BUFFERS)
		return descriptor_fail(err_out, "buffers: more than %u entries",
				       DESCRIPTOR_MAX_BUFFERS);
	/* Count first: descriptor_free() then releases whatever was filled in. */
	d->buffers = g_new0(struct descriptor_buffer, n);
	d->n_buffers = n;
	for (size_t i = 0; i < n; i++) {
		enum te_status st = descriptor_get_buffer(json_array_get_element(array, (guint)i),
							  i, &d->buffers[i], err_out);

		if (st != TE_OK)
			return st;
	}
	return descriptor_sort_buffers(d, err_out);
}

static enum te_status descriptor_get_fields(JsonObject *root, struct descriptor *d, char **err_out)
{
	JsonNode *pid;
	enum te_status st;

	st = descriptor_get_string(root, "", "name", true, &d->name, err_out);
	if (st != TE_OK)
		return st;
	if (!*d->name)
		return descriptor_fail(err_out, "name: must not be empty");
	st = descriptor_get_u64(root, "", "generation", DESCRIPTOR_U64_DECIMAL, &d->generation,
				err_out);
	if (st != TE_OK)
		return st;
	st = descriptor_get_string(root, "", "rpc", false, &d->rpc, err_out);
	if (st != TE_OK)
		return st;
	st = descriptor_get_string(root, "", "host", false, &d->host_id, err_out);
	if (st != TE_OK)
		return st;
	pid = json_object_get_member(root, "pid");
	if (pid) {
		if (!descriptor_is_int(pid) || json_node_get_int(pid) < 0 ||
		    json_node_get_int(pid) > UINT32_MAX)
			return descriptor_fail(
				err_out, "pid: must be an integer in [0, %" PRIu32 "]", UINT32_MAX);
		d->pid = (uint32_t)json_node_get_int(pid);
	}
	if (json_object_get_member(root, "pidns")) {
		st = descriptor_get_string(root, "", "pidns", false, &d->pid_ns, err_out);
		if (st != TE_OK)
			return st;
	}
	st = descriptor_get_blobs(root, "", "transports", &d->transports, &d->n_transports,
				  err_out);
	if (st != TE_OK)
		return st;
	return descriptor_get_buffers(root, d, err_out);
}

enum te_status descriptor_decode(const char *json, size_t len, struct descriptor **d_out,
				 char **err_out)
{
	g_autoptr(JsonParser) parser = NULL;
	g_autoptr(GError) error = NULL;
	struct descriptor *d;
	enum te_status st;
	JsonNode *root;

	assert(d_out);
	assert(json || len == 0);
	if (len > DESCRIPTOR_MAX_JSON)
		return descriptor_fail(err_out, "input: longer than %u bytes", DESCRIPTOR_MAX_JSON);
	/* Also refuses NUL bytes, which would cut strings short inside json-glib. */
	if (len > 0 && !g_utf8_validate_len(json, len, NULL))
		return descriptor_fail(err_out, "input: not valid UTF-8");
	st = descriptor_prescan(json, len, err_out);
	if (st != TE_OK)
		return st;

	parser = json_parser_new_immutable();
	/* json-glib reads at most @len bytes, so no NUL terminator is needed. */
	if (!json_parser_load_from_data(parser, len ? json : "", (gssize)len, &error))
		return descriptor_fail(err_out, "input: %s", error->message);
	root = json_parser_get_root(parser);
	if (!root || !JSON_NODE_HOLDS_OBJECT(root))
		return descriptor_fail(err_out, "root: must be an object");

	d = g_new0(struct descriptor, 1);
	st = descriptor_get_fields(json_node_get_object(root), d, err_out);
	if (st != TE_OK) {
		descriptor_free(d);
		return st;
	}
	*d_out = d;
	return TE_OK;
}

/* ---- lookups ---- */

GBytes *descriptor_find_blob(const struct descriptor_blob *blobs, size_t n, const char *transport)
{
	if (!transport)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (blobs[i].transport && strcmp(blobs[i].transport, transport) == 0)
			return blobs[i].blob;
	}
	return NULL;
}

const struct descriptor_buffer *descriptor_find_buffer(const struct descriptor *d, uint64_t addr,
						       uint64_t length)
{
	const struct descriptor_buffer *buf;
	size_t lo = 0, hi;

	if (!d || length == 0 || length - 1 > UINT64_MAX - addr)
		return NULL;
	/* Find the last buffer starting at or below @addr: the only candidate. */
	hi = d->n_buffers;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (d->buffers[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	buf = &d->buffers[lo - 1];
	/* Inclusive ends: a buffer may end exactly at 2^64. */
	if (addr + (length - 1) > buf->addr + (buf->length - 1))
		return NULL;
	return buf;
}
