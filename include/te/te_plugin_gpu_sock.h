/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_plugin_gpu_sock.h: header-only fd passing between plugin instances of one host: a table of
 * exported file descriptors served over an authenticated abstract unix socket (SCM_RIGHTS).
 *
 * Part of the GPU plugin toolkit (te_plugin_gpu.h). GPU memory that a process shares as a file
 * descriptor (CUDA VMM allocations with POSIX fd handles, dmabufs) cannot travel in a segment
 * descriptor: the exporter keeps each descriptor under a random export id, publishes the id in
 * the region's key, and peers of this host fetch it from the exporter's socket.
 *
 * Each instance listens on the abstract unix socket "te-<plugin>.<pid>.<nonce>" (SOCK_SEQPACKET:
 * one message a datagram, no file, gone with the process), which peers derive from its blob.
 * One thread serves connections one at a time, each bounded by TE_PLUGIN_GPU_SOCK_TIMEOUT_MS:
 *
 *   server -> client  HELLO  magic "TGH1", version, flags (bit 0: authentication), instance
 *                            nonce, 32-byte challenge
 *   client -> server  REQ    magic "TGQ1", version, export id, the instance nonce it expects,
 *                            32-byte challenge, MAC
 *   server -> client  RESP   magic "TGR1", status, size, MAC, detail; on success the
 *                            descriptor rides along as SCM_RIGHTS
 *
 * With the engine's secret (host->auth_mac answers TE_OK, which binds the MAC to the plugin's
 * name) the client's MAC covers "gpu-fd-v1 client", the server's instance nonce, both
 * challenges and the export id; the server checks it before looking anything up, answers every
 * failed proof with the same TE_ERR_AUTH and no descriptor, and proves itself with a MAC over
 * "gpu-fd-v1 server", the same fields, its status and the size. A client with a secret refuses
 * a server that asks for none and one without refuses a server that asks. Without a secret
 * the server serves clients of its own uid (or root) only (SO_PEERCRED).
 *
 * Thread-safety: export_add/remove/dup and fetch from any thread; start/stop/fini serialized.
 */
#ifndef TE_PLUGIN_GPU_SOCK_H
#define TE_PLUGIN_GPU_SOCK_H

#include <te/te_plugin_gpu_util.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TE_PLUGIN_GPU_SOCK_VERSION 1u
#define TE_PLUGIN_GPU_SOCK_TIMEOUT_MS 2000u
#define TE_PLUGIN_GPU_SOCK_HELLO 0x31484754u /* "TGH1" */
#define TE_PLUGIN_GPU_SOCK_REQ 0x31514754u   /* "TGQ1" */
#define TE_PLUGIN_GPU_SOCK_RESP 0x31524754u  /* "TGR1" */
#define TE_PLUGIN_GPU_SOCK_TEXT 128u

/* One descriptor served to peers. */
struct te_plugin_gpu_export {
	struct te_plugin_gpu_export *next;
	uint64_t id;
	int fd;
	uint64_t size; /* what the descriptor holds (bytes of the allocation) */
};

/* The fd socket of one plugin instance and its exports. */
struct te_plugin_gpu_sock {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	const char *plugin;
	uint64_t nonce; /* the instance's */
	bool auth;	/* the engine has a secret: authenticate both ways */
	int listen_fd;
	int stop_fd; /* eventfd */
	pthread_t thread;
	bool started;
	char name[108]; /* abstract name, without the leading NUL */
	pthread_mutex_t lock;
	struct te_plugin_gpu_export *exports;
	uint64_t next_id;
};

struct te_plugin_gpu_sock_hello_ {
	uint32_t magic;
	uint32_t version;
	uint32_t flags;
	uint32_t reserved;
	uint64_t nonce;
	uint8_t challenge[32];
};

struct te_plugin_gpu_sock_req_ {
	uint32_t magic;
	uint32_t version;
	uint64_t id;
	uint64_t nonce; /* the server instance the client means */
	uint8_t challenge[32];
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
};

struct te_plugin_gpu_sock_resp_ {
	uint32_t magic;
	int32_t status;
	uint64_t size;
	uint8_t mac[TE_PLUGIN_MAC_SIZE];
	char detail[TE_PLUGIN_GPU_SOCK_TEXT];
};

