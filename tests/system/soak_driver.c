/* SPDX-License-Identifier: Apache-2.0 */
/* soak_driver.c: mixed READ/WRITE soak against a te-node that restarts, every byte checked. */

/*
 * Run by bench/soak.sh (built by meson, not a test). Starts a te-node target on loopback at a
 * fixed port, and until --minutes have passed submits batches of 1-8 READs and WRITEs of
 * random sizes (1 B .. --max-size, log-uniform) at random offsets of disjoint 4 MiB slots of
 * the target's 32 MiB; --cancel-pct of the batches are canceled after 0-3 ms. Every
 * --restart-every seconds the target is killed (SIGKILL, while a batch is in flight) and a
 * new one started at the same address.
 *
 * What the target holds is mirrored here: a COMPLETED WRITE makes its range known, a WRITE
 * that ended otherwise makes it unknown (its bytes may or may not have landed before its
 * status was reported), a restart resets everything to the new target's pattern 0. Every
 * COMPLETED READ is compared with the known bytes, and before each restart (and at the end)
 * every fully known slot is compared with the target's checksum: a stale WRITE landing after
 * its task ended shows up there or in a later READ.
 *
 * Statuses: COMPLETED is expected; CANCELED only in a canceled batch; FAILED with
 * TE_ERR_CONN_RESET, TE_ERR_PEER_RESTARTED, TE_ERR_PEER_UNREACHABLE or TE_ERR_AGAIN, and
 * TIMEOUT, only in the restart window (from the kill until --window seconds after the new
 * target is ready); anything else is unexpected. RSS and descriptors of this process and of the
 * target are sampled every --report-every seconds (the first sample, after one period, is the
 * baseline); the target's bounds use its samples right before each restart, so that
 * incarnations are compared at the same age (without restarts, the periodic samples).
 *
 * Exit 0 when there was no unexpected status, no verification failure, and neither process
 * grew beyond the bounds (RSS +64 MiB, descriptors +8 over the first sample); 1 otherwise.
 * The last line is "soak: summary ...".
 */

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib.h>

#include <te/te.h>

#include "sysnode.h"
#include "sysnode_fixture.h"

#define SLOTS 8u
#define SLOT (4u << 20)
#define TARGET (SLOTS * SLOT)
#define RSS_BOUND_KB (64l << 10)
#define FD_BOUND 8

static struct {
	double minutes;
	int restart_every_s, report_every_s, window_s, cancel_pct, timeout_ms, port;
	uint64_t max_size;
	uint32_t seed;
} opt = {
	.minutes = 10,
	.restart_every_s = 60,
	.report_every_s = 60,
	.window_s = 10,
	.cancel_pct = 20,
	.timeout_ms = 5000,
	.max_size = 4u << 20,
};

struct stats {
	uint64_t batches, tasks, canceled_batches, restarts, bytes_completed, bytes_verified;
	uint64_t unexpected, verify_failures, slot_checks;
	GHashTable *by_status; /* "STATE/status" -> count */
};

static long proc_kb(const char *pid)
{
	g_autofree char *path = g_strdup_printf("/proc/%s/status", pid);
	g_autofree char *text = NULL;
	const char *p;

	if (!g_file_get_contents(path, &text, NULL, NULL) || !(p = strstr(text, "VmRSS:")))
		return -1;
	return strtol(p + 6, NULL, 10);
}

static int proc_fd_count(const char *pid)
{
	g_autofree char *path = g_strdup_printf("/proc/%s/fd", pid);
	g_autoptr(GDir) d = g_dir_open(path, 0, NULL);
	int n = 0;

	while (d && g_dir_read_name(d))
		n++;
	return d ? n : -1;
}

static struct node *target_start(const char *yaml)
{
	const char *argv[] = { node_path, "--yaml", yaml, "--size", "32M", NULL };

	return node_start_argv(argv);
}

/* Log-uniform in [1, max]. */
static uint64_t rand_size(GRand *rnd)
{
	unsigned bits = 0;
	uint64_t lo, hi;

	while ((1ull << (bits + 1)) <= opt.max_size)
		bits++;
	bits = (unsigned)g_rand_int_range(rnd, 0, (gint32)bits + 1);
	lo = 1ull << bits;
	hi = MIN(opt.max_size, (lo << 1) - 1);
	return lo + (uint64_t)g_rand_double_range(rnd, 0, (double)(hi - lo + 1));
}

