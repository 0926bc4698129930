/* SPDX-License-Identifier: Apache-2.0 */
/* engine.c: engine lifetime, the progress worker and the public API entry points. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/batch.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/metadata/metadata.h"
#include "core/memkind.h"
#include "core/segment.h"
#include "core/rpc.h"
#include "core/transport.h"

uint64_t engine_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void engine_kick(struct engine *e)
{
	/*
	 * seq_cst load pairs with the worker's store of sleeping before its re-check.
	 * A worker in a short (polling) sleep wakes by itself within 50 us: only a
	 * long sleep needs a signal, which keeps futex calls off the submit path.
	 */
	if (atomic_load(&e->sleeping) == 2) {
		g_mutex_lock(&e->work_lock);
		g_cond_signal(&e->work_cond);
		g_mutex_unlock(&e->work_lock);
	}
}

void engine_kick_hard(struct engine *e)
{
	g_mutex_lock(&e->work_lock);
	g_cond_signal(&e->work_cond);
	g_mutex_unlock(&e->work_lock);
}

void engine_queue_retry(struct engine *e, struct slice *s)
{
	struct slice **pp;

	g_mutex_lock(&e->work_lock);
	for (pp = &e->retry_head; *pp && (*pp)->retry_at_ns <= s->retry_at_ns; pp = &(*pp)->next)
		;
	s->next = *pp;
	*pp = s;
	atomic_store(&e->retry_pending, true);
	g_cond_signal(&e->work_cond);
	g_mutex_unlock(&e->work_lock);
}

/*
 * Whether application threads drive manual progress (in te_batch_wait now, or
 * within the last millisecond). Then the worker keeps away from those plugins: two
 * threads polling one queue only bounce cache lines. Relaxed: a stale view costs
 * one redundant or one skipped poll.
 */
bool engine_user_driving(struct engine *e, uint64_t now)
{
	return atomic_load_explicit(&e->drivers, memory_order_relaxed) ||
	       now - atomic_load_explicit(&e->last_drive_ns, memory_order_relaxed) <
		       ENGINE_DRIVE_NS;
}

/* Whether a manual-progress transport has slices in flight. Relaxed, like the callers. */
bool engine_manual_in_flight(struct engine *e)
{
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL &&
		    atomic_load_explicit(&tp->in_flight, memory_order_relaxed) > 0)
			return true;
	}
	return false;
}

/*
 * Nothing to reap: block in the manual transport with slices in flight (ops.wait) for at
 * most @timeout_ns when it is the only one and can; else yield the CPU. A serialized
 * plugin is never blocked in: its call lock would stall every submitter meanwhile.
 */
void engine_manual_wait(struct engine *e, uint64_t timeout_ns)
{
	struct transport *only = NULL;

	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (tp->caps.progress != TE_PLUGIN_PROGRESS_MANUAL ||
		    !atomic_load_explicit(&tp->in_flight, memory_order_relaxed))
			continue;
		if (only || tp->serialized) {
			only = NULL;
			break;
		}
		only = tp;
	}
	if (!only || only->plugin->ops.wait(only->inst, timeout_ns) == TE_ERR_UNSUPPORTED)
		g_thread_yield();
}

unsigned engine_progress_once(struct engine *e, bool from_worker)
{
	unsigned work = 0;
	/* Relaxed: a stale view only costs one redundant or skipped poll. */
	bool skip_manual = from_worker && engine_user_driving(e, engine_now_ns());

	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (!skip_manual && tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL &&
		    atomic_load_explicit(&tp->in_flight, memory_order_relaxed) > 0) {
			if (tp->serialized)
				g_mutex_lock(&tp->call_lock);
			work += tp->plugin->ops.progress(tp->inst, 256);
			if (tp->serialized)
				g_mutex_unlock(&tp->call_lock);
		}
		work += batch_drain_backlog(e, tp);
	}
	return work;
}

