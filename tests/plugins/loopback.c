/* SPDX-License-Identifier: Apache-2.0 */
/* loopback.c: in-process test transport between engines of one process, and its faulty twins. */

/*
 * One source, many modules. Built plainly it is "loopback": a correct, fast
 * transport that moves bytes with memmove between segments living in this
 * process. Built with -D flags it becomes the fault and ABI test plugins
 * (tests/plugins/meson.build lists them):
 *   LOOPBACK_NAME="x"              descriptor name and log/detail prefix
 *   LOOPBACK_FAULT_FAIL_NTH        attempts N..N+K-1 end with TE_ERR_TRANSIENT
 *   LOOPBACK_FAULT_FAIL_PERM       every slice ends with TE_ERR_PEER_REJECTED
 *   LOOPBACK_FAULT_NEVER_COMPLETE  slices end only through cancel or fini
 *   LOOPBACK_FAULT_LATE_CANCEL     cancel() reports TE_OK ~late_ms later, from a thread
 *   LOOPBACK_FAULT_INIT_FAIL       init fails with TE_ERR_NO_DEVICE
 *   LOOPBACK_FAULT_NULL_INSTANCE   init returns TE_OK without an instance (a contract breach)
 *   LOOPBACK_DESC_ABI_MAJOR=n, LOOPBACK_DESC_ABI_MINOR=n, LOOPBACK_DESC_SIZE=n
 *   LOOPBACK_OPS_SIZE=n            ops table size (an older ABI's table)
 *                                  lie in the descriptor
 *   LOOPBACK_OMIT_SUBMIT           leave the required submit op NULL
 *   LOOPBACK_ENTRY_SYMBOL=sym      export sym instead of TE_PLUGIN_ENTRY
 *   LOOPBACK_DECLARED              declare its options (ABI 1.2; one of each type) and log
 *                                  every effective option at init ("option key=value")
 *   LOOPBACK_DECLARED_REQUIRED     ... and a required option, "token"
 *   LOOPBACK_BAD_DECL              declare an option whose default fails its own range
 *
 * Peers find each other through a process-wide registry: init publishes
 * {pid, process nonce, instance token}; load_peer resolves the token to the
 * target's endpoint (its region table) and holds a reference on it, so a target
 * that finis leaves an endpoint marked gone instead of a dangling pointer.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np, pthread_setname_np */
#endif

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>
#include <te/te_plugin_util.h>

/* The project version, passed by the build; 0.0.0 when built outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define LOOPBACK_PRIV_SIZE 16u /* slice private bytes (see query_caps) */
#ifndef LOOPBACK_NAME
#define LOOPBACK_NAME "loopback"
#endif
#ifndef LOOPBACK_DESC_ABI_MAJOR
#define LOOPBACK_DESC_ABI_MAJOR TE_PLUGIN_ABI_MAJOR
#endif
#ifndef LOOPBACK_DESC_ABI_MINOR
#define LOOPBACK_DESC_ABI_MINOR TE_PLUGIN_ABI_MINOR
#endif
#ifndef LOOPBACK_DESC_SIZE
#define LOOPBACK_DESC_SIZE sizeof(struct te_plugin_desc)
#endif
#ifndef LOOPBACK_OPS_SIZE
#define LOOPBACK_OPS_SIZE sizeof(struct te_plugin_ops)
#endif

/* Fault plugins whose slices never run on their own: no workers, progress() is a no-op. */
#if defined(LOOPBACK_FAULT_NEVER_COMPLETE) || defined(LOOPBACK_FAULT_LATE_CANCEL)
#define LOOPBACK_NEVER_RUNS 1
#else
#define LOOPBACK_NEVER_RUNS 0
#endif

#define LOOPBACK_UNUSED __attribute__((unused))

/* Slices taken from the queue per lock round trip: amortises the lock, bounds the stack. */
#define LOOPBACK_BATCH 64u
/* A worker that drained the queue polls this long before sleeping on the condvar. */
#define LOOPBACK_SPIN_NS 20000u
#define LOOPBACK_MAX_WORKERS 64u
#define LOOPBACK_MAX_DEPTH (1u << 22)
#define LOOPBACK_MAX_SIZE (1ull << 40)
#define LOOPBACK_DETAIL_MAX 256

/* Wire formats: explicit little-endian fields so blobs are well defined byte strings. */
#define LOOPBACK_PEER_MAGIC 0x31504c54u /* "TLP1" */
#define LOOPBACK_KEY_MAGIC 0x314b4c54u	/* "TLK1" */
#define LOOPBACK_PEER_BLOB_LEN 32u	/* magic, version, pid, nonce, token */
#define LOOPBACK_KEY_BLOB_LEN 24u	/* magic, access, addr, length */

#define LOOPBACK_ACCESS_ALL (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)

/*
 * The serving half of an instance: what peers need to execute against it.
 * Shared by the owning instance and every peer handle that targets it;
 * freed by whoever drops the last reference.
 */
struct loopback_endpoint {
	/* Readers: slices copying to/from this instance's memory. Writer: reg, dereg, fini. */
	pthread_rwlock_t lock;
	bool gone;			  /* owner finished; under lock */
	struct te_plugin_regions regions; /* handles: struct loopback_mem */
	atomic_uint refs;
	uint64_t token;
	struct loopback_endpoint *next; /* registry list; under loopback_registry_lock */
};

struct loopback_mem {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
};

struct loopback_peer {
	struct loopback_endpoint *ep; /* holds one reference */
	char *name;
};

struct loopback_rkey {
	uint64_t addr;
	uint64_t length;
	uint32_t access;
};

#ifdef LOOPBACK_FAULT_LATE_CANCEL
struct loopback_late {
	struct loopback_late *next;
	struct te_plugin_slice *slice;
	struct timespec due; /* CLOCK_MONOTONIC */
};
#endif

struct loopback_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;
	struct loopback_endpoint *ep;

	/* options */
	enum te_plugin_progress progress;
	uint32_t workers;
	uint32_t depth;
	uint64_t slice_size;
	uint64_t max_slice_size;

	/* Submission queue: a ring of slice pointers; count <= depth <= mask + 1. */
	pthread_mutex_t qlock;
	pthread_cond_t qcond;
	struct te_plugin_slice **ring;
	uint32_t mask;
	uint32_t head;
	/* Written under qlock; read relaxed outside it only as a hint for spinning workers. */
	atomic_uint count;
	atomic_bool stop;
	uint32_t sleepers; /* workers blocked on qcond; submit signals only when > 0 */
	pthread_t *threads;
	uint32_t n_threads;

	/* Handles the core still holds; reported at fini to expose leaks. */
	atomic_uint live_peers;
	atomic_uint live_rkeys;

