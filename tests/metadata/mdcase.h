/* SPDX-License-Identifier: Apache-2.0 */
/* mdcase.h: one metadata backend opened through its ops table, and the checks its cases share. */
#ifndef TE_TESTS_METADATA_MDCASE_H
#define TE_TESTS_METADATA_MDCASE_H

#include <stdbool.h>
#include <stdint.h>

#include <glib.h>

#include "core/metadata/metadata.h"
#include "logcap_core.h"

/* The record TTL the cases open their backends with. */
#define MD_TTL_S 2u

/* One opened backend; its params (and the strings they point to) live as long as it. */
struct md {
	const struct metadata_ops *ops;
	struct metadata_params p;
	const char *eps[4];
	char *ns;
	void *st;
};

/* Open @ops on the NULL-terminated @eps (at most 3) under @ns; logs go to @cap (NULL: none). */
enum te_status md_try_open(struct md *m, const struct metadata_ops *ops, const char *const *eps,
			   const char *ns, uint32_t ttl_s, struct logcap_sink *cap,
			   const char *user, const char *password, char **err_out);
/* md_try_open with MD_TTL_S and no credentials, which must succeed. */
void md_open_eps(struct md *m, const struct metadata_ops *ops, const char *const *eps,
		 const char *ns, struct logcap_sink *cap);
/* md_open_eps on the one endpoint @url. */
void md_open(struct md *m, const struct metadata_ops *ops, const char *url, const char *ns,
	     struct logcap_sink *cap);
void md_close(struct md *m);

/* A fresh namespace per case (g_free), so cases can share a server. */
char *md_new_ns(const char *tag);
/* A descriptor-like JSON value (g_free; the backends read only "generation" and "rpc"). */
char *md_desc(const char *name, const char *gen, const char *rpc, const char *extra);

void md_publish_ok(struct md *m, const char *name, const char *json);
/* get: TE_OK with the value (g_bytes_unref), or the status. */
enum te_status md_get(struct md *m, const char *name, GBytes **out, char **err_out);
void md_assert_value(struct md *m, const char *name, const void *data, size_t len);
/* get answers TE_ERR_METADATA_NOT_FOUND, naming @name. */
void md_assert_absent(struct md *m, const char *name);
/* Poll get until @name is absent (@want_absent) or present; ms waited, or -1 after @limit_ms. */
int64_t md_wait_presence(struct md *m, const char *name, bool want_absent, int64_t limit_ms);

#endif /* TE_TESTS_METADATA_MDCASE_H */