/* Retries whose time has come, resubmitted outside the lock. */
static unsigned engine_run_retries(struct engine *e, uint64_t now, uint64_t *next_out)
{
	struct slice *due = NULL, **tail = &due;
	unsigned n = 0;

	/* Racy peek (only the worker pops; a miss is caught on the next round). */
	if (!atomic_load_explicit(&e->retry_pending, memory_order_acquire)) {
		*next_out = UINT64_MAX;
		return 0;
	}
	g_mutex_lock(&e->work_lock);
	while (e->retry_head && e->retry_head->retry_at_ns <= now) {
		struct slice *s = e->retry_head;

		e->retry_head = s->next;
		s->next = NULL;
		*tail = s;
		tail = &s->next;
	}
	*next_out = e->retry_head ? e->retry_head->retry_at_ns : UINT64_MAX;
	atomic_store(&e->retry_pending, e->retry_head != NULL);
	g_mutex_unlock(&e->work_lock);
	while (due) {
		struct slice *s = due;

		due = s->next;
		s->next = NULL;
		batch_retry_slice(e, s);
		n++;
	}
	return n;
}

/* Work the worker must poll for: backlogs, and manual progress nobody else drives. */
static bool engine_has_pending_io(struct engine *e)
{
	bool drivers = engine_user_driving(e, engine_now_ns());

	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		if (atomic_load(&tp->backlog_len))
			return true;
		if (!drivers && tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL &&
		    atomic_load(&tp->in_flight))
			return true;
	}
	return false;
}

static gpointer engine_worker(gpointer data)
{
	struct engine *e = data;
	unsigned idle = 0;

	while (!atomic_load(&e->stopping)) {
		uint64_t now, next_retry, wake;
		unsigned work;

		work = engine_progress_once(e, true);
		now = engine_now_ns();
		work += engine_run_retries(e, now, &next_retry);
		work += batch_check_deadlines(e, now);
		work += control_send_notifies(e);
		if (work) {
			idle = 0;
			continue;
		}
		if (engine_has_pending_io(e) && ++idle < 32) {
			/* Manual transports in flight: poll, yielding the core between tries. */
			g_thread_yield();
			continue;
		}
		wake = MIN(next_retry, atomic_load(&e->next_deadline_ns));
		if (engine_has_pending_io(e))
			wake = MIN(wake, now + 50000); /* keep manual progress going at 50 us */
		else if (!atomic_load(&e->drivers) && engine_manual_in_flight(e))
			/* te_batch_wait drove them and returned: take over when that lapses. */
			wake = MIN(wake, MAX(now, atomic_load_explicit(&e->last_drive_ns,
								       memory_order_relaxed) +
							  ENGINE_DRIVE_NS));
		wake = MIN(wake, now + 100000000ull);
		g_mutex_lock(&e->work_lock);
		atomic_store(&e->sleeping, engine_has_pending_io(e) ? 1 : 2);
		if (!atomic_load(&e->stopping) &&
		    (atomic_load(&e->sleeping) == 1 || !engine_has_pending_io(e)) &&
		    (!e->retry_head || e->retry_head->retry_at_ns > now))
			g_cond_wait_until(&e->work_cond, &e->work_lock,
					  g_get_monotonic_time() + (gint64)((wake - now) / 1000) +
						  1);
		atomic_store(&e->sleeping, 0);
		g_mutex_unlock(&e->work_lock);
		idle = 0;
	}
	return NULL;
}

/*
 * Extra workers (transfer.worker_threads > 1) only drive manual-progress
 * transports and backlogs, so several manual plugins (or one with independent
 * queues) progress in parallel; retries, deadlines and notifies stay on worker 0.
 */
static gpointer engine_extra_worker(gpointer data)
{
	struct engine *e = data;

	while (!atomic_load(&e->stopping)) {
		if (engine_progress_once(e, true))
			continue;
		if (engine_has_pending_io(e)) {
			g_thread_yield();
			g_usleep(20);
			continue;
		}
		g_mutex_lock(&e->work_lock);
		if (!atomic_load(&e->stopping))
			g_cond_wait_until(&e->work_cond, &e->work_lock,
					  g_get_monotonic_time() + 10000);
		g_mutex_unlock(&e->work_lock);
	}
	return NULL;
}

