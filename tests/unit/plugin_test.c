/* SPDX-License-Identifier: Apache-2.0 */
/* plugin_test.c: descriptor validation rules of the loader, without dlopen. */
#include <string.h>

#include <glib.h>

#include "core/plugin.h"
#include "te_build_config.h"

static enum te_status fake_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				struct te_plugin_inst **inst_out)
{
	return TE_OK;
}

static void fake_fini(struct te_plugin_inst *inst)
{
}

static enum te_status fake_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	return TE_OK;
}

static enum te_status fake_reg(struct te_plugin_inst *inst, void *addr, uint64_t length,
			       uint32_t mem_type, int32_t dev, uint32_t access,
			       struct te_plugin_mem **mem_out)
{
	return TE_OK;
}

static enum te_status fake_dereg(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	return TE_OK;
}

static enum te_status fake_pack(struct te_plugin_inst *inst, struct te_plugin_mem *mem, void *buf,
				size_t cap, size_t *len_out)
{
	return TE_OK;
}

static enum te_status fake_load(struct te_plugin_inst *inst, const char *peer_name,
				const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	return TE_OK;
}

static enum te_status fake_load_ex(struct te_plugin_inst *inst,
				   const struct te_plugin_peer_info *info, const void *blob,
				   size_t len, struct te_plugin_peer **peer_out)
{
	return TE_OK;
}

static void fake_unload(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
}

static enum te_status fake_unpack(struct te_plugin_inst *inst, struct te_plugin_peer *peer,
				  const void *blob, size_t len, uint64_t addr, uint64_t length,
				  struct te_plugin_rkey **rkey_out)
{
	return TE_OK;
}

static enum te_status fake_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				  uint32_t n, uint32_t *accepted_out)
{
	*accepted_out = n;
	return TE_OK;
}

static struct te_plugin_ops good_ops(void)
{
	struct te_plugin_ops o = {
		.size = sizeof(o),
		.init = fake_init,
		.fini = fake_fini,
		.query_caps = fake_caps,
		.reg_mem = fake_reg,
		.dereg_mem = fake_dereg,
		.pack_key = fake_pack,
		.load_peer = fake_load,
		.unload_peer = fake_unload,
		.unpack_remote_key = fake_unpack,
		.submit = fake_submit,
	};
	return o;
}

static struct te_plugin_desc good_desc(const struct te_plugin_ops *ops)
{
	struct te_plugin_desc d = {
		.size = sizeof(d),
		.abi_major = TE_PLUGIN_ABI_MAJOR,
		.abi_minor = TE_PLUGIN_ABI_MINOR,
		.name = "fake",
		.version = "1",
		.description = "fake",
		.ops = ops,
	};
	return d;
}

static enum te_status check(const struct te_plugin_desc *d, char **err)
{
	struct te_plugin_ops out;

	*err = NULL;
	return plugin_validate(d, "/x/fake.so", &out, err);
}

static void test_good(void)
{
	struct te_plugin_ops ops = good_ops(), out;
	struct te_plugin_desc d = good_desc(&ops);
	char *err = NULL;

	g_assert_cmpint(plugin_validate(&d, "/x/fake.so", &out, &err), ==, TE_OK);
	g_assert_null(err);
	/* Optional ops the plugin left out answer "unsupported", never NULL. */
	g_assert_nonnull(out.cancel);
	g_assert_cmpint(out.cancel(NULL, NULL), ==, TE_ERR_UNSUPPORTED);
	g_assert_nonnull(out.retry_prepare);
	g_assert_cmpint(out.retry_prepare(NULL, NULL), ==, TE_ERR_UNSUPPORTED);
	g_assert_nonnull(out.handshake);
	g_assert_true(out.submit == fake_submit);
	g_assert_cmpuint(out.size, ==, sizeof(out));
}


/* Stands beyond a short ops table's size: answers what the core's stub never does. */
static enum te_status cancel_beyond_size(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	return TE_OK;
}

static void test_older_smaller_ops_table(void)
{
	/* A plugin built against an older 1.x may have a shorter ops table. */
	struct te_plugin_ops ops = good_ops(), out;
	struct te_plugin_desc d = good_desc(&ops);
	char *err = NULL;

	ops.size = offsetof(struct te_plugin_ops, submit) + sizeof(void *);
	ops.cancel = cancel_beyond_size; /* beyond its size: must not be copied */
	g_assert_cmpint(plugin_validate(&d, "/x/fake.so", &out, &err), ==, TE_OK);
	g_assert_cmpint(out.cancel(NULL, NULL), ==, TE_ERR_UNSUPPORTED);
}

