/* SPDX-License-Identifier: Apache-2.0 */
/* config.c: parse the YAML node configuration (libyaml events -> node tree -> schema walk). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* explicit_bzero; meson sets it, fuzz/run-libfuzzer.sh does not */
#endif
#include "core/config.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>
#include <yaml.h>

#include <te/te.h>
#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>

/*
 * Bounds on the node tree. The schema is four levels deep (root, transports,
 * item, options), so anything deeper than MAX_DEPTH is junk; MAX_NODES caps the
 * memory a 1 MiB input can make us allocate (a valid file needs a few thousand).
 */
#define MAX_DEPTH 32
#define MAX_NODES 65536
/* Longest transport name ([a-z0-9_-]+): it becomes a module file stem. */
#define MAX_TRANSPORT_NAME 64
/* Longest user text quoted in an error message, in bytes. */
#define MSG_TEXT_MAX 64
/* Most fields in one schema table (transfer has 13, control 11). */
#define MAX_FIELDS 16

#define SIZE_K (UINT64_C(1) << 10)
#define SIZE_M (UINT64_C(1) << 20)
#define SIZE_G (UINT64_C(1) << 30)
#define SLICE_SIZE_MAX SIZE_G

#define DEFAULT_LISTEN "127.0.0.1:0"
#define DEFAULT_NAMESPACE "/te"

const char config_default_yaml[] =
	"# te built-in default: one node on loopback, peer-to-peer metadata, tcp.\n"
	"engine:\n"
	"  listen: \"127.0.0.1:0\"\n"
	"metadata:\n"
	"  type: p2p\n"
	"transports:\n"
	"  - name: tcp\n"
	"    required: true\n";

/* --- node tree ---------------------------------------------------------------- */

enum node_kind {
	NODE_SCALAR,
	NODE_MAP,
	NODE_SEQ,
};

struct node {
	enum node_kind kind;
	unsigned line; /* 1-based */
	unsigned col;  /* 1-based, in characters as libyaml counts them */
	bool plain;    /* plain scalar style: the only one that can mean null */
	char *text;    /* scalar: NUL-terminated, no embedded NUL */
	size_t len;
	GPtrArray *kids; /* map: key, value, key, value...; seq: items */
};

static void node_free(struct node *n)
{
	if (!n)
		return;
	if (n->kids) {
		/* Depth is bounded by MAX_DEPTH, so the recursion is too. */
		for (guint i = 0; i < n->kids->len; i++)
			node_free(g_ptr_array_index(n->kids, i));
		g_ptr_array_free(n->kids, TRUE);
	}
	g_free(n->text);
	g_free(n);
}

static bool node_is_null(const struct node *n)
{
	if (!n)
		return true;
	if (n->kind != NODE_SCALAR || !n->plain)
		return false;
	return n->len == 0 || !strcmp(n->text, "~") || !strcmp(n->text, "null") ||
	       !strcmp(n->text, "Null") || !strcmp(n->text, "NULL");
}

static size_t node_pairs(const struct node *n)
{
	return n->kids->len / 2;
}

static struct node *node_kid(const struct node *n, size_t i)
{
	return g_ptr_array_index(n->kids, i);
}

/* --- errors ------------------------------------------------------------------- */

struct pctx {
	const char *name;
	enum te_status status; /* TE_OK until the first error */
	char *err;
	size_t n_nodes;
	/* Value nodes kept for the checks that span keys (see check_cross). */
	struct node *slot[16];
};

enum slot {
	SLOT_NONE = 0,
	SLOT_METADATA_TYPE,
	SLOT_BACKOFF,
	SLOT_BACKOFF_MAX,
	SLOT_SECRET,
	SLOT_SECRET_FILE,
	SLOT_TRANSPORTS,
	SLOT_MAX_FRAME,
	SLOT_MAX_BUFFERED,
};

/* Append user text in double quotes, escaped and bounded. */
static void append_quoted(GString *s, const char *t, size_t len)
{
	size_t n = len < MSG_TEXT_MAX ? len : MSG_TEXT_MAX;

	/* Do not cut a UTF-8 sequence in half. */
	while (n > 0 && n < len && ((unsigned char)t[n] & 0xc0) == 0x80)
		n--;
	g_string_append_c(s, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)t[i];

		if (c == '"' || c == '\\')
			g_string_append_printf(s, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			g_string_append_printf(s, "\\x%02x", c);
		else
			g_string_append_c(s, (char)c);
	}
	if (n < len)
		g_string_append(s, "...");
	g_string_append_c(s, '"');
}

static bool is_simple_key(const char *t, size_t len)
{
	if (len == 0 || len > MSG_TEXT_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!g_ascii_isalnum(t[i]) && t[i] != '_' && t[i] != '-')
			return false;
	return true;
}

/* Append a key's text to a key path: bare when simple, else quoted. */
static void append_key_text(GString *s, const char *t, size_t len)
{
	if (s->len)
		g_string_append_c(s, '.');
	if (is_simple_key(t, len))
		g_string_append_len(s, t, (gssize)len);
	else
		append_quoted(s, t, len);
}

/* Append one mapping key to a key path. */
static void append_key(GString *s, const struct node *key)
{
	if (key->kind != NODE_SCALAR) {
		if (s->len)
			g_string_append_c(s, '.');
		g_string_append(s, "?");
		return;
	}
	append_key_text(s, key->text, key->len);
}

static char *path_key(const char *parent, const struct node *key)
{
	GString *s = g_string_new(parent);

	append_key(s, key);
	return g_string_free(s, FALSE);
}

static char *path_index(const char *parent, size_t i)
{
	return g_strdup_printf("%s[%zu]", parent, i);
}

static bool fail_at(struct pctx *p, unsigned line, unsigned col, const char *path, const char *fmt,
		    ...) G_GNUC_PRINTF(5, 6);

/* Record the first error only: later ones are consequences. */
static bool fail_at(struct pctx *p, unsigned line, unsigned col, const char *path, const char *fmt,
		    ...)
{
	va_list ap;
	g_autofree char *reason = NULL;

	if (p->status != TE_OK)
		return false;
	va_start(ap, fmt);
	reason = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	p->status = TE_ERR_CONFIG;
	p->err = g_strdup_printf("%s:%u:%u: %s: %s", p->name, line, col,
				 path && *path ? path : "(root)", reason);
	return false;
}

#define fail(p, node, path, ...) fail_at((p), (node)->line, (node)->col, (path), __VA_ARGS__)

static const char *kind_name(const struct node *n)
{
	switch (n->kind) {
	case NODE_MAP:
		return "a mapping";
	case NODE_SEQ:
		return "a sequence";
	case NODE_SCALAR:
		break;
	}
	return node_is_null(n) ? "null" : "a scalar";
}

/* "expected X, got Y" where Y names the node's kind, or quotes a scalar. */
static bool fail_type(struct pctx *p, const struct node *n, const char *path, const char *expected)
{
	g_autoptr(GString) got = g_string_new(NULL);

	if (n->kind == NODE_SCALAR && !node_is_null(n))
		append_quoted(got, n->text, n->len);
	else
		g_string_append(got, kind_name(n));
	return fail(p, n, path, "expected %s, got %s", expected, got->str);
}

/* --- YAML events -> node tree ------------------------------------------------- */

/*
 * Key path of the position the builder is at: where the next node goes. Every
 * frame but the top has its open child as its last kid.
 */
static char *stack_path(GPtrArray *stack)
{
	GString *s = g_string_new(NULL);

	for (guint i = 0; i < stack->len; i++) {
		const struct node *c = g_ptr_array_index(stack, i);
		guint next = c->kids->len + (i + 1 < stack->len ? 0 : 1);

		/* @next counts the kids including the one being parsed. */
		if (c->kind == NODE_SEQ)
			g_string_append_printf(s, "[%u]", next - 1);
		else if (next % 2 == 0)
			append_key(s, g_ptr_array_index(c->kids, next - 2));
	}
	return g_string_free(s, FALSE);
}

