/* SPDX-License-Identifier: Apache-2.0 */
/* te-info: list the transport plugins te can find (ABI, caps, devices) and check a config. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te_plugin.h>
#include <te/te_status.h>

#include "core/config.h"
#include "core/host.h"
#include "core/plugin.h"
#include "core/transport.h"
#include "te_build_config.h"

/* What te-info learned about one candidate module. */
struct probe {
	char *path;
	bool shadowed;	     /* an earlier directory has a plugin of the same name */
	enum te_status load; /* plugin_open_file */
	enum te_status init; /* transport_start (only when load == TE_OK) */
	char *error;	     /* one line when load or init failed */
	/* Copied from the descriptor when load == TE_OK. */
	char *name;
	char *version;
	char *description;
	uint32_t abi_major;
	uint32_t abi_minor;
	/* Copied from the transport when init == TE_OK. */
	struct te_plugin_caps caps;
	struct te_plugin_device devices[TRANSPORT_MAX_DEVICES];
	uint32_t n_devices;
};

static void probe_free(gpointer data)
{
	struct probe *p = data;

	if (!p)
		return;
	g_free(p->path);
	g_free(p->error);
	g_free(p->name);
	g_free(p->version);
	g_free(p->description);
	g_free(p);
}

static void probe_run(struct probe *p)
{
	struct plugin *plugin = NULL;
	struct transport *t = NULL;
	char *err = NULL;

	p->init = TE_ERR_PLUGIN_INIT;
	p->load = plugin_open_file(p->path, &plugin, &err);
	if (p->load != TE_OK) {
		p->error = err ? err : g_strdup(te_status_str(p->load));
		return;
	}
	p->name = g_strdup(plugin->desc->name ? plugin->desc->name : "");
	p->version = g_strdup(plugin->desc->version ? plugin->desc->version : "");
	p->description = g_strdup(plugin->desc->description ? plugin->desc->description : "");
	p->abi_major = plugin->desc->abi_major;
	p->abi_minor = plugin->desc->abi_minor;

	/* No engine and no options: the plugin's defaults, logs to stderr. */
	p->init = transport_start(NULL, plugin, &host_services, NULL, 0, &t, &err);
	if (p->init != TE_OK) {
		p->error = err ? err : g_strdup(te_status_str(p->init));
	} else {
		p->caps = t->caps;
		p->n_devices = MIN(t->n_devices, (uint32_t)TRANSPORT_MAX_DEVICES);
		memcpy(p->devices, t->devices, p->n_devices * sizeof(p->devices[0]));
		/* Plugin-filled text: never trust it to be terminated. */
		for (uint32_t d = 0; d < p->n_devices; d++) {
			p->devices[d].name[sizeof(p->devices[d].name) - 1] = '\0';
			p->devices[d].pci[sizeof(p->devices[d].pci) - 1] = '\0';
		}
		transport_stop(t);
	}
	plugin_close(plugin);
}

struct scan_ctx {
	GPtrArray *probes; /* struct probe * */
	GHashTable *seen;  /* plugin names already found (earlier wins, as in the engine) */
};

static void scan_one(void *user, const char *path)
{
	struct scan_ctx *ctx = user;
	struct probe *p = g_new0(struct probe, 1);

	p->path = g_strdup(path);
	probe_run(p);
	if (p->load == TE_OK) {
		if (g_hash_table_contains(ctx->seen, p->name))
			p->shadowed = true;
		else
			g_hash_table_add(ctx->seen, g_strdup(p->name));
	}
	g_ptr_array_add(ctx->probes, p);
}

