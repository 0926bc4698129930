/* SPDX-License-Identifier: Apache-2.0 */
/* abi.c: te-conformance's checks of the module alone (load, descriptor, exports, caps, devices). */

/*
 * The module is probed in a forked child, as te-info does, so that a plugin crashing in its
 * entry point, init or a query is a FAIL line naming the op, not the end of te-conformance.
 * The child streams records to the parent over a pipe: the check it starts, the op it is about
 * to call, each result, and finally what the engine checks need (name, caps, devices). Whatever
 * arrived before a crash is kept. The core's own loader (plugin_open_file, plugin_validate,
 * transport_start) is used where it decides, so its verdicts and messages are the engine's.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conformance.h"
#include "core/config.h"
#include "core/host.h"
#include "core/plugin.h"
#include "core/transport.h"

enum rec {
	REC_BEGIN = 'B',  /* text: the check starting */
	REC_OP = 'O',	  /* text: the op about to be called */
	REC_RESULT = 'R', /* kind byte, name, NUL, text */
	REC_INFO = 'I',	  /* struct abi_info */
};

struct abi_info {
	char name[64];
	struct te_plugin_caps caps;
	uint32_t n_devices;
};

static int child_fd = -1;

static void rec_send(char tag, const void *data, size_t len)
{
	uint8_t hdr[1 + sizeof(uint32_t)];
	uint32_t len32 = (uint32_t)len;
	const uint8_t *parts[2] = { hdr, data };
	size_t sizes[2] = { sizeof(hdr), len };

	hdr[0] = (uint8_t)tag;
	memcpy(hdr + 1, &len32, sizeof(len32));
	for (int i = 0; i < 2; i++) {
		for (size_t off = 0; off < sizes[i];) {
			ssize_t w = write(child_fd, parts[i] + off, sizes[i] - off);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				_exit(3); /* the parent went away */
			off += (size_t)w;
		}
	}
}

static void rec_text(char tag, const char *text)
{
	rec_send(tag, text, strlen(text));
}

static void child_result(enum report_kind kind, const char *name, const char *fmt, ...)
	G_GNUC_PRINTF(3, 4);
static void child_result(enum report_kind kind, const char *name, const char *fmt, ...)
{
	g_autofree char *text = NULL;
	GString *rec = g_string_new(NULL);
	va_list ap;

	va_start(ap, fmt);
	text = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	g_string_append_c(rec, (char)kind);
	g_string_append(rec, name);
	g_string_append_c(rec, '\0');
	g_string_append(rec, text);
	rec_send(REC_RESULT, rec->str, rec->len);
	g_string_free(rec, TRUE);
}

/* query_devices as the plugin answered it, before the core clamps and terminates anything. */
static struct {
	struct te_plugin_ops orig;
	bool called;
	enum te_status st;
	uint32_t max, n;
	struct te_plugin_device raw[CONF_MAX_DEVICES];
} qd;

static enum te_status wrap_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				struct te_plugin_inst **inst_out)
{
	rec_text(REC_OP, "init");
	return qd.orig.init(host, ctx, inst_out);
}

static enum te_status wrap_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	rec_text(REC_OP, "query_caps");
	return qd.orig.query_caps(inst, caps);
}

static enum te_status wrap_query_devices(struct te_plugin_inst *inst,
					 struct te_plugin_device *devices, uint32_t max,
					 uint32_t *n_out)
{
	uint32_t n = 0;

	rec_text(REC_OP, "query_devices");
	qd.st = qd.orig.query_devices(inst, devices, max, &n);
	qd.called = true;
	qd.max = max;
	qd.n = n;
	memcpy(qd.raw, devices, MIN(max, CONF_MAX_DEVICES) * sizeof(devices[0]));
	if (qd.st == TE_OK)
		*n_out = MIN(n, max);
	return qd.st;
}

#define KNOWN_MEM (TE_PLUGIN_MEM_CPU | TE_PLUGIN_MEM_CUDA | TE_PLUGIN_MEM_HIP | TE_PLUGIN_MEM_CXL)