static void fail_yaml(struct pctx *p, const yaml_parser_t *parser, const char *buf, size_t len,
		      GPtrArray *stack)
{
	g_autofree char *path = stack_path(stack);
	const char *problem = parser->problem ? parser->problem : "unknown error";

	switch (parser->error) {
	case YAML_MEMORY_ERROR:
		fail_at(p, 1, 1, path, "out of memory");
		p->status = TE_ERR_NOMEM;
		return;
	case YAML_READER_ERROR: {
		/* The reader reports a byte offset, not a mark. */
		unsigned line = 1, col = 1;
		size_t end = parser->problem_offset < len ? parser->problem_offset : len;

		for (size_t i = 0; i < end; i++) {
			if (buf[i] == '\n') {
				line++;
				col = 1;
			} else {
				col++;
			}
		}
		/* The reader decodes ahead of the parser: the builder's path means nothing. */
		if (parser->problem_value >= 0)
			fail_at(p, line, col, NULL, "invalid input: %s (0x%x)", problem,
				(unsigned)parser->problem_value);
		else
			fail_at(p, line, col, NULL, "invalid input: %s", problem);
		return;
	}
	default:
		break;
	}
	if (parser->context)
		fail_at(p, (unsigned)parser->problem_mark.line + 1,
			(unsigned)parser->problem_mark.column + 1, path,
			"syntax error: %s (%s at %u:%u)", problem, parser->context,
			(unsigned)parser->context_mark.line + 1,
			(unsigned)parser->context_mark.column + 1);
	else
		fail_at(p, (unsigned)parser->problem_mark.line + 1,
			(unsigned)parser->problem_mark.column + 1, path, "syntax error: %s",
			problem);
}

/* Reject anchors and tags: the schema is plain data, and aliases defeat the bounds. */
static bool check_props(struct pctx *p, const yaml_event_t *ev, const yaml_char_t *anchor,
			const yaml_char_t *tag, const char *path)
{
	unsigned line = (unsigned)ev->start_mark.line + 1;
	unsigned col = (unsigned)ev->start_mark.column + 1;
	g_autoptr(GString) text = g_string_new(NULL);

	/* libyaml limits anchor names to [0-9A-Za-z_-]: safe to print, bound the length. */
	if (anchor)
		return fail_at(p, line, col, path, "anchor &%.*s is not supported", MSG_TEXT_MAX,
			       (const char *)anchor);
	if (!tag)
		return true;
	append_quoted(text, (const char *)tag, strlen((const char *)tag));
	return fail_at(p, line, col, path, "tag %s is not supported", text->str);
}

/* Attach @n to the open container (or make it the root); takes ownership of @n. */
static bool attach(struct pctx *p, GPtrArray *stack, struct node **root, struct node *n,
		   const char *path)
{
	if (stack->len) {
		struct node *top = g_ptr_array_index(stack, stack->len - 1);

		g_ptr_array_add(top->kids, n);
	} else {
		/* One document holds one root node. */
		assert(!*root);
		*root = n;
	}
	if (++p->n_nodes > MAX_NODES)
		return fail(p, n, path, "more than %d nodes in the document", MAX_NODES);
	return true;
}

static struct node *node_new(enum node_kind kind, const yaml_event_t *ev)
{
	struct node *n = g_new0(struct node, 1);

	n->kind = kind;
	n->line = (unsigned)ev->start_mark.line + 1;
	n->col = (unsigned)ev->start_mark.column + 1;
	if (kind != NODE_SCALAR)
		n->kids = g_ptr_array_new();
	return n;
}

static bool on_scalar(struct pctx *p, const yaml_event_t *ev, GPtrArray *stack, struct node **root)
{
	const char *v = (const char *)ev->data.scalar.value;
	size_t len = ev->data.scalar.length;
	g_autofree char *path = stack_path(stack);
	struct node *n;

	if (!check_props(p, ev, ev->data.scalar.anchor, ev->data.scalar.tag, path))
		return false;
	n = node_new(NODE_SCALAR, ev);
	n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
	if (!attach(p, stack, root, n, path))
		return false;
	if (len > CONFIG_MAX_STRING)
		return fail(p, n, path, "string of %zu bytes is over the %d-byte limit", len,
			    CONFIG_MAX_STRING);
	if (memchr(v, '\0', len))
		return fail(p, n, path, "string contains a NUL character");
	n->text = g_strndup(v, len);
	n->len = len;
	return true;
}

static bool on_container(struct pctx *p, const yaml_event_t *ev, GPtrArray *stack,
			 struct node **root)
{
	bool map = ev->type == YAML_MAPPING_START_EVENT;
	g_autofree char *path = stack_path(stack);
	struct node *n;

	if (map &&
	    !check_props(p, ev, ev->data.mapping_start.anchor, ev->data.mapping_start.tag, path))
		return false;
	if (!map &&
	    !check_props(p, ev, ev->data.sequence_start.anchor, ev->data.sequence_start.tag, path))
		return false;
	if (stack->len >= MAX_DEPTH)
		return fail_at(p, (unsigned)ev->start_mark.line + 1,
			       (unsigned)ev->start_mark.column + 1, path,
			       "nesting deeper than %d levels", MAX_DEPTH);
	n = node_new(map ? NODE_MAP : NODE_SEQ, ev);
	if (!attach(p, stack, root, n, path))
		return false;
	g_ptr_array_add(stack, n);
	return true;
}

static bool on_event(struct pctx *p, const yaml_event_t *ev, GPtrArray *stack, struct node **root,
		     unsigned *docs)
{
	switch (ev->type) {
	case YAML_DOCUMENT_START_EVENT:
		if (++*docs > 1)
			return fail_at(p, (unsigned)ev->start_mark.line + 1,
				       (unsigned)ev->start_mark.column + 1, NULL,
				       "more than one YAML document (a configuration is one "
				       "document)");
		return true;
	case YAML_ALIAS_EVENT: {
		g_autofree char *path = stack_path(stack);

		return fail_at(p, (unsigned)ev->start_mark.line + 1,
			       (unsigned)ev->start_mark.column + 1, path,
			       "alias *%.*s is not supported", MSG_TEXT_MAX,
			       (const char *)ev->data.alias.anchor);
	}
	case YAML_SCALAR_EVENT:
		return on_scalar(p, ev, stack, root);
	case YAML_MAPPING_START_EVENT:
	case YAML_SEQUENCE_START_EVENT:
		return on_container(p, ev, stack, root);
	case YAML_MAPPING_END_EVENT:
	case YAML_SEQUENCE_END_EVENT:
		assert(stack->len > 0);
		g_ptr_array_set_size(stack, stack->len - 1);
		return true;
	default:
		return true;
	}
}

/* Parse @buf into a node tree; *root_out is NULL for an empty stream. */
static bool build_tree(struct pctx *p, const char *buf, size_t len, struct node **root_out)
{
	yaml_parser_t parser;
	yaml_event_t ev;
	g_autoptr(GPtrArray) stack = g_ptr_array_new();
	struct node *root = NULL;
	unsigned docs = 0;
	bool ok = true, done = false;

	if (!yaml_parser_initialize(&parser)) {
		fail_at(p, 1, 1, NULL, "out of memory");
		p->status = TE_ERR_NOMEM;
		return false;
	}
	yaml_parser_set_input_string(&parser, (const unsigned char *)(len ? buf : ""), len);
	while (ok && !done) {
		if (!yaml_parser_parse(&parser, &ev)) {
			fail_yaml(p, &parser, buf, len, stack);
			ok = false;
			break;
		}
		done = ev.type == YAML_STREAM_END_EVENT;
		ok = on_event(p, &ev, stack, &root, &docs);
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&parser);
	if (!ok) {
		node_free(root);
		return false;
	}
	*root_out = root;
	return true;
}

/* --- scalar conversions ------------------------------------------------------- */

enum num {
	NUM_OK,
	NUM_BAD,   /* not a number */
	NUM_RANGE, /* a number, but negative or over 2^64-1 */
};

static enum num parse_digits(const char *s, size_t len, bool allow_sign, uint64_t *out)
{
	size_t i = 0;
	bool neg = false, over = false;
	uint64_t v = 0;

	if (allow_sign && len && (s[0] == '+' || s[0] == '-')) {
		neg = s[0] == '-';
		i++;
	}
	if (i == len)
		return NUM_BAD;
	for (; i < len; i++) {
		unsigned d;

		if (s[i] < '0' || s[i] > '9')
			return NUM_BAD;
		d = (unsigned)(s[i] - '0');
		if (v > (UINT64_MAX - d) / 10)
			over = true;
		else
			v = v * 10 + d;
	}
	if (over || (neg && v))
		return NUM_RANGE;
	*out = v;
	return NUM_OK;
}

/* A byte count: digits, optional blanks, optional binary suffix (K, KB, KiB, ...). */
static enum num parse_size(const char *s, size_t len, uint64_t *out)
{
	static const struct {
		const char *suffix;
		uint64_t mult;
	} units[] = {
		{ "", 1 },
		{ "b", 1 },
		{ "k", SIZE_K },
		{ "kb", SIZE_K },
		{ "kib", SIZE_K },
		{ "m", SIZE_M },
		{ "mb", SIZE_M },
		{ "mib", SIZE_M },
		{ "g", SIZE_G },
		{ "gb", SIZE_G },
		{ "gib", SIZE_G },
		{ "t", SIZE_G << 10 },
		{ "tb", SIZE_G << 10 },
		{ "tib", SIZE_G << 10 },
	};
	size_t d = 0, u;
	uint64_t v;
	enum num r;

