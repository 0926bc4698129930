/* SPDX-License-Identifier: Apache-2.0 */
/* rpc_test.c: control-plane codec, server under load and abuse, limits, authentication, client,
 * and the engine side of it (secret files, notify quotas). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include <te/te.h>

#include "core/control.h"
#include "core/log.h"
#include "core/rpc.h"
#include "logcap_core.h"

/* Every wait in this file is bounded by this, and none is expected to come near it. */
#define WAIT_S 30
#define CALL_MS (WAIT_S * 1000)
#define N_CLIENTS 64
/* Shared secrets of the tests: at least 16 bytes, as the configuration requires. */
#define SECRET "s3cret-for-the-rpc-tests"
#define SECRET_WRONG "s3cret-for-the-rpc-tests!"

/* --- the test server's handler ------------------------------------------------------ */

struct fixture {
	struct logcap_sink log;
	struct rpc_server *srv;
	const char *addr;
	GMutex lock;
	GCond cond;
	guint barrier;	   /* handshakes to "barrier" that arrived */
	guint barrier_n;   /* how many to wait for */
	gboolean released; /* "block" handshakes may return */
	guint blocked;	   /* "block" handshakes waiting */
	guint notifies;
	char last_sender[RPC_MAX_NAME + 1];
	uint32_t max_body;
};

static const char desc_json[] = "{\"name\":\"seg\",\"generation\":\"7\"}";

static enum te_status fx_handshake(struct fixture *fx, const struct rpc_request *req,
				   GByteArray *reply)
{
	gint64 end = g_get_monotonic_time() + WAIT_S * G_USEC_PER_SEC;
	gboolean ok = TRUE;

	if (strcmp(req->name, "barrier") == 0) {
		/* Returns only once barrier_n handlers run at the same time. */
		g_mutex_lock(&fx->lock);
		fx->barrier++;
		g_cond_broadcast(&fx->cond);
		while (ok && fx->barrier < fx->barrier_n)
			ok = g_cond_wait_until(&fx->cond, &fx->lock, end);
		g_mutex_unlock(&fx->lock);
		g_byte_array_append(reply, (const guint8 *)"barrier", 7);
		return ok ? TE_OK : TE_ERR_TIMEOUT;
	}
	if (strcmp(req->name, "block") == 0) {
		g_mutex_lock(&fx->lock);
		fx->blocked++;
		g_cond_broadcast(&fx->cond);
		while (ok && !fx->released)
			ok = g_cond_wait_until(&fx->cond, &fx->lock, end);
		g_mutex_unlock(&fx->lock);
		return TE_OK;
	}
	if (strcmp(req->name, "big") == 0) {
		g_byte_array_set_size(reply, fx->max_body + 1);
		memset(reply->data, 'b', reply->len);
		return TE_OK;
	}
	if (strcmp(req->name, "large") == 0) {
		g_byte_array_set_size(reply, 8u << 20);
		for (guint i = 0; i < reply->len; i++)
			reply->data[i] = (uint8_t)(i * 31);
		return TE_OK;
	}
	if (strcmp(req->name, "missing") == 0) {
		const char *text = "no plugin 'missing' here";

		g_byte_array_append(reply, (const guint8 *)text, (guint)strlen(text));
		return TE_ERR_PLUGIN_NOT_FOUND;
	}
	if (strcmp(req->name, "busy") == 0)
		return TE_ERR_BUSY;
	/* Echo: "<plugin>:<payload>". */
	g_byte_array_append(reply, (const guint8 *)req->name, (guint)strlen(req->name));
	g_byte_array_append(reply, (const guint8 *)":", 1);
	if (req->payload_len)
		g_byte_array_append(reply, req->payload, (guint)req->payload_len);
	return TE_OK;
}

static enum te_status fx_handle(void *user, const struct rpc_request *req, GByteArray *reply)
{
	struct fixture *fx = user;

	g_assert_nonnull(req->peer);
	switch (req->type) {
	case RPC_DESC_FETCH:
		g_byte_array_append(reply, (const guint8 *)desc_json, sizeof(desc_json) - 1);
		return TE_OK;
	case RPC_PROBE:
		g_assert_null(req->name);
		g_byte_array_append(reply, (const guint8 *)"probe:", 6);
		if (req->len)
			g_byte_array_append(reply, req->body, (guint)req->len);
		return TE_OK;
	case RPC_HANDSHAKE:
		return fx_handshake(fx, req, reply);
	case RPC_NOTIFY:
		g_mutex_lock(&fx->lock);
		fx->notifies++;
		g_strlcpy(fx->last_sender, req->name, sizeof(fx->last_sender));
		g_mutex_unlock(&fx->lock);
		return TE_OK;
	}
	g_assert_not_reached();
	return TE_ERR_INTERNAL;
}

static struct fixture *fx_new(void)
{
	struct fixture *fx = g_new0(struct fixture, 1);

	logcap_sink_init(&fx->log);
	g_mutex_init(&fx->lock);
	g_cond_init(&fx->cond);
	return fx;
}

/* Start a server; @cfg may be NULL for the defaults. */
static void fx_start(struct fixture *fx, const struct rpc_server_config *cfg)
{
	struct rpc_server_config c = { 0 };
	g_autofree char *err = NULL;

	if (cfg)
		c = *cfg;
	c.handle = fx_handle;
	c.user = fx;
	c.log = &fx->log.sink;
	fx->max_body = c.max_body ? c.max_body : RPC_DEFAULT_MAX_BODY;
	g_assert_cmpint(rpc_server_start(&c, &fx->srv, &err), ==, TE_OK);
	g_assert_null(err);
	fx->addr = rpc_server_address(fx->srv);
}

static void fx_release(struct fixture *fx)
{
	g_mutex_lock(&fx->lock);
	fx->released = TRUE;
	g_cond_broadcast(&fx->cond);
	g_mutex_unlock(&fx->lock);
}

static void fx_free(struct fixture *fx)
{
	fx_release(fx);
	rpc_server_stop(fx->srv);
	g_cond_clear(&fx->cond);
	g_mutex_clear(&fx->lock);
	logcap_sink_clear(&fx->log);
	g_free(fx);
}

static struct rpc_client *client_new(struct fixture *fx, const char *secret)
{
	struct rpc_client *c = NULL;

	g_assert_cmpint(rpc_client_new(secret, secret ? strlen(secret) : 0, &fx->log.sink, &c), ==,
			TE_OK);
	return c;
}

/* One call that must succeed with @want_status; returns the reply as a string. */
static char *call_ok(struct rpc_client *c, const char *addr, uint8_t type, const void *body,
		     size_t len, int32_t want_status)
{
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 1;
	enum te_status st;
	gsize n;
	char *s;

	st = rpc_client_call(c, addr, type, body, len, CALL_MS, &reply, &status, &err);
	if (st != TE_OK)
		g_printerr("# call to %s failed: %s\n", addr, err);
	g_assert_cmpint(st, ==, TE_OK);
	g_assert_null(err);
	g_assert_cmpint(status, ==, want_status);
	s = g_strndup(g_bytes_get_data(reply, &n), g_bytes_get_size(reply));
	g_assert_cmpuint(strlen(s), ==, n);
	g_bytes_unref(reply);
	return s;
}

static char *handshake_ok(struct rpc_client *c, const char *addr, const char *plugin,
			  const char *payload, int32_t want_status)
{
	g_autoptr(GByteArray) body = g_byte_array_new();

	g_assert_cmpint(rpc_body_pack(body, plugin, payload, strlen(payload)), ==, TE_OK);
	return call_ok(c, addr, RPC_HANDSHAKE, body->data, body->len, want_status);
}

/* A fresh client can still fetch, probe and handshake. */
static void assert_serving(struct fixture *fx)
{
	struct rpc_client *c = client_new(fx, NULL);
	g_autofree char *desc = call_ok(c, fx->addr, RPC_DESC_FETCH, NULL, 0, TE_OK);
	g_autofree char *probe = call_ok(c, fx->addr, RPC_PROBE, "x", 1, TE_OK);
	g_autofree char *hs = handshake_ok(c, fx->addr, "tcp", "qp=1", TE_OK);

	g_assert_cmpstr(desc, ==, desc_json);
	g_assert_cmpstr(probe, ==, "probe:x");
	g_assert_cmpstr(hs, ==, "tcp:qp=1");
	rpc_client_free(c);
}

/* --- raw sockets, for what a well-behaved client never sends ---------------------- */

static int raw_connect(const char *addr)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST };
	struct timeval tv = { .tv_sec = WAIT_S };
	g_autofree char *host = NULL;
	const char *colon = strrchr(addr, ':');
	struct addrinfo *res;
	int fd;

	g_assert_nonnull(colon);
	if (addr[0] == '[')
		host = g_strndup(addr + 1, (gsize)(colon - addr - 2));
	else
		host = g_strndup(addr, (gsize)(colon - addr));
	g_assert_cmpint(getaddrinfo(host, colon + 1, &hints, &res), ==, 0);
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	g_assert_cmpint(fd, >=, 0);
	g_assert_cmpint(connect(fd, res->ai_addr, res->ai_addrlen), ==, 0);
	freeaddrinfo(res);
	/* Bound every blocking read: a hang fails the test instead of stalling it. */
	g_assert_cmpint(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), ==, 0);
	return fd;
}

static void raw_send(int fd, const void *buf, size_t len)
{
	g_assert_cmpint(send(fd, buf, len, MSG_NOSIGNAL), ==, (ssize_t)len);
}

static void raw_recv_exact(int fd, uint8_t *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = recv(fd, buf + done, len - done, 0);

		g_assert_cmpint(n, >, 0);
		done += (size_t)n;
	}
}

/* Read one frame (bounded size) into *body_out. */
static void raw_read_frame(int fd, struct rpc_frame_header *hdr, GByteArray **body_out)
{
	uint8_t raw[RPC_HEADER_SIZE];
	GByteArray *body;

	raw_recv_exact(fd, raw, sizeof(raw));
	g_assert_cmpint(rpc_header_decode(raw, sizeof(raw), 1 << 20, hdr, NULL), ==, TE_OK);
	body = g_byte_array_sized_new(hdr->body_len);
	g_byte_array_set_size(body, hdr->body_len);
	raw_recv_exact(fd, body->data, hdr->body_len);
	*body_out = body;
}

/* Connect and read the greeting; *nonce_len_out is 0 without authentication. */
static int raw_open(const char *addr, uint8_t *nonce, size_t *nonce_len_out)
{
	struct rpc_frame_header hdr;
	g_autoptr(GByteArray) body = NULL;
	int fd = raw_connect(addr);

	raw_read_frame(fd, &hdr, &body);
	g_assert_cmpuint(hdr.type, ==, RPC_HELLO);
	g_assert_true(body->len == 0 || body->len == RPC_NONCE_SIZE);
	if (nonce)
		memcpy(nonce, body->data, body->len);
	if (nonce_len_out)
		*nonce_len_out = body->len;
	return fd;
}

/*
 * Read until the server closes (bounded by SO_RCVTIMEO: a timeout fails). Returns
 * the RPC_ERROR text it sent before closing, or NULL if it sent none.
 */
static char *raw_wait_closed(int fd, int32_t *status_out)
{
	g_autoptr(GByteArray) all = g_byte_array_new();
	struct rpc_frame_header hdr;
	size_t off = 0, flen;
	char *text = NULL;
	uint8_t buf[4096];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n == 0 || (n < 0 && errno == ECONNRESET))
			break;
		if (n < 0)
			g_error("server did not close the connection: %s", g_strerror(errno));
		g_byte_array_append(all, buf, (guint)n);
	}
	while (rpc_frame_decode(all->data + off, all->len - off, 1 << 20, &hdr, &flen, NULL) ==
	       TE_OK) {
		if (hdr.type == RPC_ERROR && !text) {
			text = g_strndup((const char *)all->data + off + RPC_HEADER_SIZE,
					 hdr.body_len);
			if (status_out)
				*status_out = hdr.status;
		}
		off += flen;
	}
	close(fd);
	return text;
}

