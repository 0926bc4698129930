/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp_wire.c: the tcp wire format (request and response headers, the authentication
 * transcript), reading frames, and socket helpers both sides use.
 */
#include "tcp.h"

/* "addr:port" / "[addr]:port" of a socket address. */
void tcp_sa_text(const struct sockaddr_storage *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(s4->sin_port));
	}
}

/* Printable copy of a peer-supplied detail (it may hold any bytes). */
void tcp_copy_detail(char *dst, size_t cap, const uint8_t *src, size_t len)
{
	size_t n = TCP_MIN(len, cap - 1);

	for (size_t i = 0; i < n; i++)
		dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? (char)src[i] : '?';
	dst[n] = '\0';
}

/* Make @d (malloc'd, or NULL: without memory) @s's failure text, freeing the one before. */
static void tcp_priv_detail_set(struct te_plugin_slice *s, char *d)
{
	struct tcp_spriv *p = tcp_priv(s);

	free(p->detail);
	p->detail = d;
}

/* Set @s's failure text to the formatted @fmt, cut to TCP_DETAIL_MAX - 1 bytes. */
void tcp_priv_detail(struct te_plugin_slice *s, const char *fmt, ...)
{
	char buf[TCP_DETAIL_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	tcp_priv_detail_set(s, strdup(buf));
}

/* Set @s's failure text to a printable copy of the peer's @len bytes at @src (cut the same). */
void tcp_priv_detail_peer(struct te_plugin_slice *s, const uint8_t *src, size_t len)
{
	char buf[TCP_DETAIL_MAX];

	tcp_copy_detail(buf, sizeof(buf), src, len);
	tcp_priv_detail_set(s, strdup(buf));
}

/* Fresh random bytes (nonces, client ids); false when the kernel cannot give them. */
bool tcp_random(void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = getrandom((uint8_t *)buf + done, len - done, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		done += (size_t)n;
	}
	return true;
}

/* The transcript a side MACs (TCP_TRANSCRIPT bytes). */
void tcp_transcript(uint8_t out[TCP_TRANSCRIPT], bool server, uint64_t instance, uint64_t cid,
		    uint64_t epoch, uint32_t lane, const uint8_t *nonce_c, const uint8_t *nonce_s)
{
	memset(out, 0, 16);
	memcpy(out, server ? "tcp-v2 server" : "tcp-v2 client", 14);
	te_plugin_put_u64(out + 16, instance);
	te_plugin_put_u64(out + 24, cid);
	te_plugin_put_u64(out + 32, epoch);
	te_plugin_put_u32(out + 40, lane);
	memcpy(out + 44, nonce_c, TCP_NONCE);
	memcpy(out + 44 + TCP_NONCE, nonce_s, TCP_NONCE);
}

/* Close @fd with a reset: the kernel drops what it still holds to send, now. */
void tcp_sock_abort(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

bool tcp_sock_connected(int fd)
{
	struct sockaddr_storage sa;
	socklen_t salen = sizeof(sa), len = sizeof(int);
	int err = 0;

	if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err)
		return false;
	return getpeername(fd, (struct sockaddr *)&sa, &salen) == 0;
}

/*
 * Option 'congestion' on @fd, before connect() or listen() (accepted connections take the
 * listener's): set on a connected socket, what the host's default began with stays on
 * (BBR's pacing). Checked at init (tcp_congestion_check).
 */
void tcp_sock_cc(const struct tcp_inst *ti, int fd)
{
	if (*ti->congestion)
		setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, ti->congestion,
			   (socklen_t)strlen(ti->congestion));
}

void tcp_sock_tune(const struct tcp_inst *ti, int fd)
{
	int one = 1, sz = (int)ti->sockbuf;

	/* Requests are small and latency-bound: never wait for Nagle. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (sz) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	}
	/* Called before connect(); an accepted socket has it already (then a no-op). */
	tcp_sock_cc(ti, fd);
}

/* --- initiator side: receiving ------------------------------------------------------ */

