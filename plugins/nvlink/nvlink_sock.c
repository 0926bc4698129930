/* SPDX-License-Identifier: Apache-2.0 */
/* nvlink_sock.c: hand VMM allocations' file descriptors to peers of this host (SCM_RIGHTS). */

/*
 * Each instance listens on an abstract unix socket, "te-nvlink.<pid>.<nonce>" (SOCK_SEQPACKET,
 * so every message is one datagram), which its peers derive from its published blob. One
 * thread serves connections one at a time, each bounded by NVLINK_SOCK_TIMEOUT_MS:
 *
 *   server -> client  HELLO  magic "NVS1", version, flags (bit 0: authentication), instance
 *                            nonce, 32-byte challenge
 *   client -> server  REQ    magic "NVQ1", version, export id, the instance nonce it expects,
 *                            32-byte challenge, MAC
 *   server -> client  RESP   magic "NVR1", status, allocation size, MAC, detail; on success the
 *                            descriptor rides along as SCM_RIGHTS
 *
 * With the engine's secret (host->auth_mac answers TE_OK) the client's MAC is HMAC over
 * "nvlink-v1 client" and the instance nonce, both challenges and the export id; the server
 * answers with one over "nvlink-v1 server", the same fields, the status and the size. A request
 * without a valid MAC gets TE_ERR_AUTH and no descriptor. A client with a secret refuses a
 * server that asks for none. Without a secret, the peer's uid must be this process's (or 0).
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "nvlink.h"

#define NVLINK_SOCK_VERSION 1u
#define NVLINK_SOCK_TIMEOUT_MS 2000u
#define NVLINK_HELLO_MAGIC 0x3153564eu /* "NVS1" */
#define NVLINK_REQ_MAGIC 0x3151564eu   /* "NVQ1" */
#define NVLINK_RESP_MAGIC 0x3152564eu  /* "NVR1" */
#define NVLINK_SOCK_DETAIL 128u

struct nvlink_hello {
	uint32_t magic;
	uint32_t version;
	uint32_t flags;
	uint32_t reserved;
	uint64_t nonce;
	uint8_t challenge[32];
};

struct nvlink_req {
	uint32_t magic;
	uint32_t version;
	uint64_t id;
	uint64_t nonce; /* the server instance the client means */
	uint8_t challenge[32];
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
};

struct nvlink_resp {
	uint32_t magic;
	int32_t status;
	uint64_t size;
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
	char detail[NVLINK_SOCK_DETAIL];
};

/* What a MAC covers: role label, server instance, both challenges, id, status and size. */
struct nvlink_transcript {
	char role[16];
	uint64_t nonce;
	uint8_t server_challenge[32];
	uint8_t client_challenge[32];
	uint64_t id;
	int32_t status;
	uint32_t reserved;
	uint64_t size;
};

void nvlink_sock_name(uint32_t pid, uint64_t nonce, char *buf, size_t len)
{
	snprintf(buf, len, "te-nvlink.%" PRIu32 ".%016" PRIx64, pid, nonce);
}