static void header_bytes(uint8_t *out, uint32_t magic, uint8_t version, uint8_t type,
			 uint16_t flags, uint64_t id, int32_t status, uint32_t len)
{
	g_autoptr(GByteArray) f = g_byte_array_new();

	rpc_frame_append(f, type, id, status, NULL, 0);
	memcpy(out, f->data, RPC_HEADER_SIZE);
	out[0] = (uint8_t)magic;
	out[1] = (uint8_t)(magic >> 8);
	out[2] = (uint8_t)(magic >> 16);
	out[3] = (uint8_t)(magic >> 24);
	out[4] = version;
	out[6] = (uint8_t)flags;
	out[7] = (uint8_t)(flags >> 8);
	out[20] = (uint8_t)len;
	out[21] = (uint8_t)(len >> 8);
	out[22] = (uint8_t)(len >> 16);
	out[23] = (uint8_t)(len >> 24);
}

/* --- codec ---------------------------------------------------------------------------- */

static void test_codec_roundtrip(void)
{
	static const uint8_t types[] = {
		RPC_HELLO,	RPC_AUTH,	RPC_AUTH_OK,   RPC_ERROR,
		RPC_DESC_FETCH, RPC_DESC_REPLY, RPC_HANDSHAKE, RPC_HANDSHAKE_REPLY,
		RPC_NOTIFY,	RPC_NOTIFY_ACK, RPC_PROBE,     RPC_PROBE_REPLY
	};
	static const size_t lens[] = { 0, 1, 23, 24, 1000 };
	static const uint64_t ids[] = { 0, 1, 0x0123456789abcdefull, UINT64_MAX };

	for (size_t t = 0; t < G_N_ELEMENTS(types); t++) {
		for (size_t l = 0; l < G_N_ELEMENTS(lens); l++) {
			g_autoptr(GByteArray) f = g_byte_array_new();
			g_autofree uint8_t *body = g_malloc(lens[l] + 1);
			uint64_t id = ids[(t + l) % G_N_ELEMENTS(ids)];
			int32_t status = (int32_t)l - 2;
			struct rpc_frame_header hdr;
			size_t flen = 0;

			for (size_t i = 0; i < lens[l]; i++)
				body[i] = (uint8_t)(i * 7 + t);
			rpc_frame_append(f, types[t], id, status, body, lens[l]);
			/* A second frame behind the first must not disturb it. */
			rpc_frame_append(f, RPC_PROBE, 9, 0, "zz", 2);
			g_assert_cmpuint(f->len, ==, 2 * RPC_HEADER_SIZE + lens[l] + 2);
			g_assert_cmpmem(f->data, 4, "TECP", 4);
			g_assert_cmpint(rpc_frame_decode(f->data, f->len, 1000, &hdr, &flen, NULL),
					==, TE_OK);
			g_assert_cmpuint(hdr.type, ==, types[t]);
			g_assert_true(hdr.request_id == id);
			g_assert_cmpint(hdr.status, ==, status);
			g_assert_cmpuint(hdr.body_len, ==, lens[l]);
			g_assert_cmpuint(flen, ==, RPC_HEADER_SIZE + lens[l]);
			g_assert_cmpmem(f->data + RPC_HEADER_SIZE, lens[l], body, lens[l]);
			g_assert_cmpint(rpc_frame_decode(f->data + flen, f->len - flen, 2, &hdr,
							 &flen, NULL),
					==, TE_OK);
			g_assert_cmpuint(hdr.type, ==, RPC_PROBE);

			/* Every strict prefix: in progress, and nothing written. */
			for (size_t p = 0; p < RPC_HEADER_SIZE + lens[l]; p++) {
				struct rpc_frame_header h = { .type = 0xee };
				size_t fl = 12345;
				char *err = NULL;

				g_assert_cmpint(rpc_frame_decode(f->data, p, 1000, &h, &fl, &err),
						==, TE_INPROGRESS);
				g_assert_cmpuint(h.type, ==, 0xee);
				g_assert_cmpuint(fl, ==, 12345);
				g_assert_null(err);
			}
		}
	}
}

static void expect_reject(const uint8_t *buf, size_t len, size_t max_body, const char *want)
{
	struct rpc_frame_header hdr = { .type = 0xee };
	size_t flen = 777;
	g_autofree char *err = NULL;

	g_assert_cmpint(rpc_frame_decode(buf, len, max_body, &hdr, &flen, &err), ==,
			TE_ERR_PROTOCOL);
	g_assert_cmpstr(err, ==, want);
	g_assert_cmpuint(hdr.type, ==, 0xee);
	g_assert_cmpuint(flen, ==, 777);
	/* The reason is optional. */
	g_assert_cmpint(rpc_frame_decode(buf, len, max_body, &hdr, &flen, NULL), ==,
			TE_ERR_PROTOCOL);
	g_assert_cmpint(rpc_header_decode(buf, len, max_body, &hdr, NULL), ==, TE_ERR_PROTOCOL);
}

