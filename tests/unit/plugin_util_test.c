/* SPDX-License-Identifier: Apache-2.0 */
/* plugin_util_test.c: te_plugin_util.h's little-endian wire fields, at every alignment. */

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

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/plugin-util/layout", test_layout);
	g_test_add_func("/plugin-util/round-trip", test_round_trip);
	return g_test_run();
}
