/* SPDX-License-Identifier: Apache-2.0 */
/* config_test.c: unit tests of the YAML configuration parser (core/config.c). */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "core/config.h"
#include "te/te.h"

/* A heap copy of exactly @len bytes, no NUL after it (glib >= 2.66 lacks g_memdup2). */
static char *dup_exact(const char *buf, size_t len)
{
	char *p = g_malloc(len ? len : 1);

	memcpy(p, buf, len);
	return p;
}

/* Parse @yaml (NUL-terminated) as "t.yaml"; the test fails with the message on error. */
static struct config *parse_ok(const char *yaml)
{
	struct config *cfg = NULL;
	char *err = NULL;
	enum te_status st = config_parse(yaml, strlen(yaml), "t.yaml", &cfg, &err);

	if (st != TE_OK)
		g_error("unexpected failure %d for:\n%s\n%s", st, yaml, err);
	g_assert_null(err);
	g_assert_nonnull(cfg);
	return cfg;
}

/* Parse @yaml as "t.yaml" and expect TE_ERR_CONFIG with exactly @expected. */
static void expect_err_len(const char *yaml, size_t len, const char *expected)
{
	struct config *cfg = (struct config *)(uintptr_t)0x1;
	g_autofree char *err = NULL;
	enum te_status st = config_parse(yaml, len, "t.yaml", &cfg, &err);

	g_assert_cmpint(st, ==, TE_ERR_CONFIG);
	/* Outputs are untouched on failure. */
	g_assert_true(cfg == (struct config *)(uintptr_t)0x1);
	g_assert_cmpstr(err, ==, expected);
}

static void expect_err(const char *yaml, const char *expected)
{
	expect_err_len(yaml, strlen(yaml), expected);
}

static void assert_defaults_except_transports(const struct config *c)
{
	g_assert_null(c->name);
	g_assert_cmpstr(c->listen, ==, "127.0.0.1:0");
	g_assert_cmpint(c->metadata_type, ==, CONFIG_METADATA_P2P);
	g_assert_cmpuint(c->n_metadata_endpoints, ==, 0);
	g_assert_cmpstr(c->metadata_namespace, ==, "/te");
	g_assert_cmpuint(c->metadata_ttl_s, ==, 10);
	g_assert_cmpuint(c->slice_size, ==, 0);
	g_assert_cmpuint(c->max_slices_per_task, ==, 4096);
	g_assert_cmpuint(c->retries, ==, 3);
	g_assert_cmpuint(c->retry_backoff_us, ==, 100);
	g_assert_cmpuint(c->retry_backoff_max_us, ==, 100000);
	g_assert_cmpuint(c->timeout_ms, ==, 30000);
	g_assert_cmpuint(c->quarantine_ms, ==, 1000);
	g_assert_cmpuint(c->quarantine_after, ==, 3);
	g_assert_cmpuint(c->worker_threads, ==, 1);
	g_assert_cmpuint(c->max_pollers, ==, 0);
	g_assert_cmpuint(c->max_batches, ==, 1024);
	g_assert_cmpuint(c->max_batch_size, ==, 65536);
	g_assert_false(c->fallback);
	g_assert_cmpint(c->log_level, ==, TE_LOG_WARN);
	g_assert_null(c->auth_secret);
	g_assert_null(c->auth_secret_file);
	g_assert_cmpuint(c->control_max_connections, ==, 1024);
	g_assert_cmpuint(c->control_max_connections_per_host, ==, 128);
	g_assert_cmpuint(c->control_max_unauthenticated, ==, 256);
	g_assert_cmpuint(c->control_auth_timeout_ms, ==, 5000);
	g_assert_cmpuint(c->control_idle_timeout_ms, ==, 10000);
	g_assert_cmpuint(c->control_frame_timeout_ms, ==, 10000);
	g_assert_cmpuint(c->control_max_frame, ==, 16u << 20);
	g_assert_cmpuint(c->control_max_buffered, ==, 64u << 20);
	g_assert_cmpuint(c->control_notify_inbox, ==, 65536);
	g_assert_cmpuint(c->control_notify_per_sender, ==, 1024);
	g_assert_cmpuint(c->control_notify_per_host, ==, 8192);
}

static void assert_defaults(const struct config *c)
{
	assert_defaults_except_transports(c);
	g_assert_cmpuint(c->n_transports, ==, 1);
	g_assert_cmpstr(c->transports[0].name, ==, "tcp");
	g_assert_null(c->transports[0].path);
	g_assert_true(c->transports[0].required);
	g_assert_cmpuint(c->transports[0].n_options, ==, 0);
}

/* config_to_yaml output must parse back to the same output. */
static void assert_round_trip(const struct config *c)
{
	g_autofree char *y1 = config_to_yaml(c);
	g_autofree char *y2 = NULL;
	struct config *again = parse_ok(y1);

	y2 = config_to_yaml(again);
	g_assert_cmpstr(y1, ==, y2);
	config_free(again);
}

/* --- defaults ----------------------------------------------------------------- */

static void test_defaults_empty(void)
{
	static const char *const empties[] = {
		"",
		"\n",
		"# just a comment\n",
		"---\n",
		"---\n...\n",
		"~\n",
		"null\n",
		"engine:\n",
		"engine: ~\n",
		"transfer: null\n",
		"log: {}\n",
		"auth:\n",
		"transports:\n",
		"{}\n",
		"%YAML 1.1\n---\n",
		"\xef\xbb\xbf" /* BOM */,
	};
	struct config *c = NULL;
	char *err = NULL;

	for (size_t i = 0; i < G_N_ELEMENTS(empties); i++) {
		c = parse_ok(empties[i]);
		assert_defaults(c);
		config_free(c);
	}
	/* A NULL buffer of length 0 is an empty document. */
	g_assert_cmpint(config_parse(NULL, 0, "t.yaml", &c, &err), ==, TE_OK);
	assert_defaults(c);
	config_free(c);
}

static void test_default_yaml(void)
{
	struct config *c = parse_ok(config_default_yaml);

	assert_defaults(c);
	assert_round_trip(c);
	config_free(c);
}

static void test_null_keeps_default(void)
{
	struct config *c = parse_ok("engine:\n  name: ~\n  listen: null\n"
				    "transfer:\n  retries:\n  fallback: NULL\n"
				    "metadata:\n  endpoints: Null\n");

	assert_defaults(c);
	config_free(c);
	/* Quoted "null" is a string, not null. */
	c = parse_ok("engine:\n  name: \"null\"\n");
	g_assert_cmpstr(c->name, ==, "null");
	config_free(c);
}

/* --- keys --------------------------------------------------------------------- */

static void test_engine(void)
{
	static const char *const good[] = {
		"127.0.0.1:0",		 "[::1]:0",   "[fe80::1%eth0]:7000", "localhost:65535",
		"node-1.example.com:80", "0.0.0.0:1",
	};
	static const char *const bad[] = {
		"",	  "::1:0", "host",   "host:",	":80",	   "host:65536", "host:123456",
		"[::1]0", "[]:1",  "[::1:0", "ho st:1", "host:+1", "host:-1",	 "host:8x",
	};
	struct config *c = parse_ok("engine:\n  name: node-a\n  listen: \"10.0.0.1:7000\"\n");

	g_assert_cmpstr(c->name, ==, "node-a");
	g_assert_cmpstr(c->listen, ==, "10.0.0.1:7000");
	config_free(c);

	for (size_t i = 0; i < G_N_ELEMENTS(good); i++) {
		g_autofree char *y = g_strdup_printf("engine: {listen: \"%s\"}\n", good[i]);

		c = parse_ok(y);
		g_assert_cmpstr(c->listen, ==, good[i]);
		config_free(c);
	}
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *y = g_strdup_printf("engine:\n  listen: \"%s\"\n", bad[i]);
		g_autofree char *e = NULL;

		if (!*bad[i])
			e = g_strdup("t.yaml:2:11: engine.listen: must not be empty");
		else
			e = g_strdup_printf("t.yaml:2:11: engine.listen: invalid address \"%s\" "
					    "(expected host:port, IPv6 as [::1]:port)",
					    bad[i]);
		expect_err(y, e);
	}
	expect_err(
		"engine:\n  name: \"a b\"\n",
		"t.yaml:2:9: engine.name: \"a b\" must not contain blanks or control characters");
	expect_err("engine:\n  name: ''\n", "t.yaml:2:9: engine.name: must not be empty");
}

