/* SPDX-License-Identifier: Apache-2.0 */
/* control.c: serve descriptors, handshakes, notifies and probes; call peers for them. */
#include <assert.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <te/te_plugin_util.h>

#include "core/batch.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/metadata/descriptor.h"
#include "core/rpc.h"
#include "core/transport.h"
#include "core/wake.h"

#define CONTROL_TIMEOUT_MS 5000u
#define CONTROL_SEEN_MAX 8192u
#define NOTIFY_HDR 16u /* generation u64 + sequence u64 ahead of the message */
/* Quota warnings per second (a flood repeats them); the rest go to debug. */
#define CONTROL_WARN_QUOTA_PER_S 1u
/* Bytes of a peer's refusal text quoted in the sender's log. */
#define CONTROL_REFUSAL_TEXT_MAX 200u

/* A received notify, held until te_notify_recv takes it. */
struct inbox_msg {
	char *host;   /* source address of the connection it came on: a quota key */
	char *sender; /* the name the client gave (te_notify.sender) */
	size_t len;
	uint8_t msg[]; /* len bytes */
};

/*
 * Notifies held per source, so that a flood from one host (or one sender) leaves
 * room for the others. Sender names are the client's choice, so a sender is counted
 * per (source address, name) and each address has a cap of its own. Under
 * e->notify_lock.
 */
struct control_quota {
	uint32_t inbox_max;	 /* control.notify_inbox */
	uint32_t per_sender_max; /* control.notify_per_sender */
	uint32_t per_host_max;	 /* control.notify_per_host */
	GHashTable *per_sender;	 /* "host sender" -> messages held (GUINT_TO_POINTER) */
	GHashTable *per_host;	 /* host -> messages held */
	struct rpc_ratelimit warn;
};

/* A queued outgoing notify. */
struct outgoing {
	char *addr;
	GBytes *body; /* packed: sender name, NUL, header, message */
	char *key;    /* for logs */
};

const char *control_address(const struct engine *e)
{
	return e->advertise ? e->advertise : e->rpc ? rpc_server_address(e->rpc) : "";
}

const char *control_bound_address(const struct engine *e)
{
	return e->rpc ? rpc_server_address(e->rpc) : "";
}

char *control_first_ipv4(void)
{
	struct ifaddrs *ifs = NULL;
	char *found = NULL;

	if (getifaddrs(&ifs) != 0)
		return NULL;
	for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
		char buf[INET_ADDRSTRLEN];

		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
		    (i->ifa_flags & IFF_LOOPBACK))
			continue;
		if (inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, buf,
			      sizeof(buf)))
			found = g_strdup(buf);
	}
	freeifaddrs(ifs);
	return found;
}

/*
 * What peers are told to connect to: the bound address, with engine.advertise (else the
 * host's first non-loopback IPv4 address, else its name) in place of a wildcard host or of
 * the bound host when advertise is set.
 */
static char *control_advertise(const struct engine *e)
{
	const char *bound = rpc_server_address(e->rpc);
	const char *colon = strrchr(bound, ':');
	g_autofree char *host = NULL;
	bool wildcard;

	if (!colon)
		return NULL;
	wildcard = strncmp(bound, "0.0.0.0:", 8) == 0 || strncmp(bound, "[::]:", 5) == 0;
	if (e->cfg->advertise)
		host = g_strdup(e->cfg->advertise);
	else if (!wildcard)
		return NULL;
	else if (!(host = control_first_ipv4()))
		host = g_strdup(g_get_host_name());
	if (strchr(host, ':') && host[0] != '[')
		return g_strdup_printf("[%s]%s", host, colon);
	return g_strdup_printf("%s%s", host, colon);
}

/* --- serving ------------------------------------------------------------------ */

static enum te_status control_serve_desc(struct engine *e, GByteArray *reply)
{
	struct descriptor *d = e->describe_local(e);
	size_t len = 0;
	char *json;