#ifdef LOOPBACK_FAULT_FAIL_NTH
	atomic_uint_fast64_t attempts;
	uint64_t fail_nth;
	uint64_t fail_count;
#endif
#ifdef LOOPBACK_FAULT_LATE_CANCEL
	uint64_t late_ms;
	pthread_mutex_t late_lock;
	pthread_cond_t late_cond; /* CLOCK_MONOTONIC */
	struct loopback_late *late_head;
	struct loopback_late *late_tail;
	bool late_stop;
	bool late_started;
	pthread_t late_thread;
#endif
};

/* Why a slice ended; turned into status and detail only at completion time. */
enum loopback_outcome {
	LOOPBACK_DONE = 0,
	LOOPBACK_BAD_OPCODE,
	LOOPBACK_BAD_PEER,
	LOOPBACK_TOO_LARGE,
	LOOPBACK_LOCAL_RANGE,
	LOOPBACK_PEER_GONE,
	LOOPBACK_NO_REGION,
	LOOPBACK_NO_ACCESS,
	LOOPBACK_INJECTED_TRANSIENT,
	LOOPBACK_INJECTED_PERMANENT,
};

/*
 * The registry of live endpoints of this process. The only mutable globals:
 * the module is loaded RTLD_NODELETE, so every engine of the process shares them.
 */
static pthread_mutex_t loopback_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct loopback_endpoint *loopback_registry;
static uint64_t loopback_next_token = 1;
/* Random-ish per process, so a blob of a dead process whose pid was reused is not ours. */
static uint64_t loopback_nonce;

static inline struct loopback_inst *loopback_inst_of(struct te_plugin_inst *inst)
{
	return (struct loopback_inst *)inst;
}

static inline struct loopback_peer *loopback_peer_of(struct te_plugin_peer *peer)
{
	return (struct loopback_peer *)peer;
}

static inline void loopback_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	atomic_signal_fence(memory_order_seq_cst);
#endif
}

static uint64_t loopback_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * The host prefixes every line with the plugin name. A failing op logs its reason at WARN:
 * ops have no detail out-parameter, and the core quotes the last WARN/ERROR line in the
 * error it reports for that op.
 */
#define loopback_log(li, level, ...) (li)->host->log((li)->ctx, (level), __VA_ARGS__)

/* --- endpoints and the registry ------------------------------------------------------- */

static void loopback_endpoint_put(struct loopback_endpoint *ep)
{
	/* acq_rel: the last owner must see every write made under other references. */
	if (atomic_fetch_sub_explicit(&ep->refs, 1, memory_order_acq_rel) != 1)
		return;
	pthread_rwlock_destroy(&ep->lock);
	te_plugin_regions_free(&ep->regions);
	free(ep);
}

static enum te_status loopback_endpoint_new(struct loopback_endpoint **ep_out)
{
	struct loopback_endpoint *ep = calloc(1, sizeof(*ep));
	pthread_rwlockattr_t attr;
	int rc;

	if (!ep)
		return TE_ERR_NOMEM;
	pthread_rwlockattr_init(&attr);
	/*
	 * Slices hold the read side continuously under load; without writer preference
	 * a dereg_mem could wait forever behind them.
	 */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	rc = pthread_rwlock_init(&ep->lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	if (rc != 0) {
		free(ep);
		return TE_ERR_SYSTEM;
	}
	atomic_init(&ep->refs, 1);
	*ep_out = ep;
	return TE_OK;
}

static void loopback_registry_add(struct loopback_endpoint *ep)
{
	pthread_mutex_lock(&loopback_registry_lock);
	if (loopback_nonce == 0) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		loopback_nonce = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^
				 ((uint64_t)getpid() << 40) ^
				 (uint64_t)(uintptr_t)&loopback_registry;
		if (loopback_nonce == 0)
			loopback_nonce = 1;
	}
	/* Tokens are never reused, so a blob of a finished instance stays unknown. */
	ep->token = loopback_next_token++;
	ep->next = loopback_registry;
	loopback_registry = ep;
	pthread_mutex_unlock(&loopback_registry_lock);
}

static void loopback_registry_remove(struct loopback_endpoint *ep)
{
	pthread_mutex_lock(&loopback_registry_lock);
	for (struct loopback_endpoint **pp = &loopback_registry; *pp; pp = &(*pp)->next) {
		if (*pp == ep) {
			*pp = ep->next;
			break;
		}
	}
	pthread_mutex_unlock(&loopback_registry_lock);
}

/* A new reference to the live endpoint of @token, or NULL. */
static struct loopback_endpoint *loopback_registry_get(uint64_t nonce, uint64_t token)
{
	struct loopback_endpoint *found = NULL;

	pthread_mutex_lock(&loopback_registry_lock);
	if (nonce == loopback_nonce) {
		for (struct loopback_endpoint *ep = loopback_registry; ep; ep = ep->next) {
			if (ep->token == token) {
				/* relaxed: the registry lock orders it against the owner's fini. */
				atomic_fetch_add_explicit(&ep->refs, 1, memory_order_relaxed);
				found = ep;
				break;
			}
		}
	}
	pthread_mutex_unlock(&loopback_registry_lock);
	return found;
}

/* --- options ---------------------------------------------------------------------------- */

/* Free-form options (every variant but the declared ones): parsed here. */
LOOPBACK_UNUSED static enum te_status loopback_opt_u64(struct loopback_inst *li, const char *key,
						       uint64_t def, uint64_t min, uint64_t max,
						       bool size_suffix, uint64_t *out)
{
	const char *s = li->host->config_get(li->ctx, key);

	if (!s) {
		*out = def;
		return TE_OK;
	}
	if (te_plugin_parse_u64(s, size_suffix, min, max, out))
		return TE_OK;
	loopback_log(li, TE_PLUGIN_LOG_ERROR,
		     "option '%s': expected an integer%s in [%" PRIu64 ", %" PRIu64 "], got '%s'",
		     key, size_suffix ? " (optional " TE_PLUGIN_SIZE_SUFFIXES " suffix)" : "", min,
		     max, s);
	return TE_ERR_CONFIG;
}

/* clang-format off */
LOOPBACK_UNUSED static const char *const loopback_option_names[] = {
	"progress",
	"workers",
	"queue_depth",
	"slice_size",
	"max_slice_size",
#ifdef LOOPBACK_FAULT_FAIL_NTH
	"fail_nth",
	"fail_count",
#endif
#ifdef LOOPBACK_FAULT_LATE_CANCEL
	"late_ms",
#endif
};
/* clang-format on */

#if defined(LOOPBACK_DECLARED) || defined(LOOPBACK_BAD_DECL)
static const char *const loopback_progress_modes[] = { "auto", "manual", NULL };

