/* SPDX-License-Identifier: Apache-2.0 */
/* fi_rma_loop.c: raw libfabric RMA throughput loop: the baseline of te-bench over efa. */

/*
 * fi-rma-loop forks a target process, then both open one RDM endpoint of the same provider
 * (the way the efa plugin does: same hints, same mr_mode handling, same completion flags and
 * the same progress policy) and exchange addresses and the target's key over a socketpair.
 * The initiator keeps --window operations of --block-size bytes in flight for --duration
 * seconds and prints GB/s (10^9 bytes/s); the target polls its CQ until the initiator is done.
 *
 * Buffers: the target registers 2 x max(window x block, 64 MiB) bytes filled with a pattern;
 * READs use the first half, WRITEs the second. The initiator registers window x block bytes.
 * Both touch their buffers before timing. Before timing one window of operations warms the
 * path up; after it one READ is checked against the pattern (the loop really moved data).
 *
 * Progress (--progress): "adaptive" (default) mirrors the plugin: sleep on the CQ wait fd
 * when the provider has one, otherwise spin while operations are in flight; the target
 * polls every --poll-us without a wait fd. "busy" spins on both sides.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <te/te_plugin_opts.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define LOOP_MAX_ADDR 256
#define LOOP_MAX_WINDOW 16384
#define LOOP_MIN_AREA (64ull << 20)
#define LOOP_SPIN_NS (20ull * 1000) /* as the plugin's default spin_us */

struct loop_opts {
	const char *provider;
	const char *node; /* NULL: the provider chooses */
	bool read;
	uint64_t block;
	uint32_t window;
	double duration;
	bool busy;
	uint64_t poll_ns;
	uint64_t write_flags;
	bool json;
};

struct loop_ep {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fid_mr *mr;
	int wait_fd;
	uint8_t *buf;
	size_t len;
	void *desc;
	uint64_t key;
};

/* What the target tells the initiator. */
struct loop_target {
	uint32_t addrlen;
	uint8_t addr[LOOP_MAX_ADDR];
	uint64_t key;
	uint64_t base; /* address of the buffer */
	uint64_t len;
	uint32_t offset; /* 1: the provider addresses by offset (no FI_MR_VIRT_ADDR) */
};

static const char *role = "fi-rma-loop";

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", role);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

#define FI_CHECK(call)                                                                             \
	do {                                                                                       \
		int ret_ = (int)(call);                                                            \
		if (ret_)                                                                          \
			die("%s: %s", #call, fi_strerror(-ret_));                                  \
	} while (0)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 131u + 7u);
}

static bool prov_is_ip(const char *prov)
{
	static const char *const ip[] = { "tcp", "net", "sockets", "udp", "verbs", NULL };
	size_t len = strcspn(prov, ";");

	for (unsigned i = 0; ip[i]; i++)
		if (strlen(ip[i]) == len && strncmp(prov, ip[i], len) == 0)
			return true;
	return false;
}

/*
 * The efa plugin's write_completion "auto": transmit completion on shm when CMA works (the
 * initiator copies with process_vm_writev, so the bytes are in place when the WRITE
 * completes), delivery completion otherwise.
 */
static uint64_t auto_write_flags(const char *prov)
{
	const char *env = getenv("FI_SHM_DISABLE_CMA");
	char src = 1, dst = 0;
	struct iovec l = { .iov_base = &dst, .iov_len = 1 }, r = { .iov_base = &src, .iov_len = 1 };
	int scope = 0;
	FILE *f;

	if (strcmp(prov, "shm") != 0)
		return FI_DELIVERY_COMPLETE;
	if (env && *env && strcmp(env, "0") != 0 && strcasecmp(env, "no") != 0 &&
	    strcasecmp(env, "false") != 0)
		return FI_DELIVERY_COMPLETE;
	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1 || dst != 1)
		return FI_DELIVERY_COMPLETE;
	f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = 1;
		fclose(f);
	}
	return scope == 0 ? 0 : FI_DELIVERY_COMPLETE;
}

