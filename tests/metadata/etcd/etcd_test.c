/* SPDX-License-Identifier: Apache-2.0 */
/* The etcd metadata backend's ops against a real etcd: leases, takeover, watch, restarts, auth. */
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>

#include "core/metadata/mdcurl.h"
#include "core/metadata/metadata.h"
#include "mdcase.h"
#include "mdserver.h"


static const struct metadata_ops *const ops = &metadata_etcd_ops;

/* What a watch delivered. */
struct event {
	char *name;
	GBytes *value; /* NULL: deleted */
	bool resync;   /* a delete inferred at a resync */
};

struct rec {
	GMutex lock;
	GCond cond;
	GPtrArray *ev;
};

static void rec_fn(void *user, const char *name, const char *json, size_t len, bool resync)
{
	struct rec *r = user;
	struct event *e = g_new0(struct event, 1);

	e->name = g_strdup(name);
	e->value = json ? g_bytes_new(json, len) : NULL;
	e->resync = resync;
	g_mutex_lock(&r->lock);
	g_ptr_array_add(r->ev, e);
	g_cond_broadcast(&r->cond);
	g_mutex_unlock(&r->lock);
}

static void event_free(void *p)
{
	struct event *e = p;

	g_free(e->name);
	if (e->value)
		g_bytes_unref(e->value);
	g_free(e);
}

static struct rec *rec_new(void)
{
	struct rec *r = g_new0(struct rec, 1);

	g_mutex_init(&r->lock);
	g_cond_init(&r->cond);
	r->ev = g_ptr_array_new_with_free_func(event_free);
	return r;
}

static void rec_free(struct rec *r)
{
	g_ptr_array_unref(r->ev);
	g_mutex_clear(&r->lock);
	g_cond_clear(&r->cond);
	g_free(r);
}

static void rec_clear(struct rec *r)
{
	g_mutex_lock(&r->lock);
	g_ptr_array_set_size(r->ev, 0);
	g_mutex_unlock(&r->lock);
}

/*
 * Wait for an event on @name: a delete (@value NULL, @len 0) or a value equal to @value
 * (or, with @contains, containing it as a string).
 */
static bool rec_wait(struct rec *r, const char *name, const void *value, size_t len, bool contains,
		     int64_t timeout_ms)
{
	int64_t until = g_get_monotonic_time() + timeout_ms * 1000;
	bool found = false;

	g_mutex_lock(&r->lock);
	while (!found) {
		for (guint i = 0; i < r->ev->len && !found; i++) {
			struct event *e = r->ev->pdata[i];
			gsize n;
			const char *d;

			if (strcmp(e->name, name) != 0)
				continue;
			if (!value) {
				found = e->value == NULL;
				continue;
			}
			if (!e->value)
				continue;
			d = g_bytes_get_data(e->value, &n);
			if (contains) {
				g_autofree char *s = g_strndup(d, n);

				found = strstr(s, value) != NULL;
			} else {
				found = n == len && (len == 0 || memcmp(d, value, len) == 0);
			}
		}
		if (found || !g_cond_wait_until(&r->cond, &r->lock, until))
			break;
	}
	g_mutex_unlock(&r->lock);
	return found;
}

/* Deletes of @name delivered so far: how many, and how many of them inferred at a resync. */
static void rec_deletes(struct rec *r, const char *name, unsigned *all, unsigned *resync)
{
	*all = *resync = 0;
	g_mutex_lock(&r->lock);
	for (guint i = 0; i < r->ev->len; i++) {
		const struct event *e = r->ev->pdata[i];

		if (strcmp(e->name, name) == 0 && !e->value) {
			(*all)++;
			*resync += e->resync;
		}
	}
	g_mutex_unlock(&r->lock);
}

static void watch_ok(struct md *m, struct rec *r)
{
	g_autofree char *err = NULL;
	enum te_status st = metadata_etcd_ops.watch(m->st, rec_fn, r, &err);

	if (st != TE_OK)
		g_error("watch: %s: %s", te_status_str(st), err);
}