/* What a MAC covers: role label, server instance, both challenges, id, status and size. */
struct te_plugin_gpu_sock_transcript_ {
	char role[24];
	uint64_t nonce;
	uint8_t server_challenge[32];
	uint8_t client_challenge[32];
	uint64_t id;
	int32_t status;
	uint32_t reserved;
	uint64_t size;
};

/* Prepare @sk (no socket yet); te_plugin_gpu_sock_fini undoes it. @plugin: static storage. */
static inline void te_plugin_gpu_sock_init(struct te_plugin_gpu_sock *sk,
					   const struct te_plugin_host *host,
					   struct te_plugin_host_ctx *ctx, const char *plugin,
					   uint64_t nonce, bool auth)
{
	memset(sk, 0, sizeof(*sk));
	sk->host = host;
	sk->ctx = ctx;
	sk->plugin = plugin;
	sk->nonce = nonce;
	sk->auth = auth;
	sk->listen_fd = sk->stop_fd = -1;
	pthread_mutex_init(&sk->lock, NULL);
}

/* The socket name of instance @nonce of @plugin in process @pid. */
static inline void te_plugin_gpu_sock_name(const char *plugin, uint32_t pid, uint64_t nonce,
					   char *buf, size_t len)
{
	te_plugin_gpu_fmt(buf, len, "te-%s.%" PRIu32 ".%016" PRIx64, plugin, pid, nonce);
}

/*
 * Keep @fd (taken over: closed by export_remove or fini) for peers under a new export id in
 * *@id_out; @size is what the fetcher learns.
 */
static inline enum te_status te_plugin_gpu_export_add(struct te_plugin_gpu_sock *sk, int fd,
						      uint64_t size, uint64_t *id_out)
{
	struct te_plugin_gpu_export *x =
		(struct te_plugin_gpu_export *)calloc(1, sizeof(struct te_plugin_gpu_export));

	if (!x)
		return TE_ERR_NOMEM;
	x->fd = fd;
	x->size = size;
	pthread_mutex_lock(&sk->lock);
	/* Not guessable from another instance's ids; unique within this one. */
	x->id = sk->nonce ^ (++sk->next_id * 0x9e3779b97f4a7c15ull);
	x->next = sk->exports;
	sk->exports = x;
	pthread_mutex_unlock(&sk->lock);
	*id_out = x->id;
	return TE_OK;
}

/* Forget export @id and close its descriptor (peers' imports keep what they mapped). */
static inline void te_plugin_gpu_export_remove(struct te_plugin_gpu_sock *sk, uint64_t id)
{
	struct te_plugin_gpu_export *x = NULL;

	pthread_mutex_lock(&sk->lock);
	for (struct te_plugin_gpu_export **px = &sk->exports; *px; px = &(*px)->next) {
		if ((*px)->id == id) {
			x = *px;
			*px = x->next;
			break;
		}
	}
	pthread_mutex_unlock(&sk->lock);
	if (x) {
		close(x->fd);
		free(x);
	}
}

/* A duplicate of export @id's descriptor (caller closes) and its size; false when unknown. */
static inline bool te_plugin_gpu_export_dup(struct te_plugin_gpu_sock *sk, uint64_t id, int *fd_out,
					    uint64_t *size_out)
{
	bool found = false;

	pthread_mutex_lock(&sk->lock);
	for (struct te_plugin_gpu_export *x = sk->exports; x; x = x->next) {
		if (x->id != id)
			continue;
		*fd_out = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
		*size_out = x->size;
		found = *fd_out >= 0;
		break;
	}
	pthread_mutex_unlock(&sk->lock);
	return found;
}

