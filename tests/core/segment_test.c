/* SPDX-License-Identifier: Apache-2.0 */
/* segment_test.c: the segment table's lookups, and peer quarantine through it. */
#include <glib.h>
#include <json-glib/json-glib.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/segment.h"
#include "fake.h"
#include "itest.h"

static void test_lookups(void)
{
	struct itest_pair p;
	struct engine *a;
	g_autofree char *addr = NULL;
	g_autofree char *by_name = NULL;
	struct segment *s;

	itest_pair_new(&p, "loopback", NULL, NULL);
	itest_pair_connect(&p);
	a = fake_engine(p.a);
	g_assert_null(segment_rpc_address(a, 999));
	g_assert_null(segment_rpc_address(a, TE_SEGMENT_LOCAL));
	addr = segment_rpc_address(a, p.seg);
	g_assert_nonnull(addr);
	by_name = segment_rpc_address_by_name(a, te_engine_name(p.b));
	g_assert_cmpstr(by_name, ==, addr);
	g_assert_null(segment_rpc_address_by_name(a, "nobody"));
	/* A peer restart seen on the control plane marks the segment stale. */
	segment_read_lock(a);
	s = segment_get_locked(a, p.seg);
	g_assert_nonnull(s);
	g_assert_cmpuint(atomic_load(&s->stale), ==, 0);
	segment_read_unlock(a);
	segment_note_generation(a, addr, 12345);
	segment_read_lock(a);
	s = segment_get_locked(a, p.seg);
	g_assert_cmpuint(atomic_load(&s->stale), ==, 1);
	/* Quarantine of the peer reaches the view. */
	segment_read_unlock(a);
	{
		struct te_plugin_peer *peer;

		segment_read_lock(a);
		peer = segment_get_locked(a, p.seg)->view->tps[0].peer;
		segment_read_unlock(a);
		segment_pause_peer(a, 0, peer, UINT64_MAX, "loopback", "test");
		segment_read_lock(a);
		g_assert_cmpuint(
			atomic_load(&segment_get_locked(a, p.seg)->view->tps[0].paused_until_ns),
			==, UINT64_MAX);
		segment_read_unlock(a);
	}
	itest_pair_free(&p);
}

/*
 * A transport's TE_ERR_REMOTE_ACCESS for a range the descriptor lists says the descriptor
 * may be stale (the peer registered the buffer again, under new keys): the segment is marked
 * for a refresh, at most once per SEGMENT_REFETCH_NS, and the next submit fetches it.
 */
static enum te_status refused_write(struct itest_fx *f)
{
	struct te_request q = { TE_OP_WRITE, f->p.seg, f->la.data, itest_raddr(&f->rb, 0), 4096 };
	struct te_task_info ti;
	te_batch_id b;
	enum te_status st;

	assert_ok(te_batch_new(f->p.a, 1, &b));
	assert_ok(te_batch_submit(f->p.a, b, &q, 1));
	st = itest_wait(f->p.a, b);
	ti = itest_task(f->p.a, b, 0);
	g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
	g_assert_cmpint(ti.status, ==, TE_ERR_REMOTE_ACCESS);
	assert_ok(te_batch_free(f->p.a, b));
	return st;
}

/* A segment's refresh marks, read under the table's lock. */
struct seg_marks {
	uint32_t stale;
	uint64_t unchanged_ns;
};

static struct seg_marks seg_marks(struct engine *a, te_segment_id id)
{
	struct seg_marks m;
	struct segment *s;

	segment_read_lock(a);
	s = segment_get_locked(a, id);
	m.stale = atomic_load(&s->stale);
	m.unchanged_ns = atomic_load(&s->unchanged_ns);
	segment_read_unlock(a);
	return m;
}

static void set_unchanged(struct engine *a, te_segment_id id, uint64_t ns)
{
	segment_read_lock(a);
	atomic_store(&segment_get_locked(a, id)->unchanged_ns, ns);
	segment_read_unlock(a);
}