	while (d < len && s[d] >= '0' && s[d] <= '9')
		d++;
	u = d;
	while (u < len && s[u] == ' ')
		u++;
	for (size_t i = 0; i < G_N_ELEMENTS(units); i++) {
		if (strlen(units[i].suffix) != len - u ||
		    g_ascii_strncasecmp(s + u, units[i].suffix, len - u))
			continue;
		r = parse_digits(s, d, false, &v);
		if (r != NUM_OK)
			return r;
		if (v > UINT64_MAX / units[i].mult)
			return NUM_RANGE;
		*out = v * units[i].mult;
		return NUM_OK;
	}
	/* "-1K" is a number out of range rather than garbage. */
	if (len > 1 && s[0] == '-' && parse_size(s + 1, len - 1, &v) == NUM_OK)
		return NUM_RANGE;
	return NUM_BAD;
}

/* "1G" for exact multiples of a binary unit, else the plain number. */
static char *format_size(uint64_t v)
{
	if (v && v % (SIZE_G << 10) == 0)
		return g_strdup_printf("%" PRIu64 "T", v / (SIZE_G << 10));
	if (v && v % SIZE_G == 0)
		return g_strdup_printf("%" PRIu64 "G", v / SIZE_G);
	if (v && v % SIZE_M == 0)
		return g_strdup_printf("%" PRIu64 "M", v / SIZE_M);
	if (v && v % SIZE_K == 0)
		return g_strdup_printf("%" PRIu64 "K", v / SIZE_K);
	return g_strdup_printf("%" PRIu64, v);
}

static bool has_space_or_control(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c <= 0x20 || c == 0x7f)
			return true;
	}
	return false;
}

static bool is_host_char(char c)
{
	return g_ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
}

/* host:port with a decimal port 0..65535; IPv6 literals in brackets. */
static bool listen_valid(const char *s, size_t len)
{
	const char *colon, *port;
	uint64_t v;

	if (len == 0)
		return false;
	if (s[0] == '[') {
		const char *close = memchr(s, ']', len);

		if (!close || close == s + 1 || close[1] != ':')
			return false;
		for (const char *c = s + 1; c < close; c++)
			if (!g_ascii_isxdigit(*c) && *c != ':' && *c != '.' && *c != '%' &&
			    !is_host_char(*c))
				return false;
		colon = close + 1;
	} else {
		colon = memchr(s, ':', len);
		if (!colon || colon == s || memchr(colon + 1, ':', len - (size_t)(colon + 1 - s)))
			return false;
		for (const char *c = s; c < colon; c++)
			if (!is_host_char(*c))
				return false;
	}
	port = colon + 1;
	if (port == s + len || (size_t)(s + len - port) > 5)
		return false;
	return parse_digits(port, (size_t)(s + len - port), false, &v) == NUM_OK && v <= 65535;
}

static bool transport_name_valid(const char *s, size_t len)
{
	if (len == 0 || len > MAX_TRANSPORT_NAME)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= '0' && s[i] <= '9') && s[i] != '_' &&
		    s[i] != '-')
			return false;
	return true;
}

/* --- schema ------------------------------------------------------------------- */

enum ftype {
	F_SECTION,    /* nested mapping of fields on the same base */
	F_TRANSPORTS, /* sequence of transport mappings */
	F_OPTIONS,    /* mapping of scalars kept as text */
	F_ENDPOINTS,  /* sequence of strings, or one string */
	F_STRING,     /* non-empty text */
	F_SECRET,     /* text of at least CONFIG_MIN_SECRET bytes */
	F_TOKEN,      /* non-empty text without blanks or control characters */
	F_LISTEN,     /* host:port */
	F_TNAME,      /* transport name */
	F_U32,
	F_U64,
	F_SIZE,
	F_BOOL,
	F_METATYPE,
	F_LOGLEVEL,
};

struct field {
	const char *key;
	enum ftype type;
	size_t off; /* into the base struct (struct config or struct config_transport) */
	uint64_t min, max;
	enum slot slot;
	const struct field *sub; /* F_SECTION */
	size_t n_sub;
};

static const char *const metadata_types[] = {
	[CONFIG_METADATA_P2P] = "p2p",
	[CONFIG_METADATA_ETCD] = "etcd",
	[CONFIG_METADATA_REDIS] = "redis",
	[CONFIG_METADATA_HTTP] = "http",
};

static const char *const log_levels[] = {
	[TE_LOG_ERROR] = "error", [TE_LOG_WARN] = "warn",   [TE_LOG_INFO] = "info",
	[TE_LOG_DEBUG] = "debug", [TE_LOG_TRACE] = "trace",
};

/* Designated initializers: every field not named is zero. */
#define CFG(m) offsetof(struct config, m)
#define TR(m) offsetof(struct config_transport, m)
/* clang-format off */
#define LEAF(k, t, o) { .key = (k), .type = (t), .off = (o) }
#define RANGED(k, t, o, lo, hi) { .key = (k), .type = (t), .off = (o), .min = (lo), .max = (hi) }
#define SECTION(k, t) { .key = (k), .type = F_SECTION, .sub = (t), .n_sub = G_N_ELEMENTS(t) }
/* clang-format on */

static const struct field engine_fields[] = {
	LEAF("name", F_TOKEN, CFG(name)),
	LEAF("listen", F_LISTEN, CFG(listen)),
	LEAF("advertise", F_TOKEN, CFG(advertise)),
};

static const struct field metadata_fields[] = {
	{ .key = "type",
	  .type = F_METATYPE,
	  .off = CFG(metadata_type),
	  .slot = SLOT_METADATA_TYPE },
	LEAF("endpoints", F_ENDPOINTS, 0),
	LEAF("namespace", F_TOKEN, CFG(metadata_namespace)),
	RANGED("ttl_s", F_U32, CFG(metadata_ttl_s), 1, 3600),
	LEAF("username", F_TOKEN, CFG(metadata_username)),
	LEAF("password_file", F_STRING, CFG(metadata_password_file)),
	LEAF("ca_file", F_STRING, CFG(metadata_ca_file)),
	RANGED("timeout_ms", F_U32, CFG(metadata_timeout_ms), 100, 600000),
};

static const struct field transfer_fields[] = {
	RANGED("slice_size", F_SIZE, CFG(slice_size), 0, SLICE_SIZE_MAX),
	RANGED("max_slices_per_task", F_U32, CFG(max_slices_per_task), 1, 1048576),
	RANGED("retries", F_U32, CFG(retries), 0, 100),
	{ .key = "retry_backoff_us",
	  .type = F_U64,
	  .off = CFG(retry_backoff_us),
	  .min = 0,
	  .max = 10000000,
	  .slot = SLOT_BACKOFF },
	{ .key = "retry_backoff_max_us",
	  .type = F_U64,
	  .off = CFG(retry_backoff_max_us),
	  .min = 0,
	  .max = 10000000,
	  .slot = SLOT_BACKOFF_MAX },
	RANGED("timeout_ms", F_U64, CFG(timeout_ms), 1, 86400000),
	RANGED("quarantine_ms", F_U64, CFG(quarantine_ms), 0, 3600000),
	RANGED("quarantine_after", F_U32, CFG(quarantine_after), 1, 1000),
	RANGED("cancel_grace_ms", F_U64, CFG(cancel_grace_ms), 0, 600000),
	RANGED("worker_threads", F_U32, CFG(worker_threads), 1, 64),
	RANGED("max_pollers", F_U32, CFG(max_pollers), 0, 1024),
	RANGED("max_batches", F_U32, CFG(max_batches), 1, 1048576),
	RANGED("max_batch_size", F_U32, CFG(max_batch_size), 1, 16777216),
	LEAF("fallback", F_BOOL, CFG(fallback)),
};

static const struct field log_fields[] = {
	LEAF("level", F_LOGLEVEL, CFG(log_level)),
};

static const struct field auth_fields[] = {
	{ .key = "secret", .type = F_SECRET, .off = CFG(auth_secret), .slot = SLOT_SECRET },
	{ .key = "secret_file",
	  .type = F_STRING,
	  .off = CFG(auth_secret_file),
	  .slot = SLOT_SECRET_FILE },
};