static void count_status(struct stats *s, const struct te_task_info *ti)
{
	g_autofree char *k =
		ti->state == TE_STATE_COMPLETED
			? g_strdup("COMPLETED")
			: g_strdup_printf("%s/%d", te_state_str(ti->state), ti->status);
	gpointer v = g_hash_table_lookup(s->by_status, k);

	g_hash_table_insert(s->by_status, g_strdup(k), GSIZE_TO_POINTER(GPOINTER_TO_SIZE(v) + 1));
}

static char *status_list(const struct stats *s)
{
	g_autoptr(GList) keys =
		g_list_sort(g_hash_table_get_keys(s->by_status), (GCompareFunc)strcmp);
	GString *o = g_string_new(NULL);

	for (GList *k = keys; k; k = k->next)
		g_string_append_printf(
			o, "%s%s:%zu", k == keys ? "" : ",", (const char *)k->data,
			GPOINTER_TO_SIZE(g_hash_table_lookup(s->by_status, k->data)));
	return g_string_free(o, FALSE);
}

static bool window_status(const struct te_task_info *ti)
{
	if (ti->state == TE_STATE_TIMEOUT)
		return true;
	/* TE_ERR_AGAIN: retries used up on a lane reset to cancel another batch's WRITE. */
	return ti->state == TE_STATE_FAILED &&
	       (ti->status == TE_ERR_CONN_RESET || ti->status == TE_ERR_PEER_RESTARTED ||
		ti->status == TE_ERR_PEER_UNREACHABLE || ti->status == TE_ERR_AGAIN);
}

/* Every slot whose bytes are all known matches the target's checksum. */
static void check_slots(struct node *n, const uint8_t *mirror, const uint8_t *known,
			struct stats *s, const char *when)
{
	for (unsigned k = 0; k < SLOTS; k++) {
		const uint8_t *m = mirror + (size_t)k * SLOT;
		bool all = true;

		for (size_t j = 0; j < SLOT && all; j++)
			all = known[(size_t)k * SLOT + j];
		if (!all)
			continue;
		s->slot_checks++;
		if (node_checksum(n, n->guard + (uint64_t)k * SLOT, SLOT) != sysnode_fnv(m, SLOT)) {
			s->verify_failures++;
			printf("soak: VERIFY: %s: slot %u (4 MiB at +%u) does not hold what the last "
			       "completed WRITEs left there\n",
			       when, k, k * SLOT);
		}
	}
}

static void mirror_reset(uint8_t *mirror, uint8_t *known, uint64_t guard)
{
	sysnode_fill(mirror, guard, TARGET, 0);
	memset(known, 1, TARGET);
}

