/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_raw_loop.c: a raw pipelined TCP request/response loop, the baseline of te-bench over tcp. */

/*
 * tcp-raw-loop moves blocks with the same request/response shape as te's tcp wire
 * (plugins/tcp/README.md), without anything else: no engine, no batches object, no worker
 * threads, no locks. It is what te over tcp could reach on the same machine, measured with the
 * same working-set layout as te-bench, so compare-tcp.sh can put te-bench, this loop and
 * iperf3 side by side.
 *
 * Wire: every frame starts with a 32-byte header laid out as te's (magic, version, op, flags,
 * id, status, addr, length; little-endian), with its own magic "RAWL" so neither side mistakes
 * the other. READ: the request is a header; the answer a header plus `length` payload bytes,
 * which the client receives straight into the destination (one recvmsg scatters the headers
 * and payloads of many answers). WRITE: a header plus the payload, which the server receives
 * straight into its buffer; the answer is a header. INFO (at connect, and on the first
 * connection after the run): the answer carries the server buffer's size in `length` and the
 * server process's CPU time (ns) in `addr`. The server answers in order, so the client knows which request each answer is for
 * and checks the id, op, status and length of every answer.
 *
 * Threads: the client runs one thread per connection (like te's lanes), each doing its own
 * sends and receives on a blocking socket (MSG_DONTWAIT while both directions are busy, poll
 * when neither moves). The server runs one thread per connection: headers read in bulk,
 * READ answers gathered into one sendmsg (header + payload iovecs into its buffer), WRITE
 * payloads received straight into the buffer together with the next header.
 *
 * Layout (as te-bench): the server fills its buffer with te-bench's pattern; the first half is
 * read, the second half written. Connection t uses [t x ws, +ws) of each half, ws being the
 * per-connection working set (batch x depth x block unless --working-set). Request n of a
 * connection uses area n mod (ws / block) on both sides, so every batch in flight has its own
 * areas. --depth D keeps D batches of --batch B requests in flight; a batch is sent as soon as
 * the oldest one completes; latency is per batch, from its first send to its last answer.
 * As in te-bench, each connection first runs --warmup untimed batches, then all start timing
 * together; --verify checks every byte against te-bench's pattern (depth 1).
 *
 * Output: te-bench's row (or its JSON keys, plus connections, working_set, pingpong and the
 * CPU seconds of both sides over the timed window), and te-bench's progress line on stderr.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"
#include "steal.h"

#define RL_EXIT_OK 0
#define RL_EXIT_FAIL 1
#define RL_EXIT_USAGE 2
#define RL_EXIT_SIGNAL 130

#define RL_KIB (UINT64_C(1) << 10)
#define RL_MIB (UINT64_C(1) << 20)
#define RL_GIB (UINT64_C(1) << 30)

/* Wire. */
#define RL_MAGIC 0x4c574152u /* bytes "RAWL" */
#define RL_VERSION 1u
#define RL_HDR 32u
#define RL_OP_READ 0u
#define RL_OP_WRITE 1u
#define RL_OP_INFO 2u
#define RL_MAX_FRAME RL_GIB /* longest READ/WRITE the server accepts (as te's tcp) */

/* Limits on what a user may ask for; bounded so products cannot overflow. */
#define RL_MAX_BLOCK RL_MAX_FRAME
#define RL_MAX_BATCH 65536u
#define RL_MAX_DEPTH 16u /* as te-bench */
#define RL_MAX_CONNS 256u
#define RL_MAX_WS (64 * RL_GIB)		  /* per connection */
#define RL_MAX_BUFFER (UINT64_C(1) << 40) /* server buffer */
#define RL_MIN_BUFFER (8 * RL_KIB)
#define RL_MAX_DURATION (7.0 * 86400.0)
#define RL_MAX_ITERATIONS (INT64_C(1) << 48)
#define RL_MAX_SERVER_CONNS 1024u
#define RL_MAX_WARMUP (1u << 20)

/* Defaults (te-bench's). */
#define RL_DEF_BLOCK (64 * RL_KIB)
#define RL_DEF_BATCH 128u
#define RL_DEF_DURATION 5.0
#define RL_DEF_SERVER_BUFFER RL_GIB
#define RL_DEF_TIMEOUT 120.0
#define RL_PINGPONG_BLOCK (4 * RL_KIB)
#define RL_DEF_WARMUP 8u

/* The project version (meson passes it), for the JSON rows as te-bench's. */
#ifndef RL_TE_VERSION
#define RL_TE_VERSION "0.0.0"
#endif

/* iovecs per sendmsg/recvmsg (IOV_MAX on Linux). */
#define RL_IOV 1024u
/*
 * Bytes offered to one sendmsg/recvmsg (beyond the first frame): a call moves at most about a
 * socket buffer, so a longer iovec array would only be built and thrown away.
 */
#define RL_IO_BYTES (2 * RL_MIB)
/* Server: header bytes read in bulk; answers queued before a flush (2 iovecs each). */
#define RL_SRV_HB (64 * RL_KIB)
#define RL_SRV_QUEUE (RL_IOV / 2)
/* Latency samples kept per run over all connections (8 bytes each), as te-bench. */
#define RL_MAX_SAMPLES (1u << 20)
#define RL_PROGRESS_AFTER_NS (2 * UINT64_C(1000000000))
#define RL_STARTUP_TIMEOUT_NS (120 * UINT64_C(1000000000))
#define RL_REAP_TIMEOUT_NS (10 * UINT64_C(1000000000))
/* Written into areas a READ is about to fill, so a READ that moves nothing fails verify. */
#define RL_POISON 0xa5

#define RL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define RL_MAX(a, b) ((a) > (b) ? (a) : (b))

enum rl_mode {
	RL_MODE_NONE,
	RL_MODE_SERVER,
	RL_MODE_CLIENT,
	RL_MODE_LOOPBACK,
};

struct rl_opts {
	enum rl_mode mode;
	char host[256]; /* --client HOST / --server ADDR */
	char port[16];
	uint8_t op; /* RL_OP_READ or RL_OP_WRITE */
	uint64_t block;
	uint32_t batch;
	uint32_t depth;
	uint32_t conns;
	uint64_t ws;	      /* per connection; 0: batch x depth x block */
	uint64_t buffer_size; /* server; 0: the mode's default */
	double duration_s;    /* <= 0: none (--iterations alone) */
	int64_t iterations;   /* batches per connection; < 0: not given */
	uint32_t warmup;      /* untimed batches per connection before the run */
	double timeout_s;
	bool pingpong;
	bool verify;
	bool json;
	bool quiet;
};

static volatile sig_atomic_t rl_signalled;

static void rl_on_signal(int sig)
{
	rl_signalled = sig;
}

static void rl_signals_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = rl_on_signal;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: a blocking recv returns EINTR and the loop sees the flag. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

