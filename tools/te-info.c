/* SPDX-License-Identifier: Apache-2.0 */
/* te-info: list the transport plugins te can find (ABI, caps, devices) and check a config. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <json-glib/json-glib.h>
#include <yaml.h>

#include <te/te_plugin.h>
#include <te/te_status.h>

#include "core/config.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/host.h"
#include "core/metadata/metadata.h"
#include "core/plugin.h"
#include "core/transport.h"
#include "te_build_config.h"

/* One declared option of a module (te_plugin.h, "Declared options"), as the child sent it. */
struct probe_option {
	char *name;
	uint32_t type; /* enum te_plugin_option_type */
	uint32_t flags;
	int64_t min, max;
	char *def;	/* NULL: none */
	char *help;	/* NULL: none */
	char **choices; /* NULL-terminated; NULL unless CHOICE */
};

static void probe_option_free(gpointer data)
{
	struct probe_option *o = data;

	g_free(o->name);
	g_free(o->def);
	g_free(o->help);
	g_strfreev(o->choices);
	g_free(o);
}

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
	/* Declared options (struct probe_option *); empty when it declares none. */
	GPtrArray *options;
	/* Copied from the transport when init == TE_OK. */
	struct te_plugin_caps caps;
	struct te_plugin_device devices[TRANSPORT_MAX_DEVICES];
	uint32_t n_devices;
	/* Findings on a module that loads: one line each. */
	GPtrArray *warnings; /* char * */
	GPtrArray *errors;   /* char * */
	/* The probe process died: by crash_signal (0: it exited) in crash_op. */
	bool crashed;
	int crash_signal;
	char *crash_op;
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
	g_ptr_array_unref(p->warnings);
	g_ptr_array_unref(p->errors);
	g_ptr_array_unref(p->options);
	g_free(p->crash_op);
	g_free(p);
}

static struct probe *probe_new(const char *path)
{
	struct probe *p = g_new0(struct probe, 1);

	p->path = g_strdup(path);
	p->warnings = g_ptr_array_new_with_free_func(g_free);
	p->errors = g_ptr_array_new_with_free_func(g_free);
	p->options = g_ptr_array_new_with_free_func(probe_option_free);
	return p;
}

/*
 * --- probing in a child process ----------------------------------------------------------
 *
 * A module may crash in init, a query or fini; te-info must still report it and go on. Each
 * module is probed in a forked child that streams records to the parent over a pipe: the name
 * of the op it is about to call, then what it learned. The parent rebuilds the probe from
 * them, so whatever was sent before a crash is kept.
 */

enum probe_rec {
	REC_OP = 'o',	   /* text: the op the child is about to run */
	REC_LOAD = 'L',	   /* struct rec_load */
	REC_NAME = 'n',	   /* text */
	REC_VERSION = 'v', /* text */
	REC_DESC = 'd',	   /* text */
	REC_ERROR = 'e',   /* text: p->error */
	REC_INIT = 'I',	   /* struct rec_init */
	REC_WARNING = 'w', /* text: a warning finding */
	REC_FINDING = 'x', /* text: an error finding */
	REC_OPTION = 'O',  /* GVariant OPTION_VARIANT: one declared option */
};

/* name, type, flags, min, max, default, help, choices ("" / [] where absent: see flags). */
#define OPTION_VARIANT "(suuxxmsmsas)"

struct rec_load {
	int32_t load;
	uint32_t abi_major;
	uint32_t abi_minor;
};

struct rec_init {
	int32_t init;
	uint32_t n_devices;
	struct te_plugin_caps caps;
	struct te_plugin_device devices[TRANSPORT_MAX_DEVICES];
};

/* Records are tag (1 byte), length (uint32_t, host order), then the bytes. */
static void rec_send(int fd, char tag, const void *data, size_t len)
{
	uint8_t hdr[1 + sizeof(uint32_t)];
	uint32_t len32 = (uint32_t)len;
	const uint8_t *parts[2] = { hdr, data };
	size_t sizes[2] = { sizeof(hdr), len };

	hdr[0] = (uint8_t)tag;
	memcpy(hdr + 1, &len32, sizeof(len32));
	for (int i = 0; i < 2; i++) {
		size_t off = 0;

		while (off < sizes[i]) {
			ssize_t w = write(fd, parts[i] + off, sizes[i] - off);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				return; /* the parent went away: nothing to report to */
			off += (size_t)w;
		}
	}
}

static void rec_text(int fd, char tag, const char *text)
{
	rec_send(fd, tag, text, strlen(text));
}

/*
 * The child's view of the module under probe. A global because the op wrappers below get only
 * the plugin's arguments; it exists in the child process only, one module per process.
 */
static struct {
	int fd;
	struct te_plugin_ops orig; /* the core's copy of the ops, before wrapping */
	bool too_many;		   /* query_devices reported more than it was asked for */
	uint32_t reported;
	uint32_t asked;
	enum te_status init_status; /* what the plugin's own init returned */
} child;

static enum te_status wrap_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				struct te_plugin_inst **inst_out)
{
	rec_text(child.fd, REC_OP, "init");
	child.init_status = child.orig.init(host, ctx, inst_out);
	return child.init_status;
}

static void wrap_fini(struct te_plugin_inst *inst)
{
	rec_text(child.fd, REC_OP, "fini");
	child.orig.fini(inst);
}

static enum te_status wrap_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	rec_text(child.fd, REC_OP, "query_caps");
	return child.orig.query_caps(inst, caps);
}

static enum te_status wrap_query_devices(struct te_plugin_inst *inst,
					 struct te_plugin_device *devices, uint32_t max,
					 uint32_t *n_out)
{
	struct te_plugin_device blank;
	enum te_status st;
	uint32_t n = 0, filled = 0;

	rec_text(child.fd, REC_OP, "query_devices");
	st = child.orig.query_devices(inst, devices, max, &n);
	if (st != TE_OK || n <= max) {
		if (st == TE_OK)
			*n_out = n;
		return st;
	}
	/*
	 * The core clamps such a count to @max and would list blank entries: keep only the
	 * leading entries the plugin did write (the core handed them zeroed, size set).
	 */
	child.too_many = true;
	child.reported = n;
	child.asked = max;
	memset(&blank, 0, sizeof(blank));
	blank.size = sizeof(blank);
	while (filled < max && memcmp(&devices[filled], &blank, sizeof(blank)) != 0)
		filled++;
	*n_out = filled;
	return TE_OK;
}

