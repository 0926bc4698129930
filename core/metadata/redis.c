/* SPDX-License-Identifier: Apache-2.0 */
/* redis.c: the redis metadata backend (hiredis): PX leases, keyspace-notification watch. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <json-glib/json-glib.h>

#include "core/metadata/descriptor.h"
#include "core/metadata/metadata.h"

/*
 * Design notes.
 * - Every key is written by a Lua script (EVAL) that reads the value first, so "is it still
 *   ours" (its "generation" equals ours) and the write are one atomic step. The server must
 *   allow EVAL (it does unless an ACL or a managed service forbids scripting).
 * - Connections: hiredis contexts are not thread-safe, so each user has its own: requests
 *   (get, under rlock), writes (publish, withdraw and the keeper thread, under wlock, which
 *   also serialises every write of our keys), and the watch thread's command and subscriber
 *   connections (that thread only).
 * - Several endpoints are tried in order; a connection stays on the endpoint that answered
 *   until it fails. A write answered READONLY (a replica) moves on to the next endpoint:
 *   writes need the primary, reads work on any replica.
 */

#define RD_SCAN_COUNT "512"
#define RD_MIN_PERIOD_MS 100u
#define RD_BACKOFF_START_MS 100u

struct rd_ep {
	char *host;
	int port;
	char *user;  /* NULL: no ACL user (AUTH password) */
	char *pass;  /* NULL: no AUTH */
	int db;	     /* SELECT (0: default) */
	char *shown; /* redis://[user@]host:port[/db], never the password */
};

struct rd_conn {
	redisContext *c;
	size_t ep;	   /* endpoint of c, or the first to try when c is NULL */
	uint32_t tmo_ms;   /* timeout set on c */
	uint64_t connects; /* connections made so far (a new one may find a wiped server) */
};

struct rd_pub {
	char *name;
	char *key;
	char *json;
	size_t len;
	char *gen;
	char *rpc;
	bool dirty;	 /* the store may hold an older value: SET (not PEXPIRE) next round */
	bool claim;	 /* dirty with a new generation: the write claims (takes over our rpc) */
	bool stolen;	 /* ERROR logged: another holder has the key */
	bool err_logged; /* WARN logged: the server refused our script on this key */
};

struct rd {
	struct rd_ep *eps;
	size_t n_eps;
	char *ns;
	char *prefix;	  /* "<ns>/segments/" */
	char *scan_match; /* prefix, glob-escaped, then '*' */
	uint32_t ttl_ms;
	uint32_t timeout_ms;
	const struct log_sink *log;

	GMutex rlock; /* rconn */
	struct rd_conn rconn;

	GMutex wlock; /* wconn, pubs, keeper, k_down */
	struct rd_conn wconn;
	GHashTable *pubs; /* name -> struct rd_pub */
	GThread *keeper;
	bool k_down;

	GMutex klock; /* stop; kcond */
	GCond kcond;
	bool stop;
	int stop_pipe[2]; /* written once by close: wakes the watch thread's poll */

	/* Watch thread only (and watch() before the thread starts). */
	GThread *watcher;
	metadata_watch_fn fn;
	void *user;
	struct rd_conn wcmd;
	struct rd_conn wsub;
	bool w_notify;	     /* keyspace notifications on (else SCAN polling) */
	int w_mode_shown;    /* -1: not logged yet, else the last w_notify logged */
	GHashTable *seen;    /* name -> sha1 hex of the value last seen */
	uint64_t w_connects; /* wcmd.connects when seen was last compared with the store */
};

/*
 * Claim, refresh or replace KEYS[1] for generation ARGV[1] (rpc ARGV[2]) with PX ARGV[3].
 * ARGV[4]: "claim" (first publish: also take over a value with our rpc, whose process is
 * gone since we bound its port), "set" (write ARGV[5]) or "touch" (PEXPIRE only; a missing
 * key is not re-created). Returns {0} when the key was missing (re-created unless touch),
 * {1} when it was ours (now refreshed or replaced), {2, holder generation, holder rpc,
 * value length} when someone else holds it. A plain search for our own
 * "generation":"<gen>" spares decoding large descriptors on every refresh.
 */
static const char rd_script_pub[] =
	"local v = redis.call('GET', KEYS[1])\n"
	"if not v then\n"
	"  if ARGV[4] == 'touch' then return {0} end\n"
	"  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[3])\n"
	"  return {0}\n"
	"end\n"
	"local ours = string.find(v, '\"generation\":\"' .. ARGV[1] .. '\"', 1, true) ~= nil\n"
	"local hg, hr = '', ''\n"
	"if not ours then\n"
	"  local ok, d = pcall(cjson.decode, v)\n"
	"  if ok and type(d) == 'table' then\n"
	"    if d.generation ~= nil then hg = string.sub(tostring(d.generation), 1, 64) end\n"
	"    if d.rpc ~= nil then hr = string.sub(tostring(d.rpc), 1, 256) end\n"
	"    ours = hg == ARGV[1] or (ARGV[4] == 'claim' and ARGV[2] ~= '' and hr == ARGV[2])\n"
	"  end\n"
	"end\n"
	"if not ours then return {2, hg, hr, #v} end\n"
	"if ARGV[4] == 'touch' then\n"
	"  redis.call('PEXPIRE', KEYS[1], ARGV[3])\n"
	"else\n"
	"  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[3])\n"
	"end\n"
	"return {1}\n";

/* Delete KEYS[1] when its generation is ARGV[1]: 1 deleted, 0 missing, 2 someone else's. */
static const char rd_script_del[] =
	"local v = redis.call('GET', KEYS[1])\n"
	"if not v then return 0 end\n"
	"local ours = string.find(v, '\"generation\":\"' .. ARGV[1] .. '\"', 1, true) ~= nil\n"
	"if not ours then\n"
	"  local ok, d = pcall(cjson.decode, v)\n"
	"  ours = ok and type(d) == 'table' and d.generation == ARGV[1]\n"
	"end\n"
	"if ours then redis.call('DEL', KEYS[1]) return 1 end\n"
	"return 2\n";

/* The value of KEYS[1], at most ARGV[1] + 1 bytes (so an oversize one is seen, not read). */
static const char rd_script_get[] =
	"local t = redis.call('TYPE', KEYS[1])['ok']\n"
	"if t == 'none' then return false end\n"
	"if t ~= 'string' then return redis.error_reply('WRONGTYPE the key holds a ' .. t) end\n"
	"return redis.call('GETRANGE', KEYS[1], 0, ARGV[1])\n";

/* SHA-1 of each string in KEYS ('' when missing or not a string), for the watch's resync. */
static const char rd_script_hash[] = "local r = {}\n"
				     "for i, k in ipairs(KEYS) do\n"
				     "  if redis.call('TYPE', k)['ok'] == 'string' then\n"
				     "    r[i] = redis.sha1hex(redis.call('GET', k))\n"
				     "  else\n"
				     "    r[i] = ''\n"
				     "  end\n"
				     "end\n"
				     "return r\n";

static struct timeval rd_tv(uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	return tv;
}