/* Ranges: docs/config.md, "control"; the defaults are in config_set_defaults. */
static const struct field control_fields[] = {
	RANGED("max_connections", F_U32, CFG(control_max_connections), 1, 1048576),
	RANGED("max_connections_per_host", F_U32, CFG(control_max_connections_per_host), 1,
	       1048576),
	RANGED("max_unauthenticated", F_U32, CFG(control_max_unauthenticated), 1, 1048576),
	RANGED("auth_timeout_ms", F_U32, CFG(control_auth_timeout_ms), 1, 3600000),
	RANGED("idle_timeout_ms", F_U32, CFG(control_idle_timeout_ms), 1, 86400000),
	RANGED("frame_timeout_ms", F_U32, CFG(control_frame_timeout_ms), 1, 3600000),
	{ .key = "max_frame",
	  .type = F_SIZE,
	  .off = CFG(control_max_frame),
	  .min = 64 * SIZE_K,
	  .max = SIZE_G,
	  .slot = SLOT_MAX_FRAME },
	{ .key = "max_buffered",
	  .type = F_SIZE,
	  .off = CFG(control_max_buffered),
	  .min = 64 * SIZE_K,
	  .max = 64 * SIZE_G,
	  .slot = SLOT_MAX_BUFFERED },
	RANGED("notify_inbox", F_U32, CFG(control_notify_inbox), 1, 16777216),
	RANGED("notify_per_sender", F_U32, CFG(control_notify_per_sender), 1, 16777216),
	RANGED("notify_per_host", F_U32, CFG(control_notify_per_host), 1, 16777216),
};

static const struct field transport_fields[] = {
	LEAF("name", F_TNAME, TR(name)),	LEAF("path", F_STRING, TR(path)),
	LEAF("required", F_BOOL, TR(required)), LEAF("memory_only", F_BOOL, TR(memory_only)),
	LEAF("options", F_OPTIONS, 0),
};

static const struct field root_fields[] = {
	SECTION("engine", engine_fields),
	SECTION("metadata", metadata_fields),
	SECTION("transfer", transfer_fields),
	{ .key = "transports", .type = F_TRANSPORTS, .slot = SLOT_TRANSPORTS },
	SECTION("log", log_fields),
	SECTION("auth", auth_fields),
	SECTION("control", control_fields),
};

static bool walk_fields(struct pctx *p, const struct node *map, const char *path,
			const struct field *fields, size_t n_fields, void *base,
			const struct node **seen_out);

static const char *field_expect(enum ftype t)
{
	switch (t) {
	case F_U32:
	case F_U64:
		return "an integer";
	case F_SIZE:
		return "a size (e.g. 4096, 64K, 1M, 1G, 64KiB)";
	case F_BOOL:
		return "a boolean (" TE_PLUGIN_BOOL_WORDS ")";
	case F_METATYPE:
		return "one of: p2p, etcd, redis, http";
	case F_LOGLEVEL:
		return "one of: error, warn, info, debug, trace";
	case F_LISTEN:
		return "an address host:port";
	case F_TNAME:
		return "a transport name";
	default:
		return "a string";
	}
}

static bool set_string(struct pctx *p, const struct node *v, const char *path, char **dst,
		       enum ftype t)
{
	if (v->len == 0)
		return fail(p, v, path, "must not be empty");
	/* A short shared secret falls to guessing; the engine holds a file to the same rule. */
	if (t == F_SECRET && v->len < CONFIG_MIN_SECRET)
		return fail(p, v, path, "%zu byte%s is too short (at least %d)", v->len,
			    v->len == 1 ? "" : "s", CONFIG_MIN_SECRET);
	if (t == F_TOKEN && has_space_or_control(v->text, v->len)) {
		g_autoptr(GString) q = g_string_new(NULL);

		append_quoted(q, v->text, v->len);
		return fail(p, v, path, "%s must not contain blanks or control characters", q->str);
	}
	if (t == F_LISTEN && !listen_valid(v->text, v->len)) {
		g_autoptr(GString) q = g_string_new(NULL);

		append_quoted(q, v->text, v->len);
		return fail(p, v, path,
			    "invalid address %s (expected host:port, IPv6 as [::1]:port)", q->str);
	}
	if (t == F_TNAME && !transport_name_valid(v->text, v->len)) {
		g_autoptr(GString) q = g_string_new(NULL);

		append_quoted(q, v->text, v->len);
		return fail(p, v, path,
			    "invalid transport name %s (1..%d characters of a-z, 0-9, '_', '-')",
			    q->str, MAX_TRANSPORT_NAME);
	}
	g_free(*dst);
	*dst = g_strndup(v->text, v->len);
	return true;
}

static bool set_number(struct pctx *p, const struct field *f, const struct node *v,
		       const char *path, void *dst)
{
	uint64_t x = 0;
	enum num r;

	if (f->type == F_SIZE)
		r = parse_size(v->text, v->len, &x);
	else
		r = parse_digits(v->text, v->len, true, &x);
	if (r == NUM_BAD)
		return fail_type(p, v, path, field_expect(f->type));
	if (r == NUM_RANGE || x < f->min || x > f->max) {
		g_autoptr(GString) q = g_string_new(NULL);

		/* Numbers print bare; the text is a number, so only bound its length. */
		g_string_append_len(q, v->text, (gssize)MIN(v->len, MSG_TEXT_MAX));
		if (v->len > MSG_TEXT_MAX)
			g_string_append(q, "...");
		if (f->type == F_SIZE) {
			g_autofree char *lo = format_size(f->min);
			g_autofree char *hi = format_size(f->max);

			return fail(p, v, path, "value %s out of range %s..%s", q->str, lo, hi);
		}
		return fail(p, v, path, "value %s out of range %" PRIu64 "..%" PRIu64, q->str,
			    f->min, f->max);
	}
	if (f->type == F_U32)
		*(uint32_t *)dst = (uint32_t)x;
	else
		*(uint64_t *)dst = x;
	return true;
}

static bool set_enum(struct pctx *p, const struct field *f, const struct node *v, const char *path,
		     void *dst)
{
	const char *const *names = f->type == F_METATYPE ? metadata_types : log_levels;
	size_t n = f->type == F_METATYPE ? G_N_ELEMENTS(metadata_types) : G_N_ELEMENTS(log_levels);

	for (size_t i = 0; i < n; i++) {
		if (strcmp(v->text, names[i]))
			continue;
		if (f->type == F_METATYPE)
			*(enum config_metadata_type *)dst = (enum config_metadata_type)i;
		else
			*(int *)dst = (int)i;
		return true;
	}
	return fail_type(p, v, path, field_expect(f->type));
}

static bool set_endpoints(struct pctx *p, const struct node *v, const char *path,
			  struct config *cfg)
{
	const struct node *one[1] = { v };
	const struct node *const *items = one;
	size_t n = 1;

	if (v->kind == NODE_MAP)
		return fail_type(p, v, path, "a sequence of strings or a string");
	if (v->kind == NODE_SEQ) {
		items = (const struct node *const *)v->kids->pdata;
		n = v->kids->len;
	}
	for (size_t i = 0; i < n; i++) {
		const struct node *e = items[i];
		g_autofree char *ipath = v->kind == NODE_SEQ ? path_index(path, i) : g_strdup(path);

		if (i >= CONFIG_MAX_ENDPOINTS)
			return fail(p, e, path, "more than %d endpoints", CONFIG_MAX_ENDPOINTS);
		if (e->kind != NODE_SCALAR || node_is_null(e))
			return fail_type(p, e, ipath, "a string");
		if (!set_string(p, e, ipath, &cfg->metadata_endpoints[i], F_TOKEN))
			return false;
		cfg->n_metadata_endpoints = i + 1;
	}
	return true;
}

static bool set_options(struct pctx *p, const struct node *v, const char *path,
			struct config_transport *t)
{
	size_t n;

	if (v->kind != NODE_MAP)
		return fail_type(p, v, path, "a mapping of option: value");
	t->opts_line = v->line;
	t->opts_col = v->col;
	n = node_pairs(v);
	t->options = g_new0(struct config_option, MIN(n, (size_t)CONFIG_MAX_OPTIONS));
	for (size_t i = 0; i < n; i++) {
		const struct node *k = node_kid(v, 2 * i), *val = node_kid(v, 2 * i + 1);
		g_autofree char *kpath = path_key(path, k);

		if (k->kind != NODE_SCALAR)
			return fail(p, k, path, "mapping keys must be scalars");
		if (k->len == 0)
			return fail(p, k, path, "empty option key");
		for (size_t j = 0; j < i; j++) {
			const struct node *first = node_kid(v, 2 * j);

			if (!strcmp(first->text, k->text))
				return fail(p, k, kpath, "duplicate key (first at %u:%u)",
					    first->line, first->col);
		}
		if (i >= CONFIG_MAX_OPTIONS)
			return fail(p, k, path, "more than %d options", CONFIG_MAX_OPTIONS);
		if (val->kind != NODE_SCALAR)
			return fail(p, val, kpath,
				    "option values must be scalars, got %s (nested mappings and "
				    "sequences are not allowed in options)",
				    kind_name(val));
		t->options[i].key = g_strndup(k->text, k->len);
		/*
		 * A null value is an empty one for plugins that declare nothing: they see text, and
		 * "~" means nothing. For declared options it keeps the default (config_transport_apply).
		 */
		t->options[i].null = node_is_null(val);
		t->options[i].value = t->options[i].null ? g_strdup("") : g_strdup(val->text);
		t->options[i].key_line = k->line;
		t->options[i].key_col = k->col;
		t->options[i].value_line = val->line;
		t->options[i].value_col = val->col;
		t->n_options = i + 1;
	}
	return true;
}

