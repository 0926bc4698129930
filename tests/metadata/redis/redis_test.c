/* SPDX-License-Identifier: Apache-2.0 */
/* redis_test.c: the redis metadata backend's ops against real redis-server processes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>
#include <hiredis/hiredis.h>

#include "core/metadata/descriptor.h"
#include "core/metadata/metadata.h"
#include "tests/metadata/mdserver.h"
#include "logcap_core.h"

#define NS "/te/test"
#define TTL_S 2u

static const struct metadata_ops *ops = &metadata_redis_ops;

/* --- watch events --- */

struct event {
	char *name;
	GBytes *json; /* NULL: deleted */
	bool resync;  /* a delete inferred at a resync */
};

static void event_free(gpointer p)
{
	struct event *ev = p;

	g_free(ev->name);
	if (ev->json)
		g_bytes_unref(ev->json);
	g_free(ev);
}

static void watch_fn(void *user, const char *name, const char *json, size_t len, bool resync)
{
	struct event *ev = g_new0(struct event, 1);

	ev->name = g_strdup(name);
	ev->json = json ? g_bytes_new(json, len) : NULL;
	ev->resync = resync;
	g_async_queue_push(user, ev);
}

/* The resync flag of the event wait_event last found. */
static bool found_resync;

/*
 * Wait up to @ms for an event about @name: a value equal to @json (NULL json and @del:
 * a delete; NULL json and !@del: any value). Other events are skipped.
 */
static bool wait_event(GAsyncQueue *q, const char *name, const char *json, bool del, int ms)
{
	gint64 end = g_get_monotonic_time() + ms * 1000ll;

	for (;;) {
		gint64 left = end - g_get_monotonic_time();
		struct event *ev;
		bool hit;

		if (left <= 0)
			return false;
		ev = g_async_queue_timeout_pop(q, (guint64)left);
		if (!ev)
			return false;
		hit = strcmp(ev->name, name) == 0;
		if (hit && del)
			hit = ev->json == NULL;
		else if (hit && json)
			hit = ev->json && g_bytes_get_size(ev->json) == strlen(json) &&
			      memcmp(g_bytes_get_data(ev->json, NULL), json, strlen(json)) == 0;
		else if (hit)
			hit = ev->json != NULL;
		found_resync = ev->resync;
		event_free(ev);
		if (hit)
			return true;
	}
}

/* --- helpers --- */

static char *desc(const char *name, const char *gen, const char *rpc, const char *extra)
{
	return g_strdup_printf("{\"name\":\"%s\",\"generation\":\"%s\",\"rpc\":\"%s\","
			       "\"transports\":{},\"buffers\":[]%s}",
			       name, gen, rpc, extra ? extra : "");
}

struct md {
	void *st;
	const char *eps[4];
	struct metadata_params p;
};

static enum te_status md_open_eps(struct md *m, struct logcap_sink *l, const char *const *eps,
				  size_t n, char **err_out)
{
	memset(m, 0, sizeof(*m));
	for (size_t i = 0; i < n; i++)
		m->eps[i] = eps[i];
	m->p.endpoints = m->eps;
	m->p.n_endpoints = n;
	m->p.ns = NS;
	m->p.ttl_s = TTL_S;
	m->p.timeout_ms = 2000;
	m->p.log = &l->sink;
	return ops->open(&m->p, &m->st, err_out);
}

static void md_open(struct md *m, struct logcap_sink *l, const char *url)
{
	g_autofree char *err = NULL;
	const char *eps[] = { url };

	g_assert_cmpint(md_open_eps(m, l, eps, 1, &err), ==, TE_OK);
	g_assert_null(err);
}

static void md_close(struct md *m)
{
	ops->close(m->st);
	m->st = NULL;
}

static void publish_ok(struct md *m, const char *name, const char *json)
{
	g_autofree char *err = NULL;
	enum te_status st = ops->publish(m->st, name, json, strlen(json), &err);

	if (st != TE_OK)
		g_error("publish %s: %d %s", name, st, err);
}