static const struct rd_ep *rd_ep_of(const struct rd *r, const struct rd_conn *cn)
{
	return &r->eps[cn->ep % r->n_eps];
}

/* hiredis's words for a failed context; a read timeout reads as EAGAIN's text. */
static char *rd_ctx_err(const redisContext *c, uint32_t tmo_ms)
{
	if (!c)
		return g_strdup("out of memory");
	if (c->err == REDIS_ERR_IO &&
	    (strstr(c->errstr, "temporarily unavailable") || strstr(c->errstr, "timed out")))
		return g_strdup_printf("no answer within %u ms (%s)", tmo_ms, c->errstr);
	if (c->errstr[0])
		return g_strdup(c->errstr);
	return g_strdup("connection error");
}

static void rd_drop(struct rd_conn *cn)
{
	if (cn->c)
		redisFree(cn->c);
	cn->c = NULL;
}

/* An error reply's text, or what else came. */
static const char *rd_reply_text(const redisReply *rep)
{
	if ((rep->type == REDIS_REPLY_ERROR || rep->type == REDIS_REPLY_STATUS ||
	     rep->type == REDIS_REPLY_STRING) &&
	    rep->str)
		return rep->str;
	switch (rep->type) {
	case REDIS_REPLY_NIL:
		return "(nil)";
	case REDIS_REPLY_INTEGER:
		return "(an integer)";
	case REDIS_REPLY_ARRAY:
		return "(an array)";
	default:
		return "(an unexpected reply)";
	}
}

static enum te_status rd_connect_one(struct rd *r, size_t idx, uint32_t tmo_ms,
				     redisContext **c_out, char **err_out)
{
	const struct rd_ep *ep = &r->eps[idx];
	struct timeval tv = rd_tv(tmo_ms);
	redisContext *c;
	redisReply *rep;
	g_autofree char *why = NULL;

	c = redisConnectWithTimeout(ep->host, ep->port, tv);
	if (!c || c->err) {
		why = rd_ctx_err(c, tmo_ms);
		*err_out = g_strdup_printf("cannot connect to %s: %s", ep->shown, why);
		if (c)
			redisFree(c);
		return TE_ERR_METADATA_UNAVAILABLE;
	}
	if (redisSetTimeout(c, tv) != REDIS_OK) {
		*err_out = g_strdup_printf("%s: cannot set a %u ms timeout: %s", ep->shown, tmo_ms,
					   c->errstr);
		redisFree(c);
		return TE_ERR_METADATA_UNAVAILABLE;
	}
	(void)redisEnableKeepAlive(c); /* best effort: only detects dead peers sooner */
	if (ep->pass) {
		if (ep->user)
			rep = redisCommand(c, "AUTH %s %s", ep->user, ep->pass);
		else
			rep = redisCommand(c, "AUTH %s", ep->pass);
		if (!rep)
			goto err_io;
		if (rep->type == REDIS_REPLY_ERROR) {
			*err_out = g_strdup_printf("%s refused the credentials (AUTH%s%s): %s",
						   ep->shown,
						   ep->user ? " as user " : " with a password",
						   ep->user ? ep->user : "", rd_reply_text(rep));
			freeReplyObject(rep);
			redisFree(c);
			return TE_ERR_METADATA;
		}
		freeReplyObject(rep);
	}
	if (ep->db) {
		rep = redisCommand(c, "SELECT %d", ep->db);
		if (!rep)
			goto err_io;
		if (rep->type == REDIS_REPLY_ERROR) {
			*err_out = g_strdup_printf("%s refused SELECT %d: %s", ep->shown, ep->db,
						   rd_reply_text(rep));
			freeReplyObject(rep);
			redisFree(c);
			return TE_ERR_METADATA;
		}
		freeReplyObject(rep);
	}
	rep = redisCommand(c, "PING");
	if (!rep)
		goto err_io;
	if (rep->type == REDIS_REPLY_ERROR) {
		bool noauth = g_str_has_prefix(rep->str, "NOAUTH");

		*err_out = g_strdup_printf(
			"%s refused PING: %s%s", ep->shown, rd_reply_text(rep),
			noauth ? " (give a password: redis://[user:]password@host:port or "
				 "metadata.password_file)"
			       : "");
		freeReplyObject(rep);
		redisFree(c);
		return TE_ERR_METADATA;
	}
	freeReplyObject(rep);
	*c_out = c;
	return TE_OK;

err_io:
	why = rd_ctx_err(c, tmo_ms);
	*err_out = g_strdup_printf("%s: %s", ep->shown, why);
	redisFree(c);
	return TE_ERR_METADATA_UNAVAILABLE;
}

/*
 * Connect @cn to the first endpoint that answers, from @first on (wrapping). All failed:
 * TE_ERR_METADATA when one refused us (credentials, SELECT), else UNAVAILABLE; the message
 * names every endpoint tried and why.
 */
static enum te_status rd_connect(struct rd *r, struct rd_conn *cn, size_t first, uint32_t tmo_ms,
				 char **err_out)
{
	GString *why = g_string_new("redis: ");
	enum te_status st = TE_ERR_METADATA_UNAVAILABLE;

	rd_drop(cn);
	for (size_t i = 0; i < r->n_eps; i++) {
		size_t idx = (first + i) % r->n_eps;
		redisContext *c = NULL;
		char *e = NULL;
		enum te_status s = rd_connect_one(r, idx, tmo_ms, &c, &e);

		if (s == TE_OK) {
			g_string_free(why, TRUE);
			cn->c = c;
			cn->ep = idx;
			cn->tmo_ms = tmo_ms;
			cn->connects++;
			return TE_OK;
		}
		if (s != TE_ERR_METADATA_UNAVAILABLE)
			st = s;
		if (i)
			g_string_append(why, "; ");
		g_string_append(why, e);
		g_free(e);
	}
	*err_out = g_string_free(why, FALSE);
	return st;
}

/*
 * Run one command on @cn: connect when it has no connection, reconnect once after an I/O
 * error (the server restarted; our commands are safe to repeat), and move a write answered
 * READONLY (a replica) to the next endpoint. *reply_out may be an error reply.
 */
static enum te_status rd_call(struct rd *r, struct rd_conn *cn, bool write, uint32_t tmo_ms,
			      int argc, const char **argv, const size_t *lens,
			      redisReply **reply_out, char **err_out)
{
	bool retried = false;
	size_t moves = 0;

	for (;;) {
		redisReply *rep;
		enum te_status st;

		if (!cn->c) {
			st = rd_connect(r, cn, cn->ep, tmo_ms, err_out);
			if (st != TE_OK)
				return st;
		} else if (cn->tmo_ms != tmo_ms) {
			if (redisSetTimeout(cn->c, rd_tv(tmo_ms)) == REDIS_OK)
				cn->tmo_ms = tmo_ms;
		}
		rep = redisCommandArgv(cn->c, argc, argv, lens);
		if (!rep) {
			g_autofree char *why = rd_ctx_err(cn->c, tmo_ms);

			rd_drop(cn);
			if (!retried) {
				retried = true;
				continue;
			}
			*err_out = g_strdup_printf("redis: %s: %s: %s", rd_ep_of(r, cn)->shown,
						   argv[0], why);
			return TE_ERR_METADATA_UNAVAILABLE;
		}
		if (write && rep->type == REDIS_REPLY_ERROR && rep->str &&
		    g_str_has_prefix(rep->str, "READONLY") && moves + 1 < r->n_eps) {
			log_msg(r->log, TE_LOG_INFO,
				"redis: %s is a read-only replica; trying the next endpoint",
				rd_ep_of(r, cn)->shown);
			freeReplyObject(rep);
			rd_drop(cn);
			cn->ep = (cn->ep + 1) % r->n_eps;
			moves++;
			continue;
		}
		*reply_out = rep;
		return TE_OK;
	}
}

