/* SPDX-License-Identifier: Apache-2.0 */
/* engine_test.c: engines that find each other by name through a real metadata store. */

/*
 * One binary for every store backend: $TE_MD_BACKEND (etcd, redis, http) picks it, and
 * meson runs each case as its own test (md-<backend>-<case>). Servers come from
 * tests/metadata/mdserver.h: the suite's shared one where .ci/run exported it, a private one
 * for cases that stop or restart it. Each case works in a namespace of its own, so cases and
 * runs never see each other's keys. Peers are tests/system/te-node processes (their buffer,
 * guarded, checked byte by byte) and engines in this process.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include <te/te.h>

#include "sysnode_fixture.h"
#include "core/metadata/metadata.h"
#include "mdserver.h"
#include "core/te_metadata_config.h"

#define WAIT_NS (20 * S_NS)
#define TTL_S 2u

static const char *backend; /* etcd, redis, http */
static enum mdserver_kind kind;

/* Stores that watch (http has none: peers learn of changes on a failed path). */
static bool backend_watches(void)
{
	return kind != MDSERVER_HTTP;
}

/* A namespace no other case or run uses. */
static char *case_ns(void)
{
	static unsigned n;

	return g_strdup_printf("/te-test/%d-%u-%" PRId64, (int)getpid(), ++n,
			       g_get_real_time() % 1000000);
}

/* Engine YAML for @name (NULL: host:port), listening on @listen, through @url in @ns. */
static char *yaml_for(const char *name, const char *listen, const char *url, const char *ns,
		      unsigned ttl_s)
{
	g_autofree char *name_item = name ? g_strdup_printf("name: %s, ", name) : g_strdup("");

	return g_strdup_printf("engine: {%slisten: \"%s\"}\n"
			       "metadata: {type: %s, endpoints: [\"%s\"], namespace: \"%s\", "
			       "ttl_s: %u, timeout_ms: 2000}\n"
			       "transfer: {timeout_ms: 5000}\n"
			       "transports:\n"
			       "  - name: tcp\n"
			       "    required: true\n",
			       name_item, listen, backend, url, ns, ttl_s);
}

static struct te_engine *engine_yaml(const char *yaml)
{
	struct te_engine *e = NULL;

	assert_ok(te_engine_new_from_string(yaml, strlen(yaml), &e));
	return e;
}

/* A buffer of @e that peers may READ and WRITE (lbuf_free releases it). */
static void rbuf_new(struct lbuf *b, struct te_engine *e, size_t len)
{
	b->len = len;
	b->p = g_aligned_alloc(1, len, 4096);
	memset(b->p, 0xee, len);
	assert_ok(te_mem_register(e, b->p, len, "cpu", TE_MEM_REMOTE));
}

/* WRITE then READ back @len bytes at the start of @n's buffer; every byte checked. */
static void write_read(struct te_engine *e, te_segment_id seg, struct node *n, size_t len,
		       uint8_t seed)
{
	struct lbuf b;
	struct te_request r;

	lbuf_new(&b, e, 2 * len);
	for (size_t i = 0; i < len; i++)
		b.p[i] = (uint8_t)(seed + i * 7);
	r = (struct te_request){ TE_OP_WRITE, seg, b.p, n->buf, len };
	batch_run_ok(e, &r, 1, WAIT_NS, "tcp");
	r = (struct te_request){ TE_OP_READ, seg, b.p + len, n->buf, len };
	batch_run_ok(e, &r, 1, WAIT_NS, "tcp");
	assert_bytes(b.p + len, b.p, len, "bytes read back");
	lbuf_free(&b, e);
}

/* Submit one READ of @len bytes from @seg; the task's status and detail. */
static enum te_status read_once(struct te_engine *e, te_segment_id seg, uint64_t remote, size_t len,
				char *detail, size_t dlen)
{
	struct lbuf b;
	struct te_request r;
	struct te_task_info ti;
	enum te_status sst, wst;
	te_batch_id bid;

	lbuf_new(&b, e, len);
	r = (struct te_request){ TE_OP_READ, seg, b.p, remote, len };
	bid = batch_run(e, &r, 1, WAIT_NS, &sst, &wst);
	assert_ok(te_task_status(e, bid, 0, &ti));
	g_strlcpy(detail, ti.detail, dlen);
	assert_ok(te_batch_free(e, bid));
	lbuf_free(&b, e);
	return ti.state == TE_STATE_COMPLETED ? TE_OK : ti.status;
}

