/* SPDX-License-Identifier: Apache-2.0 */
/* cxl-node.c: a te engine in its own process that serves, or writes into, a shared CXL window. */

/*
 * Target mode (--window FILE): create the engine from --yaml, map FILE MAP_SHARED (this is
 * the application's own mapping, not the plugin's), fill bytes [--offset, +--size) of it with
 * pattern --seed (cxlnode.h; offsets relative to the buffer), register that range as cxl:0
 * for remote READ and WRITE, print
 *
 *   segment: <te_engine_name>
 *   buffer: 0x<addr> <bytes>
 *   ready
 *
 * and answer commands on stdin, one per line (offsets relative to the buffer):
 *
 *   fill <off> <len> <seed>    ok
 *   check <off> <len> <seed>   check <index of the first differing byte, or len>
 *   quit                       exits 0; so does the end of stdin
 *
 * Allocating target mode (--alloc): the same, but the buffer is --size bytes that
 * te_mem_alloc_registered hands out at cxl:0 (the plugin's alloc_offset/alloc_size options in
 * --yaml say where in the window); "quit" frees it with te_mem_free, which must succeed.
 *
 * Writer mode (--writer SEGMENT): open SEGMENT, and --rounds times WRITE, as one batch,
 * --len bytes at offsets k * --stride of its first buffer for every k < --count with
 * k % 2 == --parity; round r sends pattern --seed + r. It prints "ready" once the segment is
 * open, starts on a line "go", then prints "done <rounds> <start> <end>" (CLOCK_MONOTONIC
 * microseconds, as g_get_monotonic_time) and exits 0, or says what failed on stderr and
 * exits 1.
 */

#include <errno.h>
#include <fcntl.h>
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

#include "cxlnode.h"

#define NODE_LINE_MAX 256
#define NODE_WAIT_NS (60ll * 1000 * 1000 * 1000)

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

static gboolean node_parse(const char *s, uint64_t *out)
{
	char *end = NULL;
	guint64 v;

	if (!s || !*s || *s == '-')
		return FALSE;
	errno = 0;
	v = g_ascii_strtoull(s, &end, 0);
	if (errno || end == s || *end)
		return FALSE;
	*out = v;
	return TRUE;
}

/* Serve fill and check commands on @buf (@size bytes) until "quit" or the end of stdin. */
static void node_serve(uint8_t *buf, uint64_t size)
{
	char line[NODE_LINE_MAX];

	while (fgets(line, sizeof(line), stdin)) {
		g_auto(GStrv) a = g_strsplit_set(g_strstrip(line), " \t", -1);
		uint64_t off, len, sd;

		if (!a[0] || !*a[0])
			continue;
		if (strcmp(a[0], "quit") == 0)
			break;
		if ((strcmp(a[0], "fill") && strcmp(a[0], "check")) || !a[1] || !a[2] || !a[3] ||
		    !node_parse(a[1], &off) || !node_parse(a[2], &len) || !node_parse(a[3], &sd) ||
		    off > size || len > size - off) {
			node_say("error expected fill|check <off> <len> <seed> inside the buffer");
			continue;
		}
		if (a[0][0] == 'f') {
			cxlnode_fill(buf + off, off, len, sd);
			node_say("ok");
		} else {
			node_say("check %zu", cxlnode_check(buf + off, off, len, sd));
		}
	}
}

/* Allocating target: the buffer comes from te_mem_alloc_registered at cxl:0. */
static int node_alloc_target(struct te_engine *e, uint64_t size, uint64_t seed)
{
	enum te_status st;
	void *buf = NULL;

	st = te_mem_alloc_registered(e, "cxl:0", size, TE_MEM_REMOTE, &buf);
	if (st != TE_OK) {
		fprintf(stderr, "cxl-node: te_mem_alloc_registered: %s: %s\n", te_status_str(st),
			te_last_error());
		te_engine_free(e);
		return 1;
	}
	cxlnode_fill(buf, 0, size, seed);
	node_say("segment: %s", te_engine_name(e));
	node_say("buffer: 0x%" PRIxPTR " %" PRIu64, (uintptr_t)buf, size);
	node_say("ready");
	node_serve(buf, size);
	st = te_mem_free(e, buf);
	if (st != TE_OK)
		fprintf(stderr, "cxl-node: te_mem_free: %s: %s\n", te_status_str(st),
			te_last_error());
	te_engine_free(e);
	return st == TE_OK ? 0 : 1;
}

