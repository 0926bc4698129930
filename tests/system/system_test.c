/* SPDX-License-Identifier: Apache-2.0 */
/* system_test.c: an initiator engine in this process against te-node target processes. */

/*
 * Every target is a te-node process (tests/system/te-node.c) on loopback, driven through
 * its stdin/stdout; the initiator is an engine in this process. Tests that move data need
 * the tcp plugin and skip (g_test_skip, with the reason) when tcp.so is not found along
 * $TE_PLUGIN_PATH; the control-plane tests run without it. Every wait has a deadline, and
 * every node is killed and reaped by the test that started it; te-node also dies with
 * this process (PR_SET_PDEATHSIG).
 */

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te.h>

#include "sysnode.h"
#include "sysnode_fixture.h"

/* Deadline of a batch that is expected to complete. */
#define BATCH_WAIT_NS (60 * S_NS)
/* transfer.timeout_ms of the initiators of the kill and restart tests. */
#define KILL_TIMEOUT_MS 3000

static char *tcp_path; /* tcp.so found along TE_PLUGIN_PATH, or NULL */

/* ---------------------------------------------------------------------------------------- */
/* small helpers */

/* A TCP port nobody listens on right now (bound, then closed). */
static unsigned free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	unsigned port;

	g_assert_cmpint(fd, >=, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	g_assert_cmpint(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), ==, 0);
	g_assert_cmpint(getsockname(fd, (struct sockaddr *)&sa, &len), ==, 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

/* ---------------------------------------------------------------------------------------- */
/* te-node processes */

/* Wait up to @ms for @needle in the node's stderr. */
static bool node_stderr_wait(struct node *n, const char *needle, unsigned ms)
{
	int64_t end = now_ns() + ms * MS_NS;

	for (;;) {
		g_autofree char *s = node_stderr(n);

		if (strstr(s, needle))
			return true;
		if (now_ns() >= end)
			return false;
		sleep_ms(20);
	}
}

/* SIGSTOP the node and wait (5 s at most) until every thread of it is stopped. */
static void node_stop_wait(struct node *n)
{
	const char *pid = g_subprocess_get_identifier(n->proc);
	g_autofree char *dir = g_strdup_printf("/proc/%s/task", pid);
	int64_t end = now_ns() + 5 * S_NS;

	g_subprocess_send_signal(n->proc, SIGSTOP);
	for (;;) {
		g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
		bool all = d != NULL;
		const char *tid;

		while (d && (tid = g_dir_read_name(d))) {
			g_autofree char *path = g_strdup_printf("%s/%s/stat", dir, tid);
			g_autofree char *stat = NULL;
			const char *paren;

			/* "tid (comm) S ...": the state follows the last ')'. */
			if (g_file_get_contents(path, &stat, NULL, NULL) &&
			    (paren = strrchr(stat, ')')) && paren[1] == ' ' &&
			    (paren[2] == 'T' || paren[2] == 't'))
				continue;
			all = false;
		}
		if (all)
			return;
		if (now_ns() >= end)
			g_error("te-node %s (pid %s) did not stop within 5 s of SIGSTOP",
				n->segment, pid);
		sleep_ms(1);
	}
}

/* Stop the node (stdin EOF, then SIGKILL after 10 s), reap it and free everything. */
static void node_free(struct node *n)
{
	node_close_free(n, 10000, true);
}

/* The node's received notifies as "notify ..." lines (NULL-terminated, g_strfreev). */
static char **node_notifies(struct node *n)
{
	GPtrArray *a = g_ptr_array_new();

	node_send(n, "notifies");
	for (;;) {
		char *line = node_line(n, NODE_REPLY_MS);

		g_assert_nonnull(line);
		if (g_str_has_prefix(line, "end ")) {
			g_assert_cmpuint(parse_u64(line + 4, 10), ==, a->len);
			g_free(line);
			break;
		}
		if (!g_str_has_prefix(line, "notify "))
			g_error("te-node %s: unexpected line \"%s\" in notifies", n->segment, line);
		g_ptr_array_add(a, line);
	}
	g_ptr_array_add(a, NULL);
	return (char **)g_ptr_array_free(a, FALSE);
}

/* YAML of a target or initiator engine on loopback; tcp optional unless @tcp_required. */
static char *engine_yaml(const char *listen, bool tcp_required, unsigned timeout_ms)
{
	return g_strdup_printf("engine: {listen: \"%s\"}\n"
			       "transfer: {timeout_ms: %u}\n"
			       "transports:\n"
			       "  - name: tcp\n"
			       "    required: %s\n",
			       listen ? listen : "127.0.0.1:0", timeout_ms,
			       tcp_required ? "true" : "false");
}

static struct node *node_start_tcp(void)
{
	g_autofree char *yaml = engine_yaml(NULL, true, 30000);

	return node_start(yaml, NULL);
}

static struct te_engine *initiator_new(bool tcp_required, unsigned timeout_ms)
{
	g_autofree char *yaml = engine_yaml(NULL, tcp_required, timeout_ms);
	struct te_engine *e = NULL;
	enum te_status st = te_engine_new_from_string(yaml, strlen(yaml), &e);

	if (st != TE_OK)
		g_error("initiator engine: %s: %s\nconfig:\n%s", te_status_str(st), te_last_error(),
			yaml);
	return e;
}

#define NEED_TCP()                                                                                 \
	do {                                                                                       \
		if (!tcp_path) {                                                                   \
			g_test_skip("tcp.so is not found along TE_PLUGIN_PATH (the tcp plugin is " \
				    "not built): this test moves data between processes");         \
			return;                                                                    \
		}                                                                                  \
	} while (0)

/* ---------------------------------------------------------------------------------------- */
/* raw control-plane client (the wire format of core/rpc.h, written independently) */

#define RPC_MAGIC_BYTES "TECP"
#define RPC_HDR 24
enum {
	RPC_T_HELLO = 1,
	RPC_T_ERROR = 4,
	RPC_T_DESC_FETCH = 16,
	RPC_T_DESC_REPLY = 17,
	RPC_T_NOTIFY = 20,
	RPC_T_PROBE = 22,
	RPC_T_PROBE_REPLY = 23,
};

struct rpc_hdr {
	uint32_t magic;
	uint8_t version;
	uint8_t type;
	uint16_t flags;
	uint64_t id;
	int32_t status;
	uint32_t len;
};

static void le_put(uint8_t *p, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t le_get(const uint8_t *p, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void rpc_hdr_put(uint8_t *p, const struct rpc_hdr *h)
{
	le_put(p, h->magic, 4);
	p[4] = h->version;
	p[5] = h->type;
	le_put(p + 6, h->flags, 2);
	le_put(p + 8, h->id, 8);
	le_put(p + 16, (uint32_t)h->status, 4);
	le_put(p + 20, h->len, 4);
}

static struct rpc_hdr rpc_hdr_get(const uint8_t *p)
{
	struct rpc_hdr h = {
		.magic = (uint32_t)le_get(p, 4),
		.version = p[4],
		.type = p[5],
		.flags = (uint16_t)le_get(p + 6, 2),
		.id = le_get(p + 8, 8),
		.status = (int32_t)(uint32_t)le_get(p + 16, 4),
		.len = (uint32_t)le_get(p + 20, 4),
	};
	return h;
}

/* A well-formed request header of @type with @len body bytes. */
static struct rpc_hdr rpc_req(uint8_t type, uint64_t id, uint32_t len)
{
	struct rpc_hdr h = { .version = 1, .type = type, .id = id, .len = len };

	/* The magic is the bytes "TECP" on the wire. */
	h.magic = (uint32_t)le_get((const uint8_t *)RPC_MAGIC_BYTES, 4);
	return h;
}

/* Connect to "host:port" (IPv4 literal); -1 on failure (errno kept). */
static int raw_connect(const char *hostport)
{
	g_autofree char *host = g_strdup(hostport);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	char *colon = strrchr(host, ':');
	struct timeval tv = { .tv_sec = 10 };
	int fd, one = 1;

	g_assert_nonnull(colon);
	*colon = '\0';
	sa.sin_port = htons((uint16_t)parse_u64(colon + 1, 10));
	g_assert_cmpint(inet_pton(AF_INET, host, &sa.sin_addr), ==, 1);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	g_assert_cmpint(fd, >=, 0);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/* A peer that stops reading must not block a send forever. */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static bool raw_send(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		b += w;
		n -= (size_t)w;
	}
	return true;
}

/*
 * Receive exactly @n bytes before @deadline (ns, monotonic). Returns n, 0 when the peer
 * closed first (ECONNRESET counts as closed), -1 on timeout or another error.
 */
static ssize_t raw_recv(int fd, void *p, size_t n, int64_t deadline)
{
	uint8_t *b = p;
	size_t got = 0;

	while (got < n) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int64_t left = (deadline - now_ns()) / MS_NS;
		ssize_t r;

		if (left <= 0)
			return -1;
		if (poll(&pfd, 1, (int)MIN(left, 1000)) <= 0)
			continue;
		r = recv(fd, b + got, n - got, 0);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 0;
		if (r < 0 && errno != EINTR && errno != EAGAIN)
			return -1;
		if (r > 0)
			got += (size_t)r;
	}
	return (ssize_t)n;
}

/* Read one frame; false on close or timeout. *body is g_free'd by the caller. */
static bool raw_frame(int fd, struct rpc_hdr *h, uint8_t **body, int64_t deadline)
{
	uint8_t hb[RPC_HDR];

	*body = NULL;
	if (raw_recv(fd, hb, sizeof(hb), deadline) != RPC_HDR)
		return false;
	*h = rpc_hdr_get(hb);
	if (h->len > (64u << 20))
		return false;
	*body = g_malloc0(h->len + 1);
	if (h->len && raw_recv(fd, *body, h->len, deadline) != (ssize_t)h->len) {
		g_free(*body);
		*body = NULL;
		return false;
	}
	return true;
}

/* Connect and take the server's HELLO (no authentication): the fd, or -1. */
static int raw_session(const char *hostport, int64_t deadline)
{
	struct rpc_hdr h;
	g_autofree uint8_t *body = NULL;
	int fd = raw_connect(hostport);

	if (fd < 0)
		return -1;
	if (!raw_frame(fd, &h, &body, deadline) || h.type != RPC_T_HELLO || h.len != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* One request, one reply: TRUE with *reply_out (g_free) when a reply of @type + 1 came. */
static bool raw_call(int fd, uint8_t type, uint64_t id, const void *body, uint32_t len,
		     int64_t deadline, int32_t *status_out, char **reply_out)
{
	g_autofree uint8_t *frame = g_malloc(RPC_HDR + len);
	struct rpc_hdr h = rpc_req(type, id, len);
	uint8_t *rb = NULL;

	rpc_hdr_put(frame, &h);
	if (len)
		memcpy(frame + RPC_HDR, body, len);
	if (!raw_send(fd, frame, RPC_HDR + len) || !raw_frame(fd, &h, &rb, deadline))
		return false;
	if (h.type != type + 1 || h.id != id) {
		g_test_message("raw call: reply type %u id %" PRIu64 " to type %u id %" PRIu64,
			       h.type, h.id, type, id);
		g_free(rb);
		return false;
	}
	*status_out = h.status;
	*reply_out = (char *)rb;
	return true;
}

/*
 * Read until the server closes (true) or @deadline passes (false). An RPC_ERROR frame seen
 * on the way is returned in *err_status / *err_text (g_free; NULL if none).
 */
static bool raw_wait_closed(int fd, int64_t deadline, int32_t *err_status, char **err_text)
{
	g_autoptr(GByteArray) all = g_byte_array_new();
	uint8_t buf[4096];

	*err_status = 0;
	*err_text = NULL;
	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int64_t left = (deadline - now_ns()) / MS_NS;
		ssize_t r;

		if (left <= 0)
			return false;
		if (poll(&pfd, 1, (int)MIN(left, 1000)) <= 0)
			continue;
		r = recv(fd, buf, sizeof(buf), 0);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			break;
		if (all->len < (1u << 20))
			g_byte_array_append(all, buf, (guint)r);
	}
	/* Frames before the close: HELLO (if not consumed) and at most one RPC_ERROR. */
	for (size_t off = 0; off + RPC_HDR <= all->len;) {
		struct rpc_hdr h = rpc_hdr_get(all->data + off);

		if (off + RPC_HDR + h.len > all->len)
			break;
		if (h.type == RPC_T_ERROR) {
			*err_status = h.status;
			*err_text = g_strndup((const char *)all->data + off + RPC_HDR, h.len);
		}
		off += RPC_HDR + h.len;
	}
	return true;
}

/* Fetch the descriptor JSON and the probe answer over a fresh raw connection. */
static void raw_fetch_and_probe(const char *hostport, const char *segment)
{
	int64_t deadline = now_ns() + 10 * S_NS;
	g_autofree char *json = NULL, *probe = NULL;
	g_autofree char *want = g_strdup_printf("\"%s\"", segment);
	int32_t st = -1;
	int fd = raw_session(hostport, deadline);

	if (fd < 0)
		g_error("raw session with %s failed: %s", hostport, g_strerror(errno));
	g_assert_true(raw_call(fd, RPC_T_DESC_FETCH, 1, NULL, 0, deadline, &st, &json));
	g_assert_cmpint(st, ==, TE_OK);
	assert_contains(json, want);
	g_assert_true(raw_call(fd, RPC_T_PROBE, 2, NULL, 0, deadline, &st, &probe));
	g_assert_cmpint(st, ==, TE_OK);
	g_assert_true(g_str_has_prefix(probe, segment));
	close(fd);
}

/* ---------------------------------------------------------------------------------------- */
/* data helpers */

/* Submit @n requests in a new batch, wait, return the batch (caller frees) and status. */
static te_batch_id run_batch(struct te_engine *e, const struct te_request *reqs, size_t n,
			     enum te_status *submit_out, enum te_status *wait_out)
{
	return batch_run(e, reqs, n, BATCH_WAIT_NS, submit_out, wait_out);
}

/* Run @n requests that must all complete; reports the first failed task. */
static void run_ok(struct te_engine *e, const struct te_request *reqs, size_t n)
{
	batch_run_ok(e, reqs, n, BATCH_WAIT_NS, "tcp");
}

/* ---------------------------------------------------------------------------------------- */
/* control-plane tests: no tcp needed */

static void test_unknown_segment(void)
{
	struct te_engine *e = initiator_new(false, 30000);
	g_autofree char *dead = g_strdup_printf("127.0.0.1:%u", free_port());
	te_segment_id seg = 77;
	enum te_status st;
	int64_t t0;

	/* Not a host:port at all: p2p metadata cannot know it. */
	st = te_segment_open(e, "no-such-segment", &seg);
	g_assert_cmpint(st, ==, TE_ERR_UNKNOWN_SEGMENT);
	g_assert_cmpuint(seg, ==, 77); /* outputs untouched on failure */
	g_test_message("open \"no-such-segment\": %s", te_last_error());
	assert_contains(te_last_error(), "no-such-segment");

	/* A well-formed name nobody serves: fails at open, quickly, naming it. */
	t0 = now_ns();
	st = te_segment_open(e, dead, &seg);
	g_test_message("open \"%s\": %s: %s (%.0f ms)", dead, te_status_str(st), te_last_error(),
		       (now_ns() - t0) / 1e6);
	g_assert_true(st == TE_ERR_UNKNOWN_SEGMENT || st == TE_ERR_PEER_UNREACHABLE);
	g_assert_cmpuint(seg, ==, 77);
	assert_contains(te_last_error(), dead);
	g_assert_cmpint(now_ns() - t0, <, 6 * S_NS);

	/* Closing or using a segment id that was never opened is refused too. */
	g_assert_cmpint(te_segment_close(e, 12345), ==, TE_ERR_UNKNOWN_SEGMENT);
	initiator_free(e);
}

/* A listening socket that never accepts: connects succeed, nothing ever answers. */
static int silent_listener(char *addr, size_t cap)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	g_assert_cmpint(fd, >=, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	g_assert_cmpint(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), ==, 0);
	g_assert_cmpint(listen(fd, 16), ==, 0);
	g_assert_cmpint(getsockname(fd, (struct sockaddr *)&sa, &len), ==, 0);
	g_snprintf(addr, cap, "127.0.0.1:%u", ntohs(sa.sin_port));
	return fd;
}

static void test_probe(void)
{
	g_autofree char *yaml = engine_yaml(NULL, false, 30000);
	struct te_engine *e = initiator_new(false, 30000);
	struct node *n = node_start(yaml, NULL);
	g_autofree char *dead = g_strdup_printf("127.0.0.1:%u", free_port());
	char silent[64];
	int sfd = silent_listener(silent, sizeof(silent));
	enum te_status st;
	int64_t t0;

	assert_ok(te_peer_probe(e, n->segment, 2000));

	/* Nobody listens: refused at once. */
	t0 = now_ns();
	st = te_peer_probe(e, dead, 2000);
	g_test_message("probe %s: %s: %s", dead, te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_PEER_UNREACHABLE);
	assert_contains(te_last_error(), dead);
	g_assert_cmpint(now_ns() - t0, <, 2500 * MS_NS);

	/* Connects but never answers: bounded by the timeout. */
	t0 = now_ns();
	st = te_peer_probe(e, silent, 500);
	g_test_message("probe %s (never answers): %s: %s (%.0f ms)", silent, te_status_str(st),
		       te_last_error(), (now_ns() - t0) / 1e6);
	g_assert_true(st == TE_ERR_TIMEOUT || st == TE_ERR_PEER_UNREACHABLE);
	g_assert_cmpint(now_ns() - t0, <, 1500 * MS_NS);

	/* A stopped process: its kernel accepts, it does not answer. */
	node_stop_wait(n);
	t0 = now_ns();
	st = te_peer_probe(e, n->segment, 500);
	g_test_message("probe of a SIGSTOPped node: %s: %s (%.0f ms)", te_status_str(st),
		       te_last_error(), (now_ns() - t0) / 1e6);
	g_subprocess_send_signal(n->proc, SIGCONT);
	g_assert_true(st == TE_ERR_TIMEOUT || st == TE_ERR_PEER_UNREACHABLE);
	g_assert_cmpint(now_ns() - t0, <, 1500 * MS_NS);

	/* Alive again once continued (the stale connection must not poison the next call). */
	t0 = now_ns();
	st = te_peer_probe(e, n->segment, 2000);
	g_test_message("first probe after SIGCONT: %s%s%s (%.0f ms)", te_status_str(st),
		       st ? ": " : "", st ? te_last_error() : "", (now_ns() - t0) / 1e6);
	assert_ok(st);

	/* Killed: unreachable. */
	node_kill(n);
	t0 = now_ns();
	st = te_peer_probe(e, n->segment, 2000);
	g_test_message("probe of a killed node: %s: %s", te_status_str(st), te_last_error());
	g_assert_cmpint(st, ==, TE_ERR_PEER_UNREACHABLE);
	g_assert_cmpint(now_ns() - t0, <, 2500 * MS_NS);

	close(sfd);
	node_free(n);
	initiator_free(e);
}

#define N_CLIENTS 64

struct crowd {
	const char *addr;
	const char *segment;
	struct te_engine *e;
	GMutex lock;
	GCond cond;
	unsigned arrived;
	unsigned ok;
	te_segment_id ids[N_CLIENTS];
	char why[N_CLIENTS][160];
};

static void crowd_barrier(struct crowd *c)
{
	g_mutex_lock(&c->lock);
	c->arrived++;
	g_cond_broadcast(&c->cond);
	while (c->arrived < N_CLIENTS) {
		if (!g_cond_wait_until(&c->cond, &c->lock,
				       g_get_monotonic_time() + 30 * G_USEC_PER_SEC))
			break; /* someone failed to arrive; go on, the count will tell */
	}
	g_mutex_unlock(&c->lock);
}

struct crowd_arg {
	struct crowd *c;
	unsigned i;
};

/* Raw client: connected and greeted before anyone asks, so all 64 are open at once. */
static gpointer crowd_raw_main(gpointer data)
{
	struct crowd_arg *a = data;
	struct crowd *c = a->c;
	int64_t deadline = now_ns() + 60 * S_NS;
	g_autofree char *json = NULL, *probe = NULL;
	g_autofree char *want = g_strdup_printf("\"%s\"", c->segment);
	int32_t st = -1;
	int fd = raw_session(c->addr, deadline);

	crowd_barrier(c);
	if (fd < 0) {
		g_snprintf(c->why[a->i], sizeof(c->why[0]), "connect/hello: %s", g_strerror(errno));
		return NULL;
	}
	if (!raw_call(fd, RPC_T_DESC_FETCH, a->i, NULL, 0, deadline, &st, &json) || st != 0 ||
	    !strstr(json, want)) {
		g_snprintf(c->why[a->i], sizeof(c->why[0]), "descriptor fetch: status %d", st);
	} else if (!raw_call(fd, RPC_T_PROBE, 1000 + a->i, NULL, 0, deadline, &st, &probe) ||
		   st != 0 || !g_str_has_prefix(probe, c->segment)) {
		g_snprintf(c->why[a->i], sizeof(c->why[0]), "probe: status %d", st);
	} else {
		g_mutex_lock(&c->lock);
		c->ok++;
		g_mutex_unlock(&c->lock);
	}
	close(fd);
	return NULL;
}

/* Library client: probe, and with tcp open the segment, from 64 threads at once. */
static gpointer crowd_engine_main(gpointer data)
{
	struct crowd_arg *a = data;
	struct crowd *c = a->c;
	enum te_status st;

	crowd_barrier(c);
	st = te_peer_probe(c->e, c->segment, 10000);
	if (st != TE_OK) {
		g_snprintf(c->why[a->i], sizeof(c->why[0]), "probe: %s: %s", te_status_str(st),
			   te_last_error());
		return NULL;
	}
	if (tcp_path) {
		st = te_segment_open(c->e, c->segment, &c->ids[a->i]);
		if (st != TE_OK) {
			g_snprintf(c->why[a->i], sizeof(c->why[0]), "open: %s: %s",
				   te_status_str(st), te_last_error());
			return NULL;
		}
	}
	g_mutex_lock(&c->lock);
	c->ok++;
	g_mutex_unlock(&c->lock);
	return NULL;
}

static void crowd_run(struct crowd *c, GThreadFunc fn, const char *what)
{
	struct crowd_arg args[N_CLIENTS];
	GThread *threads[N_CLIENTS];
	int64_t t0 = now_ns();

	c->arrived = 0;
	c->ok = 0;
	memset(c->why, 0, sizeof(c->why));
	watchdog_arm(120, what);
	for (unsigned i = 0; i < N_CLIENTS; i++) {
		args[i] = (struct crowd_arg){ c, i };
		threads[i] = g_thread_new("crowd", fn, &args[i]);
	}
	for (unsigned i = 0; i < N_CLIENTS; i++)
		g_thread_join(threads[i]);
	watchdog_disarm();
	g_test_message("%s: %u of %u clients served in %.0f ms", what, c->ok, N_CLIENTS,
		       (now_ns() - t0) / 1e6);
	for (unsigned i = 0; i < N_CLIENTS; i++)
		if (c->why[i][0])
			g_test_message("%s: client %u: %s", what, i, c->why[i]);
	g_assert_cmpuint(c->ok, ==, N_CLIENTS);
}

static void test_concurrent_clients(void)
{
	g_autofree char *yaml = engine_yaml(NULL, tcp_path != NULL, 30000);
	struct node *n = node_start(yaml, NULL);
	struct crowd c = { .addr = n->segment, .segment = n->segment };

	g_mutex_init(&c.lock);
	g_cond_init(&c.cond);
	crowd_run(&c, crowd_raw_main, "64 raw clients (descriptor fetch + probe)");

	c.e = initiator_new(false, 30000);
	crowd_run(&c, crowd_engine_main,
		  tcp_path ? "64 threads of one engine (probe + te_segment_open)"
			   : "64 threads of one engine (probe; no tcp: no te_segment_open)");
	if (tcp_path) {
		/* Opening one name is reference counted: one id, 64 references. */
		for (unsigned i = 0; i < N_CLIENTS; i++)
			g_assert_cmpuint(c.ids[i], ==, c.ids[0]);
		for (unsigned i = 0; i < N_CLIENTS; i++)
			assert_ok(te_segment_close(c.e, c.ids[0]));
		g_assert_cmpint(te_segment_close(c.e, c.ids[0]), ==, TE_ERR_UNKNOWN_SEGMENT);
	}
	initiator_free(c.e);
	/* Still serving after the crowd left. */
	raw_fetch_and_probe(n->segment, n->segment);
	g_cond_clear(&c.cond);
	g_mutex_clear(&c.lock);
	node_free(n);
}

struct junk {
	const char *name;
	uint8_t bytes[256];
	size_t len;
	bool half_close;    /* shutdown(SHUT_WR) after sending */
	const char *logged; /* expected in the node's log */
};

static void junk_header(struct junk *j, struct rpc_hdr h)
{
	rpc_hdr_put(j->bytes, &h);
	j->len = RPC_HDR;
}

/* Probe generation: "name gen" from a raw PROBE, to tell the same process from a restart. */
static char *raw_probe_text(const char *addr)
{
	int64_t deadline = now_ns() + 10 * S_NS;
	int32_t st = -1;
	char *probe = NULL;
	int fd = raw_session(addr, deadline);

	g_assert_cmpint(fd, >=, 0);
	g_assert_true(raw_call(fd, RPC_T_PROBE, 9, NULL, 0, deadline, &st, &probe));
	g_assert_cmpint(st, ==, TE_OK);
	close(fd);
	return probe;
}

/* Count the occurrences of @needle in the node's stderr. */
static unsigned node_stderr_count(struct node *n, const char *needle)
{
	g_autofree char *s = node_stderr(n);
	unsigned count = 0;

	for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
		count++;
	return count;
}

/* One raw connection gets @j; the node must close it and log why, and keep serving. */
static void junk_check(struct node *n, const struct junk *j)
{
	int64_t deadline = now_ns() + 10 * S_NS;
	unsigned before = node_stderr_count(n, j->logged);
	g_autofree char *text = NULL;
	int32_t st = 0;
	int64_t t0;
	int fd = raw_session(n->segment, deadline);

	if (fd < 0)
		g_error("%s: no session with %s: %s", j->name, n->segment, g_strerror(errno));
	g_assert_true(raw_send(fd, j->bytes, j->len));
	if (j->half_close)
		g_assert_cmpint(shutdown(fd, SHUT_WR), ==, 0);
	t0 = now_ns();
	if (!raw_wait_closed(fd, now_ns() + 5 * S_NS, &st, &text))
		g_error("%s: the node did not close the connection within 5 s", j->name);
	g_test_message("%s: closed after %.1f ms; RPC_ERROR %d \"%s\"", j->name,
		       (now_ns() - t0) / 1e6, st, text ? text : "(none)");
	if (text)
		g_assert_cmpint(st, ==, TE_ERR_PROTOCOL);
	close(fd);
	for (int64_t end = now_ns() + 3 * S_NS; node_stderr_count(n, j->logged) <= before;) {
		if (now_ns() >= end)
			g_error("%s: the node logged no \"%s\" line for it", j->name, j->logged);
		sleep_ms(20);
	}
	/* Only that connection: the next client is served as usual. */
	raw_fetch_and_probe(n->segment, n->segment);
}

/* Write @len bytes with @seed at buffer offset @roff and read them back; TE_OK if equal. */
static void roundtrip_ok(struct te_engine *e, te_segment_id seg, uint64_t raddr, size_t len,
			 uint64_t seed)
{
	struct lbuf l;
	struct te_request r[2];

	lbuf_new(&l, e, 2 * len);
	sysnode_fill(l.p, 0, len, seed);
	r[0] = (struct te_request){ TE_OP_WRITE, seg, l.p, raddr, len };
	run_ok(e, r, 1);
	r[1] = (struct te_request){ TE_OP_READ, seg, l.p + len, raddr, len };
	run_ok(e, r + 1, 1);
	g_assert_true(memcmp(l.p, l.p + len, len) == 0);
	lbuf_free(&l, e);
}

static void test_malformed_frames(void)
{
	g_autofree char *yaml = engine_yaml(NULL, tcp_path != NULL, 30000);
	struct node *n = node_start(yaml, NULL);
	g_autofree char *probe_before = raw_probe_text(n->segment);
	g_autofree char *probe_after = NULL;
	g_autofree char *text = NULL;
	struct junk cases[9];
	unsigned nc = 0, stalls = node_stderr_count(n, "stalled mid-frame");
	struct rpc_hdr h;
	int64_t t_stall;
	int32_t st = 0;
	int stall_fd;

	/* A client that stops mid-frame, left hanging while the others run. */
	stall_fd = raw_session(n->segment, now_ns() + 10 * S_NS);
	g_assert_cmpint(stall_fd, >=, 0);
	{
		uint8_t hb[RPC_HDR];

		h = rpc_req(RPC_T_DESC_FETCH, 1, 0);
		rpc_hdr_put(hb, &h);
		g_assert_true(raw_send(stall_fd, hb, 10));
	}
	t_stall = now_ns();

	memset(cases, 0, sizeof(cases));
	cases[nc] = (struct junk){ .name = "bad magic", .logged = "bad magic" };
	h = rpc_req(RPC_T_DESC_FETCH, 1, 0);
	h.magic = 0xdeadbeef;
	junk_header(&cases[nc++], h);

	cases[nc] = (struct junk){ .name = "unknown version", .logged = "unsupported version" };
	h = rpc_req(RPC_T_DESC_FETCH, 1, 0);
	h.version = 9;
	junk_header(&cases[nc++], h);

	cases[nc] = (struct junk){ .name = "unknown type", .logged = "unknown type" };
	junk_header(&cases[nc++], rpc_req(99, 1, 0));

	cases[nc] = (struct junk){ .name = "unknown flags", .logged = "unknown flags" };
	h = rpc_req(RPC_T_DESC_FETCH, 1, 0);
	h.flags = 0x8000;
	junk_header(&cases[nc++], h);

	cases[nc] = (struct junk){ .name = "length over the limit", .logged = "over limit" };
	junk_header(&cases[nc++], rpc_req(RPC_T_DESC_FETCH, 1, 0x7fffffffu));

	cases[nc] = (struct junk){ .name = "truncated frame",
				   .half_close = true,
				   .logged = "mid-frame" };
	junk_header(&cases[nc], rpc_req(RPC_T_DESC_FETCH, 1, 64));
	cases[nc++].len = 30; /* header and 6 of the 64 body bytes, then EOF */

	cases[nc] = (struct junk){ .name = "random bytes", .logged = "bad magic" };
	for (size_t i = 0; i < sizeof(cases[nc].bytes); i++)
		cases[nc].bytes[i] = (uint8_t)g_test_rand_int();
	cases[nc].bytes[0] = 'X'; /* never "TECP" by chance */
	cases[nc++].len = sizeof(cases[0].bytes);

	cases[nc] =
		(struct junk){ .name = "reply type sent by a client", .logged = "from a client" };
	junk_header(&cases[nc++], rpc_req(RPC_T_DESC_REPLY, 1, 0));

	cases[nc] =
		(struct junk){ .name = "NOTIFY body without a sender", .logged = "NOTIFY body" };
	junk_header(&cases[nc], rpc_req(RPC_T_NOTIFY, 1, 3));
	memcpy(cases[nc].bytes + RPC_HDR, "abc", 3);
	cases[nc++].len = RPC_HDR + 3;

	for (unsigned i = 0; i < nc; i++)
		junk_check(n, &cases[i]);

	/* Others are served while the stalled client hangs. */
	if (tcp_path) {
		struct te_engine *e = initiator_new(true, 30000);
		te_segment_id seg = open_node(e, n);

		roundtrip_ok(e, seg, n->buf + 1, 4096, 77);
		assert_ok(te_segment_close(e, seg));
		initiator_free(e);
	} else {
		struct te_engine *e = initiator_new(false, 30000);

		assert_ok(te_peer_probe(e, n->segment, 2000));
		initiator_free(e);
	}

	/* The stalled client is dropped after the server's idle timeout (10 s by default). */
	if (!raw_wait_closed(stall_fd, t_stall + 30 * S_NS, &st, &text))
		g_error("a client stalled mid-frame was not disconnected within 30 s");
	g_test_message("stalled client: closed after %.1f s; RPC_ERROR %d \"%s\"",
		       (now_ns() - t_stall) / 1e9, st, text ? text : "(none)");
	close(stall_fd);
	if (!node_stderr_wait(n, "stalled mid-frame", 3000) ||
	    node_stderr_count(n, "stalled mid-frame") <= stalls)
		g_error("the node logged no reason for dropping the stalled client");

	/* Same process, same generation: the engine kept serving, it did not restart. */
	probe_after = raw_probe_text(n->segment);
	g_assert_cmpstr(probe_after, ==, probe_before);
	g_assert_cmphex(node_checksum(n, 0, 1), ==, sysnode_fnv((const uint8_t[]){ 7 }, 1));
	node_free(n);
}

/* ---------------------------------------------------------------------------------------- */
/* data path over tcp */

static void test_transfer_sizes(void)
{
	static const size_t sizes[] = { 1, 4096, 1u << 20, 64u << 20 };
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;

	NEED_TCP();
	n = node_start_tcp();
	e = initiator_new(true, 30000);
	seg = open_node(e, n);
	xfer_sizes(e, seg, n, sizes, G_N_ELEMENTS(sizes), BATCH_WAIT_NS, "tcp");
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	node_free(n);
}

#define N_BATCH 1000

static void test_batch_1000(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;

	NEED_TCP();
	n = node_start_tcp();
	e = initiator_new(true, 30000);
	seg = open_node(e, n);
	/* 1000 requests of 1..8192 bytes, unaligned, with gaps on both sides. */
	xfer_batch(e, seg, n, N_BATCH, 8192, BATCH_WAIT_NS, "tcp");
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	node_free(n);
}

/* A one-request batch that must be rejected at submit with @want. */
static void reject_one(struct te_engine *e, const struct te_request *r, enum te_status want,
		       const char *what)
{
	struct te_task_info ti;
	te_batch_id b;
	enum te_status st;

	assert_ok(te_batch_new(e, 1, &b));
	st = te_batch_submit(e, b, r, 1);
	g_test_message("%s: submit %s: %s", what, te_status_str(st), te_last_error());
	if (st != want)
		g_error("%s: submit returned %s, expected %s", what, te_status_str(st),
			te_status_str(want));
	/* Known from the descriptor: terminal at once, nothing sent. */
	g_assert_cmpint(te_batch_wait(e, b, 0), ==, want);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	g_assert_cmpint(ti.status, ==, want);
	g_assert_cmpuint(ti.bytes, ==, 0);
	assert_contains(ti.detail, "outside");
	assert_ok(te_batch_free(e, b));
}

static void test_out_of_range(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	uint8_t *mirror;
	struct lbuf l;
	struct te_request r[3];
	struct te_batch_info bi;
	struct te_task_info ti;
	te_batch_id b;
	enum te_status sst, wst;
	g_autofree char *s = NULL;

	NEED_TCP();
	n = node_start_tcp();
	/* A target that never answers shows up as TIMEOUT after 5 s instead of FAILED. */
	e = initiator_new(true, 5000);
	seg = open_node(e, n);
	mirror = mirror_new(n);
	lbuf_new(&l, e, 4u << 20);
	sysnode_fill(l.p, 0, l.len, 9);

	{
		struct bad_range bad[BAD_RANGES];

		bad_ranges(n, bad);
		for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
			struct te_request q = { bad[i].op, seg, l.p, bad[i].addr, bad[i].len };

			reject_one(e, &q, TE_ERR_REMOTE_ACCESS, bad[i].what);
		}
	}
	{
		struct te_request q = { TE_OP_WRITE, seg, l.p, UINT64_MAX - 3, 8 };

		assert_ok(te_batch_new(e, 1, &b));
		sst = te_batch_submit(e, b, &q, 1);
		g_test_message("wrapping remote range: %s: %s", te_status_str(sst),
			       te_last_error());
		g_assert_true(sst == TE_ERR_OVERFLOW || sst == TE_ERR_REMOTE_ACCESS);
		assert_ok(te_batch_free(e, b));
	}

	/* One bad request among good ones: only it is rejected. */
	r[0] = (struct te_request){ TE_OP_WRITE, seg, l.p, n->buf + 100, 4096 };
	r[1] = (struct te_request){ TE_OP_WRITE, seg, l.p + 8192, n->buf + n->size - 1, 2 };
	/* Tasks of one batch are not ordered: the READ is of a range nobody writes. */
	r[2] = (struct te_request){ TE_OP_READ, seg, l.p + 65536, n->buf + 100000, 4096 };
	b = run_batch(e, r, 3, &sst, &wst);
	g_assert_cmpint(sst, ==, TE_ERR_REMOTE_ACCESS);
	assert_contains(te_last_error(), "request 1");
	assert_ok(te_batch_status(e, b, &bi));
	g_assert_cmpint(bi.state, ==, TE_STATE_FAILED);
	g_assert_cmpuint(bi.completed, ==, 2);
	g_assert_cmpuint(bi.failed, ==, 1);
	assert_ok(te_task_status(e, b, 1, &ti));
	g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
	assert_ok(te_batch_free(e, b));
	memcpy(mirror + n->guard + 100, l.p, 4096);
	assert_bytes(l.p + 65536, mirror + n->guard + 100000, 4096, "READ next to a rejection");
	assert_node_is(n, mirror, "after rejected requests");

	/*
	 * The descriptor says the range is fine, the target no longer has it registered: the
	 * target's own check must refuse it, as a FAILED task with detail, touching nothing.
	 * Small requests, and ones whose payload is longer than the target reads at once, in
	 * one batch: a refusal makes the core fetch the descriptor again (without the buffer),
	 * and a request submitted after it would be refused at submit instead.
	 */
	node_send(n, "unregister");
	s = node_expect(n, "ok", NODE_REPLY_MS);
	{
		struct te_request q[4];
		int64_t t0 = now_ns();
		size_t n_bufs = 99;

		for (unsigned i = 0; i < 4; i++) {
			uint64_t len = i < 2 ? 65536 : (1u << 20) + 3;

			q[i] = (struct te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg,
						    l.p + (i % 2) * len, n->buf + 4096, len };
		}
		b = run_batch(e, q, 4, &sst, &wst);
		assert_ok(sst);
		g_assert_cmpint(wst, ==, TE_ERR_REMOTE_ACCESS);
		for (unsigned i = 0; i < 4; i++) {
			assert_ok(te_task_status(e, b, i, &ti));
			g_test_message("%s of %" PRIu64 " bytes of an unregistered range: %s, %s: "
				       "\"%s\"",
				       i % 2 ? "READ" : "WRITE", q[i].length,
				       te_state_str(ti.state), te_status_str(ti.status), ti.detail);
			g_assert_cmpint(ti.state, ==, TE_STATE_FAILED);
			g_assert_cmpint(ti.status, ==, TE_ERR_REMOTE_ACCESS);
			g_assert_cmpstr(ti.detail, !=, "");
		}
		/* Refused by the target, not left to run into the 5 s deadline. */
		if (now_ns() - t0 > 2 * S_NS)
			g_error("requests to an unregistered range took %.1f ms to fail: the "
				"target did not answer every slice",
				(now_ns() - t0) / 1e6);
		assert_ok(te_batch_free(e, b));
		/* The refusals led to a fetch: the fresh descriptor lists no buffer. */
		assert_ok(te_segment_buffers(e, seg, NULL, 0, &n_bufs));
		g_assert_cmpuint(n_bufs, ==, 0);
		b = run_batch(e, q, 1, &sst, &wst);
		g_assert_cmpint(sst, ==, TE_ERR_REMOTE_ACCESS);
		assert_ok(te_task_status(e, b, 0, &ti));
		g_assert_cmpint(ti.state, ==, TE_STATE_INVALID);
		assert_contains(ti.detail, "outside the registered buffers");
		assert_ok(te_batch_free(e, b));
	}
	assert_node_is(n, mirror, "after requests to an unregistered range");
	g_free(s);
	node_send(n, "register");
	s = node_expect(n, "ok", NODE_REPLY_MS);

	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	g_free(mirror);
	node_free(n);
}

/*
 * te_batch_free releases everything: right after it, the local region can be unregistered
 * and the segment closed, every time (not "a moment later").
 */
static void test_free_releases(void)
{
	enum {
		ROUNDS = 1000
	};
	struct node *n;
	struct te_engine *e;
	unsigned busy_mem = 0, busy_seg = 0;
	g_autofree char *first = NULL;
	uint8_t *p = g_aligned_alloc(1, 1u << 20, 4096);

	NEED_TCP();
	n = node_start_tcp();
	e = initiator_new(true, 30000);
	memset(p, 1, 1u << 20);
	for (unsigned i = 0; i < ROUNDS; i++) {
		enum te_status sst, wst, st;
		struct te_request r;
		te_segment_id seg;
		te_batch_id b;

		/* A fresh open each round: the close below drops the last reference. */
		seg = open_node(e, n);
		assert_ok(te_mem_register(e, p, 1u << 20, "cpu", TE_MEM_LOCAL));
		r = (struct te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg, p, n->buf + i,
					 i % 3 ? 4096 : (1u << 20) };
		b = run_batch(e, &r, 1, &sst, &wst);
		assert_ok(sst);
		assert_ok(wst);
		assert_ok(te_batch_free(e, b));
		/* Both right away, in alternating order. */
		for (unsigned k = 0; k < 2; k++) {
			bool mem = (k + i) % 2 == 0;

			st = mem ? te_mem_unregister(e, p) : te_segment_close(e, seg);
			if (st == TE_OK)
				continue;
			if (mem)
				busy_mem++;
			else
				busy_seg++;
			if (!first)
				first = g_strdup_printf("round %u: %s: %s: %s", i,
							mem ? "te_mem_unregister"
							    : "te_segment_close",
							te_status_str(st), te_last_error());
			for (int64_t t0 = now_ns();
			     st == TE_ERR_BUSY && now_ns() - t0 < 2 * S_NS;) {
				sleep_ms(1);
				st = mem ? te_mem_unregister(e, p) : te_segment_close(e, seg);
			}
			assert_ok(st);
		}
	}
	g_test_message("%u rounds: right after te_batch_free, te_mem_unregister was busy %u "
		       "times, te_segment_close %u times%s%s",
		       ROUNDS, busy_mem, busy_seg, first ? "; first: " : "", first ? first : "");
	if (busy_mem || busy_seg)
		g_error("after te_batch_free returned, the batch still held the region (%u of %u "
			"rounds) or the segment (%u of %u rounds); first: %s",
			busy_mem, ROUNDS, busy_seg, ROUNDS, first);
	initiator_free(e);
	g_aligned_free(p);
	node_free(n);
}

/*
 * A raw tcp-transport client (wire format of plugins/tcp/README.md, written independently):
 * 32-byte little-endian headers {magic "TCP1", version 2, op, flags 0, request id, status
 * (requests: a deadline in ms, 0xffffffff none), addr, length}; a HELLO carrying the instance
 * nonce of the target's published endpoint and a 56-byte body {client id, epoch, lane, flags,
 * nonce} comes first and is answered (72-byte body) before requests; a WRITE header is
 * followed by its payload; answers echo op and request id, with status 0 and (READ) the
 * data, or an error status and a detail text of `length` bytes.
 */
#define TCPW_HDR 32
enum {
	TCPW_READ = 0,
	TCPW_WRITE = 1,
	TCPW_HELLO = 2,
};

struct tcpw_hdr {
	uint32_t magic;
	uint8_t version, op;
	uint16_t flags;
	uint32_t id;
	int32_t status;
	uint64_t addr, length;
};

static void tcpw_put(uint8_t *p, const struct tcpw_hdr *h)
{
	le_put(p, h->magic, 4);
	p[4] = h->version;
	p[5] = h->op;
	le_put(p + 6, h->flags, 2);
	le_put(p + 8, h->id, 4);
	le_put(p + 12, (uint32_t)h->status, 4);
	le_put(p + 16, h->addr, 8);
	le_put(p + 24, h->length, 8);
}

static struct tcpw_hdr tcpw_get(const uint8_t *p)
{
	struct tcpw_hdr h = {
		.magic = (uint32_t)le_get(p, 4),
		.version = p[4],
		.op = p[5],
		.flags = (uint16_t)le_get(p + 6, 2),
		.id = (uint32_t)le_get(p + 8, 4),
		.status = (int32_t)(uint32_t)le_get(p + 12, 4),
		.addr = le_get(p + 16, 8),
		.length = le_get(p + 24, 8),
	};
	return h;
}

static struct tcpw_hdr tcpw_req(uint8_t op, uint32_t id, uint64_t addr, uint64_t length)
{
	struct tcpw_hdr h = { .version = 2, .op = op, .id = id, .addr = addr, .length = length };

	h.magic = (uint32_t)le_get((const uint8_t *)"TCP1", 4);
	if (op != TCPW_HELLO)
		h.status = -1; /* no deadline */
	return h;
}

/* The tcp endpoint a node publishes: "127.0.0.1:port" and the instance nonce. */
struct tcpw_endpoint {
	char addr[64];
	uint64_t nonce;
};

static void tcpw_endpoint(struct node *n, struct tcpw_endpoint *ep)
{
	g_autofree char *json = NULL;
	g_autoptr(JsonParser) parser = json_parser_new();
	g_autoptr(GError) err = NULL;
	g_autofree guchar *blob = NULL;
	JsonObject *root, *tps;
	const char *b64;
	gsize len = 0;

	node_send(n, "descriptor");
	json = node_expect(n, "descriptor ", NODE_REPLY_MS);
	if (!json_parser_load_from_data(parser, json, -1, &err))
		g_error("descriptor is not JSON: %s: %s", err->message, json);
	root = json_node_get_object(json_parser_get_root(parser));
	g_assert_nonnull(root);
	tps = json_object_get_object_member(root, "transports");
	g_assert_nonnull(tps);
	b64 = json_object_get_string_member(tps, "tcp");
	g_assert_nonnull(b64);
	blob = g_base64_decode(b64, &len);
	/* "TCB1", version, family 4, port, nonce, IPv4 address (README.md, endpoint blob) */
	g_assert_cmpuint(len, >=, 20);
	g_assert_true(memcmp(blob, "TCB1", 4) == 0);
	g_assert_cmpuint(blob[5], ==, 4);
	g_snprintf(ep->addr, sizeof(ep->addr), "%u.%u.%u.%u:%u", blob[16], blob[17], blob[18],
		   blob[19], (unsigned)le_get(blob + 6, 2));
	ep->nonce = le_get(blob + 8, 8);
}

/* Connect and say hello with @nonce; returns the fd and the answer's status in *st. */
static int tcpw_connect(const struct tcpw_endpoint *ep, uint64_t nonce, int32_t *st)
{
	static uint64_t next_client = 1;
	int64_t deadline = now_ns() + 10 * S_NS;
	struct tcpw_hdr h = tcpw_req(TCPW_HELLO, 0, nonce, 56);
	uint8_t hb[TCPW_HDR + 200] = { 0 };
	int fd = raw_connect(ep->addr);

	if (fd < 0)
		g_error("connect to the tcp endpoint %s: %s", ep->addr, g_strerror(errno));
	tcpw_put(hb, &h);
	le_put(hb + TCPW_HDR, 0x5e57000000000000ull + next_client++, 8); /* client id */
	le_put(hb + TCPW_HDR + 8, 1, 8);				 /* epoch */
	g_assert_true(raw_send(fd, hb, TCPW_HDR + 56));
	if (raw_recv(fd, hb, TCPW_HDR, deadline) != TCPW_HDR)
		g_error("no HELLO answer from %s", ep->addr);
	h = tcpw_get(hb);
	g_assert_cmpuint(h.op, ==, TCPW_HELLO);
	g_assert_cmpuint(h.length, <=, 200);
	if (h.length)
		g_assert_cmpint(raw_recv(fd, hb + TCPW_HDR, h.length, deadline), ==, h.length);
	*st = h.status;
	return fd;
}

/*
 * Send one request (with @payload for a WRITE) and read its answer: the status, and the
 * detail text of an error (g_free) in *detail.
 */
static int32_t tcpw_call(int fd, uint8_t op, uint32_t id, uint64_t addr, uint64_t length,
			 const uint8_t *payload, uint8_t *read_out, char **detail)
{
	int64_t deadline = now_ns() + 10 * S_NS;
	struct tcpw_hdr h = tcpw_req(op, id, addr, length);
	uint8_t hb[TCPW_HDR];

	*detail = NULL;
	tcpw_put(hb, &h);
	g_assert_true(raw_send(fd, hb, sizeof(hb)));
	if (op == TCPW_WRITE)
		g_assert_true(raw_send(fd, payload, length));
	if (raw_recv(fd, hb, sizeof(hb), deadline) != TCPW_HDR)
		g_error("no answer to request %u (op %u, 0x%" PRIx64 " +%" PRIu64 ")", id, op, addr,
			length);
	h = tcpw_get(hb);
	g_assert_cmpuint(h.op, ==, op);
	g_assert_cmpuint(h.id, ==, id);
	if (h.status != 0) {
		g_assert_cmpuint(h.length, <=, 4096);
		*detail = g_malloc0(h.length + 1);
		if (h.length)
			g_assert_cmpint(raw_recv(fd, *detail, h.length, deadline), ==, h.length);
		return h.status;
	}
	if (op == TCPW_READ) {
		g_assert_cmpuint(h.length, ==, length);
		g_assert_cmpint(raw_recv(fd, read_out, length, deadline), ==, (ssize_t)length);
	} else {
		g_assert_cmpuint(h.length, ==, 0);
	}
	return 0;
}

static void test_hostile_client(void)
{
	struct node *n;
	struct tcpw_endpoint ep;
	uint8_t *mirror, *junk, *rd;
	int32_t st;
	int fd;

	NEED_TCP();
	n = node_start_tcp();
	mirror = mirror_new(n);
	tcpw_endpoint(n, &ep);
	junk = g_malloc(1u << 20);
	memset(junk, 0xa5, 1u << 20);
	rd = g_malloc(1u << 20);

	fd = tcpw_connect(&ep, ep.nonce, &st);
	g_assert_cmpint(st, ==, TE_OK);
	{
		const struct {
			const char *what;
			uint8_t op;
			uint64_t addr, len;
		} bad[] = {
			{ "WRITE into the guard before", TCPW_WRITE, n->base + 100, 4096 },
			{ "WRITE into the guard after", TCPW_WRITE, n->buf + n->size, 4096 },
			{ "WRITE across the end", TCPW_WRITE, n->buf + n->size - 10, 100 },
			{ "WRITE across the start", TCPW_WRITE, n->buf - 5, 10 },
			{ "WRITE of 1 MiB from the last page", TCPW_WRITE, n->buf + n->size - 4096,
			  1u << 20 },
			{ "WRITE nowhere", TCPW_WRITE, 4096, 8 },
			{ "WRITE whose end wraps", TCPW_WRITE, UINT64_MAX - 7, 16 },
			{ "READ of the guard before", TCPW_READ, n->base, 4096 },
			{ "READ across the end", TCPW_READ, n->buf + n->size - 1, 2 },
			{ "READ of this process's own stack", TCPW_READ, (uintptr_t)&st, 4 },
		};

		for (uint32_t i = 0; i < G_N_ELEMENTS(bad); i++) {
			g_autofree char *detail = NULL;

			st = tcpw_call(fd, bad[i].op, 100 + i, bad[i].addr, bad[i].len, junk, rd,
				       &detail);
			g_test_message("%s: status %d: \"%s\"", bad[i].what, st,
				       detail ? detail : "");
			g_assert_cmpint(st, ==, TE_ERR_REMOTE_ACCESS);
			g_assert_nonnull(detail);
			g_assert_cmpstr(detail, !=, "");
		}
	}
	/* The same connection still serves a legal request: rejections are per request. */
	{
		g_autofree char *detail = NULL;

		st = tcpw_call(fd, TCPW_WRITE, 7, n->buf + 1000, 16, junk, rd, &detail);
		g_assert_cmpint(st, ==, 0);
		memset(mirror + n->guard + 1000, 0xa5, 16);
		st = tcpw_call(fd, TCPW_READ, 8, n->buf + 990, 40, NULL, rd, &detail);
		g_assert_cmpint(st, ==, 0);
		assert_bytes(rd, mirror + n->guard + 990, 40, "raw READ");
	}
	/* Malformed: a length over the frame limit closes this connection only. */
	{
		struct tcpw_hdr h = tcpw_req(TCPW_WRITE, 9, n->buf, 1ull << 40);
		uint8_t hb[TCPW_HDR];
		g_autofree char *text = NULL;
		int32_t est;

		tcpw_put(hb, &h);
		g_assert_true(raw_send(fd, hb, sizeof(hb)));
		if (!raw_wait_closed(fd, now_ns() + 5 * S_NS, &est, &text))
			g_error("a WRITE of 1 TiB was not refused by closing the connection");
		close(fd);
	}
	/* A hello for another instance is refused, and nothing runs on that connection. */
	fd = tcpw_connect(&ep, ep.nonce ^ 1, &st);
	g_test_message("hello with a wrong nonce: status %d", st);
	g_assert_cmpint(st, ==, TE_ERR_PEER_RESTARTED);
	{
		struct tcpw_hdr h = tcpw_req(TCPW_WRITE, 10, n->buf, 16);
		uint8_t frame[TCPW_HDR + 16];
		g_autofree char *text = NULL;
		int32_t est;

		tcpw_put(frame, &h);
		memset(frame + TCPW_HDR, 0x5a, 16);
		(void)raw_send(fd, frame, sizeof(frame)); /* may fail: the server closes */
		g_assert_true(raw_wait_closed(fd, now_ns() + 5 * S_NS, &est, &text));
		close(fd);
	}
	/* A request before the hello, and garbage, are closed too. */
	{
		struct tcpw_hdr h = tcpw_req(TCPW_WRITE, 11, n->buf, 16);
		uint8_t frame[TCPW_HDR + 16];
		g_autofree char *t1 = NULL, *t2 = NULL;
		int32_t est;

		tcpw_put(frame, &h);
		memset(frame + TCPW_HDR, 0x5b, 16);
		fd = raw_connect(ep.addr);
		g_assert_cmpint(fd, >=, 0);
		(void)raw_send(fd, frame, sizeof(frame));
		g_assert_true(raw_wait_closed(fd, now_ns() + 5 * S_NS, &est, &t1));
		close(fd);
		fd = raw_connect(ep.addr);
		g_assert_cmpint(fd, >=, 0);
		(void)raw_send(fd, junk, 4096);
		g_assert_true(raw_wait_closed(fd, now_ns() + 5 * S_NS, &est, &t2));
		close(fd);
	}
	/* Not one byte outside the legal WRITE changed, guards included. */
	assert_node_is(n, mirror, "after the hostile client");
	/* And the target still serves a well-behaved engine. */
	{
		struct te_engine *e = initiator_new(true, 30000);
		te_segment_id seg = open_node(e, n);

		roundtrip_ok(e, seg, n->buf + 8192, 65536, 55);
		assert_ok(te_segment_close(e, seg));
		initiator_free(e);
	}
	g_free(rd);
	g_free(junk);
	g_free(mirror);
	node_free(n);
}

/* Mid-batch SIGKILL of the target: every task terminal by its deadline, batch freeable. */
static void test_kill_mid_batch(void)
{
	enum {
		N = 512,
		LEN = 4u << 20
	};
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	struct lbuf l;
	struct te_request *r = g_new0(struct te_request, N);
	struct te_batch_info bi;
	unsigned count[TE_STATE_INVALID + 1] = { 0 };
	te_batch_id b;
	enum te_status st, wst;
	int64_t t_submit, t_kill, t_done;
	uint64_t bytes_at_kill;

	NEED_TCP();
	n = node_start_tcp();
	e = initiator_new(true, KILL_TIMEOUT_MS);
	seg = open_node(e, n);
	lbuf_new(&l, e, LEN);
	sysnode_fill(l.p, 0, LEN, 3);
	roundtrip_ok(e, seg, n->buf, 4096, 4); /* lanes are up before the big batch */

	for (unsigned i = 0; i < N; i++)
		r[i] = (struct te_request){ i % 4 == 3 ? TE_OP_READ : TE_OP_WRITE, seg, l.p,
					    n->buf + (uint64_t)(i % 16) * LEN, LEN };
	/* READs land in l.p as well: the bytes do not matter here, only the states. */
	assert_ok(te_batch_new(e, N, &b));
	t_submit = now_ns();
	assert_ok(te_batch_submit(e, b, r, N));
	do {
		assert_ok(te_batch_status(e, b, &bi));
	} while (bi.bytes == 0 && !te_state_is_terminal(bi.state) &&
		 now_ns() - t_submit < 5 * S_NS);
	g_assert_false(te_state_is_terminal(bi.state));
	bytes_at_kill = bi.bytes;
	g_subprocess_send_signal(n->proc, SIGKILL);
	t_kill = now_ns();

	watchdog_arm(KILL_TIMEOUT_MS / 1000 + 60, "te_batch_wait after killing the target");
	st = te_batch_wait(e, b, (KILL_TIMEOUT_MS + 30000) * MS_NS);
	watchdog_disarm();
	t_done = now_ns();
	assert_ok(te_batch_status(e, b, &bi));
	g_test_message("killed %.1f ms after submit with %" PRIu64 " of %" PRIu64
		       " bytes moved; batch %s (%s) %.1f ms after submit: %u completed, %u "
		       "failed, %u timed out, %u canceled, %" PRIu64 " bytes",
		       (t_kill - t_submit) / 1e6, bytes_at_kill, (uint64_t)N * LEN,
		       te_state_str(bi.state), te_status_str(st), (t_done - t_submit) / 1e6,
		       bi.completed, bi.failed, bi.timed_out, bi.canceled, bi.bytes);
	g_assert_cmpint(st, !=, TE_INPROGRESS);
	g_assert_true(te_state_is_terminal(bi.state));
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		g_assert_true(te_state_is_terminal(ti.state));
		count[ti.state]++;
		if (ti.state == TE_STATE_COMPLETED) {
			g_assert_cmpuint(ti.bytes, ==, LEN);
		} else {
			g_assert_cmpint(ti.status, <, 0);
			if (!ti.detail[0])
				g_error("task %u: %s (%s) without detail", i,
					te_state_str(ti.state), te_status_str(ti.status));
			if (count[ti.state] == 1)
				g_test_message("first %s task (%u): %s: %s", te_state_str(ti.state),
					       i, te_status_str(ti.status), ti.detail);
		}
	}
	g_assert_cmpuint(count[TE_STATE_COMPLETED], <, N); /* the kill came mid-batch */
	/* Every task's deadline is submit + transfer.timeout_ms; allow the worker's tick. */
	if (t_done - t_submit > (KILL_TIMEOUT_MS + 1500) * MS_NS)
		g_error("the batch became terminal %.1f ms after submit, past the %u ms deadline",
			(t_done - t_submit) / 1e6, KILL_TIMEOUT_MS);
	assert_ok(te_batch_free(e, b));

	/* Later transfers to the dead peer fail within their deadline too, no hang. */
	r[0] = (struct te_request){ TE_OP_WRITE, seg, l.p, n->buf, 4096 };
	t_submit = now_ns();
	b = run_batch(e, r, 1, &st, &wst);
	{
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, 0, &ti));
		g_test_message("WRITE to the dead peer: %s, %s: %s after %.1f ms",
			       te_state_str(ti.state), te_status_str(ti.status), ti.detail,
			       (now_ns() - t_submit) / 1e6);
		g_assert_true(ti.state == TE_STATE_FAILED || ti.state == TE_STATE_TIMEOUT ||
			      ti.state == TE_STATE_INVALID);
		g_assert_cmpstr(ti.detail, !=, "");
	}
	g_assert_cmpint(now_ns() - t_submit, <=, (KILL_TIMEOUT_MS + 1500) * MS_NS);
	assert_ok(te_batch_free(e, b));

	node_kill(n);
	/* Every batch is freed: nothing may still hold the local region or the segment. */
	{
		int64_t t0 = now_ns();

		st = te_mem_unregister(e, l.p);
		if (st != TE_OK) {
			g_autofree char *first = g_strdup(te_last_error());
			enum te_status st1 = st;

			while (st == TE_ERR_BUSY && now_ns() - t0 < 5 * S_NS) {
				sleep_ms(1);
				st = te_mem_unregister(e, l.p);
			}
			g_error("te_mem_unregister after every batch was freed: %s (%s); "
				"%s %.1f ms later",
				te_status_str(st1), first, te_status_str(st),
				(now_ns() - t0) / 1e6);
		}
		g_aligned_free(l.p);
	}
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	node_free(n);
	g_free(r);
}

