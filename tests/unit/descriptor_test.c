/* SPDX-License-Identifier: Apache-2.0 */
/* descriptor_test.c: unit tests of segment descriptor encoding, decoding and lookups. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include <te/te.h>

#include "core/metadata/descriptor.h"

/* Mirrors descriptor.c: members allowed in one JSON object (bounds json-glib's cost). */
#define MAX_MEMBERS 64u

/* ---- helpers ---- */

static bool blob_equal(GBytes *a, GBytes *b)
{
	gsize na = a ? g_bytes_get_size(a) : 0, nb = b ? g_bytes_get_size(b) : 0;

	if (na != nb)
		return false;
	return na == 0 || memcmp(g_bytes_get_data(a, NULL), g_bytes_get_data(b, NULL), na) == 0;
}

static bool blobs_equal(const struct descriptor_blob *a, size_t na, const struct descriptor_blob *b,
			size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++) {
		if (g_strcmp0(a[i].transport, b[i].transport) != 0 ||
		    !blob_equal(a[i].blob, b[i].blob))
			return false;
	}
	return true;
}

static bool str_equal(const char *a, const char *b)
{
	return strcmp(a ? a : "", b ? b : "") == 0;
}

static void assert_descriptor_equal(const struct descriptor *a, const struct descriptor *b)
{
	g_assert_cmpstr(a->name, ==, b->name);
	g_assert_cmpuint(a->generation, ==, b->generation);
	g_assert_true(str_equal(a->rpc, b->rpc));
	g_assert_true(str_equal(a->host_id, b->host_id));
	g_assert_cmpuint(a->pid, ==, b->pid);
	g_assert_true(blobs_equal(a->transports, a->n_transports, b->transports, b->n_transports));
	g_assert_cmpuint(a->n_buffers, ==, b->n_buffers);
	for (size_t i = 0; i < a->n_buffers; i++) {
		const struct descriptor_buffer *x = &a->buffers[i], *y = &b->buffers[i];

		g_assert_cmphex(x->addr, ==, y->addr);
		g_assert_cmpuint(x->length, ==, y->length);
		g_assert_true(str_equal(x->location, y->location));
		g_assert_cmpuint(x->access, ==, y->access);
		g_assert_true(blobs_equal(x->keys, x->n_keys, y->keys, y->n_keys));
	}
}

static struct descriptor *decode_ok_len(const char *json, size_t len)
{
	struct descriptor *d = NULL;
	char *err = NULL;
	enum te_status st = descriptor_decode(json, len, &d, &err);

	if (st != TE_OK)
		g_test_message("unexpected error: %s", err);
	g_assert_cmpint(st, ==, TE_OK);
	g_assert_null(err);
	g_assert_nonnull(d);
	return d;
}

static struct descriptor *decode_ok(const char *json)
{
	return decode_ok_len(json, strlen(json));
}

static void expect_error_len(const char *json, size_t len, const char *want)
{
	struct descriptor *d = NULL;
	char *err = NULL;

	g_assert_cmpint(descriptor_decode(json, len, &d, &err), ==, TE_ERR_METADATA_MALFORMED);
	g_assert_null(d);
	g_assert_cmpstr(err, ==, want);
	g_free(err);
	/* Without err_out the status is the same and nothing leaks. */
	g_assert_cmpint(descriptor_decode(json, len, &d, NULL), ==, TE_ERR_METADATA_MALFORMED);
	g_assert_null(d);
}

/* json-glib words its own parse errors; only the prefix is ours. */
static void expect_parse_error_len(const char *json, size_t len)
{
	struct descriptor *d = NULL;
	char *err = NULL;

	g_assert_cmpint(descriptor_decode(json, len, &d, &err), ==, TE_ERR_METADATA_MALFORMED);
	g_assert_null(d);
	g_assert_true(g_str_has_prefix(err, "descriptor: input: "));
	g_free(err);
}

/* Encode @d, decode the text, compare; encoding the result again gives the same text. */
static void assert_round_trip(const struct descriptor *d)
{
	struct descriptor *back;
	size_t len = 0, len2 = 0;
	char *text = descriptor_encode(d, &len);
	char *text2;

	g_assert_nonnull(text);
	g_assert_cmpuint(len, ==, strlen(text));
	back = decode_ok_len(text, len);
	assert_descriptor_equal(d, back);
	text2 = descriptor_encode(back, &len2);
	g_assert_cmpuint(len, ==, len2);
	g_assert_cmpstr(text, ==, text2);
	g_free(text2);
	g_free(text);
	descriptor_free(back);
}

static void set_blob(struct descriptor_blob *b, const char *transport, const void *data,
		     size_t size)
{
	b->transport = g_strdup(transport);
	b->blob = g_bytes_new(data, size);
}

static struct descriptor *descriptor_new_test(const char *name, uint64_t generation)
{
	struct descriptor *d = g_new0(struct descriptor, 1);

	d->name = g_strdup(name);
	d->generation = generation;
	d->rpc = g_strdup("10.0.0.1:7000");
	d->host_id = g_strdup("6f1c2e7e-boot");
	d->pid = 4242;
	return d;
}

/* ---- round trips ---- */

