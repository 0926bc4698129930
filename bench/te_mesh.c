/* SPDX-License-Identifier: Apache-2.0 */
/* te_mesh.c: one member of a mesh of te engines on one host (bench/mesh.sh): all-to-all load. */

/*
 * te-mesh is one process of bench/mesh.sh's mesh: it creates an engine (the embedded default,
 * $TE_CONFIG or --config: p2p metadata and tcp on loopback), registers one buffer, opens every
 * other member's segment and runs a verified READ/WRITE load against random peers, then
 * reports what it moved and what it cost (descriptors, RSS, threads at each phase) as one JSON
 * line. mesh.sh drives the phases over stdin so all members pass them together.
 *
 * Protocol (stdout, one line each, in this order; stdin commands, one per line):
 *   out "segment: NAME"   the engine is up and the buffer registered
 *   out "ready"           the buffer holds its pattern (and every page is touched)
 *   in  "member K NAME"   one per member, K in [0, engines), all of them, own included
 *   in  "open"            open every other member's segment;  out "opened"
 *   in  "go"              warm up, then the timed load;        out "loaded"
 *   in  "close"           close every segment;                 out "closed"
 *   in  "end"             wait for descriptors to settle, free the engine, out "result: JSON"
 * EOF on stdin before "end" stops the member (exit 1).
 *
 * Buffer layout (the same on every member, checked at open): [0, read_area) holds the owner's
 * pattern and is only ever read; then one write area of `area` bytes (the largest batch) per
 * writer: member w writes [read_area + w x area, +area) of its peers. A member's write slots
 * never write to the same peer at once (a slot takes the next free peer after the random
 * one), so no two batches in flight ever write the same bytes; hence depth / 2 <= N - 1.
 *
 * Load: --depth slots, one thread each, each with one batch in flight at a time (as a
 * tcp-raw-loop connection with --verify: bench/mesh.sh's raw baseline runs the same streams).
 * Slot k moves blocks of one size (sizes[(id x ceil(depth/2) + k/2) mod n_sizes]) with one op:
 * even slots READ, odd slots WRITE. A batch has min(max_batch, batch_bytes / block) requests
 * (at least 1), all to one peer picked at random per batch (WRITE: the next one after it
 * that no other write slot of this member is writing to). READ: the local area is poisoned,
 * a random 4K-aligned range of the peer's read area is read and every byte compared with the
 * owner's pattern. WRITE: the slot's write area on the peer gets a fresh pattern (salted per
 * batch), then it is read back into a poisoned area and compared; the read-back is counted
 * apart (readback_bytes), not in bytes or GB/s, as tcp-raw-loop --verify does.
 *
 * Exit status: 0 when every transfer completed and every byte matched; 1 on any failed task,
 * verification failure or setup error (the JSON line is still printed when the run got that
 * far); 2 for a usage error.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#include "pattern.h"

#define MESH_EXIT_OK 0
#define MESH_EXIT_FAIL 1
#define MESH_EXIT_USAGE 2

#define MESH_KIB (UINT64_C(1) << 10)
#define MESH_MIB (UINT64_C(1) << 20)
#define MESH_GIB (UINT64_C(1) << 30)
#define MESH_NS (UINT64_C(1000000000))

/* Limits on what a user may ask for; bounded so the layout products cannot overflow. */
#define MESH_MAX_ENGINES 4096u
#define MESH_MIN_DEPTH 2u /* at least one READ and one WRITE slot */
#define MESH_MAX_DEPTH 64u
#define MESH_MAX_SIZES 16u
#define MESH_MAX_BLOCK (64 * MESH_MIB)
#define MESH_MAX_BATCH 4096u
#define MESH_MAX_READ_AREA (4 * MESH_GIB)
#define MESH_MAX_BUFFER (32 * MESH_GIB) /* registered buffer of one member */
#define MESH_MAX_DURATION 86400.0
#define MESH_MAX_WARMUP 1000000u
#define MESH_MAX_NAME 255u
#define MESH_LINE 512u
/* Errors by status kept per slot; more distinct statuses are counted under "other". */
#define MESH_MAX_STATUSES 16u
/* Failures described on stderr per member (the rest are only counted). */
#define MESH_MAX_REPORTS 8u
/* After close: how long descriptors may take to settle (lanes close on their worker). */
#define MESH_SETTLE_NS (5 * MESH_NS)
#define MESH_POISON 0xa5

/* Defaults. */
#define MESH_DEF_DEPTH 4u
#define MESH_DEF_SIZES "4K,64K,1M"
#define MESH_DEF_BATCH_BYTES MESH_MIB
#define MESH_DEF_MAX_BATCH 128u
#define MESH_DEF_READ_AREA (4 * MESH_MIB)
#define MESH_DEF_DURATION 20.0
#define MESH_DEF_WARMUP 4u
#define MESH_DEF_TIMEOUT 60.0

struct mesh_opts {
	uint32_t id;
	uint32_t engines;
	const char *config; /* NULL: $TE_CONFIG, else the embedded default */
	uint32_t depth;
	uint64_t sizes[MESH_MAX_SIZES];
	uint32_t n_sizes;
	uint64_t batch_bytes;
	uint32_t max_batch;
	uint64_t read_area;
	double duration_s;
	uint32_t warmup;
	double timeout_s;
	uint64_t seed;
	bool seed_set;
};

/* What the process looks like at one moment: /proc/self/fd and /proc/self/status. */
struct mesh_sample {
	int64_t fds;
	int64_t control; /* TCP sockets of the control plane (p2p descriptor fetches) */
	int64_t data;	 /* other TCP sockets: the transport's listener and lanes */
	int64_t rss_kib;
	int64_t threads;
};

enum mesh_phase {
	MESH_AT_START,	/* main() entered */
	MESH_AT_ENGINE, /* engine up, buffers registered and filled */
	MESH_AT_OPENED, /* every peer open */
	MESH_AT_LOADED, /* load done, segments still open */
	MESH_AT_CLOSED, /* segments closed, descriptors settled */
	MESH_AT_FREED,	/* engine freed */
	MESH_N_PHASES,
};

static const char *const mesh_phase_names[MESH_N_PHASES] = {
	"start", "engine", "opened", "loaded", "closed", "freed",
};

struct mesh_peer {
	char name[MESH_MAX_NAME + 1];
	unsigned ctl_port; /* of its control-plane listener (the name's port), or 0 */
	te_segment_id seg;
	bool open;
	uint64_t base;		      /* the peer's buffer (its virtual address) */
	atomic_uint_fast64_t batches; /* relaxed: counted, read after the threads joined */
	atomic_bool writing;	      /* a write slot of this member is writing to it */
};

struct mesh_status_count {
	int32_t status;
	uint64_t n;
};

struct mesh;