/*
 * The target freezes (SIGSTOP) mid-batch: no reset, no answer. Every task must still end by
 * its deadline, the batch be freeable, and the engine get its memory back once the target is
 * gone for good.
 */
static void test_freeze_mid_batch(void)
{
	enum {
		N = 512,
		LEN = 4u << 20
	};
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	struct lbuf l;
	struct te_request *r = g_new0(struct te_request, N);
	struct te_batch_info bi;
	unsigned count[TE_STATE_INVALID + 1] = { 0 };
	te_batch_id b;
	enum te_status st, ust;
	int64_t t_submit, t_stop, t_done, t_kill;

	NEED_TCP();
	n = node_start_tcp();
	e = initiator_new(true, KILL_TIMEOUT_MS);
	seg = open_node(e, n);
	lbuf_new(&l, e, LEN);
	sysnode_fill(l.p, 0, LEN, 5);
	roundtrip_ok(e, seg, n->buf, 4096, 6);

	for (unsigned i = 0; i < N; i++)
		r[i] = (struct te_request){ i % 4 == 3 ? TE_OP_READ : TE_OP_WRITE, seg, l.p,
					    n->buf + (uint64_t)(i % 16) * LEN, LEN };
	assert_ok(te_batch_new(e, N, &b));
	t_submit = now_ns();
	assert_ok(te_batch_submit(e, b, r, N));
	do {
		assert_ok(te_batch_status(e, b, &bi));
	} while (bi.bytes == 0 && !te_state_is_terminal(bi.state) &&
		 now_ns() - t_submit < 5 * S_NS);
	g_assert_false(te_state_is_terminal(bi.state));
	node_stop_wait(n);
	t_stop = now_ns();

	watchdog_arm(KILL_TIMEOUT_MS / 1000 + 60, "te_batch_wait with a frozen target");
	st = te_batch_wait(e, b, (KILL_TIMEOUT_MS + 30000) * MS_NS);
	watchdog_disarm();
	t_done = now_ns();
	assert_ok(te_batch_status(e, b, &bi));
	g_test_message("frozen %.1f ms after submit; batch %s (%s) %.1f ms after submit: %u "
		       "completed, %u failed, %u timed out, %" PRIu64 " bytes",
		       (t_stop - t_submit) / 1e6, te_state_str(bi.state), te_status_str(st),
		       (t_done - t_submit) / 1e6, bi.completed, bi.failed, bi.timed_out, bi.bytes);
	g_assert_cmpint(st, !=, TE_INPROGRESS);
	for (uint32_t i = 0; i < N; i++) {
		struct te_task_info ti;

		assert_ok(te_task_status(e, b, i, &ti));
		g_assert_true(te_state_is_terminal(ti.state));
		count[ti.state]++;
		if (ti.state != TE_STATE_COMPLETED) {
			g_assert_cmpint(ti.status, <, 0);
			if (!ti.detail[0])
				g_error("task %u: %s (%s) without detail", i,
					te_state_str(ti.state), te_status_str(ti.status));
			if (count[ti.state] == 1)
				g_test_message("first %s task (%u): %s: %s", te_state_str(ti.state),
					       i, te_status_str(ti.status), ti.detail);
		}
	}
	g_assert_cmpuint(count[TE_STATE_COMPLETED], <, N);
	if (t_done - t_submit > (KILL_TIMEOUT_MS + 1500) * MS_NS)
		g_error("the batch became terminal %.1f ms after submit, past the %u ms deadline",
			(t_done - t_submit) / 1e6, KILL_TIMEOUT_MS);
	assert_ok(te_batch_free(e, b));

	/*
	 * The transport may still hold slices towards the frozen peer (a READ could land in
	 * l.p if it woke up), so the region may stay busy; once the peer is killed it must be
	 * released within the deadline.
	 */
	ust = te_mem_unregister(e, l.p);
	g_test_message("te_mem_unregister right after te_batch_free, target frozen: %s%s%s",
		       te_status_str(ust), ust ? ": " : "", ust ? te_last_error() : "");
	g_assert_true(ust == TE_OK || ust == TE_ERR_BUSY);
	node_kill(n);
	t_kill = now_ns();
	while (ust == TE_ERR_BUSY && now_ns() - t_kill < (KILL_TIMEOUT_MS + 2000) * MS_NS) {
		sleep_ms(5);
		ust = te_mem_unregister(e, l.p);
	}
	if (ust != TE_OK)
		g_error("te_mem_unregister still %s %.1f ms after the frozen target was killed: %s",
			te_status_str(ust), (now_ns() - t_kill) / 1e6, te_last_error());
	g_test_message("local region released %.1f ms after the target was killed",
		       (now_ns() - t_kill) / 1e6);
	g_aligned_free(l.p);
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	node_free(n);
	g_free(r);
}

