/* SPDX-License-Identifier: Apache-2.0 */
/* plugin.h: finding, loading and validating transport plugin modules. */
#ifndef TE_CORE_PLUGIN_H
#define TE_CORE_PLUGIN_H

#include <te/te_plugin.h>

/* A loaded, validated plugin module (not yet initialised). */
struct plugin {
	char *name; /* descriptor name */
	char *path; /* file it was loaded from */
	void *dl;   /* dlopen handle (RTLD_NODELETE) */
	const struct te_plugin_desc *desc;
	/* Core-owned copy of the ops: missing optional ops answer TE_ERR_UNSUPPORTED. */
	struct te_plugin_ops ops;
};

/*
 * plugin_search_path - the directories searched for plugins, ':'-separated:
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

/* Callback of plugin_scan: one candidate module file. */
typedef void (*plugin_scan_fn)(void *user, const char *path);

/* plugin_scan - call @fn for every "*.so" in the directories of @search_path. */
void plugin_scan(const char *search_path, plugin_scan_fn fn, void *user);

void plugin_close(struct plugin *plugin);

#endif /* TE_CORE_PLUGIN_H */