/* EVAL @script on one key with @argc arguments. */
static enum te_status rd_eval1(struct rd *r, struct rd_conn *cn, bool write, uint32_t tmo_ms,
			       const char *script, const char *key, int argc, const char **argv,
			       const size_t *lens, redisReply **reply_out, char **err_out)
{
	const char *av[10];
	size_t al[10];

	g_assert(argc <= 6);
	av[0] = "EVAL";
	av[1] = script;
	av[2] = "1";
	av[3] = key;
	for (int i = 0; i < argc; i++) {
		av[4 + i] = argv[i];
		al[4 + i] = lens ? lens[i] : strlen(argv[i]);
	}
	for (int i = 0; i < 4; i++)
		al[i] = strlen(av[i]);
	return rd_call(r, cn, write, tmo_ms, 4 + argc, av, al, reply_out, err_out);
}

/* The value of @key (bounded): NOT_FOUND when absent; METADATA for anything but a string. */
static enum te_status rd_get_on(struct rd *r, struct rd_conn *cn, const char *key, uint32_t tmo_ms,
				GBytes **json_out, char **err_out)
{
	g_autofree char *max = g_strdup_printf("%u", DESCRIPTOR_MAX_JSON);
	const char *argv[] = { max };
	redisReply *rep = NULL;
	enum te_status st;

	st = rd_eval1(r, cn, false, tmo_ms, rd_script_get, key, 1, argv, NULL, &rep, err_out);
	if (st != TE_OK)
		return st;
	if (rep->type == REDIS_REPLY_NIL) {
		*err_out = g_strdup_printf("redis: no value under %s at %s", key,
					   rd_ep_of(r, cn)->shown);
		st = TE_ERR_METADATA_NOT_FOUND;
	} else if (rep->type != REDIS_REPLY_STRING) {
		*err_out = g_strdup_printf("redis: GET %s at %s: %s", key, rd_ep_of(r, cn)->shown,
					   rd_reply_text(rep));
		st = TE_ERR_METADATA;
	} else if (rep->len > DESCRIPTOR_MAX_JSON) {
		*err_out = g_strdup_printf("redis: the value of %s at %s is over %u bytes", key,
					   rd_ep_of(r, cn)->shown, DESCRIPTOR_MAX_JSON);
		st = TE_ERR_METADATA;
	} else {
		*json_out = g_bytes_new(rep->str, rep->len);
	}
	freeReplyObject(rep);
	return st;
}

/* --- endpoints and open --- */

static void rd_ep_clear(struct rd_ep *ep)
{
	g_free(ep->host);
	g_free(ep->user);
	if (ep->pass)
		memset(ep->pass, 0, strlen(ep->pass));
	g_free(ep->pass);
	g_free(ep->shown);
}

/* redis://[user:password@]host[:port][/db]; "host:port" alone is taken as redis://. */
static enum te_status rd_parse_ep(const char *spec, const struct metadata_params *p,
				  struct rd_ep *ep, char **err_out)
{
	g_autofree char *with = NULL, *scheme = NULL, *user = NULL, *pass = NULL, *host = NULL;
	g_autofree char *path = NULL, *query = NULL, *frag = NULL;
	g_autoptr(GError) gerr = NULL;
	gint port = -1;
	guint64 db = 0;

	if (!strstr(spec, "://"))
		spec = with = g_strconcat("redis://", spec, NULL);
	if (!g_uri_split_with_user(spec, G_URI_FLAGS_HAS_PASSWORD, &scheme, &user, &pass, NULL,
				   &host, &port, &path, &query, &frag, &gerr)) {
		*err_out = g_strdup_printf("redis: bad endpoint (expected "
					   "redis://[user:password@]host:port[/db]): %s",
					   gerr->message);
		return TE_ERR_CONFIG;
	}
	if (g_ascii_strcasecmp(scheme, "redis") != 0) {
		*err_out = g_strdup_printf("redis: endpoint scheme '%s://' is not supported "
					   "(redis:// only: this hiredis has no TLS)",
					   scheme);
		return TE_ERR_CONFIG;
	}
	if (!host || !*host || query || frag) {
		*err_out = g_strdup_printf("redis: bad endpoint for host %s (expected "
					   "redis://[user:password@]host:port[/db])",
					   host && *host ? host : "(none)");
		return TE_ERR_CONFIG;
	}
	if (path && *path && strcmp(path, "/") != 0 &&
	    !g_ascii_string_to_unsigned(path + 1, 10, 0, INT_MAX, &db, NULL)) {
		*err_out = g_strdup_printf("redis: endpoint %s: database '%s' is not a number",
					   host, path + 1);
		return TE_ERR_CONFIG;
	}
	ep->host = g_steal_pointer(&host);
	ep->port = port > 0 ? port : 6379;
	ep->db = (int)db;
	ep->user = g_strdup(user && *user		  ? user
			    : p->username && *p->username ? p->username
							  : NULL);
	ep->pass = g_strdup(pass && *pass		  ? pass
			    : p->password && *p->password ? p->password
							  : NULL);
	if (pass)
		memset(pass, 0, strlen(pass));
	{
		GString *sh = g_string_new("redis://");

		if (ep->user)
			g_string_append_printf(sh, "%s@", ep->user);
		if (strchr(ep->host, ':'))
			g_string_append_printf(sh, "[%s]:%d", ep->host, ep->port);
		else
			g_string_append_printf(sh, "%s:%d", ep->host, ep->port);
		if (ep->db)
			g_string_append_printf(sh, "/%d", ep->db);
		ep->shown = g_string_free(sh, FALSE);
	}
	if (ep->user && !ep->pass) {
		*err_out = g_strdup_printf("redis: endpoint %s names user '%s' but no password",
					   ep->shown, ep->user);
		return TE_ERR_CONFIG;
	}
	return TE_OK;
}

static void rd_pub_free(gpointer data)
{
	struct rd_pub *pub = data;

	g_free(pub->name);
	g_free(pub->key);
	g_free(pub->json);
	g_free(pub->gen);
	g_free(pub->rpc);
	g_free(pub);
}