struct mesh_slot {
	struct mesh *m;
	uint32_t index;
	pthread_t thread;
	bool started;
	bool write; /* the op of this slot: WRITE (with read-back) or READ */
	uint64_t block;
	uint32_t nreq;
	uint64_t bb;   /* nreq x block */
	uint64_t woff; /* WRITE: its area's offset in every peer's buffer */
	uint8_t *data; /* local: READ destination or WRITE source */
	uint8_t *back; /* local: WRITE read-back */
	struct te_request *reqs;
	uint64_t rng;
	uint64_t seq;

	/* Results (the slot's thread writes them; main reads them after join). */
	uint64_t bytes, readback_bytes, batches, requests, verified_bytes;
	uint64_t failed_tasks, verify_failures, end_ns;
	struct mesh_status_count statuses[MESH_MAX_STATUSES];
	uint32_t n_statuses;
	uint64_t other_statuses;
};

struct mesh {
	struct mesh_opts o;
	struct te_engine *e;
	char name[MESH_MAX_NAME + 1];
	uint8_t *buf;
	uint64_t buf_len;
	uint8_t *local;
	uint64_t local_len;
	uint64_t area; /* bytes per write area (and per local area) */
	struct mesh_peer *peers;
	uint32_t n_open;
	struct mesh_slot *slots;

	/* Timed run: the slots warm up, meet at the gate, then run until the deadline. */
	pthread_mutex_t gate_lock;
	pthread_cond_t gate_cond;
	uint32_t arrived;
	bool gate_open;
	uint64_t start_ns, deadline_ns;

	atomic_uint reports; /* failures described on stderr so far */
	atomic_uint log_warnings;
	struct mesh_sample at[MESH_N_PHASES];
	bool sampled[MESH_N_PHASES];
	uint64_t t_main, t_engine, t_registered, t_filled, t_open0, t_opened;
	uint64_t t_load0, t_load1, t_closed;
	uint64_t settle_ns;
	uint64_t cpu0_ns, cpu1_ns; /* the whole process, at the gate and after the slots ended */
};

static uint64_t mesh_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * MESH_NS + (uint64_t)ts.tv_nsec;
}

static void mesh_err(const struct mesh *m, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void mesh_err(const struct mesh *m, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "te-mesh[%" PRIu32 "]: ", m->o.id);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* CPU time (user + system) of the whole process: every thread, the engine's included. */
static uint64_t mesh_cpu_ns(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * MESH_NS +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

/* The engine's log: counted (warnings tell of refused connections and the like), to stderr. */
static void mesh_log(void *user, enum te_log_level level, const char *msg)
{
	struct mesh *m = user;

	if (level <= TE_LOG_WARN)
		atomic_fetch_add_explicit(&m->log_warnings, 1, memory_order_relaxed);
	fprintf(stderr, "te-mesh[%" PRIu32 "]: te: %s\n", m->o.id, msg);
}

/* Describe at most MESH_MAX_REPORTS failures per member; count the rest. */
static bool mesh_may_report(struct mesh *m)
{
	return atomic_fetch_add_explicit(&m->reports, 1, memory_order_relaxed) < MESH_MAX_REPORTS;
}

/* --- pattern ----------------------------------------------------------------------------- */

/*
 * Regions are filled and checked with bench/pattern.h's pattern, the one tcp-raw-loop checks
 * the raw round's bytes against, so the two rounds spend the same CPU on checking and differ
 * only in what moves the bytes. The owner's read area has salt mesh_owner_salt(owner); each
 * WRITE batch a fresh salt (mesh_mix).
 */
/* A full 64-bit mix (splitmix64's finalizer) for seeds and salts, not per word. */
static inline uint64_t mesh_mix(uint64_t i, uint64_t salt)
{
	uint64_t x = (i ^ salt) * UINT64_C(0xbf58476d1ce4e5b9);

	x ^= x >> 31;
	x *= UINT64_C(0x94d049bb133111eb);
	return x ^ (x >> 29);
}

static uint64_t mesh_owner_salt(uint32_t owner)
{
	return ((uint64_t)owner + 1) * UINT64_C(0x9e3779b97f4a7c15);
}

static uint64_t mesh_rand(uint64_t *s)
{
	/* xorshift64*: per slot, seeded from --seed, the member id and the slot index. */
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * UINT64_C(0x2545f4914f6cdd1d);
}

/* --- what the process holds ---------------------------------------------------------------- */

/* A TCP socket of this process's network namespace: its inode and ports. */
struct mesh_sock {
	uint64_t inode;
	unsigned lport, rport;
};

/* The port of a segment name "host:port" (p2p: the control-plane listener), or 0. */
static unsigned mesh_name_port(const char *name)
{
	const char *c = strrchr(name, ':');
	unsigned long v;
	char *end;

	if (!c)
		return 0;
	v = strtoul(c + 1, &end, 10);
	return *end || v > 65535 ? 0 : (unsigned)v;
}

/* Append the sockets listed in @path (/proc/self/net/tcp or tcp6) to *socks. */
static void mesh_read_socks(const char *path, struct mesh_sock **socks, size_t *n, size_t *cap)
{
	FILE *f = fopen(path, "r");
	char line[512];

	if (!f)
		return;
	if (!fgets(line, sizeof(line), f)) { /* the header */
		fclose(f);
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char la[64], ra[64];
		unsigned long long inode;
		struct mesh_sock sk;
		const char *lp, *rp;

		if (sscanf(line, "%*s %63s %63s %*s %*s %*s %*s %*s %*s %llu", la, ra, &inode) != 3)
			continue;
		lp = strrchr(la, ':');
		rp = strrchr(ra, ':');
		if (!lp || !rp)
			continue;
		sk.inode = inode;
		sk.lport = (unsigned)strtoul(lp + 1, NULL, 16);
		sk.rport = (unsigned)strtoul(rp + 1, NULL, 16);
		if (*n == *cap) {
			size_t ncap = *cap ? *cap * 2 : 256;
			struct mesh_sock *g = realloc(*socks, ncap * sizeof(*g));

			if (!g)
				break;
			*socks = g;
			*cap = ncap;
		}
		(*socks)[(*n)++] = sk;
	}
	fclose(f);
}

/*
 * Count this process's descriptors: all of them, and its TCP sockets split into control
 * plane (our control listener and connections to or from a member's control port: p2p
 * descriptor fetches) and data (everything else TCP: the transport's listener and lanes).
 */
static void mesh_count_fds(const struct mesh *m, struct mesh_sample *s)
{
	struct mesh_sock *socks = NULL;
	size_t n_socks = 0, cap = 0;
	unsigned own = mesh_name_port(m->name);
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	s->fds = s->control = s->data = 0;
	if (!d) {
		s->fds = s->control = s->data = -1;
		return;
	}
	mesh_read_socks("/proc/self/net/tcp", &socks, &n_socks, &cap);
	mesh_read_socks("/proc/self/net/tcp6", &socks, &n_socks, &cap);
	while ((de = readdir(d))) {
		char path[64], target[64];
		unsigned long long inode;
		ssize_t len;

		if (de->d_name[0] == '.' || atoi(de->d_name) == dirfd(d))
			continue;
		s->fds++;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		if (sscanf(target, "socket:[%llu]", &inode) != 1)
			continue;
		for (size_t i = 0; i < n_socks; i++) {
			bool ctl;

			if (socks[i].inode != inode)
				continue;
			ctl = own && socks[i].lport == own;
			for (uint32_t k = 0; !ctl && m->peers && k < m->o.engines; k++)
				ctl = m->peers[k].ctl_port &&
				      socks[i].rport == m->peers[k].ctl_port;
			if (ctl)
				s->control++;
			else
				s->data++;
			break;
		}
	}
	closedir(d);
	free(socks);
}

static void mesh_sample(struct mesh *m, enum mesh_phase ph)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	struct mesh_sample s = { .rss_kib = -1, .threads = -1 };

	mesh_count_fds(m, &s);
	while (f && fgets(line, sizeof(line), f)) {
		long long v;

		if (sscanf(line, "VmRSS: %lld", &v) == 1)
			s.rss_kib = v;
		else if (sscanf(line, "Threads: %lld", &v) == 1)
			s.threads = v;
	}
	if (f)
		fclose(f);
	m->at[ph] = s;
	m->sampled[ph] = true;
}

/* --- command line -------------------------------------------------------------------------- */

static void mesh_help(void)
{
	printf("te-mesh: one member of a mesh of te engines on one host (bench/mesh.sh)\n"
	       "\n"
	       "usage: te-mesh --id I --engines N [options]\n"
	       "  -i, --id I               this member's index, in [0, N)\n"
	       "  -n, --engines N          members in the mesh, 2..%u\n"
	       "  -c, --config FILE        engine configuration [$TE_CONFIG, else the embedded\n"
	       "                           default: p2p metadata, tcp on loopback]\n"
	       "  -D, --depth N            slots (threads, one batch in flight each); even slots\n"
	       "                           READ, odd slots WRITE and read back, %u..%u [%u]\n"
	       "  -s, --sizes LIST         block sizes, comma-separated (K/M/G: powers of 2),\n"
	       "                           multiples of 8 up to 64M, at most %u [%s]\n"
	       "      --batch-bytes SIZE   a batch has batch-bytes / block requests [1M]\n"
	       "      --max-batch N        ... but at most N, 1..%u [%u]\n"
	       "      --read-area SIZE     bytes of each buffer that READs pick from [4M]\n"
	       "  -d, --duration SECONDS   timed load [20]\n"
	       "  -w, --warmup N           untimed batches per slot first [%u]\n"
	       "      --timeout SECONDS    a batch still running after this is canceled and its\n"
	       "                           tasks counted as failed [60]\n"
	       "      --seed N             random peers and offsets [from the clock]\n"
	       "  -h, --help\n"
	       "\n"
	       "Every member must get the same N, depth, sizes, batch-bytes, max-batch and\n"
	       "read-area: they define the buffer layout. Phases come from stdin (member K NAME,\n"
	       "open, go, close, end); the last stdout line is 'result: JSON'.\n"
	       "Exit status: 0 ok, 1 a transfer or verification failed, 2 usage.\n",
	       MESH_MAX_ENGINES, MESH_MIN_DEPTH, MESH_MAX_DEPTH, MESH_DEF_DEPTH, MESH_MAX_SIZES,
	       MESH_DEF_SIZES, MESH_MAX_BATCH, MESH_DEF_MAX_BATCH, MESH_DEF_WARMUP);
}

static int mesh_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int mesh_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "te-mesh: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nte-mesh: try --help\n");
	return MESH_EXIT_USAGE;
}

