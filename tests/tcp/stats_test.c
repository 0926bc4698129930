/* SPDX-License-Identifier: Apache-2.0 */
/* stats_test.c: te_engine_stats and the tcp transport's stats: lanes configured and used. */
#include "itest.h"
#include "lanes_settle.h"

#include <json-glib/json-glib.h>
#include <sched.h>

#define KiB 1024u
#define MiB (1024u * 1024u)

/* The engine's stats, parsed; the root is an object (asserted). */
static JsonParser *stats_of(struct te_engine *e)
{
	g_autoptr(GError) err = NULL;
	JsonParser *parser = json_parser_new();
	char *json = NULL;

	assert_ok(te_engine_stats(e, &json));
	g_assert_nonnull(json);
	if (!json_parser_load_from_data(parser, json, -1, &err))
		g_error("te_engine_stats gave no JSON (%s): %s", err->message, json);
	g_assert_true(JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)));
	te_free(json);
	return parser;
}

/* The "tcp" member of @parser's root. */
static JsonObject *tcp_of(JsonParser *parser)
{
	JsonObject *root = json_node_get_object(json_parser_get_root(parser));

	g_assert_true(json_object_has_member(root, "tcp"));
	return json_object_get_object_member(root, "tcp");
}

/* The one peer tcp reports (the pair's other engine). */
static JsonObject *only_peer(JsonObject *tcp, const char *name)
{
	JsonArray *peers = json_object_get_array_member(tcp, "peers");
	JsonObject *peer;

	g_assert_cmpuint(json_array_get_length(peers), ==, 1);
	peer = json_array_get_object_element(peers, 0);
	g_assert_cmpstr(json_object_get_string_member(peer, "name"), ==, name);
	assert_contains(json_object_get_string_member(peer, "address"), "127.0.0.1:");
	return peer;
}

static int64_t lane_int(JsonObject *peer, guint lane, const char *key)
{
	JsonArray *lanes = json_object_get_array_member(peer, "lanes");

	return json_object_get_int_member(json_array_get_object_element(lanes, lane), key);
}

/*
 * A pair A -> B over tcp with @options, A's local buffer @la and B's remote buffer @rb
 * (guarded, filled from @fa and @fb) registered, and A's segment of B open. Not itest_fx,
 * which sizes both alike and seeds them 1 and 2: one case needs 8 and 12 MiB, and each case
 * seeds its own.
 */
static void pair_up(struct itest_pair *p, const char *options, struct itest_buf *la, size_t la_len,
		    uint32_t fa, struct itest_buf *rb, size_t rb_len, uint32_t fb)
{
	itest_pair_new(p, "tcp", options, "timeout_ms: 60000");
	itest_buf_new(la, la_len, 4096, fa);
	itest_buf_new(rb, rb_len, 4096, fb);
	itest_buf_register(la, p->a, TE_MEM_LOCAL);
	itest_buf_register(rb, p->b, TE_MEM_REMOTE);
	itest_pair_connect(p);
}

static void pair_down(struct itest_pair *p, struct itest_buf *la, struct itest_buf *rb)
{
	itest_pair_free(p);
	itest_buf_free(la);
	itest_buf_free(rb);
}

/* @n requests of @len bytes each, @op, on disjoint ranges of @la and of @rb from @roff. */
static void run_requests(struct itest_pair *p, struct itest_buf *la, struct itest_buf *rb,
			 size_t roff, enum te_opcode op, uint32_t n, size_t len)
{
	g_autofree struct te_request *r = g_new0(struct te_request, n);
	te_batch_id bid;

	for (uint32_t i = 0; i < n; i++)
		r[i] = (struct te_request){ op, p->seg, la->data + (size_t)i * len,
					    itest_raddr(rb, roff + (size_t)i * len), len };
	assert_ok(te_batch_new(p->a, n, &bid));
	assert_ok(te_batch_submit(p->a, bid, r, n));
	assert_ok(itest_wait(p->a, bid));
	assert_ok(te_batch_free(p->a, bid));
}

/*
 * Two lanes: before any transfer none is used; a batch of 32 x 64 KiB WRITEs (one slice each,
 * under stripe_min; 2 MiB, under the 4 MiB from which one submit's WRITEs spread) from one
 * thread uses that thread's lane only; one 8 MiB request in 1 MiB slices is striped over
 * both, half each. The serving engine has no peer of its own.
 */