/* The backend's ops table, for a publisher of our own beside the engines. */
static const struct metadata_ops *store_ops(void)
{
	const struct metadata_ops *ops = NULL;

#ifdef TE_HAVE_ETCD
	if (kind == MDSERVER_ETCD)
		ops = &metadata_etcd_ops;
#endif
#ifdef TE_HAVE_REDIS
	if (kind == MDSERVER_REDIS)
		ops = &metadata_redis_ops;
#endif
#ifdef TE_HAVE_HTTP
	if (kind == MDSERVER_HTTP)
		ops = &metadata_http_ops;
#endif
	g_assert_nonnull(ops);
	return ops;
}

/* --- cases ------------------------------------------------------------------------------- */

/*
 * Three engines by name: a te-node target, an initiator here that opens it by name, and a
 * second engine here that registers a buffer after start and is opened by name too (its
 * publication follows te_mem_register); with a watching store, a buffer registered after the
 * peer opened it shows up there without a failure.
 */
static void test_by_name(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	g_autofree char *ns = case_ns();
	g_autofree char *ya = yaml_for("node-a", "127.0.0.1:0", srv->url, ns, TTL_S);
	g_autofree char *yb = yaml_for("node-b", "127.0.0.1:0", srv->url, ns, TTL_S);
	g_autofree char *yc = yaml_for("node-c", "127.0.0.1:0", srv->url, ns, TTL_S);
	struct node *a = node_start(ya, NULL);
	struct te_engine *b = engine_yaml(yb), *c = engine_yaml(yc);
	struct te_buffer_info bi[4];
	te_segment_id sa, sb;
	size_t nbi = 0;
	struct lbuf cb, cb2;

	g_assert_cmpstr(a->segment, ==, "node-a");
	g_assert_cmpstr(te_engine_name(b), ==, "node-b");
	assert_ok(te_segment_open(b, "node-a", &sa));
	write_read(b, sa, a, 1 << 20, 3);
	assert_ok(te_segment_open(c, "node-a", &sa));
	write_read(c, sa, a, 4096, 9);

	/* node-c's buffer, registered after start: node-b finds it by name. */
	rbuf_new(&cb, c, 1 << 16);
	memset(cb.p, 0x5a, cb.len);
	assert_ok(te_segment_open(b, "node-c", &sb));
	assert_ok(te_segment_buffers(b, sb, bi, G_N_ELEMENTS(bi), &nbi));
	g_assert_cmpuint(nbi, ==, 1);
	g_assert_cmphex(bi[0].addr, ==, (uintptr_t)cb.p);
	{
		struct lbuf rb;
		struct te_request r;

		lbuf_new(&rb, b, cb.len);
		r = (struct te_request){ TE_OP_READ, sb, rb.p, (uintptr_t)cb.p, cb.len };
		batch_run_ok(b, &r, 1, WAIT_NS, "tcp");
		assert_bytes(rb.p, cb.p, cb.len, "node-c's buffer read by name");
		lbuf_free(&rb, b);
	}
	if (backend_watches()) {
		int64_t deadline = now_ns() + 5 * S_NS;

		/* A second buffer: the watch brings node-b the new list. */
		rbuf_new(&cb2, c, 1 << 16);
		do {
			assert_ok(te_segment_buffers(b, sb, bi, G_N_ELEMENTS(bi), &nbi));
			if (nbi == 2)
				break;
			sleep_ms(20);
		} while (now_ns() < deadline);
		g_assert_cmpuint(nbi, ==, 2);
		lbuf_free(&cb2, c);
	}
	/* Our own name is segment 0. */
	g_assert_cmpint(te_segment_open(b, "node-b", &sb), ==, TE_ERR_INVALID_ARG);
	assert_contains(te_last_error(), "own segment");
	lbuf_free(&cb, c);
	te_engine_free(c);
	te_engine_free(b);
	node_close_free(a, 5000, false);
	mdserver_free(srv);
}

/* A second engine claiming a live engine's name is refused, naming the holder. */
static void test_collision(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	g_autofree char *ns = case_ns();
	g_autofree char *y = yaml_for("dup", "127.0.0.1:0", srv->url, ns, TTL_S);
	struct te_engine *first = engine_yaml(y), *second = NULL;
	g_autofree char *holder = NULL;
	char *json = NULL;

	assert_ok(te_segment_export(first, &json, NULL));
	g_assert_cmpint(te_engine_new_from_string(y, strlen(y), &second), ==, TE_ERR_EXISTS);
	g_assert_null(second);
	g_test_message("collision: %s", te_last_error());
	assert_contains(te_last_error(), "dup");
	/* The holder's control address (it is in its descriptor). */
	{
		const char *rpc = strstr(json, "\"rpc\"");

		g_assert_nonnull(rpc);
		holder = g_strndup(
			strchr(rpc + 5, '"') + 1,
			(size_t)(strchr(strchr(rpc + 5, '"') + 1, '"') - strchr(rpc + 5, '"') - 1));
	}
	assert_contains(te_last_error(), holder);
	te_free(json);
	/* The first keeps its name: it is still found. */
	{
		g_autofree char *yo = yaml_for("other", "127.0.0.1:0", srv->url, ns, TTL_S);
		struct te_engine *o = engine_yaml(yo);
		te_segment_id id;

		assert_ok(te_segment_open(o, "dup", &id));
		te_engine_free(o);
	}
	te_engine_free(first);
	/* Once it left (withdrawn at te_engine_free), the name is free. */
	second = engine_yaml(y);
	te_engine_free(second);
	mdserver_free(srv);
}