/* Declared options: the core checks them and fills in the defaults (te_plugin.h, ABI 1.2). */
static const struct te_plugin_option loopback_options[] = {
	TE_PLUGIN_OPTION_CHOICE("progress", "auto", loopback_progress_modes,
				"auto: worker threads complete slices; manual: progress() does"),
#ifdef LOOPBACK_BAD_DECL
	TE_PLUGIN_OPTION_INT("workers", "0", 1, LOOPBACK_MAX_WORKERS, "worker threads"),
#else
	TE_PLUGIN_OPTION_INT("workers", "1", 1, LOOPBACK_MAX_WORKERS, "worker threads"),
#endif
	TE_PLUGIN_OPTION_INT("queue_depth", "4096", 1, LOOPBACK_MAX_DEPTH, "slices queued at most"),
	TE_PLUGIN_OPTION_SIZE("slice_size", "64K", 1, LOOPBACK_MAX_SIZE,
			      "slice size advertised to the core"),
	TE_PLUGIN_OPTION_SIZE("max_slice_size", "0", 0, LOOPBACK_MAX_SIZE,
			      "largest slice accepted; 0: any"),
	TE_PLUGIN_OPTION_BOOL("verbose", "false", "log more (a boolean for tests)"),
	TE_PLUGIN_OPTION_INT("bias", "-1", -100, 100, "a signed integer for tests"),
	TE_PLUGIN_OPTION_STRING("label", "lo", "a string for tests"),
	TE_PLUGIN_OPTION_STRING("note", NULL, "a string without default for tests"),
#ifdef LOOPBACK_DECLARED_REQUIRED
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, "token", NULL, 0, 0, NULL, TE_PLUGIN_OPT_REQUIRED,
			 "a required string for tests"),
#endif
};

static void loopback_log_option(void *user, const char *key, const char *value)
{
	struct loopback_inst *li = user;

	loopback_log(li, TE_PLUGIN_LOG_INFO, "option %s=%s", key, value);
}

/* Values come checked and normalized: conversion only, and the one cross-option rule. */
static enum te_status loopback_parse_declared(struct loopback_inst *li)
{
	const struct te_plugin_host *h = li->host;

	li->host->config_foreach(li->ctx, loopback_log_option, li);
	li->progress = te_plugin_opt_choice(h, li->ctx, "progress", loopback_progress_modes, 0)
			       ? TE_PLUGIN_PROGRESS_MANUAL
			       : TE_PLUGIN_PROGRESS_AUTO;
	li->workers = (uint32_t)te_plugin_opt_int(h, li->ctx, "workers", 1);
	li->depth = (uint32_t)te_plugin_opt_int(h, li->ctx, "queue_depth", 4096);
	li->slice_size = te_plugin_opt_size(h, li->ctx, "slice_size", 65536);
	li->max_slice_size = te_plugin_opt_size(h, li->ctx, "max_slice_size", 0);
	if (li->max_slice_size && li->slice_size > li->max_slice_size) {
		h->set_error(li->ctx,
			     LOOPBACK_NAME ": option 'slice_size' (%" PRIu64
					   ") exceeds option 'max_slice_size' (%" PRIu64 ")",
			     li->slice_size, li->max_slice_size);
		return TE_ERR_CONFIG;
	}
	return TE_OK;
}
#endif

static enum te_status loopback_parse_options(struct loopback_inst *li)
{
#if defined(LOOPBACK_DECLARED) || defined(LOOPBACK_BAD_DECL)
	return loopback_parse_declared(li);
#else
	const char *progress = li->host->config_get(li->ctx, "progress");
	char bad[64];
	uint64_t v;
	enum te_status st;

	/* A typo in a test's YAML must not silently run with defaults. */
	if (te_plugin_unknown_option(li->host, li->ctx, loopback_option_names,
				     TE_PLUGIN_ARRAY_LEN(loopback_option_names), bad,
				     sizeof(bad))) {
		loopback_log(li, TE_PLUGIN_LOG_ERROR, "unknown option '%s'", bad);
		return TE_ERR_CONFIG;
	}

	if (!progress || strcmp(progress, "auto") == 0) {
		li->progress = TE_PLUGIN_PROGRESS_AUTO;
	} else if (strcmp(progress, "manual") == 0) {
		li->progress = TE_PLUGIN_PROGRESS_MANUAL;
	} else {
		loopback_log(li, TE_PLUGIN_LOG_ERROR,
			     "option 'progress': expected auto or manual, got '%s'", progress);
		return TE_ERR_CONFIG;
	}

	st = loopback_opt_u64(li, "workers", 1, 1, LOOPBACK_MAX_WORKERS, false, &v);
	if (st != TE_OK)
		return st;
	li->workers = (uint32_t)v;
	st = loopback_opt_u64(li, "queue_depth", 4096, 1, LOOPBACK_MAX_DEPTH, false, &v);
	if (st != TE_OK)
		return st;
	li->depth = (uint32_t)v;
	st = loopback_opt_u64(li, "slice_size", 65536, 1, LOOPBACK_MAX_SIZE, true, &li->slice_size);
	if (st != TE_OK)
		return st;
	st = loopback_opt_u64(li, "max_slice_size", 0, 0, LOOPBACK_MAX_SIZE, true,
			      &li->max_slice_size);
	if (st != TE_OK)
		return st;
	if (li->max_slice_size && li->slice_size > li->max_slice_size) {
		loopback_log(li, TE_PLUGIN_LOG_ERROR,
			     "option 'slice_size' (%" PRIu64
			     ") exceeds option 'max_slice_size' (%" PRIu64 ")",
			     li->slice_size, li->max_slice_size);
		return TE_ERR_CONFIG;
	}
#ifdef LOOPBACK_FAULT_FAIL_NTH
	st = loopback_opt_u64(li, "fail_nth", 3, 1, UINT64_MAX / 2, false, &li->fail_nth);
	if (st != TE_OK)
		return st;
	st = loopback_opt_u64(li, "fail_count", 1, 0, UINT64_MAX / 2, false, &li->fail_count);
	if (st != TE_OK)
		return st;
#endif
#ifdef LOOPBACK_FAULT_LATE_CANCEL
	st = loopback_opt_u64(li, "late_ms", 50, 0, 60000, false, &li->late_ms);
	if (st != TE_OK)
		return st;
#endif
	return TE_OK;
#endif
}

/* --- execution -------------------------------------------------------------------------- */

