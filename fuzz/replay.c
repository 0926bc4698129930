/* SPDX-License-Identifier: Apache-2.0 */
/* replay.c: feed every file of the given directories to a fuzz target, reporting TAP. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* g_ptr_array_sort passes pointers to the elements. */
static int cmp_path(gconstpointer a, gconstpointer b)
{
	return g_strcmp0(*(char *const *)a, *(char *const *)b);
}

/* Collect regular files of @dir (or @dir itself if it is a file), sorted for stable output. */
static void collect(const char *dir, GPtrArray *files)
{
	g_autoptr(GError) gerr = NULL;
	g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
	GDir *d;
	const char *name;

	if (g_file_test(dir, G_FILE_TEST_IS_REGULAR)) {
		g_ptr_array_add(files, g_strdup(dir));
		return;
	}
	d = g_dir_open(dir, 0, &gerr);
	if (!d) {
		printf("Bail out! %s\n", gerr->message);
		exit(1);
	}
	while ((name = g_dir_read_name(d)))
		g_ptr_array_add(names, g_build_filename(dir, name, NULL));
	g_dir_close(d);
	g_ptr_array_sort(names, cmp_path);
	for (guint i = 0; i < names->len; i++)
		if (g_file_test(names->pdata[i], G_FILE_TEST_IS_REGULAR))
			g_ptr_array_add(files, g_strdup(names->pdata[i]));
}

int main(int argc, char **argv)
{
	g_autoptr(GPtrArray) files = g_ptr_array_new_with_free_func(g_free);
	int failed = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR|FILE...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++)
		collect(argv[i], files);
	printf("TAP version 13\n1..%u\n", files->len);
	for (guint i = 0; i < files->len; i++) {
		const char *path = files->pdata[i];
		g_autoptr(GError) gerr = NULL;
		g_autofree char *buf = NULL;
		g_autofree uint8_t *exact = NULL;
		gsize len = 0;

		if (!g_file_get_contents(path, &buf, &len, &gerr)) {
			printf("not ok %u - %s # %s\n", i + 1, path, gerr->message);
			failed++;
			continue;
		}
		/*
		 * An exact-size copy without the NUL g_file_get_contents adds, so that
		 * AddressSanitizer sees a read past the end as libFuzzer would. A crash
		 * aborts the process; the "#" line before it names the input.
		 */
		exact = g_malloc(len ? len : 1);
		memcpy(exact, buf, len);
		printf("# %s\n", path);
		fflush(stdout);
		LLVMFuzzerTestOneInput(exact, len);
		printf("ok %u - %s\n", i + 1, path);
	}
	return failed ? 1 : 0;
}
