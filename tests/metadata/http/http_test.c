/* SPDX-License-Identifier: Apache-2.0 */
/* The http metadata backend's ops against a real te-metadata-server: claim, takeover, TTL, restart. */
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>

#include "core/metadata/mdcurl.h"
#include "core/metadata/metadata.h"
#include "mdserver.h"

#define TTL_S 2u

/* Log lines the backend wrote, with their level. */
struct logcap {
	GMutex lock;
	GString *text;
	struct log_sink sink;
};

static void logcap_fn(void *user, enum te_log_level level, const char *msg)
{
	struct logcap *c = user;
	static const char lv[] = "EWIDT";

	g_mutex_lock(&c->lock);
	g_string_append_printf(c->text, "[%c] %s\n", lv[level <= TE_LOG_TRACE ? level : 4], msg);
	g_mutex_unlock(&c->lock);
	if (g_test_verbose())
		g_test_message("log: [%c] %s", lv[level <= TE_LOG_TRACE ? level : 4], msg);
}

static struct logcap *logcap_new(void)
{
	struct logcap *c = g_new0(struct logcap, 1);

	g_mutex_init(&c->lock);
	c->text = g_string_new(NULL);
	c->sink.fn = logcap_fn;
	c->sink.user = c;
	atomic_init(&c->sink.level, TE_LOG_DEBUG);
	return c;
}

static unsigned logcap_count(struct logcap *c, const char *tag, const char *needle)
{
	unsigned n = 0;
	g_auto(GStrv) lines = NULL;

	g_mutex_lock(&c->lock);
	lines = g_strsplit(c->text->str, "\n", -1);
	g_mutex_unlock(&c->lock);
	for (char **l = lines; *l; l++)
		if ((!tag || g_str_has_prefix(*l, tag)) && strstr(*l, needle))
			n++;
	return n;
}

static void logcap_free(struct logcap *c)
{
	g_string_free(c->text, TRUE);
	g_mutex_clear(&c->lock);
	g_free(c);
}

struct md {
	struct metadata_params p;
	const char *eps[4];
	char *ns;
	void *st;
};

static void md_open_eps(struct md *m, const char *const *eps, const char *ns, struct logcap *cap)
{
	g_autofree char *err = NULL;
	size_t n = 0;
	enum te_status st;

	memset(m, 0, sizeof(*m));
	while (eps[n])
		n++;
	for (size_t i = 0; i < n; i++)
		m->eps[i] = eps[i];
	m->ns = g_strdup(ns);
	m->p.endpoints = m->eps;
	m->p.n_endpoints = n;
	m->p.ns = m->ns;
	m->p.ttl_s = TTL_S;
	m->p.timeout_ms = 3000;
	m->p.log = cap ? &cap->sink : NULL;
	st = metadata_http_ops.open(&m->p, &m->st, &err);
	if (st != TE_OK)
		g_error("open: %s: %s", te_status_str(st), err);
}

static void md_open(struct md *m, const char *url, const char *ns, struct logcap *cap)
{
	const char *eps[] = { url, NULL };

	md_open_eps(m, eps, ns, cap);
}

static void md_close(struct md *m)
{
	if (m->st)
		metadata_http_ops.close(m->st);
	m->st = NULL;
	g_free(m->ns);
}

static char *new_ns(const char *tag)
{
	return g_strdup_printf("/te-test/%s-%d-%08x", tag, (int)getpid(), g_random_int());
}

static char *desc(const char *name, const char *gen, const char *rpc, const char *extra)
{
	return g_strdup_printf("{\"name\":\"%s\",\"generation\":\"%s\",\"rpc\":\"%s\","
			       "\"pad\":\"caf\\u00e9 \xe2\x82\xac \\\"q\\\" %s\"}",
			       name, gen, rpc, extra ? extra : "");
}

static void publish_ok(struct md *m, const char *name, const char *json)
{
	g_autofree char *err = NULL;
	enum te_status st = metadata_http_ops.publish(m->st, name, json, strlen(json), &err);

	if (st != TE_OK)
		g_error("publish %s: %s: %s", name, te_status_str(st), err);
}

static enum te_status get(struct md *m, const char *name, GBytes **out, char **err_out)
{
	*out = NULL;
	return metadata_http_ops.get(m->st, name, 2000, out, err_out);
}

static void assert_value(struct md *m, const char *name, const void *data, size_t len)
{
	g_autofree char *err = NULL;
	GBytes *v = NULL;
	enum te_status st = get(m, name, &v, &err);

	if (st != TE_OK)
		g_error("get %s: %s: %s", name, te_status_str(st), err);
	g_assert_cmpmem(g_bytes_get_data(v, NULL), g_bytes_get_size(v), data, len);
	g_bytes_unref(v);
}