static void assert_get(struct md *m, const char *name, const char *json)
{
	g_autofree char *err = NULL;
	GBytes *b = NULL;
	enum te_status st = ops->get(m->st, name, 1000, &b, &err);

	if (st != TE_OK)
		g_error("get %s: %d %s", name, st, err);
	g_assert_cmpmem(g_bytes_get_data(b, NULL), g_bytes_get_size(b), json, strlen(json));
	g_bytes_unref(b);
}

static enum te_status get_status(struct md *m, const char *name, char **err_out)
{
	GBytes *b = NULL;
	/* Generous: a loaded 2-core machine (parallel builds) once took over 1 s here. */
	enum te_status st = ops->get(m->st, name, 10000, &b, err_out);

	if (b)
		g_bytes_unref(b);
	return st;
}

/* Wait up to @ms for get(@name) to return @want. */
static bool wait_get_status(struct md *m, const char *name, enum te_status want, int ms)
{
	gint64 end = g_get_monotonic_time() + ms * 1000ll;

	do {
		g_autofree char *err = NULL;

		if (get_status(m, name, &err) == want)
			return true;
		g_usleep(50000);
	} while (g_get_monotonic_time() < end);
	return false;
}

/* A raw connection to the test's server (db @db), for what the backend must survive. */
static redisContext *raw(const struct mdserver *s, int db)
{
	struct timeval tv = { 2, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)s->port, tv);
	redisReply *r;

	g_assert_nonnull(c);
	g_assert_cmpint(c->err, ==, 0);
	if (db) {
		r = redisCommand(c, "SELECT %d", db);
		g_assert_nonnull(r);
		g_assert_cmpint(r->type, ==, REDIS_REPLY_STATUS);
		freeReplyObject(r);
	}
	return c;
}

static long long raw_exists(redisContext *c, const char *key)
{
	redisReply *r = redisCommand(c, "EXISTS %s", key);
	long long n;

	g_assert_nonnull(r);
	g_assert_cmpint(r->type, ==, REDIS_REPLY_INTEGER);
	n = r->integer;
	freeReplyObject(r);
	return n;
}

/* A loopback port nobody listens on (bound, then closed). */
/*
 * A publisher @a of "seg" (its value returned) under the watch of @w, which reports to @q:
 * both opened on @s, the watch's first event for it seen.
 */
static char *watched_seg(struct mdserver *s, struct logcap_sink *l, struct md *a, struct md *w,
			 GAsyncQueue *q)
{
	g_autofree char *err = NULL;
	char *ja = desc("seg", "1111", "127.0.0.1:7001", NULL);

	md_open(a, l, s->url);
	md_open(w, l, s->url);
	g_assert_cmpint(ops->watch(w->st, watch_fn, q, &err), ==, TE_OK);
	publish_ok(a, "seg", ja);
	g_assert_true(wait_event(q, "seg", ja, false, 3000));
	return ja;
}

static struct mdserver *server(const char *const *extra)
{
	if (!mdserver_available(MDSERVER_REDIS)) {
		g_test_skip("redis-server is not installed");
		return NULL;
	}
	return mdserver_start(MDSERVER_REDIS, extra);
}

/* --- cases --- */