static void rl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void rl_err(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "tcp-raw-loop: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static uint64_t rl_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time (user + system) of the whole process, in nanoseconds. */
static uint64_t rl_cpu_ns(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

/* "4096", "64K", "64KiB", "64KB", "1M", "1G": K/M/G are powers of 2 (as te-bench). */
static bool rl_parse_size(const char *s, uint64_t *out)
{
	uint64_t v, mult = 1;
	char *end;

	if (!s || s[0] < '0' || s[0] > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return false;
	switch (*end) {
	case 'k':
	case 'K':
		mult = RL_KIB;
		break;
	case 'm':
	case 'M':
		mult = RL_MIB;
		break;
	case 'g':
	case 'G':
		mult = RL_GIB;
		break;
	default:
		break;
	}
	if (mult > 1) {
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0' || (v && mult > UINT64_MAX / v))
		return false;
	*out = v * mult;
	return true;
}

static const char *rl_size_str(uint64_t v, char *buf, size_t len)
{
	if (v && v % RL_GIB == 0)
		snprintf(buf, len, "%" PRIu64 "G", v / RL_GIB);
	else if (v && v % RL_MIB == 0)
		snprintf(buf, len, "%" PRIu64 "M", v / RL_MIB);
	else if (v && v % RL_KIB == 0)
		snprintf(buf, len, "%" PRIu64 "K", v / RL_KIB);
	else
		snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

static const char *rl_op_str(uint8_t op)
{
	return op == RL_OP_WRITE ? "write" : "read";
}

static uint8_t *rl_map(uint64_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		rl_err("cannot allocate %" PRIu64 " bytes: %s", len, strerror(errno));
		return NULL;
	}
	return p;
}

/* Start of the write zone: half the buffer, page-aligned when big enough (as te-bench). */
static uint64_t rl_zone_half(uint64_t len)
{
	uint64_t half = len / 2;

	return half >= 8192 ? half & ~UINT64_C(4095) : half;
}

/* --- wire ---------------------------------------------------------------------------------- */

struct rl_hdr {
	uint8_t op;
	uint32_t id;
	int32_t status;
	uint64_t addr;
	uint64_t len;
};

static void rl_put(uint8_t *p, uint8_t op, uint32_t id, int32_t status, uint64_t addr, uint64_t len)
{
	uint32_t m = htole32(RL_MAGIC), i = htole32(id), s = htole32((uint32_t)status);
	uint64_t a = htole64(addr), l = htole64(len);

	memcpy(p, &m, 4);
	p[4] = RL_VERSION;
	p[5] = op;
	p[6] = 0;
	p[7] = 0;
	memcpy(p + 8, &i, 4);
	memcpy(p + 12, &s, 4);
	memcpy(p + 16, &a, 8);
	memcpy(p + 24, &l, 8);
}

/* False on a bad magic, version or flags field. */
static bool rl_get(const uint8_t *p, struct rl_hdr *h)
{
	uint32_t m, i, s;
	uint64_t a, l;

	memcpy(&m, p, 4);
	if (le32toh(m) != RL_MAGIC || p[4] != RL_VERSION || p[6] || p[7])
		return false;
	memcpy(&i, p + 8, 4);
	memcpy(&s, p + 12, 4);
	memcpy(&a, p + 16, 8);
	memcpy(&l, p + 24, 8);
	h->op = p[5];
	h->id = le32toh(i);
	h->status = (int32_t)le32toh(s);
	h->addr = le64toh(a);
	h->len = le64toh(l);
	return true;
}

/* --congestion (checked when parsed); "": the host's default. */
static char rl_congestion[16];

/*
 * Before connect() or listen(): an algorithm set on a connected socket keeps what the host's
 * default set up when the connection began (BBR's pacing, for one).
 */
static void rl_sock_cc(int fd)
{
	if (*rl_congestion)
		setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, rl_congestion,
			   (socklen_t)strlen(rl_congestion));
}

static void rl_sock_tune(int fd)
{
	int one = 1;

	/* As te's tcp plugin: no Nagle; socket buffers left to the kernel's autotuning. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Append [p, +len) to @iov (merged with the last entry when contiguous). */
static void rl_iov_add(struct iovec *iov, uint32_t *n, void *p, size_t len)
{
	if (!len)
		return;
	if (*n && (uint8_t *)iov[*n - 1].iov_base + iov[*n - 1].iov_len == (uint8_t *)p) {
		iov[*n - 1].iov_len += len;
		return;
	}
	iov[*n].iov_base = p;
	iov[*n].iov_len = len;
	(*n)++;
}

/* Send all of @iov (advanced in place); false on an error. */
static bool rl_send_all(int fd, struct iovec *iov, uint32_t n)
{
	uint32_t at = 0;

	while (at < n) {
		struct msghdr msg = { .msg_iov = iov + at, .msg_iovlen = n - at };
		ssize_t s = sendmsg(fd, &msg, MSG_NOSIGNAL);

		if (s < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		while (s > 0 && at < n) {
			if ((size_t)s >= iov[at].iov_len) {
				s -= (ssize_t)iov[at].iov_len;
				at++;
			} else {
				iov[at].iov_base = (uint8_t *)iov[at].iov_base + s;
				iov[at].iov_len -= (size_t)s;
				s = 0;
			}
		}
	}
	return true;
}

/* --- server -------------------------------------------------------------------------------- */

struct rl_region {
	uint8_t *base;
	uint64_t len;
};

struct rl_srv_conn {
	int fd;
	const struct rl_region *r;
};

static atomic_uint rl_srv_conns;

/* The queue of answers of one connection, sent by rl_srv_flush. */
struct rl_srv_q {
	uint8_t (*hdr)[RL_HDR];
	struct iovec *iov;
	uint32_t n, niov;
};

static bool rl_srv_flush(int fd, struct rl_srv_q *q)
{
	bool ok = rl_send_all(fd, q->iov, q->niov);

	q->n = 0;
	q->niov = 0;
	return ok;
}

/* Queue an answer (the caller made room); @payload: NULL or @len bytes to follow it. */
static void rl_srv_answer(struct rl_srv_q *q, uint8_t op, uint32_t id, int32_t status,
			  uint64_t addr, uint64_t len, uint8_t *payload)
{
	uint8_t *h = q->hdr[q->n++];

	rl_put(h, op, id, status, addr, len);
	rl_iov_add(q->iov, &q->niov, h, RL_HDR);
	if (payload)
		rl_iov_add(q->iov, &q->niov, payload, len);
}

/*
 * One connection: parse the headers in the bulk buffer, queue READ answers (header + iovec
 * into the region), receive WRITE payloads straight into the region along with the next
 * header; flush the queue when it is full or before blocking for more requests.
 */
static void *rl_srv_conn_main(void *arg)
{
	struct rl_srv_conn *sc = arg;
	const struct rl_region *r = sc->r;
	int fd = sc->fd;
	uint8_t *hb = malloc(RL_SRV_HB);
	struct rl_srv_q q = { .hdr = malloc((size_t)RL_SRV_QUEUE * RL_HDR),
			      .iov = malloc(sizeof(struct iovec) * RL_IOV) };
	size_t hlen = 0, hoff = 0; /* bytes in hb; parse position */
	uint8_t *dst = NULL;	   /* the WRITE payload being received */
	uint64_t left = 0;
	uint32_t wid = 0;
	bool last_write = false;

	free(sc);
	if (!hb || !q.hdr || !q.iov)
		goto out;
	for (;;) {
		struct iovec riov[2];
		struct msghdr msg = { .msg_iov = riov };
		ssize_t got;

		while (!left && hlen - hoff >= RL_HDR) {
			struct rl_hdr h;
			uint64_t take;

			if (q.n == RL_SRV_QUEUE && !rl_srv_flush(fd, &q))
				goto out;
			if (!rl_get(hb + hoff, &h))
				goto out; /* not our protocol: close */
			hoff += RL_HDR;
			if (h.op == RL_OP_INFO) {
				rl_srv_answer(&q, RL_OP_INFO, h.id, 0, rl_cpu_ns(), r->len, NULL);
				continue;
			}
			if ((h.op != RL_OP_READ && h.op != RL_OP_WRITE) || h.len == 0 ||
			    h.len > RL_MAX_FRAME || h.addr > r->len || h.len > r->len - h.addr) {
				/* Answer once, then close: the stream cannot be followed any more. */
				rl_srv_answer(&q, h.op, h.id, -EINVAL, 0, 0, NULL);
				rl_srv_flush(fd, &q);
				goto out;
			}
			if (h.op == RL_OP_READ) {
				rl_srv_answer(&q, RL_OP_READ, h.id, 0, 0, h.len, r->base + h.addr);
				last_write = false;
				continue;
			}
			/* WRITE: payload bytes already in hb (bulk read after READs) are copied. */
			dst = r->base + h.addr;
			left = h.len;
			wid = h.id;
			last_write = true;
			take = RL_MIN(left, (uint64_t)(hlen - hoff));
			memcpy(dst, hb + hoff, take);
			hoff += take;
			dst += take;
			left -= take;
			if (!left)
				rl_srv_answer(&q, RL_OP_WRITE, wid, 0, 0, 0, NULL);
		}
		if (hoff) {
			memmove(hb, hb + hoff, hlen - hoff);
			hlen -= hoff;
			hoff = 0;
		}
		if (left) {
			/* hb is empty here: the payload took every byte that was in it. */
			riov[0] = (struct iovec){ dst, left };
			riov[1] = (struct iovec){ hb, RL_HDR };
			msg.msg_iovlen = 2;
		} else {
			/* After a WRITE, read no further than the next header: no payload copies. */
			riov[0] = (struct iovec){ hb + hlen,
						  last_write ? RL_HDR - hlen : RL_SRV_HB - hlen };
			msg.msg_iovlen = 1;
		}
		got = recvmsg(fd, &msg, q.n ? MSG_DONTWAIT : 0);
		if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && q.n) {
			if (!rl_srv_flush(fd, &q))
				goto out;
			continue;
		}
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break; /* EOF or error: the client is done */
		if (left) {
			uint64_t take = RL_MIN(left, (uint64_t)got);

			dst += take;
			left -= take;
			got -= (ssize_t)take;
			if (!left) {
				if (q.n == RL_SRV_QUEUE && !rl_srv_flush(fd, &q))
					goto out;
				rl_srv_answer(&q, RL_OP_WRITE, wid, 0, 0, 0, NULL);
			}
		}
		hlen += (size_t)got;
	}
	if (q.n)
		rl_srv_flush(fd, &q);
out:
	close(fd);
	free(hb);
	free(q.hdr);
	free(q.iov);
	atomic_fetch_sub_explicit(&rl_srv_conns, 1, memory_order_relaxed);
	return NULL;
}

/*
 * Serve @len bytes (filled with the pattern) on @addr:@port until a signal, or EOF on
 * @lifeline (>= 0). Prints "port: N" to @report once listening.
 */
static int rl_server(const char *addr, const char *port, uint64_t len, FILE *report, int lifeline)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct rl_region r = { .len = len };
	pthread_attr_t attr;
	int lfd = -1, one = 1, rc = RL_EXIT_FAIL, e;
	char sz[32];
	uint64_t t0;

	e = getaddrinfo(addr, port, &hints, &ai);
	if (e) {
		rl_err("server address %s:%s: %s", addr, port, gai_strerror(e));
		return RL_EXIT_FAIL;
	}
	r.base = rl_map(len);
	if (!r.base)
		goto out;
	t0 = rl_now_ns();
	/* Touches every page before anyone measures, and lays down the pattern. */
	pattern_fill(r.base, 0, len, 0);
	lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0) {
		rl_err("socket: %s", strerror(errno));
		goto out;
	}
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	rl_sock_cc(lfd); /* accepted connections start with it */
	if (bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, 128) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&ss, &sl) != 0) {
		rl_err("listen on %s:%s: %s", addr, port, strerror(errno));
		goto out;
	}
	snprintf(sz, sizeof(sz), "%u",
		 ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						: ((struct sockaddr_in *)&ss)->sin_port));
	fprintf(report, "port: %s\n", sz);
	if (fflush(report) != 0) {
		rl_err("cannot report the port: %s", strerror(errno));
		goto out;
	}
	if (report == stdout) /* --server; --loopback's child stays quiet */
		rl_err("serving %" PRIu64 " bytes on port %s (filled in %.2f s)", len, sz,
		       (double)(rl_now_ns() - t0) / 1e9);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = RL_EXIT_OK;
	while (!rl_signalled) {
		struct pollfd pfd[2] = { { .fd = lfd, .events = POLLIN },
					 { .fd = lifeline, .events = POLLIN } };
		struct rl_srv_conn *sc;
		pthread_t th;
		int cfd, n = poll(pfd, lifeline >= 0 ? 2 : 1, 250);

		if (n <= 0)
			continue;
		if (lifeline >= 0 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
			char buf[64];
			ssize_t g = read(lifeline, buf, sizeof(buf));

			if (g == 0 || (g < 0 && errno != EINTR && errno != EAGAIN))
				break;
		}
		if (!(pfd[0].revents & POLLIN))
			continue;
		cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0)
			continue;
		if (atomic_load_explicit(&rl_srv_conns, memory_order_relaxed) >=
		    RL_MAX_SERVER_CONNS) {
			close(cfd);
			continue;
		}
		rl_sock_tune(cfd);
		sc = malloc(sizeof(*sc));
		if (!sc) {
			close(cfd);
			continue;
		}
		sc->fd = cfd;
		sc->r = &r;
		atomic_fetch_add_explicit(&rl_srv_conns, 1, memory_order_relaxed);
		if (pthread_create(&th, &attr, rl_srv_conn_main, sc) != 0) {
			atomic_fetch_sub_explicit(&rl_srv_conns, 1, memory_order_relaxed);
			close(cfd);
			free(sc);
		}
	}
	pthread_attr_destroy(&attr);
	/* Connection threads may still run: the region stays mapped until the process exits. */