static void test_round_trip_basic(void)
{
	struct descriptor *d = descriptor_new_test("node-a", 12345);
	static const uint8_t qp[] = { 0x01, 0x02, 0x03, 0x04, 0x05 };
	size_t len = 0;
	char *text;

	d->n_transports = 2;
	d->transports = g_new0(struct descriptor_blob, 2);
	set_blob(&d->transports[0], "tcp", "10.0.0.1:7001", 13);
	set_blob(&d->transports[1], "rdma", qp, sizeof(qp));
	d->n_buffers = 2;
	d->buffers = g_new0(struct descriptor_buffer, 2);
	d->buffers[0] = (struct descriptor_buffer){ .addr = 0x7f0000001000,
						    .length = 1 << 20,
						    .location = g_strdup("cpu:0"),
						    .access = TE_MEM_REMOTE };
	d->buffers[0].n_keys = 1;
	d->buffers[0].keys = g_new0(struct descriptor_blob, 1);
	set_blob(&d->buffers[0].keys[0], "rdma", "\x11\x22\x33\x44", 4);
	d->buffers[1] = (struct descriptor_buffer){ .addr = 0x7f0000200000,
						    .length = 4096,
						    .location = g_strdup("cuda:1"),
						    .access = TE_MEM_REMOTE_READ };
	assert_round_trip(d);

	/* The documented spellings: 64-bit values as strings, addr in hex. */
	text = descriptor_encode(d, &len);
	g_assert_nonnull(strstr(text, "\"generation\":\"12345\""));
	g_assert_nonnull(strstr(text, "\"addr\":\"0x7f0000001000\""));
	g_assert_nonnull(strstr(text, "\"length\":\"1048576\""));
	g_assert_nonnull(strstr(text, "\"pid\":4242"));
	g_assert_nonnull(strstr(text, "\"access\":3"));
	g_assert_nonnull(strstr(text, "\"tcp\":\"MTAuMC4wLjE6NzAwMQ==\""));
	g_free(text);
	descriptor_free(d);
}

