/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_nodev_test.c: on a machine without RDMA devices the real rdma plugin refuses to install. */
#include "itest.h"

#include <dirent.h>

/* True when the kernel shows at least one RDMA device. */
static bool have_rdma_device(void)
{
	DIR *d = opendir("/sys/class/infiniband");
	struct dirent *e;
	bool any = false;

	if (!d)
		return false;
	while ((e = readdir(d)))
		any |= e->d_name[0] != '.';
	closedir(d);
	return any;
}

/* Required: engine start fails, quoting the plugin's reason. */
static void test_required(void)
{
	struct itest_transport t = { .name = "rdma", .required = true };
	g_autofree char *yaml = itest_yaml("N", &t, 1, NULL);
	struct te_engine *e = NULL;

	assert_status(te_engine_new_from_string(yaml, strlen(yaml), &e), TE_ERR_PLUGIN_INIT);
	g_assert_null(e);
	assert_contains(te_last_error(), "no RDMA device found");
}

/* Optional: skipped; the engine starts on the transports that did install. */
static void test_optional(void)
{
	struct itest_transport t[2] = {
		{ .name = "rdma", .required = false },
		{ .name = "tcp", .required = true },
	};
	g_autofree char *yaml = itest_yaml("N", t, 2, NULL);
	struct te_engine *e = NULL;
	char *json = NULL;
	size_t len = 0;

	assert_ok(te_engine_new_from_string(yaml, strlen(yaml), &e));
	assert_ok(te_segment_export(e, &json, &len));
	g_assert_null(strstr(json, "\"rdma\""));
	g_assert_nonnull(strstr(json, "\"tcp\""));
	te_free(json);
	te_engine_free(e);
}

int main(int argc, char **argv)
{
	g_autofree char *rdma = NULL, *tcp = NULL;

	g_test_init(&argc, &argv, NULL);
	rdma = itest_plugin_file("rdma");
	tcp = itest_plugin_file("tcp");
	if (have_rdma_device() || !rdma || !tcp) {
		printf("1..0 # SKIP %s\n", !rdma || !tcp ? "rdma.so or tcp.so not built"
							 : "this machine has RDMA devices");
		return 77;
	}
	g_test_add_func("/rdma/no-device/required", test_required);
	g_test_add_func("/rdma/no-device/optional", test_optional);
	return g_test_run();
}