/* Checks that need only the slice and the local side. */
static enum loopback_outcome loopback_check_slice(const struct loopback_inst *li,
						  const struct te_plugin_slice *s)
{
	const struct loopback_mem *lm = (const struct loopback_mem *)s->local_mem;
	uint64_t local = (uint64_t)(uintptr_t)s->local;

	if (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)
		return LOOPBACK_BAD_OPCODE;
	if (!s->peer)
		return LOOPBACK_BAD_PEER;
	if (s->length == 0 || (li->max_slice_size && s->length > li->max_slice_size))
		return LOOPBACK_TOO_LARGE;
	/* The lkey check a NIC would do: the core promised the local side is registered. */
	if (lm && (local < lm->addr || s->length > lm->length ||
		   local - lm->addr > lm->length - s->length))
		return LOOPBACK_LOCAL_RANGE;
	return LOOPBACK_DONE;
}

/*
 * The serving side: the target allows the access only inside one of its registered
 * regions with the matching remote access bit. Called with ep->lock held for read,
 * which keeps the region alive (dereg_mem waits) while its bytes are copied.
 * @hint caches the last region found: slices of a batch tend to hit the same buffer.
 */
static enum loopback_outcome loopback_serve(const struct loopback_endpoint *ep,
					    const struct te_plugin_slice *s, uint32_t *hint)
{
	uint32_t need = s->opcode == TE_PLUGIN_OP_READ ? TE_PLUGIN_ACCESS_REMOTE_READ
						       : TE_PLUGIN_ACCESS_REMOTE_WRITE;
	const struct te_plugin_region *r;
	uint64_t end;

	if (ep->gone)
		return LOOPBACK_PEER_GONE;
	if (s->remote > UINT64_MAX - s->length)
		return LOOPBACK_NO_REGION;
	end = s->remote + s->length;
	if (*hint < ep->regions.n && ep->regions.v[*hint].start <= s->remote &&
	    end <= ep->regions.v[*hint].end) {
		r = &ep->regions.v[*hint];
	} else {
		uint32_t i = te_plugin_regions_search(&ep->regions, s->remote);

		if (i == ep->regions.n || ep->regions.v[i].start > s->remote ||
		    end > ep->regions.v[i].end)
			return LOOPBACK_NO_REGION;
		*hint = i;
		r = &ep->regions.v[i];
	}
	if (!(r->access & need))
		return LOOPBACK_NO_ACCESS;

	/* memmove: a segment may read or write itself through a loopback peer. */
	if (s->opcode == TE_PLUGIN_OP_READ)
		memmove(s->local, (const void *)(uintptr_t)s->remote, s->length);
	else
		memmove((void *)(uintptr_t)s->remote, s->local, s->length);
	return LOOPBACK_DONE;
}

static void loopback_complete(struct loopback_inst *li, struct te_plugin_slice *s,
			      enum loopback_outcome why, uint64_t aux)
{
	char detail[LOOPBACK_DETAIL_MAX];
	const char *peer = s->peer ? loopback_peer_of(s->peer)->name : "?";
	enum te_status st;

	switch (why) {
	case LOOPBACK_DONE:
		li->host->slice_done(li->ctx, s, TE_OK, s->length, NULL);
		return;
	case LOOPBACK_BAD_OPCODE:
		st = TE_ERR_INVALID_ARG;
		snprintf(detail, sizeof(detail), LOOPBACK_NAME ": unknown opcode %" PRIu32,
			 s->opcode);
		break;
	case LOOPBACK_BAD_PEER:
		st = TE_ERR_INVALID_HANDLE;
		snprintf(detail, sizeof(detail), LOOPBACK_NAME ": slice without a peer handle");
		break;
	case LOOPBACK_TOO_LARGE:
		st = TE_ERR_TOO_LARGE;
		snprintf(detail, sizeof(detail),
			 LOOPBACK_NAME ": slice length %" PRIu64
				       " is 0 or over max_slice_size %" PRIu64,
			 s->length, li->max_slice_size);
		break;
	case LOOPBACK_LOCAL_RANGE:
		st = TE_ERR_OUT_OF_RANGE;
		snprintf(detail, sizeof(detail),
			 LOOPBACK_NAME ": local range [%p,+%" PRIu64
				       ") outside its registered region",
			 s->local, s->length);
		break;
	case LOOPBACK_PEER_GONE:
		st = TE_ERR_CONN_RESET;
		snprintf(detail, sizeof(detail), LOOPBACK_NAME ": peer instance gone (%s)", peer);
		break;
	case LOOPBACK_NO_REGION:
	case LOOPBACK_NO_ACCESS:
		st = TE_ERR_REMOTE_ACCESS;
		snprintf(detail, sizeof(detail),
			 LOOPBACK_NAME ": remote range [0x%" PRIx64 ",+%" PRIu64
				       ") not in a registered remote-accessible buffer of %s%s",
			 s->remote, s->length, peer,
			 why == LOOPBACK_NO_REGION	  ? ""
			 : s->opcode == TE_PLUGIN_OP_READ ? " (region not remote-readable)"
							  : " (region not remote-writable)");
		break;
	case LOOPBACK_INJECTED_TRANSIENT:
		st = TE_ERR_TRANSIENT;
		snprintf(detail, sizeof(detail),
			 LOOPBACK_NAME ": injected transient failure on slice attempt %" PRIu64,
			 aux);
		break;
	case LOOPBACK_INJECTED_PERMANENT:
	default:
		st = TE_ERR_PEER_REJECTED;
		snprintf(detail, sizeof(detail), LOOPBACK_NAME ": injected permanent failure");
		break;
	}
	li->host->slice_done(li->ctx, s, st, 0, detail);
}

/*
 * Execute and complete @n (<= LOOPBACK_BATCH) dequeued slices. Copies run under the
 * target endpoint's read lock, taken once per run of slices to the same target;
 * completions run with no lock held, since slice_done may call back into submit.
 */
static void loopback_run(struct loopback_inst *li, struct te_plugin_slice **v, uint32_t n)
{
	uint8_t why[LOOPBACK_BATCH];
	uint64_t aux[LOOPBACK_BATCH];
	struct loopback_endpoint *held = NULL;
	uint32_t hint = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct te_plugin_slice *s = v[i];
		enum loopback_outcome o;
		struct loopback_endpoint *ep;

		s->device = 0; /* one device: retries name it */
		aux[i] = 0;
		o = loopback_check_slice(li, s);
#ifdef LOOPBACK_FAULT_FAIL_NTH
		if (o == LOOPBACK_DONE) {
			/* relaxed: a count, its order is the queue's FIFO order per consumer. */
			uint64_t a =
				atomic_fetch_add_explicit(&li->attempts, 1, memory_order_relaxed) +
				1;

			if (a >= li->fail_nth && a - li->fail_nth < li->fail_count) {
				o = LOOPBACK_INJECTED_TRANSIENT;
				aux[i] = a;
			}
		}
#endif
#ifdef LOOPBACK_FAULT_FAIL_PERM
		if (o == LOOPBACK_DONE)
			o = LOOPBACK_INJECTED_PERMANENT;
#endif
		if (o == LOOPBACK_DONE) {
			ep = loopback_peer_of(s->peer)->ep;
			if (ep != held) {
				if (held)
					pthread_rwlock_unlock(&held->lock);
				held = ep;
				pthread_rwlock_rdlock(&held->lock);
				hint = 0;
			}
			o = loopback_serve(held, s, &hint);
		}
		why[i] = (uint8_t)o;
	}
	if (held)
		pthread_rwlock_unlock(&held->lock);
	for (uint32_t i = 0; i < n; i++)
		loopback_complete(li, v[i], (enum loopback_outcome)why[i], aux[i]);
}