static void test_two_lanes(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	g_autoptr(JsonParser) s0 = NULL, s1 = NULL, s2 = NULL, sb = NULL;
	JsonObject *t, *peer;
	int64_t l0, l1, b0, b1;

	pair_up(&p, "lanes: 2, slice_size: 1M", &la, 8 * MiB, 0x1111, &rb, 12 * MiB, 0x2222);

	s0 = stats_of(p.a);
	t = tcp_of(s0);
	g_assert_cmpint(json_object_get_int_member(t, "lanes_per_peer"), ==, 2);
	peer = only_peer(t, "B");
	g_assert_cmpuint(json_array_get_length(json_object_get_array_member(peer, "lanes")), ==, 2);
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 0);
	g_assert_cmpint(json_object_get_int_member(peer, "slices"), ==, 0);
	g_assert_cmpint(json_object_get_int_member(peer, "bytes"), ==, 0);
	g_assert_cmpint(json_object_get_int_member(peer, "reconnects"), ==, 0);

	/* Slices under stripe_min (1M) from one thread stay on that thread's lane. */
	run_requests(&p, &la, &rb, 0, TE_OP_WRITE, 32, 64 * KiB);
	g_assert_true(itest_range_is(&rb, 0, 2 * MiB, &la, 0));
	s1 = stats_of(p.a);
	peer = only_peer(tcp_of(s1), "B");
	l0 = lane_int(peer, 0, "slices");
	l1 = lane_int(peer, 1, "slices");
	b0 = lane_int(peer, 0, "bytes");
	b1 = lane_int(peer, 1, "bytes");
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 1);
	g_assert_true((l0 == 32 && l1 == 0) || (l0 == 0 && l1 == 32));
	g_assert_cmpint(json_object_get_int_member(peer, "slices"), ==, 32);
	g_assert_cmpint(b0, ==, l0 * 64 * KiB);
	g_assert_cmpint(b1, ==, l1 * 64 * KiB);
	g_assert_cmpint(json_object_get_int_member(peer, "bytes"), ==, 2 * MiB);
	/* A connection per lane in use, opened on first use; nothing broke. */
	g_assert_cmpint(lane_int(peer, 0, "connects"), ==, l0 ? 1 : 0);
	g_assert_cmpint(lane_int(peer, 1, "connects"), ==, l1 ? 1 : 0);
	g_assert_cmpint(json_object_get_int_member(peer, "reconnects"), ==, 0);

	/* One large request: its 8 slices of 1M go over both lanes (cumulative counters). */
	run_requests(&p, &la, &rb, 4 * MiB, TE_OP_READ, 1, 8 * MiB);
	g_assert_true(itest_range_is(&la, 0, 8 * MiB, &rb, 4 * MiB));
	s2 = stats_of(p.a);
	peer = only_peer(tcp_of(s2), "B");
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 2);
	g_assert_cmpint(lane_int(peer, 0, "slices") - l0, ==, 4);
	g_assert_cmpint(lane_int(peer, 1, "slices") - l1, ==, 4);
	g_assert_cmpint(lane_int(peer, 0, "bytes") - b0, ==, 4 * MiB);
	g_assert_cmpint(lane_int(peer, 0, "slices") + lane_int(peer, 1, "slices"), ==, 32 + 8);
	g_assert_cmpint(json_object_get_int_member(peer, "bytes"), ==, 10 * MiB);
	g_assert_cmpint(lane_int(peer, 0, "connects"), ==, 1);
	g_assert_cmpint(lane_int(peer, 1, "connects"), ==, 1);

	/* The serving side opened no lane of its own. */
	sb = stats_of(p.b);
	t = tcp_of(sb);
	g_assert_cmpint(json_object_get_int_member(t, "lanes_per_peer"), ==, 2);
	g_assert_cmpuint(json_array_get_length(json_object_get_array_member(t, "peers")), ==, 0);

	pair_down(&p, &la, &rb);
}

