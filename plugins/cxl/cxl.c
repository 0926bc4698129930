/* SPDX-License-Identifier: Apache-2.0 */
/* cxl.c: the cxl transport: READ and WRITE as CPU copies through a shared CXL memory window. */

/*
 * Shape of the plugin (README.md has the user-visible semantics and the ordering guarantees):
 *
 * The window. `device` (a DAX device, or any file every host maps) is mapped MAP_SHARED once:
 * bytes [offset, offset + size) of it. Its identity (the window_id option, or the file's
 * device and inode with offset and size) is published in the transport blob; a peer that
 * publishes another identity is on another window, and load_peer says so.
 *
 * Memory. reg_mem finds where a region lies in the window: inside this plugin's own mapping,
 * or inside any shared mapping of the same file in this process (/proc/self/maps), so an
 * application maps the window itself and registers a pointer into it (location cxl:0). The
 * key publishes {window, offset, length, access}. Other CPU memory registers as local-only:
 * it can be the local side of a transfer, but peers cannot reach it through this transport.
 *
 * Data path. A slice's remote address is the peer's virtual address: (remote - key base) +
 * key offset is the window offset, and the copy goes to or from this plugin's own mapping at
 * that offset. submit() checks each slice against its local region, its remote key and the
 * window, resolves both pointers and queues it; it never copies. `threads` workers take
 * chunks (chunk_size bytes, ends aligned to destination lines) of the slice at the head of
 * one FIFO, so a large slice is copied by every worker at once and a small one by a single
 * worker in one go; whoever finishes a slice's last chunk reports it. Per-slice state lives
 * in slice->priv, so nothing is allocated per slice, and host->slice_done is never called
 * with a plugin lock held (it may re-enter unload_peer or release_remote_key).
 *
 * Serving side. There is none: a peer copies into and out of the window with its own CPUs.
 * The target's registered ranges are enforced by every initiator at submit (the key says
 * which window range a buffer is); nothing stops a host that maps the window from writing
 * anywhere in it, which is the nature of shared memory (README.md, "Trust").
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <te/te_plugin.h>
#include <te/te_plugin_opts.h>
#include <te/te_plugin_util.h>

#include "cxl_copy.h"

/* The project version, passed by the build (plugins/meson.build); 0.0.0 outside meson. */
#ifndef TE_PLUGIN_VERSION
#define TE_PLUGIN_VERSION "0.0.0"
#endif

#define CXL_NAME "cxl"

/* --- limits and published formats ------------------------------------------------------ */

#define CXL_MAX_THREADS 64u
#define CXL_DEF_THREADS 2u
#define CXL_DEF_CHUNK (256ull << 10) /* chosen by measurement: see README.md */
#define CXL_MIN_CHUNK (4ull << 10)
#define CXL_MAX_CHUNK (1ull << 30)
#define CXL_DEF_SLICE (16ull << 20)
#define CXL_DEF_READ_STREAM (1ull << 20) /* chosen by measurement: see README.md */
#define CXL_MIN_SLICE (4ull << 10)
#define CXL_MAX_OFFSET (1ull << 62)
#define CXL_ID_MAX 96u	 /* window id text, NUL included */
#define CXL_PATH_MAX 96u /* device path as published (diagnostics only), NUL included */
#define CXL_OFF_NONE UINT64_MAX

#define CXL_BLOB_MAGIC 0x31425843u /* bytes "CXB1": the published window */
#define CXL_BLOB_VERSION 1u
#define CXL_BLOB_COHERENT (1u << 0)
#define CXL_BLOB_LEN (24u + CXL_ID_MAX + CXL_PATH_MAX)
#define CXL_KEY_MAGIC 0x314b5843u /* bytes "CXK1": one registered range */
#define CXL_KEY_LEN 32u

#define CXL_ACCESS_ALL (TE_PLUGIN_ACCESS_REMOTE_READ | TE_PLUGIN_ACCESS_REMOTE_WRITE)
#define CXL_MIN(a, b) ((a) < (b) ? (a) : (b))

/* --- objects ------------------------------------------------------------------------------ */

struct cxl_mem {
	uint64_t addr;
	uint64_t length;
	uint64_t off; /* window offset of addr; CXL_OFF_NONE: not window memory */
	uint32_t access;
	struct cxl_mem *prev, *next; /* instance list, so fini can free what the core kept */
};

struct cxl_rkey {
	uint64_t addr; /* the peer's virtual address of the buffer */
	uint64_t length;
	uint64_t off; /* its window offset */
	uint32_t access;
	struct cxl_rkey *prev, *next;
};

struct cxl_peer {
	char *name;
	struct cxl_peer *prev, *next;
};

/* One range of the window handed out by mem_alloc. */
struct cxl_alloc {
	uint64_t off; /* window offset */
	uint64_t len; /* rounded up to pages */
	struct cxl_alloc *next;
};

/* Where a slice is; changed under the queue lock (read by cancel under it). */
enum cxl_state {
	CXL_S_IDLE = 0,
	CXL_S_QUEUED = 1,  /* in the FIFO: chunks left to claim */
	CXL_S_RUNNING = 2, /* every chunk claimed, some still copying */
	CXL_S_DONE = 3,	   /* reported (set just before host->slice_done) */
};

/* Per-slice plugin state, in slice->priv. */
#define CXL_PRIV_DETAIL 168
struct cxl_spriv {
	struct te_plugin_slice *prev, *next; /* FIFO links, under the queue lock */
	const struct cxl_inst *owner;	     /* tells cancel the priv bytes are ours */
	uint8_t *dst;
	const uint8_t *src;
	uint64_t chunk;
	uint32_t n_chunks;   /* 0: a failure found at submit, reported by a worker */
	uint32_t next_chunk; /* under the queue lock */
	uint32_t flags;	     /* CXL_COPY_* */
	_Atomic uint32_t state;
	_Atomic uint32_t left;	/* chunks not finished (claimed or not) */
	_Atomic int32_t status; /* TE_OK, or the first reason to fail */
	char detail[CXL_PRIV_DETAIL];
};
_Static_assert(sizeof(struct cxl_spriv) <= TE_PLUGIN_SLICE_PRIV_MAX, "slice_priv_size limit");

struct cxl_inst {
	const struct te_plugin_host *host;
	struct te_plugin_host_ctx *ctx;

	/* options */
	char path[CXL_PATH_MAX];
	uint64_t offset; /* of the window in the device */
	uint64_t size;
	bool coherent;
	uint32_t n_threads;
	uint64_t chunk;
	uint64_t slice_size;
	uint64_t read_stream_min; /* READs this long stream into local memory */
	char id[CXL_ID_MAX];
	uint64_t id_hash;
	bool alloc_set; /* alloc_offset and alloc_size given: mem_alloc hands out window memory */
	uint64_t alloc_off;
	uint64_t alloc_size;

	/* window */
	uint8_t *base;
	dev_t st_dev;
	ino_t st_ino;
	char dev_name[64];
	int32_t numa;
	struct cxl_copier copier;

	pthread_mutex_t lock; /* the lists below */
	struct cxl_mem *mems;
	struct cxl_rkey *rkeys;
	struct cxl_peer *peers;

	/* mem_alloc's allocations in [alloc_off, +alloc_size), sorted by offset */
	pthread_mutex_t alock;
	struct cxl_alloc *allocs;
	uint64_t alloc_used;
	uint32_t n_allocs;

	/* work queue */
	pthread_mutex_t qlock;
	pthread_cond_t qcond;
	struct te_plugin_slice *q_head, *q_tail;
	uint32_t n_idle;
	bool stopping;	    /* under qlock */
	atomic_bool closed; /* relaxed: submit's early refusal after fini began */
	pthread_t *threads;
	uint32_t n_started;
};

/* --- small helpers ----------------------------------------------------------------------- */

/* The host prefixes every line with the plugin name. */
#define cxl_log(ti, level, ...) (ti)->host->log((ti)->ctx, (level), __VA_ARGS__)