static socklen_t nvlink_sock_addr(const char *name, struct sockaddr_un *sa)
{
	size_t n = strlen(name);

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* Abstract namespace: a leading NUL, no file, gone with the process. */
	memcpy(sa->sun_path + 1, name, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void nvlink_sock_timeouts(int fd, uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static void nvlink_transcript(struct nvlink_transcript *t, const char *role, uint64_t nonce,
			      const uint8_t *sc, const uint8_t *cc, uint64_t id, int32_t status,
			      uint64_t size)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->role, sizeof(t->role), "%s", role);
	t->nonce = nonce;
	memcpy(t->server_challenge, sc, 32);
	memcpy(t->client_challenge, cc, 32);
	t->id = id;
	t->status = status;
	t->size = size;
}

static void nvlink_random(void *buf, size_t len)
{
	if (getrandom(buf, len, 0) != (ssize_t)len) {
		/* Not reached on Linux >= 3.17; a predictable challenge still binds the MAC. */
		memset(buf, 0x5a, len);
	}
}

/* Send @resp, with @fd as SCM_RIGHTS when >= 0. */
static bool nvlink_send_resp(int conn, const struct nvlink_resp *resp, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)resp, .iov_len = sizeof(*resp) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = sizeof(ctl.buf);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(conn, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof(*resp);
}

static void nvlink_serve_one(struct nvlink_inst *ni, int conn)
{
	const struct te_plugin_host *host = nvlink_host(ni);
	struct te_plugin_host_ctx *ctx = nvlink_ctx(ni);
	struct nvlink_hello hello;
	struct nvlink_req req;
	struct nvlink_resp resp;
	struct nvlink_transcript t;
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	bool auth = nvlink_auth(ni);
	uint64_t size = 0;
	int fd = -1;
	ssize_t n;

	nvlink_sock_timeouts(conn, NVLINK_SOCK_TIMEOUT_MS);
	memset(&hello, 0, sizeof(hello));
	hello.magic = NVLINK_HELLO_MAGIC;
	hello.version = NVLINK_SOCK_VERSION;
	hello.flags = auth ? 1u : 0u;
	hello.nonce = nvlink_nonce(ni);
	nvlink_random(hello.challenge, sizeof(hello.challenge));
	if (send(conn, &hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello))
		return;
	n = recv(conn, &req, sizeof(req), 0);
	if (n != (ssize_t)sizeof(req) || req.magic != NVLINK_REQ_MAGIC ||
	    req.version != NVLINK_SOCK_VERSION)
		return; /* not a client of ours: nothing to say */
	memset(&resp, 0, sizeof(resp));
	resp.magic = NVLINK_RESP_MAGIC;
	if (auth) {
		nvlink_transcript(&t, "nvlink-v1 client", hello.nonce, hello.challenge,
				  req.challenge, req.id, 0, 0);
		if (host->auth_check(ctx, &t, sizeof(t), req.mac) != TE_OK) {
			/* The same refusal whatever was asked: no oracle before authentication. */
			resp.status = TE_ERR_AUTH;
			snprintf(resp.detail, sizeof(resp.detail), "nvlink: authentication failed");
			(void)nvlink_send_resp(conn, &resp, -1);
			host->log(ctx, TE_PLUGIN_LOG_WARN,
				  "fd socket: a client failed authentication; refused");
			return;
		}
	} else if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
		   (cred.uid != getuid() && cred.uid != 0)) {
		resp.status = TE_ERR_PEER_REJECTED;
		snprintf(resp.detail, sizeof(resp.detail),
			 "nvlink: the client runs as another user (and no auth secret is set)");
		(void)nvlink_send_resp(conn, &resp, -1);
		return;
	}
	if (req.nonce != hello.nonce) {
		resp.status = TE_ERR_PEER_RESTARTED;
		snprintf(resp.detail, sizeof(resp.detail),
			 "nvlink: instance %016" PRIx64 " is gone (this is %016" PRIx64 ")",
			 req.nonce, hello.nonce);
	} else if (!nvlink_export_dup(ni, req.id, &fd, &size)) {
		resp.status = TE_ERR_REMOTE_ACCESS;
		snprintf(
			resp.detail, sizeof(resp.detail),
			"nvlink: no registered remote-accessible region with export id %016" PRIx64,
			req.id);
	} else {
		resp.status = TE_OK;
		resp.size = size;
	}
	if (auth) {
		nvlink_transcript(&t, "nvlink-v1 server", hello.nonce, hello.challenge,
				  req.challenge, req.id, resp.status, resp.size);
		if (host->auth_mac(ctx, &t, sizeof(t), resp.mac) != TE_OK) {
			if (fd >= 0)
				close(fd);
			return;
		}
	}
	(void)nvlink_send_resp(conn, &resp, fd);
	if (fd >= 0)
		close(fd);
}

