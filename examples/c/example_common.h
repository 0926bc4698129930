/* SPDX-License-Identifier: Apache-2.0 */
/* example_common.h: what the C examples share: a target process and failing loudly. */
#ifndef TE_EXAMPLE_COMMON_H
#define TE_EXAMPLE_COMMON_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <te/te.h>

/* Stop with te's own words when a call fails. */
#define CHECK(call)                                                                                \
	do {                                                                                       \
		enum te_status st_ = (call);                                                       \
		if (st_ != TE_OK) {                                                                \
			fprintf(stderr, "%s:%d: %s: %s (%d): %s\n", __FILE__, __LINE__, #call,     \
				te_status_str(st_), st_, te_last_error());                         \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* What a target process tells its initiator: its segment name and where its buffer is. */
struct example_target {
	pid_t pid;
	int to_target; /* write end: the target exits when it is closed */
	char segment[256];
	uint64_t addr[2]; /* buffers the target registered (remote read and write) */
};

/*
 * Start a target process: @serve (run in the child) creates the engine, registers buffers,
 * reports them with example_report(), and returns once example_wait_parent() returns.
 */
typedef int (*example_serve_fn)(int report_fd, int parent_fd);

static inline void example_report(int fd, struct te_engine *e, uint64_t a0, uint64_t a1)
{
	dprintf(fd, "%s %" PRIu64 " %" PRIu64 "\n", te_engine_name(e), a0, a1);
	close(fd);
}

/* Block until the initiator is done (it closes its end, or exits). */
static inline void example_wait_parent(int fd)
{
	char c;

	while (read(fd, &c, 1) > 0)
		;
}

static inline void example_target_start(struct example_target *t, example_serve_fn serve)
{
	int rep[2], ctl[2];
	FILE *f;

	if (pipe(rep) || pipe(ctl)) {
		perror("pipe");
		exit(1);
	}
	t->pid = fork();
	if (t->pid < 0) {
		perror("fork");
		exit(1);
	}
	if (t->pid == 0) {
		close(rep[0]);
		close(ctl[1]);
		_exit(serve(rep[1], ctl[0]));
	}
	close(rep[1]);
	close(ctl[0]);
	t->to_target = ctl[1];
	f = fdopen(rep[0], "r");
	if (!f ||
	    fscanf(f, "%255s %" SCNu64 " %" SCNu64, t->segment, &t->addr[0], &t->addr[1]) != 3) {
		fprintf(stderr, "the target did not report its segment\n");
		exit(1);
	}
	fclose(f);
}

/* Tell the target to finish; its exit status (0: it checked what it had to). */
static inline int example_target_stop(struct example_target *t)
{
	int ws = 0;

	close(t->to_target);
	if (waitpid(t->pid, &ws, 0) != t->pid)
		return 1;
	return WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
}

/* Run @n requests as one batch and wait; exits with the failed task's detail on failure. */
static inline void example_run(struct te_engine *e, const struct te_request *reqs, size_t n,
			       const char *what)
{
	te_batch_id b;
	enum te_status st;

	CHECK(te_batch_new(e, (uint32_t)n, &b));
	CHECK(te_batch_submit(e, b, reqs, n));
	st = te_batch_wait(e, b, 10 * 1000000000ll);
	for (size_t i = 0; i < n; i++) {
		struct te_task_info ti;

		CHECK(te_task_status(e, b, (uint32_t)i, &ti));
		printf("%s: task %zu: %s, %" PRIu64 " bytes over %s%s%s\n", what, i,
		       te_state_str(ti.state), ti.bytes, ti.transport, *ti.detail ? ": " : "",
		       ti.detail);
	}
	if (st != TE_OK) {
		fprintf(stderr, "%s: %s\n", what, te_status_str(st));
		exit(1);
	}
	CHECK(te_batch_free(e, b));
}

#endif /* TE_EXAMPLE_COMMON_H */