/* A put straight through the gateway (any bytes, no lease), as etcdctl would. */
static void raw_put(const char *url, const char *key, const void *value, size_t len)
{
	g_autofree char *k = g_base64_encode((const guchar *)key, strlen(key));
	g_autofree char *v = g_base64_encode(value, len);
	g_autofree char *body = g_strdup_printf("{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
	g_autofree char *u = g_strconcat(url, "/v3/kv/put", NULL);
	g_autofree char *err = NULL;
	struct mdcurl_request r = { .method = "POST",
				    .url = u,
				    .body = body,
				    .body_len = strlen(body),
				    .timeout_ms = 5000 };
	GBytes *resp = NULL;
	long code = 0;

	g_assert_cmpint(mdcurl_perform(&r, &code, &resp, &err), ==, TE_OK);
	g_assert_cmpint(code, ==, 200);
	g_bytes_unref(resp);
}

static void etcdctl(const char *url, const char *const *args)
{
	g_autoptr(GPtrArray) argv = g_ptr_array_new();
	g_autofree char *ep = g_strdup_printf("--endpoints=%s", url);
	g_autofree char *out = NULL, *errs = NULL;
	g_auto(GStrv) env = g_environ_setenv(g_get_environ(), "ETCDCTL_API", "3", TRUE);
	GError *gerr = NULL;
	int status = 0;

	g_ptr_array_add(argv, (char *)"etcdctl");
	g_ptr_array_add(argv, ep);
	for (const char *const *a = args; *a; a++)
		g_ptr_array_add(argv, (char *)*a);
	g_ptr_array_add(argv, NULL);
	if (!g_spawn_sync(NULL, (char **)argv->pdata, env, G_SPAWN_SEARCH_PATH, NULL, NULL, &out,
			  &errs, &status, &gerr))
		g_error("etcdctl: %s", gerr->message);
	if (!g_spawn_check_wait_status(status, NULL))
		g_error("etcdctl %s failed: %s%s", args[0], out, errs);
}

/* A loopback port nobody listens on. */
static bool skip_without_etcd(void)
{
	if (mdserver_available(MDSERVER_ETCD))
		return false;
	g_test_skip("etcd is not installed (apt install etcd-server)");
	return true;
}

/* ---- cases ---- */

/* publish, get (byte-exact, also 1 MiB), update, withdraw. */
static void test_roundtrip(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("rt");
	g_autofree char *v1 = md_desc("a", "11", "127.0.0.1:7001", NULL);
	g_autofree char *big_pad = NULL, *v2 = NULL;
	g_autofree char *err = NULL;
	struct md m;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	md_open(&m, ops, srv->url, ns, NULL);
	md_assert_absent(&m, "a");
	md_publish_ok(&m, "a", v1);
	md_assert_value(&m, "a", v1, strlen(v1));

	big_pad = g_strnfill(1u << 20, 'x');
	v2 = md_desc("a", "11", "127.0.0.1:7001", big_pad);
	md_publish_ok(&m, "a", v2);
	md_assert_value(&m, "a", v2, strlen(v2));

	g_assert_cmpint(metadata_etcd_ops.withdraw(m.st, "a", &err), ==, TE_OK);
	md_assert_absent(&m, "a");
	/* A name never published is left alone. */
	g_assert_cmpint(metadata_etcd_ops.withdraw(m.st, "other", &err), ==, TE_OK);
	md_close(&m);
	mdserver_free(srv);
}

/* A second engine under a live holder's name: TE_ERR_EXISTS naming the holder. */
static void test_collision(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("coll");
	g_autofree char *va = md_desc("n", "1001", "10.0.0.1:5000", NULL);
	g_autofree char *vb = md_desc("n", "2002", "10.0.0.2:5000", NULL);
	g_autofree char *err = NULL;
	struct md a, b;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	md_open(&a, ops, srv->url, ns, NULL);
	md_open(&b, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "n", va);
	g_assert_cmpint(metadata_etcd_ops.publish(b.st, "n", vb, strlen(vb), &err), ==,
			TE_ERR_EXISTS);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "10.0.0.1:5000"));
	g_assert_nonnull(strstr(err, "1001"));
	g_assert_nonnull(strstr(err, "'n'"));
	md_assert_value(&b, "n", va, strlen(va));
	/* The holder keeps updating its own value. */
	md_publish_ok(&a, "n", va);
	md_close(&b);
	md_close(&a);
	mdserver_free(srv);
}

/*
 * A restarted engine (new generation, same rpc: it bound the old one's port) takes the
 * name over while the old lease is still alive; the old lease expiring later leaves it.
 */
