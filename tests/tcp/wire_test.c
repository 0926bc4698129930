/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire_test.c: tcp_rx_read (plugins/tcp/tcp_wire.c, compiled in) over a real loopback TCP
 * connection: the bytes it moves, where they land, and its drained flag, which lets both
 * sides skip the readv that would only return EAGAIN. A drained flag raised while the
 * socket still holds bytes would leave them unread until the next arrival (a hang when
 * none comes), so every case checks both directions.
 */
#include "../../plugins/tcp/tcp.h"

#include <fcntl.h>
#include <glib.h>
#include <sys/ioctl.h>
#include <unistd.h>

struct pair {
	int tx, rx; /* connected loopback sockets; rx non-blocking */
};

static void pair_up(struct pair *p)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);

	g_assert_cmpint(lfd, >=, 0);
	g_assert_cmpint(bind(lfd, (struct sockaddr *)&a, sizeof(a)), ==, 0);
	g_assert_cmpint(listen(lfd, 1), ==, 0);
	g_assert_cmpint(getsockname(lfd, (struct sockaddr *)&a, &alen), ==, 0);
	p->tx = socket(AF_INET, SOCK_STREAM, 0);
	g_assert_cmpint(connect(p->tx, (struct sockaddr *)&a, sizeof(a)), ==, 0);
	p->rx = accept(lfd, NULL, NULL);
	g_assert_cmpint(p->rx, >=, 0);
	g_assert_cmpint(fcntl(p->rx, F_SETFL, O_NONBLOCK), ==, 0);
	close(lfd);
}

static void pair_down(struct pair *p)
{
	close(p->tx);
	close(p->rx);
}

/* Send @len bytes of pattern starting at @seed, then wait until the receiver holds them all. */
static void send_wait(struct pair *p, size_t len, uint8_t seed)
{
	uint8_t *b = g_malloc(len);
	int queued = 0;

	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(seed + i);
	g_assert_cmpint(send(p->tx, b, len, 0), ==, (ssize_t)len);
	g_free(b);
	for (int i = 0; i < 5000; i++) {
		g_assert_cmpint(ioctl(p->rx, FIONREAD, &queued), ==, 0);
		if ((size_t)queued >= len)
			return;
		g_usleep(1000);
	}
	g_error("the receiver holds %d of %zu bytes after 5 s", queued, len);
}

static void assert_pattern(const uint8_t *p, size_t len, uint8_t seed)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != (uint8_t)(seed + i))
			g_error("byte %zu is 0x%02x, not 0x%02x", i, p[i], (uint8_t)(seed + i));
}

/* Bulk mode: every read fills the buffer's room while bytes wait; only the last is short. */
static void test_bulk(void)
{
	uint8_t buf[TCP_RBUF], scratch[64];
	struct tcp_rx rx = { .buf = buf, .cap = TCP_RBUF, .bulk = true };
	size_t total = 2 * TCP_RBUF + 1000, got = 0;
	bool drained = true;
	struct pair p;
	ssize_t r;

	pair_up(&p);
	send_wait(&p, total, 7);
	for (int i = 0; i < 2; i++) {
		rx.pos = rx.end = 0; /* consumed */
		r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
		g_assert_cmpint(r, ==, TCP_RBUF);
		g_assert_false(drained); /* full: more may wait (it does) */
		assert_pattern(buf, TCP_RBUF, (uint8_t)(7 + got));
		got += (size_t)r;
	}
	rx.pos = rx.end = 0;
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, 1000);
	g_assert_true(drained);
	assert_pattern(buf, 1000, (uint8_t)(7 + got));
	/* Drained means it: the next read finds nothing. */
	rx.pos = rx.end = 0;
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, -EAGAIN);
	pair_down(&p);
}

/* Header mode: exactly @need bytes asked and got is not drained, whatever follows. */
static void test_need(void)
{
	uint8_t buf[TCP_RBUF], scratch[64];
	struct tcp_rx rx = { .buf = buf, .cap = TCP_RBUF };
	bool drained = true;
	struct pair p;
	ssize_t r;

	pair_up(&p);
	send_wait(&p, TCP_HDR_LEN + 10, 1);
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, TCP_HDR_LEN);
	g_assert_false(drained);
	assert_pattern(buf, TCP_HDR_LEN, 1);
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, 10);
	g_assert_true(drained);
	g_assert_cmpuint(rx.end, ==, TCP_HDR_LEN + 10);
	pair_down(&p);
}

