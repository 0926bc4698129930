/* SPDX-License-Identifier: Apache-2.0 */
/*
 * write_read.c: the smallest complete te program. A target process registers a buffer that
 * peers may read and write; the initiator WRITEs a message into it, READs it back and
 * compares. Both use the embedded default configuration: p2p metadata (the segment name is
 * the target's host:port) and tcp on loopback.
 */
#include "example_common.h"

#define LEN 4096

static int serve(int report_fd, int parent_fd)
{
	static char buf[LEN];
	struct te_engine *e;

	CHECK(te_engine_new_from_string("", 0, &e)); /* "": the embedded default */
	CHECK(te_mem_register(e, buf, sizeof(buf), "cpu", TE_MEM_REMOTE));
	example_report(report_fd, e, (uintptr_t)buf, 0);
	example_wait_parent(parent_fd);
	te_engine_free(e);
	return 0;
}

int main(void)
{
	static char out[LEN], back[LEN];
	struct example_target t;
	struct te_engine *e;
	te_segment_id seg;

	example_target_start(&t, serve);
	CHECK(te_engine_new_from_string("", 0, &e));
	CHECK(te_mem_register(e, out, sizeof(out), "cpu", TE_MEM_LOCAL));
	CHECK(te_mem_register(e, back, sizeof(back), "cpu", TE_MEM_LOCAL));
	CHECK(te_segment_open(e, t.segment, &seg));
	snprintf(out, sizeof(out), "hello from pid %d to segment %s", (int)getpid(), t.segment);

	struct te_request w = { TE_OP_WRITE, seg, out, t.addr[0], sizeof(out) };
	struct te_request r = { TE_OP_READ, seg, back, t.addr[0], sizeof(back) };

	example_run(e, &w, 1, "write");
	example_run(e, &r, 1, "read");
	if (memcmp(out, back, sizeof(out)) != 0) {
		fprintf(stderr, "read back differs from what was written\n");
		return 1;
	}
	printf("read back: \"%s\"\n", back);
	CHECK(te_segment_close(e, seg));
	te_engine_free(e);
	return example_target_stop(&t);
}