/* In the child: probe @path and send what it learns to @fd. */
static void probe_child(int fd, const char *path)
{
	struct plugin *plugin = NULL;
	struct transport *t = NULL;
	g_autofree char *err = NULL;
	g_autofree char *stem = NULL;
	g_autofree char *extra = NULL;
	struct config_transport ct = { 0 };
	struct rec_load rl = { 0 };
	struct rec_init *ri;
	enum te_status st;

	child.fd = fd;
	rec_text(fd, REC_OP, "open");
	st = plugin_open_file(path, &plugin, &err);
	rl.load = st;
	if (st != TE_OK) {
		rec_send(fd, REC_LOAD, &rl, sizeof(rl));
		rec_text(fd, REC_ERROR, err ? err : te_status_str(st));
		return;
	}
	rl.abi_major = plugin->desc->abi_major;
	rl.abi_minor = plugin->desc->abi_minor;
	rec_send(fd, REC_LOAD, &rl, sizeof(rl));
	rec_text(fd, REC_NAME, plugin->desc->name ? plugin->desc->name : "");
	rec_text(fd, REC_VERSION, plugin->desc->version ? plugin->desc->version : "");
	rec_text(fd, REC_DESC, plugin->desc->description ? plugin->desc->description : "");

	/* The engine finds a plugin by its file stem and knows it by its descriptor name. */
	stem = plugin_file_stem(path);
	if (strcmp(stem, plugin->desc->name ? plugin->desc->name : "") != 0) {
		g_autofree char *w = g_strdup_printf(
			"descriptor name \"%s\" does not match the file stem \"%s\"",
			plugin->desc->name ? plugin->desc->name : "", stem);

		rec_text(fd, REC_WARNING, w);
	}
	extra = plugin_extra_exports(path, true);
	if (extra) {
		g_autofree char *w =
			g_strdup_printf("exports symbols besides the entry point: %s", extra);

		rec_text(fd, REC_WARNING, w);
	}

	/* The declarations (checked by plugin_open_file), before anything of the plugin runs. */
	for (uint32_t i = 0; i < plugin->n_options; i++) {
		static const char *const no_choices[] = { NULL };
		const struct te_plugin_option *o = &plugin->options[i];
		g_autoptr(GVariant) v = g_variant_ref_sink(
			g_variant_new("(suuxxmsms^as)", o->name, o->type, o->flags, (gint64)o->min,
				      (gint64)o->max, o->default_value, o->help,
				      o->type == TE_PLUGIN_OPT_CHOICE ? o->choices : no_choices));

		rec_send(fd, REC_OPTION, g_variant_get_data(v), g_variant_get_size(v));
	}
	/* Declared options reach init with their defaults, as they would in an engine. */
	if (plugin->n_options) {
		ct.name = g_strdup(plugin->name);
		if (config_transport_apply(&ct, "<te-info>", 0, plugin->name, plugin->options,
					   plugin->n_options, false, NULL) != TE_OK)
			config_transport_clear(&ct); /* cannot happen: defaults were checked */
	}

	/* plugin->ops is the core's own copy: wrap the ops the start calls, to name them. */
	child.orig = plugin->ops;
	plugin->ops.init = wrap_init;
	plugin->ops.fini = wrap_fini;
	plugin->ops.query_caps = wrap_query_caps;
	if (plugin->ops.query_devices)
		plugin->ops.query_devices = wrap_query_devices;

	/* No engine and no YAML: the plugin's defaults, logs to stderr. */
	ri = g_new0(struct rec_init, 1);
	g_clear_pointer(&err, g_free);
	st = transport_start(NULL, plugin, &host_services, ct.name ? &ct : NULL, 0, &t, &err);
	ri->init = st;
	if (st == TE_OK) {
		ri->caps = t->caps;
		ri->n_devices = MIN(t->n_devices, (uint32_t)TRANSPORT_MAX_DEVICES);
		memcpy(ri->devices, t->devices, ri->n_devices * sizeof(ri->devices[0]));
	}
	if (child.too_many) {
		g_autofree char *e =
			g_strdup_printf("query_devices reported %" PRIu32
					" devices, more than the %" PRIu32 " asked for",
					child.reported, child.asked);

		rec_text(fd, REC_FINDING, e);
	}
	rec_send(fd, REC_INIT, ri, sizeof(*ri));
	if (st != TE_OK)
		rec_text(fd, REC_ERROR, err ? err : te_status_str(st));
	g_free(ri);
	if (t)
		transport_stop(t);
	rec_text(fd, REC_OP, "close");
	plugin_close(plugin);
	config_transport_clear(&ct);
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
	case SIGTRAP:
		return "SIGTRAP";
	case SIGSYS:
		return "SIGSYS";
	case SIGKILL:
		return "SIGKILL";
	default:
		return NULL;
	}
}

/* One REC_OPTION record: a declared option, in OPTION_VARIANT form. */
static void probe_apply_option(struct probe *p, const uint8_t *data, size_t n)
{
	g_autoptr(GBytes) bytes = g_bytes_new(data, n);
	g_autoptr(GVariant) v = g_variant_ref_sink(
		g_variant_new_from_bytes(G_VARIANT_TYPE(OPTION_VARIANT), bytes, FALSE));
	struct probe_option *o;
	gint64 min, max;

	/* Serialized by the child from checked declarations; still never trust the bytes. */
	if (!g_variant_is_normal_form(v))
		return;
	o = g_new0(struct probe_option, 1);
	g_variant_get(v, OPTION_VARIANT, &o->name, &o->type, &o->flags, &min, &max, &o->def,
		      &o->help, NULL);
	o->min = min;
	o->max = max;
	if (o->type == TE_PLUGIN_OPT_CHOICE) {
		g_autoptr(GVariant) c = g_variant_get_child_value(v, 7);

		o->choices = g_variant_dup_strv(c, NULL);
	}
	g_ptr_array_add(p->options, o);
}

/* Rebuild @p from the child's records; a truncated last record is dropped. */
static void probe_apply(struct probe *p, const uint8_t *buf, size_t len, bool *have_load,
			bool *have_init)
{
	size_t off = 0;

	while (len - off >= 1 + sizeof(uint32_t)) {
		uint8_t tag = buf[off];
		uint32_t n;
		const uint8_t *data;
		char *text;

		memcpy(&n, buf + off + 1, sizeof(n));
		off += 1 + sizeof(n);
		if (n > len - off)
			break;
		data = buf + off;
		off += n;
		if (tag == REC_LOAD || tag == REC_INIT) {
			if (tag == REC_LOAD && n == sizeof(struct rec_load)) {
				struct rec_load rl;

				memcpy(&rl, data, sizeof(rl));
				p->load = rl.load;
				p->abi_major = rl.abi_major;
				p->abi_minor = rl.abi_minor;
				*have_load = true;
			} else if (tag == REC_INIT && n == sizeof(struct rec_init)) {
				struct rec_init *ri = g_memdup2(data, sizeof(*ri));

				p->init = ri->init;
				if (ri->init == TE_OK) {
					p->caps = ri->caps;
					p->n_devices =
						MIN(ri->n_devices, (uint32_t)TRANSPORT_MAX_DEVICES);
					memcpy(p->devices, ri->devices,
					       p->n_devices * sizeof(p->devices[0]));
				}
				/* Plugin-filled text: never trust it to be terminated. */
				for (uint32_t d = 0; d < p->n_devices; d++) {
					p->devices[d].name[sizeof(p->devices[d].name) - 1] = '\0';
					p->devices[d].pci[sizeof(p->devices[d].pci) - 1] = '\0';
				}
				*have_init = true;
				g_free(ri);
			}
			continue;
		}
		if (tag == REC_OPTION) {
			probe_apply_option(p, data, n);
			continue;
		}
		text = g_strndup((const char *)data, n);
		switch (tag) {
		case REC_OP:
			g_free(p->crash_op);
			p->crash_op = text;
			break;
		case REC_NAME:
			g_free(p->name);
			p->name = text;
			break;
		case REC_VERSION:
			g_free(p->version);
			p->version = text;
			break;
		case REC_DESC:
			g_free(p->description);
			p->description = text;
			break;
		case REC_ERROR:
			g_free(p->error);
			p->error = text;
			break;
		case REC_WARNING:
			g_ptr_array_add(p->warnings, text);
			break;
		case REC_FINDING:
			g_ptr_array_add(p->errors, text);
			break;
		default:
			g_free(text);
			break;
		}
	}
}

