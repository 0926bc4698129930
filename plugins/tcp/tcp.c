/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp.c: the tcp transport: pipelined, checked READ/WRITE requests over persistent TCP lanes
 * (this file: options, setup, the plugin ops and the descriptor; the shape is in tcp.h).
 */
#include "tcp.h"

/* --- options ------------------------------------------------------------------------- */

/*
 * Declared options (te_plugin.h, ABI 1.2): the core checks types and ranges before init and
 * hands every one in normal form with its default; README.md says more about each.
 */
static const char *const tcp_progress_modes[] = { "caller", "threads", NULL };
static const char *const tcp_scatter_modes[] = { "auto", "on", "off", NULL };

static const struct te_plugin_option tcp_options[] = {
	TE_PLUGIN_OPTION_STRING("bind", "auto",
				"address the data listener binds: IPv4/IPv6 literal or host name; "
				"auto: the host the control plane listens on (engine.listen)"),
	TE_PLUGIN_OPTION_INT("port", "0", 0, 65535, "listener port; 0 picks a free one"),
	TE_PLUGIN_OPTION_STRING("advertise", NULL,
				"address published to peers (default: the bind address; needed "
				"when bind is a wildcard)"),
	TE_PLUGIN_OPTION_INT("lanes", "4", 1, TCP_MAX_LANES, "TCP connections per peer"),
	TE_PLUGIN_OPTION_INT("workers", "0", 0, TCP_MAX_WORKERS,
			     "epoll threads; 0: one per CPU this process may run on, at most 4"),
	TE_PLUGIN_OPTION_CHOICE("progress", "caller", tcp_progress_modes,
				"who reads answers while a thread waits in te_batch_wait: caller "
				"(that thread), or threads (the epoll threads only)"),
	TE_PLUGIN_OPTION_CHOICE(
		"scatter", "auto", tcp_scatter_modes,
		"read the answers a lane expects next with one readv, READ payloads "
		"straight into their destinations (a READ that fails may find its "
		"destination written): on (up to 4 MiB per read), auto (on; up to "
		"64 KiB per read under bbr), off (through the receive buffer)"),
	TE_PLUGIN_OPTION_INT("max_inflight", "65536", 1, TCP_MAX_INFLIGHT,
			     "requests in flight per lane; beyond it, back-pressure (a lane's "
			     "slot table grows to it as needed, from 2048)"),
	TE_PLUGIN_OPTION_SIZE("stripe_min", "1M", 0, TCP_MAX_FRAME,
			      "slices of at least this size go round-robin over the lanes; smaller "
			      "ones stay on the submitting thread's own lane (0: all round-robin)"),
	TE_PLUGIN_OPTION_INT("wait_hold_us", "1000", 0, 1000000,
			     "progress caller: after te_batch_wait returns, how long the waiting "
			     "thread's idle lanes whose last batch WRITEs over 1 MiB stay its own "
			     "to read (its next batch's answers); then their workers read them "
			     "(0: at once)"),
	TE_PLUGIN_OPTION_SIZE("slice_size", "1M", 4096, TCP_MAX_FRAME,
			      "slice size advertised to the core (transfer.slice_size overrides)"),
	TE_PLUGIN_OPTION_INT("connect_timeout_ms", "3000", 1, 600000,
			     "a slower connect fails its slices (TE_ERR_PEER_UNREACHABLE)"),
	TE_PLUGIN_OPTION_INT("room_retry_ms", "10000", 10, 3600000,
			     "a lane the server refused for want of room (its max_conns_per_host) "
			     "is left alone this long, doubled for each refusal in a row (up to "
			     "32 times), its requests going over the peer's other lanes"),
	TE_PLUGIN_OPTION_SIZE("sockbuf", "0", 0, 1 << 30,
			      "SO_SNDBUF/SO_RCVBUF, 0 or at least 64K; 0 keeps the kernel's "
			      "autotuning"),
	TE_PLUGIN_OPTION_STRING("congestion", NULL,
				"TCP congestion control of the data connections (TCP_CONGESTION: "
				"cubic, reno, bbr, dctcp, ...); default: the host's "
				"(net.ipv4.tcp_congestion_control)"),
	TE_PLUGIN_OPTION_INT("max_conns", "2048", 1, 1 << 20, "accepted connections open at once"),
	TE_PLUGIN_OPTION_INT("max_conns_per_host", "128", 1, 1 << 20,
			     "accepted connections from one client address"),
	TE_PLUGIN_OPTION_INT("max_unauth", "128", 1, 1 << 20,
			     "accepted connections still in their HELLO (and AUTH)"),
	TE_PLUGIN_OPTION_INT("hello_timeout_ms", "5000", 10, 600000,
			     "time an accepted connection has to finish its HELLO (and AUTH)"),
	TE_PLUGIN_OPTION_INT("idle_timeout_ms", "300000", 0, 86400000,
			     "a connection idle this long is closed; 0: never"),
	TE_PLUGIN_OPTION_INT("frame_timeout_ms", "60000", 10, 86400000,
			     "time a request frame has to arrive from its first byte"),
};

/* Option 'workers' 0: one per CPU of this process's affinity mask, 1..TCP_AUTO_WORKERS. */
static uint32_t tcp_auto_workers(void)
{
	cpu_set_t set;
	long n = 0;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		n = CPU_COUNT(&set);
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1u : n > (long)TCP_AUTO_WORKERS ? TCP_AUTO_WORKERS : (uint32_t)n;
}

/* A declared integer option (always set: every one above has a default). */
static uint64_t tcp_opt(const struct tcp_inst *ti, const char *key)
{
	return (uint64_t)te_plugin_opt_int(ti->host, ti->ctx, key, 0);
}

static uint64_t tcp_opt_size(const struct tcp_inst *ti, const char *key)
{
	return te_plugin_opt_size(ti->host, ti->ctx, key, 0);
}