	json = descriptor_encode(d, &len);
	descriptor_free(d);
	if (!json)
		return TE_ERR_NOMEM;
	g_byte_array_append(reply, (const guint8 *)json, (guint)len);
	g_free(json);
	return TE_OK;
}

static enum te_status control_serve_handshake(struct engine *e, const struct rpc_request *req,
					      GByteArray *reply)
{
	struct transport *tp = NULL;
	const uint8_t *p = req->payload;
	size_t n = req->payload_len, name_len, resp_len = 0;
	char peer[DESCRIPTOR_MAX_NAME];
	uint8_t *resp;
	enum te_status st;

	for (unsigned i = 0; i < e->n_tps; i++)
		if (strcmp(e->tps[i]->plugin->name, req->name) == 0)
			tp = e->tps[i];
	if (!tp)
		return TE_ERR_UNSUPPORTED;
	/* payload: u16 sender name length, sender name, request bytes */
	if (n < 2)
		return TE_ERR_PROTOCOL;
	name_len = (size_t)p[0] | (size_t)p[1] << 8;
	if (name_len == 0 || name_len >= sizeof(peer) || name_len > n - 2)
		return TE_ERR_PROTOCOL;
	memcpy(peer, p + 2, name_len);
	peer[name_len] = '\0';
	resp = g_malloc(RPC_DEFAULT_MAX_BODY / 16);
	st = transport_handshake(tp, peer, p + 2 + name_len, n - 2 - name_len, resp,
				 RPC_DEFAULT_MAX_BODY / 16, &resp_len);
	if (st == TE_OK && resp_len <= RPC_DEFAULT_MAX_BODY / 16)
		g_byte_array_append(reply, resp, (guint)resp_len);
	g_free(resp);
	return st;
}

static guint quota_count(GHashTable *t, const char *key)
{
	return GPOINTER_TO_UINT(g_hash_table_lookup(t, key));
}

/* Add @delta to @key's count; a key at 0 is removed, so the tables hold only senders
 * with messages waiting. */
static void quota_add(GHashTable *t, const char *key, int delta)
{
	guint n = quota_count(t, key);

	assert(delta > 0 || n > 0);
	n = (guint)((int)n + delta);
	if (n == 0)
		g_hash_table_remove(t, key);
	else
		g_hash_table_insert(t, g_strdup(key), GUINT_TO_POINTER(n));
}

static char *quota_sender_key(const char *host, const char *sender)
{
	/* A host has no blank, so the first one separates the parts. */
	return g_strdup_printf("%s %s", host, sender);
}

static void inbox_msg_free(gpointer data)
{
	struct inbox_msg *m = data;

	g_free(m->host);
	g_free(m->sender);
	g_free(m);
}

/* Under notify_lock: why the inbox takes no more from (@host, @sender), or NULL. */
static char *control_quota_full(struct engine *e, const char *host, const char *sender_key,
				const char *sender)
{
	struct control_quota *q = e->inbox_quota;
	guint n;

	n = quota_count(q->per_sender, sender_key);
	if (n >= q->per_sender_max)
		return g_strdup_printf("notify refused: %u messages from sender \"%s\" at %s wait "
				       "in the inbox, the per-sender limit "
				       "(control.notify_per_sender); the receiver takes them with "
				       "te_notify_recv",
				       n, sender, host);
	n = quota_count(q->per_host, host);
	if (n >= q->per_host_max)
		return g_strdup_printf("notify refused: %u messages from %s wait in the inbox, the "
				       "per-host limit (control.notify_per_host); the receiver "
				       "takes them with te_notify_recv",
				       n, host);
	n = g_queue_get_length(e->inbox);
	if (n >= q->inbox_max)
		return g_strdup_printf("notify refused: the inbox holds %u messages, its limit "
				       "(control.notify_inbox); the receiver takes them with "
				       "te_notify_recv",
				       n);
	return NULL;
}

