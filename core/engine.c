/* SPDX-License-Identifier: Apache-2.0 */
/* engine.c: wiring the modules into an engine, its teardown, and the public entry points. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include "core/batch.h"
#include "core/control.h"
#include "core/engine.h"
#include "core/host.h"
#include "core/metadata/metadata.h"
#include "core/memkind.h"
#include "core/progress.h"
#include "core/retry.h"
#include "core/rpc.h"
#include "core/segment.h"
#include "core/slice.h"
#include "core/stage.h"
#include "core/transport.h"
#include "te_build_config.h"

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
	g_autoptr(GString) skipped = g_string_new(NULL);
	uint32_t max_priv = 0;

	e->tps = g_new0(struct transport *, e->cfg->n_transports + 1);
	for (size_t i = 0; i < e->cfg->n_transports; i++) {
		const struct config_transport *ct = &e->cfg->transports[i];
		g_autofree char *err = NULL;
		struct plugin *p = NULL;
		struct transport *tp = NULL;
		enum te_status st;

		st = plugin_open(ct->name, ct->path, search, &p, &err);
		/*
		 * Options the plugin declares are checked before its init, and a bad one is a
		 * configuration error even for an optional transport: optional means only that
		 * the module may be absent from this host.
		 */
		if (st == TE_OK) {
			st = plugin_apply_options(p, e->cfg, i, &err);
			if (st != TE_OK) {
				plugin_close(p);
				return log_error(st, "%s", err);
			}
		}
		if (st == TE_OK) {
			char *located = NULL;

			st = transport_start(e, p, &host_services, ct, e->n_tps, &tp, &err);
			/*
			 * "option '<key>': <why>" from init's set_error is an option the plugin
			 * checked itself: say where it is, as for the options the core checks.
			 */
			if (st != TE_OK && config_option_error(e->cfg, i, p->name,
							       transport_op_error(), &located)) {
				g_free(err);
				err = located;
				/* A bad option fails the start, required or not. */
				plugin_close(p);
				return log_error(TE_ERR_CONFIG, "%s", err);
			}
			if (st != TE_OK)
				plugin_close(p);
		}
		/* Optional means "may be absent from this host", not "may be misconfigured". */
		if (st == TE_ERR_CONFIG)
			return log_error(st, "transport '%s'%s: %s", ct->name,
					 ct->required ? " (required)" : "", err);
		if (st != TE_OK) {
			if (ct->required)
				return log_error(st, "transport '%s' (required): %s", ct->name,
						 err);
			ENGINE_LOG(e, TE_LOG_WARN, "transport '%s' (optional) skipped: %s",
				   ct->name, err);
			g_string_append_printf(skipped, "%s%s: %s", skipped->len ? "; " : "",
					       ct->name, err);
			continue;
		}
		e->tps[e->n_tps++] = tp;
		max_priv = MAX(max_priv, tp->caps.slice_priv_size);
		ENGINE_LOG(e, TE_LOG_INFO, "transport %s loaded from %s (%s progress, %u devices)",
			   p->name, p->path,
			   tp->caps.progress == TE_PLUGIN_PROGRESS_MANUAL ? "manual"
			   : tp->hybrid					  ? "hybrid"
									  : "auto",
			   tp->n_devices);
	}
	/* An engine that cannot move a byte fails now, not at its first segment open. */
	if (!e->n_tps)
		return log_error(
			TE_ERR_NO_TRANSPORT,
			"no transport could be loaded, so this engine could not move data: "
			"%s",
			skipped->len ? skipped->str : "the configuration lists none");
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
	/* Every waiter may poll (up to max_pollers) when every hybrid transport serves its own. */
	e->per_thread = !e->has_manual;
	for (unsigned i = 0; i < e->n_tps; i++)
		if (e->tps[i]->hybrid && !e->tps[i]->per_thread)
			e->per_thread = false;
	/* transfer.max_pollers; 0: half the CPUs, the rest is for the plugins' threads and peers. */
	e->max_pollers =
		e->cfg->max_pollers ? e->cfg->max_pollers : MAX(1u, g_get_num_processors() / 2u);
	e->crowded_hold_ns = PROGRESS_CROWDED_HOLD_NS;
	return TE_OK;
}

/* Give plugins a moment to hand back canceled slices (bounded). */
static void engine_drain(struct engine *e)
{
	uint64_t give_up = engine_now_ns() + 2000000000ull;

	while (atomic_load(&e->live_batches) && engine_now_ns() < give_up) {
		if (!progress_once(e, false))
			g_usleep(1000);
	}
	if (atomic_load(&e->live_batches))
		ENGINE_LOG(e, TE_LOG_WARN,
			   "%u batch(es) still held by transports at shutdown; fini releases "
			   "them",
			   atomic_load(&e->live_batches));
}