static inline struct cxl_inst *cxl_inst_of(struct te_plugin_inst *inst)
{
	return (struct cxl_inst *)inst;
}

static inline struct cxl_spriv *cxl_priv(const struct te_plugin_slice *s)
{
	return (struct cxl_spriv *)s->priv;
}

/* 64-bit FNV-1a: the window id as a number, carried in every key. */
static uint64_t cxl_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++) {
		h ^= (uint8_t)*s;
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Text of up to @cap - 1 bytes of @src, non-printable bytes shown as '?'. */
static void cxl_text(char *dst, size_t cap, const uint8_t *src, size_t len)
{
	size_t n = 0;

	for (; n < len && n < cap - 1 && src[n]; n++)
		dst[n] = src[n] >= 0x20 && src[n] < 0x7f ? (char)src[n] : '?';
	dst[n] = '\0';
}

/*
 * Say why the running op fails: host->set_error (quoted to the user, "cxl: " prefixed) and a
 * debug line. Returns @st.
 */
static enum te_status cxl_fail(struct cxl_inst *ti, enum te_status st, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
static enum te_status cxl_fail(struct cxl_inst *ti, enum te_status st, const char *fmt, ...)
{
	char msg[240];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (ti->host->set_error)
		ti->host->set_error(ti->ctx, CXL_NAME ": %s", msg);
	cxl_log(ti, TE_PLUGIN_LOG_DEBUG, "%s", msg);
	return st;
}

/* --- options ------------------------------------------------------------------------------ */

static const char *const cxl_copy_choices[] = { "auto", "avx2", "sse2", "plain", NULL };

/*
 * Declared options (te_plugin.h, ABI 1.2): the core checks types, ranges, choices and the
 * required device before init and hands every one in normal form with its default.
 */
static const struct te_plugin_option cxl_options[] = {
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, "device", NULL, 0, 0, NULL, TE_PLUGIN_OPT_REQUIRED,
			 "the DAX device (/dev/daxX.Y) or file that maps the shared window"),
	TE_PLUGIN_OPTION_SIZE("offset", "0", 0, CXL_MAX_OFFSET,
			      "start of the window in the device (a multiple of the page size)"),
	TE_PLUGIN_OPTION_SIZE("size", NULL, 1, CXL_MAX_OFFSET,
			      "window bytes (default: the rest of the device after offset)"),
	TE_PLUGIN_OPTION_BOOL("coherent", "false",
			      "the window is cache-coherent between hosts: no explicit flushes"),
	TE_PLUGIN_OPTION_INT("threads", "2", 1, CXL_MAX_THREADS, "copy threads"),
	TE_PLUGIN_OPTION_SIZE("chunk_size", "256K", CXL_MIN_CHUNK, CXL_MAX_CHUNK,
			      "bytes a copy thread takes at a time"),
	TE_PLUGIN_OPTION_SIZE("slice_size", "16M", CXL_MIN_SLICE, CXL_MAX_OFFSET,
			      "slice size advertised to the core"),
	TE_PLUGIN_OPTION_STRING("window_id", NULL,
				"identity of the window shared by all its hosts (default: from "
				"the device)"),
	TE_PLUGIN_OPTION_CHOICE("copy", "auto", cxl_copy_choices,
				"copy routine; auto: the best this CPU has"),
	TE_PLUGIN_OPTION_SIZE("read_stream_min", "1M", 0, 0,
			      "READs from this size on use streaming loads"),
	TE_PLUGIN_OPTION_SIZE("alloc_offset", NULL, 0, CXL_MAX_OFFSET,
			      "start of the part of the window this engine allocates from"),
	TE_PLUGIN_OPTION_SIZE("alloc_size", NULL, 1, CXL_MAX_OFFSET,
			      "bytes of the window this engine allocates from (with alloc_offset)"),
};

/* First line of a small sysfs file of the character device @rdev, or false. */
static bool cxl_sysfs_read(dev_t rdev, const char *attr, char *buf, size_t cap)
{
	char path[96];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/%s", major(rdev), minor(rdev), attr);
	f = fopen(path, "re");
	if (!f)
		return false;
	ok = fgets(buf, (int)cap, f) != NULL;
	fclose(f);
	return ok;
}

static enum te_status cxl_parse_options(struct cxl_inst *ti)
{
	const struct te_plugin_host *h = ti->host;
	const char *dev = h->config_get(ti->ctx, "device");
	const char *wid = h->config_get(ti->ctx, "window_id");
	uint32_t features = cxl_copy_detect();
	enum cxl_copy_impl impl;

	/* The core refuses a YAML without device; an empty one (or te-info's probe) ends here. */
	if (!dev || !*dev)
		return cxl_fail(ti, TE_ERR_CONFIG,
				"option 'device' is required: the DAX device (/dev/daxX.Y) or file "
				"that maps the shared window");
	if (strlen(dev) >= sizeof(ti->path))
		return cxl_fail(ti, TE_ERR_CONFIG, "option 'device': path longer than %u bytes",
				CXL_PATH_MAX - 1);
	snprintf(ti->path, sizeof(ti->path), "%s", dev);
	ti->offset = te_plugin_opt_size(h, ti->ctx, "offset", 0);
	ti->size = te_plugin_opt_size(h, ti->ctx, "size", 0); /* 0: the rest of the device */
	ti->coherent = te_plugin_opt_bool(h, ti->ctx, "coherent", false);
	ti->n_threads = (uint32_t)te_plugin_opt_int(h, ti->ctx, "threads", CXL_DEF_THREADS);
	ti->chunk = te_plugin_opt_size(h, ti->ctx, "chunk_size", CXL_DEF_CHUNK);
	ti->slice_size = te_plugin_opt_size(h, ti->ctx, "slice_size", CXL_DEF_SLICE);
	ti->read_stream_min =
		te_plugin_opt_size(h, ti->ctx, "read_stream_min", CXL_DEF_READ_STREAM);
	ti->alloc_off = te_plugin_opt_size(h, ti->ctx, "alloc_offset", 0);
	ti->alloc_size = te_plugin_opt_size(h, ti->ctx, "alloc_size", 0);
	/* Checked against the window once it is mapped (cxl_alloc_check). */
	ti->alloc_set = h->config_get(ti->ctx, "alloc_size") != NULL;
	if (ti->alloc_set != (h->config_get(ti->ctx, "alloc_offset") != NULL))
		return cxl_fail(ti, TE_ERR_CONFIG,
				"option '%s': given without '%s': the two name the part of the "
				"window this engine allocates from, disjoint from every other "
				"engine's",
				ti->alloc_set ? "alloc_size" : "alloc_offset",
				ti->alloc_set ? "alloc_offset" : "alloc_size");
	if (wid) {
		size_t n = strlen(wid);

		if (n == 0 || n >= CXL_ID_MAX)
			return cxl_fail(ti, TE_ERR_CONFIG,
					"option 'window_id': 1 to %u characters, got %zu",
					CXL_ID_MAX - 1, n);
		for (size_t i = 0; i < n; i++)
			if (wid[i] <= 0x20 || wid[i] >= 0x7f)
				return cxl_fail(ti, TE_ERR_CONFIG,
						"option 'window_id': '%s' has a space or a "
						"non-printable character",
						wid);
		snprintf(ti->id, sizeof(ti->id), "%s", wid);
	}
	switch (te_plugin_opt_choice(h, ti->ctx, "copy", cxl_copy_choices, 0)) {
	case 1:
		impl = CXL_IMPL_AVX2;
		break;
	case 2:
		impl = CXL_IMPL_SSE2;
		break;
	case 3:
		impl = CXL_IMPL_PLAIN;
		break;
	default:
		impl = cxl_copy_best(features);
		break;
	}
	if (cxl_copier_init(&ti->copier, impl, features) != 0)
		return cxl_fail(ti, TE_ERR_CONFIG, "option 'copy': this CPU cannot do '%s'",
				cxl_copy_impl_name(impl));
	return TE_OK;
}

/* --- the window -------------------------------------------------------------------------- */

/* Open and map the window; fills base, size, identity, device name and NUMA node. */
static enum te_status cxl_window_open(struct cxl_inst *ti)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t dev_size = 0;
	const char *kind, *slash;
	char buf[64];
	struct stat sb;
	void *map;
	int fd, err;

	fd = open(ti->path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		err = errno;
		return cxl_fail(ti,
				err == ENOENT || err == ENODEV || err == ENXIO ? TE_ERR_NO_DEVICE
									       : TE_ERR_SYSTEM,
				"cannot open window device '%s': %s", ti->path, strerror(err));
	}
	if (fstat(fd, &sb) != 0) {
		err = errno;
		close(fd);
		return cxl_fail(ti, TE_ERR_SYSTEM, "cannot stat '%s': %s", ti->path, strerror(err));
	}
	ti->numa = -1;
	if (S_ISREG(sb.st_mode)) {
		kind = "file";
		dev_size = (uint64_t)sb.st_size;
	} else if (S_ISCHR(sb.st_mode)) {
		kind = "DAX device";
		if (cxl_sysfs_read(sb.st_rdev, "size", buf, sizeof(buf)))
			dev_size = strtoull(buf, NULL, 10);
		if (cxl_sysfs_read(sb.st_rdev, "target_node", buf, sizeof(buf)))
			ti->numa = (int32_t)strtol(buf, NULL, 10);
	} else {
		close(fd);
		return cxl_fail(ti, TE_ERR_CONFIG,
				"'%s' is neither a regular file nor a DAX character device",
				ti->path);
	}
	if (page > 0 && ti->offset % (uint64_t)page) {
		close(fd);
		return cxl_fail(ti, TE_ERR_CONFIG,
				"option 'offset': %" PRIu64
				" is not a multiple of the page size (%ld)",
				ti->offset, page);
	}
	if (ti->size == 0) {
		if (dev_size == 0 || ti->offset >= dev_size) {
			close(fd);
			if (dev_size == 0 && !S_ISREG(sb.st_mode))
				return cxl_fail(ti, TE_ERR_CONFIG,
						"the size of %s '%s' is unknown: set option 'size'",
						kind, ti->path);
			return cxl_fail(ti, TE_ERR_NO_DEVICE,
					"window %s '%s' is %" PRIu64
					" bytes: nothing to map at offset %" PRIu64,
					kind, ti->path, dev_size, ti->offset);
		}
		ti->size = dev_size - ti->offset;
	} else if ((dev_size || S_ISREG(sb.st_mode)) &&
		   (ti->offset > dev_size || ti->size > dev_size - ti->offset)) {
		close(fd);
		return cxl_fail(ti, TE_ERR_NO_DEVICE,
				"window %s '%s' is %" PRIu64 " bytes, too small for offset %" PRIu64
				" + size %" PRIu64,
				kind, ti->path, dev_size, ti->offset, ti->size);
	}
	if (ti->size > SIZE_MAX) {
		close(fd);
		return cxl_fail(ti, TE_ERR_CONFIG,
				"window of %" PRIu64 " bytes does not fit the address space",
				ti->size);
	}
	map = mmap(NULL, (size_t)ti->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		   (off_t)ti->offset);
	err = errno;
	close(fd);
	if (map == MAP_FAILED)
		return cxl_fail(ti, TE_ERR_SYSTEM,
				"cannot map %" PRIu64 " bytes of %s '%s' at offset %" PRIu64
				": %s%s",
				ti->size, kind, ti->path, ti->offset, strerror(err),
				err == EINVAL ? " (a DAX device needs offset and size aligned to "
						"its alignment, often 2 MiB)"
					      : "");
	ti->base = map;
	ti->st_dev = sb.st_dev;
	ti->st_ino = sb.st_ino;
	if (!ti->id[0]) {
		snprintf(ti->id, sizeof(ti->id), "%x:%x:%" PRIx64 "@%" PRIx64 "+%" PRIx64,
			 major(sb.st_dev), minor(sb.st_dev), (uint64_t)sb.st_ino, ti->offset,
			 ti->size);
		if (S_ISCHR(sb.st_mode))
			cxl_log(ti, TE_PLUGIN_LOG_INFO,
				"window id %s comes from this host's device numbers: set "
				"'window_id' on every host to share '%s' between hosts",
				ti->id, ti->path);
	}
	ti->id_hash = cxl_hash(ti->id);
	slash = strrchr(ti->path, '/');
	snprintf(ti->dev_name, sizeof(ti->dev_name), "%s",
		 slash && slash[1] ? slash + 1 : ti->path);
	cxl_log(ti, TE_PLUGIN_LOG_INFO,
		"window %s '%s': %" PRIu64 " bytes at offset %" PRIu64
		", id %s, coherent: %s; copies: %s%s%s, %u thread(s), chunks of %" PRIu64 " bytes",
		kind, ti->path, ti->size, ti->offset, ti->id, ti->coherent ? "true" : "false",
		cxl_copy_impl_name(ti->copier.impl),
		ti->copier.features & CXL_CPU_CLFLUSHOPT ? " + clflushopt"
		: ti->copier.features & CXL_CPU_CLFLUSH	 ? " + clflush"
							 : "",
		cxl_copy_detect() & CXL_CPU_CLWB ? " (clwb present, unused)" : "", ti->n_threads,
		ti->chunk);
	if (!ti->copier.flush && !ti->coherent)
		cxl_log(ti, TE_PLUGIN_LOG_WARN,
			"no cache-line flush instructions in use ('copy: %s' on this CPU): copies "
			"are plain memcpy with full fences, correct only if the hardware keeps the "
			"window coherent; set 'coherent: true' to say it does",
			cxl_copy_impl_name(ti->copier.impl));
	return TE_OK;
}