/* The first line of /proc/sys/net/ipv4/@name into @buf (empty when it cannot be read). */
static void tcp_sysctl_line(const char *name, char *buf, size_t len)
{
	char path[96];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/sys/net/ipv4/%s", name);
	buf[0] = '\0';
	f = fopen(path, "re");
	if (!f)
		return;
	if (!fgets(buf, (int)len, f))
		buf[0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	fclose(f);
}

/*
 * Option 'scatter': bytes per scatter read (0: none). auto: 4 MiB, but 64 KiB when the data
 * connections use bbr (option 'congestion', else the host's default): measured, 4 KiB READs
 * at batch 128 from one thread ran 0.80x the plugin without scatter reads with 1 MiB or
 * 256 KiB per read and 1.07x with 64 KiB under bbr (no fq), while under cubic 1 MiB gave
 * 1.25x from 2 threads against 1.10x with 64 KiB (bench/README.md). Why 4 MiB, not 1 MiB:
 * TCP_RX_CHAIN_BYTES.
 */
static void tcp_scatter_setup(struct tcp_inst *ti)
{
	char cc[sizeof(ti->congestion)] = "";
	int mode = te_plugin_opt_choice(ti->host, ti->ctx, "scatter", tcp_scatter_modes, 0);

	snprintf(cc, sizeof(cc), "%s", ti->congestion);
	if (!*cc)
		tcp_sysctl_line("tcp_congestion_control", cc, sizeof(cc));
	if (mode == 2)
		ti->scatter_max = 0;
	else if (mode == 0 && strncmp(cc, "bbr", 3) == 0)
		ti->scatter_max = TCP_RX_CHAIN_BYTES_BBR;
	else
		ti->scatter_max = TCP_RX_CHAIN_BYTES;
}

/*
 * Option 'congestion': the algorithm must exist on this host and be allowed to this process,
 * checked on a probe socket now rather than on the first connection.
 */
static enum te_status tcp_congestion_check(struct tcp_inst *ti, const char *cc)
{
	const char *list = NULL;
	char avail[256] = "";
	int fd, err = 0;

	if (!cc || !*cc)
		return TE_OK;
	if (strlen(cc) >= sizeof(ti->congestion)) {
		tcp_set_error(ti,
			      TCP_NAME ": option 'congestion': '%s' is too long (at most %zu "
				       "characters)",
			      cc, sizeof(ti->congestion) - 1);
		return TE_ERR_CONFIG;
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0)
		err = errno;
	if (fd >= 0)
		close(fd);
	if (!err) {
		snprintf(ti->congestion, sizeof(ti->congestion), "%s", cc);
		return TE_OK;
	}
	list = err == EPERM ? "tcp_allowed_congestion_control" : "tcp_available_congestion_control";
	tcp_sysctl_line(list, avail, sizeof(avail));
	tcp_set_error(ti,
		      TCP_NAME ": option 'congestion': '%s' %s on this host: %s (net.ipv4.%s: %s)",
		      cc, err == EPERM ? "is not allowed to this process" : "is not available",
		      strerror(err), list, *avail ? avail : "unknown");
	return TE_ERR_CONFIG;
}

/* Resolve @host (numeric or a name, looked up once here) with @port into @ss. */
static enum te_status tcp_resolve(struct tcp_inst *ti, const char *opt, const char *host,
				  uint16_t port, bool passive, struct sockaddr_storage *ss,
				  socklen_t *len_out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	int rc;

	if (passive)
		hints.ai_flags = AI_PASSIVE;
	rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc != 0 || !res || res->ai_addrlen > sizeof(*ss) ||
	    (res->ai_family != AF_INET && res->ai_family != AF_INET6)) {
		tcp_set_error(ti, TCP_NAME ": option '%s': cannot resolve '%s': %s", opt, host,
			      rc ? gai_strerror(rc) : "no IPv4/IPv6 address");
		if (res)
			freeaddrinfo(res);
		return TE_ERR_CONFIG;
	}
	memset(ss, 0, sizeof(*ss));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len_out = res->ai_addrlen;
	freeaddrinfo(res);
	if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)ss)->sin_port = htons(port);
	return TE_OK;
}

static bool tcp_is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
	return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
}

/* The host part of "host:port" / "[v6]:port" into @out ("" when there is none). */
static void tcp_host_of(const char *hostport, char *out, size_t cap)
{
	const char *colon = hostport ? strrchr(hostport, ':') : NULL;
	size_t n;

	out[0] = '\0';
	if (!colon)
		return;
	n = (size_t)(colon - hostport);
	if (n >= 2 && hostport[0] == '[' && hostport[n - 1] == ']') {
		hostport++;
		n -= 2;
	}
	if (n >= cap)
		return;
	memcpy(out, hostport, n);
	out[n] = '\0';
}

static bool tcp_is_wildcard(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)ss)->sin6_addr);
	return ((const struct sockaddr_in *)ss)->sin_addr.s_addr == htonl(INADDR_ANY);
}

/* Parse the options, open the listener and fill the published blob. */
static enum te_status tcp_setup(struct tcp_inst *ti, uint8_t blob[TCP_BLOB_LEN])
{
	const char *bind_s = ti->host->config_get(ti->ctx, "bind");
	const char *adv_s = ti->host->config_get(ti->ctx, "advertise");
	char ctl_host[72], auto_adv[72];
	const char *ctl_bound;
	struct sockaddr_storage bsa, asa;
	socklen_t blen, alen;
	char text[72];
	uint64_t port;
	enum te_status st;
	int one = 1;