/* Bytes with an optional K/M/G/T suffix (te's plugin option syntax), or exit. */
static uint64_t parse_size(const char *s)
{
	uint64_t v;

	if (!te_plugin_parse_u64(s, true, 0, UINT64_MAX, &v))
		die("not a size: '%s'", s);
	return v;
}

/* Open an RDM endpoint as the plugin does, register @len bytes (page aligned, touched). */
static void ep_open(const struct loop_opts *o, struct loop_ep *x, size_t len, uint64_t access)
{
	struct fi_info *h = fi_allocinfo();
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	uint32_t version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
	struct iovec iov;
	struct fi_mr_attr mr_attr = { .mr_iov = &iov, .iov_count = 1, .iface = FI_HMEM_SYSTEM };
	int ret;

	if (!h)
		die("fi_allocinfo failed");
	h->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MSG |
		  FI_SEND | FI_RECV;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode =
		FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	h->domain_attr->threading = FI_THREAD_DOMAIN; /* one thread per process here */
	h->domain_attr->av_type = FI_AV_TABLE;
	h->fabric_attr->prov_name = strdup(o->provider);
	if (fi_version() < version)
		version = fi_version();
	ret = fi_getinfo(version, o->node, NULL, o->node ? FI_SOURCE : 0, h, &x->info);
	fi_freeinfo(h);
	if (ret)
		die("fi_getinfo(%s%s%s): %s", o->provider, o->node ? ", node " : "",
		    o->node ? o->node : "", fi_strerror(-ret));
	FI_CHECK(fi_fabric(x->info->fabric_attr, &x->fabric, NULL));
	FI_CHECK(fi_domain(x->fabric, x->info, &x->domain, NULL));
	cq_attr.size = o->window + 64;
	x->wait_fd = -1;
	ret = -FI_ENOSYS;
	if (!o->busy) {
		cq_attr.wait_obj = FI_WAIT_FD;
		ret = fi_cq_open(x->domain, &cq_attr, &x->cq, NULL);
		if (ret == 0 && fi_control(&x->cq->fid, FI_GETWAIT, &x->wait_fd) != 0) {
			fi_close(&x->cq->fid);
			x->wait_fd = -1;
			ret = -FI_ENOSYS;
		}
	}
	if (ret) {
		cq_attr.wait_obj = FI_WAIT_NONE;
		FI_CHECK(fi_cq_open(x->domain, &cq_attr, &x->cq, NULL));
	}
	FI_CHECK(fi_av_open(x->domain, &av_attr, &x->av, NULL));
	if (strcmp(x->info->fabric_attr->prov_name, "shm") == 0) {
		/* As the plugin does: a region name no stale /dev/shm entry can collide with. */
		char name[64];

		snprintf(name, sizeof(name), "fi-rma-loop-%d-%" PRIx64, (int)getpid(), now_ns());
		free(x->info->src_addr);
		x->info->src_addr = strdup(name);
		x->info->src_addrlen = strlen(name) + 1;
	}
	FI_CHECK(fi_endpoint(x->domain, x->info, &x->ep, NULL));
	FI_CHECK(fi_ep_bind(x->ep, &x->cq->fid, FI_TRANSMIT | FI_RECV));
	FI_CHECK(fi_ep_bind(x->ep, &x->av->fid, 0));
	FI_CHECK(fi_enable(x->ep));

	x->len = len;
	x->buf = aligned_alloc(4096, len);
	if (!x->buf)
		die("cannot allocate %zu bytes", len);
	for (size_t i = 0; i < len; i++)
		x->buf[i] = pattern(i);
	iov = (struct iovec){ .iov_base = x->buf, .iov_len = len };
	mr_attr.access = access;
	if (!(x->info->domain_attr->mr_mode & FI_MR_PROV_KEY))
		mr_attr.requested_key = 1;
	FI_CHECK(fi_mr_regattr(x->domain, &mr_attr, 0, &x->mr));
	if (x->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		FI_CHECK(fi_mr_bind(x->mr, &x->ep->fid, 0));
		FI_CHECK(fi_mr_enable(x->mr));
	}
	x->desc = fi_mr_desc(x->mr);
	x->key = fi_mr_key(x->mr);
}