out:
	if (lfd >= 0)
		close(lfd);
	freeaddrinfo(ai);
	return rc;
}

/* --- client -------------------------------------------------------------------------------- */

struct rl_lat {
	uint64_t *v; /* reservoir of batch latencies (ns) */
	uint32_t cap;
	uint32_t n;
	uint64_t seen;
	uint64_t sum_ns;
	uint64_t max_ns;
	uint64_t rng;
};

static uint64_t rl_rand(uint64_t *s)
{
	uint64_t x = *s; /* xorshift64*: plenty for picking reservoir slots */

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * UINT64_C(0x2545f4914f6cdd1d);
}

static void rl_lat_add(struct rl_lat *l, uint64_t ns)
{
	uint64_t j;

	l->sum_ns += ns;
	if (ns > l->max_ns)
		l->max_ns = ns;
	l->seen++;
	if (l->n < l->cap) {
		l->v[l->n++] = ns;
		return;
	}
	j = rl_rand(&l->rng) % l->seen;
	if (j < l->cap)
		l->v[j] = ns;
}

/* State shared by the connections of one run. */
struct rl_run {
	const struct rl_opts *o;
	uint64_t region_len;
	uint64_t half;
	uint64_t ws;	 /* per connection: nareas x block */
	uint64_t nareas; /* areas of block bytes per connection and side */
	uint64_t duration_ns;
	int64_t timeout_ms;
	uint64_t salt_base;
	uint8_t *local;
	uint64_t llen;
	/* Holds the connection threads until all exist, then releases them together. */
	pthread_mutex_t gate_lock;
	pthread_cond_t gate_cond;
	int gate;	  /* 0 closed, 1 go, -1 abort */
	uint32_t arrived; /* connections done warming up: the timed loops start together */
	atomic_bool stop;
	atomic_uint finished;
};

/* Batch kinds: a measured batch, a warm-up batch, the read-back of a verified WRITE. */
enum {
	RL_BATCH_MAIN,
	RL_BATCH_WARMUP,
	RL_BATCH_CHECK,
};

struct rl_worker {
	struct rl_run *c;
	uint32_t idx;
	pthread_t thread;
	bool started;
	int fd;
	uint8_t *data; /* ws bytes: the areas */
	uint8_t *back; /* batch x block bytes: WRITE read-back (--verify) */
	uint64_t roff, woff;
	uint32_t nslots; /* batch x depth */
	uint8_t (*qh)[RL_HDR];
	uint8_t (*ph)[RL_HDR];
	uint8_t **loc;
	uint8_t *sop;
	struct iovec *iov;
	uint64_t issued, sent, recvd; /* request counts */
	uint64_t sends;		      /* sendmsg calls that moved requests (warm-up included) */
	uint64_t tx_off, rx_off;      /* bytes of the frame at sent / recvd already moved */
	uint64_t batches_started;     /* measured batches */
	uint64_t t0[RL_MAX_DEPTH];
	uint8_t kind[RL_MAX_DEPTH];
	bool refill; /* a completed measured batch starts the next one */
	uint64_t deadline;
	struct rl_lat lat;
	atomic_uint_fast64_t progress_bytes; /* read by the progress line; relaxed */
	uint64_t bytes, requests, batches;
	uint64_t t_start, t_end;
	bool failed;
};

static bool rl_more(struct rl_worker *w)
{
	const struct rl_opts *o = w->c->o;

	/* Relaxed: the flag only asks the loop to end soon; no data rides on it. */
	return !w->failed && !rl_signalled &&
	       !atomic_load_explicit(&w->c->stop, memory_order_relaxed) &&
	       (o->iterations < 0 || w->batches_started < (uint64_t)o->iterations) &&
	       rl_now_ns() < w->deadline;
}

/* Start one batch of @op: request k moves [lbase + a x block) <-> [rbase + a x block). */
static void rl_issue(struct rl_worker *w, uint8_t op, uint8_t *lbase, uint64_t rbase, int kind)
{
	const struct rl_opts *o = w->c->o;
	uint64_t b = w->issued / o->batch;
	uint32_t s0 = (uint32_t)(b % o->depth) * o->batch;

	for (uint32_t k = 0; k < o->batch; k++) {
		uint64_t n = w->issued + k;
		uint64_t a = kind != RL_BATCH_CHECK ? n % w->c->nareas : k;
		uint32_t s = s0 + k;

		w->loc[s] = lbase + a * o->block;
		w->sop[s] = op;
		rl_put(w->qh[s], op, (uint32_t)n, 0, rbase + a * o->block, o->block);
	}
	w->t0[b % o->depth] = rl_now_ns();
	w->kind[b % o->depth] = (uint8_t)kind;
	w->issued += o->batch;
	if (kind == RL_BATCH_MAIN)
		w->batches_started++;
}

static void rl_issue_kind(struct rl_worker *w, int kind)
{
	const struct rl_opts *o = w->c->o;

	rl_issue(w, o->op, w->data, o->op == RL_OP_READ ? w->roff : w->woff, kind);
}

static void rl_issue_main(struct rl_worker *w)
{
	rl_issue_kind(w, RL_BATCH_MAIN);
}

