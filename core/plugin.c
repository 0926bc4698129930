/* SPDX-License-Identifier: Apache-2.0 */
/* plugin.c: locate plugin modules, dlopen them and validate their ABI descriptor. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>

#include "core/plugin.h"
#include "te_build_config.h"

char *plugin_search_path(void)
{
	const char *env = g_getenv("TE_PLUGIN_PATH");

	if (env && *env)
		return g_strdup_printf("%s:%s", env, TE_PLUGINDIR);
	return g_strdup(TE_PLUGINDIR);
}

/* Stubs for optional ops the plugin left NULL: callers never test for NULL. */
static enum te_status stub_query_devices(struct te_plugin_inst *inst,
					 struct te_plugin_device *devices, uint32_t max,
					 uint32_t *n_out)
{
	*n_out = 0;
	return TE_OK;
}

static void stub_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
}

static uint32_t stub_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	return 0;
}

static enum te_status stub_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_handshake(struct te_plugin_inst *inst, const char *peer_name,
				     const void *req, size_t req_len, void *resp, size_t cap,
				     size_t *resp_len_out)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_wait(struct te_plugin_inst *inst, uint64_t timeout_ns)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_mem_query(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				     uint32_t *mem_type_out, int32_t *dev_out)
{
	return TE_ERR_NOT_FOUND;
}

static enum te_status stub_mem_copy(struct te_plugin_inst *inst, void *dst, const void *src,
				    uint64_t len, uint32_t mem_type, int32_t dev,
				    enum te_plugin_copy_dir dir)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_mem_dmabuf(struct te_plugin_inst *inst, const void *addr, uint64_t len,
				      int *fd_out, uint64_t *offset_out)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_mem_alloc(struct te_plugin_inst *inst, uint32_t mem_type, int32_t dev,
				     uint64_t len, void **ptr_out)
{
	return TE_ERR_UNSUPPORTED;
}

static enum te_status stub_mem_free(struct te_plugin_inst *inst, void *ptr)
{
	return TE_ERR_UNSUPPORTED;
}

static const struct te_plugin_ops stub_ops = {
	.size = sizeof(struct te_plugin_ops),
	.query_devices = stub_query_devices,
	.release_remote_key = stub_release_remote_key,
	.progress = stub_progress,
	.cancel = stub_cancel,
	.retry_prepare = stub_retry_prepare,
	.handshake = stub_handshake,
	.wait = stub_wait,
	.mem_query = stub_mem_query,
	.mem_copy = stub_mem_copy,
	.mem_dmabuf = stub_mem_dmabuf,
	.mem_alloc = stub_mem_alloc,
	.mem_free = stub_mem_free,
};

/* Ops of ABI 1.0 that every plugin must provide, by name for the error message. */
#define REQUIRED(op)                                                                               \
	{                                                                                          \
#op, offsetof(struct te_plugin_ops, op)                                            \
	}
static const struct {
	const char *name;
	size_t offset;
} required_ops[] = {
	REQUIRED(init),	     REQUIRED(fini),	 REQUIRED(query_caps),	REQUIRED(reg_mem),
	REQUIRED(dereg_mem), REQUIRED(pack_key), REQUIRED(unload_peer), REQUIRED(unpack_remote_key),
	REQUIRED(submit),
};

/* Ops of ABI 1.0 end with handshake; 1.1 added wait. */
#define OPS_V1_0_SIZE (offsetof(struct te_plugin_ops, handshake) + sizeof(void *))
#define DESC_V1_0_SIZE (offsetof(struct te_plugin_desc, ops) + sizeof(void *))

enum te_status plugin_validate(const struct te_plugin_desc *desc, const char *file,
			       struct te_plugin_ops *ops_out, char **err_out)
{
	struct te_plugin_ops ops = stub_ops;
	size_t n;