static void test_metadata(void)
{
	static const struct {
		const char *text;
		enum config_metadata_type type;
	} types[] = {
		{ "p2p", CONFIG_METADATA_P2P },
		{ "etcd", CONFIG_METADATA_ETCD },
		{ "redis", CONFIG_METADATA_REDIS },
		{ "http", CONFIG_METADATA_HTTP },
	};
	struct config *c;

	for (size_t i = 0; i < G_N_ELEMENTS(types); i++) {
		g_autofree char *y = g_strdup_printf(
			"metadata:\n  type: %s\n  endpoints: [\"a:1\", b:2]\n  namespace: /x/y\n"
			"  ttl_s: 3600\n",
			types[i].text);

		c = parse_ok(y);
		g_assert_cmpint(c->metadata_type, ==, types[i].type);
		g_assert_cmpuint(c->n_metadata_endpoints, ==, 2);
		g_assert_cmpstr(c->metadata_endpoints[0], ==, "a:1");
		g_assert_cmpstr(c->metadata_endpoints[1], ==, "b:2");
		g_assert_cmpstr(c->metadata_namespace, ==, "/x/y");
		g_assert_cmpuint(c->metadata_ttl_s, ==, 3600);
		assert_round_trip(c);
		config_free(c);
	}
	/* A single string is one endpoint. */
	c = parse_ok("metadata:\n  type: http\n  endpoints: http://meta:8080/te\n");
	g_assert_cmpuint(c->n_metadata_endpoints, ==, 1);
	g_assert_cmpstr(c->metadata_endpoints[0], ==, "http://meta:8080/te");
	config_free(c);
	/* p2p needs none; an empty list is fine. */
	c = parse_ok("metadata:\n  endpoints: []\n  ttl_s: 1\n");
	g_assert_cmpuint(c->n_metadata_endpoints, ==, 0);
	g_assert_cmpuint(c->metadata_ttl_s, ==, 1);
	config_free(c);
	/* Eight endpoints are the limit. */
	c = parse_ok("metadata: {type: etcd, endpoints: [a, b, c, d, e, f, g, h]}\n");
	g_assert_cmpuint(c->n_metadata_endpoints, ==, CONFIG_MAX_ENDPOINTS);
	g_assert_cmpstr(c->metadata_endpoints[7], ==, "h");
	config_free(c);

	expect_err("metadata: {type: etcd, endpoints: [a, b, c, d, e, f, g, h, i]}\n",
		   "t.yaml:1:60: metadata.endpoints: more than 8 endpoints");
	expect_err("metadata:\n  type: zookeeper\n",
		   "t.yaml:2:9: metadata.type: expected one of: p2p, etcd, redis, http, got "
		   "\"zookeeper\"");
	expect_err("metadata:\n  type: ETCD\n",
		   "t.yaml:2:9: metadata.type: expected one of: p2p, etcd, redis, http, got "
		   "\"ETCD\"");
	expect_err(
		"metadata:\n  type: etcd\n",
		"t.yaml:2:9: metadata.endpoints: metadata type etcd needs at least one endpoint");
	expect_err("metadata:\n  type: redis\n  endpoints: []\n",
		   "t.yaml:2:9: metadata.endpoints: metadata type redis needs at least one "
		   "endpoint");
	expect_err("metadata:\n  endpoints: [a, \"\"]\n",
		   "t.yaml:2:18: metadata.endpoints[1]: must not be empty");
	expect_err("metadata:\n  endpoints: [a, ~]\n",
		   "t.yaml:2:18: metadata.endpoints[1]: expected a string, got null");
	expect_err("metadata:\n  endpoints: [a, [b]]\n",
		   "t.yaml:2:18: metadata.endpoints[1]: expected a string, got a sequence");
	expect_err("metadata:\n  endpoints: {a: b}\n",
		   "t.yaml:2:14: metadata.endpoints: expected a sequence of strings or a string, "
		   "got a mapping");
	expect_err("metadata:\n  ttl_s: 0\n",
		   "t.yaml:2:10: metadata.ttl_s: value 0 out of range 1..3600");
	expect_err("metadata:\n  ttl_s: 3601\n",
		   "t.yaml:2:10: metadata.ttl_s: value 3601 out of range 1..3600");
	expect_err("metadata:\n  namespace: \"\"\n",
		   "t.yaml:2:14: metadata.namespace: must not be empty");
}

/* Every ranged integer of transfer: min and max pass, one beyond fails. */
static void test_transfer_ranges(void)
{
	static const struct {
		const char *key;
		uint64_t min, max;
		size_t off;
		bool is64;
	} keys[] = {
		{ "max_slices_per_task", 1, 1048576, offsetof(struct config, max_slices_per_task),
		  false },
		{ "retries", 0, 100, offsetof(struct config, retries), false },
		{ "retry_backoff_us", 0, 10000000, offsetof(struct config, retry_backoff_us),
		  true },
		{ "retry_backoff_max_us", 0, 10000000,
		  offsetof(struct config, retry_backoff_max_us), true },
		{ "timeout_ms", 1, 86400000, offsetof(struct config, timeout_ms), true },
		{ "quarantine_ms", 0, 3600000, offsetof(struct config, quarantine_ms), true },
		{ "quarantine_after", 1, 1000, offsetof(struct config, quarantine_after), false },
		{ "worker_threads", 1, 64, offsetof(struct config, worker_threads), false },
		{ "max_pollers", 0, 1024, offsetof(struct config, max_pollers), false },
		{ "max_batches", 1, 1048576, offsetof(struct config, max_batches), false },
		{ "max_batch_size", 1, 16777216, offsetof(struct config, max_batch_size), false },
	};

	for (size_t i = 0; i < G_N_ELEMENTS(keys); i++) {
		uint64_t vals[2] = { keys[i].min, keys[i].max };
		unsigned col = (unsigned)strlen(keys[i].key) + 5;

		for (size_t j = 0; j < 2; j++) {
			/* Keep the backoff pair consistent so only the range is tested. */
			g_autofree char *y = g_strdup_printf(
				"transfer:\n  %s: %" PRIu64 "\n  %s: %" PRIu64 "\n", keys[i].key,
				vals[j],
				!strcmp(keys[i].key, "retry_backoff_max_us") ? "retry_backoff_us"
									     : "retries",
				!strcmp(keys[i].key, "retry_backoff_max_us") ? 0 : (uint64_t)3);
			struct config *c;
			uint64_t got;

			if (!strcmp(keys[i].key, "retries"))
				continue;
			c = parse_ok(y);
			if (keys[i].is64)
				got = *(uint64_t *)((char *)c + keys[i].off);
			else
				got = *(uint32_t *)((char *)c + keys[i].off);
			g_assert_cmpuint(got, ==, vals[j]);
			config_free(c);
		}
		{
			g_autofree char *y = g_strdup_printf("transfer:\n  %s: %" PRIu64 "\n",
							     keys[i].key, keys[i].max + 1);
			g_autofree char *e = g_strdup_printf(
				"t.yaml:2:%u: transfer.%s: value %" PRIu64 " out of range %" PRIu64
				"..%" PRIu64,
				col, keys[i].key, keys[i].max + 1, keys[i].min, keys[i].max);

			expect_err(y, e);
		}
		{
			g_autofree char *y = NULL, *e = NULL;

			if (keys[i].min == 0) {
				y = g_strdup_printf("transfer:\n  %s: -1\n", keys[i].key);
				e = g_strdup_printf(
					"t.yaml:2:%u: transfer.%s: value -1 out of range "
					"0..%" PRIu64,
					col, keys[i].key, keys[i].max);
			} else {
				y = g_strdup_printf("transfer:\n  %s: %" PRIu64 "\n", keys[i].key,
						    keys[i].min - 1);
				e = g_strdup_printf("t.yaml:2:%u: transfer.%s: value %" PRIu64
						    " out of range %" PRIu64 "..%" PRIu64,
						    col, keys[i].key, keys[i].min - 1, keys[i].min,
						    keys[i].max);
			}
			expect_err(y, e);
		}
		{
			g_autofree char *y =
				g_strdup_printf("transfer:\n  %s: 12abc\n", keys[i].key);
			g_autofree char *e = g_strdup_printf(
				"t.yaml:2:%u: transfer.%s: expected an integer, got \"12abc\"", col,
				keys[i].key);

			expect_err(y, e);
		}
	}
	/* retries has its own check: 0 and 100 pass. */
	for (unsigned v = 0; v <= 100; v += 100) {
		g_autofree char *y = g_strdup_printf("transfer:\n  retries: %u\n", v);
		struct config *c = parse_ok(y);

		g_assert_cmpuint(c->retries, ==, v);
		config_free(c);
	}
}

