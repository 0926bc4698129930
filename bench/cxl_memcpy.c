/* SPDX-License-Identifier: Apache-2.0 */
/* cxl_memcpy.c: the memcpy baseline of bench/compare-cxl.sh, on the window file te-bench uses. */

/*
 * cxl-memcpy --window FILE --op read|write --block SIZE --batch N [--duration SECONDS]
 *            [--threads T]
 *
 * Copies --block bytes at a time with memcpy between anonymous memory and a MAP_SHARED
 * mapping of FILE, with te-bench's layout: READ copies from FILE's first half, WRITE into
 * its second half, request k of a batch at k * block of that half, batch after batch until
 * --duration passes. With T threads (1 by default), thread t copies the requests k with
 * k % T == t. Every page is touched before timing. Prints one JSON line:
 * {"op": ..., "block_size": ..., "batch": ..., "threads": ..., "bytes": ..., "seconds": ...,
 * "gbps": ...} with GB/s in 10^9 bytes per second, like te-bench.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

struct job {
	uint8_t *dst, *src; /* request 0 */
	uint64_t block;
	uint32_t batch, threads, index;
	gint64 end_us;
	uint64_t bytes;
	gint64 t0_us, t1_us;
};

static gpointer job_main(gpointer data)
{
	struct job *j = data;

	j->t0_us = g_get_monotonic_time();
	do {
		for (uint64_t k = j->index; k < j->batch; k += j->threads) {
			memcpy(j->dst + k * j->block, j->src + k * j->block, j->block);
			j->bytes += j->block;
		}
		j->t1_us = g_get_monotonic_time();
	} while (j->t1_us < j->end_us);
	return NULL;
}

static gboolean parse_size(const char *s, uint64_t *out)
{
	char *end = NULL;
	guint64 v, mul = 1;

	if (!s || !*s || *s == '-')
		return FALSE;
	errno = 0;
	v = g_ascii_strtoull(s, &end, 10);
	if (errno || end == s)
		return FALSE;
	if (*end) {
		switch (g_ascii_toupper(*end)) {
		case 'K':
			mul = 1ull << 10;
			break;
		case 'M':
			mul = 1ull << 20;
			break;
		case 'G':
			mul = 1ull << 30;
			break;
		default:
			return FALSE;
		}
		end++;
		if (*end == 'i')
			end++;
		if (*end == 'B')
			end++;
		if (*end)
			return FALSE;
	}
	if (v == 0 || v > UINT64_MAX / mul)
		return FALSE;
	*out = v * mul;
	return TRUE;
}

int main(int argc, char **argv)
{
	g_autofree char *window = NULL, *op = NULL, *block_s = NULL;
	gint batch = 64, threads = 1;
	gdouble duration = 3.0;
	GOptionEntry entries[] = {
		{ "window", 0, 0, G_OPTION_ARG_FILENAME, &window, "Window file", "FILE" },
		{ "op", 0, 0, G_OPTION_ARG_STRING, &op, "read or write", "OP" },
		{ "block", 0, 0, G_OPTION_ARG_STRING, &block_s, "Bytes per copy (K/M/G)", "SIZE" },
		{ "batch", 0, 0, G_OPTION_ARG_INT, &batch, "Copies per batch [64]", "N" },
		{ "duration", 0, 0, G_OPTION_ARG_DOUBLE, &duration, "Seconds [3]", "S" },
		{ "threads", 0, 0, G_OPTION_ARG_INT, &threads, "Copying threads [1]", "T" },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	g_autoptr(GOptionContext) ctx = g_option_context_new("- memcpy baseline");
	g_autoptr(GError) err = NULL;
	uint64_t block = 0, area, half, bytes = 0;
	struct job jobs[64];
	GThread *tids[64];
	gint64 t_first = G_MAXINT64, t_last = 0;
	uint8_t *map, *local, *win;
	gboolean is_read;
	struct stat sb;
	gint64 t0, t1, end;
	int fd;

	g_option_context_add_main_entries(ctx, entries, NULL);
	if (!g_option_context_parse(ctx, &argc, &argv, &err)) {
		fprintf(stderr, "cxl-memcpy: %s\n", err->message);
		return 2;
	}
	if (!window || !op || (strcmp(op, "read") && strcmp(op, "write")) ||
	    !parse_size(block_s, &block) || batch < 1 || !(duration > 0) || threads < 1 ||
	    threads > 64 || threads > batch) {
		fprintf(stderr, "cxl-memcpy: need --window FILE --op read|write --block SIZE, "
				"--batch >= 1, --threads in [1, min(64, batch)], --duration > 0\n");
		return 2;
	}
	is_read = strcmp(op, "read") == 0;
	fd = open(window, O_RDWR | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) != 0) {
		fprintf(stderr, "cxl-memcpy: %s: %s\n", window, strerror(errno));
		return 1;
	}
	half = (uint64_t)sb.st_size / 2;
	area = block * (uint64_t)batch;
	if (area > half) {
		fprintf(stderr,
			"cxl-memcpy: %s: batch x block (%" PRIu64 ") exceeds half the file\n",
			window, area);
		return 1;
	}
	map = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	local = mmap(NULL, area, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED || local == MAP_FAILED) {
		fprintf(stderr, "cxl-memcpy: mmap: %s\n", strerror(errno));
		return 1;
	}
	win = is_read ? map : map + half;
	/* Touch both areas (first touch is slow here), then one untimed pass. */
	memset(local, 0x5a, area);
	for (uint64_t k = 0; k < (uint64_t)batch; k++)
		memcpy(is_read ? local + k * block : win + k * block,
		       is_read ? win + k * block : local + k * block, block);
	end = g_get_monotonic_time() + (gint64)(duration * 1e6);
	for (int t = 0; t < threads; t++) {
		jobs[t] = (struct job){ .dst = is_read ? local : win,
					.src = is_read ? win : local,
					.block = block,
					.batch = (uint32_t)batch,
					.threads = (uint32_t)threads,
					.index = (uint32_t)t,
					.end_us = end };
		tids[t] = g_thread_new("copy", job_main, &jobs[t]);
	}
	for (int t = 0; t < threads; t++) {
		g_thread_join(tids[t]);
		bytes += jobs[t].bytes;
		t_first = MIN(t_first, jobs[t].t0_us);
		t_last = MAX(t_last, jobs[t].t1_us);
	}
	t0 = t_first;
	t1 = t_last;
	printf("{\"op\": \"%s\", \"block_size\": %" PRIu64 ", \"batch\": %d, \"threads\": %d, "
	       "\"bytes\": %" PRIu64 ", \"seconds\": %.6f, \"gbps\": %.6f}\n",
	       op, block, batch, threads, bytes, (double)(t1 - t0) / 1e6,
	       (double)bytes / ((double)(t1 - t0) * 1e3));
	munmap(local, area);
	munmap(map, (size_t)sb.st_size);
	return 0;
}