static void test_takeover(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("take");
	g_autofree char *va = md_desc("t", "1", "127.0.0.1:6000", NULL);
	g_autofree char *vb = md_desc("t", "2", "127.0.0.1:6000", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct md a, b;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	md_open(&a, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "t", va);
	md_close(&a); /* killed: no withdraw, its lease runs out by itself */
	md_open(&b, ops, srv->url, ns, cap);
	md_publish_ok(&b, "t", vb);
	md_assert_value(&b, "t", vb, strlen(vb));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_INFO, "taking over segment name 't'"),
			 ==, 1);
	g_usleep((MD_TTL_S + 1) * G_USEC_PER_SEC + 500000);
	md_assert_value(&b, "t", vb, strlen(vb));
	md_close(&b);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

/* Close without withdraw (SIGKILL): the key expires within ttl + 1 s, a watcher sees it. */
static void test_expiry(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("exp");
	g_autofree char *va = md_desc("e", "5", "127.0.0.1:6100", NULL);
	struct rec *r = rec_new();
	struct md a, w;
	int64_t t0, ms;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	md_open(&w, ops, srv->url, ns, NULL);
	watch_ok(&w, r);
	md_open(&a, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "e", va);
	g_assert_true(rec_wait(r, "e", va, strlen(va), false, 5000));
	/* Alive past its TTL while kept alive. */
	g_usleep((MD_TTL_S + 1) * G_USEC_PER_SEC);
	md_assert_value(&w, "e", va, strlen(va));
	t0 = g_get_monotonic_time();
	md_close(&a);
	ms = md_wait_presence(&w, "e", true, (MD_TTL_S + 1) * 1000);
	g_test_message("expired %" G_GINT64_FORMAT " ms after close", ms);
	g_assert_cmpint(ms, >=, 0);
	g_assert_true(rec_wait(r, "e", NULL, 0, false, 2000));
	g_assert_cmpint((g_get_monotonic_time() - t0) / 1000, <=, (MD_TTL_S + 1) * 1000 + 500);
	{
		unsigned all, resync;

		rec_deletes(r, "e", &all, &resync);
		g_assert_cmpuint(all, ==, 1);
		g_assert_cmpuint(resync, ==, 0); /* the stream reported it */
	}
	md_close(&w);
	rec_free(r);
	mdserver_free(srv);
}

/* A watcher sees a restarted engine's new generation, and withdraws. */
static void test_watch(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("watch");
	g_autofree char *v1 = md_desc("w", "100", "127.0.0.1:6200", NULL);
	g_autofree char *v2 = md_desc("w", "200", "127.0.0.1:6200", NULL);
	g_autofree char *err = NULL;
	struct rec *r = rec_new();
	struct md a, b, w;
	int64_t t0;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	md_open(&a, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "w", v1);
	md_open(&w, ops, srv->url, ns, NULL);
	watch_ok(&w, r);
	md_close(&a);
	md_open(&b, ops, srv->url, ns, NULL);
	md_publish_ok(&b, "w", v2);
	g_assert_true(rec_wait(r, "w", "\"generation\":\"200\"", 0, true, 5000));
	g_assert_cmpint(metadata_etcd_ops.withdraw(b.st, "w", &err), ==, TE_OK);
	g_assert_true(rec_wait(r, "w", NULL, 0, false, 5000));
	/* Keys outside the namespace's segments are not delivered. */
	raw_put(srv->url, "/te-test/elsewhere", "x", 1);
	md_close(&b);
	/* close stops the stream promptly (no waiting out a request). */
	t0 = g_get_monotonic_time();
	md_close(&w);
	g_assert_cmpint(g_get_monotonic_time() - t0, <, 1500000);
	for (guint i = 0; i < r->ev->len; i++)
		g_assert_cmpstr(((struct event *)r->ev->pdata[i])->name, ==, "w");
	rec_free(r);
	mdserver_free(srv);
}

/* etcd SIGKILLed and restarted with its data: the lease lives on, the watch reconnects. */
static void test_restart(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("rs");
	g_autofree char *va = md_desc("r", "7", "127.0.0.1:6300", NULL);
	g_autofree char *vc = md_desc("c", "8", "127.0.0.1:6301", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct rec *r = rec_new();
	struct md a, c, w;

	if (skip_without_etcd())
		return;
	srv = mdserver_start(MDSERVER_ETCD, NULL);
	md_open(&a, ops, srv->url, ns, cap);
	md_publish_ok(&a, "r", va);
	md_open(&w, ops, srv->url, ns, NULL);
	watch_ok(&w, r);
	mdserver_stop(srv, true);
	g_usleep(G_USEC_PER_SEC); /* keepalives fail meanwhile */
	mdserver_restart(srv);
	/* Kept alive across the restart and beyond its TTL. */
	g_usleep((MD_TTL_S + 1) * G_USEC_PER_SEC);
	md_assert_value(&w, "r", va, strlen(va));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_WARN, "etcd metadata"), ==, 1);
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_INFO, "published again"), ==, 1);
	/* The watch is back: it sees a new engine. */
	md_open(&c, ops, srv->url, ns, NULL);
	md_publish_ok(&c, "c", vc);
	g_assert_true(rec_wait(r, "c", vc, strlen(vc), false, 5000));
	md_close(&c);
	md_close(&w);
	md_close(&a);
	rec_free(r);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