/* One attempt of the restart test: WRITE and READ back 1 MiB at the current buffer. */
static bool restart_attempt(struct te_engine *e, te_segment_id seg, struct node *n,
			    unsigned attempt)
{
	const size_t len = 1u << 20;
	struct te_buffer_info buf;
	struct te_task_info ti;
	struct te_request r;
	enum te_status sst, wst;
	struct lbuf l;
	size_t nb = 0;
	te_batch_id b;
	bool ok = false;

	assert_ok(te_segment_buffers(e, seg, &buf, 1, &nb));
	g_assert_cmpuint(nb, ==, 1);
	lbuf_new(&l, e, 2 * len);
	sysnode_fill(l.p, 0, len, 1000 + attempt);
	r = (struct te_request){ TE_OP_WRITE, seg, l.p, buf.addr + 5, len };
	b = run_batch(e, &r, 1, &sst, &wst);
	assert_ok(te_task_status(e, b, 0, &ti));
	g_test_message("attempt %u: descriptor buffer 0x%" PRIx64 " (%s node's); WRITE: submit "
		       "%s, %s %s%s%s",
		       attempt, buf.addr, buf.addr == n->buf ? "the new" : "NOT the new",
		       te_status_str(sst), te_state_str(ti.state), te_status_str(ti.status),
		       ti.detail[0] ? ": " : "", ti.detail);
	assert_ok(te_batch_free(e, b));
	if (ti.state == TE_STATE_COMPLETED) {
		r = (struct te_request){ TE_OP_READ, seg, l.p + len, buf.addr + 5, len };
		b = run_batch(e, &r, 1, &sst, &wst);
		assert_ok(te_task_status(e, b, 0, &ti));
		g_test_message("attempt %u: READ: %s %s%s%s", attempt, te_state_str(ti.state),
			       te_status_str(ti.status), ti.detail[0] ? ": " : "", ti.detail);
		assert_ok(te_batch_free(e, b));
		if (ti.state == TE_STATE_COMPLETED) {
			assert_bytes(l.p + len, l.p, len, "READ after restart");
			g_assert_cmphex(node_checksum(n, buf.addr + 5 - n->base, len), ==,
					sysnode_fnv(l.p, len));
			ok = true;
		}
	}
	lbuf_free(&l, e);
	return ok;
}

