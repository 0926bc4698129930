/* SPDX-License-Identifier: Apache-2.0 */
/* conformance.h: te-conformance's modules: results, options file, ABI probe, target, checks. */
#ifndef TE_CONFORMANCE_H
#define TE_CONFORMANCE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <glib.h>

#include <te/te.h>
#include <te/te_plugin.h>

#include "shim.h"

/* Guard bytes on each side of the target's region, and the region's size (64 MiB + room). */
#define CONF_GUARD (64u << 10)
#define CONF_REGION ((64u << 20) + (1u << 20))
#define CONF_MAX_DEVICES 64u

/* What the run knows: the command line, then what the ABI probe learned. */
struct conf {
	/* command line */
	char *plugin;	 /* absolute path of the module under test */
	char *config;	 /* --config FILE or NULL */
	char *location;	 /* --location, NULL: chosen from the caps */
	char **skip;	 /* --skip patterns (globs) */
	char **only;	 /* --only patterns */
	bool verbose;	 /* --verbose: engine logs and details on stderr */
	bool no_shim;	 /* --no-shim: the real module, no contract checks or faults */
	unsigned hang_s; /* --hang-timeout: a check that takes longer is a hang */
	char *self;	 /* this executable, for the target processes */
	char *shim_path; /* the shim module */
	char *tmpdir;	 /* scratch files: the targets' YAML */
	/* --config, parsed */
	struct options *opts;
	/* learned by the ABI probe */
	bool abi_ready; /* the module loads and initialises: the engine checks can run */
	char *name;
	struct te_plugin_caps caps;
	uint32_t n_devices;
	/* the shim's API (NULL with --no-shim) */
	const struct conf_shim_api *shim;
};

/* --- report.c: one line per check, the summary, the hang guard ---------------------------- */

enum report_kind {
	REPORT_OK,
	REPORT_FAIL,
	REPORT_SKIP
};

void report_init(const struct conf *c);
/* Whether check @name runs (--only, --skip); a check skipped by --skip gets its skip line. */
bool report_wanted(const char *name);
/* Whether --only lets check @name run (no line printed). */
bool report_selected(const char *name);
void report(enum report_kind kind, const char *name, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
#define report_ok(name, ...) report(REPORT_OK, name, __VA_ARGS__)
#define report_fail(name, ...) report(REPORT_FAIL, name, __VA_ARGS__)
#define report_skip(name, ...) report(REPORT_SKIP, name, __VA_ARGS__)
/* A detail line (stderr, --verbose only). */
void report_note(const char *fmt, ...) G_GNUC_PRINTF(1, 2);
/* Prints the summary; the exit status (0: nothing failed). */
int report_summary(void);
unsigned report_failures(void);
/*
 * Hang guard: if the current check has not called report_unwatch within @seconds, its FAIL
 * line and the summary are printed, @on_hang runs (kills helper processes) and the process
 * exits 1.
 */
void report_watch(const char *check, unsigned seconds);
void report_unwatch(void);
void report_on_hang(void (*fn)(void));
/*
 * Run @fn(@arg) in a forked process (call it with no thread running): its lines go to stdout
 * as usual and are counted here; a crash of that process becomes the FAIL line of the check it
 * was in (@what when none), so a plugin that crashes the engine still gets a summary.
 */
void report_in_child(void (*fn)(void *), void *arg, const char *what);

/* --- options.c: --config, and the engines' YAML --------------------------------------------- */

struct options;
/* Parse --config FILE: an options mapping, a transports entry, or a config with transports:. */
bool options_parse(const char *path, struct options **out, char **err_out);
/* The options for plugin @name (NULL @o: none); false when @o has no entry for it. */
bool options_select(struct options *o, const char *name, char **err_out);
void options_free(struct options *o);
/*
 * Engine YAML: one transport, @name loaded from @module, required, with the options; @transfer
 * is the body of the transfer: mapping (may be NULL).
 */
char *options_yaml(const struct options *o, const char *name, const char *module,
		   const char *transfer);

/* --- abi.c: the module alone, in a child process ---------------------------------------------- */

/* Run the ABI checks (forks: call before any thread exists); fills c->name, caps, devices. */
void abi_run(struct conf *c);

/* --- membuf.c: patterns in host or device memory ------------------------------------------- */

#define PATTERN_GUARD 0x6775617264ull /* "guard" */

uint8_t pattern_byte(uint64_t seed, uint64_t i);
void pattern_fill(uint8_t *dst, uint64_t index, size_t len, uint64_t seed);

/*
 * A buffer of @len bytes whose byte at offset j carries pattern index j + shift: host memory,
 * or device memory filled and read through te_mem_copy and a host bounce buffer.
 */
struct membuf {
	struct te_engine *engine;
	uint8_t *base;
	size_t len;
	int64_t shift;
	bool device;
	uint8_t *bounce;
};

enum membuf_bad {
	MEMBUF_OK = 0,
	MEMBUF_MISMATCH,
	MEMBUF_COPY
};

/* First difference found by membuf_check. */
struct membuf_diff {
	uint64_t off;
	uint8_t got, want;
	char why[160];
};

bool membuf_init(struct membuf *b, struct te_engine *e, uint8_t *base, size_t len, int64_t shift,
		 bool device, char *err, size_t cap);
void membuf_release(struct membuf *b);
bool membuf_fill(struct membuf *b, uint64_t off, uint64_t len, uint64_t seed, char *err,
		 size_t cap);
/* Every byte of [off, +len) is pattern @a (or pattern @b when @either). */
enum membuf_bad membuf_check(struct membuf *b, uint64_t off, uint64_t len, uint64_t a, uint64_t b2,
			     bool either, struct membuf_diff *diff);
bool membuf_sum(struct membuf *b, uint64_t off, uint64_t len, uint64_t *sum, char *err, size_t cap);

/* --- target.c: the serving process ---------------------------------------------------------- */

/* Target mode (te-conformance --target ...): serve a region until stdin closes. */
int target_main(int argc, char **argv);

struct target {
	GPid pid;
	int to_fd, from_fd;
	GString *rbuf;
	bool dead;
	char *segment;
	uint64_t base;	 /* address of the mapping in the target */
	uint64_t region; /* address of the registered region (base + CONF_GUARD) */
	uint64_t len;	 /* of the region */
	char reply[512];
};

/* Start a target serving the plugin (real module) as @name; NULL with why in @err. */
struct target *target_start(const struct conf *c, char *err, size_t cap);
/* Send one command line, read its one-line answer into t->reply; true when it starts "ok". */
bool target_cmd(struct target *t, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
void target_kill(struct target *t);
void target_stop(struct target *t); /* quit, then kill after a while; frees */

/* --- checks.c: everything through te.h with two engines -------------------------------------- */

void checks_run(struct conf *c);

#endif /* TE_CONFORMANCE_H */