static void test_access_refused(void)
{
	struct itest_fx f;
	struct engine *a;

	itest_fx_new(&f, "loopback", NULL, NULL, 65536, 0);
	a = fake_engine(f.p.a);
	fake_reset();
	fake_take_over(a->tps[0]);
	fake.fail_first = TE_ERR_REMOTE_ACCESS;
	g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 0);
	g_assert_cmpint(refused_write(&f), ==, TE_ERR_REMOTE_ACCESS);
	g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 1);
	/*
	 * The next submit fetches it again; a refusal within the period marks nothing (the
	 * last mark is put in the future here, so that no clock decides the outcome).
	 */
	set_unchanged(a, f.p.seg, engine_now_ns() + 3600 * 1000000000ull);
	g_assert_cmpint(refused_write(&f), ==, TE_ERR_REMOTE_ACCESS);
	g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 0);
	/* The period over: marked again. */
	set_unchanged(a, f.p.seg, 1);
	g_assert_cmpint(refused_write(&f), ==, TE_ERR_REMOTE_ACCESS);
	g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 1);
	/*
	 * A fetch that brings a changed descriptor (here: B registered one more buffer) ends
	 * the period: the next refusal marks the segment at once.
	 */
	{
		struct itest_buf more;
		size_t n_bufs = 0;

		itest_buf_new(&more, 4096, 0, 3);
		itest_buf_register(&more, f.p.b, TE_MEM_REMOTE);
		set_unchanged(a, f.p.seg, engine_now_ns() + 3600 * 1000000000ull);
		assert_ok(te_segment_buffers(f.p.a, f.p.seg, NULL, 0, &n_bufs));
		g_assert_cmpuint(n_bufs, ==, 2);
		g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 0);
		g_assert_cmpint(refused_write(&f), ==, TE_ERR_REMOTE_ACCESS);
		g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 1);
		assert_ok(te_mem_unregister(f.p.b, more.base));
		itest_buf_free(&more);
	}
	/* Other failures do not mark it (the submit itself fetches, clearing the mark). */
	fake.fail_first = TE_ERR_DEVICE_FAILED;
	set_unchanged(a, f.p.seg, 1);
	{
		struct te_request q = { TE_OP_WRITE, f.p.seg, f.la.data, itest_raddr(&f.rb, 0),
					4096 };
		te_batch_id b;

		assert_ok(te_batch_new(f.p.a, 1, &b));
		assert_ok(te_batch_submit(f.p.a, b, &q, 1));
		(void)itest_wait(f.p.a, b);
		assert_ok(te_batch_free(f.p.a, b));
		g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 0);
	}
	fake_reset();
	itest_fx_free(&f);
}

static char submit_err[1024]; /* te_last_error() after write_at's submit */

/* te_batch_submit of one 4 KiB WRITE to @remote: its status (the task is INVALID unless OK). */
static enum te_status write_at(struct itest_fx *f, uint64_t remote)
{
	struct te_request q = { TE_OP_WRITE, f->p.seg, f->la.data, remote, 4096 };
	struct te_task_info ti;
	te_batch_id b;
	enum te_status st;

	assert_ok(te_batch_new(f->p.a, 1, &b));
	st = te_batch_submit(f->p.a, b, &q, 1);
	g_strlcpy(submit_err, te_last_error(), sizeof(submit_err));
	if (st == TE_OK)
		assert_ok(itest_wait(f->p.a, b));
	ti = itest_task(f->p.a, b, 0);
	g_assert_cmpint(ti.state, ==, st == TE_OK ? TE_STATE_COMPLETED : TE_STATE_INVALID);
	assert_ok(te_batch_free(f->p.a, b));
	return st;
}

/*
 * A request outside the cached buffers makes the submit fetch the descriptor once (it used to
 * fetch twice: again after the second validation), and not again within SEGMENT_REFETCH_NS of
 * a fetch that found nothing new: a client asking over and over for a range the peer never
 * registered costs the peer one fetch per period, not one per submit.
 */
