/* SPDX-License-Identifier: Apache-2.0 */
/* mem_test.c: location parsing and the sorted region table's range checks. */
#include <glib.h>

#include "core/mem.h"
#include "core/memkind.h"

static void test_location(void)
{
	uint32_t type = 0;
	int32_t dev = 7;

	g_assert_cmpint(memkind_parse_location("cpu", &type, &dev), ==, TE_OK);
	g_assert_cmpuint(type, ==, TE_PLUGIN_MEM_CPU);
	g_assert_cmpint(dev, ==, -1);
	g_assert_cmpint(memkind_parse_location("cpu:1", &type, &dev), ==, TE_OK);
	g_assert_cmpint(dev, ==, 1);
	g_assert_cmpint(memkind_parse_location("cuda:3", &type, &dev), ==, TE_OK);
	g_assert_cmpuint(type, ==, TE_PLUGIN_MEM_CUDA);
	g_assert_cmpint(dev, ==, 3);
	g_assert_cmpint(memkind_parse_location("hip:0", &type, &dev), ==, TE_OK);
	g_assert_cmpuint(type, ==, TE_PLUGIN_MEM_HIP);
	g_assert_cmpint(memkind_parse_location("cxl:2", &type, &dev), ==, TE_OK);
	g_assert_cmpuint(type, ==, TE_PLUGIN_MEM_CXL);
	g_assert_cmpint(memkind_parse_location("*", &type, &dev), ==, TE_OK);
	g_assert_cmpuint(type, ==, TE_PLUGIN_MEM_CPU);
	g_assert_cmpint(memkind_parse_location(NULL, &type, &dev), ==, TE_OK);
	type = 99;
	dev = 99;
	g_assert_cmpint(memkind_parse_location("gpu:0", &type, &dev), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(memkind_parse_location("cuda:", &type, &dev), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(memkind_parse_location("cuda:x", &type, &dev), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(memkind_parse_location("cuda:99999", &type, &dev), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(memkind_parse_location("cpux", &type, &dev), ==, TE_ERR_INVALID_ARG);
	/* Outputs untouched on failure. */
	g_assert_cmpuint(type, ==, 99);
	g_assert_cmpint(dev, ==, 99);
}

static struct mem_region *region(uint64_t addr, uint64_t len)
{
	struct mem_region *r = g_new0(struct mem_region, 1);

	r->addr = addr;
	r->length = len;
	return r;
}

static void test_table(void)
{
	GPtrArray *t = g_ptr_array_new_with_free_func(g_free);
	struct mem_region *r = NULL;
	guint idx = 99;

	g_assert_cmpint(mem_check_insert(t, 0x1000, 0x1000, &idx), ==, TE_OK);
	g_assert_cmpuint(idx, ==, 0);
	g_ptr_array_insert(t, (gint)idx, region(0x1000, 0x1000));
	g_assert_cmpint(mem_check_insert(t, 0x3000, 0x1000, &idx), ==, TE_OK);
	g_assert_cmpuint(idx, ==, 1);
	g_ptr_array_insert(t, (gint)idx, region(0x3000, 0x1000));
	/* Touching neighbours is fine; one byte of overlap is not. */
	g_assert_cmpint(mem_check_insert(t, 0x2000, 0x1000, &idx), ==, TE_OK);
	g_assert_cmpuint(idx, ==, 1);
	g_assert_cmpint(mem_check_insert(t, 0x1fff, 2, &idx), ==, TE_ERR_ADDRESS_OVERLAPPED);
	g_assert_cmpint(mem_check_insert(t, 0x2fff, 2, &idx), ==, TE_ERR_ADDRESS_OVERLAPPED);
	g_assert_cmpint(mem_check_insert(t, 0x0, 0x10000, &idx), ==, TE_ERR_ADDRESS_OVERLAPPED);
	g_assert_cmpint(mem_check_insert(t, 0x1800, 1, &idx), ==, TE_ERR_ADDRESS_OVERLAPPED);
	g_assert_cmpint(mem_check_insert(t, 0x5000, 0, &idx), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(mem_check_insert(t, UINT64_MAX - 4, 10, &idx), ==, TE_ERR_OVERFLOW);

	g_assert_cmpint(mem_lookup(t, 0x1000, 0x1000, &r), ==, TE_OK);
	g_assert_cmphex(r->addr, ==, 0x1000);
	g_assert_cmpint(mem_lookup(t, 0x3fff, 1, &r), ==, TE_OK);
	g_assert_cmphex(r->addr, ==, 0x3000);
	r = NULL;
	g_assert_cmpint(mem_lookup(t, 0x1fff, 2, &r), ==, TE_ERR_OUT_OF_RANGE);
	g_assert_cmpint(mem_lookup(t, 0x2000, 1, &r), ==, TE_ERR_NOT_REGISTERED);
	g_assert_cmpint(mem_lookup(t, 0xfff, 1, &r), ==, TE_ERR_NOT_REGISTERED);
	g_assert_cmpint(mem_lookup(t, 0x4000, 1, &r), ==, TE_ERR_NOT_REGISTERED);
	g_assert_cmpint(mem_lookup(t, 0x3000, UINT64_MAX, &r), ==, TE_ERR_OUT_OF_RANGE);
	g_assert_null(r);
	g_ptr_array_free(t, TRUE);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/mem/location", test_location);
	g_test_add_func("/mem/table", test_table);
	return g_test_run();
}