static void rd_free(struct rd *r)
{
	rd_drop(&r->rconn);
	rd_drop(&r->wconn);
	rd_drop(&r->wcmd);
	rd_drop(&r->wsub);
	for (size_t i = 0; i < r->n_eps; i++)
		rd_ep_clear(&r->eps[i]);
	g_free(r->eps);
	g_free(r->ns);
	g_free(r->prefix);
	g_free(r->scan_match);
	if (r->pubs)
		g_hash_table_destroy(r->pubs);
	if (r->seen)
		g_hash_table_destroy(r->seen);
	if (r->stop_pipe[0] >= 0)
		close(r->stop_pipe[0]);
	if (r->stop_pipe[1] >= 0)
		close(r->stop_pipe[1]);
	g_mutex_clear(&r->rlock);
	g_mutex_clear(&r->wlock);
	g_mutex_clear(&r->klock);
	g_cond_clear(&r->kcond);
	g_free(r);
}

static enum te_status rd_open(const struct metadata_params *p, void **state_out, char **err_out)
{
	struct rd *r;
	GString *match;
	enum te_status st;

	if (!p->n_endpoints || !p->endpoints || !p->ns) {
		*err_out = g_strdup("redis: no endpoint (metadata.endpoints) or namespace");
		return TE_ERR_CONFIG;
	}
	r = g_new0(struct rd, 1);
	g_mutex_init(&r->rlock);
	g_mutex_init(&r->wlock);
	g_mutex_init(&r->klock);
	g_cond_init(&r->kcond);
	r->stop_pipe[0] = r->stop_pipe[1] = -1;
	r->w_mode_shown = -1;
	r->eps = g_new0(struct rd_ep, p->n_endpoints);
	r->n_eps = p->n_endpoints;
	for (size_t i = 0; i < p->n_endpoints; i++) {
		st = rd_parse_ep(p->endpoints[i], p, &r->eps[i], err_out);
		if (st != TE_OK)
			goto err_free;
	}
	r->ns = g_strdup(p->ns);
	r->prefix = g_strconcat(p->ns, "/segments/", NULL);
	match = g_string_new(NULL);
	for (const char *c = r->prefix; *c; c++) {
		if (strchr("*?[]\\", *c))
			g_string_append_c(match, '\\');
		g_string_append_c(match, *c);
	}
	g_string_append_c(match, '*');
	r->scan_match = g_string_free(match, FALSE);
	r->ttl_ms = (p->ttl_s ? MIN(p->ttl_s, 1000000u) : 10u) * 1000u;
	r->timeout_ms = p->timeout_ms ? p->timeout_ms : 5000;
	r->log = p->log;
	r->pubs = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, rd_pub_free);
	r->seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	if (pipe2(r->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		*err_out = g_strdup_printf("redis: pipe: %s", g_strerror(errno));
		st = TE_ERR_SYSTEM;
		goto err_free;
	}
	/* Down at start is an error the operator sees now, not at the first lookup. */
	st = rd_connect(r, &r->rconn, 0, r->timeout_ms, err_out);
	if (st != TE_OK)
		goto err_free;
	log_msg(r->log, TE_LOG_INFO, "redis: metadata at %s, keys under %s",
		rd_ep_of(r, &r->rconn)->shown, r->prefix);
	*state_out = r;
	return TE_OK;

err_free:
	rd_free(r);
	return st;
}

static enum te_status rd_get(void *state, const char *name, uint32_t timeout_ms, GBytes **json_out,
			     char **err_out)
{
	struct rd *r = state;
	g_autofree char *key = metadata_key(r->ns, name);
	enum te_status st;

	g_mutex_lock(&r->rlock);
	st = rd_get_on(r, &r->rconn, key, timeout_ms ? timeout_ms : r->timeout_ms, json_out,
		       err_out);
	g_mutex_unlock(&r->rlock);
	return st;
}

/* --- publish, the keeper thread, withdraw --- */

/* "generation" (a string) and "rpc" of a descriptor we publish. */
static enum te_status rd_own_fields(const char *json, size_t len, char **gen_out, char **rpc_out,
				    char **err_out)
{
	g_autoptr(JsonParser) parser = json_parser_new();
	g_autoptr(GError) gerr = NULL;
	JsonNode *root, *g, *rpc;
	JsonObject *o;

	if (!json_parser_load_from_data(parser, json, (gssize)len, &gerr)) {
		*err_out = g_strdup_printf("redis: publish: not JSON: %s", gerr->message);
		return TE_ERR_INVALID_ARG;
	}
	root = json_parser_get_root(parser);
	if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
		*err_out = g_strdup("redis: publish: the descriptor is not a JSON object");
		return TE_ERR_INVALID_ARG;
	}
	o = json_node_get_object(root);
	g = json_object_get_member(o, "generation");
	if (!g || !JSON_NODE_HOLDS_VALUE(g) || json_node_get_value_type(g) != G_TYPE_STRING ||
	    !*json_node_get_string(g)) {
		*err_out = g_strdup("redis: publish: the descriptor has no \"generation\" string");
		return TE_ERR_INVALID_ARG;
	}
	rpc = json_object_get_member(o, "rpc");
	if (rpc &&
	    (!JSON_NODE_HOLDS_VALUE(rpc) || json_node_get_value_type(rpc) != G_TYPE_STRING)) {
		*err_out = g_strdup("redis: publish: the descriptor's \"rpc\" is not a string");
		return TE_ERR_INVALID_ARG;
	}
	*gen_out = g_strdup(json_node_get_string(g));
	*rpc_out = g_strdup(rpc ? json_node_get_string(rpc) : "");
	return TE_OK;
}

enum rd_pub_result {
	RD_PUB_MISSING = 0, /* the key was gone (re-created unless "touch") */
	RD_PUB_OURS = 1,
	RD_PUB_OTHER = 2,
};

/* Run rd_script_pub for @pub in @mode; RD_PUB_OTHER fills *holder_out (g_free). */
static enum te_status rd_pub_script(struct rd *r, const struct rd_pub *pub, const char *mode,
				    enum rd_pub_result *res_out, char **holder_out, char **err_out)
{
	g_autofree char *ttl = g_strdup_printf("%u", r->ttl_ms);
	const char *argv[] = { pub->gen, pub->rpc, ttl, mode, pub->json };
	size_t lens[] = { strlen(pub->gen), strlen(pub->rpc), strlen(ttl), strlen(mode), pub->len };
	int argc = strcmp(mode, "touch") == 0 ? 4 : 5;
	redisReply *rep = NULL;
	enum te_status st;

	st = rd_eval1(r, &r->wconn, true, r->timeout_ms, rd_script_pub, pub->key, argc, argv, lens,
		      &rep, err_out);
	if (st != TE_OK)
		return st;
	if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
	    rep->element[0]->type == REDIS_REPLY_INTEGER && rep->element[0]->integer >= 0 &&
	    rep->element[0]->integer <= 2) {
		*res_out = (enum rd_pub_result)rep->element[0]->integer;
		if (*res_out == RD_PUB_OTHER) {
			const char *hg = "", *hr = "";
			long long hl = 0;

			if (rep->elements >= 4 && rep->element[1]->type == REDIS_REPLY_STRING &&
			    rep->element[2]->type == REDIS_REPLY_STRING &&
			    rep->element[3]->type == REDIS_REPLY_INTEGER) {
				hg = rep->element[1]->str;
				hr = rep->element[2]->str;
				hl = rep->element[3]->integer;
			}
			if (*hg || *hr)
				*holder_out =
					g_strdup_printf("rpc %s, generation %s",
							*hr ? hr : "(none)", *hg ? hg : "(none)");
			else
				*holder_out = g_strdup_printf(
					"a %lld-byte value that is not a segment descriptor", hl);
		}
	} else {
		*err_out = g_strdup_printf("redis: publish %s at %s: %s", pub->key,
					   rd_ep_of(r, &r->wconn)->shown, rd_reply_text(rep));
		st = TE_ERR_METADATA;
	}
	freeReplyObject(rep);
	return st;
}