/* --- the queue -------------------------------------------------------------------------- */

static uint32_t loopback_pop_locked(struct loopback_inst *li, struct te_plugin_slice **out,
				    uint32_t max)
{
	/* relaxed: count is only written under qlock, which we hold. */
	uint32_t count = atomic_load_explicit(&li->count, memory_order_relaxed);
	uint32_t n = count < max ? count : max;

	for (uint32_t i = 0; i < n; i++)
		out[i] = li->ring[(li->head + i) & li->mask];
	li->head = (li->head + n) & li->mask;
	atomic_store_explicit(&li->count, count - n, memory_order_relaxed);
	return n;
}

/* Remove @slice if it is still queued. Under qlock. */
static bool loopback_unqueue_locked(struct loopback_inst *li, const struct te_plugin_slice *slice)
{
	uint32_t count = atomic_load_explicit(&li->count, memory_order_relaxed);

	for (uint32_t i = 0; i < count; i++) {
		if (li->ring[(li->head + i) & li->mask] != slice)
			continue;
		/* Close the gap so FIFO order and count stay exact; cancel is rare. */
		for (uint32_t j = i; j + 1 < count; j++)
			li->ring[(li->head + j) & li->mask] =
				li->ring[(li->head + j + 1) & li->mask];
		atomic_store_explicit(&li->count, count - 1, memory_order_relaxed);
		return true;
	}
	return false;
}

/* Poll for work a little before blocking: a busy submitter then never pays a futex wake. */
static void loopback_spin(struct loopback_inst *li)
{
	uint64_t until = 0;

	for (uint32_t i = 0;; i++) {
		/* relaxed: a hint; the decision is re-made under qlock. */
		if (atomic_load_explicit(&li->count, memory_order_relaxed) != 0 ||
		    atomic_load_explicit(&li->stop, memory_order_relaxed))
			return;
		if ((i & 63) == 0) {
			uint64_t now = loopback_now_ns();

			if (until == 0)
				until = now + LOOPBACK_SPIN_NS;
			else if (now >= until)
				return;
		}
		loopback_cpu_relax();
	}
}

static void *loopback_worker(void *arg)
{
	struct loopback_inst *li = arg;
	struct te_plugin_slice *batch[LOOPBACK_BATCH];

	for (;;) {
		uint32_t n;

		loopback_spin(li);
		pthread_mutex_lock(&li->qlock);
		while (!atomic_load_explicit(&li->stop, memory_order_relaxed) &&
		       atomic_load_explicit(&li->count, memory_order_relaxed) == 0) {
			li->sleepers++;
			pthread_cond_wait(&li->qcond, &li->qlock);
			li->sleepers--;
		}
		/* Stop without draining: fini cancels what is still queued. */
		if (atomic_load_explicit(&li->stop, memory_order_relaxed)) {
			pthread_mutex_unlock(&li->qlock);
			break;
		}
		n = loopback_pop_locked(li, batch, LOOPBACK_BATCH);
		/* Hand leftovers to a sleeping sibling instead of waking all at submit. */
		if (li->sleepers && atomic_load_explicit(&li->count, memory_order_relaxed))
			pthread_cond_signal(&li->qcond);
		pthread_mutex_unlock(&li->qlock);
		loopback_run(li, batch, n);
	}
	return NULL;
}

#ifdef LOOPBACK_FAULT_LATE_CANCEL
/* Report canceled slices as successful, late: the core must ignore the stale report. */
static void *loopback_late_worker(void *arg)
{
	struct loopback_inst *li = arg;

	pthread_mutex_lock(&li->late_lock);
	for (;;) {
		struct loopback_late *l = li->late_head;
		struct timespec now;

		if (!l) {
			if (li->late_stop)
				break;
			pthread_cond_wait(&li->late_cond, &li->late_lock);
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec < l->due.tv_sec ||
		    (now.tv_sec == l->due.tv_sec && now.tv_nsec < l->due.tv_nsec)) {
			pthread_cond_timedwait(&li->late_cond, &li->late_lock, &l->due);
			continue;
		}
		li->late_head = l->next;
		if (!li->late_head)
			li->late_tail = NULL;
		pthread_mutex_unlock(&li->late_lock);
		/* No bytes move: a core that trusted this report would fail data checks. */
		li->host->slice_done(li->ctx, l->slice, TE_OK, l->slice->length, NULL);
		free(l);
		pthread_mutex_lock(&li->late_lock);
	}
	pthread_mutex_unlock(&li->late_lock);
	return NULL;
}

static void loopback_late_add(struct loopback_inst *li, struct te_plugin_slice *slice)
{
	struct loopback_late *l = malloc(sizeof(*l));

	if (!l) {
		li->host->slice_done(li->ctx, slice, TE_ERR_CANCELED, 0,
				     LOOPBACK_NAME ": canceled (no memory for the late report)");
		return;
	}
	clock_gettime(CLOCK_MONOTONIC, &l->due);
	l->due.tv_sec += (time_t)(li->late_ms / 1000);
	l->due.tv_nsec += (long)(li->late_ms % 1000) * 1000000L;
	if (l->due.tv_nsec >= 1000000000L) {
		l->due.tv_sec++;
		l->due.tv_nsec -= 1000000000L;
	}
	l->slice = slice;
	l->next = NULL;
	pthread_mutex_lock(&li->late_lock);
	/* Same delay for all, so appending keeps the list ordered by due time. */
	if (li->late_tail)
		li->late_tail->next = l;
	else
		li->late_head = l;
	li->late_tail = l;
	pthread_cond_signal(&li->late_cond);
	pthread_mutex_unlock(&li->late_lock);
}

static enum te_status loopback_late_start(struct loopback_inst *li)
{
	pthread_condattr_t attr;

	pthread_mutex_init(&li->late_lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&li->late_cond, &attr);
	pthread_condattr_destroy(&attr);
	if (pthread_create(&li->late_thread, NULL, loopback_late_worker, li) != 0) {
		loopback_log(li, TE_PLUGIN_LOG_ERROR, "cannot start late thread");
		pthread_cond_destroy(&li->late_cond);
		pthread_mutex_destroy(&li->late_lock);
		return TE_ERR_SYSTEM;
	}
	li->late_started = true;
	return TE_OK;
}