/*
 * A killed engine that comes back on the same address takes its name over at once (its key
 * is still there, but nobody else can hold that address); peers move bytes to the new
 * generation, with a watching store without a single failed task.
 */
static void test_peer_restart(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	g_autofree char *ns = case_ns();
	g_autofree char *listen = g_strdup_printf("127.0.0.1:%u", mdserver_dead_port());
	g_autofree char *ya = yaml_for("node-a", listen, srv->url, ns, 30);
	g_autofree char *yb = yaml_for("node-b", "127.0.0.1:0", srv->url, ns, TTL_S);
	struct node *a = node_start(ya, NULL);
	struct te_engine *b = engine_yaml(yb);
	te_segment_id sa;
	char detail[512];

	assert_ok(te_segment_open(b, "node-a", &sa));
	write_read(b, sa, a, 65536, 1);
	node_kill(a);
	node_release(a);
	a = node_start(ya, NULL); /* same name, same address, TTL of 30 s not run out */
	if (backend_watches()) {
		/* The watch replaced the view: the first transfer after it succeeds. */
		int64_t deadline = now_ns() + 5 * S_NS;
		struct te_buffer_info bi;
		size_t nbi = 0;

		do {
			assert_ok(te_segment_buffers(b, sa, &bi, 1, &nbi));
			if (nbi == 1 && bi.addr == a->buf)
				break;
			sleep_ms(20);
		} while (now_ns() < deadline);
		g_assert_cmphex(bi.addr, ==, a->buf);
		write_read(b, sa, a, 65536, 2);
	} else {
		/* No watch: the first attempt may fail on the old path, then a refresh. */
		enum te_status st = read_once(b, sa, a->buf, 4096, detail, sizeof(detail));

		g_test_message("first read after the restart: %s %s", te_status_str(st), detail);
		write_read(b, sa, a, 65536, 2);
	}
	te_engine_free(b);
	node_close_free(a, 5000, false);
	mdserver_free(srv);
}

/*
 * A SIGKILLed engine leaves the store within its TTL (+1 s); a watching peer then fails new
 * requests at once with the reason, and sees it again when it comes back.
 */
static void test_departed(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	g_autofree char *ns = case_ns();
	g_autofree char *ya = yaml_for("node-a", "127.0.0.1:0", srv->url, ns, TTL_S);
	g_autofree char *yb = yaml_for("node-b", "127.0.0.1:0", srv->url, ns, TTL_S);
	struct node *a = node_start(ya, NULL);
	struct te_engine *b = engine_yaml(yb);
	uint64_t buf = a->buf;
	te_segment_id sa;
	char detail[512] = "";
	enum te_status st = TE_OK;
	int64_t killed, deadline;

	if (!backend_watches()) {
		g_test_skip("http has no watch");
		goto out;
	}
	assert_ok(te_segment_open(b, "node-a", &sa));
	write_read(b, sa, a, 4096, 4);
	node_kill(a);
	node_release(a);
	a = NULL;
	killed = now_ns();
	deadline = killed + (TTL_S + 1) * S_NS + 500 * MS_NS;
	while (now_ns() < deadline) {
		st = read_once(b, sa, buf, 4096, detail, sizeof(detail));
		if (st == TE_ERR_PEER_UNREACHABLE && strstr(detail, "is gone"))
			break;
		sleep_ms(50);
	}
	g_test_message("%.1f s after the kill: %s: %s", (double)(now_ns() - killed) / S_NS,
		       te_status_str(st), detail);
	g_assert_cmpint(st, ==, TE_ERR_PEER_UNREACHABLE);
	assert_contains(detail, "is gone");
	assert_contains(detail, backend);
	/* Failing fast: a rejected submit, no connect attempt. */
	{
		int64_t t0 = now_ns();

		st = read_once(b, sa, buf, 4096, detail, sizeof(detail));
		g_assert_cmpint(st, ==, TE_ERR_PEER_UNREACHABLE);
		g_assert_cmpint(now_ns() - t0, <, 2 * S_NS); /* no retry loop until the deadline */
	}
	/* Back under the same name: found again through the watch. */
	a = node_start(ya, NULL);
	deadline = now_ns() + 5 * S_NS;
	do {
		st = read_once(b, sa, a->buf, 4096, detail, sizeof(detail));
		if (st == TE_OK)
			break;
		sleep_ms(50);
	} while (now_ns() < deadline);
	g_assert_cmpint(st, ==, TE_OK);
	write_read(b, sa, a, 4096, 5);
out:
	te_engine_free(b);
	if (a)
		node_close_free(a, 5000, false);
	mdserver_free(srv);
}