static bool mesh_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || *s == '-' || *s == '+')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

/* A size: digits with an optional K, M or G (powers of 2; KiB, KB ... accepted). */
static bool mesh_parse_size(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || *s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return false;
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10;
		break;
	case 'M':
	case 'm':
		shift = 20;
		break;
	case 'G':
	case 'g':
		shift = 30;
		break;
	case '\0':
		break;
	default:
		return false;
	}
	if (shift) {
		end++;
		if (!strcmp(end, "iB") || !strcmp(end, "B"))
			end += strlen(end);
	}
	if (*end || v > (UINT64_MAX >> shift))
		return false;
	v <<= shift;
	if (v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static bool mesh_parse_double(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v;

	if (!s || !*s)
		return false;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || !(v > lo) || v > hi)
		return false;
	*out = v;
	return true;
}

static int mesh_parse_sizes(struct mesh_opts *o, const char *list)
{
	char buf[256], *save = NULL, *tok;

	if (strlen(list) >= sizeof(buf))
		return mesh_usage("--sizes: list too long");
	snprintf(buf, sizeof(buf), "%s", list);
	o->n_sizes = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (o->n_sizes == MESH_MAX_SIZES)
			return mesh_usage("--sizes: more than %u sizes", MESH_MAX_SIZES);
		if (!mesh_parse_size(tok, 8, MESH_MAX_BLOCK, &v) || v % 8)
			return mesh_usage("--sizes: '%s' is not a size from 8 bytes to 64M, "
					  "a multiple of 8",
					  tok);
		o->sizes[o->n_sizes++] = v;
	}
	if (o->n_sizes == 0)
		return mesh_usage("--sizes: empty list");
	return MESH_EXIT_OK;
}

enum {
	OPT_BATCH_BYTES = 256,
	OPT_MAX_BATCH,
	OPT_READ_AREA,
	OPT_TIMEOUT,
	OPT_SEED,
};