static void *nvlink_sock_main(void *arg)
{
	struct nvlink_inst *ni = arg;
	struct nvlink_sock *sk = nvlink_sock_of(ni);

	for (;;) {
		struct pollfd pfd[2] = { { .fd = sk->listen_fd, .events = POLLIN },
					 { .fd = sk->stop_fd, .events = POLLIN } };
		int conn;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[1].revents)
			break;
		if (!(pfd[0].revents & POLLIN))
			continue;
		conn = accept4(sk->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (conn < 0)
			continue;
		nvlink_serve_one(ni, conn);
		close(conn);
	}
	return NULL;
}

enum te_status nvlink_sock_start(struct nvlink_inst *ni)
{
	const struct te_plugin_host *host = nvlink_host(ni);
	struct nvlink_sock *sk = nvlink_sock_of(ni);
	struct sockaddr_un sa;
	socklen_t len;
	int err;

	sk->listen_fd = -1;
	sk->stop_fd = -1;
	nvlink_sock_name((uint32_t)getpid(), nvlink_nonce(ni), sk->name, sizeof(sk->name));
	len = nvlink_sock_addr(sk->name, &sa);
	sk->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sk->listen_fd < 0 || bind(sk->listen_fd, (struct sockaddr *)&sa, len) != 0 ||
	    listen(sk->listen_fd, 64) != 0)
		goto err;
	sk->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (sk->stop_fd < 0)
		goto err;
	err = pthread_create(&sk->thread, NULL, nvlink_sock_main, ni);
	if (err) {
		errno = err;
		goto err;
	}
	sk->started = true;
	return TE_OK;
err:
	host->set_error(nvlink_ctx(ni), NVLINK_NAME ": fd socket @%s: %s", sk->name,
			strerror(errno));
	nvlink_sock_stop(ni);
	return TE_ERR_SYSTEM;
}

void nvlink_sock_stop(struct nvlink_inst *ni)
{
	struct nvlink_sock *sk = nvlink_sock_of(ni);
	uint64_t one = 1;

	if (sk->started) {
		if (write(sk->stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
			(void)0; /* an eventfd write of 1 cannot fail short of overflow */
		pthread_join(sk->thread, NULL);
		sk->started = false;
	}
	if (sk->listen_fd >= 0)
		close(sk->listen_fd);
	if (sk->stop_fd >= 0)
		close(sk->stop_fd);
	sk->listen_fd = sk->stop_fd = -1;
}

/* Receive the RESP and the descriptor riding with it (-1 when none). */
static ssize_t nvlink_recv_resp(int conn, struct nvlink_resp *resp, int *fd_out)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = resp, .iov_len = sizeof(*resp) };
	struct msghdr msg = { .msg_iov = &iov,
			      .msg_iovlen = 1,
			      .msg_control = ctl.buf,
			      .msg_controllen = sizeof(ctl.buf) };
	ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);

	*fd_out = -1;
	if (n < 0)
		return n;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len >= CMSG_LEN(sizeof(int))) {
			int fd;

			memcpy(&fd, CMSG_DATA(c), sizeof(fd));
			if (*fd_out >= 0)
				close(fd); /* only one was asked for */
			else
				*fd_out = fd;
		}
	}
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (*fd_out >= 0)
			close(*fd_out);
		*fd_out = -1;
		return -2;
	}
	return n;
}