/* Threads of this process whose name starts with @prefix (/proc/self/task/N/comm). */
static guint threads_named(const char *prefix)
{
	g_autoptr(GDir) dir = g_dir_open("/proc/self/task", 0, NULL);
	const char *name;
	guint n = 0;

	g_assert_nonnull(dir);
	while ((name = g_dir_read_name(dir))) {
		g_autofree char *path = g_strdup_printf("/proc/self/task/%s/comm", name);
		g_autofree char *comm = NULL;

		if (g_file_get_contents(path, &comm, NULL, NULL) && g_str_has_prefix(comm, prefix))
			n++;
	}
	return n;
}

/*
 * Wait up to 5 s for @n threads named te-tcp-*: pthread_join returns before an exiting
 * thread's /proc entry is gone, so an engine freed just before may still show its workers.
 */
static void assert_tcp_threads(guint n)
{
	gint64 until = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;
	guint have;

	while ((have = threads_named("te-tcp-")) != n && g_get_monotonic_time() < until)
		g_usleep(1000);
	g_assert_cmpuint(have, ==, n);
}

/*
 * Option workers: 0 (the default) runs one epoll thread per CPU this process may run on, at
 * most 4; a number runs that many. The stats say how many, and so many threads run in each
 * of the pair's two engines (this process).
 */
static void test_workers(void)
{
	static const struct {
		const char *options;
		guint want; /* 0: the CPUs of the affinity mask, 1..4 */
	} cases[] = { { "", 0 }, { "workers: 0", 0 }, { "workers: 1", 1 }, { "workers: 3", 3 } };
	cpu_set_t set;
	guint cpus;

	g_assert_cmpint(sched_getaffinity(0, sizeof(set), &set), ==, 0);
	cpus = (guint)CPU_COUNT(&set);
	assert_tcp_threads(0);
	for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
		guint want = cases[c].want ? cases[c].want : CLAMP(cpus, 1u, 4u);
		struct itest_pair p;
		struct itest_buf la, rb;
		g_autoptr(JsonParser) sa = NULL, sb = NULL;

		pair_up(&p, cases[c].options, &la, MiB, 0x5151, &rb, MiB, 0x6262);
		run_requests(&p, &la, &rb, 0, TE_OP_READ, 16, 4 * KiB);
		g_assert_true(itest_range_is(&la, 0, 16 * 4 * KiB, &rb, 0));
		sa = stats_of(p.a);
		sb = stats_of(p.b);
		g_test_message("{%s}: %u CPUs, want %u workers", cases[c].options, cpus, want);
		g_assert_cmpint(json_object_get_int_member(tcp_of(sa), "workers"), ==, want);
		g_assert_cmpint(json_object_get_int_member(tcp_of(sb), "workers"), ==, want);
		assert_tcp_threads(2 * want);
		pair_down(&p, &la, &rb);
		assert_tcp_threads(0);
	}
}

/*
 * The configured lane count is what a peer gets. Small slices of one thread use one lane,
 * unless stripe_min says to stripe them too.
 */
static void test_lane_counts(void)
{
	static const struct {
		const char *options;
		guint lanes, used;
	} cases[] = { { "lanes: 1", 1, 1 },
		      { "lanes: 3", 3, 1 },
		      { "lanes: 3, stripe_min: 0", 3, 3 },
		      { "lanes: 2, stripe_min: 4K", 2, 2 } };

	for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
		struct itest_pair p;
		struct itest_buf la, rb;
		g_autoptr(JsonParser) s = NULL;
		JsonObject *t, *peer;
		int64_t sum = 0;

		pair_up(&p, cases[c].options, &la, MiB, 0x3333, &rb, MiB, 0x4444);
		run_requests(&p, &la, &rb, 0, TE_OP_READ, 30, 4 * KiB);
		g_assert_true(itest_range_is(&la, 0, 30 * 4 * KiB, &rb, 0));

		s = stats_of(p.a);
		t = tcp_of(s);
		g_assert_cmpint(json_object_get_int_member(t, "lanes_per_peer"), ==,
				cases[c].lanes);
		peer = only_peer(t, "B");
		g_assert_cmpuint(json_array_get_length(json_object_get_array_member(peer, "lanes")),
				 ==, cases[c].lanes);
		g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, cases[c].used);
		for (guint k = 0; k < cases[c].lanes; k++)
			sum += lane_int(peer, k, "slices");
		g_assert_cmpint(sum, ==, 30);
		pair_down(&p, &la, &rb);
	}
}