static inline socklen_t te_plugin_gpu_sock_addr_(const char *name, struct sockaddr_un *sa)
{
	size_t n = strlen(name);

	if (n > sizeof(sa->sun_path) - 1)
		n = sizeof(sa->sun_path) - 1;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* Abstract namespace: a leading NUL, no file, gone with the process. */
	memcpy(sa->sun_path + 1, name, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static inline void te_plugin_gpu_sock_timeouts_(int fd, uint32_t ms)
{
	struct timeval tv;

	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static inline void te_plugin_gpu_sock_mac_msg_(struct te_plugin_gpu_sock_transcript_ *t,
					       const char *role, uint64_t nonce, const uint8_t *sc,
					       const uint8_t *cc, uint64_t id, int32_t status,
					       uint64_t size)
{
	memset(t, 0, sizeof(*t));
	te_plugin_gpu_fmt(t->role, sizeof(t->role), "%s", role);
	t->nonce = nonce;
	memcpy(t->server_challenge, sc, 32);
	memcpy(t->client_challenge, cc, 32);
	t->id = id;
	t->status = status;
	t->size = size;
}

static inline void te_plugin_gpu_sock_random_(uint8_t *buf, size_t len)
{
	if (getrandom(buf, len, 0) != (ssize_t)len) {
		/* Not reached on Linux >= 3.17; a predictable challenge still binds the MAC. */
		memset(buf, 0x5a, len);
	}
}

/* Send @resp, with @fd as SCM_RIGHTS when >= 0. */
static inline bool
te_plugin_gpu_sock_send_resp_(int conn, const struct te_plugin_gpu_sock_resp_ *resp, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr msg;

	iov.iov_base = (void *)resp;
	iov.iov_len = sizeof(*resp);
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
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

static inline void te_plugin_gpu_sock_serve_(struct te_plugin_gpu_sock *sk, int conn)
{
	struct te_plugin_gpu_sock_hello_ hello;
	struct te_plugin_gpu_sock_req_ req;
	struct te_plugin_gpu_sock_resp_ resp;
	struct te_plugin_gpu_sock_transcript_ t;
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	uint64_t size = 0;
	int fd = -1;
	ssize_t n;

	te_plugin_gpu_sock_timeouts_(conn, TE_PLUGIN_GPU_SOCK_TIMEOUT_MS);
	memset(&hello, 0, sizeof(hello));
	hello.magic = TE_PLUGIN_GPU_SOCK_HELLO;
	hello.version = TE_PLUGIN_GPU_SOCK_VERSION;
	hello.flags = sk->auth ? 1u : 0u;
	hello.nonce = sk->nonce;
	te_plugin_gpu_sock_random_(hello.challenge, sizeof(hello.challenge));
	if (send(conn, &hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello))
		return;
	n = recv(conn, &req, sizeof(req), 0);
	if (n != (ssize_t)sizeof(req) || req.magic != TE_PLUGIN_GPU_SOCK_REQ ||
	    req.version != TE_PLUGIN_GPU_SOCK_VERSION)
		return; /* not a client of ours: nothing to say */
	memset(&resp, 0, sizeof(resp));
	resp.magic = TE_PLUGIN_GPU_SOCK_RESP;
	if (sk->auth) {
		te_plugin_gpu_sock_mac_msg_(&t, "gpu-fd-v1 client", hello.nonce, hello.challenge,
					    req.challenge, req.id, 0, 0);
		if (sk->host->auth_check(sk->ctx, &t, sizeof(t), req.mac) != TE_OK) {
			/* The same refusal whatever was asked: no oracle before authentication. */
			resp.status = TE_ERR_AUTH;
			te_plugin_gpu_fmt(resp.detail, sizeof(resp.detail),
					  "%s: authentication failed", sk->plugin);
			(void)te_plugin_gpu_sock_send_resp_(conn, &resp, -1);
			sk->host->log(sk->ctx, TE_PLUGIN_LOG_WARN,
				      "fd socket: a client failed authentication; refused");
			return;
		}
	} else if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
		   (cred.uid != getuid() && cred.uid != 0)) {
		resp.status = TE_ERR_PEER_REJECTED;
		te_plugin_gpu_fmt(resp.detail, sizeof(resp.detail),
				  "%s: the client runs as another user (and no auth secret is set)",
				  sk->plugin);
		(void)te_plugin_gpu_sock_send_resp_(conn, &resp, -1);
		return;
	}
	if (req.nonce != hello.nonce) {
		resp.status = TE_ERR_PEER_RESTARTED;
		te_plugin_gpu_fmt(resp.detail, sizeof(resp.detail),
				  "%s: instance %016" PRIx64 " is gone (this is %016" PRIx64 ")",
				  sk->plugin, req.nonce, hello.nonce);
	} else if (!te_plugin_gpu_export_dup(sk, req.id, &fd, &size)) {
		resp.status = TE_ERR_REMOTE_ACCESS;
		te_plugin_gpu_fmt(
			resp.detail, sizeof(resp.detail),
			"%s: no registered remote-accessible region with export id %016" PRIx64,
			sk->plugin, req.id);
	} else {
		resp.status = TE_OK;
		resp.size = size;
	}
	if (sk->auth) {
		te_plugin_gpu_sock_mac_msg_(&t, "gpu-fd-v1 server", hello.nonce, hello.challenge,
					    req.challenge, req.id, resp.status, resp.size);
		if (sk->host->auth_mac(sk->ctx, &t, sizeof(t), resp.mac) != TE_OK) {
			if (fd >= 0)
				close(fd);
			return;
		}
	}
	(void)te_plugin_gpu_sock_send_resp_(conn, &resp, fd);
	if (fd >= 0)
		close(fd);
}

static inline void *te_plugin_gpu_sock_main_(void *arg)
{
	struct te_plugin_gpu_sock *sk = (struct te_plugin_gpu_sock *)arg;

	for (;;) {
		struct pollfd pfd[2];
		int conn;

		pfd[0].fd = sk->listen_fd;
		pfd[0].events = POLLIN;
		pfd[0].revents = 0;
		pfd[1].fd = sk->stop_fd;
		pfd[1].events = POLLIN;
		pfd[1].revents = 0;
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
		te_plugin_gpu_sock_serve_(sk, conn);
		close(conn);
	}
	return NULL;
}

/* Stop serving (joins the thread); exports stay until fini. */
static inline void te_plugin_gpu_sock_stop(struct te_plugin_gpu_sock *sk)
{
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

/* Listen on this instance's socket and serve from a thread; TE_OK or why not (set_error). */
static inline enum te_status te_plugin_gpu_sock_start(struct te_plugin_gpu_sock *sk)
{
	struct sockaddr_un sa;
	socklen_t len;
	int err;

	te_plugin_gpu_sock_name(sk->plugin, (uint32_t)getpid(), sk->nonce, sk->name,
				sizeof(sk->name));
	len = te_plugin_gpu_sock_addr_(sk->name, &sa);
	sk->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sk->listen_fd < 0 || bind(sk->listen_fd, (struct sockaddr *)&sa, len) != 0 ||
	    listen(sk->listen_fd, 64) != 0)
		goto err;
	sk->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (sk->stop_fd < 0)
		goto err;
	err = pthread_create(&sk->thread, NULL, te_plugin_gpu_sock_main_, sk);
	if (err) {
		errno = err;
		goto err;
	}
	sk->started = true;
	return TE_OK;
err:
	te_plugin_gpu_error(sk->host, sk->ctx, sk->plugin, "%s: fd socket @%s: %s", sk->plugin,
			    sk->name, strerror(errno));
	te_plugin_gpu_sock_stop(sk);
	return TE_ERR_SYSTEM;
}

/* Stop serving and close every export. */
static inline void te_plugin_gpu_sock_fini(struct te_plugin_gpu_sock *sk)
{
	te_plugin_gpu_sock_stop(sk);
	while (sk->exports) {
		struct te_plugin_gpu_export *x = sk->exports;

		sk->exports = x->next;
		close(x->fd);
		free(x);
	}
	pthread_mutex_destroy(&sk->lock);
}

/* Receive the RESP and the descriptor riding with it (-1 when none); -2: truncated. */
static inline ssize_t te_plugin_gpu_sock_recv_resp_(int conn, struct te_plugin_gpu_sock_resp_ *resp,
						    int *fd_out)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr msg;
	ssize_t n;

	iov.iov_base = resp;
	iov.iov_len = sizeof(*resp);
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = ctl.buf;
	msg.msg_controllen = sizeof(ctl.buf);
	*fd_out = -1;
	n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
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

/*
 * Ask the instance (@pid, @nonce) of @sk's plugin on this host for its export @id: *@fd_out
 * (caller closes) and *@size_out. Blocks up to @timeout_ms. TE_ERR_PEER_UNREACHABLE,
 * TE_ERR_AUTH, TE_ERR_PROTOCOL, TE_ERR_SYSTEM or the server's status, with why in @why
 * (@len bytes).
 */
static inline enum te_status te_plugin_gpu_sock_fetch(struct te_plugin_gpu_sock *sk, uint32_t pid,
						      uint64_t nonce, uint64_t id,
						      uint32_t timeout_ms, int *fd_out,
						      uint64_t *size_out, char *why, size_t len)
{
	char name[108];
	struct sockaddr_un sa;
	struct te_plugin_gpu_sock_hello_ hello;
	struct te_plugin_gpu_sock_req_ req;
	struct te_plugin_gpu_sock_resp_ resp;
	struct te_plugin_gpu_sock_transcript_ t;
	enum te_status st = TE_ERR_PEER_UNREACHABLE;
	socklen_t alen;
	ssize_t n;
	int conn, fd = -1;

	te_plugin_gpu_sock_name(sk->plugin, pid, nonce, name, sizeof(name));
	alen = te_plugin_gpu_sock_addr_(name, &sa);
	conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (conn < 0) {
		te_plugin_gpu_fmt(why, len, "socket: %s", strerror(errno));
		return TE_ERR_SYSTEM;
	}
	te_plugin_gpu_sock_timeouts_(conn, timeout_ms);
	if (connect(conn, (struct sockaddr *)&sa, alen) != 0) {
		te_plugin_gpu_fmt(
			why, len,
			"cannot reach its fd socket @%s: %s (another network namespace, or the "
			"process is gone)",
			name, strerror(errno));
		goto out;
	}
	n = recv(conn, &hello, sizeof(hello), 0);
	if (n != (ssize_t)sizeof(hello) || hello.magic != TE_PLUGIN_GPU_SOCK_HELLO ||
	    hello.version != TE_PLUGIN_GPU_SOCK_VERSION) {
		te_plugin_gpu_fmt(why, len, "fd socket @%s: %s", name,
				  n < 0 ? strerror(errno) : "malformed greeting");
		st = n < 0 ? TE_ERR_PEER_UNREACHABLE : TE_ERR_PROTOCOL;
		goto out;
	}
	if (sk->auth && !(hello.flags & 1u)) {
		te_plugin_gpu_fmt(
			why, len,
			"fd socket @%s does not authenticate, and this engine has a secret", name);
		st = TE_ERR_AUTH;
		goto out;
	}
	memset(&req, 0, sizeof(req));
	req.magic = TE_PLUGIN_GPU_SOCK_REQ;
	req.version = TE_PLUGIN_GPU_SOCK_VERSION;
	req.id = id;
	req.nonce = nonce;
	te_plugin_gpu_sock_random_(req.challenge, sizeof(req.challenge));
	if (hello.flags & 1u) {
		te_plugin_gpu_sock_mac_msg_(&t, "gpu-fd-v1 client", hello.nonce, hello.challenge,
					    req.challenge, id, 0, 0);
		if (!sk->auth || sk->host->auth_mac(sk->ctx, &t, sizeof(t), req.mac) != TE_OK) {
			te_plugin_gpu_fmt(
				why, len,
				"fd socket @%s asks for authentication and this engine has no "
				"secret",
				name);
			st = TE_ERR_AUTH;
			goto out;
		}
	}
	if (send(conn, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req)) {
		te_plugin_gpu_fmt(why, len, "fd socket @%s: send: %s", name, strerror(errno));
		goto out;
	}
	n = te_plugin_gpu_sock_recv_resp_(conn, &resp, &fd);
	if (n != (ssize_t)sizeof(resp) || resp.magic != TE_PLUGIN_GPU_SOCK_RESP) {
		te_plugin_gpu_fmt(why, len, "fd socket @%s: %s", name,
				  n == -1 ? strerror(errno) : "malformed answer");
		st = n == -1 ? TE_ERR_PEER_UNREACHABLE : TE_ERR_PROTOCOL;
		goto out;
	}
	resp.detail[sizeof(resp.detail) - 1] = '\0';
	if (hello.flags & 1u) {
		te_plugin_gpu_sock_mac_msg_(&t, "gpu-fd-v1 server", hello.nonce, hello.challenge,
					    req.challenge, id, resp.status, resp.size);
		if (sk->host->auth_check(sk->ctx, &t, sizeof(t), resp.mac) != TE_OK) {
			te_plugin_gpu_fmt(why, len,
					  "fd socket @%s failed to prove the shared secret", name);
			st = TE_ERR_AUTH;
			goto out;
		}
	}
	if (resp.status != TE_OK) {
		te_plugin_gpu_fmt(why, len, "%s", resp.detail);
		st = resp.status < 0 ? (enum te_status)resp.status : TE_ERR_PROTOCOL;
		goto out;
	}
	if (fd < 0 || resp.size == 0) {
		te_plugin_gpu_fmt(why, len, "fd socket @%s answered without a descriptor", name);
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

#ifdef __cplusplus
}
#endif

#endif /* TE_PLUGIN_GPU_SOCK_H */
