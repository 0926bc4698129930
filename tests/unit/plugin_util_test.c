/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plugin_util_test.c: te_plugin_util.h's little-endian wire fields at every alignment, and its
 * peer-naming guard (unload waits for a naming call under way, and no call starts after it).
 */

#include <glib.h>
#include <te/te_plugin_util.h>

/* The bytes on the wire are little-endian whatever the host, at any offset. */
static void test_layout(void)
{
	static const uint8_t want[14] = { 0x34, 0x12, 0x78, 0x56, 0x34, 0x12, 0xef,
					  0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01 };

	for (unsigned off = 0; off < 8; off++) {
		uint8_t buf[32];

		memset(buf, 0xa5, sizeof(buf));
		te_plugin_put_u16(buf + off, 0x1234);
		te_plugin_put_u32(buf + off + 2, 0x12345678u);
		te_plugin_put_u64(buf + off + 6, 0x0123456789abcdefull);
		g_assert_cmpmem(buf + off, sizeof(want), want, sizeof(want));
		/* Nothing around the fields is touched. */
		for (unsigned i = 0; i < off; i++)
			g_assert_cmpuint(buf[i], ==, 0xa5);
		for (unsigned i = off + sizeof(want); i < sizeof(buf); i++)
			g_assert_cmpuint(buf[i], ==, 0xa5);
		g_assert_cmphex(te_plugin_get_u16(buf + off), ==, 0x1234);
		g_assert_cmphex(te_plugin_get_u32(buf + off + 2), ==, 0x12345678u);
		g_assert_cmphex(te_plugin_get_u64(buf + off + 6), ==, 0x0123456789abcdefull);
	}
}

/* Every value survives a round trip, including the top bits. */
static void test_round_trip(void)
{
	static const uint64_t v64[] = {
		0, 1, 0xff, 0x100, 0x8000000000000000ull, UINT64_MAX, 0xfedcba9876543210ull
	};
	uint8_t buf[9];

	for (size_t i = 0; i < G_N_ELEMENTS(v64); i++) {
		te_plugin_put_u64(buf + 1, v64[i]);
		g_assert_cmphex(te_plugin_get_u64(buf + 1), ==, v64[i]);
		te_plugin_put_u32(buf + 1, (uint32_t)v64[i]);
		g_assert_cmphex(te_plugin_get_u32(buf + 1), ==, (uint32_t)v64[i]);
		te_plugin_put_u16(buf + 1, (uint16_t)v64[i]);
		g_assert_cmphex(te_plugin_get_u16(buf + 1), ==, (uint16_t)v64[i]);
	}
	/* The lowest byte comes first. */
	te_plugin_put_u64(buf, 0x80);
	g_assert_cmpuint(buf[0], ==, 0x80);
	g_assert_cmpuint(buf[7], ==, 0);
}

/* --- the peer-naming guard --- */

struct unloader {
	struct te_plugin_naming *g;
	struct te_plugin_naming_peer *p;
	gint returned;
};

static gpointer unloader_run(gpointer data)
{
	struct unloader *u = data;

	te_plugin_naming_unload(u->g, u->p);
	g_atomic_int_set(&u->returned, 1);
	return NULL;
}

/* The unloader is waiting on the guard's condition (or has returned). */
static void wait_unloader_parked(struct unloader *u)
{
	/*
	 * It sets the flag under the lock, then waits on the condition: once the flag is seen,
	 * give it time to reach the wait. (If it came later still, "not returned yet" below
	 * would hold anyway; a guard that does not wait fails them.)
	 */
	for (;;) {
		bool set;

		pthread_mutex_lock(&u->g->lock);
		set = u->p->unloaded;
		pthread_mutex_unlock(&u->g->lock);
		if (set)
			break;
		g_usleep(1000);
	}
	g_usleep(50 * 1000);
}

/* enter before unload succeeds; unload waits for every thread inside; enter after fails. */
static void test_naming_unload_waits(void)
{
	struct te_plugin_naming g;
	struct te_plugin_naming_peer p = { 0 }, other = { 0 };
	struct unloader u = { &g, &p, 0 };
	GThread *t;

	g_assert_cmpint(te_plugin_naming_init(&g), ==, 0);
	/* Two threads name the peer (counted, not a flag). */
	g_assert_true(te_plugin_naming_enter(&g, &p));
	g_assert_true(te_plugin_naming_enter(&g, &p));
	t = g_thread_new("unload", unloader_run, &u);
	wait_unloader_parked(&u);
	/* Unloading has begun: no new call may start, but the two under way go on. */
	g_assert_false(te_plugin_naming_enter(&g, &p));
	g_assert_cmpint(g_atomic_int_get(&u.returned), ==, 0);
	/* Another peer is not held up by this one's unload. */
	g_assert_true(te_plugin_naming_enter(&g, &other));
	te_plugin_naming_leave(&g, &other);
	te_plugin_naming_leave(&g, &p);
	g_usleep(50 * 1000);
	g_assert_cmpint(g_atomic_int_get(&u.returned), ==, 0);
	te_plugin_naming_leave(&g, &p);
	g_thread_join(t);
	g_assert_cmpint(g_atomic_int_get(&u.returned), ==, 1);
	g_assert_cmpuint(p.inside, ==, 0);
	g_assert_false(te_plugin_naming_enter(&g, &p));
	/* Unloading a peer nobody names returns at once; so does a second unload. */
	te_plugin_naming_unload(&g, &other);
	te_plugin_naming_unload(&g, &other);
	g_assert_false(te_plugin_naming_enter(&g, &other));
	te_plugin_naming_destroy(&g);
}

/* Many threads entering and leaving while the peer is unloaded: none is inside afterwards. */
struct hammer {
	struct te_plugin_naming *g;
	struct te_plugin_naming_peer *p;
	gint *unload_returned;
	gint late; /* a thread found itself inside after unload returned */
	gint stop;
};

static gpointer hammer_run(gpointer data)
{
	struct hammer *h = data;

	while (!g_atomic_int_get(&h->stop)) {
		if (!te_plugin_naming_enter(h->g, h->p))
			continue;
		if (g_atomic_int_get(h->unload_returned))
			g_atomic_int_set(&h->late, 1);
		te_plugin_naming_leave(h->g, h->p);
	}
	return NULL;
}

static void test_naming_race(void)
{
	for (int round = 0; round < 50; round++) {
		struct te_plugin_naming g;
		struct te_plugin_naming_peer p = { 0 };
		gint returned = 0;
		struct hammer h = { &g, &p, &returned, 0, 0 };
		GThread *t[4];

		g_assert_cmpint(te_plugin_naming_init(&g), ==, 0);
		for (unsigned i = 0; i < G_N_ELEMENTS(t); i++)
			t[i] = g_thread_new("name", hammer_run, &h);
		g_usleep(200);
		te_plugin_naming_unload(&g, &p);
		g_atomic_int_set(&returned, 1);
		g_usleep(200);
		g_atomic_int_set(&h.stop, 1);
		for (unsigned i = 0; i < G_N_ELEMENTS(t); i++)
			g_thread_join(t[i]);
		g_assert_cmpint(g_atomic_int_get(&h.late), ==, 0);
		g_assert_cmpuint(p.inside, ==, 0);
		te_plugin_naming_destroy(&g);
	}
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/plugin-util/layout", test_layout);
	g_test_add_func("/plugin-util/round-trip", test_round_trip);
	g_test_add_func("/plugin-util/naming-unload-waits", test_naming_unload_waits);
	g_test_add_func("/plugin-util/naming-race", test_naming_race);
	return g_test_run();
}