static void check_caps(const struct te_plugin_caps *c)
{
	GString *bad = g_string_new(NULL);

#define BAD(...)                                                                                   \
	do {                                                                                       \
		g_string_append_printf(bad, "%s", bad->len ? "; " : "");                           \
		g_string_append_printf(bad, __VA_ARGS__);                                          \
	} while (0)
	if (c->size != sizeof(*c))
		BAD("caps->size was changed to %u (the core set it; the plugin only fills)",
		    c->size);
	if (!c->ops || (c->ops & ~(TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE)))
		BAD("ops 0x%x: want READ and/or WRITE, nothing else", c->ops);
	if (!c->mem_types || (c->mem_types & ~KNOWN_MEM))
		BAD("mem_types 0x%x: want a non-empty set of TE_PLUGIN_MEM_*", c->mem_types);
	if (c->progress > TE_PLUGIN_PROGRESS_MANUAL)
		BAD("progress %u is neither AUTO nor MANUAL", c->progress);
	if (c->thread_level > TE_PLUGIN_THREAD_MULTI)
		BAD("thread_level %u is neither SERIALIZED nor MULTI", c->thread_level);
	if (c->flags & ~(TE_PLUGIN_CAP_SAME_HOST_ONLY | TE_PLUGIN_CAP_SAME_PROCESS_ONLY |
			 TE_PLUGIN_CAP_FIXED_DEVICES | TE_PLUGIN_CAP_HYBRID_PROGRESS |
			 TE_PLUGIN_CAP_HYBRID_PER_THREAD))
		BAD("flags 0x%x has unknown bits", c->flags);
	if (c->slice_priv_size > TE_PLUGIN_SLICE_PRIV_MAX)
		BAD("slice_priv_size %u is over TE_PLUGIN_SLICE_PRIV_MAX (%u)", c->slice_priv_size,
		    TE_PLUGIN_SLICE_PRIV_MAX);
	if (c->max_devices > TE_PLUGIN_MAX_DEVICES)
		BAD("max_devices %u is over TE_PLUGIN_MAX_DEVICES (%u)", c->max_devices,
		    TE_PLUGIN_MAX_DEVICES);
	if (c->max_slice_size && c->default_slice_size > c->max_slice_size)
		BAD("default_slice_size %" PRIu64 " is over max_slice_size %" PRIu64,
		    c->default_slice_size, c->max_slice_size);
	if (c->owned_mem_types & ~(KNOWN_MEM & ~TE_PLUGIN_MEM_CPU))
		BAD("owned_mem_types 0x%x: only device kinds can be owned", c->owned_mem_types);
	if (c->staged_mem_types & ~KNOWN_MEM)
		BAD("staged_mem_types 0x%x has unknown bits", c->staged_mem_types);
	if (c->alloc_mem_types & ~c->mem_types)
		BAD("alloc_mem_types 0x%x is not within mem_types 0x%x", c->alloc_mem_types,
		    c->mem_types);
#undef BAD
	if (bad->len)
		child_result(REPORT_FAIL, "abi-caps", "%s", bad->str);
	else
		child_result(REPORT_OK, "abi-caps",
			     "(mem 0x%x, ops 0x%x, %s, %s, max slice %" PRIu64 ", %u B private)",
			     c->mem_types, c->ops, c->progress ? "manual" : "auto",
			     c->thread_level ? "multi" : "serialized", c->max_slice_size,
			     c->slice_priv_size);
	g_string_free(bad, TRUE);
}