static void assert_absent(struct md *m, const char *name)
{
	g_autofree char *err = NULL;
	GBytes *v = NULL;

	g_assert_cmpint(get(m, name, &v, &err), ==, TE_ERR_METADATA_NOT_FOUND);
	g_assert_nonnull(strstr(err, name));
}

static int64_t wait_presence(struct md *m, const char *name, bool want_absent, int64_t limit_ms)
{
	int64_t t0 = g_get_monotonic_time();

	for (;;) {
		g_autofree char *err = NULL;
		GBytes *v = NULL;
		enum te_status st = get(m, name, &v, &err);
		int64_t ms = (g_get_monotonic_time() - t0) / 1000;

		if (v)
			g_bytes_unref(v);
		if ((want_absent && st == TE_ERR_METADATA_NOT_FOUND) ||
		    (!want_absent && st == TE_OK))
			return ms;
		if (ms > limit_ms)
			return -1;
		g_usleep(100000);
	}
}

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

static unsigned dead_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	unsigned port;

	g_assert_cmpint(bind(fd, (struct sockaddr *)&a, sizeof(a)), ==, 0);
	g_assert_cmpint(getsockname(fd, (struct sockaddr *)&a, &len), ==, 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
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
	g_autofree char *ns = new_ns("rt");
	g_autofree char *v1 = desc("a", "11", "127.0.0.1:7001", NULL);
	g_autofree char *pad = NULL, *v2 = NULL, *err = NULL;
	struct md m;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&m, srv->url, ns, NULL);
	assert_absent(&m, "a");
	publish_ok(&m, "a", v1);
	assert_value(&m, "a", v1, strlen(v1));
	pad = g_strnfill(1u << 20, 'x');
	v2 = desc("a", "11", "127.0.0.1:7001", pad);
	publish_ok(&m, "a", v2);
	assert_value(&m, "a", v2, strlen(v2));
	g_assert_cmpint(metadata_http_ops.withdraw(m.st, "a", &err), ==, TE_OK);
	assert_absent(&m, "a");
	g_assert_null(metadata_http_ops.watch);
	md_close(&m);
	mdserver_free(srv);
}

static void test_collision(void)
{
	struct mdserver *srv;
	g_autofree char *ns = new_ns("coll");
	g_autofree char *va = desc("n", "1001", "10.0.0.1:5000", NULL);
	g_autofree char *vb = desc("n", "2002", "10.0.0.2:5000", NULL);
	g_autofree char *err = NULL;
	struct md a, b;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&a, srv->url, ns, NULL);
	md_open(&b, srv->url, ns, NULL);
	publish_ok(&a, "n", va);
	g_assert_cmpint(metadata_http_ops.publish(b.st, "n", vb, strlen(vb), &err), ==,
			TE_ERR_EXISTS);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "10.0.0.1:5000"));
	g_assert_nonnull(strstr(err, "1001"));
	assert_value(&b, "n", va, strlen(va));
	md_close(&b);
	md_close(&a);
	mdserver_free(srv);
}

static void test_takeover(void)
{
	struct mdserver *srv;
	g_autofree char *ns = new_ns("take");
	g_autofree char *va = desc("t", "1", "127.0.0.1:6000", NULL);
	g_autofree char *vb = desc("t", "2", "127.0.0.1:6000", NULL);
	struct logcap *cap = logcap_new();
	struct md a, b;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&a, srv->url, ns, NULL);
	publish_ok(&a, "t", va);
	md_close(&a);
	md_open(&b, srv->url, ns, cap);
	publish_ok(&b, "t", vb);
	assert_value(&b, "t", vb, strlen(vb));
	g_assert_cmpuint(logcap_count(cap, "[I]", "taking over segment name 't'"), ==, 1);
	md_close(&b);
	logcap_free(cap);
	mdserver_free(srv);
}

/* With --ttl-s: kept while republished, gone within ttl + 1 s of a close without withdraw. */
static void test_expiry(void)
{
	struct mdserver *srv;
	g_autofree char *ns = new_ns("exp");
	g_autofree char *va = desc("e", "5", "127.0.0.1:6100", NULL);
	struct md a, w;
	int64_t ms;

	if (skip_without_server())
		return;
	srv = server_with_ttl();
	md_open(&a, srv->url, ns, NULL);
	md_open(&w, srv->url, ns, NULL);
	publish_ok(&a, "e", va);
	g_usleep((TTL_S + 1) * G_USEC_PER_SEC);
	assert_value(&w, "e", va, strlen(va));
	md_close(&a);
	ms = wait_presence(&w, "e", true, (TTL_S + 1) * 1000);
	g_test_message("expired %" G_GINT64_FORMAT " ms after close", ms);
	g_assert_cmpint(ms, >=, 0);
	md_close(&w);
	mdserver_free(srv);
}

