/* SPDX-License-Identifier: Apache-2.0 */
/*
 * notify.c: a WRITE followed by a message. The initiator writes a block into the target and
 * attaches a notify to the batch; te delivers the message only once every byte of the batch
 * is in place, so the target reads the block as soon as the message arrives.
 */
#include <time.h>

#include "example_common.h"

#define LEN (1u << 20)

static int serve(int report_fd, int parent_fd)
{
	static unsigned char buf[LEN];
	struct te_notify msg;
	struct te_engine *e;
	size_t n = 0;

	CHECK(te_engine_new_from_string("", 0, &e));
	CHECK(te_mem_register(e, buf, sizeof(buf), "cpu", TE_MEM_REMOTE_WRITE));
	example_report(report_fd, e, (uintptr_t)buf, 0);
	/* te_notify_recv never blocks: poll (an application would do other work meanwhile). */
	for (int i = 0; i < 10000 && n == 0; i++) {
		CHECK(te_notify_recv(e, &msg, 1, &n));
		if (!n)
			nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	if (n == 0) {
		fprintf(stderr, "target: no notify within 10 s\n");
		return 1;
	}
	printf("target: notify from %s: \"%.*s\"\n", msg.sender, (int)msg.len, msg.msg);
	for (size_t i = 0; i < LEN; i++)
		if (buf[i] != (unsigned char)(i * 7)) {
			fprintf(stderr, "target: byte %zu is not there yet\n", i);
			return 1;
		}
	printf("target: all %u bytes were in place when the message came\n", LEN);
	example_wait_parent(parent_fd);
	te_engine_free(e);
	return 0;
}

int main(void)
{
	static unsigned char block[LEN];
	static const char msg[] = "block 0 written";
	struct example_target t;
	struct te_engine *e;
	te_segment_id seg;
	te_batch_id b;

	for (size_t i = 0; i < LEN; i++)
		block[i] = (unsigned char)(i * 7);
	example_target_start(&t, serve);
	CHECK(te_engine_new_from_string("", 0, &e));
	CHECK(te_mem_register(e, block, sizeof(block), "cpu", TE_MEM_LOCAL));
	CHECK(te_segment_open(e, t.segment, &seg));

	struct te_request w = { TE_OP_WRITE, seg, block, t.addr[0], sizeof(block) };

	CHECK(te_batch_new(e, 1, &b));
	CHECK(te_batch_submit_notify(e, b, &w, 1, msg, strlen(msg)));
	CHECK(te_batch_wait(e, b, 10 * 1000000000ll));
	CHECK(te_batch_free(e, b));
	printf("initiator: wrote %u bytes and sent \"%s\"\n", LEN, msg);
	CHECK(te_segment_close(e, seg));
	te_engine_free(e);
	return example_target_stop(&t);
}
