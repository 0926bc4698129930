/* SPDX-License-Identifier: Apache-2.0 */
/* segment.c: open remote segments from descriptors, build the local one, resolve peers. */
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "core/control.h"
#include "core/engine.h"
#include "core/metadata/metadata.h"
#include "core/segment.h"
#include "core/transport.h"

/* A refresh blocks the submit that triggers it: keep it short. */
#define SEGMENT_REFRESH_TIMEOUT_MS 1000u

/* Set while segview_new loads peers of a descriptor on this thread (handshake routing). */
static _Thread_local const struct descriptor *loading_desc;

/* What load_peer_ex learns of the peer described by @d (TE_PLUGIN_PEER_* flags). */
static uint32_t segview_peer_flags(const struct engine *e, const struct descriptor *d)
{
	uint32_t f = 0;

	if (!d->host_id || !*d->host_id || g_strcmp0(d->host_id, e->host_id) != 0)
		return 0;
	f |= TE_PLUGIN_PEER_SAME_HOST;
	/* Without a namespace on either side (an older peer), the pid cannot be trusted. */
	if (!d->pid_ns || !*d->pid_ns || g_strcmp0(d->pid_ns, e->pid_ns) != 0)
		return f;
	f |= TE_PLUGIN_PEER_SAME_PID_NS;
	if (d->pid == (uint32_t)getpid())
		f |= TE_PLUGIN_PEER_SAME_PROCESS;
	return f;
}

/* Whether transport @tp may be used towards the segment @d, and why not. */
static bool segview_reachable(struct engine *e, struct transport *tp, const struct descriptor *d,
			      char *why, size_t why_len)
{
	uint32_t peer = segview_peer_flags(e, d);

	if ((tp->caps.flags & TE_PLUGIN_CAP_SAME_HOST_ONLY) && !(peer & TE_PLUGIN_PEER_SAME_HOST)) {
		g_snprintf(why, why_len, "%s: same-host transport, peer is on another host",
			   tp->plugin->name);
		return false;
	}
	if ((tp->caps.flags & TE_PLUGIN_CAP_SAME_PROCESS_ONLY) &&
	    !(peer & TE_PLUGIN_PEER_SAME_PROCESS)) {
		g_snprintf(why, why_len, "%s: same-process transport, peer is another process",
			   tp->plugin->name);
		return false;
	}
	return true;
}

enum te_status segview_new(struct engine *e, struct descriptor *desc, struct segview **view_out,
			   char **err_out)
{
	struct segview *v = g_new0(struct segview, 1);
	g_autoptr(GString) reasons = g_string_new(NULL);
	unsigned usable = 0;

	atomic_init(&v->refs, 1);
	v->engine = e;
	v->desc = desc;
	v->tps = g_new0(struct segview_tp, e->n_tps ? e->n_tps : 1);
	v->rkeys = g_new0(struct te_plugin_rkey *,
			  (desc->n_buffers ? desc->n_buffers : 1) * (e->n_tps ? e->n_tps : 1));
	for (unsigned t = 0; t < e->n_tps; t++) {
		struct transport *tp = e->tps[t];
		struct segview_tp *vt = &v->tps[t];
		GBytes *blob = descriptor_find_blob(desc->transports, desc->n_transports,
						    tp->plugin->name);
		struct te_plugin_peer_info info;
		enum te_status st;
		gsize len = 0;
		const void *data;

		vt->tp = tp;
		if (tp->cfg && tp->cfg->memory_only) {
			g_snprintf(vt->why, sizeof(vt->why),
				   "%s: memory_only (loaded for the memory it owns)",
				   tp->plugin->name);
			goto skip;
		}
		if (!blob) {
			g_snprintf(vt->why, sizeof(vt->why), "%s: not offered by the peer",
				   tp->plugin->name);
			goto skip;
		}
		if (!segview_reachable(e, tp, desc, vt->why, sizeof(vt->why)))
			goto skip;
		data = g_bytes_get_data(blob, &len);
		info = (struct te_plugin_peer_info){
			.size = sizeof(info),
			.flags = segview_peer_flags(e, desc),
			.name = desc->name,
			.host_id = desc->host_id ? desc->host_id : "",
			.pid = desc->pid,
		};
		loading_desc = desc; /* lets load_peer handshake with this peer */
		st = transport_load_peer(tp, &info, data, len, &vt->peer);
		loading_desc = NULL;
		if (st != TE_OK) {
			vt->peer = NULL;
			g_snprintf(vt->why, sizeof(vt->why), "%s: load_peer failed: %s%s%s",
				   tp->plugin->name, te_status_str(st),
				   *transport_error(tp) ? ": " : "", transport_error(tp));
			goto skip;
		}
		for (size_t b = 0; b < desc->n_buffers; b++) {
			const struct descriptor_buffer *db = &desc->buffers[b];
			GBytes *key = descriptor_find_blob(db->keys, db->n_keys, tp->plugin->name);
			struct te_plugin_rkey *rk = NULL;

			if (!key)
				continue;
			data = g_bytes_get_data(key, &len);
			st = transport_unpack_remote_key(tp, vt->peer, data, len, db->addr,
							 db->length, &rk);
			if (st != TE_OK) {
				ENGINE_LOG(e, TE_LOG_WARN,
					   "segment %s: %s: key of buffer 0x%llx rejected: %s%s%s",
					   desc->name, tp->plugin->name,
					   (unsigned long long)db->addr, te_status_str(st),
					   *transport_error(tp) ? ": " : "", transport_error(tp));
				continue;
			}
			v->rkeys[b * e->n_tps + t] = rk;
		}
		usable++;
		continue;
skip:
		g_string_append_printf(reasons, "%s%s", reasons->len ? "; " : "", vt->why);
	}
	if (log_enabled(&e->log, TE_LOG_DEBUG)) {
		g_autoptr(GString) ok = g_string_new(NULL);

		for (unsigned t = 0; t < e->n_tps; t++)
			if (v->tps[t].peer)
				g_string_append_printf(ok, "%s%s", ok->len ? ", " : "",
						       e->tps[t]->plugin->name);
		ENGINE_LOG(e, TE_LOG_DEBUG, "segment %s: transports in priority order: %s%s%s",
			   desc->name, ok->len ? ok->str : "none",
			   reasons->len ? "; refused: " : "", reasons->str);
	}
	if (!usable) {
		*err_out =
			g_strdup_printf("segment '%s': no transport can reach it: %s", desc->name,
					e->n_tps ? reasons->str : "no transports installed");
		v->desc = NULL; /* the caller still owns desc on failure */
		segview_unref(v);
		return TE_ERR_NO_TRANSPORT;
	}
	*view_out = v;
	return TE_OK;
}