static char *engine_read_host_id(void)
{
	char *id = NULL;

	if (g_file_get_contents("/proc/sys/kernel/random/boot_id", &id, NULL, NULL))
		return g_strstrip(id);
	return g_strdup(g_get_host_name());
}

static uint64_t engine_new_generation(void)
{
	uint64_t g = 0;
	FILE *f = fopen("/dev/urandom", "rb");

	if (f) {
		if (fread(&g, sizeof(g), 1, f) != 1)
			g = 0;
		fclose(f);
	}
	if (!g)
		g = engine_now_ns() ^ ((uint64_t)getpid() << 40);
	return g ? g : 1;
}

static enum te_status engine_load_transports(struct engine *e)
{
	g_autofree char *search = plugin_search_path();
	uint32_t max_priv = 0;

	e->tps = g_new0(struct transport *, e->cfg->n_transports + 1);
	for (size_t i = 0; i < e->cfg->n_transports; i++) {
		const struct config_transport *ct = &e->cfg->transports[i];
		g_autofree char *err = NULL;
		struct plugin *p = NULL;
		struct transport *tp = NULL;
		enum te_status st;

		st = plugin_open(ct->name, ct->path, search, &p, &err);
		if (st == TE_OK) {
			st = transport_start(e, p, ct, e->n_tps, &tp, &err);
			if (st != TE_OK)
				plugin_close(p);
		}
		if (st != TE_OK) {
			if (ct->required)
				return log_error(st, "transport '%s' (required): %s", ct->name,
						 err);
			ENGINE_LOG(e, TE_LOG_WARN, "transport '%s' (optional) skipped: %s",
				   ct->name, err);
			continue;
		}
		e->tps[e->n_tps++] = tp;
		max_priv = MAX(max_priv, tp->caps.slice_priv_size);
		ENGINE_LOG(e, TE_LOG_INFO, "transport %s loaded from %s (%s progress, %u devices)",
			   p->name, p->path,
			   tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL ? "manual" : "auto",
			   tp->n_devices);
	}
	if (!e->n_tps)
		ENGINE_LOG(e, TE_LOG_WARN, "no transport loaded: this engine cannot move data");
	e->slice_stride = (sizeof(struct slice) + max_priv + 63) / 64 * 64;
	e->slice_size = g_new0(uint64_t, e->n_tps + 1);
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];
		uint64_t ss = e->cfg->slice_size	    ? e->cfg->slice_size
			      : tp->caps.default_slice_size ? tp->caps.default_slice_size
							    : 65536;

		if (tp->caps.max_slice_size && ss > tp->caps.max_slice_size)
			ss = tp->caps.max_slice_size;
		e->slice_size[i] = ss;
		if (tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL)
			e->has_manual = true;
	}
	return TE_OK;
}