/*
 * The store restarts (SIGKILL; etcd keeps its data, redis and te-metadata-server lose it)
 * while two engines move bytes: no transfer fails, and within one TTL both are published
 * again (a new engine finds them by name).
 */
static void test_store_restart(void)
{
	struct mdserver *srv = mdserver_start(kind, NULL);
	g_autofree char *ns = case_ns();
	g_autofree char *ya = yaml_for("node-a", "127.0.0.1:0", srv->url, ns, TTL_S);
	g_autofree char *yb = yaml_for("node-b", "127.0.0.1:0", srv->url, ns, TTL_S);
	g_autofree char *yc = yaml_for("node-c", "127.0.0.1:0", srv->url, ns, TTL_S);
	struct node *a = node_start(ya, NULL);
	struct te_engine *b = engine_yaml(yb), *c;
	te_segment_id sa;
	int64_t deadline;
	enum te_status st;

	assert_ok(te_segment_open(b, "node-a", &sa));
	write_read(b, sa, a, 65536, 6);
	mdserver_stop(srv, true);
	write_read(b, sa, a, 65536, 7); /* the data path does not need the store */
	if (kind == MDSERVER_ETCD)
		mdserver_restart(srv); /* data kept: leases survive */
	else {
		mdserver_wipe(srv);
		mdserver_restart(srv);
	}
	write_read(b, sa, a, 65536, 8);
	/* Published again within one TTL (+ a second for the republish period). */
	c = engine_yaml(yc);
	deadline = now_ns() + (TTL_S + 2) * S_NS;
	do {
		te_segment_id x;

		st = te_segment_open(c, "node-a", &x);
		if (st == TE_OK)
			st = te_segment_open(c, "node-b", &x);
		if (st == TE_OK)
			break;
		sleep_ms(100);
	} while (now_ns() < deadline);
	if (st != TE_OK)
		g_error("not published again %u s after the store restarted: %s (%s)", TTL_S + 2,
			te_status_str(st), te_last_error());
	assert_ok(te_segment_open(c, "node-a", &sa));
	write_read(c, sa, a, 4096, 9);
	te_engine_free(c);
	te_engine_free(b);
	node_close_free(a, 5000, false);
	mdserver_free(srv);
}

/* WRITE @seed's pattern into @rb (an engine's buffer here) through @e, READ it back. */
static void write_read_buf(struct te_engine *e, te_segment_id seg, const struct lbuf *rb,
			   uint8_t seed)
{
	struct lbuf b;
	struct te_request r;

	lbuf_new(&b, e, 2 * rb->len);
	for (size_t i = 0; i < rb->len; i++)
		b.p[i] = (uint8_t)(seed + i * 7);
	r = (struct te_request){ TE_OP_WRITE, seg, b.p, (uint64_t)(uintptr_t)rb->p, rb->len };
	batch_run_ok(e, &r, 1, WAIT_NS, "tcp");
	assert_bytes(rb->p, b.p, rb->len, "bytes written");
	r = (struct te_request){ TE_OP_READ, seg, b.p + rb->len, (uint64_t)(uintptr_t)rb->p,
				 rb->len };
	batch_run_ok(e, &r, 1, WAIT_NS, "tcp");
	assert_bytes(b.p + rb->len, b.p, rb->len, "bytes read back");
	lbuf_free(&b, e);
}

/*
 * The store restarts without its data and the watch gets back to it before the owner of a
 * key writes it again (node-a refreshes every 20 s here). The segment stays usable for one
 * TTL and a second (no transfer fails: the store's absence is no proof), is gone after that
 * while its key is still missing, and is back with its key, even with the very value it had
 * (before 2026-12-03 a delete found at a resync made it gone at once, and for good when the
 * owner wrote the same value again).
 */