void segview_ref(struct segview *v)
{
	atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
}

void segview_unref(struct segview *v)
{
	struct engine *e;

	if (!v || atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) != 1)
		return;
	e = v->engine;
	for (unsigned t = 0; t < e->n_tps; t++) {
		struct transport *tp = e->tps[t];

		if (!v->tps[t].peer || atomic_load(&tp->stopped))
			continue; /* fini released the plugin's peers and keys */
		for (size_t b = 0; v->desc && b < v->desc->n_buffers; b++)
			if (v->rkeys[b * e->n_tps + t])
				transport_release_remote_key(tp, v->rkeys[b * e->n_tps + t]);
		transport_unload_peer(tp, v->tps[t].peer);
	}
	descriptor_free(v->desc);
	g_free(v->tps);
	g_free(v->rkeys);
	g_free(v);
}

struct segment *segment_get_locked(struct engine *e, te_segment_id id)
{
	if (id == 0 || id >= e->segments->len)
		return NULL;
	return g_ptr_array_index(e->segments, id);
}

void segment_free(struct segment *s)
{
	if (!s)
		return;
	g_free(s->departed);
	g_free(s->absent);
	segview_unref(s->view);
	g_free(s->name);
	g_free(s);
}

static struct segment *segment_find_name_locked(struct engine *e, const char *name)
{
	for (guint i = 1; i < e->segments->len; i++) {
		struct segment *s = g_ptr_array_index(e->segments, i);

		if (s && strcmp(s->name, name) == 0)
			return s;
	}
	return NULL;
}

/*
 * Whether @a and @b publish different transport blobs: a refresh that finds them changed
 * within one generation (a transport instance of the peer was replaced, or its address
 * answered with another instance) loads the peer anew instead of keeping stale handles.
 */
static bool segment_blobs_differ(const struct descriptor *a, const struct descriptor *b)
{
	if (a->n_transports != b->n_transports)
		return true;
	for (size_t i = 0; i < a->n_transports; i++) {
		GBytes *o = descriptor_find_blob(b->transports, b->n_transports,
						 a->transports[i].transport);

		if (!o || !g_bytes_equal(o, a->transports[i].blob))
			return true;
	}
	return false;
}

/* Whether @a and @b list different buffers (a registration came or went). */
static bool segment_buffers_differ(const struct descriptor *a, const struct descriptor *b)
{
	if (a->n_buffers != b->n_buffers)
		return true;
	for (size_t i = 0; i < a->n_buffers; i++) {
		const struct descriptor_buffer *x = &a->buffers[i], *y = &b->buffers[i];

		if (x->addr != y->addr || x->length != y->length || x->access != y->access ||
		    x->n_keys != y->n_keys || strcmp(x->location, y->location) != 0)
			return true;
		for (size_t k = 0; k < x->n_keys; k++)
			if (strcmp(x->keys[k].transport, y->keys[k].transport) != 0 ||
			    !g_bytes_equal(x->keys[k].blob, y->keys[k].blob))
				return true;
	}
	return false;
}