static void check_devices(const struct te_plugin_caps *c)
{
	GString *bad = g_string_new(NULL);
	uint32_t allowed = c->mem_types | c->owned_mem_types | c->staged_mem_types;
	uint32_t n;

	if (!qd.called) {
		child_result(REPORT_OK, "abi-devices", "(no query_devices: no device)");
		g_string_free(bad, TRUE);
		return;
	}
	if (qd.st == TE_ERR_UNSUPPORTED) {
		child_result(REPORT_OK, "abi-devices", "(query_devices: UNSUPPORTED, no device)");
		g_string_free(bad, TRUE);
		return;
	}
	if (qd.n > qd.max)
		g_string_append_printf(bad,
				       "; query_devices reported %u devices, more than the %u "
				       "asked for",
				       qd.n, qd.max);
	if (qd.n > c->max_devices)
		g_string_append_printf(bad, "; %u devices, more than caps.max_devices %u", qd.n,
				       c->max_devices);
	n = MIN(qd.n, MIN(qd.max, CONF_MAX_DEVICES));
	for (uint32_t d = 0; d < n; d++) {
		const struct te_plugin_device *dv = &qd.raw[d];

		if (dv->size != sizeof(*dv))
			g_string_append_printf(bad, "; device %u: size changed to %u", d, dv->size);
		if (!memchr(dv->name, '\0', sizeof(dv->name)))
			g_string_append_printf(bad, "; device %u: name not NUL-terminated", d);
		else if (!dv->name[0])
			g_string_append_printf(bad, "; device %u: empty name", d);
		if (!memchr(dv->pci, '\0', sizeof(dv->pci)))
			g_string_append_printf(bad, "; device %u: pci not NUL-terminated", d);
		if (dv->numa_node < -1)
			g_string_append_printf(bad, "; device %u: numa_node %d", d, dv->numa_node);
		if (dv->mem_types & ~allowed)
			g_string_append_printf(bad,
					       "; device %u: mem_types 0x%x beyond the caps' 0x%x",
					       d, dv->mem_types, allowed);
		for (uint32_t e = 0; e < d; e++)
			if (memchr(dv->name, '\0', sizeof(dv->name)) &&
			    strncmp(dv->name, qd.raw[e].name, sizeof(dv->name)) == 0 && dv->name[0])
				g_string_append_printf(bad,
						       "; devices %u and %u are both named '%s'", e,
						       d, dv->name);
	}
	if (bad->len)
		child_result(REPORT_FAIL, "abi-devices", "%s", bad->str + 2);
	else
		child_result(REPORT_OK, "abi-devices", "(%u device%s%s%s)", n, n == 1 ? "" : "s",
			     n ? ": " : "", n ? qd.raw[0].name : "");
	g_string_free(bad, TRUE);
}

