/* SPDX-License-Identifier: Apache-2.0 */
/* The http metadata backend's ops against a real te-metadata-server: claim, takeover, TTL, restart. */
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>

#include "core/metadata/mdcurl.h"
#include "core/metadata/metadata.h"
#include "mdcase.h"
#include "mdserver.h"


static const struct metadata_ops *const ops = &metadata_http_ops;

/* A PUT straight to the server (any bytes), as another tool would. */
static void raw_put(const char *url, const char *key, const void *value, size_t len)
{
	g_autofree char *k = mdcurl_escape(key);
	g_autofree char *u = g_strdup_printf("%s?key=%s", url, k);
	g_autofree char *err = NULL;
	struct mdcurl_request r = {
		.method = "PUT", .url = u, .body = value, .body_len = len, .timeout_ms = 5000
	};
	GBytes *resp = NULL;
	long code = 0;

	g_assert_cmpint(mdcurl_perform(&r, &code, &resp, &err), ==, TE_OK);
	g_assert_cmpint(code, ==, 200);
	g_bytes_unref(resp);
}

static bool skip_without_server(void)
{
	if (mdserver_available(MDSERVER_HTTP))
		return false;
	g_test_skip("te-metadata-server not built (needs libsoup-3.0)");
	return true;
}

static struct mdserver *server_with_ttl(void)
{
	static const char *const extra[] = { "--ttl-s", "2", NULL };

	return mdserver_start(MDSERVER_HTTP, extra);
}

static void test_roundtrip(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("rt");
	g_autofree char *v1 = md_desc("a", "11", "127.0.0.1:7001", NULL);
	g_autofree char *pad = NULL, *v2 = NULL, *err = NULL;
	struct md m;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&m, ops, srv->url, ns, NULL);
	md_assert_absent(&m, "a");
	md_publish_ok(&m, "a", v1);
	md_assert_value(&m, "a", v1, strlen(v1));
	pad = g_strnfill(1u << 20, 'x');
	v2 = md_desc("a", "11", "127.0.0.1:7001", pad);
	md_publish_ok(&m, "a", v2);
	md_assert_value(&m, "a", v2, strlen(v2));
	g_assert_cmpint(metadata_http_ops.withdraw(m.st, "a", &err), ==, TE_OK);
	md_assert_absent(&m, "a");
	g_assert_null(metadata_http_ops.watch);
	md_close(&m);
	mdserver_free(srv);
}

static void test_collision(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("coll");
	g_autofree char *va = md_desc("n", "1001", "10.0.0.1:5000", NULL);
	g_autofree char *vb = md_desc("n", "2002", "10.0.0.2:5000", NULL);
	g_autofree char *err = NULL;
	struct md a, b;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&a, ops, srv->url, ns, NULL);
	md_open(&b, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "n", va);
	g_assert_cmpint(metadata_http_ops.publish(b.st, "n", vb, strlen(vb), &err), ==,
			TE_ERR_EXISTS);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "10.0.0.1:5000"));
	g_assert_nonnull(strstr(err, "1001"));
	md_assert_value(&b, "n", va, strlen(va));
	md_close(&b);
	md_close(&a);
	mdserver_free(srv);
}

static void test_takeover(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("take");
	g_autofree char *va = md_desc("t", "1", "127.0.0.1:6000", NULL);
	g_autofree char *vb = md_desc("t", "2", "127.0.0.1:6000", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct md a, b;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&a, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "t", va);
	md_close(&a);
	md_open(&b, ops, srv->url, ns, cap);
	md_publish_ok(&b, "t", vb);
	md_assert_value(&b, "t", vb, strlen(vb));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_INFO, "taking over segment name 't'"),
			 ==, 1);
	md_close(&b);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

/* With --ttl-s: kept while republished, gone within ttl + 1 s of a close without withdraw. */
static void test_expiry(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("exp");
	g_autofree char *va = md_desc("e", "5", "127.0.0.1:6100", NULL);
	struct md a, w;
	int64_t ms;

	if (skip_without_server())
		return;
	srv = server_with_ttl();
	md_open(&a, ops, srv->url, ns, NULL);
	md_open(&w, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "e", va);
	g_usleep((MD_TTL_S + 1) * G_USEC_PER_SEC);
	md_assert_value(&w, "e", va, strlen(va));
	md_close(&a);
	ms = md_wait_presence(&w, "e", true, (MD_TTL_S + 1) * 1000);
	g_test_message("expired %" G_GINT64_FORMAT " ms after close", ms);
	g_assert_cmpint(ms, >=, 0);
	md_close(&w);
	mdserver_free(srv);
}