static void test_range_missed(void)
{
	struct itest_fx f;
	struct itest_buf late;
	struct engine *a;
	uint64_t n0, outside;

	itest_fx_new(&f, "loopback", NULL, NULL, 65536, 0);
	a = fake_engine(f.p.a);
	outside = itest_raddr(&f.rb, 0) + (1ull << 30);
	/*
	 * A watch event with the same descriptor (the owner writing its key again) starts no
	 * period: the store may hold a newer one than the watch has delivered yet.
	 */
	{
		char *json = NULL;
		size_t len = 0;

		assert_ok(te_segment_export(f.p.b, &json, &len));
		segment_watch_event(a, "test", te_engine_name(f.p.b), json, len, false);
		te_free(json);
		g_assert_cmpuint(seg_marks(a, f.p.seg).unchanged_ns, ==, 0);
	}
	n0 = atomic_load(&a->refreshes);
	g_assert_cmpint(write_at(&f, outside), ==, TE_ERR_REMOTE_ACCESS);
	assert_contains(submit_err, "is outside the registered buffers of segment");
	g_assert_null(strstr(submit_err, "unchanged when fetched"));
	g_assert_cmpuint(atomic_load(&a->refreshes), ==, n0 + 1);
	g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 0);
	/*
	 * Within the period (the fetch's stamp is put in the future here, so that no clock
	 * decides the outcome) misses fetch nothing and say why.
	 */
	set_unchanged(a, f.p.seg, engine_now_ns() + 3600 * 1000000000ull);
	for (int i = 0; i < 50; i++)
		g_assert_cmpint(write_at(&f, outside), ==, TE_ERR_REMOTE_ACCESS);
	assert_contains(submit_err, "(unchanged when fetched 0 ms ago; fetched again 100 ms");
	g_assert_cmpuint(atomic_load(&a->refreshes), ==, n0 + 1);
	g_assert_cmpuint(seg_marks(a, f.p.seg).stale, ==, 0);
	/* Requests inside the cached buffers are not held up. */
	assert_ok(write_at(&f, itest_raddr(&f.rb, 0)));
	/* A buffer the peer registers within the period is reached once it is over. */
	itest_buf_new(&late, 4096, 0, 7);
	itest_buf_register(&late, f.p.b, TE_MEM_REMOTE);
	g_assert_cmpint(write_at(&f, itest_raddr(&late, 0)), ==, TE_ERR_REMOTE_ACCESS);
	g_assert_cmpuint(atomic_load(&a->refreshes), ==, n0 + 1);
	set_unchanged(a, f.p.seg, 1);
	assert_ok(write_at(&f, itest_raddr(&late, 0)));
	g_assert_true(itest_range_is(&late, 0, 4096, &f.la, 0));
	g_assert_cmpuint(atomic_load(&a->refreshes), ==, n0 + 2);
	/* That fetch found something new: the next miss fetches at once, and starts a period. */
	g_assert_cmpuint(seg_marks(a, f.p.seg).unchanged_ns, ==, 0);
	g_assert_cmpint(write_at(&f, outside), ==, TE_ERR_REMOTE_ACCESS);
	g_assert_cmpuint(atomic_load(&a->refreshes), ==, n0 + 3);
	g_assert_cmpuint(seg_marks(a, f.p.seg).unchanged_ns, >, 0);
	assert_ok(te_mem_unregister(f.p.b, late.base));
	itest_buf_free(&late);
	itest_fx_free(&f);
}

/* What the core told load_peer_ex last (the loopback plugin's own load_peer does the work). */
static struct {
	uint32_t calls, flags, pid;
	char name[128], host[128];
	enum te_status (*inner)(struct te_plugin_inst *, const char *, const void *, size_t,
				struct te_plugin_peer **);
} seen;

static enum te_status record_load_peer_ex(struct te_plugin_inst *inst,
					  const struct te_plugin_peer_info *info, const void *blob,
					  size_t len, struct te_plugin_peer **peer_out)
{
	g_assert_cmpuint(info->size, >=, sizeof(*info));
	seen.calls++;
	seen.flags = info->flags;
	seen.pid = info->pid;
	g_strlcpy(seen.name, info->name, sizeof(seen.name));
	g_strlcpy(seen.host, info->host_id, sizeof(seen.host));
	return seen.inner(inst, info->name, blob, len, peer_out);
}

/* b's descriptor with "name", "host", "pidns" and "pid" replaced (NULL: member removed). */
static char *edited_descriptor(struct te_engine *b, const char *name, const char *host,
			       const char *pidns, gint64 pid)
{
	g_autoptr(JsonParser) parser = json_parser_new();
	g_autoptr(JsonGenerator) gen = json_generator_new();
	JsonObject *o;
	char *json = NULL;

	g_assert_cmpint(te_segment_export(b, &json, NULL), ==, TE_OK);
	g_assert_true(json_parser_load_from_data(parser, json, -1, NULL));
	te_free(json);
	o = json_node_get_object(json_parser_get_root(parser));
	json_object_set_string_member(o, "name", name);
	if (host)
		json_object_set_string_member(o, "host", host);
	else
		json_object_remove_member(o, "host");
	if (pidns)
		json_object_set_string_member(o, "pidns", pidns);
	else
		json_object_remove_member(o, "pidns");
	json_object_set_int_member(o, "pid", pid);
	json_generator_set_root(gen, json_parser_get_root(parser));
	return json_generator_to_data(gen, NULL);
}