static void test_transfer_all_keys(void)
{
	struct config *c = parse_ok("transfer:\n"
				    "  slice_size: 1M\n"
				    "  max_slices_per_task: 8192\n"
				    "  retries: 5\n"
				    "  retry_backoff_us: 200\n"
				    "  retry_backoff_max_us: 300000\n"
				    "  timeout_ms: 60000\n"
				    "  quarantine_ms: 0\n"
				    "  quarantine_after: 7\n"
				    "  worker_threads: 64\n"
				    "  max_pollers: 3\n"
				    "  max_batches: 8\n"
				    "  max_batch_size: 16777216\n"
				    "  fallback: true\n");

	g_assert_cmpuint(c->slice_size, ==, 1u << 20);
	g_assert_cmpuint(c->max_slices_per_task, ==, 8192);
	g_assert_cmpuint(c->retries, ==, 5);
	g_assert_cmpuint(c->retry_backoff_us, ==, 200);
	g_assert_cmpuint(c->retry_backoff_max_us, ==, 300000);
	g_assert_cmpuint(c->timeout_ms, ==, 60000);
	g_assert_cmpuint(c->quarantine_ms, ==, 0);
	g_assert_cmpuint(c->quarantine_after, ==, 7);
	g_assert_cmpuint(c->worker_threads, ==, 64);
	g_assert_cmpuint(c->max_pollers, ==, 3);
	g_assert_cmpuint(c->max_batches, ==, 8);
	g_assert_cmpuint(c->max_batch_size, ==, 16777216);
	g_assert_true(c->fallback);
	assert_round_trip(c);
	config_free(c);

	/* Quoted and signed numbers are numbers. */
	c = parse_ok("transfer:\n  retries: \"7\"\n  worker_threads: +2\n  quarantine_ms: -0\n");
	g_assert_cmpuint(c->retries, ==, 7);
	g_assert_cmpuint(c->worker_threads, ==, 2);
	g_assert_cmpuint(c->quarantine_ms, ==, 0);
	config_free(c);
}

/* transfer.max_pollers: 0 is auto (printed as such), a negative or too large one an error. */
static void test_max_pollers(void)
{
	struct config *c = parse_ok("transfer:\n  max_pollers: 0\n");
	g_autofree char *y = config_to_yaml(c);

	g_assert_cmpuint(c->max_pollers, ==, 0);
	g_assert_nonnull(strstr(y, "\n  max_pollers: 0  # auto: half the CPUs\n"));
	assert_round_trip(c);
	config_free(c);
	c = parse_ok("transfer:\n  max_pollers: 1024\n");
	g_free(y);
	y = config_to_yaml(c);
	g_assert_nonnull(strstr(y, "\n  max_pollers: 1024\n"));
	config_free(c);
	expect_err("transfer:\n  max_pollers: -1\n",
		   "t.yaml:2:16: transfer.max_pollers: value -1 out of range 0..1024");
	expect_err("transfer:\n  max_pollers: 2000\n",
		   "t.yaml:2:16: transfer.max_pollers: value 2000 out of range 0..1024");
	expect_err("engine:\n  name: a\ntransfer:\n  retries: 2\n  max_pollers: 2000\n",
		   "t.yaml:5:16: transfer.max_pollers: value 2000 out of range 0..1024");
}

static void test_backoff_pair(void)
{
	struct config *c;

	/* An explicit first backoff above the default maximum raises the maximum. */
	c = parse_ok("transfer:\n  retry_backoff_us: 200000\n");
	g_assert_cmpuint(c->retry_backoff_us, ==, 200000);
	g_assert_cmpuint(c->retry_backoff_max_us, ==, 200000);
	config_free(c);
	c = parse_ok("transfer:\n  retry_backoff_us: 50\n  retry_backoff_max_us: 50\n");
	g_assert_cmpuint(c->retry_backoff_max_us, ==, 50);
	config_free(c);
	expect_err("transfer:\n  retry_backoff_us: 100\n  retry_backoff_max_us: 99\n",
		   "t.yaml:3:25: transfer.retry_backoff_max_us: value 99 is below "
		   "transfer.retry_backoff_us (100)");
	expect_err("transfer:\n  retry_backoff_max_us: 10\n",
		   "t.yaml:2:25: transfer.retry_backoff_max_us: value 10 is below "
		   "transfer.retry_backoff_us (100)");
}

static void test_sizes(void)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} ok[] = {
		{ "0", 0 },
		{ "1", 1 },
		{ "4096", 4096 },
		{ "512B", 512 },
		{ "64K", 64 << 10 },
		{ "64k", 64 << 10 },
		{ "64KB", 64 << 10 },
		{ "64KiB", 64 << 10 },
		{ "\"64KiB\"", 64 << 10 },
		{ "'64 KiB'", 64 << 10 },
		{ "1M", 1 << 20 },
		{ "1m", 1 << 20 },
		{ "1MB", 1 << 20 },
		{ "1MiB", 1 << 20 },
		{ "1G", 1 << 30 },
		{ "1GiB", 1 << 30 },
		{ "1gb", 1 << 30 },
		{ "1024M", 1 << 30 },
		{ "1048576K", 1 << 30 },
		{ "1073741824", 1 << 30 },
	};
	static const struct {
		const char *text;
		const char *err;
	} bad[] = {
		{ "1073741825", "value 1073741825 out of range 0..1G" },
		{ "2G", "value 2G out of range 0..1G" },
		{ "1025M", "value 1025M out of range 0..1G" },
		{ "1T", "value 1T out of range 0..1G" },
		{ "-1K", "value -1K out of range 0..1G" },
		{ "99999999999999999999", "value 99999999999999999999 out of range 0..1G" },
		{ "17179869184G", "value 17179869184G out of range 0..1G" },
		{ "abc", "expected a size (e.g. 4096, 64K, 1M, 1G, 64KiB), got \"abc\"" },
		{ "64X", "expected a size (e.g. 4096, 64K, 1M, 1G, 64KiB), got \"64X\"" },
		{ "1.5M", "expected a size (e.g. 4096, 64K, 1M, 1G, 64KiB), got \"1.5M\"" },
		{ "K", "expected a size (e.g. 4096, 64K, 1M, 1G, 64KiB), got \"K\"" },
		{ "0x1000", "expected a size (e.g. 4096, 64K, 1M, 1G, 64KiB), got \"0x1000\"" },
	};

	for (size_t i = 0; i < G_N_ELEMENTS(ok); i++) {
		g_autofree char *y = g_strdup_printf("transfer:\n  slice_size: %s\n", ok[i].text);
		struct config *c = parse_ok(y);

		g_assert_cmpuint(c->slice_size, ==, ok[i].bytes);
		assert_round_trip(c);
		config_free(c);
	}
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *y = g_strdup_printf("transfer:\n  slice_size: %s\n", bad[i].text);
		g_autofree char *e =
			g_strdup_printf("t.yaml:2:15: transfer.slice_size: %s", bad[i].err);

		expect_err(y, e);
	}
	expect_err("transfer:\n  slice_size: \"\"\n",
		   "t.yaml:2:15: transfer.slice_size: expected a size (e.g. 4096, 64K, 1M, 1G, "
		   "64KiB), got \"\"");
}

static void test_bools(void)
{
	static const struct {
		const char *text;
		bool v;
	} ok[] = {
		{ "true", true },    { "false", false }, { "yes", true }, { "no", false },
		{ "True", true },    { "FALSE", false }, { "Yes", true }, { "NO", false },
		{ "on", true },	     { "off", false },	 { "ON", true },  { "Off", false },
		{ "\"yes\"", true },
	};
	/* One rule with plugin options (te_plugin_parse_bool): never 1/0, y/n. */
	static const char *const bad[] = { "maybe", "1", "0", "y", "n", "onn", "\"\"" };

	for (size_t i = 0; i < G_N_ELEMENTS(ok); i++) {
		g_autofree char *y = g_strdup_printf("transfer:\n  fallback: %s\n", ok[i].text);
		struct config *c = parse_ok(y);

		g_assert_cmpint(c->fallback, ==, ok[i].v);
		config_free(c);
	}
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *y = g_strdup_printf("transfer:\n  fallback: %s\n", bad[i]);
		const char *shown = bad[i][0] == '"' ? "" : bad[i];
		g_autofree char *e = g_strdup_printf(
			"t.yaml:2:13: transfer.fallback: expected a boolean (true, false, yes, no, "
			"on, off), got \"%s\"",
			shown);

		expect_err(y, e);
	}
}

static void test_log(void)
{
	static const char *const levels[] = { "error", "warn", "info", "debug", "trace" };

	for (size_t i = 0; i < G_N_ELEMENTS(levels); i++) {
		g_autofree char *y = g_strdup_printf("log:\n  level: %s\n", levels[i]);
		struct config *c = parse_ok(y);

		g_assert_cmpint(c->log_level, ==, (int)i);
		assert_round_trip(c);
		config_free(c);
	}
	g_assert_cmpint(TE_LOG_TRACE, ==, 4);
	expect_err("log:\n  level: verbose\n",
		   "t.yaml:2:10: log.level: expected one of: error, warn, info, debug, trace, got "
		   "\"verbose\"");
	expect_err("log:\n  level: 3\n",
		   "t.yaml:2:10: log.level: expected one of: error, warn, info, debug, trace, got "
		   "\"3\"");
	expect_err("log:\n  lvl: info\n",
		   "t.yaml:2:3: log.lvl: unknown key (expected one of: level)");
}