static enum te_status control_serve_notify(struct engine *e, const struct rpc_request *req,
					   GByteArray *reply)
{
	g_autofree char *key = NULL, *sender_key = NULL, *full = NULL;
	struct inbox_msg *msg;
	uint32_t demoted = 0;
	bool warn = false;
	size_t len;

	if (req->payload_len < NOTIFY_HDR || req->payload_len - NOTIFY_HDR > TE_NOTIFY_MAX)
		return TE_ERR_PROTOCOL;
	len = req->payload_len - NOTIFY_HDR;
	/* The source address is part of the key: a client cannot mark another host's
	 * notifies as already delivered by using its sender name. */
	key = g_strdup_printf("%s/%s/%016" PRIx64 "/%" PRIu64, req->host, req->name,
			      te_plugin_get_u64(req->payload), te_plugin_get_u64(req->payload + 8));
	sender_key = quota_sender_key(req->host, req->name);
	g_mutex_lock(&e->notify_lock);
	if (g_hash_table_contains(e->inbox_seen, key)) {
		/* A resend whose first copy arrived: exactly once. */
		goto out;
	}
	full = control_quota_full(e, req->host, sender_key, req->name);
	if (full) {
		warn = rpc_ratelimit_pass(&e->inbox_quota->warn, CONTROL_WARN_QUOTA_PER_S,
					  g_get_monotonic_time(), &demoted);
		goto out;
	}
	msg = g_malloc(sizeof(*msg) + len);
	msg->host = g_strdup(req->host);
	msg->sender = g_strdup(req->name);
	msg->len = len;
	if (len)
		memcpy(msg->msg, req->payload + NOTIFY_HDR, len);
	g_queue_push_tail(e->inbox, msg);
	quota_add(e->inbox_quota->per_sender, sender_key, 1);
	quota_add(e->inbox_quota->per_host, req->host, 1);
	g_hash_table_add(e->inbox_seen, g_strdup(key));
	g_queue_push_tail(e->inbox_seen_order, g_strdup(key));
	while (g_queue_get_length(e->inbox_seen_order) > CONTROL_SEEN_MAX) {
		char *old = g_queue_pop_head(e->inbox_seen_order);

		g_hash_table_remove(e->inbox_seen, old);
		g_free(old);
	}
out:
	g_mutex_unlock(&e->notify_lock);
	if (!full)
		return TE_OK;
	if (warn && demoted)
		ENGINE_LOG(e, TE_LOG_WARN,
			   "%s (and %" PRIu32 " more refused since the last warning, logged at "
			   "debug level)",
			   full, demoted);
	else
		ENGINE_LOG(e, warn ? TE_LOG_WARN : TE_LOG_DEBUG, "%s", full);
	g_byte_array_append(reply, (const guint8 *)full, (guint)strlen(full));
	return TE_ERR_BUSY;
}

static enum te_status control_handle(void *user, const struct rpc_request *req, GByteArray *reply)
{
	struct engine *e = user;

	switch (req->type) {
	case RPC_DESC_FETCH:
		return control_serve_desc(e, reply);
	case RPC_HANDSHAKE:
		return control_serve_handshake(e, req, reply);
	case RPC_NOTIFY:
		return control_serve_notify(e, req, reply);
	case RPC_PROBE: {
		g_autofree char *s = g_strdup_printf("%s %016" PRIx64, e->name, e->generation);

		g_byte_array_append(reply, (const guint8 *)s, (guint)strlen(s));
		return TE_OK;
	}
	default:
		return TE_ERR_PROTOCOL;
	}
}

/* --- lifetime ------------------------------------------------------------------ */

static const char *control_file_kind(mode_t mode)
{
	if (S_ISDIR(mode))
		return "directory";
	if (S_ISCHR(mode))
		return "character device";
	if (S_ISBLK(mode))
		return "block device";
	if (S_ISFIFO(mode))
		return "FIFO";
	if (S_ISSOCK(mode))
		return "socket";
	return "not a regular file";
}

