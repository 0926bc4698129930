/* SPDX-License-Identifier: Apache-2.0 */
/*
 * two_transports.c: one engine, two transports in priority order. Both processes map one
 * shared memory window (a file standing in for a CXL device) and list `cxl` first and `tcp`
 * second. A request into the target's window memory goes through the window (a CPU copy,
 * nothing crosses a socket); a request into its ordinary memory cannot, so te takes tcp.
 * Each task reports the transport that carried it.
 */
#include <fcntl.h>
#include <sys/mman.h>

#include "example_common.h"

#define WINDOW (8u << 20)
#define LEN 65536

static char window_path[128];
static char yaml[1024];

static int serve(int report_fd, int parent_fd)
{
	static char plain[LEN];
	struct te_engine *e;
	int fd = open(window_path, O_RDWR);
	char *win =
		fd < 0 ? MAP_FAILED : mmap(NULL, WINDOW, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (win == MAP_FAILED) {
		perror("target: window");
		return 1;
	}
	CHECK(te_engine_new_from_string(yaml, strlen(yaml), &e));
	/* Window memory (location cxl:0) and ordinary memory, both open to peers. */
	CHECK(te_mem_register(e, win + WINDOW / 2, LEN, "cxl:0", TE_MEM_REMOTE));
	CHECK(te_mem_register(e, plain, sizeof(plain), "cpu", TE_MEM_REMOTE));
	example_report(report_fd, e, (uintptr_t)(win + WINDOW / 2), (uintptr_t)plain);
	example_wait_parent(parent_fd);
	te_engine_free(e);
	munmap(win, WINDOW);
	close(fd);
	return 0;
}

int main(void)
{
	static char src[2][LEN], back[2][LEN];
	struct example_target t;
	struct te_engine *e;
	te_segment_id seg;
	int fd, rc;

	snprintf(window_path, sizeof(window_path), "/dev/shm/te-example-window-%d", (int)getpid());
	fd = open(window_path, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || ftruncate(fd, WINDOW) != 0) {
		perror(window_path);
		return 1;
	}
	close(fd);
	snprintf(yaml, sizeof(yaml),
		 "transports:\n"
		 "  - name: cxl\n"
		 "    required: true\n"
		 "    options: {device: \"%s\", window_id: example-window, coherent: true}\n"
		 "  - name: tcp\n"
		 "    required: true\n",
		 window_path);
	example_target_start(&t, serve);
	CHECK(te_engine_new_from_string(yaml, strlen(yaml), &e));
	CHECK(te_mem_register(e, src, sizeof(src), "cpu", TE_MEM_LOCAL));
	CHECK(te_mem_register(e, back, sizeof(back), "cpu", TE_MEM_LOCAL));
	CHECK(te_segment_open(e, t.segment, &seg));
	memset(src[0], 'w', LEN); /* into the window */
	memset(src[1], 'p', LEN); /* into plain memory */

	struct te_request w[2] = { { TE_OP_WRITE, seg, src[0], t.addr[0], LEN },
				   { TE_OP_WRITE, seg, src[1], t.addr[1], LEN } };
	struct te_request r[2] = { { TE_OP_READ, seg, back[0], t.addr[0], LEN },
				   { TE_OP_READ, seg, back[1], t.addr[1], LEN } };

	example_run(e, w, 2, "write");
	example_run(e, r, 2, "read");
	rc = memcmp(src, back, sizeof(src)) != 0;
	if (rc)
		fprintf(stderr, "read back differs from what was written\n");
	CHECK(te_segment_close(e, seg));
	te_engine_free(e);
	rc |= example_target_stop(&t);
	unlink(window_path);
	return rc;
}