static void rl_fail(struct rl_worker *w, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void rl_fail(struct rl_worker *w, const char *fmt, ...)
{
	va_list ap;

	if (!w->failed) {
		fprintf(stderr, "tcp-raw-loop: connection %" PRIu32 ": ", w->idx);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
	w->failed = true;
}

static uint64_t rl_frame_tx(const struct rl_worker *w, uint32_t s)
{
	return RL_HDR + (w->sop[s] == RL_OP_WRITE ? w->c->o->block : 0);
}

static uint64_t rl_frame_rx(const struct rl_worker *w, uint32_t s)
{
	return RL_HDR + (w->sop[s] == RL_OP_READ ? w->c->o->block : 0);
}

/* Send what fits of the requests not sent yet: 1 moved, 0 would block, -1 failed. */
static int rl_tx(struct rl_worker *w)
{
	struct msghdr msg = { .msg_iov = w->iov };
	uint32_t niov = 0;
	ssize_t s;

	for (uint64_t n = w->sent, bytes = 0;
	     n < w->issued && niov + 2 <= RL_IOV && (n == w->sent || bytes < RL_IO_BYTES); n++) {
		uint32_t slot = (uint32_t)(n % w->nslots);
		uint64_t pos = n == w->sent ? w->tx_off : 0;

		bytes += rl_frame_tx(w, slot) - pos;

		if (pos < RL_HDR)
			rl_iov_add(w->iov, &niov, w->qh[slot] + pos, RL_HDR - pos);
		if (w->sop[slot] == RL_OP_WRITE) {
			uint64_t p = pos > RL_HDR ? pos - RL_HDR : 0;

			rl_iov_add(w->iov, &niov, w->loc[slot] + p, w->c->o->block - p);
		}
	}
	msg.msg_iovlen = niov;
	s = sendmsg(w->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (s < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return 0;
		rl_fail(w, "send: %s", strerror(errno));
		return -1;
	}
	w->sends += s > 0;
	while (s > 0) {
		uint64_t rem = rl_frame_tx(w, (uint32_t)(w->sent % w->nslots)) - w->tx_off;

		if ((uint64_t)s >= rem) {
			s -= (ssize_t)rem;
			w->sent++;
			w->tx_off = 0;
		} else {
			w->tx_off += (uint64_t)s;
			s = 0;
		}
	}
	return 1;
}

/* A batch has all its answers. */
static void rl_batch_done(struct rl_worker *w)
{
	const struct rl_opts *o = w->c->o;
	uint64_t b = w->recvd / o->batch - 1;
	uint32_t d = (uint32_t)(b % o->depth);
	uint64_t bb = o->batch * o->block;

	if (w->kind[d] != RL_BATCH_MAIN)
		return;
	rl_lat_add(&w->lat, rl_now_ns() - w->t0[d]);
	w->batches++;
	w->requests += o->batch;
	w->bytes += bb;
	atomic_fetch_add_explicit(&w->progress_bytes, bb, memory_order_relaxed);
	if (w->refill && rl_more(w))
		rl_issue_main(w);
}

/* An answer's header arrived: it must be the one for request @n. */
static bool rl_answer_ok(struct rl_worker *w, uint64_t n, uint32_t slot)
{
	struct rl_hdr h;
	uint64_t want = w->sop[slot] == RL_OP_READ ? w->c->o->block : 0;

	if (!rl_get(w->ph[slot], &h)) {
		rl_fail(w, "answer %" PRIu64 ": bad magic, version or flags", n);
		return false;
	}
	if (h.status != 0) {
		rl_fail(w,
			"answer %" PRIu64 ": the server refused the request (status %" PRId32 ")",
			n, h.status);
		return false;
	}
	if (h.op != w->sop[slot] || h.id != (uint32_t)n || h.len != want) {
		rl_fail(w,
			"answer %" PRIu64 ": op %u id %" PRIu32 " length %" PRIu64
			", want op %u id %" PRIu32 " length %" PRIu64,
			n, h.op, h.id, h.len, w->sop[slot], (uint32_t)n, want);
		return false;
	}
	return true;
}

/*
 * Receive answers straight into place: headers into ph, READ payloads into their areas.
 * @wait: block until something arrives. 1 moved, 0 would block, -1 failed.
 */
static int rl_rx(struct rl_worker *w, bool wait)
{
	struct msghdr msg = { .msg_iov = w->iov };
	uint32_t niov = 0;
	ssize_t g;

	for (uint64_t n = w->recvd, bytes = 0;
	     n < w->issued && niov + 2 <= RL_IOV && (n == w->recvd || bytes < RL_IO_BYTES); n++) {
		uint32_t slot = (uint32_t)(n % w->nslots);
		uint64_t pos = n == w->recvd ? w->rx_off : 0;

		bytes += rl_frame_rx(w, slot) - pos;

		if (pos < RL_HDR)
			rl_iov_add(w->iov, &niov, w->ph[slot] + pos, RL_HDR - pos);
		if (w->sop[slot] == RL_OP_READ) {
			uint64_t p = pos > RL_HDR ? pos - RL_HDR : 0;

			rl_iov_add(w->iov, &niov, w->loc[slot] + p, w->c->o->block - p);
		}
	}
	msg.msg_iovlen = niov;
	g = recvmsg(w->fd, &msg, wait ? 0 : MSG_DONTWAIT);
	if (g < 0) {
		if (errno == EINTR || (!wait && (errno == EAGAIN || errno == EWOULDBLOCK)))
			return 0;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			rl_fail(w, "no answer within %.0f s", w->c->o->timeout_s);
		else
			rl_fail(w, "receive: %s", strerror(errno));
		return -1;
	}
	if (g == 0) {
		rl_fail(w, "the server closed the connection");
		return -1;
	}
	while (g > 0) {
		uint32_t slot = (uint32_t)(w->recvd % w->nslots);
		uint64_t rem = rl_frame_rx(w, slot) - w->rx_off;
		uint64_t take = RL_MIN(rem, (uint64_t)g);

		if (w->rx_off < RL_HDR && w->rx_off + take >= RL_HDR &&
		    !rl_answer_ok(w, w->recvd, slot))
			return -1;
		w->rx_off += take;
		g -= (ssize_t)take;
		if (w->rx_off < rl_frame_rx(w, slot))
			break;
		w->rx_off = 0;
		w->recvd++;
		if (w->recvd % w->c->o->batch == 0)
			rl_batch_done(w);
	}
	return 1;
}

/* Move bytes until every issued request is answered (refilling while w->refill says so). */
static bool rl_drive(struct rl_worker *w)
{
	while (w->recvd < w->issued) {
		bool tx = w->sent < w->issued;
		int ts = 0, rs;

		if (tx) {
			ts = rl_tx(w);
			if (ts < 0)
				return false;
			tx = w->sent < w->issued;
		}
		/* Nothing left to send: block in recv (one syscall per wake-up). */
		rs = rl_rx(w, !tx);
		if (rs < 0)
			return false;
		if (!ts && !rs && tx) {
			struct pollfd pfd = { .fd = w->fd, .events = POLLIN | POLLOUT };
			int n = poll(&pfd, 1, (int)w->c->timeout_ms);

			if (n == 0) {
				rl_fail(w, "no progress within %.0f s", w->c->o->timeout_s);
				return false;
			}
		}
	}
	return true;
}

static void rl_verify_failed(struct rl_worker *w, const char *what, const uint8_t *p, uint64_t off,
			     uint64_t at, uint64_t salt)
{
	rl_fail(w,
		"verify failed after %s: remote offset 0x%" PRIx64 " (request %" PRIu64
		", byte %" PRIu64 "): got 0x%02x, want 0x%02x",
		what, off + at, at / w->c->o->block, at % w->c->o->block, p[at],
		pattern_byte(off + at, salt));
}

static uint64_t rl_write_salt(const struct rl_run *c, uint64_t i)
{
	return pattern_salt(c->salt_base + i + 1);
}

/* --verify (depth 1, one batch area): poison or fill, move, check (WRITE: read back first). */
static void rl_worker_verified(struct rl_worker *w)
{
	struct rl_run *c = w->c;
	const struct rl_opts *o = c->o;
	uint64_t bb = o->batch * o->block;
	bool wr = o->op == RL_OP_WRITE;

	w->refill = false;
	for (uint64_t i = 0; rl_more(w); i++) {
		uint64_t at;

		if (wr)
			pattern_fill(w->data, w->woff, bb, rl_write_salt(c, i));
		else
			memset(w->data, RL_POISON, bb);
		rl_issue_main(w);
		if (!rl_drive(w))
			return;
		if (!wr) {
			at = pattern_check(w->data, w->roff, bb, 0);
			if (at < bb) {
				rl_verify_failed(w, "READ", w->data, w->roff, at, 0);
				return;
			}
			continue;
		}
		memset(w->back, RL_POISON, bb);
		rl_issue(w, RL_OP_READ, w->back, w->woff, RL_BATCH_CHECK);
		if (!rl_drive(w))
			return;
		at = pattern_check(w->back, w->woff, bb, rl_write_salt(c, i));
		if (at < bb) {
			rl_verify_failed(w, "WRITE and read-back", w->back, w->woff, at,
					 rl_write_salt(c, i));
			return;
		}
	}
}

static bool rl_gate_wait(struct rl_run *c)
{
	int g;

	pthread_mutex_lock(&c->gate_lock);
	while (c->gate == 0)
		pthread_cond_wait(&c->gate_cond, &c->gate_lock);
	g = c->gate;
	pthread_mutex_unlock(&c->gate_lock);
	return g > 0;
}

static void rl_gate_open(struct rl_run *c, bool go)
{
	pthread_mutex_lock(&c->gate_lock);
	c->gate = go ? 1 : -1;
	pthread_cond_broadcast(&c->gate_cond);
	pthread_mutex_unlock(&c->gate_lock);
}

/* Wait until every connection has warmed up (or given up), so the timed loops start together. */
static void rl_gate_arrive(struct rl_run *c)
{
	pthread_mutex_lock(&c->gate_lock);
	if (++c->arrived >= c->o->conns)
		pthread_cond_broadcast(&c->gate_cond);
	while (c->arrived < c->o->conns)
		pthread_cond_wait(&c->gate_cond, &c->gate_lock);
	pthread_mutex_unlock(&c->gate_lock);
}

/* --warmup: untimed batches of the run's op, so connections and caches are warm (te-bench's). */
static bool rl_worker_warmup(struct rl_worker *w)
{
	const struct rl_opts *o = w->c->o;

	w->refill = false;
	for (uint32_t i = 0; i < o->warmup; i++) {
		/* Relaxed: as in the timed loop, the flag only asks the loop to end soon. */
		if (rl_signalled || atomic_load_explicit(&w->c->stop, memory_order_relaxed))
			break;
		rl_issue_kind(w, RL_BATCH_WARMUP);
		if (!rl_drive(w))
			return false;
	}
	return true;
}

static void *rl_worker_main(void *arg)
{
	struct rl_worker *w = arg;
	struct rl_run *c = w->c;
	const struct rl_opts *o = c->o;

	if (!rl_gate_wait(c))
		goto out;
	if (!rl_worker_warmup(w))
		atomic_store_explicit(&c->stop, true, memory_order_relaxed);
	rl_gate_arrive(c);
	if (w->failed)
		goto out;
	w->t_start = rl_now_ns();
	w->deadline = c->duration_ns ? w->t_start + c->duration_ns : UINT64_MAX;
	if (o->verify) {
		rl_worker_verified(w);
	} else {
		w->refill = true;
		for (uint32_t d = 0; d < o->depth && rl_more(w); d++)
			rl_issue_main(w);
		rl_drive(w);
	}
	w->t_end = rl_now_ns();
	if (w->failed)
		atomic_store_explicit(&c->stop, true, memory_order_relaxed);
out:
	atomic_fetch_add_explicit(&c->finished, 1, memory_order_release);
	return NULL;
}

static int rl_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array, in microseconds (as te-bench). */
static double rl_pct_us(const uint64_t *sorted, size_t n, double p)
{
	size_t rank;

	if (!n)
		return 0.0;
	rank = (size_t)(p * (double)n + 0.999999);
	rank = RL_MAX(rank, (size_t)1);
	rank = RL_MIN(rank, n);
	return (double)sorted[rank - 1] / 1000.0;
}

/* Connect to @host:@port; the INFO answer gives the server buffer's size and CPU time. */
static int rl_connect(const char *host, const char *port, double timeout_s)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV };
	struct addrinfo *ai = NULL, *p;
	struct timeval tv = { .tv_sec = (time_t)timeout_s,
			      .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) *
						       1e6) };
	int fd = -1, e = getaddrinfo(host, port, &hints, &ai);

	if (e) {
		rl_err("%s:%s: %s", host, port, gai_strerror(e));
		return -1;
	}
	for (p = ai; p; p = p->ai_next) {
		fd = socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			continue;
		rl_sock_cc(fd);
		if (connect(fd, p->ai_addr, p->ai_addrlen) == 0)
			break;
		e = errno;
		close(fd);
		fd = -1;
		errno = e;
	}
	if (fd < 0)
		rl_err("cannot connect to %s:%s: %s", host, port, strerror(errno));
	else {
		rl_sock_tune(fd);
		/* A blocking receive that waits this long fails the run. */
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	freeaddrinfo(ai);
	return fd;
}