/*
 * The open segment's view may stay: same generation, and (on a refresh) the same blobs and
 * buffers.
 */
static bool segment_same_view(const struct segview *v, const struct descriptor *d, bool refresh)
{
	return v->desc->generation == d->generation &&
	       !(refresh &&
		 (segment_blobs_differ(v->desc, d) || segment_buffers_differ(v->desc, d)));
}

/* A descriptor for @s came from the store or the application: it is not gone. */
static void segment_present_locked(struct engine *e, struct segment *s)
{
	if (s->departed || s->absent)
		ENGINE_LOG(e, TE_LOG_INFO, "segment %s: its descriptor is back: usable again",
			   s->name);
	g_clear_pointer(&s->departed, g_free);
	g_clear_pointer(&s->absent, g_free);
	s->absent_until_ns = 0;
}

const char *segment_gone_locked(const struct segment *s)
{
	if (s->departed)
		return s->departed;
	if (s->absent_until_ns && engine_now_ns() >= s->absent_until_ns)
		return s->absent;
	return NULL;
}

/*
 * segment_import_desc, and with @fetched (segment_refresh_stale's own fetch, not a watch's
 * news): a refresh that finds the view unchanged stamps unchanged_ns (segment_refetch). A
 * watch's unchanged value (the owner writing its key again) does not: the store may already
 * hold a newer one than the watch has delivered.
 */
static enum te_status segment_import(struct engine *e, const char *key, struct descriptor *desc,
				     bool refresh, bool fetched, te_segment_id *id_out)
{
	struct segview *v = NULL, *old = NULL;
	g_autofree char *err = NULL;
	g_autofree char *name = g_strdup(key ? key : desc->name);
	struct segment *s;
	enum te_status st;

	g_rw_lock_reader_lock(&e->seg_lock);
	s = segment_find_name_locked(e, name);
	if (s && segment_same_view(s->view, desc, refresh)) {
		/* Same incarnation: just another reference. */
		g_rw_lock_reader_unlock(&e->seg_lock);
		g_rw_lock_writer_lock(&e->seg_lock);
		s = segment_find_name_locked(e, name);
		if (s && segment_same_view(s->view, desc, refresh)) {
			if (!refresh)
				s->open_count++;
			else if (fetched) /* nothing new: misses and refusals wait */
				atomic_store_explicit(&s->unchanged_ns, engine_now_ns(),
						      memory_order_relaxed);
			segment_present_locked(e, s);
			*id_out = s->id;
			g_rw_lock_writer_unlock(&e->seg_lock);
			descriptor_free(desc);
			return TE_OK;
		}
		g_rw_lock_writer_unlock(&e->seg_lock);
	} else {
		g_rw_lock_reader_unlock(&e->seg_lock);
	}

	/* Peers are loaded outside the segment lock: load_peer may connect. */
	st = segview_new(e, desc, &v, &err);
	if (st != TE_OK) {
		descriptor_free(desc);
		return log_error(st, "%s", err);
	}
	g_rw_lock_writer_lock(&e->seg_lock);
	s = segment_find_name_locked(e, name);
	if (s) {
		if (!segment_same_view(s->view, v->desc, refresh)) {
			if (s->view->desc->generation != v->desc->generation)
				ENGINE_LOG(e, TE_LOG_INFO,
					   "segment %s: generation %llu replaces %llu (peer "
					   "restarted)",
					   s->name, (unsigned long long)v->desc->generation,
					   (unsigned long long)s->view->desc->generation);
			else if (segment_blobs_differ(s->view->desc, v->desc))
				ENGINE_LOG(e, TE_LOG_INFO,
					   "segment %s: transports changed within generation "
					   "%llu: peers loaded anew",
					   s->name, (unsigned long long)v->desc->generation);
			else
				ENGINE_LOG(e, TE_LOG_DEBUG,
					   "segment %s: %zu buffers now (were %zu)", s->name,
					   v->desc->n_buffers, s->view->desc->n_buffers);
			old = s->view;
			old->stale = true;
			s->view = v;
			v = NULL;
			/*
			 * A miss or refusal just led somewhere new: the next one (the peer
			 * registering again) may ask for a fetch at once (segment_refetch).
			 */
			atomic_store_explicit(&s->unchanged_ns, 0, memory_order_relaxed);
		} else if (fetched) {
			atomic_store_explicit(&s->unchanged_ns, engine_now_ns(),
					      memory_order_relaxed);
		}
		if (!refresh)
			s->open_count++;
		segment_present_locked(e, s);
	} else if (refresh) {
		/* Closed while we fetched: nothing to refresh. */
		g_rw_lock_writer_unlock(&e->seg_lock);
		segview_unref(v);
		return log_error(TE_ERR_UNKNOWN_SEGMENT, "segment '%s' was closed", name);
	} else {
		if (e->segments->len >= UINT32_MAX - 1) {
			g_rw_lock_writer_unlock(&e->seg_lock);
			segview_unref(v);
			return log_error(TE_ERR_TOO_LARGE, "too many open segments");
		}
		s = g_new0(struct segment, 1);
		s->name = g_strdup(name);
		s->open_count = 1;
		s->view = v;
		v = NULL;
		/* Reuse a closed id only after its generation of handles is gone: never. */
		s->id = e->segments->len;
		g_ptr_array_add(e->segments, s);
	}
	*id_out = s->id;
	g_rw_lock_writer_unlock(&e->seg_lock);
	segview_unref(old);
	segview_unref(v);
	return TE_OK;
}

