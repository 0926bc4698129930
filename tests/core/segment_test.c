/* SPDX-License-Identifier: Apache-2.0 */
/* segment_test.c: the segment table's lookups, and peer quarantine through it. */
#include <glib.h>

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

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/segment/lookups", test_lookups);
	return g_test_run();
}