static void test_rejections(void)
{
	struct te_plugin_ops ops = good_ops();
	struct te_plugin_desc d;
	char *err;

	g_assert_cmpint(check(NULL, &err), ==, TE_ERR_PLUGIN_INVALID);
	g_assert_cmpstr(err, ==, "/x/fake.so: entry point returned no descriptor");
	g_free(err);

	d = good_desc(&ops);
	d.abi_major = 2;
	g_assert_cmpint(check(&d, &err), ==, TE_ERR_ABI_MISMATCH);
	g_assert_cmpstr(err, ==, "/x/fake.so: ABI major 2 is not supported (core ABI 1.2)");
	g_free(err);

	d = good_desc(&ops);
	d.abi_minor = TE_PLUGIN_ABI_MINOR + 1;
	g_assert_cmpint(check(&d, &err), ==, TE_ERR_ABI_MISMATCH);
	g_assert_cmpstr(err, ==, "/x/fake.so: ABI minor 3 is newer than the core's 1.2");
	g_free(err);

	d = good_desc(&ops);
	d.size = 4;
	g_assert_cmpint(check(&d, &err), ==, TE_ERR_PLUGIN_INVALID);
	g_assert_nonnull(strstr(err, "descriptor size 4 is smaller"));
	g_free(err);

	d = good_desc(&ops);
	d.name = "";
	g_assert_cmpint(check(&d, &err), ==, TE_ERR_PLUGIN_INVALID);
	g_free(err);

	d = good_desc(NULL);
	g_assert_cmpint(check(&d, &err), ==, TE_ERR_PLUGIN_INVALID);
	g_assert_cmpstr(err, ==, "/x/fake.so: descriptor has no ops table");
	g_free(err);

	{
		static const char *const names[] = {
			"init",	    "fini",	 "query_caps",	"reg_mem",	     "dereg_mem",
			"pack_key", "load_peer", "unload_peer", "unpack_remote_key", "submit"
		};
		const size_t offs[] = {
			offsetof(struct te_plugin_ops, init),
			offsetof(struct te_plugin_ops, fini),
			offsetof(struct te_plugin_ops, query_caps),
			offsetof(struct te_plugin_ops, reg_mem),
			offsetof(struct te_plugin_ops, dereg_mem),
			offsetof(struct te_plugin_ops, pack_key),
			offsetof(struct te_plugin_ops, load_peer),
			offsetof(struct te_plugin_ops, unload_peer),
			offsetof(struct te_plugin_ops, unpack_remote_key),
			offsetof(struct te_plugin_ops, submit),
		};
		for (size_t i = 0; i < G_N_ELEMENTS(offs); i++) {
			struct te_plugin_ops o = good_ops();
			g_autofree char *want = g_strdup_printf(
				"/x/fake.so: required op '%s'%s is missing", names[i],
				strcmp(names[i], "load_peer") ? "" : " (or 'load_peer_ex')");

			memset((char *)&o + offs[i], 0, sizeof(void *));
			d = good_desc(&o);
			g_assert_cmpint(check(&d, &err), ==, TE_ERR_PLUGIN_INVALID);
			g_assert_cmpstr(err, ==, want);
			g_free(err);
		}
	}
	/* load_peer_ex (ABI 1.2) stands in for load_peer. */
	{
		struct te_plugin_ops o = good_ops();
		struct te_plugin_ops out;

		o.load_peer_ex = fake_load_ex;
		o.load_peer = NULL;
		d = good_desc(&o);
		g_assert_cmpint(plugin_validate(&d, "/x/fake.so", &out, &err), ==, TE_OK);
		g_assert_true(out.load_peer_ex == fake_load_ex);
		g_assert_null(out.load_peer);
	}
}

static void test_open_missing(void)
{
	struct plugin *p = NULL;
	char *err = NULL;

	g_assert_cmpint(plugin_open("nosuch", NULL, "/nonexistent-dir", &p, &err), ==,
			TE_ERR_PLUGIN_NOT_FOUND);
	g_assert_nonnull(strstr(err, "nosuch.so: plugin not found in search path"));
	g_assert_null(p);
	g_free(err);
	g_assert_cmpint(plugin_open("x", "/nonexistent/x.so", NULL, &p, &err), ==,
			TE_ERR_PLUGIN_NOT_FOUND);
	g_assert_nonnull(strstr(err, "/nonexistent/x.so: plugin file not found"));
	g_free(err);
}

/* Run from the build tree, the search path has the build's plugin folders (no TE_PLUGIN_PATH). */
static void test_search_path_build_tree(void)
{
	g_autofree char *saved = g_strdup(g_getenv("TE_PLUGIN_PATH"));
	g_autofree char *path = NULL;
	g_autofree char *tcp_dir = g_build_filename(TE_BUILD_ROOT, "plugins", "tcp", NULL);
	g_autofree char *tcp_so = g_build_filename(tcp_dir, "tcp.so", NULL);

	g_unsetenv("TE_PLUGIN_PATH");
	path = plugin_search_path();
	if (saved)
		g_setenv("TE_PLUGIN_PATH", saved, TRUE);
	g_assert_true(g_str_has_suffix(path, TE_PLUGINDIR));
	if (!g_file_test(tcp_so, G_FILE_TEST_EXISTS)) {
		g_test_skip("tcp is not built here");
		return;
	}
	g_assert_nonnull(strstr(path, tcp_dir));
	/* The build's folders come before the install directory. */
	g_assert_true(strstr(path, tcp_dir) < strstr(path, TE_PLUGINDIR));
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/plugin/search-path-build-tree", test_search_path_build_tree);
	g_test_add_func("/plugin/good", test_good);
	g_test_add_func("/plugin/older-ops", test_older_smaller_ops_table);
	g_test_add_func("/plugin/rejections", test_rejections);
	g_test_add_func("/plugin/open-missing", test_open_missing);
	return g_test_run();
}