static bool rl_info(int fd, uint64_t *len_out, uint64_t *cpu_ns_out)
{
	uint8_t q[RL_HDR], a[RL_HDR];
	struct rl_hdr h;
	ssize_t g;

	rl_put(q, RL_OP_INFO, 0, 0, 0, 0);
	if (send(fd, q, sizeof(q), MSG_NOSIGNAL) != (ssize_t)sizeof(q))
		return false;
	do
		g = recv(fd, a, sizeof(a), MSG_WAITALL);
	while (g < 0 && errno == EINTR);
	if (g != (ssize_t)sizeof(a) || !rl_get(a, &h) || h.op != RL_OP_INFO || h.status != 0)
		return false;
	*len_out = h.len;
	*cpu_ns_out = h.addr;
	return true;
}

static void rl_json_str(const char *key, const char *v, bool comma)
{
	printf("\"%s\":\"", key);
	for (const char *p = v; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if ((unsigned char)*p < 0x20)
			printf("\\u%04x", (unsigned char)*p);
		else
			putchar(*p);
	}
	printf("\"%s", comma ? "," : "");
}

struct rl_row {
	const char *mode;
	char segment[300];
	char device[64];
	uint64_t bytes, requests, batches;
	uint64_t sent, sends; /* requests sent and the sendmsg calls that sent them, warm-up too */
	double seconds;
	double lat_avg_us, lat_p50_us, lat_p99_us, lat_p999_us, lat_max_us;
	double cpu_init_s, cpu_target_s; /* < 0: unknown */
	double steal_pct;		 /* te-bench's: the hypervisor's share; < 0: unknown */
	bool failed, verified, interrupted;
};

static void rl_print(const struct rl_opts *o, const struct rl_run *c, const struct rl_row *r)
{
	double gbps = r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0.0;
	double ops = r->seconds > 0 ? (double)r->requests / r->seconds : 0.0;
	const char *verdict = "-";
	char sz[32];

	if (o->json) {
		printf("{");
		rl_json_str("mode", r->mode, true);
		rl_json_str("segment", r->segment, true);
		rl_json_str("opened", "-", true);
		rl_json_str("op", rl_op_str(o->op), true);
		printf("\"block_size\":%" PRIu64 ",\"batch\":%" PRIu32
		       ",\"batch_requested\":%" PRIu32 ",\"threads\":%" PRIu32 ",\"depth\":%" PRIu32
		       ",\"warmup\":%" PRIu32 ",",
		       o->block, o->batch, o->batch, o->conns, o->depth, o->warmup);
		rl_json_str("transport", "raw-tcp", true);
		rl_json_str("device", r->device, true);
		printf("\"bytes\":%" PRIu64 ",\"requests\":%" PRIu64 ",\"batches\":%" PRIu64
		       ",\"samples\":%" PRIu64
		       ",\"seconds\":%.9g,\"gbps\":%.9g,\"ops_per_s\":%.9g,\"lat_us_avg\":%.9g,"
		       "\"lat_us_p50\":%.9g,\"lat_us_p99\":%.9g,\"lat_us_p999\":%.9g,"
		       "\"lat_us_max\":%.9g,",
		       r->bytes, r->requests, r->batches, r->batches, r->seconds, gbps, ops,
		       r->lat_avg_us, r->lat_p50_us, r->lat_p99_us, r->lat_p999_us, r->lat_max_us);
		printf("\"verify\":%s,\"verified\":%s,\"failed\":%s,\"interrupted\":%s,",
		       o->verify ? "true" : "false", r->verified ? "true" : "false",
		       r->failed ? "true" : "false", r->interrupted ? "true" : "false");
		rl_json_str("version", RL_TE_VERSION, true);
		rl_json_str("congestion", rl_congestion, true);
		/* te-bench's lanes keys: one connection per thread, each carries requests. */
		printf("\"lanes\":%" PRIu32 ",\"lanes_used\":%" PRIu32 ",", o->conns, o->conns);
		/* As te-bench's: requests per sendmsg, warm-up included. */
		if (r->sends)
			printf("\"slices_per_send\":%.9g,", (double)r->sent / (double)r->sends);
		else
			printf("\"slices_per_send\":null,");
		printf("\"connections\":%" PRIu32 ",\"working_set\":%" PRIu64
		       ",\"pingpong\":%s,\"cpu_s_initiator\":%.6f",
		       o->conns, c->ws, o->pingpong ? "true" : "false", r->cpu_init_s);
		/* null as in te-bench's rows: the server did not say (an older one, or it failed) */
		if (r->cpu_target_s >= 0)
			printf(",\"cpu_s_target\":%.6f", r->cpu_target_s);
		else
			printf(",\"cpu_s_target\":null");
		if (r->steal_pct >= 0)
			printf(",\"steal_pct\":%.3f", r->steal_pct);
		else
			printf(",\"steal_pct\":null");
		printf("}\n");
		fflush(stdout);
		return;
	}
	if (r->failed && !o->verify)
		verdict = "FAILED";
	else if (o->verify)
		verdict = r->verified ? "yes" : "NO";
	/* te-bench's header and row. */
	printf("%-5s %6s %5s %3s %8s %8s %10s %9s %9s %9s %9s  %-10s %-20s %s\n", "op", "block",
	       "batch", "thr", "samples", "GB/s", "ops/s", "avg_us", "p50_us", "p99_us", "p999_us",
	       "transport", "device", "verified");
	printf("%-5s %6s %5" PRIu32 " %3" PRIu32 " %8" PRIu64 " %8.3f %10.0f %9.1f %9.1f %9.1f "
	       "%9.1f  %-10s %-20s %s\n",
	       rl_op_str(o->op), rl_size_str(o->block, sz, sizeof(sz)), o->batch, o->conns,
	       r->batches, gbps, ops, r->lat_avg_us, r->lat_p50_us, r->lat_p99_us, r->lat_p999_us,
	       "raw-tcp", r->device, verdict);
	fflush(stdout);
}