/*
 * One keeper round for @pub (wlock held). Returns false when the store is unreachable
 * (*err_out says why); a refusal on this key is logged here and counts as reachable.
 */
static bool rd_keep_one(struct rd *r, struct rd_pub *pub, char **err_out)
{
	enum rd_pub_result res = RD_PUB_OURS;
	g_autofree char *holder = NULL;
	char *e = NULL;
	enum te_status st;

	st = rd_pub_script(r, pub, pub->dirty ? (pub->claim ? "claim" : "set") : "touch", &res,
			   &holder, &e);
	if (st == TE_OK && res == RD_PUB_MISSING && !pub->dirty) {
		log_msg(r->log, TE_LOG_INFO,
			"redis: %s had lost %s (restart without persistence, or expired during an "
			"outage); publishing it again",
			rd_ep_of(r, &r->wconn)->shown, pub->key);
		st = rd_pub_script(r, pub, "set", &res, &holder, &e);
	}
	if (st == TE_ERR_METADATA_UNAVAILABLE) {
		*err_out = e;
		return false;
	}
	if (st != TE_OK) {
		if (!pub->err_logged)
			log_msg(r->log, TE_LOG_WARN, "%s (keeping it alive)", e);
		pub->err_logged = true;
		g_free(e);
		return true;
	}
	pub->err_logged = false;
	if (res == RD_PUB_OTHER) {
		if (!pub->stolen)
			log_msg(r->log, TE_LOG_ERROR,
				"redis: %s is now held by another engine (%s); this engine's "
				"descriptor of '%s' is no longer published",
				pub->key, holder, pub->name);
		pub->stolen = true;
		return true;
	}
	if (pub->stolen)
		log_msg(r->log, TE_LOG_INFO, "redis: %s is this engine's again", pub->key);
	pub->stolen = false;
	pub->dirty = false;
	pub->claim = false;
	return true;
}

/* Refresh every publication; false when the store is unreachable. */
static bool rd_keep_round(struct rd *r)
{
	GHashTableIter it;
	gpointer v;
	char *err = NULL;
	bool ok = true, any = false;

	g_mutex_lock(&r->wlock);
	g_hash_table_iter_init(&it, r->pubs);
	while (ok && g_hash_table_iter_next(&it, NULL, &v)) {
		ok = rd_keep_one(r, v, &err);
		any = true;
	}
	if (!ok && !r->k_down) {
		log_msg(r->log, TE_LOG_WARN,
			"%s; keeping this engine's descriptor alive is retried every <= %u ms", err,
			MAX(r->ttl_ms / 3, RD_MIN_PERIOD_MS));
		r->k_down = true;
	} else if (ok && any && r->k_down) {
		log_msg(r->log, TE_LOG_INFO, "redis: %s answers again; descriptor refreshed",
			rd_ep_of(r, &r->wconn)->shown);
		r->k_down = false;
	}
	g_mutex_unlock(&r->wlock);
	g_free(err);
	return ok;
}

static gpointer rd_keeper_main(gpointer data)
{
	struct rd *r = data;
	uint32_t period = MAX(r->ttl_ms / 3, RD_MIN_PERIOD_MS);
	uint32_t backoff = 0;
	gint64 next = g_get_monotonic_time() + (gint64)period * 1000;

	g_mutex_lock(&r->klock);
	while (!r->stop) {
		if (g_get_monotonic_time() < next) {
			g_cond_wait_until(&r->kcond, &r->klock, next);
			continue;
		}
		g_mutex_unlock(&r->klock);
		if (rd_keep_round(r)) {
			backoff = 0;
			next = g_get_monotonic_time() + (gint64)period * 1000;
		} else {
			/* No spinning while the store is down: 100 ms doubling up to ttl / 3. */
			backoff = backoff ? MIN(backoff * 2, period)
					  : MIN(RD_BACKOFF_START_MS, period);
			next = g_get_monotonic_time() + (gint64)backoff * 1000;
		}
		g_mutex_lock(&r->klock);
	}
	g_mutex_unlock(&r->klock);
	return NULL;
}

static enum te_status rd_publish(void *state, const char *name, const char *json, size_t len,
				 char **err_out)
{
	struct rd *r = state;
	g_autofree char *gen = NULL, *rpc = NULL, *holder = NULL;
	enum rd_pub_result res = RD_PUB_OURS;
	struct rd_pub *pub;
	const char *mode;
	enum te_status st;
	bool fresh = false;

	if (len > DESCRIPTOR_MAX_JSON) {
		*err_out = g_strdup_printf("redis: publish '%s': %zu bytes, over the %u-byte limit",
					   name, len, DESCRIPTOR_MAX_JSON);
		return TE_ERR_TOO_LARGE;
	}
	st = rd_own_fields(json, len, &gen, &rpc, err_out);
	if (st != TE_OK)
		return st;
	g_mutex_lock(&r->wlock);
	pub = g_hash_table_lookup(r->pubs, name);
	if (!pub) {
		pub = g_new0(struct rd_pub, 1);
		pub->name = g_strdup(name);
		pub->key = metadata_key(r->ns, name);
		fresh = true;
		mode = "claim";
	} else {
		/* A new generation under the same name (re-created engine) claims again. */
		mode = strcmp(pub->gen, gen) == 0 ? "set" : "claim";
		g_free(pub->json);
		g_free(pub->gen);
		g_free(pub->rpc);
	}
	pub->json = g_memdup2(json, len);
	pub->len = len;
	pub->gen = g_steal_pointer(&gen);
	pub->rpc = g_steal_pointer(&rpc);
	pub->dirty = true; /* until the store has this value */
	pub->claim = strcmp(mode, "claim") == 0;
	st = rd_pub_script(r, pub, mode, &res, &holder, err_out);
	if (st == TE_OK && res == RD_PUB_OTHER) {
		*err_out = g_strdup_printf("redis: segment '%s' is already published by another "
					   "engine (%s) under %s at %s",
					   name, holder, pub->key, rd_ep_of(r, &r->wconn)->shown);
		st = TE_ERR_EXISTS;
	}
	if (st == TE_OK) {
		pub->dirty = false;
		pub->claim = false;
		pub->stolen = false;
	}
	if (fresh) {
		if (st == TE_OK)
			g_hash_table_insert(r->pubs, pub->name, pub);
		else
			rd_pub_free(pub);
	}
	/* A later publish that failed stays dirty: the keeper writes it once the store answers. */
	if (st == TE_OK && !r->keeper)
		r->keeper = g_thread_new("te-redis-keep", rd_keeper_main, r);
	g_mutex_unlock(&r->wlock);
	return st;
}