static void ep_close(struct loop_ep *x)
{
	fi_close(&x->ep->fid);
	fi_close(&x->mr->fid);
	fi_close(&x->av->fid);
	fi_close(&x->cq->fid);
	fi_close(&x->domain->fid);
	fi_close(&x->fabric->fid);
	fi_freeinfo(x->info);
	free(x->buf);
}

/* Read up to @max completions; dies on an error completion. */
static ssize_t cq_poll(struct loop_ep *x, size_t max)
{
	struct fi_cq_entry ent[64];
	ssize_t n = fi_cq_read(x->cq, ent, max < 64 ? max : 64);

	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry e;
		char text[128];
		const char *prov;

		memset(&e, 0, sizeof(e));
		fi_cq_readerr(x->cq, &e, 0);
		prov = fi_cq_strerror(x->cq, e.prov_errno, e.err_data, text, sizeof(text));
		die("completion error: %s (provider: %s)", fi_strerror(e.err < 0 ? -e.err : e.err),
		    prov ? prov : "-");
	}
	if (n == -FI_EAGAIN)
		return 0;
	if (n < 0)
		die("fi_cq_read: %s", fi_strerror((int)-n));
	return n;
}

/* Block on the CQ wait fd (and @fd2 if >= 0) for at most @timeout_ms, if fi_trywait allows. */
static void cq_wait(struct loop_ep *x, int fd2, int timeout_ms)
{
	struct fid *fid = &x->cq->fid;
	struct pollfd pfd[2] = { { .fd = x->wait_fd, .events = POLLIN },
				 { .fd = fd2, .events = POLLIN } };

	if (fi_trywait(x->fabric, &fid, 1) != FI_SUCCESS)
		return;
	(void)poll(pfd, fd2 >= 0 ? 2 : 1, timeout_ms);
}

static void target_main(const struct loop_opts *o, int sock, uint64_t area)
{
	struct loop_ep x = { 0 };
	struct loop_target t = { 0 };
	size_t alen = sizeof(t.addr);
	uint64_t last_work = now_ns();

	role = "fi-rma-loop target";
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	ep_open(o, &x, 2 * area, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE);
	FI_CHECK(fi_getname(&x.ep->fid, t.addr, &alen));
	t.addrlen = (uint32_t)alen;
	t.key = x.key;
	t.base = (uint64_t)(uintptr_t)x.buf;
	t.len = x.len;
	t.offset = !(x.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR);
	if (write(sock, &t, sizeof(t)) != (ssize_t)sizeof(t))
		die("cannot send the target's address");
	/* Poll until the initiator closes its end (or writes anything). */
	for (;;) {
		struct pollfd pfd = { .fd = sock, .events = POLLIN };

		if (cq_poll(&x, 64) > 0) {
			last_work = now_ns();
			continue;
		}
		if (o->busy || now_ns() - last_work < LOOP_SPIN_NS) {
			if (poll(&pfd, 1, 0) > 0)
				break;
			continue;
		}
		if (x.wait_fd >= 0) {
			cq_wait(&x, sock, 100);
		} else {
			struct timespec ts = { 0, (long)o->poll_ns };

			nanosleep(&ts, NULL);
		}
		if (poll(&pfd, 1, 0) > 0)
			break;
	}
	ep_close(&x);
	exit(0);
}

/* Post op @seq of the timed loop (or of the warm-up); 0 or -FI_EAGAIN. */
static ssize_t post_one(const struct loop_opts *o, struct loop_ep *x, fi_addr_t fa,
			const struct loop_target *t, uint64_t seq, uint64_t area,
			struct fi_context2 *ctx)
{
	uint64_t slots = area / o->block;
	uint64_t roff = (o->read ? 0 : area) + (seq % slots) * o->block;
	uint8_t *local = x->buf + (seq % o->window) * o->block;
	uint64_t raddr = (t->offset ? 0 : t->base) + roff;
	ssize_t ret;