static void test_codec_reject(void)
{
	uint8_t h[RPC_HEADER_SIZE + 8] = { 0 };

	header_bytes(h, 0x58585858u, 1, RPC_PROBE, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "bad magic 0x58585858");
	/* Refused as soon as the bytes that are there cannot start a frame. */
	expect_reject(h, 4, 100, "bad magic 0x58585858");
	expect_reject((const uint8_t *)"X", 1, 100, "bad magic 0x58");
	expect_reject((const uint8_t *)"TEX", 3, 100, "bad magic 0x584554");
	header_bytes(h, RPC_MAGIC, 2, RPC_PROBE, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unsupported version 2");
	expect_reject(h, 5, 100, "unsupported version 2");
	header_bytes(h, RPC_MAGIC, 0, RPC_PROBE, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unsupported version 0");
	header_bytes(h, RPC_MAGIC, 1, 0, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unknown type 0");
	header_bytes(h, RPC_MAGIC, 1, 5, 0, 1, 0, 0);
	expect_reject(h, 6, 100, "unknown type 5");
	header_bytes(h, RPC_MAGIC, 1, 15, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unknown type 15");
	header_bytes(h, RPC_MAGIC, 1, 24, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unknown type 24");
	header_bytes(h, RPC_MAGIC, 1, 255, 0, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unknown type 255");
	header_bytes(h, RPC_MAGIC, 1, RPC_PROBE, 0x8001, 1, 0, 0);
	expect_reject(h, RPC_HEADER_SIZE, 100, "unknown flags 0x8001");
	header_bytes(h, RPC_MAGIC, 1, RPC_PROBE, 0, 1, 0, 101);
	expect_reject(h, RPC_HEADER_SIZE, 100, "body length 101 over limit 100");
	expect_reject(h, sizeof(h), 100, "body length 101 over limit 100");
	header_bytes(h, RPC_MAGIC, 1, RPC_PROBE, 0, 1, 0, UINT32_MAX);
	expect_reject(h, RPC_HEADER_SIZE, RPC_DEFAULT_MAX_BODY,
		      "body length 4294967295 over limit 16777216");
	/* Exactly at the limit is fine; in progress until the body is in. */
	header_bytes(h, RPC_MAGIC, 1, RPC_PROBE, 0, 1, 0, 8);
	{
		struct rpc_frame_header hdr;
		size_t flen;

		g_assert_cmpint(rpc_frame_decode(h, RPC_HEADER_SIZE + 7, 8, &hdr, &flen, NULL), ==,
				TE_INPROGRESS);
		g_assert_cmpint(rpc_header_decode(h, RPC_HEADER_SIZE, 8, &hdr, NULL), ==, TE_OK);
		g_assert_cmpuint(hdr.body_len, ==, 8);
		g_assert_cmpint(rpc_frame_decode(h, sizeof(h), 8, &hdr, &flen, NULL), ==, TE_OK);
		g_assert_cmpuint(flen, ==, sizeof(h));
		g_assert_cmpint(rpc_header_decode(h, 0, 8, &hdr, NULL), ==, TE_INPROGRESS);
	}
	g_assert_cmpstr(rpc_type_str(RPC_HANDSHAKE_REPLY), ==, "HANDSHAKE_REPLY");
	g_assert_cmpstr(rpc_type_str(99), ==, "unknown");
}

static void expect_unpack_reject(const void *body, size_t len, const char *want)
{
	const char *name = "untouched";
	const uint8_t *payload = (const uint8_t *)"p";
	size_t plen = 99;
	g_autofree char *err = NULL;

	g_assert_cmpint(rpc_body_unpack(body, len, &name, &payload, &plen, &err), ==,
			TE_ERR_PROTOCOL);
	g_assert_cmpstr(err, ==, want);
	g_assert_cmpstr(name, ==, "untouched");
	g_assert_cmpuint(plen, ==, 99);
}

static void test_codec_body(void)
{
	g_autoptr(GByteArray) b = g_byte_array_new();
	char long_name[RPC_MAX_NAME + 2];
	const uint8_t *payload;
	const char *name;
	size_t plen;

	g_assert_cmpint(rpc_body_pack(b, "tcp", "\0ab\0", 4), ==, TE_OK);
	g_assert_cmpmem(b->data, b->len, "tcp\0\0ab\0", 8);
	g_assert_cmpint(rpc_body_unpack(b->data, b->len, &name, &payload, &plen, NULL), ==, TE_OK);
	g_assert_cmpstr(name, ==, "tcp");
	g_assert_cmpmem(payload, plen, "\0ab\0", 4);

	g_byte_array_set_size(b, 0);
	g_assert_cmpint(rpc_body_pack(b, "engine-a", NULL, 0), ==, TE_OK);
	g_assert_cmpint(rpc_body_unpack(b->data, b->len, &name, &payload, &plen, NULL), ==, TE_OK);
	g_assert_cmpstr(name, ==, "engine-a");
	g_assert_null(payload);
	g_assert_cmpuint(plen, ==, 0);

	memset(long_name, 'n', sizeof(long_name));
	long_name[RPC_MAX_NAME] = '\0';
	g_byte_array_set_size(b, 0);
	g_assert_cmpint(rpc_body_pack(b, long_name, "x", 1), ==, TE_OK);
	g_assert_cmpint(rpc_body_unpack(b->data, b->len, &name, &payload, &plen, NULL), ==, TE_OK);
	g_assert_cmpuint(strlen(name), ==, RPC_MAX_NAME);

	/* Packing refuses what unpacking would. */
	g_byte_array_set_size(b, 0);
	long_name[RPC_MAX_NAME] = 'n';
	long_name[RPC_MAX_NAME + 1] = '\0';
	g_assert_cmpint(rpc_body_pack(b, long_name, NULL, 0), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(rpc_body_pack(b, "", NULL, 0), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(rpc_body_pack(b, "a\tb", NULL, 0), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(rpc_body_pack(b, "a", NULL, 3), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(rpc_body_pack(NULL, "a", NULL, 0), ==, TE_ERR_INVALID_ARG);
	g_assert_cmpuint(b->len, ==, 0);

	expect_unpack_reject(NULL, 0, "name without a NUL terminator");
	expect_unpack_reject("tcp", 3, "name without a NUL terminator");
	expect_unpack_reject("\0payload", 8, "empty name");
	expect_unpack_reject("a\x01z\0", 4, "name byte 1 is 0x01, not printable ASCII");
	expect_unpack_reject("\xff\0", 2, "name byte 0 is 0xff, not printable ASCII");
	expect_unpack_reject(long_name, RPC_MAX_NAME + 1, "name longer than 255 bytes");
	/* A NUL beyond the longest name does not make a name. */
	{
		g_autofree char *body = g_malloc0(RPC_MAX_NAME + 10);

		memset(body, 'n', RPC_MAX_NAME + 5);
		expect_unpack_reject(body, RPC_MAX_NAME + 10, "name longer than 255 bytes");
	}
}

/* --- server --------------------------------------------------------------------------- */

static void test_server_basic(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .max_body = 4096 };
	struct rpc_client *c;
	g_autoptr(GByteArray) nb = g_byte_array_new();
	g_autofree char *s = NULL;
	GBytes *reply = (GBytes *)&cfg;
	int32_t status = 1;
	char *err = NULL;

	fx_start(fx, &cfg);
	g_assert_true(g_str_has_prefix(fx->addr, "127.0.0.1:"));
	g_assert_cmpstr(fx->addr, !=, "127.0.0.1:0");
	c = client_new(fx, NULL);
	assert_serving(fx);

	/* Handler errors travel as the reply's status with a text body. */
	s = handshake_ok(c, fx->addr, "missing", "", TE_ERR_PLUGIN_NOT_FOUND);
	g_assert_cmpstr(s, ==, "no plugin 'missing' here");
	g_free(s);
	s = handshake_ok(c, fx->addr, "busy", "", TE_ERR_BUSY);
	g_assert_cmpstr(s, ==, te_status_str(TE_ERR_BUSY));
	g_free(s);
	s = handshake_ok(c, fx->addr, "big", "", TE_ERR_TOO_LARGE);
	g_assert_cmpstr(s, ==, "reply of 4097 bytes over limit 4096");
	g_assert_true(
		logcap_wait(&fx->log.cap, 1, "HANDSHAKE reply of 4097 bytes over limit", NULL));
	g_free(s);

	g_assert_cmpint(rpc_body_pack(nb, "engine-b", "hello", 5), ==, TE_OK);
	s = call_ok(c, fx->addr, RPC_NOTIFY, nb->data, nb->len, TE_OK);
	g_assert_cmpstr(s, ==, "");
	g_mutex_lock(&fx->lock);
	g_assert_cmpuint(fx->notifies, ==, 1);
	g_assert_cmpstr(fx->last_sender, ==, "engine-b");
	g_mutex_unlock(&fx->lock);
	g_free(s);

	/* Ten calls in a row reuse cached connections. */
	for (int i = 0; i < 10; i++) {
		s = call_ok(c, fx->addr, RPC_PROBE, NULL, 0, TE_OK);
		g_assert_cmpstr(s, ==, "probe:");
		g_free(s);
	}
	g_assert_cmpuint(logcap_count(&fx->log.cap, "connected", NULL), <, 10);
	s = NULL;

	/* Refused before anything is sent; outputs untouched. */
	g_assert_cmpint(rpc_client_call(c, fx->addr, RPC_DESC_REPLY, NULL, 0, CALL_MS, &reply,
					&status, &err),
			==, TE_ERR_INVALID_ARG);
	g_assert_nonnull(err);
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(rpc_client_call(c, fx->addr, RPC_PROBE, NULL, 0, 0, &reply, &status, NULL),
			==, TE_ERR_INVALID_ARG);
	g_assert_cmpint(
		rpc_client_call(c, fx->addr, RPC_PROBE, NULL, 1, CALL_MS, &reply, &status, NULL),
		==, TE_ERR_INVALID_ARG);
	{
		g_autofree uint8_t *huge = g_malloc0(RPC_DEFAULT_MAX_BODY + 1);

		g_assert_cmpint(rpc_client_call(c, fx->addr, RPC_PROBE, huge,
						RPC_DEFAULT_MAX_BODY + 1, CALL_MS, &reply, &status,
						&err),
				==, TE_ERR_TOO_LARGE);
		g_assert_nonnull(strstr(err, fx->addr));
		g_clear_pointer(&err, g_free);
	}
	g_assert_true(reply == (GBytes *)&cfg);
	g_assert_cmpint(status, ==, 1);

	/* A request over the server's limit: refused by the peer, connection dropped. */
	{
		g_autofree uint8_t *big = g_malloc0(5000);

		g_assert_cmpint(rpc_client_call(c, fx->addr, RPC_PROBE, big, 5000, CALL_MS, &reply,
						&status, &err),
				==, TE_ERR_PROTOCOL);
		g_assert_nonnull(strstr(err, "body length 5000 over limit 4096"));
		g_clear_pointer(&err, g_free);
	}
	assert_serving(fx);
	rpc_client_free(c);
	fx_free(fx);
}

struct worker {
	struct fixture *fx;
	int index;
	int calls;
	char *failure; /* first wrong answer */
};

static void worker_check(struct worker *w, char *got, const char *want)
{
	if (!w->failure && g_strcmp0(got, want) != 0)
		w->failure = g_strdup_printf("client %d: got '%s', want '%s'", w->index, got, want);
	g_free(got);
}

/* A call from a client thread: a failure is recorded for the main thread to report. */
static char *worker_call(struct worker *w, struct rpc_client *c, uint8_t type, const void *body,
			 size_t len)
{
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 1;
	enum te_status st;
	char *s;

	st = rpc_client_call(c, w->fx->addr, type, body, len, CALL_MS, &reply, &status, &err);
	if (st != TE_OK || status != TE_OK) {
		if (reply)
			g_bytes_unref(reply);
		return g_strdup_printf("call failed: %s status %d: %s", te_status_str(st), status,
				       err);
	}
	w->calls++;
	s = g_strndup(g_bytes_get_data(reply, NULL), g_bytes_get_size(reply));
	g_bytes_unref(reply);
	return s;
}

static gpointer worker_run(gpointer data)
{
	struct worker *w = data;
	struct rpc_client *c = NULL;
	g_autoptr(GByteArray) b = g_byte_array_new();

	if (rpc_client_new(NULL, 0, &w->fx->log.sink, &c) != TE_OK) {
		w->failure = g_strdup("rpc_client_new");
		return NULL;
	}
	/* All N_CLIENTS handshakes must be in the server at the same time to return. */
	if (w->fx->barrier_n) {
		g_assert_cmpint(rpc_body_pack(b, "barrier", NULL, 0), ==, TE_OK);
		worker_check(w, worker_call(w, c, RPC_HANDSHAKE, b->data, b->len), "barrier");
	}
	for (int i = 0; i < 12; i++) {
		g_autofree char *payload = g_strdup_printf("c%d-i%d", w->index, i);
		g_autofree char *want = NULL;

		switch ((w->index + i) % 3) {
		case 0:
			worker_check(w, worker_call(w, c, RPC_DESC_FETCH, NULL, 0), desc_json);
			break;
		case 1:
			want = g_strdup_printf("probe:%s", payload);
			worker_check(w, worker_call(w, c, RPC_PROBE, payload, strlen(payload)),
				     want);
			break;
		default:
			g_byte_array_set_size(b, 0);
			g_assert_cmpint(rpc_body_pack(b, "rdma", payload, strlen(payload)), ==,
					TE_OK);
			want = g_strdup_printf("rdma:%s", payload);
			worker_check(w, worker_call(w, c, RPC_HANDSHAKE, b->data, b->len), want);
			break;
		}
	}
	rpc_client_free(c);
	return NULL;
}

static void run_clients(struct fixture *fx)
{
	struct worker w[N_CLIENTS] = { 0 };
	GThread *t[N_CLIENTS];
	int calls = 0;

	for (int i = 0; i < N_CLIENTS; i++) {
		w[i].fx = fx;
		w[i].index = i;
		t[i] = g_thread_new("client", worker_run, &w[i]);
	}
	for (int i = 0; i < N_CLIENTS; i++) {
		g_thread_join(t[i]);
		if (w[i].failure)
			g_printerr("# %s\n", w[i].failure);
		g_assert_null(w[i].failure);
		calls += w[i].calls;
	}
	g_assert_cmpint(calls, ==, N_CLIENTS * (12 + (fx->barrier_n ? 1 : 0)));
}

static void test_server_large(void)
{
	struct fixture *fx = fx_new();
	struct rpc_client *c;
	g_autoptr(GByteArray) b = g_byte_array_new();
	g_autofree uint8_t *big = g_malloc(8u << 20);
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	const uint8_t *data;
	int32_t status = 1;
	gsize n;

	/* Megabytes each way: partial reads and writes on both sides. */
	fx_start(fx, NULL);
	c = client_new(fx, NULL);
	g_assert_cmpint(rpc_body_pack(b, "large", NULL, 0), ==, TE_OK);
	g_assert_cmpint(rpc_client_call(c, fx->addr, RPC_HANDSHAKE, b->data, b->len, CALL_MS,
					&reply, &status, &err),
			==, TE_OK);
	g_assert_cmpint(status, ==, TE_OK);
	data = g_bytes_get_data(reply, &n);
	g_assert_cmpuint(n, ==, 8u << 20);
	for (gsize i = 0; i < n; i++)
		if (data[i] != (uint8_t)(i * 31))
			g_error("byte %zu of the reply is wrong", (size_t)i);
	g_bytes_unref(reply);
	for (size_t i = 0; i < (8u << 20); i++)
		big[i] = (uint8_t)(i * 7);
	g_assert_cmpint(rpc_client_call(c, fx->addr, RPC_PROBE, big, 8u << 20, CALL_MS, &reply,
					&status, &err),
			==, TE_OK);
	data = g_bytes_get_data(reply, &n);
	g_assert_cmpuint(n, ==, (8u << 20) + 6);
	g_assert_cmpmem(data, 6, "probe:", 6);
	g_assert_true(memcmp(data + 6, big, 8u << 20) == 0);
	g_bytes_unref(reply);
	rpc_client_free(c);
	fx_free(fx);
}

static void test_server_pipelined(void)
{
	struct fixture *fx = fx_new();
	g_autoptr(GByteArray) f = g_byte_array_new();
	int fd;

	/* Requests sent back to back are answered one by one, in order. */
	fx_start(fx, NULL);
	fd = raw_open(fx->addr, NULL, NULL);
	for (uint64_t id = 1; id <= 3; id++)
		rpc_frame_append(f, RPC_PROBE, id, 0, "p", 1);
	raw_send(fd, f->data, f->len);
	for (uint64_t id = 1; id <= 3; id++) {
		g_autoptr(GByteArray) body = NULL;
		struct rpc_frame_header hdr;

		raw_read_frame(fd, &hdr, &body);
		g_assert_cmpuint(hdr.type, ==, RPC_PROBE_REPLY);
		g_assert_true(hdr.request_id == id);
		g_assert_cmpmem(body->data, body->len, "probe:p", 7);
	}
	close(fd);
	fx_free(fx);
}

static void test_server_concurrent(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .handler_threads = N_CLIENTS };

	fx->barrier_n = N_CLIENTS;
	fx_start(fx, &cfg);
	run_clients(fx);
	g_assert_cmpuint(fx->barrier, ==, N_CLIENTS);
	fx_free(fx);
}

static void test_server_concurrent_small_pool(void)
{
	struct fixture *fx = fx_new();

	/* 64 clients queue on the default 4 handler threads. */
	fx_start(fx, NULL);
	run_clients(fx);
	fx_free(fx);
}

/* Send @bytes on a fresh connection; the server must answer RPC_ERROR @want and close. */
static void expect_refused(struct fixture *fx, const void *bytes, size_t len, int32_t want_status,
			   const char *want)
{
	int fd = raw_open(fx->addr, NULL, NULL);
	int32_t status = 0;
	g_autofree char *text = NULL;

	raw_send(fd, bytes, len);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==, want);
	g_assert_cmpint(status, ==, want_status);
	g_assert_true(logcap_wait(&fx->log.cap, 1, want, "closing the connection"));
	assert_serving(fx);
}

static void test_server_malformed(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .max_body = 4096 };
	uint8_t h[RPC_HEADER_SIZE];
	g_autoptr(GByteArray) f = g_byte_array_new();
	g_autofree uint8_t *noise = g_malloc(8192);
	GRand *rand = g_rand_new_with_seed(42);

	fx_start(fx, &cfg);

	header_bytes(h, 0x58585858u, 1, RPC_PROBE, 0, 1, 0, 0);
	expect_refused(fx, h, sizeof(h), TE_ERR_PROTOCOL, "bad magic 0x58585858");
	header_bytes(h, RPC_MAGIC, 9, RPC_PROBE, 0, 1, 0, 0);
	expect_refused(fx, h, sizeof(h), TE_ERR_PROTOCOL, "unsupported version 9");
	header_bytes(h, RPC_MAGIC, 1, 77, 0, 1, 0, 0);
	expect_refused(fx, h, sizeof(h), TE_ERR_PROTOCOL, "unknown type 77");
	header_bytes(h, RPC_MAGIC, 1, RPC_PROBE, 4, 1, 0, 0);
	expect_refused(fx, h, sizeof(h), TE_ERR_PROTOCOL, "unknown flags 0x0004");
	header_bytes(h, RPC_MAGIC, 1, RPC_PROBE, 0, 1, 0, 4097);
	expect_refused(fx, h, sizeof(h), TE_ERR_PROTOCOL, "body length 4097 over limit 4096");
	/* Valid frames a client has no business sending. */
	rpc_frame_append(f, RPC_DESC_REPLY, 1, 0, "{}", 2);
	expect_refused(fx, f->data, f->len, TE_ERR_PROTOCOL,
		       "unexpected DESC_REPLY frame from a client");
	g_byte_array_set_size(f, 0);
	rpc_frame_append(f, RPC_AUTH, 1, 0, NULL, 0);
	expect_refused(fx, f->data, f->len, TE_ERR_PROTOCOL, "unexpected AUTH frame from a client");
	g_byte_array_set_size(f, 0);
	rpc_frame_append(f, RPC_HANDSHAKE, 1, 0, "tcp", 3);
	expect_refused(fx, f->data, f->len, TE_ERR_PROTOCOL,
		       "HANDSHAKE body: name without a NUL terminator");
	g_byte_array_set_size(f, 0);
	rpc_frame_append(f, RPC_NOTIFY, 1, 0, "\0msg", 4);
	expect_refused(fx, f->data, f->len, TE_ERR_PROTOCOL, "NOTIFY body: empty name");
	/* A good request first, then garbage on the same connection. */
	g_byte_array_set_size(f, 0);
	rpc_frame_append(f, RPC_PROBE, 5, 0, NULL, 0);
	g_byte_array_append(f, (const guint8 *)"JUNKJUNK", 8);
	{
		int fd = raw_open(fx->addr, NULL, NULL);
		struct rpc_frame_header hdr;
		g_autoptr(GByteArray) body = NULL;
		g_autofree char *text = NULL;

		raw_send(fd, f->data, f->len);
		raw_read_frame(fd, &hdr, &body);
		g_assert_cmpuint(hdr.type, ==, RPC_PROBE_REPLY);
		g_assert_true(hdr.request_id == 5);
		text = raw_wait_closed(fd, NULL);
		g_assert_cmpstr(text, ==, "bad magic 0x4b4e554a");
	}
	/* Random bytes (not starting with the magic). */
	for (int round = 0; round < 4; round++) {
		int fd = raw_open(fx->addr, NULL, NULL);
		g_autofree char *text = NULL;

		for (int i = 0; i < 8192; i++)
			noise[i] = (uint8_t)g_rand_int(rand);
		noise[0] = 'Z';
		raw_send(fd, noise, 64 + (size_t)round * 2000);
		text = raw_wait_closed(fd, NULL);
		g_assert_true(g_str_has_prefix(text, "bad magic 0x"));
		assert_serving(fx);
	}
	/* Truncated: half a frame, then the client closes its side. */
	g_byte_array_set_size(f, 0);
	rpc_frame_append(f, RPC_PROBE, 5, 0, "0123456789", 10);
	{
		int fd = raw_open(fx->addr, NULL, NULL);
		g_autofree char *text = NULL;

		raw_send(fd, f->data, RPC_HEADER_SIZE + 4);
		g_assert_cmpint(shutdown(fd, SHUT_WR), ==, 0);
		text = raw_wait_closed(fd, NULL);
		g_assert_null(text);
		g_assert_true(logcap_wait(&fx->log.cap, 1,
					  "peer closed mid-frame, 28 bytes into it", NULL));
		assert_serving(fx);
	}
	g_rand_free(rand);
	fx_free(fx);
}

static void test_server_stall(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .idle_timeout_ms = 60000 };
	g_autoptr(GByteArray) f = g_byte_array_new();
	int fd;

	rpc_frame_append(f, RPC_PROBE, 5, 0, "0123456789", 10);

	/* While one client sits mid-frame (long timeout), the others are served. */
	fx_start(fx, &cfg);
	fd = raw_open(fx->addr, NULL, NULL);
	raw_send(fd, f->data, 10);
	assert_serving(fx);
	raw_send(fd, f->data + 10, 10);
	assert_serving(fx);
	close(fd);
	fx_free(fx);

	/* With a short frame timeout the stalled client is cut off, with the reason. */
	fx = fx_new();
	cfg.idle_timeout_ms = 200;
	cfg.frame_timeout_ms = 200;
	fx_start(fx, &cfg);
	fd = raw_open(fx->addr, NULL, NULL);
	raw_send(fd, f->data, RPC_HEADER_SIZE + 3);
	g_assert_null(raw_wait_closed(fd, NULL));
	g_assert_true(
		logcap_wait(&fx->log.cap, 1,
			    "stalled mid-frame (27 bytes of it): not complete 200 ms after its "
			    "first byte (control.frame_timeout_ms)",
			    NULL));
	/* A silent client is closed as idle (debug: not a fault). */
	fd = raw_open(fx->addr, NULL, NULL);
	g_assert_null(raw_wait_closed(fd, NULL));
	g_assert_true(logcap_wait(&fx->log.cap, 1, "idle for 200 ms", NULL));
	assert_serving(fx);
	fx_free(fx);
}

static void test_server_limit(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .max_connections = 4 };
	struct rpc_client *c;
	int fds[4], fd;
	int32_t status = 0;
	g_autofree char *text = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	enum te_status st;

	fx_start(fx, &cfg);
	for (int i = 0; i < 4; i++)
		fds[i] = raw_open(fx->addr, NULL, NULL);
	/* The fifth is told why and closed; the four are untouched. */
	fd = raw_connect(fx->addr);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==, "connection limit 4 reached (control.max_connections)");
	g_assert_cmpint(status, ==, TE_ERR_AGAIN);
	c = client_new(fx, NULL);
	st = rpc_client_call(c, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err);
	g_assert_cmpint(st, ==, TE_ERR_AGAIN);
	g_assert_nonnull(strstr(err, "connection limit 4 reached (control.max_connections)"));
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	/* Once the server has seen the closes, a client gets in again. */
	g_assert_true(logcap_wait(&fx->log.cap, 4, "peer closed", NULL));
	assert_serving(fx);
	rpc_client_free(c);
	fx_free(fx);
}

static void test_server_bad_config(void)
{
	static const struct {
		const char *addr;
		const char *why;
	} bad[] = {
		{ "nonsense", "expected host:port" },
		{ ":80", "expected host:port" },
		{ "::1:80", "an IPv6 host needs brackets" },
		{ "[::1]80", "expected [IPv6]:port" },
		{ "[]:80", "expected [IPv6]:port" },
		{ "127.0.0.1:", "port must be a number" },
		{ "127.0.0.1:65536", "port must be a number" },
		{ "127.0.0.1:8x", "port must be a number" },
		{ "127.0.0.1:-1", "port must be a number" },
	};
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .handle = fx_handle, .log = &fx->log.sink };
	struct rpc_server *srv = NULL;

	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *err = NULL;

		cfg.listen_addr = bad[i].addr;
		g_assert_cmpint(rpc_server_start(&cfg, &srv, &err), ==, TE_ERR_CONFIG);
		g_assert_nonnull(strstr(err, bad[i].why));
		g_assert_null(srv);
	}
	cfg.listen_addr = NULL;
	cfg.secret = "";
	g_assert_cmpint(rpc_server_start(&cfg, &srv, NULL), ==, TE_ERR_INVALID_ARG);
	cfg.secret_len = RPC_MAX_SECRET + 1;
	g_assert_cmpint(rpc_server_start(&cfg, &srv, NULL), ==, TE_ERR_INVALID_ARG);
	cfg.secret = NULL;
	cfg.secret_len = 0;
	cfg.handle = NULL;
	g_assert_cmpint(rpc_server_start(&cfg, &srv, NULL), ==, TE_ERR_INVALID_ARG);
	cfg.handle = fx_handle;
	cfg.handler_threads = RPC_MAX_HANDLER_THREADS + 1;
	g_assert_cmpint(rpc_server_start(&cfg, &srv, NULL), ==, TE_ERR_CONFIG);
	cfg.handler_threads = 0;
	cfg.max_body = (1u << 30) + 1;
	g_assert_cmpint(rpc_server_start(&cfg, &srv, NULL), ==, TE_ERR_CONFIG);
	cfg.max_body = 0;
	/* The memory for frames must hold a largest frame. */
	cfg.max_body = 1u << 20;
	cfg.max_buffered = (1u << 20) - 1;
	{
		g_autofree char *err = NULL;

		g_assert_cmpint(rpc_server_start(&cfg, &srv, &err), ==, TE_ERR_CONFIG);
		g_assert_nonnull(strstr(err, "max_buffered 1048575 is below max_body 1048576"));
	}
	cfg.max_body = 0;
	cfg.max_buffered = 0;

	/* The port of a running server is taken. */
	fx_start(fx, NULL);
	{
		g_autofree char *err = NULL;

		cfg.listen_addr = fx->addr;
		g_assert_cmpint(rpc_server_start(&cfg, &srv, &err), ==, TE_ERR_SYSTEM);
		g_assert_nonnull(strstr(err, fx->addr));
		g_assert_null(srv);
	}
	g_assert_cmpint(rpc_client_new("", 0, NULL, &(struct rpc_client *){ NULL }), ==,
			TE_ERR_INVALID_ARG);
	g_assert_cmpint(
		rpc_client_new(SECRET, RPC_MAX_SECRET + 1, NULL, &(struct rpc_client *){ NULL }),
		==, TE_ERR_INVALID_ARG);
	fx_free(fx);
}

static void test_server_stop_busy(void)
{
	struct fixture *fx = fx_new();
	g_autoptr(GByteArray) f = g_byte_array_new();
	int fds[3];

	/* Stopping with clients idle, mid-frame and unread closes them all. */
	fx_start(fx, NULL);
	rpc_frame_append(f, RPC_PROBE, 5, 0, "0123456789", 10);
	fds[0] = raw_open(fx->addr, NULL, NULL);
	fds[1] = raw_open(fx->addr, NULL, NULL);
	raw_send(fds[1], f->data, 7);
	fds[2] = raw_connect(fx->addr);
	assert_serving(fx);
	rpc_server_stop(fx->srv);
	fx->srv = NULL;
	g_assert_null(raw_wait_closed(fds[0], NULL));
	g_assert_null(raw_wait_closed(fds[1], NULL));
	close(fds[2]);
	rpc_server_stop(NULL);
	fx_free(fx);
}

/* --- authentication --------------------------------------------------------------------- */

static void test_auth(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .secret = SECRET,
					 .secret_len = strlen(SECRET),
					 .idle_timeout_ms = 60000 };
	struct rpc_client *good, *wrong, *none;
	g_autoptr(GByteArray) f = g_byte_array_new();
	g_autofree char *s = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	uint8_t nonce[RPC_NONCE_SIZE];
	size_t nonce_len = 0;
	int fd;

	fx_start(fx, &cfg);
	good = client_new(fx, SECRET);
	wrong = client_new(fx, SECRET_WRONG);
	none = client_new(fx, NULL);

	s = call_ok(good, fx->addr, RPC_DESC_FETCH, NULL, 0, TE_OK);
	g_assert_cmpstr(s, ==, desc_json);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "authenticated", NULL));

	g_assert_cmpint(rpc_client_call(wrong, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply,
					&status, &err),
			==, TE_ERR_AUTH);
	g_assert_nonnull(strstr(err, fx->addr));
	g_assert_nonnull(strstr(err, "authentication failed (wrong secret)"));
	g_assert_true(logcap_wait(&fx->log.cap, 1, "authentication failed (wrong secret)",
				  "closing the connection"));
	g_clear_pointer(&err, g_free);

	g_assert_cmpint(
		rpc_client_call(none, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_AUTH);
	g_assert_nonnull(strstr(err, "peer requires authentication"));
	g_clear_pointer(&err, g_free);

	/* A raw client that skips AUTH is refused, and the HELLO carried a nonce. */
	fd = raw_open(fx->addr, nonce, &nonce_len);
	g_assert_cmpuint(nonce_len, ==, RPC_NONCE_SIZE);
	rpc_frame_append(f, RPC_PROBE, 1, 0, NULL, 0);
	raw_send(fd, f->data, f->len);
	g_free(s);
	s = raw_wait_closed(fd, &status);
	g_assert_cmpstr(s, ==, "PROBE before authentication");
	g_assert_cmpint(status, ==, TE_ERR_AUTH);

	/* Before authentication only an AUTH-sized body is accepted. */
	fd = raw_open(fx->addr, NULL, NULL);
	g_byte_array_set_size(f, 0);
	rpc_frame_append(f, RPC_AUTH, 1, 0, NULL, 0);
	f->data[20] = 65;
	raw_send(fd, f->data, f->len);
	g_free(s);
	s = raw_wait_closed(fd, &status);
	g_assert_cmpstr(s, ==, "body length 65 over limit 64");
	g_byte_array_set_size(f, 0);
	fd = raw_open(fx->addr, NULL, NULL);
	rpc_frame_append(f, RPC_AUTH, 1, 0, nonce, 16);
	raw_send(fd, f->data, f->len);
	g_free(s);
	s = raw_wait_closed(fd, &status);
	g_assert_cmpstr(s, ==, "AUTH body of 16 bytes, not 64");

	/* The good client still works, on a fresh and on a cached connection. */
	g_free(s);
	s = call_ok(good, fx->addr, RPC_PROBE, "a", 1, TE_OK);
	g_assert_cmpstr(s, ==, "probe:a");
	g_free(s);
	s = handshake_ok(good, fx->addr, "efa", "addr", TE_OK);
	g_assert_cmpstr(s, ==, "efa:addr");
	rpc_client_free(good);
	rpc_client_free(wrong);
	rpc_client_free(none);
	fx_free(fx);

	/* A client with a secret refuses a server without one (no downgrade). */
	fx = fx_new();
	fx_start(fx, NULL);
	good = client_new(fx, SECRET);
	g_assert_cmpint(
		rpc_client_call(good, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_AUTH);
	g_assert_nonnull(strstr(err, "peer does not authenticate"));
	rpc_client_free(good);
	fx_free(fx);
}

/* A one-connection server scripted to misbehave, to test what the client accepts. */
enum fake_script {
	FAKE_BAD_PROOF,	 /* HELLO with a nonce, then an AUTH_OK that proves nothing */
	FAKE_GARBAGE,	 /* HELLO, then garbage instead of a reply */
	FAKE_WRONG_ID,	 /* HELLO, then a reply with another request id */
	FAKE_WRONG_TYPE, /* HELLO, then the wrong reply type */
	FAKE_CLOSE,	 /* HELLO, then close after reading the request */
	FAKE_SILENT,	 /* no HELLO at all */
	FAKE_BAD_HELLO,	 /* HELLO with a 5-byte nonce */
	FAKE_ERROR_ODD,	 /* RPC_ERROR with a status that is no error, and control bytes */
};

struct fake {
	enum fake_script script;
	int listen_fd;
	char addr[64];
	GThread *thread;
};

static gpointer fake_run(gpointer data)
{
	struct fake *fk = data;
	g_autoptr(GByteArray) out = g_byte_array_new();
	g_autoptr(GByteArray) body = NULL;
	struct rpc_frame_header hdr;
	uint8_t zeros[RPC_MAC_SIZE] = { 0 };
	int fd = accept(fk->listen_fd, NULL, NULL);
	struct timeval tv = { .tv_sec = WAIT_S };

	g_assert_cmpint(fd, >=, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	switch (fk->script) {
	case FAKE_SILENT:
		break;
	case FAKE_BAD_HELLO:
		rpc_frame_append(out, RPC_HELLO, 0, 0, "12345", 5);
		break;
	case FAKE_BAD_PROOF:
		rpc_frame_append(out, RPC_HELLO, 0, 0, zeros, RPC_NONCE_SIZE);
		break;
	case FAKE_ERROR_ODD:
		rpc_frame_append(out, RPC_ERROR, 0, 5, "go\naway", 7);
		break;
	default:
		rpc_frame_append(out, RPC_HELLO, 0, 0, NULL, 0);
		break;
	}
	raw_send(fd, out->data, out->len);
	g_byte_array_set_size(out, 0);
	if (fk->script != FAKE_SILENT && fk->script != FAKE_BAD_HELLO &&
	    fk->script != FAKE_ERROR_ODD)
		raw_read_frame(fd, &hdr, &body);
	switch (fk->script) {
	case FAKE_BAD_PROOF:
		rpc_frame_append(out, RPC_AUTH_OK, hdr.request_id, 0, zeros, sizeof(zeros));
		break;
	case FAKE_GARBAGE:
		g_byte_array_append(out, (const guint8 *)"HTTP/1.1 400 Bad Request\r\n\r\n", 28);
		break;
	case FAKE_WRONG_ID:
		rpc_frame_append(out, (uint8_t)(hdr.type + 1), hdr.request_id + 1, 0, NULL, 0);
		break;
	case FAKE_WRONG_TYPE:
		rpc_frame_append(out, RPC_NOTIFY_ACK, hdr.request_id, 0, NULL, 0);
		break;
	default:
		break;
	}
	if (out->len)
		raw_send(fd, out->data, out->len);
	if (fk->script != FAKE_CLOSE) {
		/* Until the client hangs up (bounded by SO_RCVTIMEO). */
		uint8_t sink[256];

		while (recv(fd, sink, sizeof(sink), 0) > 0)
			;
	}
	close(fd);
	return NULL;
}

static void fake_start(struct fake *fk, enum fake_script script)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);

	fk->script = script;
	fk->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	g_assert_cmpint(bind(fk->listen_fd, (struct sockaddr *)&sin, sizeof(sin)), ==, 0);
	g_assert_cmpint(listen(fk->listen_fd, 4), ==, 0);
	g_assert_cmpint(getsockname(fk->listen_fd, (struct sockaddr *)&sin, &sl), ==, 0);
	snprintf(fk->addr, sizeof(fk->addr), "127.0.0.1:%u", ntohs(sin.sin_port));
	fk->thread = g_thread_new("fake", fake_run, fk);
}