static void test_auth(void)
{
	struct config *c = parse_ok("auth:\n  secret: \"s3cr3t: with spaces\"\n");

	g_assert_cmpstr(c->auth_secret, ==, "s3cr3t: with spaces");
	g_assert_null(c->auth_secret_file);
	assert_round_trip(c);
	config_free(c);

	c = parse_ok("auth:\n  secret_file: /etc/te/secret\n");
	g_assert_null(c->auth_secret);
	g_assert_cmpstr(c->auth_secret_file, ==, "/etc/te/secret");
	assert_round_trip(c);
	config_free(c);

	expect_err("auth:\n  secret: a-secret-of-16-bytes\n  secret_file: /b\n",
		   "t.yaml:3:16: auth.secret_file: secret and secret_file are mutually exclusive");
	expect_err("auth:\n  secret_file: /b\n  secret: a-secret-of-16-bytes\n",
		   "t.yaml:3:11: auth.secret: secret and secret_file are mutually exclusive");
	expect_err("auth:\n  secret: ''\n", "t.yaml:2:11: auth.secret: must not be empty");
	/* A short secret falls to guessing: at least 16 bytes, counted as bytes. */
	expect_err("auth:\n  secret: s3cr3t!!!\n",
		   "t.yaml:2:11: auth.secret: 9 bytes is too short (at least 16)");
	expect_err("auth:\n  secret: \"x\"\n",
		   "t.yaml:2:11: auth.secret: 1 byte is too short (at least 16)");
	expect_err("auth: {secret: 0123456789abcde}\n",
		   "t.yaml:1:16: auth.secret: 15 bytes is too short (at least 16)");
	c = parse_ok("auth: {secret: 0123456789abcdef}\n");
	g_assert_cmpstr(c->auth_secret, ==, "0123456789abcdef");
	config_free(c);
	/* Two-byte characters: 8 of them are 16 bytes. */
	c = parse_ok(
		"auth: {secret: \"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}\n");
	g_assert_cmpuint(strlen(c->auth_secret), ==, 16);
	config_free(c);
	expect_err("auth:\n  password: x\n",
		   "t.yaml:2:3: auth.password: unknown key (expected one of: secret, secret_file)");
	expect_err("auth: secret\n",
		   "t.yaml:1:7: auth: expected a mapping (secret, secret_file), got \"secret\"");
}

static void test_transports(void)
{
	struct config *c = parse_ok("transports:\n"
				    "  - name: rdma\n"
				    "    path: /opt/te/libte-rdma.so\n"
				    "    required: yes\n"
				    "    options:\n"
				    "      devices: mlx5_0,mlx5_1\n"
				    "      gid_index: 3\n"
				    "      empty: ~\n"
				    "      quoted: \"a: b\"\n"
				    "  - name: tcp\n"
				    "  - {name: my_plugin-2, memory_only: true, options: {}}\n");

	g_assert_cmpuint(c->n_transports, ==, 3);
	g_assert_cmpstr(c->transports[0].name, ==, "rdma");
	g_assert_cmpstr(c->transports[0].path, ==, "/opt/te/libte-rdma.so");
	g_assert_true(c->transports[0].required);
	g_assert_cmpuint(c->transports[0].n_options, ==, 4);
	g_assert_cmpstr(c->transports[0].options[0].key, ==, "devices");
	g_assert_cmpstr(c->transports[0].options[0].value, ==, "mlx5_0,mlx5_1");
	g_assert_cmpstr(config_transport_option(&c->transports[0], "gid_index"), ==, "3");
	g_assert_cmpstr(config_transport_option(&c->transports[0], "empty"), ==, "");
	g_assert_cmpstr(config_transport_option(&c->transports[0], "quoted"), ==, "a: b");
	g_assert_null(config_transport_option(&c->transports[0], "absent"));
	g_assert_null(config_transport_option(&c->transports[0], NULL));
	g_assert_null(config_transport_option(NULL, "devices"));
	g_assert_cmpstr(c->transports[1].name, ==, "tcp");
	g_assert_null(c->transports[1].path);
	g_assert_false(c->transports[1].required);
	g_assert_cmpuint(c->transports[1].n_options, ==, 0);
	g_assert_null(config_transport_option(&c->transports[1], "x"));
	g_assert_cmpstr(c->transports[2].name, ==, "my_plugin-2");
	g_assert_false(c->transports[0].memory_only);
	g_assert_false(c->transports[1].memory_only);
	g_assert_true(c->transports[2].memory_only);
	assert_defaults_except_transports(c);
	assert_round_trip(c);
	config_free(c);
}

static void test_transport_limits(void)
{
	GString *y = g_string_new("transports:\n");
	GString *o = g_string_new("transports:\n  - name: t\n    options:\n");
	struct config *c;

	for (int i = 0; i < CONFIG_MAX_TRANSPORTS; i++)
		g_string_append_printf(y, "  - name: t%d\n", i);
	for (int i = 0; i < CONFIG_MAX_OPTIONS; i++)
		g_string_append_printf(o, "      o%d: v%d\n", i, i);
	c = parse_ok(y->str);
	g_assert_cmpuint(c->n_transports, ==, CONFIG_MAX_TRANSPORTS);
	g_assert_cmpstr(c->transports[15].name, ==, "t15");
	config_free(c);
	c = parse_ok(o->str);
	g_assert_cmpuint(c->transports[0].n_options, ==, CONFIG_MAX_OPTIONS);
	g_assert_cmpstr(config_transport_option(&c->transports[0], "o63"), ==, "v63");
	assert_round_trip(c);
	config_free(c);

	g_string_append(y, "  - name: t16\n");
	expect_err(y->str, "t.yaml:18:5: transports: more than 16 transports");
	g_string_append(o, "      o64: v64\n");
	expect_err(o->str, "t.yaml:68:7: transports[0].options: more than 64 options");
	g_string_free(y, TRUE);
	g_string_free(o, TRUE);
}

static void test_transport_errors(void)
{
	expect_err("transports:\n  - name: tcp\n  - name: rdma\n  - name: tcp\n",
		   "t.yaml:4:11: transports[2].name: duplicate transport \"tcp\" (first at 2:11)");
	expect_err("transports:\n  - path: /x.so\n",
		   "t.yaml:2:5: transports[0]: missing required key: name");
	expect_err("transports:\n  - name: TCP\n",
		   "t.yaml:2:11: transports[0].name: invalid transport name \"TCP\" (1..64 "
		   "characters of a-z, 0-9, '_', '-')");
	expect_err("transports:\n  - name: ../evil\n",
		   "t.yaml:2:11: transports[0].name: invalid transport name \"../evil\" (1..64 "
		   "characters of a-z, 0-9, '_', '-')");
	expect_err(
		"transports:\n  - name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
		"t.yaml:2:11: transports[0].name: invalid transport name "
		"\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...\" (1..64 "
		"characters of a-z, 0-9, '_', '-')");
	expect_err("transports:\n  - name: tcp\n    nmae: x\n",
		   "t.yaml:3:5: transports[0].nmae: unknown key (expected one of: name, path, "
		   "required, memory_only, options)");
	expect_err(
		"transports:\n  - name: tcp\n    required: sometimes\n",
		"t.yaml:3:15: transports[0].required: expected a boolean (true, false, yes, no, on, "
		"off), got \"sometimes\"");
	expect_err(
		"transports:\n  - name: tcp\n    memory_only: 2\n",
		"t.yaml:3:18: transports[0].memory_only: expected a boolean (true, false, yes, no, "
		"on, off), got \"2\"");
	expect_err("transports:\n  - name: rdma\n    options:\n      nested: {a: 1}\n",
		   "t.yaml:4:15: transports[0].options.nested: option values must be scalars, got "
		   "a mapping (nested mappings and sequences are not allowed in options)");
	expect_err("transports:\n  - name: tcp\n  - name: rdma\n    options:\n      l: [1, 2]\n",
		   "t.yaml:5:10: transports[1].options.l: option values must be scalars, got a "
		   "sequence (nested mappings and sequences are not allowed in options)");
	expect_err("transports:\n  - name: rdma\n    options: [a, b]\n",
		   "t.yaml:3:14: transports[0].options: expected a mapping of option: value, got a "
		   "sequence");
	expect_err("transports:\n  - name: rdma\n    options:\n      a: 1\n      a: 2\n",
		   "t.yaml:5:7: transports[0].options.a: duplicate key (first at 4:7)");
	expect_err("transports:\n  - name: rdma\n    options: {\"\": 1}\n",
		   "t.yaml:3:15: transports[0].options: empty option key");
	expect_err("transports:\n  - name: rdma\n    options: {[a]: 1}\n",
		   "t.yaml:3:15: transports[0].options: mapping keys must be scalars");
	expect_err("transports:\n  - tcp\n",
		   "t.yaml:2:5: transports[0]: expected a mapping (name, path, required, "
		   "memory_only, options), got \"tcp\"");
	expect_err(
		"transports:\n  -\n  - name: x\n",
		"t.yaml:2:4: transports[0]: expected a mapping (name, path, required, memory_only, "
		"options), "
		"got null");
	expect_err("transports: []\n",
		   "t.yaml:1:13: transports: empty sequence (at least one transport is required)");
	expect_err("transports:\n  name: tcp\n",
		   "t.yaml:2:3: transports: expected a sequence of transports, got a mapping");
	expect_err("transports:\n  - name: tcp\n    path: ''\n",
		   "t.yaml:3:11: transports[0].path: must not be empty");
}