/*
 * Window offset of [@addr, +@len): inside this plugin's mapping, or inside shared mappings of
 * the window's file in this process (contiguous in the file). false with @why otherwise.
 */
static bool cxl_locate(struct cxl_inst *ti, uint64_t addr, uint64_t len, uint64_t *off_out,
		       char *why, size_t why_len)
{
	uint64_t base = (uint64_t)(uintptr_t)ti->base, cur = addr, end = addr + len;
	uint64_t first_fo = 0;
	bool found = false, bad = false;
	char *line = NULL;
	size_t cap = 0;
	FILE *f;

	if (addr >= base && len <= ti->size && addr - base <= ti->size - len) {
		*off_out = addr - base;
		return true;
	}
	f = fopen("/proc/self/maps", "re");
	if (!f) {
		snprintf(why, why_len, "cannot read /proc/self/maps: %s", strerror(errno));
		return false;
	}
	snprintf(why, why_len, "no mapping of the window file covers it");
	while (!bad && cur < end && getline(&line, &cap, f) > 0) {
		uint64_t vs, ve, pgoff, ino;
		unsigned dmaj, dmin;
		char perms[8];

		if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64, &vs, &ve,
			   perms, &pgoff, &dmaj, &dmin, &ino) != 7)
			continue;
		if (ve <= cur)
			continue;
		if (vs > cur) {
			if (found)
				snprintf(why, why_len, "a hole at 0x%" PRIx64 " splits it", cur);
			bad = true;
			break;
		}
		if (dmaj != major(ti->st_dev) || dmin != minor(ti->st_dev) ||
		    ino != (uint64_t)ti->st_ino) {
			if (found)
				snprintf(why, why_len, "it runs into another mapping at 0x%" PRIx64,
					 vs);
			bad = true;
			break;
		}
		if (perms[3] != 's' || perms[1] != 'w') {
			snprintf(why, why_len, "the mapping at 0x%" PRIx64 " is %s", vs,
				 perms[3] != 's' ? "private (copy-on-write), not shared"
						 : "not writable");
			bad = true;
			break;
		}
		if (!found) {
			first_fo = pgoff + (cur - vs);
			found = true;
		} else if (pgoff + (cur - vs) != first_fo + (cur - addr)) {
			snprintf(why, why_len, "its mappings are not contiguous in the file");
			bad = true;
			break;
		}
		cur = ve;
	}
	free(line);
	fclose(f);
	if (bad || !found || cur < end)
		return false;
	if (first_fo < ti->offset || first_fo - ti->offset > ti->size ||
	    len > ti->size - (first_fo - ti->offset)) {
		snprintf(why, why_len,
			 "it maps file bytes [%" PRIu64 ", +%" PRIu64
			 "), outside the window [%" PRIu64 ", +%" PRIu64 ")",
			 first_fo, len, ti->offset, ti->size);
		return false;
	}
	*off_out = first_fo - ti->offset;
	return true;
}