static void fake_expect(enum fake_script script, const char *secret, uint32_t timeout_ms,
			enum te_status want, const char *want_text)
{
	struct logcap_sink log;
	struct fake fk;
	struct rpc_client *c = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;

	logcap_sink_init(&log);
	fake_start(&fk, script);
	g_assert_cmpint(rpc_client_new(secret, secret ? strlen(secret) : 0, &log.sink, &c), ==,
			TE_OK);
	g_assert_cmpint(
		rpc_client_call(c, fk.addr, RPC_PROBE, NULL, 0, timeout_ms, &reply, &status, &err),
		==, want);
	if (!strstr(err, want_text))
		g_printerr("# got '%s'\n", err);
	g_assert_nonnull(strstr(err, want_text));
	g_assert_nonnull(strstr(err, fk.addr));
	g_assert_null(reply);
	rpc_client_free(c);
	g_thread_join(fk.thread);
	close(fk.listen_fd);
	logcap_sink_clear(&log);
}

static void test_client_vs_bad_servers(void)
{
	fake_expect(FAKE_BAD_PROOF, SECRET, CALL_MS, TE_ERR_AUTH,
		    "peer failed to prove it knows the secret");
	fake_expect(FAKE_GARBAGE, NULL, CALL_MS, TE_ERR_PROTOCOL, "reply: bad magic 0x50545448");
	fake_expect(FAKE_WRONG_ID, NULL, CALL_MS, TE_ERR_PROTOCOL, "PROBE_REPLY reply (request id");
	fake_expect(FAKE_WRONG_TYPE, NULL, CALL_MS, TE_ERR_PROTOCOL, "NOTIFY_ACK reply");
	fake_expect(FAKE_CLOSE, NULL, CALL_MS, TE_ERR_CONN_RESET, "connection closed by the peer");
	fake_expect(FAKE_SILENT, NULL, 200, TE_ERR_TIMEOUT, "no reply within 200 ms");
	fake_expect(FAKE_BAD_HELLO, NULL, CALL_MS, TE_ERR_PROTOCOL,
		    "expected HELLO, got HELLO with 5 bytes");
	fake_expect(FAKE_ERROR_ODD, NULL, CALL_MS, TE_ERR_PROTOCOL, "go?away");
}