enum te_status control_secret_load(const char *path, char **secret_out, size_t *len_out,
				   char **err_out)
{
	/* One byte over the cap tells "too large" without trusting st_size. */
	char *buf = g_malloc(RPC_MAX_SECRET + 1);
	enum te_status st = TE_ERR_CONFIG;
	struct stat sb;
	size_t len = 0;
	int fd;

	/* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		*err_out = g_strdup_printf("auth.secret_file: cannot open %s: %s", path,
					   g_strerror(errno));
		goto out;
	}
	if (fstat(fd, &sb) < 0) {
		*err_out = g_strdup_printf("auth.secret_file: cannot stat %s: %s", path,
					   g_strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(sb.st_mode)) {
		*err_out = g_strdup_printf("auth.secret_file: %s is not a regular file (%s)", path,
					   control_file_kind(sb.st_mode));
		goto out_close;
	}
	if (sb.st_mode & 077) {
		const char *how = (sb.st_mode & 044) && (sb.st_mode & 022) ? "readable and writable"
				  : (sb.st_mode & 044)			   ? "readable"
				  : (sb.st_mode & 022)			   ? "writable"
									   : "accessible";

		*err_out = g_strdup_printf("auth.secret_file: %s is %s by group or others (mode "
					   "%04o); run chmod 600 %s",
					   path, how, (unsigned)(sb.st_mode & 07777), path);
		goto out_close;
	}
	if (sb.st_size > (off_t)RPC_MAX_SECRET) {
		*err_out =
			g_strdup_printf("auth.secret_file: %s is %jd bytes, over the %u-byte limit",
					path, (intmax_t)sb.st_size, RPC_MAX_SECRET);
		goto out_close;
	}
	while (len < RPC_MAX_SECRET + 1) {
		ssize_t n = read(fd, buf + len, RPC_MAX_SECRET + 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			*err_out = g_strdup_printf("auth.secret_file: cannot read %s: %s", path,
						   g_strerror(errno));
			goto out_close;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len > RPC_MAX_SECRET) {
		*err_out = g_strdup_printf("auth.secret_file: %s is over the %u-byte limit", path,
					   RPC_MAX_SECRET);
		goto out_close;
	}
	/* Bytes as they are, NUL included; only one final newline goes ("echo s > f"). */
	if (len && buf[len - 1] == '\n') {
		len--;
		if (len && buf[len - 1] == '\r')
			len--;
	}
	if (len == 0) {
		*err_out = g_strdup_printf("auth.secret_file: %s is empty", path);
		goto out_close;
	}
	if (len < CONFIG_MIN_SECRET) {
		*err_out = g_strdup_printf("auth.secret_file: %s holds %zu byte%s, too short (at "
					   "least %d; a final newline does not count)",
					   path, len, len == 1 ? "" : "s", CONFIG_MIN_SECRET);
		goto out_close;
	}
	*secret_out = g_malloc(len);
	memcpy(*secret_out, buf, len);
	*len_out = len;
	st = TE_OK;
out_close:
	close(fd);
out:
	explicit_bzero(buf, RPC_MAX_SECRET + 1);
	g_free(buf);
	return st;
}

enum te_status control_start(struct engine *e, char **err_out)
{
	const struct config *cfg = e->cfg;
	struct rpc_server_config rc = { 0 };
	enum te_status st;

	g_mutex_init(&e->notify_lock);
	e->inbox = g_queue_new();
	e->outbox = g_queue_new();
	e->inbox_seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	e->inbox_seen_order = g_queue_new();
	e->inbox_quota = g_new0(struct control_quota, 1);
	e->inbox_quota->inbox_max = cfg->control_notify_inbox;
	e->inbox_quota->per_sender_max = cfg->control_notify_per_sender;
	e->inbox_quota->per_host_max = cfg->control_notify_per_host;
	e->inbox_quota->per_sender = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	e->inbox_quota->per_host = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

