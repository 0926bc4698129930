/* SPDX-License-Identifier: Apache-2.0 */
/* control_test.c: the shared secret file's checks, and notifies queued for sending. */
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/control.h"
#include "core/engine.h"
#include "fake.h"
#include "itest.h"

static char *write_secret(const char *text, int mode)
{
	GError *err = NULL;
	char *dir = g_dir_make_tmp("te-core-XXXXXX", &err);
	char *path;

	g_assert_no_error(err);
	path = g_build_filename(dir, "secret", NULL);
	g_assert_true(g_file_set_contents(path, text, -1, &err));
	g_assert_no_error(err);
	g_assert_cmpint(g_chmod(path, mode), ==, 0);
	g_free(dir);
	return path;
}

static void remove_secret(char *path)
{
	g_autofree char *dir = g_path_get_dirname(path);

	g_unlink(path);
	g_rmdir(dir);
	g_free(path);
}

static void test_secret(void)
{
	char *path = write_secret("0123456789abcdef0123456789abcdef\n", 0600);
	char *secret = NULL, *err = NULL;
	size_t len = 0;

	g_assert_cmpint(control_secret_load(path, &secret, &len, &err), ==, TE_OK);
	g_assert_cmpuint(len, ==, 32); /* the final newline dropped */
	g_assert_cmpmem(secret, len, "0123456789abcdef0123456789abcdef", 32);
	explicit_bzero(secret, len);
	g_free(secret);
	secret = NULL;
	/* Readable by others: refused, naming the file; outputs untouched. */
	g_assert_cmpint(g_chmod(path, 0644), ==, 0);
	g_assert_cmpint(control_secret_load(path, &secret, &len, &err), ==, TE_ERR_CONFIG);
	g_assert_null(secret);
	g_assert_nonnull(strstr(err, path));
	g_free(err);
	remove_secret(path);
}

/* A notify queued to an address nobody serves is dropped by the worker, not kept. */
static void test_notify_queue(void)
{
	struct te_engine *te = itest_engine1("A", "loopback", NULL, NULL);
	struct engine *e = fake_engine(te);
	GBytes *msg = g_bytes_new_static("hi", 2);

	control_queue_notify(e, "127.0.0.1:1", msg);
	for (int i = 0; i < 500; i++) {
		guint n;

		g_mutex_lock(&e->notify_lock);
		n = e->outbox ? g_queue_get_length(e->outbox) : 0;
		g_mutex_unlock(&e->notify_lock);
		if (!n)
			break;
		g_usleep(10000);
	}
	g_mutex_lock(&e->notify_lock);
	g_assert_cmpuint(e->outbox ? g_queue_get_length(e->outbox) : 0, ==, 0);
	g_mutex_unlock(&e->notify_lock);
	g_bytes_unref(msg);
	te_engine_free(te);
}

/*
 * A notify queued just before the application frees the engine is still delivered: freeing
 * sends what is queued (te_batch_wait may return before the completing thread queued it).
 */
static void test_notify_at_free(void)
{
	for (int round = 0; round < 5; round++) {
		struct itest_pair p;
		GBytes *msg = g_bytes_new_static("last words", 10);
		struct te_notify got;
		size_t n = 0;

		itest_pair_new(&p, "loopback", NULL, NULL);
		control_queue_notify(fake_engine(p.a), control_address(fake_engine(p.b)), msg);
		te_engine_free(p.a);
		p.a = NULL;
		for (int i = 0; i < 500 && !n; i++) {
			g_assert_cmpint(te_notify_recv(p.b, &got, 1, &n), ==, TE_OK);
			if (!n)
				g_usleep(10000);
		}
		g_assert_cmpuint(n, ==, 1);
		g_assert_cmpmem(got.msg, got.len, "last words", 10);
		g_bytes_unref(msg);
		te_engine_free(p.b);
	}
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/control/secret", test_secret);
	g_test_add_func("/control/notify-queue", test_notify_queue);
	g_test_add_func("/control/notify-at-free", test_notify_at_free);
	return g_test_run();
}