/* reg_mem, pack_key (also into a buffer one byte short), dereg_mem on memory of a kind it takes. */
static void check_register(struct transport *t)
{
	const struct te_plugin_caps *c = &t->caps;
	uint8_t keybuf[4096 + 64];
	struct te_plugin_mem *mem = NULL;
	uint32_t kind = 0, ops_kinds;
	size_t len = 0, len2 = 12345, size = 64u << 10;
	void *p = NULL;
	bool from_plugin = false;
	enum te_status st;
	const char *kname;

	/* Host memory if it takes it; else memory of a kind it hands out itself. */
	ops_kinds = c->owned_mem_types | c->alloc_mem_types;
	if (c->mem_types & TE_PLUGIN_MEM_CPU) {
		kind = TE_PLUGIN_MEM_CPU;
	} else {
		for (uint32_t k = TE_PLUGIN_MEM_CUDA; k <= TE_PLUGIN_MEM_CXL; k <<= 1)
			if (ops_kinds & c->mem_types & k) {
				kind = k;
				break;
			}
	}
	if (!kind) {
		child_result(REPORT_SKIP, "abi-register",
			     "no memory te-conformance can make: neither host memory nor a kind "
			     "the plugin allocates (mem_types 0x%x)",
			     c->mem_types);
		return;
	}
	kname = kind == TE_PLUGIN_MEM_CPU    ? "host"
		: kind == TE_PLUGIN_MEM_CUDA ? "cuda"
		: kind == TE_PLUGIN_MEM_HIP  ? "hip"
					     : "cxl";
	if (kind == TE_PLUGIN_MEM_CPU) {
		if (posix_memalign(&p, 4096, size) != 0) {
			child_result(REPORT_SKIP, "abi-register", "no host memory");
			return;
		}
		memset(p, 0, size);
	} else {
		size = 2u << 20;
		rec_text(REC_OP, "mem_alloc");
		st = transport_mem_alloc(t, kind, 0, size, &p);
		if (st != TE_OK) {
			child_result(REPORT_SKIP, "abi-register", "mem_alloc(%s, 2 MiB): %s: %s",
				     kname, te_status_str(st), transport_op_error());
			return;
		}
		from_plugin = true;
	}
	rec_text(REC_OP, "reg_mem");
	st = transport_reg_mem(t, p, size, kind, kind == TE_PLUGIN_MEM_CPU ? -1 : 0,
			       TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE, &mem);
	if (st != TE_OK) {
		child_result(REPORT_FAIL, "abi-register",
			     "reg_mem of %zu bytes of %s memory: %s%s%s", size, kname,
			     te_status_str(st), *transport_op_error() ? ": " : "",
			     transport_op_error());
		goto out_free;
	}
	memset(keybuf, 0xa5, sizeof(keybuf));
	rec_text(REC_OP, "pack_key");
	st = transport_pack_key(t, mem, keybuf, 4096, &len);
	if (st != TE_OK || len > 4096) {
		child_result(REPORT_FAIL, "abi-register",
			     "pack_key into 4096 bytes: %s, length %zu", te_status_str(st), len);
		goto out_dereg;
	}
	for (size_t i = 4096; i < sizeof(keybuf); i++)
		if (keybuf[i] != 0xa5) {
			child_result(REPORT_FAIL, "abi-register",
				     "pack_key wrote past its capacity of 4096 bytes");
			goto out_dereg;
		}
	if (len > 0) {
		memset(keybuf, 0xa5, sizeof(keybuf));
		rec_text(REC_OP, "pack_key");
		st = transport_pack_key(t, mem, keybuf, len - 1, &len2);
		if (st != TE_ERR_TOO_LARGE) {
			child_result(REPORT_FAIL, "abi-register",
				     "pack_key with %zu bytes for a %zu-byte key answered %s, not "
				     "TE_ERR_TOO_LARGE",
				     len - 1, len, te_status_str(st));
			goto out_dereg;
		}
		for (size_t i = len - 1; i < sizeof(keybuf); i++)
			if (keybuf[i] != 0xa5) {
				child_result(REPORT_FAIL, "abi-register",
					     "pack_key with %zu bytes wrote past them", len - 1);
				goto out_dereg;
			}
		if (len2 != 12345) {
			child_result(REPORT_FAIL, "abi-register",
				     "pack_key wrote *len_out although it failed");
			goto out_dereg;
		}
	}
	rec_text(REC_OP, "dereg_mem");
	st = transport_dereg_mem(t, mem);
	mem = NULL;
	if (st != TE_OK)
		child_result(REPORT_FAIL, "abi-register", "dereg_mem: %s", te_status_str(st));
	else
		child_result(
			REPORT_OK, "abi-register",
			"(%s memory: reg_mem, a %zu-byte key, TE_ERR_TOO_LARGE one byte short, "
			"dereg_mem)",
			kname, len);
out_dereg:
	if (mem) {
		rec_text(REC_OP, "dereg_mem");
		(void)transport_dereg_mem(t, mem);
	}
out_free:
	if (from_plugin) {
		rec_text(REC_OP, "mem_free");
		(void)transport_mem_free(t, p);
	} else {
		free(p);
	}
}

