/* SPDX-License-Identifier: Apache-2.0 */
/* metadata_bench.c: segment open, store fetch at scale and restart propagation per metadata backend. */

/*
 * metadata_bench [--etcd URL] [--redis URL] [--http URL] [--opens 200] [--fetches 1000]
 *                [--segments 1000] [--small 10] [--watchers 50] [--restarts 20]
 *                [--starts 100] [--parts open,fetch,watch] [--json]
 *
 * Three measurements, each with the backends' rounds interleaved (one sample of every
 * backend, then the next), so that load from elsewhere hits them alike. p2p always runs; a
 * store runs when its URL is given (bench/metadata.sh starts the servers).
 *
 * 1. open: te_segment_open, by name, of a peer engine started just before (its descriptor
 *    published, one 64 KiB buffer registered), from one long-lived initiator engine per
 *    backend; the segment is closed (its last reference: nothing stays cached) and the peer
 *    freed after each sample. Also te_engine_new of the peer (the publication's cost).
 * 2. fetch: the backend's own get (core/metadata/metadata.h ops) plus descriptor_decode of
 *    one of --segments descriptor-shaped values published in one namespace, against one of
 *    --small in another; the ratio of p50 and p99 (target: p99 within 2x). The values are a
 *    real engine's export renamed (each publisher state keeps its keys alive, as engines do).
 *    2b: in the same two namespaces, te_engine_new of a peer (it publishes, and its watch
 *    start resyncs the whole namespace) and te_segment_open of it from an engine watching
 *    that namespace, --starts times each.
 * 3. watch (etcd, redis): --watchers engines in this process, each with the store and tcp on
 *    loopback, hold the segment "watched" open; its engine restarts (te_engine_free, 200 ms,
 *    te_engine_new: a new generation, published inside te_engine_new); a thread polls every
 *    watcher's segment view (core internals: the public API exposes no generation) from
 *    before that call until each holds the new generation. Times count from the call, so
 *    they include the new engine's start (its median is printed too) and bound the delay
 *    after the publication from above; "all-ret" is the last watcher's time after
 *    te_engine_new returned (negative: every watcher had it before the call returned).
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>

#include <te/te.h>

#include "core/engine.h"
#include "core/metadata/descriptor.h"
#include "core/metadata/metadata.h"
#include "core/segment.h"
#include "core/te_metadata_config.h"

enum {
	B_P2P,
	B_ETCD,
	B_REDIS,
	B_HTTP,
	B_N
};

static const char *const bench_names[B_N] = { "p2p", "etcd", "redis", "http" };

#define BENCH_BUF (64u << 10)
#define BENCH_TIMEOUT_MS 5000u
#define BENCH_WATCH_LIMIT_NS (10ull * 1000 * 1000 * 1000)
#define BENCH_PUB_TTL_S 30u

struct bench {
	const char *url[B_N]; /* NULL: not measured (p2p: "") */
	unsigned opens;
	unsigned fetches;
	unsigned segments;
	unsigned small;
	unsigned watchers;
	unsigned restarts;
	unsigned starts;
	gboolean json;
	char *ns; /* "/te-bench-<pid>" */
};

/* Samples in ns. */
struct samples {
	GArray *v; /* double */
	unsigned failed;
};

static double now_ns(void)
{
	return (double)engine_now_ns();
}

static void samples_init(struct samples *s)
{
	s->v = g_array_new(FALSE, FALSE, sizeof(double));
	s->failed = 0;
}