/*
 * One readv on @fd. With a payload in progress: into its destination (or @scratch when it
 * is discarded) and at most one header beyond it into the buffer; a small payload
 * (tcp_rx_through) goes into the buffer in bulk instead, and the caller copies it out. Otherwise
 * into the buffer: exactly @need bytes, or all the room when the stream is in bulk mode.
 * Returns the byte count, 0 at end of stream, -errno on error. *@drained: fewer bytes came
 * than asked for, so the socket's queue was empty (TCP copies all it holds): the caller may
 * stop here instead of calling again for EAGAIN. Data that arrives later wakes its epoll
 * (edge-triggered too: every arrival signals the socket) or its ppoll.
 */
ssize_t tcp_rx_read(int fd, struct tcp_rx *rx, uint8_t *scratch, size_t scratch_len, size_t need,
		    bool *drained)
{
	bool through = tcp_rx_through(rx);
	struct iovec iov[2];
	uint64_t take = 0;
	int n = 0;
	ssize_t r;

	if (rx->pos == rx->end) {
		rx->pos = rx->end = 0;
		tcp_rx_restore(rx);
	} else if (rx->spare &&
		   rx->end - rx->pos <= rx->spare_cap - TCP_HDR_LEN - TCP_DETAIL_WIRE) {
		memcpy(rx->spare, rx->buf + rx->pos, rx->end - rx->pos);
		rx->end -= rx->pos;
		rx->pos = 0;
		tcp_rx_restore(rx);
	} else if (rx->cap - rx->end < TCP_HDR_LEN + TCP_DETAIL_WIRE ||
		   (rx->bulk && rx->pos >= rx->cap / 2)) {
		memmove(rx->buf, rx->buf + rx->pos, rx->end - rx->pos);
		rx->end -= rx->pos;
		rx->pos = 0;
	}
	if (rx->payload && !through) {
		take = rx->left;
		if (!rx->dst && take > scratch_len)
			take = scratch_len;
		if (rx->dst && rx->room && take > rx->room)
			take = rx->room;
		iov[n++] = (struct iovec){ rx->dst ? rx->dst : scratch, take };
		/* The next header only once the payload's end is within reach. */
		if (take == rx->left)
			iov[n++] = (struct iovec){ rx->buf + rx->end, TCP_HDR_LEN };
	} else {
		size_t room = rx->cap - rx->end;

		iov[n++] = (struct iovec){ rx->buf + rx->end,
					   rx->bulk || through ? room : TCP_MIN(need, room) };
	}
	do
		r = readv(fd, iov, n);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	*drained = (size_t)r < iov[0].iov_len + (n > 1 ? iov[1].iov_len : 0);
	if (rx->payload && !through) {
		uint64_t got = TCP_MIN((uint64_t)r, take);

		if (rx->dst)
			rx->dst += got;
		if (rx->dst && rx->room)
			rx->room -= got;
		rx->left -= got;
		rx->end += (uint32_t)((uint64_t)r - got);
	} else {
		rx->end += (uint32_t)r;
	}
	return r;
}

/*
 * Back to the receiver's own buffer (rx->spare) from the one a scatter read handed the
 * parser; what it still holds (pos..end) must fit at the start of the own one.
 */
void tcp_rx_restore(struct tcp_rx *rx)
{
	if (!rx->spare)
		return;
	free(rx->buf);
	rx->buf = rx->spare;
	rx->cap = rx->spare_cap;
	rx->spare = NULL;
	rx->spare_cap = 0;
}

/* Move buffered bytes that belong to the payload just announced into its destination. */
void tcp_rx_prefix(struct tcp_rx *rx)
{
	uint64_t c = TCP_MIN((uint64_t)(rx->end - rx->pos), rx->left);

	if (!c)
		return;
	if (rx->dst) {
		memcpy(rx->dst, rx->buf + rx->pos, c);
		rx->dst += c;
	}
	rx->pos += (uint32_t)c;
	rx->left -= c;
}