/*
 * Kill @*n, start a new node on the same port (so the same segment name) and transfer on
 * the segment id opened before, up to 5 times; returns the attempt that succeeded.
 */
static unsigned restart_phase(struct te_engine *e, te_segment_id seg, const char *yaml,
			      const char *listen, bool probe_first, struct node **n)
{
	unsigned attempt;
	bool ok = false;

	node_kill(*n);
	node_free(*n);
	*n = node_start(yaml, NULL);
	g_assert_cmpstr((*n)->segment, ==, listen);
	if (probe_first)
		assert_ok(te_peer_probe(e, listen, 2000));
	for (attempt = 1; attempt <= 5; attempt++) {
		ok = restart_attempt(e, seg, *n, attempt);
		if (ok)
			break;
		/* The second attempt follows at once; later ones wait out the 1/s refresh limit. */
		sleep_ms(attempt == 1 ? 0 : 1100);
	}
	if (!ok)
		g_error("no transfer to the restarted target succeeded in 5 attempts%s",
			probe_first ? " (after a successful probe)" : "");
	g_test_message("the restarted target was reached at attempt %u%s", attempt,
		       probe_first ? " (after a probe)" : " (no probe before)");
	return attempt;
}

static void test_restart(void)
{
	g_autofree char *listen = NULL, *yaml = NULL;
	struct node *n;
	struct te_engine *e;
	te_segment_id seg, again = 0;
	unsigned plain, probed;

	NEED_TCP();
	listen = g_strdup_printf("127.0.0.1:%u", free_port());
	yaml = engine_yaml(listen, true, 30000);
	n = node_start(yaml, NULL);
	g_assert_cmpstr(n->segment, ==, listen);
	e = initiator_new(true, KILL_TIMEOUT_MS);
	seg = open_node(e, n);
	g_assert_true(restart_attempt(e, seg, n, 0));

	/* The application only transfers: the failure itself must lead to a refresh. */
	plain = restart_phase(e, seg, yaml, listen, false, &n);
	/* A probe sees the new generation first. */
	probed = restart_phase(e, seg, yaml, listen, true, &n);
	if (plain > 2)
		g_error("a transfer to the restarted target succeeded only at attempt %u; the "
			"second batch after a failure should use the refreshed descriptor",
			plain);
	if (probed > 2)
		g_error("after a successful probe of the restarted target, a transfer succeeded "
			"only at attempt %u",
			probed);
	/* The same name still maps to the same, refreshed segment. */
	assert_ok(te_segment_open(e, listen, &again));
	g_assert_cmpuint(again, ==, seg);
	assert_ok(te_segment_close(e, again));
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	node_free(n);
}