static void samples_add(struct samples *s, double ns)
{
	g_array_append_val(s->v, ns);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile @p (0..100) in µs; -1 without samples. */
static double samples_pct_us(struct samples *s, double p)
{
	size_t n = s->v->len, k;

	if (!n)
		return -1;
	qsort(s->v->data, n, sizeof(double), cmp_double);
	k = (size_t)((p / 100.0) * (double)n + 0.999999);
	if (k < 1)
		k = 1;
	if (k > n)
		k = n;
	return g_array_index(s->v, double, k - 1) / 1000.0;
}

static void samples_free(struct samples *s)
{
	if (s->v)
		g_array_free(s->v, TRUE);
	s->v = NULL;
}

/* Engine YAML: named @name (NULL: its address), backend @b under namespace @ns. */
static char *bench_yaml(const struct bench *bn, int b, const char *name, const char *ns)
{
	g_autofree char *eng = name ? g_strdup_printf("engine: {name: \"%s\", listen: "
						      "\"127.0.0.1:0\"}\n",
						      name)
				    : g_strdup("engine: {listen: \"127.0.0.1:0\"}\n");
	g_autofree char *md = b == B_P2P ? g_strdup("metadata: {type: p2p}\n")
					 : g_strdup_printf("metadata:\n"
							   "  type: %s\n"
							   "  endpoints: [\"%s\"]\n"
							   "  namespace: \"%s\"\n"
							   "  ttl_s: 10\n",
							   bench_names[b], bn->url[b], ns);

	return g_strdup_printf("%s%stransports:\n  - name: tcp\n    required: true\n", eng, md);
}

static struct te_engine *bench_engine(const struct bench *bn, int b, const char *name,
				      const char *ns)
{
	g_autofree char *yaml = bench_yaml(bn, b, name, ns);
	struct te_engine_opts o = { .size = sizeof(o),
				    .config_yaml = yaml,
				    .config_yaml_len = strlen(yaml),
				    .config_name = "metadata_bench",
				    .log_level = TE_LOG_WARN };
	struct te_engine *e = NULL;
	enum te_status st = te_engine_new(&o, &e);

	if (st != TE_OK) {
		fprintf(stderr, "metadata_bench: %s engine %s: %s: %s\n", bench_names[b],
			name ? name : "(p2p)", te_status_str(st), te_last_error());
		return NULL;
	}
	return e;
}

/* ---- 1. open ---------------------------------------------------------------------- */

struct open_run {
	struct te_engine *initiator;
	struct samples open;  /* te_segment_open */
	struct samples start; /* te_engine_new of the peer */
};

static void open_sample(const struct bench *bn, int b, struct open_run *r, unsigned i)
{
	g_autofree char *name = g_strdup_printf("fresh-%u", i);
	g_autofree char *ns = g_strdup_printf("%s/open", bn->ns);
	g_autofree void *buf = g_malloc0(BENCH_BUF);
	struct te_engine *peer;
	te_segment_id id;
	enum te_status st;
	double t0, t1;

	t0 = now_ns();
	peer = bench_engine(bn, b, b == B_P2P ? NULL : name, ns);
	t1 = now_ns();
	if (!peer) {
		r->open.failed++;
		return;
	}
	samples_add(&r->start, t1 - t0);
	if (te_mem_register(peer, buf, BENCH_BUF, "cpu", TE_MEM_REMOTE) != TE_OK) {
		fprintf(stderr, "metadata_bench: te_mem_register: %s\n", te_last_error());
		r->open.failed++;
		te_engine_free(peer);
		return;
	}
	t0 = now_ns();
	st = te_segment_open(r->initiator, te_engine_name(peer), &id);
	t1 = now_ns();
	if (st != TE_OK) {
		if (r->open.failed++ < 3)
			fprintf(stderr, "metadata_bench: %s: te_segment_open %s: %s: %s\n",
				bench_names[b], te_engine_name(peer), te_status_str(st),
				te_last_error());
	} else {
		samples_add(&r->open, t1 - t0);
		if (te_segment_close(r->initiator, id) != TE_OK)
			fprintf(stderr, "metadata_bench: te_segment_close: %s\n", te_last_error());
	}
	if (te_mem_unregister(peer, buf) != TE_OK)
		fprintf(stderr, "metadata_bench: te_mem_unregister: %s\n", te_last_error());
	te_engine_free(peer);
}

static void bench_open(const struct bench *bn)
{
	struct open_run r[B_N] = { 0 };
	g_autofree char *ns = g_strdup_printf("%s/open", bn->ns);

	for (int b = 0; b < B_N; b++) {
		if (!bn->url[b])
			continue;
		samples_init(&r[b].open);
		samples_init(&r[b].start);
		r[b].initiator = bench_engine(bn, b, b == B_P2P ? NULL : "initiator", ns);
		if (!r[b].initiator)
			exit(1);
	}
	/* The backend that goes first changes every round (a server woken from idle first). */
	for (unsigned i = 0; i < bn->opens; i++)
		for (int k = 0; k < B_N; k++) {
			int b = (int)((i + (unsigned)k) % B_N);

			if (bn->url[b])
				open_sample(bn, b, &r[b], i);
		}
	if (!bn->json)
		printf("\n1. te_segment_open of a peer started just before (%u opens each; "
		       "nothing cached)\n%-6s %10s %10s %10s %8s %16s\n",
		       bn->opens, "meta", "p50_us", "p99_us", "max_us", "failed",
		       "peer_start_p50_us");
	for (int b = 0; b < B_N; b++) {
		if (!bn->url[b])
			continue;
		double p50 = samples_pct_us(&r[b].open, 50), p99 = samples_pct_us(&r[b].open, 99);
		double mx = samples_pct_us(&r[b].open, 100), s50 = samples_pct_us(&r[b].start, 50);

		if (bn->json)
			printf("{\"part\":\"open\",\"metadata\":\"%s\",\"opens\":%u,\"p50_us\":%.1f,"
			       "\"p99_us\":%.1f,\"max_us\":%.1f,\"failed\":%u,"
			       "\"peer_start_p50_us\":%.1f}\n",
			       bench_names[b], r[b].open.v->len, p50, p99, mx, r[b].open.failed,
			       s50);
		else
			printf("%-6s %10.1f %10.1f %10.1f %8u %16.1f\n", bench_names[b], p50, p99,
			       mx, r[b].open.failed, s50);
		te_engine_free(r[b].initiator);
		samples_free(&r[b].open);
		samples_free(&r[b].start);
	}
	fflush(stdout);
}

/* ---- 2. fetch at scale -------------------------------------------------------------- */

static const struct metadata_ops *bench_ops(int b)
{
	switch (b) {
#ifdef TE_HAVE_ETCD
	case B_ETCD:
		return &metadata_etcd_ops;
#endif
#ifdef TE_HAVE_REDIS
	case B_REDIS:
		return &metadata_redis_ops;
#endif
#ifdef TE_HAVE_HTTP
	case B_HTTP:
		return &metadata_http_ops;
#endif
	default:
		return NULL;
	}
}

/* A real engine's descriptor (one 1 MiB buffer), decoded: the template of the fakes. */
static struct descriptor *bench_template(const struct bench *bn)
{
	struct te_engine *e = bench_engine(bn, B_P2P, NULL, NULL);
	g_autofree char *err = NULL;
	struct descriptor *d = NULL;
	void *buf = g_malloc0(1u << 20);
	char *json = NULL;
	size_t len = 0;

	if (!e || te_mem_register(e, buf, 1u << 20, "cpu", TE_MEM_REMOTE) != TE_OK ||
	    te_segment_export(e, &json, &len) != TE_OK ||
	    descriptor_decode(json, len, &d, &err) != TE_OK) {
		fprintf(stderr, "metadata_bench: template descriptor: %s %s\n", te_last_error(),
			err ? err : "");
		exit(1);
	}
	te_free(json);
	if (te_mem_unregister(e, buf) != TE_OK)
		fprintf(stderr, "metadata_bench: te_mem_unregister: %s\n", te_last_error());
	te_engine_free(e);
	g_free(buf);
	return d;
}

struct store {
	const struct metadata_ops *ops;
	void *pub;  /* publisher: keeps the keys alive */
	void *read; /* reader: what is timed */
	struct metadata_params p;
	const char *eps[1];
	unsigned n;
	struct samples get;
	struct te_engine *initiator; /* an engine watching this namespace */
	struct samples start;	     /* te_engine_new of a peer in this namespace */
	struct samples open;	     /* te_segment_open of it from the initiator */
};

static void store_open(const struct bench *bn, int b, struct store *s, unsigned n,
		       struct descriptor *tpl)
{
	g_autofree char *err = NULL;
	double t0 = now_ns();

	s->ops = bench_ops(b);
	s->n = n;
	s->eps[0] = bn->url[b];
	s->p = (struct metadata_params){ .endpoints = s->eps,
					 .n_endpoints = 1,
					 .ns = g_strdup_printf("%s/scale%u", bn->ns, n),
					 .ttl_s = BENCH_PUB_TTL_S,
					 .timeout_ms = BENCH_TIMEOUT_MS };
	samples_init(&s->get);
	samples_init(&s->start);
	samples_init(&s->open);
	if (s->ops->open(&s->p, &s->pub, &err) != TE_OK ||
	    s->ops->open(&s->p, &s->read, &err) != TE_OK) {
		fprintf(stderr, "metadata_bench: %s open: %s\n", bench_names[b], err);
		exit(1);
	}
	for (unsigned i = 0; i < n; i++) {
		g_autofree char *json = NULL;
		size_t len = 0;

		g_free(tpl->name);
		tpl->name = g_strdup_printf("seg-%05u", i);
		tpl->generation = ((uint64_t)g_random_int() << 32) | g_random_int();
		json = descriptor_encode(tpl, &len);
		if (s->ops->publish(s->pub, tpl->name, json, len, &err) != TE_OK) {
			fprintf(stderr, "metadata_bench: %s publish %s: %s\n", bench_names[b],
				tpl->name, err);
			exit(1);
		}
	}
	if (!bn->json)
		fprintf(stderr, "metadata_bench: %s: %u segments published in %.2f s\n",
			bench_names[b], n, (now_ns() - t0) / 1e9);
	s->initiator = bench_engine(bn, b, "initiator", s->p.ns);
	if (!s->initiator)
		exit(1);
}

/* A peer started in @s's namespace (timed: its watch start resyncs the namespace), opened. */
static void store_start_sample(const struct bench *bn, int b, struct store *s, unsigned i)
{
	g_autofree char *name = g_strdup_printf("fresh-%u", i);
	g_autofree void *buf = g_malloc0(BENCH_BUF);
	struct te_engine *peer;
	te_segment_id id;
	double t0, t1;

	t0 = now_ns();
	peer = bench_engine(bn, b, name, s->p.ns);
	t1 = now_ns();
	if (!peer) {
		s->start.failed++;
		return;
	}
	samples_add(&s->start, t1 - t0);
	if (te_mem_register(peer, buf, BENCH_BUF, "cpu", TE_MEM_REMOTE) != TE_OK) {
		fprintf(stderr, "metadata_bench: te_mem_register: %s\n", te_last_error());
		s->open.failed++;
		te_engine_free(peer);
		return;
	}
	t0 = now_ns();
	if (te_segment_open(s->initiator, name, &id) == TE_OK) {
		samples_add(&s->open, now_ns() - t0);
		if (te_segment_close(s->initiator, id) != TE_OK)
			fprintf(stderr, "metadata_bench: te_segment_close: %s\n", te_last_error());
	} else if (s->open.failed++ < 3) {
		fprintf(stderr, "metadata_bench: %s: te_segment_open %s: %s\n", bench_names[b],
			name, te_last_error());
	}
	if (te_mem_unregister(peer, buf) != TE_OK)
		fprintf(stderr, "metadata_bench: te_mem_unregister: %s\n", te_last_error());
	te_engine_free(peer);
}

static void store_sample(struct store *s, int b)
{
	g_autofree char *name = g_strdup_printf("seg-%05u", g_random_int_range(0, (int)s->n));
	g_autofree char *err = NULL;
	struct descriptor *d = NULL;
	GBytes *json = NULL;
	enum te_status st;
	const char *data;
	gsize len;
	double t0 = now_ns();

	st = s->ops->get(s->read, name, BENCH_TIMEOUT_MS, &json, &err);
	if (st == TE_OK) {
		data = g_bytes_get_data(json, &len);
		st = descriptor_decode(data, len, &d, &err);
	}
	if (st == TE_OK)
		samples_add(&s->get, now_ns() - t0);
	else if (s->get.failed++ < 3)
		fprintf(stderr, "metadata_bench: %s get %s: %s\n", bench_names[b], name, err);
	descriptor_free(d);
	if (json)
		g_bytes_unref(json);
}

static void store_close(struct store *s)
{
	g_autofree char *err = NULL;

	for (unsigned i = 0; i < s->n; i++) {
		g_autofree char *name = g_strdup_printf("seg-%05u", i);

		g_clear_pointer(&err, g_free);
		if (s->ops->withdraw(s->pub, name, &err) != TE_OK && i == 0)
			fprintf(stderr, "metadata_bench: withdraw %s: %s\n", name, err);
	}
	te_engine_free(s->initiator);
	s->ops->close(s->read);
	s->ops->close(s->pub);
	g_free((char *)s->p.ns);
	samples_free(&s->get);
	samples_free(&s->start);
	samples_free(&s->open);
}

static void bench_fetch(const struct bench *bn)
{
	struct store st[B_N][2];
	struct descriptor *tpl = bench_template(bn);
	bool any = false;

	memset(st, 0, sizeof(st));
	for (int b = B_ETCD; b < B_N; b++) {
		if (!bn->url[b])
			continue;
		if (!bench_ops(b)) {
			fprintf(stderr, "metadata_bench: %s is not built in; skipped\n",
				bench_names[b]);
			continue;
		}
		store_open(bn, b, &st[b][0], bn->small, tpl);
		store_open(bn, b, &st[b][1], bn->segments, tpl);
		any = true;
	}
	descriptor_free(tpl);
	if (!any)
		return;
	/* Which size goes first alternates: the first get of a round may find the server idle. */
	for (unsigned i = 0; i < bn->fetches; i++)
		for (int b = B_ETCD; b < B_N; b++)
			for (int k = 0; k < 2; k++)
				if (st[b][k].ops)
					store_sample(&st[b][k ^ (int)(i & 1)], b);
	if (!bn->json)
		printf("\n2. get + decode of one descriptor among %u vs %u published (%u each)\n"
		       "%-6s %9s %9s %9s %9s %9s %9s\n",
		       bn->segments, bn->small, bn->fetches, "meta", "p50_10", "p99_10", "p50_1k",
		       "p99_1k", "p50_x", "p99_x");
	for (int b = B_ETCD; b < B_N; b++) {
		if (!st[b][0].ops)
			continue;
		double a50 = samples_pct_us(&st[b][0].get, 50),
		       a99 = samples_pct_us(&st[b][0].get, 99);
		double k50 = samples_pct_us(&st[b][1].get, 50),
		       k99 = samples_pct_us(&st[b][1].get, 99);

		if (bn->json)
			printf("{\"part\":\"fetch\",\"metadata\":\"%s\",\"small\":%u,\"segments\":%u,"
			       "\"fetches\":%u,\"p50_us_small\":%.1f,\"p99_us_small\":%.1f,"
			       "\"p50_us_large\":%.1f,\"p99_us_large\":%.1f,\"p50_ratio\":%.2f,"
			       "\"p99_ratio\":%.2f,\"failed\":%u}\n",
			       bench_names[b], bn->small, bn->segments, bn->fetches, a50, a99, k50,
			       k99, k50 / a50, k99 / a99,
			       st[b][0].get.failed + st[b][1].get.failed);
		else
			printf("%-6s %9.1f %9.1f %9.1f %9.1f %8.2fx %8.2fx%s\n", bench_names[b],
			       a50, a99, k50, k99, k50 / a50, k99 / a99,
			       st[b][0].get.failed + st[b][1].get.failed ? "  (failures)" : "");
	}
	for (unsigned i = 0; i < bn->starts; i++)
		for (int b = B_ETCD; b < B_N; b++)
			for (int k = 0; k < 2; k++)
				if (st[b][k].ops)
					store_start_sample(bn, b, &st[b][k ^ (int)(i & 1)], i);
	if (!bn->json)
		printf("\n2b. te_engine_new of a peer in the namespace of %u vs %u (it publishes and "
		       "its watch resyncs the namespace), then te_segment_open of it (%u each)\n"
		       "%-6s %9s %9s %9s %9s %7s %7s %9s %9s %7s %7s\n",
		       bn->segments, bn->small, bn->starts, "meta", "start50", "start99",
		       "start50k", "start99k", "x50", "x99", "open50", "open50k", "x50", "x99");
	for (int b = B_ETCD; b < B_N; b++) {
		struct store *a = &st[b][0], *k = &st[b][1];

		if (!a->ops)
			continue;
		double s50 = samples_pct_us(&a->start, 50), s99 = samples_pct_us(&a->start, 99);
		double l50 = samples_pct_us(&k->start, 50), l99 = samples_pct_us(&k->start, 99);
		double o50 = samples_pct_us(&a->open, 50), o99 = samples_pct_us(&a->open, 99);
		double m50 = samples_pct_us(&k->open, 50), m99 = samples_pct_us(&k->open, 99);
		unsigned failed =
			a->start.failed + k->start.failed + a->open.failed + k->open.failed;

		if (bn->json)
			printf("{\"part\":\"start-open\",\"metadata\":\"%s\",\"small\":%u,"
			       "\"segments\":%u,\"starts\":%u,\"start_p50_us_small\":%.1f,"
			       "\"start_p99_us_small\":%.1f,\"start_p50_us_large\":%.1f,"
			       "\"start_p99_us_large\":%.1f,\"open_p50_us_small\":%.1f,"
			       "\"open_p99_us_small\":%.1f,\"open_p50_us_large\":%.1f,"
			       "\"open_p99_us_large\":%.1f,\"failed\":%u}\n",
			       bench_names[b], bn->small, bn->segments, bn->starts, s50, s99, l50,
			       l99, o50, o99, m50, m99, failed);
		else
			printf("%-6s %9.1f %9.1f %9.1f %9.1f %6.2fx %6.2fx %9.1f %9.1f %6.2fx "
			       "%6.2fx%s\n",
			       bench_names[b], s50, s99, l50, l99, l50 / s50, l99 / s99, o50, m50,
			       m50 / o50, m99 / o99, failed ? "  (failures)" : "");
		store_close(a);
		store_close(k);
	}
	fflush(stdout);
}

/* ---- 3. restart seen by watchers ---------------------------------------------------- */

struct watch_run {
	struct te_engine *target;
	struct te_engine **w;
	te_segment_id *id;
	double *seen; /* per watcher: when its view left the old generation; <0: not yet */
	struct samples all_call; /* every watcher, from te_engine_new's call */
	struct samples all_ret;	 /* every watcher, from te_engine_new's return (<0: before) */
	struct samples each;	 /* each watcher, from the call */
	struct samples start;	 /* te_engine_new of the target */
	unsigned timeouts;
	unsigned early; /* restarts where every watcher had it before te_engine_new returned */
};

/* The generation watcher @i's view of the target holds (0: none). */
static uint64_t watch_generation(struct watch_run *r, unsigned i)
{
	struct engine *e = (struct engine *)r->w[i];
	struct segment *s;
	uint64_t gen = 0;

	segment_read_lock(e);
	s = segment_get_locked(e, r->id[i]);
	if (s && s->view && s->view->desc)
		gen = s->view->desc->generation;
	segment_read_unlock(e);
	return gen;
}

static void watch_setup(const struct bench *bn, int b, struct watch_run *r)
{
	g_autofree char *ns = g_strdup_printf("%s/watch", bn->ns);

	r->target = bench_engine(bn, b, "watched", ns);
	if (!r->target)
		exit(1);
	r->w = g_new0(struct te_engine *, bn->watchers);
	r->id = g_new0(te_segment_id, bn->watchers);
	r->seen = g_new0(double, bn->watchers);
	samples_init(&r->all_call);
	samples_init(&r->all_ret);
	samples_init(&r->each);
	samples_init(&r->start);
	for (unsigned i = 0; i < bn->watchers; i++) {
		g_autofree char *name = g_strdup_printf("watcher-%02u", i);

		r->w[i] = bench_engine(bn, b, name, ns);
		if (!r->w[i])
			exit(1);
		if (te_segment_open(r->w[i], "watched", &r->id[i]) != TE_OK) {
			fprintf(stderr, "metadata_bench: %s: watcher %u: te_segment_open: %s\n",
				bench_names[b], i, te_last_error());
			exit(1);
		}
	}
}

/* Polls every watcher from before the new target starts until all moved off @old. */
struct watch_poll {
	struct watch_run *r;
	unsigned n;
	uint64_t old;
	double deadline;
	unsigned left;
};

static gpointer watch_poll_main(gpointer data)
{
	struct watch_poll *wp = data;

	while (wp->left) {
		double t = now_ns();

		for (unsigned i = 0; i < wp->n; i++) {
			uint64_t g;

			if (wp->r->seen[i] >= 0)
				continue;
			g = watch_generation(wp->r, i);
			if (g == wp->old || g == 0)
				continue;
			wp->r->seen[i] = t;
			wp->left--;
		}
		if (!wp->left || t > wp->deadline)
			break;
		g_usleep(50);
	}
	return NULL;
}

static void watch_restart(const struct bench *bn, int b, struct watch_run *r)
{
	g_autofree char *ns = g_strdup_printf("%s/watch", bn->ns);
	struct watch_poll wp = { .r = r, .n = bn->watchers, .left = bn->watchers };
	double t_call, t_ret, last = 0;
	GThread *poller;
	uint64_t gen;

	wp.old = ((struct engine *)r->target)->generation;
	te_engine_free(r->target);
	r->target = NULL;
	g_usleep(200 * 1000); /* the old one's withdrawal reaches the watchers first */
	for (unsigned i = 0; i < bn->watchers; i++)
		r->seen[i] = -1;
	t_call = now_ns();
	wp.deadline = t_call + (double)BENCH_WATCH_LIMIT_NS;
	poller = g_thread_new("watch-poll", watch_poll_main, &wp);
	r->target = bench_engine(bn, b, "watched", ns);
	t_ret = now_ns();
	if (!r->target)
		exit(1);
	g_thread_join(poller);
	gen = ((struct engine *)r->target)->generation;
	samples_add(&r->start, t_ret - t_call);
	if (wp.left) {
		fprintf(stderr,
			"metadata_bench: %s: %u of %u watchers still lack generation %" PRIu64
			" after %.0f s\n",
			bench_names[b], wp.left, bn->watchers, gen, BENCH_WATCH_LIMIT_NS / 1e9);
		r->timeouts++;
		return;
	}
	for (unsigned i = 0; i < bn->watchers; i++) {
		if (watch_generation(r, i) != gen)
			fprintf(stderr,
				"metadata_bench: %s: watcher %u holds generation %" PRIu64
				", not the new %" PRIu64 "\n",
				bench_names[b], i, watch_generation(r, i), gen);
		samples_add(&r->each, r->seen[i] - t_call);
		if (r->seen[i] > last)
			last = r->seen[i];
	}
	samples_add(&r->all_call, last - t_call);
	samples_add(&r->all_ret, last - t_ret);
	r->early += last < t_ret;
}

static void watch_teardown(const struct bench *bn, struct watch_run *r)
{
	for (unsigned i = 0; i < bn->watchers; i++) {
		if (te_segment_close(r->w[i], r->id[i]) != TE_OK)
			fprintf(stderr, "metadata_bench: te_segment_close: %s\n", te_last_error());
		te_engine_free(r->w[i]);
	}
	te_engine_free(r->target);
	g_free(r->w);
	g_free(r->id);
	g_free(r->seen);
	samples_free(&r->all_ret);
	samples_free(&r->all_call);
	samples_free(&r->each);
	samples_free(&r->start);
}

static void bench_watch(const struct bench *bn)
{
	struct watch_run r[B_N];
	bool any = false;

	memset(r, 0, sizeof(r));
	for (int b = B_ETCD; b <= B_REDIS; b++) {
		if (!bn->url[b] || !bench_ops(b))
			continue;
		watch_setup(bn, b, &r[b]);
		any = true;
	}
	if (!any)
		return;
	for (unsigned k = 0; k < bn->restarts; k++)
		for (int b = B_ETCD; b <= B_REDIS; b++)
			if (r[b].w)
				watch_restart(bn, b, &r[b]);
	if (!bn->json)
		printf("\n3. a restart seen by %u watching engines (%u restarts): ms from the new "
		       "target's te_engine_new call (it publishes inside) until each / every "
		       "watcher's view holds the new generation\n%-6s %10s %10s %10s %10s %10s "
		       "%8s %8s\n",
		       bn->watchers, bn->restarts, "meta", "start_p50", "each_p50", "all_p50",
		       "all_max", "all-ret", "early", "timeout");
	for (int b = B_ETCD; b <= B_REDIS; b++) {
		if (!r[b].w)
			continue;
		double s50 = samples_pct_us(&r[b].start, 50) / 1000;
		double e50 = samples_pct_us(&r[b].each, 50) / 1000;
		double a50 = samples_pct_us(&r[b].all_call, 50) / 1000;
		double amx = samples_pct_us(&r[b].all_call, 100) / 1000;
		double rmx = samples_pct_us(&r[b].all_ret, 100) / 1000;

		if (bn->json)
			printf("{\"part\":\"watch\",\"metadata\":\"%s\",\"watchers\":%u,"
			       "\"restarts\":%u,\"start_p50_ms\":%.2f,\"each_p50_ms\":%.2f,"
			       "\"all_p50_ms\":%.2f,\"all_max_ms\":%.2f,"
			       "\"all_max_after_return_ms\":%.2f,\"early\":%u,\"timeouts\":%u}\n",
			       bench_names[b], bn->watchers, bn->restarts, s50, e50, a50, amx, rmx,
			       r[b].early, r[b].timeouts);
		else
			printf("%-6s %10.2f %10.2f %10.2f %10.2f %10.2f %8u %8u\n", bench_names[b],
			       s50, e50, a50, amx, rmx, r[b].early, r[b].timeouts);
		watch_teardown(bn, &r[b]);
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct bench bn = { .opens = 200,
			    .fetches = 1000,
			    .segments = 1000,
			    .small = 10,
			    .watchers = 50,
			    .restarts = 20,
			    .starts = 100 };
	g_autofree char *etcd = NULL, *redis = NULL, *http = NULL, *parts = NULL;
	int opens = 200, fetches = 1000, segments = 1000, small = 10, watchers = 50, restarts = 20;
	int starts = 100;
	GOptionEntry entries[] = {
		{ "etcd", 0, 0, G_OPTION_ARG_STRING, &etcd, "etcd endpoint", "URL" },
		{ "redis", 0, 0, G_OPTION_ARG_STRING, &redis, "redis endpoint", "URL" },
		{ "http", 0, 0, G_OPTION_ARG_STRING, &http, "http store endpoint", "URL" },
		{ "opens", 0, 0, G_OPTION_ARG_INT, &opens, "opens per backend (200)", "N" },
		{ "fetches", 0, 0, G_OPTION_ARG_INT, &fetches, "gets per backend and size (1000)",
		  "N" },
		{ "segments", 0, 0, G_OPTION_ARG_INT, &segments, "large namespace (1000)", "N" },
		{ "small", 0, 0, G_OPTION_ARG_INT, &small, "small namespace (10)", "N" },
		{ "watchers", 0, 0, G_OPTION_ARG_INT, &watchers, "watching engines (50)", "N" },
		{ "restarts", 0, 0, G_OPTION_ARG_INT, &restarts, "restarts per backend (20)", "N" },
		{ "starts", 0, 0, G_OPTION_ARG_INT, &starts,
		  "peer starts per backend and namespace (100)", "N" },
		{ "parts", 0, 0, G_OPTION_ARG_STRING, &parts, "open,fetch,watch (all)", "LIST" },
		{ "json", 0, 0, G_OPTION_ARG_NONE, &bn.json, "one JSON object per row", NULL },
		{ NULL, 0, 0, 0, NULL, NULL, NULL }
	};
	g_autoptr(GOptionContext) ctx = g_option_context_new("- metadata backend benchmark");
	g_autoptr(GError) error = NULL;

	g_option_context_add_main_entries(ctx, entries, NULL);
	if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
		fprintf(stderr, "metadata_bench: %s\n", error->message);
		return 2;
	}
	if (opens < 1 || fetches < 1 || segments < 1 || small < 1 || watchers < 1 || restarts < 1 ||
	    starts < 1 || segments > 100000 || watchers > 1000) {
		fprintf(stderr, "metadata_bench: counts must be positive (segments <= 100000, "
				"watchers <= 1000)\n");
		return 2;
	}
	bn.opens = (unsigned)opens;
	bn.fetches = (unsigned)fetches;
	bn.segments = (unsigned)segments;
	bn.small = (unsigned)small;
	bn.watchers = (unsigned)watchers;
	bn.restarts = (unsigned)restarts;
	bn.starts = (unsigned)starts;
	bn.url[B_P2P] = "";
	bn.url[B_ETCD] = etcd;
	bn.url[B_REDIS] = redis;
	bn.url[B_HTTP] = http;
	for (int b = B_ETCD; b < B_N; b++)
		if (bn.url[b] && !bench_ops(b)) {
			fprintf(stderr, "metadata_bench: %s is not built in this tree; skipped\n",
				bench_names[b]);
			bn.url[b] = NULL;
		}
	bn.ns = g_strdup_printf("/te-bench-%d", (int)getpid());
	if (!parts || strstr(parts, "open"))
		bench_open(&bn);
	if (!parts || strstr(parts, "fetch"))
		bench_fetch(&bn);
	if (!parts || strstr(parts, "watch"))
		bench_watch(&bn);
	g_free(bn.ns);
	return 0;
}