static enum te_status rd_withdraw(void *state, const char *name, char **err_out)
{
	struct rd *r = state;
	struct rd_pub *pub;
	redisReply *rep = NULL;
	enum te_status st;

	g_mutex_lock(&r->wlock);
	pub = g_hash_table_lookup(r->pubs, name);
	if (!pub) {
		g_mutex_unlock(&r->wlock);
		return TE_OK; /* nothing of ours */
	}
	g_hash_table_steal(r->pubs, name);
	{
		const char *argv[] = { pub->gen };

		st = rd_eval1(r, &r->wconn, true, r->timeout_ms, rd_script_del, pub->key, 1, argv,
			      NULL, &rep, err_out);
	}
	if (st == TE_OK) {
		if (rep->type != REDIS_REPLY_INTEGER) {
			*err_out =
				g_strdup_printf("redis: withdraw %s at %s: %s", pub->key,
						rd_ep_of(r, &r->wconn)->shown, rd_reply_text(rep));
			st = TE_ERR_METADATA;
		} else if (rep->integer == 2) {
			log_msg(r->log, TE_LOG_INFO,
				"redis: withdraw: %s is another engine's now; left as is",
				pub->key);
		}
		freeReplyObject(rep);
	}
	g_mutex_unlock(&r->wlock);
	rd_pub_free(pub);
	return st;
}

/* --- watch --- */

static bool rd_stopping(struct rd *r)
{
	bool s;

	g_mutex_lock(&r->klock);
	s = r->stop;
	g_mutex_unlock(&r->klock);
	return s;
}

/* Sleep @ms or until close; true when closing. */
static bool rd_wait_stop(struct rd *r, uint32_t ms)
{
	struct pollfd pf = { .fd = r->stop_pipe[0], .events = POLLIN };
	gint64 end = g_get_monotonic_time() + (gint64)ms * 1000;

	for (;;) {
		gint64 left = (end - g_get_monotonic_time()) / 1000;
		int n;

		if (rd_stopping(r))
			return true;
		if (left <= 0)
			return false;
		n = poll(&pf, 1, (int)MIN(left, INT_MAX));
		if (n > 0)
			return true;
	}
}

static char *rd_sha1(const char *data, size_t len)
{
	return g_compute_checksum_for_data(G_CHECKSUM_SHA1, (const guchar *)data, len);
}

/*
 * Deliver @name's new value @val, or its delete (NULL). A delete is inferred (resync) when
 * the watch's command connection is not the one it last compared the store on: the server
 * may have restarted without its data, and the key's owner writes it again.
 */
static void rd_emit(struct rd *r, const char *name, GBytes *val)
{
	gsize n = 0;
	const char *d = val ? g_bytes_get_data(val, &n) : NULL;

	r->fn(r->user, name, d, d ? n : 0, !val && r->wcmd.connects != r->w_connects);
}

/*
 * Look at @name again (an event named its key): deliver the new value when it differs from
 * what was seen, or the delete. Only UNAVAILABLE is returned (the rest is logged).
 */
static enum te_status rd_watch_check(struct rd *r, const char *name, const char *key,
				     const char *known_hash, char **err_out)
{
	GBytes *val = NULL;
	char *e = NULL;
	enum te_status st;

	st = rd_get_on(r, &r->wcmd, key, r->timeout_ms, &val, &e);
	if (st == TE_ERR_METADATA_UNAVAILABLE) {
		*err_out = e;
		return st;
	}
	if (st == TE_ERR_METADATA_NOT_FOUND) {
		g_free(e);
		if (g_hash_table_remove(r->seen, name))
			rd_emit(r, name, NULL);
		return TE_OK;
	}
	if (st != TE_OK) {
		/* Not a value we deliver (over the limit, another type): remember its hash
		 * so that polling does not fetch it again until it changes. */
		log_msg(r->log, TE_LOG_DEBUG, "redis: watch: %s", e);
		g_free(e);
		if (known_hash)
			g_hash_table_replace(r->seen, g_strdup(name), g_strdup(known_hash));
		return TE_OK;
	}
	{
		gsize n;
		const char *d = g_bytes_get_data(val, &n);
		char *h = rd_sha1(d, n);
		const char *old = g_hash_table_lookup(r->seen, name);

		if (!old || strcmp(old, h) != 0) {
			g_hash_table_replace(r->seen, g_strdup(name), h);
			rd_emit(r, name, val);
		} else {
			g_free(h);
		}
	}
	g_bytes_unref(val);
	return TE_OK;
}

/*
 * SCAN the namespace and compare with what was seen (SHA-1 of each value, computed by the
 * server so unchanged values are not transferred). @deliver: report the differences (a
 * resync after a reconnect, or a poll); else only record (the first look).
 */
static enum te_status rd_watch_resync(struct rd *r, bool deliver, char **err_out)
{
	g_autoptr(GHashTable) now = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	g_autofree char *cursor = g_strdup("0");
	GHashTableIter it;
	gpointer k, v;
	enum te_status st;