static void probe_run(struct probe *p)
{
	g_autoptr(GByteArray) got = g_byte_array_new();
	bool have_load = false, have_init = false;
	g_autofree char *why = NULL;
	uint8_t chunk[4096];
	int fds[2], status = 0;
	pid_t pid;

	p->load = TE_ERR_PLUGIN_INVALID;
	p->init = TE_ERR_PLUGIN_INIT;
	fflush(stdout);
	fflush(stderr);
	if (pipe(fds) != 0) {
		p->load = TE_ERR_SYSTEM;
		p->error = g_strdup_printf("pipe: %s", g_strerror(errno));
		return;
	}
	pid = fork();
	if (pid < 0) {
		p->load = TE_ERR_SYSTEM;
		p->error = g_strdup_printf("fork: %s", g_strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0) {
		/*
		 * A crash is reported by the signal that ended the child: take back the default
		 * action from any handler installed in this process (a sanitizer's turns a
		 * SIGSEGV into an exit status).
		 */
		static const int crash_signals[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };

		for (size_t i = 0; i < G_N_ELEMENTS(crash_signals); i++)
			signal(crash_signals[i], SIG_DFL);
		close(fds[0]);
		probe_child(fds[1], p->path);
		_exit(0);
	}
	close(fds[1]);
	for (;;) {
		ssize_t r = read(fds[0], chunk, sizeof(chunk));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		g_byte_array_append(got, chunk, (guint)r);
	}
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	probe_apply(p, got->data, got->len, &have_load, &have_init);
	if (!p->name)
		p->name = g_strdup("");
	if (!p->version)
		p->version = g_strdup("");
	if (!p->description)
		p->description = g_strdup("");

	if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && have_load)
		return;
	p->crashed = true;
	if (!p->crash_op)
		p->crash_op = g_strdup("open");
	if (WIFSIGNALED(status)) {
		p->crash_signal = WTERMSIG(status);
		if (signal_name(p->crash_signal))
			why = g_strdup_printf("crashed with %s in %s", signal_name(p->crash_signal),
					      p->crash_op);
		else
			why = g_strdup_printf("crashed with signal %d in %s", p->crash_signal,
					      p->crash_op);
	} else {
		why = g_strdup_printf("exited with status %d in %s",
				      WIFEXITED(status) ? WEXITSTATUS(status) : -1, p->crash_op);
	}
	/* Where it died decides where it shows: as the load error, the init error, or later. */
	if (!have_load || p->load != TE_OK) {
		p->load = TE_ERR_PLUGIN_INVALID;
		g_free(p->error);
		p->error = g_steal_pointer(&why);
	} else if (!have_init) {
		p->init = TE_ERR_PLUGIN_INIT;
		g_free(p->error);
		p->error = g_steal_pointer(&why);
	} else {
		g_ptr_array_add(p->errors, g_steal_pointer(&why));
	}
}

struct scan_ctx {
	GPtrArray *probes; /* struct probe * */
	GHashTable *seen;  /* plugin names already found (earlier wins, as in the engine) */
};