int main(int argc, char **argv)
{
	g_autofree char *te_node = NULL;
	GOptionEntry entries[] = {
		{ "te-node", 0, 0, G_OPTION_ARG_FILENAME, &te_node, "te-node program", "PATH" },
		{ "minutes", 0, 0, G_OPTION_ARG_DOUBLE, &opt.minutes, "Run time (10)", "M" },
		{ "restart-every", 0, 0, G_OPTION_ARG_INT, &opt.restart_every_s,
		  "Restart the target every S seconds (60; 0: never)", "S" },
		{ "report-every", 0, 0, G_OPTION_ARG_INT, &opt.report_every_s,
		  "Sample RSS/fds and print a line every S seconds (60)", "S" },
		{ "window", 0, 0, G_OPTION_ARG_INT, &opt.window_s,
		  "Restart window after the new target is ready (10 s)", "S" },
		{ "cancel-pct", 0, 0, G_OPTION_ARG_INT, &opt.cancel_pct, "Batches canceled (20)",
		  "PCT" },
		{ "timeout-ms", 0, 0, G_OPTION_ARG_INT, &opt.timeout_ms,
		  "transfer.timeout_ms of the initiator (5000)", "MS" },
		{ "port", 0, 0, G_OPTION_ARG_INT, &opt.port, "Target control port (random)",
		  "PORT" },
		{ "seed", 0, 0, G_OPTION_ARG_INT, &opt.seed, "Random seed (from the clock)", "N" },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	g_autoptr(GOptionContext) ctx = g_option_context_new("- te soak driver");
	g_autoptr(GError) err = NULL;
	struct stats s = { 0 };
	g_autofree char *yaml_t = NULL, *yaml_i = NULL;
	struct node *n;
	struct te_engine *e = NULL;
	te_segment_id seg;
	struct lbuf l;
	uint8_t *mirror, *known;
	GRand *rnd;
	int64_t t0, t_end, next_restart, next_report, window_end = 0;
	long i_rss0 = -1, i_rss_max = 0, t_rss0 = -1, t_rss_max = 0;
	int i_fd0 = -1, i_fd_max = 0, t_fd0 = -1, t_fd_max = 0;
	uint64_t seed_ctr = 1000;
	bool ok;

	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, BUFSIZ);
	g_option_context_add_main_entries(ctx, entries, NULL);
	if (!g_option_context_parse(ctx, &argc, &argv, &err)) {
		fprintf(stderr, "soak: %s\n", err->message);
		return 2;
	}
	node_path = te_node ? g_strdup(te_node) : find_te_node();
	if (!node_path || opt.minutes <= 0 || opt.report_every_s <= 0 || opt.cancel_pct < 0 ||
	    opt.cancel_pct > 100 || opt.timeout_ms <= 0) {
		fprintf(stderr, "soak: bad options or no te-node (--te-node PATH)\n");
		return 2;
	}
	if (!opt.seed)
		opt.seed = (uint32_t)g_get_real_time();
	if (!opt.port)
		opt.port = 20000 + (int)(getpid() % 20000);
	rnd = g_rand_new_with_seed(opt.seed);
	yaml_t = g_strdup_printf("engine: {listen: \"127.0.0.1:%d\"}\n"
				 "transports:\n  - name: tcp\n    required: true\n",
				 opt.port);
	yaml_i = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
				 "transfer: {timeout_ms: %d}\n"
				 "transports:\n  - name: tcp\n    required: true\n",
				 opt.timeout_ms);
	s.by_status = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	printf("soak: %.1f min, restart every %d s, cancel %d%%, sizes 1..%" PRIu64
	       " B, timeout %d ms, seed %u, target 127.0.0.1:%d\n",
	       opt.minutes, opt.restart_every_s, opt.cancel_pct, opt.max_size, opt.timeout_ms,
	       opt.seed, opt.port);

	n = target_start(yaml_t);
	if (te_engine_new_from_string(yaml_i, strlen(yaml_i), &e) != TE_OK) {
		fprintf(stderr, "soak: initiator engine: %s\n", te_last_error());
		return 1;
	}
	if (te_segment_open(e, n->segment, &seg) != TE_OK) {
		fprintf(stderr, "soak: te_segment_open %s: %s\n", n->segment, te_last_error());
		return 1;
	}
	lbuf_new(&l, e, TARGET);
	mirror = g_malloc(TARGET);
	known = g_malloc(TARGET);
	mirror_reset(mirror, known, n->guard);

	t0 = now_ns();
	t_end = t0 + (int64_t)(opt.minutes * 60 * S_NS);
	next_restart = opt.restart_every_s > 0 ? t0 + opt.restart_every_s * S_NS : INT64_MAX;
	next_report = t0 + opt.report_every_s * S_NS;
	while (now_ns() < t_end) {
		struct te_request q[SLOTS];
		unsigned slot[SLOTS], nq = 1 + (unsigned)g_rand_int_range(rnd, 0, SLOTS);
		uint64_t off[SLOTS], seeds[SLOTS];
		struct te_buffer_info bi;
		size_t nb = 0;
		te_batch_id b;
		bool cancel = g_rand_int_range(rnd, 0, 100) < opt.cancel_pct;
		bool restart = now_ns() >= next_restart;
		bool in_window;
		enum te_status st;

		if (restart) {
			/* Each incarnation at the same age: right before it is killed. */
			long trss = proc_kb(n->pid);
			int tfd = proc_fd_count(n->pid);

			check_slots(n, mirror, known, &s, "before a restart");
			if (t_rss0 < 0) {
				t_rss0 = trss;
				t_fd0 = tfd;
			}
			t_rss_max = MAX(t_rss_max, trss);
			t_fd_max = MAX(t_fd_max, tfd);
			printf("soak: t=%.0fs target before restart %" PRIu64
			       ": rss_kb=%ld fds=%d\n",
			       (now_ns() - t0) / 1e9, s.restarts + 1, trss, tfd);
		}
		if (te_segment_buffers(e, seg, &bi, 1, &nb) != TE_OK || nb != 1)
			bi.addr = n->buf; /* a restart in progress: try the last known address */
		for (unsigned i = 0; i < SLOTS; i++)
			slot[i] = i;
		for (unsigned i = SLOTS - 1; i > 0; i--) {
			unsigned j = (unsigned)g_rand_int_range(rnd, 0, (gint32)i + 1), t = slot[i];

			slot[i] = slot[j];
			slot[j] = t;
		}
		for (unsigned i = 0; i < nq; i++) {
			uint64_t len = rand_size(rnd);
			uint64_t base = (uint64_t)slot[i] * SLOT;
			bool wr = g_rand_boolean(rnd);

			off[i] = base +
				 (uint64_t)g_rand_double_range(rnd, 0, (double)(SLOT - len + 1));
			seeds[i] = ++seed_ctr;
			if (wr)
				sysnode_fill(l.p + off[i], n->guard + off[i], len, seeds[i]);
			else
				memset(l.p + off[i], 0xee, len);
			q[i] = (struct te_request){ wr ? TE_OP_WRITE : TE_OP_READ, seg,
						    l.p + off[i], bi.addr + off[i], len };
		}
		if (te_batch_new(e, nq, &b) != TE_OK) {
			fprintf(stderr, "soak: te_batch_new: %s\n", te_last_error());
			return 1;
		}
		(void)!te_batch_submit(e, b, q, nq); /* rejections show up as INVALID tasks */
		if (restart) {
			/* Mid-batch: the target dies with this batch in flight. */
			g_subprocess_send_signal(n->proc, SIGKILL);
			window_end = INT64_MAX;
		}
		if (cancel) {
			g_usleep((gulong)g_rand_int_range(rnd, 0, 3000));
			if (te_batch_cancel(e, b) != TE_OK)
				fprintf(stderr, "soak: te_batch_cancel: %s\n", te_last_error());
			s.canceled_batches++;
		}
		watchdog_arm((unsigned)opt.timeout_ms / 1000 + 60, "te_batch_wait");
		st = te_batch_wait(e, b, (int64_t)(opt.timeout_ms + 30000) * MS_NS);
		watchdog_disarm();
		if (st == TE_INPROGRESS) {
			s.unexpected++;
			printf("soak: UNEXPECTED: a batch not terminal %d ms past its deadline\n",
			       30000);
			(void)!te_batch_cancel(e, b);
			(void)!te_batch_wait(e, b, 30 * S_NS);
		}
		in_window = now_ns() < window_end;
		for (unsigned i = 0; i < nq; i++) {
			struct te_task_info ti;
			bool wr = q[i].opcode == TE_OP_WRITE, expected;

			if (te_task_status(e, b, i, &ti) != TE_OK) {
				fprintf(stderr, "soak: te_task_status: %s\n", te_last_error());
				return 1;
			}
			s.tasks++;
			count_status(&s, &ti);
			if (ti.state == TE_STATE_COMPLETED) {
				expected = true;
				s.bytes_completed += q[i].length;
				if (wr) {
					memcpy(mirror + off[i], l.p + off[i], q[i].length);
					memset(known + off[i], 1, q[i].length);
				} else {
					uint64_t bad = 0, first = 0;

					for (uint64_t k = 0; k < q[i].length; k++) {
						if (known[off[i] + k] &&
						    l.p[off[i] + k] != mirror[off[i] + k] && !bad++)
							first = k;
					}
					if (bad) {
						s.verify_failures++;
						printf("soak: VERIFY: READ of %" PRIu64
						       " B at +%" PRIu64 ": %" PRIu64
						       " bytes differ, first at +%" PRIu64 "\n",
						       q[i].length, off[i], bad, off[i] + first);
					} else {
						s.bytes_verified += q[i].length;
					}
				}
				continue;
			}
			expected = (ti.state == TE_STATE_CANCELED && cancel) ||
				   (in_window && window_status(&ti));
			if (wr)
				memset(known + off[i], 0, q[i].length);
			if (!expected) {
				s.unexpected++;
				printf("soak: UNEXPECTED: %s of %" PRIu64 " B: %s (%d) %s%s\n",
				       wr ? "WRITE" : "READ", q[i].length, te_state_str(ti.state),
				       ti.status, ti.detail, in_window ? " (restart window)" : "");
			}
		}
		{
			int64_t end = now_ns() + 10 * S_NS;

			while ((st = te_batch_free(e, b)) == TE_ERR_BUSY && now_ns() < end)
				sleep_ms(1);
			if (st != TE_OK) {
				s.unexpected++;
				printf("soak: UNEXPECTED: te_batch_free: %s\n", te_status_str(st));
			}
		}
		s.batches++;
		if (restart) {
			node_kill(n);
			node_release(n);
			n = target_start(yaml_t);
			mirror_reset(mirror, known, n->guard);
			window_end = now_ns() + opt.window_s * S_NS;
			s.restarts++;
			next_restart = now_ns() + opt.restart_every_s * S_NS;
		}
		if (now_ns() >= next_report || now_ns() >= t_end) {
			long irss = proc_kb("self"), trss = proc_kb(n->pid);
			int ifd = proc_fd_count("self"), tfd = proc_fd_count(n->pid);
			g_autofree char *sl = status_list(&s);

			next_report = now_ns() + opt.report_every_s * S_NS;
			if (i_rss0 < 0) {
				i_rss0 = irss;
				i_fd0 = ifd;
			}
			i_rss_max = MAX(i_rss_max, irss);
			i_fd_max = MAX(i_fd_max, ifd);
			if (opt.restart_every_s <= 0) {
				/* No restarts: the one target is sampled with this process. */
				if (t_rss0 < 0) {
					t_rss0 = trss;
					t_fd0 = tfd;
				}
				t_rss_max = MAX(t_rss_max, trss);
				t_fd_max = MAX(t_fd_max, tfd);
			}
			printf("soak: t=%.0fs batches=%" PRIu64 " tasks=%" PRIu64
			       " restarts=%" PRIu64 " verified_MiB=%.1f unexpected=%" PRIu64
			       " verify_failures=%" PRIu64
			       " initiator_rss_kb=%ld initiator_fds=%d target_rss_kb=%ld "
			       "target_fds=%d statuses=%s\n",
			       (now_ns() - t0) / 1e9, s.batches, s.tasks, s.restarts,
			       s.bytes_verified / 1048576.0, s.unexpected, s.verify_failures, irss,
			       ifd, trss, tfd, sl);
		}
	}
	check_slots(n, mirror, known, &s, "at the end");

	ok = s.unexpected == 0 && s.verify_failures == 0;
	if (i_rss_max > i_rss0 + RSS_BOUND_KB || t_rss_max > t_rss0 + RSS_BOUND_KB) {
		printf("soak: GROWTH: RSS first/max: initiator %ld/%ld KiB, target %ld/%ld KiB "
		       "(bound +%ld KiB)\n",
		       i_rss0, i_rss_max, t_rss0, t_rss_max, RSS_BOUND_KB);
		ok = false;
	}
	if (i_fd_max > i_fd0 + FD_BOUND || t_fd_max > t_fd0 + FD_BOUND) {
		printf("soak: GROWTH: descriptors first/max: initiator %d/%d, target %d/%d (bound "
		       "+%d)\n",
		       i_fd0, i_fd_max, t_fd0, t_fd_max, FD_BOUND);
		ok = false;
	}
	{
		g_autofree char *sl = status_list(&s);

		printf("soak: summary minutes=%.1f batches=%" PRIu64 " tasks=%" PRIu64
		       " canceled_batches=%" PRIu64 " restarts=%" PRIu64
		       " completed_MiB=%.1f verified_MiB=%.1f slot_checks=%" PRIu64
		       " unexpected=%" PRIu64 " verify_failures=%" PRIu64
		       " initiator_rss_kb=%ld..%ld initiator_fds=%d..%d target_rss_kb=%ld..%ld "
		       "target_fds=%d..%d statuses=%s result=%s\n",
		       (now_ns() - t0) / 6e10, s.batches, s.tasks, s.canceled_batches, s.restarts,
		       s.bytes_completed / 1048576.0, s.bytes_verified / 1048576.0, s.slot_checks,
		       s.unexpected, s.verify_failures, i_rss0, i_rss_max, i_fd0, i_fd_max, t_rss0,
		       t_rss_max, t_fd0, t_fd_max, sl, ok ? "pass" : "FAIL");
	}
	if (te_mem_unregister(e, l.p) == TE_OK)
		g_aligned_free(l.p);
	(void)!te_segment_close(e, seg);
	te_engine_free(e);
	node_close_free(n, 10000, true);
	g_free(mirror);
	g_free(known);
	g_rand_free(rnd);
	g_hash_table_destroy(s.by_status);
	return ok ? 0 : 1;
}