enum te_status segment_import_desc(struct engine *e, const char *key, struct descriptor *desc,
				   bool refresh, te_segment_id *id_out)
{
	return segment_import(e, key, desc, refresh, false, id_out);
}

enum te_status te_segment_import(struct te_engine *engine, const char *json, size_t len,
				 te_segment_id *id_out)
{
	ENGINE_OR_FAIL(engine, "te_segment_import");
	struct descriptor *d = NULL;
	g_autofree char *err = NULL;
	enum te_status st;

	if (!json || !id_out)
		return log_error(TE_ERR_INVALID_ARG, "te_segment_import: NULL argument");
	st = descriptor_decode(json, len, &d, &err);
	if (st != TE_OK)
		return log_error(st, "te_segment_import: %s", err);
	if (strcmp(d->name, e->name) == 0 && d->generation == e->generation) {
		descriptor_free(d);
		return log_error(TE_ERR_INVALID_ARG,
				 "te_segment_import: '%s' is this engine's own segment (id 0)",
				 e->name);
	}
	return segment_import_desc(e, NULL, d, false, id_out);
}

enum te_status te_segment_open(struct te_engine *engine, const char *name, te_segment_id *id_out)
{
	ENGINE_OR_FAIL(engine, "te_segment_open");
	struct segment *s;

	if (!name || !*name || !id_out)
		return log_error(TE_ERR_INVALID_ARG, "te_segment_open: NULL or empty argument");
	if (strlen(name) >= DESCRIPTOR_MAX_NAME)
		return log_error(TE_ERR_INVALID_ARG, "te_segment_open: name longer than %u bytes",
				 DESCRIPTOR_MAX_NAME - 1);
	if (strcmp(name, e->name) == 0)
		return log_error(TE_ERR_INVALID_ARG,
				 "te_segment_open: '%s' is this engine's own segment (id 0)", name);
	g_rw_lock_writer_lock(&e->seg_lock);
	s = segment_find_name_locked(e, name);
	if (s) {
		s->open_count++;
		*id_out = s->id;
		g_rw_lock_writer_unlock(&e->seg_lock);
		return TE_OK;
	}
	g_rw_lock_writer_unlock(&e->seg_lock);
	{
		g_autofree char *err = NULL;
		struct descriptor *d = NULL;
		enum te_status st = metadata_fetch_descriptor(e, name, 0, &d, &err);

		if (st != TE_OK)
			return log_error(st, "te_segment_open: %s", err);
		return segment_import_desc(e, name, d, false, id_out);
	}
}