static bool set_transports(struct pctx *p, const struct node *v, const char *path,
			   struct config *cfg)
{
	const struct node *names[CONFIG_MAX_TRANSPORTS] = { NULL };

	if (v->kind != NODE_SEQ)
		return fail_type(p, v, path, "a sequence of transports");
	if (v->kids->len == 0)
		return fail(p, v, path, "empty sequence (at least one transport is required)");
	for (size_t i = 0; i < v->kids->len; i++) {
		const struct node *item = node_kid(v, i);
		const struct node *seen[MAX_FIELDS] = { NULL };
		g_autofree char *ipath = path_index(path, i);
		struct config_transport *t;

		if (i >= CONFIG_MAX_TRANSPORTS)
			return fail(p, item, path, "more than %d transports",
				    CONFIG_MAX_TRANSPORTS);
		if (item->kind != NODE_MAP)
			return fail_type(p, item, ipath,
					 "a mapping (name, path, required, memory_only, options)");
		t = &cfg->transports[i];
		cfg->n_transports = i + 1;
		t->line = item->line;
		t->col = item->col;
		if (!walk_fields(p, item, ipath, transport_fields, G_N_ELEMENTS(transport_fields),
				 t, seen))
			return false;
		if (!t->name)
			return fail(p, item, ipath, "missing required key: name");
		names[i] = seen[0];
		for (size_t j = 0; j < i; j++) {
			g_autofree char *npath = g_strdup_printf("%s.name", ipath);

			if (strcmp(cfg->transports[j].name, t->name))
				continue;
			return fail(p, names[i], npath,
				    "duplicate transport \"%s\" (first at %u:%u)", t->name,
				    names[j]->line, names[j]->col);
		}
	}
	return true;
}

static bool set_field(struct pctx *p, const struct field *f, const struct node *v, const char *path,
		      void *base)
{
	void *dst = (char *)base + f->off;

	/* A null value keeps the default, for sections and leaves alike. */
	if (node_is_null(v))
		return true;
	if (f->slot != SLOT_NONE)
		p->slot[f->slot] = (struct node *)v;
	switch (f->type) {
	case F_SECTION:
		return walk_fields(p, v, path, f->sub, f->n_sub, base, NULL);
	case F_TRANSPORTS:
		return set_transports(p, v, path, base);
	case F_OPTIONS:
		return set_options(p, v, path, base);
	case F_ENDPOINTS:
		return set_endpoints(p, v, path, base);
	default:
		break;
	}
	if (v->kind != NODE_SCALAR)
		return fail_type(p, v, path, field_expect(f->type));
	switch (f->type) {
	case F_STRING:
	case F_SECRET:
	case F_TOKEN:
	case F_LISTEN:
	case F_TNAME:
		return set_string(p, v, path, dst, f->type);
	case F_U32:
	case F_U64:
	case F_SIZE:
		return set_number(p, f, v, path, dst);
	case F_BOOL:
		/* The one boolean rule, shared with plugins' options (te_plugin_opts.h). */
		if (!te_plugin_parse_bool(v->text, dst))
			return fail_type(p, v, path, field_expect(f->type));
		return true;
	case F_METATYPE:
	case F_LOGLEVEL:
		return set_enum(p, f, v, path, dst);
	default:
		assert(0);
		return fail(p, v, path, "internal error: unhandled field type");
	}
}

static bool fail_unknown(struct pctx *p, const struct node *k, const char *kpath,
			 const struct field *fields, size_t n)
{
	g_autoptr(GString) keys = g_string_new(NULL);

	for (size_t i = 0; i < n; i++)
		g_string_append_printf(keys, "%s%s", i ? ", " : "", fields[i].key);
	return fail(p, k, kpath, "unknown key (expected one of: %s)", keys->str);
}

/* Walk a mapping against a field table; @seen_out (n_fields entries) gets each value node. */
static bool walk_fields(struct pctx *p, const struct node *map, const char *path,
			const struct field *fields, size_t n_fields, void *base,
			const struct node **seen_out)
{
	const struct node *keys[MAX_FIELDS] = { NULL };

	assert(n_fields <= MAX_FIELDS);
	if (map->kind != NODE_MAP) {
		g_autoptr(GString) exp = g_string_new("a mapping (");

		for (size_t i = 0; i < n_fields; i++)
			g_string_append_printf(exp, "%s%s", i ? ", " : "", fields[i].key);
		g_string_append_c(exp, ')');
		return fail_type(p, map, path, exp->str);
	}
	for (size_t i = 0; i < node_pairs(map); i++) {
		const struct node *k = node_kid(map, 2 * i), *v = node_kid(map, 2 * i + 1);
		g_autofree char *kpath = path_key(path, k);
		size_t f;

		if (k->kind != NODE_SCALAR)
			return fail(p, k, path, "mapping keys must be scalars");
		for (f = 0; f < n_fields; f++)
			if (!strcmp(fields[f].key, k->text))
				break;
		if (f == n_fields)
			return fail_unknown(p, k, kpath, fields, n_fields);
		if (keys[f])
			return fail(p, k, kpath, "duplicate key (first at %u:%u)", keys[f]->line,
				    keys[f]->col);
		keys[f] = k;
		if (seen_out)
			seen_out[f] = v;
		if (!set_field(p, &fields[f], v, kpath, base))
			return false;
	}
	return true;
}

/* Rules that span keys, checked once every key is in. */
static bool check_cross(struct pctx *p, struct config *cfg)
{
	const struct node *n;

	if (cfg->retry_backoff_max_us < cfg->retry_backoff_us) {
		/* An implicit maximum follows an explicit first backoff. */
		if (!p->slot[SLOT_BACKOFF_MAX]) {
			cfg->retry_backoff_max_us = cfg->retry_backoff_us;
		} else {
			n = p->slot[SLOT_BACKOFF_MAX];
			return fail(p, n, "transfer.retry_backoff_max_us",
				    "value %" PRIu64 " is below transfer.retry_backoff_us (%" PRIu64
				    ")",
				    cfg->retry_backoff_max_us, cfg->retry_backoff_us);
		}
	}
	if (cfg->metadata_type != CONFIG_METADATA_P2P && cfg->n_metadata_endpoints == 0) {
		n = p->slot[SLOT_METADATA_TYPE];
		return fail(p, n, "metadata.endpoints",
			    "metadata type %s needs at least one endpoint",
			    metadata_types[cfg->metadata_type]);
	}
	if (cfg->control_max_buffered < cfg->control_max_frame) {
		/* An implicit budget follows an explicit frame size, as the backoff does. */
		if (!p->slot[SLOT_MAX_BUFFERED]) {
			cfg->control_max_buffered = cfg->control_max_frame;
		} else {
			g_autofree char *buffered = format_size(cfg->control_max_buffered);
			g_autofree char *frame = format_size(cfg->control_max_frame);

			n = p->slot[SLOT_MAX_BUFFERED];
			return fail(p, n, "control.max_buffered",
				    "value %s is below control.max_frame (%s): a largest frame "
				    "must fit",
				    buffered, frame);
		}
	}
	if (cfg->auth_secret && cfg->auth_secret_file) {
		const struct node *a = p->slot[SLOT_SECRET], *b = p->slot[SLOT_SECRET_FILE];

		n = (a->line > b->line || (a->line == b->line && a->col > b->col)) ? a : b;
		return fail(p, n, n == a ? "auth.secret" : "auth.secret_file",
			    "secret and secret_file are mutually exclusive");
	}
	return true;
}