static bool rl_is_loopback_host(const char *host)
{
	return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
	       strcmp(host, "localhost") == 0;
}

static void rl_worker_clear(struct rl_worker *w)
{
	if (w->fd >= 0)
		close(w->fd);
	free(w->qh);
	free(w->ph);
	free(w->loc);
	free(w->sop);
	free(w->iov);
	free(w->lat.v);
}

/* Sum the connections' counters and percentiles into @r. */
static void rl_collect(struct rl_row *r, struct rl_worker *ws, uint32_t n)
{
	uint64_t t0 = UINT64_MAX, t1 = 0, seen = 0, sum = 0, max = 0;
	size_t total = 0, at = 0;
	uint64_t *all;

	for (uint32_t t = 0; t < n; t++)
		total += ws[t].lat.n;
	all = malloc(sizeof(*all) * (total ? total : 1));
	for (uint32_t t = 0; t < n; t++) {
		struct rl_worker *w = &ws[t];

		r->bytes += w->bytes;
		r->requests += w->requests;
		r->batches += w->batches;
		r->sent += w->sent;
		r->sends += w->sends;
		r->failed |= w->failed;
		if (w->t_start) {
			t0 = RL_MIN(t0, w->t_start);
			t1 = RL_MAX(t1, w->t_end);
		}
		seen += w->lat.seen;
		sum += w->lat.sum_ns;
		max = RL_MAX(max, w->lat.max_ns);
		if (all)
			memcpy(all + at, w->lat.v, w->lat.n * sizeof(*all));
		at += w->lat.n;
	}
	r->seconds = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0.0;
	if (!all)
		total = 0;
	qsort(all, total, sizeof(*all), rl_cmp_u64);
	r->lat_avg_us = seen ? (double)sum / (double)seen / 1000.0 : 0.0;
	r->lat_p50_us = rl_pct_us(all, total, 0.50);
	r->lat_p99_us = rl_pct_us(all, total, 0.99);
	r->lat_p999_us = rl_pct_us(all, total, 0.999);
	r->lat_max_us = (double)max / 1000.0;
	free(all);
}

static bool rl_worker_setup(struct rl_worker *w, struct rl_run *c, uint32_t t)
{
	const struct rl_opts *o = c->o;
	uint64_t per = c->ws + (o->verify ? o->batch * o->block : 0);
	uint32_t cap = RL_MAX(RL_MAX_SAMPLES / o->conns, 1024u);

	w->c = c;
	w->idx = t;
	w->data = c->local + per * t;
	w->back = w->data + c->ws;
	w->roff = c->ws * t;
	w->woff = c->half + c->ws * t;
	w->nslots = o->batch * o->depth;
	w->qh = malloc((size_t)w->nslots * RL_HDR);
	w->ph = malloc((size_t)w->nslots * RL_HDR);
	w->loc = calloc(w->nslots, sizeof(*w->loc));
	w->sop = calloc(w->nslots, 1);
	w->iov = malloc(sizeof(struct iovec) * RL_IOV);
	w->lat.cap = cap;
	w->lat.v = malloc(sizeof(uint64_t) * cap);
	w->lat.rng = UINT64_C(0x9e3779b97f4a7c15) * (t + 1);
	atomic_init(&w->progress_bytes, 0);
	if (!w->qh || !w->ph || !w->loc || !w->sop || !w->iov || !w->lat.v) {
		rl_err("out of memory");
		return false;
	}
	return true;
}

/* Connect, lay out, touch, run, report. @mode names the row ("client", "loopback"). */
static int rl_client(const struct rl_opts *o, const char *mode, const char *host, const char *port)
{
	struct rl_run c;
	struct rl_row r;
	struct rl_worker *ws = calloc(o->conns, sizeof(*ws));
	uint64_t cpu0 = 0, cpu1 = 0, scpu0 = 0, scpu1 = 0, len = 0, per, prog_last = 0, t_prog;
	struct steal_mark steal0 = { 0 };
	uint32_t started = 0;
	bool gate_ok = false, scpu = false;
	int rc = RL_EXIT_FAIL;
	char sz[32], sz2[32];

	memset(&c, 0, sizeof(c));
	memset(&r, 0, sizeof(r));
	c.o = o;
	c.timeout_ms = (int64_t)(o->timeout_s * 1000.0);
	c.duration_ns = o->duration_s > 0 ? (uint64_t)(o->duration_s * 1e9) : 0;
	c.ws = o->ws ? o->ws : (uint64_t)o->batch * o->depth * o->block;
	c.nareas = c.ws / o->block;
	c.ws = c.nareas * o->block;
	if (getrandom(&c.salt_base, sizeof(c.salt_base), 0) != sizeof(c.salt_base))
		c.salt_base = rl_now_ns();
	if (!ws)
		return RL_EXIT_FAIL;
	for (uint32_t t = 0; t < o->conns; t++)
		ws[t].fd = -1;
	for (uint32_t t = 0; t < o->conns; t++) {
		uint64_t l, cpu;

		ws[t].fd = rl_connect(host, port, o->timeout_s);
		if (ws[t].fd < 0)
			goto out;
		if (!rl_info(ws[t].fd, &l, &cpu)) {
			rl_err("%s:%s did not answer INFO (is it tcp-raw-loop --server?)", host,
			       port);
			goto out;
		}
		if (t == 0) {
			len = l;
			scpu0 = cpu;
		}
	}
	c.region_len = len;
	c.half = rl_zone_half(len);
	if ((uint64_t)o->conns * c.ws > c.half || (uint64_t)o->conns * c.ws > len - c.half) {
		rl_err("%" PRIu32 " connection(s) x %s working set do not fit half the server's "
		       "buffer (%s); use a larger --buffer-size on the server",
		       o->conns, rl_size_str(c.ws, sz, sizeof(sz)),
		       rl_size_str(len, sz2, sizeof(sz2)));
		rc = RL_EXIT_USAGE;
		goto out;
	}
	per = c.ws + (o->verify ? o->batch * o->block : 0);
	c.llen = per * o->conns;
	c.local = rl_map(c.llen);
	if (!c.local)
		goto out;
	/* Touch every page now: first touch is slow and must not land in the timed run. */
	memset(c.local, 0, c.llen);
	pthread_mutex_init(&c.gate_lock, NULL);
	pthread_cond_init(&c.gate_cond, NULL);
	gate_ok = true;
	atomic_init(&c.stop, false);
	atomic_init(&c.finished, 0);
	for (uint32_t t = 0; t < o->conns; t++)
		if (!rl_worker_setup(&ws[t], &c, t))
			goto out_gate;
	for (uint32_t t = 0; t < o->conns; t++) {
		if (pthread_create(&ws[t].thread, NULL, rl_worker_main, &ws[t]) != 0) {
			rl_err("cannot start thread %" PRIu32, t);
			break;
		}
		ws[t].started = true;
		started++;
	}
	cpu0 = rl_cpu_ns();
	steal0 = steal_mark_now();
	t_prog = rl_now_ns();
	rl_gate_open(&c, started == o->conns);
	while (atomic_load_explicit(&c.finished, memory_order_acquire) < started) {
		uint64_t bytes = 0, now;

		usleep(50000);
		if (rl_signalled)
			atomic_store_explicit(&c.stop, true, memory_order_relaxed);
		now = rl_now_ns();
		if (o->quiet || now - t_prog < RL_PROGRESS_AFTER_NS ||
		    now - prog_last < 1000000000u)
			continue;
		prog_last = now;
		for (uint32_t t = 0; t < started; t++)
			bytes += atomic_load_explicit(&ws[t].progress_bytes, memory_order_relaxed);
		/* te-bench's progress line, so compare-tcp.sh reads both alike. */
		fprintf(stderr,
			"tcp-raw-loop: %s %s x%" PRIu32 " thr %" PRIu32
			": %.0f s (of %.0f), %.3f GB/s\n",
			rl_op_str(o->op), rl_size_str(o->block, sz, sizeof(sz)), o->batch, o->conns,
			(double)(now - t_prog) / 1e9, o->duration_s,
			(double)bytes / ((double)(now - t_prog) / 1e9) / 1e9);
	}
	for (uint32_t t = 0; t < o->conns; t++)
		if (ws[t].started)
			pthread_join(ws[t].thread, NULL);
	cpu1 = rl_cpu_ns();
	r.steal_pct = steal_pct_since(steal0);

	r.mode = mode;
	snprintf(r.segment, sizeof(r.segment), "%s:%s", host, port);
	snprintf(r.device, sizeof(r.device), "%s", rl_is_loopback_host(host) ? "lo" : host);
	rl_collect(&r, ws, started);
	r.failed |= started != o->conns;
	r.interrupted = rl_signalled != 0;
	r.verified = o->verify && !r.failed && !r.interrupted && r.batches > 0;
	r.cpu_init_s = (double)(cpu1 - cpu0) / 1e9;
	r.cpu_target_s = -1;
	if (!ws[0].failed && rl_info(ws[0].fd, &len, &scpu1))
		scpu = true;
	if (scpu && scpu1 >= scpu0)
		r.cpu_target_s = (double)(scpu1 - scpu0) / 1e9;
	rl_print(o, &c, &r);
	rc = r.failed ? RL_EXIT_FAIL : r.interrupted ? RL_EXIT_SIGNAL : RL_EXIT_OK;
out_gate:
	if (gate_ok) {
		pthread_mutex_destroy(&c.gate_lock);
		pthread_cond_destroy(&c.gate_cond);
	}
	munmap(c.local, c.llen);
out:
	for (uint32_t t = 0; t < o->conns; t++)
		rl_worker_clear(&ws[t]);
	free(ws);
	return rc;
}

