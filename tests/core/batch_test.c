/* SPDX-License-Identifier: Apache-2.0 */
/* batch_test.c: the batch handle table, batch reuse, and engine teardown with slices held. */
#include <glib.h>

#include "core/batch.h"
#include "core/engine.h"
#include "core/slice.h"
#include "fake.h"
#include "itest.h"

static void test_handles(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, "max_batches: 2");
	struct engine *e = fake_engine(te);
	te_batch_id a, b, c, a2;
	struct batch *got;
	struct batch **list;
	uint32_t n;

	list = batch_list_live(e, true, &n);
	g_assert_cmpuint(n, ==, 0);
	g_free(list);
	g_assert_cmpint(batch_new(e, 4, &a), ==, TE_OK);
	g_assert_cmpint(batch_new(e, 4, &b), ==, TE_OK);
	/* Two slots: the third waits for a free one. */
	g_assert_cmpint(batch_new(e, 4, &c), ==, TE_ERR_BUSY);
	g_assert_cmpint(batch_get(e, a, &got), ==, TE_OK);
	g_assert_true(got->engine == e);
	batch_unref(got);
	list = batch_list_live(e, true, &n);
	g_assert_cmpuint(n, ==, 2);
	/* The list holds a reference on each. */
	for (uint32_t i = 0; i < n; i++)
		batch_unref(list[i]);
	g_free(list);
	g_assert_cmpint(batch_free(e, a), ==, TE_OK);
	/* A freed handle is dead even when its slot is reused: the generation moved on. */
	g_assert_cmpint(batch_get(e, a, &got), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_free(e, a), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_new(e, 4, &a2), ==, TE_OK);
	g_assert_cmpuint((uint32_t)a2, ==, (uint32_t)a);
	g_assert_cmphex(a2, !=, a);
	g_assert_cmpint(batch_get(e, a, &got), ==, TE_ERR_INVALID_HANDLE);
	/* Forged handles: slot out of range, generation 0. */
	g_assert_cmpint(batch_get(e, (te_batch_id)1 << 32 | 7, &got), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_get(e, (uint32_t)b, &got), ==, TE_ERR_INVALID_HANDLE);
	g_assert_cmpint(batch_free(e, b), ==, TE_OK);
	g_assert_cmpint(batch_free(e, a2), ==, TE_OK);
	te_engine_free(te);
}

/* A freed batch goes to the cache and comes back for the next batch_new of its size. */
static void test_cache(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	te_batch_id id;
	struct batch *first, *again;

	g_assert_cmpint(batch_new(e, 8, &id), ==, TE_OK);
	g_assert_cmpint(batch_get(e, id, &first), ==, TE_OK);
	batch_unref(first);
	g_assert_cmpint(batch_free(e, id), ==, TE_OK);
	g_assert_cmpuint(e->n_cached, ==, 1);
	g_assert_cmpint(batch_new(e, 8, &id), ==, TE_OK);
	g_assert_cmpint(batch_get(e, id, &again), ==, TE_OK);
	g_assert_true(again == first);
	g_assert_cmpuint(atomic_load(&again->n_tasks), ==, 0);
	batch_unref(again);
	g_assert_cmpuint(e->n_cached, ==, 0);
	g_assert_cmpint(batch_free(e, id), ==, TE_OK);
	te_engine_free(te);
}

/* Engine teardown with slices a transport still holds: canceled, handed back, freed. */
static void test_teardown_held(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	static char buf[1 << 16];
	struct te_request r = { .opcode = TE_OP_WRITE,
				.segment = TE_SEGMENT_LOCAL,
				.local = buf,
				.remote = (uintptr_t)(buf + sizeof(buf) / 2),
				.length = sizeof(buf) / 2 };
	struct te_batch_info info;
	te_batch_id id;

	fake_reset();
	fake.hold = true;
	fake_take_over(e->tps[0]);
	g_assert_cmpint(te_mem_register(te, buf, sizeof(buf), "cpu", TE_MEM_REMOTE), ==, TE_OK);
	g_assert_cmpint(te_batch_new(te, 4, &id), ==, TE_OK);
	g_assert_cmpint(te_batch_submit(te, id, &r, 1), ==, TE_OK);
	g_assert_cmpuint(fake.n_held, >, 0);
	g_assert_cmpint(te_batch_status(te, id, &info), ==, TE_OK);
	g_assert_cmpint(info.state, ==, TE_STATE_PENDING);
	g_assert_cmpint(te_batch_free(te, id), ==, TE_ERR_BUSY);
	/* Not freed by the user either: teardown cancels (the fake hands back) and frees. */
	te_engine_free(te);
	g_assert_cmpuint(fake.n_held, ==, 0);
	g_assert_cmpuint(atomic_load(&fake.cancels), >, 0);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/batch/handles", test_handles);
	g_test_add_func("/batch/cache", test_cache);
	g_test_add_func("/batch/teardown-held", test_teardown_held);
	return g_test_run();
}
