/* SPDX-License-Identifier: Apache-2.0 */
/* lanes_settle.h: the tcp tests' check that lanes give their slots and counts back. */
#ifndef TE_TESTS_TCP_LANES_SETTLE_H
#define TE_TESTS_TCP_LANES_SETTLE_H

#include "itest.h"

#include <json-glib/json-glib.h>

/* in_flight + owner_in_flight over every lane of every peer of @e (te_engine_stats, "tcp"). */
static inline int64_t tcp_lanes_busy(struct te_engine *e)
{
	g_autoptr(JsonParser) parser = json_parser_new();
	JsonObject *root;
	JsonArray *peers;
	char *json = NULL;
	int64_t busy = 0;

	assert_ok(te_engine_stats(e, &json));
	g_assert_true(json_parser_load_from_data(parser, json, -1, NULL));
	te_free(json);
	root = json_node_get_object(json_parser_get_root(parser));
	peers = json_object_get_array_member(json_object_get_object_member(root, "tcp"), "peers");
	for (guint i = 0; i < json_array_get_length(peers); i++) {
		JsonArray *lanes = json_object_get_array_member(
			json_array_get_object_element(peers, i), "lanes");

		for (guint k = 0; k < json_array_get_length(lanes); k++) {
			JsonObject *l = json_array_get_object_element(lanes, k);

			busy += json_object_get_int_member(l, "in_flight") +
				json_object_get_int_member(l, "owner_in_flight");
		}
	}
	return busy;
}

/*
 * Every lane of every peer of @e gives its slots and in-flight counts back (in_flight and
 * owner_in_flight 0) within 5 s: requests that ended by cancel, failure or a moved lane
 * leave nothing behind (a leaked slot shrinks its lane for good).
 */
static inline void tcp_lanes_settle(struct te_engine *e)
{
	int64_t busy = tcp_lanes_busy(e);

	for (int tries = 1; tries < 500 && busy; tries++) {
		sleep_ms(10);
		busy = tcp_lanes_busy(e);
	}
	g_assert_cmpint(busy, ==, 0);
}

#endif /* TE_TESTS_TCP_LANES_SETTLE_H */