	port = tcp_opt(ti, "port");
	ti->lanes = (uint32_t)tcp_opt(ti, "lanes");
	ti->n_workers = (uint32_t)tcp_opt(ti, "workers");
	if (!ti->n_workers)
		ti->n_workers = tcp_auto_workers();
	ti->hybrid =
		te_plugin_opt_choice(ti->host, ti->ctx, "progress", tcp_progress_modes, 0) == 0;
	ti->max_inflight = (uint32_t)tcp_opt(ti, "max_inflight");
	ti->slice_size = tcp_opt_size(ti, "slice_size");
	ti->stripe_min = tcp_opt_size(ti, "stripe_min");
	ti->wait_hold_ns = tcp_opt(ti, "wait_hold_us") * 1000ull;
	ti->connect_timeout_ms = tcp_opt(ti, "connect_timeout_ms");
	ti->room_retry_ns = tcp_opt(ti, "room_retry_ms") * 1000000ull;
	ti->sockbuf = tcp_opt_size(ti, "sockbuf");
	if (ti->sockbuf && ti->sockbuf < TCP_SOCKBUF_MIN) {
		/*
		 * A receive window below the peer's segment size (64K on loopback) is never
		 * reopened by a window update (silly-window avoidance): the sender waits for its
		 * persist timer, 200 ms and more per frame (measured: 8K stalled 4 KiB WRITEs).
		 */
		tcp_set_error(ti,
			      TCP_NAME ": option 'sockbuf': %" PRIu64 " bytes is below the minimum "
				       "of 64K (smaller windows stall on the persist timer); 0 "
				       "keeps the kernel's autotuning",
			      ti->sockbuf);
		return TE_ERR_CONFIG;
	}
	st = tcp_congestion_check(ti, ti->host->config_get(ti->ctx, "congestion"));
	if (st != TE_OK)
		return st;
	tcp_scatter_setup(ti);
	ti->max_conns = tcp_opt(ti, "max_conns");
	ti->max_conns_per_host = tcp_opt(ti, "max_conns_per_host");
	ti->max_unauth = tcp_opt(ti, "max_unauth");
	ti->hello_timeout_ms = tcp_opt(ti, "hello_timeout_ms");
	ti->idle_timeout_ms = tcp_opt(ti, "idle_timeout_ms");
	ti->frame_timeout_ms = tcp_opt(ti, "frame_timeout_ms");

	/*
	 * auto: follow the control plane, so that the peers that find this engine can also reach
	 * its data: its bound host (a wildcard too), advertising what the control plane
	 * advertises unless 'advertise' says otherwise.
	 */
	ctl_bound = TE_PLUGIN_HAS(ti->host, struct te_plugin_host, control_address)
			    ? ti->host->control_address(ti->ctx, TE_PLUGIN_ADDR_BOUND)
			    : "";
	tcp_host_of(ctl_bound, ctl_host, sizeof(ctl_host));
	if (!bind_s || !*bind_s || strcmp(bind_s, "auto") == 0) {
		bind_s = *ctl_host ? ctl_host : "127.0.0.1";
		if (!(adv_s && *adv_s)) {
			tcp_host_of(ti->host->control_address(ti->ctx, TE_PLUGIN_ADDR_ADVERTISED),
				    auto_adv, sizeof(auto_adv));
			if (*auto_adv)
				adv_s = auto_adv;
		}
	}
	snprintf(ti->bind_text, sizeof(ti->bind_text), "%s", bind_s);
	st = tcp_resolve(ti, "bind", bind_s, (uint16_t)port, true, &bsa, &blen);
	if (st != TE_OK)
		return st;
	/* A loopback data listener behind a network control plane moves no data between hosts. */
	if (tcp_is_loopback(&bsa) && *ctl_host && strncmp(ctl_host, "127.", 4) != 0 &&
	    strcmp(ctl_host, "::1") != 0 && strcmp(ctl_host, "localhost") != 0)
		ti->host->log(ti->ctx, TE_PLUGIN_LOG_WARN,
			      "option 'bind' is %s, a loopback address, while the control plane "
			      "listens on %s: peers on other hosts will find this engine but "
			      "cannot move data with it; set 'bind' to auto (the default) or an "
			      "address they reach",
			      bind_s, ctl_bound);
	if (adv_s && *adv_s) {
		st = tcp_resolve(ti, "advertise", adv_s, 0, false, &asa, &alen);
		if (st != TE_OK)
			return st;
		if (tcp_is_wildcard(&asa)) {
			tcp_set_error(
				ti,
				TCP_NAME
				": option 'advertise': '%s' is a wildcard address; peers need one they "
				"can connect to",
				adv_s);
			return TE_ERR_CONFIG;
		}
	} else if (tcp_is_wildcard(&bsa)) {
		tcp_set_error(
			ti,
			TCP_NAME
			": option 'advertise' is required when 'bind' is the wildcard address '%s'",
			bind_s);
		return TE_ERR_CONFIG;
	} else {
		asa = bsa;
	}

	ti->listen_fd = socket(bsa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ti->listen_fd < 0) {
		tcp_set_error(ti, TCP_NAME ": option 'bind': no %s socket: %s",
			      bsa.ss_family == AF_INET6 ? "IPv6" : "IPv4", strerror(errno));
		return TE_ERR_CONFIG;
	}
	setsockopt(ti->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	tcp_sock_cc(ti, ti->listen_fd); /* accepted connections start with it */
	if (bsa.ss_family == AF_INET6 && tcp_is_wildcard(&bsa)) {
		int zero = 0;

		/* "::" serves IPv4 peers too, whatever net.ipv6.bindv6only says. */
		setsockopt(ti->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	}
	tcp_sa_text(&bsa, text, sizeof(text));
	if (bind(ti->listen_fd, (struct sockaddr *)&bsa, blen) != 0 ||
	    listen(ti->listen_fd, SOMAXCONN) != 0) {
		tcp_set_error(ti, TCP_NAME ": options 'bind'/'port': cannot listen on %s: %s", text,
			      strerror(errno));
		return TE_ERR_CONFIG;
	}
	blen = sizeof(bsa);
	if (getsockname(ti->listen_fd, (struct sockaddr *)&bsa, &blen) != 0)
		return TE_ERR_SYSTEM;
	ti->port = ntohs(bsa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bsa)->sin6_port
						   : ((struct sockaddr_in *)&bsa)->sin_port);
	tcp_sa_text(&bsa, text, sizeof(text));
	snprintf(ti->device, sizeof(ti->device), "tcp:%s", text);

	if (getrandom(&ti->nonce, sizeof(ti->nonce), GRND_NONBLOCK) != sizeof(ti->nonce))
		ti->nonce = tcp_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)ti;
	if (ti->nonce == 0)
		ti->nonce = 1;