static int node_target(struct te_engine *e, const char *window, uint64_t offset, uint64_t size,
		       uint64_t seed)
{
	enum te_status st;
	uint8_t *map, *buf;
	uint64_t total = offset + size;
	int fd;

	fd = open(window, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "cxl-node: open %s: %s\n", window, strerror(errno));
		return 1;
	}
	map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED) {
		fprintf(stderr, "cxl-node: mmap %s: %s\n", window, strerror(errno));
		return 1;
	}
	buf = map + offset;
	cxlnode_fill(buf, 0, size, seed);
	st = te_mem_register(e, buf, size, "cxl:0", TE_MEM_REMOTE);
	if (st != TE_OK) {
		fprintf(stderr, "cxl-node: te_mem_register: %s: %s\n", te_status_str(st),
			te_last_error());
		munmap(map, total);
		return 1;
	}
	node_say("segment: %s", te_engine_name(e));
	node_say("buffer: 0x%" PRIxPTR " %" PRIu64, (uintptr_t)buf, size);
	node_say("ready");
	node_serve(buf, size);
	/* The engine stops before the memory it serves goes away. */
	te_engine_free(e);
	munmap(map, total);
	return 0;
}

static int node_writer(struct te_engine *e, const char *segment, uint64_t stride, uint64_t len,
		       uint64_t count, uint64_t parity, uint64_t rounds, uint64_t seed)
{
	struct te_buffer_info bi;
	struct te_request *reqs;
	te_segment_id seg;
	size_t nbuf = 0, n = 0;
	uint8_t *local;
	enum te_status st;
	char go[16];
	gint64 t0;
	int rc = 1;

	st = te_segment_open(e, segment, &seg);
	if (st != TE_OK) {
		fprintf(stderr, "cxl-node: te_segment_open %s: %s: %s\n", segment,
			te_status_str(st), te_last_error());
		return 1;
	}
	st = te_segment_buffers(e, seg, &bi, 1, &nbuf);
	if (st != TE_OK || nbuf == 0 || bi.length < stride * count) {
		fprintf(stderr, "cxl-node: segment %s has no buffer of %" PRIu64 " bytes\n",
			segment, stride * count);
		return 1;
	}
	local = g_malloc(stride * count);
	reqs = g_new0(struct te_request, count);
	st = te_mem_register(e, local, stride * count, "cpu", TE_MEM_LOCAL);
	if (st != TE_OK) {
		fprintf(stderr, "cxl-node: te_mem_register: %s\n", te_last_error());
		goto out_free;
	}
	for (uint64_t k = parity; k < count; k += 2)
		reqs[n++] = (struct te_request){ TE_OP_WRITE, seg, local + k * stride,
						 bi.addr + k * stride, len };
	/* Start together with the other writers: the test says when. */
	node_say("ready");
	if (!fgets(go, sizeof(go), stdin) || strncmp(go, "go", 2) != 0) {
		fprintf(stderr, "cxl-node: expected \"go\" on stdin\n");
		goto out_unregister;
	}
	t0 = g_get_monotonic_time();
	for (uint64_t r = 0; r < rounds; r++) {
		te_batch_id b;

		for (uint64_t k = parity; k < count; k += 2)
			cxlnode_fill(local + k * stride, k * stride, len, seed + r);
		st = te_batch_new(e, (uint32_t)n, &b);
		if (st == TE_OK) {
			st = te_batch_submit(e, b, reqs, n);
			if (st == TE_OK)
				st = te_batch_wait(e, b, NODE_WAIT_NS);
			if (st != TE_OK)
				fprintf(stderr, "cxl-node: round %" PRIu64 ": %s: %s\n", r,
					te_status_str(st), te_last_error());
			if (te_batch_free(e, b) != TE_OK && st == TE_OK)
				st = TE_ERR_BUSY;
		}
		if (st != TE_OK)
			goto out_unregister;
	}
	node_say("done %" PRIu64 " %" G_GINT64_FORMAT " %" G_GINT64_FORMAT, rounds, t0,
		 g_get_monotonic_time());
	rc = 0;
out_unregister:
	if (te_mem_unregister(e, local) != TE_OK) {
		fprintf(stderr, "cxl-node: te_mem_unregister: %s\n", te_last_error());
		rc = 1;
	}
out_free:
	g_free(reqs);
	g_free(local);
	return rc;
}