static void test_roundtrip(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;
	struct md m;
	g_autofree char *json = NULL, *err = NULL;

	if (!s)
		return;
	logcap_sink_init(&l);
	md_open(&m, &l, s->url);
	/* Bytes a JSON re-encoder would change: spacing, escapes, UTF-8. */
	json = desc("seg-a", "123456789012345678", "127.0.0.1:4000",
		    ",  \"x\" : \"caf\\u00e9 \xc3\xa9\\n\"");
	g_assert_cmpint(get_status(&m, "seg-a", &err), ==, TE_ERR_METADATA_NOT_FOUND);
	g_assert_nonnull(strstr(err, NS "/segments/seg-a"));
	g_clear_pointer(&err, g_free);
	publish_ok(&m, "seg-a", json);
	assert_get(&m, "seg-a", json);
	{
		redisContext *c = raw(s, 0);
		redisReply *r = redisCommand(c, "PTTL %s", NS "/segments/seg-a");

		g_assert_cmpint(r->type, ==, REDIS_REPLY_INTEGER);
		g_assert_cmpint(r->integer, >, 0);
		g_assert_cmpint(r->integer, <=, TTL_S * 1000);
		freeReplyObject(r);
		redisFree(c);
	}
	g_assert_cmpint(ops->withdraw(m.st, "seg-a", &err), ==, TE_OK);
	g_assert_cmpint(get_status(&m, "seg-a", &err), ==, TE_ERR_METADATA_NOT_FOUND);
	g_clear_pointer(&err, g_free);
	/* Withdrawing what we do not hold is a no-op. */
	g_assert_cmpint(ops->withdraw(m.st, "seg-a", &err), ==, TE_OK);
	md_close(&m);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_collision(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;
	struct md a, b;
	g_autofree char *ja = NULL, *jb = NULL, *err = NULL;

	if (!s)
		return;
	logcap_sink_init(&l);
	md_open(&a, &l, s->url);
	md_open(&b, &l, s->url);
	ja = desc("seg", "1111", "10.0.0.1:7001", NULL);
	jb = desc("seg", "2222", "10.0.0.2:7002", NULL);
	publish_ok(&a, "seg", ja);
	g_assert_cmpint(ops->publish(b.st, "seg", jb, strlen(jb), &err), ==, TE_ERR_EXISTS);
	g_test_message("collision: %s", err);
	g_assert_nonnull(strstr(err, "10.0.0.1:7001"));
	g_assert_nonnull(strstr(err, "1111"));
	g_assert_nonnull(strstr(err, "seg"));
	assert_get(&b, "seg", ja);
	/* The loser's withdraw does not delete the winner's key. */
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(ops->withdraw(b.st, "seg", &err), ==, TE_OK);
	assert_get(&b, "seg", ja);
	/* A's own re-publish (descriptor changed) goes through. */
	g_free(ja);
	ja = desc("seg", "1111", "10.0.0.1:7001", ",\"v\":2");
	publish_ok(&a, "seg", ja);
	assert_get(&b, "seg", ja);
	/* Someone overwrites A's key: A's keeper logs one ERROR and leaves it alone... */
	{
		redisContext *c = raw(s, 0);
		redisReply *r = redisCommand(c, "SET %s %s PX 60000", NS "/segments/seg", jb);

		freeReplyObject(r);
		g_usleep(TTL_S * 1000 * 1000);
		g_assert_cmpuint(
			logcap_count_at(&l.cap, TE_LOG_ERROR, "now held by another engine"), ==, 1);
		g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_ERROR, "10.0.0.2:7002"), ==, 1);
		assert_get(&b, "seg", jb);
		/* ...and publishes again once that key is gone. */
		r = redisCommand(c, "DEL %s", NS "/segments/seg");
		freeReplyObject(r);
		redisFree(c);
	}
	g_assert_true(wait_get_status(&b, "seg", TE_OK, TTL_S * 1000));
	assert_get(&b, "seg", ja);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_ERROR, "now held by another engine"), ==,
			 1);
	md_close(&b);
	md_close(&a);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_takeover(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;
	struct md a, b;
	g_autofree char *ja = NULL, *jb = NULL;

	if (!s)
		return;
	logcap_sink_init(&l);
	md_open(&a, &l, s->url);
	ja = desc("seg", "1111", "127.0.0.1:7001", NULL);
	jb = desc("seg", "2222", "127.0.0.1:7001", NULL);
	publish_ok(&a, "seg", ja);
	md_close(&a); /* gone without withdraw: its key lives until the TTL */
	md_open(&b, &l, s->url);
	publish_ok(&b, "seg", jb); /* same rpc: the old process is gone */
	assert_get(&b, "seg", jb);
	md_close(&b);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_expiry(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;
	struct md a, w;
	GAsyncQueue *q = g_async_queue_new_full(event_free);
	g_autofree char *ja = NULL, *err = NULL;
	gint64 t0;

	if (!s)
		return;
	logcap_sink_init(&l);
	ja = watched_seg(s, &l, &a, &w, q);
	/* Kept alive past its TTL by the refresh. */
	g_usleep((TTL_S * 1000 + 700) * 1000);
	assert_get(&w, "seg", ja);
	t0 = g_get_monotonic_time();
	md_close(&a); /* like SIGKILL: no withdraw */
	g_assert_true(wait_event(q, "seg", NULL, true, (TTL_S + 1) * 1000));
	g_assert_false(found_resync); /* the store reported it */
	g_test_message("delete seen %.2f s after close", (g_get_monotonic_time() - t0) / 1e6);
	g_assert_cmpint(get_status(&w, "seg", &err), ==, TE_ERR_METADATA_NOT_FOUND);
	md_close(&w);
	g_async_queue_unref(q);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

/* Publish, change, withdraw and expire under a watcher. */
static void watch_cases(struct mdserver *s, struct logcap_sink *l, int db)
{
	struct md a, w;
	GAsyncQueue *q = g_async_queue_new_full(event_free);
	g_autofree char *url = db ? g_strdup_printf("%s/%d", s->url, db) : g_strdup(s->url);
	g_autofree char *j1 = NULL, *j2 = NULL, *j3 = NULL, *err = NULL;
	int wait_ms = 3000;

	md_open(&a, l, url);
	md_open(&w, l, url);
	j1 = desc("seg", "1111", "127.0.0.1:7001", NULL);
	publish_ok(&a, "before", j1); /* present before the watch: no event */
	g_assert_cmpint(ops->watch(w.st, watch_fn, q, &err), ==, TE_OK);
	g_assert_cmpint(ops->watch(w.st, watch_fn, q, &err), ==, TE_ERR_INVALID_ARG);
	g_clear_pointer(&err, g_free);
	publish_ok(&a, "seg", j1);
	g_assert_true(wait_event(q, "seg", j1, false, wait_ms));
	/* The same engine's descriptor changed. */
	j2 = desc("seg", "1111", "127.0.0.1:7001", ",\"buffers2\":[1]");
	publish_ok(&a, "seg", j2);
	g_assert_true(wait_event(q, "seg", j2, false, wait_ms));
	g_assert_cmpint(ops->withdraw(a.st, "seg", &err), ==, TE_OK);
	g_assert_true(wait_event(q, "seg", NULL, true, wait_ms));
	g_assert_false(found_resync);
	/* A restarted engine: a new generation under the same name. */
	md_close(&a);
	md_open(&a, l, url);
	j3 = desc("seg", "3333", "127.0.0.1:7001", NULL);
	publish_ok(&a, "seg", j3);
	g_assert_true(wait_event(q, "seg", j3, false, wait_ms));
	/* Our refreshes are no changes: nothing about "seg" for a while. */
	g_usleep(TTL_S * 1000 * 1000);
	g_assert_false(wait_event(q, "seg", NULL, false, 10));
	if (db) {
		redisContext *c0 = raw(s, 0), *cd = raw(s, db);

		g_assert_cmpint(raw_exists(c0, NS "/segments/seg"), ==, 0);
		g_assert_cmpint(raw_exists(cd, NS "/segments/seg"), ==, 1);
		redisFree(c0);
		redisFree(cd);
	}
	md_close(&a);
	md_close(&w);
	g_async_queue_unref(q);
}

static void test_watch_notify(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;

	if (!s)
		return;
	logcap_sink_init(&l);
	watch_cases(s, &l, 0);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "by keyspace notifications"), >=, 1);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "polling"), ==, 0);
	{
		redisContext *c = raw(s, 0);
		redisReply *r = redisCommand(c, "CONFIG GET notify-keyspace-events");

		g_assert_cmpint(r->type, ==, REDIS_REPLY_ARRAY);
		g_assert_nonnull(strchr(r->element[1]->str, 'K'));
		freeReplyObject(r);
		redisFree(c);
	}
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_watch_poll(void)
{
	static const char *const extra[] = { "--rename-command", "CONFIG", "", NULL };
	struct mdserver *s = server(extra);
	struct logcap_sink l;

	if (!s)
		return;
	logcap_sink_init(&l);
	watch_cases(s, &l, 0);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "polling"), >=, 1);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "by keyspace notifications"), ==, 0);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_select_db(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;

	if (!s)
		return;
	logcap_sink_init(&l);
	watch_cases(s, &l, 3);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_restart(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;
	struct md a, c, w;
	GAsyncQueue *q = g_async_queue_new_full(event_free);
	g_autofree char *ja = NULL, *jc = NULL, *err = NULL;
	gint64 t0;

	if (!s)
		return;
	logcap_sink_init(&l);
	ja = watched_seg(s, &l, &a, &w, q);

	mdserver_stop(s, true);
	/* Down for a while: the keeper and the watch fail, log once, do not spin. */
	g_usleep(1500 * 1000);
	g_assert_cmpint(get_status(&w, "seg", &err), ==, TE_ERR_METADATA_UNAVAILABLE);
	g_test_message("while down: %s", err);
	g_assert_nonnull(strstr(err, s->url));
	g_clear_pointer(&err, g_free);
	mdserver_restart(s); /* no persistence: empty */
	t0 = g_get_monotonic_time();
	g_assert_true(wait_get_status(&w, "seg", TE_OK, TTL_S * 1000));
	g_test_message("re-published %.2f s after the restart",
		       (g_get_monotonic_time() - t0) / 1e6);
	assert_get(&w, "seg", ja);
	/* The watch is back: a new publisher is seen. */
	md_open(&c, &l, s->url);
	jc = desc("other", "4444", "127.0.0.1:7004", NULL);
	publish_ok(&c, "other", jc);
	g_assert_true(wait_event(q, "other", jc, false, 5000));
	/* The resync may deliver "other" just before the watch logs that it is back. */
	for (int i = 0; i < 200 && logcap_count_at(&l.cap, TE_LOG_INFO, "watch reconnected") == 0;
	     i++)
		g_usleep(10 * 1000);
	g_assert_cmpuint(
		logcap_count_at(&l.cap, TE_LOG_WARN, "keeping this engine's descriptor alive"), ==,
		1);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_WARN, "the watch reconnects"), ==, 1);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "answers again"), ==, 1);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "watch reconnected"), ==, 1);
	md_close(&c);
	md_close(&a);
	md_close(&w);
	g_async_queue_unref(q);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