	memset(blob, 0, TCP_BLOB_LEN);
	te_plugin_put_u32(blob, TCP_BLOB_MAGIC);
	blob[4] = 1;
	blob[5] = asa.ss_family == AF_INET6 ? 6 : 4;
	te_plugin_put_u16(blob + 6, ti->port);
	te_plugin_put_u64(blob + 8, ti->nonce);
	if (asa.ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&asa;

		memcpy(blob + 16, &s6->sin6_addr, 16);
		te_plugin_put_u32(blob + 32, s6->sin6_scope_id);
	} else {
		memcpy(blob + 16, &((const struct sockaddr_in *)&asa)->sin_addr, 4);
	}
	if (asa.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&asa)->sin6_port = htons(ti->port);
	else
		((struct sockaddr_in *)&asa)->sin_port = htons(ti->port);
	tcp_sa_text(&asa, text, sizeof(text));
	tcp_log(ti, TE_PLUGIN_LOG_INFO,
		"listening on %s, advertised as %s; %u lanes per peer, %u workers, slice %" PRIu64
		" bytes%s%s",
		ti->device + 4, text, ti->lanes, ti->n_workers, ti->slice_size,
		*ti->congestion ? ", congestion control " : "", ti->congestion);
	return TE_OK;
}

/* --- install -------------------------------------------------------------------------- */

static enum te_status tcp_workers_start(struct tcp_inst *ti)
{
	ti->workers = calloc(ti->n_workers, sizeof(*ti->workers));
	if (!ti->workers)
		return TE_ERR_NOMEM;
	for (uint32_t i = 0; i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];

		w->ti = ti;
		w->index = i;
		w->epfd = -1;
		w->kick_fd = -1;
		pthread_mutex_init(&w->lock, NULL);
	}
	for (uint32_t i = 0; i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];
		struct epoll_event ev = { .events = EPOLLIN };
		char name[16];
		int rc;

		w->kick_ep.kind = TCP_EP_KICK;
		w->scratch = malloc(TCP_SCRATCH);
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		w->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (!w->scratch || w->epfd < 0 || w->kick_fd < 0)
			goto err_system;
		ev.data.ptr = &w->kick_ep;
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->kick_fd, &ev) != 0)
			goto err_system;
		if (i == 0) {
			ev.events = EPOLLIN | EPOLLET;
			ev.data.ptr = &ti->listen_ep;
			if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, ti->listen_fd, &ev) != 0)
				goto err_system;
		}
		rc = pthread_create(&w->thread, NULL, tcp_worker_main, w);
		if (rc != 0) {
			errno = rc;
			goto err_system;
		}
		w->started = true;
		snprintf(name, sizeof(name), "te-tcp-%u", i);
		pthread_setname_np(w->thread, name);
		continue;
err_system:
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "cannot start worker %u: %s", i, strerror(errno));
		return TE_ERR_SYSTEM;
	}
	return TE_OK;
}

/* Teardown shared by fini and a failing init; @ti may be partly built. */
static void tcp_destroy(struct tcp_inst *ti)
{
	uint32_t peers = 0, rkeys = 0, mems;

	atomic_store_explicit(&ti->stopping, true, memory_order_release);
	for (uint32_t i = 0; ti->workers && i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];

		if (!w->started)
			continue;
		pthread_mutex_lock(&w->lock);
		w->kicked = false;
		tcp_worker_wake_locked(w);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
		w->started = false;
	}
	if (ti->listen_fd >= 0)
		close(ti->listen_fd);

	/* Single-threaded from here. Every slice still held is reported exactly once. */
	while (ti->peers) {
		struct tcp_peer *peer = ti->peers;

		peers++;
		for (uint32_t i = 0; i < peer->n_lanes; i++) {
			struct tcp_lane *l = &peer->lanes[i];
			struct tcp_rlist rest = { 0 };

			tcp_lane_break(ti, l, TE_ERR_CANCELED, TCP_NAME ": instance shut down");
			/* WRITEs still waiting for a fence: shutting down, nobody waits longer. */
			pthread_mutex_lock(&l->lock);
			tcp_fence_take_locked(l, true, 0, &rest);
			pthread_mutex_unlock(&l->lock);
			tcp_rlist_report(ti, &rest);
		}
		tcp_peer_free(ti, peer);
	}
	for (uint32_t i = 0; ti->workers && i < ti->n_workers; i++) {
		struct tcp_worker *w = &ti->workers[i];

		while (w->conns) {
			struct tcp_conn *c = w->conns;

			w->conns = c->next;
			close(c->fd);
			tcp_conn_free(c);
		}
		while (w->defer_head) {
			struct te_plugin_slice *s = w->defer_head;

			w->defer_head = tcp_priv(s)->next;
			tcp_report_priv(ti, s);
		}
		if (w->epfd >= 0)
			close(w->epfd);
		if (w->kick_fd >= 0)
			close(w->kick_fd);
		free(w->scratch);
		free(w->again);
		pthread_mutex_destroy(&w->lock);
	}
	while (ti->rkeys) {
		struct tcp_rkey *k = ti->rkeys;

		ti->rkeys = k->next;
		rkeys++;
		free(k);
	}
	mems = ti->regions.n;
	for (uint32_t i = 0; i < ti->regions.n; i++)
		free(ti->regions.v[i].mem);
	if (peers || rkeys || mems)
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
			"fini released %u peers, %u remote keys and %u regions", peers, rkeys,
			mems);
	te_plugin_regions_free(&ti->regions);
	free(ti->workers);
	free(ti->fences);
	pthread_rwlock_destroy(&ti->reg_lock);
	pthread_mutex_destroy(&ti->lock);
	pthread_mutex_destroy(&ti->fence_lock);
	te_plugin_naming_destroy(&ti->naming);
	free(ti);
}

