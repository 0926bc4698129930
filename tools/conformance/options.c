/* SPDX-License-Identifier: Apache-2.0 */
/* options.c: te-conformance --config (the plugin's options) and the YAML of its engines. */
#include <string.h>

#include <yaml.h>

#include "conformance.h"

/*
 * --config FILE is YAML in one of three forms (docs/man/te-conformance.1):
 *   1. the plugin's options mapping:        {device: /dev/dax0.0, threads: 2}
 *   2. one transports entry (has options:): {name: cxl, options: {device: /dev/dax0.0}}
 *   3. an engine configuration (has transports:): the entry named like the plugin is used.
 * Option values are scalars, kept as text, as the core hands them to plugins.
 */

struct opt_entry {
	char *name; /* NULL in forms 1 and 2 when the entry names none */
	GPtrArray *keys, *values;
};

struct options {
	char *path;
	GPtrArray *entries;		/* struct opt_entry * */
	const struct opt_entry *chosen; /* options_select */
};

static void entry_free(gpointer p)
{
	struct opt_entry *e = p;

	g_free(e->name);
	g_ptr_array_unref(e->keys);
	g_ptr_array_unref(e->values);
	g_free(e);
}

void options_free(struct options *o)
{
	if (!o)
		return;
	g_free(o->path);
	g_ptr_array_unref(o->entries);
	g_free(o);
}

static char *where(const struct options *o, const yaml_node_t *n)
{
	return g_strdup_printf("%s:%zu:%zu", o->path, n->start_mark.line + 1,
			       n->start_mark.column + 1);
}

static const char *scalar(const yaml_node_t *n)
{
	return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The value of @key in mapping @map, or NULL. */
static yaml_node_t *member(yaml_document_t *doc, yaml_node_t *map, const char *key)
{
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		const char *k = scalar(yaml_document_get_node(doc, p->key));

		if (k && strcmp(k, key) == 0)
			return yaml_document_get_node(doc, p->value);
	}
	return NULL;
}

/* A mapping of scalars into @e; false with a file:line:col reason. */
static bool read_options(struct options *o, yaml_document_t *doc, yaml_node_t *map,
			 struct opt_entry *e, char **err_out)
{
	if (map->type != YAML_MAPPING_NODE) {
		g_autofree char *at = where(o, map);

		*err_out = g_strdup_printf("%s: options must be a mapping of option: value", at);
		return false;
	}
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		yaml_node_t *vn = yaml_document_get_node(doc, p->value);
		const char *k = scalar(kn), *v = scalar(vn);

		if (!k || !v) {
			g_autofree char *at = where(o, k ? vn : kn);

			*err_out = g_strdup_printf("%s: option %s%s%s must be a scalar (text, a "
						   "number or a boolean)",
						   at, k ? "'" : "", k ? k : "keys", k ? "'" : "");
			return false;
		}
		g_ptr_array_add(e->keys, g_strdup(k));
		g_ptr_array_add(e->values, g_strdup(v));
	}
	return true;
}

static struct opt_entry *entry_new(void)
{
	struct opt_entry *e = g_new0(struct opt_entry, 1);

	e->keys = g_ptr_array_new_with_free_func(g_free);
	e->values = g_ptr_array_new_with_free_func(g_free);
	return e;
}

/* A transports entry (form 2, or one item of form 3). */
static bool read_entry(struct options *o, yaml_document_t *doc, yaml_node_t *map, char **err_out)
{
	struct opt_entry *e;
	yaml_node_t *opts, *mo;
	const char *name;

	if (map->type != YAML_MAPPING_NODE) {
		g_autofree char *at = where(o, map);

		*err_out = g_strdup_printf("%s: a transports entry must be a mapping", at);
		return false;
	}
	mo = member(doc, map, "memory_only");
	if (scalar(mo) && (strcmp(scalar(mo), "true") == 0 || strcmp(scalar(mo), "yes") == 0)) {
		g_autofree char *at = where(o, mo);

		*err_out = g_strdup_printf("%s: memory_only: true: such a transport never moves "
					   "bytes, there is nothing to check",
					   at);
		return false;
	}
	e = entry_new();
	name = scalar(member(doc, map, "name"));
	e->name = g_strdup(name);
	g_ptr_array_add(o->entries, e);
	opts = member(doc, map, "options");
	return !opts || read_options(o, doc, opts, e, err_out);
}