static void child_main(const struct conf *c)
{
	const struct te_plugin_desc *d1, *d2;
	struct plugin *plugin = NULL;
	struct transport *t = NULL;
	struct config *cfg = NULL;
	te_plugin_entry_fn entry;
	g_autofree char *err = NULL;
	g_autofree char *stem = NULL;
	g_autofree char *extra = NULL;
	g_autofree char *yaml = NULL;
	struct abi_info info;
	enum te_status st;
	void *dl;

	rec_text(REC_BEGIN, "abi-load");
	rec_text(REC_OP, "dlopen");
	dl = dlopen(c->plugin, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!dl) {
		child_result(REPORT_FAIL, "abi-load", "dlopen: %s", dlerror());
		return;
	}
	*(void **)&entry = dlsym(dl, TE_PLUGIN_ENTRY_NAME);
	if (!entry) {
		for (int major = 0; major < 16; major++) {
			char sym[32];

			g_snprintf(sym, sizeof(sym), "te_plugin_entry_v%d", major);
			if (major != TE_PLUGIN_ABI_MAJOR && dlsym(dl, sym)) {
				child_result(REPORT_FAIL, "abi-load",
					     "exports %s, not %s: built for ABI major %d", sym,
					     TE_PLUGIN_ENTRY_NAME, major);
				return;
			}
		}
		child_result(REPORT_FAIL, "abi-load", "no %s symbol: not a te plugin",
			     TE_PLUGIN_ENTRY_NAME);
		return;
	}
	child_result(REPORT_OK, "abi-load", "%s", "");

	rec_text(REC_BEGIN, "abi-entry-stable");
	rec_text(REC_OP, TE_PLUGIN_ENTRY_NAME);
	d1 = entry();
	d2 = entry();
	if (d1 != d2)
		child_result(REPORT_FAIL, "abi-entry-stable",
			     "two calls returned different descriptors (%p, %p): the entry point "
			     "must return a static descriptor and do nothing else",
			     (const void *)d1, (const void *)d2);
	else
		child_result(REPORT_OK, "abi-entry-stable", "%s", "");

	rec_text(REC_BEGIN, "abi-descriptor");
	rec_text(REC_OP, "open");
	st = plugin_open_file(c->plugin, &plugin, &err);
	if (st != TE_OK) {
		child_result(REPORT_FAIL, "abi-descriptor", "%s (%s)", err, te_status_str(st));
		return;
	}
	child_result(REPORT_OK, "abi-descriptor", "(%s %s, ABI %u.%u%s)", plugin->name,
		     plugin->desc->version ? plugin->desc->version : "", plugin->desc->abi_major,
		     plugin->desc->abi_minor, plugin->n_options ? ", declared options" : "");

	rec_text(REC_BEGIN, "abi-name");
	stem = plugin_file_stem(c->plugin);
	if (strcmp(stem, plugin->name) != 0)
		child_result(REPORT_FAIL, "abi-name",
			     "descriptor name \"%s\" differs from the file stem \"%s\" (engines "
			     "find <name>.so along the search path)",
			     plugin->name, stem);
	else
		child_result(REPORT_OK, "abi-name", "%s", "");

	rec_text(REC_BEGIN, "abi-exports");
	extra = plugin_extra_exports(c->plugin, false);
	if (extra)
		child_result(REPORT_FAIL, "abi-exports", "exports symbols besides %s: %s",
			     TE_PLUGIN_ENTRY_NAME, extra);
	else
		child_result(REPORT_OK, "abi-exports", "%s", "");

	/* The options as an engine would hand them over: the same YAML, the core's checks. */
	rec_text(REC_BEGIN, "abi-options");
	g_clear_pointer(&err, g_free);
	if (!options_select(c->opts, plugin->name, &err)) {
		child_result(REPORT_FAIL, "abi-options", "%s", err);
		goto out;
	}
	yaml = options_yaml(c->opts, plugin->name, c->plugin, NULL);
	st = config_parse(yaml, strlen(yaml), c->config ? c->config : "<no --config>", &cfg, &err);
	if (st == TE_OK)
		st = plugin_apply_options(plugin, cfg, 0, &err);
	if (st != TE_OK) {
		child_result(REPORT_FAIL, "abi-options", "%s", err);
		goto out;
	}
	child_result(REPORT_OK, "abi-options", "(%zu option%s)", cfg->transports[0].n_options,
		     cfg->transports[0].n_options == 1 ? "" : "s");

	rec_text(REC_BEGIN, "abi-init");
	qd.orig = plugin->ops;
	plugin->ops.init = wrap_init;
	plugin->ops.query_caps = wrap_query_caps;
	plugin->ops.query_devices = wrap_query_devices;
	g_clear_pointer(&err, g_free);
	st = transport_start(NULL, plugin, &host_services, &cfg->transports[0], 0, &t, &err);
	if (st != TE_OK) {
		child_result(REPORT_FAIL, "abi-init", "%s", err ? err : te_status_str(st));
		goto out;
	}
	child_result(REPORT_OK, "abi-init", "%s", "");

	rec_text(REC_BEGIN, "abi-caps");
	check_caps(&t->caps);
	rec_text(REC_BEGIN, "abi-devices");
	check_devices(&t->caps);
	rec_text(REC_BEGIN, "abi-register");
	check_register(t);

	memset(&info, 0, sizeof(info));
	g_strlcpy(info.name, plugin->name, sizeof(info.name));
	info.caps = t->caps;
	info.n_devices = t->n_devices;

	rec_text(REC_BEGIN, "abi-fini");
	rec_text(REC_OP, "fini");
	transport_stop(t);
	child_result(REPORT_OK, "abi-fini", "%s", "");
	rec_send(REC_INFO, &info, sizeof(info));
out:
	config_free(cfg);
	rec_text(REC_OP, "dlclose");
	plugin_close(plugin);
}