static enum te_status tcp_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out)
{
	uint8_t blob[TCP_BLOB_LEN];
	pthread_rwlockattr_t attr;
	struct tcp_inst *ti;
	enum te_status st;

	if (!host || !inst_out || !host->log || !host->slice_done || !host->config_get ||
	    !host->publish)
		return TE_ERR_INVALID_ARG;
	ti = calloc(1, sizeof(*ti));
	if (!ti)
		return TE_ERR_NOMEM;
	if (te_plugin_naming_init(&ti->naming)) {
		free(ti);
		return TE_ERR_NOMEM;
	}
	ti->host = host;
	ti->ctx = ctx;
	ti->listen_fd = -1;
	ti->listen_ep.kind = TCP_EP_LISTEN;
	pthread_mutex_init(&ti->lock, NULL);
	pthread_mutex_init(&ti->fence_lock, NULL);
	/* Since ABI 1.2 the host authenticates with the engine's secret, which we never see. */
	if (TE_PLUGIN_HAS(host, struct te_plugin_host, auth_check) && host->auth_mac &&
	    host->auth_check) {
		uint8_t probe[TE_PLUGIN_MAC_SIZE];

		ti->auth = host->auth_mac(ctx, NULL, 0, probe) == TE_OK;
	}
	pthread_rwlockattr_init(&attr);
	/*
	 * Serving syscalls hold the read side back to back under load; without writer
	 * preference dereg_mem could wait behind them forever.
	 */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&ti->reg_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	ti->fences = calloc(TCP_FENCES, sizeof(*ti->fences));
	if (!ti->fences) {
		st = TE_ERR_NOMEM;
		goto err_destroy;
	}

	st = tcp_setup(ti, blob);
	if (st != TE_OK)
		goto err_destroy;
	st = host->publish(ctx, blob, sizeof(blob));
	if (st != TE_OK) {
		tcp_log(ti, TE_PLUGIN_LOG_ERROR, "publish failed (%d)", st);
		goto err_destroy;
	}
	st = tcp_workers_start(ti);
	if (st != TE_OK)
		goto err_destroy;
	*inst_out = (struct te_plugin_inst *)ti;
	return TE_OK;

err_destroy:
	tcp_destroy(ti);
	return st;
}

static void tcp_fini(struct te_plugin_inst *inst)
{
	tcp_destroy(tcp_inst_of(inst));
}

static enum te_status tcp_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct tcp_inst *ti = tcp_inst_of(inst);

	if (!caps)
		return TE_ERR_INVALID_ARG;
	caps->mem_types = TE_PLUGIN_MEM_CPU;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	caps->flags =
		ti->hybrid ? TE_PLUGIN_CAP_HYBRID_PROGRESS | TE_PLUGIN_CAP_HYBRID_PER_THREAD : 0;
	caps->max_slice_size = TCP_MAX_FRAME;
	caps->default_slice_size = ti->slice_size;
	caps->slice_priv_size = sizeof(struct tcp_spriv);
	caps->max_devices = 1;
	/* GPU regions are served by staging through their owner (host->mem_copy). */
	if (TE_PLUGIN_HAS(caps, struct te_plugin_caps, staged_mem_types))
		caps->staged_mem_types = TCP_STAGED_TYPES;
	return TE_OK;
}

static enum te_status tcp_query_devices(struct te_plugin_inst *inst,
					struct te_plugin_device *devices, uint32_t max,
					uint32_t *n_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);

	if (!n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	if (max == 0) {
		*n_out = 0;
		return TE_OK;
	}
	te_plugin_device_set(devices, ti->device, -1, NULL, 0, TE_PLUGIN_MEM_CPU);
	*n_out = 1;
	return TE_OK;
}

/* --- memory -------------------------------------------------------------------------- */

static enum te_status tcp_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				  uint32_t mem_type, int32_t dev, uint32_t access,
				  struct te_plugin_mem **mem_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	uint64_t start = (uint64_t)(uintptr_t)addr;
	struct tcp_mem *m;
	enum te_status st;

	if (!addr || length == 0 || !mem_out || (access & ~TCP_ACCESS_ALL))
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CPU && !(mem_type & TCP_STAGED_TYPES))
		return TE_ERR_MEMORY_TYPE;
	/* GPU memory is served through staging: only when a loaded plugin owns the kind. */
	if (mem_type != TE_PLUGIN_MEM_CPU &&
	    ti->host->mem_copy(ti->ctx, NULL, NULL, 0, mem_type, dev, TE_PLUGIN_COPY_TO_HOST) !=
		    TE_OK) {
		tcp_set_error(ti,
			      TCP_NAME
			      ": cannot serve %s memory: no loaded transport owns that kind "
			      "to stage it",
			      mem_type == TE_PLUGIN_MEM_HIP ? "hip" : "cuda");
		return TE_ERR_MEMORY_TYPE;
	}
	if (start > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	m = malloc(sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = start;
	m->length = length;
	m->access = access;
	m->mem_type = mem_type;
	m->dev = dev;

	pthread_rwlock_wrlock(&ti->reg_lock);
	st = te_plugin_regions_add(&ti->regions, start, length, access, m);
	pthread_rwlock_unlock(&ti->reg_lock);
	if (st != TE_OK) {
		free(m);
		return st;
	}
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;
}

static enum te_status tcp_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_mem *m = (struct tcp_mem *)mem;

	if (!m)
		return TE_ERR_INVALID_ARG;
	/*
	 * The write lock waits for the serving syscall in progress on this region (each is
	 * non-blocking and short); later ones see the new version, re-check and find it gone.
	 */
	pthread_rwlock_wrlock(&ti->reg_lock);
	if (te_plugin_regions_remove(&ti->regions, m) != TE_OK) {
		pthread_rwlock_unlock(&ti->reg_lock);
		return TE_ERR_INVALID_HANDLE;
	}
	/*
	 * relaxed: readers load it under the read lock, which orders it, or without it to
	 * trust a connection's kept region (tcp_conn_lookup), where a stale value is caught by
	 * the re-check under the lock before any byte moves.
	 */
	atomic_fetch_add_explicit(&ti->reg_ver, 1, memory_order_relaxed);
	pthread_rwlock_unlock(&ti->reg_lock);
	free(m);
	return TE_OK;
}

