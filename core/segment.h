/* SPDX-License-Identifier: Apache-2.0 */
/*
 * segment.h: remote segments, their descriptor views and per-transport peer state.
 * A layer above control.c and metadata/: it fetches descriptors through metadata_* and
 * calls peers through control_*; neither calls back into it (the engine hands them
 * segment_local_descriptor and segment_watch_event as callbacks).
 */
#ifndef TE_CORE_SEGMENT_H
#define TE_CORE_SEGMENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <glib.h>

#include <te/te.h>

#include "core/metadata/descriptor.h"

struct engine;
struct transport;

/* What one engine transport knows about one segment view. */
struct segview_tp {
	struct transport *tp;
	struct te_plugin_peer *peer;	  /* NULL: this transport cannot reach the segment */
	char why[160];			  /* reason when peer is NULL */
	_Atomic uint64_t paused_until_ns; /* peer quarantine */
	_Atomic uint32_t failures;	  /* consecutive retryable failures */
};

/*
 * An immutable snapshot of a segment: one descriptor generation with its peers
 * and remote keys. Tasks hold a reference, so a restart (new generation) can swap
 * the segment's view while old transfers drain.
 */
struct segview {
	_Atomic int32_t refs;
	struct engine *engine;
	struct descriptor *desc;
	struct segview_tp *tps; /* engine->n_tps entries */
	/* rkeys[buffer * n_tps + transport], NULL if that buffer has no key for it */
	struct te_plugin_rkey **rkeys;
	bool stale; /* a newer generation replaced it */
};

struct segment {
	te_segment_id id;
	char *name;
	int32_t open_count;	  /* te_segment_open/import references */
	struct segview *view;	  /* current; swap under engine->seg_lock (write) */
	_Atomic int32_t busy;	  /* live batches that use it */
	_Atomic uint32_t stale;	  /* a path failure asks for a descriptor refresh */
	uint64_t last_refresh_ns; /* under engine->seg_lock (write) */
	/*
	 * When a fetch for a refresh last found the descriptor unchanged; 0: never, or a later
	 * fetch or watch event changed it. Within SEGMENT_REFETCH_NS of it, refused or
	 * missing ranges fetch nothing (segment_refetch).
	 */
	_Atomic uint64_t unchanged_ns;
	/* Why the store says the segment left (its key deleted or expired); NULL: present. */
	char *departed; /* under engine->seg_lock */
	/*
	 * Missing from the store when its watch came back after an outage (the store may have
	 * lost its data: the owner writes its key again within its refresh period): gone
	 * from absent_until_ns on, for the reason in absent, unless a value shows up first.
	 * 0 and NULL: not missing. Under engine->seg_lock.
	 */
	uint64_t absent_until_ns;
	char *absent;
};

/* The reason a submit to @s is refused now (departed, or absent past its grace); NULL: none. */
const char *segment_gone_locked(const struct segment *s);

/* Build a view from a decoded descriptor (takes ownership of @desc). */
enum te_status segview_new(struct engine *e, struct descriptor *desc, struct segview **view_out,
			   char **err_out);
void segview_ref(struct segview *v);
void segview_unref(struct segview *v);

/*
 * segment_import_desc - open or refresh the segment described by @desc (owned),
 * registered under @key (the name it was opened by; NULL: desc->name).
 * Same key and generation: the existing id; another generation: the view is
 * replaced (old one drains: its transfers keep their peers until they end); new
 * key: a new id. @refresh: do not take an open reference (a cache refresh).
 */
enum te_status segment_import_desc(struct engine *e, const char *key, struct descriptor *desc,
				   bool refresh, te_segment_id *id_out);

/*
 * segment_refresh_stale - re-fetch through the metadata backend every segment a
 * path failure flagged (at most once per second each). Called by submit; cheap
 * when nothing is flagged.
 */
void segment_refresh_stale(struct engine *e);

/* A path towards @s failed: refresh its descriptor before the next submit uses it. */
void segment_mark_stale(struct engine *e, struct segment *s);

/*
 * segment_refetch - @s's descriptor may be stale: a request fell outside its buffers (the
 * peer may have registered one since), or the peer refused an access it allows (the buffer
 * was registered again, under new keys). Marks @s stale and returns true, unless a fetch
 * found the descriptor unchanged less than SEGMENT_REFETCH_NS ago: then false, and the
 * milliseconds since in *@ago_ms (may be NULL). So a client that keeps asking for ranges
 * the peer never registered, or a peer that refuses every request, costs the peer (or the
 * store) one fetch per period and submitting thread at most, not one or two per submit; a
 * fetch that finds the descriptor changed ends the period (segment_import_desc). NULL (the
 * local segment): false.
 */
#define SEGMENT_REFETCH_NS 100000000ull
bool segment_refetch(struct engine *e, struct segment *s, uint64_t *ago_ms);

/*
 * segment_watch_event - the store's watch saw segment @name change: @json is its new value
 * (a new generation or a changed buffer list: the open segment's view is replaced; any
 * value clears a departure), or NULL when its key was deleted or expired (new requests to it
 * fail at once, naming @backend, until it comes back). A delete inferred at a resync
 * (@resync) takes effect only if no value shows up within the TTL and a second: a store
 * that lost its data gets the key back from its live owner. A value that does not decode is
 * logged and changes nothing.
 */
void segment_watch_event(struct engine *e, const char *backend, const char *name, const char *json,
			 size_t len, bool resync);

/* Caller holds segment_read_lock. NULL if id unknown. */
struct segment *segment_get_locked(struct engine *e, te_segment_id id);

void segment_free(struct segment *s);

/* This engine's own descriptor (buffers with remote access only); descriptor_free. */
struct descriptor *segment_local_descriptor(struct engine *e);

/*
 * segment_local_view - view of this engine's own segment for requests to id 0,
 * rebuilt when the registered memory changed. Returns a reference (unref).
 */
enum te_status segment_local_view(struct engine *e, struct segview **view_out, char **err_out);

/* The segment table (engine->segments, seg_lock, the local view): this module's alone. */
void segment_table_init(struct engine *e);
/* Teardown, before transports fini: drop every segment's view (peers unloaded). */
void segment_table_drop_views(struct engine *e);
/* Teardown, after transports fini: free the segments and the table. */
void segment_table_fini(struct engine *e);

/* Hold the table for segment_get_locked (shared with other readers). */
void segment_read_lock(struct engine *e);
void segment_read_unlock(struct engine *e);

/* The control-plane address of open segment @id (g_free), NULL if none. */
char *segment_rpc_address(struct engine *e, te_segment_id id);
/* ... of the open segment named (or whose descriptor is named) @name, NULL if none. */
char *segment_rpc_address_by_name(struct engine *e, const char *name);
/*
 * segment_resolve_address - the control-plane address of segment @name (g_free): that of
 * the descriptor whose peers this thread is loading (segview_new), else of the open
 * segment, else @name itself (a "host:port").
 */
char *segment_resolve_address(struct engine *e, const char *name);

/* The peer at control address @addr runs generation @gen: a segment of another goes stale. */
void segment_note_generation(struct engine *e, const char *addr, uint64_t gen);

/* Quarantine @peer of transport @tp_index in every open view until @until_ns. */
void segment_pause_peer(struct engine *e, unsigned tp_index, const struct te_plugin_peer *peer,
			uint64_t until_ns, const char *plugin, const char *why);

#endif /* TE_CORE_SEGMENT_H */