/* Waits until every pending late report went out. */
static void loopback_late_stop(struct loopback_inst *li)
{
	if (!li->late_started)
		return;
	pthread_mutex_lock(&li->late_lock);
	li->late_stop = true;
	pthread_cond_signal(&li->late_cond);
	pthread_mutex_unlock(&li->late_lock);
	pthread_join(li->late_thread, NULL);
	pthread_cond_destroy(&li->late_cond);
	pthread_mutex_destroy(&li->late_lock);
	li->late_started = false;
}
#endif

/* --- install ------------------------------------------------------------------------ */

static void loopback_stop_workers(struct loopback_inst *li)
{
	pthread_mutex_lock(&li->qlock);
	atomic_store_explicit(&li->stop, true, memory_order_relaxed);
	pthread_cond_broadcast(&li->qcond);
	pthread_mutex_unlock(&li->qlock);
	for (uint32_t i = 0; i < li->n_threads; i++)
		pthread_join(li->threads[i], NULL);
	li->n_threads = 0;
}

/* Teardown shared by fini and a failing init; @li may be partly built. */
static void loopback_destroy(struct loopback_inst *li)
{
	struct te_plugin_slice *batch[LOOPBACK_BATCH];
	uint32_t n;

	loopback_stop_workers(li);
	/* Exactly one report per accepted slice: what never ran is canceled. */
	do {
		pthread_mutex_lock(&li->qlock);
		n = loopback_pop_locked(li, batch, LOOPBACK_BATCH);
		pthread_mutex_unlock(&li->qlock);
		for (uint32_t i = 0; i < n; i++)
			li->host->slice_done(li->ctx, batch[i], TE_ERR_CANCELED, 0,
					     LOOPBACK_NAME
					     ": instance shut down before the slice ran");
	} while (n);
#ifdef LOOPBACK_FAULT_LATE_CANCEL
	loopback_late_stop(li);
#endif

	if (li->ep) {
		uint32_t peers = atomic_load_explicit(&li->live_peers, memory_order_relaxed);
		uint32_t rkeys = atomic_load_explicit(&li->live_rkeys, memory_order_relaxed);
		uint32_t mems;

		loopback_registry_remove(li->ep);
		/* The write lock waits for peers' copies in progress; later ones see gone. */
		pthread_rwlock_wrlock(&li->ep->lock);
		li->ep->gone = true;
		mems = li->ep->regions.n;
		for (uint32_t i = 0; i < li->ep->regions.n; i++)
			free(li->ep->regions.v[i].mem);
		li->ep->regions.n = 0;
		pthread_rwlock_unlock(&li->ep->lock);
		/* Handles the core never released: a leak there, not here (regions are freed). */
		if (peers || rkeys)
			loopback_log(li, TE_PLUGIN_LOG_WARN,
				     "fini with %" PRIu32 " peers and %" PRIu32
				     " remote keys still loaded by the core",
				     peers, rkeys);
		if (mems)
			loopback_log(li, TE_PLUGIN_LOG_DEBUG,
				     "fini released %" PRIu32 " still registered regions", mems);
		loopback_endpoint_put(li->ep);
	}
	pthread_cond_destroy(&li->qcond);
	pthread_mutex_destroy(&li->qlock);
	free(li->threads);
	free(li->ring);
	free(li);
}

static enum te_status loopback_start_workers(struct loopback_inst *li)
{
	li->threads = calloc(li->workers, sizeof(*li->threads));
	if (!li->threads)
		return TE_ERR_NOMEM;
	for (uint32_t i = 0; i < li->workers; i++) {
		char name[16];
		int rc = pthread_create(&li->threads[i], NULL, loopback_worker, li);

		if (rc != 0) {
			loopback_log(li, TE_PLUGIN_LOG_ERROR, "cannot start worker %" PRIu32 ": %s",
				     i, strerror(rc));
			return TE_ERR_SYSTEM;
		}
		li->n_threads++;
		snprintf(name, sizeof(name), "te-lo-%" PRIu32, i % LOOPBACK_MAX_WORKERS);
		pthread_setname_np(li->threads[i], name);
	}
	return TE_OK;
}

static enum te_status loopback_init(const struct te_plugin_host *host,
				    struct te_plugin_host_ctx *ctx,
				    struct te_plugin_inst **inst_out)
{
	struct loopback_inst *li;
	uint8_t blob[LOOPBACK_PEER_BLOB_LEN];
	uint32_t cap = 1;
	enum te_status st;

	if (!host || !inst_out || !host->log || !host->slice_done || !host->config_get ||
	    !host->publish)
		return TE_ERR_INVALID_ARG;
#ifdef LOOPBACK_FAULT_INIT_FAIL
	host->log(ctx, TE_PLUGIN_LOG_ERROR, "no device (injected)");
	return TE_ERR_NO_DEVICE;
#endif
#ifdef LOOPBACK_FAULT_NULL_INSTANCE
	*inst_out = NULL;
	return TE_OK;
#endif

	li = calloc(1, sizeof(*li));
	if (!li)
		return TE_ERR_NOMEM;
	li->host = host;
	li->ctx = ctx;
	pthread_mutex_init(&li->qlock, NULL);
	pthread_cond_init(&li->qcond, NULL);

	st = loopback_parse_options(li);
	if (st != TE_OK)
		goto err_destroy;

	while (cap < li->depth)
		cap <<= 1;
	li->ring = calloc(cap, sizeof(*li->ring));
	if (!li->ring) {
		st = TE_ERR_NOMEM;
		goto err_destroy;
	}
	li->mask = cap - 1;

	st = loopback_endpoint_new(&li->ep);
	if (st != TE_OK)
		goto err_destroy;
	loopback_registry_add(li->ep);

	te_plugin_put_u32(blob, LOOPBACK_PEER_MAGIC);
	te_plugin_put_u32(blob + 4, 1);
	te_plugin_put_u64(blob + 8, (uint64_t)getpid());
	te_plugin_put_u64(blob + 16, loopback_nonce);
	te_plugin_put_u64(blob + 24, li->ep->token);
	st = host->publish(ctx, blob, sizeof(blob));
	if (st != TE_OK) {
		loopback_log(li, TE_PLUGIN_LOG_ERROR, "publish failed (%d)", st);
		goto err_destroy;
	}

#ifdef LOOPBACK_FAULT_LATE_CANCEL
	st = loopback_late_start(li);
	if (st != TE_OK)
		goto err_destroy;
#endif
	if (li->progress == TE_PLUGIN_PROGRESS_AUTO && !LOOPBACK_NEVER_RUNS) {
		st = loopback_start_workers(li);
		if (st != TE_OK)
			goto err_destroy;
	}
	loopback_log(li, TE_PLUGIN_LOG_DEBUG,
		     "instance %" PRIu64 " up: progress %s, %" PRIu32
		     " workers, queue depth %" PRIu32,
		     li->ep->token, li->progress == TE_PLUGIN_PROGRESS_AUTO ? "auto" : "manual",
		     li->n_threads, li->depth);
	*inst_out = (struct te_plugin_inst *)li;
	return TE_OK;

err_destroy:
	loopback_destroy(li);
	return st;
}

