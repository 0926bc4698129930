/* SPDX-License-Identifier: Apache-2.0 */
/* engine_test.c: the engine's wiring: names, generations, advertised address, start unwinding. */
#include <string.h>

#include <glib.h>

#include "core/control.h"
#include "core/engine.h"
#include "fake.h"
#include "itest.h"

/* An engine on the loopback test plugin listening on @listen, with extra engine keys @extra. */
static struct te_engine *engine_at(const char *listen, const char *extra)
{
	g_autofree char *y = g_strdup_printf("engine: {listen: \"%s\"%s%s}\n"
					     "transports: [{name: loopback, required: true}]\n",
					     listen, extra ? ", " : "", extra ? extra : "");
	struct te_engine *te = NULL;

	assert_ok(te_engine_new_from_string(y, strlen(y), &te));
	return te;
}

/* Without engine.name the segment is named by its control address; generations differ. */
static void test_name_generation(void)
{
	struct te_engine *a = engine_at("127.0.0.1:0", NULL), *b = engine_at("127.0.0.1:0", NULL);
	struct engine *ea = fake_engine(a), *eb = fake_engine(b);

	g_assert_true(g_str_has_prefix(te_engine_name(a), "127.0.0.1:"));
	g_assert_cmpstr(te_engine_name(a), ==, control_address(ea));
	g_assert_cmpstr(te_engine_name(a), !=, te_engine_name(b));
	g_assert_cmphex(ea->generation, !=, eb->generation);
	g_assert_cmphex(ea->generation, !=, 0);
	te_engine_free(b);
	te_engine_free(a);
}

/* The descriptor carries a reachable address: never a wildcard; engine.advertise wins. */
static void test_advertise(void)
{
	struct te_engine *w = engine_at("0.0.0.0:0", NULL);
	struct te_engine *n = engine_at("127.0.0.1:0", "advertise: node-7.example");
	const char *aw = control_address(fake_engine(w));
	const char *an = control_address(fake_engine(n));
	const char *bound = strrchr(te_engine_name(n), ':');

	g_test_message("wildcard listener advertises %s; advertise: node-7.example gives %s", aw,
		       an);
	g_assert_false(g_str_has_prefix(aw, "0.0.0.0:"));
	g_assert_nonnull(strrchr(aw, ':'));
	/* The name was taken from the advertised address, with the bound port. */
	g_assert_true(g_str_has_prefix(an, "node-7.example:"));
	g_assert_cmpstr(strrchr(an, ':'), ==, bound);
	te_engine_free(n);
	te_engine_free(w);
}

/* A start that fails half way (required transport missing) unwinds every module it started. */
static void test_start_unwinds(void)
{
	static const char y[] = "engine: {listen: \"127.0.0.1:0\"}\n"
				"transports:\n"
				"  - {name: loopback, required: true}\n"
				"  - {name: no-such-transport, required: true}\n";
	struct te_engine *te = NULL;

	for (int i = 0; i < 3; i++) {
		g_assert_cmpint(te_engine_new_from_string(y, strlen(y), &te), ==,
				TE_ERR_PLUGIN_NOT_FOUND);
		g_assert_null(te);
		assert_contains(te_last_error(), "no-such-transport");
	}
	/* The listener it had bound is closed again: a new engine starts fine. */
	te = engine_at("127.0.0.1:0", NULL);
	te_engine_free(te);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/engine/name-generation", test_name_generation);
	g_test_add_func("/engine/advertise", test_advertise);
	g_test_add_func("/engine/start-unwinds", test_start_unwinds);
	return g_test_run();
}