static void scan_one(void *user, const char *path)
{
	struct scan_ctx *ctx = user;
	struct probe *p = probe_new(path);

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
		p = probe_new(arg);
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
static const uint32_t cap_bits[] = { TE_PLUGIN_CAP_SAME_HOST_ONLY, TE_PLUGIN_CAP_SAME_PROCESS_ONLY,
				     TE_PLUGIN_CAP_FIXED_DEVICES };
static const char *const cap_names[] = { "same-host-only", "same-process-only", "fixed-devices" };
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

/* --- declared options -------------------------------------------------------------------- */

static const char *option_type_str(uint32_t t)
{
	switch (t) {
	case TE_PLUGIN_OPT_BOOL:
		return "bool";
	case TE_PLUGIN_OPT_INT:
		return "int";
	case TE_PLUGIN_OPT_SIZE:
		return "size";
	case TE_PLUGIN_OPT_STRING:
		return "string";
	case TE_PLUGIN_OPT_CHOICE:
		return "choice";
	default:
		return "unknown";
	}
}

/* A size as the YAML may write it: "64K" for exact multiples of a binary unit. */
static void option_size_str(GString *s, uint64_t v)
{
	static const char units[] = "TGMK";

	for (int i = 0; i < 4; i++) {
		uint64_t mult = 1ull << (10 * (4 - i));

		if (v && v % mult == 0) {
			g_string_append_printf(s, "%" PRIu64 "%c", v / mult, units[i]);
			return;
		}
	}
	g_string_append_printf(s, "%" PRIu64, v);
}

/* "int 1..16, default 2", "choice (auto, manual), default auto", "string, required". */
static void option_spec(GString *s, const struct probe_option *o)
{
	bool ranged = (o->type == TE_PLUGIN_OPT_INT || o->type == TE_PLUGIN_OPT_SIZE) &&
		      (o->min != 0 || o->max != 0);

	g_string_append(s, option_type_str(o->type));
	if (ranged && o->type == TE_PLUGIN_OPT_SIZE) {
		g_string_append_c(s, ' ');
		option_size_str(s, (uint64_t)o->min);
		g_string_append(s, "..");
		option_size_str(s, (uint64_t)o->max);
	} else if (ranged) {
		g_string_append_printf(s, " %" PRId64 "..%" PRId64, o->min, o->max);
	}
	if (o->choices) {
		g_autofree char *list = g_strjoinv(", ", o->choices);

		g_string_append_printf(s, " (%s)", list);
	}
	if (o->flags & TE_PLUGIN_OPT_REQUIRED)
		g_string_append(s, ", required");
	else if (!o->def)
		g_string_append(s, ", no default");
	else if (o->type == TE_PLUGIN_OPT_STRING)
		g_string_append_printf(s, ", default \"%s\"", o->def);
	else
		g_string_append_printf(s, ", default %s", o->def);
}

static void print_options(const struct probe *p)
{
	g_autoptr(GString) s = g_string_new(NULL);

	if (!p->options->len) {
		printf("  options:  none declared (free-form)\n");
		return;
	}
	printf("  options:  %u declared\n", p->options->len);
	for (guint i = 0; i < p->options->len; i++) {
		const struct probe_option *o = p->options->pdata[i];

		g_string_truncate(s, 0);
		option_spec(s, o);
		printf("    %s: %s%s%s\n", o->name, s->str, o->help ? " -- " : "",
		       o->help ? o->help : "");
	}
}

static void json_options(JsonBuilder *b, const struct probe *p)
{
	json_builder_set_member_name(b, "options_declared");
	json_builder_add_boolean_value(b, p->options->len > 0);
	json_builder_set_member_name(b, "options");
	json_builder_begin_array(b);
	for (guint i = 0; i < p->options->len; i++) {
		const struct probe_option *o = p->options->pdata[i];

		json_builder_begin_object(b);
		json_builder_set_member_name(b, "name");
		json_builder_add_string_value(b, o->name);
		json_builder_set_member_name(b, "type");
		json_builder_add_string_value(b, option_type_str(o->type));
		json_builder_set_member_name(b, "default");
		if (o->def)
			json_builder_add_string_value(b, o->def);
		else
			json_builder_add_null_value(b);
		if ((o->type == TE_PLUGIN_OPT_INT || o->type == TE_PLUGIN_OPT_SIZE) &&
		    (o->min != 0 || o->max != 0)) {
			json_builder_set_member_name(b, "min");
			json_builder_add_int_value(b, o->min);
			json_builder_set_member_name(b, "max");
			json_builder_add_int_value(b, o->max);
		}
		if (o->choices) {
			json_builder_set_member_name(b, "choices");
			json_builder_begin_array(b);
			for (char **c = o->choices; *c; c++)
				json_builder_add_string_value(b, *c);
			json_builder_end_array(b);
		}
		json_builder_set_member_name(b, "required");
		json_builder_add_boolean_value(b, (o->flags & TE_PLUGIN_OPT_REQUIRED) != 0);
		json_builder_set_member_name(b, "help");
		if (o->help)
			json_builder_add_string_value(b, o->help);
		else
			json_builder_add_null_value(b);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
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
		for (guint k = 0; k < p->warnings->len; k++)
			printf("  warning:  %s\n", (const char *)p->warnings->pdata[k]);
		for (guint k = 0; k < p->errors->len; k++)
			printf("  error:    %s\n", (const char *)p->errors->pdata[k]);
		print_options(p);
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

static void json_strings(JsonBuilder *b, const char *member, GPtrArray *a)
{
	json_builder_set_member_name(b, member);
	json_builder_begin_array(b);
	for (guint i = 0; i < a->len; i++)
		json_builder_add_string_value(b, a->pdata[i]);
	json_builder_end_array(b);
}

/* Members only for a module with findings: a good module's object stays as it was. */
static void json_findings(JsonBuilder *b, const struct probe *p)
{
	if (p->warnings->len)
		json_strings(b, "warnings", p->warnings);
	if (p->errors->len)
		json_strings(b, "errors", p->errors);
	if (p->crashed) {
		json_builder_set_member_name(b, "crashed");
		json_builder_begin_object(b);
		if (p->crash_signal && signal_name(p->crash_signal))
			json_string(b, "signal", signal_name(p->crash_signal));
		else if (p->crash_signal)
			json_int(b, "signal", p->crash_signal);
		json_string(b, "op", p->crash_op);
		json_builder_end_object(b);
	}
}

static void json_probe(JsonBuilder *b, const struct probe *p)
{
	json_builder_begin_object(b);
	json_string(b, "path", p->path);
	if (p->load != TE_OK) {
		json_string(b, "status", te_status_str(p->load));
		json_int(b, "code", p->load);
		json_string(b, "error", p->error);
		json_findings(b, p);
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
	json_findings(b, p);
	json_options(b, p);
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

/* --- YAML: positions of keys, and the effective configuration as JSON ------------------------ */

/* Parse @len bytes of YAML @text into @doc (yaml_document_delete); false when it has none. */
static bool yaml_doc_load(const char *text, size_t len, yaml_document_t *doc)
{
	yaml_parser_t parser;
	bool ok;

	if (!yaml_parser_initialize(&parser))
		return false;
	yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
	ok = yaml_parser_load(&parser, doc) != 0;
	yaml_parser_delete(&parser);
	if (ok && !yaml_document_get_root_node(doc)) {
		yaml_document_delete(doc);
		ok = false;
	}
	return ok;
}

/* The value of @key in mapping @map, or NULL. */
static yaml_node_t *yaml_member(yaml_document_t *doc, yaml_node_t *map, const char *key,
				size_t key_len)
{
	if (!map || map->type != YAML_MAPPING_NODE)
		return NULL;
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(doc, p->key);

		if (k && k->type == YAML_SCALAR_NODE && k->data.scalar.length == key_len &&
		    memcmp(k->data.scalar.value, key, key_len) == 0)
			return yaml_document_get_node(doc, p->value);
	}
	return NULL;
}

/* The node at key path @path ("engine.listen", "transports[1].options.bind"), or NULL. */
static yaml_node_t *yaml_find(yaml_document_t *doc, const char *path)
{
	yaml_node_t *n = yaml_document_get_root_node(doc);
	const char *s = path;

	while (n && *s) {
		size_t len = strcspn(s, ".[");

		if (len) {
			n = yaml_member(doc, n, s, len);
			s += len;
		}
		while (n && *s == '[') {
			char *end;
			unsigned long i = strtoul(s + 1, &end, 10);

			if (*end != ']' || n->type != YAML_SEQUENCE_NODE ||
			    i >= (unsigned long)(n->data.sequence.items.top -
						 n->data.sequence.items.start))
				return NULL;
			n = yaml_document_get_node(doc, n->data.sequence.items.start[i]);
			s = end + 1;
		}
		if (*s == '.')
			s++;
		else if (*s)
			return NULL;
	}
	return n;
}

/* true: @v is one of te's boolean words (docs/config.md), its value in *out. */
static bool yaml_bool_word(const char *v, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on" }, *const no[] = { "false", "no",
										  "off" };

	for (size_t i = 0; i < G_N_ELEMENTS(yes); i++) {
		if (g_ascii_strcasecmp(v, yes[i]) == 0 || g_ascii_strcasecmp(v, no[i]) == 0) {
			*out = g_ascii_strcasecmp(v, yes[i]) == 0;
			return true;
		}
	}
	return false;
}

/*
 * @n as JSON: mappings as objects, sequences as arrays; a plain scalar that reads as null, a
 * boolean or a decimal integer is typed so; every other scalar (quoted ones too) is a string.
 */
static void yaml_to_json(JsonBuilder *b, yaml_document_t *doc, yaml_node_t *n, int depth)
{
	if (!n || depth > 64) {
		json_builder_add_null_value(b);
		return;
	}
	switch (n->type) {
	case YAML_MAPPING_NODE:
		json_builder_begin_object(b);
		for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
		     p < n->data.mapping.pairs.top; p++) {
			yaml_node_t *k = yaml_document_get_node(doc, p->key);

			if (!k || k->type != YAML_SCALAR_NODE)
				continue;
			json_builder_set_member_name(b, (const char *)k->data.scalar.value);
			yaml_to_json(b, doc, yaml_document_get_node(doc, p->value), depth + 1);
		}
		json_builder_end_object(b);
		return;
	case YAML_SEQUENCE_NODE:
		json_builder_begin_array(b);
		for (yaml_node_item_t *i = n->data.sequence.items.start;
		     i < n->data.sequence.items.top; i++)
			yaml_to_json(b, doc, yaml_document_get_node(doc, *i), depth + 1);
		json_builder_end_array(b);
		return;
	case YAML_SCALAR_NODE: {
		const char *v = (const char *)n->data.scalar.value;
		gint64 num;
		bool flag;

		if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
			if (!v[0] || strcmp(v, "~") == 0 || g_ascii_strcasecmp(v, "null") == 0) {
				json_builder_add_null_value(b);
				return;
			}
			if (yaml_bool_word(v, &flag)) {
				json_builder_add_boolean_value(b, flag);
				return;
			}
			if ((g_ascii_isdigit(v[0]) ||
			     ((v[0] == '-' || v[0] == '+') && g_ascii_isdigit(v[1]))) &&
			    g_ascii_string_to_signed(v, 10, G_MININT64, G_MAXINT64, &num, NULL)) {
				json_builder_add_int_value(b, num);
				return;
			}
		}
		json_builder_add_string_value(b, v);
		return;
	}
	default:
		json_builder_add_null_value(b);
		return;
	}
}

/* --- --check ----------------------------------------------------------------------------- */

/*
 * What would stop or cripple an engine started from a file on this host: each check makes
 * one line (ok, note, warning, error); the first error ends the run. Plugins are loaded and
 * initialised in a child process each, as te-info probes them, so a crash is a finding.
 */

enum check_level {
	CHECK_OK = 'o',
	CHECK_NOTE = 'n',
	CHECK_WARNING = 'w',
	CHECK_ERROR = 'e'
};

struct check_line {
	char level; /* enum check_level */
	char *key;  /* the key path it is about */
	char *text; /* the line, without the level */
};

static void check_line_free(gpointer data)
{
	struct check_line *l = data;

	g_free(l->key);
	g_free(l->text);
	g_free(l);
}

struct check {
	const char *file;
	struct config *cfg;
	yaml_document_t doc;
	bool have_doc;
	bool json;
	GPtrArray *lines; /* struct check_line */
	unsigned warnings, errors;
	enum te_status status; /* of the first error */
	char *first_error;
	/* The control plane's address as an engine would report it to plugins (ABI 1.2). */
	char *ctl_bound;
	char *ctl_advertised;
};

/* Child-to-parent records of a transport check (besides REC_OP). */
enum {
	REC_CHECK = 'k',  /* level (1 byte), status (int32), key, NUL, text */
	REC_RESULT = 'r', /* 1 byte: 'L' loaded, 'S' skipped, 'E' error */
};

static const char *check_level_word(char level)
{
	switch (level) {
	case CHECK_OK:
		return "ok";
	case CHECK_NOTE:
		return "note";
	case CHECK_WARNING:
		return "warning";
	default:
		return "error";
	}
}

static void check_add_line(struct check *c, char level, enum te_status st, const char *key,
			   const char *text)
{
	struct check_line *l = g_new0(struct check_line, 1);

	l->level = level;
	l->key = g_strdup(key);
	l->text = g_strdup(text);
	g_ptr_array_add(c->lines, l);
	if (level == CHECK_WARNING)
		c->warnings++;
	if (level == CHECK_ERROR && !c->errors++) {
		c->status = st != TE_OK ? st : TE_ERR_CONFIG;
		c->first_error = g_strdup(text);
	}
	if (!c->json)
		fprintf(stderr, "%s: %s\n", check_level_word(level), text);
}

static void check_add(struct check *c, char level, enum te_status st, const char *key,
		      const char *fmt, ...) G_GNUC_PRINTF(5, 6);
static void check_add(struct check *c, char level, enum te_status st, const char *key,
		      const char *fmt, ...)
{
	g_autofree char *text = NULL;
	va_list ap;

	va_start(ap, fmt);
	text = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	check_add_line(c, level, st, key, text);
}

/* Where @key is in the file: true with its value's 1-based line and column. */
static bool check_pos(struct check *c, const char *key, unsigned *line, unsigned *col)
{
	yaml_node_t *n = c->have_doc ? yaml_find(&c->doc, key) : NULL;

	if (!n)
		return false;
	*line = (unsigned)n->start_mark.line + 1;
	*col = (unsigned)n->start_mark.column + 1;
	return true;
}

/* "<file>:<line>:<col>: <key>" where the file has @key, else "<file>: <key>". */
static char *check_at(struct check *c, const char *key)
{
	unsigned line, col;

	if (check_pos(c, key, &line, &col))
		return g_strdup_printf("%s:%u:%u: %s", c->file, line, col, key);
	return g_strdup_printf("%s: %s", c->file, key);
}

/* An error or warning about @key: "<file>:<line>:<col>: <key>: <reason>". */
static void check_problem(struct check *c, char level, enum te_status st, const char *key,
			  const char *fmt, ...) G_GNUC_PRINTF(5, 6);
static void check_problem(struct check *c, char level, enum te_status st, const char *key,
			  const char *fmt, ...)
{
	g_autofree char *at = check_at(c, key);
	g_autofree char *why = NULL;
	va_list ap;

	va_start(ap, fmt);
	why = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	check_add(c, level, st, key, "%s: %s", at, why);
}

/* @text without a leading "<key>: " (the core's messages often start with their key). */
static const char *strip_key(const char *text, const char *key)
{
	size_t n = strlen(key);

	if (strncmp(text, key, n) == 0 && text[n] == ':' && text[n + 1] == ' ')
		return text + n + 2;
	return text;
}

static void check_secret(struct check *c)
{
	const struct config *cfg = c->cfg;
	g_autofree char *err = NULL;
	char *secret = NULL;
	size_t len = 0;
	enum te_status st;

	if (!cfg->auth_secret_file) {
		if (cfg->auth_secret)
			check_add(c, CHECK_OK, TE_OK, "auth.secret",
				  "auth.secret: inline, %zu bytes (secret_file keeps it out of "
				  "the file)",
				  strlen(cfg->auth_secret));
		else
			check_add(c, CHECK_OK, TE_OK, "auth",
				  "auth: none (no authentication: keep engine.listen on "
				  "loopback)");
		return;
	}
	st = control_secret_load(cfg->auth_secret_file, &secret, &len, &err);
	if (st != TE_OK) {
		check_problem(c, CHECK_ERROR, st, "auth.secret_file", "%s",
			      strip_key(err ? err : te_status_str(st), "auth.secret_file"));
		return;
	}
	explicit_bzero(secret, len);
	g_free(secret);
	check_add(c, CHECK_OK, TE_OK, "auth.secret_file",
		  "auth.secret_file: %s holds %zu bytes, readable by its owner only",
		  cfg->auth_secret_file, len);
}

/* Split "host:port" / "[v6]:port" (engine.listen, already checked by the parser). */
static bool split_hostport(const char *addr, char **host_out, char **port_out)
{
	const char *colon = strrchr(addr, ':');

	if (!colon || colon == addr)
		return false;
	if (addr[0] == '[' && colon[-1] == ']')
		*host_out = g_strndup(addr + 1, (gsize)(colon - addr - 2));
	else
		*host_out = g_strndup(addr, (gsize)(colon - addr));
	*port_out = g_strdup(colon + 1);
	return true;
}

static bool sockaddr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >>
			24) == 127;
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a =
			&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;

		if (IN6_IS_ADDR_LOOPBACK(a))
			return true;
		/* ::ffff:127.x.y.z */
		return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
	}
	return false;
}