static void test_store_wiped(void)
{
	struct mdserver *srv = mdserver_start(kind, NULL);
	g_autofree char *ns = case_ns();
	g_autofree char *ya = yaml_for("node-a", "127.0.0.1:0", srv->url, ns, 60);
	g_autofree char *yb = yaml_for("node-b", "127.0.0.1:0", srv->url, ns, TTL_S);
	const char *eps[] = { srv->url };
	struct metadata_params p = {
		.endpoints = eps, .n_endpoints = 1, .ns = ns, .ttl_s = 60, .timeout_ms = 2000
	};
	const struct metadata_ops *ops = store_ops();
	g_autofree char *err = NULL;
	char detail[512] = "";
	struct te_engine *a, *b;
	GBytes *saved = NULL;
	void *st = NULL;
	struct lbuf ab;
	te_segment_id sa;
	enum te_status s;
	int64_t back, deadline, gone_after;
	unsigned moved = 0;

	if (!backend_watches()) {
		g_test_skip("http has no watch");
		mdserver_free(srv);
		return;
	}
	a = engine_yaml(ya);
	rbuf_new(&ab, a, 65536);
	b = engine_yaml(yb);
	assert_ok(te_segment_open(b, "node-a", &sa));
	write_read_buf(b, sa, &ab, 1);
	assert_ok(ops->open(&p, &st, &err));
	if (ops->get(st, "node-a", 2000, &saved, &err) != TE_OK)
		g_error("reading node-a's descriptor: %s", err);
	mdserver_stop(srv, true);
	mdserver_wipe(srv);
	back = now_ns(); /* before the watch can get back */
	mdserver_restart(srv);
	/* The watch is back within its backoff and finds node-a missing: still usable. */
	while (now_ns() - back < TTL_S * S_NS - 500 * MS_NS)
		write_read_buf(b, sa, &ab, (uint8_t)(2 + moved++));
	g_test_message("%u WRITE+READ pairs in the %u.5 s from the restart", moved, TTL_S - 1);
	/* Gone once node-a has not come back for a TTL and a second. */
	deadline = back + (TTL_S + 6) * S_NS;
	do {
		s = read_once(b, sa, (uint64_t)(uintptr_t)ab.p, 4096, detail, sizeof(detail));
		if (s != TE_OK)
			break;
		sleep_ms(50);
	} while (now_ns() < deadline);
	gone_after = now_ns() - back;
	g_test_message("%.1f s after the restart: %s: %s", (double)gone_after / S_NS,
		       te_status_str(s), detail);
	g_assert_cmpint(s, ==, TE_ERR_PEER_UNREACHABLE);
	assert_contains(detail, "is gone");
	assert_contains(detail, "not published again");
	assert_contains(detail, backend);
	g_assert_cmpint(gone_after, >=, (int64_t)(TTL_S + 1) * S_NS);
	/* Its key back with the value it had: usable again. */
	{
		gsize n;
		const char *d = g_bytes_get_data(saved, &n);

		if (ops->publish(st, "node-a", d, n, &err) != TE_OK)
			g_error("publishing node-a's descriptor again: %s", err);
	}
	deadline = now_ns() + 5 * S_NS;
	do {
		s = read_once(b, sa, (uint64_t)(uintptr_t)ab.p, 4096, detail, sizeof(detail));
		if (s == TE_OK)
			break;
		sleep_ms(50);
	} while (now_ns() < deadline);
	g_assert_cmpint(s, ==, TE_OK);
	write_read_buf(b, sa, &ab, 99);
	te_engine_free(b);
	g_bytes_unref(saved);
	ops->close(st);
	lbuf_free(&ab, a);
	te_engine_free(a);
	mdserver_free(srv);
}

/* No server at the endpoint: the engine does not start and says where it tried. */
static void test_unreachable(void)
{
	g_autofree char *url = NULL;
	g_autofree char *y = NULL;
	struct te_engine *e = NULL;
	unsigned port = mdserver_dead_port();

	url = g_strdup_printf(kind == MDSERVER_REDIS  ? "redis://127.0.0.1:%u"
			      : kind == MDSERVER_HTTP ? "http://127.0.0.1:%u/metadata"
						      : "http://127.0.0.1:%u",
			      port);
	y = yaml_for("lonely", "127.0.0.1:0", url, "/te-test", TTL_S);
	g_assert_cmpint(te_engine_new_from_string(y, strlen(y), &e), ==,
			TE_ERR_METADATA_UNAVAILABLE);
	g_assert_null(e);
	g_test_message("%s", te_last_error());
	{
		g_autofree char *hp = g_strdup_printf("127.0.0.1:%u", port);

		assert_contains(te_last_error(), hp);
	}
}

/*
 * A value under a segment key that is not a descriptor: opening it fails with
 * METADATA_MALFORMED naming the key; a watcher that had the segment open keeps its view.
 */