	if (o->read) {
		ret = fi_read(x->ep, local, o->block, x->desc, fa, raddr, t->key, ctx);
	} else {
		struct iovec iov = { .iov_base = local, .iov_len = o->block };
		struct fi_rma_iov rma = { .addr = raddr, .len = o->block, .key = t->key };
		struct fi_msg_rma msg = {
			.msg_iov = &iov,
			.desc = &x->desc,
			.iov_count = 1,
			.addr = fa,
			.rma_iov = &rma,
			.rma_iov_count = 1,
			.context = ctx,
		};

		ret = fi_writemsg(x->ep, &msg, FI_COMPLETION | o->write_flags);
	}
	if (ret && ret != -FI_EAGAIN)
		die("posting: %s", fi_strerror((int)-ret));
	return ret;
}

/* Keep the window full until @end_ns (0: just @count operations); returns ops completed. */
static uint64_t run(const struct loop_opts *o, struct loop_ep *x, fi_addr_t fa,
		    const struct loop_target *t, uint64_t area, uint64_t end_ns, uint64_t count)
{
	static struct fi_context2 ctx[LOOP_MAX_WINDOW];
	uint64_t posted = 0, done = 0, last_work = now_ns();
	uint32_t inflight = 0;

	for (;;) {
		bool more = end_ns ? now_ns() < end_ns : posted < count;
		ssize_t n;

		while (more && inflight < o->window) {
			if (post_one(o, x, fa, t, posted, area, &ctx[posted % o->window]))
				break;
			posted++;
			inflight++;
			if (!end_ns && posted == count)
				break;
		}
		if (!inflight && !more)
			break;
		n = cq_poll(x, 64);
		if (n > 0) {
			done += (uint64_t)n;
			inflight -= (uint32_t)n;
			last_work = now_ns();
			continue;
		}
		/* The plugin's adaptive policy: a wait fd after spin_us, else keep polling. */
		if (!o->busy && x->wait_fd >= 0 && now_ns() - last_work >= LOOP_SPIN_NS)
			cq_wait(x, -1, 10);
		else if (!o->busy && x->wait_fd < 0)
			sched_yield();
	}
	return done;
}