static void test_round_trip_many_buffers(void)
{
	const size_t n = DESCRIPTOR_MAX_BUFFERS;
	struct descriptor *d = descriptor_new_test("many", 7);
	struct descriptor *back;
	GRand *rand = g_rand_new_with_seed(42);
	size_t *order = g_new(size_t, n);
	char *text;
	size_t len;

	/* Publish in a shuffled order: decode must hand them back sorted. */
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	for (size_t i = n - 1; i > 0; i--) {
		size_t j = (size_t)g_rand_int_range(rand, 0, (gint32)(i + 1));
		size_t t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
	d->n_buffers = n;
	d->buffers = g_new0(struct descriptor_buffer, n);
	for (size_t i = 0; i < n; i++) {
		uint64_t slot = order[i];

		d->buffers[i].addr = 0x100000000ull + slot * 0x2000;
		d->buffers[i].length = 0x1000 + slot % 0x1000;
		d->buffers[i].location = g_strdup_printf("cpu:%u", (unsigned)(slot % 4));
		d->buffers[i].access = (uint32_t)(slot % 4);
		d->buffers[i].n_keys = 1;
		d->buffers[i].keys = g_new0(struct descriptor_blob, 1);
		set_blob(&d->buffers[i].keys[0], "rdma", &slot, sizeof(slot));
	}
	text = descriptor_encode(d, &len);
	back = decode_ok_len(text, len);
	g_assert_cmpuint(back->n_buffers, ==, n);
	for (size_t i = 0; i < n; i++) {
		const struct descriptor_buffer *b = &back->buffers[i];
		uint64_t key;

		g_assert_cmphex(b->addr, ==, 0x100000000ull + i * 0x2000);
		g_assert_cmpuint(b->length, ==, 0x1000 + i % 0x1000);
		g_assert_cmpuint(b->access, ==, i % 4);
		g_assert_cmpuint(b->n_keys, ==, 1);
		g_assert_cmpuint(g_bytes_get_size(b->keys[0].blob), ==, sizeof(key));
		memcpy(&key, g_bytes_get_data(b->keys[0].blob, NULL), sizeof(key));
		g_assert_cmpuint(key, ==, i);
		g_assert_true(descriptor_find_buffer(back, b->addr, b->length) == b);
	}
	/* Once sorted, the descriptor round-trips exactly. */
	assert_round_trip(back);
	descriptor_free(back);
	g_free(text);
	g_free(order);
	g_rand_free(rand);
	descriptor_free(d);
}

static void test_round_trip_binary_blobs(void)
{
	struct descriptor *d = descriptor_new_test("blobs", 1);
	uint8_t all[256], big[DESCRIPTOR_MAX_BLOB];

	for (size_t i = 0; i < sizeof(all); i++)
		all[i] = (uint8_t)i;
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(255 - i * 7);
	/* The maximum number of transports, with every byte value and every padding. */
	d->n_transports = DESCRIPTOR_MAX_TRANSPORTS;
	d->transports = g_new0(struct descriptor_blob, d->n_transports);
	set_blob(&d->transports[0], "all-bytes", all, sizeof(all));
	set_blob(&d->transports[1], "max-blob", big, sizeof(big));
	set_blob(&d->transports[2], "empty", NULL, 0);
	for (size_t i = 3; i < d->n_transports; i++) {
		char name[32];

		snprintf(name, sizeof(name), "t%zu", i);
		set_blob(&d->transports[i], name, all + i, i % 5);
	}
	d->n_buffers = 1;
	d->buffers = g_new0(struct descriptor_buffer, 1);
	d->buffers[0].addr = 0x1000;
	d->buffers[0].length = 0x1000;
	d->buffers[0].n_keys = DESCRIPTOR_MAX_TRANSPORTS;
	d->buffers[0].keys = g_new0(struct descriptor_blob, DESCRIPTOR_MAX_TRANSPORTS);
	for (size_t i = 0; i < DESCRIPTOR_MAX_TRANSPORTS; i++) {
		char name[32];

		snprintf(name, sizeof(name), "k%zu", i);
		set_blob(&d->buffers[0].keys[i], name, all + 255 - i * 3, i % 4 + 1);
	}
	assert_round_trip(d);
	g_assert_true(descriptor_find_blob(d->transports, d->n_transports, "max-blob") ==
		      d->transports[1].blob);
	descriptor_free(d);
}

static void test_round_trip_extremes(void)
{
	struct descriptor *d = descriptor_new_test("extremes", UINT64_MAX);
	struct descriptor *back;
	char *text;

	d->pid = UINT32_MAX;
	d->n_buffers = 2;
	d->buffers = g_new0(struct descriptor_buffer, 2);
	/* A buffer from address 0, and one that ends exactly at 2^64. */
	d->buffers[0].addr = 0;
	d->buffers[0].length = 1;
	d->buffers[1].addr = UINT64_MAX - 4095;
	d->buffers[1].length = 4096;
	d->buffers[1].access = TE_MEM_REMOTE_WRITE;
	assert_round_trip(d);
	text = descriptor_encode(d, NULL);
	g_assert_nonnull(strstr(text, "\"generation\":\"18446744073709551615\""));
	g_assert_nonnull(strstr(text, "\"addr\":\"0xfffffffffffff000\""));
	back = decode_ok(text);
	g_assert_cmpuint(back->generation, ==, UINT64_MAX);
	g_free(text);
	descriptor_free(back);
	descriptor_free(d);
}

static void test_round_trip_unicode_name(void)
{
	struct descriptor *d = descriptor_new_test("сегмент-段-\xf0\x9f\x9a\x80", 99);
	char *longest = g_strnfill(DESCRIPTOR_MAX_NAME, 'n');

	assert_round_trip(d);
	/* Names at the limit are accepted (the limit counts bytes). */
	g_free(d->name);
	d->name = longest;
	g_free(d->rpc);
	d->rpc = g_strnfill(DESCRIPTOR_MAX_NAME, 'r');
	assert_round_trip(d);
	/* Quotes, backslashes and control bytes survive JSON escaping. */
	g_free(d->name);
	d->name = g_strdup("a\"b\\c\n\x01\x7f");
	assert_round_trip(d);
	descriptor_free(d);
}

/* ---- decoding ---- */

static void test_decode_defaults(void)
{
	struct descriptor *d =
		decode_ok("{\"name\":\"n\",\"generation\":\"0\",\"buffers\":[{\"addr\":\"0x10\","
			  "\"length\":\"16\"}]}");

	g_assert_cmpstr(d->name, ==, "n");
	g_assert_cmpuint(d->generation, ==, 0);
	g_assert_cmpstr(d->rpc, ==, "");
	g_assert_cmpstr(d->host_id, ==, "");
	g_assert_cmpuint(d->pid, ==, 0);
	g_assert_cmpuint(d->n_transports, ==, 0);
	g_assert_cmpuint(d->n_buffers, ==, 1);
	g_assert_cmpstr(d->buffers[0].location, ==, "");
	/* Least privilege: a buffer without "access" is not remotely accessible. */
	g_assert_cmpuint(d->buffers[0].access, ==, TE_MEM_LOCAL);
	g_assert_cmpuint(d->buffers[0].n_keys, ==, 0);
	descriptor_free(d);

	d = decode_ok("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[]}");
	g_assert_cmpuint(d->n_buffers, ==, 0);
	g_assert_null(descriptor_find_buffer(d, 0, 1));
	descriptor_free(d);
}

static void test_decode_number_forms(void)
{
	struct descriptor *d =
		decode_ok("{\"name\":\"n\",\"generation\":9223372036854775807,\"pid\":4294967295,"
			  "\"buffers\":[{\"addr\":\"4096\",\"length\":4096},"
			  "{\"addr\":\"0x00000000000000000000ABCDEF000\",\"length\":\"00010\"},"
			  "{\"addr\":\"0xffffffffffffffff\",\"length\":\"1\"}]}");

	g_assert_cmpuint(d->generation, ==, INT64_MAX);
	g_assert_cmpuint(d->pid, ==, UINT32_MAX);
	g_assert_cmphex(d->buffers[0].addr, ==, 4096);
	g_assert_cmpuint(d->buffers[0].length, ==, 4096);
	g_assert_cmphex(d->buffers[1].addr, ==, 0xabcdef000);
	g_assert_cmpuint(d->buffers[1].length, ==, 10);
	g_assert_cmphex(d->buffers[2].addr, ==, UINT64_MAX);
	descriptor_free(d);

	d = decode_ok("{\"name\":\"n\",\"generation\":\"18446744073709551615\",\"buffers\":[]}");
	g_assert_cmpuint(d->generation, ==, UINT64_MAX);
	descriptor_free(d);
}

static void test_decode_unknown_members(void)
{
	struct descriptor *d = decode_ok(
		" {\"future\":{\"a\":[1,2,{\"b\":null}],\"c\":true},\"name\":\"n\",\"x\":-1.5e3,"
		"\"generation\":\"5\",\"buffers\":[{\"addr\":\"0x1000\",\"length\":\"1\","
		"\"numa\":3,\"keys\":{}}],\"transports\":{}}\r\n");

	g_assert_cmpuint(d->generation, ==, 5);
	g_assert_cmpuint(d->n_buffers, ==, 1);
	descriptor_free(d);
}

static void test_decode_sorts_buffers(void)
{
	struct descriptor *d =
		decode_ok("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":["
			  "{\"addr\":\"0x3000\",\"length\":\"4096\",\"location\":\"c\"},"
			  "{\"addr\":\"0x1000\",\"length\":\"4096\",\"location\":\"a\"},"
			  "{\"addr\":\"0x2000\",\"length\":\"4096\",\"location\":\"b\"}]}");

	g_assert_cmpuint(d->n_buffers, ==, 3);
	g_assert_cmpstr(d->buffers[0].location, ==, "a");
	g_assert_cmpstr(d->buffers[1].location, ==, "b");
	g_assert_cmpstr(d->buffers[2].location, ==, "c");
	descriptor_free(d);
}

static void test_decode_not_nul_terminated(void)
{
	static const char text[] = "{\"name\":\"n\",\"generation\":\"3\",\"buffers\":[]}";
	const size_t len = sizeof(text) - 1;
	char *exact = g_memdup2(text, len);
	char *padded = g_strconcat(text, "garbage", NULL);
	char *want = g_strdup_printf("descriptor: input: trailing data at offset %zu", len);
	struct descriptor *d;

	/* Exactly @len bytes, no terminator: a read past the end shows under ASan/valgrind. */
	d = decode_ok_len(exact, len);
	g_assert_cmpuint(d->generation, ==, 3);
	descriptor_free(d);
	/* Bytes past @len are not part of the input. */
	d = decode_ok_len(padded, len);
	descriptor_free(d);
	expect_error_len(padded, strlen(padded), want);
	/* A prefix that cuts a string short is a parse error, not a read past the end. */
	expect_parse_error_len(exact, 10);
	g_free(want);
	g_free(padded);
	g_free(exact);
}

/* ---- rejections ---- */

struct reject_case {
	char *json;
	size_t len;  /* 0: strlen(json) */
	char *error; /* exact text; NULL for json-glib's own parse errors */
};

static void test_reject(gconstpointer data)
{
	const struct reject_case *c = data;
	size_t len = c->len ? c->len : strlen(c->json);

	if (c->error)
		expect_error_len(c->json, len, c->error);
	else
		expect_parse_error_len(c->json, len);
}

static GPtrArray *reject_cases;

static void add_reject_len(const char *id, char *json, size_t len, const char *error)
{
	struct reject_case *c = g_new0(struct reject_case, 1);
	char *path = g_strconcat("/descriptor/reject/", id, NULL);

	c->json = json;
	c->len = len;
	c->error = g_strdup(error);
	g_ptr_array_add(reject_cases, c);
	g_test_add_data_func(path, c, test_reject);
	g_free(path);
}

/* A descriptor whose root members are @root (with a leading comma if any). */
static void add_reject_root(const char *id, const char *root, const char *error)
{
	add_reject_len(
		id, g_strdup_printf("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[]%s}", root),
		0, error);
}

/* A descriptor with one extra buffer at index 1 whose members are @members. */
static void add_reject_buffer(const char *id, const char *members, const char *error)
{
	add_reject_len(id,
		       g_strdup_printf(
			       "{\"name\":\"n\",\"generation\":\"1\",\"buffers\":["
			       "{\"addr\":\"0x100000\",\"length\":\"1\",\"keys\":{\"a\":\"AA==\"}},"
			       "{%s}]}",
			       members),
		       0, error);
}

static void add_reject(const char *id, const char *json, const char *error)
{
	add_reject_len(id, g_strdup(json), 0, error);
}

static void free_reject_case(gpointer p)
{
	struct reject_case *c = p;

	g_free(c->json);
	g_free(c->error);
	g_free(c);
}

/* @head, then @n comma-separated items "<before><index><after>", then @tail. */
static char *json_repeat(const char *head, const char *before, const char *after, size_t n,
			 const char *tail)
{
	GString *s = g_string_new(head);

	for (size_t i = 0; i < n; i++)
		g_string_append_printf(s, "%s%s%zu%s", i > 0 ? "," : "", before, i, after);
	g_string_append(s, tail);
	return g_string_free(s, FALSE);
}

static void add_reject_cases(void)
{
	const char *gen_err =
		"descriptor: generation: must be a decimal string or a non-negative integer";
	const char *addr_err =
		"descriptor: buffers[1].addr: must be a hex (0x...) or decimal string";
	const char *len_err =
		"descriptor: buffers[1].length: must be a decimal string or a non-negative integer";
	const char *pid_err = "descriptor: pid: must be an integer in [0, 4294967295]";
	char *s;

	/* Input as a whole. */
	add_reject("empty", "", "descriptor: root: must be an object");
	add_reject("blank", " \n\t", "descriptor: root: must be an object");
	add_reject("root-array", "[]", "descriptor: root: must be an object");
	add_reject("root-string", "\"x\"", "descriptor: root: must be an object");
	add_reject("root-number", "42", "descriptor: root: must be an object");
	add_reject("parse-error", "{\"name\":}", NULL);
	add_reject("truncated", "{\"name\":\"n\"", NULL);
	add_reject("trailing", "{} {}", "descriptor: input: trailing data at offset 3");
	add_reject("unbalanced", "]", "descriptor: input: unbalanced ']' at offset 0");
	add_reject("comment", "/**/{}", "descriptor: input: unexpected character at offset 0");
	add_reject("single-quote", "{'a':1}",
		   "descriptor: input: unexpected character at offset 1");
	add_reject("bare-hex", "{\"a\":0x10}",
		   "descriptor: input: unexpected character at offset 6");
	add_reject("invalid-utf8", "{\"name\":\"\xff\"}", "descriptor: input: not valid UTF-8");
	add_reject_len("embedded-nul", g_memdup2("{\"name\":\"a\0b\"}", 14), 14,
		       "descriptor: input: not valid UTF-8");
	s = g_strnfill(100000, '[');
	add_reject_len("deep-nesting", s, 0, "descriptor: input: nested deeper than 32");
	add_reject_len("depth-33", g_strconcat(s + 100000 - 33, NULL), 0,
		       "descriptor: input: nested deeper than 32");
	add_reject_len("member-flood", json_repeat("{", "\"k\":", "", MAX_MEMBERS + 1, "}"), 0,
		       "descriptor: input: object with more than 64 members");
	s = g_malloc(DESCRIPTOR_MAX_JSON + 1);
	memset(s, ' ', DESCRIPTOR_MAX_JSON + 1);
	add_reject_len("oversize", s, DESCRIPTOR_MAX_JSON + 1,
		       "descriptor: input: longer than 16777216 bytes");

	/* name */
	add_reject("name-missing", "{\"generation\":\"1\",\"buffers\":[]}",
		   "descriptor: name: missing");
	add_reject("name-number", "{\"name\":5,\"generation\":\"1\",\"buffers\":[]}",
		   "descriptor: name: must be a string");
	add_reject("name-null", "{\"name\":null,\"generation\":\"1\",\"buffers\":[]}",
		   "descriptor: name: must be a string");
	/* Found by libFuzzer: json-glib decodes a lone surrogate to invalid UTF-8. */
	add_reject("name-lone-surrogate",
		   "{\"name\":\"a\\ud82d\\]ude80\",\"generation\":\"1\",\"buffers\":[]}",
		   "descriptor: name: not valid UTF-8");
	add_reject_root("host-lone-surrogate", ",\"host\":\"\\udc00x\"",
			"descriptor: host: not valid UTF-8");
	add_reject_buffer("location-lone-surrogate",
			  "\"addr\":\"0x1000\",\"length\":\"1\",\"location\":\"\\ud800x\"",
			  "descriptor: buffers[1].location: not valid UTF-8");
	add_reject_root("transport-name-lone-surrogate", ",\"transports\":{\"\\ud800x\":\"\"}",
			"descriptor: transports: transport name not valid UTF-8");
	add_reject("name-empty", "{\"name\":\"\",\"generation\":\"1\",\"buffers\":[]}",
		   "descriptor: name: must not be empty");
	s = g_strnfill(DESCRIPTOR_MAX_NAME + 1, 'x');
	add_reject_len("name-long",
		       g_strdup_printf("{\"name\":\"%s\",\"generation\":\"1\",\"buffers\":[]}", s),
		       0, "descriptor: name: longer than 256 bytes");
	g_free(s);

	/* generation */
	add_reject("generation-missing", "{\"name\":\"n\",\"buffers\":[]}",
		   "descriptor: generation: missing");
	add_reject("generation-negative-string",
		   "{\"name\":\"n\",\"generation\":\"-1\",\"buffers\":[]}", gen_err);
	add_reject("generation-plus", "{\"name\":\"n\",\"generation\":\"+1\",\"buffers\":[]}",
		   gen_err);
	add_reject("generation-empty", "{\"name\":\"n\",\"generation\":\"\",\"buffers\":[]}",
		   gen_err);
	add_reject("generation-space", "{\"name\":\"n\",\"generation\":\" 1\",\"buffers\":[]}",
		   gen_err);
	add_reject("generation-hex", "{\"name\":\"n\",\"generation\":\"0x1\",\"buffers\":[]}",
		   gen_err);
	add_reject("generation-overflow",
		   "{\"name\":\"n\",\"generation\":\"18446744073709551616\",\"buffers\":[]}",
		   gen_err);
	add_reject("generation-negative-int", "{\"name\":\"n\",\"generation\":-1,\"buffers\":[]}",
		   gen_err);
	add_reject("generation-int-overflow",
		   "{\"name\":\"n\",\"generation\":18446744073709551615,\"buffers\":[]}", gen_err);
	add_reject("generation-double", "{\"name\":\"n\",\"generation\":1.5,\"buffers\":[]}",
		   gen_err);
	add_reject("generation-bool", "{\"name\":\"n\",\"generation\":true,\"buffers\":[]}",
		   gen_err);

	/* rpc, host, pid */
	add_reject_root("rpc-number", ",\"rpc\":1", "descriptor: rpc: must be a string");
	s = g_strnfill(DESCRIPTOR_MAX_NAME + 1, 'r');
	add_reject_len("rpc-long",
		       g_strdup_printf("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[],"
				       "\"rpc\":\"%s\"}",
				       s),
		       0, "descriptor: rpc: longer than 256 bytes");
	g_free(s);
	add_reject_root("host-null", ",\"host\":null", "descriptor: host: must be a string");
	add_reject_root("pid-string", ",\"pid\":\"1\"", pid_err);
	add_reject_root("pid-negative", ",\"pid\":-1", pid_err);
	add_reject_root("pid-big", ",\"pid\":4294967296", pid_err);
	add_reject_root("pid-double", ",\"pid\":1.0", pid_err);

	/* transports */
	add_reject_root("transports-array", ",\"transports\":[]",
			"descriptor: transports: must be an object");
	add_reject_len("transports-too-many",
		       json_repeat("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[],"
				   "\"transports\":{",
				   "\"t", "\":\"\"", DESCRIPTOR_MAX_TRANSPORTS + 1, "}}"),
		       0, "descriptor: transports: more than 32 entries");
	add_reject_root("transports-empty-name", ",\"transports\":{\"\":\"AA==\"}",
			"descriptor: transports: empty transport name");
	s = g_strnfill(DESCRIPTOR_MAX_NAME + 1, 't');
	add_reject_len("transports-long-name",
		       g_strdup_printf("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[],"
				       "\"transports\":{\"%s\":\"\"}}",
				       s),
		       0, "descriptor: transports: transport name longer than 256 bytes");
	g_free(s);
	add_reject_root("transports-number", ",\"transports\":{\"tcp\":5}",
			"descriptor: transports.tcp: must be a base64 string");
	add_reject_root("transports-escaped-name", ",\"transports\":{\"a\\u0001\\\"\":null}",
			"descriptor: transports.a\\001\\\": must be a base64 string");
	add_reject_root("base64-short", ",\"transports\":{\"tcp\":\"A\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-unpadded", ",\"transports\":{\"tcp\":\"AA\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-triple-pad", ",\"transports\":{\"tcp\":\"A===\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-leading-pad", ",\"transports\":{\"tcp\":\"=AAA\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-bad-char", ",\"transports\":{\"tcp\":\"AA*A\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-whitespace", ",\"transports\":{\"tcp\":\"AAAA AAA=\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-url-alphabet", ",\"transports\":{\"tcp\":\"-_AA\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-noncanonical", ",\"transports\":{\"tcp\":\"AB==\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-noncanonical-1", ",\"transports\":{\"tcp\":\"AAB=\"}",
			"descriptor: transports.tcp: invalid base64");
	add_reject_root("base64-later-invalid",
			",\"transports\":{\"good\":\"AAAA\",\"tcp\":\"AA=A\"}",
			"descriptor: transports.tcp: invalid base64");
	s = g_strnfill(4 * ((DESCRIPTOR_MAX_BLOB + 2) / 3) + 4, 'A');
	add_reject_len("base64-too-long",
		       g_strdup_printf("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[],"
				       "\"transports\":{\"tcp\":\"%s\"}}",
				       s),
		       0, "descriptor: transports.tcp: decodes to more than 4096 bytes");
	g_free(s);
	/* 5464 characters is the longest text, yet it may decode to 4097 or 4098 bytes. */
	s = g_strnfill(4 * ((DESCRIPTOR_MAX_BLOB + 2) / 3), 'A');
	s[strlen(s) - 1] = '=';
	add_reject_len("base64-4097",
		       g_strdup_printf("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[],"
				       "\"transports\":{\"tcp\":\"%s\"}}",
				       s),
		       0, "descriptor: transports.tcp: decodes to more than 4096 bytes");
	g_free(s);

	/* buffers */
	add_reject("buffers-missing", "{\"name\":\"n\",\"generation\":\"1\"}",
		   "descriptor: buffers: missing");
	add_reject("buffers-object", "{\"name\":\"n\",\"generation\":\"1\",\"buffers\":{}}",
		   "descriptor: buffers: must be an array");
	add_reject_len("buffers-too-many",
		       json_repeat("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[",
				   "{\"addr\":\"", "\",\"length\":\"1\"}",
				   DESCRIPTOR_MAX_BUFFERS + 1, "]}"),
		       0, "descriptor: buffers: more than 65536 entries");
	add_reject("buffer-number",
		   "{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[{\"addr\":\"1\","
		   "\"length\":\"1\"},5]}",
		   "descriptor: buffers[1]: must be an object");
	add_reject_buffer("addr-missing", "\"length\":\"1\"",
			  "descriptor: buffers[1].addr: missing");
	add_reject_buffer("addr-int", "\"addr\":4096,\"length\":\"1\"", addr_err);
	add_reject_buffer("addr-0x", "\"addr\":\"0x\",\"length\":\"1\"", addr_err);
	add_reject_buffer("addr-0X", "\"addr\":\"0X10\",\"length\":\"1\"", addr_err);
	add_reject_buffer("addr-bad-hex", "\"addr\":\"0x1g\",\"length\":\"1\"", addr_err);
	add_reject_buffer("addr-hex-overflow", "\"addr\":\"0x10000000000000000\",\"length\":\"1\"",
			  addr_err);
	add_reject_buffer("addr-dec-overflow", "\"addr\":\"18446744073709551616\",\"length\":\"1\"",
			  addr_err);
	add_reject_buffer("addr-negative", "\"addr\":\"-1\",\"length\":\"1\"", addr_err);
	add_reject_buffer("addr-empty", "\"addr\":\"\",\"length\":\"1\"", addr_err);
	add_reject_buffer("length-missing", "\"addr\":\"0x1000\"",
			  "descriptor: buffers[1].length: missing");
	add_reject_buffer("length-zero", "\"addr\":\"0x1000\",\"length\":\"0\"",
			  "descriptor: buffers[1].length: must be > 0");
	add_reject_buffer("length-zero-int", "\"addr\":\"0x1000\",\"length\":0",
			  "descriptor: buffers[1].length: must be > 0");
	add_reject_buffer("length-hex", "\"addr\":\"0x1000\",\"length\":\"0x10\"", len_err);
	add_reject_buffer("length-text", "\"addr\":\"0x1000\",\"length\":\"abc\"", len_err);
	add_reject_buffer("wrap", "\"addr\":\"0xffffffffffffffff\",\"length\":\"2\"",
			  "descriptor: buffers[1].length: addr + length wraps around");
	add_reject_buffer("wrap-max", "\"addr\":\"0x2\",\"length\":\"18446744073709551615\"",
			  "descriptor: buffers[1].length: addr + length wraps around");
	add_reject_buffer("access-string", "\"addr\":\"0x1000\",\"length\":\"1\",\"access\":\"1\"",
			  "descriptor: buffers[1].access: must be an integer");
	add_reject_buffer("access-double", "\"addr\":\"0x1000\",\"length\":\"1\",\"access\":1.0",
			  "descriptor: buffers[1].access: must be an integer");
	add_reject_buffer("access-bit-4", "\"addr\":\"0x1000\",\"length\":\"1\",\"access\":4",
			  "descriptor: buffers[1].access: bits other than 1 (read) and 2 (write)");
	add_reject_buffer("access-negative", "\"addr\":\"0x1000\",\"length\":\"1\",\"access\":-1",
			  "descriptor: buffers[1].access: bits other than 1 (read) and 2 (write)");
	add_reject_buffer("location-number", "\"addr\":\"0x1000\",\"length\":\"1\",\"location\":0",
			  "descriptor: buffers[1].location: must be a string");
	add_reject_buffer("keys-array", "\"addr\":\"0x1000\",\"length\":\"1\",\"keys\":[]",
			  "descriptor: buffers[1].keys: must be an object");
	add_reject_buffer("keys-bad-base64",
			  "\"addr\":\"0x1000\",\"length\":\"1\",\"keys\":{\"x\":\"AAAA\","
			  "\"rdma\":\"!!!!\"}",
			  "descriptor: buffers[1].keys.rdma: invalid base64");
	add_reject_len(
		"keys-too-many",
		json_repeat("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[{\"addr\":\"0\","
			    "\"length\":\"1\",\"keys\":{",
			    "\"k", "\":\"\"", DESCRIPTOR_MAX_TRANSPORTS + 1, "}}]}"),
		0, "descriptor: buffers[0].keys: more than 32 entries");

	/* Overlaps name the JSON indices, whatever the sorted order. */
	add_reject_buffer("overlap-after", "\"addr\":\"0x100000\",\"length\":\"2\"",
			  "descriptor: buffers[1]: overlaps buffers[0]");
	add_reject_buffer("overlap-before", "\"addr\":\"0xff000\",\"length\":\"4097\"",
			  "descriptor: buffers[0]: overlaps buffers[1]");
	add_reject("overlap-before-sorted",
		   "{\"name\":\"n\",\"generation\":\"1\",\"buffers\":["
		   "{\"addr\":\"0x1800\",\"length\":\"1\"},"
		   "{\"addr\":\"0x1000\",\"length\":\"2049\"}]}",
		   "descriptor: buffers[0]: overlaps buffers[1]");
	add_reject(
		"overlap-contained",
		"{\"name\":\"n\",\"generation\":\"1\",\"buffers\":["
		"{\"addr\":\"0x9000\",\"length\":\"1\"},{\"addr\":\"0x1000\",\"length\":\"4096\"},"
		"{\"addr\":\"0x1800\",\"length\":\"1\",\"keys\":{\"a\":\"AA==\"}}]}",
		"descriptor: buffers[2]: overlaps buffers[1]");
	add_reject("overlap-at-top",
		   "{\"name\":\"n\",\"generation\":\"1\",\"buffers\":["
		   "{\"addr\":\"0xffffffffffffffff\",\"length\":\"1\"},"
		   "{\"addr\":\"0xfffffffffffff000\",\"length\":\"4096\"}]}",
		   "descriptor: buffers[0]: overlaps buffers[1]");
}

/* ---- lookups ---- */

static void test_find_buffer(void)
{
	struct descriptor *d = decode_ok(
		"{\"name\":\"n\",\"generation\":\"1\",\"buffers\":["
		"{\"addr\":\"0x2000\",\"length\":\"4096\",\"location\":\"b\"},"
		"{\"addr\":\"0x1000\",\"length\":\"4096\",\"location\":\"a\"},"
		"{\"addr\":\"0x10000\",\"length\":\"256\",\"location\":\"c\"},"
		"{\"addr\":\"0xfffffffffffff000\",\"length\":\"4096\",\"location\":\"top\"}]}");
	const struct descriptor_buffer *a = &d->buffers[0], *b = &d->buffers[1];
	const struct descriptor_buffer *c = &d->buffers[2], *top = &d->buffers[3];

	g_assert_cmpstr(a->location, ==, "a");
	/* First byte, whole buffer, last byte, and the next buffer's first and last. */
	g_assert_true(descriptor_find_buffer(d, 0x1000, 1) == a);
	g_assert_true(descriptor_find_buffer(d, 0x1000, 4096) == a);
	g_assert_true(descriptor_find_buffer(d, 0x1fff, 1) == a);
	g_assert_true(descriptor_find_buffer(d, 0x2000, 1) == b);
	g_assert_true(descriptor_find_buffer(d, 0x2fff, 1) == b);
	g_assert_true(descriptor_find_buffer(d, 0x100ff, 1) == c);
	/* Adjacent buffers are still two: a range spanning both is not found. */
	g_assert_null(descriptor_find_buffer(d, 0x1fff, 2));
	g_assert_null(descriptor_find_buffer(d, 0x1000, 8192));
	g_assert_null(descriptor_find_buffer(d, 0x1000, 4097));
	/* Below the first buffer, in gaps, and just past a buffer. */
	g_assert_null(descriptor_find_buffer(d, 0xfff, 1));
	g_assert_null(descriptor_find_buffer(d, 0, 1));
	g_assert_null(descriptor_find_buffer(d, 0x3000, 1));
	g_assert_null(descriptor_find_buffer(d, 0xffff, 2));
	g_assert_null(descriptor_find_buffer(d, 0x10100, 1));
	g_assert_null(descriptor_find_buffer(d, 0x1000, 0));
	/* The top buffer ends exactly at 2^64; ranges that wrap are refused. */
	g_assert_true(descriptor_find_buffer(d, UINT64_MAX, 1) == top);
	g_assert_true(descriptor_find_buffer(d, UINT64_MAX - 4095, 4096) == top);
	g_assert_null(descriptor_find_buffer(d, UINT64_MAX, 2));
	g_assert_null(descriptor_find_buffer(d, 0x1000, UINT64_MAX));
	g_assert_null(descriptor_find_buffer(d, UINT64_MAX - 4095, 4097));
	g_assert_null(descriptor_find_buffer(NULL, 0x1000, 1));
	descriptor_free(d);
}

static void test_find_blob(void)
{
	struct descriptor *d =
		decode_ok("{\"name\":\"n\",\"generation\":\"1\",\"buffers\":[],"
			  "\"transports\":{\"tcp\":\"dGNw\",\"rdma\":\"\",\"shm\":\"AQID\"}}");
	GBytes *b;

	b = descriptor_find_blob(d->transports, d->n_transports, "tcp");
	g_assert_nonnull(b);
	g_assert_cmpmem(g_bytes_get_data(b, NULL), g_bytes_get_size(b), "tcp", 3);
	b = descriptor_find_blob(d->transports, d->n_transports, "rdma");
	g_assert_nonnull(b);
	g_assert_cmpuint(g_bytes_get_size(b), ==, 0);
	b = descriptor_find_blob(d->transports, d->n_transports, "shm");
	g_assert_cmpmem(g_bytes_get_data(b, NULL), g_bytes_get_size(b), "\x01\x02\x03", 3);
	g_assert_null(descriptor_find_blob(d->transports, d->n_transports, "efa"));
	g_assert_null(descriptor_find_blob(d->transports, d->n_transports, "tc"));
	g_assert_null(descriptor_find_blob(d->transports, d->n_transports, NULL));
	g_assert_null(descriptor_find_blob(NULL, 0, "tcp"));
	descriptor_free(d);
}

static void test_free_null(void)
{
	descriptor_free(NULL);
}

int main(int argc, char **argv)
{
	int rc;

	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/descriptor/round-trip/basic", test_round_trip_basic);
	g_test_add_func("/descriptor/round-trip/many-buffers", test_round_trip_many_buffers);
	g_test_add_func("/descriptor/round-trip/binary-blobs", test_round_trip_binary_blobs);
	g_test_add_func("/descriptor/round-trip/extremes", test_round_trip_extremes);
	g_test_add_func("/descriptor/round-trip/unicode-name", test_round_trip_unicode_name);
	g_test_add_func("/descriptor/decode/defaults", test_decode_defaults);
	g_test_add_func("/descriptor/decode/number-forms", test_decode_number_forms);
	g_test_add_func("/descriptor/decode/unknown-members", test_decode_unknown_members);
	g_test_add_func("/descriptor/decode/sorts-buffers", test_decode_sorts_buffers);
	g_test_add_func("/descriptor/decode/not-nul-terminated", test_decode_not_nul_terminated);
	reject_cases = g_ptr_array_new_with_free_func(free_reject_case);
	add_reject_cases();
	g_test_add_func("/descriptor/find-buffer", test_find_buffer);
	g_test_add_func("/descriptor/find-blob", test_find_blob);
	g_test_add_func("/descriptor/free-null", test_free_null);
	rc = g_test_run();
	g_ptr_array_unref(reject_cases);
	return rc;
}