/* The server restarted without its data: the publisher PUTs again within ttl_s / 3. */
static void test_restart(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("rs");
	g_autofree char *va = md_desc("r", "7", "127.0.0.1:6300", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct md a, w;
	int64_t ms;

	if (skip_without_server())
		return;
	srv = server_with_ttl();
	md_open(&a, ops, srv->url, ns, cap);
	md_open(&w, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "r", va);
	mdserver_stop(srv, true);
	g_usleep(G_USEC_PER_SEC); /* republishing fails meanwhile */
	mdserver_restart(srv);
	ms = md_wait_presence(&w, "r", false, MD_TTL_S * 1000);
	g_test_message("re-published %" G_GINT64_FORMAT " ms after the restart", ms);
	g_assert_cmpint(ms, >=, 0);
	md_assert_value(&w, "r", va, strlen(va));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_WARN, "http metadata"), ==, 1);
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_INFO, "published again"), ==, 1);
	md_close(&w);
	md_close(&a);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

static void test_down(void)
{
	g_autofree char *u1 = g_strdup_printf("http://127.0.0.1:%u/metadata", mdserver_dead_port());
	g_autofree char *u2 = g_strdup_printf("http://127.0.0.1:%u/metadata", mdserver_dead_port());
	const char *eps[] = { u1, u2, NULL };
	g_autofree char *ns = md_new_ns("down");
	g_autofree char *v = md_desc("d", "1", "127.0.0.1:1", NULL);
	g_autofree char *err = NULL;
	GBytes *out = NULL;
	struct md m;

	md_open_eps(&m, ops, eps, ns, NULL);
	g_assert_cmpint(metadata_http_ops.publish(m.st, "d", v, strlen(v), &err), ==,
			TE_ERR_METADATA_UNAVAILABLE);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, u1));
	g_assert_nonnull(strstr(err, u2));
	g_assert_nonnull(strstr(err, "Couldn't connect"));
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(md_get(&m, "d", &out, &err), ==, TE_ERR_METADATA_UNAVAILABLE);
	md_close(&m);
}

static void test_failover(void)
{
	struct mdserver *srv;
	g_autofree char *dead =
		g_strdup_printf("http://127.0.0.1:%u/metadata", mdserver_dead_port());
	g_autofree char *ns = md_new_ns("fo");
	g_autofree char *v = md_desc("f", "3", "127.0.0.1:6500", NULL);
	const char *eps[3];
	struct md m;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	eps[0] = dead;
	eps[1] = srv->url;
	eps[2] = NULL;
	md_open_eps(&m, ops, eps, ns, NULL);
	md_publish_ok(&m, "f", v);
	md_assert_value(&m, "f", v, strlen(v));
	md_close(&m);
	mdserver_free(srv);
}

/* Values that are not descriptors pass through get; publishing takes them over. */
static void test_garbage(void)
{
	static const char bin[] = { 0, 1, 2, (char)0xff, (char)0xfe, '{', 0, '"', '\n' };
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("junk");
	g_autofree char *k = metadata_key(ns, "bin");
	g_autofree char *mine = md_desc("bin", "4", "127.0.0.1:6600", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct md m;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&m, ops, srv->url, ns, cap);
	raw_put(srv->url, k, bin, sizeof(bin));
	md_assert_value(&m, "bin", bin, sizeof(bin));
	md_publish_ok(&m, "bin", mine);
	md_assert_value(&m, "bin", mine, strlen(mine));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_WARN, "taking over segment name 'bin'"),
			 ==, 1);
	md_close(&m);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/http/roundtrip", test_roundtrip);
	g_test_add_func("/http/collision", test_collision);
	g_test_add_func("/http/takeover", test_takeover);
	g_test_add_func("/http/expiry", test_expiry);
	g_test_add_func("/http/restart", test_restart);
	g_test_add_func("/http/down", test_down);
	g_test_add_func("/http/failover", test_failover);
	g_test_add_func("/http/garbage", test_garbage);
	return g_test_run();
}