static void usage(int rc)
{
	fprintf(rc ? stderr : stdout,
		"usage: fi-rma-loop [--provider P] [--node ADDR] [--op read|write]\n"
		"                   [--block-size 64K] [--window 128] [--duration 3]\n"
		"                   [--progress adaptive|busy] [--poll-us 50]\n"
		"                   [--write-completion auto|delivery|transmit] [--json]\n");
	exit(rc);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "provider", required_argument, NULL, 'p' },
		{ "node", required_argument, NULL, 'n' },
		{ "op", required_argument, NULL, 'o' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "window", required_argument, NULL, 'w' },
		{ "duration", required_argument, NULL, 'd' },
		{ "progress", required_argument, NULL, 'P' },
		{ "poll-us", required_argument, NULL, 'u' },
		{ "write-completion", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct loop_opts o = {
		.provider = "tcp;ofi_rxm",
		.block = 64u << 10,
		.window = 128,
		.duration = 3,
		.poll_ns = 50000,
	};
	const char *completion = "auto";
	bool node_set = false;
	struct loop_ep x = { 0 };
	struct loop_target t;
	uint64_t area, t0, t1, done;
	fi_addr_t fa = FI_ADDR_NOTAVAIL;
	int sv[2], c, status;
	pid_t pid;
	double secs;

	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'p':
			o.provider = optarg;
			break;
		case 'n':
			o.node = *optarg ? optarg : NULL;
			node_set = true;
			break;
		case 'o':
			if (strcmp(optarg, "read") && strcmp(optarg, "write"))
				usage(2);
			o.read = strcmp(optarg, "read") == 0;
			break;
		case 'b':
			o.block = parse_size(optarg);
			break;
		case 'w':
			o.window = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'd':
			o.duration = strtod(optarg, NULL);
			break;
		case 'P':
			if (strcmp(optarg, "adaptive") && strcmp(optarg, "busy"))
				usage(2);
			o.busy = strcmp(optarg, "busy") == 0;
			break;
		case 'u':
			o.poll_ns = strtoull(optarg, NULL, 10) * 1000;
			break;
		case 'c':
			if (strcmp(optarg, "auto") && strcmp(optarg, "delivery") &&
			    strcmp(optarg, "transmit"))
				usage(2);
			completion = optarg;
			break;
		case 'j':
			o.json = true;
			break;
		case 'h':
			usage(0);
			break;
		default:
			usage(2);
		}
	}
	if (optind != argc || o.block == 0 || o.block > (1ull << 30) || o.window == 0 ||
	    o.window > LOOP_MAX_WINDOW || o.duration <= 0 || o.poll_ns == 0 ||
	    o.poll_ns >= 1000000000ull)
		usage(2);
	if (!node_set && prov_is_ip(o.provider))
		o.node = "127.0.0.1";
	if (strcmp(completion, "auto") == 0)
		o.write_flags = auto_write_flags(o.provider);
	else
		o.write_flags = strcmp(completion, "delivery") == 0 ? FI_DELIVERY_COMPLETE : 0;
	area = o.block * o.window;
	if (area < LOOP_MIN_AREA)
		area = (LOOP_MIN_AREA / o.block) * o.block;

	/* Fork before any libfabric call: providers are not fork-safe. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		die("socketpair: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		target_main(&o, sv[1], area);
	}
	close(sv[1]);
	role = "fi-rma-loop initiator";
	ep_open(&o, &x, o.block * o.window, FI_READ | FI_WRITE);
	if (read(sv[0], &t, sizeof(t)) != (ssize_t)sizeof(t))
		die("the target did not start (see its error above)");
	if (t.addrlen == 0 || t.addrlen > LOOP_MAX_ADDR)
		die("bad target address length %u", t.addrlen);
	if (fi_av_insert(x.av, t.addr, 1, &fa, 0, NULL) != 1)
		die("fi_av_insert of the target failed");

	/* Warm-up: connections, first-touch of provider buffers. */
	run(&o, &x, fa, &t, area, 0, o.window);
	t0 = now_ns();
	done = run(&o, &x, fa, &t, area, t0 + (uint64_t)(o.duration * 1e9), 0);
	t1 = now_ns();

	/* The loop moved real bytes: READ one block of the pattern back and check it. */
	memset(x.buf, 0, o.block);
	{
		struct loop_opts one = o;

		one.read = true;
		one.window = 1;
		run(&one, &x, fa, &t, area, 0, 1);
		for (uint64_t i = 0; i < o.block; i++)
			if (x.buf[i] != pattern(i))
				die("check READ: byte %" PRIu64 " is 0x%02x, expected 0x%02x", i,
				    x.buf[i], pattern(i));
	}
	close(sv[0]);
	ep_close(&x);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		die("the target failed");

	secs = (double)(t1 - t0) / 1e9;
	if (o.json)
		printf("{\"tool\": \"fi-rma-loop\", \"provider\": \"%s\", \"op\": \"%s\", "
		       "\"block_size\": %" PRIu64 ", \"window\": %u, \"seconds\": %.3f, "
		       "\"ops\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"gbps\": %.4f, "
		       "\"ops_per_s\": %.0f}\n",
		       o.provider, o.read ? "read" : "write", o.block, o.window, secs, done,
		       done * o.block, (double)done * (double)o.block / secs / 1e9,
		       (double)done / secs);
	else
		printf("%s %s block %" PRIu64 " window %u: %.3f GB/s, %.0f ops/s (%.2f s)\n",
		       o.provider, o.read ? "read" : "write", o.block, o.window,
		       (double)done * (double)o.block / secs / 1e9, (double)done / secs, secs);
	return 0;
}