/*
 * The server restarts empty while the key's owner is gone for good: the watch, back, finds
 * the key missing and delivers a delete flagged as inferred (resync), since an empty store
 * looks the same as a departed owner. A delete the server then reports is not flagged.
 */
static void restart_owner_gone(const char *const *extra)
{
	struct mdserver *s = server(extra);
	struct logcap_sink l;
	struct md a, b, w;
	GAsyncQueue *q = g_async_queue_new_full(event_free);
	g_autofree char *ja = NULL, *jb = NULL, *err = NULL;

	if (!s) {
		g_async_queue_unref(q);
		return;
	}
	logcap_sink_init(&l);
	ja = watched_seg(s, &l, &a, &w, q);
	mdserver_stop(s, true);
	md_close(&a); /* gone while the server was down: nobody writes "seg" again */
	mdserver_restart(s);
	g_assert_true(wait_event(q, "seg", NULL, true, (TTL_S + 3) * 1000));
	g_assert_true(found_resync);
	/* A key published and withdrawn after that: a delete the server reported. */
	md_open(&b, &l, s->url);
	jb = desc("other", "2222", "127.0.0.1:7002", NULL);
	publish_ok(&b, "other", jb);
	g_assert_true(wait_event(q, "other", jb, false, 5000));
	g_assert_cmpint(ops->withdraw(b.st, "other", &err), ==, TE_OK);
	g_assert_true(wait_event(q, "other", NULL, true, 5000));
	g_assert_false(found_resync);
	md_close(&b);
	md_close(&w);
	g_async_queue_unref(q);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_restart_owner_gone(void)
{
	restart_owner_gone(NULL);
}

/* The same when the watch polls (no CONFIG: no keyspace notifications). */
static void test_restart_owner_gone_poll(void)
{
	static const char *const extra[] = { "--rename-command", "CONFIG", "", NULL };

	restart_owner_gone(extra);
}

static void test_down_at_start(void)
{
	struct logcap_sink l;
	struct md m;
	g_autofree char *url = g_strdup_printf("redis://127.0.0.1:%u", mdserver_dead_port());
	g_autofree char *err = NULL;
	const char *eps[] = { url };

	logcap_sink_init(&l);
	g_assert_cmpint(md_open_eps(&m, &l, eps, 1, &err), ==, TE_ERR_METADATA_UNAVAILABLE);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, url));
	g_assert_nonnull(strstr(err, "refused"));
	logcap_sink_clear(&l);
}