void segment_refresh_stale(struct engine *e)
{
	g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
	g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func(g_free);
	g_autoptr(GPtrArray) idents = g_ptr_array_new_with_free_func(g_free);
	uint64_t now = engine_now_ns();

	if (!atomic_load_explicit(&e->refresh_pending, memory_order_acquire))
		return;
	g_rw_lock_writer_lock(&e->seg_lock);
	for (guint i = 1; i < e->segments->len; i++) {
		struct segment *s = g_ptr_array_index(e->segments, i);
		uint32_t one = 1;

		if (!s || !atomic_load(&s->stale))
			continue;
		/*
		 * A fetch that timed out blocks submit; after one, wait a second before the
		 * next (last_refresh_ns is set only for slow failures: a refused connect
		 * costs nothing and must not delay seeing a restarted peer).
		 */
		if (s->last_refresh_ns && now - s->last_refresh_ns < 1000000000ull)
			continue;
		if (atomic_compare_exchange_strong(&s->stale, &one, 0)) {
			const char *rpc = s->view && s->view->desc ? s->view->desc->rpc : NULL;

			atomic_fetch_sub(&e->refresh_pending, 1);
			g_ptr_array_add(names, g_strdup(s->name));
			/* The engine's own name: a p2p segment may be opened by an alias of its
			 * address ("localhost:PORT" for an engine named "127.0.0.1:PORT"). */
			g_ptr_array_add(
				idents,
				g_strdup(s->view && s->view->desc ? s->view->desc->name : s->name));
			/*
			 * Without a store, a segment opened by engine name (imported out of band)
			 * is fetched again from the control-plane address its descriptor gave.
			 */
			g_ptr_array_add(keys, g_strdup(!metadata_is_store(e->md) && rpc && *rpc &&
								       !strchr(s->name, ':')
							       ? rpc
							       : s->name));
		}
	}
	g_rw_lock_writer_unlock(&e->seg_lock);
	for (guint i = 0; i < names->len; i++) {
		const char *name = g_ptr_array_index(names, i);
		const char *key = g_ptr_array_index(keys, i);
		const char *ident = g_ptr_array_index(idents, i);
		g_autofree char *err = NULL;
		struct descriptor *d = NULL;
		te_segment_id id;

		uint64_t t0 = engine_now_ns();

		atomic_fetch_add_explicit(&e->refreshes, 1, memory_order_relaxed);
		if (metadata_fetch_descriptor(e, key, SEGMENT_REFRESH_TIMEOUT_MS, &d, &err) !=
		    TE_OK) {
			bool slow = engine_now_ns() - t0 > 100000000ull;

			ENGINE_LOG(e, TE_LOG_INFO, "segment %s: refresh failed: %s", name, err);
			/* Still stale: the next submit tries again. */
			g_rw_lock_writer_lock(&e->seg_lock);
			for (guint k = 1; k < e->segments->len; k++) {
				struct segment *s = g_ptr_array_index(e->segments, k);

				if (s && strcmp(s->name, name) == 0) {
					s->last_refresh_ns = slow ? engine_now_ns() : 0;
					segment_mark_stale(e, s);
				}
			}
			g_rw_lock_writer_unlock(&e->seg_lock);
			continue;
		}
		if (strcmp(d->name, name) != 0 && strcmp(d->name, ident) != 0) {
			/* Another engine answers at that address now: not ours to import. */
			ENGINE_LOG(e, TE_LOG_INFO,
				   "segment %s: refresh from %s found segment '%s' there instead",
				   name, key, d->name);
			descriptor_free(d);
			continue;
		}
		if (segment_import(e, name, d, true, true, &id) != TE_OK)
			ENGINE_LOG(e, TE_LOG_INFO, "segment %s: refresh failed: %s", name,
				   te_last_error());
	}
}

void segment_watch_event(struct engine *e, const char *backend, const char *name, const char *json,
			 size_t len, bool resync)
{
	g_autofree char *err = NULL;
	struct descriptor *d = NULL;
	struct segment *s;
	te_segment_id id;
	bool open;

	g_rw_lock_writer_lock(&e->seg_lock);
	s = segment_find_name_locked(e, name);
	open = s != NULL;
	if (s && !json && !s->departed && !resync) {
		s->departed = g_strdup_printf("its descriptor left the %s store (the engine "
					      "stopped, or its TTL of %u s ran out: it died or "
					      "lost the store)",
					      backend, e->cfg->metadata_ttl_s);
		ENGINE_LOG(e, TE_LOG_INFO, "segment %s: %s", name, s->departed);
	} else if (s && !json && !s->departed && !s->absent_until_ns) {
		/* Inferred: the owner's next refresh writes it again if it lives (a TTL + 1 s). */
		uint32_t grace_s = e->cfg->metadata_ttl_s + 1;

		s->absent_until_ns = engine_now_ns() + grace_s * 1000000000ull;
		s->absent = g_strdup_printf("its descriptor was missing from the %s store when "
					    "the watch got back to it after an outage, and was "
					    "not published again within %u s (the engine stopped "
					    "or died meanwhile, or cannot reach the store)",
					    backend, grace_s);
		ENGINE_LOG(e, TE_LOG_INFO,
			   "segment %s: missing from the %s store after the watch's outage; "
			   "it stays usable for %u s (a store that lost its data gets it back "
			   "from its owner), then it is gone",
			   name, backend, grace_s);
	}
	g_rw_lock_writer_unlock(&e->seg_lock);
	if (!open || !json)
		return; /* nothing cached for it */
	if (descriptor_decode(json, len, &d, &err) != TE_OK) {
		ENGINE_LOG(e, TE_LOG_WARN,
			   "segment %s: the %s store holds a value that is not a descriptor, "
			   "ignored (the cached one stays): %s",
			   name, backend, err);
		return;
	}
	if (strcmp(d->name, name) != 0) {
		ENGINE_LOG(e, TE_LOG_WARN,
			   "segment %s: the %s store's value names segment '%s', ignored", name,
			   backend, d->name);
		descriptor_free(d);
		return;
	}
	if (segment_import_desc(e, name, d, true, &id) != TE_OK)
		ENGINE_LOG(e, TE_LOG_INFO, "segment %s: refresh from the %s watch failed: %s", name,
			   backend, te_last_error());
}