	/* The secret is bytes (secret_len of them, NUL included), never a C string. */
	if (cfg->auth_secret) {
		e->secret_len = strlen(cfg->auth_secret);
		e->secret = g_malloc(e->secret_len);
		memcpy(e->secret, cfg->auth_secret, e->secret_len);
	} else if (cfg->auth_secret_file) {
		st = control_secret_load(cfg->auth_secret_file, &e->secret, &e->secret_len,
					 err_out);
		if (st != TE_OK)
			return st;
	}
	st = rpc_client_new(e->secret, e->secret_len, &e->log, &e->rpc_client);
	if (st != TE_OK) {
		*err_out = g_strdup("control plane: cannot create the client");
		return st;
	}
	rc.listen_addr = cfg->listen;
	rc.secret = e->secret;
	rc.secret_len = e->secret_len;
	rc.handle = control_handle;
	rc.user = e;
	rc.log = &e->log;
	rc.max_body = (uint32_t)cfg->control_max_frame;
	rc.max_buffered = cfg->control_max_buffered;
	rc.idle_timeout_ms = cfg->control_idle_timeout_ms;
	rc.frame_timeout_ms = cfg->control_frame_timeout_ms;
	rc.auth_timeout_ms = cfg->control_auth_timeout_ms;
	rc.max_connections = cfg->control_max_connections;
	rc.max_connections_per_host = cfg->control_max_connections_per_host;
	rc.max_unauthenticated = cfg->control_max_unauthenticated;
	st = rpc_server_start(&rc, &e->rpc, err_out);
	if (st != TE_OK)
		return st;
	e->advertise = control_advertise(e);
	return TE_OK;
}

void control_stop(struct engine *e)
{
	/*
	 * Notifies of batches that completed before the application freed the engine are
	 * still sent (bounded: a dead peer cannot hold the engine's end longer than 2 s).
	 */
	if (e->outbox && e->rpc_client) {
		control_send_notifies_until(e, engine_now_ns() + 2000000000ull);
		g_mutex_lock(&e->notify_lock);
		if (!g_queue_is_empty(e->outbox))
			ENGINE_LOG(e, TE_LOG_WARN,
				   "%u notify message(s) not sent: the engine was freed before "
				   "their peers answered",
				   g_queue_get_length(e->outbox));
		g_mutex_unlock(&e->notify_lock);
	}
	rpc_server_stop(e->rpc);
	e->rpc = NULL;
	g_clear_pointer(&e->advertise, g_free);
	rpc_client_free(e->rpc_client);
	e->rpc_client = NULL;
	if (e->inbox) {
		g_queue_free_full(e->inbox, inbox_msg_free);
		while (!g_queue_is_empty(e->outbox)) {
			struct outgoing *o = g_queue_pop_head(e->outbox);

			g_free(o->addr);
			g_free(o->key);
			g_bytes_unref(o->body);
			g_free(o);
		}
		g_queue_free(e->outbox);
		g_hash_table_destroy(e->inbox_seen);
		g_queue_free_full(e->inbox_seen_order, g_free);
		g_hash_table_destroy(e->inbox_quota->per_sender);
		g_hash_table_destroy(e->inbox_quota->per_host);
		g_clear_pointer(&e->inbox_quota, g_free);
		g_mutex_clear(&e->notify_lock);
		e->inbox = NULL;
	}
	if (e->secret)
		explicit_bzero(e->secret, e->secret_len);
	g_clear_pointer(&e->secret, g_free);
	e->secret_len = 0;
}

/* --- calling peers ------------------------------------------------------------- */