static void test_endpoints(void)
{
	static const char *const bad[] = {
		"rediss://127.0.0.1:6379",  "redis://127.0.0.1:6379/x", "redis://alice@127.0.0.1:1",
		"redis://127.0.0.1:6379?a", "http://127.0.0.1:1",	"redis://:1",
	};
	struct logcap_sink l;
	struct md m;
	unsigned port = mdserver_dead_port();

	logcap_sink_init(&l);
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *err = NULL;
		const char *eps[] = { bad[i] };

		g_assert_cmpint(md_open_eps(&m, &l, eps, 1, &err), ==, TE_ERR_CONFIG);
		g_test_message("%s: %s", bad[i], err);
	}
	{
		/* No scheme, IPv6, a db and a user: all named (never the password). */
		g_autofree char *a = g_strdup_printf("127.0.0.1:%u", port);
		g_autofree char *b = g_strdup_printf("redis://bob:hush@[::1]:%u/2", port);
		g_autofree char *err = NULL, *want_a = NULL, *want_b = NULL;
		const char *eps[] = { a, b };

		g_assert_cmpint(md_open_eps(&m, &l, eps, 2, &err), ==, TE_ERR_METADATA_UNAVAILABLE);
		g_test_message("%s", err);
		want_a = g_strdup_printf("redis://127.0.0.1:%u", port);
		want_b = g_strdup_printf("redis://bob@[::1]:%u/2", port);
		g_assert_nonnull(strstr(err, want_a));
		g_assert_nonnull(strstr(err, want_b));
		g_assert_null(strstr(err, "hush"));
	}
	logcap_sink_clear(&l);
}