/* --- workers ----------------------------------------------------------------------------- */

/* Start of chunk @i of @p (which copies @len bytes): chunk ends fall on destination lines. */
static uint64_t cxl_chunk_edge(const struct cxl_spriv *p, uint64_t len, uint32_t i)
{
	uint64_t e;

	if (i == 0)
		return 0;
	if (i >= p->n_chunks)
		return len;
	e = (uint64_t)i * p->chunk;
	return e - ((uintptr_t)(p->dst + e) & 63);
}

/* Report @s: its status decides. The caller holds no plugin lock. */
static void cxl_finish(struct cxl_inst *ti, struct te_plugin_slice *s)
{
	struct cxl_spriv *p = cxl_priv(s);
	enum te_status st = atomic_load_explicit(&p->status, memory_order_acquire);

	atomic_store_explicit(&p->state, CXL_S_DONE, memory_order_release);
	ti->host->slice_done(ti->ctx, s, st, st == TE_OK ? s->length : 0,
			     st == TE_OK ? NULL : p->detail);
}

/* Set the first failure of @p (later ones are dropped). */
static void cxl_set_status(struct cxl_spriv *p, enum te_status st, const char *fmt, ...)
	TE_PLUGIN_PRINTF(3, 4);
static void cxl_set_status(struct cxl_spriv *p, enum te_status st, const char *fmt, ...)
{
	int32_t expect = TE_OK;
	va_list ap;

	if (!atomic_compare_exchange_strong_explicit(&p->status, &expect, (int32_t)st,
						     memory_order_acq_rel, memory_order_acquire))
		return;
	va_start(ap, fmt);
	vsnprintf(p->detail, sizeof(p->detail), fmt, ap);
	va_end(ap);
}

static void cxl_unlink_locked(struct cxl_inst *ti, struct te_plugin_slice *s)
{
	struct cxl_spriv *p = cxl_priv(s);

	if (p->prev)
		cxl_priv(p->prev)->next = p->next;
	else
		ti->q_head = p->next;
	if (p->next)
		cxl_priv(p->next)->prev = p->prev;
	else
		ti->q_tail = p->prev;
	p->prev = p->next = NULL;
}

static void *cxl_worker_main(void *arg)
{
	struct cxl_inst *ti = arg;

	pthread_mutex_lock(&ti->qlock);
	for (;;) {
		struct te_plugin_slice *s;
		struct cxl_spriv *p;
		uint64_t from, to;
		uint32_t i;

		while (!ti->q_head && !ti->stopping) {
			ti->n_idle++;
			pthread_cond_wait(&ti->qcond, &ti->qlock);
			ti->n_idle--;
		}
		if (ti->stopping)
			break; /* fini reports what is still queued */
		s = ti->q_head;
		p = cxl_priv(s);
		if (p->n_chunks == 0) {
			/* A failure found at submit: report it off the submitting thread. */
			cxl_unlink_locked(ti, s);
			pthread_mutex_unlock(&ti->qlock);
			cxl_finish(ti, s);
			pthread_mutex_lock(&ti->qlock);
			continue;
		}
		i = p->next_chunk++;
		if (p->next_chunk == p->n_chunks) {
			cxl_unlink_locked(ti, s);
			atomic_store_explicit(&p->state, CXL_S_RUNNING, memory_order_relaxed);
		}
		pthread_mutex_unlock(&ti->qlock);

		from = cxl_chunk_edge(p, s->length, i);
		to = cxl_chunk_edge(p, s->length, i + 1);
		cxl_copy(&ti->copier, p->dst + from, p->src + from, (size_t)(to - from), p->flags);
		/* acq_rel: the reporter sees every chunk's bytes (each fenced by its copier). */
		if (atomic_fetch_sub_explicit(&p->left, 1, memory_order_acq_rel) == 1)
			cxl_finish(ti, s);
		pthread_mutex_lock(&ti->qlock);
	}
	pthread_mutex_unlock(&ti->qlock);
	return NULL;
}

/* --- allocation ------------------------------------------------------------------------- */

/*
 * mem_alloc hands out ranges of [alloc_offset, +alloc_size) of the window, first fit. Every
 * engine mapping the window allocates from its own range, so engines never hand out the same
 * bytes; nothing in the window records the ranges, so keeping them disjoint is the
 * deployment's job (README.md, "Allocating window memory").
 */

#define CXL_ALLOC_LARGE (2ull << 20) /* requests this large start on a 2 MiB window offset */

static uint64_t cxl_page(void)
{
	long page = sysconf(_SC_PAGESIZE);

	return page > 0 ? (uint64_t)page : 4096;
}

static uint64_t cxl_align_up(uint64_t v, uint64_t align)
{
	return (v + align - 1) / align * align;
}

/* The allocation range must lie inside the mapped window: a config error at install. */
static enum te_status cxl_alloc_check(struct cxl_inst *ti)
{
	uint64_t page = cxl_page();

	if (!ti->alloc_set)
		return TE_OK;
	/* "option '<key>': ..." is the convention the core locates in the YAML. */
	if (ti->alloc_off % page || ti->alloc_size % page)
		return cxl_fail(ti, TE_ERR_CONFIG,
				"option '%s': %" PRIu64
				" is not a multiple of the page size (%" PRIu64 ")",
				ti->alloc_off % page ? "alloc_offset" : "alloc_size",
				ti->alloc_off % page ? ti->alloc_off : ti->alloc_size, page);
	if (ti->alloc_off > ti->size || ti->alloc_size > ti->size - ti->alloc_off)
		return cxl_fail(ti, TE_ERR_CONFIG,
				"option '%s': the allocation range [%" PRIu64 ", +%" PRIu64
				") is outside the %" PRIu64 "-byte window '%s'",
				ti->alloc_off >= ti->size ? "alloc_offset" : "alloc_size",
				ti->alloc_off, ti->alloc_size, ti->size, ti->path);
	cxl_log(ti, TE_PLUGIN_LOG_INFO,
		"allocates window memory from [%" PRIu64 ", +%" PRIu64 ") of window %s",
		ti->alloc_off, ti->alloc_size, ti->id);
	return TE_OK;
}

/*
 * First fit of @len bytes at a window offset that is a multiple of @align: the offset, or
 * CXL_OFF_NONE; *prev_out is the allocation to link it after (NULL: at the head). Under alock.
 */
static uint64_t cxl_alloc_fit(const struct cxl_inst *ti, uint64_t len, uint64_t align,
			      struct cxl_alloc **prev_out)
{
	uint64_t cur = ti->alloc_off, end = ti->alloc_off + ti->alloc_size;
	struct cxl_alloc *prev = NULL;

	for (struct cxl_alloc *a = ti->allocs;; prev = a, a = a->next) {
		uint64_t gap_end = a ? a->off : end, at = cxl_align_up(cur, align);

		if (at <= gap_end && len <= gap_end - at) {
			*prev_out = prev;
			return at;
		}
		if (!a)
			return CXL_OFF_NONE;
		cur = a->off + a->len;
	}
}