/* --- loopback: a forked server ------------------------------------------------------------- */

static int rl_reap(pid_t pid)
{
	uint64_t deadline = rl_now_ns() + RL_REAP_TIMEOUT_NS;
	int status = 0, sig = 0;
	pid_t r;

	for (;;) {
		r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -1;
		if (rl_now_ns() >= deadline) {
			sig = sig == 0 ? SIGTERM : SIGKILL;
			rl_err("the server process %d did not exit; sending %s", (int)pid,
			       sig == SIGTERM ? "SIGTERM" : "SIGKILL");
			kill(pid, sig);
			deadline = rl_now_ns() + 2 * UINT64_C(1000000000);
		}
		usleep(10000);
	}
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return -1;
}

/* The server buffer --loopback needs: both halves hold every connection's working set. */
static uint64_t rl_loopback_buffer(const struct rl_opts *o)
{
	uint64_t ws = o->ws ? o->ws : (uint64_t)o->batch * o->depth * o->block;
	uint64_t need = 2 * (uint64_t)o->conns * (ws / o->block * o->block) + 2 * 4096;

	if (o->buffer_size)
		return o->buffer_size;
	return (RL_MAX(need, RL_MIN_BUFFER) + RL_MIB - 1) & ~(RL_MIB - 1);
}

static int rl_loopback(const struct rl_opts *o)
{
	int port_pipe[2], life[2], rc, child;
	char line[64], port[16];
	uint64_t deadline = rl_now_ns() + RL_STARTUP_TIMEOUT_NS;
	size_t have = 0;
	pid_t pid;

	if (pipe2(port_pipe, O_CLOEXEC) != 0)
		return RL_EXIT_FAIL;
	if (pipe2(life, O_CLOEXEC) != 0) {
		close(port_pipe[0]);
		close(port_pipe[1]);
		return RL_EXIT_FAIL;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		rl_err("fork: %s", strerror(errno));
		return RL_EXIT_FAIL;
	}
	if (pid == 0) {
		FILE *report;

		/* The server goes when its parent goes, whatever way. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		close(port_pipe[0]);
		close(life[1]);
		report = fdopen(port_pipe[1], "w");
		if (!report)
			_exit(RL_EXIT_FAIL);
		rc = rl_server("127.0.0.1", "0", rl_loopback_buffer(o), report, life[0]);
		fclose(report);
		_exit(rc);
	}
	close(port_pipe[1]);
	close(life[0]);
	port[0] = '\0';
	while (have < sizeof(line) - 1 && !rl_signalled && rl_now_ns() < deadline) {
		struct pollfd pfd = { .fd = port_pipe[0], .events = POLLIN };
		ssize_t g;
		char *nl;

		if (poll(&pfd, 1, 250) <= 0)
			continue;
		g = read(port_pipe[0], line + have, sizeof(line) - 1 - have);
		if (g <= 0 && !(g < 0 && errno == EINTR))
			break;
		if (g > 0)
			have += (size_t)g;
		line[have] = '\0';
		nl = strchr(line, '\n');
		if (nl) {
			*nl = '\0';
			if (sscanf(line, "port: %15[0-9]", port) != 1)
				port[0] = '\0';
			break;
		}
	}
	close(port_pipe[0]);
	if (!port[0]) {
		rl_err("the server process did not report its port%s",
		       rl_signalled ? " (interrupted)" : "");
		rc = RL_EXIT_FAIL;
	} else {
		rc = rl_client(o, "loopback", "127.0.0.1", port);
	}
	close(life[1]); /* EOF: the server finishes */
	child = rl_reap(pid);
	if (child != 0) {
		rl_err("the server process exited with status %d", child);
		if (rc == RL_EXIT_OK)
			rc = RL_EXIT_FAIL;
	}
	return rc;
}

/* --- command line -------------------------------------------------------------------------- */

static void rl_help(void)
{
	printf("Usage:\n"
	       "  tcp-raw-loop --server [ADDR:]PORT [--buffer-size 1G]\n"
	       "      fill a buffer with te-bench's pattern, print 'port: N', serve until\n"
	       "      SIGINT/SIGTERM or EOF on stdin when stdin is a pipe (ADDR: 127.0.0.1)\n"
	       "  tcp-raw-loop --client HOST:PORT [options]\n"
	       "  tcp-raw-loop --loopback [options]\n"
	       "      fork a server on 127.0.0.1:0 (port reported over a pipe), run as its client\n"
	       "\n"
	       "Options (client, loopback):\n"
	       "  -o, --op read|write        [read]\n"
	       "  -b, --block-size SIZE      bytes per request, K/M/G powers of 2 [64K]\n"
	       "  -B, --batch N              requests per batch [128]\n"
	       "  -D, --depth N              batches in flight per connection; requests in flight\n"
	       "                             = batch x depth (te-bench's --depth) [1]\n"
	       "  -t, --connections N        connections, one thread each (--threads) [1]\n"
	       "      --working-set SIZE     bytes per connection and side; request n uses area\n"
	       "                             n mod (SIZE / block) [batch x depth x block]\n"
	       "  -d, --duration SECONDS     per run [5]\n"
	       "  -n, --iterations N         batches per connection instead of a duration\n"
	       "  -w, --warmup N             untimed batches per connection first; the timed\n"
	       "                             loops then start together (te-bench's) [8]\n"
	       "      --pingpong             one 4K READ at a time: batch 1, depth 1\n"
	       "  -v, --verify               check every byte (te-bench's pattern; depth 1)\n"
	       "      --buffer-size SIZE     server buffer [server: 1G; loopback: what the run\n"
	       "                             needs]\n"
	       "      --timeout SECONDS      a connection with no progress this long fails [120]\n"
	       "      --congestion NAME      TCP congestion control of every connection, as te's\n"
	       "                             tcp option 'congestion' [the host's]\n"
	       "  -j, --json                 one JSON object (te-bench's keys) instead of a row\n"
	       "  -q, --quiet                no progress line\n"
	       "\n"
	       "A row: timed batches (samples), GB/s (10^9 bytes/s), requests/s, batch latency\n"
	       "avg/p50/p99/p99.9 in us.\n"
	       "Exit status: 0 ok, 1 a transfer or verification failed, 2 usage, 130 interrupted.\n");
}

static int rl_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int rl_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "tcp-raw-loop: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\ntcp-raw-loop: try --help\n");
	return RL_EXIT_USAGE;
}

/* HOST:PORT, [V6]:PORT, or PORT alone (@host keeps its default). */
static bool rl_split_hostport(const char *s, char *host, size_t hlen, char *port, size_t plen)
{
	const char *colon = strrchr(s, ':'), *p = colon ? colon + 1 : s;
	size_t n;

	if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) >= plen || atoi(p) > 65535)
		return false;
	snprintf(port, plen, "%s", p);
	if (!colon)
		return true;
	n = (size_t)(colon - s);
	if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
		s++;
		n -= 2;
	}
	if (n == 0 || n >= hlen)
		return false;
	memcpy(host, s, n);
	host[n] = '\0';
	return true;
}

static bool rl_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		return false;
	*out = (uint32_t)v;
	return true;
}