static int mesh_parse(int argc, char **argv, struct mesh_opts *o)
{
	static const struct option longopts[] = {
		{ "id", required_argument, NULL, 'i' },
		{ "engines", required_argument, NULL, 'n' },
		{ "config", required_argument, NULL, 'c' },
		{ "depth", required_argument, NULL, 'D' },
		{ "sizes", required_argument, NULL, 's' },
		{ "batch-bytes", required_argument, NULL, OPT_BATCH_BYTES },
		{ "max-batch", required_argument, NULL, OPT_MAX_BATCH },
		{ "read-area", required_argument, NULL, OPT_READ_AREA },
		{ "duration", required_argument, NULL, 'd' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool have_id = false, have_n = false;
	uint64_t v;
	int ch, rc;

	memset(o, 0, sizeof(*o));
	o->depth = MESH_DEF_DEPTH;
	o->batch_bytes = MESH_DEF_BATCH_BYTES;
	o->max_batch = MESH_DEF_MAX_BATCH;
	o->read_area = MESH_DEF_READ_AREA;
	o->duration_s = MESH_DEF_DURATION;
	o->warmup = MESH_DEF_WARMUP;
	o->timeout_s = MESH_DEF_TIMEOUT;
	rc = mesh_parse_sizes(o, MESH_DEF_SIZES);
	if (rc)
		return rc;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":i:n:c:D:s:d:w:h", longopts, NULL)) != -1) {
		switch (ch) {
		case 'i':
			if (!mesh_parse_u64(optarg, 0, MESH_MAX_ENGINES - 1, &v))
				return mesh_usage("--id: '%s' is not in [0, %u)", optarg,
						  MESH_MAX_ENGINES);
			o->id = (uint32_t)v;
			have_id = true;
			break;
		case 'n':
			if (!mesh_parse_u64(optarg, 2, MESH_MAX_ENGINES, &v))
				return mesh_usage("--engines: '%s' is not in [2, %u]", optarg,
						  MESH_MAX_ENGINES);
			o->engines = (uint32_t)v;
			have_n = true;
			break;
		case 'c':
			if (!*optarg)
				return mesh_usage("--config: empty file name");
			o->config = optarg;
			break;
		case 'D':
			if (!mesh_parse_u64(optarg, MESH_MIN_DEPTH, MESH_MAX_DEPTH, &v))
				return mesh_usage("--depth: '%s' is not in [%u, %u]", optarg,
						  MESH_MIN_DEPTH, MESH_MAX_DEPTH);
			o->depth = (uint32_t)v;
			break;
		case 's':
			rc = mesh_parse_sizes(o, optarg);
			if (rc)
				return rc;
			break;
		case OPT_BATCH_BYTES:
			if (!mesh_parse_size(optarg, 8, MESH_MAX_BLOCK, &v) || v % 8)
				return mesh_usage("--batch-bytes: '%s' is not a size from 8 bytes "
						  "to 64M, a multiple of 8",
						  optarg);
			o->batch_bytes = v;
			break;
		case OPT_MAX_BATCH:
			if (!mesh_parse_u64(optarg, 1, MESH_MAX_BATCH, &v))
				return mesh_usage("--max-batch: '%s' is not in [1, %u]", optarg,
						  MESH_MAX_BATCH);
			o->max_batch = (uint32_t)v;
			break;
		case OPT_READ_AREA:
			if (!mesh_parse_size(optarg, 4096, MESH_MAX_READ_AREA, &v) || v % 4096)
				return mesh_usage("--read-area: '%s' is not a multiple of 4K from "
						  "4K to 4G",
						  optarg);
			o->read_area = v;
			break;
		case 'd':
			if (!mesh_parse_double(optarg, 0.0, MESH_MAX_DURATION, &o->duration_s))
				return mesh_usage("--duration: '%s' is not a number of seconds in "
						  "(0, %.0f]",
						  optarg, MESH_MAX_DURATION);
			break;
		case 'w':
			if (!mesh_parse_u64(optarg, 0, MESH_MAX_WARMUP, &v))
				return mesh_usage("--warmup: '%s' is not in [0, %u]", optarg,
						  MESH_MAX_WARMUP);
			o->warmup = (uint32_t)v;
			break;
		case OPT_TIMEOUT:
			if (!mesh_parse_double(optarg, 0.0, MESH_MAX_DURATION, &o->timeout_s))
				return mesh_usage("--timeout: '%s' is not a number of seconds in "
						  "(0, %.0f]",
						  optarg, MESH_MAX_DURATION);
			break;
		case OPT_SEED:
			if (!mesh_parse_u64(optarg, 0, UINT64_MAX, &o->seed))
				return mesh_usage("--seed: '%s' is not an unsigned integer",
						  optarg);
			o->seed_set = true;
			break;
		case 'h':
			mesh_help();
			exit(MESH_EXIT_OK);
		case ':':
			return mesh_usage("option '%s' needs a value", argv[optind - 1]);
		default:
			return mesh_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return mesh_usage("unexpected argument '%s'", argv[optind]);
	if (!have_id || !have_n)
		return mesh_usage("--id and --engines are required");
	if (o->id >= o->engines)
		return mesh_usage("--id %" PRIu32 " is not below --engines %" PRIu32, o->id,
				  o->engines);
	return MESH_EXIT_OK;
}

/* --- layout ------------------------------------------------------------------------------- */

static uint64_t mesh_round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

/* Slot k's block size, requests per batch and op; the same function on every member. */
static void mesh_slot_shape(const struct mesh_opts *o, uint32_t id, uint32_t k, bool *write_out,
			    uint64_t *block_out, uint32_t *nreq_out)
{
	uint32_t per = (o->depth + 1) / 2; /* READ slots per member (>= write slots) */
	uint64_t block = o->sizes[((uint64_t)id * per + k / 2) % o->n_sizes];
	uint64_t n = o->batch_bytes / block;

	*write_out = k % 2 == 1;
	*block_out = block;
	*nreq_out = (uint32_t)(n < 1 ? 1 : n > o->max_batch ? o->max_batch : n);
}

static int mesh_layout(struct mesh *m)
{
	const struct mesh_opts *o = &m->o;
	uint64_t biggest = 0, total;

	/* The largest batch of any size: every member's layout must be the same. */
	for (uint32_t s = 0; s < o->n_sizes; s++) {
		uint64_t n = o->batch_bytes / o->sizes[s];

		n = n < 1 ? 1 : n > o->max_batch ? o->max_batch : n;
		if (n * o->sizes[s] > biggest)
			biggest = n * o->sizes[s];
	}
	m->area = mesh_round_up(biggest, 4096);
	if (o->depth / 2 > o->engines - 1)
		return mesh_usage("--depth %" PRIu32 " has %" PRIu32 " write slots, more than the "
				  "%" PRIu32 " peers they must write to one at a time",
				  o->depth, o->depth / 2, o->engines - 1);
	if (biggest > o->read_area)
		return mesh_usage("--read-area %" PRIu64 " is smaller than the largest batch "
				  "(%" PRIu64 " bytes)",
				  o->read_area, biggest);
	total = o->read_area + (uint64_t)o->engines * m->area;
	if (total > MESH_MAX_BUFFER)
		return mesh_usage("the buffer would be %" PRIu64 " MiB (read area + engines x "
				  "%" PRIu64 " KiB), over the %" PRIu64
				  " MiB limit: use fewer engines, a smaller depth or batch",
				  total >> 20, m->area >> 10, MESH_MAX_BUFFER >> 20);
	m->buf_len = total;
	m->local_len = (uint64_t)o->depth * 2 * m->area;
	return MESH_EXIT_OK;
}

/* --- setup -------------------------------------------------------------------------------- */

static uint8_t *mesh_map(struct mesh *m, uint64_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		mesh_err(m, "cannot allocate %" PRIu64 " bytes: %s", len, strerror(errno));
		return NULL;
	}
	return p;
}

