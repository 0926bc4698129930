/* SPDX-License-Identifier: Apache-2.0 */
/* te-metadata-server driven as a real process over HTTP with libcurl: contract, limits, TTL, persistence. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

/* A server this test started: its PID and the URL from its "listening on" line. */
struct srv {
	GPid pid;
	char *url; /* http://127.0.0.1:P/metadata */
	unsigned port;
	int out_fd;
};

/* One HTTP exchange. */
struct reply {
	long status;
	GByteArray *body;
	char *revision;	    /* X-TE-Revision, NULL when absent */
	char *content_type; /* Content-Type, NULL when absent */
};

static char *server_program(void)
{
	const char *env = g_getenv("TE_METADATA_SERVER");
	const char *root = g_getenv("TE_BUILD_ROOT");

	if (env && *env)
		return g_strdup(env);
	if (root && *root)
		return g_build_filename(root, "tools", "te-metadata-server", NULL);
	return g_strdup("te-metadata-server");
}

static bool server_missing(void)
{
	g_autofree char *prog = server_program();

	if (g_file_test(prog, G_FILE_TEST_IS_EXECUTABLE))
		return false;
	g_test_skip("te-metadata-server not built (needs libsoup-3.0); set TE_METADATA_SERVER");
	return true;
}

/* Read one line from @fd within @timeout_ms; NULL at EOF or timeout. */
static char *read_line(int fd, int timeout_ms)
{
	GString *line = g_string_new(NULL);
	gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		gint64 left_ms = (deadline - g_get_monotonic_time()) / 1000;
		char c;
		ssize_t n;

		if (left_ms <= 0 || poll(&p, 1, (int)left_ms) <= 0)
			break;
		n = read(fd, &c, 1);
		if (n <= 0)
			break;
		if (c == '\n')
			return g_string_free(line, FALSE);
		g_string_append_c(line, c);
	}
	g_string_free(line, TRUE);
	return NULL;
}

/* argv: the program, then @args (NULL-terminated), then more (NULL-terminated, may be NULL). */
static GPtrArray *make_argv(const char *const *args, const char *const *more)
{
	GPtrArray *argv = g_ptr_array_new_with_free_func(g_free);

	g_ptr_array_add(argv, server_program());
	for (; args && *args; args++)
		g_ptr_array_add(argv, g_strdup(*args));
	for (; more && *more; more++)
		g_ptr_array_add(argv, g_strdup(*more));
	g_ptr_array_add(argv, NULL);
	return argv;
}

/* Start on 127.0.0.1:0 with @extra options and wait for its one stdout line. */
static struct srv *srv_start(const char *const *extra)
{
	static const char *const listen[] = { "--listen", "127.0.0.1:0", NULL };
	g_autoptr(GPtrArray) argv = make_argv(listen, extra);
	g_autoptr(GError) err = NULL;
	g_autoptr(GRegex) re =
		g_regex_new("^listening on (http://127\\.0\\.0\\.1:([0-9]+)/\\S*)$", 0, 0, NULL);
	g_autoptr(GMatchInfo) mi = NULL;
	g_autofree char *line = NULL;
	g_autofree char *port = NULL;
	struct srv *s = g_new0(struct srv, 1);

	if (!g_spawn_async_with_pipes(NULL, (char **)argv->pdata, NULL, G_SPAWN_DO_NOT_REAP_CHILD,
				      NULL, NULL, &s->pid, NULL, &s->out_fd, NULL, &err))
		g_error("cannot start %s: %s", (char *)argv->pdata[0], err->message);
	line = read_line(s->out_fd, 20000);
	if (!line || !g_regex_match(re, line, 0, &mi))
		g_error("te-metadata-server printed \"%s\", not \"listening on http://...\"",
			line ? line : "(nothing)");
	s->url = g_match_info_fetch(mi, 1);
	port = g_match_info_fetch(mi, 2);
	s->port = (unsigned)atoi(port);
	return s;
}

/* Send @sig and reap; the wait status, or -1 when it did not exit within 10 s. */
static int srv_stop(struct srv *s, int sig)
{
	int status = -1;

	if (!s->pid)
		return 0;
	kill(s->pid, sig);
	for (int i = 0; i < 1000; i++) {
		pid_t r = waitpid(s->pid, &status, WNOHANG);

		if (r == s->pid)
			break;
		if (r < 0 && errno != EINTR) {
			status = -1;
			break;
		}
		g_usleep(10000);
		status = -1;
	}
	if (status == -1) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
	}
	g_spawn_close_pid(s->pid);
	s->pid = 0;
	return status;
}