static int rl_parse_args(int argc, char **argv, struct rl_opts *o)
{
	enum {
		OPT_SERVER = 256,
		OPT_CLIENT,
		OPT_LOOPBACK,
		OPT_PINGPONG,
		OPT_BUFFER,
		OPT_TIMEOUT,
		OPT_WS,
		OPT_CC,
	};
	static const struct option longopts[] = {
		{ "server", required_argument, NULL, OPT_SERVER },
		{ "client", required_argument, NULL, OPT_CLIENT },
		{ "loopback", no_argument, NULL, OPT_LOOPBACK },
		{ "op", required_argument, NULL, 'o' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "batch", required_argument, NULL, 'B' },
		{ "depth", required_argument, NULL, 'D' },
		{ "connections", required_argument, NULL, 't' },
		{ "threads", required_argument, NULL, 't' },
		{ "working-set", required_argument, NULL, OPT_WS },
		{ "warmup", required_argument, NULL, 'w' },
		{ "duration", required_argument, NULL, 'd' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "pingpong", no_argument, NULL, OPT_PINGPONG },
		{ "verify", no_argument, NULL, 'v' },
		{ "buffer-size", required_argument, NULL, OPT_BUFFER },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "congestion", required_argument, NULL, OPT_CC },
		{ "json", no_argument, NULL, 'j' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool block_set = false, batch_set = false, depth_set = false, duration_set = false;
	int modes = 0, ch;
	char *end;

	memset(o, 0, sizeof(*o));
	o->op = RL_OP_READ;
	o->block = RL_DEF_BLOCK;
	o->batch = RL_DEF_BATCH;
	o->depth = 1;
	o->conns = 1;
	o->duration_s = RL_DEF_DURATION;
	o->iterations = -1;
	o->warmup = RL_DEF_WARMUP;
	o->timeout_s = RL_DEF_TIMEOUT;
	snprintf(o->host, sizeof(o->host), "127.0.0.1");
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "o:b:B:D:t:w:d:n:vjqh", longopts, NULL)) != -1) {
		switch (ch) {
		case OPT_SERVER:
		case OPT_CLIENT:
			modes++;
			o->mode = ch == OPT_SERVER ? RL_MODE_SERVER : RL_MODE_CLIENT;
			if (!rl_split_hostport(optarg, o->host, sizeof(o->host), o->port,
					       sizeof(o->port)))
				return rl_usage("%s: '%s' is not [HOST:]PORT",
						ch == OPT_SERVER ? "--server" : "--client", optarg);
			break;
		case OPT_LOOPBACK:
			modes++;
			o->mode = RL_MODE_LOOPBACK;
			break;
		case 'o':
			if (strcmp(optarg, "read") == 0)
				o->op = RL_OP_READ;
			else if (strcmp(optarg, "write") == 0)
				o->op = RL_OP_WRITE;
			else
				return rl_usage("--op: '%s' is not one of read, write", optarg);
			break;
		case 'b':
			if (!rl_parse_size(optarg, &o->block) || o->block == 0 ||
			    o->block > RL_MAX_BLOCK)
				return rl_usage("--block-size: invalid size '%s' (1 to 1G bytes)",
						optarg);
			block_set = true;
			break;
		case 'B':
			if (!rl_parse_u32(optarg, 1, RL_MAX_BATCH, &o->batch))
				return rl_usage("--batch: '%s' is not in [1, %u]", optarg,
						RL_MAX_BATCH);
			batch_set = true;
			break;
		case 'D':
			if (!rl_parse_u32(optarg, 1, RL_MAX_DEPTH, &o->depth))
				return rl_usage("--depth: '%s' is not in [1, %u]", optarg,
						RL_MAX_DEPTH);
			depth_set = true;
			break;
		case 't':
			if (!rl_parse_u32(optarg, 1, RL_MAX_CONNS, &o->conns))
				return rl_usage("--connections: '%s' is not in [1, %u]", optarg,
						RL_MAX_CONNS);
			break;
		case 'w':
			if (!rl_parse_u32(optarg, 0, RL_MAX_WARMUP, &o->warmup))
				return rl_usage("--warmup: '%s' is not in [0, %u]", optarg,
						RL_MAX_WARMUP);
			break;
		case OPT_WS:
			if (!rl_parse_size(optarg, &o->ws) || o->ws == 0 || o->ws > RL_MAX_WS)
				return rl_usage("--working-set: invalid size '%s' (1 to 64G bytes)",
						optarg);
			break;
		case 'd':
			o->duration_s = strtod(optarg, &end);
			if (end == optarg || *end || !(o->duration_s > 0.0) ||
			    o->duration_s > RL_MAX_DURATION)
				return rl_usage("--duration: invalid value '%s' (seconds in (0, "
						"%.0f])",
						optarg, RL_MAX_DURATION);
			duration_set = true;
			break;
		case 'n':
			errno = 0;
			o->iterations = strtoll(optarg, &end, 10);
			if (errno || end == optarg || *end || o->iterations < 1 ||
			    o->iterations > RL_MAX_ITERATIONS)
				return rl_usage("--iterations: '%s' is not in [1, 2^48]", optarg);
			break;
		case OPT_PINGPONG:
			o->pingpong = true;
			break;
		case 'v':
			o->verify = true;
			break;
		case OPT_BUFFER:
			if (!rl_parse_size(optarg, &o->buffer_size) ||
			    o->buffer_size < RL_MIN_BUFFER || o->buffer_size > RL_MAX_BUFFER)
				return rl_usage("--buffer-size: invalid size '%s' (8K to 1T bytes)",
						optarg);
			break;
		case OPT_CC: {
			int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			int err = 0;

			if (strlen(optarg) >= sizeof(rl_congestion))
				return rl_usage("--congestion: '%s' is too long", optarg);
			if (fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, optarg,
						  (socklen_t)strlen(optarg)) != 0)
				err = errno;
			if (fd >= 0)
				close(fd);
			if (err)
				return rl_usage("--congestion: '%s' cannot be used here: %s "
						"(net.ipv4.tcp_available_congestion_control)",
						optarg, strerror(err));
			snprintf(rl_congestion, sizeof(rl_congestion), "%s", optarg);
			break;
		}
		case OPT_TIMEOUT:
			o->timeout_s = strtod(optarg, &end);
			if (end == optarg || *end || !(o->timeout_s >= 0.001) ||
			    o->timeout_s > RL_MAX_DURATION)
				return rl_usage("--timeout: invalid value '%s'", optarg);
			break;
		case 'j':
			o->json = true;
			break;
		case 'q':
			o->quiet = true;
			break;
		case 'h':
			rl_help();
			exit(RL_EXIT_OK);
		default:
			return rl_usage("unknown or incomplete option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return rl_usage("unexpected argument '%s'", argv[optind]);
	if (modes != 1)
		return rl_usage("choose one of --server [ADDR:]PORT, --client HOST:PORT, "
				"--loopback");
	if (o->mode == RL_MODE_SERVER)
		return RL_EXIT_OK;
	if (o->pingpong) {
		if ((batch_set && o->batch != 1) || (depth_set && o->depth != 1))
			return rl_usage("--pingpong is batch 1, depth 1");
		o->batch = 1;
		o->depth = 1;
		if (!block_set)
			o->block = RL_PINGPONG_BLOCK;
	}
	if (o->iterations >= 0 && !duration_set)
		o->duration_s = 0.0; /* --iterations alone: no time limit */
	if ((uint64_t)o->batch * o->depth > UINT64_MAX / o->block ||
	    (!o->ws && (uint64_t)o->batch * o->depth * o->block > RL_MAX_WS))
		return rl_usage("batch x depth x block exceeds the 64G working-set limit");
	if (o->ws && o->ws < o->block)
		return rl_usage("--working-set is smaller than one block");
	if (o->verify && o->depth > 1)
		return rl_usage("--verify checks one batch area per connection: depth 1 only");
	if (o->verify && o->ws && o->ws / o->block != o->batch)
		return rl_usage("--verify uses the default working set (batch x block)");
	if (o->buffer_size && o->mode == RL_MODE_CLIENT)
		return rl_usage("--buffer-size sizes the server (--server, --loopback)");
	return RL_EXIT_OK;
}

int main(int argc, char **argv)
{
	struct rl_opts o;
	struct stat sb;
	int rc = rl_parse_args(argc, argv, &o);

	if (rc != RL_EXIT_OK)
		return rc;
	rl_signals_install();
	switch (o.mode) {
	case RL_MODE_SERVER:
		/* EOF on stdin ends the server when stdin is a parent's pipe (as te-bench). */
		rc = rl_server(o.host, o.port, o.buffer_size ? o.buffer_size : RL_DEF_SERVER_BUFFER,
			       stdout,
			       fstat(STDIN_FILENO, &sb) == 0 &&
					       (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode))
				       ? STDIN_FILENO
				       : -1);
		break;
	case RL_MODE_CLIENT:
		rc = rl_client(&o, "client", o.host, o.port);
		break;
	case RL_MODE_LOOPBACK:
		rc = rl_loopback(&o);
		break;
	default:
		rc = RL_EXIT_USAGE;
	}
	if (rc == RL_EXIT_OK && rl_signalled)
		rc = RL_EXIT_SIGNAL;
	return rc;
}