/* Hex of @len bytes (g_free). */
static char *hex(const uint8_t *p, size_t len)
{
	GString *s = g_string_sized_new(2 * len + 1);

	for (size_t k = 0; k < len; k++)
		g_string_append_printf(s, "%02x", p[k]);
	return g_string_free(s, FALSE);
}

/* Poll the node until it reports @want notifies (10 s at most); returns them. */
static char **notifies_wait(struct node *n, unsigned want)
{
	int64_t end = now_ns() + 10 * S_NS;

	for (;;) {
		char **v = node_notifies(n);

		if (g_strv_length(v) >= want || now_ns() >= end)
			return v;
		g_strfreev(v);
		sleep_ms(20);
	}
}

/* A notify batch: WRITE + READ of 4 KiB, then @msg. */
static void notify_batch(struct te_engine *e, te_segment_id seg, struct node *n, struct lbuf *l,
			 const uint8_t *msg, size_t len, bool with_bad, enum te_status want_submit)
{
	struct te_request r[3] = {
		{ TE_OP_WRITE, seg, l->p, n->buf + 10, 4096 },
		{ TE_OP_READ, seg, l->p + 8192, n->buf + 10, 4096 },
		{ TE_OP_WRITE, seg, l->p, n->buf + n->size - 100, 200 },
	};
	size_t nr = with_bad ? 3 : 2;
	te_batch_id b;
	enum te_status st;

	assert_ok(te_batch_new(e, (uint32_t)nr, &b));
	st = te_batch_submit_notify(e, b, r, nr, msg, len);
	g_assert_cmpint(st, ==, want_submit);
	watchdog_arm(BATCH_WAIT_NS / S_NS + 30, "te_batch_wait (notify)");
	st = te_batch_wait(e, b, BATCH_WAIT_NS);
	watchdog_disarm();
	g_assert_cmpint(st, ==, with_bad ? TE_ERR_REMOTE_ACCESS : TE_OK);
	assert_ok(te_batch_free(e, b));
}