/* --- client ------------------------------------------------------------------------------ */

struct blocked_call {
	struct rpc_client *c;
	const char *addr;
	uint32_t timeout_ms;
	enum te_status st;
	char *err;
};

static gpointer blocked_call_run(gpointer data)
{
	struct blocked_call *bc = data;
	g_autoptr(GByteArray) b = g_byte_array_new();
	GBytes *reply = NULL;
	int32_t status;

	g_assert_cmpint(rpc_body_pack(b, "block", NULL, 0), ==, TE_OK);
	bc->st = rpc_client_call(bc->c, bc->addr, RPC_HANDSHAKE, b->data, b->len, bc->timeout_ms,
				 &reply, &status, &bc->err);
	if (reply)
		g_bytes_unref(reply);
	return NULL;
}

static void test_client_errors(void)
{
	struct fixture *fx = fx_new();
	struct rpc_client *c = client_new(fx, NULL);
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	g_autofree char *closed_addr = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	int fd;

	/* A port nobody listens on: bound, then closed. */
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	g_assert_cmpint(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), ==, 0);
	g_assert_cmpint(getsockname(fd, (struct sockaddr *)&sin, &sl), ==, 0);
	closed_addr = g_strdup_printf("127.0.0.1:%u", ntohs(sin.sin_port));
	close(fd);
	g_assert_cmpint(
		rpc_client_call(c, closed_addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_PEER_UNREACHABLE);
	g_assert_nonnull(strstr(err, closed_addr));
	g_assert_nonnull(strstr(err, g_strerror(ECONNREFUSED)));
	g_clear_pointer(&err, g_free);

	g_assert_cmpint(
		rpc_client_call(c, "no-port", RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_INVALID_ARG);
	g_assert_nonnull(strstr(err, "expected host:port"));
	g_clear_pointer(&err, g_free);

	/* A handler that does not answer in time: the call times out, the server is fine. */
	fx_start(fx, NULL);
	{
		struct blocked_call bc = { .c = c, .addr = fx->addr, .timeout_ms = 300 };
		GThread *t = g_thread_new("blocked", blocked_call_run, &bc);

		g_thread_join(t);
		g_assert_cmpint(bc.st, ==, TE_ERR_TIMEOUT);
		g_assert_nonnull(strstr(bc.err, "no reply within 300 ms"));
		g_free(bc.err);
		/* The handler is still blocked; other connections are served meanwhile. */
		assert_serving(fx);
		fx_release(fx);
	}
	/* A cached connection to a server that went away is replaced transparently. */
	{
		g_autofree char *addr = g_strdup(fx->addr);
		struct rpc_server_config cfg = { .listen_addr = addr };
		g_autofree char *s = call_ok(c, addr, RPC_PROBE, NULL, 0, TE_OK);

		rpc_server_stop(fx->srv);
		fx->srv = NULL;
		fx_start(fx, &cfg);
		g_assert_cmpstr(fx->addr, ==, addr);
		g_free(s);
		s = call_ok(c, addr, RPC_PROBE, "again", 5, TE_OK);
		g_assert_cmpstr(s, ==, "probe:again");
	}
	rpc_client_free(c);
	rpc_client_free(NULL);
	fx_free(fx);
}

static void test_ipv6(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .listen_addr = "[::1]:0",
					 .secret = SECRET,
					 .secret_len = strlen(SECRET) };
	struct rpc_client *c;
	g_autofree char *err = NULL;
	g_autofree char *s = NULL;
	int probe = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };

	if (probe < 0 || bind(probe, (struct sockaddr *)&sin6, sizeof(sin6)) < 0) {
		if (probe >= 0)
			close(probe);
		g_test_skip("no IPv6 loopback here");
		fx_free(fx);
		return;
	}
	close(probe);
	cfg.handle = fx_handle;
	cfg.user = fx;
	cfg.log = &fx->log.sink;
	g_assert_cmpint(rpc_server_start(&cfg, &fx->srv, &err), ==, TE_OK);
	fx->addr = rpc_server_address(fx->srv);
	fx->max_body = RPC_DEFAULT_MAX_BODY;
	g_assert_true(g_str_has_prefix(fx->addr, "[::1]:"));
	c = client_new(fx, SECRET);
	s = call_ok(c, fx->addr, RPC_DESC_FETCH, NULL, 0, TE_OK);
	g_assert_cmpstr(s, ==, desc_json);
	g_free(s);
	s = handshake_ok(c, fx->addr, "tcp", "v6", TE_OK);
	g_assert_cmpstr(s, ==, "tcp:v6");
	/* Peers are named in the same bracketed form. */
	g_assert_true(logcap_wait(&fx->log.cap, 1, "rpc: [::1]:", "authenticated"));
	rpc_client_free(c);
	fx_free(fx);
}

static void test_wildcard_warns(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .listen_addr = "0.0.0.0:0" };

	/* Without a secret a non-loopback listener is allowed but called out. */
	fx_start(fx, &cfg);
	g_assert_true(g_str_has_prefix(fx->addr, "0.0.0.0:"));
	g_assert_cmpuint(logcap_count(&fx->log.cap, "without authentication", NULL), ==, 1);
	fx_free(fx);
}