static int mesh_engine_up(struct mesh *m)
{
	struct te_engine_opts opts;
	enum te_status st;

	memset(&opts, 0, sizeof(opts));
	opts.size = sizeof(opts);
	opts.config_path = m->o.config;
	opts.log_fn = mesh_log;
	opts.log_user = m;
	opts.log_level = -1;
	st = te_engine_new(&opts, &m->e);
	if (st != TE_OK) {
		mesh_err(m, "te_engine_new: %s: %s", te_status_str(st), te_last_error());
		return MESH_EXIT_FAIL;
	}
	m->t_engine = mesh_now_ns();
	snprintf(m->name, sizeof(m->name), "%s", te_engine_name(m->e));
	m->buf = mesh_map(m, m->buf_len);
	m->local = m->buf ? mesh_map(m, m->local_len) : NULL;
	if (!m->local)
		return MESH_EXIT_FAIL;
	st = te_mem_register(m->e, m->buf, m->buf_len, "cpu", TE_MEM_REMOTE);
	if (st == TE_OK)
		st = te_mem_register(m->e, m->local, m->local_len, "cpu", TE_MEM_LOCAL);
	if (st != TE_OK) {
		mesh_err(m, "te_mem_register: %s: %s", te_status_str(st), te_last_error());
		return MESH_EXIT_FAIL;
	}
	m->t_registered = mesh_now_ns();
	printf("segment: %s\n", m->name);
	fflush(stdout);
	/* Touch every page before any sample: RSS deltas then show the engine's own memory. */
	pattern_fill(m->buf, 0, m->o.read_area, mesh_owner_salt(m->o.id));
	memset(m->buf + m->o.read_area, 0, m->buf_len - m->o.read_area);
	memset(m->local, MESH_POISON, m->local_len);
	m->t_filled = mesh_now_ns();
	return MESH_EXIT_OK;
}

/* One line of stdin without its newline; false at EOF (or a line too long: an error). */
static bool mesh_read_line(struct mesh *m, char *line, size_t cap)
{
	size_t n;

	if (!fgets(line, (int)cap, stdin))
		return false;
	n = strlen(line);
	if (n && line[n - 1] == '\n')
		line[--n] = '\0';
	else if (!feof(stdin)) {
		mesh_err(m, "stdin: a line longer than %zu bytes", cap - 2);
		return false;
	}
	return true;
}

/* Wait for the command @want; false (with a message) on EOF or anything else. */
static bool mesh_expect(struct mesh *m, const char *want)
{
	char line[MESH_LINE];

	if (!mesh_read_line(m, line, sizeof(line))) {
		mesh_err(m, "stdin ended while waiting for '%s'", want);
		return false;
	}
	if (strcmp(line, want) != 0) {
		mesh_err(m, "stdin: expected '%s', got '%s'", want, line);
		return false;
	}
	return true;
}

/* "member K NAME" lines until "open": every member once, our own name where it belongs. */
static int mesh_members(struct mesh *m)
{
	char line[MESH_LINE];
	uint32_t got = 0;

	m->peers = calloc(m->o.engines, sizeof(*m->peers));
	if (!m->peers) {
		mesh_err(m, "out of memory for %" PRIu32 " members", m->o.engines);
		return MESH_EXIT_FAIL;
	}
	while (mesh_read_line(m, line, sizeof(line))) {
		char name[MESH_LINE];
		unsigned long k;
		int used = 0;

		if (!strcmp(line, "open")) {
			if (got != m->o.engines) {
				mesh_err(m, "'open' after %" PRIu32 " of %" PRIu32 " members", got,
					 m->o.engines);
				return MESH_EXIT_FAIL;
			}
			return MESH_EXIT_OK;
		}
		if (sscanf(line, "member %lu %511s%n", &k, name, &used) != 2 || line[used] ||
		    k >= m->o.engines || strlen(name) > MESH_MAX_NAME) {
			mesh_err(m,
				 "stdin: '%s' is not 'member K NAME' with K in [0, %" PRIu32
				 ") and a name of at most %u bytes",
				 line, m->o.engines, MESH_MAX_NAME);
			return MESH_EXIT_FAIL;
		}
		if (m->peers[k].name[0]) {
			mesh_err(m, "stdin: member %lu given twice", k);
			return MESH_EXIT_FAIL;
		}
		if (k == m->o.id && strcmp(name, m->name) != 0) {
			mesh_err(m,
				 "stdin: member %lu is '%s', but this member (--id %" PRIu32
				 ") is '%s'",
				 k, name, m->o.id, m->name);
			return MESH_EXIT_FAIL;
		}
		snprintf(m->peers[k].name, sizeof(m->peers[k].name), "%s", name);
		m->peers[k].ctl_port = mesh_name_port(name);
		got++;
	}
	mesh_err(m, "stdin ended after %" PRIu32 " of %" PRIu32 " members, before 'open'", got,
		 m->o.engines);
	return MESH_EXIT_FAIL;
}

/* Open every other member and check that its buffer has this layout. */
static int mesh_open_all(struct mesh *m)
{
	m->t_open0 = mesh_now_ns();
	for (uint32_t k = 0; k < m->o.engines; k++) {
		struct mesh_peer *p = &m->peers[k];
		struct te_buffer_info bi[4];
		size_t n = 0;
		enum te_status st;

		if (k == m->o.id)
			continue;
		st = te_segment_open(m->e, p->name, &p->seg);
		if (st != TE_OK) {
			mesh_err(m, "te_segment_open(%s) (member %" PRIu32 "): %s: %s", p->name, k,
				 te_status_str(st), te_last_error());
			return MESH_EXIT_FAIL;
		}
		p->open = true;
		m->n_open++;
		st = te_segment_buffers(m->e, p->seg, bi, 4, &n);
		if (st != TE_OK || n != 1 || bi[0].length != m->buf_len ||
		    (bi[0].access & TE_MEM_REMOTE) != TE_MEM_REMOTE) {
			mesh_err(m,
				 "member %" PRIu32 " (%s) does not have this layout: %zu buffers, "
				 "the first %" PRIu64 " bytes, expected one of %" PRIu64
				 " readable and writable (same --engines, --depth, --sizes, "
				 "--batch-bytes, --max-batch, --read-area?)%s%s",
				 k, p->name, n, n ? bi[0].length : 0, m->buf_len,
				 st != TE_OK ? ": " : "", st != TE_OK ? te_last_error() : "");
			return MESH_EXIT_FAIL;
		}
		p->base = bi[0].addr;
	}
	m->t_opened = mesh_now_ns();
	return MESH_EXIT_OK;
}

/* --- load --------------------------------------------------------------------------------- */

static void mesh_count_status(struct mesh_slot *s, int32_t status)
{
	for (uint32_t i = 0; i < s->n_statuses; i++)
		if (s->statuses[i].status == status) {
			s->statuses[i].n++;
			return;
		}
	if (s->n_statuses == MESH_MAX_STATUSES) {
		s->other_statuses++;
		return;
	}
	s->statuses[s->n_statuses].status = status;
	s->statuses[s->n_statuses++].n = 1;
}

/*
 * Run @n requests as one batch and wait for it. True when every task COMPLETED; otherwise
 * every task that did not is counted by status (a task that was not COMPLETED but has TE_OK as
 * its status, e.g. one canceled after --timeout, is counted as TE_ERR_TIMEOUT).
 */