/* load_peer_ex learns the peer's host identity and pid, and how they compare with ours. */
static void test_peer_info(void)
{
	struct itest_pair p;
	struct engine *a;
	struct transport *tp;
	g_autofree char *ns = g_file_read_link("/proc/self/ns/pid", NULL);
	g_autofree char *boot = NULL;
	te_segment_id id;

	itest_pair_new(&p, "loopback", NULL, NULL);
	a = fake_engine(p.a);
	tp = a->tps[0];
	memset(&seen, 0, sizeof(seen));
	seen.inner = tp->plugin->ops.load_peer;
	tp->plugin->ops.load_peer_ex = record_load_peer_ex;
	itest_pair_connect(&p);
	/* Same process: every flag, our own pid and boot id. */
	g_assert_cmpuint(seen.calls, ==, 1);
	g_assert_cmpstr(seen.name, ==, te_engine_name(p.b));
	g_assert_cmpuint(seen.pid, ==, (uint32_t)getpid());
	g_assert_true(g_file_get_contents("/proc/sys/kernel/random/boot_id", &boot, NULL, NULL));
	g_assert_cmpstr(seen.host, ==, g_strstrip(boot));
	g_assert_nonnull(ns);
	g_assert_cmpuint(seen.flags, ==,
			 TE_PLUGIN_PEER_SAME_HOST | TE_PLUGIN_PEER_SAME_PID_NS |
				 TE_PLUGIN_PEER_SAME_PROCESS);
	/* The loopback plugin is same-process only: lift that (the core's copy of its caps) to
	 * see what the other cases tell load_peer_ex (its own check uses its blob's pid). */
	tp->caps.flags = 0;
	/* Another process of this host and namespace. */
	{
		g_autofree char *j = edited_descriptor(p.b, "other-pid", seen.host, ns, 1);

		g_assert_cmpint(te_segment_import(p.a, j, strlen(j), &id), ==, TE_OK);
		g_assert_cmpuint(seen.calls, ==, 2);
		g_assert_cmpuint(seen.pid, ==, 1);
		g_assert_cmpuint(seen.flags, ==,
				 TE_PLUGIN_PEER_SAME_HOST | TE_PLUGIN_PEER_SAME_PID_NS);
	}
	/* Same host, another pid namespace (a container): the pid means nothing here. */
	{
		g_autofree char *j =
			edited_descriptor(p.b, "other-ns", seen.host, "pid:[1]", getpid());

		g_assert_cmpint(te_segment_import(p.a, j, strlen(j), &id), ==, TE_OK);
		g_assert_cmpuint(seen.flags, ==, TE_PLUGIN_PEER_SAME_HOST);
	}
	/* An older peer that publishes no namespace: same host only. */
	{
		g_autofree char *j = edited_descriptor(p.b, "no-ns", seen.host, NULL, getpid());

		g_assert_cmpint(te_segment_import(p.a, j, strlen(j), &id), ==, TE_OK);
		g_assert_cmpuint(seen.flags, ==, TE_PLUGIN_PEER_SAME_HOST);
	}
	/* Another host: a same-host plugin is not even asked, the segment has no transport. */
	tp->caps.flags = TE_PLUGIN_CAP_SAME_HOST_ONLY;
	{
		g_autofree char *j =
			edited_descriptor(p.b, "other-host", "another-boot-id", ns, getpid());
		uint32_t calls = seen.calls;

		g_assert_cmpint(te_segment_import(p.a, j, strlen(j), &id), ==, TE_ERR_NO_TRANSPORT);
		g_assert_cmpuint(seen.calls, ==, calls);
		g_assert_nonnull(
			strstr(te_last_error(), "same-host transport, peer is on another host"));
	}
	itest_pair_free(&p);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/segment/lookups", test_lookups);
	g_test_add_func("/segment/peer-info", test_peer_info);
	g_test_add_func("/segment/access-refused", test_access_refused);
	g_test_add_func("/segment/range-missed", test_range_missed);
	return g_test_run();
}