/* "host:port", with brackets for an IPv6 host. */
static char *join_hostport(const char *host, const char *port)
{
	if (strchr(host, ':') && host[0] != '[')
		return g_strdup_printf("[%s]:%s", host, port);
	return g_strdup_printf("%s:%s", host, port);
}

/*
 * engine.listen resolves and its host can be bound (port 0: an engine already running on the
 * configured port does not fail the check; a busy port is a note). Sets c->ctl_bound and
 * c->ctl_advertised as the engine would report them to plugins.
 */
static void check_listen(struct check *c)
{
	const struct config *cfg = c->cfg;
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	g_autofree char *host = NULL, *port = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = 0;
	struct addrinfo *res = NULL;
	char numeric[NI_MAXHOST];
	bool wildcard, loopback;
	int rc, err = 0, one = 1;
	unsigned long portnum;

	if (!split_hostport(cfg->listen, &host, &port)) {
		check_problem(c, CHECK_ERROR, TE_ERR_CONFIG, "engine.listen",
			      "invalid address \"%s\"", cfg->listen);
		return;
	}
	portnum = strtoul(port, NULL, 10);
	rc = getaddrinfo(host, "0", &hints, &res);
	if (rc != 0) {
		check_problem(c, CHECK_ERROR, TE_ERR_CONFIG, "engine.listen",
			      "cannot resolve '%s' on this host: %s", host, gai_strerror(rc));
		return;
	}
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);

		if (fd < 0) {
			err = errno;
			continue;
		}
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
			memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
			sl = ai->ai_addrlen;
			close(fd);
			break;
		}
		err = errno;
		close(fd);
	}
	freeaddrinfo(res);
	if (!sl) {
		check_problem(c, CHECK_ERROR, TE_ERR_SYSTEM, "engine.listen",
			      "cannot bind '%s' on this host: %s (an engine would fail to start)",
			      host, g_strerror(err));
		return;
	}
	if (getnameinfo((struct sockaddr *)&ss, sl, numeric, sizeof(numeric), NULL, 0,
			NI_NUMERICHOST) != 0)
		g_strlcpy(numeric, host, sizeof(numeric));
	loopback = sockaddr_is_loopback((struct sockaddr *)&ss);
	wildcard = strcmp(numeric, "0.0.0.0") == 0 || strcmp(numeric, "::") == 0;

	/* The configured port: in use is a note (most likely an engine of this very file). */
	if (portnum) {
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (ss.ss_family == AF_INET6)
			((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)portnum);
		else
			((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)portnum);
		err = 0;
		if (fd >= 0) {
			(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
			if (bind(fd, (struct sockaddr *)&ss, sl) != 0)
				err = errno;
			close(fd);
		}
		if (err == EADDRINUSE) {
			check_add(c, CHECK_NOTE, TE_OK, "engine.listen",
				  "engine.listen: port %lu is in use on %s (an engine of this file "
				  "running already?): a second engine on it would fail to start",
				  portnum, numeric);
		} else if (err) {
			check_problem(c, CHECK_ERROR, TE_ERR_SYSTEM, "engine.listen",
				      "cannot bind %s port %lu on this host: %s (an engine would "
				      "fail to start)",
				      numeric, portnum, g_strerror(err));
			return;
		}
	}
	c->ctl_bound = join_hostport(numeric, port);
	if (cfg->advertise) {
		c->ctl_advertised = join_hostport(cfg->advertise, port);
	} else if (wildcard) {
		g_autofree char *ip = control_first_ipv4();

		c->ctl_advertised = join_hostport(ip ? ip : g_get_host_name(), port);
	} else {
		c->ctl_advertised = g_strdup(c->ctl_bound);
	}
	if (portnum)
		check_add(c, CHECK_OK, TE_OK, "engine.listen",
			  "engine.listen: %s resolves and can be bound on this host (as %s; peers "
			  "are told %s)",
			  cfg->listen, c->ctl_bound, c->ctl_advertised);
	else
		check_add(c, CHECK_OK, TE_OK, "engine.listen",
			  "engine.listen: %s resolves and can be bound on this host (as %s, a port "
			  "chosen at start; peers are told that port on %s)",
			  cfg->listen, numeric,
			  cfg->advertise ? cfg->advertise
			  : wildcard	 ? "this host's first network address"
					 : numeric);
	if (!loopback && !cfg->auth_secret && !cfg->auth_secret_file)
		check_add(c, CHECK_NOTE, TE_OK, "engine.listen",
			  "engine.listen: %s is not loopback and auth is not set: any host that "
			  "reaches it may fetch the descriptor and send handshakes",
			  cfg->listen);
}