static enum te_status tcp_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				   void *buf, size_t cap, size_t *len_out)
{
	const struct tcp_mem *m = (const struct tcp_mem *)mem;
	uint8_t *p = buf;

	if (!m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	if (cap < TCP_KEY_LEN)
		return TE_ERR_TOO_LARGE;
	te_plugin_put_u32(p, TCP_KEY_MAGIC);
	te_plugin_put_u32(p + 4, m->access);
	te_plugin_put_u64(p + 8, m->addr);
	te_plugin_put_u64(p + 16, m->length);
	*len_out = TCP_KEY_LEN;
	return TE_OK;
}

/* --- peers ------------------------------------------------------------------------- */

static enum te_status tcp_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				    const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	const uint8_t *b = blob;
	struct tcp_peer *peer;
	uint32_t base;
	uint16_t port;

	if (!peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != TCP_BLOB_LEN || te_plugin_get_u32(b) != TCP_BLOB_MAGIC || b[4] != 1 ||
	    (b[5] != 4 && b[5] != 6) || te_plugin_get_u16(b + 6) == 0 ||
	    te_plugin_get_u32(b + 36) != 0) {
		char why[160];

		if (len != TCP_BLOB_LEN)
			snprintf(why, sizeof(why), "%zu bytes, expected %u", len, TCP_BLOB_LEN);
		else if (te_plugin_get_u32(b) != TCP_BLOB_MAGIC || b[4] != 1)
			snprintf(why, sizeof(why),
				 "magic 0x%08" PRIx32 " version %u, expected "
				 "0x%08x version 1",
				 te_plugin_get_u32(b), b[4], TCP_BLOB_MAGIC);
		else if (b[5] != 4 && b[5] != 6)
			snprintf(why, sizeof(why), "address family %u, expected 4 or 6", b[5]);
		else if (te_plugin_get_u16(b + 6) == 0)
			snprintf(why, sizeof(why), "port 0");
		else
			snprintf(why, sizeof(why), "reserved field 0x%08" PRIx32 " is not 0",
				 te_plugin_get_u32(b + 36));
		tcp_set_error(ti, TCP_NAME ": peer %s: malformed transport blob (%s)", peer_name,
			      why);
		tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "peer %s: malformed transport blob (%s)",
			peer_name, why);
		return TE_ERR_METADATA_MALFORMED;
	}
	port = te_plugin_get_u16(b + 6);
	peer = calloc(1, sizeof(*peer) + ti->lanes * sizeof(peer->lanes[0]));
	if (!peer)
		return TE_ERR_NOMEM;
	peer->ti = ti;
	peer->name = strdup(peer_name);
	peer->nonce = te_plugin_get_u64(b + 8);
	if (!tcp_random(&peer->cid, sizeof(peer->cid)) || !peer->cid) {
		tcp_set_error(ti, TCP_NAME ": peer %s: no random bytes for a client id", peer_name);
		free(peer->name);
		free(peer);
		return TE_ERR_SYSTEM;
	}
	peer->n_lanes = ti->lanes;
	if (b[5] == 6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&peer->sa;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		memcpy(&s6->sin6_addr, b + 16, 16);
		s6->sin6_scope_id = te_plugin_get_u32(b + 32);
		peer->salen = sizeof(*s6);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&peer->sa;

		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		memcpy(&s4->sin_addr, b + 16, 4);
		peer->salen = sizeof(*s4);
	}
	tcp_sa_text(&peer->sa, peer->addr_text, sizeof(peer->addr_text));

	pthread_mutex_lock(&ti->lock);
	base = ti->next_peer_worker;
	ti->next_peer_worker += ti->lanes;
	pthread_mutex_unlock(&ti->lock);
	for (uint32_t i = 0, first = tcp_slots_first(ti); i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		l->ep.kind = TCP_EP_LANE;
		l->peer = peer;
		l->index = i;
		l->fd = -1;
		l->w = &ti->workers[(base + i) % ti->n_workers];
		pthread_mutex_init(&l->lock, NULL);
		pthread_mutex_init(&l->rx_lock, NULL);
		l->slots = calloc(first, sizeof(*l->slots));
		l->free_ids = malloc(first * sizeof(*l->free_ids));
		l->rx.buf = malloc(TCP_RBUF_BIG);
		l->txh = malloc(TCP_TXH_FIRST * TCP_HDR_LEN);
		l->txh_cap = TCP_TXH_FIRST;
		l->rx.cap = TCP_RBUF_BIG;
		l->rx.gulp = TCP_GULP;
		if (l->free_ids)
			tcp_lane_ids_reset(l, first);
	}
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		if (!peer->name || !l->slots || !l->free_ids || !l->rx.buf || !l->txh) {
			/* Not yet visible to anyone: free it directly. */
			for (uint32_t k = 0; k < peer->n_lanes; k++) {
				pthread_mutex_destroy(&peer->lanes[k].lock);
				pthread_mutex_destroy(&peer->lanes[k].rx_lock);
				free(peer->lanes[k].slots);
				free(peer->lanes[k].free_ids);
				free(peer->lanes[k].rx.buf);
				free(peer->lanes[k].txh);
			}
			free(peer->name);
			free(peer);
			return TE_ERR_NOMEM;
		}
	}
	atomic_init(&peer->lanes_open, peer->n_lanes);
	pthread_mutex_lock(&ti->lock);
	peer->next = ti->peers;
	if (ti->peers)
		ti->peers->prev = peer;
	ti->peers = peer;
	pthread_mutex_unlock(&ti->lock);
	for (uint32_t i = 0; i < peer->n_lanes; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		pthread_mutex_lock(&l->w->lock);
		l->wnext = l->w->lanes;
		if (l->w->lanes)
			l->w->lanes->wprev = l;
		l->w->lanes = l;
		pthread_mutex_unlock(&l->w->lock);
	}
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG, "peer %s at %s (instance %016" PRIx64 ")", peer_name,
		peer->addr_text, peer->nonce);
	*peer_out = (struct te_plugin_peer *)peer;
	return TE_OK;
}