/* Largest free gap of the range (for the message of a refusal). Under alock. */
static uint64_t cxl_alloc_largest_gap(const struct cxl_inst *ti)
{
	uint64_t cur = ti->alloc_off, best = 0;

	for (const struct cxl_alloc *a = ti->allocs; a; a = a->next) {
		best = a->off - cur > best ? a->off - cur : best;
		cur = a->off + a->len;
	}
	return ti->alloc_off + ti->alloc_size - cur > best ? ti->alloc_off + ti->alloc_size - cur
							   : best;
}

static enum te_status cxl_mem_alloc(struct te_plugin_inst *inst, uint32_t mem_type, int32_t dev,
				    uint64_t len, void **ptr_out)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	uint64_t page = cxl_page(), rounded, off;
	struct cxl_alloc *a, *prev = NULL;

	if (!ptr_out || len == 0)
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CXL)
		return cxl_fail(ti, TE_ERR_MEMORY_TYPE,
				"allocates cxl window memory only, not memory type 0x%x", mem_type);
	if (dev != 0)
		return cxl_fail(ti, TE_ERR_NO_DEVICE,
				"location cxl:%d: this engine maps one window, cxl:0 ('%s')", dev,
				ti->path);
	if (!ti->alloc_set)
		return cxl_fail(ti, TE_ERR_CONFIG,
				"no allocation range: set the options 'alloc_offset' and "
				"'alloc_size' to the part of window %s this engine allocates from "
				"(disjoint from every other engine's)",
				ti->id);
	if (len > ti->alloc_size)
		return cxl_fail(ti, TE_ERR_NOMEM,
				"%" PRIu64 " bytes: larger than the allocation range [%" PRIu64
				", +%" PRIu64 ") of window %s",
				len, ti->alloc_off, ti->alloc_size, ti->id);
	rounded = cxl_align_up(len, page);
	a = calloc(1, sizeof(*a));
	if (!a)
		return TE_ERR_NOMEM;
	pthread_mutex_lock(&ti->alock);
	off = rounded >= CXL_ALLOC_LARGE ? cxl_alloc_fit(ti, rounded, CXL_ALLOC_LARGE, &prev)
					 : CXL_OFF_NONE;
	if (off == CXL_OFF_NONE)
		off = cxl_alloc_fit(ti, rounded, page, &prev);
	if (off == CXL_OFF_NONE) {
		uint64_t used = ti->alloc_used, gap = cxl_alloc_largest_gap(ti);
		uint32_t n = ti->n_allocs;

		pthread_mutex_unlock(&ti->alock);
		free(a);
		return cxl_fail(ti, TE_ERR_NOMEM,
				"no free %" PRIu64 " bytes in the allocation range [%" PRIu64
				", +%" PRIu64 ") of window %s: %" PRIu64
				" bytes in use by %u allocation(s), largest free gap %" PRIu64
				" bytes",
				rounded, ti->alloc_off, ti->alloc_size, ti->id, used, n, gap);
	}
	a->off = off;
	a->len = rounded;
	a->next = prev ? prev->next : ti->allocs;
	if (prev)
		prev->next = a;
	else
		ti->allocs = a;
	ti->alloc_used += rounded;
	ti->n_allocs++;
	pthread_mutex_unlock(&ti->alock);
	cxl_log(ti, TE_PLUGIN_LOG_DEBUG, "allocated window [%" PRIu64 ", +%" PRIu64 ")", off,
		rounded);
	*ptr_out = ti->base + off;
	return TE_OK;
}

static enum te_status cxl_mem_free(struct te_plugin_inst *inst, void *ptr)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	uint64_t p = (uint64_t)(uintptr_t)ptr, base = (uint64_t)(uintptr_t)ti->base;
	struct cxl_alloc *a, *prev = NULL;
	const struct cxl_mem *m;

	pthread_mutex_lock(&ti->alock);
	for (a = ti->allocs; a && base + a->off != p; prev = a, a = a->next)
		;
	if (!a) {
		pthread_mutex_unlock(&ti->alock);
		return cxl_fail(ti, TE_ERR_NOT_FOUND, "%p is not an allocation of window %s", ptr,
				ti->id);
	}
	/* Peers reach a registered range through its key: it stays until deregistered. */
	pthread_mutex_lock(&ti->lock);
	for (m = ti->mems; m; m = m->next)
		if (m->off != CXL_OFF_NONE && m->off < a->off + a->len &&
		    a->off < m->off + m->length)
			break;
	pthread_mutex_unlock(&ti->lock);
	if (m) {
		uint64_t off = m->off, len = m->length;

		pthread_mutex_unlock(&ti->alock);
		return cxl_fail(ti, TE_ERR_BUSY,
				"window [%" PRIu64 ", +%" PRIu64 ") of the allocation at %p is "
				"still registered",
				off, len, ptr);
	}
	if (prev)
		prev->next = a->next;
	else
		ti->allocs = a->next;
	ti->alloc_used -= a->len;
	ti->n_allocs--;
	pthread_mutex_unlock(&ti->alock);
	cxl_log(ti, TE_PLUGIN_LOG_DEBUG, "freed window [%" PRIu64 ", +%" PRIu64 ")", a->off,
		a->len);
	free(a);
	return TE_OK;
}

/* --- install -------------------------------------------------------------------------------- */

static enum te_status cxl_workers_start(struct cxl_inst *ti)
{
	ti->threads = calloc(ti->n_threads, sizeof(*ti->threads));
	if (!ti->threads)
		return TE_ERR_NOMEM;
	for (uint32_t i = 0; i < ti->n_threads; i++) {
		char name[16];
		int rc = pthread_create(&ti->threads[i], NULL, cxl_worker_main, ti);

		if (rc != 0)
			return cxl_fail(ti, TE_ERR_SYSTEM, "cannot start worker %u: %s", i,
					strerror(rc));
		ti->n_started++;
		snprintf(name, sizeof(name), "te-cxl-%u", i);
		pthread_setname_np(ti->threads[i], name);
	}
	return TE_OK;
}

/* Teardown shared by fini and a failing init; @ti may be partly built. */
static void cxl_destroy(struct cxl_inst *ti)
{
	uint32_t peers = 0, rkeys = 0, mems = 0, slices = 0, allocs = 0;

	atomic_store_explicit(&ti->closed, true, memory_order_relaxed);
	pthread_mutex_lock(&ti->qlock);
	ti->stopping = true;
	pthread_cond_broadcast(&ti->qcond);
	pthread_mutex_unlock(&ti->qlock);
	for (uint32_t i = 0; i < ti->n_started; i++)
		pthread_join(ti->threads[i], NULL);
	free(ti->threads);

	/* Single-threaded from here: every claimed chunk has finished. */
	while (ti->q_head) {
		struct te_plugin_slice *s = ti->q_head;
		struct cxl_spriv *p = cxl_priv(s);

		cxl_unlink_locked(ti, s);
		if (p->n_chunks)
			cxl_set_status(p, TE_ERR_CANCELED, CXL_NAME ": instance shut down");
		slices++;
		cxl_finish(ti, s);
	}
	while (ti->peers) {
		struct cxl_peer *peer = ti->peers;

		ti->peers = peer->next;
		peers++;
		free(peer->name);
		free(peer);
	}
	while (ti->rkeys) {
		struct cxl_rkey *k = ti->rkeys;

		ti->rkeys = k->next;
		rkeys++;
		free(k);
	}
	while (ti->mems) {
		struct cxl_mem *m = ti->mems;

		ti->mems = m->next;
		mems++;
		free(m);
	}
	/* Allocations are ranges of the window: they go with its mapping. */
	while (ti->allocs) {
		struct cxl_alloc *a = ti->allocs;

		ti->allocs = a->next;
		allocs++;
		free(a);
	}
	if (peers || rkeys || mems || slices || allocs)
		cxl_log(ti, TE_PLUGIN_LOG_DEBUG,
			"fini released %u peers, %u remote keys, %u regions, %u allocations and %u "
			"queued slices",
			peers, rkeys, mems, allocs, slices);
	if (ti->base)
		munmap(ti->base, (size_t)ti->size);
	pthread_cond_destroy(&ti->qcond);
	pthread_mutex_destroy(&ti->qlock);
	pthread_mutex_destroy(&ti->alock);
	pthread_mutex_destroy(&ti->lock);
	free(ti);
}