int main(int argc, char **argv)
{
	g_autofree char *yaml = NULL, *window = NULL, *writer = NULL;
	gint64 offset = 0, size = 1 << 20, seed = 0, stride = 100, len = 100, count = 1000;
	gint64 parity = 0, rounds = 1;
	gboolean alloc = FALSE;
	GOptionEntry entries[] = {
		{ "yaml", 0, 0, G_OPTION_ARG_STRING, &yaml, "Engine YAML text", "STRING" },
		{ "window", 0, 0, G_OPTION_ARG_FILENAME, &window, "Target: the window file",
		  "FILE" },
		{ "offset", 0, 0, G_OPTION_ARG_INT64, &offset, "Target: buffer offset in FILE",
		  "N" },
		{ "size", 0, 0, G_OPTION_ARG_INT64, &size, "Target: buffer bytes", "N" },
		{ "seed", 0, 0, G_OPTION_ARG_INT64, &seed, "Pattern seed (writer: of round 0)",
		  "N" },
		{ "alloc", 0, 0, G_OPTION_ARG_NONE, &alloc,
		  "Target: the buffer from te_mem_alloc_registered (cxl:0)", NULL },
		{ "writer", 0, 0, G_OPTION_ARG_STRING, &writer, "Write into SEGMENT", "SEGMENT" },
		{ "stride", 0, 0, G_OPTION_ARG_INT64, &stride, "Writer: bytes between ranges",
		  "N" },
		{ "len", 0, 0, G_OPTION_ARG_INT64, &len, "Writer: bytes per range", "N" },
		{ "count", 0, 0, G_OPTION_ARG_INT64, &count, "Writer: ranges (both parities)",
		  "N" },
		{ "parity", 0, 0, G_OPTION_ARG_INT64, &parity, "Writer: 0 or 1", "N" },
		{ "rounds", 0, 0, G_OPTION_ARG_INT64, &rounds, "Writer: batches", "N" },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	g_autoptr(GOptionContext) ctx = g_option_context_new("- cxl test node");
	g_autoptr(GError) err = NULL;
	struct te_engine *e = NULL;
	enum te_status st;
	int rc;

	/* A test that dies must not leave its nodes behind. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		return 1;
	g_option_context_add_main_entries(ctx, entries, NULL);
	if (!g_option_context_parse(ctx, &argc, &argv, &err)) {
		fprintf(stderr, "cxl-node: %s\n", err->message);
		return 2;
	}
	if (!yaml || (!!window + !!writer + !!alloc) != 1 || offset < 0 || size <= 0 || seed < 0 ||
	    stride <= 0 || len <= 0 || len > stride || count <= 0 || count > (1 << 20) ||
	    parity < 0 || parity > 1 || rounds <= 0) {
		fprintf(stderr,
			"cxl-node: need --yaml and one of --window, --alloc, --writer; sizes > 0\n");
		return 2;
	}
	st = te_engine_new_from_string(yaml, strlen(yaml), &e);
	if (st != TE_OK) {
		fprintf(stderr, "cxl-node: cannot create the engine: %s: %s\n", te_status_str(st),
			te_last_error());
		return 1;
	}
	if (alloc)
		return node_alloc_target(e, (uint64_t)size, (uint64_t)seed);
	if (window)
		return node_target(e, window, (uint64_t)offset, (uint64_t)size, (uint64_t)seed);
	rc = node_writer(e, writer, (uint64_t)stride, (uint64_t)len, (uint64_t)count,
			 (uint64_t)parity, (uint64_t)rounds, (uint64_t)seed);
	te_engine_free(e);
	return rc;
}