/* etcd restarted with its data lost: the publisher re-publishes within one TTL. */
static void test_restart_wiped(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("wipe");
	g_autofree char *va = md_desc("p", "9", "127.0.0.1:6400", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct rec *r = rec_new();
	struct md a, w;
	int64_t ms;

	if (skip_without_etcd())
		return;
	srv = mdserver_start(MDSERVER_ETCD, NULL);
	md_open(&a, ops, srv->url, ns, cap);
	md_publish_ok(&a, "p", va);
	md_open(&w, ops, srv->url, ns, NULL);
	watch_ok(&w, r);
	mdserver_stop(srv, true);
	mdserver_wipe(srv);
	rec_clear(r);
	mdserver_restart(srv);
	ms = md_wait_presence(&w, "p", false, MD_TTL_S * 1000);
	g_test_message("re-published %" G_GINT64_FORMAT " ms after the restart", ms);
	g_assert_cmpint(ms, >=, 0);
	md_assert_value(&w, "p", va, strlen(va));
	/* The watcher resynced and saw it come back. */
	g_assert_true(rec_wait(r, "p", va, strlen(va), false, 5000));
	{
		unsigned all, resync;

		/* Missing when the watch came back (if it came back first): inferred. */
		rec_deletes(r, "p", &all, &resync);
		g_test_message("%u deletes of p seen, %u inferred at a resync", all, resync);
		g_assert_cmpuint(resync, ==, all);
	}
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_WARN, "etcd metadata"), ==, 1);
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_INFO, "published again"), ==, 1);
	/* And it stays: the new lease is kept alive. */
	g_usleep((MD_TTL_S + 1) * G_USEC_PER_SEC);
	md_assert_value(&w, "p", va, strlen(va));
	md_close(&w);
	md_close(&a);
	rec_free(r);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

/*
 * etcd restarted with its data lost, and the publisher put its value back before the watcher
 * resynced: the value's mod_revision can be the one it had (a fresh etcd counts from 1
 * again), yet it is a new value the watcher must deliver (the same bytes here; another
 * engine's would look just as old by its revision). The watcher's thread is held
 * between losing the server and its next resync (in the log call of "watch ... interrupted")
 * until then.
 */
static void test_restart_wiped_late_resync(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("wipelate");
	g_autofree char *va = md_desc("q", "9", "127.0.0.1:6401", NULL);
	struct logcap_sink *wcap = logcap_sink_new();
	struct rec *r = rec_new();
	struct loggate gate;
	struct md a, w, c;
	int64_t ms;

	if (skip_without_etcd()) {
		logcap_sink_free(wcap);
		rec_free(r);
		return;
	}
	loggate_init(&gate, "etcd metadata: watch of '", "' interrupted: ");
	wcap->sink.fn = loggate_fn;
	wcap->sink.user = &gate;
	srv = mdserver_start(MDSERVER_ETCD, NULL);
	md_open(&a, ops, srv->url, ns, NULL);
	md_publish_ok(&a, "q", va);
	/* Revisions the store counted before it lost them (keys outside the namespace). */
	for (int i = 0; i < 8; i++)
		raw_put(srv->url, "/te-test-elsewhere", "x", 1);
	md_open(&w, ops, srv->url, ns, wcap);
	watch_ok(&w, r);
	mdserver_stop(srv, true);
	if (!loggate_wait(&gate, 10000)) {
		g_autofree char *text = logcap_text(&gate.log);

		g_error("the watcher never lost the server; its log:\n%s", text);
	}
	mdserver_wipe(srv);
	rec_clear(r);
	mdserver_restart(srv);
	md_open(&c, ops, srv->url, ns, NULL);
	ms = md_wait_presence(&c, "q", false, (MD_TTL_S + 2) * 1000);
	g_test_message("re-published %" G_GINT64_FORMAT " ms after the restart", ms);
	g_assert_cmpint(ms, >=, 0);
	md_assert_value(&c, "q", va, strlen(va));
	loggate_release(&gate);
	/* The watcher resynced after the value came back, and delivered it. */
	g_assert_true(rec_wait(r, "q", va, strlen(va), false, 5000));
	g_assert_cmpuint(logcap_count_at(&gate.log, TE_LOG_INFO, "revision went back"), ==, 1);
	md_close(&c);
	md_close(&w);
	md_close(&a);
	rec_free(r);
	loggate_clear(&gate);
	logcap_sink_free(wcap);
	mdserver_free(srv);
}