static void engine_destroy(struct engine *e)
{
	uint64_t give_up;

	/* Peers stop finding us first (a store backend deletes our key). */
	metadata_withdraw_local(e);
	if (e->worker) {
		atomic_store(&e->stopping, true);
		g_mutex_lock(&e->work_lock);
		g_cond_broadcast(&e->work_cond);
		g_mutex_unlock(&e->work_lock);
		g_thread_join(e->worker);
		for (unsigned i = 0; i < e->n_extra; i++)
			g_thread_join(e->extra[i]);
	}
	g_free(e->extra);
	/* No peer request may reach the engine while it comes apart. */
	rpc_server_stop(e->rpc);
	e->rpc = NULL;
	if (e->slots)
		batch_cancel_all(e);
	/* Retries and backlog never to be run: release their batch references. */
	while (e->retry_head) {
		struct slice *s = e->retry_head;

		e->retry_head = s->next;
		batch_release_slice(s);
	}
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct transport *tp = e->tps[i];

		while (tp->backlog_head) {
			struct slice *s = tp->backlog_head;

			tp->backlog_head = s->next;
			batch_release_slice(s);
		}
		atomic_store(&tp->backlog_len, 0);
	}
	for (uint32_t i = 0; e->slots && i < e->n_slots; i++) {
		/* Batches the user never freed: drop the handle reference. */
		struct batch *b = e->slots[i].batch;

		e->slots[i].batch = NULL;
		if (b)
			batch_unref(b);
	}
	/* Give plugins a moment to hand back canceled slices (bounded). */
	give_up = engine_now_ns() + 2000000000ull;
	while (atomic_load(&e->live_batches) && engine_now_ns() < give_up) {
		if (!engine_progress_once(e, false))
			g_usleep(1000);
	}
	if (atomic_load(&e->live_batches))
		ENGINE_LOG(e, TE_LOG_WARN,
			   "%u batch(es) still held by transports at shutdown; fini releases "
			   "them",
			   atomic_load(&e->live_batches));
	/*
	 * Drop the segments' views first (unloading peers nobody else uses) but keep
	 * the segment structs: slices a plugin reports during fini release tasks that
	 * still count on them. Views held by such tasks go when those tasks go.
	 */
	if (e->segments) {
		g_rw_lock_writer_lock(&e->seg_lock);
		for (guint i = 1; i < e->segments->len; i++) {
			struct segment *s = g_ptr_array_index(e->segments, i);

			if (s) {
				segview_unref(s->view);
				s->view = NULL;
			}
		}
		g_rw_lock_writer_unlock(&e->seg_lock);
	}
	segview_unref(e->local_view);
	e->local_view = NULL;
	/*
	 * fini completes whatever a plugin still holds and releases its peers, keys
	 * and registrations; from here the core makes no more calls into it.
	 */
	for (unsigned i = 0; i < e->n_tps; i++) {
		atomic_store(&e->tps[i]->stopped, true);
		e->tps[i]->plugin->ops.fini(e->tps[i]->inst);
	}
	if (e->segments) {
		g_rw_lock_writer_lock(&e->seg_lock);
		for (guint i = 1; i < e->segments->len; i++)
			segment_free(g_ptr_array_index(e->segments, i));
		g_ptr_array_set_size(e->segments, 1);
		g_rw_lock_writer_unlock(&e->seg_lock);
		g_ptr_array_free(e->segments, TRUE);
		e->segments = NULL;
	}
	if (e->mem.regions) {
		mem_unregister_all(e);
		mem_table_clear(&e->mem);
	}
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct plugin *p = e->tps[i]->plugin;

		transport_free(e->tps[i]);
		plugin_close(p);
	}
	control_stop(e);
	while (e->cache) {
		struct batch *b = e->cache;

		e->cache = b->cache_next;
		batch_free_cached(b);
	}
	g_mutex_clear(&e->cache_lock);
	g_free(e->slots);
	g_free(e->tps);
	g_free(e->slice_size);
	g_free(e->name);
	g_free(e->host_id);
	g_free((char *)e->log.prefix);
	config_free(e->cfg);
	g_rw_lock_clear(&e->seg_lock);
	g_mutex_clear(&e->slot_lock);
	g_mutex_clear(&e->work_lock);
	g_mutex_clear(&e->local_lock);
	g_cond_clear(&e->work_cond);
	g_mutex_clear(&e->standby_lock);
	g_cond_clear(&e->standby_cond);
	memkind_fini(e);
	g_free(e);
}

enum te_status te_engine_new(const struct te_engine_opts *opts, struct te_engine **engine_out)
{
	g_autofree char *err = NULL;
	struct config *cfg = NULL;
	struct engine *e;
	enum te_status st;
	const char *env;

	log_clear_error();
	if (!opts || !engine_out)
		return log_error(TE_ERR_INVALID_ARG, "te_engine_new: NULL argument");
	if (opts->size < offsetof(struct te_engine_opts, log_level) + sizeof(int))
		return log_error(TE_ERR_INVALID_ARG, "te_engine_new: opts.size %u too small",
				 opts->size);
	env = g_getenv("TE_CONFIG");
	if (opts->config_path)
		st = config_load_file(opts->config_path, &cfg, &err);
	else if (opts->config_yaml)
		st = config_parse(opts->config_yaml, opts->config_yaml_len,
				  opts->config_name ? opts->config_name : "<string>", &cfg, &err);
	else if (env && *env)
		st = config_load_file(env, &cfg, &err);
	else
		st = config_parse(config_default_yaml, strlen(config_default_yaml), "<default>",
				  &cfg, &err);
	if (st != TE_OK)
		return log_error(st, "%s", err ? err : "configuration error");