static void cxl_blob_build(const struct cxl_inst *ti, uint8_t blob[CXL_BLOB_LEN])
{
	memset(blob, 0, CXL_BLOB_LEN);
	te_plugin_put_u32(blob, CXL_BLOB_MAGIC);
	blob[4] = CXL_BLOB_VERSION;
	blob[5] = ti->coherent ? CXL_BLOB_COHERENT : 0;
	blob[6] = (uint8_t)strlen(ti->id);
	te_plugin_put_u64(blob + 8, ti->size);
	te_plugin_put_u64(blob + 16, ti->id_hash);
	memcpy(blob + 24, ti->id, strlen(ti->id));
	memcpy(blob + 24 + CXL_ID_MAX, ti->path, strlen(ti->path));
}

static enum te_status cxl_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
			       struct te_plugin_inst **inst_out)
{
	uint8_t blob[CXL_BLOB_LEN];
	struct cxl_inst *ti;
	enum te_status st;

	if (!host || !inst_out || !host->log || !host->slice_done || !host->config_get ||
	    !host->publish)
		return TE_ERR_INVALID_ARG;
	ti = calloc(1, sizeof(*ti));
	if (!ti)
		return TE_ERR_NOMEM;
	ti->host = host;
	ti->ctx = ctx;
	pthread_mutex_init(&ti->lock, NULL);
	pthread_mutex_init(&ti->alock, NULL);
	pthread_mutex_init(&ti->qlock, NULL);
	pthread_cond_init(&ti->qcond, NULL);

	st = cxl_parse_options(ti);
	if (st == TE_OK)
		st = cxl_window_open(ti);
	if (st == TE_OK)
		st = cxl_alloc_check(ti);
	if (st != TE_OK)
		goto err_destroy;
	cxl_blob_build(ti, blob);
	st = host->publish(ctx, blob, sizeof(blob));
	if (st != TE_OK) {
		cxl_fail(ti, st, "publish of the window blob failed (%d)", st);
		goto err_destroy;
	}
	st = cxl_workers_start(ti);
	if (st != TE_OK)
		goto err_destroy;
	*inst_out = (struct te_plugin_inst *)ti;
	return TE_OK;

err_destroy:
	cxl_destroy(ti);
	return st;
}

static void cxl_fini(struct te_plugin_inst *inst)
{
	cxl_destroy(cxl_inst_of(inst));
}

static enum te_status cxl_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	struct cxl_inst *ti = cxl_inst_of(inst);

	if (!caps)
		return TE_ERR_INVALID_ARG;
	caps->mem_types = TE_PLUGIN_MEM_CPU | TE_PLUGIN_MEM_CXL;
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	/* Not same-host only: a CXL window spans hosts. */
	caps->flags = 0;
	/* Every slice touches the window, so none is longer than the window. */
	caps->max_slice_size = ti->size;
	caps->default_slice_size = CXL_MIN(ti->slice_size, ti->size);
	caps->slice_priv_size = sizeof(struct cxl_spriv);
	caps->max_devices = 1;
	/* Window memory for te_mem_alloc("cxl:0"); without alloc_size mem_alloc says so. */
	caps->alloc_mem_types = TE_PLUGIN_MEM_CXL;
	return TE_OK;
}

static enum te_status cxl_query_devices(struct te_plugin_inst *inst,
					struct te_plugin_device *devices, uint32_t max,
					uint32_t *n_out)
{
	struct cxl_inst *ti = cxl_inst_of(inst);

	if (!n_out || (max && !devices))
		return TE_ERR_INVALID_ARG;
	if (max == 0) {
		*n_out = 0;
		return TE_OK;
	}
	te_plugin_device_set(devices, ti->dev_name, ti->numa, NULL, 0,
			     TE_PLUGIN_MEM_CPU | TE_PLUGIN_MEM_CXL);
	*n_out = 1;
	return TE_OK;
}

/* --- memory ------------------------------------------------------------------------------ */

static enum te_status cxl_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				  uint32_t mem_type, int32_t dev, uint32_t access,
				  struct te_plugin_mem **mem_out)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	uint64_t start = (uint64_t)(uintptr_t)addr, off = CXL_OFF_NONE;
	struct cxl_mem *m;
	char why[160];

	if (!addr || length == 0 || !mem_out || (access & ~CXL_ACCESS_ALL))
		return TE_ERR_INVALID_ARG;
	if (mem_type != TE_PLUGIN_MEM_CPU && mem_type != TE_PLUGIN_MEM_CXL)
		return cxl_fail(ti, TE_ERR_MEMORY_TYPE, "memory type 0x%x is neither cpu nor cxl",
				mem_type);
	if (start > UINT64_MAX - length)
		return TE_ERR_OVERFLOW;
	if (mem_type == TE_PLUGIN_MEM_CXL && dev > 0)
		return cxl_fail(ti, TE_ERR_MEMORY_TYPE,
				"location cxl:%d: this engine maps one window, cxl:0 ('%s')", dev,
				ti->path);
	if (!cxl_locate(ti, start, length, &off, why, sizeof(why))) {
		if (mem_type == TE_PLUGIN_MEM_CXL)
			return cxl_fail(ti, TE_ERR_OUT_OF_RANGE,
					"[%p, +%" PRIu64 ") registered as cxl:0 is not in window "
					"'%s' (%" PRIu64 " bytes at offset %" PRIu64 "): %s",
					addr, length, ti->path, ti->size, ti->offset, why);
		off = CXL_OFF_NONE; /* ordinary memory: usable as the local side only */
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return TE_ERR_NOMEM;
	m->addr = start;
	m->length = length;
	m->off = off;
	m->access = access;
	pthread_mutex_lock(&ti->lock);
	m->next = ti->mems;
	if (ti->mems)
		ti->mems->prev = m;
	ti->mems = m;
	pthread_mutex_unlock(&ti->lock);
	if (off != CXL_OFF_NONE)
		cxl_log(ti, TE_PLUGIN_LOG_DEBUG,
			"registered [%p, +%" PRIu64 ") at window offset %" PRIu64, addr, length,
			off);
	*mem_out = (struct te_plugin_mem *)m;
	return TE_OK;
}

static enum te_status cxl_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	struct cxl_mem *m = (struct cxl_mem *)mem;

	if (!m)
		return TE_ERR_INVALID_ARG;
	/*
	 * Nothing to fence: no thread of this engine copies for peers. The core calls this only
	 * when no local batch uses the region.
	 */
	pthread_mutex_lock(&ti->lock);
	if (m->prev)
		m->prev->next = m->next;
	else
		ti->mems = m->next;
	if (m->next)
		m->next->prev = m->prev;
	pthread_mutex_unlock(&ti->lock);
	free(m);
	return TE_OK;
}

static enum te_status cxl_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				   void *buf, size_t cap, size_t *len_out)
{
	const struct cxl_inst *ti = cxl_inst_of(inst);
	const struct cxl_mem *m = (const struct cxl_mem *)mem;
	uint8_t *p = buf;

	if (!m || !len_out || (cap && !buf))
		return TE_ERR_INVALID_ARG;
	/* Ordinary memory (outside the window) is a local side only: no key to publish. */
	if (m->off == CXL_OFF_NONE) {
		*len_out = 0;
		return TE_OK;
	}
	if (cap < CXL_KEY_LEN)
		return TE_ERR_TOO_LARGE;
	te_plugin_put_u32(p, CXL_KEY_MAGIC);
	te_plugin_put_u32(p + 4, m->access);
	te_plugin_put_u64(p + 8, ti->id_hash);
	te_plugin_put_u64(p + 16, m->off);
	te_plugin_put_u64(p + 24, m->length);
	*len_out = CXL_KEY_LEN;
	return TE_OK;
}