/* An explicit argument: a module file (contains '/' or ends in .so) or a plugin name. */
static void probe_arg(struct scan_ctx *ctx, const char *arg, const char *search_path)
{
	struct plugin *plugin = NULL;
	g_autofree char *path = NULL;
	struct probe *p;
	char *err = NULL;
	enum te_status st;

	if (strchr(arg, '/') || g_str_has_suffix(arg, ".so")) {
		scan_one(ctx, arg);
		return;
	}
	/* Resolve the name the way the engine does, then probe that file. */
	st = plugin_open(arg, NULL, search_path, &plugin, &err);
	if (st != TE_OK) {
		p = g_new0(struct probe, 1);
		p->path = g_strdup(arg);
		p->load = st;
		p->init = TE_ERR_PLUGIN_INIT;
		p->error = err ? err : g_strdup(te_status_str(st));
		g_ptr_array_add(ctx->probes, p);
		return;
	}
	path = g_strdup(plugin->path);
	plugin_close(plugin);
	scan_one(ctx, path);
}

/* --- formatting helpers ------------------------------------------------------------------ */

static const char *progress_str(uint32_t p)
{
	switch (p) {
	case TE_PLUGIN_PROGRESS_AUTO:
		return "auto";
	case TE_PLUGIN_PROGRESS_MANUAL:
		return "manual";
	default:
		return "unknown";
	}
}

static const char *thread_str(uint32_t t)
{
	switch (t) {
	case TE_PLUGIN_THREAD_SERIALIZED:
		return "serialized";
	case TE_PLUGIN_THREAD_MULTI:
		return "multi";
	default:
		return "unknown";
	}
}

static void flag_list(JsonBuilder *b, GString *s, uint32_t v, const uint32_t *bits,
		      const char *const *names, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!(v & bits[i]))
			continue;
		if (b)
			json_builder_add_string_value(b, names[i]);
		if (s)
			g_string_append_printf(s, "%s%s", s->len ? " " : "", names[i]);
	}
}

static const uint32_t op_bits[] = { TE_PLUGIN_CAN_READ, TE_PLUGIN_CAN_WRITE };
static const char *const op_names[] = { "read", "write" };
static const uint32_t cap_bits[] = { TE_PLUGIN_CAP_SAME_HOST_ONLY,
				     TE_PLUGIN_CAP_SAME_PROCESS_ONLY };
static const char *const cap_names[] = { "same-host-only", "same-process-only" };
static const uint32_t mem_bits[] = { TE_PLUGIN_MEM_CPU, TE_PLUGIN_MEM_CUDA, TE_PLUGIN_MEM_HIP,
				     TE_PLUGIN_MEM_CXL };
static const char *const mem_names[] = { "cpu", "cuda", "hip", "cxl" };

static void mem_types_str(GString *s, uint32_t m)
{
	flag_list(NULL, s, m, mem_bits, mem_names, G_N_ELEMENTS(mem_bits));
	if (s->len == 0)
		g_string_append(s, "none");
}

static void size_str(GString *s, uint64_t v, const char *zero)
{
	if (v == 0)
		g_string_append(s, zero);
	else if (v % (1ull << 30) == 0)
		g_string_append_printf(s, "%" PRIu64 " GiB", v >> 30);
	else if (v % (1ull << 20) == 0)
		g_string_append_printf(s, "%" PRIu64 " MiB", v >> 20);
	else if (v % (1ull << 10) == 0)
		g_string_append_printf(s, "%" PRIu64 " KiB", v >> 10);
	else
		g_string_append_printf(s, "%" PRIu64 " B", v);
}

/* --- text output ------------------------------------------------------------------------- */