/* Threads that stay alive until all of them are done (NULL: a thread exits when done). */
struct lane_meet {
	GMutex lock;
	GCond cond;
	int done, total;
};

struct lane_job {
	struct itest_pair *p;
	struct itest_buf *la, *rb;
	size_t off;
	uint32_t n;
	struct lane_meet *meet;
};

static gpointer lane_job_run(gpointer data)
{
	struct lane_job *j = data;

	run_requests(j->p, j->la, j->rb, j->off, TE_OP_READ, j->n, 4 * KiB);
	if (j->meet) {
		g_mutex_lock(&j->meet->lock);
		j->meet->done++;
		g_cond_broadcast(&j->meet->cond);
		while (j->meet->done < j->meet->total)
			g_cond_wait(&j->meet->cond, &j->meet->lock);
		g_mutex_unlock(&j->meet->lock);
	}
	return NULL;
}

/* Run @n jobs one after the other; with @meet, each stays alive until the last is done. */
static void lane_jobs_run(struct lane_job *jobs, int n, struct lane_meet *meet)
{
	GThread *t[8];

	g_assert_cmpint(n, <=, (int)G_N_ELEMENTS(t));
	if (meet) {
		g_mutex_init(&meet->lock);
		g_cond_init(&meet->cond);
		meet->done = 0;
		meet->total = n;
	}
	for (int i = 0; i < n; i++) {
		jobs[i].meet = meet;
		t[i] = g_thread_new("lane-job", lane_job_run, &jobs[i]);
		if (meet) {
			/* Its batch is done before the next thread starts. */
			g_mutex_lock(&meet->lock);
			while (meet->done < i + 1)
				g_cond_wait(&meet->cond, &meet->lock);
			g_mutex_unlock(&meet->lock);
		} else {
			g_thread_join(t[i]);
		}
	}
	for (int i = 0; meet && i < n; i++)
		g_thread_join(t[i]);
	if (meet) {
		g_mutex_clear(&meet->lock);
		g_cond_clear(&meet->cond);
	}
}

/*
 * Small slices of two submitting threads alive at the same time go to two lanes, each
 * thread's to its own: one lane carries all 20 of one thread, the other all 40 of the other
 * (dealt round-robin they would be 30 and 30).
 */
static void test_thread_lanes(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	struct lane_job jobs[2];
	struct lane_meet meet;
	g_autoptr(JsonParser) s = NULL;
	JsonObject *peer;
	int64_t l0;

	pair_up(&p, "lanes: 2", &la, MiB, 0x5555, &rb, MiB, 0x6666);
	for (int i = 0; i < 2; i++)
		jobs[i] = (struct lane_job){ &p,  &la, &rb, (size_t)i * 256 * KiB, 20u * (i + 1),
					     NULL };
	/* One batch after the other, both threads alive: their slices stay on their lanes. */
	lane_jobs_run(jobs, 2, &meet);
	/* Both read into the start of la; the second thread's bytes are there now. */
	g_assert_true(itest_range_is(&la, 0, 40 * 4 * KiB, &rb, 256 * KiB));

	s = stats_of(p.a);
	peer = only_peer(tcp_of(s), "B");
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 2);
	l0 = lane_int(peer, 0, "slices");
	g_assert_true(l0 == 20 || l0 == 40);
	g_assert_cmpint(lane_int(peer, 1, "slices"), ==, 60 - l0);
	g_assert_cmpint(lane_int(peer, 0, "bytes"), ==, l0 * 4 * KiB);
	g_assert_cmpint(lane_int(peer, 1, "bytes"), ==, (60 - l0) * 4 * KiB);
	pair_down(&p, &la, &rb);
}

/*
 * A thread that exits gives its lane back: three threads, each started after the previous
 * one exited, all submit on the same lane (20 + 40 + 10 slices, the other lane none). A
 * pool whose threads come and go keeps its live threads spread over the lanes; numbered
 * in order of first submit, they would alternate (30 and 40).
 */
