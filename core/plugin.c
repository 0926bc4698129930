/* SPDX-License-Identifier: Apache-2.0 */
/* plugin.c: locate plugin modules, dlopen them and validate their ABI descriptor. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>

#include "core/plugin.h"
#include "te_build_config.h"

static gint plugin_cmp_str(gconstpointer a, gconstpointer b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * When this code runs from the build tree it was compiled in (libte.so or a tool linking the
 * core there), the build's plugin folders, so that tools and programs run from a checkout find
 * the plugins built with them: build/plugins/<name>/. NULL otherwise (an installed te).
 */
static char *plugin_build_tree_dirs(void)
{
	g_autofree char *root = g_strconcat(TE_BUILD_ROOT, "/", NULL);
	g_autofree char *plugins = g_build_filename(TE_BUILD_ROOT, "plugins", NULL);
	g_autoptr(GString) dirs = g_string_new(NULL);
	g_autoptr(GPtrArray) found = g_ptr_array_new_with_free_func(g_free);
	g_autoptr(GDir) d = NULL;
	g_autofree char *self = NULL;
	const char *entry;
	Dl_info info;

	/* The object holding this code: libte.so, or the executable (dli_fname may be relative). */
	if (!dladdr((void *)plugin_build_tree_dirs, &info) || !info.dli_fname)
		return NULL;
	self = realpath(info.dli_fname, NULL);
	if (!self)
		self = g_file_read_link("/proc/self/exe", NULL);
	if (!self || !g_str_has_prefix(self, root))
		return NULL;
	d = g_dir_open(plugins, 0, NULL);
	while (d && (entry = g_dir_read_name(d))) {
		g_autofree char *so = g_strdup_printf("%s/%s/%s.so", plugins, entry, entry);

		if (g_file_test(so, G_FILE_TEST_IS_REGULAR))
			g_ptr_array_add(found, g_build_filename(plugins, entry, NULL));
	}
	g_ptr_array_sort(found, plugin_cmp_str);
	for (guint i = 0; i < found->len; i++)
		g_string_append_printf(dirs, "%s%s", i ? ":" : "", (char *)found->pdata[i]);
	return dirs->len ? g_string_free(g_steal_pointer(&dirs), FALSE) : NULL;
}

char *plugin_search_path(void)
{
	const char *env = g_getenv("TE_PLUGIN_PATH");
	g_autofree char *build = plugin_build_tree_dirs();
	g_autoptr(GString) s = g_string_new(NULL);

	if (env && *env)
		g_string_append_printf(s, "%s:", env);
	if (build)
		g_string_append_printf(s, "%s:", build);
	g_string_append(s, TE_PLUGINDIR);
	return g_string_free(g_steal_pointer(&s), FALSE);
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

/*
 * struct te_plugin_option as ABI 1.2 has it, padding included (an array's stride): the smallest
 * option_size accepted.
 */
#define OPTION_ALIGN _Alignof(struct te_plugin_option)
#define OPTION_V1_2_SIZE                                                                           \
	((offsetof(struct te_plugin_option, flags) + sizeof(uint32_t) + OPTION_ALIGN - 1) /        \
	 OPTION_ALIGN * OPTION_ALIGN)
#define OPTION_NAME_MAX 63
#define OPTION_CHOICES_MAX 64
#define OPTION_FLAGS_KNOWN TE_PLUGIN_OPT_REQUIRED

/* [a-z][a-z0-9_-]*, 1..OPTION_NAME_MAX bytes: a YAML key printed bare in messages. */
static bool option_name_valid(const char *s)
{
	size_t n = strnlen(s, OPTION_NAME_MAX + 1);

	if (n == 0 || n > OPTION_NAME_MAX || !g_ascii_islower(s[0]))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!g_ascii_islower(s[i]) && !g_ascii_isdigit(s[i]) && s[i] != '_' && s[i] != '-')
			return false;
	return true;
}

/* A bounded, escaped copy of plugin text for a message (g_free). */
static char *option_text(const char *s)
{
	g_autofree char *cut = g_strndup(s, 64);

	return g_strescape(cut, NULL);
}