static void test_control(void)
{
	struct config *c = parse_ok("control:\n"
				    "  max_connections: 4096\n"
				    "  max_connections_per_host: 32\n"
				    "  max_unauthenticated: 64\n"
				    "  auth_timeout_ms: 2000\n"
				    "  idle_timeout_ms: 30000\n"
				    "  frame_timeout_ms: 4000\n"
				    "  max_frame: 4M\n"
				    "  max_buffered: 1G\n"
				    "  notify_inbox: 1000\n"
				    "  notify_per_sender: 10\n"
				    "  notify_per_host: 100\n");
	g_autofree char *y = config_to_yaml(c);

	g_assert_cmpuint(c->control_max_connections, ==, 4096);
	g_assert_cmpuint(c->control_max_connections_per_host, ==, 32);
	g_assert_cmpuint(c->control_max_unauthenticated, ==, 64);
	g_assert_cmpuint(c->control_auth_timeout_ms, ==, 2000);
	g_assert_cmpuint(c->control_idle_timeout_ms, ==, 30000);
	g_assert_cmpuint(c->control_frame_timeout_ms, ==, 4000);
	g_assert_cmpuint(c->control_max_frame, ==, 4u << 20);
	g_assert_cmpuint(c->control_max_buffered, ==, 1u << 30);
	g_assert_cmpuint(c->control_notify_inbox, ==, 1000);
	g_assert_cmpuint(c->control_notify_per_sender, ==, 10);
	g_assert_cmpuint(c->control_notify_per_host, ==, 100);
	/* Printed as a section of its own, sizes with their unit, and read back. */
	g_assert_nonnull(strstr(y, "\ncontrol:\n  max_connections: 4096\n"
				   "  max_connections_per_host: 32\n"
				   "  max_unauthenticated: 64\n"
				   "  auth_timeout_ms: 2000\n"
				   "  idle_timeout_ms: 30000\n"
				   "  frame_timeout_ms: 4000\n"
				   "  max_frame: 4M\n"
				   "  max_buffered: 1G\n"
				   "  notify_inbox: 1000\n"
				   "  notify_per_sender: 10\n"
				   "  notify_per_host: 100\n"));
	assert_round_trip(c);
	config_free(c);

	/* The defaults print too, and a null section keeps them. */
	c = parse_ok("control:\n");
	assert_defaults(c);
	g_free(y);
	y = config_to_yaml(c);
	g_assert_nonnull(strstr(y, "  max_frame: 16M\n  max_buffered: 64M\n"));
	config_free(c);

	/* A frame larger than the default budget raises the budget it did not set. */
	c = parse_ok("control: {max_frame: 256M}\n");
	g_assert_cmpuint(c->control_max_buffered, ==, 256u << 20);
	assert_round_trip(c);
	config_free(c);
	expect_err("control:\n  max_frame: 2M\n  max_buffered: 1M\n",
		   "t.yaml:3:17: control.max_buffered: value 1M is below control.max_frame (2M): "
		   "a largest frame must fit");
	expect_err("control:\n  max_buffered: 1M\n",
		   "t.yaml:2:17: control.max_buffered: value 1M is below control.max_frame (16M): "
		   "a largest frame must fit");

	expect_err("control:\n  max_connections: 0\n",
		   "t.yaml:2:20: control.max_connections: value 0 out of range 1..1048576");
	expect_err("control:\n  max_connections_per_host: -1\n",
		   "t.yaml:2:29: control.max_connections_per_host: value -1 out of range "
		   "1..1048576");
	expect_err("control:\n  auth_timeout_ms: 3600001\n",
		   "t.yaml:2:20: control.auth_timeout_ms: value 3600001 out of range 1..3600000");
	expect_err("control:\n  frame_timeout_ms: soon\n",
		   "t.yaml:2:21: control.frame_timeout_ms: expected an integer, got \"soon\"");
	expect_err("control:\n  max_frame: 1K\n",
		   "t.yaml:2:14: control.max_frame: value 1K out of range 64K..1G");
	expect_err("control:\n  max_frame: 2G\n",
		   "t.yaml:2:14: control.max_frame: value 2G out of range 64K..1G");
	expect_err("control:\n  notify_per_sender: 0\n",
		   "t.yaml:2:22: control.notify_per_sender: value 0 out of range 1..16777216");
	expect_err("control:\n  max_conns: 1\n",
		   "t.yaml:2:3: control.max_conns: unknown key (expected one of: max_connections, "
		   "max_connections_per_host, max_unauthenticated, auth_timeout_ms, "
		   "idle_timeout_ms, frame_timeout_ms, max_frame, max_buffered, notify_inbox, "
		   "notify_per_sender, notify_per_host)");
	expect_err("control:\n  max_connections: 1\n  max_connections: 2\n",
		   "t.yaml:3:3: control.max_connections: duplicate key (first at 2:3)");
	expect_err("control: [1]\n",
		   "t.yaml:1:10: control: expected a mapping (max_connections, "
		   "max_connections_per_host, max_unauthenticated, auth_timeout_ms, "
		   "idle_timeout_ms, frame_timeout_ms, max_frame, max_buffered, notify_inbox, "
		   "notify_per_sender, notify_per_host), got a sequence");
}

/* --- error classes ------------------------------------------------------------- */

static void test_unknown_keys(void)
{
	expect_err(
		"engine:\n  nmae: x\n",
		"t.yaml:2:3: engine.nmae: unknown key (expected one of: name, listen, advertise)");
	expect_err("engin:\n  name: x\n",
		   "t.yaml:1:1: engin: unknown key (expected one of: engine, metadata, transfer, "
		   "transports, log, auth, control)");
	expect_err("metadata:\n  kind: p2p\n",
		   "t.yaml:2:3: metadata.kind: unknown key (expected one of: type, endpoints, "
		   "namespace, ttl_s, username, password_file, ca_file, timeout_ms)");
	expect_err("transfer:\n  retry: 1\n",
		   "t.yaml:2:3: transfer.retry: unknown key (expected one of: slice_size, "
		   "max_slices_per_task, retries, retry_backoff_us, retry_backoff_max_us, "
		   "timeout_ms, quarantine_ms, quarantine_after, cancel_grace_ms, worker_threads, "
		   "max_pollers, max_batches, max_batch_size, fallback)");
	/* Keys that are not identifiers are quoted in the path. */
	expect_err(
		"engine:\n  \"a.b\": x\n",
		"t.yaml:2:3: engine.\"a.b\": unknown key (expected one of: name, listen, advertise)");
	expect_err(
		"engine:\n  \"\\t\": x\n",
		"t.yaml:2:3: engine.\"\\x09\": unknown key (expected one of: name, listen, advertise)");
	expect_err("? [a]\n: b\n", "t.yaml:1:3: (root): mapping keys must be scalars");
	/* Keys are case-sensitive. */
	expect_err("Engine: {}\n",
		   "t.yaml:1:1: Engine: unknown key (expected one of: engine, metadata, transfer, "
		   "transports, log, auth, control)");
}

static void test_duplicate_keys(void)
{
	expect_err("transfer:\n  retries: 5\n  retries: 6\n",
		   "t.yaml:3:3: transfer.retries: duplicate key (first at 2:3)");
	expect_err("engine: {}\nlog: {}\nengine: {}\n",
		   "t.yaml:3:1: engine: duplicate key (first at 1:1)");
	/* A null first value is still a use of the key. */
	expect_err("engine:\n  name:\n  name: x\n",
		   "t.yaml:3:3: engine.name: duplicate key (first at 2:3)");
}