/* No etcd: TE_ERR_METADATA_UNAVAILABLE naming the endpoints and curl's error. */
static void test_down(void)
{
	unsigned p1 = mdserver_dead_port(), p2 = mdserver_dead_port();
	g_autofree char *u1 = g_strdup_printf("http://127.0.0.1:%u", p1);
	g_autofree char *u2 = g_strdup_printf("127.0.0.1:%u", p2);
	const char *eps[] = { u1, u2, NULL };
	g_autofree char *ns = md_new_ns("down");
	g_autofree char *err = NULL;
	struct md m;

	g_assert_cmpint(md_try_open(&m, ops, eps, ns, MD_TTL_S, NULL, NULL, NULL, &err), ==,
			TE_ERR_METADATA_UNAVAILABLE);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, u1));
	g_assert_nonnull(strstr(err, u2));
	g_assert_nonnull(strstr(err, "Couldn't connect"));
	g_free(m.ns);
}

/* The first endpoint is dead: requests go on to the second and stay there. */
static void test_failover(void)
{
	struct mdserver *srv;
	g_autofree char *dead = g_strdup_printf("http://127.0.0.1:%u", mdserver_dead_port());
	g_autofree char *ns = md_new_ns("fo");
	g_autofree char *v = md_desc("f", "3", "127.0.0.1:6500", NULL);
	g_autofree char *err = NULL;
	struct rec *r = rec_new();
	const char *eps[3];
	struct md m;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	eps[0] = dead;
	eps[1] = srv->url;
	eps[2] = NULL;
	g_assert_cmpint(md_try_open(&m, ops, eps, ns, MD_TTL_S, NULL, NULL, NULL, &err), ==, TE_OK);
	watch_ok(&m, r);
	md_publish_ok(&m, "f", v);
	md_assert_value(&m, "f", v, strlen(v));
	g_assert_true(rec_wait(r, "f", v, strlen(v), false, 5000));
	g_usleep((MD_TTL_S + 1) * G_USEC_PER_SEC);
	md_assert_value(&m, "f", v, strlen(v));
	md_close(&m);
	rec_free(r);
	mdserver_free(srv);
}

/* Values that are not descriptors (text, binary with NULs): get and watch pass them on. */
static void test_garbage(void)
{
	static const char bin[] = { 0, 1, 2, (char)0xff, (char)0xfe, '{', 0, '"', '\n' };
	static const char text[] = "this is not JSON {";
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("junk");
	g_autofree char *k1 = metadata_key(ns, "text");
	g_autofree char *k2 = metadata_key(ns, "bin");
	g_autofree char *k3 = metadata_key(ns, "empty");
	g_autofree char *mine = md_desc("text", "4", "127.0.0.1:6600", NULL);
	struct logcap_sink *cap = logcap_sink_new();
	struct rec *r = rec_new();
	struct md m;

	if (skip_without_etcd())
		return;
	srv = mdserver_shared(MDSERVER_ETCD);
	md_open(&m, ops, srv->url, ns, cap);
	raw_put(srv->url, k1, text, strlen(text));
	watch_ok(&m, r);
	raw_put(srv->url, k2, bin, sizeof(bin));
	raw_put(srv->url, k3, "", 0);
	md_assert_value(&m, "text", text, strlen(text));
	md_assert_value(&m, "bin", bin, sizeof(bin));
	md_assert_value(&m, "empty", "", 0);
	g_assert_true(rec_wait(r, "bin", bin, sizeof(bin), false, 5000));
	g_assert_true(rec_wait(r, "empty", "", 0, false, 5000));
	/* Not a descriptor and under no lease: nobody holds it, publishing takes it over. */
	md_publish_ok(&m, "text", mine);
	md_assert_value(&m, "text", mine, strlen(mine));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_WARN, "taking over segment name 'text'"),
			 ==, 1);
	md_close(&m);
	rec_free(r);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