static void srv_free(struct srv *s)
{
	if (!s)
		return;
	if (s->pid)
		srv_stop(s, SIGKILL);
	close(s->out_fd);
	g_free(s->url);
	g_free(s);
}

static void reply_clear(struct reply *r)
{
	if (r->body)
		g_byte_array_unref(r->body);
	g_free(r->revision);
	g_free(r->content_type);
	memset(r, 0, sizeof(*r));
}

static size_t on_body(char *data, size_t size, size_t n, void *user)
{
	g_byte_array_append(user, (const guint8 *)data, (guint)(size * n));
	return size * n;
}

static size_t on_header(char *data, size_t size, size_t n, void *user)
{
	struct reply *r = user;
	g_autofree char *line = g_strndup(data, size * n);
	char *colon = strchr(line, ':');

	if (colon) {
		*colon = '\0';
		if (g_ascii_strcasecmp(line, "X-TE-Revision") == 0) {
			g_free(r->revision);
			r->revision = g_strstrip(g_strdup(colon + 1));
		} else if (g_ascii_strcasecmp(line, "Content-Type") == 0) {
			g_free(r->content_type);
			r->content_type = g_strstrip(g_strdup(colon + 1));
		}
	}
	return size * n;
}

struct upload {
	const guint8 *data;
	size_t len, off;
};

static size_t on_read(char *buf, size_t size, size_t n, void *user)
{
	struct upload *u = user;
	size_t k = MIN(size * n, u->len - u->off);

	memcpy(buf, u->data + u->off, k);
	u->off += k;
	return k;
}

/*
 * @method @url with @body (NULL: none). @chunked: no Content-Length. @type: a Content-Type
 * (NULL: none). Fills *r (reply_clear it), returns the status (0 when the exchange failed).
 */
static long http_full(const char *method, const char *url, const void *body, size_t len,
		      bool chunked, const char *type, struct reply *r)
{
	CURL *c = curl_easy_init();
	struct curl_slist *hdrs = NULL;
	struct upload u = { .data = body, .len = len };
	g_autofree char *type_hdr = NULL;
	CURLcode rc;

	memset(r, 0, sizeof(*r));
	r->body = g_byte_array_new();
	g_assert_nonnull(c);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r->body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	if (body) {
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &u);
		curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE,
				 chunked ? (curl_off_t)-1 : (curl_off_t)len);
	}
	if (type) {
		type_hdr = g_strdup_printf("Content-Type: %s", type);
		hdrs = curl_slist_append(hdrs, type_hdr);
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	rc = curl_easy_perform(c);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	else
		g_test_message("%s %s: %s", method, url, curl_easy_strerror(rc));
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(c);
	return r->status;
}

/* The URL of @key under the server's base, URL-encoded. */
static char *key_url(const struct srv *s, const char *key)
{
	char *esc = curl_easy_escape(NULL, key, 0);
	char *url = g_strdup_printf("%s?key=%s", s->url, esc);

	curl_free(esc);
	return url;
}

static long put(const struct srv *s, const char *key, const void *v, size_t len)
{
	g_autofree char *url = key_url(s, key);
	struct reply r;
	long st = http_full("PUT", url, v ? v : "", len, false, NULL, &r);

	reply_clear(&r);
	return st;
}

static long del(const struct srv *s, const char *key)
{
	g_autofree char *url = key_url(s, key);
	struct reply r;
	long st = http_full("DELETE", url, NULL, 0, false, NULL, &r);

	reply_clear(&r);
	return st;
}

/* GET @key; fills *r. */
static long get(const struct srv *s, const char *key, struct reply *r)
{
	g_autofree char *url = key_url(s, key);

	return http_full("GET", url, NULL, 0, false, NULL, r);
}

static void assert_value(const struct srv *s, const char *key, const void *v, size_t len)
{
	struct reply r;

	g_assert_cmpint(get(s, key, &r), ==, 200);
	g_assert_cmpmem(r.body->data, r.body->len, v, len);
	reply_clear(&r);
}

