/* SPDX-License-Identifier: Apache-2.0 */
/* te-node.c: a te engine in its own process, serving a guarded buffer to system tests. */

/*
 * Target mode (default): create an engine, map guard + size + guard bytes filled with pattern
 * 0 (sysnode.h), register the middle for remote READ and WRITE, print
 *
 *   segment: <te_engine_name>
 *   base: 0x<addr> <bytes>        the whole mapping
 *   buffer: 0x<addr> <bytes>      the registered part
 *   guard: 0x<addr> <bytes>       before the buffer
 *   guard: 0x<addr> <bytes>       after the buffer
 *   ready
 *
 * and answer commands read from stdin, one per line. Offsets are relative to base (so a
 * range may cover guard bytes) and accept 0x; every answer ends with a line of its own:
 *
 *   checksum <off> <len>      sum <16 hex digits>      (FNV-1a 64, sysnode_fnv)
 *   dump <off> <len>          dump <hex>               (len <= SYSNODE_DUMP_MAX)
 *   fill <off> <len> <seed>   ok                       (writes sysnode_pattern(seed, off..))
 *   notifies                  notify <sender> <len> <hex> per message received so far,
 *                             then end <count>
 *   senders                   sender <name> <count> <sum> per sender, then end <senders>:
 *                             messages are counted instead of kept (a flood of them), <sum>
 *                             adds up sysnode_fnv of each message (16 hex digits); what one
 *                             of these two commands took, the other does not list
 *   descriptor                descriptor <json>        (te_segment_export)
 *   unregister                ok                       (te_mem_unregister of the buffer)
 *   register                  ok                       (registers it again)
 *   quit                      exits 0; so does the end of stdin
 *
 * With --location LOC other than cpu (cuda:0, ...) the whole mapping is device memory from
 * te_mem_alloc, registered (the middle) at LOC; fill, checksum and dump then go through
 * te_mem_copy and a host bounce buffer, and addresses printed are device addresses.
 *
 * Malformed commands get "error <why>". Initiator mode (--initiator SEGMENT) opens SEGMENT,
 * writes --length bytes (default 1 MiB) to an unaligned address of its first buffer, reads
 * them back and compares; with --verify it also reads untouched bytes and checks them against
 * pattern 0. It prints "verify ok" and exits 0, or says what differs and exits 1.
 */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <glib.h>

#include <te/te.h>

#include "sysnode.h"

#define NODE_LINE_MAX 512
#define NODE_WAIT_NS (30ll * 1000 * 1000 * 1000)

/* Bytes of the host bounce buffer for a device mapping (--location). */
#define NODE_BOUNCE (4u << 20)

struct node {
	struct te_engine *engine;
	uint8_t *base;
	size_t total;
	size_t guard;
	size_t size;
	const char *location; /* of the registered buffer */
	uint8_t *bounce;      /* NULL: base is host memory */
	GPtrArray *notifies;  /* "notify ..." lines, every message received so far */
	GHashTable *senders;  /* sender name -> struct node_sender, for "senders" */
};

/* Messages of one sender taken by the "senders" command. */
struct node_sender {
	uint64_t count;
	uint64_t sum; /* of sysnode_fnv over each message */
};