	do {
		const char *argv[] = { "SCAN",	      cursor,  "MATCH",
				       r->scan_match, "COUNT", RD_SCAN_COUNT };
		size_t lens[G_N_ELEMENTS(argv)];
		redisReply *rep = NULL, *keys, *hrep = NULL;

		for (size_t i = 0; i < G_N_ELEMENTS(argv); i++)
			lens[i] = strlen(argv[i]);
		st = rd_call(r, &r->wcmd, false, r->timeout_ms, (int)G_N_ELEMENTS(argv), argv, lens,
			     &rep, err_out);
		if (st != TE_OK)
			return st;
		if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
		    rep->element[0]->type != REDIS_REPLY_STRING ||
		    rep->element[1]->type != REDIS_REPLY_ARRAY) {
			*err_out =
				g_strdup_printf("redis: SCAN %s at %s: %s", r->scan_match,
						rd_ep_of(r, &r->wcmd)->shown, rd_reply_text(rep));
			freeReplyObject(rep);
			/* The watch thread retries this like an outage: all it can do. */
			return TE_ERR_METADATA;
		}
		g_free(cursor);
		cursor = g_strdup(rep->element[0]->str);
		keys = rep->element[1];
		if (keys->elements) {
			size_t n = keys->elements;
			g_autofree const char **av = g_new(const char *, n + 3);
			g_autofree size_t *al = g_new(size_t, n + 3);
			g_autofree char *nk = NULL;
			size_t m = 3;

			av[0] = "EVAL";
			av[1] = rd_script_hash;
			for (size_t i = 0; i < n; i++)
				if (keys->element[i]->type == REDIS_REPLY_STRING &&
				    strlen(keys->element[i]->str) == keys->element[i]->len)
					av[m++] = keys->element[i]->str;
			nk = g_strdup_printf("%zu", m - 3);
			av[2] = nk;
			for (size_t i = 0; i < m; i++)
				al[i] = strlen(av[i]);
			st = rd_call(r, &r->wcmd, false, r->timeout_ms, (int)m, av, al, &hrep,
				     err_out);
			if (st != TE_OK) {
				freeReplyObject(rep);
				return st;
			}
			if (hrep->type != REDIS_REPLY_ARRAY || hrep->elements != m - 3) {
				*err_out = g_strdup_printf("redis: hashing %s* at %s: %s",
							   r->prefix, rd_ep_of(r, &r->wcmd)->shown,
							   rd_reply_text(hrep));
				freeReplyObject(hrep);
				freeReplyObject(rep);
				return TE_ERR_METADATA;
			}
			for (size_t i = 0; i < m - 3; i++) {
				const redisReply *h = hrep->element[i];
				const char *name = metadata_key_name(r->ns, av[3 + i]);

				if (!name || h->type != REDIS_REPLY_STRING || !h->len)
					continue;
				g_hash_table_replace(now, g_strdup(name), g_strdup(h->str));
			}
			freeReplyObject(hrep);
		}
		freeReplyObject(rep);
	} while (strcmp(cursor, "0") != 0);

	if (!deliver) {
		g_hash_table_destroy(r->seen);
		r->seen = g_steal_pointer(&now);
		r->w_connects = r->wcmd.connects;
		return TE_OK;
	}
	/* Deletes first: names seen before and gone now. */
	{
		g_autoptr(GPtrArray) gone = g_ptr_array_new_with_free_func(g_free);

		g_hash_table_iter_init(&it, r->seen);
		while (g_hash_table_iter_next(&it, &k, &v))
			if (!g_hash_table_contains(now, k))
				g_ptr_array_add(gone, g_strdup(k));
		for (guint i = 0; i < gone->len; i++) {
			g_hash_table_remove(r->seen, gone->pdata[i]);
			rd_emit(r, gone->pdata[i], NULL);
		}
	}
	/* New or changed values: fetch and deliver (rd_watch_check records them). */
	g_hash_table_iter_init(&it, now);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		const char *old = g_hash_table_lookup(r->seen, k);
		g_autofree char *key = NULL;

		if (old && strcmp(old, v) == 0)
			continue;
		key = metadata_key(r->ns, k);
		st = rd_watch_check(r, k, key, v, err_out);
		if (st != TE_OK)
			return st;
	}
	r->w_connects = r->wcmd.connects;
	return TE_OK;
}

/*
 * Keyspace notifications on the watch's server: already on (K and the string, generic,
 * expired and evicted classes), or switched on with CONFIG SET. false: unavailable (CONFIG
 * renamed or refused, as managed services do); *why_out says why.
 */
static enum te_status rd_watch_notify_setup(struct rd *r, bool *on_out, char **why_out,
					    char **err_out)
{
	const char *get[] = { "CONFIG", "GET", "notify-keyspace-events" };
	size_t gl[] = { 6, 3, 22 };
	redisReply *rep = NULL;
	g_autofree char *flags = NULL;
	GString *want;
	enum te_status st;
	bool all;

	st = rd_call(r, &r->wcmd, false, r->timeout_ms, 3, get, gl, &rep, err_out);
	if (st != TE_OK)
		return st;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
	    rep->element[1]->type != REDIS_REPLY_STRING) {
		*why_out = g_strdup_printf("CONFIG GET notify-keyspace-events: %s",
					   rep->type == REDIS_REPLY_ARRAY ? "(unexpected)"
									  : rd_reply_text(rep));
		freeReplyObject(rep);
		*on_out = false;
		return TE_OK;
	}
	flags = g_strdup(rep->element[1]->str);
	freeReplyObject(rep);
	all = strchr(flags, 'A') != NULL;
	if (strchr(flags, 'K') && (all || (strchr(flags, '$') && strchr(flags, 'g') &&
					   strchr(flags, 'x') && strchr(flags, 'e')))) {
		*on_out = true;
		return TE_OK;
	}
	want = g_string_new(flags);
	for (const char *c = "K$gxe"; *c; c++)
		if (!strchr(flags, *c) && !(all && *c != 'K'))
			g_string_append_c(want, *c);
	{
		const char *set[] = { "CONFIG", "SET", "notify-keyspace-events", want->str };
		size_t sl[] = { 6, 3, 22, want->len };

		st = rd_call(r, &r->wcmd, false, r->timeout_ms, 4, set, sl, &rep, err_out);
	}
	if (st == TE_OK) {
		if (rep->type == REDIS_REPLY_STATUS) {
			*on_out = true;
		} else {
			*why_out = g_strdup_printf("CONFIG SET notify-keyspace-events %s: %s",
						   want->str, rd_reply_text(rep));
			*on_out = false;
		}
		freeReplyObject(rep);
	}
	g_string_free(want, TRUE);
	return st;
}

/* Send one command on the subscriber connection without waiting for its answer. */
static bool rd_sub_send(redisContext *c, const char *cmd)
{
	int done = 0;

	if (redisAppendCommand(c, cmd) != REDIS_OK)
		return false;
	while (!done)
		if (redisBufferWrite(c, &done) != REDIS_OK)
			return false;
	return true;
}

/* (Re)connect the watch: command connection, notification setup, subscriber. */
static enum te_status rd_watch_connect(struct rd *r, char **err_out)
{
	g_autofree char *why = NULL;
	g_autofree char *pattern = NULL;
	enum te_status st;
	redisReply *rep;
	bool on = false;

	rd_drop(&r->wsub);
	if (!r->wcmd.c) {
		st = rd_connect(r, &r->wcmd, r->wcmd.ep, r->timeout_ms, err_out);
		if (st != TE_OK)
			return st;
	}
	st = rd_watch_notify_setup(r, &on, &why, err_out);
	if (st != TE_OK)
		return st;
	if (on) {
		const struct rd_ep *ep;

		/* Same server as the command connection: events and GETs must agree. */
		st = rd_connect(r, &r->wsub, r->wcmd.ep, r->timeout_ms, err_out);
		if (st != TE_OK)
			return st;
		ep = rd_ep_of(r, &r->wsub);
		pattern = g_strdup_printf("__keyspace@%d__:%s", ep->db, r->scan_match);
		rep = redisCommand(r->wsub.c, "PSUBSCRIBE %s", pattern);
		if (!rep) {
			g_autofree char *e = rd_ctx_err(r->wsub.c, r->timeout_ms);

			*err_out = g_strdup_printf("redis: %s: PSUBSCRIBE: %s", ep->shown, e);
			rd_drop(&r->wsub);
			return TE_ERR_METADATA_UNAVAILABLE;
		}
		if (rep->type != REDIS_REPLY_ARRAY) {
			/* e.g. an ACL without channel rights: poll instead. */
			why = g_strdup_printf("PSUBSCRIBE %s: %s", pattern, rd_reply_text(rep));
			on = false;
			rd_drop(&r->wsub);
		}
		freeReplyObject(rep);
	}
	r->w_notify = on;
	if (r->w_mode_shown != (int)on) {
		if (on)
			log_msg(r->log, TE_LOG_INFO,
				"redis: watching %s by keyspace notifications at %s", r->prefix,
				rd_ep_of(r, &r->wcmd)->shown);
		else
			log_msg(r->log, TE_LOG_INFO,
				"redis: keyspace notifications unavailable at %s (%s); polling %s "
				"every %u ms",
				rd_ep_of(r, &r->wcmd)->shown, why ? why : "?", r->prefix,
				MAX(r->ttl_ms / 2, RD_MIN_PERIOD_MS));
		r->w_mode_shown = on;
	}
	return TE_OK;
}