static void config_set_defaults(struct config *cfg)
{
	cfg->listen = g_strdup(DEFAULT_LISTEN);
	cfg->metadata_type = CONFIG_METADATA_P2P;
	cfg->metadata_namespace = g_strdup(DEFAULT_NAMESPACE);
	cfg->metadata_ttl_s = 10;
	cfg->metadata_timeout_ms = 3000;
	cfg->slice_size = 0;
	cfg->max_slices_per_task = 4096;
	cfg->retries = 3;
	cfg->retry_backoff_us = 100;
	cfg->retry_backoff_max_us = 100000;
	cfg->timeout_ms = 30000;
	cfg->quarantine_ms = 1000;
	cfg->quarantine_after = 3;
	cfg->cancel_grace_ms = 2000;
	cfg->worker_threads = 1;
	cfg->max_pollers = 0;
	cfg->max_batches = 1024;
	cfg->max_batch_size = 65536;
	cfg->fallback = false;
	/* Safe on a public network: docs/config.md, "Limits on a public network". */
	cfg->control_max_connections = 1024;
	cfg->control_max_connections_per_host = 128;
	cfg->control_max_unauthenticated = 256;
	cfg->control_auth_timeout_ms = 5000;
	cfg->control_idle_timeout_ms = 10000;
	cfg->control_frame_timeout_ms = 10000;
	cfg->control_max_frame = 16 * SIZE_M;
	cfg->control_max_buffered = 64 * SIZE_M;
	cfg->control_notify_inbox = 65536;
	cfg->control_notify_per_sender = 1024;
	cfg->control_notify_per_host = 8192;
	cfg->log_level = TE_LOG_WARN;
}

enum te_status config_parse(const char *buf, size_t len, const char *name, struct config **cfg_out,
			    char **err_out)
{
	struct pctx p = { .name = name ? name : "<config>" };
	struct node *root = NULL;
	struct config *cfg;

	if (!cfg_out || (!buf && len)) {
		if (err_out)
			*err_out = g_strdup_printf("%s: config_parse: invalid argument", p.name);
		return TE_ERR_INVALID_ARG;
	}
	if (len > CONFIG_MAX_INPUT) {
		fail_at(&p, 1, 1, NULL, "input of %zu bytes is over the %d-byte limit", len,
			CONFIG_MAX_INPUT);
		goto err;
	}
	if (!build_tree(&p, buf, len, &root))
		goto err;

	cfg = g_new0(struct config, 1);
	config_set_defaults(cfg);
	cfg->source = g_strdup(p.name);
	if (root && !node_is_null(root) &&
	    !walk_fields(&p, root, NULL, root_fields, G_N_ELEMENTS(root_fields), cfg, NULL))
		goto err_free_config;
	if (!check_cross(&p, cfg))
		goto err_free_config;
	if (!p.slot[SLOT_TRANSPORTS]) {
		cfg->transports[0].name = g_strdup("tcp");
		cfg->transports[0].required = true;
		cfg->n_transports = 1;
	}
	node_free(root);
	*cfg_out = cfg;
	return TE_OK;

err_free_config:
	config_free(cfg);
	node_free(root);
err:
	if (err_out)
		*err_out = p.err;
	else
		g_free(p.err);
	return p.status;
}