static void test_thread_reuse(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	struct lane_job jobs[3];
	g_autoptr(JsonParser) s = NULL;
	JsonObject *peer;
	int64_t l0;

	pair_up(&p, "lanes: 2", &la, MiB, 0x5656, &rb, MiB, 0x6565);
	jobs[0] = (struct lane_job){ &p, &la, &rb, 0, 20, NULL };
	jobs[1] = (struct lane_job){ &p, &la, &rb, 256 * KiB, 40, NULL };
	jobs[2] = (struct lane_job){ &p, &la, &rb, 512 * KiB, 10, NULL };
	lane_jobs_run(jobs, 3, NULL);
	g_assert_true(itest_range_is(&la, 0, 10 * 4 * KiB, &rb, 512 * KiB));
	g_assert_true(itest_range_is(&la, 10 * 4 * KiB, 30 * 4 * KiB, &rb, 256 * KiB + 40 * KiB));

	s = stats_of(p.a);
	peer = only_peer(tcp_of(s), "B");
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 1);
	l0 = lane_int(peer, 0, "slices");
	g_assert_true(l0 == 70 || l0 == 0);
	g_assert_cmpint(lane_int(peer, 1, "slices"), ==, 70 - l0);
	pair_down(&p, &la, &rb);
}

/*
 * The in-flight counts go back to 0 once everything is answered. One thread's small slices
 * dealt round-robin over 4 lanes (stripe_min: 0): each lane's worker frees the slots of its
 * own lane, and every one of those slots counts against the thread's own lane
 * (owner_in_flight), while the thread submits more under another lane's lock. Counted with
 * a plain load and store under each lane's own lock, updates from different lanes got lost
 * (the count stayed above 0, or wrapped, for good, and kept every other thread's large
 * slices off the lanes); 200 batches of 256 READs and WRITEs of 4 KiB. Then another thread's
 * small slices are dealt over all lanes, as for a thread alone.
 */
static void test_owner_counts(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	g_autoptr(JsonParser) s = NULL;
	JsonObject *peer;
	int64_t slices = 0;

	pair_up(&p, "lanes: 4, stripe_min: 0", &la, MiB, 0x3939, &rb, MiB, 0x9393);
	for (int i = 0; i < 200; i++)
		run_requests(&p, &la, &rb, 0, i % 2 ? TE_OP_WRITE : TE_OP_READ, 256, 4 * KiB);
	g_assert_true(itest_range_is(&la, 0, MiB, &rb, 0));

	s = stats_of(p.a);
	peer = only_peer(tcp_of(s), "B");
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 4);
	for (guint k = 0; k < 4; k++) {
		g_test_message("lane %u: %" PRId64 " slices, in flight %" PRId64
			       ", of its owner %" PRId64,
			       k, lane_int(peer, k, "slices"), lane_int(peer, k, "in_flight"),
			       lane_int(peer, k, "owner_in_flight"));
		slices += lane_int(peer, k, "slices");
		g_assert_cmpint(lane_int(peer, k, "in_flight"), ==, 0);
		g_assert_cmpint(lane_int(peer, k, "owner_in_flight"), ==, 0);
	}
	g_assert_cmpint(slices, ==, 200 * 256);

	/*
	 * Idle past TCP_OWNER_RECENT_NS (20 ms), this thread moves data no more: another
	 * thread's 64 small READs are dealt over all 4 lanes (a count left above 0 kept them
	 * all on that thread's own lane).
	 */
	g_usleep(50 * 1000);
	{
		struct lane_job job = { &p, &la, &rb, 0, 64, NULL };
		g_autoptr(JsonParser) s2 = NULL;
		JsonObject *peer2;

		lane_jobs_run(&job, 1, NULL);
		g_assert_true(itest_range_is(&la, 0, 64 * 4 * KiB, &rb, 0));
		s2 = stats_of(p.a);
		peer2 = only_peer(tcp_of(s2), "B");
		for (guint k = 0; k < 4; k++)
			g_assert_cmpint(lane_int(peer2, k, "slices") - lane_int(peer, k, "slices"),
					==, 16);
	}
	pair_down(&p, &la, &rb);
}