static void print_text(const char *search_path, GPtrArray *probes)
{
	g_autoptr(GString) s = g_string_new(NULL);

	printf("te %s, plugin ABI %d.%d\n", TE_VERSION, TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR);
	printf("search path: %s\n", search_path && *search_path ? search_path : "(empty)");
	if (probes->len == 0)
		printf("no plugins found\n");

	for (guint i = 0; i < probes->len; i++) {
		const struct probe *p = probes->pdata[i];

		printf("\n%s\n", p->path);
		if (p->load != TE_OK) {
			printf("  error:    %s (%s)\n", p->error, te_status_str(p->load));
			continue;
		}
		printf("  name:     %s %s%s\n", p->name, p->version,
		       p->shadowed ? "  (shadowed by an earlier plugin of this name)" : "");
		if (p->description[0])
			printf("  about:    %s\n", p->description);
		printf("  abi:      %" PRIu32 ".%" PRIu32 "\n", p->abi_major, p->abi_minor);
		if (p->init != TE_OK) {
			printf("  init:     %s\n", p->error);
			continue;
		}

		g_string_truncate(s, 0);
		mem_types_str(s, p->caps.mem_types);
		printf("  memory:   %s (moved directly)\n", s->str);
		/*
		 * Host-memory transports get any kind a loaded plugin owns as the local side
		 * through the core's bounce buffers; staged_mem_types they also serve as a target.
		 */
		if (p->caps.mem_types & TE_PLUGIN_MEM_CPU) {
			g_string_truncate(s, 0);
			flag_list(NULL, s, p->caps.staged_mem_types, mem_bits, mem_names,
				  G_N_ELEMENTS(mem_bits));
			printf("  staged:   local side: any kind a loaded plugin owns (core bounce "
			       "buffers); as a target: %s\n",
			       s->len ? s->str : "none");
		}
		if (p->caps.owned_mem_types) {
			g_string_truncate(s, 0);
			mem_types_str(s, p->caps.owned_mem_types);
			printf("  owns:     %s (copies, allocation, location '*' for everyone)\n",
			       s->str);
		}
		g_string_truncate(s, 0);
		flag_list(NULL, s, p->caps.ops, op_bits, op_names, G_N_ELEMENTS(op_bits));
		printf("  ops:      %s\n", s->len ? s->str : "none");
		printf("  progress: %s, threads: %s\n", progress_str(p->caps.progress),
		       thread_str(p->caps.thread_level));
		g_string_truncate(s, 0);
		flag_list(NULL, s, p->caps.flags, cap_bits, cap_names, G_N_ELEMENTS(cap_bits));
		printf("  flags:    %s\n", s->len ? s->str : "none");
		g_string_truncate(s, 0);
		g_string_append(s, "max ");
		size_str(s, p->caps.max_slice_size, "unlimited");
		g_string_append(s, ", default ");
		size_str(s, p->caps.default_slice_size, "core's choice");
		g_string_append_printf(s, ", %" PRIu32 " B private per slice",
				       p->caps.slice_priv_size);
		printf("  slices:   %s\n", s->str);

		printf("  devices:  %" PRIu32 "\n", p->n_devices);
		for (uint32_t d = 0; d < p->n_devices; d++) {
			const struct te_plugin_device *dev = &p->devices[d];

			g_string_truncate(s, 0);
			mem_types_str(s, dev->mem_types);
			printf("    [%" PRIu32 "] %-16s numa %-3" PRId32 " pci %-12s speed ", d,
			       dev->name, dev->numa_node, dev->pci[0] ? dev->pci : "-");
			if (dev->link_speed_mbps)
				printf("%" PRIu64 " Mb/s", dev->link_speed_mbps);
			else
				printf("unknown");
			printf("  memory %s\n", s->str);
		}
	}
}

/* --- JSON output ------------------------------------------------------------------------- */

static void json_flags(JsonBuilder *b, const char *member, uint32_t v, const uint32_t *bits,
		       const char *const *names, size_t n)
{
	json_builder_set_member_name(b, member);
	json_builder_begin_array(b);
	flag_list(b, NULL, v, bits, names, n);
	json_builder_end_array(b);
}

static void json_string(JsonBuilder *b, const char *member, const char *value)
{
	json_builder_set_member_name(b, member);
	json_builder_add_string_value(b, value);
}

static void json_int(JsonBuilder *b, const char *member, int64_t value)
{
	json_builder_set_member_name(b, member);
	json_builder_add_int_value(b, value);
}