static const char *signal_name(int sig)
{
	switch (sig) {
	case SIGSEGV:
		return "SIGSEGV";
	case SIGBUS:
		return "SIGBUS";
	case SIGABRT:
		return "SIGABRT";
	case SIGFPE:
		return "SIGFPE";
	case SIGILL:
		return "SIGILL";
	case SIGALRM:
		return "SIGALRM (hung)";
	case SIGKILL:
		return "SIGKILL";
	default:
		return NULL;
	}
}

void abi_run(struct conf *c)
{
	g_autoptr(GByteArray) got = g_byte_array_new();
	g_autofree char *began = NULL, *op = NULL, *last_result = NULL;
	struct abi_info info;
	bool have_info = false;
	int fds[2], status = 0;
	size_t off = 0;
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	if (pipe(fds) != 0 || (pid = fork()) < 0) {
		report_fail("abi-load", "cannot start the probe process: %s", g_strerror(errno));
		return;
	}
	if (pid == 0) {
		static const int crash[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };

		for (size_t i = 0; i < G_N_ELEMENTS(crash); i++)
			signal(crash[i], SIG_DFL);
		close(fds[0]);
		child_fd = fds[1];
		alarm(c->hang_s);
		child_main(c);
		_exit(0);
	}
	close(fds[1]);
	for (;;) {
		uint8_t chunk[4096];
		ssize_t r = read(fds[0], chunk, sizeof(chunk));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		g_byte_array_append(got, chunk, (guint)r);
		/* Print results as they come: a slow op shows where it is. */
		while (got->len - off >= 1 + sizeof(uint32_t)) {
			uint8_t tag = got->data[off];
			uint32_t n;
			const char *data;

			memcpy(&n, got->data + off + 1, sizeof(n));
			if (n > got->len - off - 1 - sizeof(n))
				break;
			data = (const char *)got->data + off + 1 + sizeof(n);
			off += 1 + sizeof(n) + n;
			if (tag == REC_BEGIN) {
				g_free(began);
				began = g_strndup(data, n);
				g_clear_pointer(&op, g_free);
			} else if (tag == REC_OP) {
				g_free(op);
				op = g_strndup(data, n);
			} else if (tag == REC_RESULT && n >= 2) {
				/* kind byte, name, NUL, text: NUL-terminated copies of each. */
				g_autofree char *rec = g_malloc0(n + 1);
				const char *name, *text;

				memcpy(rec, data, n);
				name = rec + 1;
				text = name + strlen(name) < rec + n ? name + strlen(name) + 1 : "";
				report((enum report_kind)rec[0], name, "%s", text);
				g_free(last_result);
				last_result = g_strdup(name);
			} else if (tag == REC_INFO && n == sizeof(info)) {
				memcpy(&info, data, sizeof(info));
				have_info = true;
			}
		}
	}
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		g_autofree char *how = NULL;
		const char *where =
			began && g_strcmp0(began, last_result) != 0 ? began : "abi-probe";

		if (WIFSIGNALED(status) && signal_name(WTERMSIG(status)))
			how = g_strdup_printf("crashed with %s", signal_name(WTERMSIG(status)));
		else if (WIFSIGNALED(status))
			how = g_strdup_printf("crashed with signal %d", WTERMSIG(status));
		else
			how = g_strdup_printf("exited with status %d", WEXITSTATUS(status));
		report_fail(where, "the probe process %s in %s", how, op ? op : "te-conformance");
		have_info = false;
	}
	if (!have_info)
		return;
	info.name[sizeof(info.name) - 1] = '\0';
	c->name = g_strdup(info.name);
	c->caps = info.caps;
	c->n_devices = info.n_devices;
	c->abi_ready = true;
}