static void test_failover(void)
{
	/* Full sync to the replica right away (the default waits 5 s for more replicas). */
	static const char *const pextra[] = { "--repl-diskless-sync-delay", "0", NULL };
	struct mdserver *s = server(pextra);
	struct mdserver *rep;
	struct logcap_sink l;
	struct md m;
	g_autofree char *dead = g_strdup_printf("redis://127.0.0.1:%u", mdserver_dead_port());
	g_autofree char *port = NULL, *err = NULL, *json = NULL;
	const char *extra[] = { "--replicaof", "127.0.0.1", NULL, NULL };

	if (!s)
		return;
	port = g_strdup_printf("%u", s->port);
	extra[2] = port;
	rep = mdserver_start(MDSERVER_REDIS, extra);
	logcap_sink_init(&l);
	{
		/* A dead port, a read-only replica, then the primary: writes land on it. */
		const char *eps[] = { dead, rep->url, s->url };

		g_assert_cmpint(md_open_eps(&m, &l, eps, 3, &err), ==, TE_OK);
	}
	json = desc("seg", "1111", "127.0.0.1:7001", NULL);
	publish_ok(&m, "seg", json);
	/* Reads stay on the replica (the first endpoint that answered): replication lags. */
	g_assert_true(wait_get_status(&m, "seg", TE_OK, 3000));
	assert_get(&m, "seg", json);
	g_assert_cmpuint(logcap_count_at(&l.cap, TE_LOG_INFO, "read-only replica"), >=, 1);
	{
		redisContext *c = raw(s, 0);

		g_assert_cmpint(raw_exists(c, NS "/segments/seg"), ==, 1);
		redisFree(c);
	}
	g_assert_cmpint(ops->withdraw(m.st, "seg", &err), ==, TE_OK);
	md_close(&m);
	logcap_sink_clear(&l);
	mdserver_free(rep);
	mdserver_free(s);
}