	e = g_new0(struct engine, 1);
	e->cfg = cfg;
	e->log.fn = opts->log_fn;
	e->log.user = opts->log_user;
	atomic_init(&e->log.level, opts->log_level >= 0 ? opts->log_level : cfg->log_level);
	g_rw_lock_init(&e->seg_lock);
	g_mutex_init(&e->slot_lock);
	g_mutex_init(&e->work_lock);
	g_mutex_init(&e->local_lock);
	g_mutex_init(&e->cache_lock);
	g_cond_init(&e->work_cond);
	g_mutex_init(&e->standby_lock);
	g_cond_init(&e->standby_cond);
	mem_table_init(&e->mem);
	memkind_init(e);
	e->segments = g_ptr_array_new();
	g_ptr_array_add(e->segments, NULL); /* id 0: local */
	atomic_init(&e->next_deadline_ns, UINT64_MAX);
	e->generation = engine_new_generation();
	e->host_id = engine_read_host_id();
	st = control_start(e, &err);
	if (st != TE_OK) {
		engine_destroy(e);
		return log_error(st, "control plane: %s", err ? err : te_status_str(st));
	}
	/* A segment is named by where peers reach it unless the YAML names it. */
	e->name = cfg->name ? g_strdup(cfg->name) : g_strdup(control_address(e));
	e->log.prefix = g_strdup(e->name);

	e->n_slots = cfg->max_batches;
	e->slots = g_new0(struct batch_slot, e->n_slots);
	for (uint32_t i = 0; i < e->n_slots; i++) {
		e->slots[i].gen = 1;
		e->slots[i].next_free = i + 1 < e->n_slots ? i + 1 : UINT32_MAX;
	}
	e->free_head = 0;

	st = engine_load_transports(e);
	if (st != TE_OK) {
		g_autofree char *msg = g_strdup(te_last_error());

		engine_destroy(e);
		return log_error(st, "%s", msg);
	}
	e->worker = g_thread_try_new("te-worker", engine_worker, e, NULL);
	if (e->worker && cfg->worker_threads > 1 && e->has_manual) {
		e->extra = g_new0(GThread *, cfg->worker_threads - 1);
		while (e->n_extra < cfg->worker_threads - 1) {
			GThread *t = g_thread_try_new("te-worker", engine_extra_worker, e, NULL);

			if (!t)
				break;
			e->extra[e->n_extra++] = t;
		}
	}
	if (!e->worker) {
		engine_destroy(e);
		return log_error(TE_ERR_SYSTEM, "te_engine_new: cannot start the worker thread");
	}
	/* With a store: claim the name, publish the descriptor, then follow the others. */
	g_clear_pointer(&err, g_free);
	st = metadata_publish_local(e, &err);
	if (st != TE_OK) {
		g_autofree char *msg = g_strdup_printf("metadata (%s): publishing segment '%s': %s",
						       metadata_name(e->md), e->name,
						       err ? err : te_status_str(st));

		engine_destroy(e);
		return log_error(st, "%s", msg);
	}
	st = metadata_watch_start(e, &err);
	if (st != TE_OK) {
		g_autofree char *msg =
			g_strdup_printf("metadata (%s): watch: %s", metadata_name(e->md),
					err ? err : te_status_str(st));

		engine_destroy(e);
		return log_error(st, "%s", msg);
	}
	ENGINE_LOG(e, TE_LOG_INFO,
		   "engine %s started (generation %016" PRIx64 ", %u transports, metadata %s)",
		   e->name, e->generation, e->n_tps, metadata_name(e->md));
	*engine_out = (struct te_engine *)e;
	return TE_OK;
}

enum te_status te_engine_new_from_file(const char *path, struct te_engine **engine_out)
{
	struct te_engine_opts o = { .size = sizeof(o), .config_path = path, .log_level = -1 };

	log_clear_error();
	if (!path)
		return log_error(TE_ERR_INVALID_ARG, "te_engine_new_from_file: path is NULL");
	return te_engine_new(&o, engine_out);
}