void segment_mark_stale(struct engine *e, struct segment *s)
{
	uint32_t zero = 0;

	if (s && atomic_compare_exchange_strong(&s->stale, &zero, 1))
		atomic_fetch_add(&e->refresh_pending, 1);
}

bool segment_refetch(struct engine *e, struct segment *s, uint64_t *ago_ms)
{
	uint64_t now, last;

	if (!s)
		return false;
	now = engine_now_ns();
	last = atomic_load_explicit(&s->unchanged_ns, memory_order_relaxed);
	if (last && now < last + SEGMENT_REFETCH_NS) {
		if (ago_ms)
			*ago_ms = now > last ? (now - last) / 1000000u : 0;
		return false;
	}
	segment_mark_stale(e, s);
	return true;
}

enum te_status te_segment_close(struct te_engine *engine, te_segment_id id)
{
	ENGINE_OR_FAIL(engine, "te_segment_close");
	struct segment *s;

	if (id == TE_SEGMENT_LOCAL)
		return log_error(TE_ERR_INVALID_ARG,
				 "te_segment_close: segment 0 is the local segment");
	g_rw_lock_writer_lock(&e->seg_lock);
	s = segment_get_locked(e, id);
	if (!s) {
		g_rw_lock_writer_unlock(&e->seg_lock);
		return log_error(TE_ERR_UNKNOWN_SEGMENT, "te_segment_close: no segment id %u", id);
	}
	if (s->open_count == 1 && atomic_load_explicit(&s->busy, memory_order_acquire) > 0) {
		g_rw_lock_writer_unlock(&e->seg_lock);
		return log_error(TE_ERR_BUSY,
				 "te_segment_close: segment '%s' is used by live "
				 "batches",
				 s->name);
	}
	if (--s->open_count == 0) {
		g_ptr_array_index(e->segments, id) = NULL;
		g_rw_lock_writer_unlock(&e->seg_lock);
		segment_free(s);
		return TE_OK;
	}
	g_rw_lock_writer_unlock(&e->seg_lock);
	return TE_OK;
}

struct descriptor *segment_local_descriptor(struct engine *e)
{
	struct descriptor *d = g_new0(struct descriptor, 1);
	guint n = 0;

	d->name = g_strdup(e->name);
	d->generation = e->generation;
	d->rpc = g_strdup(control_address(e));
	d->host_id = g_strdup(e->host_id);
	d->pid = (uint32_t)getpid();
	d->pid_ns = g_strdup(e->pid_ns);
	d->transports = g_new0(struct descriptor_blob, e->n_tps ? e->n_tps : 1);
	for (unsigned t = 0; t < e->n_tps; t++) {
		GBytes *b = transport_blob(e->tps[t]);

		d->transports[d->n_transports].transport = g_strdup(e->tps[t]->plugin->name);
		d->transports[d->n_transports].blob = b ? b : g_bytes_new(NULL, 0);
		d->n_transports++;
	}
	g_rw_lock_reader_lock(&e->mem.lock);
	d->buffers = g_new0(struct descriptor_buffer, e->mem.regions->len + 1);
	for (guint i = 0; i < e->mem.regions->len; i++) {
		const struct mem_region *r = g_ptr_array_index(e->mem.regions, i);
		struct descriptor_buffer *db;

		if (!(r->access & TE_MEM_REMOTE))
			continue;
		db = &d->buffers[n++];
		db->addr = r->addr;
		db->length = r->length;
		db->location = g_strdup(r->location);
		db->access = r->access;
		db->keys = g_new0(struct descriptor_blob, e->n_tps ? e->n_tps : 1);
		for (unsigned t = 0; t < e->n_tps; t++) {
			if (!r->keys[t])
				continue;
			db->keys[db->n_keys].transport = g_strdup(e->tps[t]->plugin->name);
			db->keys[db->n_keys].blob = g_bytes_ref(r->keys[t]);
			db->n_keys++;
		}
	}
	d->n_buffers = n;
	g_rw_lock_reader_unlock(&e->mem.lock);
	return d;
}

enum te_status te_segment_export(struct te_engine *engine, char **json_out, size_t *len_out)
{
	ENGINE_OR_FAIL(engine, "te_segment_export");
	struct descriptor *d;
	size_t len = 0;
	char *json;