/* etcd with auth: works with the password (also after the token expires), not without. */
static void test_auth(void)
{
	static const char *const extra[] = { "--auth-token-ttl=1", NULL };
	static const char *const add[] = { "user", "add", "root:s3cret", NULL };
	static const char *const enable[] = { "auth", "enable", NULL };
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("auth");
	g_autofree char *v = md_desc("u", "12", "127.0.0.1:6700", NULL);
	g_autofree char *v2 = md_desc("u", "12", "127.0.0.1:6700", "second");
	g_autofree char *vx = md_desc("x", "13", "127.0.0.1:6701", NULL);
	g_autofree char *err = NULL;
	struct logcap_sink *cap = logcap_sink_new();
	struct rec *r = rec_new();
	const char *eps[2];
	struct md m, bad, none;

	if (skip_without_etcd())
		return;
	srv = mdserver_start(MDSERVER_ETCD, extra);
	etcdctl(srv->url, add);
	etcdctl(srv->url, enable);
	eps[0] = srv->url;
	eps[1] = NULL;

	g_assert_cmpint(md_try_open(&bad, ops, eps, ns, MD_TTL_S, NULL, "root", "wrong", &err), ==,
			TE_ERR_AUTH);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "authentication failed"));
	g_assert_nonnull(strstr(err, "root"));
	g_free(bad.ns);
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(md_try_open(&none, ops, eps, ns, MD_TTL_S, NULL, NULL, NULL, &err), ==,
			TE_ERR_AUTH);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "metadata.username"));
	g_free(none.ns);
	g_clear_pointer(&err, g_free);

	g_assert_cmpint(md_try_open(&m, ops, eps, ns, MD_TTL_S, cap, "root", "s3cret", &err), ==,
			TE_OK);
	watch_ok(&m, r);
	md_publish_ok(&m, "u", v);
	md_assert_value(&m, "u", v, strlen(v));
	g_assert_true(rec_wait(r, "u", v, strlen(v), false, 5000));
	/* Idle past the token's TTL: the next request authenticates again. */
	g_assert_cmpint(metadata_etcd_ops.withdraw(m.st, "u", &err), ==, TE_OK);
	g_usleep(3 * G_USEC_PER_SEC);
	md_publish_ok(&m, "u", v2);
	md_assert_value(&m, "u", v2, strlen(v2));
	g_assert_cmpuint(logcap_count_at(&cap->cap, TE_LOG_DEBUG, "refused our token"), >=, 1);
	md_publish_ok(&m, "x", vx);
	g_assert_true(rec_wait(r, "x", vx, strlen(vx), false, 5000));
	md_close(&m);
	rec_free(r);
	logcap_sink_free(cap);
	mdserver_free(srv);
}

/* A server that is not etcd (te-metadata-server): a clear TE_ERR_METADATA, no crash. */
static void test_not_etcd(void)
{
	struct mdserver *srv;
	g_autofree char *ns = md_new_ns("notetcd");
	g_autofree char *base = NULL, *err = NULL;
	const char *eps[2];
	struct md m;

	if (!mdserver_available(MDSERVER_HTTP)) {
		g_test_skip("te-metadata-server not built (needs libsoup-3.0)");
		return;
	}
	srv = mdserver_start(MDSERVER_HTTP, NULL);
	base = g_strdup_printf("http://127.0.0.1:%u", srv->port);
	eps[0] = base;
	eps[1] = NULL;
	g_assert_cmpint(md_try_open(&m, ops, eps, ns, MD_TTL_S, NULL, NULL, NULL, &err), ==,
			TE_ERR_METADATA);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, base));
	g_assert_nonnull(strstr(err, "HTTP 4"));
	g_free(m.ns);
	mdserver_free(srv);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/etcd/roundtrip", test_roundtrip);
	g_test_add_func("/etcd/collision", test_collision);
	g_test_add_func("/etcd/takeover", test_takeover);
	g_test_add_func("/etcd/expiry", test_expiry);
	g_test_add_func("/etcd/watch", test_watch);
	g_test_add_func("/etcd/restart", test_restart);
	g_test_add_func("/etcd/restart-wiped", test_restart_wiped);
	g_test_add_func("/etcd/restart-wiped-late-resync", test_restart_wiped_late_resync);
	g_test_add_func("/etcd/down", test_down);
	g_test_add_func("/etcd/failover", test_failover);
	g_test_add_func("/etcd/garbage", test_garbage);
	g_test_add_func("/etcd/auth", test_auth);
	g_test_add_func("/etcd/not-etcd", test_not_etcd);
	return g_test_run();
}