static void test_wrong_types(void)
{
	expect_err(
		"engine: [a, b]\n",
		"t.yaml:1:9: engine: expected a mapping (name, listen, advertise), got a sequence");
	expect_err("engine: 5\n",
		   "t.yaml:1:9: engine: expected a mapping (name, listen, advertise), got \"5\"");
	expect_err("engine:\n  name: {a: 1}\n",
		   "t.yaml:2:9: engine.name: expected a string, got a mapping");
	expect_err("engine:\n  listen: [a]\n",
		   "t.yaml:2:11: engine.listen: expected an address host:port, got a sequence");
	expect_err("transfer:\n  worker_threads: abc\n",
		   "t.yaml:2:19: transfer.worker_threads: expected an integer, got \"abc\"");
	expect_err("transfer:\n  retries: 1.5\n",
		   "t.yaml:2:12: transfer.retries: expected an integer, got \"1.5\"");
	expect_err("transfer:\n  retries: 0x10\n",
		   "t.yaml:2:12: transfer.retries: expected an integer, got \"0x10\"");
	expect_err("transfer:\n  retries: [1]\n",
		   "t.yaml:2:12: transfer.retries: expected an integer, got a sequence");
	expect_err("transfer:\n  retries: \"\"\n",
		   "t.yaml:2:12: transfer.retries: expected an integer, got \"\"");
	expect_err(
		"transfer:\n  fallback: {}\n",
		"t.yaml:2:13: transfer.fallback: expected a boolean (true, false, yes, no, on, off), "
		"got a mapping");
	expect_err(
		"- engine\n",
		"t.yaml:1:1: (root): expected a mapping (engine, metadata, transfer, transports, "
		"log, auth, control), got a sequence");
	expect_err(
		"hello\n",
		"t.yaml:1:1: (root): expected a mapping (engine, metadata, transfer, transports, "
		"log, auth, control), got \"hello\"");
	/* Huge numbers are out of range, not wrapped. */
	expect_err(
		"transfer:\n  timeout_ms: 99999999999999999999999999\n",
		"t.yaml:2:15: transfer.timeout_ms: value 99999999999999999999999999 out of range "
		"1..86400000");
	expect_err("transfer:\n  timeout_ms: 18446744073709551616\n",
		   "t.yaml:2:15: transfer.timeout_ms: value 18446744073709551616 out of range "
		   "1..86400000");
	expect_err("transfer:\n  max_batches: 4294967297\n",
		   "t.yaml:2:16: transfer.max_batches: value 4294967297 out of range 1..1048576");
}

static void test_syntax_errors(void)
{
	expect_err("engine:\n  name: x\n listen: y\n",
		   "t.yaml:3:2: (root): syntax error: did not find expected key (while parsing a "
		   "block mapping at 1:1)");
	expect_err("engine: {name: [\n",
		   "t.yaml:2:1: engine.name[0]: syntax error: did not find expected node content "
		   "(while parsing a flow node at 2:1)");
	expect_err("engine:\n  name: \"unterminated\n",
		   "t.yaml:3:1: engine.name: syntax error: found unexpected end of stream (while "
		   "scanning a quoted scalar at 2:9)");
	expect_err(
		"a: b: c\n",
		"t.yaml:1:5: (root): syntax error: mapping values are not allowed in this context");
	expect_err("engine:\n\tname: x\n",
		   "t.yaml:2:1: engine: syntax error: found character that cannot start any token "
		   "(while scanning for the next token at 2:1)");
	expect_err("engine:\n  name: \"\\q\"\n",
		   "t.yaml:2:10: engine.name: syntax error: found unknown escape character (while "
		   "parsing a quoted scalar at 2:9)");
	/* Reader errors: bad encoding and control characters. */
	expect_err("engine:\n  name: \xc3\x28\n",
		   "t.yaml:2:10: (root): invalid input: invalid trailing UTF-8 octet (0x28)");
	expect_err("engine:\n  name: a\x01\n",
		   "t.yaml:2:10: (root): invalid input: control characters are not allowed (0x1)");
	expect_err_len("engine:\n  name: a\0b\n", 18,
		       "t.yaml:2:10: (root): invalid input: control characters are not allowed "
		       "(0x0)");
}

static void test_documents_anchors_tags(void)
{
	expect_err("engine:\n  name: x\n---\nengine:\n  name: y\n",
		   "t.yaml:3:1: (root): more than one YAML document (a configuration is one "
		   "document)");
	expect_err("---\n---\n",
		   "t.yaml:2:1: (root): more than one YAML document (a configuration is one "
		   "document)");
	expect_err("transfer: &t\n  retries: 5\n",
		   "t.yaml:1:11: transfer: anchor &t is not supported");
	expect_err("transfer:\n  retries: &n 5\n",
		   "t.yaml:2:12: transfer.retries: anchor &n is not supported");
	expect_err("transfer:\n  retries: *n\n",
		   "t.yaml:2:12: transfer.retries: alias *n is not supported");
	expect_err("transports:\n  - &a {name: x}\n",
		   "t.yaml:2:5: transports[0]: anchor &a is not supported");
	expect_err("engine:\n  name: !!str x\n",
		   "t.yaml:2:9: engine.name: tag \"tag:yaml.org,2002:str\" is not supported");
	expect_err("engine: !custom\n  name: x\n",
		   "t.yaml:1:9: engine: tag \"!custom\" is not supported");
	expect_err("engine:\n  ! name: x\n", "t.yaml:2:3: engine: tag \"!\" is not supported");
}

static void test_string_limits(void)
{
	g_autofree char *max = g_strnfill(CONFIG_MAX_STRING, 's');
	g_autofree char *over = g_strnfill(CONFIG_MAX_STRING + 1, 's');
	g_autofree char *y1 = g_strdup_printf("auth:\n  secret: %s\n", max);
	g_autofree char *y2 = g_strdup_printf("auth:\n  secret: %s\n", over);
	g_autofree char *y3 = g_strdup_printf("? %s\n: 1\n", over);
	struct config *c = parse_ok(y1);

	g_assert_cmpuint(strlen(c->auth_secret), ==, CONFIG_MAX_STRING);
	assert_round_trip(c);
	config_free(c);
	expect_err(y2,
		   "t.yaml:2:11: auth.secret: string of 4097 bytes is over the 4096-byte limit");
	/* Implicit keys are bounded by libyaml at 1024 characters; explicit ones by us. */
	expect_err(y3, "t.yaml:1:3: (root): string of 4097 bytes is over the 4096-byte limit");
	expect_err("engine:\n  name: \"a\\0b\"\n",
		   "t.yaml:2:9: engine.name: string contains a NUL character");
}

static void test_nesting_and_nodes(void)
{
	GString *deep = g_string_new("transports:\n  - name: x\n    options:\n      o: ");
	GString *wide = g_string_new("metadata:\n  endpoints: [");
	g_autofree char *e = NULL;

	for (int i = 0; i < 100; i++)
		g_string_append_c(deep, '[');
	for (int i = 0; i < 100; i++)
		g_string_append_c(deep, ']');
	g_string_append_c(deep, '\n');
	e = g_strdup_printf("t.yaml:4:%d: transports[0].options.o%s: nesting deeper than 32 levels",
			    10 + 28,
			    "[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
			    "[0][0][0][0][0][0][0][0]");
	expect_err(deep->str, e);

	for (int i = 0; i < 70000; i++)
		g_string_append(wide, "a,");
	g_string_append(wide, "a]\n");
	expect_err(wide->str,
		   "t.yaml:2:131077: metadata.endpoints[65531]: more than 65536 nodes in the "
		   "document");
	g_string_free(deep, TRUE);
	g_string_free(wide, TRUE);
}

/* --- inputs ------------------------------------------------------------------- */

static void test_input_limit(void)
{
	/* Exactly the limit passes: a valid head padded with a comment. */
	const char *head = "transfer:\n  retries: 9\n#";
	size_t n = CONFIG_MAX_INPUT;
	g_autofree char *buf = g_malloc(n + 1);
	struct config *c = NULL;
	g_autofree char *err = NULL;

	memset(buf, 'x', n + 1);
	memcpy(buf, head, strlen(head));
	buf[n - 1] = '\n';
	g_assert_cmpint(config_parse(buf, n, "t.yaml", &c, &err), ==, TE_OK);
	g_assert_cmpuint(c->retries, ==, 9);
	config_free(c);
	buf[n] = '\n';
	expect_err_len(buf, n + 1,
		       "t.yaml:1:1: (root): input of 1048577 bytes is over the 1048576-byte limit");
	expect_err_len(buf, SIZE_MAX,
		       "t.yaml:1:1: (root): input of 18446744073709551615 bytes is over the "
		       "1048576-byte limit");
}

static void test_not_nul_terminated(void)
{
	const char text[] = "transfer:\n  retries: 12";
	size_t len = sizeof(text) - 1;
	/* Exact-size heap copies: a read past the end shows up under valgrind and ASan. */
	g_autofree char *exact = dup_exact(text, len);
	g_autofree char *shorter = dup_exact(text, len - 1);
	struct config *c = NULL;
	char *err = NULL;

	g_assert_cmpint(config_parse(exact, len, "t.yaml", &c, &err), ==, TE_OK);
	g_assert_cmpuint(c->retries, ==, 12);
	config_free(c);
	/* The bytes after @len do not count. */
	g_assert_cmpint(config_parse(text, len - 1, "t.yaml", &c, &err), ==, TE_OK);
	g_assert_cmpuint(c->retries, ==, 1);
	config_free(c);
	g_assert_cmpint(config_parse(shorter, len - 1, "t.yaml", &c, &err), ==, TE_OK);
	g_assert_cmpuint(c->retries, ==, 1);
	config_free(c);
}