	if (!json_out)
		return log_error(TE_ERR_INVALID_ARG, "te_segment_export: NULL argument");
	d = segment_local_descriptor(e);
	json = descriptor_encode(d, &len);
	descriptor_free(d);
	if (!json)
		return log_error(TE_ERR_NOMEM, "te_segment_export: encoding failed");
	*json_out = json;
	if (len_out)
		*len_out = len;
	return TE_OK;
}

enum te_status segment_local_view(struct engine *e, struct segview **view_out, char **err_out)
{
	uint64_t version = atomic_load_explicit(&e->mem.version, memory_order_acquire);
	struct segview *v = NULL, *old = NULL;
	enum te_status st;

	g_mutex_lock(&e->local_lock);
	if (e->local_view && e->local_view_version == version) {
		segview_ref(e->local_view);
		*view_out = e->local_view;
		g_mutex_unlock(&e->local_lock);
		return TE_OK;
	}
	st = segview_new(e, segment_local_descriptor(e), &v, err_out);
	if (st != TE_OK) {
		g_mutex_unlock(&e->local_lock);
		return st;
	}
	old = e->local_view;
	e->local_view = v;
	e->local_view_version = version;
	segview_ref(v);
	*view_out = v;
	g_mutex_unlock(&e->local_lock);
	segview_unref(old);
	return TE_OK;
}

enum te_status te_segment_buffers(struct te_engine *engine, te_segment_id id,
				  struct te_buffer_info *buffers, size_t max, size_t *n_out)
{
	ENGINE_OR_FAIL(engine, "te_segment_buffers");
	struct segview *v = NULL;
	struct segment *s;
	enum te_status st;

	if (!n_out || (max && !buffers))
		return log_error(TE_ERR_INVALID_ARG, "te_segment_buffers: NULL argument");
	segment_refresh_stale(e); /* answer from the peer's current incarnation */
	if (id == TE_SEGMENT_LOCAL) {
		g_autofree char *err = NULL;

		st = segment_local_view(e, &v, &err);
		if (st != TE_OK)
			return log_error(st, "te_segment_buffers: local segment: %s", err);
	} else {
		g_rw_lock_reader_lock(&e->seg_lock);
		s = segment_get_locked(e, id);
		if (s) {
			v = s->view;
			segview_ref(v);
		}
		g_rw_lock_reader_unlock(&e->seg_lock);
		if (!v)
			return log_error(TE_ERR_UNKNOWN_SEGMENT,
					 "te_segment_buffers: no segment id %u", id);
	}
	for (size_t i = 0; i < v->desc->n_buffers && i < max; i++) {
		const struct descriptor_buffer *db = &v->desc->buffers[i];

		buffers[i].addr = db->addr;
		buffers[i].length = db->length;
		buffers[i].access = db->access;
		g_strlcpy(buffers[i].location, db->location ? db->location : "",
			  sizeof(buffers[i].location));
	}
	*n_out = v->desc->n_buffers;
	segview_unref(v);
	return TE_OK;
}

/* --- the segment table: only this module takes seg_lock or local_lock ----------- */

void segment_table_init(struct engine *e)
{
	g_rw_lock_init(&e->seg_lock);
	g_mutex_init(&e->local_lock);
	e->segments = g_ptr_array_new();
	g_ptr_array_add(e->segments, NULL); /* id 0: local */
}

void segment_table_drop_views(struct engine *e)
{
	if (e->segments) {
		g_autoptr(GPtrArray) views = g_ptr_array_new();

		/*
		 * Unreferenced after the lock: the last reference unloads peers, and a plugin
		 * may wait in unload_peer for a host call of its own (mark_failed, peer_event)
		 * that takes this lock for reading.
		 */
		g_rw_lock_writer_lock(&e->seg_lock);
		for (guint i = 1; i < e->segments->len; i++) {
			struct segment *s = g_ptr_array_index(e->segments, i);

			if (s && s->view) {
				g_ptr_array_add(views, s->view);
				s->view = NULL;
			}
		}
		g_rw_lock_writer_unlock(&e->seg_lock);
		for (guint i = 0; i < views->len; i++)
			segview_unref(g_ptr_array_index(views, i));
	}
	segview_unref(e->local_view);
	e->local_view = NULL;
}

void segment_table_fini(struct engine *e)
{
	if (e->segments) {
		g_rw_lock_writer_lock(&e->seg_lock);
		for (guint i = 1; i < e->segments->len; i++)
			segment_free(g_ptr_array_index(e->segments, i));
		g_ptr_array_set_size(e->segments, 1);
		g_rw_lock_writer_unlock(&e->seg_lock);
		g_ptr_array_free(e->segments, TRUE);
		e->segments = NULL;
	}
	g_rw_lock_clear(&e->seg_lock);
	g_mutex_clear(&e->local_lock);
}

void segment_read_lock(struct engine *e)
{
	g_rw_lock_reader_lock(&e->seg_lock);
}