/*
 * The child of a transport check: the host services it hands the plugin are the core's, but
 * for the control-plane address (check_listen's) and a log that keeps WARN-or-worse lines.
 */
static struct {
	struct check *c;
	struct te_plugin_host host;
	GPtrArray *logged; /* char *: "<plugin>: <line>", during init */
} chk;

static void check_host_log(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level,
			   const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static void check_host_log(struct te_plugin_host_ctx *ctx, enum te_plugin_log_level level,
			   const char *fmt, ...)
{
	struct transport *tp = (struct transport *)ctx;
	char line[900];
	va_list ap;

	if (level > TE_PLUGIN_LOG_WARN)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* As the core's log does: an init failure quotes the last such line. */
	g_strlcpy(tp->last_log, line, sizeof(tp->last_log));
	if (chk.logged)
		g_ptr_array_add(chk.logged, g_strdup_printf("%s: %s", tp->plugin->name, line));
}

static const char *check_host_control_address(struct te_plugin_host_ctx *ctx, uint32_t which)
{
	(void)ctx;
	if (which == TE_PLUGIN_ADDR_BOUND)
		return chk.c->ctl_bound ? chk.c->ctl_bound : "";
	return chk.c->ctl_advertised ? chk.c->ctl_advertised : "";
}

static void child_check(char level, enum te_status st, const char *key, const char *fmt, ...)
	G_GNUC_PRINTF(4, 5);
static void child_check(char level, enum te_status st, const char *key, const char *fmt, ...)
{
	g_autoptr(GByteArray) rec = g_byte_array_new();
	g_autofree char *text = NULL;
	int32_t st32 = st;
	va_list ap;

	va_start(ap, fmt);
	text = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	g_byte_array_append(rec, (const guint8 *)&level, 1);
	g_byte_array_append(rec, (const guint8 *)&st32, sizeof(st32));
	g_byte_array_append(rec, (const guint8 *)key, (guint)strlen(key) + 1);
	g_byte_array_append(rec, (const guint8 *)text, (guint)strlen(text));
	rec_send(child.fd, REC_CHECK, rec->data, rec->len);
}

/* A problem about @key in the child: located as check_problem does. */
static void child_problem(char level, enum te_status st, const char *key, const char *why)
{
	g_autofree char *at = check_at(chk.c, key);

	child_check(level, st, key, "%s: %s", at, why);
}

/*
 * A line the plugin logged during init, located at the option it names ("option 'bind' ...")
 * when the file sets that option, else at the transport.
 */
static void child_logged(size_t index, const char *line)
{
	const struct config_transport *ct = &chk.c->cfg->transports[index];
	g_autofree char *tkey = g_strdup_printf("transports[%zu]", index);
	const char *o = strstr(line, "option '");

	if (o) {
		const char *name = o + strlen("option '");
		const char *end = strchr(name, '\'');

		for (size_t j = 0; end && j < ct->n_options; j++) {
			const struct config_option *opt = &ct->options[j];

			if (strlen(opt->key) == (size_t)(end - name) &&
			    strncmp(opt->key, name, (size_t)(end - name)) == 0 && opt->value_line) {
				child_check(CHECK_WARNING, TE_OK, tkey,
					    "%s:%u:%u: %s.options.%s: %s", chk.c->file,
					    opt->value_line, opt->value_col, tkey, opt->key, line);
				return;
			}
		}
	}
	child_problem(CHECK_WARNING, TE_OK, tkey, line);
}

/* In the child: load, check and initialise transports[@index] as engine start would. */
static void check_transport_child(size_t index, const char *search_path)
{
	struct config *cfg = chk.c->cfg;
	const struct config_transport *ct = &cfg->transports[index];
	g_autofree char *tkey = g_strdup_printf("transports[%zu]", index);
	g_autofree char *err = NULL;
	g_autofree char *located = NULL;
	g_autofree char *why = NULL;
	struct plugin *p = NULL;
	struct transport *t = NULL;
	const char *detail;
	char result = 'E';
	bool located_ok;
	enum te_status st;

	rec_text(child.fd, REC_OP, "open");
	st = plugin_open(ct->name, ct->path, search_path, &p, &err);
	if (st != TE_OK) {
		g_autofree char *key = g_strdup_printf("%s.%s", tkey, ct->path ? "path" : "name");

		if (ct->required) {
			why = g_strdup_printf("transport '%s' (required): %s", ct->name,
					      err ? err : te_status_str(st));
			child_problem(CHECK_ERROR, st, key, why);
		} else {
			child_check(
				CHECK_NOTE, TE_OK, tkey,
				"%s (%s): absent on this host (%s): an engine skips it, and its "
				"options are not checked",
				tkey, ct->name, err ? err : te_status_str(st));
			result = 'S';
		}
		rec_send(child.fd, REC_RESULT, &result, 1);
		return;
	}
	g_clear_pointer(&err, g_free);
	st = plugin_apply_options(p, cfg, index, &err);
	if (st != TE_OK) {
		child_check(CHECK_ERROR, st, tkey, "%s", err ? err : te_status_str(st));
		goto out;
	}

	child.orig = p->ops;
	p->ops.init = wrap_init;
	p->ops.fini = wrap_fini;
	p->ops.query_caps = wrap_query_caps;
	if (p->ops.query_devices)
		p->ops.query_devices = wrap_query_devices;
	chk.logged = g_ptr_array_new_with_free_func(g_free);
	st = transport_start(NULL, p, &chk.host, ct, (unsigned)index, &t, &err);
	rec_text(child.fd, REC_OP, "check");
	if (st == TE_OK) {
		for (guint k = 0; k < chk.logged->len; k++)
			child_logged(index, chk.logged->pdata[k]);
		g_ptr_array_set_size(chk.logged, 0);
		child_check(CHECK_OK, TE_OK, tkey,
			    "%s (%s%s): %s %s loaded from %s, options valid, initialised with "
			    "them (%" PRIu32 " device%s)",
			    tkey, ct->name, ct->required ? ", required" : "", p->name,
			    p->desc->version ? p->desc->version : "", p->path, t->n_devices,
			    t->n_devices == 1 ? "" : "s");
		result = 'L';
		transport_stop(t);
		goto out;
	}
	/*
	 * "option '<key>': <why>" from init (said through set_error, else logged): an option
	 * the plugin checked itself, a configuration error whether required or not.
	 */
	located_ok = config_option_error(cfg, index, p->name, transport_op_error(), &located);
	for (guint k = chk.logged->len; !located_ok && k > 0; k--)
		located_ok = config_option_error(cfg, index, p->name, chk.logged->pdata[k - 1],
						 &located);
	if (located_ok) {
		child_check(CHECK_ERROR, TE_ERR_CONFIG, tkey, "%s", located);
		goto out;
	}
	detail = err ? err : te_status_str(st);
	if (child.init_status == TE_ERR_CONFIG)
		st = TE_ERR_CONFIG;
	if (strstr(detail, g_strerror(EADDRINUSE))) {
		/* A port it needs is busy: most likely an engine of this file is running. */
		child_check(
			CHECK_NOTE, TE_OK, tkey,
			"%s (%s): init failed here: %s: a port it needs is in use (an engine of "
			"this file running already?)",
			tkey, ct->name, detail);
		result = 'L';
		goto out;
	}
	if (st == TE_ERR_CONFIG || ct->required) {
		for (guint k = 0; k < chk.logged->len; k++)
			child_logged(index, chk.logged->pdata[k]);
		why = g_strdup_printf("transport '%s'%s: %s", ct->name,
				      ct->required ? " (required)" : "", detail);
		child_problem(CHECK_ERROR, st, tkey, why);
		goto out;
	}
	/* Optional, and this host lacks what it needs: the engine logs it and goes on. */
	child_check(CHECK_NOTE, TE_OK, tkey,
		    "%s (%s): cannot initialise on this host: %s: an engine skips it", tkey,
		    ct->name, detail);
	result = 'S';
out:
	rec_send(child.fd, REC_RESULT, &result, 1);
	rec_text(child.fd, REC_OP, "close");
	plugin_close(p);
}

/* Seconds a plugin's open, init and fini may take in the check before it counts as hung. */
#define CHECK_CHILD_TIMEOUT_S 60

/* Check transports[@index] in a child process; 'L' loaded, 'S' skipped, 'E' error. */
static char check_transport(struct check *c, size_t index, const char *search_path)
{
	g_autoptr(GByteArray) got = g_byte_array_new();
	g_autofree char *tkey = g_strdup_printf("transports[%zu]", index);
	g_autofree char *op = NULL;
	uint8_t chunk[4096];
	int fds[2], status = 0;
	char result = 0;
	size_t off = 0;
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	if (pipe(fds) != 0) {
		check_add(c, CHECK_ERROR, TE_ERR_SYSTEM, tkey, "te-info: pipe: %s",
			  g_strerror(errno));
		return 'E';
	}
	pid = fork();
	if (pid < 0) {
		check_add(c, CHECK_ERROR, TE_ERR_SYSTEM, tkey, "te-info: fork: %s",
			  g_strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return 'E';
	}
	if (pid == 0) {
		static const int crash_signals[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };

		for (size_t i = 0; i < G_N_ELEMENTS(crash_signals); i++)
			signal(crash_signals[i], SIG_DFL);
		close(fds[0]);
		child.fd = fds[1];
		chk.c = c;
		chk.host = host_services;
		chk.host.log = check_host_log;
		chk.host.control_address = check_host_control_address;
		alarm(CHECK_CHILD_TIMEOUT_S);
		check_transport_child(index, search_path);
		_exit(0);
	}
	close(fds[1]);
	for (;;) {
		ssize_t r = read(fds[0], chunk, sizeof(chunk));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		g_byte_array_append(got, chunk, (guint)r);
	}
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;

	while (got->len - off >= 1 + sizeof(uint32_t)) {
		uint8_t tag = got->data[off];
		const uint8_t *data;
		uint32_t n;

		memcpy(&n, got->data + off + 1, sizeof(n));
		off += 1 + sizeof(n);
		if (n > got->len - off)
			break;
		data = got->data + off;
		off += n;
		if (tag == REC_OP) {
			g_free(op);
			op = g_strndup((const char *)data, n);
		} else if (tag == REC_RESULT && n == 1) {
			result = (char)data[0];
		} else if (tag == REC_CHECK && n > 1 + sizeof(int32_t)) {
			const char *key = (const char *)data + 1 + sizeof(int32_t);
			const char *nul = memchr(key, '\0', n - 1 - sizeof(int32_t));
			g_autofree char *text = NULL;
			int32_t st;

			if (!nul)
				continue;
			memcpy(&st, data + 1, sizeof(st));
			text = g_strndup(nul + 1, (gsize)((const char *)data + n - nul - 1));
			check_add_line(c, (char)data[0], (enum te_status)st, key, text);
		}
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && result)
		return result;
	/* It died: an engine loading it would die too (or hang, for SIGALRM). */
	{
		const struct config_transport *ct = &c->cfg->transports[index];
		g_autofree char *why = NULL;
		int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;

		if (sig == SIGALRM)
			why = g_strdup_printf("did not return from %s within %d s",
					      op ? op : "open", CHECK_CHILD_TIMEOUT_S);
		else if (sig && signal_name(sig))
			why = g_strdup_printf("crashed with %s in %s", signal_name(sig),
					      op ? op : "open");
		else if (sig)
			why = g_strdup_printf("crashed with signal %d in %s", sig,
					      op ? op : "open");
		else
			why = g_strdup_printf("exited with status %d in %s",
					      WIFEXITED(status) ? WEXITSTATUS(status) : -1,
					      op ? op : "open");
		check_problem(c, CHECK_ERROR, TE_ERR_PLUGIN_INIT, tkey,
			      "transport '%s': the plugin %s (an engine loading it would too)",
			      ct->name, why);
	}
	return 'E';
}

static const char *const metadata_names[] = { "p2p", "etcd", "redis", "http" };

/* Longest wait of the metadata check per request, in ms (less when metadata.timeout_ms is). */
#define CHECK_METADATA_TIMEOUT_MS 2000

/*
 * The store answers: open the backend as an engine does, then look up a key nobody
 * publishes (NOT_FOUND means reachable). Nothing is written.
 */
static void check_metadata(struct check *c)
{
	struct config *cfg = c->cfg;
	const char *type = metadata_names[cfg->metadata_type];
	g_autofree char *err = NULL;
	g_autofree char *name = NULL;
	g_autofree char *eps = NULL;
	g_autoptr(GBytes) json = NULL;
	struct metadata *md = NULL;
	struct engine *e;
	uint32_t saved = cfg->metadata_timeout_ms;
	uint32_t timeout = MIN(saved, (uint32_t)CHECK_METADATA_TIMEOUT_MS);
	enum te_status st;
	const char *key;

	if (cfg->metadata_type == CONFIG_METADATA_P2P) {
		check_add(c, CHECK_OK, TE_OK, "metadata.type",
			  "metadata: p2p: no server to reach (peers fetch descriptors from "
			  "engine.listen)");
		return;
	}
	{
		g_autoptr(GString) s = g_string_new(NULL);

		for (size_t i = 0; i < cfg->n_metadata_endpoints; i++)
			g_string_append_printf(s, "%s%s", i ? ", " : "",
					       cfg->metadata_endpoints[i]);
		eps = g_string_free(g_steal_pointer(&s), FALSE);
	}
	/* metadata_open reads only the configuration and the log sink of its engine. */
	e = g_new0(struct engine, 1);
	e->cfg = cfg;
	e->log.level = -1; /* quiet: the check says what went wrong */
	cfg->metadata_timeout_ms = timeout;
	st = metadata_open(e, &md, &err);
	if (st == TE_OK) {
		name = g_strdup_printf("te-info-check-%ld", (long)getpid());
		g_clear_pointer(&err, g_free);
		st = metadata_get(md, name, timeout, &json, &err);
	}
	metadata_close(md);
	cfg->metadata_timeout_ms = saved;
	g_free(e);
	if (st == TE_OK || st == TE_ERR_METADATA_NOT_FOUND) {
		check_add(c, CHECK_OK, TE_OK, "metadata.endpoints",
			  "metadata: %s at %s answers (a lookup of an absent key, within %" PRIu32
			  " ms)",
			  type, eps, timeout);
		return;
	}
	key = "metadata.endpoints";
	if (err && g_str_has_prefix(err, "metadata.password_file: "))
		key = "metadata.password_file";
	else if (st == TE_ERR_CONFIG)
		key = "metadata.type";
	else if (st == TE_ERR_AUTH)
		key = cfg->metadata_username ? "metadata.username" : "metadata.endpoints";
	check_problem(c, CHECK_ERROR, st, key, "%s", strip_key(err ? err : te_status_str(st), key));
}

static int check_config(const char *path, bool json, const char *search_path)
{
	struct check c = { .file = path, .json = json, .status = TE_OK };
	g_autofree char *text = NULL;
	g_autofree char *err = NULL;
	g_autoptr(GString) skipped = g_string_new(NULL);
	enum te_status st;
	size_t len = 0;
	unsigned loaded = 0;
	int rc;

	c.lines = g_ptr_array_new_with_free_func(check_line_free);
	st = config_load_file(path, &c.cfg, &err);
	if (st != TE_OK) {
		check_add(&c, CHECK_ERROR, st, "(root)", "%s", err ? err : te_status_str(st));
		goto done;
	}
	/* Positions of the keys the configuration keeps none for (engine.listen, auth...). */
	if (g_file_get_contents(path, &text, &len, NULL))
		c.have_doc = yaml_doc_load(text, len, &c.doc);
	check_add(&c, CHECK_OK, TE_OK, "(root)", "config: %s parses (%zu transport%s, metadata %s)",
		  path, c.cfg->n_transports, c.cfg->n_transports == 1 ? "" : "s",
		  metadata_names[c.cfg->metadata_type]);

	check_secret(&c);
	if (c.errors)
		goto done;
	check_listen(&c);
	if (c.errors)
		goto done;
	for (size_t i = 0; i < c.cfg->n_transports && !c.errors; i++) {
		char r = check_transport(&c, i, search_path);

		if (r == 'L')
			loaded++;
		else if (r == 'S')
			g_string_append_printf(skipped, "%s%s", skipped->len ? ", " : "",
					       c.cfg->transports[i].name);
	}
	if (c.errors)
		goto done;
	if (!loaded) {
		check_problem(&c, CHECK_ERROR, TE_ERR_NO_TRANSPORT, "transports",
			      "no transport can be loaded on this host (%s skipped), and an engine "
			      "without one refuses to start",
			      skipped->len ? skipped->str : "none listed");
		goto done;
	}
	check_metadata(&c);

done:
	rc = c.errors || c.warnings ? 1 : 0;
	if (json) {
		g_autoptr(JsonBuilder) b = json_builder_new();

		json_builder_begin_object(b);
		json_string(b, "file", path);
		json_builder_set_member_name(b, "ok");
		json_builder_add_boolean_value(b, rc == 0);
		json_string(b, "status", te_status_str(c.status));
		json_int(b, "code", c.status);
		if (c.first_error)
			json_string(b, "error", c.first_error);
		json_int(b, "warnings", c.warnings);
		json_builder_set_member_name(b, "checks");
		json_builder_begin_array(b);
		for (guint i = 0; i < c.lines->len; i++) {
			const struct check_line *l = c.lines->pdata[i];

			json_builder_begin_object(b);
			json_string(b, "level", check_level_word(l->level));
			json_string(b, "key", l->key);
			json_string(b, "message", l->text);
			json_builder_end_object(b);
		}
		json_builder_end_array(b);
		json_builder_end_object(b);
		print_json_root(b);
	}
	if (c.have_doc)
		yaml_document_delete(&c.doc);
	g_ptr_array_unref(c.lines);
	g_free(c.first_error);
	g_free(c.ctl_bound);
	g_free(c.ctl_advertised);
	config_free(c.cfg);
	return rc;
}

/* --- --config ---------------------------------------------------------------------------- */

/*
 * Check each transport's options against its plugin's declarations, as engine start does (same
 * error text), filling in the defaults. A plugin te-info cannot load here is a note, not an
 * error: the file may be meant for another host.
 */
static enum te_status check_options(struct config *cfg, const char *search_path, GPtrArray *notes,
				    char **err_out)
{
	for (size_t i = 0; i < cfg->n_transports; i++) {
		const struct config_transport *ct = &cfg->transports[i];
		g_autofree char *err = NULL;
		struct plugin *p = NULL;
		enum te_status st;

		st = plugin_open(ct->name, ct->path, search_path, &p, &err);
		if (st != TE_OK) {
			g_ptr_array_add(
				notes,
				g_strdup_printf("transports[%zu] (%s): options not checked: %s", i,
						ct->name, err ? err : te_status_str(st)));
			continue;
		}
		if (!p->n_options)
			g_ptr_array_add(notes, g_strdup_printf("transports[%zu] (%s): the plugin "
							       "declares no options: not checked",
							       i, ct->name));
		st = plugin_apply_options(p, cfg, i, err_out);
		plugin_close(p);
		if (st != TE_OK)
			return st;
	}
	return TE_OK;
}

static int show_config(const char *path, bool json, const char *search_path)
{
	g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
	struct config *cfg = NULL;
	g_autofree char *err = NULL;
	g_autofree char *yaml = NULL;
	enum te_status st;

	st = config_load_file(path, &cfg, &err);
	if (st == TE_OK)
		st = check_options(cfg, search_path, notes, &err);
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
		if (st == TE_OK) {
			yaml_document_t doc;

			/* The effective configuration's tree, read back from its YAML. */
			json_builder_set_member_name(b, "effective");
			if (yaml && yaml_doc_load(yaml, strlen(yaml), &doc)) {
				yaml_to_json(b, &doc, yaml_document_get_root_node(&doc), 0);
				yaml_document_delete(&doc);
			} else {
				json_builder_begin_object(b);
				json_builder_end_object(b);
			}
		} else
			json_string(b, "error", err ? err : te_status_str(st));
		if (notes->len)
			json_strings(b, "notes", notes);
		json_builder_end_object(b);
		print_json_root(b);
		config_free(cfg);
		return st == TE_OK ? 0 : 1;
	}
	for (guint i = 0; i < notes->len; i++)
		fprintf(stderr, "te-info: note: %s\n", (const char *)notes->pdata[i]);
	if (st == TE_OK) {
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
	g_autofree char *check_file = NULL;
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
		  "Print the effective configuration of FILE (or its error, exit 1); transport "
		  "options are checked against the plugins' declarations",
		  "FILE" },
		{ "check", 'k', 0, G_OPTION_ARG_FILENAME, &check_file,
		  "Check that an engine can start from FILE on this host: plugins found, their "
		  "options valid and their init passing, secret file, listen address, metadata "
		  "store reachable; one line per check on stderr, exit 1 at the first problem",
		  "FILE" },
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
		"List the transport plugins te can find: path, name, ABI version, declared options\n"
		"(type, range or choices, default, help), capabilities and devices. Plugins that fail\n"
		"to load or initialise are listed with the reason.\n"
		"PLUGIN: a plugin name (resolved along the search path) or a module file.\n"
		"Without PLUGIN: every *.so in the search path.\n"
		"Each module is probed in a child process. Exit status 1 when one crashed, or when\n"
		"a PLUGIN named on the command line is not found or does not load.\n"
		"--check FILE: ok/note/warning/error lines (error and warning lines read\n"
		"<file>:<line>:<col>: <key>: <reason>); exit 1 on any warning or error.");
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
	if (config_file && check_file) {
		fprintf(stderr, "te-info: --config and --check are exclusive (try --help)\n");
		return 2;
	}
	if ((config_file || check_file) && argc > 1) {
		fprintf(stderr, "te-info: unexpected argument '%s' (try --help)\n", argv[1]);
		return 2;
	}
	search_path = plugin_path ? g_strdup(plugin_path) : plugin_search_path();
	if (config_file)
		return show_config(config_file, json, search_path);
	if (check_file)
		return check_config(check_file, json, search_path);

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
	/*
	 * In a scan, failing plugins are reported, not fatal: the listing itself succeeded. A
	 * module that crashed te-info's probe would crash the engine too: that fails the listing.
	 * A plugin named on the command line that is not found or does not load fails it too.
	 */
	for (guint i = 0; i < probes->len; i++) {
		const struct probe *p = probes->pdata[i];

		if (p->crashed || (argc > 1 && p->load != TE_OK))
			return 1;
	}
	return 0;
}