static bool mesh_batch(struct mesh_slot *s, uint32_t peer, const char *what, bool counted)
{
	struct mesh *m = s->m;
	int64_t timeout_ns = (int64_t)(m->o.timeout_s * 1e9);
	te_batch_id b;
	enum te_status st, wst;
	bool ok = true;

	st = te_batch_new(m->e, s->nreq, &b);
	if (st != TE_OK) {
		if (mesh_may_report(m))
			mesh_err(m, "slot %" PRIu32 ": te_batch_new: %s: %s", s->index,
				 te_status_str(st), te_last_error());
		if (counted)
			mesh_count_status(s, st);
		s->failed_tasks += s->nreq;
		return false;
	}
	st = te_batch_submit(m->e, b, s->reqs, s->nreq);
	if (st != TE_OK && mesh_may_report(m))
		mesh_err(m, "slot %" PRIu32 ": %s to %s: te_batch_submit: %s: %s", s->index, what,
			 m->peers[peer].name, te_status_str(st), te_last_error());
	wst = te_batch_wait(m->e, b, timeout_ns);
	if (wst == TE_INPROGRESS) {
		if (mesh_may_report(m))
			mesh_err(m, "slot %" PRIu32 ": %s to %s: not done after %.0f s; canceled",
				 s->index, what, m->peers[peer].name, m->o.timeout_s);
		if (te_batch_cancel(m->e, b) != TE_OK || te_batch_wait(m->e, b, -1) != TE_OK)
			wst = TE_ERR_TIMEOUT;
	}
	if (wst != TE_OK || st != TE_OK) {
		ok = false;
		for (uint32_t t = 0; t < s->nreq; t++) {
			struct te_task_info ti;

			if (te_task_status(m->e, b, t, &ti) != TE_OK) {
				mesh_count_status(s, TE_ERR_INTERNAL);
				s->failed_tasks++;
				continue;
			}
			if (ti.state == TE_STATE_COMPLETED)
				continue;
			s->failed_tasks++;
			mesh_count_status(s, ti.status != TE_OK ? ti.status : TE_ERR_TIMEOUT);
			if (mesh_may_report(m))
				mesh_err(m,
					 "slot %" PRIu32 ": %s to %s, task %" PRIu32 ": %s, %s: %s "
					 "(transport %s, device %s)",
					 s->index, what, m->peers[peer].name, t,
					 te_state_str(ti.state), te_status_str(ti.status),
					 ti.detail, ti.transport, ti.device);
		}
	}
	st = te_batch_free(m->e, b);
	if (st != TE_OK && mesh_may_report(m))
		mesh_err(m, "slot %" PRIu32 ": te_batch_free: %s: %s", s->index, te_status_str(st),
			 te_last_error());
	return ok;
}

static void mesh_verify_failed(struct mesh_slot *s, uint32_t peer, const char *what,
			       const uint8_t *p, uint64_t remote_off, uint64_t at, uint64_t salt)
{
	struct mesh *m = s->m;
	uint64_t want, got;

	s->verify_failures++;
	if (!mesh_may_report(m))
		return;
	/* The word that holds the first byte that differs (offsets are multiples of 8). */
	at &= ~UINT64_C(7);
	memcpy(&got, p + at, 8);
	want = pattern_word((remote_off + at) >> 3, salt);
	mesh_err(m,
		 "slot %" PRIu32 ": %s from %s (member %" PRIu32 "): bytes differ at its buffer "
		 "offset %" PRIu64 ": 0x%016" PRIx64 ", expected 0x%016" PRIx64,
		 s->index, what, m->peers[peer].name, peer, remote_off + at, got, want);
}

static void mesh_requests(struct mesh_slot *s, enum te_opcode op, uint32_t peer, uint8_t *local,
			  uint64_t remote_off)
{
	struct mesh *m = s->m;

	for (uint32_t r = 0; r < s->nreq; r++) {
		s->reqs[r].opcode = op;
		s->reqs[r].segment = m->peers[peer].seg;
		s->reqs[r].local = local + r * s->block;
		s->reqs[r].remote = m->peers[peer].base + remote_off + r * s->block;
		s->reqs[r].length = s->block;
	}
}

/* A random peer; for a WRITE the first one from there that no other write slot holds. */
static uint32_t mesh_pick(struct mesh_slot *s)
{
	struct mesh *m = s->m;
	uint32_t n = m->o.engines - 1;
	uint32_t r = (uint32_t)(mesh_rand(&s->rng) % n);

	for (uint32_t t = 0;; t++) {
		uint32_t peer = (r + t) % n;

		if (peer >= m->o.id)
			peer++;
		/* Fewer write slots than peers (mesh_layout): one is always free. */
		if (!s->write ||
		    !atomic_exchange_explicit(&m->peers[peer].writing, true, memory_order_acquire))
			return peer;
	}
}

static void mesh_read_step(struct mesh_slot *s, uint32_t peer, bool counted)
{
	struct mesh *m = s->m;
	uint64_t pages = (m->o.read_area - s->bb) / 4096 + 1;
	uint64_t off = (mesh_rand(&s->rng) % pages) * 4096;
	uint64_t salt = mesh_owner_salt(peer);
	uint64_t at;

	memset(s->data, MESH_POISON, s->bb);
	mesh_requests(s, TE_OP_READ, peer, s->data, off);
	if (!mesh_batch(s, peer, "READ", counted))
		return;
	at = pattern_check(s->data, off, s->bb, salt);
	if (at < s->bb)
		mesh_verify_failed(s, peer, "READ", s->data, off, at, salt);
	else
		s->verified_bytes += s->bb;
	if (counted) {
		s->bytes += s->bb;
		s->batches++;
		s->requests += s->nreq;
	}
}

static void mesh_write_step(struct mesh_slot *s, uint32_t peer, bool counted)
{
	struct mesh *m = s->m;
	/* A fresh salt per batch, never 0 and never an owner's: a stale byte cannot match. */
	uint64_t salt = mesh_mix(++s->seq, ((uint64_t)m->o.id << 32 | s->index) ^ m->o.seed) | 1;
	uint64_t at;

	pattern_fill(s->data, s->woff, s->bb, salt);
	mesh_requests(s, TE_OP_WRITE, peer, s->data, s->woff);
	if (!mesh_batch(s, peer, "WRITE", counted))
		return;
	if (counted) {
		s->bytes += s->bb;
		s->batches++;
		s->requests += s->nreq;
	}
	memset(s->back, MESH_POISON, s->bb);
	mesh_requests(s, TE_OP_READ, peer, s->back, s->woff);
	if (!mesh_batch(s, peer, "READ-back of a WRITE", counted))
		return;
	if (counted)
		s->readback_bytes += s->bb;
	at = pattern_check(s->back, s->woff, s->bb, salt);
	if (at < s->bb)
		mesh_verify_failed(s, peer, "WRITE and read-back", s->back, s->woff, at, salt);
	else
		s->verified_bytes += s->bb;
}

/* One READ batch, or one WRITE batch and its read-back, to a random peer. */
static void mesh_step(struct mesh_slot *s, bool counted)
{
	struct mesh *m = s->m;
	uint32_t peer = mesh_pick(s);

	atomic_fetch_add_explicit(&m->peers[peer].batches, 1, memory_order_relaxed);
	if (!s->write) {
		mesh_read_step(s, peer, counted);
		return;
	}
	mesh_write_step(s, peer, counted);
	atomic_store_explicit(&m->peers[peer].writing, false, memory_order_release);
}