/*
 * engine_destroy - the module finalizers, in order. Each undoes its module's part of
 * te_engine_new and copes with a part never made (a failed start).
 */
static void engine_destroy(struct engine *e)
{
	/*
	 * The watch thread stops changing segments first (it runs until metadata_close;
	 * a change it delivers may import a descriptor into transports torn down below).
	 */
	metadata_watch_quiet(e);
	/* Peers stop finding us (a store backend deletes our key). */
	metadata_withdraw_local(e);
	progress_stop(e);
	/* No peer request may reach the engine while it comes apart. */
	rpc_server_stop(e->rpc);
	e->rpc = NULL;
	if (e->slots)
		retry_cancel_all(e);
	retry_drop_all(e);
	for (unsigned i = 0; i < e->n_tps; i++)
		slice_drop_backlog(e->tps[i]);
	batch_table_fini(e);
	engine_drain(e);
	/*
	 * Drop the segments' views first (unloading peers nobody else uses) but keep the
	 * segment structs: slices a plugin reports during fini release tasks that still
	 * count on them. Views held by such tasks go when those tasks go.
	 */
	segment_table_drop_views(e);
	/* te_mem_alloc memory left: unregistered and freed while its transport still runs. */
	memkind_release_all(e);
	/*
	 * fini completes whatever a plugin still holds and releases its peers, keys and
	 * registrations; from here the core makes no more calls into it.
	 */
	for (unsigned i = 0; i < e->n_tps; i++)
		transport_fini(e->tps[i]);
	segment_table_fini(e);
	if (e->mem.regions) {
		mem_unregister_all(e);
		mem_table_clear(&e->mem);
	}
	for (unsigned i = 0; i < e->n_tps; i++) {
		struct plugin *p = e->tps[i]->plugin;

		stage_pool_free(e->tps[i]);
		transport_free(e->tps[i]);
		plugin_close(p);
	}
	metadata_close(e->md);
	e->md = NULL;
	control_stop(e);
	batch_table_clear(e);
	g_free(e->tps);
	g_free(e->slice_size);
	g_free(e->name);
	g_free(e->host_id);
	g_free(e->pid_ns);
	g_free((char *)e->log.prefix);
	if (e->log.file)
		fclose(e->log.file);
	config_free(e->cfg);
	g_mutex_clear(&e->work_lock);
	g_cond_clear(&e->work_cond);
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
	FILE *log_file = NULL;
	int env_level = -1;

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
	st = log_from_env(&env_level, &log_file, &err);
	if (st != TE_OK) {
		config_free(cfg);
		return log_error(st, "%s", err);
	}

	e = g_new0(struct engine, 1);
	e->cfg = cfg;
	e->log.fn = opts->log_fn;
	e->log.user = opts->log_user;
	e->log.file = log_file;
	/* The caller's level, else $TE_LOG_LEVEL, else the config's log.level. */
	atomic_init(&e->log.level, opts->log_level >= 0 ? opts->log_level
				   : env_level >= 0	? env_level
							: cfg->log_level);
	g_mutex_init(&e->work_lock);
	g_cond_init(&e->work_cond);
	batch_table_init(e);
	mem_table_init(&e->mem);
	memkind_init(e);
	segment_table_init(e);
	atomic_init(&e->next_deadline_ns, UINT64_MAX);
	e->generation = engine_new_generation();
	e->host_id = engine_read_host_id();
	e->pid_ns = g_file_read_link("/proc/self/ns/pid", NULL);
	e->describe_local = segment_local_descriptor;
	st = control_start(e, &err);
	if (st == TE_OK)
		st = metadata_open(e, &e->md, &err);
	if (st != TE_OK) {
		engine_destroy(e);
		return log_error(st, "control plane: %s", err ? err : te_status_str(st));
	}
	/* A segment is named by where peers reach it unless the YAML names it. */
	e->name = cfg->name ? g_strdup(cfg->name) : g_strdup(control_address(e));
	e->log.prefix = g_strdup(e->name);

	st = engine_load_transports(e);
	if (st != TE_OK) {
		g_autofree char *msg = g_strdup(te_last_error());

		engine_destroy(e);
		return log_error(st, "%s", msg);
	}
	if (!progress_start(e)) {
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
	st = metadata_watch_start(e, segment_watch_event, &err);
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

const char *te_version(void)
{
	return TE_VERSION;
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
	return slice_submit(e, batch, requests, n);
}

enum te_status te_batch_submit_notify(struct te_engine *engine, te_batch_id batch,
				      const struct te_request *requests, size_t n, const void *msg,
				      size_t len)
{
	ENGINE_OR_FAIL(engine, "te_batch_submit_notify");
	return slice_submit_notify(e, batch, requests, n, msg, len);
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
	return progress_wait(e, batch, timeout_ns);
}

enum te_status te_batch_cancel(struct te_engine *engine, te_batch_id batch)
{
	ENGINE_OR_FAIL(engine, "te_batch_cancel");
	return retry_cancel(e, batch);
}

enum te_status te_batch_free(struct te_engine *engine, te_batch_id batch)
{
	ENGINE_OR_FAIL(engine, "te_batch_free");
	return batch_free(e, batch);
}

/* Largest object one plugin's stats may report (a bound on what a buggy plugin asks for). */
#define ENGINE_STATS_MAX (16u << 20)

/* One transport's stats object, parsed (NULL when it reports nothing). */
static enum te_status engine_transport_stats(struct transport *tp, JsonNode **node_out)
{
	const char *name = tp->plugin->name;
	g_autoptr(JsonParser) parser = NULL;
	g_autofree char *buf = NULL;
	size_t len = 0, need = 0;
	enum te_status st = TE_ERR_TOO_LARGE;
	g_autoptr(GError) err = NULL;

	*node_out = NULL;
	if (!tp->inst || !tp->plugin->ops.stats)
		return TE_OK;
	/* The object may grow between the calls: try again a few times with what it needs. */
	for (int tries = 0; tries < 4 && st == TE_ERR_TOO_LARGE; tries++) {
		if (need > len) {
			if (need > ENGINE_STATS_MAX)
				return log_error(
					TE_ERR_PLUGIN_INVALID,
					"te_engine_stats: transport %s asks for %zu bytes of "
					"stats (at most %u)",
					name, need, ENGINE_STATS_MAX);
			g_free(buf);
			buf = g_malloc(need);
			len = need;
		}
		need = 0;
		if (tp->serialized)
			g_mutex_lock(&tp->call_lock);
		st = tp->plugin->ops.stats(tp->inst, buf, len, &need);
		if (tp->serialized)
			g_mutex_unlock(&tp->call_lock);
		if (st == TE_ERR_TOO_LARGE && need <= len)
			return log_error(TE_ERR_PLUGIN_INVALID,
					 "te_engine_stats: transport %s: stats reported "
					 "TE_ERR_TOO_LARGE but needs only %zu bytes of %zu",
					 name, need, len);
	}
	if (st == TE_ERR_UNSUPPORTED)
		return TE_OK;
	if (st != TE_OK)
		return log_error(st, "te_engine_stats: transport %s: stats failed: %s", name,
				 te_status_str(st));
	if (!buf || !memchr(buf, '\0', len))
		return log_error(
			TE_ERR_PLUGIN_INVALID,
			"te_engine_stats: transport %s: stats are not NUL-terminated within "
			"%zu bytes",
			name, len);
	parser = json_parser_new();
	if (!json_parser_load_from_data(parser, buf, -1, &err) ||
	    !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
		return log_error(TE_ERR_PLUGIN_INVALID,
				 "te_engine_stats: transport %s: stats are not a JSON object%s%s",
				 name, err ? ": " : "", err ? err->message : "");
	*node_out = json_node_copy(json_parser_get_root(parser));
	return TE_OK;
}

enum te_status te_engine_stats(struct te_engine *engine, char **json_out)
{
	ENGINE_OR_FAIL(engine, "te_engine_stats");
	g_autoptr(JsonBuilder) b = NULL;
	g_autoptr(JsonGenerator) gen = NULL;
	g_autoptr(JsonNode) root = NULL;

	if (!json_out)
		return log_error(TE_ERR_INVALID_ARG, "te_engine_stats: json_out is NULL");
	b = json_builder_new();
	json_builder_begin_object(b);
	for (unsigned t = 0; t < e->n_tps; t++) {
		JsonNode *node;
		enum te_status st = engine_transport_stats(e->tps[t], &node);

		if (st != TE_OK)
			return st;
		if (!node)
			continue;
		json_builder_set_member_name(b, e->tps[t]->plugin->name);
		json_builder_add_value(b, node); /* takes it */
	}
	json_builder_end_object(b);
	root = json_builder_get_root(b);
	gen = json_generator_new();
	json_generator_set_root(gen, root);
	*json_out = json_generator_to_data(gen, NULL);
	if (!*json_out)
		return log_error(TE_ERR_NOMEM, "te_engine_stats: encoding failed");
	return TE_OK;
}
