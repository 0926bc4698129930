/* SPDX-License-Identifier: Apache-2.0 */
/* mdcurl.h: the libcurl layer the etcd and http metadata backends share (requests, failover). */
#ifndef TE_CORE_METADATA_MDCURL_H
#define TE_CORE_METADATA_MDCURL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te_status.h>

/*
 * A cancel switch for requests in flight: mdcurl_stop_fire() ends every request that was
 * given this switch at once (the request returns TE_ERR_CANCELED), and any later one
 * before it starts. Thread-safe.
 */
struct mdcurl_stop;

struct mdcurl_stop *mdcurl_stop_new(void);
void mdcurl_stop_fire(struct mdcurl_stop *s);
bool mdcurl_stop_fired(struct mdcurl_stop *s);
/* No request may be using @s any more. NULL is fine. */
void mdcurl_stop_free(struct mdcurl_stop *s);

/*
 * Streamed response bodies: called with each chunk as it arrives (the body is then not
 * kept); return false to end the transfer (the request then returns TE_OK).
 */
typedef bool (*mdcurl_data_fn)(void *user, const char *data, size_t len);

struct mdcurl_request {
	const char *method; /* "GET", "PUT", "POST" or "DELETE" */
	const char *url;    /* http:// or https:// (no other protocol is allowed) */
	const void *body;   /* NULL: no body (an empty one for POST and PUT) */
	size_t body_len;
	const char *const *headers;  /* NULL-terminated "Name: value" lines, or NULL */
	uint32_t timeout_ms;	     /* the whole request; 0: no limit (streams) */
	uint32_t connect_timeout_ms; /* 0: timeout_ms, or 10 s when that is 0 too */
	const char *ca_file;	     /* https: CA bundle (NULL: the system's) */
	size_t max_body;	     /* a longer body fails the request (0: 64 MiB) */
	mdcurl_data_fn on_data;	     /* NULL: the body is returned in *body_out */
	void *user;
	struct mdcurl_stop *stop; /* NULL: runs until done or timed out */
	bool tcp_keepalive;	  /* probe an idle connection (long-lived streams) */
};

/*
 * mdcurl_perform - run one request. Thread-safe (each call has its own handles).
 * Returns TE_OK with the HTTP status in *code_out and the body in *body_out (GBytes, may
 * be empty; NULL body_out: discarded) whatever the status code: the caller judges it.
 * Failures, with *err_out (g_free) naming the URL and curl's words:
 * - TE_ERR_METADATA_UNAVAILABLE: no connection, timeout, transfer broken (try elsewhere);
 * - TE_ERR_METADATA: the body was longer than max_body;
 * - TE_ERR_CANCELED: @stop fired.
 */
enum te_status mdcurl_perform(const struct mdcurl_request *r, long *code_out, GBytes **body_out,
			      char **err_out);

/* @s escaped for a URL's query (g_free). */
char *mdcurl_escape(const char *s);

/*
 * The holder a stored descriptor names: its "generation" (a decimal string, or a number)
 * and "rpc" (g_free'd; NULL when absent, or when @json is not a JSON object). Reads only
 * those two members: the value may be anything a store holds.
 */
void mdcurl_holder(const char *json, size_t len, char **generation_out, char **rpc_out);

/*
 * Endpoints of one backend, tried in order. Requests go first to the one that answered
 * last (sticky), and on to the next ones only when it is unreachable.
 */
struct mdcurl_endpoints {
	char **urls; /* "scheme://host:port[/path]" without a trailing '/' */
	size_t n;
	_Atomic size_t current; /* the one that answered last */
};

/* "host:port" becomes "http://host:port"; a trailing '/' is dropped. */
void mdcurl_endpoints_init(struct mdcurl_endpoints *e, const char *const *endpoints, size_t n);
void mdcurl_endpoints_clear(struct mdcurl_endpoints *e);

/*
 * One attempt on @endpoint: returns TE_ERR_METADATA_UNAVAILABLE (with *err_out) to move on
 * to the next endpoint, anything else to stop there.
 */
typedef enum te_status (*mdcurl_try_fn)(void *user, const char *endpoint, char **err_out);

/*
 * mdcurl_failover - run @fn on the endpoints, starting at the current one, until one gives
 * something other than TE_ERR_METADATA_UNAVAILABLE (that one becomes current). When none
 * answers: TE_ERR_METADATA_UNAVAILABLE with "@backend: no endpoint answered: <url>: <why>;
 * ...". TE_ERR_CANCELED stops at once.
 */
enum te_status mdcurl_failover(struct mdcurl_endpoints *e, const char *backend, mdcurl_try_fn fn,
			       void *user, char **err_out);

/* A name this process publishes: what a backend keeps to claim, refresh and re-publish it. */
struct mdcurl_pub {
	char *name;
	char *key;	  /* metadata_key(ns, name) */
	GBytes *json;	  /* the latest value */
	char *generation; /* ours, from @json (NULL when absent) */
	char *rpc;
	bool dirty; /* the store may not have the latest @json */
};

/*
 * mdcurl_pub_set - the record of @name in @pubs (name -> struct mdcurl_pub, values freed by
 * mdcurl_pub_free), created when absent (*is_new), now holding @json as its latest value.
 * TE_ERR_TOO_LARGE (nothing changed) when @json is over DESCRIPTOR_MAX_JSON. Caller holds the
 * lock that guards @pubs.
 */
enum te_status mdcurl_pub_set(GHashTable *pubs, const char *backend, const char *ns,
			      const char *name, const char *json, size_t len,
			      struct mdcurl_pub **pub_out, bool *is_new, char **err_out);
void mdcurl_pub_free(void *data);

#endif /* TE_CORE_METADATA_MDCURL_H */