/* --- peers ------------------------------------------------------------------------------ */

static enum te_status cxl_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				    const void *blob, size_t len, struct te_plugin_peer **peer_out)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	char id[CXL_ID_MAX], path[CXL_PATH_MAX];
	const uint8_t *b = blob;
	struct cxl_peer *peer;
	uint64_t size, hash;

	if (!peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != CXL_BLOB_LEN || te_plugin_get_u32(b) != CXL_BLOB_MAGIC ||
	    b[4] != CXL_BLOB_VERSION || b[6] == 0 || b[6] >= CXL_ID_MAX)
		return cxl_fail(ti, TE_ERR_METADATA_MALFORMED,
				"peer %s: malformed window blob (%zu bytes)", peer_name, len);
	size = te_plugin_get_u64(b + 8);
	hash = te_plugin_get_u64(b + 16);
	cxl_text(id, sizeof(id), b + 24, b[6]);
	cxl_text(path, sizeof(path), b + 24 + CXL_ID_MAX, CXL_PATH_MAX);
	if (hash != ti->id_hash || strcmp(id, ti->id) != 0) {
		/* The reason is quoted in a short field: the paths go to the log only. */
		cxl_log(ti, TE_PLUGIN_LOG_INFO,
			"peer %s maps window %s from '%s', this engine %s from '%s'", peer_name, id,
			path, ti->id, ti->path);
		return cxl_fail(ti, TE_ERR_PEER_UNREACHABLE,
				"peer %s is on window %s, this engine on %s", peer_name, id,
				ti->id);
	}
	if (size != ti->size)
		return cxl_fail(ti, TE_ERR_PEER_UNREACHABLE,
				"peer %s maps window %s with %" PRIu64
				" bytes, this engine with %" PRIu64,
				peer_name, id, size, ti->size);
	if (!(b[5] & CXL_BLOB_COHERENT) != !ti->coherent)
		cxl_log(ti, TE_PLUGIN_LOG_WARN,
			"peer %s says the window is %scoherent, this engine says %scoherent: "
			"check the 'coherent' option of both",
			peer_name, b[5] & CXL_BLOB_COHERENT ? "" : "not ",
			ti->coherent ? "" : "not ");
	peer = calloc(1, sizeof(*peer));
	if (!peer || !(peer->name = strdup(peer_name))) {
		free(peer);
		return TE_ERR_NOMEM;
	}
	pthread_mutex_lock(&ti->lock);
	peer->next = ti->peers;
	if (ti->peers)
		ti->peers->prev = peer;
	ti->peers = peer;
	pthread_mutex_unlock(&ti->lock);
	cxl_log(ti, TE_PLUGIN_LOG_DEBUG, "peer %s on window %s", peer_name, id);
	*peer_out = (struct te_plugin_peer *)peer;
	return TE_OK;
}

static void cxl_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *handle)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	struct cxl_peer *peer = (struct cxl_peer *)handle;

	if (!peer)
		return;
	/* Slices hold no reference to the peer object beyond submit. */
	pthread_mutex_lock(&ti->lock);
	if (peer->prev)
		peer->prev->next = peer->next;
	else
		ti->peers = peer->next;
	if (peer->next)
		peer->next->prev = peer->prev;
	pthread_mutex_unlock(&ti->lock);
	free(peer->name);
	free(peer);
}

static enum te_status cxl_unpack_remote_key(struct te_plugin_inst *inst,
					    struct te_plugin_peer *peer, const void *blob,
					    size_t len, uint64_t addr, uint64_t length,
					    struct te_plugin_rkey **rkey_out)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	const uint8_t *p = blob;
	uint64_t off, klen;
	struct cxl_rkey *k;
	uint32_t access;

	if (!peer || !rkey_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len != CXL_KEY_LEN || te_plugin_get_u32(p) != CXL_KEY_MAGIC)
		return cxl_fail(ti, TE_ERR_METADATA_MALFORMED,
				"peer %s: malformed key (%zu bytes) for buffer [0x%" PRIx64
				", +%" PRIu64 ")",
				((struct cxl_peer *)peer)->name, len, addr, length);
	access = te_plugin_get_u32(p + 4);
	off = te_plugin_get_u64(p + 16);
	klen = te_plugin_get_u64(p + 24);
	/* The key must describe exactly the buffer the descriptor lists it under. */
	if ((access & ~CXL_ACCESS_ALL) || klen != length || klen == 0 || addr > UINT64_MAX - klen)
		return cxl_fail(ti, TE_ERR_METADATA_MALFORMED,
				"peer %s: key for buffer [0x%" PRIx64 ", +%" PRIu64
				") describes %" PRIu64 " bytes",
				((struct cxl_peer *)peer)->name, addr, length, klen);
	if (te_plugin_get_u64(p + 8) != ti->id_hash)
		return cxl_fail(ti, TE_ERR_REMOTE_ACCESS,
				"peer %s: buffer [0x%" PRIx64 ", +%" PRIu64
				") is on another window",
				((struct cxl_peer *)peer)->name, addr, length);
	if (off == CXL_OFF_NONE || off > ti->size || klen > ti->size - off)
		return cxl_fail(ti, TE_ERR_MEMORY_TYPE,
				"peer %s: buffer [0x%" PRIx64 ", +%" PRIu64 ") is not in window %s",
				((struct cxl_peer *)peer)->name, addr, length, ti->id);
	k = calloc(1, sizeof(*k));
	if (!k)
		return TE_ERR_NOMEM;
	k->addr = addr;
	k->length = klen;
	k->off = off;
	k->access = access;
	pthread_mutex_lock(&ti->lock);
	k->next = ti->rkeys;
	if (ti->rkeys)
		ti->rkeys->prev = k;
	ti->rkeys = k;
	pthread_mutex_unlock(&ti->lock);
	*rkey_out = (struct te_plugin_rkey *)k;
	return TE_OK;
}

static void cxl_release_remote_key(struct te_plugin_inst *inst, struct te_plugin_rkey *rkey)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	struct cxl_rkey *k = (struct cxl_rkey *)rkey;

	if (!k)
		return;
	pthread_mutex_lock(&ti->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		ti->rkeys = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&ti->lock);
	free(k);
}

/* --- submit and cancel --------------------------------------------------------------------- */

/*
 * Check @s against its local region, its remote key and the window, then resolve the copy
 * into @p. On failure @p carries the status and detail, with no chunks.
 */