/* Check one declaration (@o, a core copy) at index @i; @prev are the ones before it. */
static enum te_status option_check(const struct te_plugin_option *o, uint32_t i,
				   const struct te_plugin_option *prev, const char *file,
				   char **err_out)
{
	g_autofree char *normal = NULL;
	g_autofree char *reason = NULL;
	size_t n_choices = 0;

	if (!o->name) {
		*err_out = g_strdup_printf("%s: option %u has no name", file, i);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (!option_name_valid(o->name)) {
		g_autofree char *t = option_text(o->name);

		*err_out = g_strdup_printf("%s: option %u: invalid name \"%s\" (expected "
					   "[a-z][a-z0-9_-]*, at most %d bytes)",
					   file, i, t, OPTION_NAME_MAX);
		return TE_ERR_PLUGIN_INVALID;
	}
	for (uint32_t j = 0; j < i; j++) {
		if (strcmp(prev[j].name, o->name) == 0) {
			*err_out = g_strdup_printf("%s: option '%s' is declared twice (options %u "
						   "and %u)",
						   file, o->name, j, i);
			return TE_ERR_PLUGIN_INVALID;
		}
	}
	if (o->type > TE_PLUGIN_OPT_CHOICE) {
		*err_out =
			g_strdup_printf("%s: option '%s': unknown type %u", file, o->name, o->type);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (o->flags & ~(uint32_t)OPTION_FLAGS_KNOWN) {
		*err_out = g_strdup_printf("%s: option '%s': unknown flags 0x%x", file, o->name,
					   o->flags & ~(uint32_t)OPTION_FLAGS_KNOWN);
		return TE_ERR_PLUGIN_INVALID;
	}
	if ((o->type == TE_PLUGIN_OPT_INT || o->type == TE_PLUGIN_OPT_SIZE) && o->min > o->max) {
		*err_out = g_strdup_printf("%s: option '%s': min %" PRId64 " is above max %" PRId64,
					   file, o->name, o->min, o->max);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (o->type == TE_PLUGIN_OPT_SIZE && o->min < 0) {
		*err_out = g_strdup_printf("%s: option '%s': a SIZE range cannot be negative "
					   "(min %" PRId64 ")",
					   file, o->name, o->min);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (o->type != TE_PLUGIN_OPT_CHOICE && o->choices) {
		*err_out = g_strdup_printf("%s: option '%s': choices given for a type other than "
					   "CHOICE",
					   file, o->name);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (o->type == TE_PLUGIN_OPT_CHOICE) {
		while (o->choices && n_choices <= OPTION_CHOICES_MAX && o->choices[n_choices]) {
			if (!*o->choices[n_choices]) {
				*err_out = g_strdup_printf("%s: option '%s': choice %zu is empty",
							   file, o->name, n_choices);
				return TE_ERR_PLUGIN_INVALID;
			}
			n_choices++;
		}
		if (n_choices == 0 || n_choices > OPTION_CHOICES_MAX) {
			*err_out = g_strdup_printf("%s: option '%s': a CHOICE needs 1..%d choices "
						   "(a NULL-terminated array)",
						   file, o->name, OPTION_CHOICES_MAX);
			return TE_ERR_PLUGIN_INVALID;
		}
	}
	if ((o->flags & TE_PLUGIN_OPT_REQUIRED) && o->default_value) {
		*err_out = g_strdup_printf("%s: option '%s': a required option cannot have a "
					   "default",
					   file, o->name);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (o->default_value &&
	    config_option_normalize(o, o->default_value, &normal, &reason) != TE_OK) {
		g_autofree char *t = option_text(o->default_value);

		*err_out = g_strdup_printf("%s: option '%s': default \"%s\" is invalid: %s", file,
					   o->name, t, reason);
		return TE_ERR_PLUGIN_INVALID;
	}
	return TE_OK;
}

enum te_status plugin_validate_options(const struct te_plugin_desc *desc, const char *file,
				       struct te_plugin_option **options_out, uint32_t *n_out,
				       char **err_out)
{
	g_autofree struct te_plugin_option *opts = NULL;
	uint32_t n;

	*options_out = NULL;
	*n_out = 0;
	/* Members a plugin built before 1.2 does not have: nothing declared. */
	if (desc->abi_minor < 2 || !TE_PLUGIN_HAS(desc, struct te_plugin_desc, option_size) ||
	    desc->n_options == 0)
		return TE_OK;
	n = desc->n_options;
	if (n > TE_PLUGIN_MAX_OPTIONS) {
		*err_out = g_strdup_printf("%s: descriptor declares %u options, more than %u", file,
					   n, TE_PLUGIN_MAX_OPTIONS);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (!desc->options) {
		*err_out = g_strdup_printf("%s: descriptor declares %u options but options is NULL",
					   file, n);
		return TE_ERR_PLUGIN_INVALID;
	}
	if (desc->option_size < OPTION_V1_2_SIZE) {
		*err_out = g_strdup_printf("%s: option_size %u is smaller than ABI 1.2's %zu", file,
					   desc->option_size, (size_t)OPTION_V1_2_SIZE);
		return TE_ERR_PLUGIN_INVALID;
	}
	opts = g_new0(struct te_plugin_option, n);
	for (uint32_t i = 0; i < n; i++) {
		const char *src = (const char *)desc->options + (size_t)i * desc->option_size;
		struct te_plugin_option *o = &opts[i];
		enum te_status st;

		/* Members beyond what the plugin knows stay zero. */
		memcpy(o, src, MIN((size_t)desc->option_size, sizeof(*o)));
		if (o->size != desc->option_size) {
			*err_out = g_strdup_printf("%s: option %u: size %u differs from the "
						   "descriptor's option_size %u",
						   file, i, o->size, desc->option_size);
			return TE_ERR_PLUGIN_INVALID;
		}
		o->size = sizeof(*o);
		st = option_check(o, i, opts, file, err_out);
		if (st != TE_OK)
			return st;
	}
	*options_out = g_steal_pointer(&opts);
	*n_out = n;
	return TE_OK;
}

enum te_status plugin_apply_options(const struct plugin *plugin, struct config *cfg, size_t index,
				    char **err_out)
{
	if (!plugin->n_options)
		return TE_OK;
	return config_apply_options(cfg, index, plugin->name, plugin->options, plugin->n_options,
				    err_out);
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
	struct te_plugin_option *options = NULL;
	uint32_t n_options = 0;
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
	if (st == TE_OK)
		st = plugin_validate_options(desc, path, &options, &n_options, err_out);
	if (st != TE_OK) {
		dlclose(dl);
		return st;
	}
	p = g_new0(struct plugin, 1);
	p->options = options;
	p->n_options = n_options;
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
	g_free(plugin->options);
	g_free(plugin->name);
	g_free(plugin->path);
	g_free(plugin);
}

char *plugin_file_stem(const char *path)
{
	char *base = g_path_get_basename(path);

	if (g_str_has_suffix(base, ".so"))
		base[strlen(base) - 3] = '\0';
	return base;
}

char *plugin_extra_exports(const char *path, bool any_major)
{
	g_autoptr(GMappedFile) mf = g_mapped_file_new(path, FALSE, NULL);
	g_autoptr(GString) names = NULL;
	const char *buf;
	size_t len;
	ElfW(Ehdr) eh;

	if (!mf)
		return NULL;
	buf = g_mapped_file_get_contents(mf);
	len = g_mapped_file_get_length(mf);
	if (len < sizeof(eh))
		return NULL;
	memcpy(&eh, buf, sizeof(eh));
	if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
	    eh.e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
	    eh.e_shentsize != sizeof(ElfW(Shdr)) || eh.e_shoff > len ||
	    eh.e_shnum > (len - eh.e_shoff) / sizeof(ElfW(Shdr)))
		return NULL;

	names = g_string_new(NULL);
	for (unsigned i = 0; i < eh.e_shnum; i++) {
		ElfW(Shdr) sh, strsh;

		memcpy(&sh, buf + eh.e_shoff + i * sizeof(sh), sizeof(sh));
		if (sh.sh_type != SHT_DYNSYM || sh.sh_link >= eh.e_shnum ||
		    sh.sh_entsize != sizeof(ElfW(Sym)) || sh.sh_offset > len ||
		    sh.sh_size > len - sh.sh_offset)
			continue;
		memcpy(&strsh, buf + eh.e_shoff + sh.sh_link * sizeof(strsh), sizeof(strsh));
		if (strsh.sh_offset > len || strsh.sh_size > len - strsh.sh_offset)
			continue;
		/* Symbol 0 is the reserved null symbol. */
		for (size_t k = 1; k < sh.sh_size / sizeof(ElfW(Sym)); k++) {
			const char *strtab = buf + strsh.sh_offset;
			unsigned bind, type;
			const char *name;
			ElfW(Sym) sym;

			memcpy(&sym, buf + sh.sh_offset + k * sizeof(sym), sizeof(sym));
			bind = ELF64_ST_BIND(sym.st_info); /* same encoding in ELF32 */
			type = ELF64_ST_TYPE(sym.st_info);
			if (sym.st_shndx == SHN_UNDEF || sym.st_shndx == SHN_ABS)
				continue;
			if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE)
				continue;
			if (type != STT_FUNC && type != STT_OBJECT)
				continue;
			if (sym.st_name >= strsh.sh_size ||
			    !memchr(strtab + sym.st_name, '\0', strsh.sh_size - sym.st_name))
				continue;
			name = strtab + sym.st_name;
			if (any_major ? g_str_has_prefix(name, "te_plugin_entry_v")
				      : strcmp(name, TE_PLUGIN_ENTRY_NAME) == 0)
				continue;
			g_string_append_printf(names, "%s%s", names->len ? " " : "", name);
		}
	}
	return names->len ? g_string_free(g_steal_pointer(&names), FALSE) : NULL;
}