/*
 * Canceled requests give their slots and counts back: rounds of 64 READs and WRITEs of
 * 64 KiB, dealt over 4 lanes and canceled 0-3 ms after the submit (queued, on the wire,
 * half answered: a canceled READ's slot waits for its answer, a canceled WRITE on the wire
 * breaks its lane), then a batch that must go through. Once the answers still due have
 * come (at most 5 s here), every lane's in_flight and owner_in_flight are 0 again: a slot
 * lost on each cancel would shrink the lane until it took nothing more.
 */
static void test_counts_after_cancel(void)
{
	enum {
		N = 64
	};
	struct itest_pair p;
	struct itest_buf la, rb;
	struct te_request r[N];
	te_batch_id bid;
	int done = 0, canceled = 0;

	pair_up(&p, "lanes: 4, stripe_min: 0", &la, 8 * MiB, 0x4242, &rb, 8 * MiB, 0x2424);
	for (int round = 0; round < 24; round++) {
		for (int i = 0; i < N; i++)
			r[i] = (struct te_request){ (i + round) % 2 ? TE_OP_READ : TE_OP_WRITE,
						    p.seg, la.data + (size_t)i * 64 * KiB,
						    itest_raddr(&rb, (size_t)i * 64 * KiB),
						    64 * KiB };
		assert_ok(te_batch_new(p.a, N, &bid));
		assert_ok(te_batch_submit(p.a, bid, r, N));
		if (round % 4)
			g_usleep((gulong)(round % 4) * 1000);
		assert_ok(te_batch_cancel(p.a, bid));
		(void)itest_wait(p.a, bid);
		for (uint32_t i = 0; i < N; i++) {
			struct te_task_info ti;

			assert_ok(te_task_status(p.a, bid, i, &ti));
			if (ti.state == TE_STATE_COMPLETED)
				done++;
			else if (ti.state == TE_STATE_CANCELED)
				canceled++;
		}
		assert_ok(te_batch_free(p.a, bid));
	}
	g_test_message("%d requests done, %d canceled", done, canceled);
	g_assert_cmpint(canceled, >, 0);
	/* Canceled WRITEs may have landed in rb: compare with its bytes, not its pattern. */
	run_requests(&p, &la, &rb, 0, TE_OP_READ, N, 64 * KiB);
	g_assert_cmpmem(la.data, N * 64 * KiB, rb.data, N * 64 * KiB);

	tcp_lanes_settle(p.a);
	pair_down(&p, &la, &rb);
}

/*
 * progress 'caller' (the default): the thread waiting in te_batch_wait reads answers on its
 * own lane itself (counted per lane as "driven"); 'threads': only the epoll threads do.
 * Rounds of 50 one-request batches, one at a time: the waiter starts polling microseconds
 * after its submit, so some answers are the waiter's (about half on an idle 2-CPU machine;
 * under load the lane's worker, woken by the answer, can preempt the waiter every time: CI
 * once saw 0 of 50, so 'caller' gets up to 10 rounds to show one); with 'threads' none is.
 * Slices of 512 KiB and more are always left to the workers (the bytes are the work
 * there): four 1 MiB READs add none.
 */