static const char full_yaml[] =
	"engine:\n"
	"  name: node-a\n"
	"  listen: \"[::1]:7000\"\n"
	"metadata:\n"
	"  type: etcd\n"
	"  endpoints: [\"http://10.0.0.10:2379\", \"http://10.0.0.11:2379\"]\n"
	"  namespace: /te/prod\n"
	"  ttl_s: 30\n"
	"transfer:\n"
	"  slice_size: 64KiB\n"
	"  max_slices_per_task: 8192\n"
	"  retries: 5\n"
	"  retry_backoff_us: 200\n"
	"  retry_backoff_max_us: 200000\n"
	"  timeout_ms: 60000\n"
	"  quarantine_ms: 5000\n"
	"  quarantine_after: 2\n"
	"  worker_threads: 4\n"
	"  max_pollers: 2\n"
	"  max_batches: 2048\n"
	"  max_batch_size: 131072\n"
	"  fallback: yes\n"
	"transports:\n"
	"  - name: rdma\n"
	"    required: true\n"
	"    options:\n"
	"      devices: \"mlx5_0,mlx5_1\"\n"
	"      gid_index: 3\n"
	"  - name: tcp\n"
	"    path: /opt/te/plugins/libte-tcp.so\n"
	"  - name: nvlink\n"
	"    memory_only: true\n"
	"log:\n"
	"  level: debug\n"
	"auth:\n"
	"  secret_file: /etc/te/secret\n"
	"control:\n"
	"  max_connections: 2000\n"
	"  max_connections_per_host: 100\n"
	"  max_unauthenticated: 300\n"
	"  auth_timeout_ms: 3000\n"
	"  idle_timeout_ms: 20000\n"
	"  frame_timeout_ms: 15000\n"
	"  max_frame: 32MiB\n"
	"  max_buffered: 256M\n"
	"  notify_inbox: 100000\n"
	"  notify_per_sender: 2000\n"
	"  notify_per_host: 20000\n";

/* Every prefix of a valid file parses or fails cleanly with a well-formed message. */
static void test_truncated(void)
{
	size_t len = strlen(full_yaml);
	unsigned ok = 0, failed = 0;

	for (size_t n = 0; n <= len; n++) {
		g_autofree char *buf = dup_exact(full_yaml, n);
		struct config *c = NULL;
		g_autofree char *err = NULL;
		enum te_status st = config_parse(buf, n, "t.yaml", &c, &err);

		if (st == TE_OK) {
			g_assert_null(err);
			assert_round_trip(c);
			config_free(c);
			ok++;
		} else {
			g_assert_cmpint(st, ==, TE_ERR_CONFIG);
			g_assert_nonnull(err);
			g_assert_true(g_regex_match_simple(
				"^t\\.yaml:[1-9][0-9]*:[1-9][0-9]*: [^ ]+: .+$", err, 0, 0));
			failed++;
		}
	}
	g_assert_cmpuint(ok, >, 0);
	g_assert_cmpuint(failed, >, 0);
	expect_err("engine:\n  name: \"abc",
		   "t.yaml:2:13: engine.name: syntax error: found unexpected end of stream (while "
		   "scanning a quoted scalar at 2:9)");
	/* Cut inside a key: "listen" becomes the scalar "li", the value of engine. */
	expect_err("engine:\n  li",
		   "t.yaml:2:3: engine: expected a mapping (name, listen, advertise), got \"li\"");
}

static void test_utf16(void)
{
	g_autofree char *u16 = NULL;
	gsize written = 0;
	struct config *c = NULL;
	char *err = NULL;
	const char text[] = "\xef\xbb\xbf"
			    "engine:\n  name: n\xc3\xa9ud\n";

	/* libyaml detects UTF-16 by its BOM; the value arrives as UTF-8. */
	u16 = g_convert(text, -1, "UTF-16LE", "UTF-8", NULL, &written, NULL);
	g_assert_nonnull(u16);
	g_assert_cmpint(config_parse(u16, written, "t.yaml", &c, &err), ==, TE_OK);
	g_assert_cmpstr(c->name, ==, "n\xc3\xa9ud");
	config_free(c);
}

/* --- round trip --------------------------------------------------------------- */

static void test_round_trip_full(void)
{
	struct config *c = parse_ok(full_yaml);
	g_autofree char *y = config_to_yaml(c);
	struct config *again = parse_ok(y);

	g_assert_cmpstr(again->name, ==, "node-a");
	g_assert_cmpstr(again->listen, ==, "[::1]:7000");
	g_assert_cmpint(again->metadata_type, ==, CONFIG_METADATA_ETCD);
	g_assert_cmpuint(again->n_metadata_endpoints, ==, 2);
	g_assert_cmpstr(again->metadata_endpoints[1], ==, "http://10.0.0.11:2379");
	g_assert_cmpstr(again->metadata_namespace, ==, "/te/prod");
	g_assert_cmpuint(again->metadata_ttl_s, ==, 30);
	g_assert_cmpuint(again->slice_size, ==, 65536);
	g_assert_cmpuint(again->max_slices_per_task, ==, 8192);
	g_assert_cmpuint(again->retries, ==, 5);
	g_assert_cmpuint(again->retry_backoff_us, ==, 200);
	g_assert_cmpuint(again->retry_backoff_max_us, ==, 200000);
	g_assert_cmpuint(again->timeout_ms, ==, 60000);
	g_assert_cmpuint(again->quarantine_ms, ==, 5000);
	g_assert_cmpuint(again->quarantine_after, ==, 2);
	g_assert_cmpuint(again->worker_threads, ==, 4);
	g_assert_cmpuint(again->max_pollers, ==, 2);
	g_assert_cmpuint(again->max_batches, ==, 2048);
	g_assert_cmpuint(again->max_batch_size, ==, 131072);
	g_assert_true(again->fallback);
	g_assert_cmpuint(again->n_transports, ==, 3);
	g_assert_cmpstr(again->transports[0].name, ==, "rdma");
	g_assert_true(again->transports[0].required);
	g_assert_cmpstr(config_transport_option(&again->transports[0], "devices"), ==,
			"mlx5_0,mlx5_1");
	g_assert_cmpstr(config_transport_option(&again->transports[0], "gid_index"), ==, "3");
	g_assert_cmpstr(again->transports[1].path, ==, "/opt/te/plugins/libte-tcp.so");
	g_assert_false(again->transports[1].required);
	g_assert_false(again->transports[1].memory_only);
	g_assert_cmpstr(again->transports[2].name, ==, "nvlink");
	g_assert_true(again->transports[2].memory_only);
	g_assert_cmpint(again->log_level, ==, TE_LOG_DEBUG);
	g_assert_cmpstr(again->auth_secret_file, ==, "/etc/te/secret");
	g_assert_cmpuint(again->control_max_connections, ==, 2000);
	g_assert_cmpuint(again->control_max_connections_per_host, ==, 100);
	g_assert_cmpuint(again->control_max_unauthenticated, ==, 300);
	g_assert_cmpuint(again->control_auth_timeout_ms, ==, 3000);
	g_assert_cmpuint(again->control_idle_timeout_ms, ==, 20000);
	g_assert_cmpuint(again->control_frame_timeout_ms, ==, 15000);
	g_assert_cmpuint(again->control_max_frame, ==, 32u << 20);
	g_assert_cmpuint(again->control_max_buffered, ==, 256u << 20);
	g_assert_cmpuint(again->control_notify_inbox, ==, 100000);
	g_assert_cmpuint(again->control_notify_per_sender, ==, 2000);
	g_assert_cmpuint(again->control_notify_per_host, ==, 20000);
	assert_round_trip(again);
	config_free(again);
	config_free(c);

	/* Defaults print as every key. */
	c = parse_ok("");
	y = (g_free(y), config_to_yaml(c));
	g_assert_nonnull(strstr(y, "  max_batch_size: 65536\n"));
	g_assert_nonnull(strstr(y, "  listen: \"127.0.0.1:0\"\n"));
	g_assert_nonnull(strstr(y, "  - name: \"tcp\"\n"));
	g_assert_nonnull(strstr(y, "  level: warn\n"));
	assert_round_trip(c);
	config_free(c);
	g_assert_null(config_to_yaml(NULL));
}

