/* SPDX-License-Identifier: Apache-2.0 */
/* mdserver.h: real metadata servers (etcd, redis-server, te-metadata-server) for tests. */
#ifndef TE_TESTS_METADATA_MDSERVER_H
#define TE_TESTS_METADATA_MDSERVER_H

#include <stdbool.h>

#include <glib.h>

/*
 * A server this test process started on a free loopback port, with its data under a fresh
 * temporary folder, stopped by its PID (never by name). mdserver_shared() instead returns
 * the server .ci/run started for the whole suite ($TE_TEST_ETCD, $TE_TEST_REDIS,
 * $TE_TEST_HTTP_METADATA: its URL), when set; cases that stop or restart a server always
 * start their own.
 */
enum mdserver_kind {
	MDSERVER_ETCD,
	MDSERVER_REDIS,
	MDSERVER_HTTP
};

struct mdserver {
	enum mdserver_kind kind;
	char *url; /* http://127.0.0.1:P (etcd), redis://127.0.0.1:P, http://127.0.0.1:P/metadata */
	unsigned port;
	char *dir;	/* data folder (removed by mdserver_free) */
	char *log_path; /* the server's stdout and stderr */
	GPid pid;	/* 0: not running (or shared: not ours) */
	bool shared;
	char **extra; /* extra arguments given at start, reused by restart */
};

/*
 * Start a private server of @kind; aborts the test (g_error) when the program is missing or
 * it does not answer within 20 s, quoting the end of its log. @extra: more arguments
 * (NULL-terminated, may be NULL), e.g. {"--requirepass", "pw", NULL} for redis.
 */
struct mdserver *mdserver_start(enum mdserver_kind kind, const char *const *extra);
/* The suite's shared server of @kind when .ci/run exported one, else a private one. */
struct mdserver *mdserver_shared(enum mdserver_kind kind);
/* Whether the server program of @kind is installed (else the case skips). */
bool mdserver_available(enum mdserver_kind kind);
/* SIGKILL (@hard) or SIGTERM the server and reap it; its data folder stays. */
void mdserver_stop(struct mdserver *s, bool hard);
/* Start it again on the same port with the same data folder (waits until it answers). */
void mdserver_restart(struct mdserver *s);
/* Remove the stopped server's data (its log stays): the next restart starts empty. */
void mdserver_wipe(struct mdserver *s);
/* Stop (when ours and running), remove the data folder, free. NULL is fine. */
void mdserver_free(struct mdserver *s);
/* The program for te-metadata-server: $TE_METADATA_SERVER, else under $TE_BUILD_ROOT/tools. */
char *mdserver_http_program(void);

/* A loopback TCP port where nothing listens (bound, then closed). */
unsigned mdserver_dead_port(void);

#endif /* TE_TESTS_METADATA_MDSERVER_H */