void segment_read_unlock(struct engine *e)
{
	g_rw_lock_reader_unlock(&e->seg_lock);
}

char *segment_rpc_address(struct engine *e, te_segment_id id)
{
	struct segment *s;
	char *addr = NULL;

	g_rw_lock_reader_lock(&e->seg_lock);
	s = segment_get_locked(e, id);
	if (s && s->view->desc->rpc && *s->view->desc->rpc)
		addr = g_strdup(s->view->desc->rpc);
	g_rw_lock_reader_unlock(&e->seg_lock);
	return addr;
}

char *segment_rpc_address_by_name(struct engine *e, const char *name)
{
	g_rw_lock_reader_lock(&e->seg_lock);
	for (guint i = 1; i < e->segments->len; i++) {
		struct segment *s = g_ptr_array_index(e->segments, i);

		if (s && s->view &&
		    (strcmp(s->name, name) == 0 || strcmp(s->view->desc->name, name) == 0) &&
		    s->view->desc->rpc && *s->view->desc->rpc) {
			char *a = g_strdup(s->view->desc->rpc);

			g_rw_lock_reader_unlock(&e->seg_lock);
			return a;
		}
	}
	g_rw_lock_reader_unlock(&e->seg_lock);
	return NULL;
}

void segment_note_generation(struct engine *e, const char *addr, uint64_t gen)
{
	g_rw_lock_reader_lock(&e->seg_lock);
	for (guint i = 1; i < e->segments->len; i++) {
		struct segment *s = g_ptr_array_index(e->segments, i);

		if (s && s->view->desc->rpc && strcmp(s->view->desc->rpc, addr) == 0 &&
		    s->view->desc->generation != gen) {
			ENGINE_LOG(e, TE_LOG_INFO,
				   "segment %s: peer restarted (generation %016" PRIx64
				   " -> %016" PRIx64 ")",
				   s->name, s->view->desc->generation, gen);
			segment_mark_stale(e, s);
		}
	}
	g_rw_lock_reader_unlock(&e->seg_lock);
}

char *segment_resolve_address(struct engine *e, const char *name)
{
	if (loading_desc && strcmp(loading_desc->name, name) == 0 && loading_desc->rpc &&
	    *loading_desc->rpc)
		return g_strdup(loading_desc->rpc);
	{
		char *a = segment_rpc_address_by_name(e, name);

		if (a)
			return a;
	}
	return g_strdup(name);
}

void segment_pause_peer(struct engine *e, unsigned tp_index, const struct te_plugin_peer *peer,
			uint64_t until_ns, const char *plugin, const char *why)
{
	g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);

	g_rw_lock_reader_lock(&e->seg_lock);
	for (guint i = 1; i < e->segments->len; i++) {
		struct segment *s = g_ptr_array_index(e->segments, i);

		if (!s || !s->view)
			continue;
		if (s->view->tps[tp_index].peer == peer) {
			atomic_store_explicit(&s->view->tps[tp_index].paused_until_ns, until_ns,
					      memory_order_relaxed);
			g_ptr_array_add(names, g_strdup(s->name));
		}
	}
	g_rw_lock_reader_unlock(&e->seg_lock);
	/* Logged after the lock: a log function that takes long holds no writer up. */
	for (guint i = 0; i < names->len; i++)
		ENGINE_LOG(e, TE_LOG_WARN, "%s: peer %s quarantined for %llu ms: %s", plugin,
			   (const char *)g_ptr_array_index(names, i),
			   (unsigned long long)e->cfg->quarantine_ms, why ? why : "");
}

enum te_status te_peer_probe(struct te_engine *engine, const char *name, uint32_t timeout_ms)
{
	ENGINE_OR_FAIL(engine, "te_peer_probe");
	g_autofree char *addr = NULL;
	g_autofree char *err = NULL;
	bool has_gen = false;
	uint64_t gen = 0;
	enum te_status st;

	if (!name || !*name)
		return log_error(TE_ERR_INVALID_ARG, "te_peer_probe: name is NULL or empty");
	addr = segment_resolve_address(e, name);
	st = control_probe(e, addr, timeout_ms, &gen, &has_gen, &err);
	if (st == TE_OK) {
		/* Another generation at @addr: the peer restarted, refresh before next use. */
		if (has_gen)
			segment_note_generation(e, addr, gen);
		return TE_OK;
	}
	if (st == TE_ERR_TIMEOUT)
		return log_error(TE_ERR_TIMEOUT, "te_peer_probe: %s (%s): no answer within %u ms",
				 name, addr, timeout_ms);
	return log_error(TE_ERR_PEER_UNREACHABLE, "te_peer_probe: %s (%s) unreachable: %s", name,
			 addr, err);
}