/* The server restarted without its data: the publisher PUTs again within ttl_s / 3. */
static void test_restart(void)
{
	struct mdserver *srv;
	g_autofree char *ns = new_ns("rs");
	g_autofree char *va = desc("r", "7", "127.0.0.1:6300", NULL);
	struct logcap *cap = logcap_new();
	struct md a, w;
	int64_t ms;

	if (skip_without_server())
		return;
	srv = server_with_ttl();
	md_open(&a, srv->url, ns, cap);
	md_open(&w, srv->url, ns, NULL);
	publish_ok(&a, "r", va);
	mdserver_stop(srv, true);
	g_usleep(G_USEC_PER_SEC); /* republishing fails meanwhile */
	mdserver_restart(srv);
	ms = wait_presence(&w, "r", false, TTL_S * 1000);
	g_test_message("re-published %" G_GINT64_FORMAT " ms after the restart", ms);
	g_assert_cmpint(ms, >=, 0);
	assert_value(&w, "r", va, strlen(va));
	g_assert_cmpuint(logcap_count(cap, "[W]", "http metadata"), ==, 1);
	g_assert_cmpuint(logcap_count(cap, "[I]", "published again"), ==, 1);
	md_close(&w);
	md_close(&a);
	logcap_free(cap);
	mdserver_free(srv);
}

static void test_down(void)
{
	g_autofree char *u1 = g_strdup_printf("http://127.0.0.1:%u/metadata", dead_port());
	g_autofree char *u2 = g_strdup_printf("http://127.0.0.1:%u/metadata", dead_port());
	const char *eps[] = { u1, u2, NULL };
	g_autofree char *ns = new_ns("down");
	g_autofree char *v = desc("d", "1", "127.0.0.1:1", NULL);
	g_autofree char *err = NULL;
	GBytes *out = NULL;
	struct md m;

	md_open_eps(&m, eps, ns, NULL);
	g_assert_cmpint(metadata_http_ops.publish(m.st, "d", v, strlen(v), &err), ==,
			TE_ERR_METADATA_UNAVAILABLE);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, u1));
	g_assert_nonnull(strstr(err, u2));
	g_assert_nonnull(strstr(err, "Couldn't connect"));
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(get(&m, "d", &out, &err), ==, TE_ERR_METADATA_UNAVAILABLE);
	md_close(&m);
}

static void test_failover(void)
{
	struct mdserver *srv;
	g_autofree char *dead = g_strdup_printf("http://127.0.0.1:%u/metadata", dead_port());
	g_autofree char *ns = new_ns("fo");
	g_autofree char *v = desc("f", "3", "127.0.0.1:6500", NULL);
	const char *eps[3];
	struct md m;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	eps[0] = dead;
	eps[1] = srv->url;
	eps[2] = NULL;
	md_open_eps(&m, eps, ns, NULL);
	publish_ok(&m, "f", v);
	assert_value(&m, "f", v, strlen(v));
	md_close(&m);
	mdserver_free(srv);
}

/* Values that are not descriptors pass through get; publishing takes them over. */
static void test_garbage(void)
{
	static const char bin[] = { 0, 1, 2, (char)0xff, (char)0xfe, '{', 0, '"', '\n' };
	struct mdserver *srv;
	g_autofree char *ns = new_ns("junk");
	g_autofree char *k = metadata_key(ns, "bin");
	g_autofree char *mine = desc("bin", "4", "127.0.0.1:6600", NULL);
	struct logcap *cap = logcap_new();
	struct md m;

	if (skip_without_server())
		return;
	srv = mdserver_shared(MDSERVER_HTTP);
	md_open(&m, srv->url, ns, cap);
	raw_put(srv->url, k, bin, sizeof(bin));
	assert_value(&m, "bin", bin, sizeof(bin));
	publish_ok(&m, "bin", mine);
	assert_value(&m, "bin", mine, strlen(mine));
	g_assert_cmpuint(logcap_count(cap, "[W]", "taking over segment name 'bin'"), ==, 1);
	md_close(&m);
	logcap_free(cap);
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