static void tcp_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *handle)
{
	struct tcp_peer *peer = (struct tcp_peer *)handle;
	struct tcp_inst *ti = tcp_inst_of(inst);
	uint32_t n;

	if (!peer)
		return;
	/* A worker inside peer_event for this peer finishes first (the core holds no lock). */
	te_plugin_naming_unload(&ti->naming, &peer->np);
	/*
	 * Closed by the lanes' workers: this may run on one of them (from slice_done) in the
	 * middle of using a lane, and only the worker may close a lane's socket. The last
	 * lane's worker frees the peer, possibly before this loop ends: read nothing of the
	 * peer after the last kick.
	 */
	n = peer->n_lanes;
	for (uint32_t i = 0; i < n; i++) {
		struct tcp_lane *l = &peer->lanes[i];

		pthread_mutex_lock(&l->lock);
		l->closing = true;
		pthread_mutex_unlock(&l->lock);
		tcp_kick_lane(l);
	}
}

static enum te_status tcp_unpack_remote_key(struct te_plugin_inst *inst,
					    struct te_plugin_peer *peer, const void *blob,
					    size_t len, uint64_t addr, uint64_t length,
					    struct te_plugin_rkey **rkey_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	const uint8_t *p = blob;
	uint64_t kaddr, klen;
	struct tcp_rkey *k;
	uint32_t access;

	if (!peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != TCP_KEY_LEN || te_plugin_get_u32(p) != TCP_KEY_MAGIC)
		goto err_malformed;
	access = te_plugin_get_u32(p + 4);
	kaddr = te_plugin_get_u64(p + 8);
	klen = te_plugin_get_u64(p + 16);
	/* The key must describe exactly the buffer the descriptor lists it under. */
	if ((access & ~TCP_ACCESS_ALL) || klen == 0 || kaddr > UINT64_MAX - klen || kaddr != addr ||
	    klen != length)
		goto err_malformed;
	k = calloc(1, sizeof(*k));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = kaddr;
	k->length = klen;
	k->access = access;
	pthread_mutex_lock(&ti->lock);
	k->next = ti->rkeys;
	if (ti->rkeys)
		ti->rkeys->prev = k;
	ti->rkeys = k;
	pthread_mutex_unlock(&ti->lock);
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;

err_malformed:
	tcp_set_error(ti,
		      TCP_NAME ": peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64
			       ", +%" PRIu64 ")",
		      ((struct tcp_peer *)peer)->name, len, addr, length);
	tcp_log(ti, TE_PLUGIN_LOG_DEBUG,
		"peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64 ", +%" PRIu64 ")",
		((struct tcp_peer *)peer)->name, len, addr, length);
	return TE_ERR_METADATA_MALFORMED;
}

static void tcp_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_rkey *k = (struct tcp_rkey *)rkey;

	if (!k)
		return;
	pthread_mutex_lock(&ti->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		ti->rkeys = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&ti->lock);
	free(k);
}

/* Appends to a buffer that may be too small, counting what the whole text needs. */
struct tcp_out {
	char *buf;
	size_t len, used;
};

static void tcp_out(struct tcp_out *o, const char *fmt, ...) TE_PLUGIN_PRINTF(2, 3);