static void assert_absent(const struct srv *s, const char *key)
{
	struct reply r;

	g_assert_cmpint(get(s, key, &r), ==, 404);
	reply_clear(&r);
}

static guint64 revision_of(const struct reply *r)
{
	g_assert_nonnull(r->revision);
	return g_ascii_strtoull(r->revision, NULL, 10);
}

static bool body_has(const struct reply *r, const char *needle)
{
	g_autofree char *text = g_strndup((const char *)r->body->data, r->body->len);

	return strstr(text, needle) != NULL;
}

/* ---- cases ------------------------------------------------------------------------------ */

static void test_listen_line(void)
{
	static const char *const path[] = { "--path", "/kv/", NULL };
	struct srv *s;
	struct reply r;

	if (server_missing())
		return;
	s = srv_start(NULL);
	/* Port 0 asked for a free one: the line names the real one, which answers. */
	g_assert_cmpuint(s->port, >, 0);
	g_assert_true(g_str_has_suffix(s->url, "/metadata"));
	assert_absent(s, "nothing");
	g_assert_cmpint(srv_stop(s, SIGINT), ==, 0);
	srv_free(s);

	/* A trailing slash of --path is dropped; both spellings are served. */
	s = srv_start(path);
	g_assert_true(g_str_has_suffix(s->url, "/kv"));
	g_assert_cmpint(put(s, "a", "1", 1), ==, 200);
	{
		g_autofree char *url = g_strdup_printf("%s/?key=a", s->url);

		g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 200);
		reply_clear(&r);
	}
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_put_get_delete(void)
{
	struct srv *s;
	struct reply r;
	guint64 rev0, rev1;

	if (server_missing())
		return;
	s = srv_start(NULL);
	g_assert_cmpint(get(s, "engine/a", &r), ==, 404);
	rev0 = revision_of(&r);
	reply_clear(&r);

	g_assert_cmpint(put(s, "engine/a", "descriptor-1", 12), ==, 200);
	g_assert_cmpint(get(s, "engine/a", &r), ==, 200);
	g_assert_cmpmem(r.body->data, r.body->len, "descriptor-1", 12);
	g_assert_cmpstr(r.content_type, ==, "application/octet-stream");
	rev1 = revision_of(&r);
	g_assert_cmpuint(rev1, ==, rev0 + 1);
	reply_clear(&r);

	/* Republishing the same bytes is no change; new bytes are. */
	g_assert_cmpint(put(s, "engine/a", "descriptor-1", 12), ==, 200);
	g_assert_cmpint(get(s, "engine/a", &r), ==, 200);
	g_assert_cmpuint(revision_of(&r), ==, rev1);
	reply_clear(&r);
	g_assert_cmpint(put(s, "engine/a", "descriptor-2!", 13), ==, 200);
	assert_value(s, "engine/a", "descriptor-2!", 13);
	g_assert_cmpint(get(s, "engine/a", &r), ==, 200);
	g_assert_cmpuint(revision_of(&r), ==, rev1 + 1);
	reply_clear(&r);

	/* An empty value is a value. */
	g_assert_cmpint(put(s, "empty", "", 0), ==, 200);
	assert_value(s, "empty", "", 0);

	g_assert_cmpint(del(s, "engine/a"), ==, 200);
	assert_absent(s, "engine/a");
	g_assert_cmpint(del(s, "engine/a"), ==, 404);
	g_assert_cmpint(del(s, "never"), ==, 404);
	g_assert_cmpint(get(s, "empty", &r), ==, 200);
	g_assert_cmpuint(revision_of(&r), ==, rev1 + 3);
	reply_clear(&r);

	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_binary(void)
{
	struct srv *s;
	guint8 all[512];
	g_autofree guint8 *big = g_malloc(1 << 20);
	g_autoptr(GRand) rng = g_rand_new_with_seed(14);

	if (server_missing())
		return;
	for (size_t i = 0; i < sizeof(all); i++)
		all[i] = (guint8)(i * 7 + (i >> 8));
	for (size_t i = 0; i < (1 << 20); i += 4) {
		guint32 v = g_rand_int(rng);

		memcpy(big + i, &v, 4);
	}
	s = srv_start(NULL);
	g_assert_cmpint(put(s, "bin", all, sizeof(all)), ==, 200);
	g_assert_cmpint(put(s, "nul", "\0\0\0", 3), ==, 200);
	g_assert_cmpint(put(s, "big", big, 1 << 20), ==, 200);
	assert_value(s, "bin", all, sizeof(all));
	assert_value(s, "nul", "\0\0\0", 3);
	assert_value(s, "big", big, 1 << 20);
	/* Chunked uploads are collected the same way. */
	{
		g_autofree char *url = key_url(s, "chunked");
		struct reply r;

		g_assert_cmpint(http_full("PUT", url, big, 1 << 20, true, NULL, &r), ==, 200);
		reply_clear(&r);
		assert_value(s, "chunked", big, 1 << 20);
	}
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_keys(void)
{
	static const char *const keys[] = {
		"a b", "a+b",	"x/y?z&w=1#f", "mooncake/ram/segment-0", "ünïcödé", "%41",
		"=",   "key=v", NULL,
	};
	struct srv *s;
	g_autofree char *longest = g_strnfill(4096, 'k');
	g_autofree char *too_long = g_strnfill(4097, 'k');
	struct reply r;

	if (server_missing())
		return;
	s = srv_start(NULL);
	for (int i = 0; keys[i]; i++)
		g_assert_cmpint(put(s, keys[i], keys[i], strlen(keys[i])), ==, 200);
	/* Each key is its own entry: none decoded into another. */
	for (int i = 0; keys[i]; i++)
		assert_value(s, keys[i], keys[i], strlen(keys[i]));
	g_assert_cmpint(put(s, longest, "L", 1), ==, 200);
	assert_value(s, longest, "L", 1);
	g_assert_cmpint(put(s, too_long, "L", 1), ==, 400);

	/* No key, an empty key, a NUL byte, bad escapes: 400 with a text that says why. */
	g_assert_cmpint(http_full("GET", s->url, NULL, 0, false, NULL, &r), ==, 400);
	g_assert_true(body_has(&r, "missing key"));
	g_assert_nonnull(r.revision);
	reply_clear(&r);
	{
		g_autofree char *url = g_strdup_printf("%s?key=", s->url);

		g_assert_cmpint(http_full("PUT", url, "x", 1, false, NULL, &r), ==, 400);
		g_assert_true(body_has(&r, "missing key"));
		reply_clear(&r);
	}
	{
		g_autofree char *url = g_strdup_printf("%s?other=1", s->url);

		g_assert_cmpint(http_full("DELETE", url, NULL, 0, false, NULL, &r), ==, 400);
		reply_clear(&r);
	}
	{
		g_autofree char *url = g_strdup_printf("%s?key=a%%00b", s->url);

		g_assert_cmpint(http_full("PUT", url, "x", 1, false, NULL, &r), ==, 400);
		g_assert_true(body_has(&r, "malformed query"));
		reply_clear(&r);
		/* "a" was not written by truncation. */
		assert_absent(s, "a");
	}
	{
		g_autofree char *url = g_strdup_printf("%s?key=%%zz", s->url);

		g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 400);
		reply_clear(&r);
	}
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_errors(void)
{
	static const char *const small[] = { "--max-value", "1000", NULL };
	static const char *const methods[] = { "POST", "PATCH", "HEAD", "OPTIONS", NULL };
	g_autofree char *exact = g_malloc0(1000);
	g_autofree char *over = g_malloc0(1001);
	g_autofree char *huge = g_malloc0(8 << 20);
	g_autofree char *url = NULL;
	g_autofree char *other = NULL;
	struct srv *s;
	struct reply r;

	if (server_missing())
		return;
	s = srv_start(small);
	url = key_url(s, "k");

	for (int i = 0; methods[i]; i++) {
		g_assert_cmpint(http_full(methods[i], url, NULL, 0, false, NULL, &r), ==, 405);
		reply_clear(&r);
	}
	g_assert_cmpint(http_full("POST", url, "x", 1, false, NULL, &r), ==, 405);
	g_assert_true(body_has(&r, "GET, PUT or DELETE"));
	reply_clear(&r);

	/* Another path: 404 with a text naming the served one. */
	other = g_strdup_printf("http://127.0.0.1:%u/other?key=k", s->port);
	g_assert_cmpint(http_full("GET", other, NULL, 0, false, NULL, &r), ==, 404);
	g_assert_true(body_has(&r, "/metadata"));
	g_assert_nonnull(r.revision);
	reply_clear(&r);
	g_assert_cmpint(http_full("PUT", other, "x", 1, false, NULL, &r), ==, 404);
	reply_clear(&r);

	/* --max-value: the limit fits, one more byte does not (with or without a length). */
	g_assert_cmpint(put(s, "k", exact, 1000), ==, 200);
	g_assert_cmpint(http_full("PUT", url, over, 1001, false, NULL, &r), ==, 413);
	g_assert_true(body_has(&r, "--max-value 1000"));
	reply_clear(&r);
	g_assert_cmpint(http_full("PUT", url, over, 1001, true, NULL, &r), ==, 413);
	reply_clear(&r);
	g_assert_cmpint(http_full("PUT", url, huge, 8 << 20, false, NULL, &r), ==, 413);
	reply_clear(&r);
	g_assert_cmpint(http_full("PUT", url, huge, 8 << 20, true, NULL, &r), ==, 413);
	reply_clear(&r);
	/* The old value stayed, and the server still serves. */
	assert_value(s, "k", exact, 1000);

	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_content_type(void)
{
	struct srv *s;
	struct reply r;
	g_autofree char *url = NULL;

	if (server_missing())
		return;
	s = srv_start(NULL);
	url = key_url(s, "j");
	g_assert_cmpint(http_full("PUT", url, "{}", 2, false, "application/json", &r), ==, 200);
	reply_clear(&r);
	g_assert_cmpint(get(s, "j", &r), ==, 200);
	g_assert_cmpstr(r.content_type, ==, "application/json");
	reply_clear(&r);
	/* curl -d's default type is not kept. */
	g_assert_cmpint(
		http_full("PUT", url, "{}", 2, false, "application/x-www-form-urlencoded", &r), ==,
		200);
	reply_clear(&r);
	g_assert_cmpint(get(s, "j", &r), ==, 200);
	g_assert_cmpstr(r.content_type, ==, "application/octet-stream");
	reply_clear(&r);
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_max_keys(void)
{
	static const char *const two[] = { "--max-keys", "2", NULL };
	struct srv *s;
	struct reply r;
	g_autofree char *url = NULL;

	if (server_missing())
		return;
	s = srv_start(two);
	g_assert_cmpint(put(s, "a", "1", 1), ==, 200);
	g_assert_cmpint(put(s, "b", "2", 1), ==, 200);
	url = key_url(s, "c");
	g_assert_cmpint(http_full("PUT", url, "3", 1, false, NULL, &r), ==, 507);
	g_assert_true(body_has(&r, "--max-keys 2"));
	reply_clear(&r);
	/* Replacing stays possible; a delete makes room. */
	g_assert_cmpint(put(s, "a", "11", 2), ==, 200);
	g_assert_cmpint(del(s, "b"), ==, 200);
	g_assert_cmpint(put(s, "c", "3", 1), ==, 200);
	assert_value(s, "a", "11", 2);
	assert_value(s, "c", "3", 1);
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_ttl(void)
{
	static const char *const ttl[] = { "--ttl-s", "1", NULL };
	struct srv *s;
	struct reply r;
	guint64 rev;

	if (server_missing())
		return;
	s = srv_start(ttl);
	g_assert_cmpint(put(s, "dead", "d", 1), ==, 200);
	g_assert_cmpint(put(s, "alive", "a", 1), ==, 200);
	/* "alive" is republished every ttl/3, as engines do; "dead" is not. */
	for (int i = 0; i < 8; i++) {
		g_usleep(300 * 1000);
		g_assert_cmpint(put(s, "alive", "a", 1), ==, 200);
	}
	assert_absent(s, "dead");
	assert_value(s, "alive", "a", 1);
	/* Expiry is a change: the revision moved past the two PUTs. */
	g_assert_cmpint(get(s, "alive", &r), ==, 200);
	rev = revision_of(&r);
	g_assert_cmpuint(rev, ==, 3);
	reply_clear(&r);
	/* Gone from listings too once it expired. */
	{
		g_autofree char *url = g_strdup_printf("%s?prefix=", s->url);

		g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 200);
		g_assert_false(body_has(&r, "dead"));
		g_assert_true(body_has(&r, "alive"));
		reply_clear(&r);
	}
	g_usleep(2000 * 1000);
	assert_absent(s, "alive");
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

static void test_persist(void)
{
	g_autofree char *dir = g_dir_make_tmp("te-mds-XXXXXX", NULL);
	g_autofree char *file = g_build_filename(dir, "store.json", NULL);
	const char *const args[] = { "--persist", file, NULL };
	guint8 bin[256];
	struct srv *s;
	struct reply r;
	guint64 rev;

	if (server_missing())
		return;
	for (int i = 0; i < 256; i++)
		bin[i] = (guint8)i;
	s = srv_start(args);
	/* Created at start, so a bad place shows at once. */
	g_assert_true(g_file_test(file, G_FILE_TEST_IS_REGULAR));
	g_assert_cmpint(put(s, "bin", bin, sizeof(bin)), ==, 200);
	g_assert_cmpint(put(s, "text", "hello", 5), ==, 200);
	g_assert_cmpint(put(s, "gone", "x", 1), ==, 200);
	g_assert_cmpint(del(s, "gone"), ==, 200);
	{
		g_autofree char *url = key_url(s, "json");

		g_assert_cmpint(http_full("PUT", url, "[1]", 3, false, "application/json", &r), ==,
				200);
		reply_clear(&r);
	}
	g_assert_cmpint(get(s, "text", &r), ==, 200);
	rev = revision_of(&r);
	reply_clear(&r);
	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);

	s = srv_start(args);
	assert_value(s, "bin", bin, sizeof(bin));
	assert_value(s, "text", "hello", 5);
	assert_absent(s, "gone");
	g_assert_cmpint(get(s, "json", &r), ==, 200);
	g_assert_cmpstr(r.content_type, ==, "application/json");
	/* The revision continues where it was: watchers never see it go back. */
	g_assert_cmpuint(revision_of(&r), ==, rev);
	reply_clear(&r);

	/* Written within about a second of a change, without an exit: SIGKILL loses nothing. */
	g_assert_cmpint(put(s, "late", "L", 1), ==, 200);
	g_usleep(1600 * 1000);
	srv_stop(s, SIGKILL);
	srv_free(s);
	s = srv_start(args);
	assert_value(s, "late", "L", 1);
	assert_value(s, "text", "hello", 5);
	g_assert_cmpint(srv_stop(s, SIGINT), ==, 0);
	srv_free(s);

	g_unlink(file);
	g_rmdir(dir);
}

/* Run with @args to its exit; the wait status and its stderr. */
static int run_sync(const char *const *args, char **err_out)
{
	g_autoptr(GPtrArray) argv = make_argv(args, NULL);
	g_autoptr(GError) err = NULL;
	int status = -1;

	if (!g_spawn_sync(NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, NULL,
			  err_out, &status, &err))
		g_error("cannot run %s: %s", (char *)argv->pdata[0], err->message);
	return status;
}

static void test_persist_corrupt(void)
{
	static const char *const bad[] = {
		"{\"format\": \"te-metadata-server/1\", \"revision\": 1, \"entries\": {",
		"[]",
		"{\"format\": \"something-else\", \"revision\": 1, \"entries\": {}}",
		"{\"format\": \"te-metadata-server/1\", \"revision\": 1, \"entries\": {\"k\": \"***\"}}",
		"{\"format\": \"te-metadata-server/1\", \"revision\": 1, \"entries\": {\"k\": 5}}",
		"{\"format\": \"te-metadata-server/1\", \"revision\": -1, \"entries\": {}}",
		"{\"format\": \"te-metadata-server/1\", \"revision\": 1}",
		"\x01\x02\xff garbage",
		NULL,
	};
	g_autofree char *dir = g_dir_make_tmp("te-mds-XXXXXX", NULL);
	g_autofree char *file = g_build_filename(dir, "store.json", NULL);
	g_autofree char *nodir = g_build_filename(dir, "missing", "store.json", NULL);
	const char *const args[] = { "--listen", "127.0.0.1:0", "--persist", file, NULL };
	const char *const args_nodir[] = { "--listen", "127.0.0.1:0", "--persist", nodir, NULL };

	if (server_missing())
		return;
	for (int i = 0; bad[i]; i++) {
		g_autofree char *err = NULL;
		int status;

		g_assert_true(g_file_set_contents(file, bad[i], -1, NULL));
		status = run_sync(args, &err);
		g_test_message("case %d: %s", i, err);
		g_assert_true(WIFEXITED(status));
		g_assert_cmpint(WEXITSTATUS(status), ==, 1);
		g_assert_nonnull(strstr(err, file));
	}
	{
		g_autofree char *err = NULL;
		int status = run_sync(args_nodir, &err);

		g_assert_true(WIFEXITED(status));
		g_assert_cmpint(WEXITSTATUS(status), ==, 1);
		g_assert_nonnull(strstr(err, nodir));
	}
	/* Bad options: usage error 2 with a text. */
	{
		static const char *const bad_listen[] = { "--listen", "nowhere", NULL };
		g_autofree char *err = NULL;
		int status = run_sync(bad_listen, &err);

		g_assert_true(WIFEXITED(status));
		g_assert_cmpint(WEXITSTATUS(status), ==, 2);
		g_assert_nonnull(strstr(err, "HOST:PORT"));
	}
	g_unlink(file);
	g_rmdir(dir);
}

static void test_prefix(void)
{
	struct srv *s;
	struct reply r;
	g_autoptr(JsonParser) p = json_parser_new();
	JsonObject *o;
	g_autofree char *url = NULL;
	g_autofree guchar *v = NULL;
	gsize n = 0;

	if (server_missing())
		return;
	s = srv_start(NULL);
	g_assert_cmpint(put(s, "mooncake/a", "A", 1), ==, 200);
	g_assert_cmpint(put(s, "mooncake/b", "\0\xff", 2), ==, 200);
	g_assert_cmpint(put(s, "other/c", "C", 1), ==, 200);

	url = g_strdup_printf("%s?prefix=mooncake%%2F", s->url);
	g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 200);
	g_assert_cmpstr(r.content_type, ==, "application/json");
	g_assert_nonnull(r.revision);
	g_assert_true(json_parser_load_from_data(p, (const char *)r.body->data, r.body->len, NULL));
	o = json_node_get_object(json_parser_get_root(p));
	g_assert_cmpuint(json_object_get_size(o), ==, 2);
	g_assert_cmpstr(json_object_get_string_member(o, "mooncake/a"), ==, "QQ==");
	v = g_base64_decode(json_object_get_string_member(o, "mooncake/b"), &n);
	g_assert_cmpmem(v, n, "\0\xff", 2);
	reply_clear(&r);
	g_clear_pointer(&url, g_free);

	/* An empty prefix lists everything; no match is an empty object. */
	url = g_strdup_printf("%s?prefix=", s->url);
	g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 200);
	g_assert_true(body_has(&r, "other/c"));
	reply_clear(&r);
	g_clear_pointer(&url, g_free);
	url = g_strdup_printf("%s?prefix=zzz", s->url);
	g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 200);
	g_assert_cmpmem(r.body->data, r.body->len, "{}", 2);
	reply_clear(&r);
	g_clear_pointer(&url, g_free);

	/* Not with key=, not for PUT. */
	url = g_strdup_printf("%s?prefix=a&key=b", s->url);
	g_assert_cmpint(http_full("GET", url, NULL, 0, false, NULL, &r), ==, 400);
	reply_clear(&r);
	g_assert_cmpint(http_full("PUT", url, "x", 1, false, NULL, &r), ==, 400);
	reply_clear(&r);

	g_assert_cmpint(srv_stop(s, SIGTERM), ==, 0);
	srv_free(s);
}

int main(int argc, char **argv)
{
	int rc;

	g_test_init(&argc, &argv, NULL);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	g_test_add_func("/metadata-server/listen-line", test_listen_line);
	g_test_add_func("/metadata-server/put-get-delete", test_put_get_delete);
	g_test_add_func("/metadata-server/binary", test_binary);
	g_test_add_func("/metadata-server/keys", test_keys);
	g_test_add_func("/metadata-server/errors", test_errors);
	g_test_add_func("/metadata-server/content-type", test_content_type);
	g_test_add_func("/metadata-server/max-keys", test_max_keys);
	g_test_add_func("/metadata-server/ttl", test_ttl);
	g_test_add_func("/metadata-server/persist", test_persist);
	g_test_add_func("/metadata-server/persist-corrupt", test_persist_corrupt);
	g_test_add_func("/metadata-server/prefix", test_prefix);
	rc = g_test_run();
	curl_global_cleanup();
	return rc;
}