enum te_status control_peer_handshake(struct engine *e, const char *plugin, const char *peer_name,
				      const char *addr, const void *req, size_t len, void *resp,
				      size_t cap, size_t *resp_len_out, uint32_t timeout_ms)
{
	g_autoptr(GByteArray) body = g_byte_array_new();
	g_autofree char *err = NULL;
	g_autoptr(GBytes) reply = NULL;
	size_t nlen = strlen(e->name);
	uint8_t hdr[2] = { (uint8_t)nlen, (uint8_t)(nlen >> 8) };
	g_autoptr(GByteArray) payload = g_byte_array_new();
	int32_t status = 0;
	enum te_status st;
	const void *data;
	gsize rlen = 0;

	if (!peer_name || !addr || (len && !req) || !resp_len_out)
		return TE_ERR_INVALID_ARG;
	g_byte_array_append(payload, hdr, 2);
	g_byte_array_append(payload, (const guint8 *)e->name, (guint)nlen);
	if (len)
		g_byte_array_append(payload, req, (guint)len);
	st = rpc_body_pack(body, plugin, payload->data, payload->len);
	if (st != TE_OK)
		return st;
	st = rpc_client_call(e->rpc_client, addr, RPC_HANDSHAKE, body->data, body->len,
			     timeout_ms ? timeout_ms : CONTROL_TIMEOUT_MS, &reply, &status, &err);
	if (st != TE_OK) {
		ENGINE_LOG(e, TE_LOG_WARN, "%s: handshake with %s failed: %s", plugin, peer_name,
			   err ? err : te_status_str(st));
		return st;
	}
	if (status != TE_OK)
		return status;
	data = g_bytes_get_data(reply, &rlen);
	if (rlen > cap)
		return TE_ERR_TOO_LARGE;
	if (rlen)
		memcpy(resp, data, rlen);
	*resp_len_out = rlen;
	return TE_OK;
}

void control_queue_notify(struct engine *e, const char *addr, GBytes *msg)
{
	struct outgoing *o = g_new0(struct outgoing, 1);
	g_autoptr(GByteArray) body = g_byte_array_new();
	g_autoptr(GByteArray) payload = g_byte_array_new();
	uint64_t seq = atomic_fetch_add(&e->notify_seq, 1);
	uint8_t hdr[NOTIFY_HDR];
	gsize len = 0;
	const void *data = g_bytes_get_data(msg, &len);

	te_plugin_put_u64(hdr, e->generation);
	te_plugin_put_u64(hdr + 8, seq);
	g_byte_array_append(payload, hdr, sizeof(hdr));
	if (len)
		g_byte_array_append(payload, data, (guint)len);
	if (rpc_body_pack(body, e->name, payload->data, payload->len) != TE_OK) {
		ENGINE_LOG(e, TE_LOG_ERROR, "notify to %s dropped: engine name not sendable", addr);
		g_free(o);
		return;
	}
	o->addr = g_strdup(addr);
	o->body = g_byte_array_free_to_bytes(g_steal_pointer(&body));
	o->key = g_strdup_printf("#%" PRIu64, seq);
	g_mutex_lock(&e->notify_lock);
	g_queue_push_tail(e->outbox, o);
	g_mutex_unlock(&e->notify_lock);
	wake_kick_hard(e);
}

unsigned control_send_notifies(struct engine *e)
{
	return control_send_notifies_until(e, UINT64_MAX);
}

