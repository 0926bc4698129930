/* SPDX-License-Identifier: Apache-2.0 */
/* transport_test.c: the op wrappers (serialization, set_error capture) and device quarantine. */
#include <string.h>

#include <glib.h>

#include "core/engine.h"
#include "core/plugin.h"
#include "core/transport.h"
#include "fake.h"

struct caller {
	struct transport *tp;
	unsigned rounds;
};

static gpointer call_ops(gpointer data)
{
	struct caller *c = data;
	struct te_plugin_slice ps = { .size = sizeof(ps) };
	struct te_plugin_mem *mem = NULL;
	char buf[8];

	for (unsigned i = 0; i < c->rounds; i++) {
		g_assert_cmpint(transport_cancel(c->tp, &ps), ==, TE_OK);
		g_assert_cmpint(transport_retry_prepare(c->tp, &ps), ==, TE_OK);
		g_assert_cmpint(
			transport_reg_mem(c->tp, buf, sizeof(buf), TE_PLUGIN_MEM_CPU, -1, 0, &mem),
			==, TE_ERR_NOMEM);
	}
	return NULL;
}

static void run_callers(struct transport *tp)
{
	struct caller c = { .tp = tp, .rounds = 20 };
	GThread *t[4];

	for (unsigned i = 0; i < G_N_ELEMENTS(t); i++)
		t[i] = g_thread_new("caller", call_ops, &c);
	for (unsigned i = 0; i < G_N_ELEMENTS(t); i++)
		g_thread_join(t[i]);
}

/*
 * TE_PLUGIN_CAP_HYBRID_PROGRESS without the op progress: refused at start, with the plugin
 * file and the op named. The same flag on a SERIALIZED plugin is ignored (not hybrid).
 */
static void test_hybrid_needs_progress(void)
{
	g_autofree char *err = NULL;
	struct transport *tp = NULL;

	fake_reset();
	fake.caps_flags = TE_PLUGIN_CAP_HYBRID_PROGRESS;
	g_assert_cmpint(fake_transport_try(TE_PLUGIN_THREAD_MULTI, 1, &tp, &err), ==,
			TE_ERR_PLUGIN_INVALID);
	g_assert_null(tp);
	g_assert_nonnull(err);
	g_assert_nonnull(strstr(err, "<tests/core/fake.c>: required op 'progress' is missing"));
	g_assert_nonnull(strstr(err, "TE_PLUGIN_CAP_HYBRID_PROGRESS"));
	g_clear_pointer(&err, g_free);

	g_assert_cmpint(fake_transport_try(TE_PLUGIN_THREAD_SERIALIZED, 1, &tp, &err), ==, TE_OK);
	g_assert_nonnull(tp);
	g_assert_false(tp->hybrid);
	g_assert_false(tp->polled);
	fake_transport_free(tp);
	fake.caps_flags = 0;
}

/* A SERIALIZED plugin never sees two data-path calls at once, reg_mem included. */
static void test_serialized(void)
{
	struct transport *tp;

	fake_reset();
	tp = fake_transport_new(TE_PLUGIN_THREAD_SERIALIZED, 1);
	g_assert_true(tp->serialized);
	run_callers(tp);
	g_assert_cmpuint(atomic_load(&fake.overlaps), ==, 0);
	g_assert_cmpuint(atomic_load(&fake.cancels), ==, 80);
	g_assert_cmpuint(atomic_load(&fake.retry_prepares), ==, 80);
	fake_transport_free(tp);
}

/* A MULTI plugin gets calls at once (the wrappers add no lock: the test can fail). */
static void test_multi(void)
{
	struct transport *tp;

	fake_reset();
	tp = fake_transport_new(TE_PLUGIN_THREAD_MULTI, 1);
	g_assert_false(tp->serialized);
	run_callers(tp);
	g_assert_cmpuint(atomic_load(&fake.overlaps), >, 0);
	fake_transport_free(tp);
}

/* What an op says through host->set_error is its failure's text, and only that op's. */
static void test_set_error(void)
{
	struct transport *tp;
	struct te_plugin_mem *mem = NULL;
	struct te_plugin_slice ps = { .size = sizeof(ps) };
	char buf[16];

	fake_reset();
	tp = fake_transport_new(TE_PLUGIN_THREAD_MULTI, 1);
	g_assert_cmpint(transport_reg_mem(tp, buf, sizeof(buf), TE_PLUGIN_MEM_CPU, -1, 0, &mem), ==,
			TE_ERR_NOMEM);
	g_assert_cmpstr(transport_op_error(), ==, "reg_mem of 16 bytes refused");
	g_assert_cmpstr(transport_error(tp), ==, "reg_mem of 16 bytes refused");
	/* The next op starts with a clean slate. */
	g_assert_cmpint(transport_cancel(tp, &ps), ==, TE_OK);
	g_assert_cmpstr(transport_op_error(), ==, "");
	g_assert_cmpint(transport_unpack_remote_key(tp, NULL, "", 0, 0, 0, NULL), ==,
			TE_ERR_PROTOCOL);
	g_assert_cmpstr(transport_error(tp), ==, "no key of 0 bytes");
	/* An op the plugin lacks answers with the loader's stub, and clears the error. */
	g_assert_cmpint(transport_wait(tp, 0), ==, TE_ERR_UNSUPPORTED);
	g_assert_cmpstr(transport_op_error(), ==, "");
	fake_transport_free(tp);
}

static void test_paused_devices(void)
{
	struct transport *tp;
	uint64_t now = engine_now_ns();

	fake_reset();
	tp = fake_transport_new(TE_PLUGIN_THREAD_MULTI, 3);
	g_assert_cmpuint(tp->n_devices, ==, 3);
	g_assert_cmphex(transport_paused_devices(tp, now), ==, 0);
	transport_pause_device(tp, 1, now + 1000000000ull);
	g_assert_cmphex(transport_paused_devices(tp, now), ==, 0x2);
	/* Once the pause has passed, nothing is excluded. */
	g_assert_cmphex(transport_paused_devices(tp, now + 2000000000ull), ==, 0);
	/* Every device paused: exclude none (a retry must go somewhere). */
	transport_pause_device(tp, 0, now + 1000000000ull);
	transport_pause_device(tp, 2, now + 1000000000ull);
	g_assert_cmphex(transport_paused_devices(tp, now), ==, 0);
	/* Out of range: ignored. */
	transport_pause_device(tp, TRANSPORT_MAX_DEVICES, UINT64_MAX);
	fake_transport_free(tp);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/transport/hybrid-needs-progress", test_hybrid_needs_progress);
	g_test_add_func("/transport/serialized", test_serialized);
	g_test_add_func("/transport/multi", test_multi);
	g_test_add_func("/transport/set-error", test_set_error);
	g_test_add_func("/transport/paused-devices", test_paused_devices);
	return g_test_run();
}