/*
 * A payload straight into its destination with the next header behind it (two iovecs):
 * both filled is not drained; a payload tail that ends the stream is.
 */
static void test_payload(void)
{
	uint8_t buf[TCP_RBUF], scratch[64], dst[3000];
	struct tcp_rx rx = {
		.buf = buf, .cap = TCP_RBUF, .payload = true, .dst = dst, .left = sizeof(dst)
	};
	bool drained = true;
	struct pair p;
	ssize_t r;

	pair_up(&p);
	send_wait(&p, sizeof(dst) + TCP_HDR_LEN + 5, 3);
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, sizeof(dst) + TCP_HDR_LEN);
	g_assert_false(drained);
	g_assert_cmpuint(rx.left, ==, 0);
	assert_pattern(dst, sizeof(dst), 3);
	assert_pattern(buf, TCP_HDR_LEN, (uint8_t)(3 + sizeof(dst)));
	g_assert_cmpuint(rx.end, ==, TCP_HDR_LEN);

	/* Half a payload waits: short, drained, and it went to the destination. */
	rx = (struct tcp_rx){
		.buf = buf, .cap = TCP_RBUF, .payload = true, .dst = dst, .left = sizeof(dst)
	};
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, 5);
	g_assert_true(drained);
	g_assert_cmpuint(rx.left, ==, sizeof(dst) - 5);
	assert_pattern(dst, 5, (uint8_t)(3 + sizeof(dst) + TCP_HDR_LEN));

	/* The payload's rest and part of the next header: drained too. */
	send_wait(&p, sizeof(dst) - 5 + 10, 9);
	r = tcp_rx_read(p.rx, &rx, scratch, sizeof(scratch), TCP_HDR_LEN, &drained);
	g_assert_cmpint(r, ==, sizeof(dst) - 5 + 10);
	g_assert_true(drained);
	g_assert_cmpuint(rx.left, ==, 0);
	g_assert_cmpuint(rx.end, ==, 10);
	assert_pattern(dst + 5, sizeof(dst) - 5, 9);
	assert_pattern(buf, 10, (uint8_t)(9 + sizeof(dst) - 5));
	pair_down(&p);
}

/*
 * A slice's failure text (tcp_priv_detail): formatted, at most TCP_DETAIL_MAX - 1 bytes, each
 * replacing the last; the peer's text made printable and cut the same way; a report takes it.
 */
static void test_priv_detail(void)
{
	struct {
		struct te_plugin_slice s;
		struct tcp_spriv p;
	} sl = { 0 };
	char big[400];
	uint8_t peer[300];

	sl.s.priv = &sl.p;
	tcp_priv_detail(&sl.s, "tcp: %s %d", "connect to B failed", 7);
	g_assert_cmpstr(sl.p.detail, ==, "tcp: connect to B failed 7");
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	tcp_priv_detail(&sl.s, "%s", big); /* replaces (and frees) the first: ASan checks */
	g_assert_cmpuint(strlen(sl.p.detail), ==, TCP_DETAIL_MAX - 1);
	g_assert_true(strspn(sl.p.detail, "x") == TCP_DETAIL_MAX - 1);
	for (size_t i = 0; i < sizeof(peer); i++)
		peer[i] = i % 2 ? 'a' : 0x07;
	tcp_priv_detail_peer(&sl.s, peer, 4);
	g_assert_cmpstr(sl.p.detail, ==, "?a?a");
	tcp_priv_detail_peer(&sl.s, peer, sizeof(peer));
	g_assert_cmpuint(strlen(sl.p.detail), ==, TCP_DETAIL_MAX - 1);
	tcp_priv_detail_peer(&sl.s, peer, 0);
	g_assert_cmpstr(sl.p.detail, ==, "");
	free(sl.p.detail);
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/tcp/wire/rx-read/bulk", test_bulk);
	g_test_add_func("/tcp/wire/rx-read/need", test_need);
	g_test_add_func("/tcp/wire/rx-read/payload", test_payload);
	g_test_add_func("/tcp/wire/priv-detail", test_priv_detail);
	return g_test_run();
}