/* --- limits: deadlines, connections, memory ------------------------------------------- */

/* Bytes a trickling client sends before giving up on being cut off (one per 300 ms). */
#define TRICKLE_MAX 200

/*
 * Send @bytes one at a time, 300 ms apart, as long as the server keeps the connection:
 * how many were sent when it closed it (TRICKLE_MAX or @len if it never did).
 */
static size_t raw_trickle(int fd, const uint8_t *bytes, size_t len)
{
	for (size_t i = 0; i < MIN(len, (size_t)TRICKLE_MAX); i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (send(fd, bytes + i, 1, MSG_NOSIGNAL) != 1)
			return i;
		/* Readable before the next byte is due: an EOF or a reset means closed. */
		if (poll(&p, 1, 300) > 0) {
			uint8_t sink[256];
			ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);

			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
				return i + 1;
		}
	}
	return MIN(len, (size_t)TRICKLE_MAX);
}

/* Connect from the loopback address @from (127.0.0.0/8 is all local): another host. */
static int raw_connect_from(const char *addr, const char *from)
{
	struct sockaddr_in src = { .sin_family = AF_INET };
	struct sockaddr_in dst = { .sin_family = AF_INET };
	struct timeval tv = { .tv_sec = WAIT_S };
	const char *colon = strrchr(addr, ':');
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	g_assert_cmpint(fd, >=, 0);
	g_assert_cmpint(inet_pton(AF_INET, from, &src.sin_addr), ==, 1);
	g_assert_cmpint(bind(fd, (struct sockaddr *)&src, sizeof(src)), ==, 0);
	g_assert_cmpint(inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr), ==, 1);
	dst.sin_port = htons((uint16_t)atoi(colon + 1));
	g_assert_cmpint(connect(fd, (struct sockaddr *)&dst, sizeof(dst)), ==, 0);
	g_assert_cmpint(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), ==, 0);
	return fd;
}

/* One request on an open raw connection; the reply's status, and its body in @text_out. */
static int32_t raw_call(int fd, uint8_t type, uint64_t id, const void *body, size_t len,
			char **text_out)
{
	g_autoptr(GByteArray) f = g_byte_array_new();
	g_autoptr(GByteArray) reply = NULL;
	struct rpc_frame_header hdr;

	rpc_frame_append(f, type, id, 0, body, len);
	raw_send(fd, f->data, f->len);
	raw_read_frame(fd, &hdr, &reply);
	g_assert_cmpuint(hdr.type, ==, type + 1u);
	g_assert_true(hdr.request_id == id);
	if (text_out)
		*text_out = g_strndup((const char *)reply->data, reply->len);
	return hdr.status;
}

static void test_server_slowloris_frame(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .idle_timeout_ms = 60000,
					 .auth_timeout_ms = 60000,
					 .frame_timeout_ms = 1000 };
	g_autoptr(GByteArray) f = g_byte_array_new();
	g_autofree uint8_t *body = g_malloc0(4096);
	g_autofree char *text = NULL;
	int fd;

	fx_start(fx, &cfg);
	fd = raw_open(fx->addr, NULL, NULL);
	g_assert_cmpint(raw_call(fd, RPC_PROBE, 1, "p", 1, &text), ==, TE_OK);
	g_assert_cmpstr(text, ==, "probe:p");
	/*
	 * A frame whose bytes keep coming, one every 300 ms, still has to be complete
	 * frame_timeout_ms after its first byte: the bytes do not keep the slot.
	 */
	rpc_frame_append(f, RPC_PROBE, 2, 0, body, 4096);
	g_assert_cmpuint(raw_trickle(fd, f->data, f->len), <, TRICKLE_MAX);
	close(fd);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "[warn] ",
				  "not complete 1000 ms after its first byte "
				  "(control.frame_timeout_ms); connection closed"));
	g_assert_cmpuint(logcap_count(&fx->log.cap, "stalled mid-frame (", "frame_timeout_ms"), ==,
			 1);
	assert_serving(fx);
	fx_free(fx);
}

static void test_server_auth_deadline(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .secret = SECRET,
					 .secret_len = strlen(SECRET),
					 .idle_timeout_ms = 60000,
					 .frame_timeout_ms = 60000,
					 .auth_timeout_ms = 1000 };
	g_autoptr(GByteArray) f = g_byte_array_new();
	uint8_t auth[RPC_NONCE_SIZE + RPC_MAC_SIZE] = { 0 };
	struct rpc_client *good;
	g_autofree char *s = NULL;
	int fd;

	/* From accept, absolute: trickling the AUTH frame does not buy time. */
	fx_start(fx, &cfg);
	fd = raw_open(fx->addr, NULL, NULL);
	rpc_frame_append(f, RPC_AUTH, 0, 0, auth, sizeof(auth));
	g_assert_cmpuint(raw_trickle(fd, f->data, f->len), <, f->len);
	close(fd);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "stalled mid-frame (",
				  "did not authenticate within 1000 ms of connecting "
				  "(control.auth_timeout_ms)"));
	/* A silent one goes the same way, whatever the idle timeout. */
	fd = raw_open(fx->addr, NULL, NULL);
	g_assert_null(raw_wait_closed(fd, NULL));
	g_assert_true(logcap_wait(&fx->log.cap, 2, "[warn] ",
				  "did not authenticate within 1000 ms of connecting"));
	good = client_new(fx, SECRET);
	s = call_ok(good, fx->addr, RPC_PROBE, "ok", 2, TE_OK);
	g_assert_cmpstr(s, ==, "probe:ok");
	rpc_client_free(good);
	fx_free(fx);

	/* Without a secret the first complete request must come within the deadline. */
	fx = fx_new();
	cfg.secret = NULL;
	cfg.secret_len = 0;
	fx_start(fx, &cfg);
	{
		int est = raw_open(fx->addr, NULL, NULL);
		g_autofree char *text = NULL;
		g_autofree uint8_t *body = g_malloc0(512);

		/* Established before the trickler connects: not subject to the deadline. */
		g_assert_cmpint(raw_call(est, RPC_PROBE, 1, "a", 1, &text), ==, TE_OK);
		fd = raw_open(fx->addr, NULL, NULL);
		g_byte_array_set_size(f, 0);
		rpc_frame_append(f, RPC_PROBE, 1, 0, body, 512);
		g_assert_cmpuint(raw_trickle(fd, f->data, f->len), <, TRICKLE_MAX);
		close(fd);
		g_assert_true(logcap_wait(&fx->log.cap, 1, "stalled mid-frame (",
					  "sent no complete request within 1000 ms of connecting "
					  "(control.auth_timeout_ms)"));
		/* More than auth_timeout_ms after its accept, it is still served. */
		g_free(text);
		text = NULL;
		g_assert_cmpint(raw_call(est, RPC_PROBE, 2, "b", 1, &text), ==, TE_OK);
		g_assert_cmpstr(text, ==, "probe:b");
		close(est);
	}
	fx_free(fx);
}

static void test_server_per_host_limit(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .max_connections_per_host = 3 };
	static const char want[] =
		"connection limit 3 per host reached for 127.0.0.1 (control.max_connections_per_host)";
	struct rpc_client *c;
	g_autofree char *text = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	int fds[3], fd;

	fx_start(fx, &cfg);
	for (int i = 0; i < 3; i++)
		fds[i] = raw_open(fx->addr, NULL, NULL);
	/* The fourth from this host is told why and closed. */
	fd = raw_connect(fx->addr);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==, want);
	g_assert_cmpint(status, ==, TE_ERR_AGAIN);
	c = client_new(fx, NULL);
	g_assert_cmpint(
		rpc_client_call(c, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_AGAIN);
	g_assert_nonnull(strstr(err, want));
	g_assert_true(logcap_wait(&fx->log.cap, 1, want, "connection refused"));
	/* Another host is served meanwhile. */
	fd = raw_connect_from(fx->addr, "127.0.0.2");
	{
		struct rpc_frame_header hdr;
		g_autoptr(GByteArray) body = NULL;
		g_autofree char *probe = NULL;

		raw_read_frame(fd, &hdr, &body);
		g_assert_cmpuint(hdr.type, ==, RPC_HELLO);
		g_assert_cmpint(raw_call(fd, RPC_PROBE, 1, "2", 1, &probe), ==, TE_OK);
		g_assert_cmpstr(probe, ==, "probe:2");
	}
	close(fd);
	/* Closing one frees a slot for this host, once the server has seen the close (and
	 * that of the other host's connection). */
	close(fds[0]);
	g_assert_true(logcap_wait(&fx->log.cap, 2, "peer closed", NULL));
	{
		g_autofree char *s = call_ok(c, fx->addr, RPC_PROBE, "x", 1, TE_OK);

		g_assert_cmpstr(s, ==, "probe:x");
	}
	rpc_client_free(c);
	close(fds[1]);
	close(fds[2]);
	fx_free(fx);
}

static void test_server_unauthenticated_limit(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .secret = SECRET,
					 .secret_len = strlen(SECRET),
					 .idle_timeout_ms = 60000,
					 .max_unauthenticated = 2 };
	static const char want[] =
		"limit of 2 connections not yet authenticated reached (control.max_unauthenticated)";
	struct rpc_client *good;
	g_autofree char *text = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	int fds[3], fd;

	fx_start(fx, &cfg);
	fds[0] = raw_open(fx->addr, NULL, NULL);
	fds[1] = raw_open(fx->addr, NULL, NULL);
	fd = raw_connect(fx->addr);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==, want);
	g_assert_cmpint(status, ==, TE_ERR_AGAIN);
	/* Even a client that knows the secret waits until one of them goes. */
	good = client_new(fx, SECRET);
	g_assert_cmpint(
		rpc_client_call(good, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_AGAIN);
	g_assert_nonnull(strstr(err, want));
	close(fds[0]);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "peer closed", NULL));
	{
		g_autofree char *s = call_ok(good, fx->addr, RPC_PROBE, "in", 2, TE_OK);

		g_assert_cmpstr(s, ==, "probe:in");
	}
	/* Authenticated, its connection no longer counts: one more may wait. */
	fds[2] = raw_open(fx->addr, NULL, NULL);
	fd = raw_connect(fx->addr);
	g_free(text);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==, want);
	rpc_client_free(good);
	close(fds[1]);
	close(fds[2]);
	fx_free(fx);
}

/* Start a frame of @type announcing @body_len bytes and send @sent bytes of its body. */
static int raw_partial(struct fixture *fx, uint8_t type, uint32_t body_len, size_t sent)
{
	g_autoptr(GByteArray) f = g_byte_array_new();
	g_autofree uint8_t *body = g_malloc0(body_len);
	int fd = raw_open(fx->addr, NULL, NULL);

	rpc_frame_append(f, type, 7, 0, body, body_len);
	raw_send(fd, f->data, RPC_HEADER_SIZE + sent);
	return fd;
}