/* One message on the subscriber connection. */
static enum te_status rd_watch_message(struct rd *r, const redisReply *m, char **err_out)
{
	const char *chan, *ev, *key, *name;

	if (m->type != REDIS_REPLY_ARRAY || m->elements != 4 ||
	    m->element[0]->type != REDIS_REPLY_STRING ||
	    strcmp(m->element[0]->str, "pmessage") != 0 ||
	    m->element[2]->type != REDIS_REPLY_STRING || m->element[3]->type != REDIS_REPLY_STRING)
		return TE_OK; /* PONG, subscribe confirmations */
	chan = m->element[2]->str;
	ev = m->element[3]->str;
	key = strstr(chan, "__:");
	if (!key)
		return TE_OK;
	key += 3;
	name = metadata_key_name(r->ns, key);
	if (!name || !*name)
		return TE_OK;
	/* A TTL change is not a change of the value (the keeper's refresh). */
	if (!strcmp(ev, "expire") || !strcmp(ev, "persist"))
		return TE_OK;
	return rd_watch_check(r, name, key, NULL, err_out);
}

/* Read events until close (TE_OK) or the subscriber connection fails. */
static enum te_status rd_watch_events(struct rd *r, char **err_out)
{
	int ping_ms = (int)CLAMP(r->ttl_ms / 2, 500u, 5000u);
	bool ping_out = false;

	for (;;) {
		redisContext *c = r->wsub.c;
		struct pollfd pf[2] = { { .fd = c->fd, .events = POLLIN },
					{ .fd = r->stop_pipe[0], .events = POLLIN } };
		int n;

		for (;;) {
			void *rep = NULL;
			enum te_status st;

			if (redisGetReplyFromReader(c, &rep) != REDIS_OK) {
				*err_out = g_strdup_printf("redis: %s: subscriber: %s",
							   rd_ep_of(r, &r->wsub)->shown, c->errstr);
				return TE_ERR_METADATA_UNAVAILABLE;
			}
			if (!rep)
				break;
			ping_out = false;
			st = rd_watch_message(r, rep, err_out);
			freeReplyObject(rep);
			if (st != TE_OK)
				return st;
		}
		n = poll(pf, 2, ping_ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			*err_out = g_strdup_printf("redis: watch: poll: %s", g_strerror(errno));
			return TE_ERR_METADATA_UNAVAILABLE;
		}
		if (pf[1].revents)
			return TE_OK; /* closing */
		if (n == 0) {
			/* Quiet: prove the connection is alive (a cut path sends no FIN). */
			if (ping_out) {
				*err_out = g_strdup_printf("redis: %s: no answer to PING within "
							   "%d ms",
							   rd_ep_of(r, &r->wsub)->shown, ping_ms);
				return TE_ERR_METADATA_UNAVAILABLE;
			}
			if (!rd_sub_send(c, "PING")) {
				*err_out = g_strdup_printf("redis: %s: subscriber: %s",
							   rd_ep_of(r, &r->wsub)->shown, c->errstr);
				return TE_ERR_METADATA_UNAVAILABLE;
			}
			ping_out = true;
			continue;
		}
		if (redisBufferRead(c) != REDIS_OK) {
			g_autofree char *e = rd_ctx_err(c, (uint32_t)ping_ms);

			*err_out = g_strdup_printf("redis: %s: subscriber: %s",
						   rd_ep_of(r, &r->wsub)->shown, e);
			return TE_ERR_METADATA_UNAVAILABLE;
		}
	}
}

static gpointer rd_watch_main(gpointer data)
{
	struct rd *r = data;
	uint32_t cap = MAX(r->ttl_ms / 3, RD_MIN_PERIOD_MS);
	uint32_t poll_ms = MAX(r->ttl_ms / 2, RD_MIN_PERIOD_MS);
	uint32_t backoff = 0;
	bool down = false, connected = true; /* watch() connected and took the first look */

	while (!rd_stopping(r)) {
		char *err = NULL;
		enum te_status st = TE_OK;

		if (!connected) {
			st = rd_watch_connect(r, &err);
			if (st == TE_OK)
				st = rd_watch_resync(r, true, &err);
		}
		if (st == TE_OK) {
			if (down)
				log_msg(r->log, TE_LOG_INFO,
					"redis: watch reconnected to %s; changes missed meanwhile "
					"were delivered",
					rd_ep_of(r, &r->wcmd)->shown);
			down = false;
			connected = true;
			backoff = 0;
			if (r->w_notify) {
				st = rd_watch_events(r, &err);
			} else {
				while (!rd_wait_stop(r, poll_ms)) {
					st = rd_watch_resync(r, true, &err);
					if (st != TE_OK)
						break;
				}
			}
			if (st == TE_OK)
				break; /* closing */
		}
		if (!down)
			log_msg(r->log, TE_LOG_WARN,
				"%s; the watch reconnects (every <= %u ms) and then delivers what "
				"changed",
				err, cap);
		g_free(err);
		down = true;
		connected = false;
		rd_drop(&r->wsub);
		rd_drop(&r->wcmd);
		backoff = backoff ? MIN(backoff * 2, cap) : MIN(RD_BACKOFF_START_MS, cap);
		if (rd_wait_stop(r, backoff))
			break;
	}
	return NULL;
}

static enum te_status rd_watch(void *state, metadata_watch_fn fn, void *user, char **err_out)
{
	struct rd *r = state;
	enum te_status st;

	if (r->watcher || r->fn) {
		*err_out = g_strdup("redis: watch: already watching");
		return TE_ERR_INVALID_ARG;
	}
	/* Subscribed and a first look taken before returning: no change after this is lost. */
	st = rd_watch_connect(r, err_out);
	if (st == TE_OK)
		st = rd_watch_resync(r, false, err_out);
	if (st != TE_OK) {
		rd_drop(&r->wsub);
		rd_drop(&r->wcmd);
		return st;
	}
	r->fn = fn;
	r->user = user;
	r->watcher = g_thread_new("te-redis-watch", rd_watch_main, r);
	return TE_OK;
}

static void rd_close(void *state)
{
	struct rd *r = state;
	ssize_t n;

	if (!r)
		return;
	g_mutex_lock(&r->klock);
	r->stop = true;
	g_cond_broadcast(&r->kcond);
	g_mutex_unlock(&r->klock);
	do
		n = write(r->stop_pipe[1], "x", 1);
	while (n < 0 && errno == EINTR);
	if (r->keeper)
		g_thread_join(r->keeper);
	if (r->watcher)
		g_thread_join(r->watcher);
	rd_free(r);
}

const struct metadata_ops metadata_redis_ops = {
	.name = "redis",
	.open = rd_open,
	.get = rd_get,
	.publish = rd_publish,
	.withdraw = rd_withdraw,
	.watch = rd_watch,
	.close = rd_close,
};