static void test_notify(void)
{
	struct node *n;
	struct te_engine *e;
	te_segment_id seg;
	struct lbuf l;
	uint8_t msg1[16] = { 0x00, 0x01, 'n', 'o', 't', 'i', 'f', 'y', 0xff };
	uint8_t *msg3 = g_malloc(TE_NOTIFY_MAX);
	g_autofree char *want1 = NULL, *want3 = NULL;
	char **v;

	NEED_TCP();
	n = node_start_tcp();
	e = initiator_new(true, 30000);
	seg = open_node(e, n);
	lbuf_new(&l, e, 1u << 20);
	for (size_t i = 9; i < sizeof(msg1); i++)
		msg1[i] = (uint8_t)g_test_rand_int();
	for (size_t i = 0; i < TE_NOTIFY_MAX; i++)
		msg3[i] = (uint8_t)(i * 7 + 1);
	{
		g_autofree char *h1 = hex(msg1, sizeof(msg1));
		g_autofree char *h3 = hex(msg3, TE_NOTIFY_MAX);

		want1 = g_strdup_printf("notify %s %zu %s", te_engine_name(e), sizeof(msg1), h1);
		want3 = g_strdup_printf("notify %s %u %s", te_engine_name(e), TE_NOTIFY_MAX, h3);
	}

	/* A completed batch: its message arrives, exactly once. */
	notify_batch(e, seg, n, &l, msg1, sizeof(msg1), false, TE_OK);
	v = notifies_wait(n, 1);
	g_assert_cmpuint(g_strv_length(v), ==, 1);
	g_assert_cmpstr(v[0], ==, want1);
	g_strfreev(v);
	sleep_ms(1500);
	v = node_notifies(n);
	g_assert_cmpuint(g_strv_length(v), ==, 1);
	g_strfreev(v);

	/* A batch with a failing task: no message. */
	notify_batch(e, seg, n, &l, (const uint8_t *)"must-not-arrive", 15, true,
		     TE_ERR_REMOTE_ACCESS);
	sleep_ms(1500);
	v = node_notifies(n);
	g_assert_cmpuint(g_strv_length(v), ==, 1);
	g_strfreev(v);

	/* A batch whose task the target refuses (no longer registered there): no message. */
	{
		struct te_request q = { TE_OP_WRITE, seg, l.p, n->buf + 10, 4096 };
		g_autofree char *ok1 = NULL, *ok2 = NULL;
		te_batch_id b;
		enum te_status st;

		node_send(n, "unregister");
		ok1 = node_expect(n, "ok", NODE_REPLY_MS);
		assert_ok(te_batch_new(e, 1, &b));
		assert_ok(te_batch_submit_notify(e, b, &q, 1, "must-not-arrive-either", 22));
		watchdog_arm(BATCH_WAIT_NS / S_NS + 30, "te_batch_wait (notify, refused)");
		st = te_batch_wait(e, b, BATCH_WAIT_NS);
		watchdog_disarm();
		g_assert_cmpint(st, ==, TE_ERR_REMOTE_ACCESS);
		assert_ok(te_batch_free(e, b));
		node_send(n, "register");
		ok2 = node_expect(n, "ok", NODE_REPLY_MS);
	}
	sleep_ms(1500);
	v = node_notifies(n);
	g_assert_cmpuint(g_strv_length(v), ==, 1);
	g_strfreev(v);

	/* Bad input: refused, nothing appended, the error names the call and the cause. */
	{
		struct te_request q = { TE_OP_WRITE, seg, l.p, n->buf + 10, 4096 };
		struct te_request local = { TE_OP_WRITE, TE_SEGMENT_LOCAL, l.p, 0, 4096 };
		struct te_batch_info bi;
		te_batch_id b;

		local.remote = (uintptr_t)l.p + 8192;
		assert_ok(te_batch_new(e, 2, &b));
		g_assert_cmpint(te_batch_submit_notify(e, b, &q, 1, msg3, TE_NOTIFY_MAX + 1), ==,
				TE_ERR_INVALID_ARG);
		g_assert_nonnull(
			strstr(te_last_error(), "te_batch_submit_notify: message of 4097"));
		g_assert_cmpint(te_batch_submit_notify(e, b, &local, 1, "x", 1), ==,
				TE_ERR_INVALID_ARG);
		g_assert_nonnull(strstr(te_last_error(),
					"te_batch_submit_notify: request 0: all "
					"requests must target one remote segment"));
		g_assert_cmpint(te_batch_submit_notify(e, b, &q, 0, "x", 1), ==,
				TE_ERR_INVALID_ARG);
		g_assert_nonnull(strstr(te_last_error(), "te_batch_submit_notify: no requests"));
		assert_ok(te_batch_status(e, b, &bi));
		g_assert_cmpuint(bi.tasks, ==, 0);
		/* One notify per batch. */
		assert_ok(te_batch_submit_notify(e, b, &q, 1, "once", 4));
		g_assert_cmpint(te_batch_submit_notify(e, b, &q, 1, "twice", 5), ==, TE_ERR_EXISTS);
		g_assert_nonnull(strstr(te_last_error(),
					"te_batch_submit_notify: batch already has a notify"));
		watchdog_arm(BATCH_WAIT_NS / S_NS + 30, "te_batch_wait (notify, bad input)");
		assert_ok(te_batch_wait(e, b, BATCH_WAIT_NS));
		watchdog_disarm();
		assert_ok(te_batch_status(e, b, &bi));
		g_assert_cmpuint(bi.tasks, ==, 1);
		assert_ok(te_batch_free(e, b));
	}
	{
		g_autofree char *want_once = NULL;

		want_once = g_strdup_printf("notify %s 4 %s", te_engine_name(e), "6f6e6365");
		v = notifies_wait(n, 2);
		g_assert_cmpuint(g_strv_length(v), ==, 2);
		g_assert_cmpstr(v[1], ==, want_once);
		g_strfreev(v);
	}

	/* The next completed batch delivers its own, the largest allowed. */
	notify_batch(e, seg, n, &l, msg3, TE_NOTIFY_MAX, false, TE_OK);
	v = notifies_wait(n, 3);
	g_assert_cmpuint(g_strv_length(v), ==, 3);
	g_assert_cmpstr(v[2], ==, want3);
	g_strfreev(v);
	sleep_ms(1000);
	v = node_notifies(n);
	g_assert_cmpuint(g_strv_length(v), ==, 3);
	g_strfreev(v);

	lbuf_free(&l, e);
	assert_ok(te_segment_close(e, seg));
	initiator_free(e);
	g_free(msg3);
	node_free(n);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	signal(SIGPIPE, SIG_IGN);
	node_path = find_te_node();
	if (!node_path) {
		printf("1..0 # SKIP te-node not found (set TE_NODE or TE_BUILD_ROOT)\n");
		return 77;
	}
	tcp_path = find_plugin("tcp.so");
	g_test_message("te-node: %s; tcp plugin: %s", node_path,
		       tcp_path ? tcp_path : "not found along TE_PLUGIN_PATH");

	g_test_add_func("/system/control/unknown-segment", test_unknown_segment);
	g_test_add_func("/system/control/probe", test_probe);
	g_test_add_func("/system/control/concurrent-clients", test_concurrent_clients);
	g_test_add_func("/system/control/malformed-frames", test_malformed_frames);
	g_test_add_func("/system/tcp/transfer-sizes", test_transfer_sizes);
	g_test_add_func("/system/tcp/batch-1000", test_batch_1000);
	g_test_add_func("/system/tcp/out-of-range", test_out_of_range);
	g_test_add_func("/system/tcp/free-releases", test_free_releases);
	g_test_add_func("/system/tcp/hostile-client", test_hostile_client);
	g_test_add_func("/system/tcp/kill-mid-batch", test_kill_mid_batch);
	g_test_add_func("/system/tcp/freeze-mid-batch", test_freeze_mid_batch);
	g_test_add_func("/system/tcp/restart", test_restart);
	g_test_add_func("/system/tcp/notify", test_notify);
	return g_test_run();
}