enum te_status nvlink_sock_fetch(struct nvlink_inst *ni, uint32_t pid, uint64_t nonce, uint64_t id,
				 uint32_t timeout_ms, int *fd_out, uint64_t *size_out, char *why)
{
	const struct te_plugin_host *host = nvlink_host(ni);
	struct te_plugin_host_ctx *ctx = nvlink_ctx(ni);
	char name[108];
	struct sockaddr_un sa;
	struct nvlink_hello hello;
	struct nvlink_req req;
	struct nvlink_resp resp;
	struct nvlink_transcript t;
	bool auth = nvlink_auth(ni);
	enum te_status st = TE_ERR_PEER_UNREACHABLE;
	socklen_t len;
	ssize_t n;
	int conn, fd = -1;

	nvlink_sock_name(pid, nonce, name, sizeof(name));
	len = nvlink_sock_addr(name, &sa);
	conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (conn < 0) {
		snprintf(why, NVLINK_DETAIL, "socket: %s", strerror(errno));
		return TE_ERR_SYSTEM;
	}
	nvlink_sock_timeouts(conn, timeout_ms);
	if (connect(conn, (struct sockaddr *)&sa, len) != 0) {
		snprintf(why, NVLINK_DETAIL,
			 "cannot reach its fd socket @%s: %s (another network namespace, or the "
			 "process is gone)",
			 name, strerror(errno));
		goto out;
	}
	n = recv(conn, &hello, sizeof(hello), 0);
	if (n != (ssize_t)sizeof(hello) || hello.magic != NVLINK_HELLO_MAGIC ||
	    hello.version != NVLINK_SOCK_VERSION) {
		snprintf(why, NVLINK_DETAIL, "fd socket @%s: %s", name,
			 n < 0 ? strerror(errno) : "malformed greeting");
		st = n < 0 ? TE_ERR_PEER_UNREACHABLE : TE_ERR_PROTOCOL;
		goto out;
	}
	if (auth && !(hello.flags & 1u)) {
		snprintf(why, NVLINK_DETAIL,
			 "fd socket @%s does not authenticate, and this engine has a secret", name);
		st = TE_ERR_AUTH;
		goto out;
	}
	memset(&req, 0, sizeof(req));
	req.magic = NVLINK_REQ_MAGIC;
	req.version = NVLINK_SOCK_VERSION;
	req.id = id;
	req.nonce = nonce;
	nvlink_random(req.challenge, sizeof(req.challenge));
	if (hello.flags & 1u) {
		nvlink_transcript(&t, "nvlink-v1 client", hello.nonce, hello.challenge,
				  req.challenge, id, 0, 0);
		if (!auth || host->auth_mac(ctx, &t, sizeof(t), req.mac) != TE_OK) {
			snprintf(why, NVLINK_DETAIL,
				 "fd socket @%s asks for authentication and this engine has no "
				 "secret",
				 name);
			st = TE_ERR_AUTH;
			goto out;
		}
	}
	if (send(conn, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req)) {
		snprintf(why, NVLINK_DETAIL, "fd socket @%s: send: %s", name, strerror(errno));
		goto out;
	}
	n = nvlink_recv_resp(conn, &resp, &fd);
	if (n != (ssize_t)sizeof(resp) || resp.magic != NVLINK_RESP_MAGIC) {
		snprintf(why, NVLINK_DETAIL, "fd socket @%s: %s", name,
			 n == -1 ? strerror(errno) : "malformed answer");
		st = n == -1 ? TE_ERR_PEER_UNREACHABLE : TE_ERR_PROTOCOL;
		goto out;
	}
	resp.detail[sizeof(resp.detail) - 1] = '\0';
	if (hello.flags & 1u) {
		nvlink_transcript(&t, "nvlink-v1 server", hello.nonce, hello.challenge,
				  req.challenge, id, resp.status, resp.size);
		if (host->auth_check(ctx, &t, sizeof(t), resp.mac) != TE_OK) {
			snprintf(why, NVLINK_DETAIL,
				 "fd socket @%s failed to prove the shared secret", name);
			st = TE_ERR_AUTH;
			goto out;
		}
	}
	if (resp.status != TE_OK) {
		snprintf(why, NVLINK_DETAIL, "%s", resp.detail);
		st = resp.status < 0 ? (enum te_status)resp.status : TE_ERR_PROTOCOL;
		goto out;
	}
	if (fd < 0 || resp.size == 0) {
		snprintf(why, NVLINK_DETAIL, "fd socket @%s answered without a descriptor", name);
		st = TE_ERR_PROTOCOL;
		goto out;
	}
	*fd_out = fd;
	*size_out = resp.size;
	fd = -1;
	st = TE_OK;
out:
	if (fd >= 0)
		close(fd);
	close(conn);
	return st;
}