enum te_status te_engine_new_from_string(const char *yaml, size_t len,
					 struct te_engine **engine_out)
{
	struct te_engine_opts o = {
		.size = sizeof(o), .config_yaml = yaml, .config_yaml_len = len, .log_level = -1
	};

	log_clear_error();
	if (!yaml)
		return log_error(TE_ERR_INVALID_ARG, "te_engine_new_from_string: yaml is NULL");
	return te_engine_new(&o, engine_out);
}

void te_engine_free(struct te_engine *engine)
{
	if (engine)
		engine_destroy((struct engine *)engine);
}

const char *te_engine_name(const struct te_engine *engine)
{
	return engine ? ((const struct engine *)engine)->name : "";
}

void te_engine_set_log_level(struct te_engine *engine, enum te_log_level level)
{
	if (engine && (int)level >= TE_LOG_ERROR && level <= TE_LOG_TRACE)
		atomic_store(&((struct engine *)engine)->log.level, (int)level);
}

enum te_status engine_batch_get(struct engine *e, te_batch_id id, struct batch **batch_out)
{
	uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
	struct batch *b;

	g_mutex_lock(&e->slot_lock);
	if (slot >= e->n_slots || !e->slots[slot].batch || e->slots[slot].gen != gen) {
		g_mutex_unlock(&e->slot_lock);
		return log_error(TE_ERR_INVALID_HANDLE,
				 "batch handle 0x%016" PRIx64 " is not a live batch", id);
	}
	b = e->slots[slot].batch;
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	g_mutex_unlock(&e->slot_lock);
	*batch_out = b;
	return TE_OK;
}

/* --- public wrappers: validate the engine, clear the thread's last error ----- */

enum te_status te_mem_register(struct te_engine *engine, void *addr, size_t length,
			       const char *location, uint32_t access)
{
	ENGINE_OR_FAIL(engine, "te_mem_register");
	return mem_register(e, addr, length, location, access);
}

enum te_status te_mem_unregister(struct te_engine *engine, void *addr)
{
	ENGINE_OR_FAIL(engine, "te_mem_unregister");
	return mem_unregister(e, addr);
}

enum te_status te_batch_new(struct te_engine *engine, uint32_t capacity, te_batch_id *batch_out)
{
	ENGINE_OR_FAIL(engine, "te_batch_new");
	return batch_new(e, capacity, batch_out);
}

enum te_status te_batch_submit(struct te_engine *engine, te_batch_id batch,
			       const struct te_request *requests, size_t n)
{
	ENGINE_OR_FAIL(engine, "te_batch_submit");
	return batch_submit(e, batch, requests, n);
}

enum te_status te_batch_submit_notify(struct te_engine *engine, te_batch_id batch,
				      const struct te_request *requests, size_t n, const void *msg,
				      size_t len)
{
	ENGINE_OR_FAIL(engine, "te_batch_submit_notify");
	return batch_submit_notify(e, batch, requests, n, msg, len);
}

enum te_status te_task_status(struct te_engine *engine, te_batch_id batch, uint32_t task,
			      struct te_task_info *info_out)
{
	ENGINE_OR_FAIL(engine, "te_task_status");
	return batch_task_status(e, batch, task, info_out);
}

enum te_status te_batch_status(struct te_engine *engine, te_batch_id batch,
			       struct te_batch_info *info_out)
{
	ENGINE_OR_FAIL(engine, "te_batch_status");
	return batch_status(e, batch, info_out);
}

enum te_status te_batch_wait(struct te_engine *engine, te_batch_id batch, int64_t timeout_ns)
{
	ENGINE_OR_FAIL(engine, "te_batch_wait");
	return batch_wait(e, batch, timeout_ns);
}

enum te_status te_batch_cancel(struct te_engine *engine, te_batch_id batch)
{
	ENGINE_OR_FAIL(engine, "te_batch_cancel");
	return batch_cancel(e, batch);
}

enum te_status te_batch_free(struct te_engine *engine, te_batch_id batch)
{
	ENGINE_OR_FAIL(engine, "te_batch_free");
	return batch_free(e, batch);
}