static void tcp_out(struct tcp_out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(o->used < o->len ? o->buf + o->used : NULL,
		      o->used < o->len ? o->len - o->used : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->used += (size_t)n;
}

/*
 * @s as a JSON string: quotes, backslashes and control bytes escaped, and bytes above 0x7e
 * too (as code points U+0080..U+00FF), so that any name gives valid JSON.
 */
static void tcp_out_str(struct tcp_out *o, const char *s)
{
	tcp_out(o, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			tcp_out(o, "\\%c", c);
		else if (c < 0x20 || c > 0x7e)
			tcp_out(o, "\\u%04x", c);
		else
			tcp_out(o, "%c", c);
	}
	tcp_out(o, "\"");
}

/*
 * {"lanes_per_peer": N, "workers": N, ..., "refused_for_room": N, "peers": [{"name",
 * "address", "lanes": [{"slices", "bytes", "connects", ..., "in_flight", "owner_in_flight",
 * "slots", "room_refused", "room_refusals_in_row", "room_wait_ms", "room_woken", "sends",
 * "up"}...], "lanes_used", "slices", "bytes", "reconnects"}...]}: workers, the epoll threads
 * running (option workers, 0 resolved); per peer loaded now, the slices and payload bytes
 * queued on each lane since the peer was loaded (retries count again), connections opened
 * (reconnects: all but each lane's first). A lane is used when it carried at least one
 * slice. Now: in_flight, the lane's slots in use (orphans included); owner_in_flight, the
 * requests in flight on any lane of the threads whose own lane this is; slots, the slot ids
 * the lane has (its table grows to max_inflight as needed); room_refused, the
 * connections the peer refused for want of room, room_refusals_in_row and room_wait_ms those
 * in a row since the lane was served and the wait the last one set; room_woken, the sleeps
 * of a thread driving the lane that room in its full socket ended (tcp_wait); sends, the
 * sendmsg calls that moved request bytes on it (handshakes included). refused_for_room: lanes
 * of other engines this one refused so (the serving side).
 */
static enum te_status tcp_stats(struct te_plugin_inst *inst, char *buf, size_t len,
				size_t *needed_out)
{
	struct tcp_inst *ti = tcp_inst_of(inst);
	struct tcp_out o = { .buf = buf, .len = buf ? len : 0 };
	const char *sep = "";

	if (!needed_out)
		return TE_ERR_INVALID_ARG;
	tcp_out(&o,
		"{\"lanes_per_peer\":%" PRIu32 ",\"workers\":%" PRIu32 ",\"progress\":\"%s\""
		",\"scatter_max\":%" PRIu32 ",\"refused_for_room\":%" PRIu64 ",\"peers\":[",
		ti->lanes, ti->n_workers, ti->hybrid ? "caller" : "threads", ti->scatter_max,
		(uint64_t)atomic_load_explicit(&ti->st_room_refused, memory_order_relaxed));
	pthread_mutex_lock(&ti->lock);
	for (struct tcp_peer *peer = ti->peers; peer; peer = peer->next) {
		uint64_t slices = 0, bytes = 0, reconnects = 0;
		uint32_t used = 0;

		tcp_out(&o, "%s{\"name\":", sep);
		tcp_out_str(&o, peer->name);
		tcp_out(&o, ",\"address\":");
		tcp_out_str(&o, peer->addr_text);
		tcp_out(&o, ",\"lanes\":[");
		for (uint32_t i = 0; i < peer->n_lanes; i++) {
			struct tcp_lane *l = &peer->lanes[i];
			/* relaxed: counters, each read once */
			uint64_t n = atomic_load_explicit(&l->st_slices, memory_order_relaxed);
			uint64_t b = atomic_load_explicit(&l->st_bytes, memory_order_relaxed);
			uint64_t c = atomic_load_explicit(&l->st_connects, memory_order_relaxed);
			uint64_t d = atomic_load_explicit(&l->st_driven, memory_order_relaxed);
			uint64_t sc = atomic_load_explicit(&l->st_scattered, memory_order_relaxed);
			uint64_t rp = atomic_load_explicit(&l->st_replayed, memory_order_relaxed);
			uint64_t rr =
				atomic_load_explicit(&l->st_room_refused, memory_order_relaxed);
			uint64_t rw = atomic_load_explicit(&l->st_room_woken, memory_order_relaxed);
			uint64_t sn = atomic_load_explicit(&l->st_sends, memory_order_relaxed);
			uint32_t own = tcp_owner_busy(l);
			uint32_t inflight, slots, streak, wait_ms;
			bool up;

			pthread_mutex_lock(&l->lock);
			up = l->state == TCP_LANE_UP;
			inflight = atomic_load_explicit(&l->used, memory_order_relaxed);
			slots = l->free_cap;
			streak = l->room_streak;
			wait_ms = l->room_wait_ms;
			pthread_mutex_unlock(&l->lock);
			tcp_out(&o,
				"%s{\"slices\":%" PRIu64 ",\"bytes\":%" PRIu64
				",\"connects\":%" PRIu64 ",\"driven\":%" PRIu64
				",\"scattered\":%" PRIu64 ",\"replayed\":%" PRIu64
				",\"in_flight\":%" PRIu32 ",\"owner_in_flight\":%" PRIu32
				",\"slots\":%" PRIu32 ",\"room_refused\":%" PRIu64
				",\"room_refusals_in_row\":%" PRIu32 ",\"room_wait_ms\":%" PRIu32
				",\"room_woken\":%" PRIu64 ",\"sends\":%" PRIu64 ",\"up\":%s}",
				i ? "," : "", n, b, c, d, sc, rp, inflight, own, slots, rr, streak,
				wait_ms, rw, sn, up ? "true" : "false");
			slices += n;
			bytes += b;
			reconnects += c > 1 ? c - 1 : 0;
			used += n > 0;
		}
		tcp_out(&o,
			"],\"lanes_used\":%" PRIu32 ",\"slices\":%" PRIu64 ",\"bytes\":%" PRIu64
			",\"reconnects\":%" PRIu64 "}",
			used, slices, bytes, reconnects);
		sep = ",";
	}
	pthread_mutex_unlock(&ti->lock);
	tcp_out(&o, "]}");
	*needed_out = o.used + 1;
	return o.used < o.len ? TE_OK : TE_ERR_TOO_LARGE;
}

static const struct te_plugin_ops tcp_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = tcp_init,
	.fini = tcp_fini,
	.query_caps = tcp_query_caps,
	.query_devices = tcp_query_devices,
	.reg_mem = tcp_reg_mem,
	.dereg_mem = tcp_dereg_mem,
	.pack_key = tcp_pack_key,
	.load_peer = tcp_load_peer,
	.unload_peer = tcp_unload_peer,
	.unpack_remote_key = tcp_unpack_remote_key,
	.release_remote_key = tcp_release_remote_key,
	.submit = tcp_submit,
	.cancel = tcp_cancel,
	.retry_prepare = tcp_retry_prepare,
	.progress = tcp_progress,
	.wait = tcp_wait,
	.drive = tcp_drive,
	.stats = tcp_stats,
};

static const struct te_plugin_desc tcp_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = TCP_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "TCP transport: pipelined, bounds-checked READ/WRITE over persistent lanes",
	.ops = &tcp_ops,
	TE_PLUGIN_OPTIONS(tcp_options),
};

TE_PLUGIN_DEFINE(&tcp_desc)