static void loopback_fini(struct te_plugin_inst *inst)
{
	loopback_destroy(loopback_inst_of(inst));
}

static enum te_status loopback_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct loopback_inst *li = loopback_inst_of(inst);

	if (!caps)
		return TE_ERR_INVALID_ARG;
	caps->mem_types = TE_PLUGIN_MEM_CPU;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = li->progress;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	caps->flags = TE_PLUGIN_CAP_SAME_PROCESS_ONLY;
	caps->max_slice_size = li->max_slice_size;
	caps->default_slice_size = li->slice_size;
	/* Unused by its own ops; tests/core's fake checks that the core zeroes them. */
	caps->slice_priv_size = LOOPBACK_PRIV_SIZE;
	caps->max_devices = 1;
	return TE_OK;
}

static enum te_status loopback_query_devices(struct te_plugin_inst *inst,
					     struct te_plugin_device *devices, uint32_t max,
					     uint32_t *n_out)
{
	if (!n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	if (max == 0) {
		*n_out = 0;
		return TE_OK;
	}
	te_plugin_device_set(devices, "lo0", -1, NULL, 0, TE_PLUGIN_MEM_CPU);
	*n_out = 1;
	return TE_OK;
}

/* --- memory and peers --------------------------------------------------------------- */

static enum te_status loopback_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				       uint32_t mem_type, int32_t dev, uint32_t access,
				       struct te_plugin_mem **mem_out)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	struct loopback_endpoint *ep;
	uint64_t start = (uint64_t)(uintptr_t)addr;
	struct loopback_mem *m;
	enum te_status st;

	(void)dev; /* CPU memory only: no device to pin */
	if (!addr || length == 0 || !mem_out || (access & ~LOOPBACK_ACCESS_ALL))
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CPU)
		return TE_ERR_MEMORY_TYPE;
	if (start > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	m = malloc(sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = start;
	m->length = length;
	m->access = access;

	ep = li->ep;
	pthread_rwlock_wrlock(&ep->lock);
	st = te_plugin_regions_add(&ep->regions, start, length, access, m);
	pthread_rwlock_unlock(&ep->lock);
	if (st != TE_OK) {
		free(m);
		if (st == TE_ERR_ADDRESS_OVERLAPPED)
			loopback_log(li, TE_PLUGIN_LOG_WARN,
				     "[%p,+%" PRIu64 ") overlaps a registered region", addr,
				     length);
		return st;
	}
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;
}

static enum te_status loopback_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	struct loopback_mem *m = (struct loopback_mem *)mem;
	struct loopback_endpoint *ep;
	enum te_status st;

	if (!m)
		return TE_ERR_INVALID_ARG;
	ep = li->ep;
	/* The write lock also waits out peers' copies into this region. */
	pthread_rwlock_wrlock(&ep->lock);
	/* Found by identity, never dereferenced first: a stale handle is an error, not a crash. */
	st = te_plugin_regions_remove(&ep->regions, m);
	pthread_rwlock_unlock(&ep->lock);
	if (st != TE_OK) {
		loopback_log(li, TE_PLUGIN_LOG_WARN, "dereg_mem of an unknown handle");
		return st;
	}
	free(m);
	return TE_OK;
}

static enum te_status loopback_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
					void *buf, size_t cap, size_t *len_out)
{
	const struct loopback_mem *m = (const struct loopback_mem *)mem;
	uint8_t *p = buf;

	if (!m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	if (cap < LOOPBACK_KEY_BLOB_LEN)
		return TE_ERR_TOO_LARGE;
	te_plugin_put_u32(p, LOOPBACK_KEY_MAGIC);
	te_plugin_put_u32(p + 4, m->access);
	te_plugin_put_u64(p + 8, m->addr);
	te_plugin_put_u64(p + 16, m->length);
	*len_out = LOOPBACK_KEY_BLOB_LEN;
	return TE_OK;
}

static enum te_status loopback_load_peer(struct te_plugin_inst *inst, const char *peer_name,
					 const void *blob, size_t len,
					 struct te_plugin_peer **peer_out)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	const uint8_t *p = blob;
	struct loopback_endpoint *ep;
	struct loopback_peer *peer;
	uint64_t pid, nonce, token;

	if (!peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != LOOPBACK_PEER_BLOB_LEN || te_plugin_get_u32(p) != LOOPBACK_PEER_MAGIC ||
	    te_plugin_get_u32(p + 4) != 1) {
		loopback_log(li, TE_PLUGIN_LOG_WARN,
			     "peer %s: malformed transport blob (%zu bytes)", peer_name, len);
		return TE_ERR_METADATA_MALFORMED;
	}
	pid = te_plugin_get_u64(p + 8);
	nonce = te_plugin_get_u64(p + 16);
	token = te_plugin_get_u64(p + 24);
	if (pid != (uint64_t)getpid()) {
		loopback_log(li, TE_PLUGIN_LOG_WARN,
			     "peer pid %" PRIu64 " is another process (peer %s)", pid, peer_name);
		return TE_ERR_PEER_UNREACHABLE;
	}
	ep = loopback_registry_get(nonce, token);
	if (!ep) {
		loopback_log(li, TE_PLUGIN_LOG_WARN,
			     "peer %s: instance %" PRIu64 " of this process is gone", peer_name,
			     token);
		return TE_ERR_PEER_UNREACHABLE;
	}
	peer = malloc(sizeof(*peer));
	if (peer)
		peer->name = strdup(peer_name);
	if (!peer || !peer->name) {
		free(peer);
		loopback_endpoint_put(ep);
		return TE_ERR_NOMEM;
	}
	peer->ep = ep;
	atomic_fetch_add_explicit(&li->live_peers, 1, memory_order_relaxed); /* a statistic */
	*peer_out = (struct te_plugin_peer *)peer;
	return TE_OK;
}

static void loopback_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
	struct loopback_peer *p = loopback_peer_of(peer);

	if (!p)
		return;
	atomic_fetch_sub_explicit(&loopback_inst_of(inst)->live_peers, 1, memory_order_relaxed);
	loopback_endpoint_put(p->ep);
	free(p->name);
	free(p);
}