unsigned control_send_notifies_until(struct engine *e, uint64_t give_up_ns)
{
	unsigned n = 0;

	for (;;) {
		struct outgoing *o;
		enum te_status st = TE_ERR_INTERNAL;
		int32_t status = 0;
		uint64_t now = engine_now_ns();
		uint32_t timeout_ms = CONTROL_TIMEOUT_MS;

		if (now >= give_up_ns)
			break;
		if (give_up_ns != UINT64_MAX)
			timeout_ms = (uint32_t)MIN((uint64_t)CONTROL_TIMEOUT_MS,
						   (give_up_ns - now) / 1000000 + 1);
		g_mutex_lock(&e->notify_lock);
		o = e->outbox ? g_queue_pop_head(e->outbox) : NULL;
		g_mutex_unlock(&e->notify_lock);
		if (!o)
			break;
		/* Resends are safe: the receiver drops duplicates by (sender, gen, seq). */
		g_autofree char *refusal = NULL;

		for (int attempt = 0; attempt < 3; attempt++) {
			g_autofree char *err = NULL;
			GBytes *reply = NULL;
			gsize len = 0;
			const void *data = g_bytes_get_data(o->body, &len);

			st = rpc_client_call(e->rpc_client, o->addr, RPC_NOTIFY, data, len,
					     timeout_ms, &reply, &status, &err);
			if (st == TE_OK && status != TE_OK) {
				gsize rlen = 0;
				const char *text = g_bytes_get_data(reply, &rlen);

				refusal =
					g_strndup(text, MIN(rlen, (gsize)CONTROL_REFUSAL_TEXT_MAX));
				/* Printable only: the text is the peer's. */
				for (char *c = refusal; *c; c++)
					if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
						*c = '?';
			}
			if (reply)
				g_bytes_unref(reply);
			if (st == TE_OK)
				break;
			ENGINE_LOG(e, TE_LOG_WARN, "notify %s to %s: attempt %d failed: %s", o->key,
				   o->addr, attempt + 1, err ? err : te_status_str(st));
			if ((st != TE_ERR_TIMEOUT && st != TE_ERR_CONN_RESET) ||
			    engine_now_ns() >= give_up_ns)
				break;
		}
		if (st == TE_OK && status != TE_OK)
			ENGINE_LOG(e, TE_LOG_WARN, "notify %s to %s refused (%s): %s", o->key,
				   o->addr, te_status_str(status), refusal ? refusal : "");
		g_free(o->addr);
		g_free(o->key);
		g_bytes_unref(o->body);
		g_free(o);
		n++;
	}
	return n;
}

/* A probe reply is "<name> <generation hex>". */
static bool control_parse_generation(GBytes *reply, uint64_t *gen_out)
{
	gsize len = 0;
	const char *data = g_bytes_get_data(reply, &len);
	g_autofree char *text = g_strndup(data, len);
	const char *sp = strrchr(text, ' ');
	guint64 gen;

	if (!sp || !g_ascii_string_to_unsigned(sp + 1, 16, 0, G_MAXUINT64, &gen, NULL))
		return false;
	*gen_out = (uint64_t)gen;
	return true;
}

enum te_status control_probe(struct engine *e, const char *addr, uint32_t timeout_ms,
			     uint64_t *gen_out, bool *has_gen_out, char **err_out)
{
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	enum te_status st;

	st = rpc_client_call(e->rpc_client, addr, RPC_PROBE, NULL, 0, timeout_ms ? timeout_ms : 1,
			     &reply, &status, &err);
	if (st == TE_OK && status == TE_OK) {
		*has_gen_out = control_parse_generation(reply, gen_out);
		g_bytes_unref(reply);
		return TE_OK;
	}
	if (reply)
		g_bytes_unref(reply);
	if (st == TE_ERR_TIMEOUT)
		return TE_ERR_TIMEOUT;
	*err_out = err ? g_steal_pointer(&err) : g_strdup(te_status_str(st != TE_OK ? st : status));
	return TE_ERR_PEER_UNREACHABLE;
}

/* --- public API ------------------------------------------------------------------ */

enum te_status te_notify_recv(struct te_engine *engine, struct te_notify *msgs, size_t max,
			      size_t *n_out)
{
	ENGINE_OR_FAIL(engine, "te_notify_recv");
	size_t n = 0;

	if (!n_out || (max && !msgs))
		return log_error(TE_ERR_INVALID_ARG, "te_notify_recv: NULL argument");
	g_mutex_lock(&e->notify_lock);
	while (n < max && !g_queue_is_empty(e->inbox)) {
		struct inbox_msg *m = g_queue_pop_head(e->inbox);
		g_autofree char *sender_key = quota_sender_key(m->host, m->sender);
		struct te_notify *out = &msgs[n++];

		memset(out, 0, sizeof(*out));
		g_strlcpy(out->sender, m->sender, sizeof(out->sender));
		out->len = m->len;
		memcpy(out->msg, m->msg, m->len);
		quota_add(e->inbox_quota->per_sender, sender_key, -1);
		quota_add(e->inbox_quota->per_host, m->host, -1);
		inbox_msg_free(m);
	}
	g_mutex_unlock(&e->notify_lock);
	*n_out = n;
	return TE_OK;
}