static void test_malformed(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	g_autofree char *ns = case_ns();
	g_autofree char *yb = yaml_for("node-b", "127.0.0.1:0", srv->url, ns, TTL_S);
	g_autofree char *key = metadata_key(ns, "bogus");
	const char *eps[] = { srv->url };
	struct metadata_params p = {
		.endpoints = eps, .n_endpoints = 1, .ns = ns, .ttl_s = 60, .timeout_ms = 2000
	};
	const struct metadata_ops *ops = store_ops();
	/* JSON, with the fields a store backend reads, but no descriptor. */
	static const char garbage[] =
		"{\"name\": \"bogus\", \"generation\": \"12\", \"rpc\": \"127.0.0.1:1\", "
		"\"buffers\": 7}";
	g_autofree char *err = NULL;
	struct te_engine *b;
	void *st = NULL;
	te_segment_id id;

	/* A publisher that writes garbage (and goes away without deleting it). */
	assert_ok(ops->open(&p, &st, &err));
	if (ops->publish(st, "bogus", garbage, sizeof(garbage) - 1, &err) != TE_OK)
		g_error("publishing garbage: %s", err);
	b = engine_yaml(yb);
	g_assert_cmpint(te_segment_open(b, "bogus", &id), ==, TE_ERR_METADATA_MALFORMED);
	g_test_message("%s", te_last_error());
	assert_contains(te_last_error(), key);
	assert_contains(te_last_error(), "not a segment descriptor");
	/* Absent: NOT_FOUND naming the key. */
	g_assert_cmpint(te_segment_open(b, "nobody", &id), ==, TE_ERR_METADATA_NOT_FOUND);
	{
		g_autofree char *k2 = metadata_key(ns, "nobody");

		assert_contains(te_last_error(), k2);
	}
	g_clear_pointer(&err, g_free);
	(void)ops->withdraw(st, "bogus", &err);
	ops->close(st);
	te_engine_free(b);
	mdserver_free(srv);
}

/* Publishes two values of one segment by turns until told to stop. */
struct churn {
	const struct metadata_ops *ops;
	void *st;
	const char *name;
	GBytes *val[2];
	gint stop;
	gint published;
};

static gpointer churn_main(gpointer data)
{
	struct churn *c = data;

	while (!g_atomic_int_get(&c->stop)) {
		GBytes *v = c->val[g_atomic_int_get(&c->published) & 1];
		g_autofree char *err = NULL;
		gsize len;
		const char *d = g_bytes_get_data(v, &len);

		if (c->ops->publish(c->st, c->name, d, len, &err) != TE_OK)
			g_error("churn: publishing %s: %s", c->name, err);
		g_atomic_int_inc(&c->published);
	}
	return NULL;
}

/*
 * The watch delivers changes while the engine comes apart. The store's value for a segment
 * the engine opened changes all the time, between the segment's descriptor before and after
 * it registered a second buffer (each delivery loads the segment's peers into the
 * transports anew), while engines that opened it are freed, one after another. A delivery
 * under way could load peers into transports already torn down (a SIGSEGV in CI,
 * 2026-12-03); engine_destroy now quiets the watch before anything else. ASan reports a use
 * after free here if it comes back.
 */
static void test_watch_at_free(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	g_autofree char *ns = case_ns();
	g_autofree char *yc = yaml_for("node-c", "127.0.0.1:0", srv->url, ns, TTL_S);
	const char *eps[] = { srv->url };
	struct metadata_params p = {
		.endpoints = eps, .n_endpoints = 1, .ns = ns, .ttl_s = 60, .timeout_ms = 2000
	};
	struct churn ch = { .ops = store_ops(), .name = "node-c" };
	g_autofree char *err = NULL;
	struct te_engine *c;
	struct lbuf cb;
	GThread *th;
	int64_t deadline;

	if (!backend_watches()) {
		g_test_skip("http has no watch");
		mdserver_free(srv);
		return;
	}
	c = engine_yaml(yc);
	assert_ok(ch.ops->open(&p, &ch.st, &err));
	if (ch.ops->get(ch.st, "node-c", 2000, &ch.val[0], &err) != TE_OK)
		g_error("reading node-c's descriptor: %s", err);
	rbuf_new(&cb, c, 8192); /* published again with this buffer */
	deadline = now_ns() + 5 * S_NS;
	do {
		g_clear_pointer(&ch.val[1], g_bytes_unref);
		if (ch.ops->get(ch.st, "node-c", 2000, &ch.val[1], &err) != TE_OK)
			g_error("reading node-c's descriptor: %s", err);
	} while (g_bytes_equal(ch.val[0], ch.val[1]) && now_ns() < deadline && (sleep_ms(10), 1));
	g_assert_false(g_bytes_equal(ch.val[0], ch.val[1]));
	th = g_thread_new("churn", churn_main, &ch);
	for (unsigned i = 0; i < 10; i++) {
		g_autofree char *name = g_strdup_printf("node-b%u", i);
		g_autofree char *yb = yaml_for(name, "127.0.0.1:0", srv->url, ns, TTL_S);
		struct te_engine *b = engine_yaml(yb);
		gint before = g_atomic_int_get(&ch.published);
		te_segment_id id;

		assert_ok(te_segment_open(b, "node-c", &id));
		/* Deliveries under way: new values published since the open. */
		while (g_atomic_int_get(&ch.published) < before + 20)
			sleep_ms(1);
		te_engine_free(b);
	}
	g_atomic_int_set(&ch.stop, 1);
	g_thread_join(th);
	g_test_message("%d values published while 10 engines came and went", ch.published);
	/* node-c as it is now, and still reachable: an engine that opens it reads its buffer. */
	{
		g_autofree char *yd = yaml_for("node-d", "127.0.0.1:0", srv->url, ns, TTL_S);
		struct te_engine *d = engine_yaml(yd);
		struct lbuf db;
		te_segment_id id;

		lbuf_free(&cb, c); /* published once more, as it is */
		rbuf_new(&cb, c, 8192);
		memset(cb.p, 0x5a, cb.len);
		lbuf_new(&db, d, cb.len);
		deadline = now_ns() + 5 * S_NS;
		assert_ok(te_segment_open(d, "node-c", &id));
		{
			struct te_request r = { TE_OP_READ, id, db.p, (uint64_t)(uintptr_t)cb.p,
						cb.len };
			enum te_status sst, wst;
			te_batch_id bid;

			do {
				bid = batch_run(d, &r, 1, WAIT_NS, &sst, &wst);
				assert_ok(te_batch_free(d, bid));
			} while ((sst != TE_OK || wst != TE_OK) && now_ns() < deadline &&
				 (sleep_ms(50), 1));
			g_assert_cmpint(sst, ==, TE_OK);
			g_assert_cmpint(wst, ==, TE_OK);
		}
		g_assert_cmpint(db.p[0], ==, 0x5a);
		g_assert_cmpint(db.p[db.len - 1], ==, 0x5a);
		lbuf_free(&db, d);
		te_engine_free(d);
	}
	lbuf_free(&cb, c);
	g_bytes_unref(ch.val[0]);
	g_bytes_unref(ch.val[1]);
	ch.ops->close(ch.st);
	te_engine_free(c);
	mdserver_free(srv);
}