bool options_parse(const char *path, struct options **out, char **err_out)
{
	struct options *o = g_new0(struct options, 1);
	g_autofree char *text = NULL;
	g_autoptr(GError) gerr = NULL;
	yaml_parser_t parser;
	yaml_document_t doc;
	yaml_node_t *root, *tps;
	gsize len = 0;
	bool ok = false;

	o->path = g_strdup(path);
	o->entries = g_ptr_array_new_with_free_func(entry_free);
	if (!g_file_get_contents(path, &text, &len, &gerr)) {
		*err_out = g_strdup_printf("--config: %s", gerr->message);
		options_free(o);
		return false;
	}
	yaml_parser_initialize(&parser);
	yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
	if (!yaml_parser_load(&parser, &doc)) {
		*err_out = g_strdup_printf("%s:%zu:%zu: %s", path, parser.problem_mark.line + 1,
					   parser.problem_mark.column + 1,
					   parser.problem ? parser.problem : "malformed YAML");
		yaml_parser_delete(&parser);
		options_free(o);
		return false;
	}
	root = yaml_document_get_root_node(&doc);
	if (!root) {
		/* An empty file: no options. */
		g_ptr_array_add(o->entries, entry_new());
		ok = true;
	} else if (root->type != YAML_MAPPING_NODE) {
		g_autofree char *at = where(o, root);

		*err_out = g_strdup_printf("%s: expected a mapping (the plugin's options, a "
					   "transports entry or an engine configuration)",
					   at);
	} else if ((tps = member(&doc, root, "transports"))) {
		ok = true;
		if (tps->type != YAML_SEQUENCE_NODE) {
			g_autofree char *at = where(o, tps);

			*err_out = g_strdup_printf("%s: transports must be a list", at);
			ok = false;
		}
		for (yaml_node_item_t *it = ok ? tps->data.sequence.items.start : NULL;
		     ok && it < tps->data.sequence.items.top; it++)
			ok = read_entry(o, &doc, yaml_document_get_node(&doc, *it), err_out);
	} else if (member(&doc, root, "options")) {
		ok = read_entry(o, &doc, root, err_out);
	} else {
		struct opt_entry *e = entry_new();

		g_ptr_array_add(o->entries, e);
		ok = read_options(o, &doc, root, e, err_out);
	}
	yaml_document_delete(&doc);
	yaml_parser_delete(&parser);
	if (!ok) {
		options_free(o);
		return false;
	}
	*out = o;
	return true;
}

bool options_select(struct options *o, const char *name, char **err_out)
{
	if (!o)
		return true;
	for (guint i = 0; i < o->entries->len; i++) {
		const struct opt_entry *e = o->entries->pdata[i];

		if (!e->name || strcmp(e->name, name) == 0) {
			o->chosen = e;
			return true;
		}
	}
	*err_out = g_strdup_printf("%s: no transports entry is named '%s' (the plugin's "
				   "descriptor name)",
				   o->path, name);
	return false;
}

/* @s as a double-quoted YAML scalar. */
static void quoted(GString *out, const char *s)
{
	g_string_append_c(out, '"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			g_string_append_printf(out, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			g_string_append_printf(out, "\\x%02x", *p);
		else
			g_string_append_c(out, (char)*p);
	}
	g_string_append_c(out, '"');
}

char *options_yaml(const struct options *o, const char *name, const char *module,
		   const char *transfer)
{
	GString *y = g_string_new(NULL);
	const struct opt_entry *e = o ? o->chosen : NULL;

	g_string_append(y, "engine: {listen: \"127.0.0.1:0\"}\n"
			   "metadata: {type: p2p}\n"
			   "log: {level: warn}\n");
	g_string_append_printf(y, "transfer: {%s}\n", transfer ? transfer : "");
	g_string_append(y, "transports:\n  - name: ");
	quoted(y, name);
	g_string_append(y, "\n    path: ");
	quoted(y, module);
	g_string_append(y, "\n    required: true\n    options: {");
	for (guint i = 0; e && i < e->keys->len; i++) {
		if (i)
			g_string_append(y, ", ");
		quoted(y, e->keys->pdata[i]);
		g_string_append(y, ": ");
		quoted(y, e->values->pdata[i]);
	}
	g_string_append(y, "}\n");
	return g_string_free(y, FALSE);
}