static void *mesh_slot_main(void *arg)
{
	struct mesh_slot *s = arg;
	struct mesh *m = s->m;

	for (uint32_t w = 0; w < m->o.warmup; w++)
		mesh_step(s, false);
	pthread_mutex_lock(&m->gate_lock);
	m->arrived++;
	pthread_cond_broadcast(&m->gate_cond);
	while (!m->gate_open)
		pthread_cond_wait(&m->gate_cond, &m->gate_lock);
	pthread_mutex_unlock(&m->gate_lock);
	while (mesh_now_ns() < m->deadline_ns)
		mesh_step(s, true);
	s->end_ns = mesh_now_ns();
	return NULL;
}

static int mesh_slots_init(struct mesh *m)
{
	m->slots = calloc(m->o.depth, sizeof(*m->slots));
	if (!m->slots) {
		mesh_err(m, "out of memory for %" PRIu32 " slots", m->o.depth);
		return MESH_EXIT_FAIL;
	}
	for (uint32_t k = 0; k < m->o.depth; k++) {
		struct mesh_slot *s = &m->slots[k];

		s->m = m;
		s->index = k;
		mesh_slot_shape(&m->o, m->o.id, k, &s->write, &s->block, &s->nreq);
		s->bb = (uint64_t)s->nreq * s->block;
		s->data = m->local + (uint64_t)k * 2 * m->area;
		s->back = s->data + m->area;
		s->woff = m->o.read_area + (uint64_t)m->o.id * m->area;
		s->reqs = calloc(s->nreq, sizeof(*s->reqs));
		s->rng = mesh_mix(m->o.seed, ((uint64_t)m->o.id << 16) ^ k) | 1;
		if (!s->reqs) {
			mesh_err(m, "out of memory for %" PRIu32 " requests", s->nreq);
			return MESH_EXIT_FAIL;
		}
	}
	return MESH_EXIT_OK;
}

static int mesh_load(struct mesh *m)
{
	uint32_t started = 0;

	pthread_mutex_init(&m->gate_lock, NULL);
	pthread_cond_init(&m->gate_cond, NULL);
	m->deadline_ns = UINT64_MAX;
	for (uint32_t k = 0; k < m->o.depth; k++) {
		if (pthread_create(&m->slots[k].thread, NULL, mesh_slot_main, &m->slots[k]) != 0) {
			mesh_err(m, "cannot start the thread of slot %" PRIu32, k);
			break;
		}
		m->slots[k].started = true;
		started++;
	}
	pthread_mutex_lock(&m->gate_lock);
	while (m->arrived < started)
		pthread_cond_wait(&m->gate_cond, &m->gate_lock);
	m->cpu0_ns = mesh_cpu_ns();
	m->start_ns = mesh_now_ns();
	m->deadline_ns = started == m->o.depth
				 ? m->start_ns + (uint64_t)(m->o.duration_s * 1e9)
				 : m->start_ns; /* a thread missing: the others stop at once */
	m->gate_open = true;
	pthread_cond_broadcast(&m->gate_cond);
	pthread_mutex_unlock(&m->gate_lock);
	m->t_load1 = m->start_ns;
	for (uint32_t k = 0; k < m->o.depth; k++) {
		if (!m->slots[k].started)
			continue;
		pthread_join(m->slots[k].thread, NULL);
		if (m->slots[k].end_ns > m->t_load1)
			m->t_load1 = m->slots[k].end_ns;
	}
	m->cpu1_ns = mesh_cpu_ns();
	pthread_mutex_destroy(&m->gate_lock);
	pthread_cond_destroy(&m->gate_cond);
	return started == m->o.depth ? MESH_EXIT_OK : MESH_EXIT_FAIL;
}

static int mesh_close_all(struct mesh *m)
{
	int rc = MESH_EXIT_OK;

	for (uint32_t k = 0; k < m->o.engines; k++) {
		struct mesh_peer *p = &m->peers[k];
		enum te_status st;

		if (!p->open)
			continue;
		st = te_segment_close(m->e, p->seg);
		if (st != TE_OK) {
			mesh_err(m, "te_segment_close(%s): %s: %s", p->name, te_status_str(st),
				 te_last_error());
			rc = MESH_EXIT_FAIL;
		}
		p->open = false;
	}
	return rc;
}

/*
 * After every member closed: lanes close on their workers, and accepted connections when
 * their clients close them; wait until the data sockets are back to what the process had
 * before it opened any peer (or MESH_SETTLE_NS passed) and report what remains. Control-plane
 * connections are not waited for: the client keeps up to 16 idle ones (core/rpc.c), the
 * server closes its side after control.idle_timeout_ms.
 */
static void mesh_settle(struct mesh *m)
{
	uint64_t t0 = mesh_now_ns();

	for (;;) {
		struct mesh_sample s;

		mesh_count_fds(m, &s);
		if (s.data <= m->at[MESH_AT_ENGINE].data || mesh_now_ns() - t0 >= MESH_SETTLE_NS)
			break;
		usleep(20000);
	}
	m->settle_ns = mesh_now_ns() - t0;
	mesh_sample(m, MESH_AT_CLOSED);
}

/* --- report ------------------------------------------------------------------------------- */

static double mesh_ms(uint64_t from, uint64_t to)
{
	return from && to >= from ? (double)(to - from) / 1e6 : -1.0;
}

static void mesh_json_sample(FILE *f, const struct mesh *m, const char *key, size_t field)
{
	fprintf(f, "\"%s\":{", key);
	for (int ph = 0, first = 1; ph < MESH_N_PHASES; ph++) {
		const struct mesh_sample *s = &m->at[ph];
		int64_t v = field == 0	 ? s->fds
			    : field == 1 ? s->rss_kib
			    : field == 2 ? s->threads
			    : field == 3 ? s->control
					 : s->data;

		if (!m->sampled[ph])
			continue;
		fprintf(f, "%s\"%s\":%" PRId64, first ? "" : ",", mesh_phase_names[ph], v);
		first = 0;
	}
	fputc('}', f);
}