static void test_server_max_buffered(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .max_body = 4096,
					 .max_buffered = 10000,
					 .idle_timeout_ms = 60000 };
	g_autoptr(GByteArray) f = g_byte_array_new();
	g_autofree uint8_t *zeros = g_malloc0(4096);
	g_autofree char *text = NULL;
	int32_t status = 0;
	int a, b, fd;

	atomic_store(&fx->log.sink.level, TE_LOG_TRACE);
	fx_start(fx, &cfg);
	/* A header reserves its whole body, however little of it has come. */
	a = raw_partial(fx, RPC_PROBE, 4000, 10);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "4000-byte body reserved (4000 of 10000", NULL));
	b = raw_partial(fx, RPC_PROBE, 4096, 0);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "4096-byte body reserved (8096 of 10000", NULL));
	/* The next that does not fit is refused with TE_ERR_BUSY and closed. */
	fd = raw_partial(fx, RPC_PROBE, 4096, 0);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==,
			"server busy: a 4096-byte PROBE body does not fit in the memory for frames "
			"(8096 of 10000 bytes in use, control.max_buffered); try again");
	g_assert_cmpint(status, ==, TE_ERR_BUSY);
	/* One that fits is served. */
	fd = raw_open(fx->addr, NULL, NULL);
	g_assert_cmpint(raw_call(fd, RPC_PROBE, 1, zeros, 1000, NULL), ==, TE_OK);
	close(fd);
	/* A complete frame gives its memory back: the room is there again. */
	raw_send(a, zeros, 4000 - 10);
	{
		struct rpc_frame_header hdr;
		g_autoptr(GByteArray) reply = NULL;

		raw_read_frame(a, &hdr, &reply);
		g_assert_cmpint(hdr.status, ==, TE_OK);
		g_assert_cmpuint(reply->len, ==, 4000 + 6);
	}
	fd = raw_partial(fx, RPC_PROBE, 4096, 100);
	g_assert_true(logcap_wait(&fx->log.cap, 1, "4096-byte body reserved (8192 of 10000", NULL));
	/* So does a connection closed mid-frame. */
	close(b);
	g_assert_true(
		logcap_wait(&fx->log.cap, 1, "peer closed mid-frame, 24 bytes into it", NULL));
	close(fd);
	g_assert_true(
		logcap_wait(&fx->log.cap, 1, "peer closed mid-frame, 124 bytes into it", NULL));
	close(a);

	/* Requests held by handlers count too, until the handler returns. */
	g_byte_array_set_size(f, 0);
	for (int i = 0; i < 2; i++) {
		g_autoptr(GByteArray) hb = g_byte_array_new();
		int h = raw_open(fx->addr, NULL, NULL);

		g_assert_cmpint(rpc_body_pack(hb, "block", zeros, 4000 - 6), ==, TE_OK);
		rpc_frame_append(f, RPC_HANDSHAKE, 1, 0, hb->data, hb->len);
		raw_send(h, f->data, f->len);
		g_byte_array_set_size(f, 0);
		g_mutex_lock(&fx->lock);
		while (fx->blocked < (guint)i + 1)
			g_assert_true(g_cond_wait_until(&fx->cond, &fx->lock,
							g_get_monotonic_time() +
								WAIT_S * G_USEC_PER_SEC));
		g_mutex_unlock(&fx->lock);
		if (i == 0)
			a = h;
		else
			b = h;
	}
	fd = raw_partial(fx, RPC_PROBE, 4096, 0);
	g_free(text);
	text = raw_wait_closed(fd, &status);
	g_assert_cmpstr(text, ==,
			"server busy: a 4096-byte PROBE body does not fit in the memory for frames "
			"(8000 of 10000 bytes in use, control.max_buffered); try again");
	fx_release(fx);
	for (int i = 0; i < 2; i++) {
		struct rpc_frame_header hdr;
		g_autoptr(GByteArray) reply = NULL;

		raw_read_frame(i ? b : a, &hdr, &reply);
		g_assert_cmpuint(hdr.type, ==, RPC_HANDSHAKE_REPLY);
		g_assert_cmpint(hdr.status, ==, TE_OK);
	}
	g_assert_cmpint(raw_call(a, RPC_PROBE, 2, zeros, 4000, NULL), ==, TE_OK);
	close(a);
	close(b);
	assert_serving(fx);
	fx_free(fx);
}

/* Sum of N over the lines "... (and N more like it since the last warning ...)". */
static guint capture_sum_demoted(struct logcap_sink *c, const char *a)
{
	guint sum = 0;

	g_mutex_lock(&c->cap.lock);
	for (guint i = 0; i < c->cap.lines->len; i++) {
		const char *line = c->cap.lines->pdata[i];
		const char *more = strstr(line, "(and ");
		unsigned n = 0;

		if (g_str_has_prefix(line, "[warn] ") && strstr(line, a) && more &&
		    sscanf(more, "(and %u more like it", &n) == 1)
			sum += n;
	}
	g_mutex_unlock(&c->cap.lock);
	return sum;
}

static void test_server_refusal_log_rate(void)
{
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .max_connections_per_host = 1 };
	const guint flood = 30;
	guint warned, demoted;
	int keep, fd;

	fx_start(fx, &cfg);
	keep = raw_open(fx->addr, NULL, NULL);
	for (guint i = 0; i < flood; i++) {
		fd = raw_connect(fx->addr);
		g_free(raw_wait_closed(fd, NULL));
	}
	/* Past the one-second window the next refusal is a warning with the count. */
	g_usleep(1100 * 1000);
	fd = raw_connect(fx->addr);
	g_free(raw_wait_closed(fd, NULL));
	g_assert_true(logcap_wait(&fx->log.cap, flood + 1, "connection refused", NULL));
	warned = logcap_count(&fx->log.cap, "[warn] ", "connection refused");
	demoted = logcap_count(&fx->log.cap, "[debug] ", "connection refused");
	/* Every refusal is logged once, as a warning or at debug level counted by the next
	 * warning; a flood makes no more than one warning a second. */
	g_assert_cmpuint(warned + demoted, ==, flood + 1);
	g_assert_cmpuint(capture_sum_demoted(&fx->log, "connection refused"), ==, demoted);
	g_assert_cmpuint(demoted, >, 0);
	g_assert_true(
		logcap_wait(&fx->log.cap, 1, "[warn] ", "more like it since the last warning"));
	close(keep);
	fx_free(fx);
}

static void test_auth_secret_bytes(void)
{
	/* The secret is bytes: what follows a NUL counts, and so does the NUL. */
	static const char srv_secret[] = "ab\0cdefghijklmnopqrstu";
	static const char other[] = "ab\0cdefghijklmnopqrstX";
	struct fixture *fx = fx_new();
	struct rpc_server_config cfg = { .secret = srv_secret,
					 .secret_len = sizeof(srv_secret) - 1,
					 .idle_timeout_ms = 60000 };
	struct rpc_client *same = NULL, *diff = NULL, *cut = NULL;
	g_autofree char *err = NULL;
	g_autofree char *s = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;

	fx_start(fx, &cfg);
	g_assert_cmpint(rpc_client_new(srv_secret, sizeof(srv_secret) - 1, &fx->log.sink, &same),
			==, TE_OK);
	g_assert_cmpint(rpc_client_new(other, sizeof(other) - 1, &fx->log.sink, &diff), ==, TE_OK);
	g_assert_cmpint(rpc_client_new(srv_secret, 2, &fx->log.sink, &cut), ==, TE_OK);
	s = call_ok(same, fx->addr, RPC_PROBE, "n", 1, TE_OK);
	g_assert_cmpstr(s, ==, "probe:n");
	g_assert_cmpint(
		rpc_client_call(diff, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_AUTH);
	g_assert_nonnull(strstr(err, "authentication failed (wrong secret)"));
	g_clear_pointer(&err, g_free);
	g_assert_cmpint(
		rpc_client_call(cut, fx->addr, RPC_PROBE, NULL, 0, CALL_MS, &reply, &status, &err),
		==, TE_ERR_AUTH);
	g_assert_nonnull(strstr(err, "authentication failed (wrong secret)"));
	rpc_client_free(same);
	rpc_client_free(diff);
	rpc_client_free(cut);
	fx_free(fx);
}

/* --- the engine's control plane: secret files, notify quotas ------------------------- */

/* Write @len bytes to @dir/@name with @mode; the path (g_free). */
static char *secret_file(const char *dir, const char *name, const void *bytes, size_t len,
			 mode_t mode)
{
	char *path = g_build_filename(dir, name, NULL);

	g_assert_true(g_file_set_contents(path, bytes, (gssize)len, NULL));
	g_assert_cmpint(chmod(path, mode), ==, 0);
	return path;
}

/* control_secret_load on @path must fail with exactly @want_tmpl, "%s" there being @path. */
static void secret_refused(const char *path, const char *want_tmpl)
{
	g_auto(GStrv) parts = g_strsplit(want_tmpl, "%s", -1);
	g_autofree char *want = g_strjoinv(path, parts);
	g_autofree char *err = NULL;
	char *secret = (char *)"untouched";
	size_t len = 77;

	g_assert_cmpint(control_secret_load(path, &secret, &len, &err), ==, TE_ERR_CONFIG);
	g_assert_cmpstr(err, ==, want);
	g_assert_cmpstr(secret, ==, "untouched");
	g_assert_cmpuint(len, ==, 77);
}

/* control_secret_load on @path must give exactly @want_len bytes @want. */
static void secret_loaded(const char *path, const void *want, size_t want_len)
{
	g_autofree char *err = NULL;
	g_autofree char *secret = NULL;
	size_t len = 0;

	if (control_secret_load(path, &secret, &len, &err) != TE_OK)
		g_error("%s", err);
	g_assert_null(err);
	g_assert_cmpmem(secret, len, want, want_len);
}

static void test_secret_file(void)
{
	static const char nul_file[] = "ab\0cdefghijklmnopq\n";
	g_autofree char *dir = g_dir_make_tmp("rpc-test-XXXXXX", NULL);
	g_autofree char *big = g_strnfill(5000, 's');
	g_autofree char *fifo = g_build_filename(dir, "fifo", NULL);
	char *p;

	g_assert_nonnull(dir);
	/* NUL bytes are part of the secret, and nothing but one final newline goes. */
	p = secret_file(dir, "nul", nul_file, sizeof(nul_file) - 1, 0600);
	secret_loaded(p, nul_file, sizeof(nul_file) - 2);
	g_free(p);
	p = secret_file(dir, "lf", "0123456789abcdef\n", 17, 0600);
	secret_loaded(p, "0123456789abcdef", 16);
	g_free(p);
	p = secret_file(dir, "crlf", "0123456789abcdef\r\n", 18, 0400);
	secret_loaded(p, "0123456789abcdef", 16);
	g_free(p);
	p = secret_file(dir, "two-lf", "0123456789abcdef\n\n", 18, 0600);
	secret_loaded(p, "0123456789abcdef\n", 17);
	g_free(p);
	p = secret_file(dir, "blanks", " 0123456789abcdef \r", 19, 0600);
	secret_loaded(p, " 0123456789abcdef \r", 19);
	g_free(p);
	p = secret_file(dir, "max", big, 4096, 0600);
	secret_loaded(p, big, 4096);
	g_free(p);

	/* Too short, empty, too large. */
	p = secret_file(dir, "short", "0123456789abcde\n", 16, 0600);
	secret_refused(p, "auth.secret_file: %s holds 15 bytes, too short (at least 16; a final "
			  "newline does not count)");
	g_free(p);
	p = secret_file(dir, "empty", "\n", 1, 0600);
	secret_refused(p, "auth.secret_file: %s is empty");
	g_free(p);
	p = secret_file(dir, "over", big, 4097, 0600);
	secret_refused(p, "auth.secret_file: %s is 4097 bytes, over the 4096-byte limit");
	g_free(p);
	p = secret_file(dir, "big", big, 5000, 0600);
	secret_refused(p, "auth.secret_file: %s is 5000 bytes, over the 4096-byte limit");
	g_free(p);

	/* Readable or writable by others: refused with the fix. */
	p = secret_file(dir, "0644", "0123456789abcdef", 16, 0644);
	secret_refused(p, "auth.secret_file: %s is readable by group or others (mode 0644); run "
			  "chmod 600 %s");
	g_free(p);
	p = secret_file(dir, "0620", "0123456789abcdef", 16, 0620);
	secret_refused(p, "auth.secret_file: %s is writable by group or others (mode 0620); run "
			  "chmod 600 %s");
	g_free(p);
	p = secret_file(dir, "0606", "0123456789abcdef", 16, 0606);
	secret_refused(p, "auth.secret_file: %s is readable and writable by group or others (mode "
			  "0606); run chmod 600 %s");
	g_free(p);
	p = secret_file(dir, "0610", "0123456789abcdef", 16, 0610);
	secret_refused(p, "auth.secret_file: %s is accessible by group or others (mode 0610); run "
			  "chmod 600 %s");
	g_free(p);

	/* Not a regular file: never read (a FIFO would block, /dev/zero never ends). */
	secret_refused("/dev/zero",
		       "auth.secret_file: %s is not a regular file (character device)");
	secret_refused(dir, "auth.secret_file: %s is not a regular file (directory)");
	g_assert_cmpint(mkfifo(fifo, 0600), ==, 0);
	secret_refused(fifo, "auth.secret_file: %s is not a regular file (FIFO)");
	g_assert_cmpint(g_unlink(fifo), ==, 0);
	p = g_build_filename(dir, "missing", NULL);
	{
		g_autofree char *want = g_strdup_printf("auth.secret_file: cannot open %%s: %s",
							g_strerror(ENOENT));

		secret_refused(p, want);
	}
	g_free(p);

	{
		static const char *const names[] = { "nul",  "lf",    "crlf",  "two-lf", "blanks",
						     "max",  "short", "empty", "over",	 "big",
						     "0644", "0620",  "0606",  "0610" };

		for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
			g_autofree char *f = g_build_filename(dir, names[i], NULL);

			g_assert_cmpint(g_unlink(f), ==, 0);
		}
	}
	g_assert_cmpint(g_rmdir(dir), ==, 0);
}