/* Read at most CONFIG_MAX_INPUT + 1 bytes: enough to tell "too large" without a stat race. */
static enum te_status read_bounded(const char *path, char **buf_out, size_t *len_out,
				   char **err_out)
{
	size_t cap = CONFIG_MAX_INPUT + 1, len = 0;
	g_autofree char *buf = NULL;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		goto err_errno;
	buf = g_malloc(cap);
	while (len < cap) {
		ssize_t r = read(fd, buf + len, cap - len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;

			close(fd);
			errno = e;
			goto err_errno;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	if (len > CONFIG_MAX_INPUT) {
		*err_out = g_strdup_printf("%s: cannot read: file is over the %d-byte limit", path,
					   CONFIG_MAX_INPUT);
		return TE_ERR_CONFIG;
	}
	*buf_out = g_steal_pointer(&buf);
	*len_out = len;
	return TE_OK;

err_errno:
	*err_out = g_strdup_printf("%s: cannot read: %s", path, g_strerror(errno));
	return TE_ERR_CONFIG;
}

enum te_status config_load_file(const char *path, struct config **cfg_out, char **err_out)
{
	g_autofree char *buf = NULL;
	g_autofree char *err = NULL;
	size_t len = 0;
	enum te_status st;

	if (!path || !cfg_out) {
		if (err_out)
			*err_out = g_strdup("config_load_file: invalid argument");
		return TE_ERR_INVALID_ARG;
	}
	st = read_bounded(path, &buf, &len, &err);
	if (st == TE_OK)
		st = config_parse(buf, len, path, cfg_out, &err);
	if (st != TE_OK && err_out)
		*err_out = g_steal_pointer(&err);
	return st;
}

/* --- printing ----------------------------------------------------------------- */

/*
 * Characters that may appear raw inside a double-quoted scalar and read back as
 * themselves: YAML's printable set (as libyaml's reader checks it) minus the line
 * breaks NEL, LS and PS, which a quoted scalar would fold.
 */
static bool yaml_printable(gunichar c)
{
	return (c >= 0x20 && c <= 0x7e) ||
	       (c >= 0xa0 && c <= 0xd7ff && c != 0x2028 && c != 0x2029) ||
	       (c >= 0xe000 && c <= 0xfffd && c != 0xfeff) || (c >= 0x10000 && c <= 0x10ffff);
}

/* A double-quoted YAML scalar that config_parse reads back as exactly @s. */
static void emit_string(GString *out, const char *s)
{
	const char *p = s;

	if (!s) {
		g_string_append(out, "null");
		return;
	}
	g_string_append_c(out, '"');
	while (*p) {
		gunichar c = g_utf8_get_char_validated(p, -1);

		if (c == (gunichar)-1 || c == (gunichar)-2) {
			/* Not UTF-8 (cannot come from config_parse): keep the byte visible. */
			g_string_append_printf(out, "\\x%02x", (unsigned char)*p);
			p++;
			continue;
		}
		if (c == '"' || c == '\\')
			g_string_append_printf(out, "\\%c", (char)c);
		else if (c == '\n')
			g_string_append(out, "\\n");
		else if (c == '\t')
			g_string_append(out, "\\t");
		else if (c == '\r')
			g_string_append(out, "\\r");
		else if (c < 0x20 || c == 0x7f)
			g_string_append_printf(out, "\\x%02x", c);
		else if (!yaml_printable(c))
			g_string_append_printf(out, c > 0xffff ? "\\U%08x" : "\\u%04x", c);
		else
			g_string_append_len(out, p, g_utf8_next_char(p) - p);
		p = g_utf8_next_char(p);
	}
	g_string_append_c(out, '"');
}

static const char *enum_name(const char *const *names, size_t n, int v)
{
	return v >= 0 && (size_t)v < n ? names[v] : "invalid";
}

char *config_to_yaml(const struct config *cfg)
{
	GString *o;

	if (!cfg)
		return NULL;
	o = g_string_new("# te effective configuration (every key, defaults filled in)\n");
	g_string_append(o, "engine:\n  name: ");
	emit_string(o, cfg->name);
	g_string_append(o, cfg->name ? "\n" : "  # host:port of the listener\n");
	g_string_append(o, "  listen: ");
	emit_string(o, cfg->listen);
	g_string_append(o, "\n  advertise: ");
	emit_string(o, cfg->advertise);

	g_string_append_printf(
		o, "\nmetadata:\n  type: %s\n",
		enum_name(metadata_types, G_N_ELEMENTS(metadata_types), (int)cfg->metadata_type));
	g_string_append(o, "  endpoints:");
	if (!cfg->n_metadata_endpoints)
		g_string_append(o, " []");
	for (size_t i = 0; i < cfg->n_metadata_endpoints && i < CONFIG_MAX_ENDPOINTS; i++) {
		g_string_append(o, "\n    - ");
		emit_string(o, cfg->metadata_endpoints[i]);
	}
	g_string_append(o, "\n  namespace: ");
	emit_string(o, cfg->metadata_namespace);
	g_string_append_printf(o, "\n  ttl_s: %" PRIu32 "\n", cfg->metadata_ttl_s);
	g_string_append(o, "  username: ");
	emit_string(o, cfg->metadata_username);
	g_string_append(o, "\n  password_file: ");
	emit_string(o, cfg->metadata_password_file);
	g_string_append(o, "\n  ca_file: ");
	emit_string(o, cfg->metadata_ca_file);
	g_string_append_printf(o, "\n  timeout_ms: %" PRIu32 "\n", cfg->metadata_timeout_ms);

	g_string_append_printf(o,
			       "transfer:\n"
			       "  slice_size: %" PRIu64 "%s\n"
			       "  max_slices_per_task: %" PRIu32 "\n"
			       "  retries: %" PRIu32 "\n"
			       "  retry_backoff_us: %" PRIu64 "\n"
			       "  retry_backoff_max_us: %" PRIu64 "\n"
			       "  timeout_ms: %" PRIu64 "\n"
			       "  quarantine_ms: %" PRIu64 "\n"
			       "  quarantine_after: %" PRIu32 "\n"
			       "  cancel_grace_ms: %" PRIu64 "\n"
			       "  worker_threads: %" PRIu32 "\n"
			       "  max_pollers: %" PRIu32 "%s\n"
			       "  max_batches: %" PRIu32 "\n"
			       "  max_batch_size: %" PRIu32 "\n"
			       "  fallback: %s\n",
			       cfg->slice_size, cfg->slice_size ? "" : "  # from transport caps",
			       cfg->max_slices_per_task, cfg->retries, cfg->retry_backoff_us,
			       cfg->retry_backoff_max_us, cfg->timeout_ms, cfg->quarantine_ms,
			       cfg->quarantine_after, cfg->cancel_grace_ms, cfg->worker_threads,
			       cfg->max_pollers, cfg->max_pollers ? "" : "  # auto: half the CPUs",
			       cfg->max_batches, cfg->max_batch_size,
			       cfg->fallback ? "true" : "false");

	g_string_append(o, "transports:");
	if (!cfg->n_transports)
		g_string_append(o, " []");
	for (size_t i = 0; i < cfg->n_transports && i < CONFIG_MAX_TRANSPORTS; i++) {
		const struct config_transport *t = &cfg->transports[i];

		g_string_append(o, "\n  - name: ");
		emit_string(o, t->name);
		g_string_append(o, "\n    path: ");
		emit_string(o, t->path);
		g_string_append_printf(o, "\n    required: %s", t->required ? "true" : "false");
		if (t->memory_only)
			g_string_append(o, "\n    memory_only: true");
		g_string_append(o, "\n    options:");
		if (!t->n_options)
			g_string_append(o, " {}");
		for (size_t j = 0; j < t->n_options; j++) {
			g_autoptr(GString) key = g_string_new(NULL);

			emit_string(key, t->options[j].key);
			/* libyaml bounds implicit keys to 1024 characters; use "? key" beyond. */
			if (key->len > 512)
				g_string_append_printf(o, "\n      ? %s\n      : ", key->str);
			else
				g_string_append_printf(o, "\n      %s: ", key->str);
			emit_string(o, t->options[j].value);
		}
	}

	g_string_append_printf(o, "\nlog:\n  level: %s\n",
			       enum_name(log_levels, G_N_ELEMENTS(log_levels), cfg->log_level));
	g_string_append(o, "auth:\n  secret: ");
	emit_string(o, cfg->auth_secret);
	g_string_append(o, "\n  secret_file: ");
	emit_string(o, cfg->auth_secret_file);
	{
		g_autofree char *frame = format_size(cfg->control_max_frame);
		g_autofree char *buffered = format_size(cfg->control_max_buffered);

		g_string_append_printf(
			o,
			"\ncontrol:\n"
			"  max_connections: %" PRIu32 "\n"
			"  max_connections_per_host: %" PRIu32 "\n"
			"  max_unauthenticated: %" PRIu32 "\n"
			"  auth_timeout_ms: %" PRIu32 "\n"
			"  idle_timeout_ms: %" PRIu32 "\n"
			"  frame_timeout_ms: %" PRIu32 "\n"
			"  max_frame: %s\n"
			"  max_buffered: %s\n"
			"  notify_inbox: %" PRIu32 "\n"
			"  notify_per_sender: %" PRIu32 "\n"
			"  notify_per_host: %" PRIu32 "\n",
			cfg->control_max_connections, cfg->control_max_connections_per_host,
			cfg->control_max_unauthenticated, cfg->control_auth_timeout_ms,
			cfg->control_idle_timeout_ms, cfg->control_frame_timeout_ms, frame,
			buffered, cfg->control_notify_inbox, cfg->control_notify_per_sender,
			cfg->control_notify_per_host);
	}
	return g_string_free(o, FALSE);
}

const char *config_transport_option(const struct config_transport *t, const char *key)
{
	if (!t || !key)
		return NULL;
	for (size_t i = 0; i < t->n_options; i++)
		if (!strcmp(t->options[i].key, key))
			return t->options[i].value;
	return NULL;
}

void config_free(struct config *cfg)
{
	if (!cfg)
		return;
	g_free(cfg->name);
	g_free(cfg->listen);
	for (size_t i = 0; i < cfg->n_metadata_endpoints; i++)
		g_free(cfg->metadata_endpoints[i]);
	g_free(cfg->advertise);
	g_free(cfg->metadata_namespace);
	g_free(cfg->metadata_username);
	g_free(cfg->metadata_password_file);
	g_free(cfg->metadata_ca_file);
	for (size_t i = 0; i < cfg->n_transports; i++)
		config_transport_clear(&cfg->transports[i]);
	g_free(cfg->source);
	if (cfg->auth_secret)
		explicit_bzero(cfg->auth_secret, strlen(cfg->auth_secret));
	g_free(cfg->auth_secret);
	g_free(cfg->auth_secret_file);
	g_free(cfg);
}

/* --- declared plugin options ---------------------------------------------------- */

/* A signed decimal integer ('+' or '-' allowed) into *out. */
static enum num parse_int64(const char *s, size_t len, int64_t *out)
{
	bool neg = len && s[0] == '-';
	size_t sign = len && (s[0] == '-' || s[0] == '+');
	uint64_t v;
	enum num r = parse_digits(s + sign, len - sign, false, &v);

	if (r != NUM_OK)
		return r;
	if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)
		return NUM_RANGE;
	/* -(INT64_MAX + 1) without overflowing: negate in unsigned arithmetic. */
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return NUM_OK;
}

/* The range a declaration allows: both 0 means none (SIZE: non-negative). */
static void option_range(const struct te_plugin_option *d, int64_t *lo, int64_t *hi)
{
	if (d->min == 0 && d->max == 0) {
		*lo = d->type == TE_PLUGIN_OPT_SIZE ? 0 : INT64_MIN;
		*hi = INT64_MAX;
	} else {
		*lo = d->min;
		*hi = d->max;
	}
}

static char *option_got(const char *text, const char *expected)
{
	g_autoptr(GString) s = g_string_new(NULL);

	g_string_append_printf(s, "expected %s, got ", expected);
	append_quoted(s, text, strlen(text));
	return g_string_free(g_steal_pointer(&s), FALSE);
}

/* Numbers print bare; the text is a number, so only bound its length. */
static char *option_out_of_range(const char *text, const char *lo, const char *hi)
{
	size_t len = strlen(text);

	return g_strdup_printf("value %.*s%s out of range %s..%s", (int)MIN(len, MSG_TEXT_MAX),
			       text, len > MSG_TEXT_MAX ? "..." : "", lo, hi);
}

enum te_status config_option_normalize(const struct te_plugin_option *decl, const char *text,
				       char **normal_out, char **reason_out)
{
	size_t len = strlen(text);
	int64_t lo, hi, iv = 0;
	uint64_t uv = 0;
	bool b;
	enum num r;

	option_range(decl, &lo, &hi);
	switch (decl->type) {
	case TE_PLUGIN_OPT_BOOL:
		if (!te_plugin_parse_bool(text, &b))
			break;
		*normal_out = g_strdup(b ? "true" : "false");
		return TE_OK;
	case TE_PLUGIN_OPT_INT:
		r = parse_int64(text, len, &iv);
		if (r == NUM_BAD)
			break;
		if (r == NUM_RANGE || iv < lo || iv > hi) {
			g_autofree char *l = g_strdup_printf("%" PRId64, lo);
			g_autofree char *h = g_strdup_printf("%" PRId64, hi);

			*reason_out = option_out_of_range(text, l, h);
			return TE_ERR_CONFIG;
		}
		*normal_out = g_strdup_printf("%" PRId64, iv);
		return TE_OK;
	case TE_PLUGIN_OPT_SIZE:
		r = parse_size(text, len, &uv);
		if (r == NUM_BAD)
			break;
		/* lo >= 0 for SIZE (plugin_validate_options): the casts keep the values. */
		if (r == NUM_RANGE || uv < (uint64_t)lo || uv > (uint64_t)hi) {
			g_autofree char *l = format_size((uint64_t)lo);
			g_autofree char *h = format_size((uint64_t)hi);

			*reason_out = option_out_of_range(text, l, h);
			return TE_ERR_CONFIG;
		}
		*normal_out = g_strdup_printf("%" PRIu64, uv);
		return TE_OK;
	case TE_PLUGIN_OPT_STRING:
		*normal_out = g_strdup(text);
		return TE_OK;
	case TE_PLUGIN_OPT_CHOICE:
		for (size_t i = 0; decl->choices && decl->choices[i]; i++) {
			if (strcmp(text, decl->choices[i]) == 0) {
				*normal_out = g_strdup(decl->choices[i]);
				return TE_OK;
			}
		}
		break;
	default:
		*reason_out = g_strdup_printf("option type %u is unknown", decl->type);
		return TE_ERR_CONFIG;
	}
	switch (decl->type) {
	case TE_PLUGIN_OPT_BOOL:
		*reason_out = option_got(text, field_expect(F_BOOL));
		break;
	case TE_PLUGIN_OPT_INT:
		*reason_out = option_got(text, field_expect(F_U64));
		break;
	case TE_PLUGIN_OPT_SIZE:
		*reason_out = option_got(text, field_expect(F_SIZE));
		break;
	default: {
		g_autoptr(GString) list = g_string_new("one of: ");

		for (size_t i = 0; decl->choices && decl->choices[i]; i++)
			g_string_append_printf(list, "%s%s", i ? ", " : "", decl->choices[i]);
		*reason_out = option_got(text, list->str);
		break;
	}
	}
	return TE_ERR_CONFIG;
}

/*
 * Edit distance of two short strings (at most 64 bytes each; longer ones: a large value):
 * insertions, deletions, substitutions and swaps of neighbours ("lable") count 1, case none.
 */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	uint8_t d[65][65];

	if (la > 64 || lb > 64)
		return SIZE_MAX;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = (uint8_t)i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = (uint8_t)j;
	for (size_t i = 1; i <= la; i++) {
		for (size_t j = 1; j <= lb; j++) {
			char x = g_ascii_tolower(a[i - 1]), y = g_ascii_tolower(b[j - 1]);
			size_t v = MIN(MIN(d[i - 1][j] + 1u, d[i][j - 1] + 1u),
				       d[i - 1][j - 1] + (x == y ? 0u : 1u));

			if (i > 1 && j > 1 && x == g_ascii_tolower(b[j - 2]) &&
			    g_ascii_tolower(a[i - 2]) == y)
				v = MIN(v, d[i - 2][j - 2] + 1u);
			d[i][j] = (uint8_t)v;
		}
	}
	return d[la][lb];
}