static enum te_status loopback_unpack_remote_key(struct te_plugin_inst *inst,
						 struct te_plugin_peer *peer, const void *blob,
						 size_t len, uint64_t addr, uint64_t length,
						 struct te_plugin_rkey **rkey_out)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	const uint8_t *p = blob;
	struct loopback_rkey *k;
	uint64_t kaddr, klen;
	uint32_t access;

	if (!peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != LOOPBACK_KEY_BLOB_LEN || te_plugin_get_u32(p) != LOOPBACK_KEY_MAGIC)
		goto err_malformed;
	access = te_plugin_get_u32(p + 4);
	kaddr = te_plugin_get_u64(p + 8);
	klen = te_plugin_get_u64(p + 16);
	/* The key must describe exactly the buffer the descriptor lists it under. */
	if ((access & ~LOOPBACK_ACCESS_ALL) || klen == 0 || kaddr > UINT64_MAX - klen ||
	    kaddr != addr || klen != length)
		goto err_malformed;
	k = malloc(sizeof(*k));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = kaddr;
	k->length = klen;
	k->access = access;
	atomic_fetch_add_explicit(&li->live_rkeys, 1, memory_order_relaxed); /* a statistic */
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;

err_malformed:
	loopback_log(li, TE_PLUGIN_LOG_WARN,
		     "peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64 ",+%" PRIu64 ")",
		     loopback_peer_of(peer)->name, len, addr, length);
	return TE_ERR_METADATA_MALFORMED;
}

static void loopback_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	if (!rkey)
		return;
	atomic_fetch_sub_explicit(&loopback_inst_of(inst)->live_rkeys, 1, memory_order_relaxed);
	free(rkey);
}

/* --- submit ------------------------------------------------------------------------- */

static LOOPBACK_UNUSED enum te_status loopback_submit(struct te_plugin_inst *inst,
						      struct te_plugin_slice **slices, uint32_t n,
						      uint32_t *accepted_out)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	uint32_t count, tail, k;

	if (!accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	pthread_mutex_lock(&li->qlock);
	if (atomic_load_explicit(&li->stop, memory_order_relaxed)) {
		pthread_mutex_unlock(&li->qlock);
		return TE_ERR_SHUTDOWN;
	}
	count = atomic_load_explicit(&li->count, memory_order_relaxed);
	k = li->depth - count < n ? li->depth - count : n;
	tail = li->head + count;
	for (uint32_t i = 0; i < k; i++)
		li->ring[(tail + i) & li->mask] = slices[i];
	atomic_store_explicit(&li->count, count + k, memory_order_relaxed);
	/* Busy or spinning workers will find the slices; only a sleeper needs a wake. */
	if (k && li->sleepers)
		pthread_cond_signal(&li->qcond);
	pthread_mutex_unlock(&li->qlock);
	*accepted_out = k;
	return TE_OK;
}

static uint32_t loopback_progress(struct te_plugin_inst *inst, uint32_t budget)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	uint32_t done = 0;

	/* never_complete and late_cancel: slices wait for cancel or fini. */
	if (li->progress != TE_PLUGIN_PROGRESS_MANUAL || LOOPBACK_NEVER_RUNS)
		return 0;
	while (done < budget) {
		struct te_plugin_slice *batch[LOOPBACK_BATCH];
		uint32_t want = budget - done < LOOPBACK_BATCH ? budget - done : LOOPBACK_BATCH;
		uint32_t n;

		/* relaxed: an empty-queue fast path; the real check is under qlock. */
		if (atomic_load_explicit(&li->count, memory_order_relaxed) == 0)
			break;
		pthread_mutex_lock(&li->qlock);
		n = loopback_pop_locked(li, batch, want);
		pthread_mutex_unlock(&li->qlock);
		if (n == 0)
			break;
		loopback_run(li, batch, n);
		done += n;
	}
	return done;
}

static enum te_status loopback_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *slice)
{
	struct loopback_inst *li = loopback_inst_of(inst);
	bool queued;

	if (!slice)
		return TE_ERR_INVALID_ARG;
	pthread_mutex_lock(&li->qlock);
	queued = loopback_unqueue_locked(li, slice);
	pthread_mutex_unlock(&li->qlock);
	/* Not queued: it is executing (it will report) or already reported. */
	if (!queued)
		return TE_OK;
#ifdef LOOPBACK_FAULT_LATE_CANCEL
	loopback_late_add(li, slice);
#else
	li->host->slice_done(li->ctx, slice, TE_ERR_CANCELED, 0,
			     LOOPBACK_NAME ": canceled while queued");
#endif
	return TE_OK;
}

static enum te_status loopback_retry_prepare(struct te_plugin_inst *inst,
					     struct te_plugin_slice *slice)
{
	if (!slice)
		return TE_ERR_INVALID_ARG;
	/* One device, one path: a retry goes the same way. */
	slice->device = 0;
	return TE_OK;
}

static const struct te_plugin_ops loopback_ops = {
	.size = LOOPBACK_OPS_SIZE,
	.init = loopback_init,
	.fini = loopback_fini,
	.query_caps = loopback_query_caps,
	.query_devices = loopback_query_devices,
	.reg_mem = loopback_reg_mem,
	.dereg_mem = loopback_dereg_mem,
	.pack_key = loopback_pack_key,
	.load_peer = loopback_load_peer,
	.unload_peer = loopback_unload_peer,
	.unpack_remote_key = loopback_unpack_remote_key,
	.release_remote_key = loopback_release_remote_key,
#ifndef LOOPBACK_OMIT_SUBMIT
	.submit = loopback_submit,
#endif
	.progress = loopback_progress,
	.cancel = loopback_cancel,
	.retry_prepare = loopback_retry_prepare,
};

static const struct te_plugin_desc loopback_desc = {
	.size = LOOPBACK_DESC_SIZE,
	.abi_major = LOOPBACK_DESC_ABI_MAJOR,
	.abi_minor = LOOPBACK_DESC_ABI_MINOR,
	.name = LOOPBACK_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "in-process test transport (" LOOPBACK_NAME ")",
	.ops = &loopback_ops,
#if defined(LOOPBACK_DECLARED) || defined(LOOPBACK_BAD_DECL)
	TE_PLUGIN_OPTIONS(loopback_options),
#endif
};

#ifdef LOOPBACK_ENTRY_SYMBOL
/* An entry point of another ABI major: the loader must not even find it. */
TE_PLUGIN_EXPORT const struct te_plugin_desc *LOOPBACK_ENTRY_SYMBOL(void);
TE_PLUGIN_EXPORT const struct te_plugin_desc *LOOPBACK_ENTRY_SYMBOL(void)
{
	return &loopback_desc;
}
#else
TE_PLUGIN_DEFINE(&loopback_desc)
#endif