/* An engine on 127.0.0.1 with the loopback transport and @extra YAML; NULL on failure. */
static struct te_engine *engine_start(struct logcap_sink *log, const char *extra,
				      enum te_status want)
{
	g_autofree char *yaml = g_strdup_printf("engine: {listen: \"127.0.0.1:0\"}\n"
						"transports: [{name: loopback, required: true}]\n"
						"%s",
						extra);
	struct te_engine_opts opts = { .size = sizeof(opts),
				       .config_yaml = yaml,
				       .config_yaml_len = strlen(yaml),
				       .config_name = "rpc-test.yaml",
				       .log_fn = logcap_fn,
				       .log_user = &log->cap,
				       .log_level = TE_LOG_DEBUG };
	struct te_engine *e = NULL;
	enum te_status st = te_engine_new(&opts, &e);

	if (st != want)
		g_error("te_engine_new: %s (%s), expected %s", te_status_str(st), te_last_error(),
			te_status_str(want));
	return e;
}

static void test_engine_secret(void)
{
	static const char bytes[] = "ab\0cdefghijklmnopq";
	g_autofree char *dir = g_dir_make_tmp("rpc-test-XXXXXX", NULL);
	g_autofree char *path = secret_file(dir, "secret", bytes, sizeof(bytes), 0600);
	g_autofree char *yaml = g_strdup_printf("auth: {secret_file: \"%s\"}\n", path);
	struct logcap_sink log;
	struct rpc_client *full = NULL, *cut = NULL;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	struct te_engine *e;

	logcap_sink_init(&log);
	/* The file holds bytes, NUL and the final newline (the array's own NUL here, so the
	 * file ends "q\0": nothing is dropped) included. */
	e = engine_start(&log, yaml, TE_OK);
	g_assert_cmpint(rpc_client_new(bytes, sizeof(bytes), &log.sink, &full), ==, TE_OK);
	g_assert_cmpint(rpc_client_new(bytes, 2, &log.sink, &cut), ==, TE_OK);
	g_assert_cmpint(rpc_client_call(full, te_engine_name(e), RPC_PROBE, NULL, 0, CALL_MS,
					&reply, &status, &err),
			==, TE_OK);
	g_assert_cmpint(status, ==, TE_OK);
	g_bytes_unref(reply);
	reply = NULL;
	g_assert_cmpint(rpc_client_call(cut, te_engine_name(e), RPC_PROBE, NULL, 0, CALL_MS, &reply,
					&status, &err),
			==, TE_ERR_AUTH);
	g_assert_nonnull(strstr(err, "authentication failed (wrong secret)"));
	rpc_client_free(full);
	rpc_client_free(cut);
	te_engine_free(e);

	/* Engine start refuses a file others may read, saying how to fix it. */
	g_assert_cmpint(chmod(path, 0644), ==, 0);
	g_assert_null(engine_start(&log, yaml, TE_ERR_CONFIG));
	g_assert_nonnull(strstr(te_last_error(), "is readable by group or others (mode 0644); "
						 "run chmod 600"));
	g_assert_nonnull(strstr(te_last_error(), path));
	/* An inline secret is held to the same length at parse time, with its position. */
	g_assert_null(engine_start(&log, "auth: {secret: s3cr3t!!!}\n", TE_ERR_CONFIG));
	g_assert_nonnull(strstr(te_last_error(), "rpc-test.yaml:3:16: auth.secret: 9 bytes is "
						 "too short (at least 16)"));
	/* An inline secret of 16 bytes authenticates as those bytes. */
	e = engine_start(&log, "auth: {secret: 0123456789abcdef}\n", TE_OK);
	g_assert_cmpint(rpc_client_new("0123456789abcdef", 16, &log.sink, &full), ==, TE_OK);
	g_assert_cmpint(rpc_client_call(full, te_engine_name(e), RPC_PROBE, NULL, 0, CALL_MS,
					&reply, &status, &err),
			==, TE_OK);
	g_bytes_unref(reply);
	rpc_client_free(full);
	te_engine_free(e);

	g_assert_cmpint(g_unlink(path), ==, 0);
	g_assert_cmpint(g_rmdir(dir), ==, 0);
	logcap_sink_clear(&log);
}

/* One NOTIFY from @sender with sequence @seq on raw connection @fd: its status and text. */
static int32_t raw_notify(int fd, const char *sender, uint64_t seq, const char *msg,
			  char **text_out)
{
	g_autoptr(GByteArray) payload = g_byte_array_new();
	g_autoptr(GByteArray) body = g_byte_array_new();
	uint8_t hdr[16];

	/* generation u64, sequence u64, little-endian, then the message */
	for (int i = 0; i < 8; i++) {
		hdr[i] = (uint8_t)(UINT64_C(0x1234) >> (8 * i));
		hdr[8 + i] = (uint8_t)(seq >> (8 * i));
	}
	g_byte_array_append(payload, hdr, sizeof(hdr));
	g_byte_array_append(payload, (const guint8 *)msg, (guint)strlen(msg));
	g_assert_cmpint(rpc_body_pack(body, sender, payload->data, payload->len), ==, TE_OK);
	return raw_call(fd, RPC_NOTIFY, seq, body->data, body->len, text_out);
}

static void notify_ok(int fd, const char *sender, uint64_t seq, const char *msg)
{
	g_autofree char *text = NULL;
	int32_t st = raw_notify(fd, sender, seq, msg, &text);

	if (st != TE_OK)
		g_error("notify %s #%" G_GUINT64_FORMAT ": %s: %s", sender, seq, te_status_str(st),
			text);
}

static void notify_busy(int fd, const char *sender, uint64_t seq, const char *want)
{
	g_autofree char *text = NULL;

	g_assert_cmpint(raw_notify(fd, sender, seq, "x", &text), ==, TE_ERR_BUSY);
	g_assert_cmpstr(text, ==, want);
}

static void test_engine_notify_quota(void)
{
	struct logcap_sink log;
	struct te_notify got[8];
	struct te_engine *e;
	struct rpc_frame_header hdr;
	g_autoptr(GByteArray) hello = NULL;
	size_t n = 0;
	int a, b;

	logcap_sink_init(&log);
	e = engine_start(&log,
			 "control: {notify_per_sender: 3, notify_per_host: 5, notify_inbox: 8}\n",
			 TE_OK);
	a = raw_open(te_engine_name(e), NULL, NULL);
	b = raw_connect_from(te_engine_name(e), "127.0.0.2");
	raw_read_frame(b, &hdr, &hello);
	g_assert_cmpuint(hdr.type, ==, RPC_HELLO);

	/* One sender floods: over its quota it is refused, and another still gets in. */
	for (uint64_t seq = 1; seq <= 3; seq++)
		notify_ok(a, "flood", seq, "f");
	notify_busy(a, "flood", 4,
		    "notify refused: 3 messages from sender \"flood\" at 127.0.0.1 wait in the "
		    "inbox, the per-sender limit (control.notify_per_sender); the receiver takes "
		    "them with te_notify_recv");
	g_assert_true(logcap_wait(&log.cap, 1, "[warn] ", "the per-sender limit"));
	notify_ok(a, "honest", 1, "h1");
	notify_ok(a, "honest", 2, "h2");
	/* Any number of names from one host: the host has its own quota. */
	notify_busy(a, "another-name", 1,
		    "notify refused: 5 messages from 127.0.0.1 wait in the inbox, the per-host "
		    "limit (control.notify_per_host); the receiver takes them with te_notify_recv");
	/* Names are the client's choice: the same name from another host is another sender. */
	notify_ok(b, "flood", 1, "bf");
	notify_ok(b, "b", 1, "b1");
	/* Nor can it pass for the first host's message: seen keys include the address. */
	notify_ok(b, "honest", 1, "bh");
	notify_busy(b, "b", 2,
		    "notify refused: the inbox holds 8 messages, its limit (control.notify_inbox); "
		    "the receiver takes them with te_notify_recv");
	/* A resend of a message that arrived is acknowledged, not counted. */
	notify_ok(a, "flood", 1, "f");

	/* Taking messages frees their quota. */
	g_assert_cmpint(te_notify_recv(e, got, 2, &n), ==, TE_OK);
	g_assert_cmpuint(n, ==, 2);
	g_assert_cmpstr(got[0].sender, ==, "flood");
	g_assert_cmpmem(got[0].msg, got[0].len, "f", 1);
	notify_ok(a, "flood", 4, "f4");
	notify_ok(b, "b", 2, "b2");
	g_assert_cmpint(te_notify_recv(e, got, G_N_ELEMENTS(got), &n), ==, TE_OK);
	g_assert_cmpuint(n, ==, 8);
	g_assert_cmpstr(got[0].sender, ==, "flood");
	g_assert_cmpstr(got[1].sender, ==, "honest");
	g_assert_cmpmem(got[1].msg, got[1].len, "h1", 2);
	g_assert_cmpstr(got[3].sender, ==, "flood");
	g_assert_cmpmem(got[3].msg, got[3].len, "bf", 2);
	g_assert_cmpstr(got[5].sender, ==, "honest");
	g_assert_cmpmem(got[5].msg, got[5].len, "bh", 2);
	g_assert_cmpmem(got[6].msg, got[6].len, "f4", 2);
	g_assert_cmpmem(got[7].msg, got[7].len, "b2", 2);
	g_assert_cmpint(te_notify_recv(e, got, G_N_ELEMENTS(got), &n), ==, TE_OK);
	g_assert_cmpuint(n, ==, 0);
	/* Every quota is back to empty. */
	for (uint64_t seq = 10; seq < 13; seq++)
		notify_ok(a, "flood", seq, "again");
	close(a);
	close(b);
	te_engine_free(e);
	logcap_sink_clear(&log);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/rpc/codec/roundtrip", test_codec_roundtrip);
	g_test_add_func("/rpc/codec/reject", test_codec_reject);
	g_test_add_func("/rpc/codec/body", test_codec_body);
	g_test_add_func("/rpc/server/basic", test_server_basic);
	g_test_add_func("/rpc/server/large", test_server_large);
	g_test_add_func("/rpc/server/pipelined", test_server_pipelined);
	g_test_add_func("/rpc/server/concurrent", test_server_concurrent);
	g_test_add_func("/rpc/server/concurrent-small-pool", test_server_concurrent_small_pool);
	g_test_add_func("/rpc/server/malformed", test_server_malformed);
	g_test_add_func("/rpc/server/stall", test_server_stall);
	g_test_add_func("/rpc/server/limit", test_server_limit);
	g_test_add_func("/rpc/server/slowloris-frame", test_server_slowloris_frame);
	g_test_add_func("/rpc/server/auth-deadline", test_server_auth_deadline);
	g_test_add_func("/rpc/server/per-host-limit", test_server_per_host_limit);
	g_test_add_func("/rpc/server/unauthenticated-limit", test_server_unauthenticated_limit);
	g_test_add_func("/rpc/server/max-buffered", test_server_max_buffered);
	g_test_add_func("/rpc/server/refusal-log-rate", test_server_refusal_log_rate);
	g_test_add_func("/rpc/server/bad-config", test_server_bad_config);
	g_test_add_func("/rpc/server/stop-busy", test_server_stop_busy);
	g_test_add_func("/rpc/auth", test_auth);
	g_test_add_func("/rpc/auth/secret-bytes", test_auth_secret_bytes);
	g_test_add_func("/rpc/engine/secret-file", test_secret_file);
	g_test_add_func("/rpc/engine/secret", test_engine_secret);
	g_test_add_func("/rpc/engine/notify-quota", test_engine_notify_quota);
	g_test_add_func("/rpc/client/bad-servers", test_client_vs_bad_servers);
	g_test_add_func("/rpc/client/errors", test_client_errors);
	g_test_add_func("/rpc/ipv6", test_ipv6);
	g_test_add_func("/rpc/wildcard-warns", test_wildcard_warns);
	return g_test_run();
}
