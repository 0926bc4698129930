/* SPDX-License-Identifier: Apache-2.0 */
/* mdserver.c: start, stop and restart real metadata servers on free loopback ports. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "mdserver.h"

#define MDSERVER_READY_MS 20000

static const char *const kind_names[] = { "etcd", "redis-server", "te-metadata-server" };

/* A port nobody listens on now (bound then released; the server binds it right after). */
static unsigned free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	unsigned port;

	g_assert_cmpint(fd, >=, 0);
	g_assert_cmpint(bind(fd, (struct sockaddr *)&a, sizeof(a)), ==, 0);
	g_assert_cmpint(getsockname(fd, (struct sockaddr *)&a, &len), ==, 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

char *mdserver_http_program(void)
{
	const char *env = g_getenv("TE_METADATA_SERVER");
	const char *root = g_getenv("TE_BUILD_ROOT");
	char *p;

	if (env && *env)
		return g_strdup(env);
	if (!root)
		return NULL;
	p = g_build_filename(root, "tools", "te-metadata-server", NULL);
	if (g_file_test(p, G_FILE_TEST_IS_EXECUTABLE))
		return p;
	g_free(p);
	return NULL;
}

static char *program_of(enum mdserver_kind kind)
{
	switch (kind) {
	case MDSERVER_ETCD:
		return g_find_program_in_path("etcd");
	case MDSERVER_REDIS:
		return g_find_program_in_path("redis-server");
	case MDSERVER_HTTP:
		return mdserver_http_program();
	}
	return NULL;
}

bool mdserver_available(enum mdserver_kind kind)
{
	g_autofree char *p = program_of(kind);

	return p != NULL;
}

/* The last @max bytes of the server's log, for failure messages. */
static char *log_tail(const struct mdserver *s, size_t max)
{
	g_autofree char *text = NULL;
	gsize len = 0;

	if (!g_file_get_contents(s->log_path, &text, &len, NULL))
		return g_strdup("(no log)");
	return g_strdup(len > max ? text + len - max : text);
}

/* Whether 127.0.0.1:port accepts a connection. */
static bool port_open(unsigned port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (fd < 0)
		return false;
	ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* One request line on a fresh connection; the first bytes of the answer (g_free) or NULL. */
static char *ask(unsigned port, const char *request)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct timeval tv = { .tv_sec = 2 };
	char buf[512];
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return NULL;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    write(fd, request, strlen(request)) != (ssize_t)strlen(request)) {
		close(fd);
		return NULL;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	return g_strdup(buf);
}

/* Whether the server answers as a ready server of its kind. */
static bool ready(const struct mdserver *s)
{
	g_autofree char *r = NULL;

	if (!port_open(s->port))
		return false;
	switch (s->kind) {
	case MDSERVER_ETCD:
		/* The gateway serves /health once the member has a leader. */
		r = ask(s->port, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
		return r && strstr(r, "\"health\":\"true\"");
	case MDSERVER_REDIS:
		/* A password-protected server answers NOAUTH: it is up all the same. */
		r = ask(s->port, "PING\r\n");
		return r && (g_str_has_prefix(r, "+PONG") || strstr(r, "NOAUTH"));
	case MDSERVER_HTTP:
		return true;
	}
	return false;
}

/* In the child: die with the test (an aborted case must not leave its server running). */
static void child_setup(gpointer unused)
{
	(void)unused;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/*
 * Start the server on s->port and wait until it answers. @may_move: a server that exits
 * because its port (or etcd's peer port) was taken meanwhile returns false (free_port only
 * finds a port free at the time; parallel tests may bind it first); any other failure ends
 * the test.
 */
static bool spawn(struct mdserver *s, bool may_move)
{
	g_autoptr(GPtrArray) argv = g_ptr_array_new_with_free_func(g_free);
	g_autofree char *prog = program_of(s->kind);
	g_autoptr(GError) error = NULL;
	int64_t deadline;
	int fd;

	if (!prog)
		g_error("mdserver: %s is not installed", kind_names[s->kind]);
	g_ptr_array_add(argv, g_strdup(prog));
	switch (s->kind) {
	case MDSERVER_ETCD: {
		unsigned peer = free_port();

		g_ptr_array_add(argv, g_strdup("--name=te-test"));
		g_ptr_array_add(argv, g_strdup_printf("--data-dir=%s/etcd", s->dir));
		g_ptr_array_add(
			argv, g_strdup_printf("--listen-client-urls=http://127.0.0.1:%u", s->port));
		g_ptr_array_add(argv, g_strdup_printf("--advertise-client-urls=http://127.0.0.1:%u",
						      s->port));
		g_ptr_array_add(argv,
				g_strdup_printf("--listen-peer-urls=http://127.0.0.1:%u", peer));
		g_ptr_array_add(
			argv,
			g_strdup_printf("--initial-advertise-peer-urls=http://127.0.0.1:%u", peer));
		g_ptr_array_add(
			argv,
			g_strdup_printf("--initial-cluster=te-test=http://127.0.0.1:%u", peer));
		g_ptr_array_add(argv, g_strdup("--log-level=warn"));
		break;
	}
	case MDSERVER_REDIS:
		g_ptr_array_add(argv, g_strdup("--bind"));
		g_ptr_array_add(argv, g_strdup("127.0.0.1"));
		g_ptr_array_add(argv, g_strdup("--port"));
		g_ptr_array_add(argv, g_strdup_printf("%u", s->port));
		g_ptr_array_add(argv, g_strdup("--dir"));
		g_ptr_array_add(argv, g_strdup(s->dir));
		g_ptr_array_add(argv, g_strdup("--save"));
		g_ptr_array_add(argv, g_strdup(""));
		g_ptr_array_add(argv, g_strdup("--appendonly"));
		g_ptr_array_add(argv, g_strdup("no"));
		g_ptr_array_add(argv, g_strdup("--daemonize"));
		g_ptr_array_add(argv, g_strdup("no"));
		break;
	case MDSERVER_HTTP:
		g_ptr_array_add(argv, g_strdup("--listen"));
		g_ptr_array_add(argv, g_strdup_printf("127.0.0.1:%u", s->port));
		break;
	}
	for (char **x = s->extra; x && *x; x++)
		g_ptr_array_add(argv, g_strdup(*x));
	g_ptr_array_add(argv, NULL);

	fd = g_open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	g_assert_cmpint(fd, >=, 0);
	{
		int out = fd;

		if (!g_spawn_async_with_fds(s->dir, (char **)argv->pdata, NULL,
					    G_SPAWN_DO_NOT_REAP_CHILD, child_setup, NULL, &s->pid,
					    -1, out, out, &error))
			g_error("mdserver: cannot start %s: %s", prog, error->message);
	}
	close(fd);
	deadline = g_get_monotonic_time() + MDSERVER_READY_MS * 1000ll;
	while (!ready(s)) {
		int status;

		if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
			g_autofree char *tail = log_tail(s, 2000);
			g_autofree char *low = g_ascii_strdown(tail, -1);

			s->pid = 0;
			if (may_move && strstr(low, "address already in use")) {
				g_test_message("mdserver: %s: port %u taken meanwhile, moving",
					       kind_names[s->kind], s->port);
				return false;
			}
			g_error("mdserver: %s exited at start (status 0x%x); its log ends:\n%s",
				kind_names[s->kind], status, tail);
		}
		if (g_get_monotonic_time() > deadline) {
			g_autofree char *tail = log_tail(s, 2000);

			mdserver_stop(s, true);
			g_error("mdserver: %s on port %u not ready after %d ms; its log ends:\n%s",
				kind_names[s->kind], s->port, MDSERVER_READY_MS, tail);
		}
		g_usleep(20000);
	}
	return true;
}

struct mdserver *mdserver_start(enum mdserver_kind kind, const char *const *extra)
{
	struct mdserver *s = g_new0(struct mdserver, 1);
	g_autoptr(GError) error = NULL;

	s->kind = kind;
	s->dir = g_dir_make_tmp("te-mdserver-XXXXXX", &error);
	if (!s->dir)
		g_error("mdserver: temporary folder: %s", error->message);
	s->log_path = g_build_filename(s->dir, "server.log", NULL);
	s->extra = g_strdupv((char **)extra);
	for (int attempt = 0;; attempt++) {
		s->port = free_port();
		g_clear_pointer(&s->url, g_free);
		switch (kind) {
		case MDSERVER_ETCD:
			s->url = g_strdup_printf("http://127.0.0.1:%u", s->port);
			break;
		case MDSERVER_REDIS:
			s->url = g_strdup_printf("redis://127.0.0.1:%u", s->port);
			break;
		case MDSERVER_HTTP:
			s->url = g_strdup_printf("http://127.0.0.1:%u/metadata", s->port);
			break;
		}
		/* A fresh log per attempt: the next one's failure is read from its own. */
		g_unlink(s->log_path);
		if (spawn(s, attempt < 4))
			break;
	}
	return s;
}

struct mdserver *mdserver_shared(enum mdserver_kind kind)
{
	static const char *const envs[] = { "TE_TEST_ETCD", "TE_TEST_REDIS",
					    "TE_TEST_HTTP_METADATA" };
	const char *url = g_getenv(envs[kind]);
	struct mdserver *s;

	if (!url || !*url)
		return mdserver_start(kind, NULL);
	s = g_new0(struct mdserver, 1);
	s->kind = kind;
	s->url = g_strdup(url);
	s->shared = true;
	return s;
}

void mdserver_stop(struct mdserver *s, bool hard)
{
	int status;

	if (!s || s->shared || !s->pid)
		return;
	kill(s->pid, hard ? SIGKILL : SIGTERM);
	while (waitpid(s->pid, &status, 0) < 0 && errno == EINTR)
		;
	g_spawn_close_pid(s->pid);
	s->pid = 0;
}

void mdserver_restart(struct mdserver *s)
{
	g_assert(!s->shared);
	mdserver_stop(s, true);
	spawn(s, false);
}

/* rm -r of the data folder (only ours, made by g_dir_make_tmp). */
static void remove_tree(const char *path)
{
	GDir *d = g_dir_open(path, 0, NULL);
	const char *n;

	if (d) {
		while ((n = g_dir_read_name(d))) {
			g_autofree char *p = g_build_filename(path, n, NULL);

			if (g_file_test(p, G_FILE_TEST_IS_DIR) &&
			    !g_file_test(p, G_FILE_TEST_IS_SYMLINK))
				remove_tree(p);
			else
				g_unlink(p);
		}
		g_dir_close(d);
	}
	g_rmdir(path);
}

void mdserver_wipe(struct mdserver *s)
{
	GDir *d;
	const char *n;

	g_assert(!s->shared && !s->pid);
	d = g_dir_open(s->dir, 0, NULL);
	while (d && (n = g_dir_read_name(d))) {
		g_autofree char *p = g_build_filename(s->dir, n, NULL);

		if (strcmp(n, "server.log") == 0)
			continue;
		if (g_file_test(p, G_FILE_TEST_IS_DIR) && !g_file_test(p, G_FILE_TEST_IS_SYMLINK))
			remove_tree(p);
		else
			g_unlink(p);
	}
	if (d)
		g_dir_close(d);
}

void mdserver_free(struct mdserver *s)
{
	if (!s)
		return;
	mdserver_stop(s, false);
	if (s->dir)
		remove_tree(s->dir);
	g_free(s->dir);
	g_free(s->url);
	g_free(s->log_path);
	g_strfreev(s->extra);
	g_free(s);
}

unsigned mdserver_dead_port(void)
{
	return free_port();
}