static void mesh_report(struct mesh *m, int rc)
{
	uint64_t bytes = 0, readback = 0, batches = 0, requests = 0, verified = 0;
	uint64_t failed = 0, vfail = 0, other = 0, used = 0;
	struct mesh_status_count all[MESH_MAX_STATUSES];
	uint32_t n_all = 0;
	double secs = m->t_load1 > m->start_ns ? (double)(m->t_load1 - m->start_ns) / 1e9 : 0.0;
	FILE *f = stdout;

	for (uint32_t k = 0; m->slots && k < m->o.depth; k++) {
		const struct mesh_slot *s = &m->slots[k];

		bytes += s->bytes;
		readback += s->readback_bytes;
		batches += s->batches;
		requests += s->requests;
		verified += s->verified_bytes;
		failed += s->failed_tasks;
		vfail += s->verify_failures;
		other += s->other_statuses;
		for (uint32_t i = 0; i < s->n_statuses; i++) {
			uint32_t j = 0;

			while (j < n_all && all[j].status != s->statuses[i].status)
				j++;
			if (j == n_all) {
				if (n_all == MESH_MAX_STATUSES) {
					other += s->statuses[i].n;
					continue;
				}
				all[n_all].status = s->statuses[i].status;
				all[n_all++].n = 0;
			}
			all[j].n += s->statuses[i].n;
		}
	}
	for (uint32_t k = 0; m->peers && k < m->o.engines; k++)
		used += atomic_load_explicit(&m->peers[k].batches, memory_order_relaxed) > 0;

	fprintf(f,
		"result: {\"id\":%" PRIu32 ",\"name\":\"%s\",\"engines\":%" PRIu32
		",\"peers\":%" PRIu32 ",\"peers_opened\":%" PRIu32 ",\"peers_used\":%" PRIu64
		",\"depth\":%" PRIu32 ",\"seed\":%" PRIu64 ",\"buffer_bytes\":%" PRIu64
		",\"local_bytes\":%" PRIu64 ",\"streams\":[",
		m->o.id, m->name, m->o.engines, m->o.engines - 1, m->n_open, used, m->o.depth,
		m->o.seed, m->buf_len, m->local_len);
	for (uint32_t k = 0; m->slots && k < m->o.depth; k++) {
		const struct mesh_slot *s = &m->slots[k];

		fprintf(f,
			"%s{\"op\":\"%s\",\"block\":%" PRIu64 ",\"batch\":%" PRIu32
			",\"bytes\":%" PRIu64 ",\"batches\":%" PRIu64 "}",
			k ? "," : "", s->write ? "write" : "read", s->block, s->nreq, s->bytes,
			s->batches);
	}
	fprintf(f,
		"],\"ms\":{\"engine\":%.3f,\"register\":%.3f,\"fill\":%.3f,\"open\":%.3f,"
		"\"open_per_peer\":%.3f,\"startup\":%.3f,\"close_settle\":%.3f},",
		mesh_ms(m->t_main, m->t_engine), mesh_ms(m->t_engine, m->t_registered),
		mesh_ms(m->t_registered, m->t_filled), mesh_ms(m->t_open0, m->t_opened),
		m->n_open ? mesh_ms(m->t_open0, m->t_opened) / m->n_open : -1.0,
		m->t_opened ? mesh_ms(m->t_main, m->t_registered) + mesh_ms(m->t_open0, m->t_opened)
			    : -1.0,
		m->sampled[MESH_AT_CLOSED] ? (double)m->settle_ns / 1e6 : -1.0);
	fprintf(f,
		"\"seconds\":%.6f,\"cpu_s\":%.6f,\"bytes\":%" PRIu64 ",\"readback_bytes\":%" PRIu64
		",\"batches\":%" PRIu64 ",\"requests\":%" PRIu64 ",\"gbps\":%.6f,"
		"\"verified_bytes\":%" PRIu64 ",\"verify_failures\":%" PRIu64
		",\"failed_tasks\":%" PRIu64 ",\"errors\":{",
		secs, (double)(m->cpu1_ns - m->cpu0_ns) / 1e9, bytes, readback, batches, requests,
		secs > 0 ? (double)bytes / secs / 1e9 : 0.0, verified, vfail, failed);
	for (uint32_t i = 0; i < n_all; i++)
		fprintf(f, "%s\"%s\":%" PRIu64, i ? "," : "", te_status_str(all[i].status),
			all[i].n);
	if (other)
		fprintf(f, "%s\"other\":%" PRIu64, n_all ? "," : "", other);
	fprintf(f, "},\"log_warnings\":%u,",
		atomic_load_explicit(&m->log_warnings, memory_order_relaxed));
	mesh_json_sample(f, m, "fds", 0);
	fputc(',', f);
	mesh_json_sample(f, m, "rss_kib", 1);
	fputc(',', f);
	mesh_json_sample(f, m, "threads", 2);
	fputc(',', f);
	mesh_json_sample(f, m, "fds_control", 3);
	fputc(',', f);
	mesh_json_sample(f, m, "fds_data", 4);
	fprintf(f, ",\"ok\":%s}\n", rc == MESH_EXIT_OK ? "true" : "false");
	fflush(f);
}

/* --- main --------------------------------------------------------------------------------- */

static int mesh_phases(struct mesh *m)
{
	int rc;

	rc = mesh_engine_up(m);
	if (rc)
		return rc;
	mesh_sample(m, MESH_AT_ENGINE);
	printf("ready\n");
	fflush(stdout);
	rc = mesh_members(m);
	if (rc)
		return rc;
	rc = mesh_open_all(m);
	if (rc)
		return rc;
	mesh_sample(m, MESH_AT_OPENED);
	printf("opened\n");
	fflush(stdout);
	rc = mesh_slots_init(m);
	if (rc || !mesh_expect(m, "go"))
		return MESH_EXIT_FAIL;
	m->t_load0 = mesh_now_ns();
	rc = mesh_load(m);
	mesh_sample(m, MESH_AT_LOADED);
	printf("loaded\n");
	fflush(stdout);
	if (!mesh_expect(m, "close"))
		return MESH_EXIT_FAIL;
	if (mesh_close_all(m) != MESH_EXIT_OK)
		rc = MESH_EXIT_FAIL;
	m->t_closed = mesh_now_ns();
	printf("closed\n");
	fflush(stdout);
	if (!mesh_expect(m, "end"))
		return MESH_EXIT_FAIL;
	mesh_settle(m);
	return rc;
}

int main(int argc, char **argv)
{
	struct mesh m;
	int rc;

	memset(&m, 0, sizeof(m));
	m.t_main = mesh_now_ns();
	mesh_sample(&m, MESH_AT_START);
	rc = mesh_parse(argc, argv, &m.o);
	if (rc)
		return rc;
	if (!m.o.seed_set)
		m.o.seed = m.t_main ^ ((uint64_t)getpid() << 32);
	rc = mesh_layout(&m);
	if (rc)
		return rc;
	atomic_init(&m.reports, 0);
	atomic_init(&m.log_warnings, 0);
	rc = mesh_phases(&m);
	te_engine_free(m.e);
	m.e = NULL;
	mesh_sample(&m, MESH_AT_FREED);
	for (uint32_t k = 0; m.slots && k < m.o.depth; k++)
		if (m.slots[k].failed_tasks || m.slots[k].verify_failures)
			rc = MESH_EXIT_FAIL;
	if (m.t_opened)
		mesh_report(&m, rc);
	if (m.buf)
		munmap(m.buf, m.buf_len);
	if (m.local)
		munmap(m.local, m.local_len);
	for (uint32_t k = 0; m.slots && k < m.o.depth; k++)
		free(m.slots[k].reqs);
	free(m.slots);
	free(m.peers);
	return rc;
}
