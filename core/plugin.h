/* SPDX-License-Identifier: Apache-2.0 */
/* plugin.h: finding, loading and validating transport plugin modules. */
#ifndef TE_CORE_PLUGIN_H
#define TE_CORE_PLUGIN_H

#include <stdbool.h>

#include <te/te_plugin.h>

#include "core/config.h"

/* A loaded, validated plugin module (not yet initialised). */
struct plugin {
	char *name; /* descriptor name */
	char *path; /* file it was loaded from */
	void *dl;   /* dlopen handle (RTLD_NODELETE) */
	const struct te_plugin_desc *desc;
	/* Core-owned copy of the ops: missing optional ops answer TE_ERR_UNSUPPORTED. */
	struct te_plugin_ops ops;
	/*
	 * Core-owned copies of the declared options (te_plugin.h, ABI 1.2), each a whole struct
	 * (members past the plugin's option_size zeroed); n_options 0: free-form options.
	 */
	struct te_plugin_option *options;
	uint32_t n_options;
};

/*
 * plugin_search_path - the directories searched for plugins, ':'-separated (when the code
 * runs from its build tree, the build's plugin folders come after $TE_PLUGIN_PATH):
 * $TE_PLUGIN_PATH, then the install directory. Caller g_frees.
 */
char *plugin_search_path(void);

/*
 * plugin_open - load plugin @name: from @explicit_path when given, else the
 * first "<dir>/<name>.so" along @search_path (NULL: plugin_search_path()).
 * Validates the entry symbol, ABI major/minor, descriptor and required ops. On
 * failure returns TE_ERR_PLUGIN_NOT_FOUND, TE_ERR_PLUGIN_INVALID or
 * TE_ERR_ABI_MISMATCH and *err_out (g_free) is one line naming the file and the
 * reason.
 */
enum te_status plugin_open(const char *name, const char *explicit_path, const char *search_path,
			   struct plugin **plugin_out, char **err_out);

/* plugin_open_file - load and validate the module at @path (any name). */
enum te_status plugin_open_file(const char *path, struct plugin **plugin_out, char **err_out);

/*
 * plugin_validate - check a descriptor as the loader does (pure; used by the
 * loader and by unit tests). @file names the module in messages.
 */
enum te_status plugin_validate(const struct te_plugin_desc *desc, const char *file,
			       struct te_plugin_ops *ops_out, char **err_out);

/*
 * plugin_validate_options - check the option declarations of @desc (already accepted by
 * plugin_validate) as te_plugin.h, "Declared options", says. TE_OK with *options_out (g_free;
 * NULL when none are declared) and *n_out; TE_ERR_PLUGIN_INVALID with *err_out (g_free) naming
 * @file and the option. Pure; used by the loader and by unit tests.
 */
enum te_status plugin_validate_options(const struct te_plugin_desc *desc, const char *file,
				       struct te_plugin_option **options_out, uint32_t *n_out,
				       char **err_out);

/*
 * plugin_apply_options - check transport @index of @cfg (its plugin is @plugin) against the
 * plugin's declarations and fill in the effective options (config_apply_options). A plugin
 * that declares nothing keeps its options as they are. TE_OK; TE_ERR_CONFIG with *err_out
 * "<file>:<line>:<col>: transports[<index>].options.<key>: <reason>".
 */
enum te_status plugin_apply_options(const struct plugin *plugin, struct config *cfg, size_t index,
				    char **err_out);

/* Callback of plugin_scan: one candidate module file. */
typedef void (*plugin_scan_fn)(void *user, const char *path);

/* plugin_scan - call @fn for every "*.so" in the directories of @search_path. */
void plugin_scan(const char *search_path, plugin_scan_fn fn, void *user);

void plugin_close(struct plugin *plugin);

/* The basename of module file @path without ".so" (g_free): what desc.name must equal. */
char *plugin_file_stem(const char *path);

/*
 * The defined global function and object symbols of module @path's .dynsym other than its
 * entry point (any major's with @any_major, else TE_PLUGIN_ENTRY_NAME), space-separated
 * (g_free), or NULL when there are none or the file is not an ELF object of this machine's
 * class. Every offset read from the file is checked against its size. For te-info and
 * te-conformance.
 */
char *plugin_extra_exports(const char *path, bool any_major);

#endif /* TE_CORE_PLUGIN_H */