/* The declared name closest to @key when it is close enough to be a typo, else NULL. */
static const char *option_suggest(const char *key, const struct te_plugin_option *decls, size_t n)
{
	const char *best = NULL;
	size_t best_d = SIZE_MAX;

	for (size_t i = 0; i < n; i++) {
		size_t d = edit_distance(key, decls[i].name);
		/* One edit per 3 characters of the name, at least 1, at most 2 ("a.b" is no "any"). */
		size_t most = MIN((size_t)2, MAX((size_t)1, strlen(decls[i].name) / 3));

		if (d < best_d && d <= most) {
			best = decls[i].name;
			best_d = d;
		}
	}
	return best;
}

static char *option_path(size_t index, const char *key)
{
	GString *s = g_string_new(NULL);

	g_string_append_printf(s, "transports[%zu].options", index);
	append_key_text(s, key, strlen(key));
	return g_string_free(s, FALSE);
}

static void options_free(struct config_option *o, size_t n)
{
	for (size_t i = 0; o && i < n; i++) {
		g_free(o[i].key);
		g_free(o[i].value);
	}
	g_free(o);
}

enum te_status config_transport_apply(struct config_transport *t, const char *source, size_t index,
				      const char *plugin, const struct te_plugin_option *decls,
				      size_t n, bool check_required, char **err_out)
{
	struct pctx p = { .name = source ? source : "<config>" };
	struct config_option *eff;
	size_t *from; /* per declaration: 1 + index of the YAML option setting it, or 0 */
	size_t n_eff = 0;

	if (n == 0)
		return TE_OK;
	eff = g_new0(struct config_option, n);
	from = g_new0(size_t, n);
	for (size_t j = 0; j < t->n_options; j++) {
		const struct config_option *o = &t->options[j];
		g_autofree char *path = option_path(index, o->key);
		g_autofree char *reason = NULL;
		char *normal = NULL;
		size_t k;

		for (k = 0; k < n; k++)
			if (strcmp(decls[k].name, o->key) == 0)
				break;
		if (k == n) {
			const char *near = option_suggest(o->key, decls, n);
			g_autoptr(GString) names = g_string_new(NULL);

			if (near) {
				fail_at(&p, o->key_line, o->key_col, path,
					"unknown option of plugin %s (did you mean \"%s\"?)",
					plugin, near);
				goto err;
			}
			for (size_t i = 0; i < n; i++)
				g_string_append_printf(names, "%s%s", i ? ", " : "", decls[i].name);
			fail_at(&p, o->key_line, o->key_col, path,
				"unknown option of plugin %s (expected one of: %s)", plugin,
				names->str);
			goto err;
		}
		/* A null value keeps the default, as for the core's own keys. */
		if (o->null)
			continue;
		if (config_option_normalize(&decls[k], o->value, &normal, &reason) != TE_OK) {
			fail_at(&p, o->value_line, o->value_col, path, "%s", reason);
			goto err;
		}
		eff[k].key = g_strdup(decls[k].name);
		eff[k].value = normal;
		eff[k].key_line = o->key_line;
		eff[k].key_col = o->key_col;
		eff[k].value_line = o->value_line;
		eff[k].value_col = o->value_col;
		from[k] = j + 1;
	}
	for (size_t k = 0; k < n; k++) {
		g_autofree char *reason = NULL;

		if (from[k])
			continue;
		if (decls[k].default_value) {
			/* Checked when the module loaded (plugin_validate_options): cannot fail. */
			if (config_option_normalize(&decls[k], decls[k].default_value,
						    &eff[k].value, &reason) != TE_OK) {
				g_autofree char *path = option_path(index, decls[k].name);

				fail_at(&p, t->line, t->col, path, "bad default: %s", reason);
				goto err;
			}
			eff[k].key = g_strdup(decls[k].name);
		} else if (check_required && (decls[k].flags & TE_PLUGIN_OPT_REQUIRED)) {
			g_autofree char *path = option_path(index, decls[k].name);

			fail_at(&p, t->opts_line ? t->opts_line : t->line,
				t->opts_line ? t->opts_col : t->col, path,
				"missing required option of plugin %s%s%s%s", plugin,
				decls[k].help ? " (" : "", decls[k].help ? decls[k].help : "",
				decls[k].help ? ")" : "");
			goto err;
		}
	}
	/* Compact: declarations without a value are left out. */
	for (size_t k = 0; k < n; k++)
		if (eff[k].key)
			eff[n_eff++] = eff[k];
	options_free(t->options, t->n_options);
	t->options = eff;
	t->n_options = n_eff;
	g_free(from);
	return TE_OK;

err:
	options_free(eff, n);
	g_free(from);
	if (err_out)
		*err_out = p.err;
	else
		g_free(p.err);
	return p.status;
}

enum te_status config_apply_options(struct config *cfg, size_t index, const char *plugin,
				    const struct te_plugin_option *decls, size_t n, char **err_out)
{
	if (!cfg || index >= cfg->n_transports) {
		if (err_out)
			*err_out = g_strdup("config_apply_options: invalid argument");
		return TE_ERR_INVALID_ARG;
	}
	return config_transport_apply(&cfg->transports[index], cfg->source, index, plugin, decls, n,
				      true, err_out);
}

bool config_option_error(const struct config *cfg, size_t index, const char *plugin,
			 const char *text, char **out_out)
{
	static const char head[] = "option '";
	const struct config_transport *t;
	struct pctx p = { .name = cfg && cfg->source ? cfg->source : "<config>" };
	g_autofree char *key = NULL;
	g_autofree char *path = NULL;
	const char *end;
	unsigned line, col;

	if (!cfg || index >= cfg->n_transports || !text)
		return false;
	t = &cfg->transports[index];
	/* An optional "<plugin>: " before it (many plugins prefix what they say). */
	if (plugin && g_str_has_prefix(text, plugin) &&
	    g_str_has_prefix(text + strlen(plugin), ": "))
		text += strlen(plugin) + 2;
	if (!g_str_has_prefix(text, head))
		return false;
	text += strlen(head);
	end = strchr(text, '\'');
	if (!end || end[1] != ':' || end[2] != ' ' || !end[3] ||
	    !is_simple_key(text, (size_t)(end - text)))
		return false;
	key = g_strndup(text, (size_t)(end - text));
	line = t->opts_line ? t->opts_line : t->line;
	col = t->opts_line ? t->opts_col : t->col;
	for (size_t j = 0; j < t->n_options; j++) {
		if (strcmp(t->options[j].key, key) == 0 && t->options[j].value_line) {
			line = t->options[j].value_line;
			col = t->options[j].value_col;
		}
	}
	if (!line)
		return false; /* a transport the YAML does not have: nowhere to point */
	path = option_path(index, key);
	fail_at(&p, line, col, path, "%s", end + 3);
	*out_out = p.err;
	return true;
}

void config_transport_clear(struct config_transport *t)
{
	if (!t)
		return;
	g_free(t->name);
	g_free(t->path);
	options_free(t->options, t->n_options);
	memset(t, 0, sizeof(*t));
}