static void node_say(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static void node_say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* Parse "123", "0x7b", "64K", "64MiB", "1G": TRUE and *out on success. */
static gboolean node_parse_size(const char *s, uint64_t *out)
{
	char *end = NULL;
	guint64 v, mul = 1;

	if (!s || !*s || *s == '-')
		return FALSE;
	errno = 0;
	v = g_ascii_strtoull(s, &end, 0);
	if (errno || end == s)
		return FALSE;
	if (*end) {
		if (g_ascii_strcasecmp(end, "K") == 0 || g_ascii_strcasecmp(end, "KiB") == 0)
			mul = 1ull << 10;
		else if (g_ascii_strcasecmp(end, "M") == 0 || g_ascii_strcasecmp(end, "MiB") == 0)
			mul = 1ull << 20;
		else if (g_ascii_strcasecmp(end, "G") == 0 || g_ascii_strcasecmp(end, "GiB") == 0)
			mul = 1ull << 30;
		else
			return FALSE;
	}
	if (v > UINT64_MAX / mul)
		return FALSE;
	*out = v * mul;
	return TRUE;
}

static struct te_engine *node_engine(const char *config, const char *yaml, const char *listen)
{
	g_autofree char *text = NULL;
	struct te_engine *e = NULL;
	enum te_status st;

	if (config) {
		st = te_engine_new_from_file(config, &e);
	} else {
		if (yaml)
			text = g_strdup(yaml);
		else
			text = g_strdup_printf("engine: {listen: \"%s\"}\n"
					       "transports:\n"
					       "  - name: tcp\n"
					       "    required: true\n",
					       listen ? listen : "127.0.0.1:0");
		st = te_engine_new_from_string(text, strlen(text), &e);
	}
	if (st != TE_OK) {
		fprintf(stderr, "te-node: cannot create the engine: %s: %s\n", te_status_str(st),
			te_last_error());
		return NULL;
	}
	return e;
}

/* Parse "<off> <len>" at @args[0..1] into a range inside the mapping. */
static gboolean node_range(const struct node *n, char **args, uint64_t *off, uint64_t *len)
{
	if (!args[0] || !args[1] || !node_parse_size(args[0], off) ||
	    !node_parse_size(args[1], len)) {
		node_say("error expected <off> <len>");
		return FALSE;
	}
	if (*off > n->total || *len > n->total - *off) {
		node_say("error range [%" PRIu64 ", +%" PRIu64 ") is outside the %zu-byte mapping",
			 *off, *len, n->total);
		return FALSE;
	}
	return TRUE;
}

/* Copy [off, +len) of the mapping to @dst (host memory); FALSE and an error line on failure. */
static gboolean node_get(const struct node *n, uint64_t off, void *dst, size_t len)
{
	enum te_status st;

	if (!n->bounce) {
		memcpy(dst, n->base + off, len);
		return TRUE;
	}
	st = te_mem_copy(n->engine, dst, n->base + off, len);
	if (st != TE_OK)
		node_say("error te_mem_copy from %s: %s: %s", n->location, te_status_str(st),
			 te_last_error());
	return st == TE_OK;
}

/* Copy @len bytes of host memory @src to [off, +len) of the mapping. */
static gboolean node_put(const struct node *n, uint64_t off, const void *src, size_t len)
{
	enum te_status st;

	if (!n->bounce) {
		memcpy(n->base + off, src, len);
		return TRUE;
	}
	st = te_mem_copy(n->engine, n->base + off, src, len);
	if (st != TE_OK)
		node_say("error te_mem_copy to %s: %s: %s", n->location, te_status_str(st),
			 te_last_error());
	return st == TE_OK;
}

/* sysnode_fnv of [off, +len) of the mapping, in bounce-sized pieces for device memory. */
static gboolean node_fnv(const struct node *n, uint64_t off, uint64_t len, uint64_t *out)
{
	uint64_t h = 0xcbf29ce484222325ull;

	if (!n->bounce) {
		*out = sysnode_fnv(n->base + off, len);
		return TRUE;
	}
	for (uint64_t at = 0; at < len; at += NODE_BOUNCE) {
		size_t k = (size_t)MIN((uint64_t)NODE_BOUNCE, len - at);

		if (!node_get(n, off + at, n->bounce, k))
			return FALSE;
		for (size_t i = 0; i < k; i++) {
			h ^= n->bounce[i];
			h *= 0x100000001b3ull;
		}
	}
	*out = h;
	return TRUE;
}

/* Write pattern @seed over [off, +len) of the mapping. */
static gboolean node_pattern(const struct node *n, uint64_t off, uint64_t len, uint64_t seed)
{
	if (!n->bounce) {
		sysnode_fill(n->base + off, off, len, seed);
		return TRUE;
	}
	for (uint64_t at = 0; at < len; at += NODE_BOUNCE) {
		size_t k = (size_t)MIN((uint64_t)NODE_BOUNCE, len - at);

		sysnode_fill(n->bounce, off + at, k, seed);
		if (!node_put(n, off + at, n->bounce, k))
			return FALSE;
	}
	return TRUE;
}

static void node_collect_notifies(struct node *n)
{
	struct te_notify *msgs = g_new0(struct te_notify, 16);
	size_t got = 0;

	do {
		enum te_status st = te_notify_recv(n->engine, msgs, 16, &got);

		if (st != TE_OK) {
			node_say("error te_notify_recv: %s: %s", te_status_str(st),
				 te_last_error());
			break;
		}
		for (size_t i = 0; i < got; i++) {
			size_t len = MIN(msgs[i].len, (size_t)TE_NOTIFY_MAX);
			GString *s = g_string_new(NULL);

			g_string_append_printf(s, "notify %s %zu ",
					       *msgs[i].sender ? msgs[i].sender : "-", msgs[i].len);
			for (size_t k = 0; k < len; k++)
				g_string_append_printf(s, "%02x", msgs[i].msg[k]);
			g_ptr_array_add(n->notifies, g_string_free(s, FALSE));
		}
	} while (got == 16);
	g_free(msgs);
}

/* Take every message received so far into per-sender counts (a flood is not kept). */
static void node_count_senders(struct node *n)
{
	struct te_notify *msgs = g_new0(struct te_notify, 64);
	size_t got = 0;

	do {
		enum te_status st = te_notify_recv(n->engine, msgs, 64, &got);

		if (st != TE_OK) {
			node_say("error te_notify_recv: %s: %s", te_status_str(st),
				 te_last_error());
			break;
		}
		for (size_t i = 0; i < got; i++) {
			const char *who = *msgs[i].sender ? msgs[i].sender : "-";
			struct node_sender *c = g_hash_table_lookup(n->senders, who);

			if (!c) {
				c = g_new0(struct node_sender, 1);
				g_hash_table_insert(n->senders, g_strdup(who), c);
			}
			c->count++;
			c->sum += sysnode_fnv(msgs[i].msg, MIN(msgs[i].len, (size_t)TE_NOTIFY_MAX));
		}
	} while (got == 64);
	g_free(msgs);
}

/* One command line; FALSE when the node should exit. */
static gboolean node_command(struct node *n, char *line)
{
	g_auto(GStrv) args = NULL;
	uint64_t off, len, seed;

	g_strstrip(line);
	if (!*line)
		return TRUE;
	args = g_strsplit_set(line, " \t", -1);
	if (strcmp(args[0], "quit") == 0) {
		return FALSE;
	} else if (strcmp(args[0], "checksum") == 0) {
		uint64_t h;

		if (node_range(n, args + 1, &off, &len) && node_fnv(n, off, len, &h))
			node_say("sum %016" PRIx64, h);
	} else if (strcmp(args[0], "dump") == 0) {
		if (node_range(n, args + 1, &off, &len)) {
			uint8_t bytes[SYSNODE_DUMP_MAX];
			GString *s;

			if (len > SYSNODE_DUMP_MAX) {
				node_say("error dump of %" PRIu64 " bytes: at most %u", len,
					 SYSNODE_DUMP_MAX);
				return TRUE;
			}
			if (!node_get(n, off, bytes, len))
				return TRUE;
			s = g_string_new("dump ");
			for (uint64_t k = 0; k < len; k++)
				g_string_append_printf(s, "%02x", bytes[k]);
			node_say("%s", s->str);
			g_string_free(s, TRUE);
		}
	} else if (strcmp(args[0], "fill") == 0) {
		if (node_range(n, args + 1, &off, &len)) {
			if (!args[2] || !args[3] || !node_parse_size(args[3], &seed)) {
				node_say("error expected fill <off> <len> <seed>");
				return TRUE;
			}
			if (node_pattern(n, off, len, seed))
				node_say("ok");
		}
	} else if (strcmp(args[0], "notifies") == 0) {
		node_collect_notifies(n);
		for (guint i = 0; i < n->notifies->len; i++)
			node_say("%s", (const char *)g_ptr_array_index(n->notifies, i));
		node_say("end %u", n->notifies->len);
	} else if (strcmp(args[0], "senders") == 0) {
		GHashTableIter it;
		gpointer k, v;

		node_count_senders(n);
		g_hash_table_iter_init(&it, n->senders);
		while (g_hash_table_iter_next(&it, &k, &v)) {
			const struct node_sender *c = v;

			node_say("sender %s %" PRIu64 " %016" PRIx64, (const char *)k, c->count,
				 c->sum);
		}
		node_say("end %u", g_hash_table_size(n->senders));
	} else if (strcmp(args[0], "descriptor") == 0) {
		char *json = NULL;
		size_t jlen = 0;
		enum te_status st = te_segment_export(n->engine, &json, &jlen);

		if (st != TE_OK)
			node_say("error te_segment_export: %s: %s", te_status_str(st),
				 te_last_error());
		else
			node_say("descriptor %s", json);
		te_free(json);
	} else if (strcmp(args[0], "unregister") == 0) {
		enum te_status st = te_mem_unregister(n->engine, n->base + n->guard);

		if (st != TE_OK)
			node_say("error te_mem_unregister: %s: %s", te_status_str(st),
				 te_last_error());
		else
			node_say("ok");
	} else if (strcmp(args[0], "register") == 0) {
		enum te_status st = te_mem_register(n->engine, n->base + n->guard, n->size,
						    n->location, TE_MEM_REMOTE);

		if (st != TE_OK)
			node_say("error te_mem_register: %s: %s", te_status_str(st),
				 te_last_error());
		else
			node_say("ok");
	} else {
		node_say("error unknown command '%s'", args[0]);
	}
	return TRUE;
}

/* Host (cpu, cpu:N) or device memory for the target's mapping. */
static gboolean node_on_host(const char *location)
{
	return strcmp(location, "cpu") == 0 || g_str_has_prefix(location, "cpu:");
}

static void node_unmap(struct node *n)
{
	enum te_status st;

	if (!n->bounce) {
		munmap(n->base, n->total);
		return;
	}
	st = te_mem_free(n->engine, n->base);
	if (st != TE_OK)
		fprintf(stderr, "te-node: te_mem_free: %s: %s\n", te_status_str(st),
			te_last_error());
	g_free(n->bounce);
}

static int node_target(struct te_engine *e, uint64_t size, uint64_t guard, const char *location)
{
	struct node n = { .engine = e, .guard = guard, .size = size, .location = location };
	char line[NODE_LINE_MAX];
	enum te_status st;
	void *map;

	n.total = guard + size + guard;
	if (node_on_host(location)) {
		map = mmap(NULL, n.total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			   0);
		if (map == MAP_FAILED) {
			fprintf(stderr, "te-node: mmap of %zu bytes: %s\n", n.total,
				strerror(errno));
			return 1;
		}
	} else {
		st = te_mem_alloc(e, location, n.total, &map);
		if (st != TE_OK) {
			fprintf(stderr, "te-node: te_mem_alloc(%s, %zu): %s: %s\n", location,
				n.total, te_status_str(st), te_last_error());
			te_engine_free(e);
			return 1;
		}
		n.bounce = g_malloc(NODE_BOUNCE);
	}
	n.base = map;
	if (!node_pattern(&n, 0, n.total, 0)) {
		node_unmap(&n);
		te_engine_free(e);
		return 1;
	}
	st = te_mem_register(e, n.base + guard, size, location, TE_MEM_REMOTE);
	if (st != TE_OK) {
		fprintf(stderr, "te-node: te_mem_register: %s: %s\n", te_status_str(st),
			te_last_error());
		node_unmap(&n);
		te_engine_free(e);
		return 1;
	}
	n.notifies = g_ptr_array_new_with_free_func(g_free);
	n.senders = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	node_say("segment: %s", te_engine_name(e));
	node_say("base: 0x%" PRIxPTR " %zu", (uintptr_t)n.base, n.total);
	node_say("buffer: 0x%" PRIxPTR " %zu", (uintptr_t)(n.base + guard), n.size);
	node_say("guard: 0x%" PRIxPTR " %zu", (uintptr_t)n.base, n.guard);
	node_say("guard: 0x%" PRIxPTR " %zu", (uintptr_t)(n.base + guard + size), n.guard);
	node_say("ready");
	while (fgets(line, sizeof(line), stdin)) {
		if (!strchr(line, '\n') && !feof(stdin)) {
			int c;

			/* Over-long line: drop the rest of it. */
			while ((c = getchar()) != EOF && c != '\n')
				;
			node_say("error command longer than %d bytes", NODE_LINE_MAX - 2);
			continue;
		}
		if (!node_command(&n, line))
			break;
	}
	g_ptr_array_free(n.notifies, TRUE);
	g_hash_table_destroy(n.senders);
	if (n.bounce) {
		/* Device memory goes back through the engine that allocated it. */
		st = te_mem_unregister(e, n.base + guard);
		if (st == TE_OK)
			node_unmap(&n); /* else the engine releases it */
		else
			g_free(n.bounce);
		te_engine_free(e);
		return 0;
	}
	/* The engine stops serving before the memory it serves goes away. */
	te_engine_free(e);
	node_unmap(&n);
	return 0;
}

/* Submit @n requests as one batch and wait; TE_OK or why not (printed). */
static enum te_status node_run(struct te_engine *e, const struct te_request *reqs, size_t n,
			       const char *what)
{
	te_batch_id b;
	enum te_status st;

	st = te_batch_new(e, (uint32_t)n, &b);
	if (st != TE_OK) {
		fprintf(stderr, "te-node: %s: te_batch_new: %s: %s\n", what, te_status_str(st),
			te_last_error());
		return st;
	}
	st = te_batch_submit(e, b, reqs, n);
	if (st != TE_OK)
		fprintf(stderr, "te-node: %s: te_batch_submit: %s: %s\n", what, te_status_str(st),
			te_last_error());
	st = te_batch_wait(e, b, NODE_WAIT_NS);
	if (st != TE_OK) {
		struct te_task_info ti;

		if (st == TE_INPROGRESS && te_batch_cancel(e, b) == TE_OK &&
		    te_batch_wait(e, b, NODE_WAIT_NS) == TE_INPROGRESS)
			fprintf(stderr, "te-node: %s: still not terminal after cancel\n", what);
		for (size_t i = 0; i < n; i++)
			if (te_task_status(e, b, (uint32_t)i, &ti) == TE_OK && ti.status != TE_OK)
				fprintf(stderr, "te-node: %s: task %zu %s: %s: %s\n", what, i,
					te_state_str(ti.state), te_status_str(ti.status),
					ti.detail);
	}
	if (te_batch_free(e, b) != TE_OK)
		fprintf(stderr, "te-node: %s: te_batch_free: %s\n", what, te_last_error());
	return st;
}

static int node_initiator(struct te_engine *e, const char *segment, uint64_t length,
			  gboolean verify)
{
	struct te_buffer_info buf;
	struct te_request req;
	te_segment_id seg;
	size_t nbuf = 0, bad = 0;
	uint8_t *local;
	const uint64_t skew = 3; /* remote offset: unaligned on purpose */
	uint64_t checked = MIN((uint64_t)SYSNODE_DUMP_MAX, length);
	enum te_status st;
	int rc = 1;

	st = te_segment_open(e, segment, &seg);
	if (st != TE_OK) {
		fprintf(stderr, "te-node: te_segment_open %s: %s: %s\n", segment, te_status_str(st),
			te_last_error());
		return 1;
	}
	st = te_segment_buffers(e, seg, &buf, 1, &nbuf);
	if (st != TE_OK) {
		fprintf(stderr, "te-node: te_segment_buffers: %s\n", te_last_error());
		goto out_close;
	}
	if (nbuf == 0 || buf.length < skew + length + checked) {
		fprintf(stderr, "te-node: segment %s: need a buffer of %" PRIu64 " bytes, %s\n",
			segment, skew + length + checked,
			nbuf ? "the first one is smaller" : "none is published");
		goto out_close;
	}
	/* [0, length): data to write; [length, 2 length): read back; then pattern 0 checks. */
	local = g_malloc(2 * length + checked + 1);
	st = te_mem_register(e, local, 2 * length + checked + 1, "cpu", TE_MEM_LOCAL);
	if (st != TE_OK) {
		fprintf(stderr, "te-node: te_mem_register: %s\n", te_last_error());
		goto out_free;
	}
	sysnode_fill(local, 0, length, 0x5eed);
	memset(local + length, 0, length + checked + 1);
	req = (struct te_request){ TE_OP_WRITE, seg, local, buf.addr + skew, length };
	if (node_run(e, &req, 1, "write") != TE_OK)
		goto out_unregister;
	req = (struct te_request){ TE_OP_READ, seg, local + length, buf.addr + skew, length };
	if (node_run(e, &req, 1, "read") != TE_OK)
		goto out_unregister;
	if (memcmp(local, local + length, length) != 0) {
		for (uint64_t k = 0; k < length; k++)
			bad += local[k] != local[length + k];
		fprintf(stderr, "te-node: %zu of %" PRIu64 " bytes read back differ\n", bad,
			length);
		goto out_unregister;
	}
	if (verify) {
		/* Bytes after the written range still hold pattern 0 (buffer-relative). */
		uint64_t at = skew + length;

		req = (struct te_request){ TE_OP_READ, seg, local + 2 * length + 1, buf.addr + at,
					   checked };
		if (node_run(e, &req, 1, "read untouched") != TE_OK)
			goto out_unregister;
		for (uint64_t k = 0; k < checked; k++) {
			if (local[2 * length + 1 + k] != sysnode_pattern(0, at + k)) {
				fprintf(stderr,
					"te-node: untouched byte +%" PRIu64 " is 0x%02x, "
					"expected 0x%02x\n",
					at + k, local[2 * length + 1 + k],
					sysnode_pattern(0, at + k));
				goto out_unregister;
			}
		}
	}
	node_say("initiator: %" PRIu64 " bytes written to %s at 0x%" PRIx64 " and read back",
		 length, segment, buf.addr + skew);
	node_say("verify ok");
	rc = 0;
out_unregister:
	if (te_mem_unregister(e, local) != TE_OK)
		fprintf(stderr, "te-node: te_mem_unregister: %s\n", te_last_error());
out_free:
	g_free(local);
out_close:
	if (te_segment_close(e, seg) != TE_OK)
		fprintf(stderr, "te-node: te_segment_close: %s\n", te_last_error());
	return rc;
}

int main(int argc, char **argv)
{
	g_autofree char *config = NULL, *yaml = NULL, *listen = NULL, *initiator = NULL;
	g_autofree char *size_s = NULL, *guard_s = NULL, *length_s = NULL, *location = NULL;
	gboolean verify = FALSE;
	GOptionEntry entries[] = {
		{ "config", 0, 0, G_OPTION_ARG_FILENAME, &config, "Engine YAML file", "FILE" },
		{ "yaml", 0, 0, G_OPTION_ARG_STRING, &yaml, "Engine YAML text", "STRING" },
		{ "listen", 0, 0, G_OPTION_ARG_STRING, &listen,
		  "Without --config/--yaml: listen here, tcp transport", "HOST:PORT" },
		{ "size", 0, 0, G_OPTION_ARG_STRING, &size_s, "Registered bytes", "BYTES" },
		{ "guard", 0, 0, G_OPTION_ARG_STRING, &guard_s,
		  "Unregistered bytes on each side (multiple of 4096)", "BYTES" },
		{ "initiator", 0, 0, G_OPTION_ARG_STRING, &initiator,
		  "Write, read back and compare on SEGMENT, then exit", "SEGMENT" },
		{ "length", 0, 0, G_OPTION_ARG_STRING, &length_s, "Initiator bytes (1 MiB)",
		  "BYTES" },
		{ "verify", 0, 0, G_OPTION_ARG_NONE, &verify,
		  "Initiator: also check untouched bytes", NULL },
		{ "location", 0, 0, G_OPTION_ARG_STRING, &location,
		  "Target: memory of the buffer (cpu; cuda:0 allocates it with te_mem_alloc)",
		  "LOC" },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	g_autoptr(GOptionContext) ctx = g_option_context_new("- te system test node");
	g_autoptr(GError) err = NULL;
	uint64_t size = SYSNODE_DEFAULT_SIZE, guard = SYSNODE_DEFAULT_GUARD, length = 1u << 20;
	struct te_engine *e;
	int rc;

	/* A test that dies must not leave its nodes behind. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		return 1;
	g_option_context_add_main_entries(ctx, entries, NULL);
	if (!g_option_context_parse(ctx, &argc, &argv, &err)) {
		fprintf(stderr, "te-node: %s\n", err->message);
		return 2;
	}
	if ((config != NULL) + (yaml != NULL) > 1) {
		fprintf(stderr, "te-node: --config and --yaml are mutually exclusive\n");
		return 2;
	}
	if ((size_s && (!node_parse_size(size_s, &size) || size == 0 || size > (1ull << 40))) ||
	    (guard_s &&
	     (!node_parse_size(guard_s, &guard) || guard % 4096 || guard > (1u << 30))) ||
	    (length_s &&
	     (!node_parse_size(length_s, &length) || length == 0 || length > (1ull << 32)))) {
		fprintf(stderr, "te-node: bad --size, --guard or --length\n");
		return 2;
	}
	e = node_engine(config, yaml, listen);
	if (!e)
		return 1;
	if (initiator) {
		rc = node_initiator(e, initiator, length, verify);
		te_engine_free(e);
		return rc;
	}
	return node_target(e, size, guard, location ? location : "cpu");
}