/* Strings YAML would misread unquoted, or that need escapes, survive exactly. */
static void test_round_trip_strings(void)
{
	static const char *const values[] = {
		"yes",
		"null",
		"~",
		"123",
		"-1",
		"0x10",
		"a: b",
		"- x",
		"#c",
		"  lead",
		"trail  ",
		"\"q\"",
		"back\\slash",
		"tab\there",
		"line\nbreak",
		"cr\rx",
		"\x01\x1f\x7f",
		"caf\xc3\xa9",
		"\xe2\x80\xa8 ls",
		"\xc2\x85 nel",
		"\xef\xbb\xbf bom",
		"\xf0\x9f\x98\x80",
		"[x]",
		"{y}",
		"&a",
		"*b",
		"!t",
		"%",
		"@",
		"`",
		"'",
		"",
	};
	GString *y = g_string_new("transports:\n  - name: t\n    options:\n");
	GString *k = g_string_new(NULL);
	struct config *c, *again;
	g_autofree char *out = NULL;

	/* Build the input by escaping in double quotes ourselves. */
	for (size_t i = 0; i < G_N_ELEMENTS(values); i++) {
		g_string_append_printf(y, "      k%zu: \"", i);
		for (const char *p = values[i]; *p; p++) {
			if (*p == '"' || *p == '\\')
				g_string_append_printf(y, "\\%c", *p);
			else if ((unsigned char)*p < 0x20 || *p == 0x7f)
				g_string_append_printf(y, "\\x%02x", (unsigned char)*p);
			else if (!strncmp(p, "\xe2\x80\xa8", 3))
				g_string_append(y, "\\L"), p += 2;
			else if (!strncmp(p, "\xc2\x85", 2))
				g_string_append(y, "\\N"), p += 1;
			else if (!strncmp(p, "\xef\xbb\xbf", 3))
				g_string_append(y, "\\ufeff"), p += 2;
			else
				g_string_append_c(y, *p);
		}
		g_string_append(y, "\"\n");
	}
	/* A key longer than libyaml's 1024-character implicit key limit once printed. */
	for (int i = 0; i < 300; i++)
		g_string_append(k, "\\x01");
	g_string_append_printf(y, "      ? \"%s\"\n      : long\n", k->str);

	c = parse_ok(y->str);
	g_assert_cmpuint(c->transports[0].n_options, ==, G_N_ELEMENTS(values) + 1);
	for (size_t i = 0; i < G_N_ELEMENTS(values); i++)
		g_assert_cmpstr(c->transports[0].options[i].value, ==, values[i]);
	g_assert_cmpuint(strlen(c->transports[0].options[G_N_ELEMENTS(values)].key), ==, 300);
	out = config_to_yaml(c);
	again = parse_ok(out);
	for (size_t i = 0; i <= G_N_ELEMENTS(values); i++) {
		g_assert_cmpstr(again->transports[0].options[i].key, ==,
				c->transports[0].options[i].key);
		g_assert_cmpstr(again->transports[0].options[i].value, ==,
				c->transports[0].options[i].value);
	}
	assert_round_trip(again);
	config_free(again);
	config_free(c);
	g_string_free(y, TRUE);
	g_string_free(k, TRUE);
}

/* --- API edges and files ------------------------------------------------------ */

static void test_api_edges(void)
{
	struct config *c = NULL;
	char *err = NULL;

	config_free(NULL);
	g_assert_cmpint(config_parse("", 0, "t.yaml", NULL, &err), ==, TE_ERR_INVALID_ARG);
	g_assert_nonnull(err);
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(config_parse(NULL, 5, "t.yaml", &c, &err), ==, TE_ERR_INVALID_ARG);
	g_assert_null(c);
	g_clear_pointer(&err, g_free);
	/* err_out may be NULL when the caller only wants the status. */
	g_assert_cmpint(config_parse("x: 1", 4, "t.yaml", &c, NULL), ==, TE_ERR_CONFIG);
	g_assert_null(c);
	/* Without a name the message still has the form. */
	g_assert_cmpint(config_parse("x: 1", 4, NULL, &c, &err), ==, TE_ERR_CONFIG);
	g_assert_cmpstr(err, ==,
			"<config>:1:1: x: unknown key (expected one of: engine, metadata, "
			"transfer, transports, log, auth, control)");
	g_free(err);
	g_assert_cmpint(config_load_file(NULL, &c, &err), ==, TE_ERR_INVALID_ARG);
	g_free(err);
}

static void test_load_file(void)
{
	g_autoptr(GError) gerr = NULL;
	g_autofree char *dir = g_dir_make_tmp("te-config-XXXXXX", &gerr);
	g_autofree char *good = g_build_filename(dir, "node.yaml", NULL);
	g_autofree char *bad = g_build_filename(dir, "bad.yaml", NULL);
	g_autofree char *big = g_build_filename(dir, "big.yaml", NULL);
	g_autofree char *missing = g_build_filename(dir, "missing.yaml", NULL);
	g_autofree char *huge = g_malloc0(CONFIG_MAX_INPUT + 10);
	g_autofree char *expect = NULL;
	struct config *c = NULL;
	char *err = NULL;

	g_assert_no_error(gerr);
	g_assert_true(g_file_set_contents(good, "log:\n  level: info\n", -1, NULL));
	g_assert_true(g_file_set_contents(bad, "log:\n\n  levle: info\n", -1, NULL));
	memset(huge, '#', CONFIG_MAX_INPUT + 10);
	g_assert_true(g_file_set_contents(big, huge, CONFIG_MAX_INPUT + 10, NULL));

	g_assert_cmpint(config_load_file(good, &c, &err), ==, TE_OK);
	g_assert_null(err);
	g_assert_cmpint(c->log_level, ==, TE_LOG_INFO);
	config_free(c);
	c = NULL;

	g_assert_cmpint(config_load_file(bad, &c, &err), ==, TE_ERR_CONFIG);
	g_assert_null(c);
	expect = g_strdup_printf("%s:3:3: log.levle: unknown key (expected one of: level)", bad);
	g_assert_cmpstr(err, ==, expect);
	g_clear_pointer(&err, g_free);
	g_clear_pointer(&expect, g_free);

	g_assert_cmpint(config_load_file(missing, &c, &err), ==, TE_ERR_CONFIG);
	expect = g_strdup_printf("%s: cannot read: %s", missing, g_strerror(ENOENT));
	g_assert_cmpstr(err, ==, expect);
	g_clear_pointer(&err, g_free);
	g_clear_pointer(&expect, g_free);

	g_assert_cmpint(config_load_file(dir, &c, &err), ==, TE_ERR_CONFIG);
	expect = g_strdup_printf("%s: cannot read: %s", dir, g_strerror(EISDIR));
	g_assert_cmpstr(err, ==, expect);
	g_clear_pointer(&err, g_free);
	g_clear_pointer(&expect, g_free);

	g_assert_cmpint(config_load_file(big, &c, &err), ==, TE_ERR_CONFIG);
	expect = g_strdup_printf("%s: cannot read: file is over the 1048576-byte limit", big);
	g_assert_cmpstr(err, ==, expect);
	g_clear_pointer(&err, g_free);
	g_assert_null(c);

	g_assert_cmpint(g_unlink(good), ==, 0);
	g_assert_cmpint(g_unlink(bad), ==, 0);
	g_assert_cmpint(g_unlink(big), ==, 0);
	g_assert_cmpint(g_rmdir(dir), ==, 0);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/config/defaults/empty", test_defaults_empty);
	g_test_add_func("/config/defaults/embedded-yaml", test_default_yaml);
	g_test_add_func("/config/defaults/null-keeps-default", test_null_keeps_default);
	g_test_add_func("/config/keys/engine", test_engine);
	g_test_add_func("/config/keys/metadata", test_metadata);
	g_test_add_func("/config/keys/transfer-ranges", test_transfer_ranges);
	g_test_add_func("/config/keys/transfer-all", test_transfer_all_keys);
	g_test_add_func("/config/keys/max-pollers", test_max_pollers);
	g_test_add_func("/config/keys/backoff-pair", test_backoff_pair);
	g_test_add_func("/config/keys/sizes", test_sizes);
	g_test_add_func("/config/keys/bools", test_bools);
	g_test_add_func("/config/keys/log", test_log);
	g_test_add_func("/config/keys/auth", test_auth);
	g_test_add_func("/config/keys/control", test_control);
	g_test_add_func("/config/keys/transports", test_transports);
	g_test_add_func("/config/keys/transport-limits", test_transport_limits);
	g_test_add_func("/config/errors/transports", test_transport_errors);
	g_test_add_func("/config/errors/unknown-key", test_unknown_keys);
	g_test_add_func("/config/errors/duplicate-key", test_duplicate_keys);
	g_test_add_func("/config/errors/wrong-type", test_wrong_types);
	g_test_add_func("/config/errors/syntax", test_syntax_errors);
	g_test_add_func("/config/errors/documents-anchors-tags", test_documents_anchors_tags);
	g_test_add_func("/config/errors/string-limits", test_string_limits);
	g_test_add_func("/config/errors/nesting-and-nodes", test_nesting_and_nodes);
	g_test_add_func("/config/input/size-limit", test_input_limit);
	g_test_add_func("/config/input/not-nul-terminated", test_not_nul_terminated);
	g_test_add_func("/config/input/truncated", test_truncated);
	g_test_add_func("/config/input/utf16", test_utf16);
	g_test_add_func("/config/round-trip/full", test_round_trip_full);
	g_test_add_func("/config/round-trip/strings", test_round_trip_strings);
	g_test_add_func("/config/api/edges", test_api_edges);
	g_test_add_func("/config/api/load-file", test_load_file);
	return g_test_run();
}