static void test_progress_modes(void)
{
	static const char *const modes[] = { "caller", "threads" };

	for (size_t m = 0; m < G_N_ELEMENTS(modes); m++) {
		g_autofree char *opts = g_strdup_printf("lanes: 2, progress: %s", modes[m]);
		struct itest_pair p;
		struct itest_buf la, rb;
		g_autoptr(JsonParser) s = NULL;
		JsonObject *t, *peer;
		int64_t driven = 0, slices = 0;
		int rounds = 0;

		pair_up(&p, opts, &la, MiB, 0x7777, &rb, MiB, 0x8888);
		do {
			for (int i = 0; i < 50; i++)
				run_requests(&p, &la, &rb, (size_t)i * 4 * KiB, TE_OP_READ, 1,
					     4 * KiB);
			g_assert_true(itest_range_is(&la, 0, 4 * KiB, &rb, 49 * 4 * KiB));
			rounds++;
			g_clear_pointer(&s, g_object_unref);
			s = stats_of(p.a);
			t = tcp_of(s);
			g_assert_cmpstr(json_object_get_string_member(t, "progress"), ==, modes[m]);
			peer = only_peer(t, "B");
			driven = slices = 0;
			for (guint k = 0; k < 2; k++) {
				driven += lane_int(peer, k, "driven");
				slices += lane_int(peer, k, "slices");
			}
			g_assert_cmpint(slices, ==, 50 * rounds);
		} while (m == 0 && driven == 0 && rounds < 10);
		g_assert_cmpint(driven, <=, slices);
		if (m == 0)
			g_assert_cmpint(driven, >, 0);
		else
			g_assert_cmpint(driven, ==, 0);
		g_test_message("progress %s: %" PRId64 " of %" PRId64
			       " answers read by the waiter (%d round%s)",
			       modes[m], driven, slices, rounds, rounds == 1 ? "" : "s");

		for (int i = 0; i < 4; i++)
			run_requests(&p, &la, &rb, 0, TE_OP_READ, 1, MiB);
		g_assert_true(itest_range_is(&la, 0, MiB, &rb, 0));
		g_clear_pointer(&s, g_object_unref);
		s = stats_of(p.a);
		peer = only_peer(tcp_of(s), "B");
		g_assert_cmpint(lane_int(peer, 0, "slices") + lane_int(peer, 1, "slices"), ==,
				slices + 4);
		g_assert_cmpint(lane_int(peer, 0, "driven") + lane_int(peer, 1, "driven"), ==,
				driven);
		pair_down(&p, &la, &rb);
	}
}

/*
 * The 2048 slot ids a lane starts with hold a batch of 2048 small slices from one thread on
 * its own lane: every slice on one lane, none spilled to the other (with 256 slots, 1792
 * would spill). Deeper batches: /tcp/client/slots-grow*.
 */
static void test_deep_batch(void)
{
	struct itest_pair p;
	struct itest_buf la, rb;
	g_autoptr(JsonParser) s = NULL;
	JsonObject *peer;
	int64_t l0, l1;

	pair_up(&p, "lanes: 2", &la, 8 * MiB, 0x9999, &rb, 8 * MiB, 0xaaaa);
	run_requests(&p, &la, &rb, 0, TE_OP_READ, 2048, 4 * KiB);
	g_assert_true(itest_range_is(&la, 0, 8 * MiB, &rb, 0));

	s = stats_of(p.a);
	peer = only_peer(tcp_of(s), "B");
	l0 = lane_int(peer, 0, "slices");
	l1 = lane_int(peer, 1, "slices");
	g_assert_true((l0 == 2048 && l1 == 0) || (l0 == 0 && l1 == 2048));
	g_assert_cmpint(json_object_get_int_member(peer, "lanes_used"), ==, 1);
	pair_down(&p, &la, &rb);
}

/* Bad arguments get a clear error; a transport without stats is left out. */
static void test_bad_input(void)
{
	struct te_engine *e = itest_engine1("L", "loopback", NULL, NULL);
	char *json = (char *)"untouched";

	assert_status(te_engine_stats(NULL, &json), TE_ERR_INVALID_ARG);
	assert_contains(te_last_error(), "te_engine_stats: engine is NULL");
	g_assert_cmpstr(json, ==, "untouched");
	assert_status(te_engine_stats(e, NULL), TE_ERR_INVALID_ARG);
	assert_contains(te_last_error(), "te_engine_stats: json_out is NULL");

	/* The loopback test transport reports nothing: an empty object. */
	assert_ok(te_engine_stats(e, &json));
	g_assert_cmpstr(json, ==, "{}");
	te_free(json);
	te_engine_free(e);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/tcp/stats/two-lanes", test_two_lanes);
	g_test_add_func("/tcp/stats/lane-counts", test_lane_counts);
	g_test_add_func("/tcp/stats/workers", test_workers);
	g_test_add_func("/tcp/stats/thread-lanes", test_thread_lanes);
	g_test_add_func("/tcp/stats/thread-reuse", test_thread_reuse);
	g_test_add_func("/tcp/stats/owner-counts", test_owner_counts);
	g_test_add_func("/tcp/stats/counts-after-cancel", test_counts_after_cancel);
	g_test_add_func("/tcp/stats/progress-modes", test_progress_modes);
	g_test_add_func("/tcp/stats/deep-batch", test_deep_batch);
	g_test_add_func("/tcp/stats/bad-input", test_bad_input);
	return g_test_run();
}