static void test_auth(void)
{
	static const char *const extra[] = {
		"--requirepass", "pw s3cret", "--user", "alice", "on",
		">alicepw",	 "~*",	      "&*",	"+@all", NULL
	};
	struct mdserver *s = server(extra);
	struct logcap_sink l;
	struct md m;
	g_autofree char *url = NULL, *err = NULL, *json = NULL;
	const char *eps[1];

	if (!s)
		return;
	logcap_sink_init(&l);
	json = desc("seg", "1111", "127.0.0.1:7001", NULL);
	/* Password in the URL (percent-encoded space). */
	url = g_strdup_printf("redis://:pw%%20s3cret@127.0.0.1:%u", s->port);
	md_open(&m, &l, url);
	publish_ok(&m, "seg", json);
	assert_get(&m, "seg", json);
	md_close(&m);
	/* Password from the params (metadata.password_file). */
	eps[0] = s->url;
	memset(&m, 0, sizeof(m));
	m.eps[0] = s->url;
	m.p = (struct metadata_params){ .endpoints = m.eps,
					.n_endpoints = 1,
					.ns = NS,
					.ttl_s = TTL_S,
					.timeout_ms = 2000,
					.password = "pw s3cret",
					.log = &l.sink };
	g_assert_cmpint(ops->open(&m.p, &m.st, &err), ==, TE_OK);
	assert_get(&m, "seg", json);
	md_close(&m);
	/* An ACL user (redis 6+). */
	g_free(url);
	url = g_strdup_printf("redis://alice:alicepw@127.0.0.1:%u", s->port);
	md_open(&m, &l, url);
	assert_get(&m, "seg", json);
	md_close(&m);
	/* Wrong password: the server's words. */
	g_free(url);
	url = g_strdup_printf("redis://:wrong@127.0.0.1:%u", s->port);
	eps[0] = url;
	g_assert_cmpint(md_open_eps(&m, &l, eps, 1, &err), ==, TE_ERR_METADATA);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "WRONGPASS"));
	g_assert_nonnull(strstr(err, "127.0.0.1"));
	g_assert_null(strstr(err, "wrong@"));
	g_clear_pointer(&err, g_free);
	/* None at all. */
	eps[0] = s->url;
	g_assert_cmpint(md_open_eps(&m, &l, eps, 1, &err), ==, TE_ERR_METADATA);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "NOAUTH"));
	logcap_sink_clear(&l);
	mdserver_free(s);
}