/* Every conf/ file that names this backend starts an engine that moves bytes by name. */
static void test_conf_files(void)
{
	struct mdserver *srv = mdserver_shared(kind);
	const char *root = g_getenv("TE_SOURCE_ROOT");
	g_autofree char *dir = g_build_filename(root ? root : ".", "conf", NULL);
	g_autofree char *ns = case_ns();
	g_autofree char *secret = g_build_filename(g_get_tmp_dir(), "te-md-secret-XXXXXX", NULL);
	GDir *d = g_dir_open(dir, 0, NULL);
	const char *f;
	unsigned tried = 0;
	int fd;

	g_assert_nonnull(d);
	fd = g_mkstemp_full(secret, O_WRONLY, 0600);
	g_assert_cmpint(fd, >=, 0);
	g_assert_cmpint(write(fd, "conf-files-test-secret-0123456789", 33), ==, 33);
	close(fd);
	while ((f = g_dir_read_name(d))) {
		g_autofree char *path = g_build_filename(dir, f, NULL);
		g_autofree char *text = NULL;
		g_autofree char *type = g_strdup_printf("type: %s\n", backend);
		g_autoptr(GString) y = NULL;
		g_autoptr(GRegex) ep = NULL;
		g_autofree char *peer_yaml = NULL;
		char **lines;
		struct te_engine *e, *peer;
		te_segment_id id;
		struct lbuf lb;

		if (!g_str_has_suffix(f, ".yaml") ||
		    !g_file_get_contents(path, &text, NULL, NULL) || !strstr(text, type))
			continue;
		/*
		 * The file as a user would run it, with what only this machine can give: the
		 * test's store, a loopback listener, a secret file of the test's, and
		 * transports this build lacks made optional (tcp carries the bytes).
		 */
		y = g_string_new(NULL);
		lines = g_strsplit(text, "\n", -1);
		for (char **l = lines; *l; l++) {
			const char *t = *l + strspn(*l, " ");

			if (g_str_has_prefix(t, "listen:"))
				g_string_append_printf(y, "%.*slisten: \"127.0.0.1:0\"\n",
						       (int)(t - *l), *l);
			else if (g_str_has_prefix(t, "endpoints:") && strchr(t, '['))
				g_string_append_printf(y, "%.*sendpoints: [\"%s\"]\n",
						       (int)(t - *l), *l, srv->url);
			else if (g_str_has_prefix(t, "endpoints:") && t[10] && t[11])
				g_string_append_printf(y, "%.*sendpoints: \"%s\"\n", (int)(t - *l),
						       *l, srv->url);
			else if (g_str_has_prefix(t, "endpoints:"))
				g_string_append_printf(y, "%.*sendpoints: [\"%s\"]\n",
						       (int)(t - *l), *l, srv->url);
			else if (g_str_has_prefix(t, "- http://") ||
				 g_str_has_prefix(t, "- redis://"))
				continue; /* items of the endpoint list replaced above */
			else if (g_str_has_prefix(t, "namespace:"))
				g_string_append_printf(y, "%.*snamespace: \"%s\"\n", (int)(t - *l),
						       *l, ns);
			else if (g_str_has_prefix(t, "secret_file:"))
				g_string_append_printf(y, "%.*ssecret_file: \"%s\"\n",
						       (int)(t - *l), *l, secret);
			else if (g_str_has_prefix(t, "required: true") &&
				 !strstr(l[-1], "name: tcp"))
				g_string_append_printf(y, "%.*srequired: false\n", (int)(t - *l),
						       *l);
			else
				g_string_append_printf(y, "%s\n", *l);
		}
		g_strfreev(lines);
		g_test_message("%s as run:\n%s", f, y->str);
		{
			struct te_engine_opts o = { .size = sizeof(o),
						    .config_yaml = y->str,
						    .config_yaml_len = y->len,
						    .config_name = path,
						    .log_level = -1 };

			if (te_engine_new(&o, &e) != TE_OK)
				g_error("%s does not start with a real %s: %s", f, backend,
					te_last_error());
		}
		/* A peer finds it by the name the file gives, and moves bytes to it. */
		peer_yaml = g_strdup_printf("engine: {name: conf-peer, listen: \"127.0.0.1:0\"}\n"
					    "metadata: {type: %s, endpoints: [\"%s\"], "
					    "namespace: \"%s\"}\n"
					    "transports: [{name: tcp, required: true}]\n"
					    "auth: {secret_file: \"%s\"}\n",
					    backend, srv->url, ns, secret);
		peer = engine_yaml(peer_yaml);
		rbuf_new(&lb, e, 1 << 20);
		assert_ok(te_segment_open(peer, te_engine_name(e), &id));
		{
			struct lbuf pb;
			struct te_request r;

			lbuf_new(&pb, peer, lb.len);
			for (size_t i = 0; i < pb.len; i++)
				pb.p[i] = (uint8_t)(i * 31 + 7);
			r = (struct te_request){ TE_OP_WRITE, id, pb.p, (uintptr_t)lb.p, pb.len };
			batch_run_ok(peer, &r, 1, WAIT_NS, "tcp");
			assert_bytes(lb.p, pb.p, pb.len, f);
			lbuf_free(&pb, peer);
		}
		te_engine_free(peer);
		lbuf_free(&lb, e);
		te_engine_free(e);
		tried++;
		(void)ep;
	}
	g_dir_close(d);
	g_unlink(secret);
	g_test_message("%u conf files name %s", tried, backend);
	g_assert_cmpuint(tried, >=, 1);
	mdserver_free(srv);
}