static void json_probe(JsonBuilder *b, const struct probe *p)
{
	json_builder_begin_object(b);
	json_string(b, "path", p->path);
	if (p->load != TE_OK) {
		json_string(b, "status", te_status_str(p->load));
		json_int(b, "code", p->load);
		json_string(b, "error", p->error);
		json_builder_end_object(b);
		return;
	}
	json_string(b, "name", p->name);
	json_string(b, "version", p->version);
	json_string(b, "description", p->description);
	json_builder_set_member_name(b, "shadowed");
	json_builder_add_boolean_value(b, p->shadowed);
	json_builder_set_member_name(b, "abi");
	json_builder_begin_object(b);
	json_int(b, "major", p->abi_major);
	json_int(b, "minor", p->abi_minor);
	json_builder_end_object(b);
	if (p->init != TE_OK) {
		json_string(b, "status", te_status_str(p->init));
		json_int(b, "code", p->init);
		json_string(b, "error", p->error);
		json_builder_end_object(b);
		return;
	}
	json_string(b, "status", te_status_str(TE_OK));
	json_int(b, "code", TE_OK);

	json_builder_set_member_name(b, "caps");
	json_builder_begin_object(b);
	json_flags(b, "mem_types", p->caps.mem_types, mem_bits, mem_names, G_N_ELEMENTS(mem_bits));
	json_flags(b, "staged_mem_types", p->caps.staged_mem_types, mem_bits, mem_names,
		   G_N_ELEMENTS(mem_bits));
	json_flags(b, "owned_mem_types", p->caps.owned_mem_types, mem_bits, mem_names,
		   G_N_ELEMENTS(mem_bits));
	json_flags(b, "ops", p->caps.ops, op_bits, op_names, G_N_ELEMENTS(op_bits));
	json_string(b, "progress", progress_str(p->caps.progress));
	json_string(b, "thread_level", thread_str(p->caps.thread_level));
	json_flags(b, "flags", p->caps.flags, cap_bits, cap_names, G_N_ELEMENTS(cap_bits));
	json_int(b, "max_slice_size", (int64_t)p->caps.max_slice_size);
	json_int(b, "default_slice_size", (int64_t)p->caps.default_slice_size);
	json_int(b, "slice_priv_size", p->caps.slice_priv_size);
	json_int(b, "max_devices", p->caps.max_devices);
	json_builder_end_object(b);

	json_builder_set_member_name(b, "devices");
	json_builder_begin_array(b);
	for (uint32_t d = 0; d < p->n_devices; d++) {
		const struct te_plugin_device *dev = &p->devices[d];

		json_builder_begin_object(b);
		json_int(b, "index", d);
		json_string(b, "name", dev->name);
		json_int(b, "numa_node", dev->numa_node);
		json_string(b, "pci", dev->pci);
		json_int(b, "link_speed_mbps", (int64_t)dev->link_speed_mbps);
		json_flags(b, "mem_types", dev->mem_types, mem_bits, mem_names,
			   G_N_ELEMENTS(mem_bits));
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	json_builder_end_object(b);
}

static void print_json_root(JsonBuilder *b)
{
	g_autoptr(JsonGenerator) gen = json_generator_new();
	g_autoptr(JsonNode) root = json_builder_get_root(b);
	g_autofree char *text = NULL;

	json_generator_set_pretty(gen, TRUE);
	json_generator_set_root(gen, root);
	text = json_generator_to_data(gen, NULL);
	printf("%s\n", text);
}

static void print_json(const char *search_path, GPtrArray *probes)
{
	g_autoptr(JsonBuilder) b = json_builder_new();
	g_auto(GStrv) dirs = g_strsplit(search_path ? search_path : "", ":", -1);

	json_builder_begin_object(b);
	json_string(b, "te_version", TE_VERSION);
	json_builder_set_member_name(b, "abi");
	json_builder_begin_object(b);
	json_int(b, "major", TE_PLUGIN_ABI_MAJOR);
	json_int(b, "minor", TE_PLUGIN_ABI_MINOR);
	json_builder_end_object(b);
	json_builder_set_member_name(b, "search_path");
	json_builder_begin_array(b);
	for (char **d = dirs; *d; d++)
		if (**d)
			json_builder_add_string_value(b, *d);
	json_builder_end_array(b);
	json_builder_set_member_name(b, "plugins");
	json_builder_begin_array(b);
	for (guint i = 0; i < probes->len; i++)
		json_probe(b, probes->pdata[i]);
	json_builder_end_array(b);
	json_builder_end_object(b);
	print_json_root(b);
}

/* --- --config ---------------------------------------------------------------------------- */

static int show_config(const char *path, bool json)
{
	struct config *cfg = NULL;
	g_autofree char *err = NULL;
	g_autofree char *yaml = NULL;
	enum te_status st;

	st = config_load_file(path, &cfg, &err);
	if (st == TE_OK) {
		/* Never print a shared secret: operators paste this output into tickets. */
		if (cfg->auth_secret) {
			g_free(cfg->auth_secret);
			cfg->auth_secret = g_strdup(
				"<redacted secret>"); /* still >= 16 bytes: the text loads again */
		}
		yaml = config_to_yaml(cfg);
	}

	if (json) {
		g_autoptr(JsonBuilder) b = json_builder_new();

		json_builder_begin_object(b);
		json_string(b, "file", path);
		json_string(b, "status", te_status_str(st));
		json_int(b, "code", st);
		if (st == TE_OK)
			json_string(b, "effective", yaml ? yaml : "");
		else
			json_string(b, "error", err ? err : te_status_str(st));
		json_builder_end_object(b);
		print_json_root(b);
	} else if (st == TE_OK) {
		fputs(yaml ? yaml : "", stdout);
		if (yaml && yaml[0] && !g_str_has_suffix(yaml, "\n"))
			putchar('\n');
	} else {
		fprintf(stderr, "te-info: %s\n", err ? err : te_status_str(st));
	}
	config_free(cfg);
	return st == TE_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
	gboolean json = FALSE, version = FALSE;
	g_autofree char *config_file = NULL;
	g_autofree char *plugin_path = NULL;
	g_autofree char *search_path = NULL;
	g_autoptr(GError) error = NULL;
	g_autoptr(GOptionContext) octx = NULL;
	g_autoptr(GPtrArray) probes = NULL;
	g_autoptr(GHashTable) seen = NULL;
	struct scan_ctx sctx;
	const GOptionEntry entries[] = {
		{ "json", 'j', 0, G_OPTION_ARG_NONE, &json, "Print one JSON document", NULL },
		{ "config", 'c', 0, G_OPTION_ARG_FILENAME, &config_file,
		  "Print the effective configuration of FILE (or its error, exit 1)", "FILE" },
		{ "plugin-path", 'p', 0, G_OPTION_ARG_STRING, &plugin_path,
		  "Search these ':'-separated directories instead of $TE_PLUGIN_PATH and "
		  "the install directory",
		  "DIRS" },
		{ "version", 'V', 0, G_OPTION_ARG_NONE, &version, "Print versions and exit", NULL },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};

	octx = g_option_context_new("[PLUGIN...]");
	g_option_context_set_summary(
		octx,
		"List the transport plugins te can find: path, name, ABI version, capabilities\n"
		"and devices. Plugins that fail to load or initialise are listed with the reason.\n"
		"PLUGIN: a plugin name (resolved along the search path) or a module file.\n"
		"Without PLUGIN: every *.so in the search path.");
	g_option_context_add_main_entries(octx, entries, NULL);
	if (!g_option_context_parse(octx, &argc, &argv, &error)) {
		fprintf(stderr, "te-info: %s (try --help)\n", error->message);
		return 2;
	}
	if (version) {
		printf("te-info %s (plugin ABI %d.%d, plugin dir %s)\n", TE_VERSION,
		       TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR, TE_PLUGINDIR);
		return 0;
	}
	if (config_file)
		return show_config(config_file, json);

	search_path = plugin_path ? g_strdup(plugin_path) : plugin_search_path();
	probes = g_ptr_array_new_with_free_func(probe_free);
	seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	sctx.probes = probes;
	sctx.seen = seen;
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			probe_arg(&sctx, argv[i], search_path);
	} else {
		plugin_scan(search_path, scan_one, &sctx);
	}

	if (json)
		print_json(search_path, probes);
	else
		print_text(search_path, probes);
	/* Failing plugins are reported, not fatal: the listing itself succeeded. */
	return 0;
}