	if (!desc) {
		*err_out = g_strdup_printf("%s: entry point returned no descriptor", file);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (desc->size < DESC_V1_0_SIZE) {
		*err_out = g_strdup_printf("%s: descriptor size %u is smaller than ABI 1.0's %zu",
					   file, desc->size, (size_t)DESC_V1_0_SIZE);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (desc->abi_major != TE_PLUGIN_ABI_MAJOR) {
		*err_out =
			g_strdup_printf("%s: ABI major %u is not supported (core ABI %d.%d)", file,
					desc->abi_major, TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR);
		return TE_ERR_ABI_MISMATCH;
	}
	if (desc->abi_minor > TE_PLUGIN_ABI_MINOR) {
		*err_out =
			g_strdup_printf("%s: ABI minor %u is newer than the core's %d.%d", file,
					desc->abi_minor, TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR);
		return TE_ERR_ABI_MISMATCH;
	}
	if (!desc->name || !*desc->name || strlen(desc->name) > 63) {
		*err_out = g_strdup_printf("%s: descriptor has no valid name", file);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (!desc->ops) {
		*err_out = g_strdup_printf("%s: descriptor has no ops table", file);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (desc->ops->size < offsetof(struct te_plugin_ops, submit) + sizeof(void *)) {
		*err_out = g_strdup_printf("%s: ops table size %u is smaller than ABI 1.0 requires",
					   file, desc->ops->size);
		return TE_ERR_PLUGIN_INVALID;
	}
	/* Copy what the plugin knows; members beyond its size keep their stubs. */
	n = MIN((size_t)desc->ops->size, sizeof(ops));
	/* After the size field the table holds only function pointers. */
	for (size_t off = offsetof(struct te_plugin_ops, init); off + sizeof(void *) <= n;
	     off += sizeof(void *)) {
		void *fn;

		memcpy(&fn, (const char *)desc->ops + off, sizeof(fn));
		if (fn)
			memcpy((char *)&ops + off, &fn, sizeof(fn));
	}
	ops.size = sizeof(ops);
	/* load_peer_ex (1.2) has no stub: the core calls it when set, else load_peer. */
	if (!ops.load_peer && !ops.load_peer_ex) {
		*err_out = g_strdup_printf("%s: required op 'load_peer' (or 'load_peer_ex') is "
					   "missing",
					   file);
		return TE_ERR_PLUGIN_INVALID;
	}
	for (size_t i = 0; i < G_N_ELEMENTS(required_ops); i++) {
		void *fn;

		memcpy(&fn, (const char *)&ops + required_ops[i].offset, sizeof(fn));
		if (!fn) {
			*err_out = g_strdup_printf("%s: required op '%s' is missing", file,
						   required_ops[i].name);
			return TE_ERR_PLUGIN_INVALID;
		}
	}
	*ops_out = ops;
	return TE_OK;
}

/* A file that is not an ELF object gives dlopen a cryptic message; say it plainly. */
static bool is_elf(const char *path)
{
	unsigned char magic[4] = { 0 };
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return true; /* let dlopen report the real reason */
	n = read(fd, magic, sizeof(magic));
	close(fd);
	return n == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' && magic[3] == 'F';
}

/* A plugin built for another major exports te_plugin_entry_v<N>: name it. */
static int other_major(void *dl)
{
	for (int major = 0; major < 16; major++) {
		char sym[32];

		if (major == TE_PLUGIN_ABI_MAJOR)
			continue;
		snprintf(sym, sizeof(sym), "te_plugin_entry_v%d", major);
		if (dlsym(dl, sym))
			return major;
	}
	return -1;
}

enum te_status plugin_open_file(const char *path, struct plugin **plugin_out, char **err_out)
{
	const struct te_plugin_desc *desc;
	te_plugin_entry_fn entry;
	struct te_plugin_ops ops;
	struct plugin *p;
	enum te_status st;
	void *dl;
	int major;

	if (access(path, F_OK) != 0) {
		*err_out =
			g_strdup_printf("%s: plugin file not found: %s", path, g_strerror(errno));
		return TE_ERR_PLUGIN_NOT_FOUND;
	}
	if (!is_elf(path)) {
		*err_out = g_strdup_printf("%s: not a shared object (no ELF header)", path);
		return TE_ERR_PLUGIN_INVALID;
	}
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!dl) {
		*err_out = g_strdup_printf("%s: cannot load: %s", path, dlerror());
		return TE_ERR_PLUGIN_INVALID;
	}
	*(void **)&entry = dlsym(dl, TE_PLUGIN_ENTRY_NAME);
	if (!entry) {
		major = other_major(dl);
		if (major >= 0) {
			*err_out = g_strdup_printf(
				"%s: ABI major %d is not supported (core ABI %d.%d; the plugin "
				"exports te_plugin_entry_v%d, not %s)",
				path, major, TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR, major,
				TE_PLUGIN_ENTRY_NAME);
			dlclose(dl);
			return TE_ERR_ABI_MISMATCH;
		}
		*err_out = g_strdup_printf("%s: entry symbol %s not found (not a te plugin)", path,
					   TE_PLUGIN_ENTRY_NAME);
		dlclose(dl);
		return TE_ERR_PLUGIN_INVALID;
	}
	desc = entry();
	st = plugin_validate(desc, path, &ops, err_out);
	if (st != TE_OK) {
		dlclose(dl);
		return st;
	}
	p = g_new0(struct plugin, 1);
	p->name = g_strdup(desc->name);
	p->path = g_strdup(path);
	p->dl = dl;
	p->desc = desc;
	p->ops = ops;
	*plugin_out = p;
	return TE_OK;
}

enum te_status plugin_open(const char *name, const char *explicit_path, const char *search_path,
			   struct plugin **plugin_out, char **err_out)
{
	g_autofree char *owned_path = NULL;
	g_auto(GStrv) dirs = NULL;
	g_autofree char *file = NULL;
	struct plugin *p;
	enum te_status st;

	if (explicit_path) {
		st = plugin_open_file(explicit_path, &p, err_out);
	} else {
		if (!search_path)
			search_path = owned_path = plugin_search_path();
		file = g_strdup_printf("%s.so", name);
		dirs = g_strsplit(search_path, ":", -1);
		for (int i = 0; dirs[i]; i++) {
			g_autofree char *cand = NULL;

			if (!*dirs[i])
				continue;
			cand = g_build_filename(dirs[i], file, NULL);
			if (g_file_test(cand, G_FILE_TEST_EXISTS)) {
				st = plugin_open_file(cand, &p, err_out);
				goto found;
			}
		}
		*err_out = g_strdup_printf("%s: plugin not found in search path %s "
					   "(set TE_PLUGIN_PATH or the transport's path:)",
					   file, search_path);
		return TE_ERR_PLUGIN_NOT_FOUND;
	}
found:
	if (st != TE_OK)
		return st;
	if (strcmp(p->name, name) != 0) {
		*err_out = g_strdup_printf("%s: descriptor name '%s' does not match transport '%s'",
					   p->path, p->name, name);
		plugin_close(p);
		return TE_ERR_PLUGIN_INVALID;
	}
	*plugin_out = p;
	return TE_OK;
}

static gint plugin_cmp_path(gconstpointer a, gconstpointer b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void plugin_scan(const char *search_path, plugin_scan_fn fn, void *user)
{
	g_auto(GStrv) dirs = g_strsplit(search_path, ":", -1);

	for (int i = 0; dirs[i]; i++) {
		g_autoptr(GDir) dir = NULL;
		g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
		const char *ent;

		if (!*dirs[i])
			continue;
		dir = g_dir_open(dirs[i], 0, NULL);
		if (!dir)
			continue;
		while ((ent = g_dir_read_name(dir)))
			if (g_str_has_suffix(ent, ".so"))
				g_ptr_array_add(names, g_build_filename(dirs[i], ent, NULL));
		g_ptr_array_sort(names, plugin_cmp_path);
		for (guint k = 0; k < names->len; k++)
			fn(user, g_ptr_array_index(names, k));
	}
}

void plugin_close(struct plugin *plugin)
{
	if (!plugin)
		return;
	/* RTLD_NODELETE keeps the code mapped: stale function pointers stay valid. */
	dlclose(plugin->dl);
	g_free(plugin->name);
	g_free(plugin->path);
	g_free(plugin);
}