/* With p2p, a name that is not host:port says what to do. */
static void test_p2p_name(void)
{
	static const char y[] = "engine: {listen: \"127.0.0.1:0\"}\n"
				"transports: [{name: tcp, required: true}]\n";
	struct te_engine *e = engine_yaml(y);
	te_segment_id id;

	g_assert_cmpint(te_segment_open(e, "node-b", &id), ==, TE_ERR_UNKNOWN_SEGMENT);
	assert_contains(te_last_error(), "not a host:port");
	assert_contains(te_last_error(), "metadata.type");
	te_engine_free(e);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	signal(SIGPIPE, SIG_IGN);
	backend = g_getenv("TE_MD_BACKEND");
	if (!backend)
		backend = "etcd";
	kind = strcmp(backend, "redis") == 0  ? MDSERVER_REDIS
	       : strcmp(backend, "http") == 0 ? MDSERVER_HTTP
					      : MDSERVER_ETCD;
	node_path = find_te_node();
	if (!node_path) {
		printf("1..0 # SKIP te-node not found (set TE_NODE or TE_BUILD_ROOT)\n");
		return 77;
	}
	if (!mdserver_available(kind)) {
		printf("1..0 # SKIP the %s server is not installed\n", backend);
		return 77;
	}
	g_test_add_func("/md/by-name", test_by_name);
	g_test_add_func("/md/collision", test_collision);
	g_test_add_func("/md/peer-restart", test_peer_restart);
	g_test_add_func("/md/departed", test_departed);
	g_test_add_func("/md/store-restart", test_store_restart);
	g_test_add_func("/md/store-wiped", test_store_wiped);
	g_test_add_func("/md/unreachable", test_unreachable);
	g_test_add_func("/md/malformed", test_malformed);
	g_test_add_func("/md/conf-files", test_conf_files);
	g_test_add_func("/md/watch-at-free", test_watch_at_free);
	g_test_add_func("/md/p2p-name", test_p2p_name);
	return g_test_run();
}