static void cxl_prepare(struct cxl_inst *ti, struct te_plugin_slice *s, struct cxl_spriv *p)
{
	const struct cxl_mem *m = (const struct cxl_mem *)s->local_mem;
	const struct cxl_rkey *k = (const struct cxl_rkey *)s->rkey;
	uint64_t local = (uint64_t)(uintptr_t)s->local, len = s->length, off, n;
	bool read = s->opcode == TE_PLUGIN_OP_READ;
	uint32_t need = read ? TE_PLUGIN_ACCESS_REMOTE_READ : TE_PLUGIN_ACCESS_REMOTE_WRITE;
	uint8_t *win;

	p->n_chunks = 0;
	if (!m || local < m->addr || len > m->length || local - m->addr > m->length - len) {
		cxl_set_status(p, TE_ERR_OUT_OF_RANGE,
			       CXL_NAME ": local range [%p, +%" PRIu64
					") is outside its registered region",
			       s->local, len);
		return;
	}
	if (!k || s->remote < k->addr || len > k->length || s->remote - k->addr > k->length - len ||
	    !(k->access & need)) {
		if (k)
			cxl_set_status(p, TE_ERR_REMOTE_ACCESS,
				       CXL_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
						") is not inside the remote-%s buffer [0x%" PRIx64
						", +%" PRIu64 ") it was submitted for",
				       s->remote, len, read ? "readable" : "writable", k->addr,
				       k->length);
		else
			cxl_set_status(p, TE_ERR_REMOTE_ACCESS,
				       CXL_NAME ": remote range [0x%" PRIx64 ", +%" PRIu64
						") has no cxl key",
				       s->remote, len);
		return;
	}
	off = k->off + (s->remote - k->addr);
	/* unpack_remote_key kept [k->off, +k->length) inside the window: defence in depth. */
	if (off > ti->size || len > ti->size - off) {
		cxl_set_status(p, TE_ERR_REMOTE_ACCESS,
			       CXL_NAME ": window range [%" PRIu64 ", +%" PRIu64
					") is outside the %" PRIu64 "-byte window",
			       off, len, ti->size);
		return;
	}
	if (m->off != CXL_OFF_NONE) {
		uint64_t loff = m->off + (local - m->addr);

		if (loff < off + len && off < loff + len) {
			cxl_set_status(p, TE_ERR_INVALID_ARG,
				       CXL_NAME ": local and remote ranges overlap in the window "
						"([%" PRIu64 ", +%" PRIu64 ") and [%" PRIu64
						", +%" PRIu64 "))",
				       loff, len, off, len);
			return;
		}
	}
	win = ti->base + off;
	if (read) {
		p->dst = s->local;
		p->src = win;
		/*
		 * Large READs stream into local memory too: no read-for-ownership of the
		 * destination lines, at the price of leaving them out of the cache.
		 */
		p->flags =
			(ti->coherent ? 0 : CXL_COPY_FLUSH_SRC) |
			(m->off != CXL_OFF_NONE || len >= ti->read_stream_min ? CXL_COPY_STREAM_DST
									      : 0);
	} else {
		p->dst = win;
		p->src = s->local;
		p->flags = CXL_COPY_STREAM_DST |
			   (m->off != CXL_OFF_NONE && !ti->coherent ? CXL_COPY_FLUSH_SRC : 0);
	}
	/* Chunk counts fit 32 bits: a slice is at most the window. */
	p->chunk = ti->chunk;
	n = (len + p->chunk - 1) / p->chunk;
	if (n > UINT32_MAX) {
		p->chunk = (len + UINT32_MAX - 1) / UINT32_MAX;
		n = (len + p->chunk - 1) / p->chunk;
	}
	p->n_chunks = (uint32_t)n;
	atomic_store_explicit(&p->left, (uint32_t)n, memory_order_relaxed);
}

static enum te_status cxl_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				 uint32_t n, uint32_t *accepted_out)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	struct te_plugin_slice *head = NULL, *tail = NULL;
	enum te_status ret = TE_OK;
	uint64_t work = 0;
	uint32_t i;

	if (!accepted_out || (n && !slices))
		return TE_ERR_INVALID_ARG;
	if (atomic_load_explicit(&ti->closed, memory_order_relaxed))
		return TE_ERR_SHUTDOWN;
	for (i = 0; i < n; i++) {
		struct te_plugin_slice *s = slices[i];
		struct cxl_spriv *p;

		if (!s || !s->priv || !s->peer || !s->local || s->length == 0 ||
		    (s->opcode != TE_PLUGIN_OP_READ && s->opcode != TE_PLUGIN_OP_WRITE)) {
			ret = cxl_fail(ti, TE_ERR_INVALID_ARG, "submit: malformed slice %u of %u",
				       i, n);
			break;
		}
		p = cxl_priv(s);
		p->owner = ti;
		p->prev = tail;
		p->next = NULL;
		p->next_chunk = 0;
		p->detail[0] = '\0';
		atomic_store_explicit(&p->status, TE_OK, memory_order_relaxed);
		s->device = 0;
		cxl_prepare(ti, s, p);
		if (tail)
			cxl_priv(tail)->next = s;
		else
			head = s;
		tail = s;
		work += p->n_chunks ? p->n_chunks : 1;
	}
	if (head) {
		pthread_mutex_lock(&ti->qlock);
		/* relaxed: cancel reads state under qlock */
		for (struct te_plugin_slice *s = head; s; s = cxl_priv(s)->next)
			atomic_store_explicit(&cxl_priv(s)->state, CXL_S_QUEUED,
					      memory_order_relaxed);
		cxl_priv(head)->prev = ti->q_tail;
		if (ti->q_tail)
			cxl_priv(ti->q_tail)->next = head;
		else
			ti->q_head = head;
		ti->q_tail = tail;
		if (work >= ti->n_idle)
			pthread_cond_broadcast(&ti->qcond);
		else
			for (uint64_t k = 0; k < work; k++)
				pthread_cond_signal(&ti->qcond);
		pthread_mutex_unlock(&ti->qlock);
	}
	*accepted_out = i;
	return ret;
}

static enum te_status cxl_cancel(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	struct cxl_inst *ti = cxl_inst_of(inst);
	struct cxl_spriv *p;
	bool report = false;

	if (!s || !s->priv)
		return TE_ERR_INVALID_ARG;
	p = cxl_priv(s);
	pthread_mutex_lock(&ti->qlock);
	/*
	 * The slice memory is valid during the call; its priv bytes are ours only if we took it
	 * (an accepted slice always ends DONE before it is reported).
	 */
	if (p->owner != ti ||
	    atomic_load_explicit(&p->state, memory_order_relaxed) != CXL_S_QUEUED) {
		bool running =
			p->owner == ti &&
			atomic_load_explicit(&p->state, memory_order_relaxed) == CXL_S_RUNNING;

		pthread_mutex_unlock(&ti->qlock);
		/* A running slice finishes within one chunk copy: with its real outcome. */
		return running ? TE_OK : TE_ERR_NOT_FOUND;
	}
	cxl_unlink_locked(ti, s);
	atomic_store_explicit(&p->state, CXL_S_RUNNING, memory_order_relaxed);
	cxl_set_status(p, TE_ERR_CANCELED, CXL_NAME ": canceled before %s",
		       p->next_chunk ? "all of it was copied" : "it was copied");
	if (p->n_chunks == 0) {
		report = true;
	} else {
		/* Chunks never claimed will not run; claimed ones finish and count down. */
		uint32_t unclaimed = p->n_chunks - p->next_chunk;

		report = unclaimed && atomic_fetch_sub_explicit(&p->left, unclaimed,
								memory_order_acq_rel) == unclaimed;
	}
	pthread_mutex_unlock(&ti->qlock);
	if (report)
		cxl_finish(ti, s);
	return TE_OK;
}

static enum te_status cxl_retry_prepare(struct te_plugin_inst *inst, struct te_plugin_slice *s)
{
	if (!s)
		return TE_ERR_INVALID_ARG;
	s->device = 0; /* one window */
	return TE_OK;
}

static const struct te_plugin_ops cxl_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = cxl_init,
	.fini = cxl_fini,
	.query_caps = cxl_query_caps,
	.query_devices = cxl_query_devices,
	.reg_mem = cxl_reg_mem,
	.dereg_mem = cxl_dereg_mem,
	.pack_key = cxl_pack_key,
	.load_peer = cxl_load_peer,
	.unload_peer = cxl_unload_peer,
	.unpack_remote_key = cxl_unpack_remote_key,
	.release_remote_key = cxl_release_remote_key,
	.submit = cxl_submit,
	.cancel = cxl_cancel,
	.retry_prepare = cxl_retry_prepare,
	.mem_alloc = cxl_mem_alloc,
	.mem_free = cxl_mem_free,
};

static const struct te_plugin_desc cxl_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = CXL_NAME,
	.version = TE_PLUGIN_VERSION,
	.description = "CXL transport: copies through a shared memory window with explicit "
		       "cache management",
	.ops = &cxl_ops,
	TE_PLUGIN_OPTIONS(cxl_options),
};

TE_PLUGIN_DEFINE(&cxl_desc)