static void test_garbage(void)
{
	struct mdserver *s = server(NULL);
	struct logcap_sink l;
	struct md m, w;
	GAsyncQueue *q = g_async_queue_new_full(event_free);
	static const char junk[] = "\x00\xff{\"generation\":\x01\x02 not json";
	g_autofree char *err = NULL, *json = NULL, *big = NULL;
	redisContext *c;
	redisReply *r;
	GBytes *b = NULL;

	if (!s)
		return;
	logcap_sink_init(&l);
	md_open(&m, &l, s->url);
	md_open(&w, &l, s->url);
	g_assert_cmpint(ops->watch(w.st, watch_fn, q, &err), ==, TE_OK);
	c = raw(s, 0);
	r = redisCommand(c, "SET %s %b", NS "/segments/junk", junk, sizeof(junk) - 1);
	freeReplyObject(r);
	/* Binary values come back byte-exact and reach the watcher (the core decodes). */
	g_assert_cmpint(ops->get(m.st, "junk", 1000, &b, &err), ==, TE_OK);
	g_assert_cmpmem(g_bytes_get_data(b, NULL), g_bytes_get_size(b), junk, sizeof(junk) - 1);
	g_bytes_unref(b);
	g_assert_true(wait_event(q, "junk", NULL, false, 3000));
	/* Publishing over it: not ours, and no holder to name. */
	json = desc("junk", "1111", "127.0.0.1:7001", NULL);
	g_assert_cmpint(ops->publish(m.st, "junk", json, strlen(json), &err), ==, TE_ERR_EXISTS);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "not a segment descriptor"));
	g_clear_pointer(&err, g_free);
	/* A key of another type. */
	r = redisCommand(c, "RPUSH %s a b", NS "/segments/list");
	freeReplyObject(r);
	g_assert_cmpint(get_status(&m, "list", &err), ==, TE_ERR_METADATA);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, NS "/segments/list"));
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(ops->publish(m.st, "list", json, strlen(json), &err), ==, TE_ERR_METADATA);
	g_clear_pointer(&err, g_free);
	/* Over the size limit: refused, not read whole. */
	big = g_malloc(DESCRIPTOR_MAX_JSON + 2);
	memset(big, 'x', DESCRIPTOR_MAX_JSON + 1);
	r = redisCommand(c, "SET %s %b", NS "/segments/big", big, (size_t)DESCRIPTOR_MAX_JSON + 1);
	freeReplyObject(r);
	g_assert_cmpint(get_status(&m, "big", &err), ==, TE_ERR_METADATA);
	g_test_message("%s", err);
	g_assert_nonnull(strstr(err, "over"));
	g_clear_pointer(&err, g_free);
	/* Not JSON from the caller, no generation: refused before the network. */
	g_assert_cmpint(ops->publish(m.st, "x", "{}", 2, &err), ==, TE_ERR_INVALID_ARG);
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(ops->publish(m.st, "x", "\xff", 1, &err), ==, TE_ERR_INVALID_ARG);
	g_clear_pointer(&err, g_free);
	/* The watch survived all of it and still works. */
	r = redisCommand(c, "DEL %s", NS "/segments/junk");
	freeReplyObject(r);
	g_assert_true(wait_event(q, "junk", NULL, true, 3000));
	g_free(json);
	json = desc("fine", "1111", "127.0.0.1:7001", NULL);
	publish_ok(&m, "fine", json);
	g_assert_true(wait_event(q, "fine", json, false, 3000));
	redisFree(c);
	md_close(&m);
	md_close(&w);
	g_async_queue_unref(q);
	logcap_sink_clear(&l);
	mdserver_free(s);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/redis/roundtrip", test_roundtrip);
	g_test_add_func("/redis/collision", test_collision);
	g_test_add_func("/redis/takeover", test_takeover);
	g_test_add_func("/redis/expiry", test_expiry);
	g_test_add_func("/redis/watch-notify", test_watch_notify);
	g_test_add_func("/redis/watch-poll", test_watch_poll);
	g_test_add_func("/redis/select-db", test_select_db);
	g_test_add_func("/redis/restart", test_restart);
	g_test_add_func("/redis/restart-owner-gone", test_restart_owner_gone);
	g_test_add_func("/redis/restart-owner-gone-poll", test_restart_owner_gone_poll);
	g_test_add_func("/redis/down-at-start", test_down_at_start);
	g_test_add_func("/redis/endpoints", test_endpoints);
	g_test_add_func("/redis/failover", test_failover);
	g_test_add_func("/redis/auth", test_auth);
	g_test_add_func("/redis/garbage", test_garbage);
	return g_test_run();
}
