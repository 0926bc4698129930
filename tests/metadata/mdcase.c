/* SPDX-License-Identifier: Apache-2.0 */
/* mdcase.c: one metadata backend opened through its ops table, and the checks its cases share. */
#include "mdcase.h"

#include <string.h>
#include <unistd.h>

enum te_status md_try_open(struct md *m, const struct metadata_ops *ops, const char *const *eps,
			   const char *ns, uint32_t ttl_s, struct logcap_sink *cap,
			   const char *user, const char *password, char **err_out)
{
	size_t n = 0;

	memset(m, 0, sizeof(*m));
	m->ops = ops;
	while (eps[n])
		n++;
	g_assert_cmpuint(n, <, G_N_ELEMENTS(m->eps));
	for (size_t i = 0; i < n; i++)
		m->eps[i] = eps[i];
	m->ns = g_strdup(ns);
	m->p.endpoints = m->eps;
	m->p.n_endpoints = n;
	m->p.ns = m->ns;
	m->p.ttl_s = ttl_s;
	m->p.username = user;
	m->p.password = password;
	m->p.timeout_ms = 3000;
	m->p.log = cap ? &cap->sink : NULL;
	return m->ops->open(&m->p, &m->st, err_out);
}

void md_open_eps(struct md *m, const struct metadata_ops *ops, const char *const *eps,
		 const char *ns, struct logcap_sink *cap)
{
	g_autofree char *err = NULL;
	enum te_status st = md_try_open(m, ops, eps, ns, MD_TTL_S, cap, NULL, NULL, &err);

	if (st != TE_OK)
		g_error("open: %s: %s", te_status_str(st), err);
}

void md_open(struct md *m, const struct metadata_ops *ops, const char *url, const char *ns,
	     struct logcap_sink *cap)
{
	const char *eps[] = { url, NULL };

	md_open_eps(m, ops, eps, ns, cap);
}

void md_close(struct md *m)
{
	if (m->st)
		m->ops->close(m->st);
	m->st = NULL;
	g_free(m->ns);
}

/* A fresh namespace per case, so cases can share a server. */
char *md_new_ns(const char *tag)
{
	return g_strdup_printf("/te-test/%s-%d-%08x", tag, (int)getpid(), g_random_int());
}

/* A descriptor-like JSON value (the backend reads only "generation" and "rpc"). */
char *md_desc(const char *name, const char *gen, const char *rpc, const char *extra)
{
	return g_strdup_printf("{\"name\":\"%s\",\"generation\":\"%s\",\"rpc\":\"%s\","
			       "\"pad\":\"caf\\u00e9 \xe2\x82\xac \\\"q\\\" %s\"}",
			       name, gen, rpc, extra ? extra : "");
}

void md_publish_ok(struct md *m, const char *name, const char *json)
{
	g_autofree char *err = NULL;
	enum te_status st = m->ops->publish(m->st, name, json, strlen(json), &err);

	if (st != TE_OK)
		g_error("publish %s: %s: %s", name, te_status_str(st), err);
}

/* get: TE_OK with the value (g_bytes_unref), or the status. */
enum te_status md_get(struct md *m, const char *name, GBytes **out, char **err_out)
{
	*out = NULL;
	return m->ops->get(m->st, name, 2000, out, err_out);
}

void md_assert_value(struct md *m, const char *name, const void *data, size_t len)
{
	g_autofree char *err = NULL;
	GBytes *v = NULL;
	enum te_status st = md_get(m, name, &v, &err);

	if (st != TE_OK)
		g_error("get %s: %s: %s", name, te_status_str(st), err);
	g_assert_cmpmem(g_bytes_get_data(v, NULL), g_bytes_get_size(v), data, len);
	g_bytes_unref(v);
}

void md_assert_absent(struct md *m, const char *name)
{
	g_autofree char *err = NULL;
	GBytes *v = NULL;

	g_assert_cmpint(md_get(m, name, &v, &err), ==, TE_ERR_METADATA_NOT_FOUND);
	g_assert_nonnull(strstr(err, name));
}

/* Poll get until @name is absent (@want_absent) or present; ms waited, or -1. */
int64_t md_wait_presence(struct md *m, const char *name, bool want_absent, int64_t limit_ms)
{
	int64_t t0 = g_get_monotonic_time();

	for (;;) {
		g_autofree char *err = NULL;
		GBytes *v = NULL;
		enum te_status st = md_get(m, name, &v, &err);
		int64_t ms = (g_get_monotonic_time() - t0) / 1000;

		if (v)
			g_bytes_unref(v);
		if ((want_absent && st == TE_ERR_METADATA_NOT_FOUND) ||
		    (!want_absent && st == TE_OK))
			return ms;
		if (ms > limit_ms)
			return -1;
		g_usleep(100000);
	}
}
