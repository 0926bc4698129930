/* SPDX-License-Identifier: Apache-2.0 */
/* sysnode_fixture.h: the node driver and test helpers shared by the te-node/cxl-node tests. */
#ifndef TE_TESTS_LIB_SYSNODE_FIXTURE_H
#define TE_TESTS_LIB_SYSNODE_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <gio/gio.h>
#include <glib.h>

#include <te/te.h>

#include "tlib.h"

/* Deadline for a node's answer to one command (a 64 MiB fill or checksum included). */
#define NODE_REPLY_MS 30000
/* Deadline for a node to print "ready" (a fresh 64 MiB costs ~0.3 s to touch). */
#define NODE_READY_MS 30000

/* The node program node_start runs (te-node); set by the test's main. */
extern char *node_path;

/*
 * Watchdog: a test arms it around a call that must not hang (te_batch_wait after a kill,
 * te_engine_free); if it is still armed at the deadline the process aborts and says which
 * call hung, instead of waiting for meson's timeout.
 */
void watchdog_arm(unsigned seconds, const char *what);
void watchdog_disarm(void);

/* A number in @base; anything else is an error. */
uint64_t parse_u64(const char *s, int base);
/* Parse "0x<addr> <len>". */
void parse_range(const char *s, uint64_t *addr, uint64_t *len);

/* "<dir>/<file>" for the first directory of $TE_PLUGIN_PATH holding @file, else NULL. */
char *find_plugin(const char *file);
/* te-node from $TE_NODE, else under $TE_BUILD_ROOT; NULL when not an executable. */
char *find_te_node(void);

/* ---------------------------------------------------------------------------------------- */
/* node processes, driven over stdin/stdout */

#define NODE_EOF "\x04eof"

struct node {
	GSubprocess *proc;
	GOutputStream *in;
	GAsyncQueue *lines; /* stdout lines (g_free); NODE_EOF once stdout closed */
	GThread *out_thread;
	GThread *err_thread;
	GMutex err_lock;
	GString *err; /* everything the node wrote on stderr */
	char *name;   /* in messages; NULL: "te-node ?" (node_start sets "te-node <segment>") */
	char *segment;
	char *pid;	/* of the process, kept for cleaning up after it */
	uint64_t base;	/* address of the mapping (guards included) */
	uint64_t total; /* bytes of the mapping */
	uint64_t buf;	/* address of the registered buffer */
	uint64_t size;	/* registered bytes */
	uint64_t guard; /* unregistered bytes on each side */
	bool dead;	/* killed or exited: no more commands */
};

/* Start @argv (NULL-terminated) with its stdio piped to the node's threads; @name may be NULL. */
struct node *node_spawn(const char *name, const char *const *argv);
/*
 * Start te-node with engine YAML @yaml (NULL: tcp, listen on @listen) and the default
 * buffer; returns once it printed "ready".
 */
struct node *node_start(const char *yaml, const char *listen);
/*
 * As node_start, with the whole command line (NULL-terminated): a te-node run through a
 * wrapper such as "ip netns exec NS te-node ..." (which must exec, so that the PID is
 * te-node's).
 */
struct node *node_start_argv(const char *const *argv);
/* A copy of what the node wrote on stderr so far. */
char *node_stderr(struct node *n);
/* The next stdout line within @ms (g_free), or NULL on timeout; NODE_EOF at the end. */
char *node_line(struct node *n, unsigned ms);
/* Next line, which must start with @prefix; returns what follows it (g_free). */
char *node_expect(struct node *n, const char *prefix, unsigned ms);
void node_send(struct node *n, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* Wait up to @ms for the node to exit; kills it and returns false if it did not. */
bool node_wait_exit(struct node *n, unsigned ms);
/* SIGKILL the node and reap it. */
void node_kill(struct node *n);
/*
 * Stop the node (stdin EOF, then SIGKILL after @ms), reap it and free everything (NULL: no
 * node). Not exiting in time is an error unless @kill_ok (then a test message); exiting with
 * a status other than 0 always is.
 */
void node_close_free(struct node *n, unsigned ms, bool kill_ok);
/* Free a node that exited and was reaped: join its threads, release everything. */
void node_release(struct node *n);
/* FNV checksum of the node's bytes [base + off, + len). */
uint64_t node_checksum(struct node *n, uint64_t off, uint64_t len);
void node_fill(struct node *n, uint64_t off, uint64_t len, uint64_t seed);

/* ---------------------------------------------------------------------------------------- */
/* the initiator side */

void initiator_free(struct te_engine *e);

/* A local buffer registered with the initiator, page aligned. */
struct lbuf {
	uint8_t *p;
	size_t len;
};

void lbuf_new(struct lbuf *b, struct te_engine *e, size_t len);
/*
 * Unregister and free. Right after te_batch_free the region may still be reported busy for
 * a moment (the core releases task references when the last slice reference drops, which
 * can be after te_batch_wait returned); /system/tcp/free-releases checks that strictly,
 * here a bounded wait keeps it from failing unrelated tests.
 */
void lbuf_free(struct lbuf *b, struct te_engine *e);

/* What the node's mapping should hold: pattern 0, then every change the test made. */
uint8_t *mirror_new(const struct node *n);
/* The whole mapping, guards included, equals @mirror: no byte changed that should not. */
void assert_node_is(struct node *n, const uint8_t *mirror, const char *when);
/* Compare @len bytes, reporting the first difference. */
void assert_bytes(const uint8_t *got, const uint8_t *want, size_t len, const char *what);
/* Every byte of @p[from, to) is still 0xee. */
void assert_untouched(const uint8_t *p, size_t from, size_t to, const char *what);

/* Open the node's segment from @e and check what it publishes. */
te_segment_id open_node(struct te_engine *e, struct node *n);

/*
 * Submit @n requests in a new batch, wait up to @wait_ns (under the watchdog), return the
 * batch (caller frees) and status.
 */
te_batch_id batch_run(struct te_engine *e, const struct te_request *reqs, size_t n, int64_t wait_ns,
		      enum te_status *submit_out, enum te_status *wait_out);
/* Run @n requests that must all complete over @transport; reports the first failed task. */
void batch_run_ok(struct te_engine *e, const struct te_request *reqs, size_t n, int64_t wait_ns,
		  const char *transport);

/* ---------------------------------------------------------------------------------------- */
/* data checks: every request must complete over @transport within @wait_ns */

/*
 * READ and WRITE of each of @sizes (@count of them) at three places of the node's buffer
 * (aligned, unaligned, at the end; a place the size does not fit is skipped) through a local
 * buffer of 64 MiB + 8 KiB: the bytes moved, the bytes around them and, at the end, the
 * node's whole mapping checked.
 */
void xfer_sizes(struct te_engine *e, te_segment_id seg, struct node *n, const size_t *sizes,
		size_t count, int64_t wait_ns, const char *transport);
/*
 * @count unaligned requests of 1..@max_len bytes, with gaps, in one batch: all WRITEs, then
 * all READs of fresh node data, then both mixed over disjoint ranges; bytes verified.
 */
void xfer_batch(struct te_engine *e, te_segment_id seg, struct node *n, unsigned count,
		uint32_t max_len, int64_t wait_ns, const char *transport);

/* A remote range outside the node's registered buffer, and where it lies. */
struct bad_range {
	const char *what;
	enum te_opcode op;
	uint64_t addr, len;
};

#define BAD_RANGES 7
/* The ranges next to, across the edges of and far from @n's buffer, refused at submit. */
void bad_ranges(const struct node *n, struct bad_range out[BAD_RANGES]);

#endif /* TE_TESTS_LIB_SYSNODE_FIXTURE_H */
