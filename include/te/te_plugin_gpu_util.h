/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_plugin_gpu_util.h: header-only helpers of GPU transport plugins: failure text, loading a
 * vendor runtime with dlopen, who a peer process is, NUMA nodes from sysfs, option parsing
 * with messages.
 *
 * Part of the GPU plugin toolkit (te_plugin_gpu.h includes it; nvlink and hip use it). Linux
 * only; static inline functions over libc, pthreads and libdl, nothing to link but what the
 * plugin links anyway. Include it before any system header, or build with _GNU_SOURCE. It
 * compiles as C11 and as C++11. Unlike te.h and te_plugin.h it uses POSIX types (pthread in
 * the headers that include it): none of them crosses the plugin ABI, they live inside one
 * plugin module.
 *
 * Conventions: functions that fail say why through host->set_error (prefixed with the
 * plugin's name, "nvlink: ...") and log the same text at debug level; they return
 * enum te_status and write outputs only on TE_OK, as te_plugin.h's ops do.
 */
#ifndef TE_PLUGIN_GPU_UTIL_H
#define TE_PLUGIN_GPU_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a failure's detail text (slice_done, set_error). */
#define TE_PLUGIN_GPU_DETAIL 224u

#ifdef __cplusplus
#define TE_PLUGIN_GPU_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define TE_PLUGIN_GPU_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* --- failure text ---------------------------------------------------------------------------- */

/*
 * snprintf for texts that may be cut short on purpose (details are bounded): a function of its
 * own, so that compilers do not warn about truncation they cannot rule out.
 */
static inline int te_plugin_gpu_fmt(char *buf, size_t len, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
static inline int te_plugin_gpu_fmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return n;
}

/*
 * Log @text at @level. Details start with "<plugin>: " (what users see in task details and
 * errors); the host prefixes log lines with the plugin's name itself, so it is cut here.
 */
static inline void te_plugin_gpu_log_detail(const struct te_plugin_host *host,
					    struct te_plugin_host_ctx *ctx, const char *plugin,
					    enum te_plugin_log_level level, const char *text)
{
	size_t n = strlen(plugin);

	if (strncmp(text, plugin, n) == 0 && text[n] == ':' && text[n + 1] == ' ')
		text += n + 2;
	host->log(ctx, level, "%s", text);
}

/* Say why the running op fails (host->set_error) and log it at debug level; @fmt is the whole text. */
static inline void te_plugin_gpu_error(const struct te_plugin_host *host,
				       struct te_plugin_host_ctx *ctx, const char *plugin,
				       const char *fmt, ...) TE_PLUGIN_PRINTF(4, 5);
static inline void te_plugin_gpu_error(const struct te_plugin_host *host,
				       struct te_plugin_host_ctx *ctx, const char *plugin,
				       const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	host->set_error(ctx, "%s", buf);
	te_plugin_gpu_log_detail(host, ctx, plugin, TE_PLUGIN_LOG_DEBUG, buf);
}

/* "NAME: text" of a vendor error, or "NAME" alone when the runtime's text is only its name. */
static inline const char *te_plugin_gpu_name_text(const char *name, const char *text, int code,
						  const char *type, char *buf, size_t len)
{
	if (name && text && strcmp(name, text) != 0)
		snprintf(buf, len, "%s: %s", name, text);
	else if (name || text)
		snprintf(buf, len, "%s", name ? name : text);
	else
		snprintf(buf, len, "%s %d", type, code);
	return buf;
}

/* --- the vendor runtime ---------------------------------------------------------------------- */

/*
 * dlopen the first of @names (@n of them) that loads (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE:
 * GPU runtimes keep threads and must stay mapped). The handle, with the name that loaded in
 * *@which_out; NULL with the loader's text for each name tried in @why ("a: ...; b: ...").
 */
static inline void *te_plugin_gpu_dlopen(const char *const *names, size_t n, const char **which_out,
					 char *why, size_t len)
{
	size_t at = 0;

	if (len)
		why[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		void *dl;
		const char *e;
		int k;

		dlerror();
		dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		if (dl) {
			*which_out = names[i];
			return dl;
		}
		e = dlerror();
		if (at >= len)
			continue;
		k = snprintf(why + at, len - at, "%s%s", i ? "; " : "", e ? e : names[i]);
		if (k > 0)
			at += (size_t)k;
	}
	return NULL;
}

/* One entry point to resolve: its name and where its address goes. */
struct te_plugin_gpu_sym {
	const char *name;
	void **slot;
};

/*
 * Look up a symbol: its address, or NULL with why in @why (@len bytes; may stay empty).
 * dlsym for most runtimes; NVIDIA's cuGetProcAddress for CUDA.
 */
typedef void *(*te_plugin_gpu_lookup_fn)(void *user, const char *name, char *why, size_t len);

/*
 * Resolve every one of @syms (@n of them) through @lookup. TE_OK; or the index of the first
 * that is missing in *@missing_out and its lookup's text in @why, and TE_ERR_NOT_FOUND.
 */
static inline enum te_status te_plugin_gpu_resolve(const struct te_plugin_gpu_sym *syms, size_t n,
						   te_plugin_gpu_lookup_fn lookup, void *user,
						   size_t *missing_out, char *why, size_t len)
{
	for (size_t i = 0; i < n; i++) {
		void *p;

		if (len)
			why[0] = '\0';
		p = lookup(user, syms[i].name, why, len);
		if (!p) {
			*missing_out = i;
			return TE_ERR_NOT_FOUND;
		}
		*syms[i].slot = p;
	}
	return TE_OK;
}

/* The dlsym lookup for te_plugin_gpu_resolve; @user is the dlopen handle. */
static inline void *te_plugin_gpu_dlsym(void *user, const char *name, char *why, size_t len)
{
	void *p;
	const char *e;

	dlerror();
	p = dlsym(user, name);
	e = p ? NULL : dlerror();
	if (!p && len)
		snprintf(why, len, "%s", e ? e : "symbol not found");
	return p;
}

/* --- NUMA ------------------------------------------------------------------------------------ */

/* NUMA node of PCI device @pci ("0000:3b:00.0", any case) from sysfs; -1 when unknown. */
static inline int te_plugin_gpu_sysfs_numa(const char *pci)
{
	char path[128], low[32];
	FILE *f;
	int v = -1;
	size_t i;

	for (i = 0; pci[i] && i + 1 < sizeof(low); i++)
		low[i] = (char)(pci[i] >= 'A' && pci[i] <= 'F' ? pci[i] - 'A' + 'a' : pci[i]);
	low[i] = '\0';
	if (!low[0] || strchr(low, '/'))
		return -1;
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", low);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

/* --- who a peer is ------------------------------------------------------------------------- */

/*
 * A process instance, as peers see it in the published blob (48 bytes, little-endian): the
 * host's boot id, the pid namespace, the pid, the process start time and a random nonce of the
 * plugin instance. GPU memory handles (CUDA or HIP IPC) are valid only while their process
 * lives, and only on its host: from this, load_peer tells a peer of this process, of this host,
 * a dead process, or another host.
 */
struct te_plugin_gpu_ident {
	uint8_t host[16]; /* /proc/sys/kernel/random/boot_id, zeros if unreadable */
	uint64_t pidns;	  /* inode of /proc/self/ns/pid */
	uint32_t pid;
	uint32_t reserved;
	uint64_t starttime; /* of the process, clock ticks after boot */
	uint64_t nonce;	    /* of the plugin instance, never 0 */
};

TE_PLUGIN_GPU_STATIC_ASSERT(sizeof(struct te_plugin_gpu_ident) == 48, "ident wire size");

enum te_plugin_gpu_where {
	TE_PLUGIN_GPU_SAME_PROCESS = 0, /* its device pointers are valid here */
	TE_PLUGIN_GPU_SAME_HOST = 1,	/* a live process of this host */
	TE_PLUGIN_GPU_GONE = 2, /* a process of this host (and pid namespace) that is gone */
	TE_PLUGIN_GPU_OTHER_HOST = 3,
};

static inline int te_plugin_gpu_hexval_(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The boot id as 16 bytes (what the core calls the host id), zeros if unreadable. */
static inline void te_plugin_gpu_host_id(uint8_t out[16])
{
	char buf[64];
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	size_t k = 0;

	memset(out, 0, 16);
	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f)) {
		for (size_t i = 0; buf[i] && k < 32; i++) {
			int v = te_plugin_gpu_hexval_(buf[i]);

			if (v < 0)
				continue;
			out[k / 2] = (uint8_t)(out[k / 2] | (k % 2 ? v : v << 4));
			k++;
		}
	}
	fclose(f);
}

/* Start time of process @pid (clock ticks after boot), 0 when it does not exist. */
static inline uint64_t te_plugin_gpu_starttime(uint32_t pid)
{
	char path[64], buf[1024];
	const char *p;
	FILE *f;
	size_t n;
	unsigned long long v = 0;

	snprintf(path, sizeof(path), "/proc/%" PRIu32 "/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
	if (!p || !p[1])
		return 0;
	/* Fields after the name start with the state (field 3); starttime is field 22. */
	if (sscanf(p + 2,
		   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
		   "%*d %llu",
		   &v) != 1)
		return 0;
	return v;
}

/* This process, with a fresh random nonce for a new plugin instance. */
static inline void te_plugin_gpu_ident_self(struct te_plugin_gpu_ident *id)
{
	struct stat st;

	memset(id, 0, sizeof(*id));
	te_plugin_gpu_host_id(id->host);
	id->pidns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
	id->pid = (uint32_t)getpid();
	id->starttime = te_plugin_gpu_starttime(id->pid);
	if (getrandom(&id->nonce, sizeof(id->nonce), 0) != (ssize_t)sizeof(id->nonce) || !id->nonce)
		id->nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ 1u;
}

/* Where the process @peer runs, seen from @self. */
static inline enum te_plugin_gpu_where
te_plugin_gpu_ident_where(const struct te_plugin_gpu_ident *self,
			  const struct te_plugin_gpu_ident *peer)
{
	if (memcmp(peer->host, self->host, sizeof(peer->host)) != 0)
		return TE_PLUGIN_GPU_OTHER_HOST;
	if (peer->pidns != self->pidns)
		return TE_PLUGIN_GPU_SAME_HOST; /* its pid means nothing here */
	if (peer->pid == self->pid && peer->starttime == self->starttime)
		return TE_PLUGIN_GPU_SAME_PROCESS;
	if (te_plugin_gpu_starttime(peer->pid) != peer->starttime)
		return TE_PLUGIN_GPU_GONE;
	return TE_PLUGIN_GPU_SAME_HOST;
}

/* --- options --------------------------------------------------------------------------------- */

/*
 * The toolkit's options, declared (te_plugin.h, "Declared options", ABI 1.2): a GPU plugin lists
 * them first in its own array, then its own options, and gives the array to its descriptor:
 *
 *   static const struct te_plugin_option my_options[] = {
 *           TE_PLUGIN_GPU_OPTIONS_COMMON,
 *           TE_PLUGIN_GPU_OPTION_FETCH_TIMEOUT, // when it shares file descriptors
 *           TE_PLUGIN_OPTION_CHOICE("alloc", "legacy", my_alloc_modes, "..."),
 *   };
 *
 * The core checks them before init; te_plugin_gpu_init reads the common ones (normalized, with
 * their defaults) and the vendor's options hook reads its own with te_plugin_opt_* of
 * te_plugin_opts.h. The slice_size default is TE_PLUGIN_GPU_DEF_SLICE (te_plugin_gpu.h).
 */
#define TE_PLUGIN_GPU_OPTIONS_COMMON                                                               \
	TE_PLUGIN_OPTION_STRING("library", NULL,                                                   \
				"the runtime library to dlopen (a path or a name; default: the "   \
				"vendor's)"),                                                      \
		TE_PLUGIN_OPTION_INT("streams", "4", 1, 64,                                        \
				     "streams per GPU that copies are spread over"),               \
		TE_PLUGIN_OPTION_INT("window", "256", 1, 4096,                                     \
				     "copies in flight per stream; beyond, back-pressure"),        \
		TE_PLUGIN_OPTION_SIZE("slice_size", "64M", 4096, 1ll << 40,                        \
				      "slice size advertised to the core (transfer.slice_size "    \
				      "overrides)"),                                               \
		TE_PLUGIN_OPTION_BOOL("pin_host", "true",                                          \
				      "pin registered host memory (false: pageable, the runtime "  \
				      "stages)")
#define TE_PLUGIN_GPU_OPTION_FETCH_TIMEOUT                                                         \
	TE_PLUGIN_OPTION_INT("fetch_timeout_ms", "5000", 10, 600000,                               \
			     "how long importing a file descriptor from a peer may take")

/* A file name of 1..@len - 1 bytes into @buf; @def when absent (NULL: *@buf = ""). */
static inline enum te_status te_plugin_gpu_opt_path(const struct te_plugin_host *host,
						    struct te_plugin_host_ctx *ctx,
						    const char *plugin, const char *key,
						    const char *def, char *buf, size_t len)
{
	const char *s = host->config_get(ctx, key);

	if (s && (!*s || strlen(s) >= len)) {
		te_plugin_gpu_error(host, ctx, plugin,
				    "%s: option '%s': expected a file name of 1..%zu bytes", plugin,
				    key, len - 1);
		return TE_ERR_CONFIG;
	}
	snprintf(buf, len, "%s", s ? s : def ? def : "");
	return TE_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* TE_PLUGIN_GPU_UTIL_H */
